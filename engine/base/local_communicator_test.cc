// LocalCommGroup: collectives among rank threads (rank-order sums, in-place gathers, broadcast),
// a mismatched call reported to every rank, and Abort unblocking a waiting rank.
#include "engine/base/local_communicator.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

namespace specd {
namespace {

// Runs fn(rank) on one thread per rank and waits for all of them.
void RunRanks(int32_t n, const std::function<void(int32_t)>& fn) {
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

TEST(LocalCommGroupTest, AllReduceSumGivesEveryRankTheRankOrderSum) {
  constexpr int32_t kRanks = 3;
  LocalCommGroup group(kRanks);
  // 1e8 + 1 - 1e8 in f32 depends on the order: rank order gives (1e8 + 1) - 1e8 = 0.
  const float values[kRanks] = {1e8f, 1.0f, -1e8f};
  std::vector<std::vector<float>> data(kRanks);
  RunRanks(kRanks, [&](int32_t r) {
    for (int round = 0; round < 50; ++round) {  // many generations back to back
      data[r] = {values[r], static_cast<float>(r + round)};
      ASSERT_TRUE(group.comm(r)->AllReduceSum(data[r].data(), 2, CommDataType::kF32, nullptr).ok());
      ASSERT_EQ(data[r][1], static_cast<float>(3 * round + 3));
    }
  });
  for (int32_t r = 0; r < kRanks; ++r) {
    EXPECT_EQ(data[r][0], (1e8f + 1.0f) + -1e8f);
    EXPECT_EQ(group.comm(r)->rank(), r);
    EXPECT_EQ(group.comm(r)->world_size(), kRanks);
  }
}

TEST(LocalCommGroupTest, AllGatherInPlaceAndBroadcast) {
  constexpr int32_t kRanks = 4;
  LocalCommGroup group(kRanks);
  std::vector<std::vector<int32_t>> gathered(kRanks, std::vector<int32_t>(2 * kRanks, -1));
  std::vector<std::vector<float>> broadcast(kRanks);
  RunRanks(kRanks, [&](int32_t r) {
    int32_t* mine = gathered[r].data() + 2 * r;  // in place: send is recv's row r
    mine[0] = 10 * r;
    mine[1] = 10 * r + 1;
    ASSERT_TRUE(
        group.comm(r)->AllGather(mine, gathered[r].data(), 2, CommDataType::kI32, nullptr).ok());
    broadcast[r] = {static_cast<float>(r), 0.5f};
    ASSERT_TRUE(
        group.comm(r)->Broadcast(broadcast[r].data(), 2, CommDataType::kF32, 2, nullptr).ok());
    ASSERT_TRUE(group.comm(r)->Barrier(nullptr).ok());
  });
  for (int32_t r = 0; r < kRanks; ++r) {
    EXPECT_EQ(gathered[r], (std::vector<int32_t>{0, 1, 10, 11, 20, 21, 30, 31}));
    EXPECT_EQ(broadcast[r], (std::vector<float>{2.0f, 0.5f}));
  }
}

TEST(LocalCommGroupTest, MismatchedCallsFailOnEveryRank) {
  LocalCommGroup group(2);
  std::vector<absl::Status> status(2);
  RunRanks(2, [&](int32_t r) {
    std::vector<float> data(4, 1.0f);
    status[r] =
        group.comm(r)->AllReduceSum(data.data(), r == 0 ? 4 : 3, CommDataType::kF32, nullptr);
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("3 elements"), std::string::npos) << s;
  }
}

TEST(LocalCommGroupTest, AbortUnblocksAWaitingRankAndFailsLaterCalls) {
  LocalCommGroup group(2);
  absl::Status waited;
  std::thread rank0([&] { waited = group.comm(0)->Barrier(nullptr); });
  group.comm(1)->Abort();  // rank 1 never enters the barrier
  rank0.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(group.comm(1)->Barrier(nullptr).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace specd
