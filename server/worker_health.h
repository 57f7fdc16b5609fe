// The health endpoint of a `specd worker` process (deploy/k8s/multinode: the worker pods' probes):
// a plain HTTP/1.1 responder on its own thread answering GET /health (200 while the process
// runs) and GET /ready (200 once the worker's ranks joined the group, 503 before); anything else
// is 404. Workers take no client traffic, so nothing else is served. Start from any thread;
// SetReady from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"

namespace specd {

class WorkerHealth {
 public:
  // Listens on 0.0.0.0:port (0: a free port).
  static absl::StatusOr<std::unique_ptr<WorkerHealth>> Start(int32_t port);
  ~WorkerHealth();  // stops the thread and closes the socket

  int32_t port() const { return port_; }
  void SetReady(bool ready) { ready_.store(ready, std::memory_order_release); }

 private:
  WorkerHealth(int fd, int32_t port);
  void Serve();

  const int fd_;
  const int32_t port_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace specd
