// Setup of the one-shot all-reduce group: allocate and zero this rank's staging buffer, exchange
// where every rank's buffer lives (host, process, GPU, IPC handle), agree on the outcome, map the
// peers' buffers. Every decision that could differ between ranks is gathered, so all ranks
// enable the path or none does (a rank alone on it would wait for peers that use NCCL).
#include "engine/distributed/oneshot_allreduce.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"

namespace specd {
namespace {

// Largest message slot: each rank holds two per rank of the group.
constexpr size_t kMaxSlotBytes = size_t{16} << 20;

}  // namespace

// What each rank tells the others; fixed size and trivially copyable (it travels as bytes).
struct OneShotAllReduce::RankInfo {
  char host[64];        // hostname
  char boot_id[40];     // /proc/sys/kernel/random/boot_id: tells hosts apart with one name
  uint64_t process;     // random per process: same value means same address space
  char pci_bus_id[32];  // of the rank's GPU
  uint64_t buffer;      // the staging buffer's device pointer in its own process
  uint64_t slot_bytes;  // what the rank can hold (0: it cannot take part)
  cudaIpcMemHandle_t handle;
};
static_assert(sizeof(OneShotAllReduce::RankInfo) % 4 == 0);

namespace {

uint64_t ProcessToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  return token;
}

void CopyString(const std::string& from, char* to, size_t size) {
  std::memset(to, 0, size);
  std::memcpy(to, from.data(), std::min(from.size(), size - 1));
}

std::string BootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

std::string Why(cudaError_t e, std::string_view what) {
  cudaGetLastError();  // a failed runtime call may leave the error behind for the next launch
  return absl::StrCat(absl::string_view(what.data(), what.size()), ": ", cudaGetErrorName(e));
}

template <typename T>
std::span<const uint8_t> BytesOf(const T& v) {
  return {reinterpret_cast<const uint8_t*>(&v), sizeof(v)};
}

// Gathers one u32 from every rank: 1 where the rank succeeded.
absl::StatusOr<bool> AllAgree(bool ok, int32_t world_size, const HostAllGather& gather) {
  const uint32_t mine = ok ? 1 : 0;
  std::vector<uint32_t> all(world_size);
  SPECD_RETURN_IF_ERROR(
      gather(BytesOf(mine), {reinterpret_cast<uint8_t*>(all.data()), all.size() * 4}));
  return std::all_of(all.begin(), all.end(), [](uint32_t v) { return v == 1; });
}

}  // namespace

absl::StatusOr<std::unique_ptr<OneShotAllReduce>> OneShotAllReduce::Create(
    int32_t rank, int32_t world_size, int32_t device, size_t max_bytes,
    const HostAllGather& gather) {
  if (world_size < 2 || world_size > kernels::kOneShotMaxRanks) return nullptr;
  auto self = std::unique_ptr<OneShotAllReduce>(new OneShotAllReduce());
  self->device_ = device;
  self->group_.rank = rank;
  self->group_.world_size = world_size;

  // 1. This rank's staging buffer and host-mapped words.
  RankInfo info = {};
  char host[sizeof(info.host)] = {};
  gethostname(host, sizeof(host) - 1);
  CopyString(host, info.host, sizeof(info.host));
  CopyString(BootId(), info.boot_id, sizeof(info.boot_id));
  info.process = ProcessToken();
  std::string problem =
      max_bytes == 0
          ? "turned off (0 bytes)"
          : self->AllocateLocal((std::min(max_bytes, kMaxSlotBytes) + 15) / 16 * 16, info);

  // 2. Everyone's info; the smallest slot wins.
  std::vector<RankInfo> all(world_size);
  SPECD_RETURN_IF_ERROR(
      gather(BytesOf(info), {reinterpret_cast<uint8_t*>(all.data()), all.size() * sizeof(info)}));
  uint64_t common_slot = kMaxSlotBytes;
  for (const RankInfo& peer : all) common_slot = std::min(common_slot, peer.slot_bytes);
  if (common_slot == 0 && problem.empty()) problem = "a peer turned it off or could not set it up";
  self->group_.slot_bytes = common_slot;

  // 3. Map every peer's buffer on this rank's GPU.
  self->group_.buffers[rank] = self->own_buffer_;
  for (int32_t r = 0; r < world_size && problem.empty(); ++r) {
    if (r != rank) problem = self->MapPeer(r, all[r], info);
  }

  // 4. All or none.
  SPECD_ASSIGN_OR_RETURN(const bool everyone, AllAgree(problem.empty(), world_size, gather));
  if (!everyone) {
    const std::string why = problem.empty() ? "a peer could not set it up" : problem;
    if (max_bytes == 0) {
      SPECD_LOG_INFO("dist: one-shot all-reduce off on rank {}: {}", rank, why);
    } else {
      SPECD_LOG_WARN("dist: one-shot all-reduce off on rank {}: {}; NCCL for all sizes", rank, why);
    }
    return nullptr;
  }
  SPECD_LOG_INFO("dist: one-shot all-reduce on for messages up to {} bytes (rank {}/{})",
                 common_slot, rank, world_size);
  return self;
}

std::string OneShotAllReduce::AllocateLocal(size_t slot, RankInfo& info) {
  if (cudaError_t e = cudaDeviceGetPCIBusId(info.pci_bus_id, sizeof(info.pci_bus_id), device_);
      e != cudaSuccess) {
    return Why(e, "cudaDeviceGetPCIBusId");
  }
  if (cudaError_t e =
          cudaMalloc(&own_buffer_, kernels::OneShotBufferBytes(slot, group_.world_size));
      e != cudaSuccess) {
    own_buffer_ = nullptr;
    return Why(e, "cudaMalloc (one-shot staging buffer)");
  }
  if (cudaError_t e =
          cudaMemset(own_buffer_, 0, kernels::OneShotBufferBytes(slot, group_.world_size));
      e != cudaSuccess) {
    return Why(e, "cudaMemset");
  }
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {  // zeroed before peers write
    return Why(e, "cudaDeviceSynchronize");
  }
  if (cudaError_t e = cudaIpcGetMemHandle(&info.handle, own_buffer_); e != cudaSuccess) {
    return Why(e, "cudaIpcGetMemHandle");
  }
  if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&host_words_), 2 * sizeof(uint32_t),
                                    cudaHostAllocMapped);
      e != cudaSuccess) {
    host_words_ = nullptr;
    return Why(e, "cudaHostAlloc (mapped)");
  }
  host_words_[0] = host_words_[1] = 0;
  uint32_t* device_words = nullptr;
  if (cudaError_t e =
          cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_words), host_words_, 0);
      e != cudaSuccess) {
    return Why(e, "cudaHostGetDevicePointer");
  }
  group_.abort_word = device_words;
  group_.error_word = device_words + 1;
  info.buffer = reinterpret_cast<uint64_t>(own_buffer_);
  info.slot_bytes = slot;
  return "";
}

std::string OneShotAllReduce::MapPeer(int32_t r, const RankInfo& peer, const RankInfo& mine) {
  if (std::strncmp(peer.host, mine.host, sizeof(mine.host)) != 0 ||
      std::strncmp(peer.boot_id, mine.boot_id, sizeof(mine.boot_id)) != 0) {
    return absl::StrCat("rank ", r, " is on another host (", peer.host, ")");
  }
  int peer_device = -1, can_access = 0;
  if (cudaError_t e = cudaDeviceGetByPCIBusId(&peer_device, peer.pci_bus_id); e != cudaSuccess) {
    return Why(e, absl::StrCat("rank ", r, "'s GPU ", peer.pci_bus_id, " is not visible"));
  }
  if (cudaError_t e = cudaDeviceCanAccessPeer(&can_access, device_, peer_device);
      e != cudaSuccess) {
    return Why(e, "cudaDeviceCanAccessPeer");
  }
  if (!can_access)
    return absl::StrCat("no peer access from cuda:", device_, " to cuda:", peer_device);
  if (peer.process == mine.process) {  // threads of one process: the pointer itself
    const cudaError_t e = cudaDeviceEnablePeerAccess(peer_device, 0);
    cudaGetLastError();  // AlreadyEnabled stays as the last error until read
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
      return Why(e, "cudaDeviceEnablePeerAccess");
    }
    group_.buffers[r] = reinterpret_cast<void*>(peer.buffer);
    return "";
  }
  if (cudaError_t e =
          cudaIpcOpenMemHandle(&opened_[r], peer.handle, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    opened_[r] = nullptr;
    return Why(e, absl::StrCat("cudaIpcOpenMemHandle (rank ", r, ")"));
  }
  group_.buffers[r] = opened_[r];
  return "";
}

OneShotAllReduce::~OneShotAllReduce() {
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  for (void* p : opened_) {
    if (p != nullptr) cudaIpcCloseMemHandle(p);
  }
  if (own_buffer_ != nullptr) cudaFree(own_buffer_);
  if (host_words_ != nullptr) cudaFreeHost(host_words_);
  if (previous >= 0) cudaSetDevice(previous);
}

bool OneShotAllReduce::Accepts(size_t count, CommDataType type) const {
  size_t element = 0;
  if (type == CommDataType::kF32) element = sizeof(float);
  if (type == CommDataType::kBF16) element = sizeof(uint16_t);
  return element != 0 && count > 0 && count <= capacity() / element;
}

absl::Status OneShotAllReduce::GaveUpError() const {
  return absl::UnavailableError(
      absl::StrCat("one-shot all-reduce on rank ", group_.rank,
                   host_words_[0] != 0 ? " aborted" : ": a kernel timed out waiting for a peer"));
}

absl::Status OneShotAllReduce::Run(void* data, size_t count, CommDataType type, void* stream) {
  if (GaveUp()) return GaveUpError();
  const auto s = static_cast<cudaStream_t>(stream);
  const auto n = static_cast<int64_t>(count);
  const cudaError_t e =
      type == CommDataType::kF32
          ? kernels::OneShotAllReduce(static_cast<float*>(data), n, group_, s)
          : kernels::OneShotAllReduce(static_cast<__nv_bfloat16*>(data), n, group_, s);
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("one-shot all-reduce launch: ", cudaGetErrorName(e)));
  }
  return absl::OkStatus();
}

bool OneShotAllReduce::AcceptsAddRmsNorm(int64_t rows, int64_t hidden) const {
  return kernels::OneShotFusesNorm(group_.world_size, rows, hidden, group_.slot_bytes);
}

absl::Status OneShotAllReduce::RunAddRmsNorm(void* data, void* residual, const void* weight,
                                             int64_t rows, int64_t hidden, float eps,
                                             void* stream) {
  if (GaveUp()) return GaveUpError();
  const cudaError_t e = kernels::OneShotAllReduceAddRmsNorm(
      static_cast<__nv_bfloat16*>(data), static_cast<__nv_bfloat16*>(residual),
      static_cast<const __nv_bfloat16*>(weight), rows, hidden, eps, group_,
      static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("one-shot all-reduce + RMSNorm launch: ", cudaGetErrorName(e)));
  }
  return absl::OkStatus();
}

void OneShotAllReduce::Abort() {
  if (host_words_ != nullptr) reinterpret_cast<volatile uint32_t*>(host_words_)[0] = 1;
}

bool OneShotAllReduce::GaveUp() const {
  const auto* words = reinterpret_cast<const volatile uint32_t*>(host_words_);
  return words[0] != 0 || words[1] != 0;
}

}  // namespace specd
