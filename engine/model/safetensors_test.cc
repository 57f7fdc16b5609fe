// Safetensors reading, and every corruption a checkpoint can carry: each must be an error
// naming the file and tensor, never a crash or an out-of-bounds read. Files are written
// into the test's temp dir.
#include "engine/model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/base/float16.h"
#include "engine/model/model.h"

namespace specd {
namespace {

std::string TempPath(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/safetensors_test";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// header JSON text + data bytes, the way safetensors lays them out.
std::string Safetensors(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

nlohmann::json Entry(const char* dtype, std::vector<int64_t> shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

// Writes `bytes` to a file named `name` and opens it; returns the status.
absl::Status OpenWritten(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  WriteBytes(path, bytes);
  return SafetensorsCheckpoint::OpenFile(path).status();
}

void ExpectErrorMentions(const absl::Status& s, const std::vector<std::string>& words) {
  ASSERT_FALSE(s.ok());
  for (const std::string& w : words) {
    EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in: " << s;
  }
}

TEST(SafetensorsTest, ReadsF32F16Bf16AsFloat) {
  std::string data = FloatBytes({1.5f, -2.0f});
  const uint16_t f16[2] = {0x3c00, 0xc000};                           // 1, -2
  const uint16_t bf16[2] = {FloatToBf16(0.25f), FloatToBf16(-3.0f)};  // exact in bf16
  data.append(reinterpret_cast<const char*>(f16), 4);
  data.append(reinterpret_cast<const char*>(bf16), 4);
  nlohmann::json h = {{"__metadata__", {{"format", "pt"}}},
                      {"a", Entry("F32", {2}, 0, 8)},
                      {"b", Entry("F16", {1, 2}, 8, 12)},
                      {"c", Entry("BF16", {2, 1}, 12, 16)}};
  const std::string path = TempPath("ok.safetensors");
  WriteBytes(path, Safetensors(h.dump(), data));
  absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->num_tensors(), 3u);
  EXPECT_EQ(*ckpt->ReadF32("a", {2}), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(*ckpt->ReadF32("b", {1, 2}), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(*ckpt->ReadF32("c", {2, 1}), (std::vector<float>{0.25f, -3.0f}));
}

TEST(SafetensorsTest, RejectsTruncatedFiles) {
  ExpectErrorMentions(OpenWritten("tiny.safetensors", "abc"), {"tiny.safetensors"});
  // Declares a 1000-byte header in a 30-byte file.
  ExpectErrorMentions(OpenWritten("short.safetensors", LengthPrefix(1000) + "{\"a\": 1}"),
                      {"short.safetensors", "past the end"});
}

TEST(SafetensorsTest, RejectsHeaderOverLimit) {
  ExpectErrorMentions(OpenWritten("huge.safetensors", LengthPrefix(200ull << 20) + "{}"),
                      {"huge.safetensors", "exceeds"});
  ExpectErrorMentions(OpenWritten("max.safetensors", LengthPrefix(~0ull) + "{}"),
                      {"max.safetensors"});
}

TEST(SafetensorsTest, RejectsBadJson) {
  ExpectErrorMentions(OpenWritten("json.safetensors", Safetensors("{\"a\": [1, ", "")),
                      {"json.safetensors", "malformed JSON"});
  ExpectErrorMentions(OpenWritten("array.safetensors", Safetensors("[1, 2]", "")),
                      {"array.safetensors"});
  nlohmann::json h = {{"a", "not an entry"}};
  ExpectErrorMentions(OpenWritten("entry.safetensors", Safetensors(h.dump(), "")),
                      {"entry.safetensors", "'a'"});
  h = {{"a", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}}};
  ExpectErrorMentions(OpenWritten("dim.safetensors", Safetensors(h.dump(), FloatBytes({1}))),
                      {"dim.safetensors", "'a'", "shape"});
}

TEST(SafetensorsTest, RejectsOffsetsOutsideDataSection) {
  nlohmann::json h = {{"w", Entry("F32", {4}, 0, 16)}};
  ExpectErrorMentions(OpenWritten("oob.safetensors", Safetensors(h.dump(), FloatBytes({1, 2}))),
                      {"oob.safetensors", "'w'", "outside the data section"});
  h = {{"w", Entry("F32", {1}, 8, 4)}};  // end before begin
  ExpectErrorMentions(
      OpenWritten("reversed.safetensors", Safetensors(h.dump(), FloatBytes({1, 2, 3}))),
      {"reversed.safetensors", "'w'"});
  h = {{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0}}}}};
  ExpectErrorMentions(OpenWritten("one.safetensors", Safetensors(h.dump(), FloatBytes({1}))),
                      {"one.safetensors", "'w'", "data_offsets"});
}

TEST(SafetensorsTest, RejectsOverlappingTensors) {
  nlohmann::json h = {{"a", Entry("F32", {2}, 0, 8)}, {"b", Entry("F32", {2}, 4, 12)}};
  ExpectErrorMentions(
      OpenWritten("overlap.safetensors", Safetensors(h.dump(), FloatBytes({1, 2, 3}))),
      {"overlap.safetensors", "overlaps"});
}

TEST(SafetensorsTest, RejectsSizeNotMatchingShapeAndDtype) {
  nlohmann::json h = {{"w", Entry("BF16", {3}, 0, 8)}};  // needs 6 bytes
  ExpectErrorMentions(OpenWritten("size.safetensors", Safetensors(h.dump(), FloatBytes({1, 2}))),
                      {"size.safetensors", "'w'", "needs 6"});
  // A shape whose byte count overflows 64 bits.
  h = {{"w", Entry("F32", {1ll << 40, 1ll << 40}, 0, 8)}};
  ExpectErrorMentions(OpenWritten("ovf.safetensors", Safetensors(h.dump(), FloatBytes({1, 2}))),
                      {"ovf.safetensors", "'w'"});
}

TEST(SafetensorsTest, RejectsUnknownAndUnsupportedDtypes) {
  nlohmann::json h = {{"w", Entry("F12", {2}, 0, 8)}};
  ExpectErrorMentions(OpenWritten("dtype.safetensors", Safetensors(h.dump(), FloatBytes({1, 2}))),
                      {"dtype.safetensors", "'w'", "unknown dtype 'F12'"});
  h = {{"w", Entry("I32", {2}, 0, 8)}};  // a valid dtype the model cannot use
  const std::string path = TempPath("i32.safetensors");
  WriteBytes(path, Safetensors(h.dump(), FloatBytes({1, 2})));
  absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ExpectErrorMentions(ckpt->ReadF32("w", {2}).status(), {"i32.safetensors", "'w'", "I32"});
}

TEST(SafetensorsTest, RejectsWrongShapeAndMissingTensor) {
  nlohmann::json h = {{"w", Entry("F32", {2, 2}, 0, 16)}};
  const std::string path = TempPath("shape.safetensors");
  WriteBytes(path, Safetensors(h.dump(), FloatBytes({1, 2, 3, 4})));
  absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ExpectErrorMentions(ckpt->ReadF32("w", {4}).status(),
                      {"shape.safetensors", "'w'", "[2, 2]", "[4]"});
  ExpectErrorMentions(ckpt->ReadF32("v", {4}).status(), {"shape.safetensors", "'v'", "missing"});
}

// Writes dir/model.safetensors.index.json mapping each tensor to a shard.
std::string WriteIndex(const std::string& dir_name, const nlohmann::json& weight_map) {
  const std::string dir = TempPath(dir_name);
  std::filesystem::create_directories(dir);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  WriteBytes(dir + "/model.safetensors.index.json", index.dump());
  return dir;
}

TEST(SafetensorsTest, ReadsShardsThroughIndex) {
  const std::string dir = WriteIndex("sharded", {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  WriteBytes(dir + "/s1.safetensors",
             Safetensors(nlohmann::json{{"a", Entry("F32", {1}, 0, 4)}}.dump(), FloatBytes({7})));
  WriteBytes(dir + "/s2.safetensors",
             Safetensors(nlohmann::json{{"b", Entry("F32", {1}, 0, 4)}}.dump(), FloatBytes({9})));
  absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenDir(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(*ckpt->ReadF32("a", {1}), std::vector<float>{7});
  EXPECT_EQ(*ckpt->ReadF32("b", {1}), std::vector<float>{9});
}

TEST(SafetensorsTest, RejectsIndexNamingMissingShard) {
  const std::string dir = WriteIndex("noshard", {{"a", "gone.safetensors"}});
  ExpectErrorMentions(SafetensorsCheckpoint::OpenDir(dir).status(),
                      {"model.safetensors.index.json", "'a'", "gone.safetensors"});
}

TEST(SafetensorsTest, RejectsIndexEscapingTheDirectory) {
  const std::string dir = WriteIndex("escape", {{"a", "../ok.safetensors"}});
  ExpectErrorMentions(SafetensorsCheckpoint::OpenDir(dir).status(),
                      {"model.safetensors.index.json", "'a'"});
}

TEST(SafetensorsTest, RejectsIndexEntryAbsentFromItsShard) {
  const std::string dir = WriteIndex("absent", {{"a", "s1.safetensors"}});
  WriteBytes(dir + "/s1.safetensors",
             Safetensors(nlohmann::json{{"b", Entry("F32", {1}, 0, 4)}}.dump(), FloatBytes({7})));
  ExpectErrorMentions(SafetensorsCheckpoint::OpenDir(dir).status(), {"'a'", "s1.safetensors"});
}

TEST(SafetensorsTest, RejectsBadIndexJson) {
  const std::string dir = TempPath("badindex");
  std::filesystem::create_directories(dir);
  WriteBytes(dir + "/model.safetensors.index.json", "{\"weight_map\": 3}");
  ExpectErrorMentions(SafetensorsCheckpoint::OpenDir(dir).status(),
                      {"model.safetensors.index.json", "weight_map"});
  EXPECT_EQ(SafetensorsCheckpoint::OpenDir(TempPath("empty_dir_absent")).status().code(),
            absl::StatusCode::kNotFound);
}

// The floats a tensor's raw bytes stand for, widened the way the reader documents.
std::vector<float> Widen(const std::string& bytes, size_t begin, size_t end, const char* dtype) {
  std::vector<float> out;
  for (size_t i = begin; i < end;) {
    if (std::strcmp(dtype, "F32") == 0) {
      float f;
      std::memcpy(&f, bytes.data() + i, 4);
      out.push_back(f);
      i += 4;
      continue;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + i, 2);
    out.push_back(std::strcmp(dtype, "BF16") == 0 ? Bf16ToFloat(h) : Fp16ToFloat(h));
    i += 2;
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Random truncations and byte flips of a valid file. Every truncation loses the last tensor's
// bytes, so it is an error naming the file; a flip inside the data section leaves the header
// valid, so the file opens and each tensor reads back exactly the flipped bytes; a flip in the
// length prefix or header gives either an error naming the file or a checkpoint whose every
// readable tensor has the size its shape says. None may crash (ASan builds check the reads).
TEST(SafetensorsTest, RandomCorruptionsAreErrorsOrExactReads) {
  struct Spec {
    const char* name;
    const char* dtype;
    std::vector<int64_t> shape;
    size_t begin, end;
  };
  const std::vector<Spec> specs = {
      {"a", "F32", {2, 2}, 0, 16}, {"b", "BF16", {4}, 16, 24}, {"c", "F16", {2}, 24, 28}};
  nlohmann::json h = {{"__metadata__", {{"format", "pt"}}}};
  for (const Spec& t : specs) h[t.name] = Entry(t.dtype, t.shape, t.begin, t.end);
  const std::string header = h.dump();
  const size_t data_start = 8 + header.size();
  const std::string good = Safetensors(header, FloatBytes({1, 2, 3, 4, 5, 6, 7}));
  ASSERT_EQ(good.size(), data_start + 28);
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(state >> 33);
  };
  const std::string path = TempPath("fuzz.safetensors");
  int truncated = 0, data_flips = 0, header_errors = 0, header_opens = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = good;
    bool header_touched = false;
    if (i % 3 == 0) {
      bytes.resize(next() % bytes.size());
    } else {
      for (int k = 0; k < 1 + i % 4; ++k) {
        const size_t at = next() % bytes.size();
        bytes[at] = static_cast<char>(next());
        header_touched |= at < data_start;
      }
    }
    WriteBytes(path, bytes);
    absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::OpenFile(path);
    SCOPED_TRACE(::testing::Message() << "case " << i << ", " << bytes.size() << " bytes");
    if (!ckpt.ok()) {
      EXPECT_NE(ckpt.status().message().find("fuzz.safetensors"), std::string::npos)
          << ckpt.status();
    }
    if (i % 3 == 0) {
      EXPECT_FALSE(ckpt.ok()) << "a truncated file opened";
      ++truncated;
      continue;
    }
    if (!header_touched) {
      ASSERT_TRUE(ckpt.ok()) << ckpt.status();
      ++data_flips;
      for (const Spec& t : specs) {
        absl::StatusOr<std::vector<float>> got = ckpt->ReadF32(t.name, t.shape);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE(SameBits(*got, Widen(bytes, data_start + t.begin, data_start + t.end, t.dtype)))
            << t.name;
      }
      continue;
    }
    if (!ckpt.ok()) {
      ++header_errors;
      continue;
    }
    ++header_opens;
    for (const Spec& t : specs) {
      const TensorInfo* info = ckpt->Find(t.name);
      if (info == nullptr) continue;
      absl::StatusOr<std::vector<float>> got = ckpt->ReadF32(t.name, info->shape);
      if (!got.ok()) continue;
      int64_t n = 1;
      for (int64_t d : info->shape) n *= d;
      EXPECT_EQ(static_cast<int64_t>(got->size()), n) << t.name;
    }
  }
  // Each kind of case happened, so each branch above was exercised.
  EXPECT_EQ(truncated, 100);
  EXPECT_GT(data_flips, 0);
  EXPECT_GT(header_errors, 0);
  EXPECT_EQ(truncated + data_flips + header_errors + header_opens, 300);
}

TEST(SafetensorsTest, ModelLoadNamesTheFirstMissingTensor) {
  // A real config with a checkpoint holding only the embedding.
  const std::string dir = TempPath("partial_model");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(
      std::string(SPECD_SHARED_DIR) + "/models/tiny-random/llama3/config.json",
      dir + "/config.json", std::filesystem::copy_options::overwrite_existing);
  const std::vector<float> embed(1024 * 64, 0.5f);
  LoadOptions one_thread;
  one_thread.num_threads = 1;
  nlohmann::json h = {{"model.embed_tokens.weight", Entry("F32", {1024, 64}, 0, 1024 * 64 * 4)}};
  WriteBytes(dir + "/model.safetensors", Safetensors(h.dump(), FloatBytes(embed)));
  ExpectErrorMentions(Model::Load(dir, one_thread).status(),
                      {"model.layers.0.input_layernorm.weight", "missing"});
  h = {{"model.embed_tokens.weight", Entry("F32", {64, 1024}, 0, 1024 * 64 * 4)}};
  WriteBytes(dir + "/model.safetensors", Safetensors(h.dump(), FloatBytes(embed)));
  ExpectErrorMentions(Model::Load(dir, one_thread).status(),
                      {"model.safetensors", "model.embed_tokens.weight", "[1024, 64]"});
}

}  // namespace
}  // namespace specd
