// CopyRows (kernels/cuda/embedding.h) against its reference (kernels/ref/embedding.h): scattered
// row copies of a bf16 table, chains in list order (a copy reads an earlier one's write), a
// full list, and the arguments it refuses. Part of kernels_cuda_test.
#include <cuda_runtime.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/ref/embedding.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;

constexpr int64_t kRows = 160;
constexpr int64_t kRowElems = 4096;  // an 8B target's EAGLE-3 head: hidden 4096 bf16

// Runs `copies` on the device and the reference over the same random table; both tables.
void ExpectMatchesReference(const RowCopies& copies) {
  std::vector<uint16_t> host(kRows * kRowElems);
  std::mt19937 rng(7);
  for (uint16_t& x : host) x = static_cast<uint16_t>(rng());
  DeviceBuffer table(host.size() * 2);
  table.Upload(host);
  ASSERT_EQ(CopyRows(copies, table.as<__nv_bfloat16>(), kRowElems, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ref::CopyRows(copies.src, copies.dst, copies.count, host.data(), kRowElems);
  EXPECT_EQ(table.Download<uint16_t>(), host);
}

TEST(CopyRowsCudaTest, ScatteredRowsMatchTheReference) {
  RowCopies c;
  c.count = 24;  // a cache wave's pass: 24 branches' rows into their rings
  for (int32_t i = 0; i < c.count; ++i) {
    c.src[i] = 128 + (i * 5) % 24;  // the pass's output rows
    c.dst[i] = 3 * i;
  }
  ExpectMatchesReference(c);
}

TEST(CopyRowsCudaTest, ChainsRunInListOrder) {
  RowCopies c;
  c.count = kMaxRowCopies;
  for (int32_t i = 0; i < c.count; ++i) {  // row i + 1 <- row i: row 0 spreads down the chain
    c.src[i] = i;
    c.dst[i] = i + 1;
  }
  c.src[10] = c.dst[10] = 5;  // a row onto itself
  ExpectMatchesReference(c);
}

TEST(CopyRowsCudaTest, RefusesWhatItCannotRun) {
  DeviceBuffer table(kRows * kRowElems * 2);
  auto* t = table.as<__nv_bfloat16>();
  RowCopies c;
  c.count = 1;
  c.src[0] = 0;
  c.dst[0] = 1;
  EXPECT_EQ(CopyRows(c, t, 12, nullptr), cudaErrorInvalidValue) << "not 16-byte columns";
  EXPECT_EQ(CopyRows(c, nullptr, kRowElems, nullptr), cudaErrorInvalidValue);
  auto* misaligned = reinterpret_cast<__nv_bfloat16*>(table.as<uint16_t>() + 1);
  EXPECT_EQ(CopyRows(c, misaligned, kRowElems, nullptr), cudaErrorInvalidValue) << "misaligned";
  c.src[0] = -1;
  EXPECT_EQ(CopyRows(c, t, kRowElems, nullptr), cudaErrorInvalidValue);
  c.count = kMaxRowCopies + 1;
  EXPECT_EQ(CopyRows(c, t, kRowElems, nullptr), cudaErrorInvalidValue);
  c.count = 0;
  EXPECT_EQ(CopyRows(c, t, kRowElems, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels
