#include "server/commands.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/flags.h"
#include "server/option_flags.h"
#include "server/worker_health.h"

namespace specd {
namespace {

constexpr char kDefaultModel[] = "models/codepair/target";

std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

struct GenerateFlags {
  std::string model = kDefaultModel;
  std::optional<std::string> prompt, prompt_ids, stop, log_level;
  std::string speculative_config, speculation_method;
  int32_t num_speculative_tokens = 0;
  DeviceOptions device;                   // device "auto"; generate takes no KV pool flags
  TensorParallelOptions tensor_parallel;  // one host
  int32_t max_tokens = 64, top_k = 0, logprobs = -1;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::optional<int64_t> seed;
  bool json = false, ignore_eos = false;

  void Register(FlagParser& p) {
    p.Add("model", &model, "HF model directory (default models/codepair/target)");
    p.Add("prompt", &prompt, "prompt text (BOS added as the tokenizer config says)");
    p.Add("prompt-ids", &prompt_ids, "prompt token ids, comma-separated");
    p.Add("max-tokens", &max_tokens, "tokens to generate (default 64)");
    p.Add("temperature", &temperature, "0 = greedy (default 0)");
    p.Add("top-p", &top_p, "nucleus sampling mass (default 1)");
    p.Add("top-k", &top_k, "keep the k most likely tokens (0 = off)");
    p.Add("min-p", &min_p, "drop tokens below min-p times the top probability");
    p.Add("repetition-penalty", &repetition_penalty, "HF-style repetition penalty (1 = off)");
    p.Add("presence-penalty", &presence_penalty, "OpenAI presence penalty");
    p.Add("frequency-penalty", &frequency_penalty, "OpenAI frequency penalty");
    p.Add("seed", &seed, "sampling seed (same seed, same output)");
    p.Add("stop", &stop, "stop string");
    p.Add("ignore-eos", &ignore_eos, "keep generating after EOS");
    p.Add("logprobs", &logprobs, "report the sampled token's logprob and the top N");
    AddDeviceFlags(p, &device, /*kv_pool=*/false);
    AddTensorParallelFlags(p, &tensor_parallel, TensorParallelFlags::kOneHost);
    p.Add("speculative-config", &speculative_config,
          "speculative decoding, JSON as for specd serve (e.g. {\"method\": \"draft_model\", "
          "\"model\": DIR, \"num_speculative_tokens\": 4}); the output is the same");
    p.Add("speculation-method", &speculation_method,
          "this request's method: none | auto | draft_model | eagle3 | ngram (default: the "
          "config's)");
    p.Add("num-speculative-tokens", &num_speculative_tokens,
          "draft tokens per round, 0..64 (0 = the config's)");
    p.Add("json", &json, "print one JSON object instead of streaming text");
    p.Add("log-level", &log_level, "trace|debug|info|warn|error");
  }

  SamplingParams ToSamplingParams() const {
    SamplingParams s;
    s.max_tokens = max_tokens;
    s.temperature = temperature;
    s.top_p = top_p;
    s.top_k = top_k;
    s.min_p = min_p;
    s.repetition_penalty = repetition_penalty;
    s.presence_penalty = presence_penalty;
    s.frequency_penalty = frequency_penalty;
    if (seed) s.seed = static_cast<uint64_t>(*seed);
    if (stop) s.stop = {*stop};
    s.ignore_eos = ignore_eos;
    s.logprobs = logprobs;
    return s;
  }
};

absl::StatusOr<std::vector<int32_t>> PromptIds(const GenerateFlags& f, const Engine& engine) {
  std::vector<int32_t> ids;
  if (f.prompt && f.prompt_ids)
    return absl::InvalidArgumentError("give --prompt or --prompt-ids, not both");
  if (f.prompt_ids) {
    SPECD_RETURN_IF_ERROR(ParseIdList(*f.prompt_ids, &ids));
    return ids;
  }
  const Tokenizer* tok = engine.tokenizer();
  if (f.prompt) {
    if (tok == nullptr)
      return absl::InvalidArgumentError("model has no tokenizer: use --prompt-ids");
    return tok->Encode(*f.prompt, /*add_special=*/true);
  }
  // No prompt: just BOS.
  std::optional<int32_t> bos = tok ? tok->bos_id() : std::nullopt;
  if (!bos) bos = engine.model_bos_id();
  if (!bos) return absl::InvalidArgumentError("model has no BOS token: give a prompt");
  return std::vector<int32_t>{*bos};
}

absl::StatusOr<SpeculationParams> ToSpeculationParams(const GenerateFlags& f) {
  SpeculationParams s;
  absl::StatusOr<SpeculationMethod> method = ParseSpeculationMethod(f.speculation_method);
  if (!method.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculation-method: ", method.status().message()));
  }
  s.method = *method;
  s.num_speculative_tokens = f.num_speculative_tokens;
  // The request's rules (SpeculationParams::Validate); K is the only value the flags set.
  if (absl::Status v = s.Validate(); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--num-speculative-tokens: ", v.message()));
  }
  return s;
}

nlohmann::json SpeculationJson(const RequestUsage& u) {
  return {{"num_drafts", u.num_drafts},
          {"num_draft_tokens", u.num_draft_tokens},
          {"num_accepted_tokens", u.num_accepted_tokens},
          {"mean_accepted_length", u.mean_accepted_length()}};
}

nlohmann::json LogprobsJson(const GenerateResult& r) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : r.tokens) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& c : t.top) top.push_back({{"id", c.id}, {"logprob", c.logprob}});
    out.push_back({{"id", t.id}, {"logprob", t.logprob}, {"top", top}});
  }
  return out;
}

}  // namespace

absl::Status RunGenerate(const std::vector<std::string>& args) {
  GenerateFlags f;
  FlagParser parser;
  f.Register(parser);
  if (WantsHelp(args)) {
    std::printf("usage: specd generate [flags]\n%s", parser.Usage().c_str());
    return absl::OkStatus();
  }
  SPECD_RETURN_IF_ERROR(parser.Parse(args));
  if (f.log_level && !SetLogLevel(*f.log_level)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level: unknown level '", *f.log_level, "'"));
  }
  EngineOptions options;
  options.model_dir = f.model;
  static_cast<DeviceOptions&>(options) = f.device;
  SPECD_RETURN_IF_ERROR(CheckTensorParallelFlags(f.tensor_parallel));
  options.tensor_parallel = f.tensor_parallel;
  SPECD_ASSIGN_OR_RETURN(options.speculative, ParseSpeculativeConfig(f.speculative_config));
  GenerateRequest request;
  SPECD_ASSIGN_OR_RETURN(request.speculation, ToSpeculationParams(f));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  SPECD_ASSIGN_OR_RETURN(request.prompt_ids, PromptIds(f, *engine));
  request.params = f.ToSamplingParams();
  TokenCallback stream;
  if (!f.json) {
    stream = [](size_t, const GeneratedToken&, std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
  }
  SPECD_ASSIGN_OR_RETURN(GenerateResult result, engine->Generate(request, stream));
  if (!f.json) {
    std::printf("\n");
    return absl::OkStatus();
  }
  nlohmann::json out = {{"prompt_ids", result.prompt_ids},
                        {"ids", result.ids()},
                        {"text", result.text},
                        {"finish_reason", FinishReasonName(result.finish_reason)}};
  if (f.logprobs >= 0) out["logprobs"] = LogprobsJson(result);
  if (options.speculative.enabled() || !f.speculation_method.empty()) {
    out["speculation"] = SpeculationJson(result.usage);
  }
  std::printf("%s\n", Dump(out).c_str());
  return absl::OkStatus();
}

absl::Status RunTokenize(const std::vector<std::string>& args) {
  std::string model = kDefaultModel;
  bool add_special = false;
  FlagParser parser;
  parser.Add("model", &model, "HF model/tokenizer directory, or a GGUF file");
  parser.Add("add-special", &add_special, "add BOS/EOS as the tokenizer config says");
  if (WantsHelp(args)) {
    std::printf("usage: specd tokenize [flags] < lines.jsonl\n%s", parser.Usage().c_str());
    return absl::OkStatus();
  }
  SPECD_RETURN_IF_ERROR(parser.Parse(args));
  const bool gguf = model.size() > 5 && model.substr(model.size() - 5) == ".gguf";
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                         gguf ? Tokenizer::FromGguf(model) : Tokenizer::FromDir(model));
  std::string line;
  int bad_lines = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json in = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    absl::StatusOr<std::vector<int32_t>> ids =
        absl::InvalidArgumentError("each line must be a JSON object with a string \"text\"");
    if (in.is_object() && in.contains("text") && in["text"].is_string()) {
      ids = tok->Encode(in["text"].get<std::string>(), add_special);
    }
    if (ids.ok()) {
      std::printf("%s\n", Dump({{"ids", *ids}}).c_str());
    } else {
      ++bad_lines;
      std::printf("%s\n", Dump({{"error", std::string(ids.status().message())}}).c_str());
    }
  }
  if (bad_lines > 0)
    return absl::InvalidArgumentError(absl::StrCat(bad_lines, " input line(s) failed"));
  return absl::OkStatus();
}

absl::Status RunSpeculator(const std::vector<std::string>& args) {
  FlagParser p;
  SpeculatorProcessOptions o;
  std::optional<std::string> log_level;
  int64_t connect_timeout_s = 60;
  p.Add("connect", &o.connect, "the verifier's HOST:PORT (its speculator_address)");
  p.Add("connect-timeout", &connect_timeout_s, "seconds to keep trying to connect (default 60)");
  p.Add("reconnect", &o.reconnect, "connect again after the verifier goes away");
  p.Add("speculator-secret-file", &o.secret_file,
        "file with the link secret (64 hex digits, mode 0600; or $SPECD_SPECULATOR_SECRET)");
  p.Add("speculator-tls-cert", &o.tls_cert,
        "TLS: this speculator's certificate, signed by --speculator-tls-ca");
  p.Add("speculator-tls-key", &o.tls_key, "TLS: its private key");
  p.Add("speculator-tls-ca", &o.tls_ca, "TLS: the CA both ends trust (the verifier's)");
  p.Add("device", &o.device,
        "the draft's device on this host, overriding the verifier's choice (its "
        "speculator_device, else its own device): cpu | cuda | cuda:N");
  p.Add("threads", &o.num_threads,
        "CPU threads on this host, overriding the verifier's (0 = all cores; default: the "
        "verifier's)");
  p.Add("log-level", &log_level, "trace|debug|info|warn|error (default info)");
  if (WantsHelp(args)) {
    std::printf(
        "usage: specd speculator --connect HOST:PORT [flags]\n"
        "The draft, its settings and the verifier's limits come from the verifier after the\n"
        "handshake; the flags are what is local to this process.\n%s",
        p.Usage().c_str());
    return absl::OkStatus();
  }
  SPECD_RETURN_IF_ERROR(p.Parse(args));
  if (!SetLogLevel(log_level.value_or("info"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level: unknown level '", *log_level, "'"));
  }
  if (o.connect.empty()) return absl::InvalidArgumentError("--connect HOST:PORT is required");
  if (o.num_threads < -1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads: ", o.num_threads, " < 0"));
  }
  o.connect_timeout = absl::Seconds(connect_timeout_s);
  return RunSpeculatorProcess(o);
}

absl::Status RunWorker(const std::vector<std::string>& args) {
  FlagParser p;
  WorkerProcessOptions o;
  std::optional<std::string> log_level;
  int64_t connect_timeout_s = 120;
  p.Add("rank", &o.rank, "this process's rank (1..N-1); omit to start all of this node's ranks");
  p.Add("device", &o.device, "cpu | cuda:N | auto (default: cuda:<rank> with NCCL, else cpu)");
  p.Add("threads", &o.num_threads, "CPU threads of this rank (0 = all cores)");
  p.Add("secret-file", &o.secret_file,
        "the group's secret file (rank 0's --tp-secret-file; or $SPECD_TP_SECRET)");
  p.Add("connect-timeout", &connect_timeout_s, "seconds to keep trying to reach rank 0 (120)");
  int32_t health_port = -1;
  p.Add("health-port", &health_port,
        "serve GET /health and /ready (ready once joined) on this port for probes (-1 = off)");
  AddTensorParallelFlags(p, &o, TensorParallelFlags::kWorker);
  p.Add("log-level", &log_level, "trace|debug|info|warn|error (default info)");
  if (WantsHelp(args)) {
    std::printf(
        "usage: specd worker --master-addr HOST --master-port PORT (--rank R | "
        "--tensor-parallel-size N --nnodes M --node-rank K) [flags]\n%s",
        p.Usage().c_str());
    return absl::OkStatus();
  }
  SPECD_RETURN_IF_ERROR(p.Parse(args));
  if (!SetLogLevel(log_level.value_or("info"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level: unknown level '", *log_level, "'"));
  }
  if (o.master_port <= 0 || o.master_port > 65535) {
    return absl::InvalidArgumentError("--master-port PORT (rank 0's) is required");
  }
  o.connect_timeout = absl::Seconds(connect_timeout_s);
  std::unique_ptr<WorkerHealth> health;
  if (health_port >= 0) {
    SPECD_ASSIGN_OR_RETURN(health, WorkerHealth::Start(health_port));
    o.on_ready = [h = health.get()] { h->SetReady(true); };
  }
  return RunWorkerProcess(o);
}

}  // namespace specd
