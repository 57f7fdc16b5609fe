// Who is at the other end of a connection to the SSD listener, for the one case where the
// kernel can tell: a speculator the verifier launched itself, which connects over loopback.
// SO_PEERCRED answers only for Unix sockets (on TCP it reports pid 0 and uid -1), so for TCP the
// peer's socket is looked up by its address in /proc/net/tcp{,6} (its owner's uid and inode),
// and the process is asked whether it holds that socket (/proc/PID/fd). A same-user process can
// still impersonate the child by other means (ptrace); this check keeps other users and other
// processes out before any handshake runs, and the link secret does the rest. Any thread.
#pragma once

#include <sys/types.h>

#include "absl/status/status.h"

namespace specd {

// Whether the connected socket's peer address is loopback (127.0.0.0/8, ::1, ::ffff:127.x), or
// the socket is a Unix socket.
bool PeerIsLocal(int fd);

// OK when the peer of connected socket `fd` is process `pid`, running as this process's uid.
// PermissionDenied naming what differs (a non-loopback peer, another uid, another process);
// NotFound when the peer's socket cannot be found (it closed already).
absl::Status CheckPeerProcess(int fd, pid_t pid);

}  // namespace specd
