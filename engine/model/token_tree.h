// Token trees (tree drafting and tree verification; docs/architecture.md, "Token trees"). A
// round's drafts may form a tree instead of a chain: several candidates per position, each
// continuing its own path. The target verifies the whole tree in one pass: every node sits in
// its own KV slot, at the position of its depth, and attends the committed prefix and its own
// ancestors only (the tree mask), so each node's logits are those its path alone would give.
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace specd {

// A tree in a sequence's KV slots: slots [start, start + parents.size()) hold its nodes in
// topological order; parents[i] is node i's parent (< i), or -1 for a root, whose parent is the
// committed prefix [0, start). Node i sits at position start + depth(i) (a root has depth 0) and
// attends the prefix, its ancestors and itself. A chain is parents {-1, 0, 1, ...}: position ==
// slot, the causal mask. Caller-owned spans.
struct TokenTree {
  int32_t start = 0;
  std::span<const int32_t> parents;
};

// InvalidArgument (naming the node) unless every parents[i] is -1 or in [0, i).
absl::Status ValidateTreeParents(std::span<const int32_t> parents);

// InvalidArgument (saying what is wrong) unless `tree` fits a chunk of num_tokens tokens from
// slot start_pos: tree.start in [0, start_pos], one parent per slot of [tree.start, start_pos +
// num_tokens), and valid parents.
absl::Status ValidateChunkTree(const TokenTree& tree, int32_t start_pos, size_t num_tokens);

// depths[i] = depth of node i (roots 0); parents must be valid.
void TreeDepths(std::span<const int32_t> parents, std::vector<int32_t>* depths);

// Node `node`'s ancestors and itself, root first (indices into parents), appended to *out.
void AppendTreePath(std::span<const int32_t> parents, int32_t node, std::vector<int32_t>* out);

// Node `node`'s row of a tree attention mask (kernels::AttentionTreeMask): bit a % 64 of
// mask[a / 64] set for each of its ancestors and itself. `mask` holds at least
// (parents.size() + 63) / 64 words; bits already set stay.
void SetTreeMaskBits(std::span<const int32_t> parents, int32_t node, std::span<uint64_t> mask);

}  // namespace specd
