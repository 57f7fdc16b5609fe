// ShmCommunicator with real processes: ranks are forked children (each runs its body and exits
// with 0 or the failing line's code), or threads where one test needs to call Abort on a rank.
// Results are compared bitwise against plain references computed from the same deterministic
// inputs on every rank, which also proves all ranks got identical bits. Every test checks that
// nothing of its group is left in /dev/shm.
#include "engine/distributed/shm_communicator.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

// In a child: report the failing line and exit with a code the parent sees.
#define CHILD_CHECK(cond)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: rank check failed: %s\n", __FILE__, __LINE__, #cond); \
      return __LINE__ % 200 + 1;                                                         \
    }                                                                                    \
  } while (0)

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string NewGroup() {
  std::random_device rd;
  return absl::StrFormat("t%08x%08x", rd(), rd());
}

// Names of this group still in /dev/shm.
std::vector<std::string> Leftovers(const std::string& group) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  const std::string prefix = "specd-" + group;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

ShmOptions Options(const std::string& group, int32_t rank, int32_t world, size_t max_bytes,
                   absl::Duration timeout = absl::Seconds(10)) {
  return ShmOptions{.group = group,
                    .rank = rank,
                    .world_size = world,
                    .max_bytes = max_bytes,
                    .timeout = timeout};
}

// Forks one child per rank in `ranks`, each running body(rank); returns their exit codes (128 +
// signal when killed), reaping children as they end so a killed rank is not left a zombie.
std::vector<int> RunRanks(const std::vector<int32_t>& ranks,
                          const std::function<int(int32_t)>& body) {
  std::vector<pid_t> pids;
  for (int32_t r : ranks) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int code = body(r);
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -1);
  for (size_t done = 0; done < pids.size(); ++done) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] == pid)
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }
  return codes;
}

std::vector<int32_t> AllRanks(int32_t world) {
  std::vector<int32_t> r(world);
  for (int32_t i = 0; i < world; ++i) r[i] = i;
  return r;
}

// Deterministic inputs with exponents spread over 2^-10..2^10, so the order of a sum matters.
float Value(int32_t rank, uint64_t round, size_t i) {
  uint64_t h = (rank + 1) * 0x9E3779B97F4A7C15ull ^ (round + 7) * 0xC2B2AE3D27D4EB4Full ^ i;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  const float mantissa = static_cast<float>(h & 0xFFFF) / 65536.0f - 0.5f;
  return std::ldexp(mantissa, static_cast<int>((h >> 16) % 21) - 10);
}

std::vector<float> Inputs(int32_t rank, uint64_t round, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Value(rank, round, i);
  return v;
}

bool SameBits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// One round of every collective on `n` elements, checked bitwise; 0 when all matched.
int CheckRound(ShmCommunicator& comm, uint64_t round, size_t n, int which = -1) {
  const int32_t world = comm.world_size();
  const int32_t rank = comm.rank();
  if (which < 0 || which == 0) {  // AllReduceSum, in rank order
    std::vector<float> data = Inputs(rank, round, n);
    std::vector<float> want = Inputs(0, round, n);
    for (int32_t r = 1; r < world; ++r) {
      const std::vector<float> x = Inputs(r, round, n);
      for (size_t i = 0; i < n; ++i) want[i] += x[i];
    }
    CHILD_CHECK(comm.AllReduceSum(data.data(), n, CommDataType::kF32, nullptr).ok());
    CHILD_CHECK(SameBits(data.data(), want.data(), n * sizeof(float)));
  }
  if (which < 0 || which == 1) {  // AllGather f32 into a separate buffer
    const std::vector<float> send = Inputs(rank, round, n);
    std::vector<float> recv(world * n, NAN);
    CHILD_CHECK(comm.AllGather(send.data(), recv.data(), n, CommDataType::kF32, nullptr).ok());
    for (int32_t r = 0; r < world; ++r) {
      CHILD_CHECK(SameBits(recv.data() + r * n, Inputs(r, round, n).data(), n * sizeof(float)));
    }
  }
  if (which < 0 || which == 2) {  // AllGather i32 in place
    std::vector<int32_t> rows(world * n, -1);
    for (size_t i = 0; i < n; ++i) rows[rank * n + i] = static_cast<int32_t>(rank * 1000003 + i);
    CHILD_CHECK(
        comm.AllGather(rows.data() + rank * n, rows.data(), n, CommDataType::kI32, nullptr).ok());
    for (int32_t r = 0; r < world; ++r) {
      for (size_t i = 0; i < n; ++i) CHILD_CHECK(rows[r * n + i] == r * 1000003 + int32_t(i));
    }
  }
  if (which < 0 || which == 3) {  // Broadcast from a root that moves with the round
    const int32_t root = static_cast<int32_t>(round % world);
    std::vector<float> data = Inputs(rank, round, n);
    CHILD_CHECK(comm.Broadcast(data.data(), n, CommDataType::kF32, root, nullptr).ok());
    CHILD_CHECK(SameBits(data.data(), Inputs(root, round, n).data(), n * sizeof(float)));
  }
  if (which < 0 || which == 4) CHILD_CHECK(comm.Barrier(nullptr).ok());
  return 0;
}

TEST(ShmCommunicatorTest, WorldOfOneCopiesOrDoesNothing) {
  auto comm = ShmCommunicator::Create(Options(NewGroup(), 0, 1, 256));
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ(CheckRound(**comm, 3, 100), 0);
  EXPECT_FALSE((*comm)->on_device());
  EXPECT_EQ((*comm)->name(), "shm");
}

TEST(ShmCommunicatorTest, RejectsBadOptionsAndArguments) {
  EXPECT_EQ(ShmCommunicator::Create(Options("bad/name", 0, 2, 256)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmCommunicator::Create(Options(NewGroup(), 2, 2, 256)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto comm = ShmCommunicator::Create(Options(NewGroup(), 0, 1, 256));
  ASSERT_TRUE(comm.ok()) << comm.status();
  int32_t x = 1;
  EXPECT_EQ((*comm)->AllReduceSum(&x, 1, CommDataType::kI32, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)->Broadcast(&x, 1, CommDataType::kI32, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShmCommunicatorTest, CollectivesMatchReferencesOnTwoAndFourRanks) {
  // 256-byte buffers (64 floats): every size past 64 is chunked, 4099 into 65 steps.
  const std::vector<size_t> sizes = {1, 3, 63, 64, 65, 1000, 4099};
  for (int32_t world : {2, 4}) {
    const std::string group = NewGroup();
    const std::vector<int> codes = RunRanks(AllRanks(world), [&](int32_t rank) {
      auto comm = ShmCommunicator::Create(Options(group, rank, world, 256));
      CHILD_CHECK(comm.ok());
      for (size_t s = 0; s < sizes.size(); ++s) {
        if (const int code = CheckRound(**comm, s, sizes[s]); code != 0) return code;
      }
      // Cross-check: the sums every rank holds, gathered, are the same bits on all rows.
      std::vector<float> sum = Inputs(rank, 99, 777);
      CHILD_CHECK((*comm)->AllReduceSum(sum.data(), sum.size(), CommDataType::kF32, nullptr).ok());
      std::vector<float> rows(world * sum.size());
      CHILD_CHECK((*comm)
                      ->AllGather(sum.data(), rows.data(), sum.size(), CommDataType::kF32, nullptr)
                      .ok());
      for (int32_t r = 0; r < world; ++r) {
        CHILD_CHECK(SameBits(rows.data() + r * sum.size(), sum.data(), sum.size() * 4));
      }
      return 0;
    });
    for (int32_t r = 0; r < world; ++r)
      EXPECT_EQ(codes[r], 0) << "world " << world << " rank " << r;
    EXPECT_TRUE(Leftovers(group).empty());
  }
}

TEST(ShmCommunicatorTest, StressOfTwoThousandAlternatingCollectives) {
  // 4 ranks on however few cores: waiting must yield. Sizes cross the 4 KiB chunk boundary.
  constexpr int kRounds = 2000;
  constexpr int32_t kWorld = 4;
  const std::string group = NewGroup();
  const Clock::time_point start = Clock::now();
  const std::vector<int> codes = RunRanks(AllRanks(kWorld), [&](int32_t rank) {
    auto comm = ShmCommunicator::Create(Options(group, rank, kWorld, 4096));
    CHILD_CHECK(comm.ok());
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < kRounds; ++i) {
      const size_t n = 1 + (i * 37) % 1500;
      if (const int code = CheckRound(**comm, i, n, i % 5); code != 0) return code;
    }
    if (rank == 0) {
      std::printf("stress: %d collectives on %d ranks in %.1f ms (%.1f us each, %u cores)\n",
                  kRounds, kWorld, MsSince(t0), MsSince(t0) * 1000 / kRounds,
                  std::thread::hardware_concurrency());
    }
    return 0;
  });
  for (int32_t r = 0; r < kWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_LT(MsSince(start), 15000);
  EXPECT_TRUE(Leftovers(group).empty());
}

TEST(ShmCommunicatorTest, HiddenSizeAllReduceLatency) {
  // What a decode step pays per all-reduce: 4096 floats, 2 and 4 ranks (printed, loosely bounded).
  for (int32_t world : {2, 4}) {
    const std::string group = NewGroup();
    const std::vector<int> codes = RunRanks(AllRanks(world), [&](int32_t rank) {
      auto comm = ShmCommunicator::Create(Options(group, rank, world, 64 * 1024));
      CHILD_CHECK(comm.ok());
      const std::vector<float> input = Inputs(rank, 1, 4096);
      std::vector<float> data;
      constexpr int kIters = 500;
      const Clock::time_point t0 = Clock::now();
      for (int i = 0; i < kIters; ++i) {
        data = input;
        CHILD_CHECK(
            (*comm)->AllReduceSum(data.data(), data.size(), CommDataType::kF32, nullptr).ok());
      }
      const double us = MsSince(t0) * 1000 / kIters;
      if (rank == 0) std::printf("all-reduce 4096 f32, %d ranks: %.1f us\n", world, us);
      std::vector<float> want = Inputs(0, 1, 4096);
      for (int32_t r = 1; r < world; ++r) {
        for (size_t i = 0; i < want.size(); ++i) want[i] += Value(r, 1, i);
      }
      CHILD_CHECK(SameBits(data.data(), want.data(), want.size() * sizeof(float)));
      return 0;
    });
    for (int32_t r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "world " << world;
    EXPECT_TRUE(Leftovers(group).empty());
  }
}

TEST(ShmCommunicatorTest, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  const std::string group = NewGroup();
  const std::vector<int> codes = RunRanks({0, 1}, [&](int32_t rank) {
    const Clock::time_point t0 = Clock::now();
    auto comm = ShmCommunicator::Create(Options(group, rank, 3, 256, absl::Milliseconds(400)));
    CHILD_CHECK(!comm.ok());
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    CHILD_CHECK(absl::IsDeadlineExceeded(comm.status()) || absl::IsUnavailable(comm.status()));
    CHILD_CHECK(absl::StrContains(comm.status().message(), "rank 2"));
    CHILD_CHECK(MsSince(t0) < 2000);
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_TRUE(Leftovers(group).empty());
}

TEST(ShmCommunicatorTest, KilledRankFailsThePeersPromptly) {
  // The timeout is long, so only the dead-pid check can end the peers' wait quickly.
  const std::string group = NewGroup();
  const std::vector<int> codes = RunRanks(AllRanks(3), [&](int32_t rank) {
    auto comm = ShmCommunicator::Create(Options(group, rank, 3, 1024, absl::Seconds(30)));
    CHILD_CHECK(comm.ok());
    for (int i = 0;; ++i) {
      if (rank == 2 && i == 100) ::raise(SIGKILL);
      std::vector<float> data = Inputs(rank, i, 300);
      const Clock::time_point t0 = Clock::now();
      const absl::Status s =
          i % 2 ? (*comm)->AllReduceSum(data.data(), 300, CommDataType::kF32, nullptr)
                : (*comm)->Barrier(nullptr);
      if (s.ok()) continue;
      std::fprintf(stderr, "rank %d, round %d, after %.1f ms: %s\n", rank, i, MsSince(t0),
                   s.ToString().c_str());
      CHILD_CHECK(i >= 100);
      CHILD_CHECK(absl::IsUnavailable(s));
      CHILD_CHECK(absl::StrContains(s.message(), "rank 2"));
      CHILD_CHECK(MsSince(t0) < 2000);
      CHILD_CHECK((*comm)->Barrier(nullptr) == s);  // later calls: the same error
      return 0;
    }
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
  EXPECT_TRUE(Leftovers(group).empty());
}

TEST(ShmCommunicatorTest, AbortFromAnotherThreadUnblocksACollective) {
  // Ranks as threads of this process (same pid: only the flags can tell).
  const std::string group = NewGroup();
  std::unique_ptr<ShmCommunicator> comms[2];
  {
    std::thread t1([&] { comms[1] = *ShmCommunicator::Create(Options(group, 1, 2, 256)); });
    auto c0 = ShmCommunicator::Create(Options(group, 0, 2, 256));
    t1.join();
    ASSERT_TRUE(c0.ok()) << c0.status();
    ASSERT_NE(comms[1], nullptr);
    comms[0] = *std::move(c0);
  }
  EXPECT_TRUE(Leftovers(group).empty());  // unlinked once both attached
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    comms[0]->Abort();
  });
  // Rank 1 never calls: rank 0 waits until the watchdog aborts it.
  std::vector<float> data(10, 1.0f);
  const Clock::time_point t0 = Clock::now();
  const absl::Status s = comms[0]->AllReduceSum(data.data(), 10, CommDataType::kF32, nullptr);
  const double waited_ms = MsSince(t0);
  watchdog.join();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_GE(waited_ms, 90);
  EXPECT_LT(waited_ms, 10000);  // it returns (no hang); a loaded CI core can wake it late
  EXPECT_EQ(comms[0]->Barrier(nullptr), s);
  // The peer learns of it from the segment's flag, with the reason. Its first call may complete:
  // rank 0 had published its part of that step before the abort.
  absl::Status peer = comms[1]->AllReduceSum(data.data(), 10, CommDataType::kF32, nullptr);
  if (peer.ok()) peer = comms[1]->Barrier(nullptr);
  EXPECT_TRUE(absl::IsUnavailable(peer)) << peer;
  EXPECT_TRUE(absl::StrContains(peer.message(), "rank 0")) << peer;
}

TEST(ShmCommunicatorTest, StuckPeerIsUnavailableAfterTheTimeout) {
  // Rank 1 (a thread: alive, never failing) never calls; rank 0 gives up at its timeout.
  const std::string group = NewGroup();
  std::unique_ptr<ShmCommunicator> rank1;
  std::thread t1([&] {
    rank1 = *ShmCommunicator::Create(Options(group, 1, 2, 256, absl::Milliseconds(300)));
  });
  auto rank0 = ShmCommunicator::Create(Options(group, 0, 2, 256, absl::Milliseconds(300)));
  t1.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  const Clock::time_point t0 = Clock::now();
  const absl::Status s = (*rank0)->Barrier(nullptr);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1 did not reach step 1")) << s;
  EXPECT_GE(MsSince(t0), 290);
  EXPECT_LT(MsSince(t0), 1500);
}

TEST(ShmCommunicatorTest, TakenSegmentNameIsAlreadyExists) {
  const std::string group = NewGroup();
  const std::string path = "/dev/shm/specd-" + group + "-r0";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const auto comm = ShmCommunicator::Create(Options(group, 0, 2, 256, absl::Milliseconds(100)));
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kAlreadyExists) << comm.status();
  std::remove(path.c_str());
  EXPECT_TRUE(Leftovers(group).empty());
}

}  // namespace
}  // namespace specd
