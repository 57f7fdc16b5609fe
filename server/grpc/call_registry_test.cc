#include "server/grpc/call_registry.h"

#include <gtest/gtest.h>

#include <set>

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

}  // namespace
}  // namespace specd
