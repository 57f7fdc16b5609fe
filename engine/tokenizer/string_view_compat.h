// Abseil as packaged here is built with its own absl::string_view (not an alias of
// std::string_view); this converts at the boundary. Pure; any thread.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace specd::tok {

inline absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace specd::tok
