// The SSD speculator's time budget (docs/architecture.md "SSD"): what one wave of the cache build
// costs against its branch count, how many branches fit the verifier's window, and how they are
// spread over the sequences. Pure; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specd {

// What one wave of the cache build (one batched Propose over its branches: K + 1 passes of a
// draft model, one pass of a parallel draft) costs, in seconds, against its number of branches:
// a least-squares line over the recent waves (each older one counts 0.9 as much as the next).
// Before waves of two sizes were seen, a wave of n branches is predicted from the mean wave: in
// proportion above the mean size, with half of its cost fixed below it. Once three waves are in,
// a sample counts at most twice its prediction (one-off stalls).
class WaveCostModel {
 public:
  void Add(double branches, double seconds);
  // Predicted seconds of a wave of `branches`; 0 before any wave.
  double Predict(double branches) const;
  bool measured() const { return weight_ > 0; }

 private:
  double weight_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
};

// The most branches whose waves (of at most per_wave each) the model predicts to build within
// `window` seconds, at most max_branches; 0 when not even one fits.
int32_t BranchesWithin(const WaveCostModel& model, double window, int32_t per_wave,
                       int32_t max_branches);

// Splits `total` branches evenly over sequences, each getting at most cap[i] (what is left
// above a cap goes to the others; earlier sequences get the remainder of an uneven split).
std::vector<int32_t> SplitBudget(int32_t total, std::span<const int32_t> cap);

}  // namespace specd
