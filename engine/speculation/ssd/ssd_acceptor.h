// The verifier's door for speculators: a background thread accepts connections on the SSD
// listener, admits only a peer that passes the current policy (the launched process on
// loopback, TLS when configured, proof of the link secret), sends it the SsdInit and waits for
// its SsdReady (ssd_init.h), and hands each ready channel to the engine thread, which takes it at
// its next round. A refused connection or a failed init changes nothing: it is counted, logged at
// warning and closed, while the current link and the launched speculator carry on. The handshake
// and the init run on this thread, so a slow or hostile peer, or a draft that takes a minute to
// load, never stalls the engine. Take/WaitFor: the engine thread; the rest: any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/distributed/messages.h"
#include "engine/distributed/tcp_channel.h"

namespace specd {

class SsdAcceptor {
 public:
  // Starts accepting on `listener` with `policy`; each admitted speculator gets `init` and
  // `init_timeout` to answer it.
  SsdAcceptor(std::unique_ptr<TcpListener> listener, const AcceptPolicy& policy, SsdInit init,
              absl::Duration init_timeout);
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

  // Connections refused so far (wrong process, TLS, secret, garbage, incompatible Hello, an
  // init the speculator failed).
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  void Loop();
  // The policy for a connection that just arrived (waits while a launch is half done).
  AcceptPolicy CurrentPolicy(uint64_t* generation) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a launch began since `generation` (a channel admitted before it is dropped).
  bool Superseded(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<TcpListener> listener_;
  const SsdInit init_;
  const absl::Duration init_timeout_;
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
