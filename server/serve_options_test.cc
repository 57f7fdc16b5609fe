#include "server/serve_options.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace specd {
namespace {

const std::string kModel = SPECD_SOURCE_DIR "/models/codepair/target";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

absl::StatusOr<ServeOptions> Parse(std::vector<std::string> args, const char* env = nullptr) {
  args.insert(args.begin(), {"--model", kModel});
  return ParseServeOptions(args, env);
}

TEST(ServeOptionsTest, DefaultsMatchTheDocumentedOnes) {
  auto o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->port, 8000);
  EXPECT_EQ(o->grpc_port, 50051);
  EXPECT_EQ(o->host, "0.0.0.0");
  EXPECT_EQ(o->served_model_name, "target");  // the model folder's name
  EXPECT_EQ(o->max_request_body_bytes, 8 << 20);
  EXPECT_EQ(o->drain_timeout_s, 30);
  EXPECT_TRUE(o->api_key.empty());
  EngineOptions e = ToEngineOptions(*o);
  EXPECT_EQ(e.model_dir, kModel);
  EXPECT_TRUE(e.enable_prefix_caching);
}

TEST(ServeOptionsTest, WithNoFlagsTheBundledModelIsServedAsCodepair) {
  // The default model path is relative to the working directory: the repository root.
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(SPECD_SOURCE_DIR);
  auto o = ParseServeOptions({}, nullptr);
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->model, "models/codepair/target");
  EXPECT_EQ(o->served_model_name, "codepair");
}

TEST(ServeOptionsTest, VllmStyleFlagsAreParsed) {
  auto o = Parse({"--port",
                  "0",
                  "--grpc-port=-1",
                  "--served-model-name",
                  "cp",
                  "--max-model-len",
                  "512",
                  "--max-num-seqs",
                  "8",
                  "--max-waiting-requests",
                  "4",
                  "--kv-cache-memory-bytes",
                  "1048576",
                  "--disable-prefix-caching",
                  "--drain-timeout",
                  "2.5",
                  "--request-timeout",
                  "60",
                  "--log-level",
                  "debug"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->port, 0);
  EXPECT_EQ(o->grpc_port, -1);
  EXPECT_EQ(o->served_model_name, "cp");
  EXPECT_DOUBLE_EQ(o->drain_timeout_s, 2.5);
  EngineOptions e = ToEngineOptions(*o);
  EXPECT_EQ(e.max_model_len, 512);
  EXPECT_EQ(e.max_num_seqs, 8);
  EXPECT_EQ(e.max_waiting, 4);
  EXPECT_EQ(e.kv_cache_bytes, 1048576);
  EXPECT_FALSE(e.enable_prefix_caching);
}

TEST(ServeOptionsTest, JsonConfigIsReadAndFlagsOverrideIt) {
  const std::string path = WriteFile(
      "serve.json", R"({"port": 9001, "grpc_port": 9002, "max_num_seqs": 7, "api_key": "k",
                        "tls": {}, "drain_timeout_s": 5})");
  auto o = Parse({"--config", path, "--port", "9100"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->port, 9100);
  EXPECT_EQ(o->grpc_port, 9002);
  EXPECT_EQ(o->max_num_seqs, 7);
  EXPECT_EQ(o->api_key, "k");
  EXPECT_EQ(o->drain_timeout_s, 5);
}

TEST(ServeOptionsTest, TextprotoConfigIsRead) {
  const std::string path =
      WriteFile("serve.textproto", "port: 9300\nserved_model_name: \"x\"\nblock_size: 32\n");
  auto o = Parse({"--config=" + path});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->port, 9300);
  EXPECT_EQ(o->served_model_name, "x");
  EXPECT_EQ(o->block_size, 32);
}

TEST(ServeOptionsTest, ApiKeyComesFromEnvUnlessTheFlagIsGiven) {
  EXPECT_EQ(Parse({}, "env-key")->api_key, "env-key");
  EXPECT_EQ(Parse({"--api-key", "flag-key"}, "env-key")->api_key, "flag-key");
}

TEST(ServeOptionsTest, BadFlagsAndConfigsAreInvalidArgument) {
  const std::string unknown_field = WriteFile("bad1.json", R"({"no_such_field": 1})");
  const std::string bad_json = WriteFile("bad2.json", R"({"port": )");
  const std::string bad_text = WriteFile("bad3.textproto", "port: \"x\"\n");
  const std::vector<std::vector<std::string>> cases = {
      {"--port", "70000"},
      {"--port", "http"},
      {"--grpc-port", "-2"},
      {"--max-num-seqs", "0"},
      {"--block-size", "0"},
      {"--drain-timeout", "-1"},
      {"--drain-timeout", "nan"},
      {"--log-level", "loud"},
      {"--ssl-certfile", "/nonexistent.pem"},
      {"--ssl-certfile", "/nonexistent.pem", "--ssl-keyfile", "/nonexistent.key"},
      {"--model", "/no/such/dir"},
      {"--no-such-flag"},
      {"--config", "/no/such/file.json"},
      {"--config", unknown_field},
      {"--config", bad_json},
      {"--config", bad_text},
      {"--config"},
      {"--device", "tpu"},
  };
  for (const auto& args : cases) {
    auto o = Parse(args);
    ASSERT_FALSE(o.ok()) << args[0];
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << args[0];
    EXPECT_FALSE(o.status().message().empty());
  }
}

const std::string kDraft = SPECD_SOURCE_DIR "/models/codepair/draft";

TEST(ServeOptionsTest, SpeculativeConfigReachesTheEngine) {
  auto none = Parse({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(ToEngineOptions(*none).speculative.enabled());
  auto o = Parse({"--speculative-config", R"({"method": "draft_model", "model": ")" + kDraft +
                                              R"(", "num_speculative_tokens": 6})"});
  ASSERT_TRUE(o.ok()) << o.status();
  EngineOptions e = ToEngineOptions(*o);
  EXPECT_EQ(e.speculative.method, SpeculationMethod::kDraftModel);
  EXPECT_EQ(e.speculative.draft_model, kDraft);
  EXPECT_EQ(e.speculative.num_speculative_tokens, 6);
  auto ngram = Parse({"--speculative-config={\"method\": \"ngram\", \"prompt_lookup_max\": 3}"});
  ASSERT_TRUE(ngram.ok()) << ngram.status();
  EXPECT_EQ(ToEngineOptions(*ngram).speculative.method, SpeculationMethod::kNgram);
  EXPECT_EQ(ToEngineOptions(*ngram).speculative.prompt_lookup_max, 3);
}

TEST(ServeOptionsTest, SpeculativeConfigComesFromTheConfigFileAndTheFlagWins) {
  const std::string path =
      WriteFile("spec.json", R"({"speculative_config": "{\"method\": \"none\", \"model\": \")" +
                                 kDraft + R"(\"}"})");
  auto o = Parse({"--config", path});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.method, SpeculationMethod::kNone);
  EXPECT_EQ(o->speculative.draft_model, kDraft);
  EXPECT_TRUE(o->speculative.enabled());
  auto flag = Parse({"--config", path, "--speculative-config", R"({"method": "ngram"})"});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->speculative.method, SpeculationMethod::kNgram);
  EXPECT_TRUE(flag->speculative.draft_model.empty());
}

TEST(ServeOptionsTest, CostProfileComesFromTheFlagOrTheConfigAndMustBeAFile) {
  const std::string profile = WriteFile("profile.json", "{}");  // parsed by the engine
  auto o = Parse({"--cost-profile", profile});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(ToEngineOptions(*o).cost_profile, profile);
  EXPECT_TRUE(ToEngineOptions(*Parse({})).cost_profile.empty());
  const std::string config =
      WriteFile("with_profile.json", R"({"cost_profile": ")" + profile + R"("})");
  auto from_config = Parse({"--config", config});
  ASSERT_TRUE(from_config.ok()) << from_config.status();
  EXPECT_EQ(from_config->cost_profile, profile);
  auto missing = Parse({"--cost-profile", ::testing::TempDir() + "/no_such_profile.json"});
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("--cost-profile"), std::string::npos);
}

TEST(ServeOptionsTest, BadSpeculativeConfigNamesTheFlag) {
  const std::string in_file = WriteFile("bad_spec.json", R"({"speculative_config": "{\"k\": 1}"})");
  const std::vector<std::vector<std::string>> cases = {
      {"--speculative-config", "not json"},
      {"--speculative-config", "[1]"},
      {"--speculative-config", R"({"method": "warp"})"},
      {"--speculative-config", R"({"method": "ssd"})"},
      {"--speculative-config", R"({"method": "draft_model"})"},
      {"--speculative-config", R"({"model": "/no/such/draft"})"},
      {"--speculative-config", R"({"method": "ngram", "num_speculative_tokens": 65})"},
      {"--speculative-config", R"({"method": "ngram", "num_speculative_tokens": 0})"},
      {"--speculative-config", R"({"method": "ngram", "prompt_lookup_min": 5,
                                   "prompt_lookup_max": 2})"},
      {"--speculative-config", R"({"method": "ngram", "extra": 1})"},
      {"--config", in_file},
  };
  for (const auto& args : cases) {
    auto o = Parse(args);
    ASSERT_FALSE(o.ok()) << args[1];
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << args[1];
    EXPECT_NE(o.status().message().find("--speculative-config"), std::string::npos) << o.status();
  }
}

TEST(ServeOptionsTest, HttpHardeningFlagsAreParsed) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->allowed_hosts.empty());
  EXPECT_EQ(d->api_worker_threads, 2);
  EXPECT_FALSE(d->allow_special_tokens_in_content);
  auto o = Parse({"--allowed-hosts", "a.example,localhost", "--api-worker-threads", "4",
                  "--allow-special-tokens-in-content"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->allowed_hosts, "a.example,localhost");
  EXPECT_EQ(o->api_worker_threads, 4);
  EXPECT_TRUE(o->allow_special_tokens_in_content);
  EXPECT_EQ(Parse({"--api-worker-threads", "0"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ServeOptionsTest, HelpIsReported) {
  auto o = ParseServeOptions({"--help"}, nullptr);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->help);
  EXPECT_NE(ServeUsage().find("--max-num-batched-tokens"), std::string::npos);
  EXPECT_NE(ServeUsage().find("--speculative-config"), std::string::npos);
}

}  // namespace
}  // namespace specd
