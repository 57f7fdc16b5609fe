// The fused decode launch RopeAndWriteKvCache (rope.h) against the launches it replaces, bit for
// bit: HeadRmsNorm of q and k (where the model has q_norm / k_norm), ApplyRope, WriteKvCache; both
// vector widths, partial rotary, skipped slots. Part of kernels_cuda_test.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/rope.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;

__nv_bfloat16* At(const DeviceBuffer& b, int64_t offset = 0) {
  return b.as<__nv_bfloat16>() + offset;
}

TEST(RopeAndWriteKvCacheTest, EqualsTheLaunchesItReplacesBitForBit) {
  struct Case {
    int32_t tokens, q_heads, kv_heads, head_dim, rot_dim, block_size, row_pad;
    bool norm;
  };
  // Llama-3.2-1B's heads (16-byte path), Qwen3-8B's with q/k norms, partial rotary (with and
  // without norms), a padded row (scalar paths, with and without norms), MHA.
  for (const Case c : {Case{1, 32, 8, 64, 64, 16, 0, false}, Case{7, 32, 8, 64, 64, 16, 0, false},
                       Case{3, 32, 8, 128, 128, 16, 0, true}, Case{33, 8, 2, 128, 64, 32, 0, false},
                       Case{33, 8, 2, 128, 64, 32, 0, true}, Case{5, 4, 1, 64, 64, 16, 4, false},
                       Case{5, 4, 1, 64, 64, 16, 4, true}, Case{9, 4, 4, 32, 16, 64, 0, false}}) {
    SCOPED_TRACE(testing::Message() << "tokens " << c.tokens << " heads " << c.q_heads << "/"
                                    << c.kv_heads << " d " << c.head_dim << " rot " << c.rot_dim
                                    << " pad " << c.row_pad << (c.norm ? " norm" : ""));
    const int64_t kv_row = int64_t{c.kv_heads} * c.head_dim;
    const int64_t stride = int64_t{c.q_heads} * c.head_dim + 2 * kv_row + c.row_pad;
    const int64_t positions_max = 4096, blocks = (c.tokens + c.block_size - 1) / c.block_size + 2;
    std::mt19937_64 rng(c.tokens * 131 + c.head_dim);
    const auto qkv_host = check::RandomBf16(c.tokens * stride, -2.0f, 2.0f, rng);
    std::vector<float> cos_sin(positions_max * c.rot_dim);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (float& v : cos_sin) v = unit(rng);
    const auto norms_host = check::RandomBf16(2 * c.head_dim, 0.5f, 1.5f, rng);  // q_norm, k_norm
    DeviceBuffer norms(norms_host.size() * 2);
    norms.Upload(norms_host);
    const __nv_bfloat16* q_norm = c.norm ? At(norms) : nullptr;
    const __nv_bfloat16* k_norm = c.norm ? At(norms, c.head_dim) : nullptr;
    constexpr float kEps = 1e-6f;
    std::vector<int32_t> positions(c.tokens);
    std::vector<int64_t> slots(c.tokens);
    for (int32_t t = 0; t < c.tokens; ++t) {
      positions[t] = static_cast<int32_t>(rng() % positions_max);
      slots[t] = t % 3 == 2 ? -1 : (blocks * c.block_size - 1 - 2 * t);  // -1: skipped
    }
    DeviceBuffer positions_dev(positions.size() * 4), slots_dev(slots.size() * 8),
        table(cos_sin.size() * 4);
    positions_dev.Upload(positions);
    slots_dev.Upload(slots);
    table.Upload(cos_sin);
    AttentionShape shape;
    shape.num_q_heads = c.q_heads;
    shape.num_kv_heads = c.kv_heads;
    shape.head_dim = c.head_dim;
    shape.block_size = c.block_size;
    shape.scale = 1.0f;
    const int64_t cache_elems = blocks * c.block_size * kv_row;
    std::vector<std::vector<uint16_t>> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      DeviceBuffer qkv(qkv_host.size() * 2), k_cache(cache_elems * 2), v_cache(cache_elems * 2);
      qkv.Upload(qkv_host);
      k_cache.Poison();
      v_cache.Poison();
      __nv_bfloat16* q = At(qkv);
      __nv_bfloat16* k = At(qkv, int64_t{c.q_heads} * c.head_dim);
      __nv_bfloat16* v = At(qkv, int64_t{c.q_heads} * c.head_dim + kv_row);
      if (fused == 1) {
        ASSERT_EQ(
            RopeAndWriteKvCache(positions_dev.as<int32_t>(), c.tokens, q, stride, k, stride, v,
                                stride, c.rot_dim, table.as<float>(), q_norm, k_norm, kEps,
                                slots_dev.as<int64_t>(), shape, At(k_cache), At(v_cache), nullptr),
            cudaSuccess);
      } else {
        if (c.norm) {
          ASSERT_EQ(HeadRmsNorm(q, stride, c.tokens, c.q_heads, c.head_dim, q_norm, kEps, nullptr),
                    cudaSuccess);
          ASSERT_EQ(HeadRmsNorm(k, stride, c.tokens, c.kv_heads, c.head_dim, k_norm, kEps, nullptr),
                    cudaSuccess);
        }
        ASSERT_EQ(ApplyRope(positions_dev.as<int32_t>(), c.tokens, q, stride, c.q_heads, k, stride,
                            c.kv_heads, c.head_dim, c.rot_dim, table.as<float>(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(WriteKvCache(k, stride, v, stride, slots_dev.as<int64_t>(), c.tokens, shape,
                               At(k_cache), At(v_cache), nullptr),
                  cudaSuccess);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      results[fused] = {qkv.Download<uint16_t>(), k_cache.Download<uint16_t>(),
                        v_cache.Download<uint16_t>()};
    }
    EXPECT_NE(results[0][0], qkv_host);  // the rotation did something
    EXPECT_EQ(results[1][0], results[0][0]) << "q and k rows";
    EXPECT_EQ(results[1][1], results[0][1]) << "k cache";
    EXPECT_EQ(results[1][2], results[0][2]) << "v cache";
  }
}

TEST(RopeAndWriteKvCacheTest, RejectsWhatEitherCallRejects) {
  DeviceBuffer buf(1 << 16), table(1 << 16), slots(64), positions(64);
  AttentionShape shape;
  shape.num_q_heads = 4;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.block_size = 16;
  shape.scale = 1.0f;
  const int64_t stride = 8 * 64;
  DeviceBuffer norm(64 * 2);
  auto run = [&](int32_t rot_dim, int64_t q_stride, const AttentionShape& s,
                 const __nv_bfloat16* q_norm = nullptr, const __nv_bfloat16* k_norm = nullptr) {
    return RopeAndWriteKvCache(positions.as<int32_t>(), 1, At(buf), q_stride, At(buf, 256), stride,
                               At(buf, 384), stride, rot_dim, table.as<float>(), q_norm, k_norm,
                               1e-6f, slots.as<int64_t>(), s, At(buf, 4096), At(buf, 8192),
                               nullptr);
  };
  EXPECT_EQ(run(63, stride, shape), cudaErrorInvalidValue);   // odd rot_dim
  EXPECT_EQ(run(128, stride, shape), cudaErrorInvalidValue);  // rot_dim > head_dim
  EXPECT_EQ(run(64, 100, shape), cudaErrorInvalidValue);      // q stride below its heads
  AttentionShape no_kv = shape;
  no_kv.num_kv_heads = 0;
  EXPECT_EQ(run(64, stride, no_kv), cudaErrorInvalidValue);
  EXPECT_EQ(run(64, stride, shape, At(norm), nullptr), cudaErrorInvalidValue);  // one norm only
  EXPECT_EQ(run(64, stride, shape, nullptr, At(norm)), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels
