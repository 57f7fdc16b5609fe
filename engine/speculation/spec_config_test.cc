#include "engine/speculation/spec_config.h"

#include <string>

#include "engine/base/field_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

TEST(SpeculativeConfigTest, EmptyMeansNoSpeculation) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, SpeculationMethod::kNone);
  EXPECT_FALSE(c->enabled());
}

TEST(SpeculativeConfigTest, ParsesVllmStyleDraftModelConfig) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(
      R"({"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 7})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(c->draft_model, "/m/draft");
  EXPECT_EQ(c->num_speculative_tokens, 7);
  EXPECT_EQ(c->speculator_device, "");
  c = ParseSpeculativeConfig(R"({"model": "/m/draft", "speculator_device": 1})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->speculator_device, "cuda:1");
  c = ParseSpeculativeConfig(R"({"model": "/m/draft", "speculator_device": "cpu"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->speculator_device, "cpu");
}

TEST(SpeculativeConfigTest, ModelAloneImpliesDraftModelAndNgramKeepsLookupBounds) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(R"({"model": "d"})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(c->num_speculative_tokens, 4);
  c = ParseSpeculativeConfig(R"({"method": "ngram", "prompt_lookup_min": 2,
                                 "prompt_lookup_max": 5})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->method, SpeculationMethod::kNgram);
  EXPECT_EQ(c->prompt_lookup_min, 2);
  EXPECT_EQ(c->prompt_lookup_max, 5);
}

TEST(SpeculativeConfigTest, RejectsBadInputNamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "JSON object"},
      {"[1]", "JSON object"},
      {R"({"method": "draft_model"})", "\"model\""},
      {R"({"method": "magic"})", "unknown"},
      {R"({"method": "ssv", "model": "d"})", "not a way to draft"},
      {R"({"method": "vegas", "sparsity_ratio": 0})", "sparsity_ratio"},
      {R"({"method": "ngram", "ssv": 4})", "\"ssv\""},
      {R"({"method": "ngram", "ssv": {"group_size": 0}})", "ssv.group_size"},
      {R"({"method": "ngram", "ssv": {"group_size": 17}})", "ssv.group_size"},
      {R"({"method": "ngram", "ssv": {"mode": "approximate"}})", "ssv.mode"},
      {R"({"method": "ngram", "ssv": {"refresh_every": 0}})", "ssv.refresh_every"},
      {R"({"method": "ngram", "ssv": {"c": 4}})", "ssv.c"},
      {R"({"method": "vegas", "sparsity_ratio": 1.5})", "sparsity_ratio"},
      {R"({"method": "vegas", "min_tokens": -1})", "min_tokens"},
      {R"({"method": "vegas", "max_tokens": 10, "min_tokens": 20})", "max_tokens"},
      {R"({"method": "ssd"})", "\"model\""},
      {R"({"method": "ssd", "model": "d", "fan_out": 0})", "fan_out"},
      {R"({"method": "ssd", "model": "d", "fan_out_mode": "fancy"})", "fan_out_mode"},
      {R"({"method": "ssd", "model": "d", "saguaro_c": 1.5})", "saguaro_c"},
      {R"({"method": "ssd", "model": "d", "backup": "eagle"})", "backup"},
      {R"({"method": "ssd", "model": "d", "speculator_address": "nohost"})", "HOST:PORT"},
      {R"({"method": "ssd", "model": "d", "launch_speculator": 1})", "launch_speculator"},
      {R"({"method": "ssd", "model": "d", "cache_offers": "yes"})", "cache_offers"},
      {R"({"method": "ssd", "model": "d", "speculator_timeout_ms": 0})", "speculator_timeout_ms"},
      {R"({"method": "ssd", "model": "d", "cache_build": "lazy"})", "cache_build"},
      {R"({"method": "ssd", "model": "d", "cache_budget": "all"})", "cache_budget"},
      {R"({"method": "ssd", "model": "d", "data_path": "pcie"})", "data_path"},
      {R"({"method": "ssd", "model": "d", "speculator_drafter": "head"})", "speculator_drafter"},
      {R"({"method": "ssd", "speculator_drafter": "eagle3"})", "speculator_drafter"},
      {R"({"method": "ssd", "eagle3_model": "h", "speculator_drafter": "draft_model"})",
       "\"model\""},
      {R"({"method": "ssd", "model": "d", "speculator_gpu_memory_utilization": 0})",
       "speculator_gpu_memory_utilization"},
      {R"({"method": "ssd", "model": "d", "speculator_gpu_memory_utilization": 1.5})",
       "speculator_gpu_memory_utilization"},
      {R"({"method": 3})", "\"method\""},
      {R"({"num_speculative_tokens": 0, "method": "ngram"})", "num_speculative_tokens"},
      {R"({"num_speculative_tokens": 65, "method": "ngram"})", "num_speculative_tokens"},
      {R"({"num_speculative_tokens": 2.5, "method": "ngram"})", "integer"},
      {R"({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2})",
       "prompt_lookup_min"},
      {R"({"model": ""})", "\"model\""},
      {R"({"model": "d", "speculator_device": -1})", "speculator_device"},
      {R"({"model": "d", "speculator_device": ""})", "speculator_device"},
      {R"({"method": "ngram", "draft_tensor_parallel_size": 1})", "not a known field"},
  };
  for (const auto& [json, message] : cases) {
    absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(c.status().message(), HasSubstr(message)) << json;
  }
}

TEST(SpeculativeConfigTest, ParsesSsdOptions) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(
      R"({"method": "ssd", "model": "/m/draft", "num_speculative_tokens": 7,
          "speculator_device": 1, "fan_out": 4, "fan_out_mode": "constant", "saguaro_c": 0.5,
          "critical_batch_size": 8, "backup": "random", "speculator_address": "0.0.0.0:7000",
          "launch_speculator": false, "speculator_timeout_ms": 500, "cache_build": "complete",
          "cache_budget": "fixed", "parallel": true, "speculator_gpu_memory_utilization": 0.8,
          "data_path": "host", "cache_offers": false})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kSsd);
  EXPECT_EQ(c->num_speculative_tokens, 7);
  EXPECT_EQ(c->speculator_device, "cuda:1");
  EXPECT_EQ(c->ssd.fan_out, 4);
  EXPECT_FALSE(c->ssd.geometric_fan_out);
  EXPECT_FLOAT_EQ(c->ssd.saguaro_c, 0.5f);
  EXPECT_EQ(c->ssd.critical_batch_size, 8);
  EXPECT_EQ(c->ssd.backup, "random");
  EXPECT_EQ(c->ssd.address, "0.0.0.0:7000");
  EXPECT_FALSE(c->ssd.launch);
  EXPECT_EQ(c->ssd.timeout_ms, 500);
  EXPECT_TRUE(c->ssd.complete_cache);
  EXPECT_FALSE(c->ssd.time_budget);
  EXPECT_FALSE(c->ssd.device_data_path);
  EXPECT_FALSE(c->ssd.cache_offers);
  EXPECT_TRUE(c->parallel_drafting);
  EXPECT_DOUBLE_EQ(c->ssd.gpu_memory_utilization, 0.8);
  // The JSON writer and the reader agree.
  absl::StatusOr<SpeculativeConfig> back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SpeculativeConfigToJson(*back), SpeculativeConfigToJson(*c));
  EXPECT_EQ(back->ssd.backup, "random");
  EXPECT_FALSE(back->ssd.time_budget);
  EXPECT_FALSE(back->ssd.cache_offers);
  EXPECT_TRUE(back->parallel_drafting);
  EXPECT_DOUBLE_EQ(back->ssd.gpu_memory_utilization, 0.8);
  EXPECT_EQ(back->speculator_device, "cuda:1");
  // Requests may ask for SSD only when the server runs it; C per request overrides the server's.
  auto r = ResolveSpeculation({SpeculationMethod::kSsd, 0, 0.25f}, *c, true, /*has_ssd=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, SpeculationMethod::kSsd);
  EXPECT_EQ(r->num_speculative_tokens, 7);
  EXPECT_FLOAT_EQ(r->saguaro_c, 0.25f);
  r = ResolveSpeculation({SpeculationMethod::kSsd, 0}, *c, true, /*has_ssd=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_FLOAT_EQ(r->saguaro_c, 0.5f);
  EXPECT_FALSE(ResolveSpeculation({SpeculationMethod::kSsd, 0}, *c, true, false).ok());
  EXPECT_FALSE(ResolveSpeculation({SpeculationMethod::kSsd, 0, 1.5f}, *c, true, true).ok());
}

// The SSD link's security files (issue 15): read, handed on to the speculator, and TLS only as
// all three files for a speculator the verifier does not launch.
TEST(SpeculativeConfigTest, ParsesSsdLinkSecurityFiles) {
  absl::StatusOr<SpeculativeConfig> c = ParseSpeculativeConfig(
      R"({"method": "ssd", "model": "/m/draft", "launch_speculator": false,
          "speculator_secret_file": "/etc/specd/secret", "speculator_tls_cert": "/c.pem",
          "speculator_tls_key": "/k.pem", "speculator_tls_ca": "/ca.pem"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ssd.secret_file, "/etc/specd/secret");
  EXPECT_EQ(c->ssd.tls_cert, "/c.pem");
  EXPECT_EQ(c->ssd.tls_key, "/k.pem");
  EXPECT_EQ(c->ssd.tls_ca, "/ca.pem");
  absl::StatusOr<SpeculativeConfig> back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ssd.tls_ca, "/ca.pem");
  EXPECT_EQ(back->ssd.secret_file, "/etc/specd/secret");
  const absl::Status partial = ParseSpeculativeConfig(
                                   R"({"method": "ssd", "model": "/m", "launch_speculator": false,
          "speculator_tls_cert": "/c.pem"})")
                                   .status();
  EXPECT_TRUE(absl::IsInvalidArgument(partial)) << partial;
  EXPECT_NE(partial.message().find("go together"), std::string::npos) << partial;
  const absl::Status launched =
      ParseSpeculativeConfig(
          R"({"method": "ssd", "model": "/m", "speculator_tls_cert": "/c.pem",
          "speculator_tls_key": "/k.pem", "speculator_tls_ca": "/ca.pem"})")
          .status();
  EXPECT_NE(launched.message().find("launch_speculator"), std::string::npos) << launched;
}

TEST(ResolveSpeculationTest, RequestOverridesServerDefault) {
  SpeculativeConfig server;
  server.method = SpeculationMethod::kDraftModel;
  server.draft_model = "d";
  server.num_speculative_tokens = 5;
  auto r = ResolveSpeculation({}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(r->num_speculative_tokens, 5);
  r = ResolveSpeculation({SpeculationMethod::kNgram, 3}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kNgram);
  EXPECT_EQ(r->num_speculative_tokens, 3);
  r = ResolveSpeculation({SpeculationMethod::kNone, 0}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->enabled());
  EXPECT_EQ(r->num_speculative_tokens, 0);
}

TEST(ResolveSpeculationTest, AutoStaysAutoWithTheServersKAsItsCap) {
  const SpeculativeConfig server;  // no speculation by default
  auto r = ResolveSpeculation({SpeculationMethod::kAuto, 0}, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kAuto);  // the engine's policy decides per step
  EXPECT_EQ(r->num_speculative_tokens, 4);
  EXPECT_FALSE(r->k_pinned);
  r = ResolveSpeculation({SpeculationMethod::kAuto, 6}, server, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kAuto);
  EXPECT_EQ(r->num_speculative_tokens, 6);
  EXPECT_TRUE(r->k_pinned);
  r = ResolveSpeculation({}, server, false);  // nothing asked, nothing configured
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->enabled());
}

TEST(ResolveSpeculationTest, PolicyCapsKAndForbidsMethods) {
  SpeculativeConfig server;
  server.method = SpeculationMethod::kNgram;
  server.num_speculative_tokens = 6;
  SpeculationParams p;
  p.method = SpeculationMethod::kAuto;
  p.policy_max_k = 2;
  p.policy_forbid = {SpeculationMethod::kDraftModel};
  auto r = ResolveSpeculation(p, server, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_speculative_tokens, 2);
  EXPECT_TRUE(r->Forbids(SpeculationMethod::kDraftModel));
  EXPECT_FALSE(r->Forbids(SpeculationMethod::kNgram));
  // The server's default method, forbidden by the request: no speculation.
  SpeculationParams d;
  d.policy_forbid = {SpeculationMethod::kNgram};
  r = ResolveSpeculation(d, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->enabled());
  // The server's default K above max_k is lowered; max_k 0 turns speculation off.
  d = {};
  d.policy_max_k = 3;
  r = ResolveSpeculation(d, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->method, SpeculationMethod::kNgram);
  EXPECT_EQ(r->num_speculative_tokens, 3);
  d.policy_max_k = 0;
  r = ResolveSpeculation(d, server, true);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->enabled());
}

TEST(ResolveSpeculationTest, PolicyConflictsAndBadEntriesAreInvalidArguments) {
  const SpeculativeConfig server;
  SpeculationParams p;
  p.method = SpeculationMethod::kNgram;
  p.policy_forbid = {SpeculationMethod::kNgram};
  auto r = ResolveSpeculation(p, server, true);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("forbid"), std::string::npos) << r.status();
  p = {};
  p.method = SpeculationMethod::kAuto;
  p.num_speculative_tokens = 5;
  p.policy_max_k = 2;
  r = ResolveSpeculation(p, server, true);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_k"), std::string::npos) << r.status();
  p = {};
  p.policy_max_k = kMaxSpeculativeTokens + 1;
  EXPECT_EQ(ResolveSpeculation(p, server, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  p = {};
  p.policy_forbid = {SpeculationMethod::kAuto};
  r = ResolveSpeculation(p, server, true);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a speculation method"), std::string::npos);
}

// Every refusal names its field as the status's field payload (what HTTP reports as "param"), both
// the request's own values (SpeculationParams::Validate, which the front ends call too) and what
// the server cannot run (only ResolveSpeculation, in the engine, knows that).
TEST(ResolveSpeculationTest, ErrorsNameTheirFieldAsPayload) {
  const SpeculativeConfig server;
  struct Case {
    const char* name;
    SpeculationParams params;
    const char* field;
    const char* message;
  };
  auto with = [](auto edit) {
    SpeculationParams p;
    edit(p);
    return p;
  };
  const Case own[] = {
      {"K", with([](auto& p) { p.num_speculative_tokens = 65; }),
       "speculation.num_speculative_tokens", "[0, 64]"},
      {"C", with([](auto& p) { p.saguaro_c = 1.5f; }), "speculation.saguaro_c", "[0, 1]"},
      {"ratio 0", with([](auto& p) { p.sparsity_ratio = 0; }), "speculation.sparsity_ratio",
       "(0, 1]"},
      {"min_tokens", with([](auto& p) { p.sparse_min_tokens = -2; }), "speculation.min_tokens",
       "negative"},
      {"max_k", with([](auto& p) { p.policy_max_k = 65; }), "speculation.policy.max_k", "[0, 64]"},
      {"K over max_k", with([](auto& p) {
         p.num_speculative_tokens = 5;
         p.policy_max_k = 3;
       }),
       "speculation.policy.max_k", "exceeds"},
      {"forbid auto", with([](auto& p) { p.policy_forbid = {SpeculationMethod::kAuto}; }),
       "speculation.policy.forbid", "not a speculation method"},
      {"forbid own method", with([](auto& p) {
         p.method = SpeculationMethod::kNgram;
         p.policy_forbid = {SpeculationMethod::kNgram};
       }),
       "speculation.policy.forbid", "forbidden"},
      {"ssv group", with([](auto& p) { p.ssv_group_size = 17; }), "speculation.ssv.group_size",
       "[1, 16]"},
      {"ssv strict shared", with([](auto& p) {
         p.ssv_strict = true;
         p.ssv_mode = SsvMode::kShared;
       }),
       "speculation.ssv", "lossy"},
      {"budget cap below floor", with([](auto& p) {
         p.sparse_min_tokens = 64;
         p.sparse_max_tokens = 8;
       }),
       "speculation.max_tokens", "below min_tokens"},
      {"tree top_k", with([](auto& p) {
         p.tree = {true, 0, 17, 0};
       }),
       "speculation.tree.top_k", "[1, 16]"},
      {"tree with vegas", with([](auto& p) {
         p.method = SpeculationMethod::kVegas;
         p.tree = {true, 0, 0, 8};
       }),
       "speculation.tree", "draft_model, eagle3, ngram"},
  };
  for (const Case& c : own) {
    const absl::Status v = c.params.Validate();
    ASSERT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(FieldOf(v), c.field) << c.name;
    EXPECT_THAT(std::string(v.message()), HasSubstr(c.message)) << c.name;
    const absl::Status r = ResolveSpeculation(c.params, server, true, true).status();
    EXPECT_EQ(r, v) << c.name;  // Resolve validates first
  }
  EXPECT_TRUE(SpeculationParams{}.Validate().ok());
  // What only the server knows: refused by ResolveSpeculation alone.
  const Case server_side[] = {
      {"no draft model", with([](auto& p) { p.method = SpeculationMethod::kDraftModel; }),
       "speculation.method", "draft model"},
      {"no speculator", with([](auto& p) { p.method = SpeculationMethod::kSsd; }),
       "speculation.method", "needs a speculator"},
      {"no head", with([](auto& p) { p.method = SpeculationMethod::kEagle3; }),
       "speculation.method", "EAGLE-3 head"},
      {"no sparse drafting", with([](auto& p) { p.method = SpeculationMethod::kStreaming; }),
       "speculation.method", "sparse drafting"},
      {"dense target's ssv", with([](auto& p) { p.ssv_group_size = 4; }), "speculation.ssv", "NSA"},
      {"budget cap below the server's floor", with([](auto& p) {
         p.method = SpeculationMethod::kVegas;
         p.sparse_max_tokens = 8;  // the server's min_tokens is 256
       }),
       "speculation.max_tokens", "below min_tokens"},
  };
  for (const Case& c : server_side) {
    EXPECT_TRUE(c.params.Validate().ok()) << c.name;
    const absl::Status r =
        ResolveSpeculation(c.params, server, /*has_draft_model=*/false,
                           /*has_ssd=*/false,
                           /*has_sparse_drafting=*/c.field != std::string("speculation.method"))
            .status();
    ASSERT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(FieldOf(r), c.field) << c.name;
    EXPECT_THAT(std::string(r.message()), HasSubstr(c.message)) << c.name;
  }
}

TEST(ResolveSpeculationTest, DraftModelWithoutOneOrBadKIsAnInvalidArgument) {
  const SpeculativeConfig server;
  auto r = ResolveSpeculation({SpeculationMethod::kDraftModel, 4}, server, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--speculative-config"));
  EXPECT_FALSE(ResolveSpeculation({SpeculationMethod::kNgram, -1}, server, false).ok());
  EXPECT_FALSE(ResolveSpeculation({SpeculationMethod::kNgram, 65}, server, false).ok());
  EXPECT_TRUE(ResolveSpeculation({SpeculationMethod::kNgram, 64}, server, false).ok());
}

TEST(SpeculativeConfigTest, VegasNeedsNoModelAndReadsItsBudget) {
  auto c = ParseSpeculativeConfig(R"({"method": "vegas"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kVegas);
  EXPECT_DOUBLE_EQ(c->sparse.sparsity_ratio, 0.07);
  EXPECT_EQ(c->sparse.min_tokens, 256);
  EXPECT_EQ(c->sparse.max_tokens, 0);
  c = ParseSpeculativeConfig(
      R"({"method": "streaming", "sparsity_ratio": 0.2, "min_tokens": 8, "max_tokens": 64})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kStreaming);
  EXPECT_DOUBLE_EQ(c->sparse.sparsity_ratio, 0.2);
  EXPECT_EQ(c->sparse.min_tokens, 8);
  EXPECT_EQ(c->sparse.max_tokens, 64);
  auto back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_DOUBLE_EQ(back->sparse.sparsity_ratio, 0.2);
  EXPECT_EQ(back->sparse.max_tokens, 64);
}

TEST(ResolveSpeculationTest, VegasBudgetFromRequestElseServer) {
  SpeculativeConfig server;
  server.sparse.sparsity_ratio = 0.1;
  SpeculationParams p{SpeculationMethod::kVegas, 6};
  auto r = ResolveSpeculation(p, server, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, SpeculationMethod::kVegas);
  EXPECT_EQ(r->num_speculative_tokens, 6);
  EXPECT_DOUBLE_EQ(r->sparse.sparsity_ratio, 0.1);
  p.sparsity_ratio = 0.03;
  p.sparse_min_tokens = 16;
  r = ResolveSpeculation(p, server, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->sparse.sparsity_ratio, 0.03);
  EXPECT_EQ(r->sparse.min_tokens, 16);
  p.sparsity_ratio = 2;
  EXPECT_THAT(ResolveSpeculation(p, server, false).status().message(), HasSubstr("sparsity_ratio"));
  p.sparsity_ratio = 0.07;
  p.sparse_max_tokens = 4;
  EXPECT_THAT(ResolveSpeculation(p, server, false).status().message(), HasSubstr("max_tokens"));
  const absl::Status gpu =
      ResolveSpeculation({SpeculationMethod::kStreaming, 4}, server, false, false, false).status();
  EXPECT_EQ(gpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gpu.message(), HasSubstr("sparse drafting"));
}

TEST(SpeculativeConfigTest, ReadsTheSsvStrategyAndWritesItBack) {
  auto c = ParseSpeculativeConfig(
      R"({"method": "draft_model", "model": "d", "ssv": {"group_size": 4, "mode": "shared",
          "refresh_every": 2}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ssv, (SsvStrategy{.group_size = 4, .mode = SsvMode::kShared, .refresh_every = 2}));
  auto back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ssv, c->ssv);
  auto plain = ParseSpeculativeConfig(R"({"method": "ngram"})");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->ssv, SsvStrategy{}) << "default: per query, exact, every layer";
}

TEST(ResolveSpeculationTest, SsvFromRequestElseServerStrictStaysLossless) {
  SpeculativeConfig server;
  server.method = SpeculationMethod::kNgram;
  server.ssv = SsvStrategy{.group_size = 4, .mode = SsvMode::kShared, .refresh_every = 3};
  auto resolve = [&](const SpeculationParams& r) {
    return ResolveSpeculation(r, server, false, false, false, /*target_is_nsa=*/true);
  };
  auto d = resolve(SpeculationParams{});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->ssv, server.ssv);
  SpeculationParams own;
  own.ssv_group_size = 8;
  own.ssv_mode = SsvMode::kExact;
  auto o = resolve(own);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->ssv, (SsvStrategy{.group_size = 8, .mode = SsvMode::kExact, .refresh_every = 3}));
  // strict: the server's lossy default becomes lossless; the group size stays.
  SpeculationParams strict;
  strict.ssv_strict = true;
  auto s = resolve(strict);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ssv, (SsvStrategy{.group_size = 4}));
  EXPECT_FALSE(s->ssv.lossy());
  // strict beside an explicit lossy value is a contradiction.
  strict.ssv_mode = SsvMode::kShared;
  EXPECT_EQ(resolve(strict).status().code(), absl::StatusCode::kInvalidArgument);
  strict.ssv_mode.reset();
  strict.ssv_refresh_every = 2;
  auto r = resolve(strict);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("refresh_every"), std::string::npos) << r.status();
  SpeculationParams big;
  big.ssv_group_size = kMaxSsvGroupSize + 1;
  EXPECT_EQ(resolve(big).status().code(), absl::StatusCode::kInvalidArgument);
  // A dense target refuses any speculation.ssv, and ignores the server's (Engine::Create
  // refuses a non-default one there).
  auto dense = ResolveSpeculation(own, server, false);
  EXPECT_EQ(dense.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dense.status().message().find("NSA"), std::string::npos) << dense.status();
}

TEST(ParseSpeculationMethodTest, AcceptsNamesAndAliases) {
  EXPECT_EQ(*ParseSpeculationMethod("vegas"), SpeculationMethod::kVegas);
  EXPECT_EQ(*ParseSpeculationMethod("streaming"), SpeculationMethod::kStreaming);
  EXPECT_EQ(*ParseSpeculationMethod(""), SpeculationMethod::kDefault);
  EXPECT_EQ(*ParseSpeculationMethod("draft"), SpeculationMethod::kDraftModel);
  EXPECT_EQ(*ParseSpeculationMethod("draft_model"), SpeculationMethod::kDraftModel);
  EXPECT_EQ(*ParseSpeculationMethod("ngram"), SpeculationMethod::kNgram);
  EXPECT_EQ(*ParseSpeculationMethod("auto"), SpeculationMethod::kAuto);
  EXPECT_EQ(*ParseSpeculationMethod("none"), SpeculationMethod::kNone);
  EXPECT_FALSE(ParseSpeculationMethod("Draft").ok());
}

// Issue 33: an EAGLE-3 head as vLLM names it ("model" with method eagle3) or beside a draft
// model ("eagle3_model"), and parallel drafting; both survive the JSON round trip.
TEST(SpeculativeConfigTest, ReadsEagle3HeadsAndParallelDraftingAndWritesThemBack) {
  auto c = ParseSpeculativeConfig(R"({"method": "eagle3", "model": "/h"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kEagle3);
  EXPECT_EQ(c->eagle3_model, "/h");
  EXPECT_EQ(c->draft_model, "");
  c = ParseSpeculativeConfig(R"({"model": "/d", "eagle3_model": "/h", "parallel": true})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(c->draft_model, "/d");
  EXPECT_EQ(c->eagle3_model, "/h");
  EXPECT_TRUE(c->parallel_drafting);
  auto back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->draft_model, "/d");
  EXPECT_EQ(back->eagle3_model, "/h");
  EXPECT_TRUE(back->parallel_drafting);
  c = ParseSpeculativeConfig(R"({"eagle3_model": "/h"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->method, SpeculationMethod::kEagle3);
  back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->eagle3_model, "/h");
  EXPECT_EQ(back->draft_model, "");
  for (const char* bad :
       {R"({"method": "eagle3"})", R"({"eagle3_model": ""})", R"({"eagle3_model": 3})",
        R"({"parallel": true})", R"({"model": "/d", "parallel": "yes"})",
        R"({"method": "ssd", "model": "/d", "parallel": 1})"}) {
    auto refused = ParseSpeculativeConfig(bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// SSD's speculator drafts with the EAGLE-3 head when asked ("speculator_drafter": "eagle3"), and
// by default when the head is all the config names; the draft model otherwise.
TEST(SpeculativeConfigTest, ReadsTheSsdSpeculatorsDrafter) {
  const struct {
    const char* json;
    bool head;
  } cases[] = {
      {R"({"method": "ssd", "eagle3_model": "h"})", true},
      {R"({"method": "ssd", "model": "d", "eagle3_model": "h"})", false},
      {R"({"method": "ssd", "model": "d", "eagle3_model": "h", "speculator_drafter": "eagle3"})",
       true},
      {R"({"method": "eagle3", "model": "h"})", false},
      {R"({"method": "ssd", "model": "d"})", false},
  };
  for (const auto& c : cases) {
    absl::StatusOr<SpeculativeConfig> config = ParseSpeculativeConfig(c.json);
    ASSERT_TRUE(config.ok()) << c.json << ": " << config.status();
    EXPECT_EQ(config->ssd.eagle3_drafter, c.head) << c.json;
    absl::StatusOr<SpeculativeConfig> back =
        ParseSpeculativeConfig(SpeculativeConfigToJson(*config));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ssd.eagle3_drafter, c.head) << c.json;
  }
}

TEST(ResolveSpeculationTest, Eagle3NeedsTheServersHead) {
  SpeculativeConfig server;
  SpeculationParams request;
  request.method = SpeculationMethod::kEagle3;
  auto r = ResolveSpeculation(request, server, false);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("EAGLE-3 head"));
  server.eagle3_model = "/h";
  r = ResolveSpeculation(request, server, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, SpeculationMethod::kEagle3);
  EXPECT_EQ(r->num_speculative_tokens, server.num_speculative_tokens);
  request.policy_forbid = {SpeculationMethod::kEagle3};
  EXPECT_FALSE(ResolveSpeculation(request, server, false).ok());
  EXPECT_EQ(ParseSpeculationMethod("eagle-3").value(), SpeculationMethod::kEagle3);
  EXPECT_STREQ(SpeculationMethodName(SpeculationMethod::kEagle3), "eagle3");
}

}  // namespace
}  // namespace specd
