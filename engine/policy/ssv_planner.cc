#include "engine/policy/ssv_planner.h"

#include <algorithm>

#include "engine/policy/acceptance_estimator.h"

namespace specd {

void SsvAcceptance::Counts::Add(int32_t drafts, int32_t accepted_now, double weight) {
  // Decayed sums: an average over about 1 / weight rounds once that many have run, a plain sum
  // before (a few rounds weigh fully).
  const double keep = rounds * weight >= 1 ? 1 - weight : 1;
  accepted = accepted * keep + accepted_now;
  rejections = rejections * keep + (accepted_now < drafts ? 1 : 0);
  ++rounds;
}

double SsvAcceptance::Counts::Alpha() const {
  // Every round accepted in full: the estimate's upper end, kept below 1 (a chain's value
  // diverges there).
  const double total = accepted + rejections;
  return total > 0 ? std::min(accepted / total, 0.99) : 0;
}

void SsvAcceptance::Note(size_t index, bool lossy, int32_t drafts, int32_t accepted,
                         const SsvPlannerOptions& options) {
  if (drafts <= 0) return;
  if (by_strategy_.size() <= index) by_strategy_.resize(index + 1);
  by_strategy_[index].Add(drafts, accepted, options.round_weight);
  if (!lossy) lossless_.Add(drafts, accepted, options.round_weight);
}

double SsvAcceptance::Alpha(size_t index, bool lossy, double prior,
                            const SsvPlannerOptions& options) const {
  if (lossy && index < by_strategy_.size() && by_strategy_[index].rounds >= options.min_rounds) {
    return by_strategy_[index].Alpha();
  }
  if (lossless_.rounds >= options.min_rounds) return lossless_.Alpha();
  return prior;
}

std::vector<SsvRanked> SsvPlanner::Rank(PolicyMethod method, double batch, int32_t k,
                                        double context, bool allow_lossy,
                                        const SsvAcceptance* measured) const {
  std::vector<SsvRanked> ranked;
  const double draft_ms = profile_.DraftMs(method, batch, k, context);
  const std::vector<SsvCosts>& all = profile_.ssv();
  for (size_t i = 0; i < all.size(); ++i) {
    const bool lossy = all[i].strategy.lossy();
    if (lossy && !allow_lossy) continue;
    SsvRanked r;
    r.index = i;
    r.alpha = measured != nullptr ? measured->Alpha(i, lossy, profile_.ssv_alpha, options_)
                                  : profile_.ssv_alpha;
    r.round_ms = draft_ms + all[i].verify.Ms(batch, k + 1, context);
    r.tokens_per_second = 1e3 * ExpectedCommittedTokens({r.alpha}, k) / r.round_ms;
    ranked.push_back(r);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const SsvRanked& a, const SsvRanked& b) {
    return a.tokens_per_second > b.tokens_per_second;
  });
  return ranked;
}

int32_t SsvPlanner::Choose(PolicyMethod method, double batch, int32_t k, double context,
                           bool allow_lossy, const SsvAcceptance* measured, int32_t held) const {
  const std::vector<SsvRanked> ranked = Rank(method, batch, k, context, allow_lossy, measured);
  if (ranked.empty()) return -1;
  for (const SsvRanked& r : ranked) {
    if (static_cast<int32_t>(r.index) != held) continue;
    if (r.tokens_per_second * (1 + options_.switch_margin) >= ranked.front().tokens_per_second) {
      return held;
    }
  }
  return static_cast<int32_t>(ranked.front().index);
}

}  // namespace specd
