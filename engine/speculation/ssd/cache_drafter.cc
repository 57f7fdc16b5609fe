#include "engine/speculation/ssd/cache_drafter.h"

#include <algorithm>

#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/speculation/ssd/ssd_worker.h"

namespace specd {

absl::Status CacheDrafter::ReadKeptProbs(const KeptProbs& /*kept*/,
                                         std::vector<float>* /*probs*/) const {
  return absl::UnimplementedError("ssd speculator: this drafter keeps no q rows on a device");
}

absl::Status CacheDrafter::CopyKeptRows(std::span<const ModelRunner::RowRange> /*ranges*/,
                                        void* /*dst*/) const {
  return absl::UnimplementedError("ssd speculator: this drafter keeps no q rows on a device");
}

absl::StatusOr<std::unique_ptr<CacheDrafter>> CreateDraftModelCacheDrafter(
    const SsdWorkerOptions& options, const DraftModelDrafterOptions& d) {
  const SpeculativeConfig& c = options.config;
  if (c.draft_model.empty()) return absl::InvalidArgumentError("ssd speculator: no draft model");
  RunnerOptions r = options.draft;
  r.model_dir = c.draft_model;
  if (options.max_model_len > 0) r.max_model_len = options.max_model_len;
  // A parallel draft draws K + 1 rows per branch in one pass: room for a wave of branches.
  if (c.parallel_drafting) {
    r.max_sample_rows = static_cast<int32_t>(std::min<int64_t>(
        r.max_num_batched_tokens,
        static_cast<int64_t>(d.max_branches_per_pass) * (c.num_speculative_tokens + 1)));
  }
  // The cache's waves mix catch-ups of every acceptance length: chunk lengths rounded to 4 share
  // graph shapes.
  r.round_graph_q_len_multiple = d.wave_query_len_multiple;
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, CreateModelRunner(r));
  const int32_t vocab = runner->config().vocab_size;
  // Their graphs are captured now, not in the verification windows of the first requests (a
  // capture takes tens of ms; a window a few). A parallel draft's pass: the catch-up (the
  // accepted drafts and the bonus, 1 to K + 1 tokens) and K mask tokens, a row per token; a
  // draft model's: the catch-up, a row per sequence, then decode steps (captured at load).
  {
    const int32_t K = c.num_speculative_tokens;
    std::vector<int32_t> q_lens;
    for (int32_t n = c.parallel_drafting ? K + 1 : 2;
         n <= (c.parallel_drafting ? 2 * K + 1 : K + 1); ++n) {
      q_lens.push_back(n);
    }
    const absl::Time start = absl::Now();
    SPECD_RETURN_IF_ERROR(
        runner->CaptureRoundGraphs(d.max_branches_per_pass, q_lens, c.parallel_drafting));
    SPECD_LOG_INFO("ssd speculator: round graphs for the cache's waves ready in {}",
                   absl::FormatDuration(absl::Now() - start));
  }
  SPECD_ASSIGN_OR_RETURN(
      std::unique_ptr<DraftModelSpeculator> draft,
      DraftModelSpeculator::Create(std::move(runner), vocab, r.max_num_batched_tokens));
  if (c.parallel_drafting) {
    SPECD_ASSIGN_OR_RETURN(const int32_t mask,
                           DraftModelSpeculator::ReadMaskToken(c.draft_model, vocab));
    draft->set_parallel(mask);
  }
  if (c.replay.enabled()) {
    SPECD_ASSIGN_OR_RETURN(std::unique_ptr<DraftReplay> replay, DraftReplay::Load(c.replay, vocab));
    SPECD_LOG_WARN(
        "ssd speculator: draft in replay mode (controlled acceptance alpha {}, "
        "candidate hit {}): a benchmark setting",
        c.replay.alpha, c.replay.candidate_hit);
    draft->set_replay(std::move(replay));
  }
  // Sampled branches keep their q rows on the draft's device while cached, a block of K + 1 rows
  // each, as many as the cache can hold (the time budget's at most d.max_candidates per acceptance
  // length and sequence) within d.kept_rows_bytes.
  {
    const int32_t rows = c.num_speculative_tokens + 1;
    const int64_t block_bytes = int64_t{rows} * vocab * static_cast<int64_t>(sizeof(float));
    const int64_t blocks = std::min<int64_t>(
        int64_t{options.max_num_seqs} * rows * d.max_candidates, d.kept_rows_bytes / block_bytes);
    SPECD_RETURN_IF_ERROR(draft->KeepProbsOnDevice(rows, static_cast<int32_t>(blocks)));
  }
  return std::unique_ptr<CacheDrafter>(new DraftModelCacheDrafter(std::move(draft)));
}

}  // namespace specd
