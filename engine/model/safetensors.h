// Reads Hugging Face safetensors checkpoints: one model.safetensors, or shards listed by
// model.safetensors.index.json. Files are memory-mapped and every header is validated
// before any tensor byte is touched (header length, JSON, dtypes, offsets inside the data
// section, no overlaps, byte counts matching shape x dtype), so a corrupt or hostile file
// is an error naming the file and tensor, never a crash or an out-of-bounds read.
// Immutable after Open: reads are safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/mapped_file.h"

namespace specd {

enum class TensorDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kOther8 };

struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as in the header, e.g. "BF16"
  TensorDtype dtype;
  std::vector<int64_t> shape;     // [d0, d1, ...]
  std::span<const uint8_t> data;  // [product(shape) * element size] bytes, in the mapping
  const std::string* file;        // path of the file holding it (owned by the file)
};

class SafetensorsFile {
 public:
  // Largest header accepted; real headers are a few hundred KB.
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const TensorInfo* Find(std::string_view name) const;
  const absl::flat_hash_map<std::string, TensorInfo>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader();

  MappedFile file_;
  absl::flat_hash_map<std::string, TensorInfo> tensors_;
};

// A rectangle of a 1-D or 2-D tensor: rows [row_begin, row_begin + num_rows) of dim 0 and, of a
// 2-D tensor, columns [col_begin, col_begin + num_cols) of dim 1 (a 1-D tensor: col_begin 0,
// num_cols 1). A tensor-parallel rank's shard of a projection.
struct TensorSlice {
  int64_t row_begin = 0;
  int64_t num_rows = 0;
  int64_t col_begin = 0;
  int64_t num_cols = 1;
};

class SafetensorsCheckpoint {
 public:
  // Opens dir/model.safetensors, or dir/model.safetensors.index.json and its shards.
  static absl::StatusOr<SafetensorsCheckpoint> OpenDir(const std::string& dir);
  // Opens one file (tests, tools).
  static absl::StatusOr<SafetensorsCheckpoint> OpenFile(const std::string& path);

  bool Contains(std::string_view name) const { return Find(name) != nullptr; }
  const TensorInfo* Find(std::string_view name) const;
  size_t num_tensors() const { return index_.size(); }

  // Reads tensor `name`, which must have exactly `shape`, widened to f32 into `out`
  // ([product(shape)] floats). F32, F16 and BF16 are supported. InvalidArgument on a
  // missing tensor, wrong shape or unsupported dtype.
  absl::Status ReadF32(std::string_view name, const std::vector<int64_t>& shape,
                       std::span<float> out) const;
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name,
                                             const std::vector<int64_t>& shape) const;
  // Reads `slice` of tensor `name` (exactly `shape`, 1-D or 2-D) widened to f32 into `out`
  // ([num_rows, num_cols] floats, row-major). Only the slice's bytes of the mapping are touched,
  // so a rank never widens (or pages in) the rest of the tensor. Errors as ReadF32's, and
  // InvalidArgument for a slice outside the tensor.
  absl::Status ReadF32Slice(std::string_view name, const std::vector<int64_t>& shape,
                            const TensorSlice& slice, std::span<float> out) const;

 private:
  // The tensor `name` if it has exactly `shape` and a dtype ReadF32 widens.
  absl::StatusOr<const TensorInfo*> FindF32(std::string_view name,
                                            const std::vector<int64_t>& shape) const;

  std::string where_;  // dir or file, for errors
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, const TensorInfo*> index_;
};

}  // namespace specd
