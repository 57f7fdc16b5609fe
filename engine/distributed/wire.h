// Byte-level building blocks of the dist/ wire format: a reusable frame buffer, a
// little-endian writer and a bounds-checked reader, and CRC-32C. They exist so messages.cc
// encodes every field explicitly (no struct memcpy, no padding on the wire, the same bytes on
// any host) and so a decoder can never read past the bytes it was given.
// Plain values: one thread per object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace specd {

// Abseil here has its own absl::string_view (not std::string_view): converts for StrCat.
inline absl::string_view DistView(std::string_view s) { return {s.data(), s.size()}; }

// Stores unsigned `v` little-endian at dst[0, sizeof(T)) (e.g. a frame header patched in place).
template <typename T>
void StoreLittleEndian(uint8_t* dst, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) dst[i] = static_cast<uint8_t>(v >> (8 * i));
}

// CRC-32C (Castagnoli), the checksum of every frame's payload. Uses SSE4.2 when the CPU has
// it (about 8 GB/s), else a table (about 1 GB/s). `crc` continues an earlier computation.
uint32_t Crc32c(std::span<const uint8_t> bytes, uint32_t crc = 0);

// A growable byte buffer whose storage is reused across frames: Resize() within Capacity()
// never allocates, and growth leaves the old bytes in place. Storage is not zero-filled, so
// reserving a large maximum costs address space, not touched memory, until it is written.
class FrameBuffer {
 public:
  FrameBuffer() = default;
  explicit FrameBuffer(size_t capacity) { Reserve(capacity); }

  // Grows capacity to at least `capacity` bytes (allocates; keeps the first size() bytes).
  void Reserve(size_t capacity);
  // Sets size(); allocates (doubling) only when `size` exceeds Capacity().
  void Resize(size_t size);

  // The first size() bytes are the current contents; the storage is owned by the buffer.
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  // Bytes reserved; Resize up to this never allocates.
  size_t Capacity() const { return capacity_; }
  // [size()] the current contents, valid until the next Reserve/Resize that grows.
  std::span<const uint8_t> bytes() const { return {data_.get(), size_}; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// Appends little-endian values to a FrameBuffer, starting at its current size().
class ByteWriter {
 public:
  // `buffer` (not owned) must outlive the writer.
  explicit ByteWriter(FrameBuffer* buffer) : buffer_(buffer) {}

  // Each appends one value in little-endian byte order.
  void U8(uint8_t v) { Put(&v, 1); }
  void U16(uint16_t v);
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I32(int32_t v) { U32(static_cast<uint32_t>(v)); }
  void F32(float v);
  void F64(double v);
  // A u16 length followed by the bytes (callers check the length against their limits).
  void Text(std::string_view text);
  // Arrays written element by element as little-endian (one memcpy on little-endian hosts).
  void I32Array(std::span<const int32_t> values);
  void U64Array(std::span<const uint64_t> values);
  void F32Array(std::span<const float> values);
  void Bytes(std::span<const uint8_t> bytes) { Put(bytes.data(), bytes.size()); }

 private:
  void Put(const void* src, size_t n);
  FrameBuffer* buffer_;
};

// The first problem found while checking a message, naming the field: "<what>.<field>: ...".
// Shared by encoding (checks before writing) and decoding (checks while reading).
class FieldErrors {
 public:
  // `what` prefixes error messages, e.g. "SpeculateRequest".
  explicit FieldErrors(std::string_view what) : what_(what) {}

  // Index substituted for "[]" in field names of later errors ("seqs[].flags" -> "seqs[3].flags").
  void SetItem(size_t item) { item_ = item; }
  // Records InvalidArgument "<field name>: <problem>" unless a problem is already kept.
  void Fail(const char* field, std::string_view problem);
  // The field's full name: "<what>.<field>" with "[]" replaced by the current item.
  std::string FieldName(const char* field) const;

  // The first problem recorded (OK when none).
  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }

 protected:
  absl::Status status_;

 private:
  std::string_view what_;
  size_t item_ = 0;
};

// Reads little-endian values from a span, never past its end. Each read names the field it
// reads; the first failure is kept and every later read fails too (returning 0), so a decoder
// may read a run of fields and check ok() once.
class ByteReader : public FieldErrors {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string_view what)
      : FieldErrors(what), bytes_(bytes) {}

  // Each reads one little-endian value; 0 after a failure.
  uint8_t U8(const char* field);
  uint16_t U16(const char* field);
  uint32_t U32(const char* field);
  uint64_t U64(const char* field);
  int32_t I32(const char* field) { return static_cast<int32_t>(U32(field)); }
  float F32(const char* field);
  double F64(const char* field);
  // Reads a u16 length and that many bytes, at most `max_bytes`, into *out.
  void Text(const char* field, size_t max_bytes, std::string* out);
  // Read `count` elements into out[0, count) (out must have room for them).
  void I32Array(const char* field, size_t count, int32_t* out);
  void U64Array(const char* field, size_t count, uint64_t* out);
  void F32Array(const char* field, size_t count, float* out);
  void Bytes(const char* field, size_t count, uint8_t* out);

  // Bytes not read yet.
  size_t remaining() const { return bytes_.size() - offset_; }

 private:
  // True when `n` more bytes exist; otherwise records a truncation error and returns false.
  bool Take(const char* field, size_t n);
  // Same for `count` elements of `elem_bytes` each (count may be huge: no overflow).
  bool TakeArray(const char* field, size_t count, size_t elem_bytes);

  std::span<const uint8_t> bytes_;
  size_t offset_ = 0;
};

}  // namespace specd
