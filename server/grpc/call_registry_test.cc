#include "server/grpc/call_registry.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"

namespace specd {
namespace {

TEST(NewRequestIdTest, IsPrefixedHexOf128RandomBits) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> id = NewRequestId();
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(absl::StartsWith(*id, "grpc-")) << *id;
    ASSERT_EQ(id->size(), 5u + 32u) << *id;
    EXPECT_EQ(id->find_first_not_of("0123456789abcdef", 5), std::string::npos) << *id;
    seen.insert(*id);
  }
  EXPECT_EQ(seen.size(), 1000u);
  // Not a counter: consecutive ids differ in many of their 32 digits.
  const std::string a = *NewRequestId();
  const std::string b = *NewRequestId();
  int differing = 0;
  for (size_t i = 5; i < a.size(); ++i) differing += a[i] != b[i];
  EXPECT_GT(differing, 8);
}

TEST(CallRegistryTest, IdsAreScopedToTheirCaller) {
  CallRegistry<int> registry;
  auto mine = std::make_shared<int>(1);
  auto theirs = std::make_shared<int>(2);
  ASSERT_TRUE(registry.Add("peer-a", "job", mine));
  // The same id from another caller is another call, not a conflict.
  ASSERT_TRUE(registry.Add("peer-b", "job", theirs));
  EXPECT_EQ(registry.Find("peer-a", "job"), mine);
  EXPECT_EQ(registry.Find("peer-b", "job"), theirs);
  EXPECT_EQ(registry.Find("peer-c", "job"), nullptr);
  // Key parts cannot be shifted into each other.
  EXPECT_EQ(registry.Find("peer-", "ajob"), nullptr);
  EXPECT_EQ(registry.All().size(), 2u);
}

TEST(CallRegistryTest, ADuplicateLiveIdOfTheSameCallerIsRefused) {
  CallRegistry<int> registry;
  auto first = std::make_shared<int>(1);
  auto second = std::make_shared<int>(2);
  ASSERT_TRUE(registry.Add("peer-a", "job", first));
  EXPECT_FALSE(registry.Add("peer-a", "job", second));
  // Removing with the wrong call keeps the id; with the right one frees it.
  registry.Remove("peer-a", "job", second.get());
  EXPECT_EQ(registry.Find("peer-a", "job"), first);
  registry.Remove("peer-a", "job", first.get());
  EXPECT_EQ(registry.Find("peer-a", "job"), nullptr);
  EXPECT_TRUE(registry.Add("peer-a", "job", second));
}

TEST(CallRegistryTest, AnEndedCallFreesItsIdAtOnce) {
  CallRegistry<int> registry;
  auto first = std::make_shared<int>(1);
  ASSERT_TRUE(registry.Add("peer-a", "job", first));
  first.reset();
  EXPECT_EQ(registry.Find("peer-a", "job"), nullptr);
  EXPECT_TRUE(registry.All().empty());
  EXPECT_TRUE(registry.Add("peer-a", "job", std::make_shared<int>(3)));
}

// Callers on their own threads (as gRPC's callback threads are) add, find, abort-scan and
// remove calls at once; each sees exactly its own calls, and nothing is left at the end. Run
// under TSan by the sanitizer stage.
TEST(CallRegistryTest, ConcurrentCallersSeeOnlyTheirOwnCalls) {
  CallRegistry<int> registry;
  constexpr int kCallers = 8, kCalls = 200;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kCallers, 0);
  for (int t = 0; t < kCallers; ++t) {
    threads.emplace_back([&registry, &wrong, t] {
      const std::string caller = "peer-" + std::to_string(t);
      for (int i = 0; i < kCalls; ++i) {
        const std::string id = "job-" + std::to_string(i % 16);
        auto call = std::make_shared<int>(t * kCalls + i);
        if (!registry.Add(caller, id, call)) ++wrong[t];
        const std::shared_ptr<int> found = registry.Find(caller, id);
        if (found != call) ++wrong[t];
        for (const std::shared_ptr<int>& c : registry.All()) {
          if (c == nullptr) ++wrong[t];
        }
        registry.Remove(caller, id, call.get());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kCallers; ++t) EXPECT_EQ(wrong[t], 0) << "caller " << t;
  EXPECT_TRUE(registry.All().empty());
}

}  // namespace
}  // namespace specd
