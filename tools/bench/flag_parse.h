// Command-line helpers the bench tools (spec_bench, vegas_bench) share: the walk over argv
// that stops at the first flag refused, and comma-separated number lists checked against the
// range each flag allows. Each tool keeps its own flags and their checks. Main thread only.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace specd {

// "a,b,c" into `out`, each in [lo, hi]; false on an empty list or a bad value.
inline bool ParseIntList(const std::string& text, int lo, int hi, std::vector<int>* out) {
  out->clear();
  for (absl::string_view s : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < lo || v > hi) return false;
    out->push_back(v);
  }
  return !out->empty();
}

// "a,b,c" into `out`, each a fraction in (0, 1]; false on an empty list or a bad value.
inline bool ParseFractionList(const std::string& text, std::vector<double>* out) {
  out->clear();
  for (absl::string_view s : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(s, &v) || !(v > 0 && v <= 1)) return false;
    out->push_back(v);
  }
  return !out->empty();
}

// Calls `parse_one(flag, value)` for each flag of argv[1..]; `value()` consumes and returns
// the argument after the flag ("" past the end). `parse_one` returns false for an unknown
// flag or a bad value: then "<tool>: bad flag or value: <flag>" goes to stderr and the walk
// ends with false.
template <typename ParseOne>
bool ParseEachFlag(int argc, char** argv, const char* tool, ParseOne parse_one) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (!parse_one(flag, value)) {
      std::fprintf(stderr, "%s: bad flag or value: %s\n", tool, flag.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace specd
