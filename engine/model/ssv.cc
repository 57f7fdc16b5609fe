#include "engine/model/ssv.h"

#include "absl/strings/str_cat.h"
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
