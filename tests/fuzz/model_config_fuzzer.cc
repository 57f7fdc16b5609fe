// libFuzzer target: config.json and generation_config.json text (engine/model/model_config),
// and an EAGLE-3 head's config.json (engine/model/eagle3_head.h) against a codepair-shaped
// target, as a model directory from an untrusted source would hold them. A config that parses
// must be usable: positive sizes that divide as the forward pass assumes; a head's layer ids
// inside the target and its vocabularies consistent.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model/eagle3_head.h"
#include "engine/model/model_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace specd::fuzz {
namespace {

// The head's config against the codepair target's shape (6 layers, hidden 384, vocab 8192).
void FuzzEagle3(std::string_view text) {
  ModelConfig target;
  target.vocab_size = 8192;
  target.hidden_size = 384;
  target.num_layers = 6;
  absl::StatusOr<Eagle3Config> head = ParseEagle3Config(text, "config.json", target);
  if (!head.ok()) return;
  FUZZ_CHECK(head->layer.num_layers == 1 && head->layer.vocab_size == target.vocab_size,
             "a head of another shape");
  FUZZ_CHECK(head->draft_vocab_size >= 1 && head->draft_vocab_size <= target.vocab_size,
             absl::StrCat("draft vocabulary ", head->draft_vocab_size));
  FUZZ_CHECK(head->target_hidden_size == target.hidden_size, "target hidden size");
  FUZZ_CHECK(head->aux_layer_ids.size() == 3, "not three layer ids");
  for (int32_t id : head->aux_layer_ids) {
    FUZZ_CHECK(id >= 0 && id < target.num_layers, absl::StrCat("layer id ", id));
  }
}

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
  FuzzEagle3(text);
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
