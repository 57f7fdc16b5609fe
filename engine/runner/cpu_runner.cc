#include "engine/runner/cpu_runner.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/kv/block_allocator.h"
#include "kernels/ref/sampling.h"

namespace specd {
namespace {

constexpr int64_t kDefaultKvCacheBytes = int64_t{64} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<CpuRunner>> CpuRunner::Create(const RunnerOptions& options) {
  std::unique_ptr<CpuRunner> runner(new CpuRunner());
  LoadOptions load;
  load.num_threads = options.num_threads;
  load.tp = options.tp;
  load.comm = options.comm;
  SPECD_ASSIGN_OR_RETURN(runner->model_, Model::Load(options.model_dir, load));
  SPECD_ASSIGN_OR_RETURN(runner->max_model_len_,
                         ResolveMaxModelLen(runner->model_->config(), options.max_model_len));
  const int64_t block_bytes = runner->model_->MakeKvCacheSpec(1, options.block_size).total_bytes();
  const int64_t pool_bytes =
      options.kv_cache_bytes > 0 ? options.kv_cache_bytes : kDefaultKvCacheBytes;
  const int32_t num_blocks = static_cast<int32_t>(std::max<int64_t>(
      BlockTable::BlocksFor(runner->max_model_len_, options.block_size), pool_bytes / block_bytes));
  SPECD_ASSIGN_OR_RETURN(runner->kv_, CpuKvCache::Create(runner->model_->MakeKvCacheSpec(
                                          num_blocks, options.block_size)));
  runner->rank_ = options.tp.rank;
  runner->num_threads_ = options.num_threads > 0
                             ? options.num_threads
                             : static_cast<int32_t>(std::thread::hardware_concurrency());
  if (!options.eagle3_head.empty() && options.tp.rank == 0) {
    SPECD_ASSIGN_OR_RETURN(
        runner->eagle3_,
        CreateCpuEagle3Compute(options.eagle3_head, options.model_dir, runner.get()));
  }
  return runner;
}

std::string CpuRunner::device_name() const {
  return absl::StrCat("cpu (", num_threads_, " threads)");
}

absl::Status CpuRunner::CheckSampling(std::span<const SampleRow> rows) const {
  for (const SampleRow& row : rows) {
    if (row.sampler == nullptr || row.history == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: sample row of chunk ", row.chunk, " is malformed"));
    }
    if (row.num_candidates < 0 || row.num_candidates > kMaxSampleCandidates ||
        row.num_candidates > model_->config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Step: ", row.num_candidates, " candidates; at most ", kMaxSampleCandidates));
    }
    if (row.saguaro_fan_out != 0) {  // kDraft only, which needs device speculation
      return absl::InvalidArgumentError(
          "Step: Saguaro sampling in a row needs a runner with device speculation");
    }
    if (!row.pending.empty()) {  // the CPU Sampler sees the history only
      return absl::InvalidArgumentError(
          "Step: pending tokens need a runner with device speculation");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::span<const SequenceInput>> CpuRunner::RunRows(
    std::span<const SequenceInput> batch, std::span<const SampleRow> rows) {
  for (const SequenceInput& in : batch) {
    if (in.all_logits) return absl::InvalidArgumentError("Step: a chunk asks for all_logits");
  }
  bool per_token = false;
  for (const SampleRow& row : rows) {
    if (row.chunk < 0 || static_cast<size_t>(row.chunk) >= batch.size() || row.token < -1 ||
        row.token >= static_cast<int64_t>(batch[row.chunk].tokens.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: sample row of chunk ", row.chunk, " is malformed"));
    }
    per_token = per_token || row.token >= 0;
  }
  // Rows naming a token inside their chunk need every logits row of that chunk.
  std::span<const SequenceInput> run = batch;
  if (per_token) {
    batch_.assign(batch.begin(), batch.end());
    for (const SampleRow& row : rows) batch_[row.chunk].all_logits |= row.token >= 0;
    run = batch_;
  }
  logits_.clear();
  // Tensor parallelism: greedy rows need only the shards' best logits (every rank's rows agree:
  // a worker's copies carry full_logits where rank 0's rows need the whole rows).
  SPECD_RETURN_IF_ERROR(model_->Forward(run, *kv_, &logits_, VocabMergeK(rows)));
  return run;
}

absl::Status CpuRunner::Run(const StepRequest& request, StepResult* result) {
  switch (request.kind) {
    case StepKind::kStep:
      return DrawRows(request.batch, request.rows, result->samples);
    case StepKind::kGreedyVerify:
      return VerifyGreedy(request, result);
    case StepKind::kForward:
      return ForwardLogits(request.batch, result->logits);
    case StepKind::kSampledVerify:
    case StepKind::kDraft:
    case StepKind::kForwardCandidates:
      return Unsupported(request.kind);
  }
  return absl::InvalidArgumentError("Run: unknown step kind");
}

absl::Status CpuRunner::DrawRows(std::span<const SequenceInput> batch,
                                 std::span<const SampleRow> rows, std::vector<SampleResult>* out) {
  out->clear();
  if (worker()) return RunRows(batch, rows).status();
  // Everything rank 0 refuses it refuses before the forward (nothing is written then).
  SPECD_RETURN_IF_ERROR(CheckSampling(rows));
  SPECD_ASSIGN_OR_RETURN(std::span<const SequenceInput> run, RunRows(batch, rows));
  std::vector<size_t> first_row(run.size() + 1, 0);  // first logits row of each chunk
  for (size_t c = 0; c < run.size(); ++c) {
    first_row[c + 1] = first_row[c] + (run[c].all_logits ? run[c].tokens.size() : 1);
  }
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  out->reserve(rows.size());
  for (const SampleRow& row : rows) {
    const size_t r =
        row.token >= 0 ? first_row[row.chunk] + row.token : first_row[row.chunk + 1] - 1;
    std::span<float> logits = std::span<float>(logits_).subspan(r * vocab, vocab);
    std::vector<int32_t> candidates;
    if (row.num_candidates > 0) {  // raw logits: before the sampler's penalties and bans
      candidates.resize(row.num_candidates);
      kernels::ref::TopKRows(logits.data(), static_cast<int64_t>(vocab), 1,
                             static_cast<int32_t>(vocab), row.num_candidates, candidates.data());
    }
    out->push_back(row.sampler->Sample(logits, *row.history, row.banned));
    out->back().candidates = std::move(candidates);
  }
  return absl::OkStatus();
}

absl::Status CpuRunner::VerifyGreedy(const StepRequest& request, StepResult* result) {
  if (!worker()) return GreedyVerifyByStep(request, result);
  result->verified->clear();
  // The expansion without the checks of what a worker's rows do not carry (params).
  std::vector<SampleRow> expanded;
  SPECD_RETURN_IF_ERROR(
      runner_internal::ExpandDraftRows(request.batch, request.rows, request.drafts, &expanded));
  return RunRows(request.batch, expanded).status();
}

absl::Status CpuRunner::ForwardLogits(std::span<const SequenceInput> batch,
                                      std::vector<float>* logits) {
  if (logits == nullptr) return absl::InvalidArgumentError("Forward: logits is null");
  logits->clear();
  SPECD_RETURN_IF_ERROR(model_->Forward(batch, *kv_, logits));
  if (worker()) logits->clear();
  return absl::OkStatus();
}

bool CpuRunner::SupportsTokenTrees() const {
  return model_->shard().world_size == 1 && !model_->config().is_nsa();
}

absl::Status CpuRunner::MoveKv(std::span<const KvSlotMove> moves) {
  if (!SupportsTokenTrees()) return ModelRunner::MoveKv(moves);
  return kv_->MoveSlots(moves);
}

}  // namespace specd
