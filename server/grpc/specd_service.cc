#include "server/grpc/specd_service.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "proto/specd.grpc.pb.h"
#include "server/grpc/auth.h"

namespace specd {
namespace {

// absl and gRPC share the canonical codes; the table is spelled out so a mismatch would show.
grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return grpc::StatusCode::OK;
    case absl::StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted:
      return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kOutOfRange:
      return grpc::StatusCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case absl::StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss:
      return grpc::StatusCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
    case absl::StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case absl::StatusCode::kUnknown:
    default:
      return grpc::StatusCode::UNKNOWN;
  }
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpcCode(s.code()), std::string(s.message()));
}

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

grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
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

class GenerateCall;

// request_id -> running Generate call: for Abort, and to keep caller ids unique.
class CallRegistry {
 public:
  bool Add(const std::string& id, const std::shared_ptr<GenerateCall>& call) {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = calls_.try_emplace(id, call);
    if (inserted) return true;
    if (!it->second.expired()) return false;
    it->second = call;
    return true;
  }
  // Forgets `id` unless a newer call took it over.
  void Remove(const std::string& id, const GenerateCall* call) {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return;
    std::shared_ptr<GenerateCall> current = it->second.lock();
    if (current == nullptr || current.get() == call) calls_.erase(it);
  }
  std::shared_ptr<GenerateCall> Find(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    return it == calls_.end() ? nullptr : it->second.lock();
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<GenerateCall>> calls_ ABSL_GUARDED_BY(mu_);
};

// One Generate call. Owned by shared_ptrs: its own (dropped in OnDone) and one in each engine
// OutputCallback, so an engine update arriving after the RPC ended finds it alive (and
// ignores it). Reactions, engine updates and Abort may run concurrently: all state is under
// mu_, and StartWrite / Finish / Engine::Abort are called after mu_ is released (gRPC may run
// a reaction inline, and Abort may take engine locks).
class GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateCall(Engine* engine, const Tokenizer* tokenizer, CallRegistry* registry,
               CallTracker* calls, std::string request_id, size_t num_choices, bool with_logprobs)
      : engine_(engine),
        tokenizer_(tokenizer),
        registry_(registry),
        calls_(calls),
        request_id_(std::move(request_id)),
        with_logprobs_(with_logprobs),
        choices_(num_choices),
        num_open_(num_choices) {}

  // Submits one engine request per choice; `self` keeps the call alive until OnDone.
  static GenerateCall* Launch(std::shared_ptr<GenerateCall> self,
                              std::vector<GenerateRequest> requests);
  // The Abort RPC: the engine ends the choices, and the call ends CANCELLED.
  void AbortByRequest();

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Choice {
    std::optional<RequestId> engine_id;  // once submitted
    bool done = false;
  };
  // What to do once mu_ is released.
  struct Action {
    enum { kNothing, kWrite, kFinish } kind = kNothing;
    v1::GenerateResponse message;  // kWrite
    grpc::Status status;           // kFinish
    std::vector<RequestId> to_abort;
  };

  void OnOutput(size_t index, RequestOutput&& output);  // engine thread
  void Queue(size_t index, const RequestOutput& output) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the call with `status` (the first stop wins) and collects the engine work to end.
  void StopLocked(grpc::Status status, Action* action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlanLocked(Action* action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Action action);

  Engine* const engine_;
  const Tokenizer* const tokenizer_;
  CallRegistry* const registry_;
  CallTracker* const calls_;
  const std::string request_id_;
  const bool with_logprobs_;
  std::shared_ptr<GenerateCall> self_;  // set by Launch, dropped by OnDone

  absl::Mutex mu_;
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  size_t num_open_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::GenerateResponse> pending_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer in_flight_;  // touched only by the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_by_request_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // client gone: drop what is pending
  std::optional<grpc::Status> stop_status_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
};

GenerateCall* GenerateCall::Launch(std::shared_ptr<GenerateCall> self,
                                   std::vector<GenerateRequest> requests) {
  GenerateCall* call = self.get();
  call->self_ = self;
  for (size_t i = 0; i < requests.size(); ++i) {
    {
      absl::MutexLock lock(&call->mu_);
      if (call->stop_status_) break;
    }
    absl::StatusOr<RequestId> id = call->engine_->Submit(
        std::move(requests[i]),
        [self, i](RequestOutput&& output) { self->OnOutput(i, std::move(output)); });
    Action action;
    {
      absl::MutexLock lock(&call->mu_);
      if (id.ok()) {
        call->choices_[i].engine_id = *id;
        // Cancelled while submitting: end this one too.
        if (call->stop_status_) call->StopLocked(*call->stop_status_, &action);
      } else {
        call->StopLocked(ToGrpc(id.status()), &action);
      }
      call->PlanLocked(&action);
    }
    call->Run(std::move(action));
  }
  return call;
}

void GenerateCall::AbortByRequest() {
  std::vector<RequestId> ids;
  {
    absl::MutexLock lock(&mu_);
    aborted_by_request_ = true;
    for (const Choice& c : choices_) {
      if (c.engine_id && !c.done) ids.push_back(*c.engine_id);
    }
  }
  for (RequestId id : ids) engine_->Abort(id);
}

void GenerateCall::OnOutput(size_t index, RequestOutput&& output) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (finish_called_ || cancelled_ || choices_[index].done) return;
    Queue(index, output);
    if (output.finished) {
      choices_[index].done = true;
      --num_open_;
      if (!output.status.ok()) {
        grpc::Status status = ToGrpc(output.status);
        if (aborted_by_request_ && output.status.code() == absl::StatusCode::kCancelled) {
          status = grpc::Status(grpc::StatusCode::CANCELLED,
                                absl::StrCat("request ", request_id_, " was aborted"));
        }
        StopLocked(std::move(status), &action);
      }
    }
    PlanLocked(&action);
  }
  Run(std::move(action));
}

void GenerateCall::Queue(size_t index, const RequestOutput& output) {
  const bool merge = !pending_.empty() && pending_.back().index() == index &&
                     pending_.back().finish_reason() == v1::FINISH_REASON_UNSPECIFIED;
  if (!merge) {
    if (output.tokens.empty() && output.text.empty() && !(output.finished && output.status.ok())) {
      return;  // nothing to tell
    }
    pending_.emplace_back();
    pending_.back().set_request_id(request_id_);
    pending_.back().set_index(static_cast<uint32_t>(index));
  }
  AppendOutput(output, tokenizer_, with_logprobs_, &pending_.back());
}

void GenerateCall::StopLocked(grpc::Status status, Action* action) {
  if (!stop_status_) stop_status_ = std::move(status);
  for (Choice& c : choices_) {
    if (c.engine_id && !c.done) action->to_abort.push_back(*c.engine_id);
  }
}

void GenerateCall::PlanLocked(Action* action) {
  if (finish_called_ || writing_) return;
  if (!cancelled_ && !pending_.empty()) {
    action->message = std::move(pending_.front());
    pending_.pop_front();
    writing_ = true;
    action->kind = Action::kWrite;
    return;
  }
  if (!cancelled_ && !stop_status_ && num_open_ > 0) return;
  finish_called_ = true;
  action->kind = Action::kFinish;
  if (cancelled_) {
    action->status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  } else if (stop_status_) {
    action->status = *stop_status_;
  }
}

void GenerateCall::Run(Action action) {
  for (RequestId id : action.to_abort) engine_->Abort(id);
  if (action.kind == Action::kWrite) {
    in_flight_ = SerializeMessage(action.message);
    StartWrite(&in_flight_);
  } else if (action.kind == Action::kFinish) {
    if (!action.status.ok()) {
      SPECD_LOG_DEBUG("grpc {}: ends with {}: {}", request_id_,
                      static_cast<int>(action.status.error_code()), action.status.error_message());
    }
    // The id is free (and Abort says not found) before the client sees the status.
    registry_->Remove(request_id_, this);
    Finish(std::move(action.status));
  }
}

void GenerateCall::OnWriteDone(bool ok) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {  // the stream broke: the client is gone
      cancelled_ = true;
      StopLocked(grpc::Status::CANCELLED, &action);
    }
    PlanLocked(&action);
  }
  Run(std::move(action));
}

void GenerateCall::OnCancel() {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    pending_.clear();
    StopLocked(grpc::Status::CANCELLED, &action);
    PlanLocked(&action);
  }
  Run(std::move(action));
}

void GenerateCall::OnDone() {
  registry_->Remove(request_id_, this);  // normally done at Finish already
  Action action;
  {
    absl::MutexLock lock(&mu_);
    StopLocked(grpc::Status::CANCELLED, &action);  // normally nothing is left to end
  }
  for (RequestId id : action.to_abort) engine_->Abort(id);
  calls_->End();
  std::shared_ptr<GenerateCall> self = std::move(self_);  // may be the last owner
}

// Every method raw (ByteBuffer in and out) so that parsing is ours; see ParseMessage.
using RawSpecdService = v1::Specd::WithRawCallbackMethod_Generate<
    v1::Specd::WithRawCallbackMethod_Abort<v1::Specd::WithRawCallbackMethod_Tokenize<
        v1::Specd::WithRawCallbackMethod_Detokenize<v1::Specd::WithRawCallbackMethod_GetModelInfo<
            v1::Specd::WithRawCallbackMethod_GetServerInfo<v1::Specd::Service>>>>>>;

class SpecdService final : public RawSpecdService {
 public:
  explicit SpecdService(SpecdServiceConfig config) : config_(std::move(config)) {}

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
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out,
                                  absl::Status (SpecdService::*handler)(const Request&,
                                                                        Response*)) {
    if (!config_.calls->Begin()) {
      return new UnaryReply(nullptr, grpc::Status(grpc::StatusCode::UNAVAILABLE, kShuttingDown));
    }
    Request request;
    Response response;
    absl::Status status = Authorize(*ctx);
    if (status.ok()) status = ParseMessage(*in, &request);
    if (status.ok()) status = (this->*handler)(request, &response);
    if (status.ok()) *out = SerializeMessage(response);
    return new UnaryReply(config_.calls, ToGrpc(status));
  }

  absl::Status DoAbort(const v1::AbortRequest& request, v1::AbortResponse* response);
  absl::Status DoTokenize(const v1::TokenizeRequest& request, v1::TokenizeResponse* response);
  absl::Status DoDetokenize(const v1::DetokenizeRequest& request, v1::DetokenizeResponse* response);
  absl::Status DoGetModelInfo(const v1::GetModelInfoRequest& request,
                              v1::GetModelInfoResponse* response);
  absl::Status DoGetServerInfo(const v1::GetServerInfoRequest& request,
                               v1::GetServerInfoResponse* response);

  const SpecdServiceConfig config_;
  CallRegistry registry_;
  std::atomic<uint64_t> next_request_id_{1};
};

absl::Status SpecdService::Authorize(const grpc::CallbackServerContext& ctx) const {
  if (config_.api_key.empty()) return absl::OkStatus();
  const auto& metadata = ctx.client_metadata();
  auto [begin, end] = metadata.equal_range("authorization");
  for (auto it = begin; it != end; ++it) {
    if (BearerTokenMatches(std::string_view(it->second.data(), it->second.size()),
                           config_.api_key)) {
      return absl::OkStatus();
    }
  }
  return absl::UnauthenticatedError(
      "missing or invalid API key: send metadata 'authorization: Bearer <key>'");
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
  if (!status.ok()) return new FailedGenerate(calls, ToGrpc(status));
  std::string request_id = request.request_id();
  if (request_id.empty()) request_id = absl::StrCat("grpc-", next_request_id_++);
  absl::StatusOr<std::vector<GenerateRequest>> requests =
      ToEngineRequests(request, config_.model, request_id, DeadlineOf(*ctx));
  if (!requests.ok()) return new FailedGenerate(calls, ToGrpc(requests.status()));
  auto call =
      std::make_shared<GenerateCall>(config_.engine, config_.model.tokenizer, &registry_, calls,
                                     request_id, requests->size(), request.has_logprobs());
  if (!registry_.Add(request_id, call)) {
    return new FailedGenerate(
        calls, grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                            absl::StrCat("request_id '", request_id, "' is already running")));
  }
  SPECD_LOG_DEBUG("grpc {}: Generate, {} prompt tokens, {} choice(s)", request_id,
                  requests->front().prompt_ids.size(), requests->size());
  return GenerateCall::Launch(std::move(call), *std::move(requests));
}

absl::Status SpecdService::DoAbort(const v1::AbortRequest& request, v1::AbortResponse* response) {
  if (request.request_id().empty()) return absl::InvalidArgumentError("request_id is required");
  std::shared_ptr<GenerateCall> call = registry_.Find(request.request_id());
  if (call != nullptr) call->AbortByRequest();
  response->set_found(call != nullptr);
  return absl::OkStatus();
}

absl::Status SpecdService::DoTokenize(const v1::TokenizeRequest& request,
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

absl::Status SpecdService::DoDetokenize(const v1::DetokenizeRequest& request,
                                        v1::DetokenizeResponse* response) {
  const Tokenizer* tok = config_.model.tokenizer;
  if (tok == nullptr) return absl::FailedPreconditionError("model has no tokenizer");
  const bool skip = !request.has_skip_special_tokens() || request.skip_special_tokens();
  const std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  SPECD_ASSIGN_OR_RETURN(*response->mutable_text(), tok->Decode(ids, skip));
  return absl::OkStatus();
}

absl::Status SpecdService::DoGetModelInfo(const v1::GetModelInfoRequest& /*request*/,
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

absl::Status SpecdService::DoGetServerInfo(const v1::GetServerInfoRequest& /*request*/,
                                           v1::GetServerInfoResponse* response) {
  const EngineStats stats = config_.engine->Stats();
  response->set_version(config_.version);
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - config_.start_time));
  response->set_num_running_requests(stats.num_running);
  response->set_num_waiting_requests(stats.num_waiting);
  response->set_kv_blocks_used(stats.kv_blocks_used);
  response->set_kv_blocks_total(stats.kv_blocks_total);
  response->set_draining(stats.draining);
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
