// The NSA references (kernels/ref/nsa.h) on small hand-computed cases: kernels/ may not include
// engine/model's NsaAttention (tools/check_deps.py), so the cases are built so their answers are
// means and counts: equal keys give uniform softmaxes, zero queries too.
#include "kernels/ref/nsa.h"

#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

NsaShape Shape(int64_t q_heads, int64_t kv_heads, int64_t d, int64_t page, int64_t block,
               int64_t count, int64_t window) {
  return {q_heads, kv_heads, d,      page,
          block,   count,    window, 1.0 / std::sqrt(static_cast<double>(d))};
}

// A paged cache of one sequence over pages in reverse order (so the table matters).
struct Paged {
  NsaShape s;
  int64_t pages;
  std::vector<int32_t> table;
  std::vector<double> k, v;

  Paged(const NsaShape& shape, int64_t context) : s(shape) {
    pages = (context + s.page_size - 1) / s.page_size;
    table.resize(pages);
    for (int64_t i = 0; i < pages; ++i) table[i] = static_cast<int32_t>(pages - 1 - i);
    k.assign(pages * s.num_kv_heads * s.page_size * s.head_dim, 0.0);
    v = k;
  }
  int64_t Row(int64_t pos, int64_t head) const {
    return ((table[pos / s.page_size] * s.num_kv_heads + head) * s.page_size + pos % s.page_size) *
           s.head_dim;
  }
};

TEST(NsaRefTest, TopBlocksForcesFirstAndOwnAndBreaksTiesLow) {
  std::vector<double> scores = {0.0, 0.5, 0.7, 0.5, 0.5, 0.1, 0.0};  // own block 6
  // Forced 0, 5, 6 (score 2); then 2 (0.7); then 1 of the tied 1, 3, 4: block 1.
  EXPECT_EQ(NsaTopBlocks(scores.data(), 6, 2, 5), (std::vector<int32_t>{0, 1, 2, 5, 6}));
  std::vector<double> few = {0.1, 0.2, 0.3};
  EXPECT_EQ(NsaTopBlocks(few.data(), 2, 1, 4), (std::vector<int32_t>{0, 1, 2}));
}

TEST(NsaRefTest, CompressWritesMeansIntoThePageOfTheLastPosition) {
  for (int64_t page : {16, 64}) {  // B 32: two entries per page of 64, one per second page of 16
    const NsaShape s = Shape(2, 1, 8, page, 32, 2, 16);
    Paged kv(s, 128);
    for (int64_t j = 0; j < 128; ++j) {
      for (int64_t x = 0; x < 8; ++x) {
        kv.k[kv.Row(j, 0) + x] = static_cast<double>(j);
        kv.v[kv.Row(j, 0) + x] = static_cast<double>(x);
      }
    }
    const int64_t epp = NsaEntriesPerPage(s);
    std::vector<double> cmp_k(kv.pages * epp * 8, -1.0), cmp_v = cmp_k;
    const std::vector<int32_t> positions = {30, 31, 63, 95, 100}, seqs = {0, 0, 0, -1, 0};
    NsaCompress(kv.k.data(), kv.v.data(), kv.table.data(), kv.pages, positions.data(), seqs.data(),
                5, s, cmp_k.data(), cmp_v.data());
    // Blocks 0 and 1 (positions 31, 63) written; 95 is padding, 30 and 100 end no block.
    EXPECT_EQ(cmp_k[NsaEntryOffset(kv.table.data(), 0, 0, s)], 15.5);
    EXPECT_EQ(cmp_k[NsaEntryOffset(kv.table.data(), 1, 0, s) + 7], 47.5);
    EXPECT_EQ(cmp_v[NsaEntryOffset(kv.table.data(), 1, 0, s) + 3], 3.0);
    EXPECT_EQ(cmp_k[NsaEntryOffset(kv.table.data(), 2, 0, s)], -1.0);
    // Entry c lives in the page of position (c + 1) * 32 - 1.
    const int64_t page_of_63 = kv.table[63 / page];
    EXPECT_EQ(NsaEntryOffset(kv.table.data(), 1, 0, s) / (epp * 8), page_of_63);
  }
}

TEST(NsaRefTest, SelectWithEqualKeysAveragesValuesAndPicksLowBlocks) {
  const NsaShape s = Shape(4, 2, 8, 16, 16, 3, 16);  // group 2
  Paged kv(s, 160);
  const int64_t epp = NsaEntriesPerPage(s);
  std::vector<double> cmp_k(kv.pages * 2 * epp * 8, 0.25), cmp_v(cmp_k.size());
  for (int64_t c = 0; c < 10; ++c) {
    for (int64_t g = 0; g < 2; ++g) {
      for (int64_t x = 0; x < 8; ++x) {
        cmp_v[NsaEntryOffset(kv.table.data(), c, g, s) + x] = static_cast<double>(c + 10 * g);
      }
    }
  }
  std::vector<double> q(3 * 4 * 8, 1.0), o_cmp(3 * 4 * 8, -7.0), scores(3 * 2 * 10, -1.0);
  std::vector<int32_t> sel(3 * 2 * 3, 99);
  const std::vector<int32_t> positions = {8, 20, 150}, seqs = {0, 0, 0};
  NsaSelect(q.data(), 32, cmp_k.data(), cmp_v.data(), kv.table.data(), kv.pages, positions.data(),
            seqs.data(), 3, s, o_cmp.data(), 32, sel.data(), scores.data(), 10);
  // Position 8: no complete block (o_cmp zeros), own block 0 only.
  EXPECT_EQ(o_cmp[0], 0.0);
  EXPECT_EQ(sel[0], 0);
  EXPECT_EQ(sel[1], -1);
  // Position 20: block 0 visible (weight 1), own block 1; both forced.
  EXPECT_EQ(o_cmp[32 + 8], 0.0);       // head 1, kv head 0: value of entry 0
  EXPECT_EQ(o_cmp[32 + 3 * 8], 10.0);  // head 3, kv head 1
  EXPECT_EQ((std::vector<int32_t>(sel.begin() + 6, sel.begin() + 9)),
            (std::vector<int32_t>{0, 1, -1}));
  // Position 150: 9 visible blocks of weight 1/9 per head (score 2/9), own block 9; forced 0, 8,
  // 9 fill S = 3. o_cmp is the mean of entries 0 .. 8.
  EXPECT_NEAR(o_cmp[64 + 8], 4.0, 1e-12);
  EXPECT_NEAR(o_cmp[64 + 16], 14.0, 1e-12);
  EXPECT_EQ((std::vector<int32_t>(sel.begin() + 12, sel.begin() + 15)),
            (std::vector<int32_t>{0, 8, 9}));
  EXPECT_NEAR(scores[2 * 2 * 10 + 4], 2.0 / 9.0, 1e-12);
  EXPECT_EQ(scores[2 * 2 * 10 + 9], 2.0);
}

TEST(NsaRefTest, AttendAveragesSelectedAndWindowKeysAndGates) {
  const NsaShape s = Shape(2, 1, 8, 16, 16, 2, 8);
  Paged kv(s, 64);
  for (int64_t j = 0; j < 64; ++j) {
    for (int64_t x = 0; x < 8; ++x) kv.v[kv.Row(j, 0) + x] = static_cast<double>(j);
  }
  // Two tokens at 40 and 41 in one group; zero queries: uniform softmaxes.
  std::vector<double> q(2 * 16, 0.0), o_cmp(2 * 16, 3.0), gates(2 * 6, 0.0), out(2 * 16, -1.0);
  const std::vector<int32_t> positions = {40, 41}, seqs = {0, 0}, groups = {0, 2};
  const std::vector<int32_t> sel = {0, 2, 1, 2};  // token 0: blocks 0, 2; token 1: 1, 2
  auto mean = [](int64_t lo, int64_t hi) { return (lo + hi) / 2.0; };
  for (bool shared : {false, true}) {
    NsaAttend(q.data(), 16, kv.k.data(), kv.v.data(), kv.table.data(), kv.pages, positions.data(),
              seqs.data(), groups.data(), 1, sel.data(), shared, o_cmp.data(), 16, gates.data(), 6,
              s, out.data(), 16);
    // Token 0: selected keys 0..15 and 32..40 (25 keys, mean of their positions); window 33..40.
    const double slc0 = (mean(0, 15) * 16 + mean(32, 40) * 9) / 25.0;
    EXPECT_NEAR(out[5], 0.5 * (slc0 + 3.0 + mean(33, 40)), 1e-12);
    // Token 1: own blocks 1, 2 (16..31, 32..41) or, shared, token 0's blocks 0, 2 (0..15,
    // 32..41); window 34..41.
    const double slc1 = shared ? (mean(0, 15) * 16 + mean(32, 41) * 10) / 26.0 : mean(16, 41);
    EXPECT_NEAR(out[16 + 8 + 2], 0.5 * (slc1 + 3.0 + mean(34, 41)), 1e-12);
  }
}

}  // namespace
}  // namespace specd::kernels::ref
