#include "server/grpc/grpc_front_end.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/service_type.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/grpc/specd_service.h"

namespace specd {
namespace {

constexpr const char* kServiceName = "specd.v1.Specd";

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const GrpcFrontEndOptions& options) {
  if (options.tls_cert_file.empty() && options.tls_key_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key file");
  }
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  SPECD_ASSIGN_OR_RETURN(pair.private_key, ReadFile(options.tls_key_file));
  SPECD_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(options.tls_cert_file));
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<ServedModel> DescribeModel(const Engine& engine,
                                          const GrpcFrontEndOptions& options) {
  ServedModel model;
  model.tokenizer = engine.tokenizer();
  model.served_model_name = options.served_model_name;
  model.max_model_len = engine.max_model_len();
  model.eos_ids = engine.eos_ids();
  model.bos_id = model.tokenizer ? model.tokenizer->bos_id() : std::nullopt;
  if (!model.bos_id) model.bos_id = engine.model_bos_id();
  if (!options.model_dir.empty()) {
    SPECD_RETURN_IF_ERROR(ReadModelFileInfo(options.model_dir, &model));
  }
  if (model.vocab_size == 0 && model.tokenizer) model.vocab_size = model.tokenizer->vocab_size();
  return model;
}

class GrpcFrontEndImpl final : public GrpcFrontEnd {
 public:
  GrpcFrontEndImpl(std::unique_ptr<CallTracker> calls, std::unique_ptr<grpc::Service> service,
                   std::unique_ptr<grpc::Server> server, int32_t port)
      : calls_(std::move(calls)),
        service_(std::move(service)),
        server_(std::move(server)),
        port_(port) {}
  ~GrpcFrontEndImpl() override { Shutdown(absl::Now()); }

  int32_t port() const override { return port_; }

  void SetServing(bool serving) override {
    grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
    if (health == nullptr) return;
    health->SetServingStatus("", serving);
    health->SetServingStatus(kServiceName, serving);
  }

  void Shutdown(absl::Time deadline) override {
    if (shut_down_) return;
    shut_down_ = true;
    SetServing(false);
    // New calls get UNAVAILABLE; running ones may finish until the deadline. Then gRPC's
    // Shutdown cancels what is left (the reactors abort its engine work) and closes the
    // connections at once: given the deadline itself, it would also wait for idle clients.
    calls_->Close();
    if (!calls_->WaitIdle(deadline)) {
      SPECD_LOG_WARN("grpc: shutdown deadline passed: cancelling the calls still running");
    }
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    SPECD_LOG_INFO("grpc: front end on port {} stopped", port_);
  }

 private:
  std::unique_ptr<CallTracker> calls_;      // outlives service_
  std::unique_ptr<grpc::Service> service_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  const int32_t port_;
  bool shut_down_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> GrpcFrontEnd::Start(
    Engine* engine, const GrpcFrontEndOptions& options) {
  if (engine == nullptr) return absl::InvalidArgumentError("gRPC front end needs an engine");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("gRPC port ", options.port, " is invalid"));
  }
  SPECD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, Credentials(options));
  SpecdServiceConfig config;
  config.engine = engine;
  SPECD_ASSIGN_OR_RETURN(config.model, DescribeModel(*engine, options));
  config.api_key = options.api_key;
  config.version = options.version;
  config.stream_limits.max_queued_bytes =
      static_cast<size_t>(std::max<int64_t>(options.max_queued_bytes_per_stream, 1));
  config.stream_limits.write_timeout = options.write_timeout;
  auto calls = std::make_unique<CallTracker>();
  config.calls = calls.get();
  std::unique_ptr<grpc::Service> service = NewSpecdService(std::move(config));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  const std::string address = absl::StrContains(options.host, ':')
                                  ? absl::StrCat("[", options.host, "]:", options.port)
                                  : absl::StrCat(options.host, ":", options.port);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, creds, &bound_port);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("gRPC: cannot listen on ", address));
  }
  auto front_end = std::make_unique<GrpcFrontEndImpl>(std::move(calls), std::move(service),
                                                      std::move(server), bound_port);
  front_end->SetServing(true);
  SPECD_LOG_INFO("grpc: serving {} on {}:{}{}", kServiceName, options.host, bound_port,
                 options.tls_cert_file.empty() ? "" : " (TLS)");
  return front_end;
}

}  // namespace specd
