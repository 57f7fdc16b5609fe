// Online acceptance estimates per request and method, for StrategyPolicy: how likely each draft
// position is to be accepted, given the ones before it were, and how often the method offers a
// draft at all (an n-gram lookup finds no match; such a round costs a plain row). Each verified
// round updates an exponential average of the request's per-position rates and offer rate; a
// request's first round of a method starts from that method's global average (itself a slower
// exponential average over every request), so a new request is neither optimistic nor
// pessimistic. A request's estimate of a method it has stopped running relaxes back towards the
// global average, relax_weight per step (Tick), so that a few bad rounds do not rule the method
// out for the rest of the request: the policy tries it again once the estimate says it may pay.
// Engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/policy/cost_profile.h"

namespace specd {

struct AcceptanceOptions {
  double request_weight = 0.3;  // weight of a new round in a request's average
  double global_weight = 0.05;  // weight of a new round in the method's global average
  double prior = 0.6;           // global rate of a method before any round was seen
  int32_t max_positions = 16;   // positions tracked; later ones share the last rate
  double relax_weight = 0.03;   // per step without a round: pull towards the global average
  absl::Status Validate() const;
};

// Expected tokens one round commits with K drafts whose conditional acceptance rates are
// rates[0..K-1] (position j is accepted with probability rates[j] once 0..j-1 were): the accepted
// prefix plus the correction or bonus token, 1 + sum_j prod_{l<=j} rates[l]. With one rate a at
// every position this is (1 - a^(K+1)) / (1 - a). Positions past rates.size() use its last entry.
double ExpectedCommittedTokens(const std::vector<double>& rates, int32_t k);

class AcceptanceEstimator {
 public:
  explicit AcceptanceEstimator(AcceptanceOptions options = {});

  // One verified round of `method` for `request`: `num_drafts` drafted, the first `accepted` of
  // them accepted. Positions 0..accepted-1 count as accepted, position `accepted` (when drafted)
  // as rejected; later positions were not tested and are left alone. num_drafts 0: the method
  // offered no draft (only the offer rate moves). Plain rounds are ignored.
  void Observe(uint64_t request, PolicyMethod method, int32_t num_drafts, int32_t accepted);
  // One step passed (the relaxation's clock).
  void Tick() { ++now_; }

  // Conditional acceptance at draft position `position` (0-based): the request's estimate once
  // it has run `method`, else the method's global average.
  double Rate(uint64_t request, PolicyMethod method, int32_t position) const;
  double GlobalRate(PolicyMethod method, int32_t position) const;
  // How often `method` offers `request` a draft (the estimate, as Rate).
  double OfferRate(uint64_t request, PolicyMethod method) const;
  // 1 + OfferRate x (ExpectedCommittedTokens over Rate(request, method, 0..k-1) - 1): a round
  // without an offer commits one token. 1 for k 0 or plain.
  double ExpectedCommitted(uint64_t request, PolicyMethod method, int32_t k) const;
  // ExpectedCommitted at every K in 0..k into out[0..k], in one pass.
  void ExpectedCommittedUpTo(uint64_t request, PolicyMethod method, int32_t k,
                             std::vector<double>* out) const;

  // Seeds a method's global average at every position (e.g. from the previous run).
  void SetGlobalRate(PolicyMethod method, double rate);
  void Forget(uint64_t request);
  size_t num_requests() const { return requests_.size(); }

 private:
  using Rates = std::vector<double>;  // [max_positions]; empty: not run yet
  struct Estimate {
    Rates rates;       // empty: the request has not run the method
    double offer = 1;  // share of its rounds that had a draft
    int64_t tick = 0;  // when last observed (relaxation)
  };
  using PerMethod = std::array<Estimate, kNumPolicyMethods>;

  // The request's estimate of `method` relaxed to now, in `rates` / `offer`; false: none (the
  // global average applies).
  bool Current(uint64_t request, int method, Rates* rates, double* offer) const;

  AcceptanceOptions options_;
  std::array<Rates, kNumPolicyMethods> global_;
  std::array<double, kNumPolicyMethods> global_offer_;
  absl::flat_hash_map<uint64_t, PerMethod> requests_;
  int64_t now_ = 0;
  mutable Rates scratch_;  // Current's output for the const readers
};

}  // namespace specd
