// Token trees for drafters that run a model (the draft model, an EAGLE-3 head): the tree grows
// a level at a time from the drafter's logits, as EAGLE-2's dynamic draft tree does. Each node
// scores the sum of its path's log-probabilities under the drafter (log-softmax of the raw
// logits; banned ids excluded while the request is below min_tokens). Level 1 is the root's
// top_k children; each later level expands the top_k best nodes of the level before by their
// top_k children; the tree verified is the num_nodes best nodes of all (a child never scores
// above its parent, so the best nodes include their ancestors), breadth first, siblings best
// first. Nodes are deterministic choices: verification treats q as one-hot at each, which keeps
// sampled requests lossless (Acceptor::VerifyTree).
// Controlled acceptance (benchmarks only, set_replay): every drafter that grows its trees here
// gets replayed trees, each node's children rewritten by DraftReplay::Children. Engine thread
// only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specd {

class DraftReplay;

class DraftTreeBuilder {
 public:
  // depth >= 1 levels, top_k >= 1, max_nodes >= 1 nodes in the tree verified. Turns the replay
  // off.
  void Reset(int32_t depth, int32_t top_k, int32_t max_nodes);
  // Benchmarks only, after Reset, for a greedy request (the replay follows the target's greedy
  // output): until the next Reset, Expand passes each node's children through
  // replay->Children(context, the node's path, children). `context` is the sequence's tokens
  // (DraftInput::tokens), viewed, not copied: it must outlive the tree's growth. A replayed
  // child takes the slot of the child it displaced, score included (the model's log-probability
  // for that rank), so scores stay ordered within each row and NextLevel / Finish choose among
  // the replayed tokens as they would among the model's. nullptr: off.
  void set_replay(const DraftReplay* replay, std::span<const int32_t> context);

  // Adds node `node`'s top_k children (node -1: the root) from the drafter's raw logits after
  // it; ids in `banned` are never children (the replay's may be: it places the recorded token
  // as the chain's Draft does).
  void Expand(int32_t node, std::span<const float> logits, std::span<const int32_t> banned);
  // Expand from candidates the drafter already ranked (on its device: Eagle3Compute::
  // TopCandidates): `ids` best first with their log-probabilities under the drafter; the first
  // top_k with a finite log-probability become the children (replayed as Expand's are).
  void ExpandCandidates(int32_t node, std::span<const int32_t> ids,
                        std::span<const float> logprobs);
  // The nodes whose logits expand the tree next: the top_k best of the deepest level, while
  // a deeper level is allowed (empty once the tree is complete). Each call moves one level on.
  std::vector<int32_t> NextLevel();

  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  int32_t token(int32_t node) const { return nodes_[node].token; }
  int32_t parent(int32_t node) const { return nodes_[node].parent; }
  int32_t depth(int32_t node) const { return nodes_[node].depth; }  // the root's children: 0
  double score(int32_t node) const { return nodes_[node].score; }
  // The path's tokens from the root's child down to `node`, appended to *out.
  void AppendPathTokens(int32_t node, std::vector<int32_t>* out) const;

  // The tree verified: the max_nodes best nodes, breadth first (Draft::tokens and parents).
  void Finish(std::vector<int32_t>* tokens, std::vector<int32_t>* parents) const;

 private:
  // The children of `node`: ids[i] with log-probability logprobs[i], best first, up to the first
  // non-finite one; the replay (set_replay) may rewrite ids.
  void AddChildren(int32_t node, std::vector<int32_t>& ids, std::span<const double> logprobs);

  struct Node {
    int32_t token;
    int32_t parent;  // -1: a child of the root
    int32_t depth;
    double score;  // the path's summed log-probabilities
  };
  int32_t depth_ = 0;
  int32_t top_k_ = 0;
  int32_t max_nodes_ = 0;
  int32_t level_ = 0;       // the deepest level added (0: the root's children)
  size_t level_begin_ = 0;  // nodes of the deepest level: [level_begin_, nodes_.size())
  std::vector<Node> nodes_;
  std::vector<float> scratch_;           // [vocab] log-softmax of one row
  const DraftReplay* replay_ = nullptr;  // set_replay
  std::span<const int32_t> context_;     // [num_tokens] the replayed sequence's tokens
  std::vector<int32_t> path_;            // scratch: a node's path for the replay
  std::vector<int32_t> candidates_;      // scratch: ExpandCandidates' ids
  std::vector<double> logprobs_;         // scratch: the children's log-probabilities
};

}  // namespace specd
