// Helpers shared by the libFuzzer targets of tests/fuzz: a scratch file for APIs that read a
// path (memfd-backed, so no disk I/O per input), a UTF-8 validity check for the outputs the
// APIs promise are valid, and FUZZ_CHECK, which aborts (a crash libFuzzer reports) when a
// documented property fails. Each fuzz target is one process and one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace specd::fuzz {

// Aborts with the failed condition and `what` (an input-dependent detail) on stderr.
#define FUZZ_CHECK(cond, what)                                                                  \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n  %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                                  \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

// A file whose contents are replaced by each Write; path() names it for open()/mmap().
class ScratchFile {
 public:
  ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile();

  void Write(const uint8_t* data, size_t size);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A fresh temporary directory, removed with its files on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();

  // Replaces dir/name with `contents`.
  void WriteFile(const std::string& name, std::string_view contents) {
    WriteFileAt(path_ + "/" + name, contents);
  }
  // Replaces the file at `path` with `contents` (aborts on failure).
  static void WriteFileAt(const std::string& path, std::string_view contents);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
// Written apart from engine/tokenizer/utf8.h on purpose: the oracle must not share the code
// it checks.
bool IsValidUtf8(std::string_view text);

// Reads a whole file; aborts when it cannot (fixed assets of the targets).
std::string ReadFileOrDie(const std::string& path);

// Silences spdlog: loaders warn about odd inputs, which would flood the fuzzer's output.
void QuietLogs();

}  // namespace specd::fuzz
