// Logging: spdlog behind a tiny facade so the format of every line is set in one place.
// Lifecycle at info, per-step at debug, never per token at info. Any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace specd {

// Sets the global level from a name ("trace", "debug", "info", "warn", "error", "off").
// Unknown names leave the level unchanged and return false.
bool SetLogLevel(std::string_view name);

}  // namespace specd

#define SPECD_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define SPECD_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define SPECD_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define SPECD_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
