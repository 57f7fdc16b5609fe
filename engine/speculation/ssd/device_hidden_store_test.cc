// DeviceHiddenStore's bookkeeping over host memory (the NCCL link's buffers on a GPU): what a
// request sends is each sequence's rows of the asked positions, in order, after truncations,
// gaps, per-sequence caps and compactions of the arena.
#include "engine/speculation/ssd/device_hidden_store.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

namespace specd {
namespace {

// A row is (sequence, position) as two u32: 8 bytes.
constexpr size_t kRowBytes = 8;

class HostLink : public DeviceRowLink {
 public:
  absl::StatusOr<void*> Buffer(size_t bytes, int slot) override {
    std::vector<uint8_t>& b = buffers_[slot];
    if (bytes > b.size()) b.assign(bytes, 0xCD);  // growing drops the contents
    return b.data();
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Send(const void* data, size_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(data);
    sent.emplace_back(p, p + bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    ++syncs;
    return absl::OkStatus();
  }

  std::vector<std::vector<uint8_t>> sent;
  int syncs = 0;

 private:
  std::array<std::vector<uint8_t>, 4> buffers_;
};

// A pass: chunks (seq, first position, count); writes their rows where BeginPass says and
// stores them.
struct Chunk {
  uint64_t seq;
  int32_t position;
  int32_t count;
};
void Pass(DeviceHiddenStore& store, std::vector<Chunk> chunks) {
  int64_t rows = 0;
  for (const Chunk& c : chunks) rows += c.count;
  absl::StatusOr<void*> to = store.BeginPass(rows);
  ASSERT_TRUE(to.ok()) << to.status();
  auto* out = static_cast<uint32_t*>(*to);
  int64_t at = 0;
  for (const Chunk& c : chunks) {
    store.Truncate(c.seq, c.position);
    for (int32_t i = 0; i < c.count; ++i) {
      out[2 * (at + i)] = static_cast<uint32_t>(c.seq);
      out[2 * (at + i) + 1] = static_cast<uint32_t>(c.position + i);
    }
    store.Store(c.seq, c.position, at, c.count);
    at += c.count;
  }
}

// The rows of the last send as (seq, position) pairs.
std::vector<std::pair<uint32_t, uint32_t>> LastSent(const HostLink& link) {
  std::vector<std::pair<uint32_t, uint32_t>> rows;
  if (link.sent.empty()) return rows;
  const std::vector<uint8_t>& b = link.sent.back();
  for (size_t i = 0; i + kRowBytes <= b.size(); i += kRowBytes) {
    uint32_t v[2];
    std::memcpy(v, b.data() + i, kRowBytes);
    rows.emplace_back(v[0], v[1]);
  }
  return rows;
}

std::vector<std::pair<uint32_t, uint32_t>> Expect(uint32_t seq, uint32_t from, uint32_t n) {
  std::vector<std::pair<uint32_t, uint32_t>> rows;
  for (uint32_t p = from; p < from + n; ++p) rows.emplace_back(seq, p);
  return rows;
}

TEST(DeviceHiddenStoreTest, RequestsSendTheAskedPositionsInOrder) {
  HostLink link;
  DeviceHiddenStore store(link, kRowBytes, 1000);
  // Prefill chunks of sequence 1 over two passes, sequence 2 in one.
  Pass(store, {{1, 0, 5}, {2, 0, 3}});
  Pass(store, {{1, 5, 4}});
  int32_t first = -1, count = -1;
  ASSERT_TRUE(store.Run(1, &first, &count));
  EXPECT_EQ(first, 0);
  EXPECT_EQ(count, 9);
  // A request: sequence 2's rows 1-2, then sequence 1's rows 3-8 (its run spans two segments).
  store.Queue(2, 1, 2);
  store.Queue(1, 3, 6);
  absl::StatusOr<int64_t> sent = store.SendQueued();
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(*sent, 8);
  auto want = Expect(2, 1, 2);
  const auto rest = Expect(1, 3, 6);
  want.insert(want.end(), rest.begin(), rest.end());
  EXPECT_EQ(LastSent(link), want);
  store.Erase(1);
  store.Erase(2);
  EXPECT_EQ(store.live_rows(), 0);
  // Nothing queued: nothing sent.
  sent = store.SendQueued();
  ASSERT_TRUE(sent.ok());
  EXPECT_EQ(*sent, 0);
  EXPECT_EQ(link.sent.size(), 1u);
}

TEST(DeviceHiddenStoreTest, VerificationRowsReplaceRejectedOnesAndGapsStartOver) {
  HostLink link;
  DeviceHiddenStore store(link, kRowBytes, 1000);
  Pass(store, {{7, 0, 10}});
  // A verification chunk from position 8 (K 3): rows 8-11 replace 8-9.
  Pass(store, {{7, 8, 4}});
  int32_t first = 0, count = 0;
  ASSERT_TRUE(store.Run(7, &first, &count));
  EXPECT_EQ(count, 12);
  store.Queue(7, 6, 5);
  ASSERT_TRUE(store.SendQueued().ok());
  EXPECT_EQ(LastSent(link), Expect(7, 6, 5));
  // A chunk that does not continue the run (a gap) starts a new one.
  Pass(store, {{7, 20, 2}});
  ASSERT_TRUE(store.Run(7, &first, &count));
  EXPECT_EQ(first, 20);
  EXPECT_EQ(count, 2);
  // Truncating everything drops the run.
  store.Truncate(7, 0);
  EXPECT_FALSE(store.Run(7, &first, &count));
}

TEST(DeviceHiddenStoreTest, CompactionKeepsLiveRowsAndCapsKeepTheLatest) {
  HostLink link;
  DeviceHiddenStore store(link, kRowBytes, 40);
  // Sequence 3 stays live (a long prefill in chunks) while sequences 100+ come and go; the
  // arena fills and is compacted into the other buffer, growing as needed.
  int32_t position = 0;
  for (int round = 0; round < 30; ++round) {
    const uint64_t other = 100 + static_cast<uint64_t>(round);
    Pass(store, {{3, position, 7}, {other, 0, 50}});
    position += 7;
    store.Queue(other, 10, 30);
    ASSERT_TRUE(store.SendQueued().ok());
    EXPECT_EQ(LastSent(link), Expect(static_cast<uint32_t>(other), 10, 30)) << round;
    store.Erase(other);
  }
  EXPECT_GE(store.arena_rows(), 256);
  int32_t first = 0, count = 0;
  ASSERT_TRUE(store.Run(3, &first, &count));
  // Capped at 40 rows: the latest ones.
  EXPECT_EQ(count, 40);
  EXPECT_EQ(first, position - 40);
  store.Queue(3, first, count);
  ASSERT_TRUE(store.SendQueued().ok());
  EXPECT_EQ(LastSent(link), Expect(3, static_cast<uint32_t>(first), 40));
  // Every pass waited for the link's stream first.
  EXPECT_GE(link.syncs, 30);
}

}  // namespace
}  // namespace specd
