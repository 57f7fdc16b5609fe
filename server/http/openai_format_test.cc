#include "server/http/openai_format.h"

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd::http {
namespace {

constexpr char kModelDir[] = SPECD_SOURCE_DIR "/models/codepair/target";

Json ParseEvent(const std::string& event) {
  EXPECT_EQ(event.substr(0, 6), "data: ");
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  return Json::parse(event.substr(6, event.size() - 8));
}

ResponseMeta Meta(Endpoint endpoint) {
  ResponseMeta m;
  m.endpoint = endpoint;
  m.id = "cmpl-1";
  m.created = 1700000000;
  m.model = "codepair";
  return m;
}

GeneratedToken Token(int32_t id, float logprob, std::vector<TokenLogprob> top = {}) {
  GeneratedToken t;
  t.id = id;
  t.logprob = logprob;
  t.top = std::move(top);
  return t;
}

TEST(OpenAiFormatTest, CompletionResponseHasOpenAiShape) {
  Usage usage{5, 3, 2};
  Json body = Json::parse(
      FormatResponse(Meta(Endpoint::kCompletions), {{"abc", {}, FinishReason::kLength}}, usage));
  EXPECT_EQ(body["id"], "cmpl-1");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "codepair");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["text"], "abc");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["usage"]["total_tokens"], 8);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST(OpenAiFormatTest, ChatResponseHasAssistantMessage) {
  ResponseMeta meta = Meta(Endpoint::kChat);
  Json body = Json::parse(FormatResponse(
      meta, {{"hi", {}, FinishReason::kStop}, {"yo", {}, FinishReason::kLength}}, {}));
  EXPECT_EQ(body["object"], "chat.completion");
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
}

TEST(OpenAiFormatTest, ChatStreamIsRoleThenContentThenFinishThenUsageThenDone) {
  ResponseMeta meta = Meta(Endpoint::kChat);
  meta.include_usage = true;
  Json role = ParseEvent(RoleEvent(meta, 0));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(role.contains("usage") && role["usage"].is_null());
  int64_t offset = 0;
  Json content = ParseEvent(ContentEvent(meta, 0, "he", {}, &offset));
  EXPECT_EQ(content["choices"][0]["delta"]["content"], "he");
  EXPECT_FALSE(content["choices"][0]["delta"].contains("role"));
  Json finish = ParseEvent(FinishEvent(meta, 0, FinishReason::kStop));
  EXPECT_TRUE(finish["choices"][0]["delta"].empty());
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "stop");
  Json usage = ParseEvent(UsageEvent(meta, {1, 2, 0}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 3);
  EXPECT_EQ(DoneEvent(), "data: [DONE]\n\n");
}

TEST(OpenAiFormatTest, CompletionChunksCarryTextAndNoUsageKeyUnlessAsked) {
  ResponseMeta meta = Meta(Endpoint::kCompletions);
  int64_t offset = 0;
  Json chunk = ParseEvent(ContentEvent(meta, 2, "x", {}, &offset));
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  EXPECT_EQ(chunk["choices"][0]["text"], "x");
  EXPECT_FALSE(chunk.contains("usage"));
}

TEST(OpenAiFormatTest, UsageCarriesSpeculationOnlyWhenReported) {
  Usage usage{5, 9, 0};
  Json plain = Json::parse(
      FormatResponse(Meta(Endpoint::kCompletions), {{"abc", {}, FinishReason::kLength}}, usage));
  EXPECT_FALSE(plain["usage"].contains("speculation"));
  usage.report_speculation = true;
  Json none = Json::parse(UsageEvent(Meta(Endpoint::kChat), usage).substr(6));
  EXPECT_EQ(none["usage"]["speculation"], Json({{"num_drafts", 0},
                                                {"num_draft_tokens", 0},
                                                {"num_accepted_tokens", 0},
                                                {"mean_accepted_length", 0.0}}));
  usage.num_drafts = 4;
  usage.num_draft_tokens = 16;
  usage.num_accepted_tokens = 6;
  Json body = Json::parse(
      FormatResponse(Meta(Endpoint::kCompletions), {{"abc", {}, FinishReason::kLength}}, usage));
  const Json& s = body["usage"]["speculation"];
  EXPECT_EQ(s["num_drafts"], 4);
  EXPECT_EQ(s["num_draft_tokens"], 16);
  EXPECT_EQ(s["num_accepted_tokens"], 6);
  EXPECT_DOUBLE_EQ(s["mean_accepted_length"].get<double>(), 2.5);
  EXPECT_EQ(body["usage"]["total_tokens"], 14);
  EXPECT_FALSE(s.contains("by_method"));
  // Per method, summed over choices (auto used the draft model, then n-gram).
  usage.AddByMethod({{"draft_model", 3, 12, 5}});
  usage.AddByMethod({{"draft_model", 1, 4, 1}, {"ngram", 2, 6, 0}});
  body = Json::parse(UsageEvent(Meta(Endpoint::kChat), usage).substr(6));
  EXPECT_EQ(
      body["usage"]["speculation"]["by_method"],
      Json({{"draft_model",
             {{"num_drafts", 4}, {"num_draft_tokens", 16}, {"num_accepted_tokens", 6}}},
            {"ngram", {{"num_drafts", 2}, {"num_draft_tokens", 6}, {"num_accepted_tokens", 0}}}}));
  EXPECT_FALSE(body["usage"]["speculation"].contains("draft_context_stop"));
  // A choice grew past the draft model's context: where its drafts stopped.
  usage.draft_context_stop = 8192;
  body = Json::parse(UsageEvent(Meta(Endpoint::kChat), usage).substr(6));
  EXPECT_EQ(body["usage"]["speculation"]["draft_context_stop"], 8192);
}

TEST(OpenAiFormatTest, ErrorEventHasErrorObject) {
  Json e = ParseEvent(ErrorEvent(ToApiError(absl::DeadlineExceededError("late"))));
  EXPECT_EQ(e["error"]["type"], "timeout_error");
  EXPECT_EQ(e["error"]["message"], "late");
}

class LogprobsFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromDir(kModelDir);
    ASSERT_TRUE(tok.ok());
    tok_ = std::move(*tok);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(LogprobsFormatTest, CompletionLogprobsAreTheLegacyObject) {
  ResponseMeta meta = Meta(Endpoint::kCompletions);
  meta.logprobs = true;
  meta.top_logprobs = 2;
  meta.tokenizer = tok_.get();
  const std::vector<int32_t> ids = *tok_->Encode(" hello world", false);
  ASSERT_GE(ids.size(), 2u);
  std::vector<GeneratedToken> tokens = {
      Token(ids[0], -0.5f, {{ids[0], -0.5f}, {ids[1], -1.5f}}),
      Token(ids[1], -std::numeric_limits<float>::infinity(), {{ids[1], -0.1f}})};
  int64_t offset = 0;
  Json lp = ParseEvent(ContentEvent(meta, 0, "t", tokens, &offset))["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 2u);
  const std::string first = TokenText(tok_.get(), ids[0]);
  EXPECT_EQ(lp["tokens"][0], first);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][0].get<float>(), -0.5f);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -9999.0f);  // -inf is not JSON
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0][first].get<float>(), -0.5f);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1], static_cast<int64_t>(first.size()));
  EXPECT_EQ(offset, static_cast<int64_t>((first + TokenText(tok_.get(), ids[1])).size()));
}

TEST_F(LogprobsFormatTest, ChatLogprobsListTokensWithBytes) {
  ResponseMeta meta = Meta(Endpoint::kChat);
  meta.logprobs = true;
  meta.top_logprobs = 1;
  meta.tokenizer = tok_.get();
  const int32_t id = (*tok_->Encode(" hello", false))[0];
  Json body = Json::parse(FormatResponse(
      meta, {{"x", {Token(id, -0.25f, {{id, -0.25f}, {5, -3.0f}})}, FinishReason::kStop}}, {}));
  const Json& entry = body["choices"][0]["logprobs"]["content"][0];
  const std::string text = TokenText(tok_.get(), id);
  EXPECT_EQ(entry["token"], text);
  EXPECT_FLOAT_EQ(entry["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(entry["bytes"], Json(std::vector<uint8_t>(text.begin(), text.end())));
  ASSERT_EQ(entry["top_logprobs"].size(), 1u);
  EXPECT_EQ(entry["top_logprobs"][0]["token"], text);
}

TEST_F(LogprobsFormatTest, PartialUtf8TokensReportTheirRawBytes) {
  // "é" is two bytes; byte-level BPE may split rare characters into single-byte tokens.
  const std::vector<int32_t> ids = *tok_->Encode("\xe2\x82\xac", false);  // "€"
  std::vector<uint8_t> all;
  for (int32_t id : ids) {
    std::vector<uint8_t> b = TokenBytes(tok_.get(), id);
    all.insert(all.end(), b.begin(), b.end());
  }
  EXPECT_EQ(all, (std::vector<uint8_t>{0xe2, 0x82, 0xac}));
}

}  // namespace
}  // namespace specd::http
