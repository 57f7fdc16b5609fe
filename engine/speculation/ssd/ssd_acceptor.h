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
#include "engine/distributed/nccl_channel.h"
#include "engine/distributed/tcp_channel.h"

namespace specd {

// A speculator ready for rounds: its control channel and, when the init agreed on the device data
// path, the NCCL link beside it.
struct SsdLink {
  std::unique_ptr<TcpChannel> channel;
  std::unique_ptr<NcclChannel> bulk;
  explicit operator bool() const { return channel != nullptr; }
};

class SsdAcceptor {
 public:
  // Starts accepting on `listener` with `policy`; each admitted speculator gets `init` and
  // `init_timeout` to answer it. When init.bulk_link offers the device data path and the
  // speculator takes it, both join its NCCL link, this end on GPU `bulk_device`; a link that
  // fails to come up refuses that speculator, and later ones are not offered it (their q rows
  // go inline over TCP).
  SsdAcceptor(std::unique_ptr<TcpListener> listener, const AcceptPolicy& policy, SsdInit init,
              absl::Duration init_timeout, int32_t bulk_device = -1);
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

  // The link admitted since the last call, or an empty one. Never blocks.
  SsdLink Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for an admitted link (startup); an empty one when none came.
  SsdLink WaitFor(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

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
  const int32_t bulk_device_;
  bool offer_bulk_;  // the accept thread's: cleared after a device data path failed
  absl::Mutex mu_;
  AcceptPolicy policy_ ABSL_GUARDED_BY(mu_);
  bool launching_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by BeginLaunch
  SsdLink ready_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> refused_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace specd
