#include "server/serve_options.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "proto/config.pb.h"
#include "server/flags.h"
#include "server/option_flags.h"

namespace specd {
namespace {

void Register(FlagParser& p, ServeOptions& o, std::string* config_path) {
  p.Add("config", config_path, "ServeConfig file (proto/config.proto), JSON or textproto");
  p.Add("model", &o.model,
        "HF model directory (default models/codepair/target, served as codepair)");
  p.Add("served-model-name", &o.served_model_name, "model name in the API (default: folder name)");
  AddDeviceFlags(p, &o);
  AddSchedulerFlags(p, &o);
  AddTensorParallelFlags(p, &o.tensor_parallel, TensorParallelFlags::kAll);
  p.Add("host", &o.host, "address to listen on (default 0.0.0.0)");
  p.Add("port", &o.port, "HTTP port (default 8000; 0 = pick a free port)");
  p.Add("grpc-port", &o.grpc_port, "gRPC port (default 50051; 0 = free port; -1 = off)");
  p.Add("api-key", &o.api_key, "require 'Authorization: Bearer KEY' (also $SPECD_API_KEY)");
  p.Add("ssl-certfile", &o.ssl_certfile, "PEM certificate chain: TLS with --ssl-keyfile");
  p.Add("ssl-keyfile", &o.ssl_keyfile, "PEM private key");
  p.Add("max-request-body-bytes", &o.max_request_body_bytes, "HTTP body limit (413 past it)");
  p.Add("allowed-hosts", &o.allowed_hosts,
        "comma-separated Host names API requests may name (default: any)");
  p.Add("api-worker-threads", &o.api_worker_threads,
        "threads parsing and tokenizing HTTP request bodies (default 2)");
  p.Add("allow-special-tokens-in-content", &o.allow_special_tokens_in_content,
        "special-token text in chat message content becomes control tokens (default: text)");
  p.Add("write-timeout", &o.write_timeout_s,
        "seconds an HTTP or gRPC client may read nothing of a paused stream before it is "
        "closed and its requests aborted (default 60)");
  p.Add("drain-timeout", &o.drain_timeout_s, "seconds in-flight requests may finish on SIGTERM");
  p.Add("request-timeout", &o.request_timeout_s, "per-request deadline in seconds (0 = none)");
  p.Add("log-level", &o.log_level, "trace|debug|info|warn|error");
  p.Add("speculative-config", &o.speculative_config,
        "speculative decoding defaults, JSON: {\"method\": "
        "none|auto|draft_model|eagle3|ngram|ssd|vegas|streaming, "
        "\"model\": DRAFT_DIR (eagle3: HEAD_DIR), \"eagle3_model\": HEAD_DIR (beside a draft), "
        "\"num_speculative_tokens\": K, \"prompt_lookup_min\"/"
        "\"prompt_lookup_max\": N, \"draft_kv_cache_bytes\": B, \"sparsity_ratio\": R, "
        "\"min_tokens\"/\"max_tokens\": N (vegas / streaming)}");
  p.Add("cost-profile", &o.cost_profile,
        "auto speculation's step-time profile, the JSON specd_profile writes (default: a "
        "built-in rule for the device)");
}

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first.empty()) first = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  std::string first;
};

bool LooksLikeJson(const std::string& path, const std::string& text) {
  if (absl::EndsWithIgnoreCase(path, ".json")) return true;
  for (const char* ext : {".textproto", ".txtpb", ".pbtxt", ".prototxt"}) {
    if (absl::EndsWithIgnoreCase(path, ext)) return false;
  }
  const absl::string_view body = absl::StripLeadingAsciiWhitespace(text);
  return !body.empty() && body.front() == '{';
}

absl::StatusOr<config::ServeConfig> LoadConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Bad(absl::StrCat("--config: cannot read '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  config::ServeConfig config;
  if (LooksLikeJson(path, text)) {
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    auto status = google::protobuf::util::JsonStringToMessage(text, &config, options);
    if (!status.ok()) return Bad(absl::StrCat("--config ", path, ": ", status.ToString()));
    return config;
  }
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return Bad(absl::StrCat("--config ", path, ": ", errors.first));
  }
  return config;
}

// proto3 cannot tell unset from zero: zero / empty fields keep the defaults.
void ApplyConfig(const config::ServeConfig& c, ServeOptions* o) {
  auto str = [](const std::string& v, std::string* out) {
    if (!v.empty()) *out = v;
  };
  auto num = [](auto v, auto* out) {
    if (v != 0) *out = v;
  };
  str(c.model(), &o->model);
  str(c.served_model_name(), &o->served_model_name);
  num(c.max_model_len(), &o->max_model_len);
  str(c.device(), &o->device);
  str(c.load_format(), &o->load_format);
  num(c.gpu_memory_utilization(), &o->gpu_memory_utilization);
  if (c.enforce_eager()) o->enforce_eager = true;
  num(c.threads(), &o->num_threads);
  TensorParallelOptions& tp = o->tensor_parallel;
  num(c.tensor_parallel_size(), &tp.size);
  num(c.nnodes(), &tp.nnodes);
  num(c.node_rank(), &tp.node_rank);
  str(c.master_addr(), &tp.master_addr);
  num(c.master_port(), &tp.master_port);
  str(c.tp_secret_file(), &tp.secret_file);
  if (c.tp_timeout_s() != 0) tp.timeout = absl::Seconds(c.tp_timeout_s());
  str(c.tp_communicator(), &tp.communicator);
  str(c.host(), &o->host);
  num(c.port(), &o->port);
  num(c.grpc_port(), &o->grpc_port);
  str(c.api_key(), &o->api_key);
  str(c.tls().cert_file(), &o->ssl_certfile);
  str(c.tls().key_file(), &o->ssl_keyfile);
  num(c.max_request_body_bytes(), &o->max_request_body_bytes);
  num(c.write_timeout_s(), &o->write_timeout_s);
  num(c.max_num_seqs(), &o->max_num_seqs);
  num(c.max_num_batched_tokens(), &o->max_num_batched_tokens);
  num(c.max_waiting_requests(), &o->max_waiting);
  num(c.kv_cache_memory_bytes(), &o->kv_cache_bytes);
  num(c.block_size(), &o->block_size);
  if (c.disable_prefix_caching()) o->enable_prefix_caching = false;
  num(c.drain_timeout_s(), &o->drain_timeout_s);
  num(c.request_timeout_s(), &o->request_timeout_s);
  str(c.log_level(), &o->log_level);
  str(c.speculative_config(), &o->speculative_config);
  str(c.cost_profile(), &o->cost_profile);
}

absl::Status CheckRange(absl::string_view flag, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return Bad(absl::StrCat("--", flag, ": ", v, " is outside [", lo, ", ", hi, "]"));
}

// The device's syntax; whether it exists is the engine's question at startup.
absl::Status CheckDevice(const std::string& device) {
  if (device == "cpu" || device == "cuda" || device == "auto") return absl::OkStatus();
  const std::string n = device.size() > 5 ? device.substr(5) : "";
  if (absl::StartsWith(device, "cuda:") && !n.empty() && n.size() <= 4 &&
      std::all_of(n.begin(), n.end(), [](char ch) { return absl::ascii_isdigit(ch); })) {
    return absl::OkStatus();
  }
  return Bad(absl::StrCat("--device: '", device, "' is not one of cpu, cuda, cuda:N, auto"));
}

absl::Status CheckSeconds(absl::string_view flag, double v) {
  if (std::isfinite(v) && v >= 0 && v <= 86400 * 365) return absl::OkStatus();
  return Bad(absl::StrCat("--", flag, ": must be a number of seconds >= 0"));
}

// Parses --speculative-config into o->speculative; the draft model must be a directory.
absl::Status ParseSpeculation(ServeOptions* o) {
  SPECD_ASSIGN_OR_RETURN(o->speculative, ParseSpeculativeConfig(o->speculative_config));
  std::error_code exists_ec;
  if (!o->cost_profile.empty() && !std::filesystem::is_regular_file(o->cost_profile, exists_ec)) {
    return Bad(absl::StrCat("--cost-profile: '", o->cost_profile, "' is not a file"));
  }
  const std::string& draft = o->speculative.draft_model;
  std::error_code ec;
  if (!draft.empty() && !std::filesystem::is_directory(draft, ec)) {
    return Bad(absl::StrCat("--speculative-config: \"model\" '", draft, "' is not a directory"));
  }
  const std::string& head = o->speculative.eagle3_model;
  if (!head.empty() && !std::filesystem::is_directory(head, ec)) {
    const char* field = o->speculative.method == SpeculationMethod::kEagle3 && draft.empty()
                            ? "model"
                            : "eagle3_model";
    return Bad(
        absl::StrCat("--speculative-config: \"", field, "\" '", head, "' is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const ServeOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (o.model.empty() || !fs::is_directory(o.model, ec)) {
    return Bad(absl::StrCat("--model: '", o.model, "' is not a directory"));
  }
  SPECD_RETURN_IF_ERROR(CheckDevice(o.device));
  if (o.load_format != "auto" && o.load_format != "dummy") {
    return Bad(absl::StrCat("--load-format: '", o.load_format, "' is not one of auto, dummy"));
  }
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1)) {
    return Bad("--gpu-memory-utilization: must be in (0, 1]");
  }
  SPECD_RETURN_IF_ERROR(CheckRange("port", o.port, 0, 65535));
  SPECD_RETURN_IF_ERROR(CheckRange("grpc-port", o.grpc_port, -1, 65535));
  SPECD_RETURN_IF_ERROR(CheckRange("max-model-len", o.max_model_len, 0, 1 << 24));
  SPECD_RETURN_IF_ERROR(CheckRange("threads", o.num_threads, 0, 4096));
  SPECD_RETURN_IF_ERROR(CheckTensorParallelFlags(o.tensor_parallel));
  SPECD_RETURN_IF_ERROR(CheckRange("max-num-seqs", o.max_num_seqs, 1, 1 << 20));
  SPECD_RETURN_IF_ERROR(CheckRange("max-num-batched-tokens", o.max_num_batched_tokens, 1, 1 << 24));
  SPECD_RETURN_IF_ERROR(CheckRange("max-waiting-requests", o.max_waiting, 1, 1 << 24));
  SPECD_RETURN_IF_ERROR(CheckRange("kv-cache-memory-bytes", o.kv_cache_bytes, 0, int64_t{1} << 50));
  SPECD_RETURN_IF_ERROR(CheckRange("block-size", o.block_size, 1, 1024));
  SPECD_RETURN_IF_ERROR(CheckRange("api-worker-threads", o.api_worker_threads, 1, 256));
  SPECD_RETURN_IF_ERROR(
      CheckRange("max-request-body-bytes", o.max_request_body_bytes, 1024, int64_t{1} << 30));
  SPECD_RETURN_IF_ERROR(CheckSeconds("drain-timeout", o.drain_timeout_s));
  SPECD_RETURN_IF_ERROR(CheckSeconds("request-timeout", o.request_timeout_s));
  SPECD_RETURN_IF_ERROR(CheckSeconds("write-timeout", o.write_timeout_s));
  if (o.write_timeout_s <= 0) return Bad("--write-timeout: must be more than 0 seconds");
  if (o.host.empty()) return Bad("--host: must not be empty");
  if (o.ssl_certfile.empty() != o.ssl_keyfile.empty()) {
    return Bad("--ssl-certfile and --ssl-keyfile must be given together");
  }
  for (const std::string* f : {&o.ssl_certfile, &o.ssl_keyfile}) {
    if (!f->empty() && !fs::is_regular_file(*f, ec)) {
      return Bad(absl::StrCat("TLS file '", *f, "' does not exist"));
    }
  }
  static constexpr const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
  for (const char* level : kLevels) {
    if (o.log_level == level) return absl::OkStatus();
  }
  return Bad(absl::StrCat("--log-level: unknown level '", o.log_level, "'"));
}

// --config's value, found before the other flags so that they override the file.
absl::StatusOr<std::string> FindConfigPath(const std::vector<std::string>& args) {
  std::string path;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config") {
      if (i + 1 >= args.size()) return Bad("--config needs a value");
      path = args[++i];
    } else if (absl::StartsWith(args[i], "--config=")) {
      path = args[i].substr(9);
    }
  }
  return path;
}

}  // namespace

absl::StatusOr<ServeOptions> ParseServeOptions(const std::vector<std::string>& args,
                                               const char* env_api_key) {
  ServeOptions options;
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      options.help = true;
      return options;
    }
  }
  SPECD_ASSIGN_OR_RETURN(std::string config_path, FindConfigPath(args));
  if (!config_path.empty()) {
    SPECD_ASSIGN_OR_RETURN(config::ServeConfig config, LoadConfig(config_path));
    ApplyConfig(config, &options);
  }
  if (env_api_key != nullptr && env_api_key[0] != '\0') options.api_key = env_api_key;
  FlagParser parser;
  Register(parser, options, &config_path);
  SPECD_RETURN_IF_ERROR(parser.Parse(args));
  if (options.served_model_name.empty() && options.model == kBundledModel) {
    options.served_model_name = "codepair";
  }
  if (options.served_model_name.empty()) {
    std::filesystem::path p(options.model);
    options.served_model_name = (p.has_filename() ? p : p.parent_path()).filename().string();
    if (options.served_model_name.empty()) options.served_model_name = options.model;
  }
  SPECD_RETURN_IF_ERROR(Validate(options));
  SPECD_RETURN_IF_ERROR(ParseSpeculation(&options));
  return options;
}

std::string ServeUsage() {
  ServeOptions o;
  std::string config;
  FlagParser parser;
  Register(parser, o, &config);
  return absl::StrCat("usage: specd serve [flags]\n", parser.Usage());
}

EngineOptions ToEngineOptions(const ServeOptions& o) {
  EngineOptions e;
  static_cast<DeviceOptions&>(e) = o;
  static_cast<SchedulerOptions&>(e) = o;
  static_cast<SpeculativeOptions&>(e) = o;
  e.model_dir = o.model;
  e.tensor_parallel = o.tensor_parallel;
  return e;
}

}  // namespace specd
