#include "engine/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace specd {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double Uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

void TokenHistory::AddPrompt(std::span<const int32_t> ids) {
  prompt_.insert(ids.begin(), ids.end());
}

void TokenHistory::AddOutput(int32_t id) { ++output_[id]; }

int32_t TokenHistory::OutputCount(int32_t id) const {
  auto it = output_.find(id);
  return it == output_.end() ? 0 : it->second;
}

std::vector<float> LogSoftmax(std::span<const float> logits) {
  float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const double log_z = max + std::log(sum);
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - log_z);
  return out;
}

SampleResult RawTokenLogprobs(std::span<const float> logits, int32_t id, int32_t num_logprobs) {
  SampleResult out;
  out.id = id;
  if (num_logprobs < 0) return out;
  const std::vector<float> logprobs = LogSoftmax(logits);
  out.logprob = logprobs[id];
  out.top = TopN(logprobs, num_logprobs);
  return out;
}

std::vector<TokenLogprob> TopN(std::span<const float> logprobs, int32_t n) {
  n = std::min<int32_t>(n, static_cast<int32_t>(logprobs.size()));
  std::vector<int32_t> ids(logprobs.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
  std::vector<TokenLogprob> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) out.push_back({ids[i], logprobs[ids[i]]});
  return out;
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {}

void Sampler::ApplyPenalties(std::span<float> logits, const TokenHistory& history) const {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      float& v = logits[id];
      v = v > 0 ? v / params_.repetition_penalty : v * params_.repetition_penalty;
    };
    // Each token once, whether it is in the prompt, the output or both.
    for (int32_t id : history.prompt_tokens()) penalize(id);
    for (const auto& [id, count] : history.output_counts()) {
      if (!history.InPrompt(id)) penalize(id);
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : history.output_counts()) {
      if (id < 0 || id >= vocab) continue;
      logits[id] -= params_.frequency_penalty * count + params_.presence_penalty;
    }
  }
}

SampleResult Sampler::Sample(std::span<float> logits, const TokenHistory& history,
                             std::span<const int32_t> banned) {
  SampleResult result;
  std::vector<float> raw_logprobs;
  if (params_.logprobs >= 0) {
    raw_logprobs = LogSoftmax(logits);
    result.top = TopN(raw_logprobs, params_.logprobs);
  }
  for (int32_t id : banned) logits[id] = kNegInf;
  if (params_.has_penalties()) ApplyPenalties(logits, history);
  result.id = params_.greedy() ? Argmax(logits) : Draw(logits);
  if (params_.logprobs >= 0) result.logprob = raw_logprobs[result.id];
  return result;
}

// Temperature, min-p, top-k, top-p, then inverse-CDF sampling over the kept candidates in
// descending probability order (deterministic for a given seed).
int32_t Sampler::Draw(std::span<const float> logits) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const float max = *std::max_element(logits.begin(), logits.end());
  probs_.resize(vocab);
  for (int32_t i = 0; i < vocab; ++i) probs_[i] = std::exp((logits[i] - max) / params_.temperature);
  const float min_keep = static_cast<float>(params_.min_p);  // relative to the max prob (= 1 here)
  order_.clear();
  for (int32_t i = 0; i < vocab; ++i) {
    if (probs_[i] > 0.0f && probs_[i] >= min_keep) order_.push_back(i);
  }
  auto by_prob = [&](int32_t a, int32_t b) {
    return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
  };
  size_t keep = order_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_prob);
  } else {
    std::sort(order_.begin(), order_.end(), by_prob);
  }
  order_.resize(keep);
  double kept = 0.0;
  for (int32_t id : order_) kept += probs_[id];
  if (params_.top_p < 1.0f) {
    // Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    const double target = params_.top_p * kept;
    double cum = 0.0;
    size_t n = 0;
    while (n < order_.size() && (n == 0 || cum < target)) cum += probs_[order_[n++]];
    order_.resize(n);
    kept = cum;
  }
  const double u = Uniform01(rng_) * kept;
  double cum = 0.0;
  for (int32_t id : order_) {
    cum += probs_[id];
    if (u < cum) return id;
  }
  return order_.back();
}

}  // namespace specd
