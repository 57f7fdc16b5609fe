#include "kernels/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> RandomValues(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> values(n);
  for (double& v : values) v = dist(rng);
  return values;
}

// Sequences with their contiguous K/V and the same K/V scattered over a paged cache through
// random block tables. Every slot no token was written to holds NaN, so a read of a wrong slot
// turns the output into NaN.
struct PagedSequences {
  AttentionShape shape;
  std::vector<int32_t> seq_lens;
  std::vector<std::vector<double>> keys, values;  // per sequence: [seq_len, num_kv_heads, d]
  int64_t max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  std::vector<double> k_cache, v_cache;

  PagedSequences(const AttentionShape& s, std::vector<int32_t> lens, std::mt19937_64& rng)
      : shape(s), seq_lens(std::move(lens)) {
    const int64_t row = s.num_kv_heads * s.head_dim;
    int64_t num_used = 0;
    for (int32_t len : seq_lens) {
      max_blocks_per_seq =
          std::max<int64_t>(max_blocks_per_seq, (len + s.block_size - 1) / s.block_size);
      num_used += (len + s.block_size - 1) / s.block_size;
    }
    const int64_t num_blocks = num_used + 3;  // spare blocks nobody owns
    std::vector<int32_t> free_blocks(num_blocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    block_tables.assign(seq_lens.size() * max_blocks_per_seq, -1);
    k_cache.assign(num_blocks * row * s.block_size, kNaN);
    v_cache = k_cache;
    size_t next_free = 0;
    for (size_t i = 0; i < seq_lens.size(); ++i) {
      const int32_t len = seq_lens[i];
      keys.push_back(RandomValues(len * row, rng));
      values.push_back(RandomValues(len * row, rng));
      std::vector<int64_t> slots(len);
      for (int32_t pos = 0; pos < len; ++pos) {
        int32_t& block = block_tables[i * max_blocks_per_seq + pos / s.block_size];
        if (pos % s.block_size == 0) block = free_blocks[next_free++];
        slots[pos] = static_cast<int64_t>(block) * s.block_size + pos % s.block_size;
      }
      WriteKvCache(keys[i].data(), row, values[i].data(), row, slots.data(), len, shape,
                   k_cache.data(), v_cache.data());
    }
  }
};

// Dense attention of one sequence's q_len last positions on contiguous K/V with an explicit
// mask, written independently of the paged reference: a full score matrix where key j enters
// query i's softmax iff visible(i, j).
//   q  [q_len, num_q_heads, d];  k, v  [seq_len, num_kv_heads, d];  returns [q_len, num_q_heads, d]
std::vector<double> DenseMaskedAttention(const std::vector<double>& q, const std::vector<double>& k,
                                         const std::vector<double>& v, int64_t q_len,
                                         int64_t seq_len, const AttentionShape& s,
                                         const std::function<bool(int64_t, int64_t)>& visible) {
  const int64_t d = s.head_dim, hq = s.num_q_heads, hkv = s.num_kv_heads;
  std::vector<double> out(q_len * hq * d, 0.0);
  for (int64_t i = 0; i < q_len; ++i) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = h / (hq / hkv);
      std::vector<double> scores(seq_len, -std::numeric_limits<double>::infinity());
      for (int64_t j = 0; j < seq_len; ++j) {
        if (!visible(i, j)) continue;
        double dot = 0;
        for (int64_t x = 0; x < d; ++x) dot += q[(i * hq + h) * d + x] * k[(j * hkv + kvh) * d + x];
        scores[j] = dot * s.scale;
      }
      const double max_score = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double& sc : scores) sum += (sc = std::exp(sc - max_score));
      for (int64_t j = 0; j < seq_len; ++j) {
        for (int64_t x = 0; x < d; ++x) {
          out[(i * hq + h) * d + x] += scores[j] / sum * v[(j * hkv + kvh) * d + x];
        }
      }
    }
  }
  return out;
}

// The causal (and sliding-window) mask: query i at position seq_len - q_len + i.
std::vector<double> DenseCausalAttention(const std::vector<double>& q, const std::vector<double>& k,
                                         const std::vector<double>& v, int64_t q_len,
                                         int64_t seq_len, const AttentionShape& s) {
  return DenseMaskedAttention(q, k, v, q_len, seq_len, s, [&](int64_t i, int64_t j) {
    const int64_t pos = seq_len - q_len + i;
    return j <= pos && (s.sliding_window == 0 || pos - j < s.sliding_window);
  });
}

// Runs the paged prefill reference over all sequences with the given query counts and checks
// every output against the dense attention.
void ExpectPrefillMatchesDense(const AttentionShape& shape, const std::vector<int32_t>& seq_lens,
                               const std::vector<int32_t>& q_lens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  PagedSequences seqs(shape, seq_lens, rng);
  std::vector<int32_t> cu_q_lens = {0};
  for (int32_t n : q_lens) cu_q_lens.push_back(cu_q_lens.back() + n);
  const int64_t num_tokens = cu_q_lens.back(), row = shape.num_q_heads * shape.head_dim;
  // Strided rows (as views into a fused qkv output) to exercise q_stride and out_stride.
  const int64_t q_stride = row + 8, out_stride = row + 4;
  const std::vector<double> q = RandomValues(num_tokens * q_stride, rng);
  std::vector<double> out(num_tokens * out_stride, kNaN);
  PagedPrefillAttention(q.data(), q_stride, seqs.k_cache.data(), seqs.v_cache.data(),
                        seqs.block_tables.data(), seqs.max_blocks_per_seq, cu_q_lens.data(),
                        seq_lens.data(), static_cast<int64_t>(seq_lens.size()), shape, out.data(),
                        out_stride);
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    std::vector<double> seq_q;
    for (int32_t t = cu_q_lens[s]; t < cu_q_lens[s + 1]; ++t) {
      seq_q.insert(seq_q.end(), q.begin() + t * q_stride, q.begin() + t * q_stride + row);
    }
    const auto dense =
        DenseCausalAttention(seq_q, seqs.keys[s], seqs.values[s], q_lens[s], seq_lens[s], shape);
    for (int32_t i = 0; i < q_lens[s]; ++i) {
      for (int64_t x = 0; x < row; ++x) {
        ASSERT_NEAR(out[(cu_q_lens[s] + i) * out_stride + x], dense[i * row + x], 1e-12)
            << "seq " << s << " query " << i << " element " << x;
      }
    }
  }
}

AttentionShape Shape(int64_t hq, int64_t hkv, int64_t d, int64_t block_size, int64_t window) {
  return {hq, hkv, d, block_size, 1.3 / std::sqrt(static_cast<double>(d)), window};
}

// Slots 3 (block 1, row 1), -1 (skipped) and 0 (block 0, row 0) with 2 kv heads of 2 values:
// head h of a block is the block_size x head_dim tile at (block * heads + h) * block_size rows.
TEST(WriteKvCacheRefTest, PlacesRowsInHndTilesAndSkipsNegativeSlots) {
  const AttentionShape shape = Shape(2, 2, 2, 2, 0);
  const std::vector<double> key = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<double> value = {-1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -12};
  const std::vector<int64_t> slots = {3, -1, 0};
  std::vector<double> k_cache(16, 0), v_cache(16, 0);
  WriteKvCache(key.data(), 4, value.data(), 4, slots.data(), 3, shape, k_cache.data(),
               v_cache.data());
  //                                  block 0: head 0 rows 0,1 | head 1 | block 1: head 0 | head 1
  EXPECT_EQ(k_cache, (std::vector<double>{9, 10, 0, 0, 11, 12, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4}));
  EXPECT_EQ(v_cache,
            (std::vector<double>{-9, -10, 0, 0, -11, -12, 0, 0, 0, 0, -1, -2, 0, 0, -3, -4}));
}

// q is orthogonal to both keys: equal scores, so the output is the mean of the two values.
TEST(PagedDecodeRefTest, EqualScoresAverageTheValues) {
  const AttentionShape shape = Shape(1, 1, 2, 16, 0);
  std::vector<double> k_cache(32, kNaN), v_cache(32, kNaN);
  k_cache[0] = 1, k_cache[1] = 0, k_cache[2] = -1, k_cache[3] = 0;
  v_cache[0] = 2, v_cache[1] = 4, v_cache[2] = 6, v_cache[3] = -8;
  const std::vector<double> q = {0, 5};
  const std::vector<int32_t> block_table = {0}, seq_len = {2};
  std::vector<double> out(2);
  PagedDecodeAttention(q.data(), 2, k_cache.data(), v_cache.data(), block_table.data(), 1,
                       seq_len.data(), 1, shape, out.data(), 2);
  EXPECT_NEAR(out[0], 4.0, 1e-15);
  EXPECT_NEAR(out[1], -2.0, 1e-15);
}

TEST(PagedPrefillRefTest, WholePromptsMatchDenseCausalAttention) {
  ExpectPrefillMatchesDense(Shape(2, 2, 8, 4, 0), {13, 1, 8}, {13, 1, 8}, 1);
}

// Chunked prefill and verification: each chunk's queries follow a cached context and see it.
TEST(PagedPrefillRefTest, ChunksAfterCachedContextMatchDenseCausalAttention) {
  ExpectPrefillMatchesDense(Shape(2, 2, 8, 4, 0), {21, 9, 30, 5}, {6, 9, 1, 3}, 2);
}

// Query head h reads kv head h / group (not h % num_kv_heads): checked against MHA with every
// kv head repeated `group` times.
TEST(PagedPrefillRefTest, GroupedQueryHeadsShareTheirKvHead) {
  ExpectPrefillMatchesDense(Shape(8, 2, 8, 4, 0), {17, 11}, {5, 11}, 3);

  std::mt19937_64 rng(4);
  const AttentionShape gqa = Shape(6, 2, 4, 4, 0), mha = Shape(6, 6, 4, 4, 0);
  const std::vector<int32_t> seq_lens = {10}, cu_q_lens = {0, 4};
  PagedSequences seqs(gqa, seq_lens, rng);
  std::vector<double> k_mha, v_mha;  // [10, 6, 4]: kv head h / 3 in head h
  for (int32_t pos = 0; pos < 10; ++pos) {
    for (int h = 0; h < 6; ++h) {
      const auto k = seqs.keys[0].begin() + (pos * 2 + h / 3) * 4;
      const auto v = seqs.values[0].begin() + (pos * 2 + h / 3) * 4;
      k_mha.insert(k_mha.end(), k, k + 4);
      v_mha.insert(v_mha.end(), v, v + 4);
    }
  }
  const std::vector<double> q = RandomValues(4 * 24, rng);
  std::vector<double> out(4 * 24);
  PagedPrefillAttention(q.data(), 24, seqs.k_cache.data(), seqs.v_cache.data(),
                        seqs.block_tables.data(), seqs.max_blocks_per_seq, cu_q_lens.data(),
                        seq_lens.data(), 1, gqa, out.data(), 24);
  const auto expected = DenseCausalAttention(q, k_mha, v_mha, 4, 10, mha);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expected[i], 1e-12) << i;
}

// The tiny test models' shapes: 4 query / 2 kv heads, head_dim 16 and 32, block 16.
TEST(PagedPrefillRefTest, TinyModelShapesMatchDenseCausalAttention) {
  ExpectPrefillMatchesDense(Shape(4, 2, 16, 16, 0), {40, 17, 3}, {40, 5, 3}, 10);
  ExpectPrefillMatchesDense(Shape(4, 2, 32, 16, 0), {35, 20}, {9, 20}, 11);
  ExpectPrefillMatchesDense(Shape(4, 2, 16, 16, 7), {30}, {12}, 12);
}

TEST(PagedPrefillRefTest, SlidingWindowMatchesDenseAttentionWithTheWindowMask) {
  ExpectPrefillMatchesDense(Shape(4, 2, 8, 4, 5), {23, 7, 12}, {23, 2, 9}, 5);
  ExpectPrefillMatchesDense(Shape(4, 1, 8, 8, 1), {9}, {9}, 6);
}

// A window of 1 leaves each query only its own key: the output is its own value row.
TEST(PagedPrefillRefTest, WindowOfOneReturnsTheQuerysOwnValue) {
  std::mt19937_64 rng(7);
  const AttentionShape shape = Shape(2, 1, 4, 4, 1);
  const std::vector<int32_t> seq_lens = {6}, cu_q_lens = {0, 3};
  PagedSequences seqs(shape, seq_lens, rng);
  const std::vector<double> q = RandomValues(3 * 8, rng);
  std::vector<double> out(3 * 8);
  PagedPrefillAttention(q.data(), 8, seqs.k_cache.data(), seqs.v_cache.data(),
                        seqs.block_tables.data(), seqs.max_blocks_per_seq, cu_q_lens.data(),
                        seq_lens.data(), 1, shape, out.data(), 8);
  for (int i = 0; i < 3; ++i) {
    for (int h = 0; h < 2; ++h) {
      for (int x = 0; x < 4; ++x) {
        EXPECT_DOUBLE_EQ(out[(i * 2 + h) * 4 + x], seqs.values[0][(3 + i) * 4 + x]);
      }
    }
  }
}

// Decode is the q_len = 1 case of prefill: compared with the last query of whole-prompt prefill
// and with dense attention, with and without a window, over several block sizes and head_dims
// (16: the tiny test models').
TEST(PagedDecodeRefTest, MatchesLastPrefillQueryAndDenseAttention) {
  for (const int64_t head_dim : {8, 16}) {
    for (const int64_t window : {0, 6}) {
      for (const int64_t block_size : {1, 4, 16}) {
        std::mt19937_64 rng(8 + block_size);
        const AttentionShape shape = Shape(4, 2, head_dim, block_size, window);
        const std::vector<int32_t> seq_lens = {19, 1, 33};
        PagedSequences seqs(shape, seq_lens, rng);
        const int64_t row = 4 * head_dim;
        const std::vector<double> q = RandomValues(3 * row, rng);
        std::vector<double> decode_out(3 * row, kNaN);
        PagedDecodeAttention(q.data(), row, seqs.k_cache.data(), seqs.v_cache.data(),
                             seqs.block_tables.data(), seqs.max_blocks_per_seq, seq_lens.data(), 3,
                             shape, decode_out.data(), row);
        const std::vector<int32_t> cu_q_lens = {0, 1, 2, 3};
        std::vector<double> prefill_out(3 * row, kNaN);
        PagedPrefillAttention(q.data(), row, seqs.k_cache.data(), seqs.v_cache.data(),
                              seqs.block_tables.data(), seqs.max_blocks_per_seq, cu_q_lens.data(),
                              seq_lens.data(), 3, shape, prefill_out.data(), row);
        EXPECT_EQ(decode_out, prefill_out);
        for (int s = 0; s < 3; ++s) {
          const std::vector<double> seq_q(q.begin() + s * row, q.begin() + (s + 1) * row);
          const auto dense =
              DenseCausalAttention(seq_q, seqs.keys[s], seqs.values[s], 1, seq_lens[s], shape);
          for (int64_t x = 0; x < row; ++x) {
            ASSERT_NEAR(decode_out[s * row + x], dense[x], 1e-12)
                << "head_dim " << head_dim << " window " << window << " block " << block_size
                << " seq " << s;
          }
        }
      }
    }
  }
}

// kBf16 perturbs each probability by at most 2^-8 relative (half a bf16 ulp), so the output moves
// by at most 2^-8 * max|v| = 2^-8 (the normaliser is unrounded), and it does move.
TEST(PagedDecodeRefTest, Bf16ProbabilitiesStayWithinTheirRoundingOfExact) {
  std::mt19937_64 rng(9);
  const AttentionShape shape = Shape(4, 2, 16, 16, 0);
  const std::vector<int32_t> seq_lens = {100};
  PagedSequences seqs(shape, seq_lens, rng);
  std::vector<float> k_cache(seqs.k_cache.begin(), seqs.k_cache.end());
  std::vector<float> v_cache(seqs.v_cache.begin(), seqs.v_cache.end());
  const auto q64 = RandomValues(64, rng);
  const std::vector<float> q(q64.begin(), q64.end());
  std::vector<float> exact(64), rounded(64);
  for (auto [rounding, out] :
       {std::pair{ProbRounding::kExact, &exact}, std::pair{ProbRounding::kBf16, &rounded}}) {
    PagedDecodeAttention(q.data(), 64, k_cache.data(), v_cache.data(), seqs.block_tables.data(),
                         seqs.max_blocks_per_seq, seq_lens.data(), 1, shape, out->data(), 64,
                         rounding);
  }
  double max_diff = 0;
  for (int i = 0; i < 64; ++i)
    max_diff = std::max<double>(max_diff, std::abs(exact[i] - rounded[i]));
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LE(max_diff, std::ldexp(1.0, -8) + 1e-5);
}

// ---------------------------------------------------------------------------------------------
// Token-tree masks.

// Random parents in topological order (parents[i] in [-1, i)): mostly the previous few nodes,
// sometimes a new root.
std::vector<int32_t> RandomParents(int32_t n, std::mt19937_64& rng) {
  std::vector<int32_t> parents(n, -1);
  for (int32_t i = 1; i < n; ++i) {
    std::uniform_int_distribution<int32_t> pick(std::max(-1, i - 5), i - 1);
    parents[i] = pick(rng);
  }
  return parents;
}

bool IsAncestorOrSelf(const std::vector<int32_t>& parents, int32_t a, int32_t node) {
  for (; node >= 0; node = parents[node]) {
    if (node == a) return true;
  }
  return false;
}

// One sequence of a tree test: `prefix` committed slots, then a tree of `parents.size()` nodes
// (none: causal queries), of which the last q_len slots are the queries.
struct TreeSeq {
  int32_t prefix;
  std::vector<int32_t> parents;
  int32_t q_len;
  int32_t seq_len() const {
    return prefix + (parents.empty() ? q_len : static_cast<int32_t>(parents.size()));
  }
};

// The tree mask of `seqs` with mask_words words per row: each tree query's row sets its
// ancestors and itself, plus random bits after its own slot (the causal rule must drop them);
// rows of sequences without a tree are random (never read), their start INT32_MAX or seq_len.
struct TreeMasks {
  std::vector<int32_t> tree_starts;
  std::vector<uint64_t> masks;
  int64_t mask_words;

  TreeMasks(const std::vector<TreeSeq>& seqs, int64_t words, std::mt19937_64& rng)
      : mask_words(words) {
    std::uniform_int_distribution<uint64_t> bits;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const TreeSeq& seq = seqs[s];
      const bool tree = !seq.parents.empty();
      tree_starts.push_back(tree         ? seq.prefix
                            : s % 2 == 0 ? std::numeric_limits<int32_t>::max()
                                         : seq.seq_len());
      for (int32_t i = 0; i < seq.q_len; ++i) {
        std::vector<uint64_t> row(words);
        for (uint64_t& w : row) w = bits(rng);
        if (tree) {
          const int32_t node = static_cast<int32_t>(seq.parents.size()) - seq.q_len + i;
          for (int32_t b = 0; b <= node; ++b) {
            const uint64_t bit = uint64_t{1} << (b % 64);
            row[b / 64] =
                IsAncestorOrSelf(seq.parents, b, node) ? row[b / 64] | bit : row[b / 64] & ~bit;
          }
        }
        masks.insert(masks.end(), row.begin(), row.end());
      }
    }
  }
  AttentionTreeMask View() const { return {tree_starts.data(), masks.data(), mask_words}; }
};

// Paged reference over `seqs` with their tree mask, and without one; outputs [tokens, hq, d].
struct TreeRun {
  std::vector<int32_t> seq_lens, cu_q_lens = {0};
  std::vector<double> q, tree_out, causal_out;
};
TreeRun RunTreeReference(const AttentionShape& shape, const std::vector<TreeSeq>& seqs,
                         const PagedSequences& paged, const TreeMasks& masks,
                         std::mt19937_64& rng) {
  TreeRun run;
  for (const TreeSeq& seq : seqs) {
    run.seq_lens.push_back(seq.seq_len());
    run.cu_q_lens.push_back(run.cu_q_lens.back() + seq.q_len);
  }
  const int64_t row = shape.num_q_heads * shape.head_dim, tokens = run.cu_q_lens.back();
  run.q = RandomValues(tokens * row, rng);
  run.tree_out.assign(tokens * row, kNaN);
  run.causal_out.assign(tokens * row, kNaN);
  const AttentionTreeMask view = masks.View();
  for (auto [tree, out] :
       {std::pair{&view, &run.tree_out},
        std::pair{static_cast<const AttentionTreeMask*>(nullptr), &run.causal_out}}) {
    PagedPrefillAttention(run.q.data(), row, paged.k_cache.data(), paged.v_cache.data(),
                          paged.block_tables.data(), paged.max_blocks_per_seq, run.cu_q_lens.data(),
                          run.seq_lens.data(), static_cast<int64_t>(seqs.size()), shape,
                          out->data(), row, ProbRounding::kExact, tree);
  }
  return run;
}

// STYLE.md: a tree kernel checked against the dense one with the equivalent mask written out.
// The written-out mask comes from the parents (ancestor walks), not from the mask bits.
TEST(PagedPrefillRefTest, TreeMaskEqualsDenseAttentionWithTheMaskWrittenOut) {
  std::mt19937_64 rng(20);
  const AttentionShape shape = Shape(4, 2, 8, 4, 0);
  const std::vector<TreeSeq> seqs = {
      {9, RandomParents(7, rng), 7},   // the whole tree queried
      {12, {}, 3},                     // no tree: start INT32_MAX
      {5, RandomParents(70, rng), 4},  // a tree begun before the chunk, over two words
      {6, {}, 2},                      // no tree: start == seq_len
      {0, RandomParents(5, rng), 5},   // a tree at slot 0 (no prefix)
  };
  std::vector<int32_t> lens;
  for (const TreeSeq& seq : seqs) lens.push_back(seq.seq_len());
  const PagedSequences paged(shape, lens, rng);
  const TreeMasks masks(seqs, 3, rng);  // one word more than the largest tree needs
  const TreeRun run = RunTreeReference(shape, seqs, paged, masks, rng);
  EXPECT_NE(run.tree_out, run.causal_out);  // the trees branch: the mask matters
  const int64_t row = shape.num_q_heads * shape.head_dim;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const TreeSeq& seq = seqs[s];
    const int32_t seq_len = seq.seq_len(), first = seq_len - seq.q_len;
    const std::vector<double> seq_q(run.q.begin() + run.cu_q_lens[s] * row,
                                    run.q.begin() + run.cu_q_lens[s + 1] * row);
    const auto dense = DenseMaskedAttention(seq_q, paged.keys[s], paged.values[s], seq.q_len,
                                            seq_len, shape, [&](int64_t i, int64_t j) {
                                              const int64_t slot = first + i;
                                              if (j > slot) return false;
                                              if (seq.parents.empty() || j < seq.prefix)
                                                return true;
                                              return IsAncestorOrSelf(
                                                  seq.parents, static_cast<int32_t>(j - seq.prefix),
                                                  static_cast<int32_t>(slot - seq.prefix));
                                            });
    for (int64_t x = 0; x < seq.q_len * row; ++x) {
      ASSERT_NEAR(run.tree_out[run.cu_q_lens[s] * row + x], dense[x], 1e-12)
          << "seq " << s << " element " << x;
      if (seq.parents.empty()) {  // sequences without a tree: exactly the causal output
        ASSERT_EQ(run.tree_out[run.cu_q_lens[s] * row + x],
                  run.causal_out[run.cu_q_lens[s] * row + x]);
      }
    }
  }
}

// A chain (parents -1, 0, 1, ...) puts every node at its slot's position with all earlier nodes
// as ancestors: the causal mask, so the outputs are exactly the causal ones, for a whole chain
// and for the last queries of a chain begun earlier.
TEST(PagedPrefillRefTest, ChainTreeEqualsCausalAttention) {
  std::mt19937_64 rng(21);
  const AttentionShape shape = Shape(6, 2, 8, 4, 0);
  std::vector<int32_t> chain(80);
  std::iota(chain.begin(), chain.end(), -1);
  const std::vector<TreeSeq> seqs = {{11, {chain.begin(), chain.begin() + 9}, 9},
                                     {3, chain, 5},
                                     {20, {chain.begin(), chain.begin() + 1}, 1}};
  std::vector<int32_t> lens;
  for (const TreeSeq& seq : seqs) lens.push_back(seq.seq_len());
  const PagedSequences paged(shape, lens, rng);
  const TreeMasks masks(seqs, 2, rng);
  const TreeRun run = RunTreeReference(shape, seqs, paged, masks, rng);
  EXPECT_EQ(run.tree_out, run.causal_out);
}

// Every layer, kv head, K and V of slot `to` gets slot `from`'s row, moves in order: 1 -> 4, then
// 4 -> 0 reads the row the first move wrote; negative slots and from == to change nothing, nor
// does anything outside the caches (the gap between layers and between K and V).
TEST(MoveKvSlotsRefTest, MovesEveryLayerAndHeadInOrder) {
  const AttentionShape shape = Shape(4, 2, 2, 2, 0);
  const int64_t num_blocks = 3, cache = num_blocks * 2 * 2 * 2;  // blocks x heads x rows x d
  const int64_t v_offset = cache + 2, layer_stride = 2 * cache + 6, num_layers = 2;
  std::vector<double> kv(num_layers * layer_stride);
  std::iota(kv.begin(), kv.end(), 0.0);
  const std::vector<double> before = kv;
  const std::vector<int64_t> from = {1, 4, -1, 5, 3}, to = {4, 0, 2, 5, -1};
  MoveKvSlots(from.data(), to.data(), 5, kv.data(), num_layers, layer_stride, v_offset, shape);
  const int64_t source[6] = {1, 1, 2, 3, 1, 5};  // slot s now holds slot source[s]'s row
  std::vector<double> expected = before;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    for (int64_t base : {layer * layer_stride, layer * layer_stride + v_offset}) {
      for (int64_t slot = 0; slot < 6; ++slot) {
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t x = 0; x < 2; ++x) {
            auto at = [&](int64_t sl) { return base + ((sl / 2 * 2 + h) * 2 + sl % 2) * 2 + x; };
            expected[at(slot)] = before[at(source[slot])];
          }
        }
      }
    }
  }
  EXPECT_EQ(kv, expected);
}

}  // namespace
}  // namespace specd::kernels::ref
