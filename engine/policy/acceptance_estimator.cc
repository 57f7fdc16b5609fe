#include "engine/policy/acceptance_estimator.h"

#include <algorithm>

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
}

void AcceptanceEstimator::Observe(uint64_t request, PolicyMethod method, int32_t num_drafts,
                                  int32_t accepted) {
  if (method == PolicyMethod::kPlain || num_drafts <= 0) return;
  accepted = std::clamp(accepted, 0, num_drafts);
  const int m = static_cast<int>(method);
  Rates& rates = requests_[request][m];
  if (rates.empty()) rates = global_[m];  // seeded from the method's recent global average
  Update(rates, options_.request_weight, num_drafts, accepted);
  Update(global_[m], options_.global_weight, num_drafts, accepted);
}

double AcceptanceEstimator::GlobalRate(PolicyMethod method, int32_t position) const {
  const Rates& g = global_[static_cast<int>(method)];
  return g[std::clamp<int32_t>(position, 0, g.size() - 1)];
}

double AcceptanceEstimator::Rate(uint64_t request, PolicyMethod method, int32_t position) const {
  const auto it = requests_.find(request);
  if (it == requests_.end() || it->second[static_cast<int>(method)].empty()) {
    return GlobalRate(method, position);
  }
  const Rates& r = it->second[static_cast<int>(method)];
  return r[std::clamp<int32_t>(position, 0, r.size() - 1)];
}

double AcceptanceEstimator::ExpectedCommitted(uint64_t request, PolicyMethod method,
                                              int32_t k) const {
  if (method == PolicyMethod::kPlain || k <= 0) return 1;
  const auto it = requests_.find(request);
  const int m = static_cast<int>(method);
  const Rates& r = it == requests_.end() || it->second[m].empty() ? global_[m] : it->second[m];
  return ExpectedCommittedTokens(r, k);
}

void AcceptanceEstimator::SetGlobalRate(PolicyMethod method, double rate) {
  global_[static_cast<int>(method)].assign(options_.max_positions, std::clamp(rate, 0.0, 1.0));
}

void AcceptanceEstimator::Forget(uint64_t request) { requests_.erase(request); }

}  // namespace specd
