// The verifier's door for speculators: a background thread accepts connections on the SSD
// listener, admits only a peer that passes the current policy (the launched process on
// loopback, TLS when configured, proof of the link secret), and hands each admitted channel to
// the engine thread, which takes it at its next round. A refused connection changes nothing: it
// is counted, logged at warning and closed, while the current link and the launched speculator
// carry on. The handshake runs on this thread, so a slow or hostile peer never stalls the
// engine. Take/WaitFor: the engine thread; the rest: any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/distributed/tcp_channel.h"

namespace specd {

class SsdAcceptor {
 public:
  // Starts accepting on `listener` with `policy`.
  SsdAcceptor(std::unique_ptr<TcpListener> listener, const AcceptPolicy& policy);
  // Closes the listener and joins the thread.
  ~SsdAcceptor();
  SsdAcceptor(const SsdAcceptor&) = delete;
  SsdAcceptor& operator=(const SsdAcceptor&) = delete;

  uint16_t port() const { return listener_->port(); }

  // A launch is starting: connections wait (up to 10 s) for EndLaunch before they are judged,
  // and from then on only `secret` is accepted. A channel admitted earlier but not taken yet is
  // dropped.
  void BeginLaunch(const LinkSecret& secret) ABSL_LOCKS_EXCLUDED(mu_);
  // The launched process is `pid` (0: the launch failed): only it may join.
  void EndLaunch(int32_t pid) ABSL_LOCKS_EXCLUDED(mu_);

  // The channel admitted since the last call, or null. Never blocks.
  std::unique_ptr<TcpChannel> Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for an admitted channel (startup); null when none came.
  std::unique_ptr<TcpChannel> WaitFor(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Connections refused so far (wrong process, TLS, secret, garbage, incompatible Hello).
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  void Loop();
  // The policy for a connection that just arrived (waits while a launch is half done).
  AcceptPolicy CurrentPolicy(uint64_t* generation) ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<TcpListener> listener_;
  absl::Mutex mu_;
  AcceptPolicy policy_ ABSL_GUARDED_BY(mu_);
  bool launching_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by BeginLaunch
  std::unique_ptr<TcpChannel> ready_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> refused_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace specd
