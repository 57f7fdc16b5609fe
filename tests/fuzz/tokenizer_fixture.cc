#include "tests/fuzz/tokenizer_fixture.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/fuzz/fuzz_util.h"

namespace specd::fuzz {
namespace {

constexpr std::string_view kSample =
    "Hello world! def f(x):\n    return x  # caf\xC3\xA9 \xF0\x9F\xA6\x99 <s></s><|user|>";
// Decoding every id of a large vocabulary would dominate the run time; the first ones are
// the interesting (special, byte and merge) tokens.
constexpr int32_t kMaxDecodedIds = 512;

}  // namespace

void CheckLoadedTokenizer(const Tokenizer& tok) {
  const int32_t vocab = tok.vocab_size();
  for (bool add_special : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(kSample, add_special);
    if (!ids.ok()) continue;  // a vocabulary may lack pieces for the sample
    for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < vocab, absl::StrCat("id ", id));
    absl::StatusOr<std::string> text = tok.Decode(*ids, false);
    FUZZ_CHECK(text.ok(), text.status().ToString());
    FUZZ_CHECK(IsValidUtf8(*text), *text);
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < vocab && id < kMaxDecodedIds; ++id) all.push_back(id);
  for (bool skip : {false, true}) {
    absl::StatusOr<std::string> text = tok.Decode(all, skip);
    FUZZ_CHECK(text.ok(), text.status().ToString());
    FUZZ_CHECK(IsValidUtf8(*text), *text);
  }
  for (int32_t id : {-1, vocab}) {
    FUZZ_CHECK(!tok.Decode(std::vector<int32_t>{id}, false).ok(), absl::StrCat("id ", id));
  }
}

const Tokenizer& GetFixtureTokenizer(FixtureTokenizer which) {
  static const std::string kDirs[kNumFixtureTokenizers] = {
      SPECD_SOURCE_DIR "/models/codepair/target",
      SPECD_SHARED_DIR "/models/stories260K/hf",
      SPECD_SHARED_DIR "/models/babyllama-tok105/hf",
  };
  static std::unique_ptr<Tokenizer> loaded[kNumFixtureTokenizers];
  const int i = static_cast<int>(which);
  if (loaded[i] == nullptr) {
    QuietLogs();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDir(kDirs[i]);
    FUZZ_CHECK(tok.ok(), tok.status().ToString());
    loaded[i] = *std::move(tok);
  }
  return *loaded[i];
}

}  // namespace specd::fuzz
