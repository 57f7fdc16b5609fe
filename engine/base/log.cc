#include "engine/base/log.h"

#include <string>

namespace specd {

bool SetLogLevel(std::string_view name) {
  auto level = spdlog::level::from_str(std::string(name));
  if (level == spdlog::level::off && name != "off") return false;
  spdlog::set_level(level);
  return true;
}

}  // namespace specd
