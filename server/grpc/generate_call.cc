#include "server/grpc/generate_call.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "server/grpc/generate_conversion.h"
#include "server/grpc/specd_service.h"

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

// A merged message stops growing here (a new one starts), well under a client's default
// 4 MiB receive limit.
constexpr size_t kMaxMergedBytes = size_t{256} << 10;
// request_id, index, tags, and a last message's usage and speculation_stats.
constexpr size_t kMessageOverheadBytes = 96;

// The wire bytes `message` grew by since it had these many ids, text bytes and logprobs
// (ids counted at their longest varint); costs only the new part.
size_t GrowthBytes(const v1::GenerateResponse& message, int num_ids, size_t text_size,
                   int num_logprobs) {
  size_t bytes = 5 * static_cast<size_t>(message.token_ids_size() - num_ids) +
                 (message.text().size() - text_size);
  for (int i = num_logprobs; i < message.logprobs_size(); ++i) {
    bytes += message.logprobs(i).ByteSizeLong() + 4;
  }
  return bytes;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpcCode(status.code()), std::string(status.message()));
}

grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

GenerateCall::GenerateCall(Params p)
    : engine_(p.engine),
      tokenizer_(p.tokenizer),
      registry_(p.registry),
      calls_(p.calls),
      caller_(std::move(p.caller)),
      request_id_(std::move(p.request_id)),
      with_logprobs_(p.with_logprobs),
      limits_(p.limits),
      context_(p.context),
      choices_(p.num_choices),
      num_open_(p.num_choices) {}

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
        // Paused while submitting: so is this one.
        action.pause_changed = call->paused_;
      } else {
        call->StopLocked(ToGrpcStatus(id.status()), &action);
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
    ids = OpenRequestsLocked();
  }
  for (RequestId id : ids) engine_->Abort(id);
}

void GenerateCall::CheckStalled(absl::Time now) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (!paused_ || stalled_ || cancelled_ || finish_called_ ||
        now - last_progress_ < limits_.write_timeout) {
      return;
    }
    stalled_ = true;
    holding_finish_ = true;  // so OnDone cannot free context_ during TryCancel
    StopLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"), &action);
  }
  SPECD_LOG_WARN("grpc {}: its client read nothing for {} with over {} bytes queued: aborting",
                 request_id_, absl::FormatDuration(limits_.write_timeout),
                 limits_.max_queued_bytes);
  for (RequestId id : action.to_abort) engine_->Abort(id);
  // The write in flight never completes: only cancelling the stream ends the call. gRPC may
  // run OnCancel / OnWriteDone inline here (they take mu_, which is not held).
  context_->TryCancel();
  Action next;
  {
    absl::MutexLock lock(&mu_);
    holding_finish_ = false;
    PlanLocked(&next);
  }
  Run(std::move(next));
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
        grpc::Status status = ToGrpcStatus(output.status);
        if (aborted_by_request_ && output.status.code() == absl::StatusCode::kCancelled) {
          status = grpc::Status(grpc::StatusCode::CANCELLED,
                                absl::StrCat("request ", request_id_, " was aborted"));
        }
        StopLocked(std::move(status), &action);
      }
    }
    PlanLocked(&action);
    UpdatePauseLocked(&action);
  }
  Run(std::move(action));
}

void GenerateCall::Queue(size_t index, const RequestOutput& output) {
  const bool merge = !pending_.empty() && pending_.back().message.index() == index &&
                     pending_.back().message.finish_reason() == v1::FINISH_REASON_UNSPECIFIED &&
                     pending_.back().bytes < kMaxMergedBytes;
  if (!merge) {
    if (output.tokens.empty() && output.text.empty() && !(output.finished && output.status.ok())) {
      return;  // nothing to tell
    }
    pending_.emplace_back();
    pending_.back().message.set_request_id(request_id_);
    pending_.back().message.set_index(static_cast<uint32_t>(index));
    pending_.back().bytes = kMessageOverheadBytes + request_id_.size();
    queued_bytes_ += pending_.back().bytes;
  }
  Pending& p = pending_.back();
  const int num_ids = p.message.token_ids_size();
  const size_t text_size = p.message.text().size();
  const int num_logprobs = p.message.logprobs_size();
  AppendOutput(output, tokenizer_, with_logprobs_, &p.message);
  const size_t grown = GrowthBytes(p.message, num_ids, text_size, num_logprobs);
  p.bytes += grown;
  queued_bytes_ += grown;
}

void GenerateCall::UpdatePauseLocked(Action* action) {
  if (stop_status_ || cancelled_) return;  // the requests are being ended anyway
  if (!paused_ && queued_bytes_ > limits_.max_queued_bytes) {
    paused_ = true;
    last_progress_ = absl::Now();
    action->pause_changed = true;
    SPECD_LOG_DEBUG("grpc {}: {} bytes queued for a slow client: pausing", request_id_,
                    queued_bytes_);
  } else if (paused_ && queued_bytes_ <= limits_.max_queued_bytes / 4) {
    paused_ = false;
    action->pause_changed = true;
    SPECD_LOG_DEBUG("grpc {}: the client caught up: resuming", request_id_);
  }
}

void GenerateCall::StopLocked(grpc::Status status, Action* action) {
  if (!stop_status_) stop_status_ = std::move(status);
  std::vector<RequestId> open = OpenRequestsLocked();
  action->to_abort.insert(action->to_abort.end(), open.begin(), open.end());
}

std::vector<RequestId> GenerateCall::OpenRequestsLocked() const {
  std::vector<RequestId> ids;
  for (const Choice& c : choices_) {
    if (c.engine_id && !c.done) ids.push_back(*c.engine_id);
  }
  return ids;
}

void GenerateCall::PlanLocked(Action* action) {
  if (finish_called_ || writing_ || holding_finish_) return;
  if (!cancelled_ && !pending_.empty()) {
    action->message = std::move(pending_.front().message);
    in_flight_bytes_ = pending_.front().bytes;
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
  if (action.pause_changed) ApplyPause();
  if (action.kind == Action::kWrite) {
    in_flight_ = SerializeMessage(action.message);
    StartWrite(&in_flight_);
  } else if (action.kind == Action::kFinish) {
    if (!action.status.ok()) {
      SPECD_LOG_DEBUG("grpc {}: ends with {}: {}", request_id_,
                      static_cast<int>(action.status.error_code()), action.status.error_message());
    }
    // The id is free (and Abort says not found) before the client sees the status.
    registry_->Remove(caller_, request_id_, this);
    Finish(std::move(action.status));
  }
}

void GenerateCall::ApplyPause() {
  absl::MutexLock order(&pause_mu_);
  bool paused = false;
  std::vector<RequestId> ids;
  {
    absl::MutexLock lock(&mu_);
    paused = paused_;
    ids = OpenRequestsLocked();
  }
  for (RequestId id : ids) engine_->SetPaused(id, paused);
}

void GenerateCall::OnWriteDone(bool ok) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queued_bytes_ -= in_flight_bytes_;
    in_flight_bytes_ = 0;
    last_progress_ = absl::Now();
    if (!ok) {  // the stream broke: the client is gone
      cancelled_ = true;
      StopLocked(grpc::Status::CANCELLED, &action);
    }
    PlanLocked(&action);
    UpdatePauseLocked(&action);
  }
  Run(std::move(action));
}

void GenerateCall::OnCancel() {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    pending_.clear();
    queued_bytes_ = in_flight_bytes_;
    StopLocked(grpc::Status::CANCELLED, &action);
    PlanLocked(&action);
  }
  Run(std::move(action));
}

void GenerateCall::OnDone() {
  registry_->Remove(caller_, request_id_, this);  // normally done at Finish already
  Action action;
  {
    absl::MutexLock lock(&mu_);
    StopLocked(grpc::Status::CANCELLED, &action);  // normally nothing is left to end
  }
  for (RequestId id : action.to_abort) engine_->Abort(id);
  calls_->End();
  std::shared_ptr<GenerateCall> self = std::move(self_);  // may be the last owner
}

}  // namespace specd
