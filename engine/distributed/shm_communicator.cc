// ShmCommunicator: segments, the step protocol and the waiting policy (see the header).
#include "engine/distributed/shm_communicator.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/base/log.h"
#include "engine/base/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specd {

namespace {

constexpr uint64_t kMagic = 0x314D534443455053ull;  // "SPECDSM1"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kAlign = 64;
// Waiting: spin, then yield for kYieldFor, then sleep on the lagging peer's futex word (woken
// when it publishes, or after kSleep to check the deadline and pids). With a core per rank a long
// spin catches a peer that is microseconds behind; with more ranks than cores spinning steals the
// core the peer needs, so the spin is short and the futex hands the core over. Measured on 2
// cores (shm_communicator_test, 4096-float all-reduce): 2 ranks ~8 us with the long spin; 4 ranks
// ~70-100 us with the short one vs ~400 us with sched_yield and sleeps alone.
constexpr int kLongSpinPolls = 2000;
constexpr int kShortSpinPolls = 64;
constexpr auto kYieldFor = std::chrono::microseconds(20);
constexpr auto kSleep = std::chrono::microseconds(2000);
constexpr auto kPidCheckInterval = std::chrono::milliseconds(5);
constexpr auto kAttachPoll = std::chrono::milliseconds(1);

// Failure flag values.
constexpr uint32_t kHealthy = 0;
constexpr uint32_t kWritingReason = 1;
constexpr uint32_t kFailed = 2;

using Clock = std::chrono::steady_clock;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string SegmentName(const std::string& group, int32_t rank) {
  return absl::StrCat("/specd-", group, "-r", rank);
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string Errno(std::string_view what) {
  return absl::StrCat(absl::string_view(what.data(), what.size()), ": ", std::strerror(errno));
}

// True when `pid` is gone or a zombie (a killed child its parent has not reaped yet still
// answers kill(pid, 0)).
bool ProcessDead(int32_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;  // no /proc: trust kill()
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // "pid (comm) S ...": comm may hold spaces
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  const timespec ts = {static_cast<time_t>(timeout.count() / 1000000),
                       static_cast<long>(timeout.count() % 1000000) * 1000};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

std::string RankList(const std::vector<int32_t>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

// The header at the start of each rank's segment; the two payload buffers follow at kHeaderBytes.
// Written by its owner only (the flags and stamps are what peers read).
struct ShmCommunicator::Segment {
  std::atomic<uint64_t> magic{0};  // kMagic once the fields below are valid (release)
  int32_t rank = 0;
  int32_t world_size = 0;
  uint64_t buffer_bytes = 0;
  int32_t pid = 0;
  alignas(kAlign) std::atomic<uint32_t> attached{0};  // 1: this rank mapped every peer
  std::atomic<uint32_t> failure{kHealthy};            // kFailed: `reason` says why
  char reason[200] = {};
  alignas(kAlign) std::atomic<uint32_t> epoch{0};  // futex word: bumped after every stamp change
  std::atomic<uint32_t> sleepers{0};               // peers in FUTEX_WAIT on `epoch`
  alignas(kAlign) std::atomic<uint64_t> published{0};  // last step whose payload is in its buffer
  alignas(kAlign) std::atomic<uint64_t> consumed{0};   // last step whose peer data it has read
};

static_assert(sizeof(ShmCommunicator::Segment) <= kHeaderBytes);

// After a stamp or flag of `s` changed: bump its futex word, wake peers sleeping on it. The
// seq_cst pair (epoch, sleepers) here and in SleepOn makes a lost wake-up impossible: either the
// waker sees the sleeper, or the sleeper reads the new epoch and does not sleep.
void ShmCommunicator::Wake(Segment* s) {
  s->epoch.fetch_add(1, std::memory_order_seq_cst);
  if (s->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&s->epoch);
}

template <typename Ready>
void ShmCommunicator::SleepOn(Segment* s, Ready&& ready) {
  s->sleepers.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t epoch = s->epoch.load(std::memory_order_seq_cst);
  if (!ready()) FutexWait(&s->epoch, epoch, kSleep);
  s->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}
static_assert(std::atomic<uint64_t>::is_always_lock_free, "stamps must work across processes");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "flags must work across processes");

ShmCommunicator::ShmCommunicator(const ShmOptions& options)
    : group_(options.group),
      rank_(options.rank),
      world_size_(options.world_size),
      buffer_bytes_(RoundUp(std::max<size_t>(options.max_bytes, kAlign), kAlign)),
      segment_bytes_(kHeaderBytes + 2 * buffer_bytes_),
      timeout_(options.timeout),
      spin_polls_(std::thread::hardware_concurrency() >= static_cast<unsigned>(options.world_size)
                      ? kLongSpinPolls
                      : kShortSpinPolls),
      segments_(options.world_size, nullptr) {}

absl::StatusOr<std::unique_ptr<ShmCommunicator>> ShmCommunicator::Create(
    const ShmOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("shm communicator: rank ", options.rank,
                                                   " not in a world of ", options.world_size));
  }
  const bool group_ok = !options.group.empty() && options.group.size() <= 64 &&
                        std::all_of(options.group.begin(), options.group.end(), [](char c) {
                          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                                 (c >= '0' && c <= '9') || c == '_' || c == '-';
                        });
  if (!group_ok) {
    return absl::InvalidArgumentError(absl::StrCat("shm communicator: group id '", options.group,
                                                   "' is not 1..64 of [A-Za-z0-9_-]"));
  }
  if (options.max_bytes > (size_t{1} << 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm communicator: max_bytes ", options.max_bytes, " over 4 GiB"));
  }
  auto comm = std::unique_ptr<ShmCommunicator>(new ShmCommunicator(options));
  if (comm->world_size_ == 1) return comm;
  const absl::Time deadline = absl::Now() + options.timeout;
  absl::Status status = comm->CreateOwnSegment();
  if (status.ok()) status = comm->MapPeers(deadline);
  if (status.ok()) status = comm->MeetPeers(deadline);
  if (!status.ok()) {
    // Peers waiting for us see the flag; names of ranks that died before unlinking theirs go too.
    if (comm->segments_[comm->rank_] != nullptr) comm->MarkFailed(std::string(status.message()));
    for (int32_t r = 0; r < comm->world_size_; ++r) {
      if (r != comm->rank_) ::shm_unlink(SegmentName(comm->group_, r).c_str());
    }
    return status;  // the destructor unlinks our own name and unmaps
  }
  SPECD_LOG_INFO("dist: shm communicator up, group {} rank {}/{}, {} KiB per buffer", comm->group_,
                 comm->rank_, comm->world_size_, comm->buffer_bytes_ / 1024);
  return comm;
}

ShmCommunicator::~ShmCommunicator() {
  if (own_name_linked_) ::shm_unlink(SegmentName(group_, rank_).c_str());
  for (Segment* s : segments_) {
    if (s != nullptr) ::munmap(s, segment_bytes_);
  }
}

absl::Status ShmCommunicator::CreateOwnSegment() {
  const std::string name = SegmentName(group_, rank_);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(
          "shm communicator: /dev/shm", name,
          " exists (a reused group id, or left by a run killed during its rendezvous)"));
    }
    return absl::InternalError(Errno(absl::StrCat("shm_open(", name, ")")));
  }
  own_name_linked_ = true;
  void* base = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(segment_bytes_)) == 0) {
    base = ::mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const std::string error = Errno(absl::StrCat("creating ", name));
  ::close(fd);
  if (base == MAP_FAILED) return absl::ResourceExhaustedError(error);
  Segment* own = new (base) Segment();
  own->rank = rank_;
  own->world_size = world_size_;
  own->buffer_bytes = buffer_bytes_;
  own->pid = static_cast<int32_t>(::getpid());
  own->magic.store(kMagic, std::memory_order_release);
  segments_[rank_] = own;
  return absl::OkStatus();
}

absl::Status ShmCommunicator::MapPeers(absl::Time deadline) {
  while (true) {
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < world_size_; ++r) {
      if (segments_[r] != nullptr) continue;
      const std::string name = SegmentName(group_, r);
      const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
      if (fd < 0 && errno != ENOENT) {
        return absl::InternalError(Errno(absl::StrCat("shm_open(", name, ")")));
      }
      struct stat st = {};
      if (fd >= 0 && ::fstat(fd, &st) == 0 && st.st_size != 0 &&
          static_cast<size_t>(st.st_size) != segment_bytes_) {
        ::close(fd);
        return absl::InvalidArgumentError(
            absl::StrCat("shm communicator: rank ", r, "'s segment has ", st.st_size,
                         " bytes, this rank's ", segment_bytes_, " (max_bytes differ)"));
      }
      void* base = MAP_FAILED;
      if (fd >= 0 && static_cast<size_t>(st.st_size) == segment_bytes_) {
        base = ::mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      if (fd >= 0) ::close(fd);
      if (base != MAP_FAILED) segments_[r] = static_cast<Segment*>(base);
      if (segments_[r] == nullptr) missing.push_back(r);
    }
    // A mapped peer counts once its header is complete.
    for (int32_t r = 0; r < world_size_; ++r) {
      Segment* s = segments_[r];
      if (s == nullptr || r == rank_) continue;
      if (s->magic.load(std::memory_order_acquire) != kMagic) {
        missing.push_back(r);
      } else if (s->world_size != world_size_ || s->rank != r) {
        return absl::InvalidArgumentError(absl::StrCat("shm communicator: rank ", r,
                                                       " has world size ", s->world_size,
                                                       ", this rank ", world_size_));
      }
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      std::sort(missing.begin(), missing.end());
      return absl::DeadlineExceededError(
          absl::StrCat("shm communicator group ", group_, ": ", RankList(missing), " of ",
                       world_size_, " did not arrive within ", absl::FormatDuration(timeout_)));
    }
    std::this_thread::sleep_for(kAttachPoll);
  }
}

absl::Status ShmCommunicator::MeetPeers(absl::Time deadline) {
  segments_[rank_]->attached.store(1, std::memory_order_release);
  while (true) {
    std::vector<int32_t> missing;
    for (int32_t r = 0; r < world_size_; ++r) {
      if (r == rank_ || segments_[r]->attached.load(std::memory_order_acquire) == 1) continue;
      SPECD_RETURN_IF_ERROR(CheckPeer(r, true));
      missing.push_back(r);
    }
    if (missing.empty()) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("shm communicator group ", group_, ": ", RankList(missing), " of ",
                       world_size_, " did not attach within ", absl::FormatDuration(timeout_)));
    }
    std::this_thread::sleep_for(kAttachPoll);
  }
  // Every peer has mapped this segment: the name is no longer needed.
  ::shm_unlink(SegmentName(group_, rank_).c_str());
  own_name_linked_ = false;
  return absl::OkStatus();
}

absl::Status ShmCommunicator::CheckPeer(int32_t peer, bool check_pid) const {
  const Segment* s = segments_[peer];
  if (s->failure.load(std::memory_order_acquire) == kFailed) {
    return absl::UnavailableError(absl::StrCat(
        "shm communicator: rank ", peer,
        " failed: ", absl::string_view(s->reason, strnlen(s->reason, sizeof(s->reason)))));
  }
  if (check_pid && s->pid != static_cast<int32_t>(::getpid()) && ProcessDead(s->pid)) {
    return absl::UnavailableError(
        absl::StrCat("shm communicator: rank ", peer, " (pid ", s->pid, ") died"));
  }
  return absl::OkStatus();
}

void ShmCommunicator::MarkFailed(const std::string& reason) {
  Segment* own = segments_[rank_];
  uint32_t expected = kHealthy;
  // Only the first failure writes a reason (Abort may race with the collective thread).
  if (!own->failure.compare_exchange_strong(expected, kWritingReason, std::memory_order_acq_rel)) {
    return;
  }
  const std::string text = absl::StrCat("rank ", rank_, ": ", reason);
  const size_t n = std::min(text.size(), sizeof(own->reason) - 1);
  std::memcpy(own->reason, text.data(), n);
  own->reason[n] = '\0';
  own->failure.store(kFailed, std::memory_order_release);
  Wake(own);
}

absl::Status ShmCommunicator::Fail(absl::Status status) {
  if (failed_.ok()) {
    failed_ = status;
    if (segments_[rank_] != nullptr) MarkFailed(std::string(status.message()));
    SPECD_LOG_WARN("dist: shm communicator rank {} failed: {}", rank_,
                   std::string(status.message()));
  }
  return failed_;
}

absl::Status ShmCommunicator::Precheck() {
  if (!failed_.ok()) return failed_;
  if (aborted_.load(std::memory_order_acquire)) {
    return Fail(absl::UnavailableError(absl::StrCat("shm communicator: rank ", rank_, " aborted")));
  }
  return absl::OkStatus();
}

void ShmCommunicator::Abort() {
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  if (world_size_ == 1 || segments_[rank_] == nullptr) return;
  MarkFailed("aborted");
  // This rank's collective thread may sleep on any peer's word: wake them all.
  for (Segment* s : segments_) {
    if (s != nullptr) Wake(s);
  }
}

uint8_t* ShmCommunicator::Buffer(int32_t rank, uint64_t step) const {
  return reinterpret_cast<uint8_t*>(segments_[rank]) + kHeaderBytes + (step % 2) * buffer_bytes_;
}

template <typename Ready>
absl::Status ShmCommunicator::WaitFor(int32_t from, Ready&& ready, const char* what) {
  const auto all_ready = [&] {
    if (from >= 0) return ready(from);
    for (int32_t r = 0; r < world_size_; ++r) {
      if (r != rank_ && !ready(r)) return false;
    }
    return true;
  };
  for (int i = 0; i < spin_polls_; ++i) {
    if (all_ready()) return absl::OkStatus();
    CpuRelax();
  }
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + absl::ToChronoNanoseconds(timeout_);
  Clock::time_point next_pid_check = start;
  while (!all_ready()) {
    if (aborted_.load(std::memory_order_acquire)) {
      return absl::UnavailableError(absl::StrCat("shm communicator: rank ", rank_, " aborted"));
    }
    const Clock::time_point now = Clock::now();
    const bool check_pid = now >= next_pid_check;
    if (check_pid) next_pid_check = now + kPidCheckInterval;
    std::vector<int32_t> lagging;
    for (int32_t r = 0; r < world_size_; ++r) {
      if (r == rank_ || (from >= 0 && r != from) || ready(r)) continue;
      SPECD_RETURN_IF_ERROR(CheckPeer(r, check_pid));
      lagging.push_back(r);
    }
    if (lagging.empty()) continue;  // became ready while we looked
    if (now >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("shm communicator: ", RankList(lagging), " did not reach step ", step_, " (",
                       what, ") within ", absl::FormatDuration(timeout_), "; stuck or deadlocked"));
    }
    if (now - start < kYieldFor) {
      ::sched_yield();
    } else {
      SleepOn(segments_[lagging.front()], [&] { return ready(lagging.front()); });
    }
  }
  return absl::OkStatus();
}

template <typename Read>
absl::Status ShmCommunicator::Step(const void* payload, size_t bytes, int32_t from, Read&& read) {
  const uint64_t k = ++step_;
  Segment* own = segments_[rank_];
  if (bytes > 0) {
    // Buffer k % 2 last held step k - 2: every peer must have read it.
    if (k > 2) {
      absl::Status s = WaitFor(
          -1,
          [&](int32_t r) {
            return segments_[r]->consumed.load(std::memory_order_acquire) + 2 >= k;
          },
          "buffer reuse");
      if (!s.ok()) return Fail(std::move(s));
    }
    std::memcpy(Buffer(rank_, k), payload, bytes);
  }
  own->published.store(k, std::memory_order_release);
  Wake(own);
  absl::Status s = WaitFor(
      from, [&](int32_t r) { return segments_[r]->published.load(std::memory_order_acquire) >= k; },
      "publish");
  if (!s.ok()) return Fail(std::move(s));
  read(k);
  own->consumed.store(k, std::memory_order_release);
  Wake(own);
  return absl::OkStatus();
}

absl::Status ShmCommunicator::AllReduceSum(void* data, size_t count, CommDataType type, void*) {
  if (type != CommDataType::kF32) {
    return absl::InvalidArgumentError("shm communicator: AllReduceSum takes kF32 only");
  }
  SPECD_RETURN_IF_ERROR(Precheck());
  if (count == 0 || world_size_ == 1) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("AllReduceSum: null data");
  float* out = static_cast<float*>(data);
  const size_t per_step = buffer_bytes_ / sizeof(float);
  constexpr size_t kBlock = 1024;  // a block of the sum stays in L1 while ranks are added
  for (size_t off = 0; off < count; off += per_step) {
    const size_t n = std::min(per_step, count - off);
    SPECD_RETURN_IF_ERROR(Step(out + off, n * sizeof(float), -1, [&](uint64_t k) {
      for (size_t b = 0; b < n; b += kBlock) {
        const size_t m = std::min(kBlock, n - b);
        float* dst = out + off + b;
        std::memcpy(dst, reinterpret_cast<const float*>(Buffer(0, k)) + b, m * sizeof(float));
        for (int32_t r = 1; r < world_size_; ++r) {  // rank order: bitwise equal on every rank
          const float* src = reinterpret_cast<const float*>(Buffer(r, k)) + b;
          for (size_t i = 0; i < m; ++i) dst[i] += src[i];
        }
      }
    }));
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::AllGather(const void* send, void* recv, size_t count,
                                        CommDataType type, void*) {
  SPECD_RETURN_IF_ERROR(Precheck());
  const size_t elem = CommDataTypeBytes(type);
  const size_t row_bytes = count * elem;
  if (count == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) {
    return absl::InvalidArgumentError("AllGather: null buffer");
  }
  uint8_t* rows = static_cast<uint8_t*>(recv);
  const uint8_t* in = static_cast<const uint8_t*>(send);
  const bool in_place = in == rows + rank_ * row_bytes;
  if (world_size_ == 1) {
    if (!in_place) std::memcpy(rows, in, row_bytes);
    return absl::OkStatus();
  }
  const size_t per_step = buffer_bytes_ / elem * elem;
  for (size_t off = 0; off < row_bytes; off += per_step) {
    const size_t n = std::min(per_step, row_bytes - off);
    SPECD_RETURN_IF_ERROR(Step(in + off, n, -1, [&](uint64_t k) {
      for (int32_t r = 0; r < world_size_; ++r) {
        if (r == rank_ && in_place) continue;
        std::memcpy(rows + r * row_bytes + off, Buffer(r, k), n);
      }
    }));
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Broadcast(void* data, size_t count, CommDataType type, int32_t root,
                                        void*) {
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " not in a world of ", world_size_));
  }
  SPECD_RETURN_IF_ERROR(Precheck());
  const size_t bytes = count * CommDataTypeBytes(type);
  if (bytes == 0 || world_size_ == 1) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("Broadcast: null data");
  uint8_t* p = static_cast<uint8_t*>(data);
  const bool is_root = rank_ == root;
  for (size_t off = 0; off < bytes; off += buffer_bytes_) {
    const size_t n = std::min(buffer_bytes_, bytes - off);
    // Only the root writes, and the others wait for the root alone.
    SPECD_RETURN_IF_ERROR(
        Step(is_root ? p + off : nullptr, is_root ? n : 0, is_root ? rank_ : root, [&](uint64_t k) {
          if (!is_root) std::memcpy(p + off, Buffer(root, k), n);
        }));
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Barrier(void*) {
  SPECD_RETURN_IF_ERROR(Precheck());
  if (world_size_ == 1) return absl::OkStatus();
  return Step(nullptr, 0, -1, [](uint64_t) {});
}

}  // namespace specd
