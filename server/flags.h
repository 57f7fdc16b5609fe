// A small command-line flag parser for specd's subcommands: `--name value`, `--name=value`
// and bare `--flag` for booleans; unknown flags and bad values are errors naming the flag.
// Main thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace specd {

class FlagParser {
 public:
  void Add(const std::string& name, std::string* out, std::string help);
  void Add(const std::string& name, std::optional<std::string>* out, std::string help);
  void Add(const std::string& name, int32_t* out, std::string help);
  void Add(const std::string& name, std::optional<int64_t>* out, std::string help);
  void Add(const std::string& name, int64_t* out, std::string help);
  void Add(const std::string& name, float* out, std::string help);
  void Add(const std::string& name, double* out, std::string help);
  void Add(const std::string& name, bool* out, std::string help);
  // A number of seconds (`--tp-timeout 2.5`; "inf" waits forever), stored as a Duration.
  void Add(const std::string& name, absl::Duration* out, std::string help);
  // A boolean flag stored negated: `--disable-prefix-caching` (bare: true) into a field that
  // says enable (false). Add(name, Negated{&field}, help).
  struct Negated {
    bool* out;
  };
  void Add(const std::string& name, Negated out, std::string help);

  // `-short` (and `-short=value`) as another spelling of `--name` (vLLM's `-tp`).
  void Alias(const std::string& short_name, const std::string& name);

  // args excludes the program and subcommand names.
  absl::Status Parse(const std::vector<std::string>& args);
  std::string Usage() const;

 private:
  using Target =
      std::variant<std::string*, std::optional<std::string>*, int32_t*, int64_t*,
                   std::optional<int64_t>*, float*, double*, bool*, absl::Duration*, Negated>;
  struct Flag {
    Target target;
    std::string help;
  };
  absl::Status Set(const std::string& name, Flag& flag, const std::string& value);
  std::map<std::string, std::string> aliases_;  // short name -> flag name

  std::map<std::string, Flag> flags_;
};

// Parses "1,2,3" into ids; InvalidArgument on anything else.
absl::Status ParseIdList(const std::string& text, std::vector<int32_t>* out);

}  // namespace specd
