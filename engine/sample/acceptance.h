// Speculative-decoding acceptance on the CPU: how many of a sequence's K drafts the target keeps
// and which token follows them. Greedy requests keep drafts up to the first one that differs
// from the target's argmax; sampled requests use speculative sampling (Leviathan et al. 2023,
// Chen et al. 2023), which leaves the output distribution exactly the target's whatever the
// draft proposes. Probabilities are the Sampler's processed distributions (penalties, banned
// ids, temperature, min-p, top-k, top-p), for the target and the draft alike.
// The GPU backend does the same for a whole batch in kernels/cuda/verify.h.
// Free functions are pure (apart from the RNG they are given); an Acceptor belongs to one
// sequence and is used on the engine thread only.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace specd {

// One verification round of one sequence: commit num_accepted drafts, then next_token.
struct AcceptResult {
  int32_t num_accepted = 0;  // 0..K
  int32_t next_token = 0;    // the correction at the first rejected draft, or the bonus token
};

// Greedy acceptance.
//   draft_tokens   [K]: the drafts
//   target_tokens  [K + 1]: the target's argmax after the committed tokens and drafts 0..j-1
AcceptResult AcceptGreedy(std::span<const int32_t> draft_tokens,
                          std::span<const int32_t> target_tokens);

// Speculative sampling over given probability rows: draft j is kept with probability
// min(1, p_j(d_j) / q_j(d_j)); at the first rejection the next token is drawn from
// norm(max(0, p_j - q_j)) (from p_j if that is empty through rounding); after K acceptances the
// bonus token is drawn from p_K.
//   draft_tokens  [K]
//   draft_probs   [K, vocab]: q_j, the distribution draft j was drawn from; empty for
//                 deterministic drafts (n-gram, prompt lookup): q_j = one-hot at d_j
//   target_probs  [K + 1, vocab]: p_j, the target's processed distribution at position j
AcceptResult AcceptStochastic(std::span<const int32_t> draft_tokens,
                              std::span<const float> draft_probs,
                              std::span<const float> target_probs, int32_t vocab,
                              std::mt19937_64& rng);

// Which ids are banned at which positions: `ids` at the first `num_positions` verified positions
// (EOS and stop ids while fewer than min_tokens are generated: min_tokens - generated).
struct BannedIds {
  std::span<const int32_t> ids;
  int32_t num_positions = 0;
};

// The distribution Sampler::Sample draws from for `logits`: banned ids removed, penalties over
// `history` plus `pending` (tokens generated after history: the drafts before this position),
// then temperature, min-p, top-k, top-p, normalised over the kept ids (0 elsewhere). Greedy
// params give a one-hot row at Sampler's argmax. Mirrors sampler.cc operation for operation, so
// greedy rows agree exactly and sampled rows are the same distribution (acceptance_test checks
// both against Sampler).
//   logits  [vocab] raw f32 (not modified); probs [vocab] out
void ProcessedProbs(const SamplingParams& params, std::span<const float> logits,
                    const TokenHistory& history, std::span<const int32_t> pending,
                    std::span<const int32_t> banned, std::span<float> probs);

// Inverse-CDF draw from a probability row (need not be normalised; at least one entry > 0).
int32_t DrawFromProbs(std::span<const float> probs, std::mt19937_64& rng);

// Verification of one sequence's drafts from the target's raw logits, under its sampling params.
class Acceptor {
 public:
  Acceptor(const SamplingParams& params, uint64_t seed);

  // target_logits [K + 1, vocab] raw f32 from the verification pass; draft_tokens [K];
  // draft_probs [K, vocab] the draft's processed rows (ProcessedProbs under the same params),
  // or empty for deterministic drafts; ignored for greedy params. history: the sequence before
  // the drafts. Target rows are processed lazily, up to the first rejection.
  AcceptResult Verify(std::span<const float> target_logits, std::span<const int32_t> draft_tokens,
                      std::span<const float> draft_probs, const TokenHistory& history,
                      const BannedIds& banned = {});

  // Verification of a token tree (engine/model/token_tree.h): draft j's parent is parents[j]
  // (-1: the last committed token, the root; else an earlier draft), siblings best first, every
  // node chosen deterministically by the drafter (its best candidates: q one-hot), and
  // target_logits [K + 1, vocab] has the root's row first, then draft j's at row j + 1. Greedy:
  // from the root, descend to the first child whose token is the target's choice there, until
  // no child is. Sampled: recursive rejection over siblings (SpecInfer's multi-draft speculative
  // sampling with one-hot proposals, lossless): at a node whose processed distribution is p,
  // child c is kept with probability p(x_c); when it is not, p loses x_c (renormalised) and the
  // next sibling is tried; once every child failed, the next token is drawn from what is left of
  // p; at a kept leaf the bonus token is drawn from its p. Penalties count the path's tokens; a
  // node at depth d (the root 0) is banned while d < banned.num_positions. *path gets the kept
  // drafts, root side first; num_accepted is its length.
  AcceptResult VerifyTree(std::span<const float> target_logits,
                          std::span<const int32_t> draft_tokens, std::span<const int32_t> parents,
                          const TokenHistory& history, const BannedIds& banned,
                          std::vector<int32_t>* path);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> row_;  // [vocab] scratch: one processed target row
  // VerifyTree's scratch: children of each node (node j + 1; the root 0), and the path's tokens.
  std::vector<std::vector<int32_t>> children_;
  std::vector<int32_t> path_tokens_;
};

namespace acceptance_internal {

// The acceptance test. kDraftOverTargetForTest (min(1, q/p)) is deliberately wrong: tests use it
// to show that the statistical test of losslessness can fail.
enum class Rule { kSpeculativeSampling, kDraftOverTargetForTest };

AcceptResult AcceptStochasticWithRule(std::span<const int32_t> draft_tokens,
                                      std::span<const float> draft_probs,
                                      std::span<const float> target_probs, int32_t vocab,
                                      std::mt19937_64& rng, Rule rule);

}  // namespace acceptance_internal
}  // namespace specd
