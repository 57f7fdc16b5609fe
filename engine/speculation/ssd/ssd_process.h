// The `specd speculator` process's life (docs/architecture.md "SSD"): connect to the verifier,
// shake hands, receive its SsdInit, load the draft it names (or keep the one loaded for an equal
// init, after a reconnect), answer SsdReady and serve rounds (SsdWorker); with `reconnect`, join
// again after the verifier goes away. Only what is local to the process is an option here: where
// to join, the link's secret and TLS files, and for a speculator started by hand on another host
// its own device and thread count. Main thread only.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/tls.h"

namespace specd {

struct SsdProcessOptions {
  std::string connect;  // the verifier's HOST:PORT
  absl::Duration connect_timeout = absl::Seconds(60);
  bool reconnect = false;
  LinkSecret secret;  // what this end proves it holds (link_auth.h)
  TlsFiles tls;       // all three or none: TLS 1.3 with mutual certificates
  // Overrides of the verifier's choice for the draft: "" and -1 keep what its SsdInit says.
  std::string device;
  int32_t num_threads = -1;
};

// Joins and serves until the verifier shuts down (OK) or, without reconnect, the link breaks or
// the init fails (the verifier was told why in an SsdReady: its draft could not load, its
// vocabulary differs from the target's, the SsdInit was malformed).
absl::Status RunSsdSpeculator(const SsdProcessOptions& options);

}  // namespace specd
