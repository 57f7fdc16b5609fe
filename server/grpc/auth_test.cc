#include "server/grpc/auth.h"

#include <gtest/gtest.h>

namespace specd {
namespace {

TEST(BearerTokenMatchesTest, AcceptsTheKeyWithAnyCaseScheme) {
  EXPECT_TRUE(BearerTokenMatches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(BearerTokenMatches("bearer s3cret", "s3cret"));
  EXPECT_TRUE(BearerTokenMatches("BEARER s3cret", "s3cret"));
}

TEST(BearerTokenMatchesTest, RejectsWrongMissingOrMalformedCredentials) {
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3crett", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer ", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer  s3cret", "s3cret"));
}

}  // namespace
}  // namespace specd
