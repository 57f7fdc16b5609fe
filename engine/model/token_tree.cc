#include "engine/model/token_tree.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specd {

absl::Status ValidateTreeParents(std::span<const int32_t> parents) {
  for (size_t i = 0; i < parents.size(); ++i) {
    if (parents[i] < -1 || parents[i] >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("tree node ", i, " has parent ", parents[i],
                                                     ": -1 or an earlier node needed"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateChunkTree(const TokenTree& tree, int32_t start_pos, size_t num_tokens) {
  if (tree.start < 0 || tree.start > start_pos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree start ", tree.start, " outside [0, start_pos ", start_pos, "]"));
  }
  const int64_t nodes = int64_t{start_pos} - tree.start + static_cast<int64_t>(num_tokens);
  if (static_cast<int64_t>(tree.parents.size()) != nodes) {
    return absl::InvalidArgumentError(absl::StrCat("tree has ", tree.parents.size(),
                                                   " parents for slots ", tree.start, "..",
                                                   tree.start + nodes - 1));
  }
  return ValidateTreeParents(tree.parents);
}

void TreeDepths(std::span<const int32_t> parents, std::vector<int32_t>* depths) {
  depths->resize(parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    (*depths)[i] = parents[i] < 0 ? 0 : (*depths)[parents[i]] + 1;
  }
}

void AppendTreePath(std::span<const int32_t> parents, int32_t node, std::vector<int32_t>* out) {
  const size_t first = out->size();
  for (int32_t n = node; n >= 0; n = parents[n]) out->push_back(n);
  std::reverse(out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
}

void SetTreeMaskBits(std::span<const int32_t> parents, int32_t node, std::span<uint64_t> mask) {
  for (int32_t n = node; n >= 0; n = parents[n]) mask[n / 64] |= uint64_t{1} << (n % 64);
}

}  // namespace specd
