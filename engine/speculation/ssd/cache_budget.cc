#include "engine/speculation/ssd/cache_budget.h"

#include <algorithm>

namespace specd {
namespace {

// Decay of the wave cost model's older samples, per newer one.
constexpr double kWaveDecay = 0.9;

}  // namespace

void WaveCostModel::Add(double branches, double seconds) {
  // A one-off stall (a CUDA graph captured for a new shape, a page fault) must not stop the
  // cache from growing for many rounds: a sample counts at most twice the prediction once a few
  // waves are in (a wave that really got dearer still moves the estimate, doubling each time).
  if (weight_ >= 3) seconds = std::min(seconds, 2 * Predict(branches));
  weight_ = weight_ * kWaveDecay + 1;
  sx_ = sx_ * kWaveDecay + branches;
  sy_ = sy_ * kWaveDecay + seconds;
  sxx_ = sxx_ * kWaveDecay + branches * branches;
  sxy_ = sxy_ * kWaveDecay + branches * seconds;
}

double WaveCostModel::Predict(double branches) const {
  if (weight_ <= 0) return 0;
  const double mx = sx_ / weight_, my = sy_ / weight_;
  const double var = sxx_ / weight_ - mx * mx;
  // Waves of (nearly) one size: in proportion above it; below it, half of the cost is taken as
  // fixed (a pass reads its weights whatever its rows), until a second size is measured.
  if (var < 1.0 || mx <= 0) {
    if (mx <= 0) return my;
    return branches >= mx ? my * branches / mx : my * (0.5 + 0.5 * branches / mx);
  }
  const double slope = std::max(0.0, (sxy_ / weight_ - mx * my) / var);
  return std::max(0.0, my + slope * (branches - mx));
}

int32_t BranchesWithin(const WaveCostModel& model, double window, int32_t per_wave,
                       int32_t max_branches) {
  if (per_wave < 1 || window <= 0) return 0;
  const double full = model.Predict(per_wave);
  int32_t branches = 0;
  double spent = 0;
  while (branches < max_branches) {
    const int32_t wave = std::min(per_wave, max_branches - branches);
    if (wave == per_wave && spent + full <= window) {  // a whole wave more fits
      spent += full;
      branches += wave;
      continue;
    }
    // The last wave: the most branches that still fit.
    int32_t fit = 0;
    for (int32_t n = wave; n >= 1; --n) {
      if (spent + model.Predict(n) <= window) {
        fit = n;
        break;
      }
    }
    return branches + fit;
  }
  return branches;
}

std::vector<int32_t> SplitBudget(int32_t total, std::span<const int32_t> cap) {
  std::vector<int32_t> out(cap.size(), 0);
  int32_t left = std::max(0, total);
  // Rounds of an even share over the sequences still below their caps.
  while (left > 0) {
    int32_t open = 0;
    for (size_t i = 0; i < cap.size(); ++i) open += out[i] < cap[i] ? 1 : 0;
    if (open == 0) break;
    const int32_t share = std::max(1, left / open);
    for (size_t i = 0; i < cap.size() && left > 0; ++i) {
      const int32_t give = std::min({share, cap[i] - out[i], left});
      if (give <= 0) continue;
      out[i] += give;
      left -= give;
    }
  }
  return out;
}

}  // namespace specd
