// The table of CUDA ops x shapes that both the GPU test (kernels/cuda/kernels_cuda_test.cc) and
// tools/kernel_check run, in check mode (each output against the fp64 reference under the
// flash-attention rule, cuda_check.h) or perf mode (timed launches). In the spirit of ggml's
// tests/test-backend-ops.cpp: a new kernel adds one OpCase subclass and one table row. One thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/check/cuda_check.h"

namespace specd::kernels::check {

// Sizes of one case; `width` is hidden (norms, embedding) or d (silu_and_mul), `table_rows`
// the embedding shard's rows (0 for other ops). Ops with more dimensions use the named fields
// below (0 when unused) and may set `label` for ToString.
struct OpShape {
  int64_t num_tokens = 0;
  int64_t width = 0;
  int64_t table_rows = 0;
  // attention (num_tokens: query tokens; batch: sequences), rope, head norm
  int64_t batch = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t context = 0;     // KV tokens per sequence
  int64_t block_size = 0;  // KV block size
  int64_t window = 0;      // sliding window (0 = none)
  // sampling (num_tokens: rows), gemm (num_tokens: m, width: k)
  int64_t vocab = 0;
  int64_t n = 0;
  std::string label = {};  // free text shown by ToString when set

  std::string ToString() const;  // "num_tokens x width[, rows]"
};

// One op at one shape with its device buffers. Construction fills the inputs with random
// non-zero bf16 data (seeded by the shape) and poisons the outputs, so perf runs never time zeros.
class OpCase {
 public:
  virtual ~OpCase() = default;

  // Queues one launch on `stream` and returns the launcher's error (the launch's last error).
  // Graph-capturable. In-place outputs (a fused residual) drift across repeated launches.
  virtual cudaError_t Launch(cudaStream_t stream) = 0;

  // Least bytes one launch reads plus writes: the numerator of its GB/s.
  virtual int64_t BytesMoved() const = 0;

  // Re-uploads the inputs, poisons the outputs, launches once, synchronises and compares every
  // output with the fp64 reference against the same-precision baseline.
  virtual std::vector<ErrorCheck> Check() = 0;
};

struct OpSpec {
  std::string name;
  std::vector<OpShape> check_shapes;  // small, odd and model-sized widths
  std::vector<OpShape> perf_shapes;   // decode- and prefill-sized, most larger than L2
  std::function<std::unique_ptr<OpCase>(const OpShape&)> make;
};

// An op whose cases are described by parameters P: each check and perf entry becomes the shape
// shape_of(p) (whose label must be unique within the op) and make(p) builds the case of a shape.
template <class P>
OpSpec MakeLabelledSpec(std::string name, const std::vector<P>& check, const std::vector<P>& perf,
                        const std::function<OpShape(const P&)>& shape_of,
                        std::function<std::unique_ptr<OpCase>(const P&)> make) {
  auto by_label = std::make_shared<std::map<std::string, P>>();
  OpSpec spec{std::move(name), {}, {}, nullptr};
  for (const auto* list : {&check, &perf}) {
    for (const P& p : *list) {
      const OpShape shape = shape_of(p);
      (*by_label)[shape.label] = p;
      (list == &check ? spec.check_shapes : spec.perf_shapes).push_back(shape);
    }
  }
  spec.make = [by_label, make = std::move(make)](const OpShape& s) {
    return make(by_label->at(s.label));
  };
  return spec;
}

// Every op, in a fixed order. Building the table touches no CUDA state.
const std::vector<OpSpec>& OpTable();

}  // namespace specd::kernels::check
