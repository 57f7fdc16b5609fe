#include <atomic>
#include <cmath>
#include <fstream>
#include <vector>

#include "engine/base/float16.h"
#include "engine/base/mapped_file.h"
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
