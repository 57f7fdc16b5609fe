// The CLI subcommands besides serve (`specd generate`, `specd tokenize`, `specd speculator`). Their
// output formats are stable contracts used by outside checks; see README.md. Main thread only.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specd {

absl::Status RunGenerate(const std::vector<std::string>& args);
absl::Status RunTokenize(const std::vector<std::string>& args);
// `specd speculator`: the SSD speculator process (normally launched by `specd serve` with
// --speculative-config '{"method": "ssd", ...}'; run it by hand on another host with
// "launch_speculator": false).
absl::Status RunSpeculator(const std::vector<std::string>& args);
// `specd worker`: a worker rank of a tensor-parallel group (engine.h RunWorkerProcess).
absl::Status RunWorker(const std::vector<std::string>& args);

}  // namespace specd
