// Helpers shared by the CUDA runner's GPU tests (cuda_runner_test.cc, codepair_cuda_test.cc):
// model paths under $SPECD_SHARED_DIR, runner options, a runner with block tables from a real
// allocator, the greedy-agreement rule, the data check (missing data fails), and the main that
// skips (exit 77) without a visible GPU, the only reason a GPU test may skip.
// Test code only (needs SPECD_SHARED_DIR and GoogleTest).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"

namespace specd::cuda_test {

inline std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? std::string(v) : fallback;
}
inline std::string SharedDir() { return Env("SPECD_SHARED_DIR", SPECD_SHARED_DIR); }
inline std::string ModelDir(const std::string& rel) { return SharedDir() + "/models/" + rel; }

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
}

// Whenever a test body runs a GPU is visible (RunUnlessNoGpu exits 77 otherwise), so the data
// the test needs must be there too: use as ASSERT_TRUE(DataPresent(path)). A missing path is a
// failure naming it, never a skip.
inline ::testing::AssertionResult DataPresent(const std::string& path) {
  if (std::filesystem::exists(path)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << path
         << " is absent (set SPECD_SHARED_DIR / SPECD_SHAPES_DIR): a GPU is visible, so missing "
            "test data fails the test";
}

inline std::vector<int32_t> Ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

inline RunnerOptions Options(const std::string& dir, const std::string& device) {
  RunnerOptions o;
  o.model_dir = dir;
  o.device = device;
  o.max_model_len = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 1024;
  o.kv_cache_bytes = int64_t{64} << 20;
  return o;
}

inline std::unique_ptr<ModelRunner> MakeRunner(const RunnerOptions& o) {
  auto runner = CreateModelRunner(o);
  EXPECT_TRUE(runner.ok()) << o.device << " " << o.model_dir << ": " << runner.status();
  return runner.ok() ? std::move(*runner) : nullptr;
}

// A runner with block tables from a real allocator (as model_golden_test's harness).
class Harness {
 public:
  explicit Harness(std::unique_ptr<ModelRunner> runner) : runner_(std::move(runner)) {
    if (runner_) allocator_ = std::make_unique<BlockAllocator>(runner_->num_kv_blocks());
  }
  bool ok() const { return runner_ != nullptr; }
  ModelRunner& runner() { return *runner_; }
  int32_t vocab() const { return runner_->config().vocab_size; }

  int AddSequence() {
    tables_.emplace_back(runner_->block_size());
    lengths_.push_back(0);
    return static_cast<int>(tables_.size()) - 1;
  }
  struct Chunk {
    int seq;
    std::vector<int32_t> tokens;
    bool all_logits;
    const SsvStrategy* ssv = nullptr;  // an NSA model's verification strategy for the chunk
  };
  std::vector<float> Run(const std::vector<Chunk>& chunks) {
    std::vector<SequenceInput> batch;
    for (const Chunk& c : chunks) {
      const int32_t end = lengths_[c.seq] + static_cast<int32_t>(c.tokens.size());
      EXPECT_TRUE(tables_[c.seq].EnsureCapacity(end, *allocator_).ok());
      batch.push_back({c.tokens, lengths_[c.seq], tables_[c.seq].ids(), c.all_logits});
      batch.back().ssv = c.ssv;
    }
    std::vector<float> logits;
    const absl::Status s = runner_->Forward(batch, &logits);
    EXPECT_TRUE(s.ok()) << s;
    for (const Chunk& c : chunks) lengths_[c.seq] += static_cast<int32_t>(c.tokens.size());
    return logits;
  }
  void Release(int seq) { EXPECT_TRUE(tables_[seq].Release(*allocator_).ok()); }
  // Logits of the last position of `tokens` run as one prefill in a fresh sequence.
  std::vector<float> LastLogits(const std::vector<int32_t>& tokens) {
    const int seq = AddSequence();
    std::vector<float> logits = Run({{seq, tokens, false}});
    Release(seq);
    return logits;
  }
  // Prefill, then one decode step per token (the GPU's graph path), argmax on the host.
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    const int seq = AddSequence();
    std::vector<float> logits = Run({{seq, prompt, false}});
    std::vector<int32_t> out;
    while (static_cast<int>(out.size()) < n) {
      out.push_back(Argmax(logits));
      if (static_cast<int>(out.size()) < n) logits = Run({{seq, {out.back()}, false}});
    }
    Release(seq);
    return out;
  }

 private:
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::vector<BlockTable> tables_;
  std::vector<int32_t> lengths_;
};

inline double MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double{a[i]} - b[i]));
  return d;
}

// Greedy rule (a, b, c): two greedy runs that should agree may differ only where bf16 noise
// explains it. At the first differing position we take the CPU fp32 logits of the common
// prefix and the GPU's logits of the same prefix; the divergence is accepted only if the CPU's
// preference for its token over the GPU's token (logit difference) is at most twice the largest
// |gpu - cpu| logit error on that row. Every divergence is printed with position, ids, margin
// and error; tokens after an accepted divergence are not compared.
// `expected` is the reference continuation (CPU or HF), `got` the GPU's. True when they agree up
// to an accepted divergence.
inline bool GreedyAgrees(const std::string& what, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& expected, const std::vector<int32_t>& got,
                         Harness& cpu, Harness& gpu) {
  size_t k = 0;
  while (k < expected.size() && k < got.size() && expected[k] == got[k]) ++k;
  if (k == expected.size() && k == got.size()) return true;
  if (k == expected.size() || k == got.size()) {
    std::printf("[ %s ] lengths differ: %zu vs %zu\n", what.c_str(), expected.size(), got.size());
    return false;
  }
  std::vector<int32_t> prefix = prompt;
  prefix.insert(prefix.end(), expected.begin(), expected.begin() + k);
  const std::vector<float> c = cpu.LastLogits(prefix), g = gpu.LastLogits(prefix);
  const double margin = double{c[expected[k]]} - c[got[k]];
  const double error = MaxAbsDiff(c, g);
  const bool accepted = margin <= 2 * error;
  std::printf(
      "[ %s ] diverges at generated position %zu: expected %d, got %d; CPU margin %.5f, max "
      "|gpu - cpu| logit error %.5f there: %s\n",
      what.c_str(), k, expected[k], got[k], margin, error, accepted ? "accepted" : "REJECTED");
  return accepted;
}

// The main of each GPU test binary: exits 77 (ctest's "skipped") where no GPU is visible.
inline int RunUnlessNoGpu(int argc, char** argv, const char* test_name) {
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "%s: no CUDA device visible; skipping\n", test_name);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace specd::cuda_test
