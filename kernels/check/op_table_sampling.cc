// Sampling ops of the table: "argmax", "top_k_rows", "log_softmax_at", "penalties", "sample",
// "processed_probs", "scatter_rows" and "saguaro_downweight", against kernels/ref/sampling.h. Ids
// and copies are compared exactly. "sample" draws with the same Philox uniforms as the reference
// (checked bit for bit as the "uniforms" output), so its ids must equal the reference's except
// where the fp32 kernel and the fp64 reference may legitimately round differently: a draw within
// kCdfEps of a CDF boundary (the kernel's token must then be a kept neighbour whose interval lies
// that close), or a filter decision within kFilterMargin of its threshold. Such rows are counted as
// "baseline" (tolerated) mismatches; any other mismatch fails. "processed_probs" is judged the same
// way: a row with a filter decision within kFilterMargin of its threshold is tolerated; elsewhere
// greedy rows must match exactly, the reference's zeros must be exact zeros and every probability
// must lie within kProbTolerance of the fp64 one. "saguaro_downweight" (fp64 sums in another order
// than the reference's) must give every entry within kProbTolerance of it, and the rows it leaves
// alone bit for bit.
#include <algorithm>
#include <array>
#include <cmath>
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
#include "kernels/cuda/sampling.h"
#include "kernels/ref/bf16.h"
#include "kernels/ref/sampling.h"

namespace specd::kernels::check {
namespace {

constexpr double kCdfEps = 2e-5;         // relative to the kept mass
constexpr double kFilterMargin = 2e-5;   // ref::FilteredRow::filter_margin below this: ambiguous
constexpr double kProbTolerance = 1e-6;  // processed_probs, absolute
constexpr float kPadValue = 1e30f;       // row padding: would win every argmax if read

// What a sampling case needs beyond OpShape; looked up by the shape's label.
struct SamplingParams {
  int64_t num_rows = 0;
  int32_t vocab = 0;
  int64_t pad = 0;             // row stride = vocab + pad; odd values force scalar loads
  int32_t max_prompt_len = 0;  // penalties
  int32_t max_output_len = 0;  // penalties
  int32_t k = 0;               // top_k_rows
  int64_t out_pad = 0;         // processed_probs (out of place), scatter_rows: out stride - vocab
  bool in_place = false;       // processed_probs: out = logits
};

int64_t Stride(const SamplingParams& p) { return p.vocab + p.pad; }
int64_t OutStride(const SamplingParams& p) { return p.in_place ? Stride(p) : p.vocab + p.out_pad; }

std::mt19937_64 RngFor(const SamplingParams& p, uint64_t salt) {
  return std::mt19937_64(0x5a3bULL ^ (salt * 1000003ULL) ^
                         static_cast<uint64_t>(p.num_rows * 7919 + p.vocab * 31 + p.pad));
}

ErrorCheck CountCheck(std::string name, int64_t failures, int64_t tolerated) {
  ErrorCheck check;
  check.output = std::move(name);
  check.kernel_error = static_cast<double>(failures);
  check.baseline_error = static_cast<double>(tolerated);
  check.tolerance = 0;
  check.passed = failures == 0;
  return check;
}

template <typename T>
ErrorCheck ExactBits(std::string name, const std::vector<T>& kernel, const std::vector<T>& ref) {
  int64_t failures = kernel.size() == ref.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(kernel.size(), ref.size()); ++i) {
    if (std::memcmp(&kernel[i], &ref[i], sizeof(T)) != 0) ++failures;
  }
  return CountCheck(std::move(name), failures, 0);
}

// Rows of logits in three styles (row % 3): bf16-valued uniform; peaked (a few tokens far above
// a uniform floor); a coarse 0.5 grid full of ties, with the maximum tied at two places. Some
// rows carry a NaN and -inf (banned) tokens. Padding holds kPadValue.
std::vector<float> MakeLogits(const SamplingParams& p, std::mt19937_64& rng) {
  const int64_t stride = Stride(p);
  std::vector<float> logits(p.num_rows * stride, kPadValue);
  std::uniform_real_distribution<float> uniform(-6.0f, 6.0f);
  std::uniform_int_distribution<int32_t> token(0, p.vocab - 1);
  for (int64_t r = 0; r < p.num_rows; ++r) {
    float* row = logits.data() + r * stride;
    for (int32_t i = 0; i < p.vocab; ++i) {
      const float u = uniform(rng);
      switch (r % 3) {
        case 0:
          row[i] = kernels::RoundToBf16(u);
          break;
        case 1:
          row[i] = kernels::RoundToBf16(u * 0.6f);
          break;
        default:
          row[i] = std::round(u * 2.0f) / 2.0f;
      }
    }
    if (r % 3 == 1) {
      for (int j = 0; j < 16; ++j)
        row[token(rng)] = kernels::RoundToBf16(6.0f + uniform(rng) / 1.5f);
    }
    if (r % 3 == 2) {
      row[token(rng)] = 7.0f;
      row[token(rng)] = 7.0f;
    }
    if (r % 4 == 3 && p.vocab > 8) {
      row[token(rng)] = std::numeric_limits<float>::quiet_NaN();
      for (int j = 0; j < 4; ++j) row[token(rng)] = -std::numeric_limits<float>::infinity();
    }
  }
  return logits;
}

std::vector<double> Widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

class ArgmaxCase : public OpCase {
 public:
  explicit ArgmaxCase(const SamplingParams& p)
      : p_(p), logits_(p.num_rows * Stride(p) * sizeof(float)), ids_(p.num_rows * sizeof(int32_t)) {
    std::mt19937_64 rng = RngFor(p, 1);
    host_logits_ = MakeLogits(p, rng);
    logits_.Upload(host_logits_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return ArgmaxRows(logits_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                      ids_.as<int32_t>(), stream);
  }

  int64_t BytesMoved() const override {
    return p_.num_rows * (p_.vocab * static_cast<int64_t>(sizeof(float)) + 4);
  }

  std::vector<ErrorCheck> Check() override {
    ids_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> expected(p_.num_rows);
    ref::ArgmaxRows(host_logits_.data(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                    expected.data());
    return {ExactBits("ids", ids_.Download<int32_t>(), expected)};
  }

 private:
  SamplingParams p_;
  std::vector<float> host_logits_;
  DeviceBuffer logits_;  // [num_rows, stride] f32
  DeviceBuffer ids_;     // [num_rows] int32
};

class TopKCase : public OpCase {
 public:
  explicit TopKCase(const SamplingParams& p)
      : p_(p),
        logits_(p.num_rows * Stride(p) * sizeof(float)),
        ids_(p.num_rows * p.k * sizeof(int32_t)),
        workspace_(TopKWorkspaceBytes(static_cast<int32_t>(p.num_rows), p.vocab, p.k)) {
    std::mt19937_64 rng = RngFor(p, 4);
    host_logits_ = MakeLogits(p, rng);
    logits_.Upload(host_logits_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return TopKRows(logits_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                    p_.k, ids_.as<int32_t>(), workspace_.as<void>(), workspace_.bytes(), stream);
  }

  // Every logit read once, k ids written (the chunk candidates stay in L2).
  int64_t BytesMoved() const override {
    return p_.num_rows * (p_.vocab + p_.k) * static_cast<int64_t>(sizeof(float));
  }

  std::vector<ErrorCheck> Check() override {
    ids_.Poison();
    workspace_.Poison();  // the kernel must not depend on the workspace's contents
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> expected(p_.num_rows * p_.k);
    ref::TopKRows(host_logits_.data(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                  p_.k, expected.data());
    return {ExactBits("ids", ids_.Download<int32_t>(), expected)};
  }

 private:
  SamplingParams p_;
  std::vector<float> host_logits_;
  DeviceBuffer logits_;     // [num_rows, stride] f32
  DeviceBuffer ids_;        // [num_rows, k] int32
  DeviceBuffer workspace_;  // TopKWorkspaceBytes
};

// The tree drafters' child scores: ids from the reference's top-k (the kernel's inputs), values
// within kLogSoftmaxTolerance of the fp64 log-softmax (fp32 sums of __expf over up to 152K
// logits), -inf exactly where the reference has it.
constexpr double kLogSoftmaxTolerance = 1e-4;

class LogSoftmaxAtCase : public OpCase {
 public:
  explicit LogSoftmaxAtCase(const SamplingParams& p)
      : p_(p),
        logits_(p.num_rows * Stride(p) * sizeof(float)),
        ids_(p.num_rows * p.k * sizeof(int32_t)),
        out_(p.num_rows * p.k * sizeof(float)) {
    std::mt19937_64 rng = RngFor(p, 7);
    host_logits_ = MakeLogits(p, rng);
    logits_.Upload(host_logits_);
    host_ids_.resize(p.num_rows * p.k);
    ref::TopKRows(host_logits_.data(), Stride(p), static_cast<int32_t>(p.num_rows), p.vocab, p.k,
                  host_ids_.data());
    if (p.num_rows > 1) host_ids_[p.k] = p.vocab;  // an id outside the row: -inf
    ids_.Upload(host_ids_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return LogSoftmaxAt(logits_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows),
                        p_.vocab, ids_.as<int32_t>(), p_.k, out_.as<float>(), stream);
  }

  // Every logit read twice (the second pass from L2 at these sizes), k values written.
  int64_t BytesMoved() const override {
    return p_.num_rows * (p_.vocab + 2 * p_.k) * static_cast<int64_t>(sizeof(float));
  }

  std::vector<ErrorCheck> Check() override {
    out_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<double> wide = Widen(host_logits_);
    std::vector<double> expected(p_.num_rows * p_.k);
    ref::LogSoftmaxAt(wide.data(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                      host_ids_.data(), p_.k, expected.data());
    const std::vector<float> got = out_.Download<float>();
    int64_t failures = got.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
      const bool both_inf = std::isinf(expected[i]) && got[i] == expected[i];
      if (!both_inf && !(std::abs(got[i] - expected[i]) <= kLogSoftmaxTolerance)) ++failures;
    }
    return {CountCheck("log_softmax", failures, 0)};
  }

 private:
  SamplingParams p_;
  std::vector<float> host_logits_;
  std::vector<int32_t> host_ids_;
  DeviceBuffer logits_;  // [num_rows, stride] f32
  DeviceBuffer ids_;     // [num_rows, k] int32
  DeviceBuffer out_;     // [num_rows, k] f32
};

class PenaltiesCase : public OpCase {
 public:
  explicit PenaltiesCase(const SamplingParams& p)
      : p_(p),
        logits_(p.num_rows * Stride(p) * sizeof(float)),
        workspace_(PenaltyWorkspaceBytes(static_cast<int32_t>(p.num_rows), p.vocab)) {
    std::mt19937_64 rng = RngFor(p, 2);
    host_logits_.assign(p.num_rows * Stride(p), kPadValue);
    std::uniform_real_distribution<float> value(-8.0f, 8.0f);
    for (int64_t r = 0; r < p.num_rows; ++r) {
      for (int32_t i = 0; i < p.vocab; ++i) host_logits_[r * Stride(p) + i] = value(rng);
    }
    // Ids from a narrow range so duplicates abound, plus a few outside [0, vocab).
    const int32_t id_range = std::min(p.vocab, 3000);
    std::uniform_int_distribution<int32_t> id(0, id_range - 1);
    std::uniform_int_distribution<int32_t> prompt_len(0, p.max_prompt_len);
    std::uniform_int_distribution<int32_t> output_len(0, p.max_output_len);
    auto fill = [&](int32_t len, std::vector<int32_t>* ids) {
      for (int32_t j = 0; j < len; ++j) {
        const int32_t kind = static_cast<int32_t>(rng() % 97);
        ids->push_back(kind == 0 ? -1 : (kind == 1 ? p.vocab : id(rng)));
      }
    };
    prompt_offsets_.push_back(0);
    output_offsets_.push_back(0);
    const float table[][3] = {{1.0f, 0.0f, 0.0f}, {1.3f, 0.0f, 0.0f},  {1.0f, 0.5f, 0.2f},
                              {1.2f, 0.4f, 0.1f}, {0.8f, -0.5f, 0.0f}, {2.0f, 0.0f, 1.0f}};
    for (int64_t r = 0; r < p.num_rows; ++r) {
      fill(prompt_len(rng), &prompt_ids_);
      fill(output_len(rng), &output_ids_);
      prompt_offsets_.push_back(static_cast<int32_t>(prompt_ids_.size()));
      output_offsets_.push_back(static_cast<int32_t>(output_ids_.size()));
      penalties_.insert(penalties_.end(), table[r % 6], table[r % 6] + 3);
    }
    prompt_ids_dev_ = Upload(prompt_ids_);
    output_ids_dev_ = Upload(output_ids_);
    prompt_offsets_dev_ = Upload(prompt_offsets_);
    output_offsets_dev_ = Upload(output_offsets_);
    penalties_dev_ = Upload(penalties_);
    logits_.Upload(host_logits_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return ApplyPenalties(logits_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows),
                          p_.vocab, prompt_ids_dev_->as<int32_t>(),
                          prompt_offsets_dev_->as<int32_t>(), output_ids_dev_->as<int32_t>(),
                          output_offsets_dev_->as<int32_t>(), penalties_dev_->as<float>(),
                          workspace_.as<void>(), workspace_.bytes(), stream);
  }

  // Every listed id is read (and its count touched) a few times; logits of listed tokens change.
  int64_t BytesMoved() const override {
    const int64_t ids = static_cast<int64_t>(prompt_ids_.size() + output_ids_.size());
    return ids * 4 * static_cast<int64_t>(sizeof(int32_t)) + p_.num_rows * 40;
  }

  std::vector<ErrorCheck> Check() override {
    logits_.Upload(host_logits_);
    workspace_.Poison();  // the kernel must not depend on the workspace's contents
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> ref32 = host_logits_;
    std::vector<double> ref64 = Widen(host_logits_);
    const auto n = static_cast<int32_t>(p_.num_rows);
    ref::ApplyPenalties(ref32.data(), Stride(p_), n, p_.vocab, prompt_ids_.data(),
                        prompt_offsets_.data(), output_ids_.data(), output_offsets_.data(),
                        penalties_.data());
    ref::ApplyPenalties(ref64.data(), Stride(p_), n, p_.vocab, prompt_ids_.data(),
                        prompt_offsets_.data(), output_ids_.data(), output_offsets_.data(),
                        penalties_.data());
    const std::vector<float> kernel = logits_.Download<float>();
    return {CompareWithReference("logits", Widen(kernel), Widen(ref32), ref64),
            ExactBits("logits_vs_fp32_ref", kernel, ref32)};
  }

 private:
  template <typename T>
  static std::unique_ptr<DeviceBuffer> Upload(const std::vector<T>& v) {
    auto buffer = std::make_unique<DeviceBuffer>(v.size() * sizeof(T));
    if (!v.empty()) buffer->Upload(v);
    return buffer;
  }

  SamplingParams p_;
  std::vector<float> host_logits_, penalties_;
  std::vector<int32_t> prompt_ids_, output_ids_, prompt_offsets_, output_offsets_;
  DeviceBuffer logits_;     // [num_rows, stride] f32, in/out
  DeviceBuffer workspace_;  // PenaltyWorkspaceBytes
  std::unique_ptr<DeviceBuffer> prompt_ids_dev_, output_ids_dev_, prompt_offsets_dev_,
      output_offsets_dev_, penalties_dev_;
};

// One parameter set per row, cycling: greedy, temperature only, each filter alone, all three,
// and the edge cases (top-k 1, a tiny top-p, top-k past the vocabulary, min-p above 1).
SamplingRow RowParams(int64_t r, std::mt19937_64& rng) {
  struct Filters {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  const Filters table[] = {
      {0.0f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 0.0f},   {0.7f, 50, 1.0f, 0.0f},
      {1.0f, 0, 0.9f, 0.0f},  {0.8f, 0, 1.0f, 0.05f},  {1.2f, 200, 0.95f, 0.01f},
      {1.0f, 1, 1.0f, 0.0f},  {1.0f, 0, 0.01f, 0.0f},  {0.5f, 1 << 30, 1.0f, 0.0f},
      {1.0f, 40, 0.5f, 0.0f}, {2.0f, 0, 0.999f, 0.0f}, {1.0f, 0, 1.0f, 1.5f},
  };
  const Filters& f = table[r % 12];
  return SamplingRow{f.temperature, f.top_k, f.top_p, f.min_p, rng(), rng() % 100000};
}

ref::SampleParams RefParams(const SamplingRow& row) {
  return ref::SampleParams{row.temperature, row.top_k, row.top_p, row.min_p};
}

class SampleCase : public OpCase {
 public:
  explicit SampleCase(const SamplingParams& p)
      : p_(p),
        logits_(p.num_rows * Stride(p) * sizeof(float)),
        rows_(p.num_rows * sizeof(SamplingRow)),
        ids_(p.num_rows * sizeof(int32_t)),
        logprobs_(p.num_rows * sizeof(float)),
        uniforms_(p.num_rows * sizeof(double)),
        workspace_(SampleWorkspaceBytes(static_cast<int32_t>(p.num_rows), p.vocab)) {
    std::mt19937_64 rng = RngFor(p, 3);
    host_logits_ = MakeLogits(p, rng);
    for (int64_t r = 0; r < p.num_rows; ++r) host_rows_.push_back(RowParams(r, rng));
    logits_.Upload(host_logits_);
    rows_.Upload(host_rows_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return SampleRows(logits_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                      rows_.as<SamplingRow>(), ids_.as<int32_t>(), logprobs_.as<float>(),
                      workspace_.as<void>(), workspace_.bytes(), stream);
  }

  int64_t BytesMoved() const override {
    return p_.num_rows * (p_.vocab * static_cast<int64_t>(sizeof(float)) + 40);
  }

  std::vector<ErrorCheck> Check() override {
    ids_.Poison();
    logprobs_.Poison();
    uniforms_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(SampleUniforms(rows_.as<SamplingRow>(), static_cast<int32_t>(p_.num_rows),
                                    uniforms_.as<double>(), nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const auto ids = ids_.Download<int32_t>();
    const auto logprobs = logprobs_.Download<float>();
    std::vector<double> expected_uniforms;
    for (const SamplingRow& row : host_rows_) {
      expected_uniforms.push_back(ref::PhiloxUniform(row.seed, row.offset));
    }
    int64_t failures = 0, tolerated = 0;
    std::vector<double> kernel_lp, baseline_lp, ref_lp;
    for (int64_t r = 0; r < p_.num_rows; ++r) {
      const float* row32 = host_logits_.data() + r * Stride(p_);
      const std::vector<double> row64(row32, row32 + p_.vocab);
      const int verdict = JudgeId(row64, host_rows_[r], expected_uniforms[r], ids[r]);
      failures += verdict < 0 ? 1 : 0;
      tolerated += verdict > 0 ? 1 : 0;
      const int32_t id = ids[r] >= 0 && ids[r] < p_.vocab ? ids[r] : 0;
      kernel_lp.push_back(logprobs[r]);
      baseline_lp.push_back(ref::RawLogprob(row32, p_.vocab, id));
      ref_lp.push_back(ref::RawLogprob(row64.data(), p_.vocab, id));
    }
    return {ExactBits("uniforms", uniforms_.Download<double>(), expected_uniforms),
            CountCheck("ids", failures, tolerated),
            CompareWithReference("logprobs", kernel_lp, baseline_lp, ref_lp)};
  }

 private:
  // 0: the reference's id; 1: a tolerated rounding difference; -1: wrong.
  int JudgeId(const std::vector<double>& row, const SamplingRow& params, double u,
              int32_t id) const {
    const ref::SampleParams ref_params = RefParams(params);
    if (id == ref::SampleRow(row.data(), p_.vocab, ref_params, u)) return 0;
    if (id < 0 || id >= p_.vocab) return -1;
    const double max = *std::max_element(row.begin(), row.end(), [](double a, double b) {
      return (std::isnan(a) ? -INFINITY : a) < (std::isnan(b) ? -INFINITY : b);
    });
    if (!(params.temperature > 0.0f) || !std::isfinite(max)) return -1;  // greedy: exact
    const ref::FilteredRow<double> f = ref::FilterRow(row.data(), p_.vocab, ref_params);
    if (f.filter_margin < kFilterMargin) return 1;
    if (!(f.kept[id] > 0)) return -1;
    double lo = 0;
    for (int32_t i = 0; i < id; ++i) lo += f.kept[i];
    const double hi = lo + f.kept[id], target = u * f.kept_mass;
    const double distance = target < lo ? lo - target : (target >= hi ? target - hi : 0.0);
    return distance <= kCdfEps * f.kept_mass ? 1 : -1;
  }

  SamplingParams p_;
  std::vector<float> host_logits_;
  std::vector<SamplingRow> host_rows_;
  DeviceBuffer logits_;     // [num_rows, stride] f32
  DeviceBuffer rows_;       // [num_rows] SamplingRow
  DeviceBuffer ids_;        // [num_rows] int32
  DeviceBuffer logprobs_;   // [num_rows] f32
  DeviceBuffer uniforms_;   // [num_rows] f64
  DeviceBuffer workspace_;  // SampleWorkspaceBytes
};

// Whether ref::SampleRow takes the argmax (kernels/ref/sampling.h).
bool GreedyRow(const double* row, int32_t vocab, const SamplingRow& params) {
  double max = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i) max = std::isnan(row[i]) ? max : std::max(max, row[i]);
  return !(params.temperature > 0.0f) || !std::isfinite(max);
}

class ProcessedProbsCase : public OpCase {
 public:
  explicit ProcessedProbsCase(const SamplingParams& p)
      : p_(p),
        logits_(p.num_rows * Stride(p) * sizeof(float)),
        rows_(p.num_rows * sizeof(SamplingRow)),
        out_(p.in_place ? 0 : p.num_rows * OutStride(p) * sizeof(float)) {
    std::mt19937_64 rng = RngFor(p, 5);
    host_logits_ = MakeLogits(p, rng);
    for (int64_t r = 0; r < p.num_rows; ++r) host_rows_.push_back(RowParams(r, rng));
    // Edge rows: no token at all (sampled row 4, greedy row 12) -> zeros; +inf (row 10) -> greedy.
    for (int64_t r : {4, 12}) {
      if (r >= p.num_rows) continue;
      float* row = host_logits_.data() + r * Stride(p);
      for (int32_t i = 0; i < p.vocab; ++i) {
        row[i] = i % 3 == 0 ? std::numeric_limits<float>::quiet_NaN() : -INFINITY;
      }
    }
    if (p.num_rows > 10) host_logits_[10 * Stride(p) + p.vocab / 2] = INFINITY;
    logits_.Upload(host_logits_);
    rows_.Upload(host_rows_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    float* out = p_.in_place ? logits_.as<float>() : out_.as<float>();
    return ProcessedProbs(logits_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows),
                          p_.vocab, rows_.as<SamplingRow>(), out, OutStride(p_), stream);
  }

  // The row read once and written once (the kernel reads it up to 9 times).
  int64_t BytesMoved() const override {
    return p_.num_rows * (2 * p_.vocab * static_cast<int64_t>(sizeof(float)) + 32);
  }

  std::vector<ErrorCheck> Check() override {
    logits_.Upload(host_logits_);  // in place, the last launch overwrote them
    out_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> logits = logits_.Download<float>();
    const std::vector<float> out = p_.in_place ? logits : out_.Download<float>();
    const auto n = static_cast<int32_t>(p_.num_rows);
    const int64_t out_stride = OutStride(p_);
    std::vector<ref::SampleParams> params;
    for (const SamplingRow& row : host_rows_) params.push_back(RefParams(row));
    const std::vector<double> logits64 = Widen(host_logits_);
    std::vector<double> ref64(p_.num_rows * p_.vocab);
    std::vector<float> ref32(p_.num_rows * p_.vocab);
    ref::ProcessedProbs(logits64.data(), Stride(p_), n, p_.vocab, params.data(), ref64.data(),
                        p_.vocab);
    ref::ProcessedProbs(host_logits_.data(), Stride(p_), n, p_.vocab, params.data(), ref32.data(),
                        p_.vocab);
    ErrorCheck probs{"probs", 0, 0, kProbTolerance, false};
    int64_t failures = 0, tolerated = 0;
    for (int64_t r = 0; r < p_.num_rows; ++r) {
      const double* row = logits64.data() + r * Stride(p_);
      const bool greedy = GreedyRow(row, p_.vocab, host_rows_[r]);
      if (!greedy && ref::FilterRow(row, p_.vocab, params[r]).filter_margin < kFilterMargin) {
        ++tolerated;
        continue;
      }
      bool wrong = false;
      for (int32_t i = 0; i < p_.vocab; ++i) {
        const double kernel = out[r * out_stride + i], expected = ref64[r * p_.vocab + i];
        const double error = std::isfinite(kernel) ? std::abs(kernel - expected) : INFINITY;
        probs.kernel_error = std::max(probs.kernel_error, error);
        probs.baseline_error =
            std::max(probs.baseline_error, std::abs(ref32[r * p_.vocab + i] - expected));
        wrong |= (greedy || expected == 0) ? kernel != expected : error > kProbTolerance;
      }
      failures += wrong ? 1 : 0;
    }
    probs.passed = probs.kernel_error <= probs.tolerance;
    return {probs, CountCheck("rows", failures, tolerated), Untouched(logits, out)};
  }

 private:
  // Elements the launch must leave alone: the logits out of place, their padding in place, and
  // the output's padding (still poisoned) out of place.
  ErrorCheck Untouched(const std::vector<float>& logits, const std::vector<float>& out) const {
    int64_t changed = 0;
    for (int64_t r = 0; r < p_.num_rows; ++r) {
      for (int64_t i = p_.in_place ? p_.vocab : 0; i < Stride(p_); ++i) {
        const int64_t j = r * Stride(p_) + i;
        changed += std::memcmp(&logits[j], &host_logits_[j], sizeof(float)) != 0 ? 1 : 0;
      }
      for (int64_t i = p_.vocab; !p_.in_place && i < OutStride(p_); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &out[r * OutStride(p_) + i], sizeof(bits));
        changed += bits != 0xffffffffu ? 1 : 0;
      }
    }
    return CountCheck("untouched", changed, 0);
  }

  SamplingParams p_;
  std::vector<float> host_logits_;
  std::vector<SamplingRow> host_rows_;
  DeviceBuffer logits_;  // [num_rows, stride] f32; the output too when in place
  DeviceBuffer rows_;    // [num_rows] SamplingRow
  DeviceBuffer out_;     // [num_rows, vocab + out_pad] f32 out of place, else empty
};

// Rows of MakeLogits scattered to a random distinct subset of 2 * num_rows + 1 destination rows;
// the whole destination (poisoned first) is compared, so untouched rows and padding count too.
class ScatterRowsCase : public OpCase {
 public:
  explicit ScatterRowsCase(const SamplingParams& p)
      : p_(p),
        src_(p.num_rows * Stride(p) * sizeof(float)),
        dst_rows_(p.num_rows * sizeof(int32_t)),
        dst_((2 * p.num_rows + 1) * OutStride(p) * sizeof(float)) {
    std::mt19937_64 rng = RngFor(p, 6);
    host_src_ = MakeLogits(p, rng);
    std::vector<int32_t> slots(2 * p.num_rows + 1);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    host_dst_rows_.assign(slots.begin(), slots.begin() + p.num_rows);
    src_.Upload(host_src_);
    dst_rows_.Upload(host_dst_rows_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return ScatterRows(src_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                       dst_rows_.as<int32_t>(), dst_.as<float>(), OutStride(p_), stream);
  }

  int64_t BytesMoved() const override {
    return p_.num_rows * (2 * p_.vocab * static_cast<int64_t>(sizeof(float)) + 4);
  }

  std::vector<ErrorCheck> Check() override {
    dst_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> expected(dst_.bytes() / sizeof(float));
    std::memset(expected.data(), 0xff, dst_.bytes());
    ref::ScatterRows(host_src_.data(), Stride(p_), static_cast<int32_t>(p_.num_rows), p_.vocab,
                     host_dst_rows_.data(), expected.data(), OutStride(p_));
    return {ExactBits("dst", dst_.Download<float>(), expected)};
  }

 private:
  SamplingParams p_;
  std::vector<float> host_src_;
  std::vector<int32_t> host_dst_rows_;
  DeviceBuffer src_;       // [num_rows, stride] f32
  DeviceBuffer dst_rows_;  // [num_rows] int32
  DeviceBuffer dst_;       // [2 * num_rows + 1, vocab + out_pad] f32
};

// Rows of probabilities (random weights normalised, about a third of them zero) down-weighted at
// their k best ids (ref::TopKRows, some rows with a repeated or out-of-range id), the rows cycling
// through fan-outs {k, 1, 0, k} and C {0.5, 0, 1, 0.25, NaN, -1}; every seventh row puts all its
// mass on its cached ids (with C 0 it must stay unchanged), the last row is all zeros.
class SaguaroDownweightCase : public OpCase {
 public:
  explicit SaguaroDownweightCase(const SamplingParams& p)
      : p_(p),
        probs_(p.num_rows * Stride(p) * sizeof(float)),
        ids_(p.num_rows * p.k * sizeof(int32_t)),
        fan_out_(p.num_rows * sizeof(int32_t)),
        c_(p.num_rows * sizeof(float)) {
    std::mt19937_64 rng = RngFor(p, 7);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    const auto rows = static_cast<int32_t>(p.num_rows);
    host_probs_.assign(p.num_rows * Stride(p), kPadValue);
    host_ids_.assign(p.num_rows * p.k, 0);
    constexpr std::array<float, 6> kC = {0.5f, 0.0f, 1.0f, 0.25f, NAN, -1.0f};
    for (int32_t r = 0; r < rows; ++r) {
      float* row = host_probs_.data() + r * Stride(p);
      double sum = 0;
      for (int32_t v = 0; v < p.vocab; ++v) {
        row[v] = u(rng) < 0.3f ? 0.0f : u(rng);
        sum += row[v];
      }
      if (r == rows - 1 && rows > 1) sum = 0;  // an all-zero row
      for (int32_t v = 0; v < p.vocab; ++v) row[v] = sum > 0 ? static_cast<float>(row[v] / sum) : 0;
      ref::TopKRows(row, Stride(p), 1, p.vocab, p.k, host_ids_.data() + r * p.k);
      if (r % 7 == 6) {  // all the mass on the cached ids
        std::vector<float> kept(p.vocab, 0.0f);
        for (int32_t j = 0; j < p.k; ++j) kept[host_ids_[r * p.k + j]] = 1.0f / p.k;
        std::copy(kept.begin(), kept.end(), row);
      }
      if (r % 5 == 4 && p.k > 1) host_ids_[r * p.k + 1] = host_ids_[r * p.k];  // a repeat
      if (r % 5 == 3) host_ids_[r * p.k] = r % 2 == 0 ? -1 : p.vocab;          // out of range
      const std::array<int32_t, 4> fan = {p.k, 1, 0, p.k};
      host_fan_out_.push_back(fan[r % 4]);
      host_c_.push_back(r % 7 == 6 ? 0.0f : kC[r % kC.size()]);
    }
    ids_.Upload(host_ids_);
    fan_out_.Upload(host_fan_out_);
    c_.Upload(host_c_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return SaguaroDownweightRows(probs_.as<float>(), Stride(p_), static_cast<int32_t>(p_.num_rows),
                                 p_.vocab, ids_.as<int32_t>(), p_.k, fan_out_.as<int32_t>(),
                                 c_.as<float>(), stream);
  }

  int64_t BytesMoved() const override {
    return p_.num_rows * 2 * p_.vocab * static_cast<int64_t>(sizeof(float));
  }

  std::vector<ErrorCheck> Check() override {
    probs_.Upload(host_probs_);
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> expected = host_probs_;
    ref::SaguaroDownweightRows(expected.data(), Stride(p_), static_cast<int32_t>(p_.num_rows),
                               p_.vocab, host_ids_.data(), p_.k, host_fan_out_.data(),
                               host_c_.data());
    const std::vector<float> got = probs_.Download<float>();
    int64_t failures = 0;
    const int64_t stride = Stride(p_);
    for (int64_t r = 0; r < p_.num_rows; ++r) {
      const size_t first = r * stride, bytes = stride * sizeof(float);
      // A row the reference leaves alone (and every row's padding) must stay bit for bit.
      const bool untouched = std::memcmp(&expected[first], &host_probs_[first], bytes) == 0;
      for (int64_t v = 0; v < stride; ++v) {
        const size_t i = first + v;
        const bool exact = std::memcmp(&got[i], &expected[i], sizeof(float)) == 0;
        if (!exact &&
            (untouched || v >= p_.vocab || !(std::abs(got[i] - expected[i]) <= kProbTolerance))) {
          ++failures;
        }
      }
    }
    return {CountCheck("probs", failures, 0)};
  }

 private:
  SamplingParams p_;
  std::vector<float> host_probs_;
  std::vector<int32_t> host_ids_;
  std::vector<int32_t> host_fan_out_;
  std::vector<float> host_c_;
  DeviceBuffer probs_;    // [num_rows, stride] f32, in/out
  DeviceBuffer ids_;      // [num_rows, k] int32
  DeviceBuffer fan_out_;  // [num_rows] int32
  DeviceBuffer c_;        // [num_rows] f32
};

// The test name is op_numtokens x width: keep (num_rows, vocab) unique per op.
OpShape ShapeOf(const SamplingParams& p) {
  OpShape s;
  s.num_tokens = p.num_rows;
  s.width = p.vocab;
  s.vocab = p.vocab;
  s.label = std::to_string(p.num_rows) + "x" + std::to_string(p.vocab) +
            (p.pad > 0 ? " pad=" + std::to_string(p.pad) : "") +
            (p.max_prompt_len > 0 ? " prompt<=" + std::to_string(p.max_prompt_len) : "") +
            (p.max_output_len > 0 ? " out<=" + std::to_string(p.max_output_len) : "") +
            (p.k > 0 ? " k=" + std::to_string(p.k) : "") +
            (p.out_pad > 0 ? " out_pad=" + std::to_string(p.out_pad) : "") +
            (p.in_place ? " in-place" : "");
  return s;
}

OpSpec MakeSpec(std::string name, const std::vector<SamplingParams>& check,
                const std::vector<SamplingParams>& perf,
                std::function<std::unique_ptr<OpCase>(const SamplingParams&)> make) {
  return MakeLabelledSpec<SamplingParams>(std::move(name), check, perf, ShapeOf, std::move(make));
}

}  // namespace

void AddSamplingOps(std::vector<OpSpec>* table) {
  // {rows, vocab, pad, max prompt, max output, k}
  table->push_back(
      MakeSpec("argmax",
               {{1, 128256, 4, 0, 0},
                {3, 151936, 0, 0, 0},
                {5, 1000, 0, 0, 0},
                {7, 1001, 3, 0, 0},
                {2, 32000, 4, 0, 0},
                {4, 50, 1, 0, 0},
                {64, 151936, 0, 0, 0}},
               {{1, 128256, 0, 0, 0}, {64, 128256, 0, 0, 0}, {256, 151936, 0, 0, 0}},
               [](const SamplingParams& p) { return std::make_unique<ArgmaxCase>(p); }));
  // Rows cycle through MakeLogits' styles, so every shape of three or more rows has a row full
  // of ties; four or more add NaN and -inf.
  table->push_back(MakeSpec("top_k_rows",
                            {{1, 128256, 4, 0, 0, 16},
                             {3, 151936, 0, 0, 0, 8},
                             {5, 1000, 0, 0, 0, 3},
                             {7, 1001, 3, 0, 0, 16},
                             {4, 7, 1, 0, 0, 7},
                             {6, 8192, 0, 0, 0, 1},
                             {9, 4097, 0, 0, 0, 16},
                             {64, 151936, 0, 0, 0, 16},
                             {64, 128256, 1, 0, 0, 3}},
                            {{8, 128256, 0, 0, 0, 16},
                             {64, 128256, 0, 0, 0, 16},
                             {64, 151936, 0, 0, 0, 16},
                             {64, 128256, 0, 0, 0, 1}},
                            [](const SamplingParams& p) { return std::make_unique<TopKCase>(p); }));
  table->push_back(
      MakeSpec("log_softmax_at",
               {{1, 128256, 4, 0, 0, 16},
                {4, 32000, 0, 0, 0, 4},
                {7, 1001, 3, 0, 0, 8},
                {16, 151936, 0, 0, 0, 4},
                {5, 50, 1, 0, 0, 2}},
               {{64, 32000, 0, 0, 0, 4}, {16, 128256, 0, 0, 0, 4}},
               [](const SamplingParams& p) { return std::make_unique<LogSoftmaxAtCase>(p); }));
  table->push_back(
      MakeSpec("penalties",
               {{4, 128256, 0, 2000, 500},
                {8, 151936, 0, 300, 3000},
                {3, 1000, 5, 100, 100},
                {6, 50, 0, 40, 200},
                {64, 32000, 0, 1000, 200},
                {2, 4096, 0, 0, 0}},
               {{64, 128256, 0, 1000, 200}, {256, 151936, 0, 4000, 1000}},
               [](const SamplingParams& p) { return std::make_unique<PenaltiesCase>(p); }));
  table->push_back(
      MakeSpec("sample",
               {{12, 151936, 0, 0, 0},
                {24, 128256, 0, 0, 0},
                {12, 1000, 0, 0, 0},
                {12, 1001, 1, 0, 0},
                {12, 50, 0, 0, 0},
                {3, 7, 0, 0, 0},
                {36, 32000, 2, 0, 0}},
               {{1, 128256, 0, 0, 0}, {64, 128256, 0, 0, 0}, {256, 151936, 0, 0, 0}},
               [](const SamplingParams& p) { return std::make_unique<SampleCase>(p); }));
  // {rows, vocab, pad, -, -, -, out_pad, in_place}: in place and out of place, vec4 and scalar
  // loads, odd output strides; 24 rows reach every RowParams entry and edge row twice. Perf runs
  // out of place only: repeated in-place launches would time rows of probabilities (nearly all
  // tied), not logits.
  table->push_back(
      MakeSpec("processed_probs",
               {{24, 151936, 0, 0, 0, 0, 0, false},
                {24, 151936, 0, 0, 0, 0, 0, true},
                {24, 128256, 4, 0, 0, 0, 3, false},
                {12, 1000, 1, 0, 0, 0, 0, true},
                {12, 1001, 0, 0, 0, 0, 1, false},
                {12, 50, 0, 0, 0, 0, 0, true},
                {3, 7, 2, 0, 0, 0, 1, false},
                {36, 32000, 2, 0, 0, 0, 0, true}},
               {{8, 151936, 0, 0, 0, 0, 0, false},
                {64, 128256, 0, 0, 0, 0, 0, false},
                {256, 151936, 0, 0, 0, 0, 0, false}},
               [](const SamplingParams& p) { return std::make_unique<ProcessedProbsCase>(p); }));
  table->push_back(
      MakeSpec("scatter_rows",
               {{1, 151936, 0, 0, 0, 0, 0},
                {9, 151936, 0, 0, 0, 0, 4},
                {5, 1001, 3, 0, 0, 0, 1},
                {7, 128256, 4, 0, 0, 0, 0},
                {64, 50, 0, 0, 0, 0, 2},
                {3, 7, 0, 0, 0, 0, 0}},
               {{8, 151936, 0, 0, 0, 0, 0}, {64, 151936, 0, 0, 0, 0, 0}},
               [](const SamplingParams& p) { return std::make_unique<ScatterRowsCase>(p); }));
  // {rows, vocab, pad, -, -, -, k}: Llama's and Qwen's vocabularies and small ones, padded rows.
  table->push_back(
      MakeSpec("saguaro_downweight",
               {{14, 128256, 0, 0, 0, 16},
                {21, 151936, 4, 0, 0, 3},
                {8, 8192, 0, 0, 0, 1},
                {12, 1001, 3, 0, 0, 8},
                {7, 7, 1, 0, 0, 7}},
               {{64, 128256, 0, 0, 0, 3}, {256, 151936, 0, 0, 0, 16}},
               [](const SamplingParams& p) { return std::make_unique<SaguaroDownweightCase>(p); }));
}

}  // namespace specd::kernels::check
