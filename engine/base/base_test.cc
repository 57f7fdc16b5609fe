#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>
#include <vector>

#include "engine/base/float16.h"
#include "engine/base/mapped_file.h"
#include "engine/base/subprocess.h"
#include "engine/base/thread_pool.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

TEST(Float16Test, Bf16RoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 3.140625f, 1e-20f, 65504.0f}) {
    float r = Bf16ToFloat(FloatToBf16(v));
    EXPECT_NEAR(r, v, std::fabs(v) * (1.0f / 128)) << v;
  }
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0xc000), -2.0f);
}

TEST(Float16Test, Fp16DecodesNormalSubnormalAndSpecial) {
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(Fp16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0x7e00)));
}

TEST(MappedFileTest, MapsContentsAndReportsMissingFile) {
  std::string path = ::testing::TempDir() + "/mapped.bin";
  std::ofstream(path) << "hello";
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->size(), 5u);
  EXPECT_EQ(f->bytes()[4], 'o');
  auto missing = MappedFile::Open(path + ".nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(SubprocessTest, SpawnsKillsAndReportsExitStatus) {
  absl::StatusOr<Subprocess> sleeper = Subprocess::Spawn({"/bin/sleep", "30"});
  ASSERT_TRUE(sleeper.ok()) << sleeper.status();
  EXPECT_GT(sleeper->pid(), 0);
  EXPECT_TRUE(sleeper->Running());
  sleeper->Signal(SIGSTOP);
  EXPECT_TRUE(sleeper->Running());  // stopped is not exited
  sleeper->Kill();
  EXPECT_FALSE(sleeper->Running());
  EXPECT_TRUE(WIFSIGNALED(sleeper->exit_status()));

  absl::StatusOr<Subprocess> failing = Subprocess::Spawn({"/bin/sh", "-c", "exit 3"});
  ASSERT_TRUE(failing.ok());
  for (int i = 0; i < 500 && failing->Running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(failing->Running());
  ASSERT_TRUE(WIFEXITED(failing->exit_status()));
  EXPECT_EQ(WEXITSTATUS(failing->exit_status()), 3);

  absl::StatusOr<Subprocess> missing = Subprocess::Spawn({"/nonexistent/specd"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/specd"), std::string::npos);
  absl::StatusOr<std::string> self = SelfExecutable();
  ASSERT_TRUE(self.ok());
  EXPECT_NE(self->find("base_test"), std::string::npos);
}

TEST(ThreadPoolTest, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 17, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
  }
}

}  // namespace
}  // namespace specd
