// CudaRunner's token trees (engine/model/token_tree.h): the attention's tree masks of eager
// steps, the KV moves that compact an accepted path, and the tree walks of verification on the
// device. See cuda_runner_state.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/model/token_tree.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/cuda/cuda_runner_state.h"

namespace specd {

bool CudaRunner::State::TreesSupported() const {
  // Tensor-parallel workers would need the trees in their step messages; a sliding window has
  // no meaning over depth positions; NSA attends by blocks.
  return shard.world_size == 1 && config.sliding_window == 0 && !config.is_nsa();
}

bool CudaRunner::State::HasTree(std::span<const SequenceInput> batch) {
  return std::any_of(batch.begin(), batch.end(),
                     [](const SequenceInput& in) { return in.tree != nullptr; });
}

absl::Status CudaRunner::State::ValidateTree(size_t s, const SequenceInput& in) const {
  auto bad = [s](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", what));
  };
  if (!TreesSupported()) {
    return bad(
        absl::StrCat("token trees need world size 1 and a model without a sliding window "
                     "or NSA attention (",
                     name, ")"));
  }
  if (in.attention != nullptr || in.ssv != nullptr) {
    return bad("a token tree takes no attention options or SSV strategy");
  }
  if (const absl::Status st = ValidateChunkTree(*in.tree, in.start_pos, in.tokens.size());
      !st.ok()) {
    return bad(std::string(st.message()));
  }
  if (in.tree->parents.size() > static_cast<size_t>(64 * kernels::kMaxTreeMaskWords)) {
    return bad(absl::StrCat("a tree of ", in.tree->parents.size(), " slots; the GPU masks hold ",
                            64 * kernels::kMaxTreeMaskWords));
  }
  return absl::OkStatus();
}

bool CudaRunner::SupportsTokenTrees() const { return s_->TreesSupported(); }

absl::Status CudaRunner::State::PrepareTrees(std::span<const SequenceInput> batch, Launch* launch) {
  if (!HasTree(batch)) return absl::OkStatus();
  if (launch->key.graph()) return absl::InternalError("a token tree in a graph step");
  size_t words = 1;
  for (const SequenceInput& in : batch) {
    if (in.tree != nullptr) words = std::max(words, (in.tree->parents.size() + 63) / 64);
  }
  // Sequence s's tree start (INT32_MAX: none), and each token's mask row: its node's ancestors
  // and itself, as bits of the slots after the start.
  std::vector<int32_t> starts(batch.size(), INT32_MAX);
  std::vector<uint64_t> masks;
  masks.reserve(static_cast<size_t>(launch->args.num_tokens) * words);
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    const size_t first = masks.size();
    masks.resize(first + in.tokens.size() * words, 0);
    if (in.tree == nullptr) continue;
    starts[s] = in.tree->start;
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      const auto node = static_cast<int32_t>(in.start_pos - in.tree->start + i);
      SetTreeMaskBits(in.tree->parents, node,
                      std::span<uint64_t>(masks).subspan(first + i * words, words));
    }
  }
  tree_arena.Reset();
  const size_t starts_at = tree_arena.Push(starts);
  const size_t masks_at = tree_arena.Push(masks);
  SPECD_RETURN_IF_ERROR(tree_arena.Upload(stream));
  tree_mask.tree_starts = tree_arena.At<int32_t>(starts_at);
  tree_mask.masks = tree_arena.At<uint64_t>(masks_at);
  tree_mask.mask_words = static_cast<int32_t>(words);
  launch->args.tree = &tree_mask;
  launch->args.decode = false;
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaRunner::State::LayoutParents(
    std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
    std::span<const std::span<const int32_t>> drafts, std::vector<int32_t>* parents) {
  parents->clear();
  if (!HasTree(batch)) return false;
  std::vector<int32_t> own;
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t k = drafts[i].size();
    if (k == 0) continue;
    SPECD_RETURN_IF_ERROR(runner_internal::TreeDraftParents(batch[rows[i].chunk], k, i, &own));
    if (own.empty()) {  // a chain
      for (size_t j = 0; j < k; ++j) parents->push_back(static_cast<int32_t>(j) - 1);
    } else {
      parents->insert(parents->end(), own.begin(), own.end());
    }
  }
  return true;
}

void CudaRunner::State::TreeTestUniforms(const SampleRow& row, std::span<const int32_t> parents,
                                         std::vector<float>* uniforms) {
  std::vector<int32_t> depths;
  TreeDepths(parents, &depths);
  // Siblings are tried best first, in index order: a draft's rank is the count of earlier
  // drafts with its parent.
  std::vector<int32_t> children(parents.size() + 1, 0);  // per parent (+1: the root)
  for (size_t j = 0; j < parents.size(); ++j) {
    const int32_t sibling = children[static_cast<size_t>(parents[j] + 1)]++;
    uniforms->push_back(TreeSpeculationUniform(row.seed, row.num_generated + depths[j], sibling));
  }
}

absl::Status CudaRunner::MoveKv(std::span<const KvSlotMove> moves) {
  if (!SupportsTokenTrees()) return ModelRunner::MoveKv(moves);
  if (moves.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  const int32_t bs = s_->block_size;
  std::vector<int64_t> from, to;
  for (size_t i = 0; i < moves.size(); ++i) {
    const KvSlotMove& m = moves[i];
    const int64_t blocks = static_cast<int64_t>(m.block_table.size()) * bs;
    if (m.from < 0 || m.to < 0 || m.from >= blocks || m.to >= blocks) {
      return absl::InvalidArgumentError(absl::StrCat("MoveKv: move ", i, " (", m.from, " -> ", m.to,
                                                     ") leaves its ", m.block_table.size(),
                                                     " blocks"));
    }
    from.push_back(int64_t{m.block_table[m.from / bs]} * bs + m.from % bs);
    to.push_back(int64_t{m.block_table[m.to / bs]} * bs + m.to % bs);
  }
  s_->move_arena.Reset();
  const size_t from_at = s_->move_arena.Push(from);
  const size_t to_at = s_->move_arena.Push(to);
  SPECD_RETURN_IF_ERROR(s_->move_arena.Upload(s_->stream));
  // Queued before the next step's forward on the same stream; that step synchronises.
  return s_->forward->MoveKv(s_->move_arena.At<int64_t>(from_at), s_->move_arena.At<int64_t>(to_at),
                             static_cast<int32_t>(from.size()), s_->stream);
}

}  // namespace specd
