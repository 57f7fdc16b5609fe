// SsvPlanner: which SSV strategy (engine/base/ssv.h) an NSA target's verification runs, per request
// and step, from the strategies' measured verification grids in the cost profile (CostProfile::
// ssv(), written by specd_profile --ssv / ssv_bench --tune). A strategy's value for a round of K
// drafts is the tokens the round is expected to commit over its time:
//   ExpectedCommittedTokens(alpha_s, K) / (draft ms (method, batch, K, context)
//                                          + verify ms_s (batch, K + 1, context))
// alpha_s is the request's own acceptance under strategy s once it has run s for min_rounds
// rounds; before that its acceptance under the lossless strategies (they verify identically,
// so one estimate serves them all), and before that the profile's alpha. Lossless strategies
// therefore rank by their verification time; a lossy one (mode shared, reuse layers) is taken
// while its time wins at the acceptance the request has shown, and when its own measured
// acceptance departs from that (a lossy verifier rejects drafts the model would accept), its
// value falls and the request moves to the next-ranked strategy. Lossy strategies are offered
// only to requests that allow them (not `"strict": true`; the runner must run them).
// No engine types; engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/base/ssv.h"
#include "engine/policy/cost_profile.h"

namespace specd {

struct SsvPlannerOptions {
  int32_t min_rounds = 8;  // rounds under a strategy before its own acceptance is used
  // Weight of a new round in a request's decayed counts (about 1 / window in rounds).
  double round_weight = 1.0 / 32;
  // Hysteresis: a request keeps the strategy it holds while that one's value is within this
  // share of the best's (strategies a few percent apart would otherwise alternate with the noise
  // of the acceptance estimate).
  double switch_margin = 0.03;
};

// One request's acceptance per profile strategy: decayed counts of accepted drafts and of
// rounds that ended in a rejection; alpha = accepted / (accepted + rejections), the maximum-
// likelihood per-token acceptance of a chain whose rounds stop at the first rejection.
class SsvAcceptance {
 public:
  // A verified round under profile strategy `index` (CostProfile::ssv() order): `drafts`
  // drafted, the first `accepted` accepted. Rounds without drafts are ignored.
  void Note(size_t index, bool lossy, int32_t drafts, int32_t accepted,
            const SsvPlannerOptions& options);
  // The strategy's own estimate once it has min_rounds rounds, else the lossless estimate once
  // that has, else `prior`.
  double Alpha(size_t index, bool lossy, double prior, const SsvPlannerOptions& options) const;

 private:
  struct Counts {
    double accepted = 0;
    double rejections = 0;
    int32_t rounds = 0;
    void Add(int32_t drafts, int32_t accepted, double weight);
    double Alpha() const;
  };
  std::vector<Counts> by_strategy_;
  Counts lossless_;  // every lossless strategy's rounds: they verify alike
};

struct SsvRanked {
  size_t index = 0;  // into CostProfile::ssv()
  double alpha = 0;
  double round_ms = 0;  // draft + verification
  double tokens_per_second = 0;
};

class SsvPlanner {
 public:
  SsvPlanner(const CostProfile& profile, SsvPlannerOptions options = {})
      : profile_(profile), options_(options) {}

  bool empty() const { return profile_.ssv().empty(); }
  const SsvPlannerOptions& options() const { return options_; }
  const CostProfile& profile() const { return profile_; }

  // The strategies a round of `k` drafts by `method` may verify with, best first (ties: profile
  // order); `batch` rows of the step verify, at `context` tokens. measured: the request's
  // acceptance (null: the profile's alpha for every strategy). Lossy strategies only with
  // allow_lossy.
  std::vector<SsvRanked> Rank(PolicyMethod method, double batch, int32_t k, double context,
                              bool allow_lossy, const SsvAcceptance* measured) const;
  // Rank's first, or `held` (a profile index, -1: none) while it is allowed and its value is
  // within switch_margin of the first's; -1 when no strategy is allowed (or the profile has none).
  int32_t Choose(PolicyMethod method, double batch, int32_t k, double context, bool allow_lossy,
                 const SsvAcceptance* measured, int32_t held = -1) const;

 private:
  const CostProfile& profile_;
  SsvPlannerOptions options_;
};

}  // namespace specd
