#include "server/grpc/specd_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "proto/specd.grpc.pb.h"
#include "server/api_key.h"
#include "server/grpc/call_registry.h"
#include "server/grpc/generate_call.h"

namespace specd {
namespace {

// Requests are parsed here rather than by gRPC, whose callback handlers answer an unparsable
// message with an empty UNIMPLEMENTED; a client deserves INVALID_ARGUMENT and a reason.
absl::Status ParseMessage(const grpc::ByteBuffer& in, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (in.Dump(&slices).ok()) {
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    if (message->ParseFromString(bytes)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", message->GetTypeName(),
                   " (malformed protobuf, or a string field that is not UTF-8)"));
}

absl::Time DeadlineOf(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  // No deadline reads as time_point::max(); anything a century out is as good as none.
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365 * 100)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

constexpr const char* kShuttingDown = "the server is shutting down";

// Finishes a Generate call that failed before any work began.
class FailedGenerate final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FailedGenerate(CallTracker* calls, grpc::Status status) : calls_(calls) {
    Finish(std::move(status));
  }
  void OnDone() override {
    if (calls_ != nullptr) calls_->End();
    delete this;
  }

 private:
  CallTracker* const calls_;  // null: the call was never counted
};

// Answers a unary call.
class UnaryReply final : public grpc::ServerUnaryReactor {
 public:
  UnaryReply(CallTracker* calls, grpc::Status status) : calls_(calls) { Finish(std::move(status)); }
  void OnDone() override {
    if (calls_ != nullptr) calls_->End();
    delete this;
  }

 private:
  CallTracker* const calls_;  // null: the call was never counted
};

// Who a call comes from, for Abort's scope and request_id's namespace: the client's
// connection, as its transport address ("ipv4:127.0.0.1:41234"). A Generate call lives no
// longer than its HTTP/2 connection, and no two open connections share an address, so a
// caller's calls are those made on the same connection (one channel). The API key cannot
// tell clients apart: every client of a server shares its one key.
std::string CallerOf(const grpc::CallbackServerContext& ctx) { return ctx.peer(); }

// Gives each running Generate call's CheckStalled a chance about every `period`.
class StallWatch {
 public:
  StallWatch(CallRegistry<GenerateCall>* registry, absl::Duration period)
      : registry_(registry), period_(period), thread_([this] { Loop(); }) {}
  ~StallWatch() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

 private:
  void Loop() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) return;
      }
      const absl::Time now = absl::Now();
      for (const std::shared_ptr<GenerateCall>& call : registry_->All()) call->CheckStalled(now);
    }
  }

  CallRegistry<GenerateCall>* const registry_;
  const absl::Duration period_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is set
};

// Every method raw (ByteBuffer in and out) so that parsing is ours; see ParseMessage.
using RawSpecdService = v1::Specd::WithRawCallbackMethod_Generate<
    v1::Specd::WithRawCallbackMethod_Abort<v1::Specd::WithRawCallbackMethod_Tokenize<
        v1::Specd::WithRawCallbackMethod_Detokenize<v1::Specd::WithRawCallbackMethod_GetModelInfo<
            v1::Specd::WithRawCallbackMethod_GetServerInfo<v1::Specd::Service>>>>>>;

class SpecdService final : public RawSpecdService {
 public:
  explicit SpecdService(SpecdServiceConfig config)
      : config_(std::move(config)),
        stall_watch_(&registry_, std::clamp(config_.stream_limits.write_timeout / 4,
                                            absl::Milliseconds(10), absl::Seconds(1))) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* in) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out) override {
    return Unary(ctx, in, out, &SpecdService::DoAbort);
  }
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out) override {
    return Unary(ctx, in, out, &SpecdService::DoTokenize);
  }
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                       grpc::ByteBuffer* out) override {
    return Unary(ctx, in, out, &SpecdService::DoDetokenize);
  }
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override {
    return Unary(ctx, in, out, &SpecdService::DoGetModelInfo);
  }
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override {
    return Unary(ctx, in, out, &SpecdService::DoGetServerInfo);
  }

 private:
  absl::Status Authorize(const grpc::CallbackServerContext& ctx) const;

  // Authorizes, parses, handles and serializes; answers inline.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Unary(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
      absl::Status (SpecdService::*handler)(const std::string& caller, const Request&, Response*)) {
    if (!config_.calls->Begin()) {
      return new UnaryReply(nullptr, grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
    }
    Request request;
    Response response;
    absl::Status status = Authorize(*ctx);
    if (status.ok()) status = ParseMessage(*in, &request);
    if (status.ok()) status = (this->*handler)(CallerOf(*ctx), request, &response);
    if (status.ok()) *out = SerializeMessage(response);
    return new UnaryReply(config_.calls, ToGrpcStatus(status));
  }

  // Unary handlers; `caller` is CallerOf the call.
  absl::Status DoAbort(const std::string& caller, const v1::AbortRequest& request,
                       v1::AbortResponse* response);
  absl::Status DoTokenize(const std::string& caller, const v1::TokenizeRequest& request,
                          v1::TokenizeResponse* response);
  absl::Status DoDetokenize(const std::string& caller, const v1::DetokenizeRequest& request,
                            v1::DetokenizeResponse* response);
  absl::Status DoGetModelInfo(const std::string& caller, const v1::GetModelInfoRequest& request,
                              v1::GetModelInfoResponse* response);
  absl::Status DoGetServerInfo(const std::string& caller, const v1::GetServerInfoRequest& request,
                               v1::GetServerInfoResponse* response);

  const SpecdServiceConfig config_;
  CallRegistry<GenerateCall> registry_;  // outlives stall_watch_
  StallWatch stall_watch_;
};

absl::Status SpecdService::Authorize(const grpc::CallbackServerContext& ctx) const {
  if (config_.api_key.empty()) return absl::OkStatus();
  // As HTTP's one Authorization header; of several values the first error is told.
  absl::Status first = absl::UnauthenticatedError(kMissingApiKeyMessage);
  auto [begin, end] = ctx.client_metadata().equal_range("authorization");
  for (auto it = begin; it != end; ++it) {
    absl::Status s = CheckBearerCredential(absl::string_view(it->second.data(), it->second.size()),
                                           config_.api_key);
    if (s.ok()) return s;
    if (it == begin) first = std::move(s);
  }
  return first;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SpecdService::Generate(grpc::CallbackServerContext* ctx,
                                                                   const grpc::ByteBuffer* in) {
  CallTracker* calls = config_.calls;
  if (!calls->Begin()) {
    return new FailedGenerate(nullptr, grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
  }
  v1::GenerateRequest request;
  absl::Status status = Authorize(*ctx);
  if (status.ok()) status = ParseMessage(*in, &request);
  if (!status.ok()) return new FailedGenerate(calls, ToGrpcStatus(status));
  std::string request_id = request.request_id();
  if (request_id.empty()) {
    absl::StatusOr<std::string> id = NewRequestId();
    if (!id.ok()) return new FailedGenerate(calls, ToGrpcStatus(id.status()));
    request_id = *std::move(id);
  }
  absl::StatusOr<std::vector<GenerateRequest>> requests =
      ToEngineRequests(request, config_.model, request_id, DeadlineOf(*ctx));
  if (!requests.ok()) return new FailedGenerate(calls, ToGrpcStatus(requests.status()));
  GenerateCall::Params params;
  params.engine = config_.engine;
  params.tokenizer = config_.model.tokenizer;
  params.registry = &registry_;
  params.calls = calls;
  params.context = ctx;
  params.caller = CallerOf(*ctx);
  params.request_id = request_id;
  params.num_choices = requests->size();
  params.with_logprobs = request.has_logprobs();
  params.limits = config_.stream_limits;
  auto call = std::make_shared<GenerateCall>(std::move(params));
  // A client's ids are its own: another caller's running "job-1" neither blocks nor shows.
  if (!registry_.Add(call->caller(), request_id, call)) {
    return new FailedGenerate(
        calls, grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                            absl::StrCat("request_id '", request_id, "' is already running")));
  }
  SPECD_LOG_DEBUG("grpc {}: Generate, {} prompt tokens, {} choice(s)", request_id,
                  requests->front().prompt_ids.size(), requests->size());
  return GenerateCall::Launch(std::move(call), *std::move(requests));
}

// Another caller's id is answered as an unknown one (found = false), so ids cannot be probed.
absl::Status SpecdService::DoAbort(const std::string& caller, const v1::AbortRequest& request,
                                   v1::AbortResponse* response) {
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is required");
  std::shared_ptr<GenerateCall> call = registry_.Find(caller, request.request_id());
  if (call != nullptr) call->AbortByRequest();
  response->set_found(call != nullptr);
  return absl::OkStatus();
}

absl::Status SpecdService::DoTokenize(const std::string& /*caller*/,
                                      const v1::TokenizeRequest& request,
                                      v1::TokenizeResponse* response) {
  const Tokenizer* tok = config_.model.tokenizer;
  if (tok == nullptr) return absl::FailedPreconditionError("model has no tokenizer");
  const bool add_special = !request.has_add_special_tokens() || request.add_special_tokens();
  SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(request.text(), add_special));
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  response->set_count(static_cast<int32_t>(ids.size()));
  response->set_max_model_len(config_.model.max_model_len);
  return absl::OkStatus();
}

absl::Status SpecdService::DoDetokenize(const std::string& /*caller*/,
                                        const v1::DetokenizeRequest& request,
                                        v1::DetokenizeResponse* response) {
  const Tokenizer* tok = config_.model.tokenizer;
  if (tok == nullptr) return absl::FailedPreconditionError("model has no tokenizer");
  const bool skip = !request.has_skip_special_tokens() || request.skip_special_tokens();
  const std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  SPECD_ASSIGN_OR_RETURN(*response->mutable_text(), tok->Decode(ids, skip));
  return absl::OkStatus();
}

absl::Status SpecdService::DoGetModelInfo(const std::string& /*caller*/,
                                          const v1::GetModelInfoRequest& /*request*/,
                                          v1::GetModelInfoResponse* response) {
  const ServedModel& m = config_.model;
  response->set_served_model_name(m.served_model_name);
  response->set_max_model_len(m.max_model_len);
  response->set_vocab_size(m.vocab_size);
  response->set_architecture(m.architecture);
  response->mutable_eos_token_ids()->Add(m.eos_ids.begin(), m.eos_ids.end());
  if (m.bos_id) response->set_bos_token_id(*m.bos_id);
  response->set_has_tokenizer(m.tokenizer != nullptr);
  return absl::OkStatus();
}

absl::Status SpecdService::DoGetServerInfo(const std::string& /*caller*/,
                                           const v1::GetServerInfoRequest& /*request*/,
                                           v1::GetServerInfoResponse* response) {
  const EngineStats stats = config_.engine->Stats();
  response->set_version(config_.version);
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - config_.start_time));
  response->set_num_running_requests(stats.num_running);
  response->set_num_waiting_requests(stats.num_waiting);
  response->set_kv_blocks_used(stats.kv_blocks_used);
  response->set_kv_blocks_total(stats.kv_blocks_total);
  response->set_draining(stats.draining);
  response->set_cost_profile_json(config_.engine->cost_profile_json());
  response->set_cost_profile_source(config_.engine->cost_profile_source());
  return absl::OkStatus();
}

}  // namespace

bool CallTracker::Begin() {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  ++num_calls_;
  return true;
}

void CallTracker::End() {
  absl::MutexLock lock(&mu_);
  --num_calls_;
}

void CallTracker::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool CallTracker::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(
      absl::Condition(
          +[](int64_t* num_calls) { return *num_calls == 0; }, &num_calls_),
      deadline);
}

std::unique_ptr<grpc::Service> NewSpecdService(SpecdServiceConfig config) {
  return std::make_unique<SpecdService>(std::move(config));
}

}  // namespace specd
