// Little-endian writer/reader, frame buffer and CRC-32C of the dist/ wire format.
#include "engine/distributed/wire.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace specd {
namespace {

constexpr bool kLittleEndianHost = std::endian::native == std::endian::little;

// Slicing-by-8 tables for the reflected Castagnoli polynomial, built at compile time.
constexpr uint32_t kCrc32cPoly = 0x82F63B78u;
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr CrcTables MakeCrcTables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrc32cPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}
constexpr CrcTables kCrcTables = MakeCrcTables();

uint32_t Crc32cTable(const uint8_t* p, size_t n, uint32_t c) {
  while (n >= 8) {
    uint32_t lo =
        c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = kCrcTables[7][lo & 0xFF] ^ kCrcTables[6][(lo >> 8) & 0xFF] ^
        kCrcTables[5][(lo >> 16) & 0xFF] ^ kCrcTables[4][lo >> 24] ^ kCrcTables[3][p[4]] ^
        kCrcTables[2][p[5]] ^ kCrcTables[1][p[6]] ^ kCrcTables[0][p[7]];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kCrcTables[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
#endif

template <typename T>
T LoadLe(const uint8_t* src) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(T{src[i]} << (8 * i));
  return v;
}

// Writes an array of 4- or 8-byte values as little-endian.
template <typename T>
void PutArray(FrameBuffer* buffer, std::span<const T> values) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const size_t at = buffer->size();
  buffer->Resize(at + values.size_bytes());
  uint8_t* dst = buffer->data() + at;
  if constexpr (kLittleEndianHost) {
    if (!values.empty()) std::memcpy(dst, values.data(), values.size_bytes());
  } else {
    for (const T& v : values) {
      StoreLittleEndian<U>(dst, std::bit_cast<U>(v));
      dst += sizeof(T);
    }
  }
}

template <typename T>
void GetArray(const uint8_t* src, size_t count, T* out) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  if constexpr (kLittleEndianHost) {
    if (count > 0) std::memcpy(out, src, count * sizeof(T));
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = std::bit_cast<T>(LoadLe<U>(src + i * sizeof(T)));
  }
}

}  // namespace

uint32_t Crc32c(std::span<const uint8_t> bytes, uint32_t crc) {
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (kHasSse42) return ~Crc32cSse42(bytes.data(), bytes.size(), c);
#endif
  return ~Crc32cTable(bytes.data(), bytes.size(), c);
}

void FrameBuffer::Reserve(size_t capacity) {
  if (capacity <= capacity_) return;
  auto grown = std::make_unique_for_overwrite<uint8_t[]>(capacity);
  if (size_ > 0) std::memcpy(grown.get(), data_.get(), size_);
  data_ = std::move(grown);
  capacity_ = capacity;
}

void FrameBuffer::Resize(size_t size) {
  if (size > capacity_) Reserve(std::max(size, 2 * capacity_));
  size_ = size;
}

void ByteWriter::Put(const void* src, size_t n) {
  const size_t at = buffer_->size();
  buffer_->Resize(at + n);
  if (n > 0) std::memcpy(buffer_->data() + at, src, n);
}

void ByteWriter::U16(uint16_t v) {
  uint8_t b[2];
  StoreLittleEndian(b, v);
  Put(b, 2);
}

void ByteWriter::U32(uint32_t v) {
  uint8_t b[4];
  StoreLittleEndian(b, v);
  Put(b, 4);
}

void ByteWriter::U64(uint64_t v) {
  uint8_t b[8];
  StoreLittleEndian(b, v);
  Put(b, 8);
}

void ByteWriter::F32(float v) { U32(std::bit_cast<uint32_t>(v)); }
void ByteWriter::F64(double v) { U64(std::bit_cast<uint64_t>(v)); }

void ByteWriter::Text(std::string_view text) {
  U16(static_cast<uint16_t>(text.size()));
  Put(text.data(), text.size());
}

void ByteWriter::I32Array(std::span<const int32_t> values) { PutArray(buffer_, values); }
void ByteWriter::U64Array(std::span<const uint64_t> values) { PutArray(buffer_, values); }
void ByteWriter::F32Array(std::span<const float> values) { PutArray(buffer_, values); }

std::string FieldErrors::FieldName(const char* field) const {
  return absl::StrCat(DistView(what_), ".",
                      absl::StrReplaceAll(field, {{"[]", absl::StrCat("[", item_, "]")}}));
}

void FieldErrors::Fail(const char* field, std::string_view problem) {
  if (status_.ok())
    status_ = absl::InvalidArgumentError(absl::StrCat(FieldName(field), ": ", DistView(problem)));
}

bool ByteReader::Take(const char* field, size_t n) {
  if (!status_.ok()) return false;
  if (n <= remaining()) return true;
  status_ = absl::InvalidArgumentError(
      absl::StrCat(FieldName(field), ": truncated at payload byte ", offset_, " (needs ", n,
                   " bytes, ", remaining(), " left)"));
  return false;
}

bool ByteReader::TakeArray(const char* field, size_t count, size_t elem_bytes) {
  if (!status_.ok()) return false;
  // count may come straight off the wire: compare without multiplying it first.
  if (count <= remaining() / elem_bytes) return true;
  status_ = absl::InvalidArgumentError(
      absl::StrCat(FieldName(field), ": truncated at payload byte ", offset_, " (needs ", count,
                   " x ", elem_bytes, " bytes, ", remaining(), " left)"));
  return false;
}

uint8_t ByteReader::U8(const char* field) {
  if (!Take(field, 1)) return 0;
  return bytes_[offset_++];
}

uint16_t ByteReader::U16(const char* field) {
  if (!Take(field, 2)) return 0;
  const uint16_t v = LoadLe<uint16_t>(bytes_.data() + offset_);
  offset_ += 2;
  return v;
}

uint32_t ByteReader::U32(const char* field) {
  if (!Take(field, 4)) return 0;
  const uint32_t v = LoadLe<uint32_t>(bytes_.data() + offset_);
  offset_ += 4;
  return v;
}

uint64_t ByteReader::U64(const char* field) {
  if (!Take(field, 8)) return 0;
  const uint64_t v = LoadLe<uint64_t>(bytes_.data() + offset_);
  offset_ += 8;
  return v;
}

float ByteReader::F32(const char* field) { return std::bit_cast<float>(U32(field)); }
double ByteReader::F64(const char* field) { return std::bit_cast<double>(U64(field)); }

void ByteReader::Text(const char* field, size_t max_bytes, std::string* out) {
  const uint16_t n = U16(field);
  if (!ok()) return;
  if (n > max_bytes) return Fail(field, absl::StrCat("length ", n, " > limit ", max_bytes));
  if (!Take(field, n)) return;
  out->assign(reinterpret_cast<const char*>(bytes_.data() + offset_), n);
  offset_ += n;
}

void ByteReader::I32Array(const char* field, size_t count, int32_t* out) {
  if (!TakeArray(field, count, 4)) return;
  GetArray(bytes_.data() + offset_, count, out);
  offset_ += count * 4;
}

void ByteReader::U64Array(const char* field, size_t count, uint64_t* out) {
  if (!TakeArray(field, count, 8)) return;
  GetArray(bytes_.data() + offset_, count, out);
  offset_ += count * 8;
}

void ByteReader::F32Array(const char* field, size_t count, float* out) {
  if (!TakeArray(field, count, 4)) return;
  GetArray(bytes_.data() + offset_, count, out);
  offset_ += count * 4;
}

void ByteReader::Bytes(const char* field, size_t count, uint8_t* out) {
  if (!Take(field, count)) return;
  if (count > 0) std::memcpy(out, bytes_.data() + offset_, count);
  offset_ += count;
}

}  // namespace specd
