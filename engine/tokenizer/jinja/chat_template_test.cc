// Real chat templates rendered through the public API. Templates are the exact
// chat_template strings of the models' tokenizer_config.json (testdata/, sources in
// testdata/SOURCES.md; codepair's is read from shared/). Expected prompts are written out
// by hand from each model's documented prompt format.
#include "engine/tokenizer/jinja/chat_template.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using ::nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

ChatTemplate LoadTestdata(const std::string& name) {
  const std::string source =
      ReadFile(std::string(SPECD_SOURCE_DIR) + "/engine/tokenizer/jinja/testdata/" + name);
  EXPECT_FALSE(source.empty()) << name;
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(source);
  EXPECT_TRUE(tmpl.ok()) << name << ": " << tmpl.status();
  return *std::move(tmpl);
}

// Renders with ApplyChatTemplateOrdered; errors come back as "ERROR: <message>".
std::string Apply(const ChatTemplate& tmpl, const ordered_json& messages,
                  bool add_generation_prompt, const std::string& bos, const std::string& eos,
                  const ordered_json& extra = ordered_json::object(),
                  const ChatTemplateOptions& options = {}) {
  absl::StatusOr<std::string> out =
      ApplyChatTemplateOrdered(tmpl, messages, add_generation_prompt, bos, eos, extra, options);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

ordered_json Msg(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// user / assistant / user.
ordered_json Conversation() {
  return ordered_json::array(
      {Msg("user", "Hello"), Msg("assistant", "Hi there!"), Msg("user", "How are you?")});
}

ordered_json WithSystem(ordered_json messages) {
  messages.insert(messages.begin(), Msg("system", "You are a helpful assistant."));
  return messages;
}

// A tool as transformers' get_json_schema() builds it (key order matters for tojson).
ordered_json WeatherTool() {
  return ordered_json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "description": "Get the current weather for a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "description": "The city name"}},
      "required": ["city"]}}})");
}

// user question, assistant tool call, tool result.
ordered_json ToolConversation() {
  ordered_json call = ordered_json::parse(R"({"role": "assistant", "content": "",
      "tool_calls": [{"id": "call00001", "type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})");
  return ordered_json::array(
      {Msg("user", "What is the weather in Paris?"), call, Msg("tool", "21 degrees")});
}

TEST(ChatTemplateTest, AllTestdataTemplatesParse) {
  for (const char* name :
       {"meta-llama-3-8b-instruct.jinja", "meta-llama-3.1-8b-instruct.jinja",
        "meta-llama-3.2-3b-instruct.jinja", "qwen2.5-7b-instruct.jinja", "qwen3-0.6b.jinja",
        "mistral-7b-instruct-v0.3.jinja", "gemma-2-2b-it.jinja", "smollm2-1.7b-instruct.jinja",
        "phi-3.5-mini-instruct.jinja"}) {
    absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(
        ReadFile(std::string(SPECD_SOURCE_DIR) + "/engine/tokenizer/jinja/testdata/" + name));
    EXPECT_TRUE(tmpl.ok()) << name << ": " << tmpl.status();
  }
}

TEST(ChatTemplateTest, CodepairRendersSystemUserAssistantTurns) {
  const ordered_json config = ordered_json::parse(
      ReadFile(std::string(SPECD_SHARED_DIR) + "/models/codepair/target/tokenizer_config.json"));
  absl::StatusOr<ChatTemplate> tmpl =
      ChatTemplate::Parse(config["chat_template"].get<std::string>());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const ordered_json messages =
      ordered_json::array({Msg("system", "You write Python."), Msg("user", "Sort a list"),
                           Msg("assistant", "sorted(xs)"), Msg("user", "Reverse it")});
  // System text is followed by a newline; user and assistant turns are tagged and closed.
  EXPECT_EQ(Apply(*tmpl, messages, true, "<|begin_of_text|>", "<|end_of_text|>"),
            "<|begin_of_text|>You write Python.\n<|user|>Sort a list<|end_of_turn|>"
            "<|assistant|>sorted(xs)<|end_of_turn|><|user|>Reverse it<|end_of_turn|>"
            "<|assistant|>");
  EXPECT_EQ(Apply(*tmpl, messages, false, "<|begin_of_text|>", "<|end_of_text|>"),
            "<|begin_of_text|>You write Python.\n<|user|>Sort a list<|end_of_turn|>"
            "<|assistant|>sorted(xs)<|end_of_turn|><|user|>Reverse it<|end_of_turn|>");
  // The plain nlohmann::json entry point renders the same.
  absl::StatusOr<std::string> plain = ApplyChatTemplate(
      *tmpl, nlohmann::json::parse(messages.dump()), true, "<|begin_of_text|>", "<|end_of_text|>");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, Apply(*tmpl, messages, true, "<|begin_of_text|>", "<|end_of_text|>"));
}

TEST(ChatTemplateTest, Llama3MatchesMetaPromptFormat) {
  const ChatTemplate tmpl = LoadTestdata("meta-llama-3-8b-instruct.jinja");
  EXPECT_EQ(Apply(tmpl,
                  ordered_json::array(
                      {Msg("system", "You are a helpful assistant."), Msg("user", "Hello")}),
                  true, "<|begin_of_text|>", "<|eot_id|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "You are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
            "Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  ordered_json messages = Conversation();
  messages[1]["content"] = "  Hi there!  ";  // contents are trimmed
  EXPECT_EQ(Apply(tmpl, messages, false, "<|begin_of_text|>", "<|eot_id|>"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>");
}

TEST(ChatTemplateTest, Llama31AddsTheDatedSystemHeader) {
  const ChatTemplate tmpl = LoadTestdata("meta-llama-3.1-8b-instruct.jinja");
  EXPECT_EQ(Apply(tmpl, ordered_json::array({Msg("user", "Hello")}), true, "<|begin_of_text|>",
                  "<|eot_id|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Apply(tmpl, WithSystem(Conversation()), false, "<|begin_of_text|>", "<|eot_id|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are a helpful assistant.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>");
}

TEST(ChatTemplateTest, Llama31JsonToolCallingPutsToolsInTheFirstUserMessage) {
  const ChatTemplate tmpl = LoadTestdata("meta-llama-3.1-8b-instruct.jinja");
  const ordered_json extra = {{"tools", ordered_json::array({WeatherTool()})}};
  EXPECT_EQ(Apply(tmpl, ToolConversation(), true, "<|begin_of_text|>", "<|eot_id|>", extra),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Environment: ipython\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n"
            "Given the following functions, please respond with a JSON for a function call with "
            "its proper arguments that best answers the given prompt.\n\n"
            "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
            "argument name and its value}.Do not use variables.\n\n"
            "{\n"
            "    \"type\": \"function\",\n"
            "    \"function\": {\n"
            "        \"name\": \"get_weather\",\n"
            "        \"description\": \"Get the current weather for a city\",\n"
            "        \"parameters\": {\n"
            "            \"type\": \"object\",\n"
            "            \"properties\": {\n"
            "                \"city\": {\n"
            "                    \"type\": \"string\",\n"
            "                    \"description\": \"The city name\"\n"
            "                }\n"
            "            },\n"
            "            \"required\": [\n"
            "                \"city\"\n"
            "            ]\n"
            "        }\n"
            "    }\n"
            "}\n\n"
            "What is the weather in Paris?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n"
            "\"21 degrees\"<|eot_id|>"  // a string is iterable, so the template JSON-encodes it
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Two tool calls in one message are refused by the template.
  ordered_json two_calls = ToolConversation();
  two_calls[1]["tool_calls"].push_back(two_calls[1]["tool_calls"][0]);
  EXPECT_EQ(Apply(tmpl, two_calls, true, "<|begin_of_text|>", "<|eot_id|>", extra),
            "ERROR: This model only supports single tool-calls at once!");
}

TEST(ChatTemplateTest, Llama32DatesThePromptWithStrftimeNow) {
  const ChatTemplate tmpl = LoadTestdata("meta-llama-3.2-3b-instruct.jinja");
  ChatTemplateOptions options;
  options.now = absl::FromCivil(absl::CivilSecond(2025, 2, 10, 9, 0, 0), absl::UTCTimeZone());
  options.time_zone = absl::UTCTimeZone();
  EXPECT_EQ(Apply(tmpl, ordered_json::array({Msg("user", "Hello")}), true, "<|begin_of_text|>",
                  "<|eot_id|>", ordered_json::object(), options),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 10 Feb 2025\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // A date_string kwarg wins over the clock.
  EXPECT_EQ(
      Apply(tmpl, ordered_json::array({Msg("system", "Be brief."), Msg("user", "Hello")}), false,
            "<|begin_of_text|>", "<|eot_id|>", {{"date_string", "01 Jan 2030"}}, options),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2030\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>");
}

TEST(ChatTemplateTest, Qwen25UsesChatMlWithItsDefaultSystemPrompt) {
  const ChatTemplate tmpl = LoadTestdata("qwen2.5-7b-instruct.jinja");
  EXPECT_EQ(Apply(tmpl, ordered_json::array({Msg("user", "Hello")}), true, "", "<|im_end|>"),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Apply(tmpl, WithSystem(Conversation()), false, "", "<|im_end|>"),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n"
            "<|im_start|>user\nHow are you?<|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen25ToolCallingFollowsTheHermesFormat) {
  const ChatTemplate tmpl = LoadTestdata("qwen2.5-7b-instruct.jinja");
  EXPECT_EQ(
      Apply(tmpl, ToolConversation(), true, "", "<|im_end|>",
            {{"tools", ordered_json::array({WeatherTool()})}}),
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
      "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
      "\"Get the current weather for a city\", \"parameters\": {\"type\": \"object\", "
      "\"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city name\"}}, "
      "\"required\": [\"city\"]}}}\n</tools>\n\n"
      "For each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
      "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n21 degrees\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Qwen3HandlesThinking) {
  const ChatTemplate tmpl = LoadTestdata("qwen3-0.6b.jinja");
  EXPECT_EQ(Apply(tmpl, ordered_json::array({Msg("user", "Hello")}), true, "", "<|im_end|>"),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  // enable_thinking=False pre-fills an empty think block.
  EXPECT_EQ(Apply(tmpl, ordered_json::array({Msg("user", "Hello")}), true, "", "<|im_end|>",
                  {{"enable_thinking", false}}),
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Earlier turns keep only the answer; the reasoning after the last user query stays.
  const ordered_json history = ordered_json::array(
      {Msg("system", "Be exact."), Msg("user", "2+2?"),
       Msg("assistant", "<think>\nAdd them.\n</think>\n\n4"), Msg("user", "And 3+3?")});
  EXPECT_EQ(Apply(tmpl, history, true, "", "<|im_end|>"),
            "<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n");
  ordered_json answered = history;
  answered.push_back(Msg("assistant", "<think>\nAdd again.\n</think>\n\n6"));
  EXPECT_EQ(Apply(tmpl, answered, false, "", "<|im_end|>"),
            "<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nAdd again.\n</think>\n\n6<|im_end|>\n");
}

TEST(ChatTemplateTest, MistralV03UsesInstTagsAndRequiresAlternatingRoles) {
  const ChatTemplate tmpl = LoadTestdata("mistral-7b-instruct-v0.3.jinja");
  EXPECT_EQ(Apply(tmpl, Conversation(), true, "<s>", "</s>"),
            "<s>[INST] Hello[/INST] Hi there!</s>[INST] How are you?[/INST]");
  // The system prompt goes in front of the last user message.
  EXPECT_EQ(Apply(tmpl, WithSystem(Conversation()), false, "<s>", "</s>"),
            "<s>[INST] Hello[/INST] Hi there!</s>"
            "[INST] You are a helpful assistant.\n\nHow are you?[/INST]");
  const std::string alternate =
      "ERROR: After the optional system message, conversation roles must alternate "
      "user/assistant/user/assistant/...";
  EXPECT_EQ(
      Apply(tmpl, ordered_json::array({Msg("user", "a"), Msg("user", "b")}), true, "<s>", "</s>"),
      alternate);
  EXPECT_EQ(Apply(tmpl, ordered_json::array({Msg("assistant", "a")}), true, "<s>", "</s>"),
            alternate);
  absl::StatusOr<std::string> status =
      ApplyChatTemplate(tmpl, nlohmann::json::parse(R"([{"role": "user", "content": "a"},
                                      {"role": "user", "content": "b"}])"),
                        true, "<s>", "</s>");
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, Gemma2MapsAssistantToModelAndRejectsSystem) {
  const ChatTemplate tmpl = LoadTestdata("gemma-2-2b-it.jinja");
  EXPECT_EQ(Apply(tmpl, Conversation(), true, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there!"
            "<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(Apply(tmpl, WithSystem(Conversation()), true, "<bos>", "<eos>"),
            "ERROR: System role not supported");
  EXPECT_EQ(Apply(tmpl, ordered_json::array({Msg("assistant", "Hi")}), true, "<bos>", "<eos>"),
            "ERROR: Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(ChatTemplateTest, SmolLm2AddsItsDefaultSystemMessage) {
  const ChatTemplate tmpl = LoadTestdata("smollm2-1.7b-instruct.jinja");
  // The example conversation of Hugging Face's course chapter on chat templates.
  const ordered_json messages = ordered_json::array(
      {Msg("user", "I need help with my order"),
       Msg("assistant", "I'd be happy to help. Could you provide your order number?"),
       Msg("user", "It's ORDER-123")});
  EXPECT_EQ(Apply(tmpl, messages, true, "<|im_start|>", "<|im_end|>"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nI need help with my order<|im_end|>\n"
            "<|im_start|>assistant\nI'd be happy to help. Could you provide your order number?"
            "<|im_end|>\n<|im_start|>user\nIt's ORDER-123<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Phi35EndsWithEosWithoutAGenerationPrompt) {
  const ChatTemplate tmpl = LoadTestdata("phi-3.5-mini-instruct.jinja");
  const ordered_json messages =
      ordered_json::array({Msg("system", "You are a helpful assistant."),
                           Msg("user", "How to explain Internet for a medieval knight?")});
  EXPECT_EQ(Apply(tmpl, messages, true, "<s>", "<|endoftext|>"),
            "<|system|>\nYou are a helpful assistant.<|end|>\n"
            "<|user|>\nHow to explain Internet for a medieval knight?<|end|>\n<|assistant|>\n");
  EXPECT_EQ(Apply(tmpl, messages, false, "<s>", "<|endoftext|>"),
            "<|system|>\nYou are a helpful assistant.<|end|>\n"
            "<|user|>\nHow to explain Internet for a medieval knight?<|end|>\n<|endoftext|>");
}

}  // namespace
}  // namespace specd
