// Shared by the serving tests (engine_test, engine_pause_test): the codepair target, a
// collector of RequestOutputs, and engine and request builders.
// Test code only (needs SPECD_SHARED_DIR and GoogleTest).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd::serving_test {

inline const std::string kTarget = std::string(SPECD_SHARED_DIR) + "/models/codepair/target";

// Collects every RequestOutput per request id; any thread.
class Collector {
 public:
  struct Stream {
    std::vector<int32_t> ids;
    std::string text;
    int32_t num_updates = 0;
    int32_t num_finished = 0;
    FinishReason finish_reason = FinishReason::kLength;
    absl::Status status;
    RequestUsage usage;
  };

  OutputCallback Callback() {
    return [this](RequestOutput&& out) {
      std::lock_guard lock(mu_);
      Stream& s = streams_[out.id];
      for (const GeneratedToken& t : out.tokens) s.ids.push_back(t.id);
      s.text += out.text;
      ++s.num_updates;
      s.usage = out.usage;
      if (out.finished) {
        ++s.num_finished;
        s.finish_reason = out.finish_reason;
        s.status = out.status;
      }
      cv_.notify_all();
    };
  }

  // Waits until the request finished; false on timeout.
  bool WaitFinished(RequestId id, absl::Duration timeout = absl::Seconds(60)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this, id] {
      auto it = streams_.find(id);
      return it != streams_.end() && it->second.num_finished > 0;
    });
  }

  // Waits until the request produced at least n tokens.
  bool WaitTokens(RequestId id, size_t n, absl::Duration timeout = absl::Seconds(60)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this, id, n] {
      auto it = streams_.find(id);
      return it != streams_.end() && (it->second.ids.size() >= n || it->second.num_finished > 0);
    });
  }

  Stream Get(RequestId id) {
    std::lock_guard lock(mu_);
    return streams_[id];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<RequestId, Stream> streams_ ABSL_GUARDED_BY(mu_);
};

inline std::unique_ptr<Engine> MakeEngine(EngineOptions options) {
  options.model_dir = kTarget;
  if (options.num_threads == 0) options.num_threads = 1;  // CI has 2 cores; tiny model
  auto engine = Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

inline GenerateRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  return r;
}

// Greedy with EOS masked until max_tokens (min_tokens = max_tokens), as HF goldens generated
// with min_new_tokens: exactly max_tokens ids.
inline GenerateRequest GreedyEosMasked(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerateRequest r = Greedy(std::move(prompt), max_tokens);
  r.params.min_tokens = max_tokens;
  return r;
}

inline std::vector<int32_t> Encode(const Engine& engine, const std::string& text) {
  auto ids = engine.tokenizer()->Encode(text, /*add_special=*/true);
  EXPECT_TRUE(ids.ok());
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// A serving engine whose requests run long enough to be caught in each state.
inline std::unique_ptr<Engine> MakeSlowEngine(int32_t max_num_seqs, int32_t budget,
                                              std::shared_ptr<EngineObserver> observer = nullptr,
                                              int32_t max_waiting = 1024) {
  EngineOptions options;
  options.max_model_len = 2048;
  options.max_num_seqs = max_num_seqs;
  options.max_num_batched_tokens = budget;
  options.max_waiting = max_waiting;
  options.observer = std::move(observer);
  auto engine = MakeEngine(options);
  if (engine != nullptr) {
    EXPECT_TRUE(engine->Start().ok());
  }
  return engine;
}

// Counts the sequences the engine preempted; any thread.
class PreemptionCounter : public EngineObserver {
 public:
  void OnPreemption(int32_t n) override { preempted_ += n; }
  int64_t preempted() const { return preempted_.load(); }

 private:
  std::atomic<int64_t> preempted_{0};
};

inline GenerateRequest Endless(std::vector<int32_t> prompt) {
  GenerateRequest r = Greedy(std::move(prompt), 1500);
  r.params.ignore_eos = true;
  return r;
}

}  // namespace specd::serving_test
