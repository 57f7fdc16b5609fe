// `specd serve`: the daemon. Loads the model, serves the OpenAI HTTP API (and gRPC when
// built with it), and on SIGTERM/SIGINT drains: readiness fails, new requests get 503,
// in-flight requests finish within --drain-timeout, then both front ends and the engine
// stop and the process exits 0. Main thread only.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specd {

// args excludes "specd serve". Returns after a signal-initiated shutdown (OK) or on a
// startup error (InvalidArgument: bad flags or config, exit 2).
absl::Status RunServe(const std::vector<std::string>& args);

}  // namespace specd
