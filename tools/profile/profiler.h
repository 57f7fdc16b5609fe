// The measurement behind specd_profile: step times of the loaded target (and draft) model on a
// grid of batch sizes x contexts x tokens per sequence, taken with the runners' own Step and
// StepGreedyVerify calls on synthetic sequences, gathered into the CostProfile
// (engine/policy/cost_profile.h) that StrategyPolicy reads. A library so that the tool's test
// and, later, the server's start-up profiling share one implementation. One thread (it owns the
// runners it creates).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/ssv.h"
#include "engine/policy/cost_profile.h"

namespace specd::profile {

struct ProfileOptions {
  std::string model_dir;             // the target
  std::string draft_dir;             // "": no draft model (no draft_model entry)
  bool parallel_draft = false;       // the draft drafts a round in one pass (PARD; needs draft_dir)
  std::string eagle3_dir;            // an EAGLE-3 head for the target; "": none (no eagle3 entry)
  std::string device = "auto";       // "cpu", "cuda", "cuda:N", "auto" (the draft: the same)
  std::string load_format = "auto";  // "dummy": random weights from config.json (CUDA)
  int32_t num_threads = 0;           // CPU threads (0: one per core)
  int32_t tensor_parallel_size = 1;  // target ranks; > 1 launches `specd worker`s from `specd`
  std::string specd;                 // the specd binary tensor-parallel workers run
  double gpu_memory_utilization = 0.9;
  int32_t max_num_batched_tokens = 2048;  // prefill chunk; raised to fit the largest verify step
  // The grid: each axis is sorted and deduplicated; every value >= 1.
  std::vector<int32_t> batch_sizes = {1, 4, 16, 64};
  std::vector<int32_t> contexts = {512, 4096, 16384};  // tokens already in each sequence's KV
  std::vector<int32_t> tokens = {1, 2, 5, 9};          // verified tokens per sequence (K + 1)
  int32_t warmup = 2;                                  // untimed calls before each measurement
  int32_t repeats = 5;  // timed calls per measurement (the median is kept)
  // Wall-clock cap on the measuring (loading excluded). Repeats are lowered (to 1, with one
  // warm-up) when the calls so far say the rest would not fit; a measurement due after it has
  // passed fails the run (DeadlineExceeded), so the overrun is at most one measurement.
  double budget_seconds = 300;
  uint64_t seed = 1234;  // synthetic token ids
  // Each sequence's context its own (no shared prefix): attention reads what a batch of
  // different prompts reads, not one prefix the L2 serves to every sequence (prefix caching's
  // case). Prefills batch x context tokens per point.
  bool distinct_contexts = false;
  // NSA targets, the SSV planner: each strategy's verification grid (as `verify`, the chunks
  // under the strategy), into the profile's "ssv" section, ranked at ssv_alpha.
  std::vector<SsvStrategy> ssv;
  double ssv_alpha = 0.8;
  // Self-speculation (a dense target on one rank): vegas {draft, verify} and streaming {draft}
  // at this budget (the server's --speculative-config sparse options).
  bool sparse_drafting = false;
  double sparsity_ratio = 0.07;
  int32_t sparse_min_tokens = 256;
  int32_t sparse_max_tokens = 0;  // 0: no cap
  // Progress lines (each measurement as it completes); null: silent.
  std::function<void(std::string_view)> log;

  // InvalidArgument naming the flag at fault; sorts and deduplicates the axes.
  absl::Status Validate();
};

// What one run measured, beside the profile built from it.
struct ProfileReport {
  CostProfile profile;
  std::string target_device;  // the runner's device_name()
  double seconds = 0;         // measuring, loading excluded
  int32_t min_repeats = 0;    // fewest timed calls any measurement got (budget)
};

// Loads the models, measures every grid point and builds the profile:
//   plain   [batch] x [1] x [context]: one Step of `batch` sequences, one new token each
//   verify  [batch] x [tokens] x [context]: one StepGreedyVerify, each sequence's last token plus
//           tokens - 1 random drafts (a row at every position)
//   methods ngram {} (drafting costs nothing; dense verification) and, with a draft model,
//           draft_model {draft: [batch] x [K] x [context]}, K = 1 and every tokens - 1 > 1: K
//           times the draft runner's one-token Step (its catch-up chunk is not measured); with
//           parallel_draft, "parallel": true and one StepGreedyVerify of K tokens per sequence on
//           the draft runner at each K (the parallel pass: K positions, K rows drawn);
//           with an EAGLE-3 head, eagle3 {draft: [batch] x [K] x [context]}: K times one head
//           step (a row per sequence at the context's end, its cache holding the context, the
//           previous step's prenorm as its hidden input), dense verification (the target's
//           passes capture the head's hidden states throughout, as a server with the head does)
//   ssv     with options.ssv (an NSA target): per strategy, verify [batch] x [tokens] x [context]
//           with every sequence's chunk under the strategy
//   vegas   with sparse_drafting: verify [batch] x [tokens] x [context] a verification whose
//           chunks also select the next round's KV (into the runner's selection slots where it
//           keeps them, else as scores to the host), draft [batch] x [K] x [context] K sparse
//           draft steps over that selection (the budget's count of the context per layer);
//           streaming {draft} the same steps over sinks and a window (host lists), dense verify
// Each time is the median of `repeats` calls after `warmup`. Sequences share one prefilled
// prefix of `context` tokens (blocks shared, as prefix caching shares them) and own the blocks
// their new tokens go to; each call writes the same positions again, so contexts stay fixed.
// Errors: the runners' (a bad model, no GPU, out of memory), ResourceExhausted when the KV pool
// cannot hold the largest point, DeadlineExceeded past the budget.
absl::StatusOr<ProfileReport> MeasureProfile(ProfileOptions options);

// "name of the model folder" (+ " (random weights)" for dummy loads), target / draft.
std::string DescribeModels(const ProfileOptions& options);

}  // namespace specd::profile
