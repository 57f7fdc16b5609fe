#include "engine/tokenizer/gguf_reader.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/tokenizer/string_view_compat.h"

namespace specd::tok {
namespace {

enum GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

size_t ScalarSize(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

// A cursor over the file bytes; every read checks the remaining length.
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, uint32_t version) : bytes_(bytes), version_(version) {}

  size_t remaining() const { return bytes_.size() - pos_; }
  void set_version(uint32_t v) { version_ = v; }

  absl::Status Raw(void* out, size_t n) {
    if (n > remaining()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF truncated: need ", n, " bytes at offset ", pos_));
    }
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Read() {
    T v{};
    SPECD_RETURN_IF_ERROR(Raw(&v, sizeof(T)));
    return v;
  }
  // Lengths and counts are 32-bit in GGUF v1, 64-bit later.
  absl::StatusOr<uint64_t> Size() {
    if (version_ == 1) {
      SPECD_ASSIGN_OR_RETURN(uint32_t v, Read<uint32_t>());
      return v;
    }
    return Read<uint64_t>();
  }
  absl::StatusOr<std::string> String() {
    SPECD_ASSIGN_OR_RETURN(uint64_t n, Size());
    if (n > remaining()) return absl::InvalidArgumentError("GGUF string runs past end of file");
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  absl::Status Skip(uint64_t n) {
    if (n > remaining()) return absl::InvalidArgumentError("GGUF value runs past end of file");
    pos_ += n;
    return absl::OkStatus();
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  uint32_t version_;
};

absl::StatusOr<int64_t> ReadInt(Reader& r, uint32_t type) {
  switch (type) {
    case kU8: {
      SPECD_ASSIGN_OR_RETURN(uint8_t v, r.Read<uint8_t>());
      return v;
    }
    case kI8: {
      SPECD_ASSIGN_OR_RETURN(int8_t v, r.Read<int8_t>());
      return v;
    }
    case kU16: {
      SPECD_ASSIGN_OR_RETURN(uint16_t v, r.Read<uint16_t>());
      return v;
    }
    case kI16: {
      SPECD_ASSIGN_OR_RETURN(int16_t v, r.Read<int16_t>());
      return v;
    }
    case kU32: {
      SPECD_ASSIGN_OR_RETURN(uint32_t v, r.Read<uint32_t>());
      return v;
    }
    case kI32: {
      SPECD_ASSIGN_OR_RETURN(int32_t v, r.Read<int32_t>());
      return v;
    }
    case kU64: {
      SPECD_ASSIGN_OR_RETURN(uint64_t v, r.Read<uint64_t>());
      return static_cast<int64_t>(v);
    }
    case kI64: {
      SPECD_ASSIGN_OR_RETURN(int64_t v, r.Read<int64_t>());
      return v;
    }
    case kBool: {
      SPECD_ASSIGN_OR_RETURN(uint8_t v, r.Read<uint8_t>());
      return v != 0;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("GGUF: not an integer type ", type));
  }
}

absl::StatusOr<double> ReadFloat(Reader& r, uint32_t type) {
  if (type == kF32) {
    SPECD_ASSIGN_OR_RETURN(float v, r.Read<float>());
    return v;
  }
  return r.Read<double>();
}

bool IsIntType(uint32_t t) { return t <= kI32 || t == kBool || t == kU64 || t == kI64; }

absl::StatusOr<GgufValue> ReadArray(Reader& r) {
  SPECD_ASSIGN_OR_RETURN(uint32_t elem, r.Read<uint32_t>());
  SPECD_ASSIGN_OR_RETURN(uint64_t count, r.Size());
  // Every element takes at least one byte (strings at least their length field), so a count
  // beyond the remaining bytes is corrupt; this also bounds every allocation below.
  const size_t min_size = elem == kString ? 4 : ScalarSize(elem);
  if (elem != kArray && (min_size == 0 || count > r.remaining() / min_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF array of ", count, " elements of type ", elem, " does not fit"));
  }
  if (elem == kString) {
    std::vector<std::string> out;
    out.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      SPECD_ASSIGN_OR_RETURN(std::string s, r.String());
      out.push_back(std::move(s));
    }
    return out;
  }
  if (elem == kF32 || elem == kF64) {
    std::vector<double> out(count);
    for (uint64_t i = 0; i < count; ++i) {
      SPECD_ASSIGN_OR_RETURN(out[i], ReadFloat(r, elem));
    }
    return out;
  }
  if (IsIntType(elem)) {
    std::vector<int64_t> out(count);
    for (uint64_t i = 0; i < count; ++i) {
      SPECD_ASSIGN_OR_RETURN(out[i], ReadInt(r, elem));
    }
    return out;
  }
  if (elem == kArray) {  // nested arrays are not needed: walk them for bounds, keep nothing
    if (count > r.remaining() / 8) return absl::InvalidArgumentError("GGUF nested array too big");
    for (uint64_t i = 0; i < count; ++i) SPECD_RETURN_IF_ERROR(ReadArray(r).status());
    return GgufValue{};
  }
  return absl::InvalidArgumentError(absl::StrCat("GGUF: unknown array element type ", elem));
}

absl::StatusOr<GgufValue> ReadValue(Reader& r, uint32_t type) {
  if (type == kString) return r.String();
  if (type == kArray) return ReadArray(r);
  if (type == kF32 || type == kF64) return ReadFloat(r, type);
  if (type == kBool) {
    SPECD_ASSIGN_OR_RETURN(uint8_t v, r.Read<uint8_t>());
    return v != 0;
  }
  if (IsIntType(type)) return ReadInt(r, type);
  return absl::InvalidArgumentError(absl::StrCat("GGUF: unknown value type ", type));
}

}  // namespace

absl::StatusOr<GgufMetadata> GgufMetadata::Parse(std::span<const uint8_t> bytes) {
  Reader r(bytes, 3);
  char magic[4];
  SPECD_RETURN_IF_ERROR(r.Raw(magic, 4));
  if (std::memcmp(magic, "GGUF", 4) != 0) return absl::InvalidArgumentError("not a GGUF file");
  GgufMetadata meta;
  SPECD_ASSIGN_OR_RETURN(meta.version_, r.Read<uint32_t>());
  if (meta.version_ < 1 || meta.version_ > 3) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported GGUF version ", meta.version_));
  }
  r.set_version(meta.version_);
  SPECD_ASSIGN_OR_RETURN(uint64_t num_tensors, r.Size());
  (void)num_tensors;
  SPECD_ASSIGN_OR_RETURN(uint64_t num_kv, r.Size());
  if (num_kv > r.remaining() / 9) {  // key length + type + a one-byte value at least
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF claims ", num_kv, " keys; file too short"));
  }
  for (uint64_t i = 0; i < num_kv; ++i) {
    SPECD_ASSIGN_OR_RETURN(std::string key, r.String());
    SPECD_ASSIGN_OR_RETURN(uint32_t type, r.Read<uint32_t>());
    auto value = ReadValue(r, type);
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF key '", AsAbsl(key), "': ", value.status().message()));
    }
    meta.values_.insert_or_assign(std::move(key), *std::move(value));
  }
  return meta;
}

absl::StatusOr<GgufMetadata> GgufMetadata::ReadFile(const std::string& path) {
  SPECD_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  auto meta = Parse(file.bytes());
  if (!meta.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", meta.status().message()));
  return meta;
}

const GgufValue* GgufMetadata::Find(std::string_view key) const {
  auto it = values_.find(AsAbsl(key));
  return it == values_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::optional<std::string>> GgufMetadata::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  return absl::InvalidArgumentError(absl::StrCat("GGUF key '", AsAbsl(key), "' is not a string"));
}

absl::StatusOr<std::optional<int64_t>> GgufMetadata::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(v)) return *i;
  return absl::InvalidArgumentError(absl::StrCat("GGUF key '", AsAbsl(key), "' is not an integer"));
}

absl::StatusOr<std::optional<bool>> GgufMetadata::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* b = std::get_if<bool>(v)) return *b;
  if (const auto* i = std::get_if<int64_t>(v)) return *i != 0;
  return absl::InvalidArgumentError(absl::StrCat("GGUF key '", AsAbsl(key), "' is not a bool"));
}

const std::vector<std::string>* GgufMetadata::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? nullptr : std::get_if<std::vector<std::string>>(v);
}

const std::vector<int64_t>* GgufMetadata::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? nullptr : std::get_if<std::vector<int64_t>>(v);
}

const std::vector<double>* GgufMetadata::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? nullptr : std::get_if<std::vector<double>>(v);
}

}  // namespace specd::tok
