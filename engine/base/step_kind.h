// The kinds of pass a ModelRunner runs (engine/runner/step_request.h: StepRequest::kind), one
// enum for the runner's call and for the tensor-parallel wire, where a TpStep names the call
// every worker repeats (TpMethod in engine/distributed/messages.h is this enum). It lives in
// base/ because both runner/ and distributed/ read it and distributed/ may include base/ only.
// A new verification kind is a value here with its contract as its comment, and a `case` in each
// runner's Run. Plain values: any thread.
#pragma once

#include <cstdint>

namespace specd {

// Each value's comment is its contract; the request's and result's fields it reads and writes
// are StepRequest's and StepResult's. Values 1..5 travel on the TP wire (their numbers are the
// wire's and never change); kForwardCandidates never does (a tensor-parallel runner ranks rows
// on the host).
enum class StepKind : uint8_t {
  // Runs every chunk of `batch` (writing the KV of each new token) and draws one token per row
  // into samples[i] for rows[i]. Logprobs as the CPU Sampler returns them when the row's params
  // ask for them. Chunks must not ask for all_logits; rows name distinct (chunk, token) pairs, at
  // most max_sample_rows() of them. InvalidArgument for a malformed batch (nothing is written
  // then); Internal for a device failure.
  kStep = 1,

  // A kStep that verifies greedy drafts: rows[i]'s chunk holds the row's last committed token
  // followed by drafts[i] (exactly drafts[i].size() + 1 tokens; an empty draft is a plain row).
  // Rows with drafts must be greedy, without penalties, logprobs or banned ids; the total of
  // drafts[i].size() + 1 is at most max_sample_rows(). Results in verified[i]. The CPU runner
  // runs kStep over every drafted position and compares on the host
  // (ModelRunner::GreedyVerifyByStep); the CUDA runner keeps the argmax ids on the device and
  // runs the ballot-scan verify-and-pack kernel, reading back two ints per row.
  // Token trees (where SupportsTokenTrees()): a row whose chunk has a tree (SequenceInput::tree
  // starting at the chunk's first slot, parents[0] == -1 the last committed token, parents[1 + j]
  // draft j's parent + 1; runner_internal::TreeDraftParents) verifies the tree: the drafts kept
  // are the path from the root that follows the target's choice (Acceptor::VerifyTree), in
  // GreedyVerifyResult::path.
  kGreedyVerify = 2,

  // Verification of any drafts, sampled or greedy, in one pass: rows[i]'s chunk holds its last
  // committed token and drafts[i] (as kGreedyVerify); probs[i] says what drafts[i] were drawn
  // from. The target's processed distribution p at every position (bans while min_tokens is not
  // reached, penalties over the history plus the earlier drafts, temperature, min-p, top-k,
  // top-p; greedy rows one-hot at the argmax) is built on the device; speculative sampling
  // accepts draft j when u * q_j(d_j) < p_j(d_j), draws the correction from norm(max(0, p - q))
  // or the bonus token from p_K (kernels::VerifyStochastic), with uniforms from Philox keyed as
  // SpeculationDraw says. A draftless row draws its next token from p. The rows' positions fit
  // max_sample_rows(). Only accepted lengths and next tokens come back (verified[i]), and the
  // raw logits rows of rows that ask for logprobs (their committed tokens' logprobs are the
  // host's, as kStep's). Unimplemented unless SamplesSpeculationOnDevice().
  // Token trees (where SupportsTokenTrees(), chunks as kGreedyVerify's): every node is a
  // deterministic choice (probs[i] empty: q one-hot), verified by recursive rejection over
  // siblings (Acceptor::VerifyTree's rule; kernels::VerifyTreeStochastic); p at a node counts
  // its path's tokens as pending, and its accept tests' uniforms are TreeSpeculationUniform's.
  // A batch with a tree takes only deterministic drafts (InvalidArgument for a row with q).
  kSampledVerify = 3,

  // A kStep for a draft model: rows[i] is drawn from its processed distribution (as
  // kSampledVerify builds p; the row's own banned ids and pending tokens apply), which stays on
  // the device in probability slot slots[i] (distinct slots; ReserveProbSlots). The draw's
  // uniform is SpeculationUniform(seed, num_generated, kDraft). Only ids come back (samples[i]).
  // Unimplemented unless SamplesSpeculationOnDevice().
  kDraft = 4,

  // Runs `batch` like kStep (same kernels and graphs) and returns logits instead of drawing:
  // `logits` gets [num_rows, vocab] f32 rows, in chunk order, for the last token of each chunk
  // (every new token when all_logits). Goldens, tests and tools; copies logits to the host. A
  // tensor-parallel worker leaves it empty.
  kForward = 5,

  // kForward's rows ranked where they are (a draft model's token trees on a GPU: k ids and
  // log-probabilities per node instead of a row of the vocabulary): for each row of kForward, in
  // order, its k (1..16) largest raw logits' ids, best first (ties to the lower id), appended to
  // candidate_ids, and their log-softmax over the row to candidate_logprobs. Unimplemented
  // unless RanksCandidatesOnDevice().
  kForwardCandidates = 6,
};

// "Step", "StepGreedyVerify", ... (the ModelRunner call's name), for errors and logs.
constexpr const char* StepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kStep:
      return "Step";
    case StepKind::kGreedyVerify:
      return "StepGreedyVerify";
    case StepKind::kSampledVerify:
      return "StepSampledVerify";
    case StepKind::kDraft:
      return "StepDraft";
    case StepKind::kForward:
      return "Forward";
    case StepKind::kForwardCandidates:
      return "ForwardCandidates";
  }
  return "unknown step kind";
}

}  // namespace specd
