// The offline CLI subcommands (`specd generate`, `specd tokenize`). Their output formats
// are stable contracts used by outside checks; see README.md. Main thread only.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace specd {

absl::Status RunGenerate(const std::vector<std::string>& args);
absl::Status RunTokenize(const std::vector<std::string>& args);

}  // namespace specd
