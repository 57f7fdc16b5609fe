// libFuzzer target: a tokenizer.json file (the input) loaded with Tokenizer::FromDir, as a
// model directory from an untrusted source would be. A file that loads must then encode
// and decode without crashing: encoded ids inside the vocabulary, decoded text valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_fixture.h"

namespace specd::fuzz {
namespace {

void FuzzOne(std::string_view json) {
  static ScratchDir dir;
  QuietLogs();
  dir.WriteFile("tokenizer.json", json);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDir(dir.path());
  if (tok.ok()) CheckLoadedTokenizer(**tok);
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
