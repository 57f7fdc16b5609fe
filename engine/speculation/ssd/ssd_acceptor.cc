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
// How long joining the device data path's NCCL link may take (its first init loads NCCL).
constexpr absl::Duration kBulkLinkWait = absl::Seconds(60);

}  // namespace

SsdAcceptor::SsdAcceptor(std::unique_ptr<TcpListener> listener, const AcceptPolicy& policy,
                         SsdInit init, absl::Duration init_timeout, int32_t bulk_device)
    : listener_(std::move(listener)),
      init_(std::move(init)),
      init_timeout_(init_timeout),
      bulk_device_(bulk_device),
      offer_bulk_(init_.bulk_link && bulk_device >= 0),
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
  ready_ = SsdLink();
}

void SsdAcceptor::EndLaunch(int32_t pid) {
  absl::MutexLock lock(&mu_);
  policy_.expected_pid = pid > 0 ? pid : INT32_MAX;  // a failed launch: nobody (no such pid)
  launching_ = false;
}

SsdLink SsdAcceptor::Take() {
  absl::MutexLock lock(&mu_);
  return std::exchange(ready_, SsdLink());
}

SsdLink SsdAcceptor::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](SsdLink* ready) { return static_cast<bool>(*ready); }, &ready_),
                       timeout);
  return std::exchange(ready_, SsdLink());
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
    SsdInit init = init_;
    init.bulk_link = offer_bulk_;
    SsdReady answer;
    const absl::Status ready = OfferSsdInit(
        **channel, init, init_timeout_, [&] { return stop_.load() || Superseded(generation); },
        &answer);
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
    SsdLink link{*std::move(channel), nullptr};
    if (init.bulk_link && answer.bulk_link) {
      absl::StatusOr<std::unique_ptr<NcclChannel>> bulk =
          NcclChannel::Create(*link.channel, Role::kVerifier, bulk_device_, kBulkLinkWait);
      if (stop_.load()) return;
      if (!bulk.ok()) {  // the speculator fails its half too, and joins again without it
        SPECD_LOG_WARN(
            "ssd: no device data path to the speculator ({}); q rows go over TCP from now on",
            bulk.status().ToString());
        offer_bulk_ = false;
        refused_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      link.bulk = *std::move(bulk);
      SPECD_LOG_INFO("ssd: q rows go GPU to GPU (NCCL, cuda:{})", bulk_device_);
    }
    absl::MutexLock lock(&mu_);
    if (generation != generation_) {  // admitted under the policy of an earlier launch
      SPECD_LOG_WARN("ssd: dropping a speculator admitted before the latest launch");
      continue;
    }
    ready_ = std::move(link);
  }
}

}  // namespace specd
