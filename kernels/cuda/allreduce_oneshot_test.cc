// The one-shot all-reduce kernel on one GPU: 2..8 "ranks" are staging buffers on GPU 0, each
// rank's call launched on its own stream so all of them run at once (the kernel's flags do not
// care whether a peer's buffer is local or across NVLink). Results are compared bitwise with the
// rank-order reference (kernels/ref/allreduce.h); a rank whose peer never calls gives up after
// its timeout. The fused all-reduce + RMSNorm is compared with the two kernels it replaces. Part of
// kernels_cuda_test (exits 77 without a GPU).
#include "kernels/cuda/allreduce_oneshot.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/ref/allreduce.h"
#include "kernels/ref/bf16.h"

namespace specd::kernels {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr size_t kSlotBytes = size_t{256} << 10;

// `world` ranks on GPU 0: zeroed staging buffers, a stream and a data buffer each.
struct LocalGroup {
  std::vector<void*> buffers;
  std::vector<cudaStream_t> streams;
  std::vector<void*> data;    // [world] of [kSlotBytes] bytes, device
  uint32_t* words = nullptr;  // [2] u32, host-mapped: abort, error
  std::vector<OneShotGroup> groups;

  explicit LocalGroup(int world) : buffers(world), streams(world), data(world), groups(world) {
    cudaHostAlloc(reinterpret_cast<void**>(&words), 8, cudaHostAllocMapped);
    words[0] = words[1] = 0;
    uint32_t* device_words = nullptr;
    cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_words), words, 0);
    for (int r = 0; r < world; ++r) {
      cudaMalloc(&buffers[r], OneShotBufferBytes(kSlotBytes, world));
      cudaMemset(buffers[r], 0, OneShotBufferBytes(kSlotBytes, world));
      cudaMalloc(&data[r], kSlotBytes);
      cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
    }
    for (int r = 0; r < world; ++r) {
      OneShotGroup& g = groups[r];
      for (int p = 0; p < world; ++p) g.buffers[p] = buffers[p];
      g.rank = r;
      g.world_size = world;
      g.slot_bytes = kSlotBytes;
      g.abort_word = device_words;
      g.error_word = device_words + 1;
      g.timeout_ns = 5'000'000'000;
    }
    cudaDeviceSynchronize();
  }
  ~LocalGroup() {
    cudaDeviceSynchronize();
    for (size_t r = 0; r < buffers.size(); ++r) {
      cudaFree(buffers[r]);
      cudaFree(data[r]);
      cudaStreamDestroy(streams[r]);
    }
    cudaFreeHost(words);
  }
};

std::vector<float> Random(int rank, int tag, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 7919 + tag));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// One all-reduce of `count` elements on every rank of `g`; checks each rank against the reference.
void CheckRound(LocalGroup& g, int tag, size_t count, bool bf16) {
  const int world = static_cast<int>(g.buffers.size());
  const size_t bytes = count * (bf16 ? 2 : 4);
  std::vector<std::vector<uint16_t>> in16(world);
  std::vector<std::vector<float>> in32(world);
  for (int r = 0; r < world; ++r) {
    in32[r] = Random(r, tag, count);
    in16[r].resize(count);
    for (size_t i = 0; i < count; ++i) in16[r][i] = FloatToBf16(in32[r][i]);
    const void* src = bf16 ? static_cast<const void*>(in16[r].data()) : in32[r].data();
    CUDA_OK(cudaMemcpy(g.data[r], src, bytes, cudaMemcpyHostToDevice));
  }
  for (int r = 0; r < world; ++r) {
    const cudaError_t e =
        bf16 ? OneShotAllReduce(static_cast<__nv_bfloat16*>(g.data[r]), count, g.groups[r],
                                g.streams[r])
             : OneShotAllReduce(static_cast<float*>(g.data[r]), count, g.groups[r], g.streams[r]);
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorName(e);
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> want(bytes);
  if (bf16) {
    std::vector<const uint16_t*> ptrs;
    for (const auto& v : in16) ptrs.push_back(v.data());
    ref::AllReduceSumBf16(ptrs, count, reinterpret_cast<uint16_t*>(want.data()));
  } else {
    std::vector<const float*> ptrs;
    for (const auto& v : in32) ptrs.push_back(v.data());
    ref::AllReduceSumF32(ptrs, count, reinterpret_cast<float*>(want.data()));
  }
  for (int r = 0; r < world; ++r) {
    std::vector<uint8_t> got(bytes);
    CUDA_OK(cudaMemcpy(got.data(), g.data[r], bytes, cudaMemcpyDeviceToHost));
    ASSERT_TRUE(got == want) << "rank " << r << " of " << world << ", " << count << " x "
                             << (bf16 ? "bf16" : "f32") << ", tag " << tag;
  }
}

// All ranks' blocks must be resident at once (they wait for each other): at least 2 blocks of
// kOneShotThreads fit an SM (<= 64 registers a thread), so world sizes up to 2 * SMs / blocks.
int MaxLocalWorld() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return std::min(kOneShotMaxRanks, 2 * sms / kOneShotBlocks);
}

TEST(OneShotAllReduceTest, EveryWorldSizeMatchesTheRankOrderReference) {
  const int max_world = MaxLocalWorld();
  ASSERT_GE(max_world, 2) << "too few SMs for two ranks' grids at once";
  if (max_world < kOneShotMaxRanks) {
    std::printf("one-shot: world sizes up to %d on this GPU's SMs\n", max_world);
  }
  for (int world = 2; world <= max_world; ++world) {
    LocalGroup g(world);
    int tag = 0;
    for (bool bf16 : {true, false}) {
      for (size_t bytes :
           {size_t{4}, size_t{12}, size_t{1000}, size_t{8} << 10, size_t{100012}, kSlotBytes}) {
        CheckRound(g, ++tag, bytes / (bf16 ? 2 : 4), bf16);
      }
    }
    EXPECT_EQ(g.words[1], 0u) << "no kernel should have given up";
  }
}

TEST(OneShotAllReduceTest, BackToBackCallsAlternateSlotsCorrectly) {
  LocalGroup g(3);
  for (int round = 0; round < 200; ++round) {
    CheckRound(g, 1000 + round, round % 2 ? 4096 : 4093, round % 3 == 0);
  }
  EXPECT_EQ(g.words[1], 0u);
}

TEST(OneShotAllReduceTest, ARankWhosePeerNeverCallsGivesUpAndLaterCallsDoNothing) {
  LocalGroup g(2);
  g.groups[0].timeout_ns = 50'000'000;  // 50 ms
  const std::vector<float> x = Random(0, 1, 256);
  CUDA_OK(cudaMemcpy(g.data[0], x.data(), 1024, cudaMemcpyHostToDevice));
  CUDA_OK(OneShotAllReduce(static_cast<float*>(g.data[0]), 256, g.groups[0], g.streams[0]));
  CUDA_OK(cudaStreamSynchronize(g.streams[0]));
  EXPECT_EQ(reinterpret_cast<volatile uint32_t*>(g.words)[1], 1u) << "error word not set";
  std::vector<float> got(256);
  CUDA_OK(cudaMemcpy(got.data(), g.data[0], 1024, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, x) << "a call that gave up leaves its data unchanged";
  // The next call returns at once (it would otherwise wait another timeout) and changes nothing.
  g.groups[0].timeout_ns = 60'000'000'000;
  CUDA_OK(OneShotAllReduce(static_cast<float*>(g.data[0]), 256, g.groups[0], g.streams[0]));
  CUDA_OK(cudaStreamSynchronize(g.streams[0]));
  CUDA_OK(cudaMemcpy(got.data(), g.data[0], 1024, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, x);
}

TEST(OneShotAllReduceTest, RejectsBadGroupsAndOversizedMessages) {
  LocalGroup g(2);
  float* d = static_cast<float*>(g.data[0]);
  OneShotGroup bad = g.groups[0];
  bad.world_size = 1;
  EXPECT_EQ(OneShotAllReduce(d, 4, bad, g.streams[0]), cudaErrorInvalidValue);
  bad = g.groups[0];
  bad.buffers[1] = nullptr;
  EXPECT_EQ(OneShotAllReduce(d, 4, bad, g.streams[0]), cudaErrorInvalidValue);
  EXPECT_EQ(OneShotAllReduce(d, kSlotBytes / 4 + 1, g.groups[0], g.streams[0]),
            cudaErrorInvalidValue);
  EXPECT_EQ(OneShotAllReduce(d, 0, g.groups[0], g.streams[0]), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "no sticky error";
}

// Device copies of `n` bf16 values (from floats), freed with the test.
struct Bf16Buffer {
  void* ptr = nullptr;
  std::vector<uint16_t> host;
  explicit Bf16Buffer(const std::vector<float>& v) : host(v.size()) {
    for (size_t i = 0; i < v.size(); ++i) host[i] = FloatToBf16(v[i]);
    cudaMalloc(&ptr, host.size() * 2);
    cudaMemcpy(ptr, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  }
  ~Bf16Buffer() { cudaFree(ptr); }
  __nv_bfloat16* get() const { return static_cast<__nv_bfloat16*>(ptr); }
  std::vector<uint16_t> Read() const {
    std::vector<uint16_t> out(host.size());
    cudaMemcpy(out.data(), ptr, out.size() * 2, cudaMemcpyDeviceToHost);
    return out;
  }
};

// Largest |a - b| over bf16 vectors, relative to max(|b|, 1).
double MaxRelDiff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = Bf16ToFloat(a[i]), y = Bf16ToFloat(b[i]);
    worst = std::max(worst, std::abs(x - y) / std::max(std::abs(y), 1.0));
  }
  return worst;
}

// The fused kernel on every rank against OneShotAllReduce + FusedAddRmsNorm on the same inputs:
// identical bits where FusedAddRmsNorm runs one thread per 8 elements (hidden <= 4096), within a
// bf16 rounding step elsewhere (a different fp32 reduction order for the norm).
void CheckFusedRound(LocalGroup& g, int tag, int64_t rows, int64_t hidden) {
  const int world = static_cast<int>(g.buffers.size());
  const auto n = static_cast<size_t>(rows * hidden);
  const Bf16Buffer weight(Random(99, tag, static_cast<size_t>(hidden)));
  std::vector<std::unique_ptr<Bf16Buffer>> res_fused, res_plain, plain;
  for (int r = 0; r < world; ++r) {
    const std::vector<float> x = Random(r, tag, n);
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) bits[i] = FloatToBf16(x[i]);
    CUDA_OK(cudaMemcpy(g.data[r], bits.data(), n * 2, cudaMemcpyHostToDevice));
    plain.push_back(std::make_unique<Bf16Buffer>(x));
    // Every rank holds the same residual stream, as in tensor-parallel decoding.
    res_fused.push_back(std::make_unique<Bf16Buffer>(Random(77, tag, n)));
    res_plain.push_back(std::make_unique<Bf16Buffer>(Random(77, tag, n)));
  }
  for (int r = 0; r < world; ++r) {
    CUDA_OK(OneShotAllReduceAddRmsNorm(static_cast<__nv_bfloat16*>(g.data[r]), res_fused[r]->get(),
                                       weight.get(), rows, hidden, 1e-5f, g.groups[r],
                                       g.streams[r]));
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (int r = 0; r < world; ++r) {
    CUDA_OK(OneShotAllReduce(plain[r]->get(), static_cast<int64_t>(n), g.groups[r], g.streams[r]));
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (int r = 0; r < world; ++r) {
    CUDA_OK(FusedAddRmsNorm(plain[r]->get(), res_plain[r]->get(), weight.get(), rows, hidden, 1e-5f,
                            plain[r]->get(), g.streams[r]));
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> fused_out(n);
  for (int r = 0; r < world; ++r) {
    CUDA_OK(cudaMemcpy(fused_out.data(), g.data[r], n * 2, cudaMemcpyDeviceToHost));
    const std::vector<uint16_t> want_out = plain[r]->Read();
    EXPECT_EQ(res_fused[r]->Read(), res_plain[r]->Read())
        << "residual, rank " << r << " of " << world << ", [" << rows << ", " << hidden << "]";
    if (hidden <= 8 * kOneShotThreads) {
      EXPECT_EQ(fused_out, want_out)
          << "rank " << r << " of " << world << ", [" << rows << ", " << hidden << "]";
    } else {
      EXPECT_LE(MaxRelDiff(fused_out, want_out), 1.0 / 128)
          << "rank " << r << " of " << world << ", [" << rows << ", " << hidden << "]";
    }
  }
}

TEST(OneShotAllReduceTest, FusedAddRmsNormEqualsTheTwoKernelsItReplaces) {
  // The widest rows' kernel fits one block of kOneShotThreads per SM (~82 registers a thread), so
  // world sizes up to SMs / blocks run all ranks at once on one GPU.
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int max_world = std::min(MaxLocalWorld(), sms / kOneShotBlocks);
  ASSERT_GE(max_world, 2) << "too few SMs for two ranks' grids at once";
  int tag = 5000;
  for (int world : {2, 4, 8}) {
    if (world > max_world) continue;
    LocalGroup g(world);
    for (const auto& [rows, hidden] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 4096}, {3, 2048}, {32, 4096}, {33, 512}, {1, 8192}, {16, 8192}, {8, 16384}}) {
      CheckFusedRound(g, ++tag, rows, hidden);
      CheckRound(g, ++tag, 4096, true);  // plain and fused calls share the epochs
    }
    EXPECT_EQ(g.words[1], 0u) << "no kernel should have given up";
  }
}

TEST(OneShotAllReduceTest, FusedAddRmsNormRejectsWhatItCannotTake) {
  LocalGroup g(2);
  auto* d = static_cast<__nv_bfloat16*>(g.data[0]);
  auto* w = static_cast<__nv_bfloat16*>(g.data[1]);
  EXPECT_FALSE(OneShotFusesNorm(3, 1, 4096, kSlotBytes)) << "world sizes 2, 4 and 8 only";
  EXPECT_FALSE(OneShotFusesNorm(2, 1, 1004, kSlotBytes)) << "hidden a multiple of 8";
  EXPECT_FALSE(OneShotFusesNorm(2, 1, kOneShotMaxNormHidden + 8, size_t{1} << 30));
  EXPECT_FALSE(OneShotFusesNorm(2, 33, 4096, kSlotBytes)) << "larger than a slot";
  EXPECT_TRUE(OneShotFusesNorm(8, 32, 4096, kSlotBytes));
  EXPECT_EQ(OneShotAllReduceAddRmsNorm(d, d, w, 33, 4096, 1e-5f, g.groups[0], g.streams[0]),
            cudaErrorInvalidValue);
  EXPECT_EQ(OneShotAllReduceAddRmsNorm(d, nullptr, w, 1, 4096, 1e-5f, g.groups[0], g.streams[0]),
            cudaErrorInvalidValue);
  EXPECT_EQ(OneShotAllReduceAddRmsNorm(d, d, w, 0, 4096, 1e-5f, g.groups[0], g.streams[0]),
            cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "no sticky error";
}

}  // namespace
}  // namespace specd::kernels
