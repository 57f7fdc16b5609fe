// libFuzzer target: the chat template engine (engine/tokenizer/jinja). Input: template source,
// a NUL byte, then the render context as JSON ({"messages": [...], "add_generation_prompt":
// ..., "tools": ...}); without the NUL the whole input is the template, rendered with a fixed
// conversation. Checks chat_template.h's promises: every problem is an InvalidArgument status
// (never a crash, hang or other code) and output stays within max_output_bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/tokenizer/jinja/chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

namespace specd::fuzz {
namespace {

using nlohmann::ordered_json;

constexpr std::string_view kDefaultContext = R"json({"messages": [
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": "Write f(x)."},
  {"role": "assistant", "content": "def f(x): return x", "tool_calls": [
    {"type": "function", "function": {"name": "run", "arguments": {"code": "f(1)"}}}]},
  {"role": "tool", "content": "1"},
  {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
  "tools": [{"type": "function", "function": {"name": "run", "parameters": {}}}]})json";

ChatTemplateOptions FuzzOptions() {
  ChatTemplateOptions options;
  options.max_output_bytes = size_t{1} << 20;
  options.max_steps = 200'000;  // keeps each input fast; the limit itself is under test
  options.now = absl::FromUnixSeconds(1'700'000'000);
  options.time_zone = absl::UTCTimeZone();
  return options;
}

void CheckResult(const absl::StatusOr<std::string>& out, const ChatTemplateOptions& options) {
  if (out.ok()) {
    FUZZ_CHECK(out->size() <= options.max_output_bytes, "output over the limit");
  } else {
    FUZZ_CHECK(absl::IsInvalidArgument(out.status()), out.status().ToString());
  }
}

void FuzzOne(std::string_view input) {
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  std::string_view context_text = kDefaultContext;
  if (nul != std::string_view::npos) context_text = input.substr(nul + 1);
  absl::StatusOr<ChatTemplate> tmpl =
      ChatTemplate::Parse(absl::string_view(source.data(), source.size()));
  if (!tmpl.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(tmpl.status()), tmpl.status().ToString());
    return;
  }
  const ordered_json context = ordered_json::parse(context_text, nullptr, false);
  if (!context.is_object()) return;
  const ChatTemplateOptions options = FuzzOptions();
  CheckResult(tmpl->RenderOrdered(context, options), options);
  const auto messages = context.find("messages");
  if (messages == context.end()) return;
  ordered_json extra = context;
  extra.erase("messages");
  CheckResult(ApplyChatTemplateOrdered(*tmpl, *messages, true, "<s>", "</s>", extra, options),
              options);
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
