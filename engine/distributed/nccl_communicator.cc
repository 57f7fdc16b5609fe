// NcclCommunicator over a non-blocking NCCL communicator (ncclCommInitRankConfig with
// blocking = 0), so every host-side wait has a deadline and Abort can end a hung collective.
// Without NCCL at configure time (SPECD_DISTRIBUTED_HAS_NCCL undefined) only stubs are compiled.
#include "engine/distributed/nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"

#if defined(SPECD_DISTRIBUTED_HAS_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/distributed/oneshot_allreduce.h"
#endif

namespace specd {

#if defined(SPECD_DISTRIBUTED_HAS_NCCL)

namespace {

constexpr absl::Duration kPollInterval = absl::Microseconds(20);
constexpr absl::Duration kInitTimeout = absl::Seconds(120);
constexpr absl::Duration kEnqueueTimeout = absl::Seconds(60);  // a call still being queued
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);
// Warm-up all-reduce size: large enough for the bandwidth algorithms (ring, NVLS), so that
// their lazily made connections exist before a collective is captured in a graph.
constexpr size_t kWarmupFloats = size_t{1} << 20;
// The default one-shot limit. Measured on two H200s (NVLink), bf16 in CUDA graphs, the push
// kernel against NCCL: 1.73x / 1.66x / 2.65x / 1.71x / 2.11x at 8 KiB / 128 KiB / 256 KiB / 1 MiB /
// 2 MiB (docs/benchmarks.md, 2026-11-27), so two ranks use it up to 1 MiB (a 64-row decode step of
// an 8,192-wide model). Each rank pushes world_size - 1 copies, so larger groups, not measured,
// keep the earlier 128 KiB.
size_t DefaultOneShotMaxBytes(int32_t world_size) {
  return world_size == 2 ? size_t{1} << 20 : size_t{128} << 10;
}

// The one-shot limit this rank asks for: the option, else the environment, else the default.
size_t OneShotMaxBytes(int64_t option, int32_t world_size) {
  if (option >= 0) return static_cast<size_t>(option);
  const size_t fallback = DefaultOneShotMaxBytes(world_size);
  const char* env = std::getenv("SPECD_ONESHOT_ALLREDUCE_MAX_BYTES");
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < 0) {
    SPECD_LOG_WARN("dist: SPECD_ONESHOT_ALLREDUCE_MAX_BYTES={} is not a byte count; using {}", env,
                   fallback);
    return fallback;
  }
  return static_cast<size_t>(v);
}

absl::Status NcclError(ncclResult_t result, ncclComm_t comm, std::string_view what) {
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : "";
  return absl::InternalError(
      absl::StrCat(absl::string_view(what.data(), what.size()), ": ", ncclGetErrorString(result),
                   detail && *detail ? absl::StrCat(" (", detail, ")") : ""));
}

absl::StatusOr<ncclDataType_t> NcclType(CommDataType type) {
  switch (type) {
    case CommDataType::kF32:
      return ncclFloat32;
    case CommDataType::kBF16:
      return ncclBfloat16;
    case CommDataType::kI32:
      return ncclInt32;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("NCCL communicator: unknown data type ", static_cast<int>(type)));
}

}  // namespace

bool NcclAvailable() { return true; }

absl::StatusOr<std::vector<uint8_t>> NewNcclUniqueId() {
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return NcclError(r, nullptr, "ncclGetUniqueId");
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
  return std::vector<uint8_t>(bytes, bytes + sizeof(id));
}

struct NcclCommunicator::Impl {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t device = 0;
  int32_t* barrier_word = nullptr;  // [1] i32, device: what Barrier all-reduces
  // Set at Create, then constant until destruction (Abort reads it from any thread).
  std::unique_ptr<OneShotAllReduce> oneshot;
  std::atomic<size_t> oneshot_max{0};  // bytes; <= oneshot->capacity()
  absl::Mutex mu;                      // guards the communicator against Abort from another thread
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  bool failed ABSL_GUARDED_BY(mu) = false;   // abort instead of finalizing on destruction
  absl::Status failure ABSL_GUARDED_BY(mu);  // what later calls return

  absl::Status Dead() ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return failure.ok()
               ? absl::UnavailableError(absl::StrCat("NCCL communicator rank ", rank, " aborted"))
               : failure;
  }

  absl::Status FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    failed = true;
    if (failure.ok()) failure = std::move(status);
    return failure;
  }

  // Polls until the communicator's last call finished (no longer ncclInProgress), releasing the
  // mutex between polls so Abort can interrupt.
  absl::Status WaitQueued(absl::Time deadline, std::string_view what) ABSL_LOCKS_EXCLUDED(mu) {
    while (true) {
      {
        absl::MutexLock lock(&mu);
        if (comm == nullptr) return Dead();
        ncclResult_t state = ncclSuccess;
        if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) state = r;
        if (state == ncclSuccess) return absl::OkStatus();
        if (state != ncclInProgress) return FailLocked(NcclError(state, comm, what));
        if (absl::Now() >= deadline) {
          return FailLocked(absl::UnavailableError(
              absl::StrCat(absl::string_view(what.data(), what.size()), " on rank ", rank,
                           ": not queued in time; a peer never joined the collective")));
        }
      }
      absl::SleepFor(kPollInterval);
    }
  }

  // Issues one NCCL call and waits until it is queued on its stream.
  template <typename Op>
  absl::Status Enqueue(Op op, std::string_view what) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock lock(&mu);
      if (comm == nullptr || !failure.ok()) return Dead();
      const ncclResult_t r = op(comm);
      if (r == ncclSuccess) return absl::OkStatus();
      if (r != ncclInProgress) return FailLocked(NcclError(r, comm, what));
    }
    return WaitQueued(absl::Now() + kEnqueueTimeout, what);
  }

  // Runs each kind of collective once and waits for it, so connections NCCL makes at the first
  // use of an algorithm are made here rather than during a graph capture.
  absl::Status WarmUp(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu) {
    cudaStream_t stream = nullptr;
    float* buf = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return cuda::Check(e, "cudaStreamCreate");
    }
    absl::Status status;
    if (cudaError_t e =
            cudaMalloc(reinterpret_cast<void**>(&buf), kWarmupFloats * world_size * sizeof(float));
        e != cudaSuccess) {
      status = cuda::Check(e, "cudaMalloc (NCCL warm-up)");
    } else if (e = cudaMemsetAsync(buf, 0, kWarmupFloats * world_size * sizeof(float), stream);
               e != cudaSuccess) {
      status = cuda::Check(e, "cudaMemsetAsync");
    }
    const auto run = [&](auto op, std::string_view what) {
      if (status.ok()) status = Enqueue(op, what);
    };
    run([&](ncclComm_t c) { return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, c, stream); },
        "ncclAllReduce (warm-up)");
    run(
        [&](ncclComm_t c) {
          return ncclAllReduce(buf, buf, kWarmupFloats, ncclFloat32, ncclSum, c, stream);
        },
        "ncclAllReduce (warm-up)");
    run(
        [&](ncclComm_t c) {
          return ncclAllGather(buf + rank * kWarmupFloats, buf, kWarmupFloats, ncclFloat32, c,
                               stream);
        },
        "ncclAllGather (warm-up)");
    run([&](ncclComm_t c) { return ncclBroadcast(buf, buf, 1, ncclFloat32, 0, c, stream); },
        "ncclBroadcast (warm-up)");
    if (status.ok()) status = WaitStream(stream, deadline, "the warm-up collectives");
    if (!status.ok()) {
      absl::MutexLock lock(&mu);
      (void)FailLocked(status);
    } else {
      cudaFree(buf);  // only once the stream is done with it
    }
    cudaStreamDestroy(stream);
    return status;
  }

  // Waits for `stream`'s work, watching the communicator.
  absl::Status WaitStream(cudaStream_t stream, absl::Time deadline, std::string_view what)
      ABSL_LOCKS_EXCLUDED(mu) {
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return cuda::Check(e, what);
      SPECD_RETURN_IF_ERROR(AsyncError());
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("NCCL communicator rank ", rank, ": ",
                                                        absl::string_view(what.data(), what.size()),
                                                        " did not finish"));
      }
      absl::SleepFor(kPollInterval);
    }
  }

  // HostAllGather over NCCL (one-shot setup): through a device buffer on a private stream.
  absl::Status GatherBytes(std::span<const uint8_t> mine, std::span<uint8_t> all,
                           absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu) {
    cudaStream_t stream = nullptr;
    uint8_t* buf = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return cuda::Check(e, "cudaStreamCreate");
    }
    absl::Status status;
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&buf), all.size()); e != cudaSuccess) {
      buf = nullptr;
      status = cuda::Check(e, "cudaMalloc (gather)");
    } else if (e = cudaMemcpy(buf + rank * mine.size(), mine.data(), mine.size(),
                              cudaMemcpyHostToDevice);
               e != cudaSuccess) {
      status = cuda::Check(e, "cudaMemcpy (gather)");
    }
    if (status.ok()) {
      status = Enqueue(
          [&](ncclComm_t c) {
            return ncclAllGather(buf + rank * mine.size(), buf, mine.size(), ncclUint8, c, stream);
          },
          "ncclAllGather (one-shot setup)");
    }
    if (status.ok()) status = WaitStream(stream, deadline, "the one-shot setup exchange");
    if (status.ok()) {
      if (cudaError_t e = cudaMemcpy(all.data(), buf, all.size(), cudaMemcpyDeviceToHost);
          e != cudaSuccess) {
        status = cuda::Check(e, "cudaMemcpy (gather)");
      }
    }
    if (status.ok() && buf != nullptr) cudaFree(buf);  // a failed gather may still use it
    cudaStreamDestroy(stream);
    return status;
  }

  // Sets up the one-shot path; its problems only leave it off. Every rank takes part in the
  // exchange, even one that asked for 0 bytes (its answer turns the path off everywhere). An
  // error only when the NCCL exchange itself failed: then the group is broken.
  absl::Status SetUpOneShot(size_t max_bytes, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu) {
    if (world_size < 2) return absl::OkStatus();
    auto one = OneShotAllReduce::Create(rank, world_size, device, max_bytes,
                                        [&](std::span<const uint8_t> mine, std::span<uint8_t> all) {
                                          return GatherBytes(mine, all, deadline);
                                        });
    if (!one.ok()) {
      absl::MutexLock lock(&mu);
      return FailLocked(one.status());
    }
    oneshot = std::move(*one);
    if (oneshot != nullptr) oneshot_max = oneshot->capacity();
    return absl::OkStatus();
  }

  // A peer's kernels may still read this rank's staging buffer, on their own schedule, and a
  // collective teardown (a barrier between ranks) hangs when ranks destroy their communicators at
  // different times (measured: 10 s per communicator on two H200s). So the buffers are never
  // freed under a peer: the one-shot state (about 1 MiB of device memory per communicator) is
  // left to the process's exit.
  void TearDownOneShot() ABSL_LOCKS_EXCLUDED(mu) {
    if (oneshot == nullptr) return;
    oneshot_max = 0;
    (void)oneshot.release();
  }

  absl::Status AsyncError() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (comm == nullptr) return Dead();
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      return FailLocked(NcclError(state, comm, "NCCL communicator"));
    }
    return failure;
  }
};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::span<const uint8_t> unique_id, int32_t rank, int32_t world_size, int32_t device,
    const NcclCommunicatorOptions& options) {
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id: ", unique_id.size(),
                                                   " bytes, an ncclUniqueId has ",
                                                   sizeof(ncclUniqueId)));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL communicator: rank ", rank, " not in a world of ", world_size));
  }
  const absl::Time deadline = absl::Now() + kInitTimeout;
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return cuda::Check(e, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->world_size = world_size;
  impl->device = device;
  if (const cudaError_t e =
          cudaMalloc(reinterpret_cast<void**>(&impl->barrier_word), sizeof(int32_t));
      e != cudaSuccess) {
    return cuda::Check(e, "cudaMalloc (barrier word)");
  }
  // From here the destructor frees the word and finalizes or aborts the communicator.
  auto comm = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(impl)));
  Impl& m = *comm->impl_;
  if (const cudaError_t e = cudaMemset(m.barrier_word, 0, sizeof(int32_t)); e != cudaSuccess) {
    return cuda::Check(e, "cudaMemset (barrier word)");
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t nccl = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&nccl, world_size, id, rank, &config);
  {
    absl::MutexLock lock(&m.mu);
    m.comm = nccl;
    if (r != ncclSuccess && r != ncclInProgress) {
      return m.FailLocked(NcclError(r, nullptr, "ncclCommInitRankConfig"));
    }
  }
  absl::Status ready = m.WaitQueued(deadline, "ncclCommInitRankConfig");
  if (absl::IsUnavailable(ready)) {
    ready = absl::DeadlineExceededError(absl::StrCat("NCCL communicator rank ", rank, " of ",
                                                     world_size, ": the group did not form within ",
                                                     absl::FormatDuration(kInitTimeout)));
  }
  SPECD_RETURN_IF_ERROR(ready);
  SPECD_RETURN_IF_ERROR(m.WarmUp(deadline));
  SPECD_RETURN_IF_ERROR(
      m.SetUpOneShot(OneShotMaxBytes(options.oneshot_max_bytes, world_size), deadline));
  SPECD_LOG_INFO("dist: NCCL communicator up, rank {}/{} on cuda:{}", rank, world_size, device);
  return comm;
}

NcclCommunicator::~NcclCommunicator() {
  impl_->TearDownOneShot();
  absl::MutexLock lock(&impl_->mu);
  ncclComm_t comm = std::exchange(impl_->comm, nullptr);
  if (comm != nullptr) {
    if (!impl_->failed && ncclCommFinalize(comm) != ncclSuccess) impl_->failed = true;
    // Finalize is non-blocking here too: poll it with a deadline.
    const absl::Time deadline = absl::Now() + kFinalizeTimeout;
    while (!impl_->failed) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || absl::Now() >= deadline) impl_->failed = true;
      absl::SleepFor(kPollInterval);
    }
    if (impl_->failed) {
      ncclCommAbort(comm);
    } else {
      ncclCommDestroy(comm);
    }
  }
  if (impl_->barrier_word != nullptr) {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(impl_->device);
    cudaFree(impl_->barrier_word);
    if (previous >= 0) cudaSetDevice(previous);
  }
}

absl::Status NcclCommunicator::AllReduceSum(void* data, size_t count, CommDataType type,
                                            void* stream) {
  SPECD_ASSIGN_OR_RETURN(const ncclDataType_t t, NcclType(type));
  if (count == 0) return AsyncError();
  if (impl_->oneshot != nullptr && impl_->oneshot->Accepts(count, type) &&
      count * (type == CommDataType::kF32 ? 4 : 2) <= impl_->oneshot_max.load()) {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->comm == nullptr || !impl_->failure.ok()) return impl_->Dead();
    absl::Status s = impl_->oneshot->Run(data, count, type, stream);
    return s.ok() ? s : impl_->FailLocked(std::move(s));
  }
  return impl_->Enqueue(
      [&](ncclComm_t comm) {
        return ncclAllReduce(data, data, count, t, ncclSum, comm,
                             static_cast<cudaStream_t>(stream));
      },
      "ncclAllReduce");
}

bool NcclCommunicator::FusesAllReduceAddRmsNorm(int64_t rows, int64_t hidden) const {
  return impl_->oneshot != nullptr && rows > 0 &&
         static_cast<size_t>(rows * hidden * 2) <= impl_->oneshot_max.load() &&
         impl_->oneshot->AcceptsAddRmsNorm(rows, hidden);
}

absl::Status NcclCommunicator::AllReduceAddRmsNorm(void* data, void* residual, const void* weight,
                                                   int64_t rows, int64_t hidden, float eps,
                                                   void* stream) {
  if (!FusesAllReduceAddRmsNorm(rows, hidden)) {
    return absl::InvalidArgumentError(
        absl::StrCat("no fused all-reduce and RMSNorm for [", rows, ", ", hidden, "]"));
  }
  absl::MutexLock lock(&impl_->mu);
  if (impl_->comm == nullptr || !impl_->failure.ok()) return impl_->Dead();
  absl::Status s = impl_->oneshot->RunAddRmsNorm(data, residual, weight, rows, hidden, eps, stream);
  return s.ok() ? s : impl_->FailLocked(std::move(s));
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t count,
                                         CommDataType type, void* stream) {
  SPECD_ASSIGN_OR_RETURN(const ncclDataType_t t, NcclType(type));
  if (count == 0) return AsyncError();
  return impl_->Enqueue(
      [&](ncclComm_t comm) {
        return ncclAllGather(send, recv, count, t, comm, static_cast<cudaStream_t>(stream));
      },
      "ncclAllGather");
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t count, CommDataType type, int32_t root,
                                         void* stream) {
  SPECD_ASSIGN_OR_RETURN(const ncclDataType_t t, NcclType(type));
  if (root < 0 || root >= impl_->world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " not in a world of ", impl_->world_size));
  }
  if (count == 0) return AsyncError();
  return impl_->Enqueue(
      [&](ncclComm_t comm) {
        return ncclBroadcast(data, data, count, t, root, comm, static_cast<cudaStream_t>(stream));
      },
      "ncclBroadcast");
}

absl::Status NcclCommunicator::Barrier(void* stream) {
  return impl_->Enqueue(
      [&](ncclComm_t comm) {
        return ncclAllReduce(impl_->barrier_word, impl_->barrier_word, 1, ncclInt32, ncclSum, comm,
                             static_cast<cudaStream_t>(stream));
      },
      "ncclAllReduce (barrier)");
}

void NcclCommunicator::Abort() {
  absl::MutexLock lock(&impl_->mu);
  ncclComm_t comm = std::exchange(impl_->comm, nullptr);
  if (comm == nullptr) return;
  impl_->failed = true;
  SPECD_LOG_WARN("dist: aborting the NCCL communicator (rank {})", impl_->rank);
  if (impl_->oneshot != nullptr) impl_->oneshot->Abort();
  ncclCommAbort(comm);
}

absl::Status NcclCommunicator::AsyncError() { return impl_->AsyncError(); }

bool NcclCommunicator::oneshot_enabled() const { return impl_->oneshot != nullptr; }
size_t NcclCommunicator::oneshot_max_bytes() const { return impl_->oneshot_max.load(); }
void NcclCommunicator::set_oneshot_max_bytes(size_t bytes) {
  if (impl_->oneshot != nullptr) impl_->oneshot_max = std::min(bytes, impl_->oneshot->capacity());
}

#else  // !SPECD_DISTRIBUTED_HAS_NCCL

struct NcclCommunicator::Impl {
  int32_t rank = 0;
  int32_t world_size = 1;
};

bool NcclAvailable() { return false; }

absl::StatusOr<std::vector<uint8_t>> NewNcclUniqueId() {
  return absl::UnimplementedError("specd was built without NCCL");
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::span<const uint8_t>, int32_t, int32_t, int32_t, const NcclCommunicatorOptions&) {
  return absl::UnimplementedError("specd was built without NCCL: no device communicator");
}

NcclCommunicator::~NcclCommunicator() = default;

absl::Status NcclCommunicator::AllReduceSum(void*, size_t, CommDataType, void*) {
  return absl::UnimplementedError("built without NCCL");
}
absl::Status NcclCommunicator::AllGather(const void*, void*, size_t, CommDataType, void*) {
  return absl::UnimplementedError("built without NCCL");
}
absl::Status NcclCommunicator::Broadcast(void*, size_t, CommDataType, int32_t, void*) {
  return absl::UnimplementedError("built without NCCL");
}
absl::Status NcclCommunicator::Barrier(void*) {
  return absl::UnimplementedError("built without NCCL");
}
void NcclCommunicator::Abort() {}
absl::Status NcclCommunicator::AsyncError() {
  return absl::UnimplementedError("built without NCCL");
}
bool NcclCommunicator::FusesAllReduceAddRmsNorm(int64_t, int64_t) const { return false; }
absl::Status NcclCommunicator::AllReduceAddRmsNorm(void*, void*, const void*, int64_t, int64_t,
                                                   float, void*) {
  return absl::UnimplementedError("built without NCCL");
}
bool NcclCommunicator::oneshot_enabled() const { return false; }
size_t NcclCommunicator::oneshot_max_bytes() const { return 0; }
void NcclCommunicator::set_oneshot_max_bytes(size_t) {}

#endif  // SPECD_DISTRIBUTED_HAS_NCCL

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

int32_t NcclCommunicator::rank() const { return impl_->rank; }
int32_t NcclCommunicator::world_size() const { return impl_->world_size; }

}  // namespace specd
