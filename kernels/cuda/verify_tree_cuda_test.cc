// The token-tree acceptance kernels (kernels/cuda/verify.h: VerifyTreeGreedy,
// VerifyTreeStochastic) against their references (kernels/ref/verify.h), bit for bit: random
// batches (1..32 rows, ragged and uniform layouts) of random trees (0..64 drafts per row: chains,
// wide fans, random and beam-like shapes, repeated sibling tokens, ids outside the vocabulary,
// parents no draft can have), random target rows (peaked, sparse, with zero entries, without
// mass, unnormalised) at vocab 7, 1000, 32000 and 151936, random uniforms; outputs poisoned
// before every run. Also: wide trees up to kMaxTreeVerifyDrafts drafts, both kernels replayed
// from a CUDA graph, and the launchers' argument checks. Exits 77 (ctest: skipped) where no GPU
// is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/cuda/verify.h"
#include "kernels/ref/verify.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;

constexpr unsigned char kPoisonByte = 0x5a;  // int32 0x5a5a5a5a: no token, length or index
constexpr int32_t kPoison = 0x5a5a5a5a;

// One random batch of trees with everything both kernels read.
struct TreeBatch {
  int64_t batch = 0;
  int64_t max_draft_len = 0;
  int64_t vocab = 0;
  bool ragged = true;
  std::vector<int32_t> cu;       // [batch + 1]
  std::vector<int32_t> drafts;   // [num_drafts]
  std::vector<int32_t> parents;  // [num_drafts]
  std::vector<int32_t> targets;  // [num_drafts + batch] greedy: the target's token per position
  std::vector<float> p;          // [num_drafts + batch, vocab] sampled: target rows
  std::vector<float> uniforms;   // [num_drafts + batch]

  int64_t NumDrafts() const { return cu.back(); }
  int64_t NumPositions() const { return cu.back() + batch; }
  ref::DraftLayout RefLayout() const {
    return {ragged ? cu.data() : nullptr, batch, max_draft_len};
  }
};

// Parents of one row's k drafts in one of several shapes; a few parents no draft can have
// (itself, a later draft, below -1): such drafts are never visited, by either implementation.
std::vector<int32_t> RandomParents(int64_t k, std::mt19937_64& rng) {
  std::vector<int32_t> parents(k);
  const int shape = static_cast<int>(rng() % 5);
  for (int32_t j = 0; j < k; ++j) {
    switch (shape) {
      case 0:  // chain
        parents[j] = j - 1;
        break;
      case 1:  // a fan under the root, a few second-level nodes
        parents[j] = j < 8 || rng() % 4 != 0 ? -1 : static_cast<int32_t>(rng() % 8);
        break;
      case 2:  // random recursive tree
        parents[j] = static_cast<int32_t>(rng() % (j + 1)) - 1;
        break;
      case 3:  // beam-like: a parent among the last few drafts
        parents[j] = std::max<int32_t>(-1, j - 1 - static_cast<int32_t>(rng() % 4));
        break;
      default:  // deep with side branches
        parents[j] = rng() % 3 == 0 ? static_cast<int32_t>(rng() % (j + 1)) - 1 : j - 1;
        break;
    }
    if (rng() % 97 == 0) {
      const int32_t bad[] = {j, j + 1 + static_cast<int32_t>(rng() % 5), -2};
      parents[j] = bad[rng() % 3];
    }
  }
  return parents;
}

// A target row (vocab floats) of a random kind; `spikes` gets ids that carry much of its mass.
void RandomRow(int64_t vocab, std::mt19937_64& rng, float* row, std::vector<int32_t>* spikes) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  spikes->clear();
  const int kind = static_cast<int>(rng() % 12);
  std::fill(row, row + vocab, 0.0f);
  if (kind == 0) return;  // no mass
  const int num_spikes = 1 + static_cast<int>(rng() % 6);
  for (int s = 0; s < num_spikes; ++s) spikes->push_back(static_cast<int32_t>(rng() % vocab));
  double sum = 0;
  if (kind >= 3) {  // dense noise (a rough log-normal), some entries zero for kinds 3-5
    const float zero_fraction = kind <= 5 ? 0.3f : 0.0f;
    for (int64_t x = 0; x < vocab; ++x) {
      if (zero_fraction > 0 && unit(rng) < zero_fraction) continue;
      const float z = 2.0f * (unit(rng) + unit(rng) + unit(rng) - 1.5f);
      sum += row[x] = std::exp(3.0f * z);
    }
  }
  // Spikes: from a few percent of the mass to nearly all of it (kinds 1-2: all of it), the first
  // one dominant (the usual shape of a target row: drafts from it are often kept).
  const double spike_share = kind <= 2 ? 1.0 : 0.05 + 0.9 * unit(rng);
  const double spike_mass = kind <= 2 ? 1.0 : sum * spike_share / (1.0 - spike_share + 1e-9);
  std::vector<double> share(num_spikes);
  double share_sum = 0;
  for (int s = 0; s < num_spikes; ++s)
    share_sum += share[s] = s == 0 ? 2.0 + 4.0 * unit(rng) : 0.05 + unit(rng);
  for (int s = 0; s < num_spikes; ++s) {
    row[(*spikes)[s]] += static_cast<float>(spike_mass * share[s] / share_sum);
  }
  sum = 0;
  for (int64_t x = 0; x < vocab; ++x) sum += row[x];
  const double scale = kind == 11 ? 0.7 : kind == 10 ? 1.3 : 1.0;  // unnormalised rows
  for (int64_t x = 0; x < vocab; ++x) row[x] = static_cast<float>(row[x] * scale / sum);
}

// A random batch: rows of 0..max_k drafts (uniform layouts: all max_k), random trees, drafts
// mostly taken from the parent position's likely tokens (so paths go deep), some repeated from
// an earlier sibling, some random, some outside [0, vocab).
TreeBatch RandomBatch(int64_t batch, int64_t max_k, int64_t vocab, bool ragged, bool with_probs,
                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  TreeBatch b;
  b.batch = batch;
  b.vocab = vocab;
  b.ragged = ragged;
  b.cu.assign(batch + 1, 0);
  for (int64_t i = 0; i < batch; ++i) {
    int64_t k = max_k;
    if (ragged) {
      const uint64_t pick = rng() % 8;
      k = pick == 0   ? 0
          : pick == 1 ? max_k
          : pick == 2 ? std::min<int64_t>(max_k, 1 + static_cast<int64_t>(rng() % 4))
                      : static_cast<int64_t>(rng() % (max_k + 1));
    }
    b.cu[i + 1] = b.cu[i] + static_cast<int32_t>(k);
    b.max_draft_len = std::max(b.max_draft_len, k);
  }
  if (!ragged) b.max_draft_len = max_k;
  const int64_t positions = b.NumPositions();
  std::vector<std::vector<int32_t>> spikes(positions);
  if (with_probs) {
    b.p.resize(positions * vocab);
    for (int64_t r = 0; r < positions; ++r)
      RandomRow(vocab, rng, b.p.data() + r * vocab, &spikes[r]);
  }
  b.targets.resize(positions);
  for (int64_t r = 0; r < positions; ++r) {
    b.targets[r] =
        !spikes[r].empty() && rng() % 4 != 0 ? spikes[r][0] : static_cast<int32_t>(rng() % vocab);
  }
  b.drafts.resize(b.NumDrafts());
  b.parents.resize(b.NumDrafts());
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t start = b.cu[i], k = b.cu[i + 1] - start, position = start + i;
    const std::vector<int32_t> parents = RandomParents(k, rng);
    std::copy(parents.begin(), parents.end(), b.parents.begin() + start);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t parent = parents[j];
      const int64_t parent_position = position + (parent >= -1 && parent < j ? parent + 1 : 0);
      const std::vector<int32_t>& likely = spikes[parent_position];
      int32_t& d = b.drafts[start + j];
      const uint64_t pick = rng() % 20;
      if (pick < 8) {
        d = b.targets[parent_position];  // the greedy match
      } else if (pick < 14 && !likely.empty()) {
        d = likely[rng() % likely.size()];
      } else if (pick < 16 && j > 0) {
        d = b.drafts[start + static_cast<int64_t>(rng() % j)];  // often a sibling's token
      } else if (pick == 16) {
        d = rng() % 2 ? -1 : static_cast<int32_t>(vocab + static_cast<int64_t>(rng() % 3));
      } else {
        d = static_cast<int32_t>(rng() % vocab);
      }
    }
  }
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  b.uniforms.resize(positions);
  for (float& u : b.uniforms) {
    u = uniform(rng);
    if (u >= 1.0f) u = 0.0f;
    if (rng() % 50 == 0) u = 0.0f;  // the edges of [0, 1)
    if (rng() % 50 == 0) u = std::nextafter(1.0f, 0.0f);
  }
  return b;
}

// A device copy of `host` with room for one element at least (rows without drafts).
template <typename T>
DeviceBuffer Uploaded(const std::vector<T>& host) {
  DeviceBuffer buffer(std::max<size_t>(host.size(), 1) * sizeof(T));
  if (!host.empty()) {
    SPECD_CUDA_CHECK(cudaMemcpy(buffer.as<void>(), host.data(), host.size() * sizeof(T),
                                cudaMemcpyHostToDevice));
  }
  return buffer;
}

// The first n elements of a device buffer.
std::vector<int32_t> Downloaded(const DeviceBuffer& buffer, int64_t n) {
  std::vector<int32_t> host(n);
  if (n > 0) {
    SPECD_CUDA_CHECK(
        cudaMemcpy(host.data(), buffer.as<void>(), n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  }
  return host;
}

// The batch's inputs on the device and the three outputs.
class DeviceTrees {
 public:
  // probs_offset: floats the target rows start after a 16-byte boundary (1: unaligned rows,
  // the kernel's scalar loads).
  explicit DeviceTrees(const TreeBatch& b, int probs_offset = 0)
      : b_(b),
        cu_(Uploaded(b.cu)),
        drafts_(Uploaded(b.drafts)),
        parents_(Uploaded(b.parents)),
        targets_(Uploaded(b.targets)),
        p_((b.p.size() + probs_offset + 1) * sizeof(float)),
        uniforms_(Uploaded(b.uniforms)),
        accepted_(b.batch * sizeof(int32_t)),
        next_(b.batch * sizeof(int32_t)),
        paths_(std::max<int64_t>(b.NumDrafts(), 1) * sizeof(int32_t)),
        probs_offset_(probs_offset) {
    if (!b.p.empty()) {
      SPECD_CUDA_CHECK(cudaMemcpy(p_.as<float>() + probs_offset, b.p.data(),
                                  b.p.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
  }

  DraftLayout Layout() const {
    return {b_.ragged ? cu_.as<int32_t>() : nullptr, b_.batch, b_.max_draft_len};
  }

  void Poison() {
    for (DeviceBuffer* out : {&accepted_, &next_, &paths_}) {
      SPECD_CUDA_CHECK(cudaMemset(out->as<void>(), kPoisonByte, out->bytes()));
    }
  }

  cudaError_t Greedy(cudaStream_t stream) {
    return VerifyTreeGreedy(Layout(), drafts_.as<int32_t>(), parents_.as<int32_t>(),
                            targets_.as<int32_t>(), accepted_.as<int32_t>(), next_.as<int32_t>(),
                            paths_.as<int32_t>(), stream);
  }

  cudaError_t Stochastic(cudaStream_t stream) {
    return VerifyTreeStochastic(Layout(), drafts_.as<int32_t>(), parents_.as<int32_t>(),
                                p_.as<float>() + probs_offset_, b_.vocab, uniforms_.as<float>(),
                                accepted_.as<int32_t>(), next_.as<int32_t>(), paths_.as<int32_t>(),
                                stream);
  }

  // The outputs (paths: the batch's num_drafts entries).
  void Download(std::vector<int32_t>* accepted, std::vector<int32_t>* next,
                std::vector<int32_t>* paths) const {
    *accepted = Downloaded(accepted_, b_.batch);
    *next = Downloaded(next_, b_.batch);
    *paths = Downloaded(paths_, b_.NumDrafts());
  }

 private:
  const TreeBatch& b_;
  DeviceBuffer cu_, drafts_, parents_, targets_, p_, uniforms_;
  DeviceBuffer accepted_, next_, paths_;
  int probs_offset_;
};

// What the references give, with the untouched path entries holding the device's poison.
struct Expected {
  std::vector<int32_t> accepted, next, paths;
};

Expected RefGreedy(const TreeBatch& b) {
  Expected e{std::vector<int32_t>(b.batch, kPoison), std::vector<int32_t>(b.batch, kPoison),
             std::vector<int32_t>(b.NumDrafts(), kPoison)};
  ref::VerifyTreeGreedy(b.RefLayout(), b.drafts.data(), b.parents.data(), b.targets.data(),
                        e.accepted.data(), e.next.data(), e.paths.data());
  return e;
}

Expected RefStochastic(const TreeBatch& b) {
  Expected e{std::vector<int32_t>(b.batch, kPoison), std::vector<int32_t>(b.batch, kPoison),
             std::vector<int32_t>(b.NumDrafts(), kPoison)};
  ref::VerifyTreeStochastic(b.RefLayout(), b.drafts.data(), b.parents.data(), b.p.data(), b.vocab,
                            b.uniforms.data(), e.accepted.data(), e.next.data(), e.paths.data());
  return e;
}

// Asserts the device outputs equal `want`, naming the first differing row.
void ExpectEqual(const DeviceTrees& device, const TreeBatch& b, const Expected& want) {
  std::vector<int32_t> accepted, next, paths;
  device.Download(&accepted, &next, &paths);
  for (int64_t i = 0; i < b.batch; ++i) {
    const int32_t start = b.cu[i], k = b.cu[i + 1] - start;
    ASSERT_EQ(accepted[i], want.accepted[i]) << "row " << i << " of K " << k;
    ASSERT_EQ(next[i], want.next[i]) << "row " << i << " of K " << k;
    for (int32_t j = 0; j < k; ++j) {
      ASSERT_EQ(paths[start + j], want.paths[start + j]) << "row " << i << " path entry " << j;
    }
  }
}

// Coverage of a run of cases: the comparisons must have seen every outcome.
struct Coverage {
  int rows = 0, empty_rows = 0, deep = 0, rejected = 0, full = 0, no_mass = 0;

  void Add(const TreeBatch& b, const Expected& e) {
    for (int64_t i = 0; i < b.batch; ++i) {
      const int32_t k = b.cu[i + 1] - b.cu[i];
      ++rows;
      empty_rows += k == 0;
      deep += e.accepted[i] >= 3;
      rejected += e.accepted[i] < k;
      full += k > 0 && e.accepted[i] == k;
      no_mass += e.next[i] == -1;
    }
  }
};

struct Case {
  int64_t batch, max_k, vocab;
  bool ragged;
  int probs_offset;
};

std::vector<Case> RandomCases(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  auto add = [&](int64_t vocab, int count, int64_t max_batch) {
    for (int c = 0; c < count; ++c) {
      const int64_t batch = 1 + static_cast<int64_t>(rng() % max_batch);
      const int64_t max_k = c % 4 == 0 ? 64 : static_cast<int64_t>(rng() % 65);
      cases.push_back({batch, max_k, vocab, c % 5 != 1, c % 3 == 2 ? 1 : 0});
    }
  };
  add(7, 40, 32);  // tiny: vocab % 4 != 0, scalar loads; many repeated tokens
  add(1000, 12, 32);
  add(32000, 6, 32);
  add(151936, 3, 6);  // 151936-wide rows: a few hundred MB of host rows at most
  cases.push_back({32, 64, 32000, true, 0});
  cases.push_back({1, 0, 151936, false, 0});  // a plain row: the bonus draw only
  cases.push_back({32, 0, 7, false, 0});
  return cases;
}

TEST(VerifyTreeCudaTest, GreedyEqualsTheReference) {
  Coverage coverage;
  int index = 0;
  for (const Case& c : RandomCases(1)) {
    SCOPED_TRACE(testing::Message()
                 << "case " << index << ": batch " << c.batch << " max K " << c.max_k << " vocab "
                 << c.vocab << (c.ragged ? " ragged" : " uniform"));
    const TreeBatch b = RandomBatch(c.batch, c.max_k, c.vocab, c.ragged, false, 100 + index++);
    DeviceTrees device(b);
    device.Poison();
    SPECD_CUDA_CHECK(device.Greedy(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const Expected want = RefGreedy(b);
    ExpectEqual(device, b, want);
    coverage.Add(b, want);
  }
  // Long rows (the greedy kernel has no draft limit): several ballots per descent.
  for (int64_t k : {100, 333, 1024, 3000}) {
    SCOPED_TRACE(testing::Message() << "K " << k);
    const TreeBatch b = RandomBatch(5, k, 50, true, false, 7000 + k);
    DeviceTrees device(b);
    device.Poison();
    SPECD_CUDA_CHECK(device.Greedy(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const Expected want = RefGreedy(b);
    ExpectEqual(device, b, want);
    coverage.Add(b, want);
  }
  EXPECT_GT(coverage.deep, 20);
  EXPECT_GT(coverage.rejected, 100);
  EXPECT_GT(coverage.full, 5);
  EXPECT_GT(coverage.empty_rows, 20);
}

TEST(VerifyTreeCudaTest, StochasticEqualsTheReference) {
  Coverage coverage;
  int index = 0;
  for (const Case& c : RandomCases(2)) {
    SCOPED_TRACE(testing::Message()
                 << "case " << index << ": batch " << c.batch << " max K " << c.max_k << " vocab "
                 << c.vocab << (c.ragged ? " ragged" : " uniform")
                 << (c.probs_offset ? " unaligned" : ""));
    const TreeBatch b = RandomBatch(c.batch, c.max_k, c.vocab, c.ragged, true, 200 + index++);
    DeviceTrees device(b, c.probs_offset);
    device.Poison();
    SPECD_CUDA_CHECK(device.Stochastic(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const Expected want = RefStochastic(b);
    ExpectEqual(device, b, want);
    coverage.Add(b, want);
  }
  EXPECT_GT(coverage.deep, 8);  // 15 with these seeds
  EXPECT_GT(coverage.rejected, 100);
  EXPECT_GT(coverage.full, 5);
  EXPECT_GT(coverage.empty_rows, 20);
  EXPECT_GT(coverage.no_mass, 5);
}

// Up to kMaxTreeVerifyDrafts drafts in a row, fans of hundreds of siblings with repeated tokens:
// the block tests them all at once; the residual excludes hundreds of tokens.
TEST(VerifyTreeCudaTest, StochasticTakesWideTreesUpToTheLimit) {
  int index = 0;
  for (const int64_t vocab : {7, 1000, 32000}) {
    for (const int64_t k : {int64_t{200}, kMaxTreeVerifyDrafts}) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " K " << k);
      TreeBatch b = RandomBatch(4, k, vocab, false, true, 9000 + index++);
      // Row 0: every draft under the root, distinct tokens where the vocabulary allows, and a
      // flat root row: at vocab 32000 every child is likely rejected, and the residual draw
      // excludes all their tokens.
      std::mt19937_64 rng(index);
      std::uniform_real_distribution<float> weight(0.5f, 1.5f);
      double sum = 0;
      for (int64_t x = 0; x < vocab; ++x) sum += b.p[x] = weight(rng);
      for (int64_t x = 0; x < vocab; ++x) b.p[x] = static_cast<float>(b.p[x] / sum);
      for (int64_t j = 0; j < k; ++j) {
        b.parents[j] = -1;
        b.drafts[j] = static_cast<int32_t>((j * 7919) % vocab);
        if (b.uniforms[j] < 0.01f) b.uniforms[j] = 0.5f;  // u = 0 would keep any child
      }
      DeviceTrees device(b);
      device.Poison();
      SPECD_CUDA_CHECK(device.Stochastic(nullptr));
      SPECD_CUDA_CHECK(cudaDeviceSynchronize());
      ExpectEqual(device, b, RefStochastic(b));
    }
  }
}

// Both kernels are captured in a graph (no allocation, no host synchronisation) and replayed
// over fresh inputs of the same shape.
TEST(VerifyTreeCudaTest, BothKernelsReplayFromACudaGraph) {
  const TreeBatch b = RandomBatch(16, 32, 32000, true, true, 31);
  DeviceTrees device(b);
  cudaStream_t stream = nullptr;
  SPECD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (bool greedy : {true, false}) {
    SCOPED_TRACE(greedy ? "greedy" : "stochastic");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    SPECD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t launched = greedy ? device.Greedy(stream) : device.Stochastic(stream);
    SPECD_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    SPECD_CUDA_CHECK(launched);
    SPECD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    device.Poison();
    SPECD_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SPECD_CUDA_CHECK(cudaStreamSynchronize(stream));
    ExpectEqual(device, b, greedy ? RefGreedy(b) : RefStochastic(b));
    SPECD_CUDA_CHECK(cudaGraphExecDestroy(exec));
    SPECD_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  SPECD_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(VerifyTreeCudaTest, LaunchersRejectBadArgumentsAndSkipEmptyBatches) {
  DeviceBuffer buffer(1 << 16);
  auto* i32 = buffer.as<int32_t>();
  auto* f32 = buffer.as<float>();
  const DraftLayout ok{nullptr, 2, 4};
  EXPECT_EQ(VerifyTreeGreedy(ok, i32, nullptr, i32, i32, i32, i32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(VerifyTreeGreedy(ok, i32, i32, i32, i32, i32, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(VerifyTreeGreedy(ok, nullptr, i32, i32, i32, i32, i32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(VerifyTreeGreedy({nullptr, -1, 4}, i32, i32, i32, i32, i32, i32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(VerifyTreeGreedy({nullptr, 0, 4}, i32, i32, i32, i32, i32, i32, nullptr), cudaSuccess);
  auto sampled = [&](const DraftLayout& layout, int64_t vocab, const int32_t* parents,
                     int32_t* paths) {
    return VerifyTreeStochastic(layout, i32, parents, f32, vocab, f32, i32, i32, paths, nullptr);
  };
  EXPECT_EQ(sampled(ok, 8, nullptr, i32), cudaErrorInvalidValue);
  EXPECT_EQ(sampled(ok, 8, i32, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(sampled(ok, 0, i32, i32), cudaErrorInvalidValue);
  EXPECT_EQ(sampled(ok, kMaxVerifyVocab + 1, i32, i32), cudaErrorInvalidValue);
  EXPECT_EQ(sampled({nullptr, 2, kMaxTreeVerifyDrafts + 1}, 8, i32, i32), cudaErrorInvalidValue);
  EXPECT_EQ(sampled({nullptr, int64_t{1} << 40, 4}, 8, i32, i32), cudaErrorInvalidValue);
  EXPECT_EQ(sampled({nullptr, 0, kMaxTreeVerifyDrafts}, 8, i32, i32), cudaSuccess);
  EXPECT_EQ(VerifyTreeStochastic(ok, i32, i32, nullptr, 8, f32, i32, i32, i32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(VerifyTreeStochastic(ok, i32, i32, f32, 8, nullptr, i32, i32, i32, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels

int main(int argc, char** argv) {
  if (specd::kernels::check::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "verify_tree_cuda_test: no CUDA device visible; skipping\n");
    return specd::kernels::check::kSkipExitCode;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
