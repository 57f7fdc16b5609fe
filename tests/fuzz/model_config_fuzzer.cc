// libFuzzer target: config.json and generation_config.json text (engine/model/model_config),
// as a model directory from an untrusted source would hold them. A config that parses must
// be usable: positive sizes that divide as the forward pass assumes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace specd::fuzz {
namespace {

void FuzzOne(std::string_view text) {
  QuietLogs();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text, "config.json");
  GenerationConfig base;
  if (config.ok()) {
    FUZZ_CHECK(config->vocab_size > 0 && config->hidden_size > 0 && config->num_layers > 0,
               "non-positive sizes");
    FUZZ_CHECK(config->num_heads > 0 && config->num_kv_heads > 0 && config->head_dim > 0,
               "non-positive head counts");
    // q_size() and kv_size() are int32 products.
    FUZZ_CHECK(int64_t{config->num_heads} * config->head_dim <= INT32_MAX,
               absl::StrCat(config->num_heads, " heads of ", config->head_dim));
    FUZZ_CHECK(config->num_heads % config->num_kv_heads == 0,
               absl::StrCat(config->num_heads, " heads, ", config->num_kv_heads, " kv heads"));
    base = config->generation;
  }
  (void)ParseGenerationConfig(text, "generation_config.json", base);
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
