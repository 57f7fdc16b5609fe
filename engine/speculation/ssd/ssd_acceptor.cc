// The SSD listener's accept thread (ssd_acceptor.h).
#include "engine/speculation/ssd/ssd_acceptor.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "engine/base/log.h"
#include "engine/speculation/ssd/ssd_init.h"

namespace specd {
namespace {

// How long a connection arriving mid-launch waits for the launched pid.
constexpr absl::Duration kLaunchWait = absl::Seconds(10);

}  // namespace

SsdAcceptor::SsdAcceptor(std::unique_ptr<TcpListener> listener, const AcceptPolicy& policy,
                         SsdInit init, absl::Duration init_timeout)
    : listener_(std::move(listener)),
      init_(std::move(init)),
      init_timeout_(init_timeout),
      policy_(policy) {
  thread_ = std::thread([this] { Loop(); });
}

SsdAcceptor::~SsdAcceptor() {
  stop_.store(true);
  listener_->Close();
  thread_.join();
}

void SsdAcceptor::BeginLaunch(const LinkSecret& secret) {
  absl::MutexLock lock(&mu_);
  policy_.secret = secret;
  policy_.expected_pid = 0;
  launching_ = true;
  ++generation_;
  ready_.reset();
}

void SsdAcceptor::EndLaunch(int32_t pid) {
  absl::MutexLock lock(&mu_);
  policy_.expected_pid = pid > 0 ? pid : INT32_MAX;  // a failed launch: nobody (no such pid)
  launching_ = false;
}

std::unique_ptr<TcpChannel> SsdAcceptor::Take() {
  absl::MutexLock lock(&mu_);
  return std::move(ready_);
}

std::unique_ptr<TcpChannel> SsdAcceptor::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(
      absl::Condition(
          +[](std::unique_ptr<TcpChannel>* ready) { return *ready != nullptr; }, &ready_),
      timeout);
  return std::move(ready_);
}

AcceptPolicy SsdAcceptor::CurrentPolicy(uint64_t* generation) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](bool* launching) { return !*launching; }, &launching_),
                       kLaunchWait);
  *generation = generation_;
  return policy_;
}

bool SsdAcceptor::Superseded(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  return generation != generation_;
}

void SsdAcceptor::Loop() {
  while (!stop_.load()) {
    uint64_t generation = 0;
    absl::StatusOr<std::unique_ptr<TcpChannel>> channel =
        listener_->Accept(absl::Milliseconds(500), [&] { return CurrentPolicy(&generation); });
    if (stop_.load()) return;
    if (!channel.ok()) {
      const absl::string_view why = channel.status().message();
      if (why == "listener closed") return;
      if (why == "accept: timed out") continue;  // nobody came
      if (absl::StartsWith(why, "accept: ")) {   // out of descriptors or similar: not a peer
        SPECD_LOG_WARN("ssd: {}", channel.status().ToString());
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      // A peer was refused (TcpListener logged who and why at warning); the current link and
      // the launched speculator are left alone.
      refused_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const absl::Status ready = OfferSsdInit(**channel, init_, init_timeout_,
                                            [&] { return stop_.load() || Superseded(generation); });
    if (stop_.load()) return;
    if (absl::IsCancelled(ready)) {
      SPECD_LOG_WARN("ssd: dropping a speculator admitted before the latest launch");
      continue;
    }
    if (!ready.ok()) {  // it is closed with the channel; the current link is left alone
      SPECD_LOG_WARN("ssd: the speculator from {} did not start: {}", (*channel)->peer_address(),
                     ready.ToString());
      refused_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (generation != generation_) {  // admitted under the policy of an earlier launch
      SPECD_LOG_WARN("ssd: dropping a speculator admitted before the latest launch");
      continue;
    }
    ready_ = *std::move(channel);
  }
}

}  // namespace specd
