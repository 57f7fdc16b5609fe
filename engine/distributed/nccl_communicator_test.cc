// NcclCommunicator on real GPUs (ctest label gpu; exits 77, "skipped", without a GPU). World size
// 1 runs on GPU 0; with 2 GPUs, ranks 0 and 1 are threads of this process on GPUs 0 and 1 (one
// NCCL communicator each, the usual one-thread-per-GPU setup). Inputs are small integers, so f32
// and bf16 sums are exact and host references compare bitwise, except in the one-shot tests,
// whose random inputs round and are compared bitwise with the rank-order reference
// (kernels/ref/allreduce.h). Outputs are poisoned first.
#include "engine/distributed/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/float16.h"
#include "gtest/gtest.h"
#include "kernels/ref/allreduce.h"

namespace specd {
namespace {

int g_num_gpus = 0;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Small integers: every partial sum is exact in f32 and bf16 (|sum| < 256).
float Value(int32_t rank, int round, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + round * 5) % 61) - 30);
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  void Upload(const std::vector<T>& v, cudaStream_t s) {
    cudaMemcpyAsync(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s);
  }
  std::vector<T> Download(cudaStream_t s) {
    std::vector<T> v(n);
    cudaMemcpyAsync(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    return v;
  }
  void Poison(cudaStream_t s) { cudaMemsetAsync(ptr, 0xFF, n * sizeof(T), s); }
};

std::vector<float> Inputs(int32_t rank, int round, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Value(rank, round, i);
  return v;
}

std::vector<float> SumOverRanks(int32_t world, int round, size_t n) {
  std::vector<float> v(n, 0.0f);
  for (int32_t r = 0; r < world; ++r) {
    for (size_t i = 0; i < n; ++i) v[i] += Value(r, round, i);
  }
  return v;
}

// Runs body(rank) on `world` threads, rank r on GPU r, after making one unique id for them all.
void RunRanks(int32_t world,
              const std::function<void(int32_t, NcclCommunicator&, cudaStream_t)>& body,
              const NcclCommunicatorOptions& options = {}) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = NcclCommunicator::Create(*id, r, world, r, options);
      ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status();
      cudaStream_t stream = nullptr;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      body(r, **comm, stream);
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Every collective once on `n` elements, against host references.
void CheckCollectives(int32_t rank, NcclCommunicator& comm, cudaStream_t s, size_t n) {
  const int32_t world = comm.world_size();
  {  // AllReduceSum f32
    DeviceBuffer<float> d(n);
    d.Upload(Inputs(rank, 1, n), s);
    ASSERT_TRUE(comm.AllReduceSum(d.ptr, n, CommDataType::kF32, s).ok());
    EXPECT_EQ(d.Download(s), SumOverRanks(world, 1, n)) << "f32 all-reduce, rank " << rank;
  }
  {  // AllReduceSum bf16
    std::vector<uint16_t> in(n);
    const std::vector<float> x = Inputs(rank, 2, n);
    for (size_t i = 0; i < n; ++i) in[i] = FloatToBf16(x[i]);
    DeviceBuffer<uint16_t> d(n);
    d.Upload(in, s);
    ASSERT_TRUE(comm.AllReduceSum(d.ptr, n, CommDataType::kBF16, s).ok());
    const std::vector<uint16_t> got = d.Download(s);
    const std::vector<float> want = SumOverRanks(world, 2, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bf16ToFloat(got[i]), want[i]) << "bf16 all-reduce, rank " << rank << " i " << i;
    }
  }
  {  // AllGather f32, separate buffers, and i32 in place
    DeviceBuffer<float> send(n), recv(world * n);
    send.Upload(Inputs(rank, 3, n), s);
    recv.Poison(s);
    ASSERT_TRUE(comm.AllGather(send.ptr, recv.ptr, n, CommDataType::kF32, s).ok());
    std::vector<float> want;
    for (int32_t r = 0; r < world; ++r) {
      const std::vector<float> row = Inputs(r, 3, n);
      want.insert(want.end(), row.begin(), row.end());
    }
    EXPECT_EQ(recv.Download(s), want) << "all-gather, rank " << rank;
    std::vector<int32_t> rows(world * n, -1);
    for (size_t i = 0; i < n; ++i) rows[rank * n + i] = rank * 100000 + static_cast<int32_t>(i);
    DeviceBuffer<int32_t> d(world * n);
    d.Upload(rows, s);
    ASSERT_TRUE(comm.AllGather(d.ptr + rank * n, d.ptr, n, CommDataType::kI32, s).ok());
    const std::vector<int32_t> got = d.Download(s);
    for (int32_t r = 0; r < world; ++r) {
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[r * n + i], r * 100000 + static_cast<int32_t>(i)) << "in-place all-gather";
      }
    }
  }
  {  // Broadcast from the last rank
    const int32_t root = world - 1;
    DeviceBuffer<float> d(n);
    d.Upload(Inputs(rank, 4, n), s);
    ASSERT_TRUE(comm.Broadcast(d.ptr, n, CommDataType::kF32, root, s).ok());
    EXPECT_EQ(d.Download(s), Inputs(root, 4, n)) << "broadcast, rank " << rank;
  }
  ASSERT_TRUE(comm.Barrier(s).ok());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(comm.AsyncError().ok()) << comm.AsyncError();
}

// Captures an in-place all-reduce in a graph and replays it over fresh inputs.
void CheckGraphReplay(int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
  constexpr size_t kN = 4096;
  DeviceBuffer<float> d(kN);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = comm.AllReduceSum(d.ptr, kN, CommDataType::kF32, s);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  ASSERT_TRUE(captured.ok()) << captured;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 10; round < 13; ++round) {
    d.Upload(Inputs(rank, round, kN), s);
    CUDA_OK(cudaGraphLaunch(exec, s));
    EXPECT_EQ(d.Download(s), SumOverRanks(comm.world_size(), round, kN))
        << "graph replay " << round << ", rank " << rank;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(NcclCommunicatorTest, WorldOfOneOnGpu0) {
  RunRanks(1, [](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
    EXPECT_TRUE(comm.on_device());
    EXPECT_EQ(comm.world_size(), 1);
    CheckCollectives(rank, comm, s, 1000);
    CheckGraphReplay(rank, comm, s);
  });
}

TEST(NcclCommunicatorTest, TwoRanksMatchHostReferences) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  RunRanks(2, [](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
    for (size_t n : {size_t{1}, size_t{1000}, size_t{3} << 20}) CheckCollectives(rank, comm, s, n);
  });
}

TEST(NcclCommunicatorTest, TwoRanksReplayACapturedAllReduce) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  RunRanks(2, [](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
    CheckGraphReplay(rank, comm, s);
  });
}

TEST(NcclCommunicatorTest, AbortUnblocksARankWhosePeerNeverCalls) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  std::atomic<bool> rank0_done{false};
  RunRanks(2, [&](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
    if (rank == 1) {  // joins (Create returned), then never calls a collective
      while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      comm.Abort();  // its peer is gone: finalizing could wait for it
      return;
    }
    [&] {
      DeviceBuffer<float> d(1024);
      d.Upload(Inputs(0, 0, 1024), s);
      ASSERT_TRUE(comm.AllReduceSum(d.ptr, 1024, CommDataType::kF32, s).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the all-reduce cannot finish alone";
      std::thread watchdog([&] { comm.Abort(); });
      const auto t0 = std::chrono::steady_clock::now();
      cudaError_t e = cudaErrorNotReady;
      while (e == cudaErrorNotReady &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
        e = cudaStreamQuery(s);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      watchdog.join();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank 0: stream released %.1f ms after Abort (%s)\n", ms, cudaGetErrorName(e));
      EXPECT_NE(e, cudaErrorNotReady) << "Abort did not end the blocked all-reduce";
      EXPECT_TRUE(absl::IsUnavailable(comm.AllReduceSum(d.ptr, 1, CommDataType::kF32, s)));
      EXPECT_TRUE(absl::IsUnavailable(comm.Barrier(s)));
    }();  // a failed ASSERT returns here, and rank 1 is still released
    rank0_done.store(true);
  });
}

// --- One-shot all-reduce (CUDA-IPC staging buffers, oneshot_allreduce.h) ---

bool PeerAccess() {
  int a = 0, b = 0;
  return cudaDeviceCanAccessPeer(&a, 0, 1) == cudaSuccess &&
         cudaDeviceCanAccessPeer(&b, 1, 0) == cudaSuccess && a && b;
}

NcclCommunicatorOptions OneShotUpTo(int64_t bytes) {
  NcclCommunicatorOptions o;
  o.oneshot_max_bytes = bytes;
  return o;
}

// Random values that round when summed; the same on every rank for a given (rank, tag).
std::vector<float> RandomInputs(int32_t rank, int tag, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + tag));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& x) {
  std::vector<uint16_t> v(x.size());
  for (size_t i = 0; i < x.size(); ++i) v[i] = FloatToBf16(x[i]);
  return v;
}

// The reference result of one all-reduce: bytes of [n] f32 or bf16.
std::vector<uint8_t> ReferenceBytes(int32_t world, int tag, size_t n, bool bf16) {
  std::vector<uint8_t> out(n * (bf16 ? 2 : 4));
  if (bf16) {
    std::vector<std::vector<uint16_t>> in;
    std::vector<const uint16_t*> ptrs;
    for (int32_t r = 0; r < world; ++r) in.push_back(ToBf16(RandomInputs(r, tag, n)));
    for (const auto& v : in) ptrs.push_back(v.data());
    kernels::ref::AllReduceSumBf16(ptrs, static_cast<int64_t>(n),
                                   reinterpret_cast<uint16_t*>(out.data()));
  } else {
    std::vector<std::vector<float>> in;
    std::vector<const float*> ptrs;
    for (int32_t r = 0; r < world; ++r) in.push_back(RandomInputs(r, tag, n));
    for (const auto& v : in) ptrs.push_back(v.data());
    kernels::ref::AllReduceSumF32(ptrs, static_cast<int64_t>(n),
                                  reinterpret_cast<float*>(out.data()));
  }
  return out;
}

// One all-reduce of `bytes` through the path `max_bytes` selects; returns the result's bytes.
std::vector<uint8_t> AllReduceBytes(int32_t rank, NcclCommunicator& comm, cudaStream_t s, int tag,
                                    size_t bytes, bool bf16, size_t max_bytes) {
  const size_t n = bytes / (bf16 ? 2 : 4);
  DeviceBuffer<uint8_t> d(bytes);
  const std::vector<float> x = RandomInputs(rank, tag, n);
  std::vector<uint8_t> in(bytes);
  if (bf16) {
    std::memcpy(in.data(), ToBf16(x).data(), bytes);
  } else {
    std::memcpy(in.data(), x.data(), bytes);
  }
  d.Upload(in, s);
  comm.set_oneshot_max_bytes(max_bytes);
  const absl::Status st =
      comm.AllReduceSum(d.ptr, n, bf16 ? CommDataType::kBF16 : CommDataType::kF32, s);
  if (!st.ok()) {  // no gtest assertion: the cross-process children call this outside a test
    std::fprintf(stderr, "rank %d: AllReduceSum: %s\n", rank, st.ToString().c_str());
    return {};
  }
  return d.Download(s);
}

TEST(NcclCommunicatorTest, TwoRanksOneShotMatchesRankOrderReferenceAndNccl) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  constexpr size_t kMax = size_t{256} << 10;
  const std::vector<size_t> sizes = {4, 12, 1024, 8 << 10, 32 << 10, 100012, 128 << 10, 256 << 10};
  std::vector<std::vector<uint8_t>> oneshot_out[2];
  RunRanks(
      2,
      [&](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
        if (!comm.oneshot_enabled()) {
          EXPECT_FALSE(PeerAccess()) << "GPUs 0 and 1 have peer access, yet no one-shot path";
          return;
        }
        EXPECT_EQ(comm.oneshot_max_bytes(), kMax);
        for (bool bf16 : {true, false}) {
          for (size_t bytes : sizes) {
            const int tag = static_cast<int>(bytes) * 2 + bf16;
            const std::vector<uint8_t> want = ReferenceBytes(2, tag, bytes / (bf16 ? 2 : 4), bf16);
            const std::vector<uint8_t> one = AllReduceBytes(rank, comm, s, tag, bytes, bf16, kMax);
            const std::vector<uint8_t> nccl = AllReduceBytes(rank, comm, s, tag, bytes, bf16, 0);
            EXPECT_TRUE(one == want) << "one-shot vs reference, " << bytes << " bytes, "
                                     << (bf16 ? "bf16" : "f32") << ", rank " << rank;
            // Two ranks: a + b is the same whichever order NCCL adds in.
            EXPECT_TRUE(nccl == want) << "NCCL vs reference, " << bytes << " bytes, "
                                      << (bf16 ? "bf16" : "f32") << ", rank " << rank;
            oneshot_out[rank].push_back(one);
          }
        }
        comm.set_oneshot_max_bytes(kMax);
        EXPECT_TRUE(comm.AsyncError().ok()) << comm.AsyncError();
      },
      OneShotUpTo(kMax));
  ASSERT_EQ(oneshot_out[0].size(), oneshot_out[1].size());
  for (size_t i = 0; i < oneshot_out[0].size(); ++i) {
    EXPECT_TRUE(oneshot_out[0][i] == oneshot_out[1][i]) << "ranks differ in case " << i;
  }
}

// 2000 calls without a host sync between them, sizes cycling (vector and scalar accesses), each
// result copied aside on the stream and checked at the end: the alternating staging slots keep
// a rank that runs ahead from overwriting what its peer still reads.
TEST(NcclCommunicatorTest, TwoRanksOneShotSurvivesBackToBackCalls) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  if (!PeerAccess()) GTEST_SKIP() << "no peer access between GPUs 0 and 1";
  constexpr int kCalls = 2000;
  constexpr size_t kN = 2048;  // 8 KiB of f32
  const size_t counts[3] = {kN, 61, kN - 1};
  RunRanks(2, [&](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
    ASSERT_TRUE(comm.oneshot_enabled());
    std::vector<float> inputs(kCalls * kN);
    for (int i = 0; i < kCalls; ++i) {
      for (size_t j = 0; j < kN; ++j) inputs[i * kN + j] = Value(rank, i, j);
    }
    DeviceBuffer<float> in(kCalls * kN), out(kCalls * kN), d(kN);
    in.Upload(inputs, s);
    out.Poison(s);
    for (int i = 0; i < kCalls; ++i) {
      const size_t n = counts[i % 3];
      CUDA_OK(cudaMemcpyAsync(d.ptr, in.ptr + i * kN, n * 4, cudaMemcpyDeviceToDevice, s));
      ASSERT_TRUE(comm.AllReduceSum(d.ptr, n, CommDataType::kF32, s).ok());
      CUDA_OK(cudaMemcpyAsync(out.ptr + i * kN, d.ptr, n * 4, cudaMemcpyDeviceToDevice, s));
    }
    const std::vector<float> got = out.Download(s);
    for (int i = 0; i < kCalls; ++i) {
      for (size_t j = 0; j < counts[i % 3]; ++j) {
        ASSERT_EQ(got[i * kN + j], Value(0, i, j) + Value(1, i, j))
            << "call " << i << " element " << j << " rank " << rank;
      }
    }
    EXPECT_TRUE(comm.AsyncError().ok()) << comm.AsyncError();
  });
}

// A graph holding a layer's worth of all-reduces (bf16 8 KiB, f32 4000 B, bf16 256 KiB) replayed
// 100 times over fresh inputs: the kernel's own epoch counters advance on every replay.
TEST(NcclCommunicatorTest, TwoRanksReplayACapturedOneShotGraph100Times) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  if (!PeerAccess()) GTEST_SKIP() << "no peer access between GPUs 0 and 1";
  RunRanks(2, [&](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
    ASSERT_TRUE(comm.oneshot_enabled());
    const size_t counts[3] = {4096, 1000, 131072};
    DeviceBuffer<uint16_t> a(counts[0]), c(counts[2]);
    DeviceBuffer<float> b(counts[1]);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const absl::Status s1 = comm.AllReduceSum(a.ptr, counts[0], CommDataType::kBF16, s);
    const absl::Status s2 = comm.AllReduceSum(b.ptr, counts[1], CommDataType::kF32, s);
    const absl::Status s3 = comm.AllReduceSum(c.ptr, counts[2], CommDataType::kBF16, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    ASSERT_TRUE(s1.ok() && s2.ok() && s3.ok()) << s1 << s2 << s3;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 0; round < 100; ++round) {
      const std::vector<float> xa = Inputs(rank, round, counts[0]);
      const std::vector<float> xc = Inputs(rank, round + 1, counts[2]);
      a.Upload(ToBf16(xa), s);
      b.Upload(Inputs(rank, round + 2, counts[1]), s);
      c.Upload(ToBf16(xc), s);
      CUDA_OK(cudaGraphLaunch(exec, s));
      const std::vector<uint16_t> ga = a.Download(s), gc = c.Download(s);
      const std::vector<float> gb = b.Download(s);
      const std::vector<float> wa = SumOverRanks(2, round, counts[0]);
      const std::vector<float> wb = SumOverRanks(2, round + 2, counts[1]);
      const std::vector<float> wc = SumOverRanks(2, round + 1, counts[2]);
      ASSERT_EQ(gb, wb) << "f32, replay " << round << ", rank " << rank;
      for (size_t i = 0; i < counts[0]; ++i) {
        ASSERT_EQ(Bf16ToFloat(ga[i]), wa[i]) << "replay " << round << " i " << i;
      }
      for (size_t i = 0; i < counts[2]; ++i) {
        ASSERT_EQ(Bf16ToFloat(gc[i]), wc[i]) << "replay " << round << " i " << i;
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    EXPECT_TRUE(comm.AsyncError().ok()) << comm.AsyncError();
  });
}

// Microseconds per all-reduce of `bytes` bf16: a graph of kPerGraph back-to-back calls, the
// median over kReplays replays. Both paths are timed the same way.
double TimeAllReduceUs(NcclCommunicator& comm, cudaStream_t s, size_t bytes, size_t max_bytes) {
  constexpr int kPerGraph = 50;
  constexpr int kReplays = 21;
  comm.set_oneshot_max_bytes(max_bytes);
  DeviceBuffer<uint16_t> d(bytes / 2);
  d.Upload(ToBf16(Inputs(comm.rank(), 0, bytes / 2)), s);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
  // Values grow by 2x per call: they stay finite for the 50 calls and the timing is unaffected.
  for (int i = 0; i < kPerGraph; ++i)
    (void)comm.AllReduceSum(d.ptr, bytes / 2, CommDataType::kBF16, s);
  if (cudaStreamEndCapture(s, &graph) != cudaSuccess) return -1;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return -1;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> us;
  for (int r = 0; r < kReplays + 1; ++r) {  // the first replay warms up
    d.Upload(ToBf16(Inputs(comm.rank(), 0, bytes / 2)), s);
    cudaEventRecord(start, s);
    cudaGraphLaunch(exec, s);
    cudaEventRecord(stop, s);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (r > 0) us.push_back(ms * 1000.0 / kPerGraph);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

TEST(NcclCommunicatorTest, TwoRanksOneShotVsNcclTimingTable) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  if (!PeerAccess()) GTEST_SKIP() << "no peer access between GPUs 0 and 1";
  constexpr size_t kMax = size_t{2} << 20;
  const std::vector<size_t> sizes = {8 << 10, 32 << 10, 128 << 10, 256 << 10, 1 << 20, 2 << 20};
  std::vector<double> oneshot_us(sizes.size()), nccl_us(sizes.size());
  RunRanks(
      2,
      [&](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
        ASSERT_TRUE(comm.oneshot_enabled());
        for (size_t i = 0; i < sizes.size(); ++i) {
          const double one = TimeAllReduceUs(comm, s, sizes[i], kMax);
          const double nccl = TimeAllReduceUs(comm, s, sizes[i], 0);
          if (rank == 0) {
            oneshot_us[i] = one;
            nccl_us[i] = nccl;
          }
        }
        EXPECT_TRUE(comm.AsyncError().ok()) << comm.AsyncError();
      },
      OneShotUpTo(kMax));
  std::printf(
      "[ allreduce ] bytes one-shot_us nccl_us speedup (bf16, 2 ranks, graph of 50 calls)\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::printf("[ allreduce ] %zu %.2f %.2f %.2fx\n", sizes[i], oneshot_us[i], nccl_us[i],
                nccl_us[i] / oneshot_us[i]);
    EXPECT_GT(oneshot_us[i], 0.0) << sizes[i];
    EXPECT_GT(nccl_us[i], 0.0) << sizes[i];
  }
  EXPECT_GT(nccl_us[0] / oneshot_us[0], 1.0) << "one-shot slower than NCCL at 8 KiB";
}

// A one-shot call whose peer never comes gives up after Abort: the stream is released and later
// calls return Unavailable.
TEST(NcclCommunicatorTest, AbortReleasesAOneShotCallWhosePeerNeverCalls) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  if (!PeerAccess()) GTEST_SKIP() << "no peer access between GPUs 0 and 1";
  std::atomic<bool> rank0_done{false};
  RunRanks(2, [&](int32_t rank, NcclCommunicator& comm, cudaStream_t s) {
    if (rank == 1) {
      while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      comm.Abort();
      return;
    }
    [&] {
      ASSERT_TRUE(comm.oneshot_enabled());
      DeviceBuffer<uint16_t> d(4096);
      ASSERT_TRUE(comm.AllReduceSum(d.ptr, 4096, CommDataType::kBF16, s).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the all-reduce cannot finish alone";
      comm.Abort();
      const auto t0 = std::chrono::steady_clock::now();
      cudaError_t e = cudaErrorNotReady;
      while (e == cudaErrorNotReady &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
        e = cudaStreamQuery(s);
      }
      EXPECT_EQ(e, cudaSuccess) << "Abort did not release the one-shot kernel";
      EXPECT_TRUE(absl::IsUnavailable(comm.AllReduceSum(d.ptr, 4096, CommDataType::kBF16, s)));
    }();
    rank0_done.store(true);
  });
}

// --- The one-shot path across processes (cudaIpcOpenMemHandle), as `specd worker` ranks run ---

constexpr char kChildEnv[] = "SPECD_ONESHOT_TEST_CHILD";  // "<rank>:<unique id in hex>"

// A child rank: a few one-shot all-reduces against the reference. Exit 0 when all match (or when
// the GPUs have no peer access, so the path is rightly off), else a code naming the failure.
int RunOneShotChild(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return 10;
  const int32_t rank = std::stoi(spec.substr(0, colon));
  std::vector<uint8_t> id;
  for (size_t i = colon + 1; i + 1 < spec.size(); i += 2) {
    id.push_back(static_cast<uint8_t>(std::stoi(spec.substr(i, 2), nullptr, 16)));
  }
  auto comm = NcclCommunicator::Create(id, rank, 2, rank, OneShotUpTo(256 << 10));
  if (!comm.ok()) {
    std::fprintf(stderr, "child rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 11;
  }
  if (!(*comm)->oneshot_enabled()) return PeerAccess() ? 12 : 0;
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 13;
  int code = 0;
  for (int round = 0; round < 50 && code == 0; ++round) {
    for (bool bf16 : {true, false}) {
      for (size_t bytes : {size_t{12}, size_t{8} << 10, size_t{256} << 10}) {
        const int tag = round * 1000 + static_cast<int>(bytes % 997) * 2 + bf16;
        const std::vector<uint8_t> want = ReferenceBytes(2, tag, bytes / (bf16 ? 2 : 4), bf16);
        if (AllReduceBytes(rank, **comm, s, tag, bytes, bf16, 256 << 10) != want) code = 14;
      }
    }
  }
  if (code == 0 && !(*comm)->AsyncError().ok()) code = 15;
  cudaStreamDestroy(s);
  return code;
}

int WaitChild(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(NcclCommunicatorTest, TwoProcessesOneShotOverCudaIpc) {
  if (g_num_gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << g_num_gpus << " visible";
  if (!PeerAccess()) GTEST_SKIP() << "no peer access between GPUs 0 and 1";
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::string hex;
  for (uint8_t b : *id) hex += "0123456789abcdef"[b >> 4], hex += "0123456789abcdef"[b & 15];
  std::vector<pid_t> pids;
  for (int32_t r = 0; r < 2; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.push_back(std::string(kChildEnv) + "=" + std::to_string(r) + ":" + hex);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    char arg0[] = "nccl_communicator_test";
    char* argv[] = {arg0, nullptr};
    pid_t pid = -1;
    ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  for (int32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(WaitChild(pids[r], std::chrono::seconds(180)), 0) << "child rank " << r;
  }
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  if (const char* child = std::getenv(specd::kChildEnv); child != nullptr) {
    return specd::RunOneShotChild(child);
  }
  if (cudaGetDeviceCount(&specd::g_num_gpus) != cudaSuccess || specd::g_num_gpus < 1) {
    std::fprintf(stderr, "nccl_communicator_test: no CUDA device visible; skipping\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
