#include "engine/base/ssv.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/base/field_status.h"

namespace specd {

std::string_view SsvModeName(SsvMode mode) { return mode == SsvMode::kShared ? "shared" : "exact"; }

bool ParseSsvMode(std::string_view name, SsvMode* mode) {
  if (name == "exact") {
    *mode = SsvMode::kExact;
  } else if (name == "shared") {
    *mode = SsvMode::kShared;
  } else {
    return false;
  }
  return true;
}

std::string SsvStrategyName(const SsvStrategy& s) {
  return absl::StrCat(std::string(SsvModeName(s.mode)), "/c", s.group_size, "/r", s.refresh_every);
}

bool ParseSsvStrategy(std::string_view name, SsvStrategy* out) {
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(name.data(), name.size()), '/');
  SsvStrategy s;
  if (parts.size() != 3 || parts[1].size() < 2 || parts[1][0] != 'c' || parts[2].size() < 2 ||
      parts[2][0] != 'r' ||
      !ParseSsvMode(std::string_view(parts[0].data(), parts[0].size()), &s.mode) ||
      !absl::SimpleAtoi(parts[1].substr(1), &s.group_size) ||
      !absl::SimpleAtoi(parts[2].substr(1), &s.refresh_every) || !ValidateSsvStrategy(s, "").ok()) {
    return false;
  }
  *out = s;
  return true;
}

absl::Status ValidateSsvStrategy(const SsvStrategy& s, std::string_view prefix_view) {
  const std::string prefix(prefix_view);
  if (s.group_size < 1 || s.group_size > kMaxSsvGroupSize) {
    return FieldError(absl::StrCat(prefix, "group_size"),
                      absl::StrCat(prefix, "group_size must be in [1, ", kMaxSsvGroupSize,
                                   "], got ", s.group_size));
  }
  if (s.refresh_every < 1) {
    return FieldError(
        absl::StrCat(prefix, "refresh_every"),
        absl::StrCat(prefix, "refresh_every must be at least 1 (1: every layer), got ",
                     s.refresh_every));
  }
  return absl::OkStatus();
}

SsvLoadStats& SsvLoadStats::operator+=(const SsvLoadStats& o) {
  queries += o.queries;
  per_query_keys += o.per_query_keys;
  grouped_keys += o.grouped_keys;
  per_query_blocks += o.per_query_blocks;
  grouped_blocks += o.grouped_blocks;
  overlap_sum += o.overlap_sum;
  overlap_pairs += o.overlap_pairs;
  return *this;
}

SsvLoadStats SsvLoadStats::operator-(const SsvLoadStats& o) const {
  SsvLoadStats d = *this;
  d.queries -= o.queries;
  d.per_query_keys -= o.per_query_keys;
  d.grouped_keys -= o.grouped_keys;
  d.per_query_blocks -= o.per_query_blocks;
  d.grouped_blocks -= o.grouped_blocks;
  d.overlap_sum -= o.overlap_sum;
  d.overlap_pairs -= o.overlap_pairs;
  return d;
}

}  // namespace specd
