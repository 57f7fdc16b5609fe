// NcclCommunicator on real GPUs (ctest label gpu; exits 77, "skipped", without a GPU). World size
// 1 runs on GPU 0; with 2 GPUs, ranks 0 and 1 are threads of this process on GPUs 0 and 1 (one
// NCCL communicator each, the usual one-thread-per-GPU setup). Inputs are small integers, so f32
// and bf16 sums are exact and host references compare bitwise. Outputs are poisoned first.
#include "engine/distributed/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "engine/base/float16.h"
#include "gtest/gtest.h"

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
              const std::function<void(int32_t, NcclCommunicator&, cudaStream_t)>& body) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = NcclCommunicator::Create(*id, r, world, r);
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

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  if (cudaGetDeviceCount(&specd::g_num_gpus) != cudaSuccess || specd::g_num_gpus < 1) {
    std::fprintf(stderr, "nccl_communicator_test: no CUDA device visible; skipping\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
