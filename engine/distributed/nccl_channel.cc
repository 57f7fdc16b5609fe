// NcclChannel over a non-blocking 2-rank NCCL communicator (ncclCommInitRankConfig with
// blocking = 0), so every wait has a deadline and Abort can end a hung transfer. Without NCCL at
// configure time (SPECD_DISTRIBUTED_HAS_NCCL undefined) only the Unimplemented stubs are compiled.
#include "engine/distributed/nccl_channel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"

#if defined(SPECD_DISTRIBUTED_HAS_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/base/cuda/cuda_util.h"
#endif

namespace specd {

#if defined(SPECD_DISTRIBUTED_HAS_NCCL)

namespace {

constexpr absl::Duration kPollInterval = absl::Microseconds(20);

// Between two polls of a transfer: a sleep of kPollInterval (nanosleep rounds it up to the
// timer slack, some 50-80 us), or with SPECD_NCCL_SPIN_POLLS=1 a yield, for side-by-side runs of
// what the sleeps cost a round.
void PollPause() {
  static const bool spin = [] {
    const char* v = std::getenv("SPECD_NCCL_SPIN_POLLS");
    return v != nullptr && std::string_view(v) == "1";
  }();
  if (spin) {
    std::this_thread::yield();
  } else {
    absl::SleepFor(kPollInterval);
  }
}

constexpr absl::Duration kEnqueueTimeout = absl::Seconds(30);  // an ncclSend still being queued
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(5);

absl::Status NcclError(ncclResult_t result, ncclComm_t comm, std::string_view what) {
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : "";
  return absl::InternalError(
      absl::StrCat(DistView(what), ": ", ncclGetErrorString(result),
                   detail && *detail ? absl::StrCat(" (", detail, ")") : ""));
}

// Polls a non-blocking communicator until its last call finished; ncclInProgress past the
// deadline is DeadlineExceeded.
absl::Status WaitReady(ncclComm_t comm, absl::Time deadline, std::string_view what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclError(r, comm, what);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(state, comm, what);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(DistView(what), ": peer did not respond"));
    }
    absl::SleepFor(kPollInterval);
  }
}

// The unique id travels as BulkLinkInit from the verifier; the speculator receives it.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(Channel& control, Role role, absl::Time deadline) {
  ncclUniqueId id;
  if (role == Role::kVerifier) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, nullptr, "ncclGetUniqueId");
    }
    BulkLinkInit init;
    init.token.assign(reinterpret_cast<const uint8_t*>(&id),
                      reinterpret_cast<const uint8_t*>(&id) + sizeof(id));
    SPECD_RETURN_IF_ERROR(control.Send(init, deadline - absl::Now()));
    return id;
  }
  Message message;
  SPECD_ASSIGN_OR_RETURN(const MessageType type, control.Recv(deadline - absl::Now(), &message));
  if (type != MessageType::kBulkLinkInit) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL bootstrap: expected BulkLinkInit, got ",
                                                      DistView(MessageTypeName(type))));
  }
  const BulkLinkInit& init = std::get<BulkLinkInit>(message);
  if (init.token.size() != sizeof(id)) {
    return absl::InvalidArgumentError(absl::StrCat("BulkLinkInit.token: ", init.token.size(),
                                                   " bytes, an ncclUniqueId has ", sizeof(id)));
  }
  std::memcpy(&id, init.token.data(), sizeof(id));
  return id;
}

}  // namespace

struct NcclChannel::Impl {
  int rank = 0;
  int device = 0;
  // SendAsync's thread (started with the first one) and its one job at a time.
  struct Job {
    const void* data = nullptr;
    size_t bytes = 0;
    cudaStream_t stream = nullptr;
  };
  std::thread sender;
  absl::Mutex job_mu;
  std::optional<Job> job ABSL_GUARDED_BY(job_mu);
  bool stopping ABSL_GUARDED_BY(job_mu) = false;
  absl::Status job_status ABSL_GUARDED_BY(job_mu);
  cudaStream_t stream = nullptr;  // stream(): created with the communicator, destroyed after it
  // Buffer(): cudaMalloc'd on `device`, one per slot.
  void* buffer[kNumBuffers] = {};
  size_t buffer_bytes[kNumBuffers] = {};
  absl::Mutex mu;  // guards the communicator against Abort from another thread
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  bool failed ABSL_GUARDED_BY(mu) = false;  // abort instead of finalizing on destruction

  // Polls until the communicator's last call finished and `stream` (when `wait_stream`) drained,
  // releasing the mutex between polls so Abort can interrupt. DeadlineExceeded past `deadline`.
  absl::Status Poll(absl::Time deadline, std::string_view what, bool wait_stream,
                    cudaStream_t stream) ABSL_LOCKS_EXCLUDED(mu) {
    while (true) {
      const cudaError_t e = wait_stream ? cudaStreamQuery(stream) : cudaSuccess;
      {
        absl::MutexLock lock(&mu);
        if (comm == nullptr) return absl::UnavailableError("NCCL channel aborted");
        ncclResult_t state = ncclSuccess;
        if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) state = r;
        if (state != ncclSuccess && state != ncclInProgress) {
          failed = true;
          return NcclError(state, comm, what);
        }
        if (e != cudaSuccess && e != cudaErrorNotReady) {
          failed = true;
          return cuda::Check(e, what);
        }
        if (e == cudaSuccess && state == ncclSuccess) return absl::OkStatus();
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(DistView(what), ": not done in time; the peer stalled or died"));
      }
      PollPause();
    }
  }

  // Waits until SendAsync's job (if any) is queued; its status, then cleared.
  absl::Status JoinSend() ABSL_LOCKS_EXCLUDED(job_mu) {
    absl::MutexLock lock(&job_mu);
    job_mu.Await(absl::Condition(
        +[](std::optional<Job>* j) { return !j->has_value(); }, &job));
    return std::exchange(job_status, absl::OkStatus());
  }
  // The sender thread: each job's ncclSend, then the next.
  void SendLoop() ABSL_LOCKS_EXCLUDED(job_mu) {
    for (;;) {
      Job j;
      {
        absl::MutexLock lock(&job_mu);
        job_mu.Await(absl::Condition(this, &Impl::HasWork));
        if (!job.has_value()) return;  // stopping
        j = *job;
      }
      absl::Status s = cuda::Check(cudaSetDevice(device), "cudaSetDevice");
      if (s.ok()) {
        s = Enqueue(
            [&](ncclComm_t comm) {
              return ncclSend(j.data, j.bytes, ncclUint8, 1 - rank, comm, j.stream);
            },
            "ncclSend");
      }
      absl::MutexLock lock(&job_mu);
      job_status = s;
      job.reset();
    }
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu) { return job.has_value() || stopping; }

  // Enqueues one point-to-point operation (send or receive) and waits until NCCL queued it (the
  // first operation also connects the two ranks).
  template <typename Op>
  absl::Status Enqueue(Op op, std::string_view what) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock lock(&mu);
      if (comm == nullptr) return absl::UnavailableError("NCCL channel aborted");
      const ncclResult_t r = op(comm);
      if (r != ncclSuccess && r != ncclInProgress) {
        failed = true;
        return NcclError(r, comm, what);
      }
    }
    absl::Status status = Poll(absl::Now() + kEnqueueTimeout, what, false, nullptr);
    if (absl::IsDeadlineExceeded(status)) {
      absl::MutexLock lock(&mu);
      failed = true;
    }
    return status;
  }
};

bool NcclChannel::Available() { return true; }

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Create(Channel& control, Role role,
                                                                 int cuda_device,
                                                                 absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (const cudaError_t e = cudaSetDevice(cuda_device); e != cudaSuccess) {
    return cuda::Check(e, absl::StrCat("cudaSetDevice(", cuda_device, ")"));
  }
  SPECD_ASSIGN_OR_RETURN(ncclUniqueId id, ExchangeUniqueId(control, role, deadline));
  auto impl = std::make_unique<Impl>();
  impl->rank = role == Role::kVerifier ? 0 : 1;
  impl->device = cuda_device;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, impl->rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclError(r, nullptr, "ncclCommInitRankConfig");
  }
  if (absl::Status ready = WaitReady(comm, deadline, "NCCL communicator init"); !ready.ok()) {
    ncclCommAbort(comm);
    return ready;
  }
  if (const cudaError_t e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    ncclCommAbort(comm);
    return cuda::Check(e, "cudaStreamCreateWithFlags (NCCL channel)");
  }
  {
    absl::MutexLock lock(&impl->mu);
    impl->comm = comm;
  }
  SPECD_LOG_INFO("dist: NCCL bulk link up, rank {} on cuda:{}", impl->rank, cuda_device);
  return std::unique_ptr<NcclChannel>(new NcclChannel(std::move(impl)));
}

NcclChannel::~NcclChannel() {
  if (impl_->sender.joinable()) {
    (void)impl_->JoinSend();
    {
      absl::MutexLock lock(&impl_->job_mu);
      impl_->stopping = true;
    }
    impl_->sender.join();
  }
  {
    absl::MutexLock lock(&impl_->mu);
    if (ncclComm_t comm = std::exchange(impl_->comm, nullptr); comm != nullptr) {
      if (!impl_->failed && ncclCommFinalize(comm) != ncclSuccess) impl_->failed = true;
      if (!impl_->failed &&
          !WaitReady(comm, absl::Now() + kFinalizeTimeout, "ncclCommFinalize").ok()) {
        impl_->failed = true;
      }
      if (impl_->failed) {
        ncclCommAbort(comm);
      } else {
        ncclCommDestroy(comm);
      }
    }
  }
  // The communicator is gone: nothing can still be queued on the stream or use the buffer.
  cudaSetDevice(impl_->device);
  for (void* b : impl_->buffer) {
    if (b != nullptr) cudaFree(b);
  }
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

void* NcclChannel::stream() const { return impl_->stream; }

absl::StatusOr<void*> NcclChannel::Buffer(size_t bytes, int slot) {
  if (slot < 0 || slot >= kNumBuffers) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL channel buffer slot ", slot));
  }
  SPECD_RETURN_IF_ERROR(impl_->JoinSend());
  void*& buffer = impl_->buffer[slot];
  size_t& have = impl_->buffer_bytes[slot];
  if (bytes <= have) return buffer;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(impl_->device), "cudaSetDevice"));
  if (buffer != nullptr) {
    SPECD_RETURN_IF_ERROR(Synchronize(impl_->stream, absl::Seconds(30)));
    SPECD_RETURN_IF_ERROR(cuda::Check(cudaFree(buffer), "cudaFree (NCCL channel buffer)"));
    buffer = nullptr;
    have = 0;
  }
  const size_t grown = bytes + bytes / 4;  // rounds of slowly growing batches allocate rarely
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMalloc(&buffer, grown), "cudaMalloc (NCCL channel buffer)"));
  have = grown;
  return buffer;
}

absl::Status NcclChannel::Copy(void* device_dst, const void* device_src, size_t bytes) {
  SPECD_RETURN_IF_ERROR(impl_->JoinSend());
  if (bytes == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(impl_->device), "cudaSetDevice"));
  return cuda::Check(
      cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, impl_->stream),
      "NCCL channel copy");
}

absl::Status NcclChannel::SendAsync(const void* device_data, size_t bytes, void* cuda_stream) {
  SPECD_RETURN_IF_ERROR(impl_->JoinSend());
  if (!impl_->sender.joinable())
    impl_->sender = std::thread([impl = impl_.get()] { impl->SendLoop(); });
  absl::MutexLock lock(&impl_->job_mu);
  impl_->job = Impl::Job{device_data, bytes, static_cast<cudaStream_t>(cuda_stream)};
  return absl::OkStatus();
}

absl::Status NcclChannel::Send(const void* device_data, size_t bytes, void* cuda_stream) {
  SPECD_RETURN_IF_ERROR(impl_->JoinSend());
  const int peer = 1 - impl_->rank;
  // The caller's thread may have another GPU current (the verifier's engine thread, the
  // communicator having been made on the accept thread).
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(impl_->device), "cudaSetDevice"));
  return impl_->Enqueue(
      [&](ncclComm_t comm) {
        return ncclSend(device_data, bytes, ncclUint8, peer, comm,
                        static_cast<cudaStream_t>(cuda_stream));
      },
      "ncclSend");
}

absl::Status NcclChannel::Recv(void* device_data, size_t bytes, void* cuda_stream) {
  SPECD_RETURN_IF_ERROR(impl_->JoinSend());
  const int peer = 1 - impl_->rank;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(impl_->device), "cudaSetDevice"));
  return impl_->Enqueue(
      [&](ncclComm_t comm) {
        return ncclRecv(device_data, bytes, ncclUint8, peer, comm,
                        static_cast<cudaStream_t>(cuda_stream));
      },
      "ncclRecv");
}

absl::Status NcclChannel::Synchronize(void* cuda_stream, absl::Duration timeout) {
  SPECD_RETURN_IF_ERROR(impl_->JoinSend());
  return impl_->Poll(absl::Now() + timeout, "NCCL transfer", true,
                     static_cast<cudaStream_t>(cuda_stream));
}

void NcclChannel::Abort() {
  absl::MutexLock lock(&impl_->mu);
  ncclComm_t comm = std::exchange(impl_->comm, nullptr);
  if (comm == nullptr) return;
  SPECD_LOG_WARN("dist: aborting the NCCL bulk link (rank {})", impl_->rank);
  ncclCommAbort(comm);
}

#else  // !SPECD_DISTRIBUTED_HAS_NCCL

struct NcclChannel::Impl {
  int rank = 0;
};

bool NcclChannel::Available() { return false; }

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Create(Channel&, Role, int,
                                                                 absl::Duration) {
  return absl::UnimplementedError("specd was built without NCCL: no device bulk link");
}

NcclChannel::~NcclChannel() = default;

absl::Status NcclChannel::Send(const void*, size_t, void*) {
  return absl::UnimplementedError("built without NCCL");
}

absl::Status NcclChannel::SendAsync(const void*, size_t, void*) {
  return absl::UnimplementedError("built without NCCL");
}

absl::Status NcclChannel::Recv(void*, size_t, void*) {
  return absl::UnimplementedError("built without NCCL");
}

absl::Status NcclChannel::Synchronize(void*, absl::Duration) {
  return absl::UnimplementedError("built without NCCL");
}

void NcclChannel::Abort() {}

void* NcclChannel::stream() const { return nullptr; }

absl::StatusOr<void*> NcclChannel::Buffer(size_t, int) {
  return absl::UnimplementedError("built without NCCL");
}

absl::Status NcclChannel::Copy(void*, const void*, size_t) {
  return absl::UnimplementedError("built without NCCL");
}

#endif  // SPECD_DISTRIBUTED_HAS_NCCL

NcclChannel::NcclChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

int NcclChannel::rank() const { return impl_->rank; }

}  // namespace specd
