// A child process started with posix_spawn: the SSD verifier launches its speculator process
// this way (and starts it again after a crash). The child gets its own process group, so a
// signal meant for the server (Ctrl-C in a terminal) is not delivered to it twice, and
// PR_SET_PDEATHSIG is not needed: the owner kills it on destruction. One owner thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

class Subprocess {
 public:
  // Starts argv[0] (a path; not searched in PATH) with argv. Internal naming the program and
  // errno text when posix_spawn fails (a missing or non-executable file). The child gets this
  // process's environment with `env` ("NAME=value" entries) replacing variables of those names:
  // a way to hand it a secret that must not show in argv.
  static absl::StatusOr<Subprocess> Spawn(const std::vector<std::string>& argv,
                                          const std::vector<std::string>& env = {});

  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // SIGKILL and reap, if still running.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Whether the child still runs (reaps it when it exited; then exit_status() says how).
  bool Running();
  // The wait status of an exited child (WIFEXITED etc.), -1 while running or never started.
  int exit_status() const { return status_; }
  // Sends `signal` (SIGTERM, SIGSTOP, SIGCONT, ...) to the child; no-op after it exited.
  void Signal(int signal);
  // SIGKILL and wait for it to exit.
  void Kill();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  int status_ = -1;
};

// The absolute path of the running executable (/proc/self/exe).
absl::StatusOr<std::string> SelfExecutable();

}  // namespace specd
