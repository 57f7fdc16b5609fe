#include "server/http/generation.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/engine.h"

namespace specd::http {
namespace {

class GenerationCall : public std::enable_shared_from_this<GenerationCall> {
 public:
  GenerationCall(Engine* engine, GenerationSpec spec, ResponseMeta meta,
                 std::shared_ptr<Exchange> exchange)
      : engine_(engine),
        spec_(std::move(spec)),
        meta_(std::move(meta)),
        exchange_(std::move(exchange)),
        choices_(spec_.requests.size()) {
    for (size_t i = 0; i < choices_.size(); ++i) {
      choices_[i].prompt_tokens = static_cast<int64_t>(spec_.requests[i].prompt_ids.size());
    }
  }

  void Start(absl::Duration timeout);

 private:
  struct Choice {
    RequestId id = 0;
    bool submitted = false;
    bool finished = false;
    std::string text;                    // non-stream: all text so far
    std::vector<GeneratedToken> tokens;  // non-stream with logprobs
    int64_t num_tokens = 0;
    int64_t prompt_tokens = 0;
    int64_t text_offset = 0;  // stream: completion logprobs' running offset
    FinishReason finish_reason = FinishReason::kLength;
    RequestUsage usage;  // the engine's, final once finished
  };

  absl::Status SubmitAll(absl::Duration timeout);
  void OnOutput(size_t index, RequestOutput out);
  void StreamOutput(size_t index, const RequestOutput& out);
  void Fail(const absl::Status& status);
  void FinishAll();
  void AbortUnfinished();
  void SetPaused(bool paused);
  Usage TotalUsage() const;

  Engine* engine_;
  GenerationSpec spec_;
  ResponseMeta meta_;
  std::shared_ptr<Exchange> exchange_;
  std::vector<Choice> choices_;  // [num_prompts * n]
  size_t num_finished_ = 0;
  bool done_ = false;  // the exchange has ended (answered, failed, or client gone)
};

void GenerationCall::Start(absl::Duration timeout) {
  std::weak_ptr<GenerationCall> weak = weak_from_this();
  exchange_->OnDisconnect([weak] {
    if (auto call = weak.lock(); call && !call->done_) {
      SPECD_LOG_INFO("{}: client disconnected; aborting", call->meta_.id);
      call->done_ = true;
      call->AbortUnfinished();
    }
  });
  if (absl::Status s = SubmitAll(timeout); !s.ok()) {
    AbortUnfinished();
    done_ = true;
    exchange_->Reply(ErrorReply(s));
    return;
  }
  if (!spec_.stream) return;
  // A client that stops reading stalls its engine requests (they keep their KV) instead of
  // having the session buffer their whole output.
  exchange_->OnBackpressure([weak](bool paused) {
    if (auto call = weak.lock(); call && !call->done_) call->SetPaused(paused);
  });
  exchange_->BeginEvents();
  if (meta_.endpoint == Endpoint::kChat) {
    std::string events;
    for (size_t i = 0; i < choices_.size(); ++i)
      events += RoleEvent(meta_, static_cast<int32_t>(i));
    exchange_->SendEvent(std::move(events));
  }
}

absl::Status GenerationCall::SubmitAll(absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  for (size_t i = 0; i < choices_.size(); ++i) {
    GenerateRequest request = std::move(spec_.requests[i]);
    request.deadline = deadline;
    request.request_id = absl::StrCat(meta_.id, "-", i);
    // The engine thread only posts; outputs are handled in order on the strand.
    auto self = shared_from_this();
    OutputCallback callback = [self, i](RequestOutput&& out) {
      self->exchange_->Post(
          [self, i, out = std::move(out)]() mutable { self->OnOutput(i, std::move(out)); });
    };
    absl::StatusOr<RequestId> id = engine_->Submit(std::move(request), std::move(callback));
    if (!id.ok()) return id.status();
    choices_[i].id = *id;
    choices_[i].submitted = true;
  }
  spec_.requests.clear();
  return absl::OkStatus();
}

void GenerationCall::OnOutput(size_t index, RequestOutput out) {
  Choice& c = choices_[index];
  if (c.finished) return;
  c.num_tokens += static_cast<int64_t>(out.tokens.size());
  if (out.finished) {
    c.finished = true;
    c.finish_reason = out.finish_reason;
    c.usage = out.usage;
    ++num_finished_;
  }
  if (done_) return;
  if (out.finished && !out.status.ok()) {
    Fail(out.status);
    return;
  }
  if (spec_.stream) {
    StreamOutput(index, out);
  } else {
    c.text += out.text;
    if (meta_.logprobs) {
      for (GeneratedToken& t : out.tokens) c.tokens.push_back(std::move(t));
    }
  }
  if (num_finished_ == choices_.size()) FinishAll();
}

void GenerationCall::StreamOutput(size_t index, const RequestOutput& out) {
  Choice& c = choices_[index];
  const auto i = static_cast<int32_t>(index);
  std::string events;
  if (!out.text.empty() || (meta_.logprobs && !out.tokens.empty())) {
    events = ContentEvent(meta_, i, out.text, out.tokens, &c.text_offset);
  }
  if (out.finished) events += FinishEvent(meta_, i, out.finish_reason);
  if (!events.empty()) exchange_->SendEvent(std::move(events));
}

void GenerationCall::Fail(const absl::Status& status) {
  done_ = true;
  SPECD_LOG_INFO("{}: failed: {}", meta_.id, status.ToString());
  AbortUnfinished();
  if (!spec_.stream) {
    exchange_->Reply(ErrorReply(status));
    return;
  }
  // Streaming has begun: the error travels as an event, then the stream ends normally.
  exchange_->SendEvent(ErrorEvent(ToApiError(status)) + DoneEvent());
  exchange_->EndEvents();
}

void GenerationCall::FinishAll() {
  done_ = true;
  if (!spec_.stream) {
    std::vector<ChoiceOutput> outputs;
    outputs.reserve(choices_.size());
    for (Choice& c : choices_) {
      outputs.push_back({std::move(c.text), std::move(c.tokens), c.finish_reason});
    }
    exchange_->Reply(JsonReply(200, FormatResponse(meta_, outputs, TotalUsage())));
    return;
  }
  std::string events;
  if (spec_.include_usage) events += UsageEvent(meta_, TotalUsage());
  events += DoneEvent();
  exchange_->SendEvent(std::move(events));
  exchange_->EndEvents();
}

void GenerationCall::AbortUnfinished() {
  for (const Choice& c : choices_) {
    if (c.submitted && !c.finished) engine_->Abort(c.id);
  }
}

void GenerationCall::SetPaused(bool paused) {
  SPECD_LOG_DEBUG("{}: {}", meta_.id, paused ? "client not reading; pausing" : "resuming");
  for (const Choice& c : choices_) {
    if (c.submitted && !c.finished) engine_->SetPaused(c.id, paused);
  }
}

// Prompt tokens count once per prompt (not per choice), as OpenAI counts them.
Usage GenerationCall::TotalUsage() const {
  Usage u;
  u.report_speculation = spec_.report_speculation;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    u.completion_tokens += c.num_tokens;
    if (i % static_cast<size_t>(spec_.n) == 0) {
      u.prompt_tokens += c.prompt_tokens;
      u.cached_tokens += c.usage.cached_prompt_tokens;
    }
    u.num_drafts += c.usage.num_drafts;
    u.num_draft_tokens += c.usage.num_draft_tokens;
    u.num_accepted_tokens += c.usage.num_accepted_tokens;
    u.report_ssd = u.report_ssd || c.usage.ssd;
    u.num_cache_hit_drafts += c.usage.num_cache_hit_drafts;
    u.num_cache_hit_draft_tokens += c.usage.num_cache_hit_draft_tokens;
    u.num_cache_hit_accepted_tokens += c.usage.num_cache_hit_accepted_tokens;
    u.num_cache_miss_drafts += c.usage.num_cache_miss_drafts;
    u.ssd_wait_seconds += c.usage.ssd_wait_seconds;
    u.draft_context_stop = std::max(u.draft_context_stop, c.usage.draft_context_stop);
    u.AddByMethod(c.usage.by_method);
  }
  return u;
}

}  // namespace

void StartGeneration(Engine* engine, GenerationSpec spec, ResponseMeta meta,
                     std::shared_ptr<Exchange> exchange, absl::Duration timeout) {
  auto call = std::make_shared<GenerationCall>(engine, std::move(spec), std::move(meta),
                                               std::move(exchange));
  call->Start(timeout);
}

}  // namespace specd::http
