#include "engine/policy/acceptance_estimator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace specd {
namespace {

void Update(std::vector<double>& rates, double weight, int32_t num_drafts, int32_t accepted) {
  const int32_t n = static_cast<int32_t>(rates.size());
  const int32_t tested = std::min(num_drafts, accepted + 1);
  for (int32_t j = 0; j < tested; ++j) {
    const double seen = j < accepted ? 1.0 : 0.0;
    double& r = rates[std::min(j, n - 1)];
    r += weight * (seen - r);
  }
}

}  // namespace

absl::Status AcceptanceOptions::Validate() const {
  if (!(request_weight > 0 && request_weight <= 1) || !(global_weight > 0 && global_weight <= 1)) {
    return absl::InvalidArgumentError("acceptance weights must be in (0, 1]");
  }
  if (!(prior >= 0 && prior <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("acceptance prior ", prior, " not in [0, 1]"));
  }
  if (max_positions < 1) return absl::InvalidArgumentError("max_positions must be at least 1");
  if (!(relax_weight >= 0 && relax_weight <= 1)) {
    return absl::InvalidArgumentError("acceptance relax_weight must be in [0, 1]");
  }
  return absl::OkStatus();
}

double ExpectedCommittedTokens(const std::vector<double>& rates, int32_t k) {
  double expected = 1;  // the correction or bonus token
  double all_accepted = 1;
  for (int32_t j = 0; j < k && !rates.empty(); ++j) {
    all_accepted *= std::clamp(rates[std::min<size_t>(j, rates.size() - 1)], 0.0, 1.0);
    expected += all_accepted;
  }
  return expected;
}

AcceptanceEstimator::AcceptanceEstimator(AcceptanceOptions options) : options_(options) {
  options_.max_positions = std::max(options_.max_positions, 1);
  for (auto& g : global_) g.assign(options_.max_positions, std::clamp(options_.prior, 0.0, 1.0));
  global_offer_.fill(1);
}

bool AcceptanceEstimator::Current(uint64_t request, int method, Rates* rates, double* offer) const {
  const auto it = requests_.find(request);
  if (it == requests_.end() || it->second[method].rates.empty()) return false;
  const Estimate& e = it->second[method];
  // Each step without a round keeps (1 - relax_weight) of the distance to the global average
  // (the step after a round does not count: a method run every step does not relax).
  const double keep = std::pow(1 - std::clamp(options_.relax_weight, 0.0, 1.0),
                               static_cast<double>(std::max<int64_t>(0, now_ - e.tick - 1)));
  const Rates& g = global_[method];
  rates->resize(e.rates.size());
  for (size_t j = 0; j < e.rates.size(); ++j) (*rates)[j] = g[j] + keep * (e.rates[j] - g[j]);
  *offer = global_offer_[method] + keep * (e.offer - global_offer_[method]);
  return true;
}

void AcceptanceEstimator::Observe(uint64_t request, PolicyMethod method, int32_t num_drafts,
                                  int32_t accepted) {
  if (method == PolicyMethod::kPlain) return;
  const int m = static_cast<int>(method);
  Estimate& e = requests_[request][m];
  if (e.rates.empty()) {  // seeded from the method's recent global average
    e.rates = global_[m];
    e.offer = global_offer_[m];
  } else {
    Current(request, m, &e.rates, &e.offer);
  }
  e.tick = now_;
  const double offered = num_drafts > 0 ? 1 : 0;
  e.offer += options_.request_weight * (offered - e.offer);
  global_offer_[m] += options_.global_weight * (offered - global_offer_[m]);
  if (num_drafts <= 0) return;
  accepted = std::clamp(accepted, 0, num_drafts);
  Update(e.rates, options_.request_weight, num_drafts, accepted);
  Update(global_[m], options_.global_weight, num_drafts, accepted);
}

double AcceptanceEstimator::GlobalRate(PolicyMethod method, int32_t position) const {
  const Rates& g = global_[static_cast<int>(method)];
  return g[std::clamp<int32_t>(position, 0, g.size() - 1)];
}

double AcceptanceEstimator::Rate(uint64_t request, PolicyMethod method, int32_t position) const {
  double offer = 1;
  if (!Current(request, static_cast<int>(method), &scratch_, &offer)) {
    return GlobalRate(method, position);
  }
  return scratch_[std::clamp<int32_t>(position, 0, scratch_.size() - 1)];
}

double AcceptanceEstimator::OfferRate(uint64_t request, PolicyMethod method) const {
  double offer = 1;
  if (!Current(request, static_cast<int>(method), &scratch_, &offer)) {
    return global_offer_[static_cast<int>(method)];
  }
  return offer;
}

double AcceptanceEstimator::ExpectedCommitted(uint64_t request, PolicyMethod method,
                                              int32_t k) const {
  if (method == PolicyMethod::kPlain || k <= 0) return 1;
  const int m = static_cast<int>(method);
  double offer = global_offer_[m];
  const Rates& r = Current(request, m, &scratch_, &offer) ? scratch_ : global_[m];
  return 1 + offer * (ExpectedCommittedTokens(r, k) - 1);
}

void AcceptanceEstimator::ExpectedCommittedUpTo(uint64_t request, PolicyMethod method, int32_t k,
                                                std::vector<double>* out) const {
  out->assign(std::max(k, 0) + 1, 1.0);
  if (method == PolicyMethod::kPlain || k <= 0) return;
  const int m = static_cast<int>(method);
  double offer = global_offer_[m];
  const Rates& r = Current(request, m, &scratch_, &offer) ? scratch_ : global_[m];
  double expected = 1;
  double all_accepted = 1;
  for (int32_t j = 0; j < k; ++j) {  // as ExpectedCommittedTokens, keeping every prefix
    all_accepted *= std::clamp(r[std::min<size_t>(j, r.size() - 1)], 0.0, 1.0);
    expected += all_accepted;
    (*out)[j + 1] = 1 + offer * (expected - 1);
  }
}

void AcceptanceEstimator::SetGlobalRate(PolicyMethod method, double rate) {
  global_[static_cast<int>(method)].assign(options_.max_positions, std::clamp(rate, 0.0, 1.0));
}

void AcceptanceEstimator::Forget(uint64_t request) { requests_.erase(request); }

}  // namespace specd
