// Turns one row of logits into the next token: penalties, temperature, min-p, top-k,
// top-p, then a seeded draw (or argmax when greedy). The order follows vLLM's sampler so
// users moving from vLLM see the same behaviour. Logprobs are those of the raw model
// distribution (before any processing), as vLLM returns them by default.
// One Sampler per sequence; engine thread only.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "engine/sample/sampling_params.h"

namespace specd {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t id = 0;
  float logprob = 0.0f;             // raw log-probability of `id` (only when logprobs >= 0)
  std::vector<TokenLogprob> top;    // [params.logprobs] best raw logprobs, descending
  std::vector<int32_t> candidates;  // [SampleRow::num_candidates] (engine/runner/model_runner.h)
};

// What the penalties look at: which tokens the prompt has, and how often each generated
// token appeared so far.
class TokenHistory {
 public:
  void AddPrompt(std::span<const int32_t> ids);
  void AddOutput(int32_t id);
  bool InPrompt(int32_t id) const { return prompt_.contains(id); }
  int32_t OutputCount(int32_t id) const;
  const absl::flat_hash_map<int32_t, int32_t>& output_counts() const { return output_; }
  const absl::flat_hash_set<int32_t>& prompt_tokens() const { return prompt_; }

 private:
  absl::flat_hash_set<int32_t> prompt_;
  absl::flat_hash_map<int32_t, int32_t> output_;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed);

  // logits: [vocab_size] f32, overwritten (penalties, temperature). banned: ids that must
  // not be chosen (EOS before min_tokens). At least one id must stay allowed.
  SampleResult Sample(std::span<float> logits, const TokenHistory& history,
                      std::span<const int32_t> banned = {});

 private:
  void ApplyPenalties(std::span<float> logits, const TokenHistory& history) const;
  int32_t Draw(std::span<const float> logits);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;  // [vocab_size] scratch: candidate ids
  std::vector<float> probs_;    // [vocab_size] scratch
};

// log_softmax of a row, in double internally. Pure.
std::vector<float> LogSoftmax(std::span<const float> logits);
// The n largest entries of a row (ties: lower id first). Pure.
std::vector<TokenLogprob> TopN(std::span<const float> logprobs, int32_t n);
// Token `id` with its raw log-probability under `logits` and the num_logprobs best ones, as a
// Sampler reports a drawn token; just the id when num_logprobs < 0. Pure.
SampleResult RawTokenLogprobs(std::span<const float> logits, int32_t id, int32_t num_logprobs);
// Index of the largest logit, lowest id on ties. Pure.
int32_t Argmax(std::span<const float> logits);

}  // namespace specd
