// The tensor-parallel vocabulary merge on one GPU: each "rank" is a column range of one logits
// table; the device path (ArgmaxRows / TopKRows over the shard, PackShardCandidates, the
// concatenation an all-gather makes, ScatterShardCandidates) must give the reference's merged rows
// bit for bit, and their argmax must be the full rows'. Part of kernels_cuda_test.
#include "kernels/cuda/vocab_merge.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/sampling.h"
#include "kernels/ref/sampling.h"
#include "kernels/ref/vocab_merge.h"

namespace specd::kernels {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <typename T>
T* Upload(const std::vector<T>& host) {
  T* d = nullptr;
  cudaMalloc(&d, std::max<size_t>(host.size(), 1) * sizeof(T));
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

TEST(VocabMergeCudaTest, MergedRowsEqualTheReferenceAndKeepTheArgmax) {
  struct Case {
    int32_t rows, vocab, world, k;
  };
  for (const Case c : {Case{1, 128256, 2, 1}, Case{64, 128256, 2, 1}, Case{7, 151936, 4, 16},
                       Case{5, 9, 4, 3}, Case{33, 32000, 8, 4}}) {
    SCOPED_TRACE(testing::Message() << "rows " << c.rows << " vocab " << c.vocab << " world "
                                    << c.world << " k " << c.k);
    std::mt19937 rng(c.vocab + c.rows);
    std::uniform_int_distribution<int> level(0, 200);  // ties across shards are common
    std::vector<float> full(static_cast<size_t>(c.rows) * c.vocab);
    for (float& x : full) x = 0.125f * static_cast<float>(level(rng));
    const int32_t shard = (c.vocab + c.world - 1) / c.world;
    const size_t pair_count = static_cast<size_t>(c.rows) * c.k * 2;
    std::vector<int32_t> want_pairs(pair_count * c.world);
    float* d_full = Upload(full);
    int32_t* d_pairs = Upload(std::vector<int32_t>(pair_count * c.world, 7));
    int32_t* d_ids = Upload(std::vector<int32_t>(static_cast<size_t>(c.rows) * c.k, 0));
    void* ws = nullptr;
    const size_t ws_bytes = TopKWorkspaceBytes(c.rows, shard, std::min(c.k, shard));
    if (ws_bytes > 0) {
      CUDA_OK(cudaMalloc(&ws, ws_bytes));
    }
    for (int32_t w = 0; w < c.world; ++w) {
      const int32_t begin = std::min(c.vocab, w * shard);
      const int32_t local = std::min(c.vocab - begin, shard);
      const int32_t kept = std::min(c.k, local);
      ref::ShardCandidates(full.data() + begin, c.vocab, c.rows, local, c.k, begin,
                           want_pairs.data() + pair_count * w);
      if (kept == 1) {
        CUDA_OK(ArgmaxRows(d_full + begin, c.vocab, c.rows, local, d_ids, nullptr));
      } else if (kept > 1) {
        CUDA_OK(
            TopKRows(d_full + begin, c.vocab, c.rows, local, kept, d_ids, ws, ws_bytes, nullptr));
      }
      CUDA_OK(PackShardCandidates(d_full + begin, c.vocab, c.rows, c.k, d_ids, kept, begin,
                                  d_pairs + pair_count * w, nullptr));
    }
    float* d_out = Upload(std::vector<float>(full.size(), 1.0f));
    CUDA_OK(
        ScatterShardCandidates(d_pairs, c.world, c.rows, c.k, c.vocab, d_out, c.vocab, nullptr));
    std::vector<int32_t> got_pairs(want_pairs.size());
    std::vector<float> got(full.size());
    CUDA_OK(cudaMemcpy(got_pairs.data(), d_pairs, got_pairs.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got_pairs, want_pairs);
    std::vector<float> want(full.size());
    ref::ScatterCandidates(want_pairs.data(), c.world, c.rows, c.k, c.vocab, want.data(), c.vocab);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    std::vector<int32_t> argmax_full(c.rows), argmax_merged(c.rows);
    ref::ArgmaxRows(full.data(), c.vocab, c.rows, c.vocab, argmax_full.data());
    ref::ArgmaxRows(got.data(), c.vocab, c.rows, c.vocab, argmax_merged.data());
    EXPECT_EQ(argmax_merged, argmax_full);
    cudaFree(d_full);
    cudaFree(d_pairs);
    cudaFree(d_ids);
    cudaFree(d_out);
    if (ws != nullptr) cudaFree(ws);
  }
}

TEST(VocabMergeCudaTest, RefusesSizesItCannotRun) {
  EXPECT_EQ(PackShardCandidates(nullptr, 1, 1, 0, nullptr, 0, 0, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(PackShardCandidates(nullptr, 1, 1, 2, nullptr, 3, 0, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ScatterShardCandidates(nullptr, 0, 1, 1, 1, nullptr, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ScatterShardCandidates(nullptr, 1, 1, 1, 8, nullptr, 4, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels
