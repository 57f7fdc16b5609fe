// Peer credentials of local connections (peer_cred.h): SO_PEERCRED for Unix sockets,
// /proc/net/tcp{,6} and /proc/PID/fd for TCP over loopback.
#include "engine/distributed/peer_cred.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specd {
namespace {

// One TCP endpoint as /proc/net/tcp{,6} prints it: the address as 32-bit words in memory
// order (1 word for IPv4, 4 for IPv6), and the port.
struct Endpoint {
  int family = AF_UNSPEC;
  std::array<uint32_t, 4> words{};
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
};

Endpoint FromSockaddr(const sockaddr_storage& ss) {
  Endpoint e;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    e.family = AF_INET;
    std::memcpy(&e.words[0], &in->sin_addr, 4);
    e.port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    e.family = AF_INET6;
    std::memcpy(e.words.data(), &in6->sin6_addr, 16);
    e.port = ntohs(in6->sin6_port);
  }
  return e;
}

// An IPv4-mapped IPv6 endpoint (::ffff:a.b.c.d) as the IPv4 endpoint it stands for.
Endpoint Unmapped(const Endpoint& e) {
  const uint32_t ffff = htonl(0xFFFF);
  if (e.family != AF_INET6 || e.words[0] != 0 || e.words[1] != 0 || e.words[2] != ffff) return e;
  return Endpoint{.family = AF_INET, .words = {e.words[3], 0, 0, 0}, .port = e.port};
}

bool IsLoopback(const Endpoint& raw) {
  const Endpoint e = Unmapped(raw);
  uint8_t first = 0;
  std::memcpy(&first, &e.words[0], 1);
  if (e.family == AF_INET) return first == 127;
  static const in6_addr kLoopback6 = IN6ADDR_LOOPBACK_INIT;
  return e.family == AF_INET6 && std::memcmp(e.words.data(), &kLoopback6, 16) == 0;
}

// Parses "HEX:PORT" of a /proc/net/tcp line into `e` (`words` hex words, each printed as the
// host-order value of the address's 32-bit word in memory).
bool ParseEndpoint(const std::string& text, int family, Endpoint* e) {
  const size_t words = family == AF_INET ? 1 : 4;
  if (text.size() != 8 * words + 5 || text[8 * words] != ':') return false;
  e->family = family;
  for (size_t i = 0; i < words; ++i) {
    uint32_t w = 0;
    if (!absl::SimpleHexAtoi(text.substr(8 * i, 8), &w)) return false;
    e->words[i] = w;
  }
  uint32_t port = 0;
  if (!absl::SimpleHexAtoi(text.substr(8 * words + 1), &port) || port > 0xFFFF) return false;
  e->port = static_cast<uint16_t>(port);
  return true;
}

// The socket in /proc/net/`file` whose local end is `local` and remote end `remote`: its
// owner's uid and inode. False when there is none.
bool FindTcpSocket(const char* file, const Endpoint& local, const Endpoint& remote, uid_t* uid,
                   ino_t* inode) {
  std::ifstream in(absl::StrCat("/proc/net/", file));
  std::string line;
  std::getline(in, line);  // column names
  while (std::getline(in, line)) {
    char local_text[64], remote_text[64];
    unsigned state = 0, line_uid = 0;
    unsigned long line_inode = 0;  // NOLINT(runtime/int): sscanf's %lu
    if (std::sscanf(line.c_str(), " %*u: %63s %63s %x %*s %*s %*s %u %*d %lu", local_text,
                    remote_text, &state, &line_uid, &line_inode) != 5) {
      continue;
    }
    Endpoint l, r;
    if (!ParseEndpoint(local_text, local.family, &l) ||
        !ParseEndpoint(remote_text, local.family, &r) || !(l == local) || !(r == remote)) {
      continue;
    }
    *uid = line_uid;
    *inode = line_inode;
    return true;
  }
  return false;
}

// Whether process `pid` has socket `inode` among its open files.
bool ProcessHoldsSocket(pid_t pid, ino_t inode) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  const std::string want = absl::StrCat("socket:[", inode, "]");
  bool found = false;
  while (const dirent* entry = ::readdir(d)) {
    char target[64];
    const ssize_t n = ::readlinkat(::dirfd(d), entry->d_name, target, sizeof(target));
    if (n > 0 && std::string(target, static_cast<size_t>(n)) == want) {
      found = true;
      break;
    }
  }
  ::closedir(d);
  return found;
}

absl::Status CheckUnixPeer(int fd, pid_t pid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::NotFoundError(absl::StrCat("SO_PEERCRED: ", std::strerror(errno)));
  }
  if (cred.uid != ::getuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer runs as uid ", cred.uid, ", not ours (", ::getuid(), ")"));
  }
  if (cred.pid != pid) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer is pid ", cred.pid, ", not the launched speculator (pid ", pid, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

bool PeerIsLocal(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return false;
  return peer.ss_family == AF_UNIX || IsLoopback(FromSockaddr(peer));
}

absl::Status CheckPeerProcess(int fd, pid_t pid) {
  sockaddr_storage peer{}, self{};
  socklen_t peer_len = sizeof(peer), self_len = sizeof(self);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) {
    return absl::NotFoundError(absl::StrCat("getpeername: ", std::strerror(errno)));
  }
  if (peer.ss_family == AF_UNIX) return CheckUnixPeer(fd, pid);
  Endpoint remote = FromSockaddr(peer);  // the peer's socket: local = remote, remote = us
  Endpoint local = FromSockaddr(self);
  if (!IsLoopback(remote)) {
    return absl::PermissionDeniedError(
        "peer is not on loopback, where the launched speculator connects from");
  }
  uid_t uid = 0;
  ino_t inode = 0;
  bool found =
      FindTcpSocket(remote.family == AF_INET ? "tcp" : "tcp6", remote, local, &uid, &inode);
  if (!found && Unmapped(remote).family != remote.family) {  // an IPv4 peer of a dual socket
    found = FindTcpSocket("tcp", Unmapped(remote), Unmapped(local), &uid, &inode);
  }
  if (!found || inode == 0) {
    return absl::NotFoundError("the peer's socket is not in /proc/net/tcp (it closed already?)");
  }
  if (uid != ::getuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer runs as uid ", uid, ", not ours (", ::getuid(), ")"));
  }
  if (!ProcessHoldsSocket(pid, inode)) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer's socket (inode ", inode,
                     ") is not held by the launched speculator (pid ", pid, ")"));
  }
  return absl::OkStatus();
}

}  // namespace specd
