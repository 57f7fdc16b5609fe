#include "server/api_key.h"

#include <gtest/gtest.h>

#include <string>

namespace specd {
namespace {

constexpr absl::string_view kKey = "s3cret";

absl::StatusCode Code(absl::string_view authorization) {
  return CheckBearerCredential(authorization, kKey).code();
}

std::string Message(absl::string_view authorization) {
  return std::string(CheckBearerCredential(authorization, kKey).message());
}

TEST(CheckBearerCredentialTest, AcceptsAnySchemeCaseAndBlankRuns) {
  for (const char* ok : {"Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR s3cret",
                         "Bearer  s3cret", "Bearer\ts3cret", "Bearer \t s3cret", "Bearer s3cret ",
                         "Bearer s3cret\t", " Bearer s3cret"}) {
    EXPECT_TRUE(CheckBearerCredential(ok, kKey).ok()) << "'" << ok << "'";
  }
}

TEST(CheckBearerCredentialTest, NonBearerCredentialsAreMissingKeys) {
  for (const char* bad :
       {"", " ", "Bearer", "Bearer ", "Bearer \t ", "Bearers3cret", "Basic s3cret", "s3cret",
        "Token s3cret", "Bearer\ns3cret", "Bearer\vs3cret"}) {
    EXPECT_EQ(Code(bad), absl::StatusCode::kUnauthenticated) << "'" << bad << "'";
    EXPECT_EQ(Message(bad), kMissingApiKeyMessage) << "'" << bad << "'";
  }
}

TEST(CheckBearerCredentialTest, WrongKeysAreIncorrect) {
  for (const char* bad : {"Bearer s3cre", "Bearer s3crett", "Bearer S3CRET", "Bearer s3 cret",
                          "Bearer s3cret x", "Bearer xs3cret"}) {
    EXPECT_EQ(Code(bad), absl::StatusCode::kUnauthenticated) << "'" << bad << "'";
    EXPECT_EQ(Message(bad), kIncorrectApiKeyMessage) << "'" << bad << "'";
  }
}

TEST(CheckBearerCredentialTest, KeysMayHoldAnyBytes) {
  const std::string key("k\0y\xff", 4);
  EXPECT_TRUE(CheckBearerCredential("Bearer " + key, key).ok());
  EXPECT_FALSE(CheckBearerCredential("Bearer k", key).ok());
}

}  // namespace
}  // namespace specd
