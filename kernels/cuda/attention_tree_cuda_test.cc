// Token-tree attention on the GPU (kernels/cuda/attention.h, AttentionTreeMask): the tree
// variants of the verification kernel (trees of up to 16 queries, through PagedVerifyAttention
// with one and several splits and through PagedPrefillAttention) and of the prefill kernel
// (longer runs) against the tree-masked reference (kernels/ref/attention.h, itself checked
// against dense attention with the mask written out) under the flash-attention rule; launches mix
// sequences with and without trees, trees begun before the queried chunk, and random topologies.
// The dense path is checked unchanged: without a tree it matches the causal reference and equals,
// bit for bit, the tree variant run with no sequence holding a tree. MoveKvSlots is checked
// against its reference, overlapping moves included. Exits 77 (ctest: skipped) where no GPU is
// visible.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/ref/attention.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;

constexpr uint16_t kNaNBits = 0xffff;

__nv_bfloat16* Bf16(const DeviceBuffer& b) { return b.as<__nv_bfloat16>(); }

AttentionShape Shape(int hq, int hkv, int d, int block) {
  AttentionShape s;
  s.num_q_heads = hq;
  s.num_kv_heads = hkv;
  s.head_dim = d;
  s.block_size = block;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  return s;
}

ref::AttentionShape RefShape(const AttentionShape& a) {
  return {a.num_q_heads,   a.num_kv_heads, a.head_dim, a.block_size, static_cast<double>(a.scale),
          a.sliding_window};
}

// One sequence of a launch: `prefix` committed slots, then a tree of tree_size nodes whose last
// q_len slots are the queries (tree_size < q_len: the tree began in an earlier pass); tree_size
// 0: q_len causal queries after the prefix.
struct SeqSpec {
  int32_t prefix, tree_size, q_len;
};

struct TreeCase {
  std::string name;
  int hq, hkv, d, block;
  std::vector<SeqSpec> seqs;
  int32_t mask_words;  // 0: the fewest the largest tree needs
};

// Random parents in topological order: mostly one of the last few nodes (deep paths), sometimes
// a further root.
std::vector<int32_t> RandomParents(int32_t n, std::mt19937_64& rng) {
  std::vector<int32_t> parents(n, -1);
  std::uniform_int_distribution<int32_t> coin(0, 7);
  for (int32_t i = 1; i < n; ++i) {
    std::uniform_int_distribution<int32_t> recent(std::max(0, i - 6), i - 1);
    parents[i] = coin(rng) == 0 ? -1 : recent(rng);
  }
  return parents;
}

// A launch's host data: a bf16 paged cache behind shuffled block tables (every slot below a
// sequence's length random, every other slot NaN), strided queries, and the tree mask. Tree
// queries' rows set their ancestors and themselves plus random bits after their own slot (the
// causal rule must drop them); rows of sequences without a tree are random (never read), their
// starts INT32_MAX, seq_len or past it.
struct TreeBatch {
  AttentionShape shape;
  int32_t num_seqs = 0, max_q_len = 0, max_blocks_per_seq = 0, mask_words = 1;
  int64_t num_tokens = 0, row = 0, q_stride = 0, out_stride = 0;
  std::vector<int32_t> seq_lens, cu_q_lens = {0}, block_tables, tree_starts, no_tree_starts;
  std::vector<uint64_t> masks;
  std::vector<uint16_t> k_bits, v_bits, q_bits;

  TreeBatch(const TreeCase& c, std::mt19937_64& rng) : shape(Shape(c.hq, c.hkv, c.d, c.block)) {
    num_seqs = static_cast<int32_t>(c.seqs.size());
    int32_t largest_tree = 1;
    for (const SeqSpec& s : c.seqs) {
      seq_lens.push_back(s.prefix + (s.tree_size > 0 ? s.tree_size : s.q_len));
      cu_q_lens.push_back(cu_q_lens.back() + s.q_len);
      max_q_len = std::max(max_q_len, s.q_len);
      largest_tree = std::max(largest_tree, s.tree_size);
    }
    mask_words = c.mask_words > 0 ? c.mask_words : (largest_tree + 63) / 64;
    num_tokens = cu_q_lens.back();
    row = static_cast<int64_t>(c.hq) * c.d;
    q_stride = row + 16;
    out_stride = row + 8;
    FillCache(rng);
    q_bits = check::RandomBf16(num_tokens * q_stride, -2.0f, 2.0f, rng);
    FillMasks(c, rng);
  }

  void FillCache(std::mt19937_64& rng) {
    int64_t num_blocks = 3;  // owned by nobody
    for (int32_t len : seq_lens) {
      const int32_t blocks = (len + shape.block_size - 1) / shape.block_size;
      max_blocks_per_seq = std::max(max_blocks_per_seq, blocks + 1);
      num_blocks += blocks;
    }
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    block_tables.assign(static_cast<size_t>(num_seqs) * max_blocks_per_seq, -1);
    const int64_t tile = static_cast<int64_t>(shape.block_size) * shape.head_dim;
    k_bits.assign(num_blocks * shape.num_kv_heads * tile, kNaNBits);
    v_bits = k_bits;
    size_t next = 0;
    for (int32_t s = 0; s < num_seqs; ++s) {
      for (int32_t pos = 0; pos < seq_lens[s]; ++pos) {
        int32_t& block = block_tables[s * max_blocks_per_seq + pos / shape.block_size];
        if (pos % shape.block_size == 0) block = pool[next++];
        const auto k = check::RandomBf16(shape.num_kv_heads * shape.head_dim, -2.0f, 2.0f, rng);
        const auto v = check::RandomBf16(shape.num_kv_heads * shape.head_dim, -2.0f, 2.0f, rng);
        for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
          const int64_t dst =
              (block * shape.num_kv_heads + h) * tile + (pos % shape.block_size) * shape.head_dim;
          std::copy_n(k.begin() + h * shape.head_dim, shape.head_dim, k_bits.begin() + dst);
          std::copy_n(v.begin() + h * shape.head_dim, shape.head_dim, v_bits.begin() + dst);
        }
      }
    }
  }

  void FillMasks(const TreeCase& c, std::mt19937_64& rng) {
    std::uniform_int_distribution<uint64_t> bits;
    for (int32_t s = 0; s < num_seqs; ++s) {
      const SeqSpec& spec = c.seqs[s];
      const std::vector<int32_t> parents = RandomParents(spec.tree_size, rng);
      const int32_t none[3] = {INT32_MAX, seq_lens[s], seq_lens[s] + 5};
      tree_starts.push_back(spec.tree_size > 0 ? spec.prefix : none[s % 3]);
      no_tree_starts.push_back(INT32_MAX);
      for (int32_t i = 0; i < spec.q_len; ++i) {
        std::vector<uint64_t> words(mask_words);
        for (uint64_t& w : words) w = bits(rng);
        if (spec.tree_size > 0) {
          const int32_t node = spec.tree_size - spec.q_len + i;
          for (int32_t b = 0; b <= node; ++b) words[b / 64] &= ~(uint64_t{1} << (b % 64));
          for (int32_t a = node; a >= 0; a = parents[a]) words[a / 64] |= uint64_t{1} << (a % 64);
        }
        masks.insert(masks.end(), words.begin(), words.end());
      }
    }
  }
};

// Device copies of a TreeBatch, two tree masks (the batch's and one without any tree) and a
// workspace for every launch the test makes.
struct DeviceBatch {
  DeviceBuffer k, v, q, tables, seq_lens, cu_q, starts, no_starts, masks, out, workspace;
  AttentionTreeMask tree, no_tree;

  DeviceBatch(const TreeBatch& b, size_t workspace_bytes)
      : k(b.k_bits.size() * 2),
        v(b.v_bits.size() * 2),
        q(b.q_bits.size() * 2),
        tables(b.block_tables.size() * 4),
        seq_lens(b.seq_lens.size() * 4),
        cu_q(b.cu_q_lens.size() * 4),
        starts(b.tree_starts.size() * 4),
        no_starts(b.no_tree_starts.size() * 4),
        masks(b.masks.size() * 8),
        out(b.num_tokens * b.out_stride * 2),
        workspace(std::max<size_t>(16, workspace_bytes)) {
    k.Upload(b.k_bits);
    v.Upload(b.v_bits);
    q.Upload(b.q_bits);
    tables.Upload(b.block_tables);
    seq_lens.Upload(b.seq_lens);
    cu_q.Upload(b.cu_q_lens);
    starts.Upload(b.tree_starts);
    no_starts.Upload(b.no_tree_starts);
    masks.Upload(b.masks);
    tree = {starts.as<int32_t>(), masks.as<uint64_t>(), b.mask_words};
    no_tree = {no_starts.as<int32_t>(), masks.as<uint64_t>(), b.mask_words};
  }
};

// splits 0: PagedPrefillAttention (its own kernel and split choice); > 0: PagedVerifyAttention.
cudaError_t Launch(const TreeBatch& b, DeviceBatch& d, int32_t splits,
                   const AttentionTreeMask* tree, cudaStream_t stream) {
  if (splits == 0) {
    return PagedPrefillAttention(Bf16(d.q), b.q_stride, Bf16(d.k), Bf16(d.v),
                                 d.tables.as<int32_t>(), b.max_blocks_per_seq, d.cu_q.as<int32_t>(),
                                 d.seq_lens.as<int32_t>(), b.num_seqs, b.num_tokens, b.max_q_len,
                                 b.shape, Bf16(d.out), b.out_stride, d.workspace.as<void>(),
                                 d.workspace.bytes(), stream, tree);
  }
  return PagedVerifyAttention(Bf16(d.q), b.q_stride, Bf16(d.k), Bf16(d.v), d.tables.as<int32_t>(),
                              b.max_blocks_per_seq, d.cu_q.as<int32_t>(), d.seq_lens.as<int32_t>(),
                              b.num_seqs, b.num_tokens, b.max_q_len, splits, b.shape, Bf16(d.out),
                              b.out_stride, d.workspace.as<void>(), d.workspace.bytes(), stream,
                              tree);
}

// Poisons the output, launches, and returns the output rows ([num_tokens, hq, d] bf16 bits),
// after checking that no padding element past a row was written.
std::vector<uint16_t> RunAttention(const TreeBatch& b, DeviceBatch& d, int32_t splits,
                                   const AttentionTreeMask* tree) {
  d.out.Poison();
  d.workspace.Poison();
  SPECD_CUDA_CHECK(Launch(b, d, splits, tree, nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> strided = d.out.Download<uint16_t>();
  std::vector<uint16_t> rows(b.num_tokens * b.row);
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    std::copy_n(strided.begin() + t * b.out_stride, b.row, rows.begin() + t * b.row);
    for (int64_t x = b.row; x < b.out_stride; ++x) {
      EXPECT_EQ(strided[t * b.out_stride + x], kNaNBits) << "padding of token " << t;
    }
  }
  return rows;
}

// The reference in fp64 (the truth) and in fp32 with bf16 probabilities, its output rounded to
// bf16 (the same-precision baseline), with the batch's tree mask or none.
struct Reference {
  std::vector<double> out64;
  std::vector<double> baseline;
};
Reference RunReference(const TreeBatch& b, bool with_tree) {
  const ref::AttentionShape r = RefShape(b.shape);
  const ref::AttentionTreeMask tree = {b.tree_starts.data(), b.masks.data(), b.mask_words};
  const ref::AttentionTreeMask* mask = with_tree ? &tree : nullptr;
  Reference ref;
  ref.out64.resize(b.num_tokens * b.row);
  std::vector<float> out32(b.num_tokens * b.row);
  ref::PagedPrefillAttention(
      check::WidenToDouble(b.q_bits).data(), b.q_stride, check::WidenToDouble(b.k_bits).data(),
      check::WidenToDouble(b.v_bits).data(), b.block_tables.data(), b.max_blocks_per_seq,
      b.cu_q_lens.data(), b.seq_lens.data(), b.num_seqs, r, ref.out64.data(), b.row,
      ref::ProbRounding::kExact, mask);
  ref::PagedPrefillAttention(check::WidenToFloat(b.q_bits).data(), b.q_stride,
                             check::WidenToFloat(b.k_bits).data(),
                             check::WidenToFloat(b.v_bits).data(), b.block_tables.data(),
                             b.max_blocks_per_seq, b.cu_q_lens.data(), b.seq_lens.data(),
                             b.num_seqs, r, out32.data(), b.row, ref::ProbRounding::kBf16, mask);
  ref.baseline = check::RoundToBf16(out32);
  return ref;
}

void ExpectMatches(const std::string& what, const std::vector<uint16_t>& kernel,
                   const Reference& ref) {
  const check::ErrorCheck e =
      check::CompareWithReference(what, check::WidenToDouble(kernel), ref.baseline, ref.out64);
  EXPECT_TRUE(e.passed) << what << ": max|kernel-ref64| " << e.kernel_error << " > tolerance "
                        << e.tolerance << " (baseline " << e.baseline_error << ")";
}

class TreeAttentionTest : public ::testing::TestWithParam<TreeCase> {};

TEST_P(TreeAttentionTest, MatchesTheTreeReferenceAndLeavesTheDensePathUnchanged) {
  const TreeCase& c = GetParam();
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  const TreeBatch b(c, rng);
  const bool verify_kernel = b.max_q_len <= kMaxVerifyQueryLen && c.d <= 128;
  const std::vector<int32_t> verify_splits = {1, 5};
  size_t workspace = PagedPrefillWorkspaceBytes(b.num_tokens, b.num_seqs, b.shape);
  for (int32_t n : verify_splits) {
    workspace = std::max(workspace, PagedVerifyWorkspaceBytes(b.num_tokens, n, b.shape));
  }
  DeviceBatch d(b, workspace);
  const Reference tree_ref = RunReference(b, true), causal_ref = RunReference(b, false);

  // PagedPrefillAttention's own dispatch, then (short runs) the verification kernel directly.
  std::vector<int32_t> launches = {0};
  if (verify_kernel) launches.insert(launches.end(), verify_splits.begin(), verify_splits.end());
  for (int32_t splits : launches) {
    const std::string how = splits == 0 ? std::string(verify_kernel ? "prefill->verify" : "prefill")
                                        : "verify, " + std::to_string(splits) + " splits";
    ExpectMatches(c.name + " tree (" + how + ")", RunAttention(b, d, splits, &d.tree), tree_ref);
    // The dense path: no tree matches the causal reference, and the tree variant with no
    // sequence holding a tree computes the same bits.
    const std::vector<uint16_t> dense = RunAttention(b, d, splits, nullptr);
    ExpectMatches(c.name + " dense (" + how + ")", dense, causal_ref);
    EXPECT_EQ(RunAttention(b, d, splits, &d.no_tree), dense) << c.name << " (" << how << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Trees, TreeAttentionTest,
    ::testing::Values(
        // Runs of up to 16 queries: the split-KV verification kernel's tree variant.
        //        prefix tree q_len
        TreeCase{"verify_d128_group4",
                 32,
                 8,
                 128,
                 16,
                 {{700, 3, 3},
                  {1500, 8, 8},
                  {300, 0, 5},
                  {2000, 16, 16},
                  {1000, 40, 8},  // a tree begun before the chunk
                  {64, 0, 1},
                  {0, 5, 5}},  // a tree at slot 0
                 0},
        TreeCase{"verify_d64_group1",
                 8,
                 8,
                 64,
                 16,
                 {{900, 3, 3}, {37, 16, 16}, {1200, 0, 16}, {500, 70, 12}, {2500, 8, 8}},
                 0},
        TreeCase{"verify_d128_group1_block32_16words",
                 8,
                 8,
                 128,
                 32,
                 {{333, 16, 16}, {1024, 3, 3}, {100, 0, 7}, {4000, 300, 16}},
                 16},
        TreeCase{"verify_d64_group4_block64",
                 16,
                 4,
                 64,
                 64,
                 {{1500, 8, 8}, {70, 16, 16}, {0, 0, 4}, {2100, 33, 9}},
                 0},
        TreeCase{"verify_d16_group2", 4, 2, 16, 16, {{200, 8, 8}, {50, 0, 3}, {400, 16, 10}}, 0},
        // Longer runs: the prefill kernel's tree variant (small trees ride along).
        TreeCase{"prefill_d128_group4",
                 32,
                 8,
                 128,
                 16,
                 {{500, 17, 17},
                  {1200, 33, 33},
                  {90, 65, 65},
                  {300, 0, 40},
                  {800, 200, 33},  // begun before the chunk, four words
                  {10, 3, 3}},
                 0},
        TreeCase{"prefill_d64_group1_16words",
                 8,
                 8,
                 64,
                 16,
                 {{600, 65, 65}, {0, 33, 33}, {1000, 0, 20}, {250, 17, 17}, {3000, 1000, 65}},
                 16},
        TreeCase{
            "prefill_d256_group2", 8, 4, 256, 16, {{300, 33, 33}, {100, 0, 17}, {700, 65, 20}}, 0},
        TreeCase{"prefill_d32_group2_block32",
                 4,
                 2,
                 32,
                 32,
                 {{120, 17, 17}, {400, 100, 33}, {60, 0, 18}},
                 0}),
    [](const ::testing::TestParamInfo<TreeCase>& info) { return info.param.name; });

// The runner replays verification from CUDA graphs: a captured tree launch (the verification
// kernel with its combine, and the prefill kernel) replays to the direct launch's bits.
TEST(TreeAttentionGraphTest, CapturedLaunchReplaysTheDirectResult) {
  for (const TreeCase& c :
       {TreeCase{"graph_verify", 32, 8, 128, 16, {{3000, 8, 8}, {500, 0, 4}, {900, 40, 16}}, 0},
        TreeCase{"graph_prefill", 8, 2, 128, 16, {{700, 65, 65}, {200, 0, 30}}, 0}}) {
    std::mt19937_64 rng(std::hash<std::string>{}(c.name));
    const TreeBatch b(c, rng);
    DeviceBatch d(b, PagedPrefillWorkspaceBytes(b.num_tokens, b.num_seqs, b.shape));
    const std::vector<uint16_t> direct = RunAttention(b, d, 0, &d.tree);
    ExpectMatches(c.name, direct, RunReference(b, true));

    cudaStream_t stream;
    SPECD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    SPECD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    SPECD_CUDA_CHECK(Launch(b, d, 0, &d.tree, stream));
    SPECD_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    SPECD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    d.out.Poison();
    d.workspace.Poison();
    SPECD_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SPECD_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<uint16_t> strided = d.out.Download<uint16_t>();
    for (int64_t t = 0; t < b.num_tokens; ++t) {
      ASSERT_TRUE(std::equal(direct.begin() + t * b.row, direct.begin() + (t + 1) * b.row,
                             strided.begin() + t * b.out_stride))
          << c.name << " token " << t;
    }
    SPECD_CUDA_CHECK(cudaGraphExecDestroy(exec));
    SPECD_CUDA_CHECK(cudaGraphDestroy(graph));
    SPECD_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

TEST(TreeAttentionArgsTest, RejectsInvalidTreeMasks) {
  const TreeCase c{"args", 8, 2, 64, 16, {{100, 8, 8}}, 0};
  std::mt19937_64 rng(5);
  TreeBatch b(c, rng);
  DeviceBatch d(b, PagedPrefillWorkspaceBytes(b.num_tokens, b.num_seqs, b.shape));
  auto both = [&](const AttentionTreeMask& tree) {
    return std::vector<cudaError_t>{Launch(b, d, 0, &tree, nullptr),
                                    Launch(b, d, 1, &tree, nullptr)};
  };
  const std::vector<cudaError_t> invalid(2, cudaErrorInvalidValue);
  AttentionTreeMask tree = d.tree;
  for (int32_t words : {0, -1, kMaxTreeMaskWords + 1}) {
    tree.mask_words = words;
    EXPECT_EQ(both(tree), invalid) << "mask_words " << words;
  }
  tree = d.tree;
  tree.tree_starts = nullptr;
  EXPECT_EQ(both(tree), invalid);
  tree = d.tree;
  tree.masks = nullptr;
  EXPECT_EQ(both(tree), invalid);
  b.shape.sliding_window = 64;  // a window with a tree
  EXPECT_EQ(both(d.tree), invalid);
  EXPECT_EQ(Launch(b, d, 0, nullptr, nullptr), cudaSuccess);  // the window alone is fine
  b.shape.sliding_window = 0;
  tree = d.tree;
  tree.masks = reinterpret_cast<const uint64_t*>(d.masks.as<char>() + 4);  // misaligned
  EXPECT_EQ(both(tree), invalid);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ---------------------------------------------------------------------------------------------
// MoveKvSlots.

struct MoveCase {
  int hkv, d, block, num_blocks, num_layers, num_random_moves;
};

class MoveKvSlotsTest : public ::testing::TestWithParam<MoveCase> {};

TEST_P(MoveKvSlotsTest, MatchesTheReferenceIncludingOverlappingMoves) {
  const MoveCase& c = GetParam();
  const AttentionShape shape = Shape(c.hkv, c.hkv, c.d, c.block);
  const int64_t cache = static_cast<int64_t>(c.num_blocks) * c.hkv * c.block * c.d;
  const int64_t v_offset = cache + 24, layer_stride = 2 * cache + 64;  // gaps nobody may touch
  std::mt19937_64 rng(c.d * 7 + c.num_layers);
  const std::vector<uint16_t> init =
      check::RandomBf16(layer_stride * c.num_layers, -2.0f, 2.0f, rng);
  // A chain through the 8-move batches the kernel loads together, each move reading the slot the
  // previous one wrote (2 -> 9 -> 17 -> ..., moves 7 and 8 in different batches), a no-op,
  // skipped moves, a swap of slots 0 and 1 through slot 7; then random moves, a third of them
  // reading a slot an earlier move wrote.
  const int64_t slots = static_cast<int64_t>(c.num_blocks) * c.block;
  std::vector<int64_t> from = {2, 9, 17, 30, 41, 5, 6, 11, 12, 11, -1, 3, 0, 1, 7},
                       to = {9, 17, 30, 41, 5, 6, 11, 12, 13, 11, 4, -1, 7, 0, 1};
  std::uniform_int_distribution<int64_t> slot(0, slots - 1);
  for (int i = 0; i < c.num_random_moves; ++i) {
    from.push_back(i % 3 == 0 ? to[std::uniform_int_distribution<size_t>(0, to.size() - 1)(rng)]
                              : slot(rng));
    to.push_back(slot(rng));
  }
  for (int64_t s : from) ASSERT_LT(s, slots);
  for (int64_t s : to) ASSERT_LT(s, slots);
  const int32_t num_moves = static_cast<int32_t>(from.size());
  std::vector<uint16_t> expected = init;
  ref::MoveKvSlots(from.data(), to.data(), num_moves, expected.data(), c.num_layers, layer_stride,
                   v_offset, RefShape(shape));
  ASSERT_NE(expected, init);

  DeviceBuffer kv(init.size() * 2), d_from(from.size() * 8), d_to(to.size() * 8);
  kv.Upload(init);
  d_from.Upload(from);
  d_to.Upload(to);
  SPECD_CUDA_CHECK(MoveKvSlots(d_from.as<int64_t>(), d_to.as<int64_t>(), num_moves, Bf16(kv),
                               c.num_layers, layer_stride, v_offset, shape, nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(kv.Download<uint16_t>(), expected);

  // No moves: nothing launched, nothing changed. Then the same moves from a captured graph.
  kv.Upload(init);
  SPECD_CUDA_CHECK(MoveKvSlots(nullptr, nullptr, 0, Bf16(kv), c.num_layers, layer_stride, v_offset,
                               shape, nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(kv.Download<uint16_t>(), init);
  cudaStream_t stream;
  SPECD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SPECD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  SPECD_CUDA_CHECK(MoveKvSlots(d_from.as<int64_t>(), d_to.as<int64_t>(), num_moves, Bf16(kv),
                               c.num_layers, layer_stride, v_offset, shape, stream));
  SPECD_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  SPECD_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  SPECD_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  SPECD_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(kv.Download<uint16_t>(), expected);
  SPECD_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SPECD_CUDA_CHECK(cudaGraphDestroy(graph));
  SPECD_CUDA_CHECK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoveKvSlotsTest,
                         ::testing::Values(
                             //      hkv  d   block blocks layers random moves
                             MoveCase{2, 128, 16, 12, 3, 20},  // Llama-like head, 3 layers
                             MoveCase{8, 64, 16, 40, 32, 50},  // 32 layers, 64 moves
                             MoveCase{1, 256, 64, 5, 2, 9},    // head_dim 256, block 64
                             MoveCase{2, 16, 16, 4, 4, 30}),   // the tiny models' head_dim 16
                         [](const ::testing::TestParamInfo<MoveCase>& info) {
                           const MoveCase& c = info.param;
                           return "hkv" + std::to_string(c.hkv) + "_d" + std::to_string(c.d) +
                                  "_bs" + std::to_string(c.block) + "_l" +
                                  std::to_string(c.num_layers);
                         });

TEST(MoveKvSlotsArgsTest, RejectsInvalidArguments) {
  DeviceBuffer kv(4096), slots(64);
  const AttentionShape shape = Shape(2, 2, 64, 16);
  const int64_t* s = slots.as<int64_t>();
  __nv_bfloat16* base = Bf16(kv);
  auto move = [&](const int64_t* f, const int64_t* t, int32_t n, __nv_bfloat16* p, int32_t layers,
                  int64_t stride, int64_t v_offset, const AttentionShape& a) {
    return MoveKvSlots(f, t, n, p, layers, stride, v_offset, a, nullptr);
  };
  EXPECT_EQ(move(s, s, -1, base, 1, 0, 0, shape), cudaErrorInvalidValue);
  EXPECT_EQ(move(s, s, 1, base, -1, 0, 0, shape), cudaErrorInvalidValue);
  EXPECT_EQ(move(nullptr, s, 1, base, 1, 0, 0, shape), cudaErrorInvalidValue);
  EXPECT_EQ(move(s, nullptr, 1, base, 1, 0, 0, shape), cudaErrorInvalidValue);
  EXPECT_EQ(move(s, s, 1, nullptr, 1, 0, 0, shape), cudaErrorInvalidValue);
  __nv_bfloat16* misaligned = reinterpret_cast<__nv_bfloat16*>(kv.as<uint16_t>() + 1);
  EXPECT_EQ(move(s, s, 1, misaligned, 1, 0, 0, shape), cudaErrorInvalidValue);
  EXPECT_EQ(move(s, s, 1, base, 1, 12, 0, shape), cudaErrorInvalidValue);  // stride % 8
  EXPECT_EQ(move(s, s, 1, base, 1, 0, 4, shape), cudaErrorInvalidValue);   // v_offset % 8
  AttentionShape bad = shape;
  bad.head_dim = 12;
  EXPECT_EQ(move(s, s, 1, base, 1, 0, 0, bad), cudaErrorInvalidValue);
  EXPECT_EQ(move(s, s, 0, base, 1, 0, 0, shape), cudaSuccess);
  EXPECT_EQ(move(s, s, 1, base, 0, 0, 0, shape), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels

int main(int argc, char** argv) {
  if (specd::kernels::check::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "attention_tree_cuda_test: no CUDA device visible; skipping\n");
    return specd::kernels::check::kSkipExitCode;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
