// Attention ops of the check table (kernels/cuda/attention.h): write_kv_cache,
// paged_decode_attention, paged_prefill_attention, paged_tree_attention (the prefill op with each
// sequence's queries a token tree of random topology: its slots are the last q_len, its mask
// rows ancestors and self). Attention shapes use OpShape's named fields --
// batch (sequences), num_heads, num_kv_heads, head_dim, block_size, window -- and:
//   context     the longest sequence's length (keys, the queries' own included)
//   table_rows  the shortest's (lengths spread linearly from `context` down to it; 0: all equal)
//   num_tokens  query tokens: decode = batch; prefill = the total, split evenly over the
//               sequences and clipped to each length; write_kv_cache = tokens written
//   width       decode: a forced split count (0: ChooseDecodeSplits); prefill: > 0 runs
//               PagedVerifyAttention with that many splits (0: PagedPrefillAttention, which
//               picks the kernel and split count itself); write_kv_cache: the row stride of key
//               and value (odd: the scalar path)
// vegas_verify, vegas_verify_scores and vegas_verify_select are the prefill op's verification at
// the split count a Vegas scored run takes (width > 0 forces one): plain PagedVerifyAttention, the
// score-collecting PagedVerifyAttentionWithScores (kernels/cuda/vegas.h), and that plus
// VegasPrefixWeights and VegasSelectTopK at the paper's 7% (floor 256) -- the whole per-layer
// cost of Vegas' selection, timed side by side with the pass it rides on. Their bytes are the
// attention's, so their GB/s fall by what collection costs.
// kernels_cuda_test names a case "<op>_<num_tokens>x<width>", so those pairs are unique per op.
// The KV cache sits behind shuffled block tables and every slot a query must not read holds NaN
// (slots past each length, before a sliding window, blocks nobody owns), so a masking or
// addressing mistake shows up as an infinite error.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/check/op_families.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/vegas.h"
#include "kernels/ref/attention.h"

namespace specd::kernels::check {
namespace {

constexpr int64_t kBf16Bytes = 2;
constexpr uint16_t kNaNBits = 0xffff;
// Values per random pool; larger caches (perf shapes) repeat a pool at shifting offsets.
constexpr size_t kRandomPoolSize = size_t{1} << 22;
// Caches up to this many values (every check shape) hold NaN wherever no query may read.
constexpr size_t kMaxPoisonedCacheValues = size_t{1} << 25;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__nv_bfloat16* Bf16(const DeviceBuffer& buffer) { return buffer.as<__nv_bfloat16>(); }

std::mt19937_64 RngFor(const OpShape& s, uint64_t op_salt) {
  uint64_t h = 0x5eedULL ^ (op_salt * 1000003ULL);
  for (int64_t v : {s.num_tokens, s.width, s.table_rows, s.batch, s.num_heads, s.num_kv_heads,
                    s.head_dim, s.context, s.block_size, s.window}) {
    h = h * 0x100000001b3ULL ^ static_cast<uint64_t>(v);
  }
  return std::mt19937_64(h);
}

AttentionShape KernelShape(const OpShape& s) {
  AttentionShape a;
  a.num_q_heads = static_cast<int32_t>(s.num_heads);
  a.num_kv_heads = static_cast<int32_t>(s.num_kv_heads);
  a.head_dim = static_cast<int32_t>(s.head_dim);
  a.block_size = static_cast<int32_t>(s.block_size);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  a.sliding_window = static_cast<int32_t>(s.window);
  return a;
}

ref::AttentionShape RefShape(const AttentionShape& a) {
  return {a.num_q_heads,   a.num_kv_heads, a.head_dim, a.block_size, static_cast<double>(a.scale),
          a.sliding_window};
}

// Random bf16 bits in [-2, 2): exact up to kRandomPoolSize values, beyond that a pool repeated
// at shifting offsets (timing needs non-zero data, not fresh randomness).
std::vector<uint16_t> RandomBits(size_t n, std::mt19937_64& rng) {
  if (n <= kRandomPoolSize) return RandomBf16(n, -2.0f, 2.0f, rng);
  const std::vector<uint16_t> pool = RandomBf16(kRandomPoolSize, -2.0f, 2.0f, rng);
  std::vector<uint16_t> bits(n);
  for (size_t done = 0, shift = 0; done < n; shift = (shift + 7919) % kRandomPoolSize) {
    const size_t count = std::min(n - done, kRandomPoolSize - shift);
    std::copy_n(pool.begin() + shift, count, bits.begin() + done);
    done += count;
  }
  return bits;
}

// Sequence lengths from `context` down to table_rows (or all `context`).
std::vector<int32_t> SeqLens(const OpShape& s) {
  const int64_t shortest = s.table_rows > 0 ? s.table_rows : s.context;
  std::vector<int32_t> lens(s.batch);
  for (int64_t i = 0; i < s.batch; ++i) {
    const int64_t drop = s.batch > 1 ? i * (s.context - shortest) / (s.batch - 1) : 0;
    lens[i] = static_cast<int32_t>(s.context - drop);
  }
  return lens;
}

// A paged KV cache holding each sequence's keys [first_visible[i], seq_lens[i]) behind shuffled
// block tables; every other slot is NaN. Unused block-table entries are -1.
struct PagedKv {
  int64_t num_blocks = 0;
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [batch, max_blocks_per_seq]
  std::vector<uint16_t> k_bits, v_bits;

  PagedKv(const AttentionShape& a, const std::vector<int32_t>& seq_lens,
          const std::vector<int32_t>& first_visible, std::mt19937_64& rng) {
    const int64_t tile = static_cast<int64_t>(a.block_size) * a.head_dim;  // one head of a block
    for (int32_t len : seq_lens) {
      const int64_t blocks = CeilDiv(len, a.block_size);
      max_blocks_per_seq = std::max(max_blocks_per_seq, static_cast<int32_t>(blocks) + 1);
      num_blocks += blocks;
    }
    num_blocks += 2;  // owned by nobody
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    block_tables.assign(seq_lens.size() * max_blocks_per_seq, -1);
    const size_t cache_values = static_cast<size_t>(num_blocks) * a.num_kv_heads * tile;
    const bool poison = cache_values <= kMaxPoisonedCacheValues;
    k_bits = poison ? std::vector<uint16_t>(cache_values, kNaNBits) : RandomBits(cache_values, rng);
    v_bits = poison ? std::vector<uint16_t>(cache_values, kNaNBits) : RandomBits(cache_values, rng);
    size_t next = 0;
    for (size_t s = 0; s < seq_lens.size(); ++s) {
      for (int64_t b = 0; b < CeilDiv(seq_lens[s], a.block_size); ++b) {
        block_tables[s * max_blocks_per_seq + b] = pool[next++];
      }
      if (!poison) continue;
      const std::vector<uint16_t> k_rows = RandomBf16(
          static_cast<size_t>(seq_lens[s]) * a.num_kv_heads * a.head_dim, -2.0f, 2.0f, rng);
      const std::vector<uint16_t> v_rows = RandomBf16(k_rows.size(), -2.0f, 2.0f, rng);
      for (int32_t pos = first_visible[s]; pos < seq_lens[s]; ++pos) {
        const int64_t block = block_tables[s * max_blocks_per_seq + pos / a.block_size];
        for (int32_t h = 0; h < a.num_kv_heads; ++h) {
          const int64_t dst =
              (block * a.num_kv_heads + h) * tile + (pos % a.block_size) * a.head_dim;
          const int64_t src = (static_cast<int64_t>(pos) * a.num_kv_heads + h) * a.head_dim;
          std::copy_n(k_rows.begin() + src, a.head_dim, k_bits.begin() + dst);
          std::copy_n(v_rows.begin() + src, a.head_dim, v_bits.begin() + dst);
        }
      }
    }
  }
};

// Device copies of a PagedKv plus the per-sequence lengths.
struct DeviceKv {
  DeviceBuffer k_cache, v_cache, block_tables, seq_lens;

  DeviceKv(const PagedKv& kv, const std::vector<int32_t>& lens)
      : k_cache(kv.k_bits.size() * kBf16Bytes),
        v_cache(kv.v_bits.size() * kBf16Bytes),
        block_tables(kv.block_tables.size() * sizeof(int32_t)),
        seq_lens(lens.size() * sizeof(int32_t)) {}

  void Upload(const PagedKv& kv, const std::vector<int32_t>& lens) {
    k_cache.Upload(kv.k_bits);
    v_cache.Upload(kv.v_bits);
    block_tables.Upload(kv.block_tables);
    seq_lens.Upload(lens);
  }
};

// Keys a query at `pos` sees start here.
int32_t FirstVisible(int32_t pos, int64_t window) {
  return window > 0 ? std::max<int32_t>(0, pos - static_cast<int32_t>(window) + 1) : 0;
}

// Bytes of K and V from position `first` to `len`, the least any kernel must read.
int64_t KvBytes(const AttentionShape& a, int64_t first, int64_t len) {
  return 2 * (len - first) * a.num_kv_heads * a.head_dim * kBf16Bytes;
}

class WriteKvCacheCase : public OpCase {
 public:
  explicit WriteKvCacheCase(const OpShape& shape)
      : shape_(shape),
        attn_(KernelShape(shape)),
        num_blocks_(CeilDiv(shape.num_tokens, attn_.block_size) + 3),
        cache_values_(num_blocks_ * attn_.num_kv_heads * attn_.block_size * attn_.head_dim),
        qkv_(shape.num_tokens * shape.width * kBf16Bytes),
        slots_(shape.num_tokens * sizeof(int64_t)),
        k_cache_(cache_values_ * kBf16Bytes),
        v_cache_(cache_values_ * kBf16Bytes) {
    std::mt19937_64 rng = RngFor(shape, 11);
    qkv_bits_ = RandomBits(shape.num_tokens * shape.width, rng);
    k_init_ = RandomBits(cache_values_, rng);
    v_init_ = RandomBits(cache_values_, rng);
    std::vector<int64_t> all_slots(num_blocks_ * attn_.block_size);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), rng);
    slot_mapping_.assign(all_slots.begin(), all_slots.begin() + shape.num_tokens);
    for (size_t t = 3; t < slot_mapping_.size(); t += 5) slot_mapping_[t] = -1;  // skipped
    Reset();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return WriteKvCache(Key(), shape_.width, Value(), shape_.width, slots_.as<int64_t>(),
                        shape_.num_tokens, attn_, Bf16(k_cache_), Bf16(v_cache_), stream);
  }

  int64_t BytesMoved() const override {
    const int64_t written =
        std::count_if(slot_mapping_.begin(), slot_mapping_.end(), [](int64_t s) { return s >= 0; });
    return written * 2 * KvBytes(attn_, 0, 1) + shape_.num_tokens * 8;
  }

  std::vector<ErrorCheck> Check() override {
    Reset();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t k_offset = KeyOffset(), v_offset = k_offset + attn_.num_kv_heads * attn_.head_dim;
    auto k64 = WidenToDouble(k_init_), v64 = WidenToDouble(v_init_);
    auto k32 = WidenToFloat(k_init_), v32 = WidenToFloat(v_init_);
    const auto qkv64 = WidenToDouble(qkv_bits_);
    const auto qkv32 = WidenToFloat(qkv_bits_);
    const ref::AttentionShape r = RefShape(attn_);
    ref::WriteKvCache(qkv64.data() + k_offset, shape_.width, qkv64.data() + v_offset, shape_.width,
                      slot_mapping_.data(), shape_.num_tokens, r, k64.data(), v64.data());
    ref::WriteKvCache(qkv32.data() + k_offset, shape_.width, qkv32.data() + v_offset, shape_.width,
                      slot_mapping_.data(), shape_.num_tokens, r, k32.data(), v32.data());
    return {CompareWithReference("k_cache", WidenToDouble(k_cache_.Download<uint16_t>()),
                                 RoundToBf16(k32), k64),
            CompareWithReference("v_cache", WidenToDouble(v_cache_.Download<uint16_t>()),
                                 RoundToBf16(v32), v64)};
  }

 private:
  // K and V of a token sit after its q heads in a fused qkv row of `width` elements
  // (__nv_bfloat16 is incomplete here: offsets go through the uint16_t view).
  int64_t KeyOffset() const { return static_cast<int64_t>(attn_.num_q_heads) * attn_.head_dim; }
  const __nv_bfloat16* Key() const {
    return reinterpret_cast<const __nv_bfloat16*>(qkv_.as<uint16_t>() + KeyOffset());
  }
  const __nv_bfloat16* Value() const {
    return reinterpret_cast<const __nv_bfloat16*>(qkv_.as<uint16_t>() + KeyOffset() +
                                                  static_cast<int64_t>(attn_.num_kv_heads) *
                                                      attn_.head_dim);
  }

  void Reset() {
    qkv_.Upload(qkv_bits_);
    slots_.Upload(slot_mapping_);
    k_cache_.Upload(k_init_);  // prior contents, which unwritten slots must keep
    v_cache_.Upload(v_init_);
  }

  OpShape shape_;
  AttentionShape attn_;
  int64_t num_blocks_, cache_values_;
  std::vector<uint16_t> qkv_bits_, k_init_, v_init_;
  std::vector<int64_t> slot_mapping_;
  DeviceBuffer qkv_;                // [num_tokens, width] bf16: q heads, then k, then v
  DeviceBuffer slots_;              // [num_tokens] int64
  DeviceBuffer k_cache_, v_cache_;  // [num_blocks, num_kv_heads, block_size, head_dim] bf16
};

// Queries for both attention ops: rows of a fused qkv buffer (stride (hq + 2 hkv) * d), so
// q_stride differs from the output's.
int64_t QkvStride(const AttentionShape& a) {
  return static_cast<int64_t>(a.num_q_heads + 2 * a.num_kv_heads) * a.head_dim;
}
int64_t OutStride(const AttentionShape& a) {
  return static_cast<int64_t>(a.num_q_heads) * a.head_dim;
}

class PagedDecodeCase : public OpCase {
 public:
  explicit PagedDecodeCase(const OpShape& shape)
      : shape_(shape),
        attn_(KernelShape(shape)),
        seq_lens_(SeqLens(shape)),
        rng_(RngFor(shape, 12)),
        kv_(attn_, seq_lens_, FirstVisibleKeys(), rng_),
        device_kv_(kv_, seq_lens_),
        q_(shape.batch * QkvStride(attn_) * kBf16Bytes),
        out_(shape.batch * OutStride(attn_) * kBf16Bytes),
        num_splits_(ChooseSplits()),
        workspace_(
            PagedDecodeWorkspaceBytes(static_cast<int32_t>(shape.batch), num_splits_, attn_)) {
    q_bits_ = RandomBits(shape.batch * QkvStride(attn_), rng_);
    Reset();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return PagedDecodeAttention(
        Bf16(q_), QkvStride(attn_), Bf16(device_kv_.k_cache), Bf16(device_kv_.v_cache),
        device_kv_.block_tables.as<int32_t>(), kv_.max_blocks_per_seq,
        device_kv_.seq_lens.as<int32_t>(), static_cast<int32_t>(shape_.batch), num_splits_, attn_,
        Bf16(out_), OutStride(attn_), workspace_.as<void>(), workspace_.bytes(), stream);
  }

  int64_t BytesMoved() const override {
    int64_t bytes = 2 * shape_.batch * OutStride(attn_) * kBf16Bytes;  // q in, out
    const auto first = FirstVisibleKeys();
    for (size_t s = 0; s < seq_lens_.size(); ++s) bytes += KvBytes(attn_, first[s], seq_lens_[s]);
    return bytes;
  }

  std::vector<ErrorCheck> Check() override {
    Reset();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t n = shape_.batch * OutStride(attn_);
    std::vector<double> out64(n);
    std::vector<float> out32(n);
    const ref::AttentionShape r = RefShape(attn_);
    ref::PagedDecodeAttention(WidenToDouble(q_bits_).data(), QkvStride(attn_),
                              WidenToDouble(kv_.k_bits).data(), WidenToDouble(kv_.v_bits).data(),
                              kv_.block_tables.data(), kv_.max_blocks_per_seq, seq_lens_.data(),
                              shape_.batch, r, out64.data(), OutStride(attn_));
    ref::PagedDecodeAttention(WidenToFloat(q_bits_).data(), QkvStride(attn_),
                              WidenToFloat(kv_.k_bits).data(), WidenToFloat(kv_.v_bits).data(),
                              kv_.block_tables.data(), kv_.max_blocks_per_seq, seq_lens_.data(),
                              shape_.batch, r, out32.data(), OutStride(attn_),
                              ref::ProbRounding::kBf16);
    return {CompareWithReference("out", WidenToDouble(out_.Download<uint16_t>()),
                                 RoundToBf16(out32), out64)};
  }

 private:
  std::vector<int32_t> FirstVisibleKeys() const {
    std::vector<int32_t> first(seq_lens_.size());
    for (size_t s = 0; s < seq_lens_.size(); ++s) {
      first[s] = FirstVisible(seq_lens_[s] - 1, shape_.window);
    }
    return first;
  }

  int32_t ChooseSplits() const {
    if (shape_.width > 0) return static_cast<int32_t>(shape_.width);
    int device = 0, num_sms = 0;
    SPECD_CUDA_CHECK(cudaGetDevice(&device));
    SPECD_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    return ChooseDecodeSplits(static_cast<int32_t>(shape_.batch),
                              *std::max_element(seq_lens_.begin(), seq_lens_.end()), num_sms,
                              attn_);
  }

  void Reset() {
    device_kv_.Upload(kv_, seq_lens_);
    q_.Upload(q_bits_);
    out_.Poison();
    workspace_.Poison();
  }

  OpShape shape_;
  AttentionShape attn_;
  std::vector<int32_t> seq_lens_;
  std::mt19937_64 rng_;
  PagedKv kv_;
  DeviceKv device_kv_;
  std::vector<uint16_t> q_bits_;
  DeviceBuffer q_;    // [batch, hq + 2 hkv, d] bf16 (q is the first hq heads of each row)
  DeviceBuffer out_;  // [batch, hq, d] bf16
  int32_t num_splits_;
  DeviceBuffer workspace_;
};

// Each sequence's q_len queries as one token tree (random parents, topological order) in their
// slots [seq_len - q_len, seq_len): mask rows of ancestors and self, words for the longest run.
struct QueryTrees {
  std::vector<int32_t> tree_starts;
  std::vector<uint64_t> masks;  // [num_tokens, mask_words]
  int32_t mask_words = 1;

  QueryTrees(const std::vector<int32_t>& seq_lens, const std::vector<int32_t>& cu_q_lens,
             std::mt19937_64& rng) {
    int32_t longest = 1;
    for (size_t s = 0; s < seq_lens.size(); ++s) {
      longest = std::max(longest, cu_q_lens[s + 1] - cu_q_lens[s]);
    }
    mask_words = static_cast<int32_t>(CeilDiv(longest, 64));
    for (size_t s = 0; s < seq_lens.size(); ++s) {
      const int32_t q_len = cu_q_lens[s + 1] - cu_q_lens[s];
      tree_starts.push_back(seq_lens[s] - q_len);
      std::vector<int32_t> parents(q_len, -1);
      for (int32_t i = 1; i < q_len; ++i) {
        parents[i] = std::uniform_int_distribution<int32_t>(std::max(-1, i - 4), i - 1)(rng);
      }
      for (int32_t i = 0; i < q_len; ++i) {
        std::vector<uint64_t> row(mask_words, 0);
        for (int32_t a = i; a >= 0; a = parents[a]) row[a / 64] |= uint64_t{1} << (a % 64);
        masks.insert(masks.end(), row.begin(), row.end());
      }
    }
  }
};

// paged_prefill_attention, and paged_tree_attention with `tree`.
// What PagedPrefillCase launches: the prefill op (PagedVerifyAttention when width > 0), or a
// Vegas stage at the scored split count.
enum class VegasStage { kNone, kVerify, kScores, kSelect };

class PagedPrefillCase : public OpCase {
 public:
  explicit PagedPrefillCase(const OpShape& shape, bool tree = false,
                            VegasStage vegas = VegasStage::kNone)
      : shape_(shape),
        vegas_(vegas),
        attn_(KernelShape(shape)),
        seq_lens_(SeqLens(shape)),
        cu_q_lens_(CuQueryLens()),
        num_tokens_(cu_q_lens_.back()),
        rng_(RngFor(shape, 13)),
        kv_(attn_, seq_lens_, FirstVisibleKeys(), rng_),
        device_kv_(kv_, seq_lens_),
        cu_q_lens_device_(cu_q_lens_.size() * sizeof(int32_t)),
        q_(num_tokens_ * QkvStride(attn_) * kBf16Bytes),
        out_(num_tokens_ * OutStride(attn_) * kBf16Bytes),
        workspace_(1) {
    q_bits_ = RandomBits(num_tokens_ * QkvStride(attn_), rng_);
    for (size_t s = 0; s + 1 < cu_q_lens_.size(); ++s) {
      max_q_len_ = std::max(max_q_len_, cu_q_lens_[s + 1] - cu_q_lens_[s]);
    }
    splits_ = static_cast<int32_t>(shape.width);
    if (vegas_ != VegasStage::kNone) {
      if (splits_ <= 0) {
        int device = 0, num_sms = 0;
        SPECD_CUDA_CHECK(cudaGetDevice(&device));
        SPECD_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
        splits_ = std::min(kVegasScoreSplits,
                           ChooseVerifySplits(static_cast<int32_t>(shape.batch), max_q_len_,
                                              static_cast<int32_t>(shape.context), num_sms, attn_));
      }
      SetUpVegas();
    }
    workspace_ = DeviceBuffer(std::max<size_t>(
        16, splits_ > 0 ? PagedVerifyWorkspaceBytes(num_tokens_, splits_, attn_)
                        : PagedPrefillWorkspaceBytes(num_tokens_, static_cast<int32_t>(shape.batch),
                                                     attn_)));
    if (tree) {
      trees_ = std::make_unique<QueryTrees>(seq_lens_, cu_q_lens_, rng_);
      tree_starts_ = DeviceBuffer(trees_->tree_starts.size() * sizeof(int32_t));
      tree_masks_ = DeviceBuffer(trees_->masks.size() * sizeof(uint64_t));
      tree_starts_.Upload(trees_->tree_starts);
      tree_masks_.Upload(trees_->masks);
      tree_ = {tree_starts_.as<int32_t>(), tree_masks_.as<uint64_t>(), trees_->mask_words};
    }
    Reset();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    if (vegas_ == VegasStage::kScores || vegas_ == VegasStage::kSelect) return LaunchVegas(stream);
    if (splits_ > 0) {
      return PagedVerifyAttention(
          Bf16(q_), QkvStride(attn_), Bf16(device_kv_.k_cache), Bf16(device_kv_.v_cache),
          device_kv_.block_tables.as<int32_t>(), kv_.max_blocks_per_seq,
          cu_q_lens_device_.as<int32_t>(), device_kv_.seq_lens.as<int32_t>(),
          static_cast<int32_t>(shape_.batch), num_tokens_, max_q_len_, splits_, attn_, Bf16(out_),
          OutStride(attn_), workspace_.as<void>(), workspace_.bytes(), stream, Tree());
    }
    return PagedPrefillAttention(
        Bf16(q_), QkvStride(attn_), Bf16(device_kv_.k_cache), Bf16(device_kv_.v_cache),
        device_kv_.block_tables.as<int32_t>(), kv_.max_blocks_per_seq,
        cu_q_lens_device_.as<int32_t>(), device_kv_.seq_lens.as<int32_t>(),
        static_cast<int32_t>(shape_.batch), num_tokens_, max_q_len_, attn_, Bf16(out_),
        OutStride(attn_), workspace_.as<void>(), workspace_.bytes(), stream, Tree());
  }

  int64_t BytesMoved() const override {
    int64_t bytes = 2 * num_tokens_ * OutStride(attn_) * kBf16Bytes;  // q in, out
    const auto first = FirstVisibleKeys();
    for (size_t s = 0; s < seq_lens_.size(); ++s) bytes += KvBytes(attn_, first[s], seq_lens_[s]);
    return bytes;
  }

  std::vector<ErrorCheck> Check() override {
    Reset();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t n = num_tokens_ * OutStride(attn_);
    std::vector<double> out64(n);
    std::vector<float> out32(n);
    const ref::AttentionShape r = RefShape(attn_);
    ref::AttentionTreeMask ref_tree;
    if (trees_ != nullptr) {
      ref_tree = {trees_->tree_starts.data(), trees_->masks.data(), trees_->mask_words};
    }
    const ref::AttentionTreeMask* tree = trees_ != nullptr ? &ref_tree : nullptr;
    ref::PagedPrefillAttention(WidenToDouble(q_bits_).data(), QkvStride(attn_),
                               WidenToDouble(kv_.k_bits).data(), WidenToDouble(kv_.v_bits).data(),
                               kv_.block_tables.data(), kv_.max_blocks_per_seq, cu_q_lens_.data(),
                               seq_lens_.data(), shape_.batch, r, out64.data(), OutStride(attn_),
                               ref::ProbRounding::kExact, tree);
    ref::PagedPrefillAttention(WidenToFloat(q_bits_).data(), QkvStride(attn_),
                               WidenToFloat(kv_.k_bits).data(), WidenToFloat(kv_.v_bits).data(),
                               kv_.block_tables.data(), kv_.max_blocks_per_seq, cu_q_lens_.data(),
                               seq_lens_.data(), shape_.batch, r, out32.data(), OutStride(attn_),
                               ref::ProbRounding::kBf16, tree);
    return {CompareWithReference("out", WidenToDouble(out_.Download<uint16_t>()),
                                 RoundToBf16(out32), out64)};
  }

 private:
  // The scored stages' buffers: logits and statistics for every prefix key of each sequence's two
  // collected rows, their weights, and the selection's lists.
  void SetUpVegas() {
    const int64_t batch = shape_.batch;
    score_stride_ = std::max<int64_t>(4, (shape_.context + 3) / 4 * 4);
    const int64_t head_rows = batch * 2 * attn_.num_q_heads;
    logits_ = DeviceBuffer(head_rows * score_stride_ * 2);
    stats_ = DeviceBuffer(head_rows * kVegasScoreSplits * 2 * 4);
    weights_ = DeviceBuffer(batch * 2 * score_stride_ * 4);
    select_ws_ = DeviceBuffer(std::max<size_t>(
        16, VegasSelectWorkspaceBytes(static_cast<int32_t>(batch), score_stride_)));
    kept_ = DeviceBuffer(batch * score_stride_ * 4);
    counts_ = DeviceBuffer(batch * 4);
    std::vector<int32_t> prefixes(batch);
    for (int64_t s = 0; s < batch; ++s) {
      prefixes[s] = seq_lens_[s] - (cu_q_lens_[s + 1] - cu_q_lens_[s]);
    }
    prefixes_ = DeviceBuffer(batch * 4);
    prefixes_.Upload(prefixes);
  }

  cudaError_t LaunchVegas(cudaStream_t stream) {
    const auto batch = static_cast<int32_t>(shape_.batch);
    cudaError_t err = PagedVerifyAttentionWithScores(
        Bf16(q_), QkvStride(attn_), Bf16(device_kv_.k_cache), Bf16(device_kv_.v_cache),
        device_kv_.block_tables.as<int32_t>(), kv_.max_blocks_per_seq,
        cu_q_lens_device_.as<int32_t>(), device_kv_.seq_lens.as<int32_t>(), batch, num_tokens_,
        max_q_len_, splits_, attn_, Bf16(out_), OutStride(attn_), logits_.as<__half>(),
        stats_.as<float>(), score_stride_, workspace_.as<void>(), workspace_.bytes(), stream);
    if (err != cudaSuccess || vegas_ != VegasStage::kSelect) return err;
    err = VegasPrefixWeights(logits_.as<__half>(), stats_.as<float>(), attn_.num_q_heads,
                             score_stride_, prefixes_.as<int32_t>(), batch, batch,
                             weights_.as<float>(), stream);
    if (err != cudaSuccess) return err;
    const VegasBudget budget{0.07, 256, static_cast<int32_t>(score_stride_)};
    return VegasSelectTopK(weights_.as<float>(), 1, score_stride_, prefixes_.as<int32_t>(), batch,
                           batch, budget, kept_.as<int32_t>(), score_stride_, counts_.as<int32_t>(),
                           select_ws_.as<void>(), select_ws_.bytes(), stream);
  }

  // num_tokens split evenly over the sequences, each clipped to [1, its length].
  std::vector<int32_t> CuQueryLens() const {
    std::vector<int32_t> cu = {0};
    for (int64_t s = 0; s < shape_.batch; ++s) {
      const int64_t even =
          shape_.num_tokens / shape_.batch + (s < shape_.num_tokens % shape_.batch);
      cu.push_back(cu.back() + static_cast<int32_t>(std::clamp<int64_t>(even, 1, seq_lens_[s])));
    }
    return cu;
  }

  // The first query's window start: no query of the sequence sees a key before it.
  std::vector<int32_t> FirstVisibleKeys() const {
    std::vector<int32_t> first(seq_lens_.size());
    for (size_t s = 0; s < seq_lens_.size(); ++s) {
      const int32_t q_len = cu_q_lens_[s + 1] - cu_q_lens_[s];
      first[s] = FirstVisible(seq_lens_[s] - q_len, shape_.window);
    }
    return first;
  }

  void Reset() {
    device_kv_.Upload(kv_, seq_lens_);
    cu_q_lens_device_.Upload(cu_q_lens_);
    q_.Upload(q_bits_);
    out_.Poison();
    workspace_.Poison();
  }

  const AttentionTreeMask* Tree() const { return trees_ != nullptr ? &tree_ : nullptr; }

  OpShape shape_;
  VegasStage vegas_;
  int32_t splits_ = 0;  // > 0: PagedVerifyAttention's (or a Vegas stage's) KV splits
  AttentionShape attn_;
  std::vector<int32_t> seq_lens_;
  std::vector<int32_t> cu_q_lens_;
  int64_t num_tokens_;
  int32_t max_q_len_ = 0;
  std::unique_ptr<QueryTrees> trees_;  // paged_tree_attention only
  DeviceBuffer tree_starts_{1}, tree_masks_{1};
  AttentionTreeMask tree_;
  std::mt19937_64 rng_;
  PagedKv kv_;
  DeviceKv device_kv_;
  DeviceBuffer cu_q_lens_device_;  // [batch + 1] int32
  std::vector<uint16_t> q_bits_;
  DeviceBuffer q_;    // [num_tokens, hq + 2 hkv, d] bf16 (q is the first hq heads of each row)
  DeviceBuffer out_;  // [num_tokens, hq, d] bf16
  DeviceBuffer workspace_;
  int64_t score_stride_ = 0;  // the Vegas stages' buffers (SetUpVegas)
  DeviceBuffer logits_{1}, stats_{1}, weights_{1}, select_ws_{1}, kept_{1}, counts_{1};
  DeviceBuffer prefixes_{1};
};

// One attention shape. `shortest` 0: every sequence `context` long; `extra`: decode's forced
// split count (0: chosen), prefill's forced verification split count (0: PagedPrefillAttention).
OpShape Attn(int64_t batch, int64_t num_tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
             int64_t block_size, int64_t context, int64_t shortest, int64_t window, int64_t extra) {
  OpShape s;
  s.batch = batch;
  s.num_tokens = num_tokens;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.block_size = block_size;
  s.context = context;
  s.table_rows = shortest;
  s.window = window;
  s.width = extra;
  char buf[96];
  int n = std::snprintf(buf, sizeof(buf), "b%lld q%lld h%lld/%lld d%lld bs%lld ctx",
                        static_cast<long long>(batch), static_cast<long long>(num_tokens),
                        static_cast<long long>(heads), static_cast<long long>(kv_heads),
                        static_cast<long long>(head_dim), static_cast<long long>(block_size));
  if (shortest > 0 && shortest != context) {
    n += std::snprintf(buf + n, sizeof(buf) - n, "%lld-", static_cast<long long>(shortest));
  }
  n += std::snprintf(buf + n, sizeof(buf) - n, "%lld", static_cast<long long>(context));
  if (window > 0)
    n += std::snprintf(buf + n, sizeof(buf) - n, " w%lld", static_cast<long long>(window));
  if (extra > 0) std::snprintf(buf + n, sizeof(buf) - n, " s%lld", static_cast<long long>(extra));
  s.label = buf;
  return s;
}

OpShape Decode(int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size,
               int64_t context, int64_t shortest, int64_t window, int64_t splits) {
  return Attn(batch, batch, heads, kv_heads, head_dim, block_size, context, shortest, window,
              splits);
}

OpShape WriteKv(int64_t num_tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
                int64_t block_size, int64_t row_pad) {
  OpShape s = Attn(1, num_tokens, heads, kv_heads, head_dim, block_size, 0, 0, 0, 0);
  s.width = (heads + 2 * kv_heads) * head_dim + row_pad;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "t%lld h%lld/%lld d%lld bs%lld stride%lld",
                static_cast<long long>(num_tokens), static_cast<long long>(heads),
                static_cast<long long>(kv_heads), static_cast<long long>(head_dim),
                static_cast<long long>(block_size), static_cast<long long>(s.width));
  s.label = buf;
  return s;
}

std::vector<OpShape> DecodeCheckShapes() {
  //      batch hq hkv  d   bs  ctx  shortest window splits
  return {
      Decode(3, 4, 4, 64, 16, 37, 1, 0, 0),          // MHA, a 1-token sequence
      Decode(5, 32, 8, 128, 16, 300, 17, 0, 0),      // Llama-3 8B heads
      Decode(2, 16, 2, 128, 32, 1000, 999, 0, 7),    // group 8, forced splits
      Decode(3, 8, 2, 64, 32, 333, 64, 100, 3),      // sliding window
      Decode(2, 32, 2, 128, 16, 200, 31, 0, 1),      // group 16, one split (direct output)
      Decode(2, 40, 2, 64, 16, 150, 5, 0, 0),        // group 20: two CTAs per kv head
      Decode(4, 8, 1, 256, 16, 200, 1, 0, 0),        // head_dim 256, MQA
      Decode(1, 8, 8, 256, 64, 129, 0, 0, 2),        // block 64
      Decode(6, 24, 2, 256, 16, 90, 40, 50, 0),      // group 12, window, head_dim 256
      Decode(7, 28, 4, 128, 64, 700, 300, 0, 1),     // Qwen-7B heads (group 7)
      Decode(3, 32, 8, 128, 16, 40, 1, 0, 16),       // more splits than tiles: empty splits
      Decode(8, 32, 8, 128, 16, 2100, 1500, 0, 0),   // batch 8, longer contexts
      Decode(2, 16, 4, 64, 64, 900, 500, 0, 9),      // head_dim 64, block 64, 9 splits
      Decode(1, 32, 8, 128, 16, 4000, 0, 0, 33),     // 8B heads, 33 splits (a short last split)
      Decode(1, 32, 8, 128, 16, 9000, 0, 0, 100),    // over the combine's 64 preloaded splits
      Decode(1, 8, 8, 256, 16, 3000, 100, 0, 40),    // head_dim 256: over its 32 preloaded
      Decode(4, 4, 2, 16, 16, 70, 9, 0, 3),          // head_dim 16 (tiny test models), group 2
      Decode(3, 4, 2, 16, 16, 50, 17, 0, 1),         // head_dim 16, one split (direct output)
      Decode(5, 4, 2, 32, 16, 130, 1, 0, 2),         // head_dim 32, a 1-token sequence
      Decode(1, 4, 2, 32, 16, 100, 0, 40, 0),        // head_dim 32, window, chosen splits
      Decode(2, 32, 8, 128, 16, 1500, 700, 300, 0),  // 8B heads, window (pipelined kernel)
      Decode(3, 24, 4, 128, 32, 800, 90, 77, 1),     // group 6, window, one split (direct output)
  };
}

std::vector<OpShape> DecodePerfShapes() {
  std::vector<OpShape> shapes;
  for (int64_t context : {512, 8192, 32768}) {
    for (int64_t batch : {1, 8}) shapes.push_back(Decode(batch, 32, 8, 128, 16, context, 0, 0, 0));
  }
  return shapes;
}

std::vector<OpShape> PrefillCheckShapes() {
  //        batch tokens hq hkv d  bs  ctx shortest window
  return {
      Attn(1, 77, 4, 4, 64, 16, 77, 0, 0, 0),       // one whole prompt
      Attn(3, 150, 8, 2, 128, 16, 300, 200, 0, 0),  // chunks after cached context
      Attn(1, 100, 8, 1, 128, 32, 150, 0, 48, 0),   // sliding window, chunked
      Attn(4, 4, 32, 8, 128, 16, 500, 1, 0, 0),     // q_len 1 (decode through prefill)
      Attn(3, 15, 16, 2, 64, 32, 600, 300, 0, 0),   // 5-token verification
      Attn(2, 130, 4, 2, 256, 16, 130, 70, 0, 0),   // head_dim 256
      Attn(2, 200, 8, 8, 64, 64, 333, 120, 70, 0),  // block 64, window
      Attn(1, 257, 32, 4, 128, 16, 1000, 0, 0, 0),  // several q tiles, group 8
      Attn(2, 90, 8, 2, 256, 32, 90, 60, 33, 0),    // head_dim 256, window
      Attn(2, 96, 4, 2, 16, 16, 150, 80, 0, 0),     // head_dim 16 (tiny test models), chunks
      Attn(2, 10, 4, 2, 16, 16, 40, 9, 0, 0),       // head_dim 16, 5-token verification
      Attn(3, 33, 4, 2, 32, 16, 200, 120, 0, 0),    // head_dim 32, chunks after context
      Attn(1, 70, 4, 2, 32, 16, 70, 0, 20, 0),      // head_dim 32, whole prompt, window
      // Short query runs (max q_len <= kMaxVerifyQueryLen): the split-KV verification kernel,
      // the last column a forced split count (0: PagedPrefillAttention's choice).
      //   batch tokens hq hkv d  bs  ctx shortest window splits
      Attn(1, 8, 32, 8, 128, 16, 3000, 0, 0, 0),       // K+1 = 8, Llama-3 8B heads (32 rows)
      Attn(2, 16, 32, 8, 128, 16, 4100, 2500, 0, 13),  // 8B heads, 13 splits
      Attn(4, 32, 32, 8, 128, 16, 3000, 1, 0, 0),      // ragged q_lens 8, 8, 8, 1
      Attn(3, 48, 16, 2, 128, 32, 2000, 700, 0, 7),    // group 8, q_len 16: two 64-row tiles
      Attn(2, 6, 8, 8, 64, 16, 1500, 900, 0, 5),       // MHA, q_len 3 (one warp)
      Attn(3, 12, 32, 8, 64, 16, 2000, 1000, 300, 4),  // head_dim 64, window, q_len 4
      Attn(2, 20, 8, 2, 128, 64, 2600, 1200, 500, 0),  // block 64, window, q_len 10 (40 rows)
      Attn(1, 2, 8, 1, 256, 16, 1200, 0, 0, 0),       // head_dim 256, MQA, q_len 2 (prefill kernel)
      Attn(2, 14, 4, 2, 16, 16, 700, 300, 0, 3),      // head_dim 16, q_len 7
      Attn(2, 9, 4, 2, 32, 16, 800, 100, 40, 2),      // head_dim 32, window, q_lens 5, 4
      Attn(5, 40, 32, 8, 128, 16, 33, 9, 0, 24),      // short contexts: empty splits
      Attn(1, 16, 32, 8, 128, 16, 8192, 0, 0, 0),     // q_len 16 over 8K keys (64 rows)
      Attn(8, 64, 32, 8, 128, 16, 4096, 2000, 0, 0),  // batch 8, K+1 = 8
      Attn(3, 21, 32, 4, 128, 16, 3000, 1500, 1000, 0),  // group 8, window, q_len 7
  };
}

// paged_tree_attention: every sequence's queries a tree (no window). The last column forces a
// verification split count as for prefill (0: PagedPrefillAttention's choice).
std::vector<OpShape> TreeCheckShapes() {
  //        batch tokens hq hkv d  bs  ctx shortest window splits
  return {
      Attn(1, 8, 32, 8, 128, 16, 3000, 0, 0, 0),     // an 8-node tree, Llama-3 8B heads
      Attn(3, 48, 32, 8, 128, 16, 2000, 700, 0, 5),  // 16-node trees, 5 splits
      Attn(2, 10, 8, 8, 64, 16, 1500, 900, 0, 1),    // MHA, one split (direct output)
      Attn(2, 66, 32, 8, 128, 16, 1200, 500, 0, 0),  // 33-node trees (prefill kernel)
      Attn(1, 65, 8, 2, 64, 32, 900, 0, 0, 0),       // 65 nodes: two mask words
      Attn(2, 40, 8, 4, 256, 16, 600, 300, 0, 0),    // head_dim 256 (prefill kernel)
      Attn(2, 12, 4, 2, 16, 16, 300, 100, 0, 0),     // head_dim 16 (tiny test models)
  };
}

// The prefill perf shapes a tree fits (up to 1024 nodes), for a direct comparison.
std::vector<OpShape> TreePerfShapes() {
  return {Attn(1, 512, 32, 8, 128, 16, 8192, 0, 0, 0),   // a 512-node tree at 8K context
          Attn(8, 40, 32, 8, 128, 16, 4096, 0, 0, 0),    // 5-node trees, batch 8
          Attn(1, 8, 32, 8, 128, 16, 32768, 0, 0, 0),    // an 8-node tree over 32K keys
          Attn(8, 64, 32, 8, 128, 16, 32768, 0, 0, 0)};  // the same, batch 8
}

// The Vegas stages: K + 1 = 7 queries per sequence (K 6), Llama-3.1-8B heads, no window.
std::vector<OpShape> VegasCheckShapes() {
  //        batch tokens hq hkv d  bs  ctx shortest window splits
  return {Attn(2, 14, 32, 8, 128, 16, 3000, 1200, 0, 0),  // the chosen split count
          Attn(3, 12, 8, 2, 64, 16, 700, 300, 0, 5),      // 5 splits, head_dim 64
          Attn(1, 1, 8, 8, 128, 16, 400, 0, 0, 1)};       // one query: both rows the same
}

std::vector<OpShape> VegasPerfShapes() {
  return {Attn(1, 7, 32, 8, 128, 16, 32768, 0, 0, 0),      // batch 1 at 32K
          Attn(8, 56, 32, 8, 128, 16, 32768, 0, 0, 0),     // batch 8 at 32K
          Attn(16, 112, 32, 8, 128, 16, 16384, 0, 0, 0),   // batch 16 at 16K
          Attn(16, 112, 32, 8, 128, 16, 32768, 0, 0, 0)};  // batch 16 at 32K
}

std::vector<OpShape> PrefillPerfShapes() {
  return {Attn(1, 4096, 32, 8, 128, 16, 4096, 0, 0, 0),  // 4K prompt, Llama-3 8B heads
          Attn(1, 512, 32, 8, 128, 16, 8192, 0, 0, 0),   // 512-token chunk at 8K context
          Attn(8, 40, 32, 8, 128, 16, 4096, 0, 0, 0),    // 5-token verification, batch 8
          Attn(1, 8, 32, 8, 128, 16, 32768, 0, 0, 0),    // K+1 = 8 over 32K keys
          Attn(8, 64, 32, 8, 128, 16, 32768, 0, 0, 0)};  // the same, batch 8
}

}  // namespace

void AddAttentionOps(std::vector<OpSpec>* table) {
  table->push_back(
      {"write_kv_cache",
       {WriteKv(1, 4, 4, 64, 16, 0), WriteKv(37, 32, 8, 128, 16, 0), WriteKv(100, 8, 2, 256, 32, 0),
        WriteKv(19, 4, 1, 64, 64, 1), WriteKv(5, 4, 2, 16, 16, 0), WriteKv(7, 4, 2, 32, 16, 1)},
       {WriteKv(1, 32, 8, 128, 16, 0), WriteKv(256, 32, 8, 128, 16, 0),
        WriteKv(4096, 32, 8, 128, 16, 0)},
       [](const OpShape& s) { return std::make_unique<WriteKvCacheCase>(s); }});
  table->push_back({"paged_decode_attention", DecodeCheckShapes(), DecodePerfShapes(),
                    [](const OpShape& s) { return std::make_unique<PagedDecodeCase>(s); }});
  table->push_back({"paged_prefill_attention", PrefillCheckShapes(), PrefillPerfShapes(),
                    [](const OpShape& s) { return std::make_unique<PagedPrefillCase>(s); }});
  table->push_back({"paged_tree_attention", TreeCheckShapes(), TreePerfShapes(),
                    [](const OpShape& s) { return std::make_unique<PagedPrefillCase>(s, true); }});
  const std::pair<const char*, VegasStage> vegas[] = {{"vegas_verify", VegasStage::kVerify},
                                                      {"vegas_verify_scores", VegasStage::kScores},
                                                      {"vegas_verify_select", VegasStage::kSelect}};
  for (const auto& [name, stage] : vegas) {
    table->push_back({name, VegasCheckShapes(), VegasPerfShapes(), [stage](const OpShape& s) {
                        return std::make_unique<PagedPrefillCase>(s, false, stage);
                      }});
  }
}

}  // namespace specd::kernels::check
