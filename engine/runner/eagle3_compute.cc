#include "engine/runner/eagle3_compute.h"

#include <algorithm>
#include <cstring>

#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/runner/model_runner.h"

namespace specd {
namespace {

// The CPU compute's pool (host rows allocated as the speculator touches them).
constexpr int32_t kCpuPoolRegions = 1024;
constexpr int32_t kCpuScratchRows = 1 << 16;
constexpr int64_t kCpuPoolRows = int64_t{kCpuPoolRegions} * kEagle3PoolWindow + kCpuScratchRows;

class CpuEagle3Compute : public Eagle3Compute {
 public:
  // target null: standalone (SetHostCapture supplies the rows).
  CpuEagle3Compute(std::unique_ptr<Eagle3Head> head, ModelRunner* target)
      : head_(std::move(head)), target_(target) {}

  bool Standalone() const override { return target_ == nullptr; }
  absl::Status SetHostCapture(std::span<const float> rows) override {
    if (target_ != nullptr) return Eagle3Compute::SetHostCapture(rows);
    capture_ = rows;
    return absl::OkStatus();
  }
  absl::Status CopyHidden(std::span<const int32_t> from, std::span<const int32_t> to) override {
    if (from.size() != to.size()) {
      return absl::InvalidArgumentError("eagle3: CopyHidden of mismatched row lists");
    }
    const int64_t h = head_->hidden_size();
    int64_t max_to = -1;
    for (int32_t t : to) {
      if (t < 0 || t >= kCpuPoolRows) {
        return absl::InvalidArgumentError(absl::StrCat("eagle3: CopyHidden into pool row ", t));
      }
      max_to = std::max<int64_t>(max_to, t);
    }
    for (size_t i = 0; i < from.size(); ++i) {
      const float* src = HiddenRow(from[i]);
      if (src == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("eagle3: CopyHidden of row ", from[i], ", which is empty"));
      }
      std::memmove(PoolRow(to[i]), src, sizeof(float) * h);
    }
    return absl::OkStatus();
  }
  absl::Status ForkCache(int64_t parent, int64_t child, int32_t slots) override {
    if (kv_.contains(child)) {
      return absl::AlreadyExistsError(absl::StrCat("eagle3: sequence ", child, " exists"));
    }
    Eagle3Head::Kv& kv = kv_[child];
    if (auto it = kv_.find(parent); it != kv_.end()) {
      kv = it->second;
      kv.Truncate(slots);
    }
    return absl::OkStatus();
  }
  absl::Status AdoptCache(int64_t parent, int64_t child) override {
    auto it = kv_.find(child);
    if (it == kv_.end()) return absl::NotFoundError(absl::StrCat("eagle3: no sequence ", child));
    Eagle3Head::Kv kv = std::move(it->second);
    kv_.erase(it);
    kv_[parent] = std::move(kv);
    return absl::OkStatus();
  }

  const Eagle3Config& config() const override { return head_->config(); }
  std::span<const int32_t> draft_to_target() const override { return head_->draft_to_target(); }
  int32_t num_pool_regions() const override { return kCpuPoolRegions; }
  bool SupportsTrees() const override { return true; }

  absl::Status Fuse(std::span<const int32_t> capture_rows,
                    std::span<const int32_t> pool_rows) override {
    const std::span<const float> captured =
        target_ != nullptr ? target_->captured_hidden_states() : capture_;
    const int64_t width = head_->fc_input_size();
    const int64_t captured_rows = static_cast<int64_t>(captured.size()) / width;
    if (capture_rows.size() != pool_rows.size()) {
      return absl::InvalidArgumentError("eagle3: Fuse of mismatched row lists");
    }
    for (size_t i = 0; i < capture_rows.size(); ++i) {
      if (capture_rows[i] < 0 || capture_rows[i] >= captured_rows || pool_rows[i] < 0 ||
          pool_rows[i] >= kCpuPoolRows) {
        return absl::InvalidArgumentError(absl::StrCat("eagle3: Fuse of captured row ",
                                                       capture_rows[i], " (", captured_rows,
                                                       " captured) into pool row ", pool_rows[i]));
      }
      head_->Fuse(&captured[int64_t{capture_rows[i]} * width], 1, PoolRow(pool_rows[i]));
    }
    return absl::OkStatus();
  }

  absl::Status Forward(std::span<const Row> rows, std::span<const uint8_t> host_logits,
                       std::vector<int32_t>* ids, std::vector<float>* logits) override {
    const int64_t h = head_->hidden_size();
    // The previous pass's prenorm rows are read before this pass overwrites them.
    inputs_.resize(rows.size() * h);
    head_rows_.clear();
    for (size_t r = 0; r < rows.size(); ++r) {
      const Row& row = rows[r];
      const float* src = HiddenRow(row.hidden);
      if (src == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("eagle3: row ", r, " reads hidden row ", row.hidden, ", which is empty"));
      }
      std::memcpy(&inputs_[r * h], src, sizeof(float) * h);
      Eagle3Head::Row hr;
      hr.token = row.token;
      hr.position = row.position;
      hr.slot = row.slot;
      hr.tree = row.tree;
      hr.hidden = &inputs_[r * h];
      hr.kv = &kv_[row.seq];
      hr.logits = row.logits;
      head_rows_.push_back(hr);
    }
    SPECD_RETURN_IF_ERROR(head_->Forward(head_rows_, &prenorm_, &scratch_logits_));
    logits_prenorm_.clear();
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!rows[r].logits) continue;
      logits_prenorm_.insert(logits_prenorm_.end(), &prenorm_[r * h], &prenorm_[(r + 1) * h]);
    }
    const int64_t vocab = head_->vocab_size();
    const int64_t m = static_cast<int64_t>(scratch_logits_.size()) / vocab;
    if (static_cast<int64_t>(host_logits.size()) != m) {
      return absl::InvalidArgumentError(absl::StrCat("eagle3: ", host_logits.size(),
                                                     " host-logits flags for ", m, " logits rows"));
    }
    ids->clear();
    logits->clear();
    for (int64_t k = 0; k < m; ++k) {
      const float* row = &scratch_logits_[k * vocab];
      ids->push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      if (host_logits[k]) logits->insert(logits->end(), row, row + vocab);
    }
    return absl::OkStatus();
  }

  void Truncate(int64_t seq, int32_t slot) override {
    auto it = kv_.find(seq);
    if (it != kv_.end()) it->second.Truncate(slot);
  }
  void Release(int64_t seq) override { kv_.erase(seq); }

 private:
  // Row::hidden's row: a pool row (>= 0) or the last pass's prenorm of a logits row; null when
  // it holds nothing.
  const float* HiddenRow(int32_t hidden) const {
    const int64_t h = head_->hidden_size();
    if (hidden >= 0 && hidden < kCpuPoolRows) {
      const std::vector<float>& chunk = pool_[hidden / kEagle3PoolWindow];
      if (!chunk.empty()) return &chunk[(hidden % kEagle3PoolWindow) * h];
    }
    if (hidden < 0 && -int64_t{hidden} * h <= static_cast<int64_t>(logits_prenorm_.size())) {
      return &logits_prenorm_[(-int64_t{hidden} - 1) * h];
    }
    return nullptr;
  }

  std::unique_ptr<Eagle3Head> head_;
  ModelRunner* target_;
  std::span<const float> capture_;                   // standalone: SetHostCapture's rows
  absl::node_hash_map<int64_t, Eagle3Head::Kv> kv_;  // stable: rows point into it
  // Pool row `row` (in [0, kCpuPoolRows)), its chunk of kEagle3PoolWindow rows allocated when
  // first written: a sequence's region, or scratch rows, touch only their own.
  float* PoolRow(int32_t row) {
    const int64_t h = head_->hidden_size();
    std::vector<float>& chunk = pool_[row / kEagle3PoolWindow];
    if (chunk.empty()) chunk.resize(static_cast<size_t>(kEagle3PoolWindow * h));
    return &chunk[(row % kEagle3PoolWindow) * h];
  }
  // [kCpuPoolRows / kEagle3PoolWindow chunks] x [kEagle3PoolWindow, hidden]
  std::vector<std::vector<float>> pool_ =
      std::vector<std::vector<float>>((kCpuPoolRows + kEagle3PoolWindow - 1) / kEagle3PoolWindow);
  std::vector<float> prenorm_;         // the last pass's prenorm rows
  std::vector<float> logits_prenorm_;  // those of its logits rows
  std::vector<float> inputs_, scratch_logits_;
  std::vector<Eagle3Head::Row> head_rows_;
};

}  // namespace

absl::Status Eagle3Compute::DraftChain(std::span<const Row> rows, int32_t steps,
                                       const ChainDraws* draws, std::vector<int32_t>* ids,
                                       bool* ran) {
  *ran = false;
  if (draws != nullptr) return absl::OkStatus();  // sampled: a step at a time, by the caller
  ids->clear();
  if (steps < 1) return absl::InvalidArgumentError(absl::StrCat("eagle3: a chain of ", steps));
  for (const Row& r : rows) {
    if (!r.logits || r.tree != nullptr || r.slot >= 0) {
      return absl::InvalidArgumentError("eagle3: DraftChain takes chain rows that draw");
    }
  }
  std::vector<Row> step(rows.begin(), rows.end());
  const std::vector<uint8_t> device(rows.size(), 0);
  std::vector<int32_t> drawn;
  std::vector<float> unused;
  for (int32_t s = 0; s < steps; ++s) {
    SPECD_RETURN_IF_ERROR(Forward(step, device, &drawn, &unused));
    ids->insert(ids->end(), drawn.begin(), drawn.end());
    for (size_t i = 0; i < step.size(); ++i) {
      step[i].token = drawn[i];
      step[i].position += 1;
      step[i].hidden = -static_cast<int32_t>(i) - 1;
    }
  }
  *ran = true;
  return absl::OkStatus();
}

absl::Status Eagle3Compute::ReserveDrawSlots(int32_t /*seqs*/, int32_t /*per_seq*/) {
  return absl::UnimplementedError("EAGLE-3 head: sampled drafts are drawn on the host");
}

absl::Status Eagle3Compute::DrawRows(std::span<const int32_t> /*logits_rows*/,
                                     std::span<const SampleRow> /*rows*/,
                                     std::span<const int32_t> /*slots*/,
                                     std::vector<int32_t>* /*ids*/) {
  return absl::UnimplementedError("EAGLE-3 head: sampled drafts are drawn on the host");
}

absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateCpuEagle3Compute(const std::string& dir,
                                                                      const std::string& target_dir,
                                                                      ModelRunner* target) {
  absl::StatusOr<std::unique_ptr<Eagle3Head>> head =
      Eagle3Head::Load(dir, target_dir, target->config());
  if (!head.ok()) {
    return absl::Status(head.status().code(),
                        absl::StrCat("EAGLE-3 head: ", head.status().message()));
  }
  if (absl::Status s = target->CaptureHiddenStates((*head)->config().aux_layer_ids); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("EAGLE-3 head: ", s.message()));
  }
  return std::make_unique<CpuEagle3Compute>(*std::move(head), target);
}

absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateStandaloneCpuEagle3Compute(
    const std::string& dir, const std::string& target_dir) {
  absl::StatusOr<ModelConfig> target = LoadModelConfig(target_dir);
  if (!target.ok()) {
    return absl::Status(target.status().code(),
                        absl::StrCat("EAGLE-3 head: its target: ", target.status().message()));
  }
  absl::StatusOr<std::unique_ptr<Eagle3Head>> head = Eagle3Head::Load(dir, target_dir, *target);
  if (!head.ok()) {
    return absl::Status(head.status().code(),
                        absl::StrCat("EAGLE-3 head: ", head.status().message()));
  }
  return std::make_unique<CpuEagle3Compute>(*std::move(head), nullptr);
}

}  // namespace specd
