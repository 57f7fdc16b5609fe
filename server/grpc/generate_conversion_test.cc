#include "server/grpc/generate_conversion.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "engine/tokenizer/tokenizer.h"

namespace specd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kModelDir = SPECD_SOURCE_DIR "/models/codepair/target";

class GenerateConversionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDir(kModelDir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    model_.tokenizer = tokenizer_.get();
    model_.served_model_name = "codepair";
    model_.max_model_len = 64;
    ASSERT_TRUE(ReadModelFileInfo(kModelDir, &model_).ok());
  }

  absl::StatusOr<std::vector<GenerateRequest>> Convert(const v1::GenerateRequest& r) {
    return ToEngineRequests(r, model_, "req-1", absl::InfiniteFuture());
  }
  absl::Status Error(const v1::GenerateRequest& r) { return Convert(r).status(); }

  std::unique_ptr<Tokenizer> tokenizer_;
  ServedModel model_;
};

TEST_F(GenerateConversionTest, ReadsArchitectureAndVocabFromConfig) {
  EXPECT_EQ(model_.architecture, "LlamaForCausalLM");
  EXPECT_EQ(model_.vocab_size, 8192);
}

TEST_F(GenerateConversionTest, TextPromptIsTokenizedWithBos) {
  v1::GenerateRequest r;
  r.set_text("import os");
  r.set_max_tokens(5);
  r.set_temperature(0);
  r.set_seed(7);
  r.add_stop("\n");
  r.set_logprobs(2);
  absl::StatusOr<std::vector<GenerateRequest>> out = Convert(r);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  const GenerateRequest& g = out->front();
  absl::StatusOr<std::vector<int32_t>> want = tokenizer_->Encode("import os", true);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(g.prompt_ids, *want);
  EXPECT_EQ(g.prompt_ids.front(), 0);  // BOS
  EXPECT_EQ(g.params.max_tokens, 5);
  EXPECT_TRUE(g.params.greedy());
  EXPECT_EQ(g.params.seed, 7u);
  EXPECT_THAT(g.params.stop, ElementsAre("\n"));
  EXPECT_EQ(g.params.logprobs, 2);
  EXPECT_EQ(g.request_id, "req-1");
}

TEST_F(GenerateConversionTest, DefaultsFollowOpenAiAndMaxTokensFillsTheContext) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(0);
  r.mutable_token_ids()->add_ids(7);
  absl::StatusOr<std::vector<GenerateRequest>> out = Convert(r);
  ASSERT_TRUE(out.ok()) << out.status();
  const SamplingParams& p = out->front().params;
  EXPECT_THAT(out->front().prompt_ids, ElementsAre(0, 7));
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(p.max_tokens, 62);
  EXPECT_EQ(p.logprobs, -1);
  EXPECT_FALSE(p.seed.has_value());
}

TEST_F(GenerateConversionTest, ChoicesGetConsecutiveSeedsAndOwnIds) {
  v1::GenerateRequest r;
  r.set_text("x");
  r.set_n(3);
  r.set_seed(10);
  absl::StatusOr<std::vector<GenerateRequest>> out = Convert(r);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)[2].params.seed, 12u);
  EXPECT_EQ((*out)[2].request_id, "req-1/2");
}

TEST_F(GenerateConversionTest, BadRequestsNameTheField) {
  struct Case {
    const char* name;
    void (*edit)(v1::GenerateRequest*);
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"no prompt", [](v1::GenerateRequest*) {}, absl::StatusCode::kInvalidArgument, "prompt"},
      {"empty text", [](v1::GenerateRequest* r) { r->set_text(""); },
       absl::StatusCode::kInvalidArgument, "prompt text is empty"},
      {"empty ids", [](v1::GenerateRequest* r) { r->mutable_token_ids(); },
       absl::StatusCode::kInvalidArgument, "token_ids is empty"},
      {"max_tokens 0", [](v1::GenerateRequest* r) { r->set_max_tokens(0); },
       absl::StatusCode::kInvalidArgument, "max_tokens"},
      {"past context", [](v1::GenerateRequest* r) { r->set_max_tokens(64); },
       absl::StatusCode::kInvalidArgument, "context limit"},
      {"temperature", [](v1::GenerateRequest* r) { r->set_temperature(-1); },
       absl::StatusCode::kInvalidArgument, "temperature"},
      {"top_p", [](v1::GenerateRequest* r) { r->set_top_p(0); }, absl::StatusCode::kInvalidArgument,
       "top_p"},
      {"nan penalty", [](v1::GenerateRequest* r) { r->set_presence_penalty(NAN); },
       absl::StatusCode::kInvalidArgument, "presence_penalty"},
      {"logprobs", [](v1::GenerateRequest* r) { r->set_logprobs(21); },
       absl::StatusCode::kInvalidArgument, "logprobs"},
      {"negative logprobs", [](v1::GenerateRequest* r) { r->set_logprobs(-1); },
       absl::StatusCode::kInvalidArgument, "logprobs"},
      {"n", [](v1::GenerateRequest* r) { r->set_n(17); }, absl::StatusCode::kInvalidArgument,
       "n must be"},
      {"stop id", [](v1::GenerateRequest* r) { r->add_stop_token_ids(8192); },
       absl::StatusCode::kInvalidArgument, "stop_token_ids"},
      {"too many stop strings",
       [](v1::GenerateRequest* r) {
         for (size_t i = 0; i <= kMaxStopStrings; ++i) r->add_stop("s");
       },
       absl::StatusCode::kInvalidArgument, "stop"},
      {"long stop string",
       [](v1::GenerateRequest* r) { r->add_stop(std::string(kMaxStopStringBytes + 1, 's')); },
       absl::StatusCode::kInvalidArgument, "stop"},
      {"model", [](v1::GenerateRequest* r) { r->set_model("gpt-4"); }, absl::StatusCode::kNotFound,
       "gpt-4"},
      {"method", [](v1::GenerateRequest* r) { r->mutable_speculation()->set_method("magic"); },
       absl::StatusCode::kInvalidArgument, "speculation.method"},
      {"draft len",
       [](v1::GenerateRequest* r) { r->mutable_speculation()->set_num_speculative_tokens(65); },
       absl::StatusCode::kInvalidArgument, "num_speculative_tokens"},
      {"negative draft len",
       [](v1::GenerateRequest* r) { r->mutable_speculation()->set_num_speculative_tokens(-1); },
       absl::StatusCode::kInvalidArgument, "num_speculative_tokens"},
      {"ssv", [](v1::GenerateRequest* r) { r->mutable_speculation()->set_method("ssv"); },
       absl::StatusCode::kInvalidArgument, "not a way to draft"},
      {"saguaro_c", [](v1::GenerateRequest* r) { r->mutable_speculation()->set_saguaro_c(2.0f); },
       absl::StatusCode::kInvalidArgument, "saguaro_c"},
      {"sparsity_ratio",
       [](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_method("vegas");
         r->mutable_speculation()->set_sparsity_ratio(0);
       },
       absl::StatusCode::kInvalidArgument, "sparsity_ratio"},
      {"min_tokens",
       [](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_method("streaming");
         r->mutable_speculation()->set_min_tokens(-1);
       },
       absl::StatusCode::kInvalidArgument, "min_tokens"},
      {"policy max_k",
       [](v1::GenerateRequest* r) { r->mutable_speculation()->mutable_policy()->set_max_k(65); },
       absl::StatusCode::kInvalidArgument, "speculation.policy.max_k"},
      {"policy forbid",
       [](v1::GenerateRequest* r) {
         r->mutable_speculation()->mutable_policy()->add_forbid("warp");
       },
       absl::StatusCode::kInvalidArgument, "speculation.policy.forbid"},
      {"tree depth",
       [](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_method("ngram");
         r->mutable_speculation()->mutable_tree()->set_depth(0);
       },
       absl::StatusCode::kInvalidArgument, "speculation.tree.depth"},
      {"tree top_k",
       [](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_method("ngram");
         r->mutable_speculation()->mutable_tree()->set_top_k(17);
       },
       absl::StatusCode::kInvalidArgument, "speculation.tree.top_k"},
      {"tree off with fields",
       [](v1::GenerateRequest* r) {
         r->mutable_speculation()->mutable_tree()->set_enabled(false);
         r->mutable_speculation()->mutable_tree()->set_num_nodes(8);
       },
       absl::StatusCode::kInvalidArgument, "speculation.tree"},
      {"skip special", [](v1::GenerateRequest* r) { r->set_skip_special_tokens(false); },
       absl::StatusCode::kUnimplemented, "skip_special_tokens"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r;
    if (std::string(c.name) != "no prompt") r.set_text("hello");
    c.edit(&r);
    absl::Status s = Error(r);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
  }
}

TEST_F(GenerateConversionTest, SpeculationOptionsReachEveryChoice) {
  struct Case {
    const char* method;
    SpeculationMethod want;
  };
  const Case cases[] = {
      {"", SpeculationMethod::kDefault},         {"none", SpeculationMethod::kNone},
      {"auto", SpeculationMethod::kAuto},        {"draft_model", SpeculationMethod::kDraftModel},
      {"draft", SpeculationMethod::kDraftModel}, {"ngram", SpeculationMethod::kNgram}};
  for (const Case& c : cases) {
    v1::GenerateRequest r;
    r.set_text("x");
    r.set_n(2);
    r.mutable_speculation()->set_method(c.method);
    r.mutable_speculation()->set_num_speculative_tokens(64);
    absl::StatusOr<std::vector<GenerateRequest>> out = Convert(r);
    ASSERT_TRUE(out.ok()) << c.method << ": " << out.status();
    ASSERT_EQ(out->size(), 2u);
    for (const GenerateRequest& g : *out) {
      EXPECT_EQ(g.speculation.method, c.want) << c.method;
      EXPECT_EQ(g.speculation.num_speculative_tokens, 64) << c.method;
    }
  }
  v1::GenerateRequest plain;
  plain.set_text("x");
  absl::StatusOr<std::vector<GenerateRequest>> out = Convert(plain);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->front().speculation.method, SpeculationMethod::kDefault);
  EXPECT_EQ(out->front().speculation.num_speculative_tokens, 0);
  EXPECT_EQ(out->front().speculation.policy_max_k, -1);
  v1::GenerateRequest limited;
  limited.set_text("x");
  limited.mutable_speculation()->set_method("auto");
  limited.mutable_speculation()->mutable_policy()->set_max_k(0);
  limited.mutable_speculation()->mutable_policy()->add_forbid("ngram");
  out = Convert(limited);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->front().speculation.policy_max_k, 0);
  EXPECT_EQ(out->front().speculation.policy_forbid,
            std::vector<SpeculationMethod>{SpeculationMethod::kNgram});
}

TEST_F(GenerateConversionTest, LastMessageCarriesSpeculationStats) {
  v1::GenerateResponse resp;
  RequestOutput out;
  out.tokens = {{5, 0.0f, {}}};
  out.finished = true;
  out.finish_reason = FinishReason::kStop;
  out.usage.completion_tokens = 9;
  out.usage.num_drafts = 4;
  out.usage.num_draft_tokens = 16;
  out.usage.num_accepted_tokens = 10;
  AppendOutput(out, tokenizer_.get(), false, &resp);
  EXPECT_EQ(resp.speculation_stats().num_drafts(), 4);
  EXPECT_EQ(resp.speculation_stats().num_draft_tokens(), 16);
  EXPECT_EQ(resp.speculation_stats().num_accepted_tokens(), 10);
  EXPECT_DOUBLE_EQ(resp.speculation_stats().mean_accepted_length(), 3.5);
  EXPECT_EQ(resp.speculation_stats().by_method_size(), 0);
  out.usage.by_method = {{"draft_model", 3, 12, 8}, {"ngram", 1, 4, 2}};
  v1::GenerateResponse by_method;
  AppendOutput(out, tokenizer_.get(), false, &by_method);
  ASSERT_EQ(by_method.speculation_stats().by_method_size(), 2);
  EXPECT_EQ(by_method.speculation_stats().by_method(0).method(), "draft_model");
  EXPECT_EQ(by_method.speculation_stats().by_method(0).num_drafts(), 3);
  EXPECT_EQ(by_method.speculation_stats().by_method(1).method(), "ngram");
  EXPECT_EQ(by_method.speculation_stats().by_method(1).num_accepted_tokens(), 2);
  out.usage.by_method.clear();

  v1::GenerateResponse plain;
  out.usage.num_drafts = out.usage.num_draft_tokens = out.usage.num_accepted_tokens = 0;
  AppendOutput(out, tokenizer_.get(), false, &plain);
  EXPECT_TRUE(plain.has_speculation_stats());
  EXPECT_EQ(plain.speculation_stats().num_drafts(), 0);
  EXPECT_EQ(plain.speculation_stats().mean_accepted_length(), 0.0);
}

TEST_F(GenerateConversionTest, LongPromptIsRejected) {
  v1::GenerateRequest r;
  for (int i = 0; i < 64; ++i) r.mutable_token_ids()->add_ids(7);
  EXPECT_THAT(std::string(Error(r).message()), HasSubstr("prompt has 64 tokens"));
}

TEST_F(GenerateConversionTest, OutputsMergeAndTheLastCarriesUsage) {
  v1::GenerateResponse resp;
  RequestOutput a;
  a.tokens = {{5, -0.5f, {{5, -0.5f}, {6, -1.5f}}}};
  a.text = "ab";
  RequestOutput b;
  b.tokens = {{6, -1.0f, {{6, -1.0f}, {5, -2.0f}}}};
  b.text = "c";
  b.finished = true;
  b.finish_reason = FinishReason::kLength;
  b.usage = {3, 2, 1};
  AppendOutput(a, tokenizer_.get(), true, &resp);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  AppendOutput(b, tokenizer_.get(), true, &resp);
  EXPECT_THAT(resp.token_ids(), ElementsAre(5, 6));
  EXPECT_EQ(resp.text(), "abc");
  ASSERT_EQ(resp.logprobs_size(), 2);
  EXPECT_EQ(resp.logprobs(1).sampled().token_id(), 6);
  EXPECT_EQ(resp.logprobs(1).top(1).token_id(), 5);
  EXPECT_FLOAT_EQ(resp.logprobs(1).top(1).logprob(), -2.0f);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(resp.usage().prompt_tokens(), 3);
  EXPECT_EQ(resp.usage().completion_tokens(), 2);
  EXPECT_EQ(resp.usage().cached_prompt_tokens(), 1);
}

TEST_F(GenerateConversionTest, FailedOutputLeavesFinishReasonUnset) {
  v1::GenerateResponse resp;
  RequestOutput out;
  out.finished = true;
  out.finish_reason = FinishReason::kAbort;
  out.status = absl::CancelledError("aborted");
  AppendOutput(out, tokenizer_.get(), false, &resp);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_FALSE(resp.has_usage());
}

}  // namespace
}  // namespace specd
