#include "engine/sample/acceptance.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"

namespace specd {
namespace acceptance_internal {

// The rule every Acceptor uses. Tests only (declared for them in engine/testing/test_flags.h,
// not in a production header): engine-level losslessness tests break it to show they can fail;
// never changed in the server. Not synchronised: set it before starting work.
Rule acceptor_rule_for_test = Rule::kSpeculativeSampling;

}  // namespace acceptance_internal
namespace {

using acceptance_internal::Rule;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// As sampler.cc: 53 random bits in [0, 1).
double Uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Inverse-CDF draw over ids in order with weights weight(x) >= 0; -1 when they sum to zero.
template <typename Weight>
int32_t DrawWeighted(int32_t vocab, Weight weight, std::mt19937_64& rng) {
  double total = 0.0;
  for (int32_t x = 0; x < vocab; ++x) total += weight(x);
  if (!(total > 0.0)) return -1;
  const double u = Uniform01(rng) * total;
  double cum = 0.0;
  int32_t last = -1;
  for (int32_t x = 0; x < vocab; ++x) {
    const double w = weight(x);
    if (w <= 0.0) continue;
    cum += w;
    last = x;
    if (u < cum) return x;
  }
  return last;  // rounding left u at the very top
}

// Sampler::ApplyPenalties over history plus the pending tokens, without copying the history:
// each id gets the same float operations it would get from a history holding both.
void ApplyPenalties(const SamplingParams& params, const TokenHistory& history,
                    std::span<const int32_t> pending, std::span<float> logits) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  absl::flat_hash_map<int32_t, int32_t> pending_counts;
  for (int32_t id : pending) ++pending_counts[id];
  auto in_output = [&](int32_t id) { return history.OutputCount(id) > 0; };
  if (params.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      float& v = logits[id];
      v = v > 0 ? v / params.repetition_penalty : v * params.repetition_penalty;
    };
    for (int32_t id : history.prompt_tokens()) penalize(id);
    for (const auto& [id, count] : history.output_counts()) {
      if (!history.InPrompt(id)) penalize(id);
    }
    for (const auto& [id, count] : pending_counts) {
      if (!history.InPrompt(id) && !in_output(id)) penalize(id);
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    auto apply = [&](int32_t id, int32_t count) {
      if (id < 0 || id >= vocab) return;
      logits[id] -= params.frequency_penalty * count + params.presence_penalty;
    };
    for (const auto& [id, count] : history.output_counts()) {
      const auto it = pending_counts.find(id);
      apply(id, count + (it == pending_counts.end() ? 0 : it->second));
    }
    for (const auto& [id, count] : pending_counts) {
      if (!in_output(id)) apply(id, count);
    }
  }
}

// Sampler::Draw's distribution: temperature, min-p, top-k, top-p, normalised over kept ids.
void FilteredProbs(const SamplingParams& params, std::span<const float> logits,
                   std::span<float> probs) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const float max = *std::max_element(logits.begin(), logits.end());
  std::vector<float> weights(vocab);
  for (int32_t i = 0; i < vocab; ++i) weights[i] = std::exp((logits[i] - max) / params.temperature);
  const float min_keep = params.min_p;  // relative to the max weight (= 1)
  std::vector<int32_t> order;
  for (int32_t i = 0; i < vocab; ++i) {
    if (weights[i] > 0.0f && weights[i] >= min_keep) order.push_back(i);
  }
  auto by_prob = [&](int32_t a, int32_t b) {
    return weights[a] > weights[b] || (weights[a] == weights[b] && a < b);
  };
  size_t keep = order.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
    keep = params.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_prob);
  } else {
    std::sort(order.begin(), order.end(), by_prob);
  }
  order.resize(keep);
  double kept = 0.0;
  for (int32_t id : order) kept += weights[id];
  if (params.top_p < 1.0f) {
    const double target = params.top_p * kept;
    double cum = 0.0;
    size_t n = 0;
    while (n < order.size() && (n == 0 || cum < target)) cum += weights[order[n++]];
    order.resize(n);
    kept = cum;
  }
  std::fill(probs.begin(), probs.end(), 0.0f);
  for (int32_t id : order) probs[id] = static_cast<float>(weights[id] / kept);
}

// Speculative sampling with target rows produced on demand (target_row(j) -> span of vocab
// floats, valid until the next call).
template <typename TargetRow>
AcceptResult AcceptLazily(std::span<const int32_t> drafts, std::span<const float> draft_probs,
                          int32_t vocab, TargetRow target_row, std::mt19937_64& rng, Rule rule) {
  const int32_t num_drafts = static_cast<int32_t>(drafts.size());
  for (int32_t j = 0; j < num_drafts; ++j) {
    const int32_t d = drafts[j];
    const std::span<const float> p_row = target_row(j);
    const std::span<const float> q_row =
        draft_probs.empty() ? std::span<const float>() : draft_probs.subspan(j * vocab, vocab);
    auto q_of = [&](int32_t x) -> double {
      return q_row.empty() ? (x == d ? 1.0 : 0.0) : q_row[x];
    };
    const bool valid = d >= 0 && d < vocab;
    const double p = valid ? p_row[d] : 0.0, q = valid ? q_of(d) : 1.0;
    const double u = Uniform01(rng);
    const bool accept = rule == Rule::kSpeculativeSampling ? u * q < p : u * p < q;
    if (valid && accept) continue;
    int32_t next = DrawWeighted(
        vocab, [&](int32_t x) { return std::max(0.0, static_cast<double>(p_row[x]) - q_of(x)); },
        rng);
    if (next < 0) next = DrawFromProbs(p_row, rng);
    return {j, next};
  }
  return {num_drafts, DrawFromProbs(target_row(num_drafts), rng)};
}

}  // namespace

AcceptResult AcceptGreedy(std::span<const int32_t> draft_tokens,
                          std::span<const int32_t> target_tokens) {
  size_t k = 0;
  while (k < draft_tokens.size() && draft_tokens[k] == target_tokens[k]) ++k;
  return {static_cast<int32_t>(k), target_tokens[k]};
}

AcceptResult AcceptStochastic(std::span<const int32_t> draft_tokens,
                              std::span<const float> draft_probs,
                              std::span<const float> target_probs, int32_t vocab,
                              std::mt19937_64& rng) {
  return acceptance_internal::AcceptStochasticWithRule(draft_tokens, draft_probs, target_probs,
                                                       vocab, rng, Rule::kSpeculativeSampling);
}

void ProcessedProbs(const SamplingParams& params, std::span<const float> logits,
                    const TokenHistory& history, std::span<const int32_t> pending,
                    std::span<const int32_t> banned, std::span<float> probs) {
  std::vector<float> processed(logits.begin(), logits.end());
  for (int32_t id : banned) {
    if (id >= 0 && id < static_cast<int32_t>(processed.size())) processed[id] = kNegInf;
  }
  if (params.has_penalties()) ApplyPenalties(params, history, pending, processed);
  if (params.greedy()) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    probs[Argmax(processed)] = 1.0f;
    return;
  }
  FilteredProbs(params, processed, probs);
}

int32_t DrawFromProbs(std::span<const float> probs, std::mt19937_64& rng) {
  const int32_t id = DrawWeighted(
      static_cast<int32_t>(probs.size()), [&](int32_t x) { return std::max(0.0f, probs[x]); }, rng);
  return std::max(id, 0);
}

Acceptor::Acceptor(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {}

AcceptResult Acceptor::Verify(std::span<const float> target_logits,
                              std::span<const int32_t> draft_tokens,
                              std::span<const float> draft_probs, const TokenHistory& history,
                              const BannedIds& banned) {
  const size_t num_positions = draft_tokens.size() + 1;
  const auto vocab = static_cast<int32_t>(target_logits.size() / num_positions);
  row_.resize(vocab);
  auto target_row = [&](int32_t j) -> std::span<const float> {
    const auto ids = j < banned.num_positions ? banned.ids : std::span<const int32_t>();
    ProcessedProbs(params_, target_logits.subspan(j * vocab, vocab), history, draft_tokens.first(j),
                   ids, row_);
    return row_;
  };
  if (params_.greedy()) {
    for (int32_t j = 0;; ++j) {
      const int32_t target = Argmax(target_row(j));  // the one-hot row's id
      if (j == static_cast<int32_t>(draft_tokens.size()) || draft_tokens[j] != target) {
        return {j, target};
      }
    }
  }
  return AcceptLazily(draft_tokens, draft_probs, vocab, target_row, rng_,
                      acceptance_internal::acceptor_rule_for_test);
}

AcceptResult Acceptor::VerifyTree(std::span<const float> target_logits,
                                  std::span<const int32_t> draft_tokens,
                                  std::span<const int32_t> parents, const TokenHistory& history,
                                  const BannedIds& banned, std::vector<int32_t>* path) {
  const size_t num_nodes = draft_tokens.size() + 1;
  const auto vocab = static_cast<int32_t>(target_logits.size() / num_nodes);
  row_.resize(vocab);
  if (children_.size() < num_nodes) children_.resize(num_nodes);
  for (size_t n = 0; n < num_nodes; ++n) children_[n].clear();
  for (size_t j = 0; j < draft_tokens.size(); ++j) {
    children_[static_cast<size_t>(parents[j] + 1)].push_back(static_cast<int32_t>(j));
  }
  path->clear();
  path_tokens_.clear();
  // The processed target row at node `node` (0: the root; j + 1: draft j), whose path is *path.
  auto target_row = [&](int32_t node) {
    const int32_t depth = static_cast<int32_t>(path->size());
    const auto ids = depth < banned.num_positions ? banned.ids : std::span<const int32_t>();
    ProcessedProbs(params_, target_logits.subspan(static_cast<size_t>(node) * vocab, vocab),
                   history, path_tokens_, ids, row_);
  };
  auto descend = [&](int32_t child) {
    path->push_back(child);
    path_tokens_.push_back(draft_tokens[child]);
    return child + 1;
  };
  const Rule rule = acceptance_internal::acceptor_rule_for_test;
  for (int32_t node = 0;;) {
    target_row(node);
    const std::vector<int32_t>& kids = children_[static_cast<size_t>(node)];
    if (params_.greedy()) {
      const int32_t target = Argmax(row_);  // the one-hot row's id
      const auto hit = std::find_if(kids.begin(), kids.end(),
                                    [&](int32_t c) { return draft_tokens[c] == target; });
      if (hit == kids.end()) return {static_cast<int32_t>(path->size()), target};
      node = descend(*hit);
      continue;
    }
    // row_ is p; `left` its mass not yet rejected (siblings' tokens zeroed as they fail).
    double left = 0;
    for (float x : row_) left += x;
    int32_t kept = -1;
    for (int32_t c : kids) {
      const int32_t x = draft_tokens[c];
      const bool valid = x >= 0 && x < vocab;
      const double p = valid ? row_[x] : 0.0;
      const double u = Uniform01(rng_);
      // One-hot q: keep with probability p(x) / left (kDraftOverTargetForTest: always).
      const bool accept = rule == Rule::kSpeculativeSampling ? u * left < p : u * p < left;
      if (valid && accept) {
        kept = c;
        break;
      }
      if (valid) {
        left -= p;
        row_[x] = 0.0f;
      }
    }
    if (kept >= 0) {
      node = descend(kept);
      continue;
    }
    int32_t next = left > 0 ? DrawFromProbs(row_, rng_) : -1;
    if (next < 0 || row_[next] <= 0.0f) {  // every id rejected through rounding: p itself
      target_row(node);
      next = DrawFromProbs(row_, rng_);
    }
    return {static_cast<int32_t>(path->size()), next};
  }
}

namespace acceptance_internal {

AcceptResult AcceptStochasticWithRule(std::span<const int32_t> draft_tokens,
                                      std::span<const float> draft_probs,
                                      std::span<const float> target_probs, int32_t vocab,
                                      std::mt19937_64& rng, Rule rule) {
  auto target_row = [&](int32_t j) { return target_probs.subspan(j * vocab, vocab); };
  return AcceptLazily(draft_tokens, draft_probs, vocab, target_row, rng, rule);
}

}  // namespace acceptance_internal
}  // namespace specd
