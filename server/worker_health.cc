#include "server/worker_health.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<std::unique_ptr<WorkerHealth>> WorkerHealth::Start(int32_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("health socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("--health-port ", port, ": ", why));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<WorkerHealth> health(new WorkerHealth(fd, ntohs(addr.sin_port)));
  health->thread_ = std::thread([h = health.get()] { h->Serve(); });
  return health;
}

WorkerHealth::WorkerHealth(int fd, int32_t port) : fd_(fd), port_(port) {}

WorkerHealth::~WorkerHealth() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void WorkerHealth::Serve() {
  while (!stopping_) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    // One short request line is all a probe sends first; wait briefly for it.
    char buf[512] = {};
    pollfd c = {client, POLLIN, 0};
    ssize_t n = poll(&c, 1, 1000) > 0 ? recv(client, buf, sizeof(buf) - 1, 0) : 0;
    const std::string request(buf, n > 0 ? static_cast<size_t>(n) : 0);
    int code = 404;
    std::string body = "{\"error\":\"not found\"}";
    if (request.rfind("GET /health", 0) == 0) {
      code = 200;
      body = "{\"status\":\"ok\"}";
    } else if (request.rfind("GET /ready", 0) == 0) {
      const bool ready = ready_.load(std::memory_order_acquire);
      code = ready ? 200 : 503;
      body = ready ? "{\"status\":\"ready\"}" : "{\"status\":\"joining\"}";
    }
    const std::string reply =
        absl::StrCat("HTTP/1.1 ", code,
                     code == 200 ? " OK" : (code == 503 ? " Service Unavailable" : " Not Found"),
                     "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                     "\r\nConnection: close\r\n\r\n", body);
    (void)send(client, reply.data(), reply.size(), MSG_NOSIGNAL);
    close(client);
  }
}

}  // namespace specd
