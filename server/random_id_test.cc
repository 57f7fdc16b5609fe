#include "server/random_id.h"

#include <set>

#include "gtest/gtest.h"

namespace specd {
namespace {

TEST(NewRandomIdTest, IsThePrefixAnd32HexDigits) {
  absl::StatusOr<std::string> id = NewRandomId("cmpl-");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(id->size(), 5u + 32u);
  EXPECT_EQ(id->substr(0, 5), "cmpl-");
  EXPECT_EQ(id->find_first_not_of("0123456789abcdef", 5), std::string::npos);
}

TEST(NewRandomIdTest, NeverRepeatsAndUsesEveryDigitPosition) {
  std::set<std::string> seen;
  std::string ored(32, '0');
  for (int i = 0; i < 2000; ++i) {
    const std::string id = *NewRandomId("");
    EXPECT_TRUE(seen.insert(id).second) << id;
    for (int d = 0; d < 32; ++d) ored[d] = std::max(ored[d], id[d]);
  }
  // With 2000 draws every hex position must have taken a non-zero digit.
  EXPECT_EQ(ored.find('0'), std::string::npos) << ored;
}

}  // namespace
}  // namespace specd
