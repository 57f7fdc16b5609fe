#include "engine/runner/model_runner.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/runner/cpu_runner.h"
#include "engine/sample/acceptance.h"
#include "kernels/ref/sampling.h"
#include "kernels/ref/verify.h"
#ifdef SPECD_HAS_CUDA
#include "engine/runner/cuda/cuda_runner.h"
#endif

namespace specd {
namespace {

int32_t VisibleGpus() {
#ifdef SPECD_HAS_CUDA
  return CudaDeviceCount();
#else
  return 0;
#endif
}

}  // namespace

absl::StatusOr<DeviceChoice> ParseDevice(std::string_view device) {
  if (device == "cpu") return DeviceChoice{};
  if (device == "auto") return DeviceChoice{VisibleGpus() > 0, 0};
  if (device == "cuda") return DeviceChoice{true, 0};
  if (device.substr(0, 5) == "cuda:") {
    std::string_view n = device.substr(5);
    int32_t index = -1;
    auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), index);
    if (ec == std::errc() && end == n.data() + n.size() && !n.empty() && index >= 0) {
      return DeviceChoice{true, index};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device '", std::string(device), "' is not one of cpu, cuda, cuda:N (N >= 0), auto"));
}

namespace {

absl::Status ValidateOptions(const RunnerOptions& o) {
  if (o.load_format != "auto" && o.load_format != "dummy") {
    return absl::InvalidArgumentError(
        absl::StrCat("load_format '", o.load_format, "' is not one of auto, dummy"));
  }
  if (o.block_size < 1 || o.max_num_seqs < 1 || o.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        "block_size, max_num_seqs and max_num_batched_tokens must be positive");
  }
  if (o.max_model_len < 0 || o.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError("max_model_len and kv_cache_bytes must not be negative");
  }
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_memory_utilization ", o.gpu_memory_utilization, " is outside (0, 1]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int32_t> ResolveMaxModelLen(const ModelConfig& config, int32_t requested) {
  if (requested <= 0) return config.max_position_embeddings;
  if (requested > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("max_model_len ", requested,
                                                   " exceeds the model's max_position_embeddings ",
                                                   config.max_position_embeddings));
  }
  return requested;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const RunnerOptions& options) {
  SPECD_RETURN_IF_ERROR(ValidateOptions(options));
  SPECD_ASSIGN_OR_RETURN(DeviceChoice device, ParseDevice(options.device));
  if (!device.cuda) {
    if (options.load_format == "dummy") {
      return absl::InvalidArgumentError(
          "load_format dummy (random weights) needs a CUDA device; the CPU runner loads "
          "safetensors only");
    }
    SPECD_ASSIGN_OR_RETURN(std::unique_ptr<CpuRunner> cpu, CpuRunner::Create(options));
    return std::unique_ptr<ModelRunner>(std::move(cpu));
  }
#ifdef SPECD_HAS_CUDA
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<CudaRunner> cuda,
                         CudaRunner::Create(options, device.index));
  return std::unique_ptr<ModelRunner>(std::move(cuda));
#else
  return absl::FailedPreconditionError(
      absl::StrCat("device '", options.device,
                   "': this build has no CUDA (configure with -DSPECD_ENABLE_CUDA=ON)"));
#endif
}

absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateStandaloneEagle3Compute(
    const StandaloneEagle3Options& options) {
  SPECD_ASSIGN_OR_RETURN(const DeviceChoice device, ParseDevice(options.device));
  if (!device.cuda) {
    if (options.dummy) {
      return absl::InvalidArgumentError(
          "EAGLE-3 head: load_format dummy (random weights) needs a CUDA device");
    }
    return CreateStandaloneCpuEagle3Compute(options.dir, options.target_dir);
  }
#ifdef SPECD_HAS_CUDA
  return CreateStandaloneCudaEagle3Compute(options, device.index);
#else
  return absl::FailedPreconditionError(
      absl::StrCat("device '", options.device,
                   "': this build has no CUDA (configure with -DSPECD_ENABLE_CUDA=ON)"));
#endif
}

float SpeculationUniform(uint64_t seed, int64_t num_generated, SpeculationDraw kind) {
  // The top bit keeps these counters apart from the plain draws' (SampleRows: num_generated).
  const uint64_t counter = (uint64_t{1} << 63) | (static_cast<uint64_t>(num_generated) << 2) |
                           static_cast<uint64_t>(kind);
  const auto u = static_cast<float>(kernels::ref::PhiloxUniform(seed, counter));
  return std::min(u, 0x1.fffffep-1f);  // rounding to f32 may reach 1
}

float TreeSpeculationUniform(uint64_t seed, int64_t num_generated, int32_t sibling) {
  // Bits 63 and 62 set: apart from SpeculationUniform's counters (bit 62 is never reached by
  // their num_generated << 2) and the plain draws'.
  const uint64_t counter = (uint64_t{3} << 62) | (static_cast<uint64_t>(num_generated) << 8) |
                           static_cast<uint64_t>(sibling & 0xff);
  const auto u = static_cast<float>(kernels::ref::PhiloxUniform(seed, counter));
  return std::min(u, 0x1.fffffep-1f);
}

namespace runner_internal {

absl::Status TreeDraftParents(const SequenceInput& chunk, size_t k, size_t row,
                              std::vector<int32_t>* parents) {
  parents->clear();
  if (chunk.tree == nullptr) return absl::OkStatus();
  const TokenTree& t = *chunk.tree;
  if (t.start != chunk.start_pos || t.parents.size() != k + 1 || chunk.tokens.size() != k + 1 ||
      t.parents[0] != -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("verification: row ", row, "'s tree must cover its chunk (", k,
                     " drafts after the root) from the chunk's first slot, the root first"));
  }
  for (size_t j = 0; j < k; ++j) {
    const int32_t p = t.parents[j + 1];
    if (p < 0 || static_cast<size_t>(p) > j) {
      return absl::InvalidArgumentError(
          absl::StrCat("verification: row ", row, "'s draft ", j, " has parent node ", p));
    }
    parents->push_back(p - 1);
  }
  return absl::OkStatus();
}

absl::Status ExpandSampledVerifyRows(std::span<const SequenceInput> batch,
                                     std::span<const SampleRow> rows,
                                     std::span<const std::span<const int32_t>> drafts,
                                     std::span<const DraftProbs> probs, int64_t vocab,
                                     std::vector<SampleRow>* expanded,
                                     std::vector<int32_t>* path_tokens) {
  if (drafts.size() != rows.size() || probs.size() != rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("StepSampledVerify: ", drafts.size(),
                                                   " drafts and ", probs.size(),
                                                   " probability sets for ", rows.size(), " rows"));
  }
  expanded->clear();
  path_tokens->clear();
  // Tree rows' paths: sized first (every node's depth), so the spans taken below stay valid.
  std::vector<int32_t> parents, depths;
  size_t path_total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t k = drafts[i].size();
    if (k == 0 || rows[i].chunk < 0 || static_cast<size_t>(rows[i].chunk) >= batch.size()) continue;
    SPECD_RETURN_IF_ERROR(TreeDraftParents(batch[rows[i].chunk], k, i, &parents));
    if (parents.empty()) continue;
    if (probs[i].device != nullptr || !probs[i].host.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepSampledVerify: tree row ", i,
                       " carries draft probabilities (trees take one-hot q)"));
    }
    TreeDepths(parents, &depths);
    for (int32_t d : depths) path_total += static_cast<size_t>(d) + 1;
  }
  path_tokens->reserve(path_total);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& r = rows[i];
    const size_t k = drafts[i].size();
    if (r.params == nullptr || !r.pending.empty() || r.num_candidates > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StepSampledVerify: row ", i, " has pending tokens, candidates or no params"));
    }
    if (k == 0) {
      expanded->push_back(r);
      continue;
    }
    if (r.chunk < 0 || static_cast<size_t>(r.chunk) >= batch.size() ||
        batch[r.chunk].tokens.size() != k + 1 || r.token >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("StepSampledVerify: row ", i, " has ", k,
                                                     " drafts but its chunk is not them plus one"));
    }
    if (!probs[i].host.empty() && probs[i].host.size() != k * static_cast<size_t>(vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepSampledVerify: row ", i, " has ", probs[i].host.size(),
                       " draft probabilities for ", k, " drafts of vocabulary ", vocab));
    }
    SPECD_RETURN_IF_ERROR(TreeDraftParents(batch[r.chunk], k, i, &parents));
    std::vector<int32_t> path;
    for (size_t j = 0; j <= k; ++j) {
      SampleRow row = r;
      row.token = static_cast<int32_t>(j);
      if (parents.empty()) {
        row.pending = drafts[i].first(j);
      } else if (j > 0) {  // node j - 1's path: its ancestors' tokens and its own
        path.clear();
        AppendTreePath(parents, static_cast<int32_t>(j - 1), &path);
        const size_t at = path_tokens->size();
        for (int32_t node : path) path_tokens->push_back(drafts[i][node]);
        row.pending = std::span<const int32_t>(*path_tokens).subspan(at, path.size());
      }
      row.num_generated = r.num_generated + static_cast<int64_t>(row.pending.size());
      if (row.num_generated >= r.params->min_tokens) row.banned = {};
      expanded->push_back(row);
    }
  }
  return absl::OkStatus();
}

absl::Status ExpandDraftRows(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                             std::span<const std::span<const int32_t>> drafts,
                             std::vector<SampleRow>* expanded) {
  if (drafts.size() != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("verification: ", drafts.size(), " drafts for ", rows.size(), " rows"));
  }
  expanded->clear();
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& r = rows[i];
    const size_t k = drafts[i].size();
    if (k == 0) {
      expanded->push_back(r);
      continue;
    }
    if (r.chunk < 0 || static_cast<size_t>(r.chunk) >= batch.size() ||
        batch[r.chunk].tokens.size() != k + 1 || r.token >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("verification: row ", i, " has ", k,
                                                     " drafts but its chunk is not them plus one"));
    }
    for (size_t j = 0; j <= k; ++j) {
      SampleRow row = r;
      row.token = static_cast<int32_t>(j);
      expanded->push_back(row);
    }
  }
  return absl::OkStatus();
}

absl::Status ExpandVerifyRows(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                              std::span<const std::span<const int32_t>> drafts,
                              std::vector<SampleRow>* expanded) {
  for (size_t i = 0; i < rows.size() && i < drafts.size(); ++i) {
    const SamplingParams* p = rows[i].params;
    if (!drafts[i].empty() && (p == nullptr || !p->greedy() || p->has_penalties() ||
                               p->logprobs >= 0 || !rows[i].banned.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StepGreedyVerify: row ", i, " is not greedy without penalties, logprobs or bans"));
    }
  }
  return ExpandDraftRows(batch, rows, drafts, expanded);
}

}  // namespace runner_internal

bool NeedsFullLogits(const SampleRow& row) {
  // A row without params is a tensor-parallel worker's: full_logits speaks for rank 0's row.
  const SamplingParams* p = row.params;
  if (row.full_logits || row.num_candidates > kMaxSampleCandidates) return true;
  return p != nullptr &&
         (!p->greedy() || p->has_penalties() || p->logprobs >= 0 || !row.banned.empty());
}

int32_t VocabMergeK(std::span<const SampleRow> rows) {
  int32_t k = 1;
  for (const SampleRow& row : rows) {
    if (NeedsFullLogits(row)) return 0;
    k = std::max(k, row.num_candidates);
  }
  return rows.empty() ? 0 : k;
}

absl::Status ModelRunner::ReserveProbSlots(int32_t) {
  return absl::UnimplementedError(
      absl::StrCat("ReserveProbSlots: ", device_name(), " keeps no probabilities on a device"));
}

const float* ModelRunner::prob_slot(int32_t) const { return nullptr; }

absl::Status ModelRunner::ReadProbSlots(int32_t, int32_t, std::span<float>) const {
  return absl::UnimplementedError(
      absl::StrCat("ReadProbSlots: ", device_name(), " keeps no probabilities on a device"));
}

absl::Status ModelRunner::ReserveKeptRows(int32_t) {
  return absl::UnimplementedError(
      absl::StrCat("ReserveKeptRows: ", device_name(), " keeps no probabilities on a device"));
}

absl::Status ModelRunner::KeepProbSlots(int32_t, int32_t, int32_t) {
  return absl::UnimplementedError(
      absl::StrCat("KeepProbSlots: ", device_name(), " keeps no probabilities on a device"));
}

absl::Status ModelRunner::ReadKeptRows(int32_t, int32_t, std::span<float>) const {
  return absl::UnimplementedError(
      absl::StrCat("ReadKeptRows: ", device_name(), " keeps no probabilities on a device"));
}

absl::Status ModelRunner::CopyKeptRows(std::span<const RowRange>, void*) const {
  return absl::UnimplementedError(
      absl::StrCat("CopyKeptRows: ", device_name(), " keeps no probabilities on a device"));
}

absl::Status ModelRunner::Unsupported(StepKind kind) const {
  switch (kind) {
    case StepKind::kSampledVerify:
    case StepKind::kDraft:
      return absl::UnimplementedError(absl::StrCat(StepKindName(kind), ": ", device_name(),
                                                   " keeps no probabilities on a device"));
    case StepKind::kForwardCandidates:
      return absl::UnimplementedError(
          absl::StrCat("ForwardCandidates: ", device_name(), " ranks rows on the host"));
    case StepKind::kStep:
    case StepKind::kGreedyVerify:
    case StepKind::kForward:
      break;
  }
  return absl::UnimplementedError(absl::StrCat(StepKindName(kind), ": not run by ", device_name()));
}

absl::Status ModelRunner::GreedyVerifyByStep(const StepRequest& request, StepResult* result) {
  const std::span<const SequenceInput> batch = request.batch;
  const std::span<const SampleRow> rows = request.rows;
  const std::span<const std::span<const int32_t>> drafts = request.drafts;
  std::vector<GreedyVerifyResult>* out = result->verified;
  std::vector<SampleRow> expanded;
  SPECD_RETURN_IF_ERROR(runner_internal::ExpandVerifyRows(batch, rows, drafts, &expanded));
  std::vector<SampleResult> sampled;
  SPECD_RETURN_IF_ERROR(Step(batch, expanded, &sampled));
  out->assign(rows.size(), GreedyVerifyResult{});
  std::vector<int32_t> target, parents;
  size_t at = 0;  // first expanded row of rows[i]
  for (size_t i = 0; i < rows.size(); ++i) {
    GreedyVerifyResult& r = (*out)[i];
    if (drafts[i].empty()) {
      r.next = std::move(sampled[at++]);
      continue;
    }
    target.clear();
    for (size_t j = 0; j <= drafts[i].size(); ++j) target.push_back(sampled[at + j].id);
    at += drafts[i].size() + 1;
    SPECD_RETURN_IF_ERROR(
        runner_internal::TreeDraftParents(batch[rows[i].chunk], drafts[i].size(), i, &parents));
    if (!parents.empty()) {  // the tree's walk (kernels::ref, the device kernel's reference)
      const int32_t cu[2] = {0, static_cast<int32_t>(drafts[i].size())};
      const kernels::ref::DraftLayout layout{cu, 1, cu[1]};
      r.path.assign(drafts[i].size(), -1);
      kernels::ref::VerifyTreeGreedy(layout, drafts[i].data(), parents.data(), target.data(),
                                     &r.num_accepted, &r.next.id, r.path.data());
      r.path.resize(static_cast<size_t>(r.num_accepted));
      continue;
    }
    const AcceptResult a = AcceptGreedy(drafts[i], target);
    r.num_accepted = a.num_accepted;
    r.next.id = a.next_token;
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::MoveKv(std::span<const KvSlotMove>) {
  return absl::UnimplementedError(absl::StrCat("MoveKv: ", device_name(), " runs no token trees"));
}

absl::Status ModelRunner::CaptureHiddenStates(std::span<const int32_t> layer_ids) {
  if (layer_ids.empty()) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(device_name(),
                   ": this runner exports the target's hidden states only for the EAGLE-3 head "
                   "it holds (RunnerOptions::eagle3_head)"));
}

absl::Status ModelRunner::CopyCapturedRowsOnDevice(std::span<const RowRange>, int64_t,
                                                   void*) const {
  return absl::UnimplementedError(
      absl::StrCat("CopyCapturedRowsOnDevice: ", device_name(), " keeps no capture on a device"));
}

absl::Status ModelRunner::CopyCapturedRows(std::span<const RowRange> ranges, int64_t width,
                                           std::vector<float>* out) const {
  const std::span<const float> captured = captured_hidden_states();
  const int64_t rows = width > 0 ? static_cast<int64_t>(captured.size()) / width : 0;
  for (const RowRange& r : ranges) {
    if (r.first < 0 || r.count < 0 || int64_t{r.first} + r.count > rows) {
      return absl::OutOfRangeError(absl::StrCat("CopyCapturedRows: rows [", r.first, ", ",
                                                int64_t{r.first} + r.count, ") of ", rows,
                                                " captured by the last pass"));
    }
  }
  for (const RowRange& r : ranges) {
    const auto begin = captured.begin() + int64_t{r.first} * width;
    out->insert(out->end(), begin, begin + int64_t{r.count} * width);
  }
  return absl::OkStatus();
}

}  // namespace specd
