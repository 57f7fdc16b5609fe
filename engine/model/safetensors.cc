#include "engine/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/float16.h"
#include "engine/base/status.h"
#include "engine/model/json_fields.h"

namespace specd {
namespace {

using nlohmann::json;

struct DtypeEntry {
  const char* name;
  TensorDtype dtype;
  int size;
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", TensorDtype::kF64, 8},        {"F32", TensorDtype::kF32, 4},
    {"F16", TensorDtype::kF16, 2},        {"BF16", TensorDtype::kBF16, 2},
    {"I64", TensorDtype::kI64, 8},        {"I32", TensorDtype::kI32, 4},
    {"I16", TensorDtype::kI16, 2},        {"I8", TensorDtype::kI8, 1},
    {"U8", TensorDtype::kU8, 1},          {"BOOL", TensorDtype::kBool, 1},
    {"F8_E4M3", TensorDtype::kOther8, 1}, {"F8_E5M2", TensorDtype::kOther8, 1},
};

const DtypeEntry* LookupDtype(const std::string& name) {
  for (const DtypeEntry& e : kDtypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

absl::Status TensorError(const std::string& file, std::string_view tensor, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": tensor '", AbslView(tensor), "': ", AbslView(what)));
}

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Reads "shape" and returns the element count, rejecting negative dims and overflow.
absl::StatusOr<uint64_t> ParseShape(const json& entry, const std::string& file,
                                    const std::string& name, std::vector<int64_t>* shape) {
  auto it = entry.find("shape");
  if (it == entry.end() || !it->is_array()) return TensorError(file, name, "missing shape");
  uint64_t count = 1;
  for (const json& d : *it) {
    std::optional<int64_t> dim = JsonToInt(d);
    if (!dim.has_value() || *dim < 0) return TensorError(file, name, "bad shape dimension");
    if (*dim != 0 && count > (uint64_t{1} << 50) / static_cast<uint64_t>(*dim)) {
      return TensorError(file, name, "shape too large");
    }
    count *= static_cast<uint64_t>(*dim);
    shape->push_back(*dim);
  }
  return count;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> ParseOffsets(const json& entry,
                                                           const std::string& file,
                                                           const std::string& name,
                                                           uint64_t data_size) {
  auto it = entry.find("data_offsets");
  if (it == entry.end() || !it->is_array() || it->size() != 2) {
    return TensorError(file, name, "data_offsets must be a list of two integers");
  }
  std::optional<int64_t> begin = JsonToInt((*it)[0]);
  std::optional<int64_t> end = JsonToInt((*it)[1]);
  if (!begin.has_value() || !end.has_value() || *begin < 0 || *end < *begin) {
    return TensorError(file, name, "bad data_offsets");
  }
  if (static_cast<uint64_t>(*end) > data_size) {
    return TensorError(file, name,
                       absl::StrCat("data_offsets [", *begin, ", ", *end,
                                    ") outside the data section of ", data_size, " bytes"));
  }
  return std::make_pair(static_cast<uint64_t>(*begin), static_cast<uint64_t>(*end));
}

absl::StatusOr<TensorInfo> ParseEntry(const json& entry, const std::string& file,
                                      const std::string& name, std::span<const uint8_t> data) {
  if (!entry.is_object()) return TensorError(file, name, "entry is not an object");
  TensorInfo info;
  info.name = name;
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return TensorError(file, name, "missing dtype");
  }
  info.dtype_name = dtype_it->get<std::string>();
  const DtypeEntry* dtype = LookupDtype(info.dtype_name);
  if (dtype == nullptr) {
    return TensorError(file, name, absl::StrCat("unknown dtype '", info.dtype_name, "'"));
  }
  info.dtype = dtype->dtype;
  SPECD_ASSIGN_OR_RETURN(uint64_t count, ParseShape(entry, file, name, &info.shape));
  SPECD_ASSIGN_OR_RETURN(auto offsets, ParseOffsets(entry, file, name, data.size()));
  const uint64_t nbytes = count * static_cast<uint64_t>(dtype->size);
  if (offsets.second - offsets.first != nbytes) {
    return TensorError(
        file, name,
        absl::StrCat("holds ", offsets.second - offsets.first, " bytes but shape ",
                     ShapeString(info.shape), " of ", info.dtype_name, " needs ", nbytes));
  }
  info.data = data.subspan(offsets.first, nbytes);
  return info;
}

absl::Status CheckNoOverlap(const absl::flat_hash_map<std::string, TensorInfo>& tensors,
                            const std::string& file) {
  std::vector<const TensorInfo*> sorted;
  for (const auto& [name, info] : tensors) sorted.push_back(&info);
  std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data.data() < b->data.data();
  });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const TensorInfo* prev = sorted[i - 1];
    if (prev->data.data() + prev->data.size() > sorted[i]->data.data()) {
      return TensorError(file, sorted[i]->name,
                         absl::StrCat("data overlaps tensor '", prev->name, "'"));
    }
  }
  return absl::OkStatus();
}

// Widens out.size() elements of `dtype` starting at `src` to f32.
void WidenToF32(TensorDtype dtype, const uint8_t* src, std::span<float> out) {
  switch (dtype) {
    case TensorDtype::kF32:
      std::memcpy(out.data(), src, out.size() * sizeof(float));
      return;
    case TensorDtype::kBF16:
    case TensorDtype::kF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, sizeof(h));
        out[i] = dtype == TensorDtype::kBF16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
      }
      return;
    default:
      return;  // rejected by the caller
  }
}

// Shard file names come from the index: plain names in the same directory only.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  SPECD_ASSIGN_OR_RETURN(file->file_, MappedFile::Open(path));
  SPECD_RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

absl::Status SafetensorsFile::ParseHeader() {
  const std::string& path = file_.path();
  std::span<const uint8_t> bytes = file_.bytes();
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": too small for a safetensors file"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little endian
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header of ", header_len, " bytes exceeds the limit of ", kMaxHeaderBytes));
  }
  if (header_len > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " runs past the end of the file (", bytes.size(),
                                                   " bytes)"));
  }
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), header_len);
  SPECD_ASSIGN_OR_RETURN(json header, ParseJsonObject(text, path + " (header)"));
  std::span<const uint8_t> data = bytes.subspan(8 + header_len);
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    SPECD_ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(entry, path, name, data));
    info.file = &file_.path();
    tensors_.insert_or_assign(name, std::move(info));
  }
  return CheckNoOverlap(tensors_, path);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(AbslView(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::OpenFile(const std::string& path) {
  SafetensorsCheckpoint ckpt;
  ckpt.where_ = path;
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  for (const auto& [name, info] : file->tensors()) ckpt.index_[name] = &info;
  ckpt.files_.push_back(std::move(file));
  return ckpt;
}

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::OpenDir(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::error_code ec;
  if (std::filesystem::exists(single, ec)) return OpenFile(single);
  if (!std::filesystem::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  SPECD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  SPECD_ASSIGN_OR_RETURN(json index, ParseJsonObject(text, index_path));
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing weight_map object"));
  }
  SafetensorsCheckpoint ckpt;
  ckpt.where_ = dir;
  absl::flat_hash_map<std::string, const SafetensorsFile*> shards;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string() || !IsPlainFileName(shard.get<std::string>())) {
      return TensorError(index_path, name, "weight_map entry is not a file name");
    }
    const std::string shard_name = shard.get<std::string>();
    if (!shards.contains(shard_name)) {
      const std::string shard_path = dir + "/" + shard_name;
      if (!std::filesystem::exists(shard_path, ec)) {
        return absl::NotFoundError(absl::StrCat(index_path, ": tensor '", name, "' is in shard ",
                                                shard_name, ", which does not exist"));
      }
      SPECD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                             SafetensorsFile::Open(shard_path));
      shards[shard_name] = file.get();
      ckpt.files_.push_back(std::move(file));
    }
    const TensorInfo* info = shards[shard_name]->Find(name);
    if (info == nullptr) {
      return TensorError(index_path, name, absl::StrCat("not found in its shard ", shard_name));
    }
    ckpt.index_[name] = info;
  }
  return ckpt;
}

const TensorInfo* SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = index_.find(AbslView(name));
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<const TensorInfo*> SafetensorsCheckpoint::FindF32(
    std::string_view name, const std::vector<int64_t>& shape) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) return TensorError(where_, name, "missing from the checkpoint");
  if (!std::equal(shape.begin(), shape.end(), t->shape.begin(), t->shape.end())) {
    return TensorError(*t->file, name,
                       absl::StrCat("has shape ", ShapeString(t->shape), ", the model expects ",
                                    ShapeString(shape)));
  }
  if (t->dtype != TensorDtype::kF32 && t->dtype != TensorDtype::kF16 &&
      t->dtype != TensorDtype::kBF16) {
    return TensorError(*t->file, name,
                       absl::StrCat("dtype ", t->dtype_name, " is not supported (F32, F16, BF16)"));
  }
  return t;
}

absl::Status SafetensorsCheckpoint::ReadF32(std::string_view name,
                                            const std::vector<int64_t>& shape,
                                            std::span<float> out) const {
  SPECD_ASSIGN_OR_RETURN(const TensorInfo* t, FindF32(name, shape));
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (out.size() != static_cast<size_t>(count)) {
    return absl::InternalError(absl::StrCat("ReadF32(", AbslView(name), "): output of ", out.size(),
                                            " floats for ", count, " elements"));
  }
  WidenToF32(t->dtype, t->data.data(), out);
  return absl::OkStatus();
}

absl::Status SafetensorsCheckpoint::ReadF32Slice(std::string_view name,
                                                 const std::vector<int64_t>& shape,
                                                 const TensorSlice& slice,
                                                 std::span<float> out) const {
  SPECD_ASSIGN_OR_RETURN(const TensorInfo* t, FindF32(name, shape));
  if (shape.empty() || shape.size() > 2) {
    return TensorError(*t->file, name, "a slice is read from a 1-D or 2-D tensor only");
  }
  const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
  if (slice.row_begin < 0 || slice.num_rows < 0 || slice.row_begin + slice.num_rows > rows ||
      slice.col_begin < 0 || slice.num_cols < 0 || slice.col_begin + slice.num_cols > cols) {
    return TensorError(
        *t->file, name,
        absl::StrCat("slice rows [", slice.row_begin, ", ", slice.row_begin + slice.num_rows,
                     ") columns [", slice.col_begin, ", ", slice.col_begin + slice.num_cols,
                     ") is outside its shape ", ShapeString(shape)));
  }
  if (out.size() != static_cast<size_t>(slice.num_rows * slice.num_cols)) {
    return absl::InternalError(absl::StrCat("ReadF32Slice(", AbslView(name), "): output of ",
                                            out.size(), " floats for ", slice.num_rows, " x ",
                                            slice.num_cols, " elements"));
  }
  const size_t element = t->dtype == TensorDtype::kF32 ? 4 : 2;
  for (int64_t r = 0; r < slice.num_rows; ++r) {
    const int64_t first = (slice.row_begin + r) * cols + slice.col_begin;
    WidenToF32(t->dtype, t->data.data() + first * element,
               out.subspan(r * slice.num_cols, slice.num_cols));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> SafetensorsCheckpoint::ReadF32(
    std::string_view name, const std::vector<int64_t>& shape) const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> out(static_cast<size_t>(count));
  SPECD_RETURN_IF_ERROR(ReadF32(name, shape, std::span<float>(out)));
  return out;
}

}  // namespace specd
