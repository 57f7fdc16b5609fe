// The serving half of Engine: the engine thread's loop and the thread-safe API front-end
// threads call (Start, Submit, Abort, SetPaused, BeginDrain, WaitIdle, Stop, Stats). The inbox and
// the stats snapshot in Engine::Shared are the only state both sides touch.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/runner/model_runner.h"
#include "engine/step/speculator_set.h"
#include "engine/step/step_pipeline.h"

namespace specd {

absl::Status Engine::Start() {
  std::lock_guard join_lock(shared_->join_mu);
  std::lock_guard lock(shared_->mu);
  if (shared_->started) return absl::FailedPreconditionError("engine already started");
  shared_->started = true;
  shared_->stats.running = true;
  shared_->thread = std::thread([this] { ServeLoop(); });
  SPECD_LOG_INFO("engine: serving (max_num_seqs {}, max_num_batched_tokens {}, max_waiting {})",
                 options_.max_num_seqs, options_.max_num_batched_tokens, options_.max_waiting);
  return absl::OkStatus();
}

absl::StatusOr<RequestId> Engine::Submit(GenerateRequest request, OutputCallback on_output) {
  // The one place a served request's speculation is validated and resolved; the result rides
  // the inbox to the engine thread.
  SPECD_ASSIGN_OR_RETURN(ResolvedSpeculation speculation, Admit(request));
  const absl::Time arrival = absl::Now();
  RequestId id = 0;
  {
    std::lock_guard lock(shared_->mu);
    if (!shared_->started || shared_->stopping) {
      return absl::UnavailableError("the engine is not running");
    }
    if (shared_->draining) return absl::UnavailableError("the engine is draining");
    if (const absl::Status group = runner_->GroupStatus(); !group.ok()) return group;
    const int64_t queued = int64_t{shared_->stats.num_waiting} + shared_->inbox.size();
    if (queued >= options_.max_waiting) {
      return absl::ResourceExhaustedError(
          absl::StrCat("waiting queue full (", options_.max_waiting, " requests)"));
    }
    id = shared_->next_id++;
    shared_->inbox.push_back(
        {id, std::move(request), std::move(speculation), std::move(on_output), arrival});
  }
  shared_->work_cv.notify_one();
  return id;
}

void Engine::Abort(RequestId id) {
  {
    std::lock_guard lock(shared_->mu);
    if (!shared_->started || shared_->stopping) return;
    shared_->aborts.push_back(id);
  }
  shared_->work_cv.notify_one();
}

void Engine::SetPaused(RequestId id, bool paused) {
  {
    std::lock_guard lock(shared_->mu);
    if (!shared_->started || shared_->stopping) return;
    shared_->pauses.emplace_back(id, paused);
  }
  shared_->work_cv.notify_one();
}

void Engine::BeginDrain() {
  std::lock_guard lock(shared_->mu);
  shared_->draining = true;
}

bool Engine::WaitIdle(absl::Duration timeout) {
  std::unique_lock lock(shared_->mu);
  auto idle = [this]() { return shared_->Idle(); };
  if (timeout >= absl::Hours(24 * 365)) {  // chrono would overflow on "infinite"
    shared_->idle_cv.wait(lock, idle);
    return true;
  }
  return shared_->idle_cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), idle);
}

void Engine::Stop() {
  std::lock_guard join_lock(shared_->join_mu);
  {
    std::lock_guard lock(shared_->mu);
    shared_->stopping = true;
  }
  shared_->work_cv.notify_one();
  if (shared_->thread.joinable()) {
    shared_->thread.join();
    SPECD_LOG_INFO("engine: stopped");
  }
}

EngineStats Engine::Stats() const {
  std::lock_guard lock(shared_->mu);
  EngineStats s = shared_->stats;
  s.num_waiting += static_cast<int32_t>(shared_->inbox.size());
  s.draining = shared_->draining;
  // Read live: a watchdog thread fails the group, possibly while the engine thread is idle.
  if (const absl::Status group = runner_->GroupStatus(); !group.ok()) {
    s.failed = true;
    s.failure = std::string(group.message());
  }
  return s;
}

// The observer hears of a step before the snapshot is published, so whoever saw
// WaitIdle return also sees every OnStep of the work it waited for.
void Engine::PublishStats(bool step_ran) {
  EngineStats s;
  const StepPipeline& p = *pipeline_;
  s.num_running = p.scheduler().num_running();
  s.num_waiting = p.scheduler().num_waiting();
  s.num_paused = p.scheduler().num_paused();
  s.kv_blocks_used = p.blocks().num_used_blocks();
  s.kv_blocks_total = p.blocks().num_blocks();
  s.running = serving_;
  if (const SsdStats* ssd = speculators_->ssd_stats(); ssd != nullptr) s.ssd = *ssd;
  if (step_ran && options_.observer) {
    {
      std::lock_guard lock(shared_->mu);
      s.draining = shared_->draining;
    }
    options_.observer->OnStep(s);
  }
  bool idle = false;
  {
    std::lock_guard lock(shared_->mu);
    s.draining = shared_->draining;
    shared_->stats = s;
    idle = shared_->Idle();
  }
  if (idle) shared_->idle_cv.notify_all();
}

void Engine::ExpireDeadlines(absl::Time now) {
  std::vector<RequestId> expired;
  for (const auto& [id, r] : pipeline_->live()) {
    if (r->request.deadline <= now) expired.push_back(id);
  }
  for (RequestId id : expired) {
    pipeline_->Finish(*pipeline_->Find(id), FinishReason::kAbort,
                      absl::DeadlineExceededError("request deadline passed"), now);
  }
}

// Applies what front ends asked since the last step: new requests, pauses, aborts.
void Engine::ApplyInbox(Inbox& inbox, absl::Time now) {
  for (Shared::Pending& p : inbox.incoming) {
    pipeline_->Add(p.id, std::move(p.request), p.speculation, std::move(p.on_output), p.arrival);
  }
  for (const auto& [id, paused] : inbox.pauses) pipeline_->SetPaused(id, paused);
  for (RequestId id : inbox.aborts) {
    if (LiveRequest* r = pipeline_->Find(id)) {
      pipeline_->Finish(*r, FinishReason::kAbort, absl::CancelledError("aborted"), now);
    }
  }
}

// After a step that ran nothing while requests are live. When all of them are paused, sleep
// until a front end calls or the first deadline passes; otherwise (nothing could be
// scheduled, which a valid KV pool never causes) back off 1 ms instead of spinning.
void Engine::WaitWhileStalled() {
  absl::Time wake = absl::Now() + absl::Milliseconds(1);
  if (pipeline_->scheduler().num_paused() == static_cast<int32_t>(pipeline_->live().size())) {
    wake = absl::InfiniteFuture();
    for (const auto& [id, r] : pipeline_->live()) wake = std::min(wake, r->request.deadline);
  }
  Shared& sh = *shared_;
  std::unique_lock lock(sh.mu);
  auto has_work = [&sh] { return sh.HasWork(); };
  if (wake == absl::InfiniteFuture()) {
    sh.work_cv.wait(lock, has_work);
  } else {
    sh.work_cv.wait_until(lock, absl::ToChronoTime(wake), has_work);
  }
}

// The engine thread: take new requests, pauses and aborts from the inbox, drop expired
// requests, run one step, publish stats; sleep while there is nothing to do.
void Engine::ServeLoop() {
  Shared& sh = *shared_;
  serving_ = true;
  PublishStats(false);  // KV capacity and SSD's link are reported before any request
  for (;;) {
    Inbox inbox;
    {
      std::unique_lock lock(sh.mu);
      if (pipeline_->empty()) sh.work_cv.wait(lock, [&sh] { return sh.HasWork(); });
      inbox.incoming.swap(sh.inbox);
      inbox.pauses.swap(sh.pauses);
      inbox.aborts.swap(sh.aborts);
      inbox.stopping = sh.stopping;
      sh.stats.num_waiting += static_cast<int32_t>(inbox.incoming.size());
    }
    const absl::Time now = absl::Now();
    ApplyInbox(inbox, now);
    if (inbox.stopping) break;
    ExpireDeadlines(now);
    bool ran = false;
    if (!pipeline_->empty()) {
      absl::StatusOr<bool> step = pipeline_->Run([this] { PublishStats(false); });
      if (!step.ok()) SPECD_LOG_ERROR("engine: step failed: {}", step.status().ToString());
      ran = step.ok() && *step;
    }
    // A tensor-parallel group that lost a rank cannot run another step: end everything now,
    // with the group's reason (the server then reports not ready and exits).
    if (const absl::Status group = runner_->GroupStatus(); !group.ok() && !pipeline_->empty()) {
      pipeline_->FinishAll(group);
      ran = false;
    }
    PublishStats(ran);
    if (!ran && !pipeline_->empty()) WaitWhileStalled();
  }
  pipeline_->FinishAll(absl::UnavailableError("the engine stopped"));
  serving_ = false;
  PublishStats(false);
}

}  // namespace specd
