// Controlled acceptance for benchmarks (issue 6's controlled-acceptance measurements): makes a
// draft model's greedy proposals follow a recorded greedy continuation of the target with a set
// per-token probability, while the draft still runs its full forward pass (so every cost is
// real). Given a context that equals a prefix of a recorded trajectory (prompt + the target's
// greedy continuation), the draft for position p is the recorded token traj[p] with probability
// alpha, else another token; whether position p is drafted right is a fixed function of (seed,
// trajectory, p), so re-drafting a position gives the same answer, as a deterministic greedy
// draft would. Off the trajectory (a rejected draft in the context, or past its end) the
// model's own token stands. For SSD's speculation cache, the recorded token is placed right
// after the draft among the position's candidates with probability candidate_hit (the chance
// that the bonus token t* is the draft's best alternative).
// Token trees (DraftTreeBuilder) replay through Children: at the node whose path from the root
// follows the trajectory, the recorded token is among the node's children with probability
// alpha, decided by the same per-position draw as Draft, so a chain and a tree replaying the same
// recording hit and miss at the same positions.
// A context follows the first trajectory it is a prefix of (found through their first
// kKeyTokens tokens); trajectories may share prompts or prefixes. Results measured with it are
// labelled controlled-acceptance results. Immutable after Load; any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/speculation/spec_config.h"

namespace specd {

class DraftReplay {
 public:
  static constexpr size_t kKeyTokens = 8;

  // Reads options.file (JSONL, one {"tokens": [ids]} per line, each at least kKeyTokens long,
  // ids in [0, vocab)). InvalidArgument naming the line or trajectory for malformed input.
  static absl::StatusOr<std::unique_ptr<DraftReplay>> Load(const DraftReplayOptions& options,
                                                           int32_t vocab);
  // From trajectories in memory (tests).
  static absl::StatusOr<std::unique_ptr<DraftReplay>> Create(
      const DraftReplayOptions& options, int32_t vocab,
      std::vector<std::vector<int32_t>> trajectories);

  // The draft at position context.size() + drafts.size(), given the model's own choice.
  int32_t Draft(std::span<const int32_t> context, std::span<const int32_t> drafts,
                int32_t model_token) const;
  // Rewrites one position's candidates (best first; candidates[0] is the draft just chosen) for
  // the same position as Draft: the recorded token goes right after the draft with probability
  // candidate_hit, and never elsewhere (a miss keeps it out of the row).
  void Candidates(std::span<const int32_t> context, std::span<const int32_t> drafts,
                  std::span<int32_t> candidates) const;

  // Rewrites a token tree node's children (best first, as the drafter ranked them; distinct ids)
  // for the same position as Draft, where `path` is the drafts from the root's child down to the
  // node (empty: the root's children). On the trajectory, the best child becomes the token Draft
  // gives there: the recorded token (a hit, probability alpha) or Draft's wrong token (a miss);
  // the model's other children follow in their order, less the recorded token and that best
  // one's duplicate, and where too few are left distinct fill tokens (never the recorded one) keep
  // the row's length. So a hit has the recorded token among the children exactly once (first), a
  // miss never; a one-child tree (top_k 1) is Draft's chain token for token, and the first-child
  // path of any tree is that chain. The hit or miss at a position is Draft's at that position,
  // fixed per (seed, trajectory, position): the only node a position can be on the trajectory
  // for is the one whose path is the recorded one. Off the trajectory (the node's path left it,
  // or past its end) the children are untouched, as is a row as long as the vocabulary.
  void Children(std::span<const int32_t> context, std::span<const int32_t> path,
                std::span<int32_t> children) const;

  size_t num_trajectories() const { return trajectories_.size(); }

 private:
  DraftReplay(const DraftReplayOptions& options, int32_t vocab,
              std::vector<std::vector<int32_t>> trajectories);
  // The trajectory the context + drafts follow and the position to draft, or nullptr.
  const std::vector<int32_t>* OnTrack(std::span<const int32_t> context,
                                      std::span<const int32_t> drafts, size_t* index,
                                      size_t* position) const;
  // A uniform in [0, 1) from (seed, trajectory, position, salt).
  double Uniform(size_t index, size_t position, uint64_t salt) const;
  // A token other than `token`, fixed per (trajectory, position, salt).
  int32_t Other(size_t index, size_t position, int32_t token, uint64_t salt) const;
  // The i-th fill for a row at `position`: a token neither `right` nor in `taken`.
  int32_t Fill(size_t index, size_t position, int32_t right, size_t i,
               std::span<const int32_t> taken) const;

  DraftReplayOptions options_;
  int32_t vocab_;
  std::vector<std::vector<int32_t>> trajectories_;
  // hash of the first kKeyTokens ids -> trajectories starting so, in file order
  absl::flat_hash_map<uint64_t, std::vector<size_t>> by_key_;
};

}  // namespace specd
