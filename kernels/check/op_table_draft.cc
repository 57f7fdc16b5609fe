// Draft-vocabulary ops of the table: "map_ids" (an EAGLE-3 head's draft ids to target ids) and
// "expand_columns" (its [rows, dv] rows written out over the target vocabulary), against
// kernels/ref/draft_vocab.h. Both are copies, so every output is compared bit for bit; the whole
// destination is compared, so row padding must come back still poisoned. The map and the columns
// are a random set of distinct target ids, ascending as a checkpoint's d2t (or shuffled).
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "kernels/check/op_families.h"
#include "kernels/cuda/draft_vocab.h"
#include "kernels/ref/bf16.h"
#include "kernels/ref/draft_vocab.h"

namespace specd::kernels::check {
namespace {

// What a draft-vocabulary case needs beyond OpShape; looked up by the shape's label.
struct DraftParams {
  int64_t num_rows = 0;      // expand_columns: rows; map_ids: ids
  int32_t draft_vocab = 0;   // dv: source columns, or the map's size
  int32_t target_vocab = 0;  // destination columns; the range of the map's target ids
  int64_t src_pad = 0;       // expand_columns: src stride - dv
  int64_t dst_pad = 0;       // expand_columns: dst stride - target vocab; odd forces scalar stores
  bool shuffled = false;     // columns / map in random rather than ascending order
  bool zero_fill = false;    // expand_columns: fill 0 (probabilities) instead of -inf (logits)
  bool in_place = false;     // map_ids: out = ids
};

int64_t SrcStride(const DraftParams& p) { return p.draft_vocab + p.src_pad; }
int64_t DstStride(const DraftParams& p) { return p.target_vocab + p.dst_pad; }

std::mt19937_64 RngFor(const DraftParams& p, uint64_t salt) {
  return std::mt19937_64(0xd4a7ULL ^ (salt * 1000003ULL) ^
                         static_cast<uint64_t>(p.num_rows * 7919 + p.draft_vocab * 31 +
                                               p.target_vocab + p.dst_pad * 17 + p.src_pad * 5));
}

ErrorCheck CountCheck(std::string name, int64_t failures) {
  ErrorCheck check;
  check.output = std::move(name);
  check.kernel_error = static_cast<double>(failures);
  check.passed = failures == 0;
  return check;
}

template <typename T>
ErrorCheck ExactBits(std::string name, const std::vector<T>& kernel, const std::vector<T>& ref) {
  int64_t failures = kernel.size() == ref.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(kernel.size(), ref.size()); ++i) {
    if (std::memcmp(&kernel[i], &ref[i], sizeof(T)) != 0) ++failures;
  }
  return CountCheck(std::move(name), failures);
}

// p.draft_vocab distinct ids of [0, p.target_vocab): the draft vocabulary's target ids.
std::vector<int32_t> DraftToTarget(const DraftParams& p, std::mt19937_64& rng) {
  std::vector<int32_t> ids(p.target_vocab);
  std::iota(ids.begin(), ids.end(), 0);
  for (int32_t i = 0; i < p.draft_vocab; ++i) {  // a partial Fisher-Yates shuffle
    std::uniform_int_distribution<int32_t> pick(i, p.target_vocab - 1);
    std::swap(ids[i], ids[pick(rng)]);
  }
  ids.resize(p.draft_vocab);
  if (!p.shuffled) std::sort(ids.begin(), ids.end());
  return ids;
}

// Ids in [-3, dv + 3): mostly draft ids, some negative ("no draw") or past the map.
class MapIdsCase : public OpCase {
 public:
  explicit MapIdsCase(const DraftParams& p)
      : p_(p),
        ids_(p.num_rows * sizeof(int32_t)),
        map_(p.draft_vocab * sizeof(int32_t)),
        out_(p.in_place ? 0 : p.num_rows * sizeof(int32_t)) {
    std::mt19937_64 rng = RngFor(p, 1);
    host_map_ = DraftToTarget(p, rng);
    std::uniform_int_distribution<int32_t> id(-3, p.draft_vocab + 2);
    host_ids_.resize(p.num_rows);
    for (int32_t& x : host_ids_) x = id(rng);
    if (p.num_rows > 1) host_ids_[1] = p.draft_vocab - 1;  // the map's last entry
    ids_.Upload(host_ids_);
    map_.Upload(host_map_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    int32_t* out = p_.in_place ? ids_.as<int32_t>() : out_.as<int32_t>();
    return MapIds(ids_.as<int32_t>(), static_cast<int32_t>(p_.num_rows), map_.as<int32_t>(),
                  p_.draft_vocab, out, stream);
  }

  // Each id read, its map entry read, the target id written.
  int64_t BytesMoved() const override {
    return 3 * p_.num_rows * static_cast<int64_t>(sizeof(int32_t));
  }

  std::vector<ErrorCheck> Check() override {
    ids_.Upload(host_ids_);  // in place, the last launch overwrote them
    out_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> expected(p_.num_rows);
    ref::MapIds(host_ids_.data(), static_cast<int32_t>(p_.num_rows), host_map_.data(),
                p_.draft_vocab, expected.data());
    const DeviceBuffer& out = p_.in_place ? ids_ : out_;
    std::vector<ErrorCheck> checks = {ExactBits("ids", out.Download<int32_t>(), expected)};
    if (!p_.in_place) checks.push_back(ExactBits("in", ids_.Download<int32_t>(), host_ids_));
    return checks;
  }

 private:
  DraftParams p_;
  std::vector<int32_t> host_ids_, host_map_;
  DeviceBuffer ids_;  // [n] int32; the output too when in place
  DeviceBuffer map_;  // [dv] int32
  DeviceBuffer out_;  // [n] int32 out of place, else empty
};

// Rows of bf16-valued logits in [-8, 8) with a -inf, a NaN and a -0 in some rows (copied as bits);
// src padding holds a value that would show up if read.
class ExpandColumnsCase : public OpCase {
 public:
  static constexpr float kSrcPad = 1e30f;

  explicit ExpandColumnsCase(const DraftParams& p)
      : p_(p),
        src_(p.num_rows * SrcStride(p) * sizeof(float)),
        cols_(p.draft_vocab * sizeof(int32_t)),
        dst_(p.num_rows * DstStride(p) * sizeof(float)) {
    std::mt19937_64 rng = RngFor(p, 2);
    host_cols_ = DraftToTarget(p, rng);
    host_src_.assign(p.num_rows * SrcStride(p), kSrcPad);
    std::uniform_real_distribution<float> value(-8.0f, 8.0f);
    std::uniform_int_distribution<int32_t> col(0, p.draft_vocab - 1);
    for (int64_t r = 0; r < p.num_rows; ++r) {
      float* row = host_src_.data() + r * SrcStride(p);
      for (int32_t c = 0; c < p.draft_vocab; ++c) row[c] = kernels::RoundToBf16(value(rng));
      if (r % 3 == 1) {
        row[col(rng)] = -std::numeric_limits<float>::infinity();
        row[col(rng)] = std::numeric_limits<float>::quiet_NaN();
        row[col(rng)] = -0.0f;
      }
    }
    src_.Upload(host_src_);
    cols_.Upload(host_cols_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return ExpandColumns(src_.as<float>(), SrcStride(p_), static_cast<int32_t>(p_.num_rows),
                         p_.draft_vocab, cols_.as<int32_t>(), dst_.as<float>(), DstStride(p_),
                         p_.target_vocab, Fill(), stream);
  }

  // Each source row read and each destination row written once, the columns once.
  int64_t BytesMoved() const override {
    const auto f = static_cast<int64_t>(sizeof(float));
    return p_.num_rows * (p_.draft_vocab + p_.target_vocab) * f + p_.draft_vocab * f;
  }

  std::vector<ErrorCheck> Check() override {
    dst_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> expected(dst_.bytes() / sizeof(float));
    std::memset(expected.data(), 0xff, dst_.bytes());  // padding stays poisoned
    ref::ExpandColumns(host_src_.data(), SrcStride(p_), static_cast<int32_t>(p_.num_rows),
                       p_.draft_vocab, host_cols_.data(), expected.data(), DstStride(p_),
                       p_.target_vocab, Fill());
    return {ExactBits("dst", dst_.Download<float>(), expected)};
  }

 private:
  float Fill() const { return p_.zero_fill ? 0.0f : -std::numeric_limits<float>::infinity(); }

  DraftParams p_;
  std::vector<float> host_src_;
  std::vector<int32_t> host_cols_;
  DeviceBuffer src_;   // [num_rows, dv + src_pad] f32
  DeviceBuffer cols_;  // [dv] int32
  DeviceBuffer dst_;   // [num_rows, target vocab + dst_pad] f32
};

// The test name is op_numtokens x width: keep (num_rows, target vocab) unique per op.
OpShape ShapeOf(const DraftParams& p) {
  OpShape s;
  s.num_tokens = p.num_rows;
  s.width = p.target_vocab;
  s.vocab = p.target_vocab;
  s.label = std::to_string(p.num_rows) + "x" + std::to_string(p.target_vocab) +
            " dv=" + std::to_string(p.draft_vocab) +
            (p.src_pad > 0 ? " src_pad=" + std::to_string(p.src_pad) : "") +
            (p.dst_pad > 0 ? " dst_pad=" + std::to_string(p.dst_pad) : "") +
            (p.shuffled ? " shuffled" : "") + (p.zero_fill ? " fill=0" : "") +
            (p.in_place ? " in-place" : "");
  return s;
}

OpSpec MakeSpec(std::string name, const std::vector<DraftParams>& check,
                const std::vector<DraftParams>& perf,
                std::function<std::unique_ptr<OpCase>(const DraftParams&)> make) {
  return MakeLabelledSpec<DraftParams>(std::move(name), check, perf, ShapeOf, std::move(make));
}

}  // namespace

void AddDraftOps(std::vector<OpSpec>* table) {
  // {ids, dv, target vocab, -, -, shuffled, -, in_place}
  table->push_back(MakeSpec("map_ids",
                            {{1, 32000, 128256},
                             {7, 32000, 128256, 0, 0, true},
                             {1024, 32000, 128256},
                             {257, 5, 11, 0, 0, true},
                             {64, 32000, 151936, 0, 0, false, false, true},
                             {1000, 1, 3, 0, 0, false, false, true}},
                            {{64, 32000, 128256}, {1024, 32000, 128256}},
                            [](const DraftParams& p) { return std::make_unique<MapIdsCase>(p); }));
  // {rows, dv, target vocab, src_pad, dst_pad, shuffled, zero_fill}: model-sized (Llama 3's
  // 128256 and Qwen's 151936 target vocabularies, EAGLE-3's usual 32000 draft one; on a 132-SM
  // GPU rows cut into 31, 8, 3 (the stage's limit: two waves) and 18 chunks); odd sizes and
  // strides for the scalar stores, rows cut with odd tails (20001 columns in 4 chunks, 12289 in
  // 3), every column covered (no fill), a single column, and more rows than SMs (one chunk each).
  table->push_back(
      MakeSpec("expand_columns",
               {{1, 32000, 128256},
                {16, 32000, 128256},
                {64, 32000, 128256, 0, 0, true},
                {4, 4096, 8192},
                {7, 32000, 151936, 0, 4, false, true},
                {3, 5000, 20001, 3, 2, true},
                {2, 4096, 12289, 0, 3, true, true},
                {5, 7, 13, 1, 0, true},
                {9, 13, 13, 0, 0, true},
                {1, 1, 1},
                {130, 100, 1001, 0, 1, true}},
               {{1, 32000, 128256},
                {16, 32000, 128256},
                {64, 32000, 128256},
                {256, 32000, 128256},
                {64, 32000, 151936},
                {64, 4096, 8192}},
               [](const DraftParams& p) { return std::make_unique<ExpandColumnsCase>(p); }));
}

}  // namespace specd::kernels::check
