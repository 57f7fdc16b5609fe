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

  // `-short` (and `-short=value`) as another spelling of `--name` (vLLM's `-tp`).
  void Alias(const std::string& short_name, const std::string& name);

  // args excludes the program and subcommand names.
  absl::Status Parse(const std::vector<std::string>& args);
  std::string Usage() const;

 private:
  using Target = std::variant<std::string*, std::optional<std::string>*, int32_t*, int64_t*,
                              std::optional<int64_t>*, float*, double*, bool*>;
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

// The tensor-parallel flags shared by serve, generate and worker (vLLM's names):
// --tensor-parallel-size / -tp, --nnodes, --node-rank, --master-addr, --master-port,
// --tp-secret-file, --tp-timeout, --tp-communicator. Null pointers skip a flag.
void AddTensorParallelFlags(FlagParser& p, int32_t* size, int32_t* nnodes, int32_t* node_rank,
                            std::string* master_addr, int32_t* master_port,
                            std::string* secret_file, double* timeout_s, std::string* communicator);
// InvalidArgument naming the flag for values out of range.
absl::Status CheckTensorParallelFlags(int32_t size, int32_t nnodes, int32_t node_rank,
                                      int32_t master_port, double timeout_s,
                                      const std::string& communicator);

}  // namespace specd
