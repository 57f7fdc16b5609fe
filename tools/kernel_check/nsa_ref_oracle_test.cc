// kernels/ref/nsa.h (the NSA kernels' references, fp64) against engine/model's NsaAttention (the
// model family's fp32 CPU oracle) on the same cache: the references restate the oracle's rules
// because kernels/ may not include engine/ (tools/check_deps.py), and this test, which may include
// both, keeps the two from drifting apart. Per-query, SSV exact and SSV shared groups; NSA
// blocks smaller and larger than a page; the oracle's compressed entries kept in the cache or
// recomputed. CPU only.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "engine/base/thread_pool.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/nsa_attention.h"
#include "gtest/gtest.h"
#include "kernels/ref/nsa.h"

namespace specd {
namespace {

constexpr int kHeads = 4, kKvHeads = 2, kDim = 8, kCount = 6, kWindow = 20, kPages = 20;
constexpr int kLen = 230, kQueries = 10, kGroup = 4;

struct Case {
  int block, page;
  bool kept;  // the oracle's cache keeps compressed entries (a prefill pass wrote them)
  int mode;   // 0 no strategy, 1 exact groups of kGroup, 2 shared groups
};

class NsaRefOracleTest : public ::testing::TestWithParam<Case> {};

TEST_P(NsaRefOracleTest, ReferenceMatchesTheCpuOracle) {
  const Case c = GetParam();
  KvCacheSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = kKvHeads;
  spec.head_dim = kDim;
  spec.block_size = c.page;
  spec.num_blocks = kPages;
  spec.compressed_block_size = c.kept ? c.block : 0;
  std::unique_ptr<CpuKvCache> kv = CpuKvCache::Create(spec).value();
  std::mt19937 rng(7 + c.mode + 10 * c.block);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int pages = (kLen + c.page - 1) / c.page;
  std::vector<int32_t> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = (i * 7 + 3) % kPages;
  // The reference's HND cache holds the same values: [kPages, kv_heads, page, head_dim].
  std::vector<double> k(kPages * kKvHeads * c.page * kDim, 0.0), v = k;
  for (int j = 0; j < kLen; ++j) {
    for (int g = 0; g < kKvHeads; ++g) {
      for (int d = 0; d < kDim; ++d) {
        // A per-block offset so the compressed scores, and the selections, differ.
        const float key = u(rng) + (j / c.block % 3) * 0.5f * (d % 2 ? 1.0f : -1.0f);
        const float value = u(rng);
        kv->KeySlot(0, table[j / c.page], j % c.page)[g * kDim + d] = key;
        kv->ValueSlot(0, table[j / c.page], j % c.page)[g * kDim + d] = value;
        const int64_t row = ((table[j / c.page] * kKvHeads + g) * c.page + j % c.page) * kDim + d;
        k[row] = key;
        v[row] = value;
      }
    }
  }
  std::vector<int32_t> positions, seqs;
  for (int i = 0; i < kQueries; ++i) positions.push_back(kLen - kQueries + i), seqs.push_back(0);
  std::vector<float> q(kQueries * kHeads * kDim), gates(kQueries * 3 * kHeads);
  for (float& x : q) x = 2 * u(rng);
  for (float& x : gates) x = 2 * u(rng);

  // The oracle: with kept entries, a pass over the earlier positions writes them first.
  const std::vector<std::span<const int32_t>> tables = {table};
  ThreadPool pool(1);
  NsaAttention attention(NsaShape{kHeads, kKvHeads, kDim, {c.block, kCount, kWindow}}, 1);
  if (c.kept) {
    std::vector<int32_t> all, all_seqs;
    for (int j = 0; j < kLen - kQueries; ++j) all.push_back(j), all_seqs.push_back(0);
    std::vector<float> pq(all.size() * kHeads * kDim, 0.1f), pg(all.size() * 3 * kHeads, 0.0f);
    std::vector<float> po(pq.size());
    attention.Run(pool, TokenLayout{all, all_seqs, tables}, pq.data(), kHeads * kDim, pg.data(),
                  3 * kHeads, *kv, 0, po.data());
  }
  SsvStrategy strategy;
  strategy.group_size = kGroup;
  strategy.mode = c.mode == 2 ? SsvMode::kShared : SsvMode::kExact;
  const SsvStrategy* strategies[1] = {&strategy};
  std::vector<float> out(kQueries * kHeads * kDim);
  attention.Run(pool, TokenLayout{positions, seqs, tables}, q.data(), kHeads * kDim, gates.data(),
                3 * kHeads, *kv, 0, out.data(),
                c.mode == 0 ? std::span<const SsvStrategy* const>()
                            : std::span<const SsvStrategy* const>(strategies));

  // The references: compress every complete block, select, attend in the same groups.
  const kernels::ref::NsaShape rs{kHeads,  kKvHeads, kDim,    c.page,
                                  c.block, kCount,   kWindow, 1.0 / std::sqrt(kDim)};
  const int64_t epp = kernels::ref::NsaEntriesPerPage(rs);
  std::vector<double> cmp_k(kPages * kKvHeads * epp * kDim, 0.0), cmp_v = cmp_k;
  std::vector<int32_t> ends, end_seqs;
  for (int e = c.block - 1; e < kLen; e += c.block) ends.push_back(e), end_seqs.push_back(0);
  kernels::ref::NsaCompress(k.data(), v.data(), table.data(), pages, ends.data(), end_seqs.data(),
                            static_cast<int64_t>(ends.size()), rs, cmp_k.data(), cmp_v.data());
  const std::vector<double> q64(q.begin(), q.end()), gates64(gates.begin(), gates.end());
  std::vector<double> o_cmp(q.size()), ref_out(q.size());
  std::vector<int32_t> selections(kQueries * kKvHeads * kCount);
  kernels::ref::NsaSelect(q64.data(), kHeads * kDim, cmp_k.data(), cmp_v.data(), table.data(),
                          pages, positions.data(), seqs.data(), kQueries, rs, o_cmp.data(),
                          kHeads * kDim, selections.data(), static_cast<double*>(nullptr), 0);
  const int group = c.mode == 0 ? 1 : kGroup;
  std::vector<int32_t> groups;
  for (int g0 = 0; g0 < kQueries; g0 += group) {
    groups.insert(groups.end(), {g0, std::min(group, kQueries - g0)});
  }
  kernels::ref::NsaAttend(q64.data(), kHeads * kDim, k.data(), v.data(), table.data(), pages,
                          positions.data(), seqs.data(), groups.data(),
                          static_cast<int64_t>(groups.size() / 2), selections.data(), c.mode == 2,
                          o_cmp.data(), kHeads * kDim, gates64.data(), 3 * kHeads, rs,
                          ref_out.data(), kHeads * kDim);

  double error = 0, scale = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    error = std::max(error, std::abs(ref_out[i] - out[i]));
    scale = std::max(scale, std::abs(ref_out[i]));
  }
  EXPECT_LE(error, 1e-5 * scale + 1e-6) << "scale " << scale;
  for (int g = 0; g < kKvHeads; ++g) {
    const std::span<const int32_t> oracle = attention.LastTokenSelection(0, g);
    const int32_t* ref = &selections[((kQueries - 1) * kKvHeads + g) * kCount];
    EXPECT_EQ(std::vector<int32_t>(oracle.begin(), oracle.end()),
              std::vector<int32_t>(ref, ref + oracle.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, NsaRefOracleTest,
                         ::testing::Values(Case{16, 32, false, 0}, Case{16, 32, true, 1},
                                           Case{16, 32, true, 2}, Case{32, 16, false, 1},
                                           Case{32, 16, true, 0}, Case{32, 16, true, 2}));

}  // namespace
}  // namespace specd
