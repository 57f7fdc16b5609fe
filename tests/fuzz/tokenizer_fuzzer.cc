// libFuzzer target: encode and decode with real tokenizers (tokenizer_fixture.h). Input: one
// control byte (tokenizer, add_special / skip_special, where a literal range starts), then
// text. Checks what tokenizer.h promises: Encode and EncodeWithLiteralRanges succeed exactly
// on valid UTF-8 and yield ids inside the vocabulary, Decode of any ids inside it is valid
// UTF-8, ids outside it are an error, and the byte-level tokenizer round-trips its input
// exactly (special-token text inside a literal range included).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_fixture.h"

namespace specd::fuzz {
namespace {

// Encodes with literal [literal_begin, end): ids in range, decoding back to `text` for the
// byte-level tokenizer. An empty range must change nothing.
void CheckLiteralRanges(const Tokenizer& tok, FixtureTokenizer which, std::string_view text,
                        bool add_special, size_t literal_begin,
                        const std::vector<int32_t>& plain_ids) {
  const std::pair<size_t, size_t> literal[] = {{literal_begin, text.size()}};
  absl::StatusOr<std::vector<int32_t>> ids =
      tok.EncodeWithLiteralRanges(text, add_special, literal);
  FUZZ_CHECK(ids.ok(), ids.status().ToString());
  if (literal_begin == text.size()) FUZZ_CHECK(*ids == plain_ids, "an empty range changed ids");
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), absl::StrCat("id ", id));
  absl::StatusOr<std::string> decoded = tok.Decode(*ids, false);
  FUZZ_CHECK(decoded.ok() && IsValidUtf8(*decoded), decoded.status().ToString());
  if (which == FixtureTokenizer::kCodepairByteLevel && !add_special) {
    FUZZ_CHECK(*decoded == text, absl::StrCat("literal round trip gave '", *decoded, "'"));
  }
}

void CheckEncodeDecode(const Tokenizer& tok, FixtureTokenizer which, std::string_view text,
                       bool add_special, bool skip_special, size_t literal_begin) {
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, add_special);
  const bool valid = IsValidUtf8(text);
  FUZZ_CHECK(ids.ok() == valid, ids.status().ToString());
  if (!ids.ok()) {
    const std::pair<size_t, size_t> literal[] = {{literal_begin, text.size()}};
    FUZZ_CHECK(!tok.EncodeWithLiteralRanges(text, add_special, literal).ok(), "invalid UTF-8");
    return;
  }
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), absl::StrCat("id ", id));
  absl::StatusOr<std::string> decoded = tok.Decode(*ids, skip_special);
  FUZZ_CHECK(decoded.ok(), decoded.status().ToString());
  FUZZ_CHECK(IsValidUtf8(*decoded), *decoded);
  if (which == FixtureTokenizer::kCodepairByteLevel && !add_special && !skip_special) {
    FUZZ_CHECK(*decoded == text, absl::StrCat("round trip gave '", *decoded, "'"));
  }
  CheckLiteralRanges(tok, which, text, add_special, literal_begin, *ids);
}

// The same bytes read as little-endian u16 ids, a few past the vocabulary's end.
void CheckDecodeIds(const Tokenizer& tok, std::string_view bytes, bool skip_special) {
  std::vector<int32_t> ids;
  bool in_range = true;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    const uint32_t raw = static_cast<uint8_t>(bytes[i]) | static_cast<uint8_t>(bytes[i + 1]) << 8;
    const int32_t id = static_cast<int32_t>(raw % static_cast<uint32_t>(tok.vocab_size() + 4));
    in_range = in_range && id < tok.vocab_size();
    ids.push_back(id);
  }
  absl::StatusOr<std::string> text = tok.Decode(ids, skip_special);
  FUZZ_CHECK(text.ok() == in_range, text.status().ToString());
  if (text.ok()) FUZZ_CHECK(IsValidUtf8(*text), *text);
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t control = data[0];
  const auto which = static_cast<FixtureTokenizer>(control % kNumFixtureTokenizers);
  const bool add_special = (control >> 2) & 1;
  const bool skip_special = (control >> 3) & 1;
  const Tokenizer& tok = GetFixtureTokenizer(which);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t literal_begin = text.size() * (control >> 5) / 8;  // whole text .. last eighth
  (void)tok.ContainsSpecialToken(text);
  CheckEncodeDecode(tok, which, text, add_special, skip_special, literal_begin);
  CheckDecodeIds(tok, text, skip_special);
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(data, size);
  return 0;
}
