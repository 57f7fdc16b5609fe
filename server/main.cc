// specd: command-line entry point. Subcommands: serve, generate, tokenize, speculator, worker. Main
// thread only.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/base/log.h"
#include "server/commands.h"
#include "server/serve.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace {

constexpr char kUsage[] =
    "usage: specd <command> [flags]\n"
    "commands:\n"
    "  serve      run the OpenAI-compatible HTTP (and gRPC) server (see specd serve --help)\n"
    "  generate   generate text from a prompt (see specd generate --help)\n"
    "  tokenize   JSON lines {\"text\": ...} on stdin -> {\"ids\": [...]} on stdout\n"
    "  speculator the SSD speculator process (see specd speculator --help)\n"
    "  worker     a worker rank of a tensor-parallel group (see specd worker --help)\n";

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("specd"));
  spdlog::set_level(spdlog::level::warn);
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  absl::Status status;
  if (command == "serve") {
    status = specd::RunServe(args);
  } else if (command == "generate") {
    status = specd::RunGenerate(args);
  } else if (command == "tokenize") {
    status = specd::RunTokenize(args);
  } else if (command == "speculator") {
    status = specd::RunSpeculator(args);
  } else if (command == "worker") {
    status = specd::RunWorker(args);
  } else if (command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  } else {
    std::fprintf(stderr, "specd: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "specd %s: error: %s\n", command.c_str(),
                 std::string(status.message()).c_str());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
