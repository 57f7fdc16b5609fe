// The target's raw next-token logits on a fresh CPU runner, for the speculation tests that work
// out by hand the distribution a token must follow (engine_spec_test, engine_spec_options_test).
// Test code only.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"

namespace specd::speculation_test {

// Softmax of a logits row, in double.
inline std::vector<double> Softmax(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(double{logits[i]} - max);
  for (double& v : p) v /= sum;
  return p;
}

// Last-position logits of `ids` on a fresh runner of `model` (CPU): [vocab] f32.
inline std::vector<float> LastLogits(const std::string& model, const std::vector<int32_t>& ids) {
  RunnerOptions o;
  o.model_dir = model;
  o.device = "cpu";
  o.max_model_len = 1024;
  auto runner = CreateModelRunner(o);
  EXPECT_TRUE(runner.ok());
  BlockAllocator allocator((*runner)->num_kv_blocks());
  BlockTable table((*runner)->block_size());
  EXPECT_TRUE(table.EnsureCapacity(static_cast<int32_t>(ids.size()), allocator).ok());
  std::vector<SequenceInput> batch = {{ids, 0, table.ids(), false}};
  std::vector<float> logits;
  EXPECT_TRUE((*runner)->Forward(batch, &logits).ok());
  return logits;
}

}  // namespace specd::speculation_test
