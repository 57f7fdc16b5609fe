#include "engine/base/subprocess.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace specd {

namespace {

// environ with the variables named in `env` replaced by its entries; points into both.
std::vector<char*> ChildEnvironment(const std::vector<std::string>& env) {
  std::vector<char*> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    bool replaced = false;
    for (const std::string& o : env) {
      const size_t eq = o.find('=');
      if (eq == std::string::npos) continue;
      replaced |=
          entry.size() > eq && entry.substr(0, eq + 1) == std::string_view(o).substr(0, eq + 1);
    }
    if (!replaced) out.push_back(*e);
  }
  for (const std::string& o : env) out.push_back(const_cast<char*>(o.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

absl::StatusOr<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                             const std::vector<std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("Subprocess::Spawn: empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> child_env = ChildEnvironment(env);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], nullptr, &attr, args.data(), child_env.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  return Subprocess(pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), status_(other.status_) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = std::exchange(other.pid_, -1);
    status_ = other.status_;
  }
  return *this;
}

Subprocess::~Subprocess() { Kill(); }

bool Subprocess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) status_ = status;
  pid_ = -1;  // exited (or not our child any more)
  return false;
}

void Subprocess::Signal(int signal) {
  if (Running()) kill(pid_, signal);
}

void Subprocess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  kill(pid_, SIGCONT);  // a stopped child must run to die
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = status;
  pid_ = -1;
}

absl::StatusOr<std::string> SelfExecutable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) {
    return absl::InternalError(absl::StrCat("readlink /proc/self/exe: ", std::strerror(errno)));
  }
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace specd
