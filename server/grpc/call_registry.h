// The running Generate calls of one gRPC service, by caller and request_id. Abort finds only
// the caller's own calls, and a request_id is unique per caller, not across callers, so one
// client can neither abort, probe nor block another's ids. Server-assigned ids are 128 random
// bits from OpenSSL's CSPRNG (NewRequestId), not a guessable sequence. Any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace specd {

// "grpc-" then 32 lowercase hex digits (server/random_id.h); Internal when OpenSSL's
// generator fails.
absl::StatusOr<std::string> NewRequestId();

// Call: the registered type (GenerateCall; tests use another). The registry holds weak
// references: a call that ended is never found, even before it is removed.
template <typename Call>
class CallRegistry {
 public:
  // False when `caller` already runs a call with this id.
  bool Add(const std::string& caller, const std::string& id, const std::shared_ptr<Call>& call) {
    std::lock_guard lock(mu_);
    auto [it, inserted] = calls_.try_emplace(Key(caller, id), call);
    if (inserted) return true;
    if (!it->second.expired()) return false;
    it->second = call;
    return true;
  }
  // Forgets the id unless a newer call of the same caller took it over.
  void Remove(const std::string& caller, const std::string& id, const Call* call) {
    std::lock_guard lock(mu_);
    auto it = calls_.find(Key(caller, id));
    if (it == calls_.end()) return;
    std::shared_ptr<Call> current = it->second.lock();
    if (current == nullptr || current.get() == call) calls_.erase(it);
  }
  // The caller's running call with this id, or null (also for another caller's id).
  std::shared_ptr<Call> Find(const std::string& caller, const std::string& id) {
    std::lock_guard lock(mu_);
    auto it = calls_.find(Key(caller, id));
    return it == calls_.end() ? nullptr : it->second.lock();
  }
  // Every running call.
  std::vector<std::shared_ptr<Call>> All() {
    std::vector<std::shared_ptr<Call>> out;
    std::lock_guard lock(mu_);
    out.reserve(calls_.size());
    for (const auto& [key, call] : calls_) {
      if (std::shared_ptr<Call> c = call.lock()) out.push_back(std::move(c));
    }
    return out;
  }

 private:
  using Key = std::pair<std::string, std::string>;  // (caller, request_id)

  // std::mutex rather than absl::Mutex: the distribution's abseil is not built with TSan, and
  // the TSan stage checks this registry from many threads (call_registry_test).
  std::mutex mu_;
  absl::flat_hash_map<Key, std::weak_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specd
