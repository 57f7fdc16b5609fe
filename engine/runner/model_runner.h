// The seam between the engine loop and a compute backend. A ModelRunner owns a loaded model,
// its paged KV cache and whatever the device needs; each engine step hands it the scheduler's
// ragged batch (SequenceInput per scheduled chunk, block tables from the block manager) and the
// rows whose next token is drawn this step, and gets the drawn tokens back. The scheduler and
// block manager (engine/sched, engine/kv) are backend-independent: a runner only promises that
// it has num_kv_blocks() blocks of block_size() tokens and honours the block ids it is given.
//   CpuRunner  (cpu_runner.h): the exact fp32 Model + CpuKvCache + the CPU Sampler.
//   CudaRunner (cuda_runner.h, built with SPECD_ENABLE_CUDA): bf16 weights and KV on one GPU,
//              cuBLASLt GEMMs, our attention kernels, CUDA graphs for decode, sampling on the GPU.
// Created on any thread; afterwards one thread at a time (the engine thread).
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/communicator.h"
#include "engine/base/device_options.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/runner/eagle3_compute.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/batch_options.h"

namespace specd {

// The device, weights, threads and KV pool (DeviceOptions; device "auto" by default) and the
// step's limits (BatchLimits: max_num_seqs is the largest batch, which CUDA graph buckets go up
// to; max_num_batched_tokens the largest step in tokens, which sizes the activation buffers).
struct RunnerOptions : DeviceOptions, BatchLimits {
  std::string model_dir;
  int32_t max_sample_rows = 0;  // CUDA: rows one Step draws (logits buffer); 0:
                                // min(max_num_seqs, max_num_batched_tokens);
                                // speculation verifies K + 1 rows per sequence
  // Tensor parallelism: which shard of the target this runner holds and the group's collectives
  // (not owned; outlives the runner). world_size 1 (the default) needs no communicator. A rank's
  // runner holds 1/world_size of the sharded weights and its KV heads; rank 0 samples.
  TensorParallel tp;
  Communicator* comm = nullptr;
  // An EAGLE-3 head's folder (engine/runner/eagle3_compute.h): the runner holds the head beside
  // the model (on rank 0 of a tensor-parallel group: workers ignore it) and captures the hidden
  // states it reads. Empty: none.
  std::string eagle3_head;
};

// One token drawn this step: from the logits of batch chunk `chunk` at its last token (the
// sequence's next token), or at token `token` of the chunk (verification of greedy drafts draws
// the target's choice after every position of a drafted chunk). Pointers are the request's and
// outlive the Step call.
struct SampleRow {
  int32_t chunk = 0;
  Sampler* sampler = nullptr;              // the request's CPU sampler (its own seeded RNG)
  const SamplingParams* params = nullptr;  // the request's params (what the GPU sampler reads)
  const TokenHistory* history = nullptr;   // prompt and output ids (penalties)
  std::span<const int32_t> banned;         // ids that must not be drawn (min_tokens)
  uint64_t seed = 0;                       // the request's seed (given or drawn at arrival)
  int64_t num_generated = 0;               // tokens drawn so far (GPU Philox offset)
  int32_t token = -1;                      // index into the chunk's tokens; -1: the last
  // Tokens after `history` that penalties count as output: the earlier drafts of a speculative
  // position (StepSampledVerify sets them itself; StepDraft's caller sets them). Runners that
  // keep no probabilities on a device (SamplesSpeculationOnDevice() false) refuse rows with any.
  std::span<const int32_t> pending = {};
  // The ids of the row's num_candidates largest raw logits (before penalties and bans), best
  // first, ties to the lower id, in SampleResult::candidates (SSD's cache candidates; on a GPU
  // only the ids come back). At most kMaxSampleCandidates.
  int32_t num_candidates = 0;
  // Tensor parallelism: set on a worker rank's copy of a row whose rank-0 original needs its
  // whole row of logits (VocabMergeK), so that every rank merges the vocabulary shards alike.
  bool full_logits = false;
};
inline constexpr int32_t kMaxSampleCandidates = 16;

// How a tensor-parallel Step or StepGreedyVerify brings the vocabulary-parallel LM head's shards
// together for `rows`: 0 when some row needs its whole row of logits (sampling, penalties,
// banned ids, logprobs, full_logits; a row without params counts as greedy), which are then
// all-gathered; else k = max(1, the rows'
// num_candidates): every rank contributes its shard's k largest logits with their ids, and the
// merged rows hold the global k best and -inf elsewhere, which give the argmax and the candidates
// of the full rows (ties to the lower id, as over the full row). Calls that hand out
// probabilities or logits (StepSampledVerify, StepDraft, Forward) always gather.
int32_t VocabMergeK(std::span<const SampleRow> rows);
// Whether `row` alone makes VocabMergeK 0.
bool NeedsFullLogits(const SampleRow& row);

// What greedy verification of one row's drafts gives: the drafts kept up to the first mismatch
// with the target's argmax, and the target's token after them (the correction, or the bonus
// token when every draft is kept). A row without drafts draws `next` exactly as Step does.
struct GreedyVerifyResult {
  int32_t num_accepted = 0;  // 0..K
  SampleResult next;         // logprobs only for draftless rows that ask for them
                             // (StepSampledVerify: for every row that asks)
  // StepSampledVerify, rows that ask for logprobs: the accepted drafts with theirs; else empty.
  std::vector<SampleResult> accepted;
  // A token tree's row: the accepted drafts (indices into the row's drafts, root side first,
  // num_accepted of them); empty for chains.
  std::vector<int32_t> path;
};

// The distribution a row's drafts were drawn from, for StepSampledVerify: [k, vocab] f32 rows
// on a GPU (StepDraft's probability slots, on this runner's device or another one), or on the
// host (a speculator that drafts on the CPU or over the network), or neither: deterministic
// drafts (n-gram, greedy drafting), whose q is one-hot at each draft.
struct DraftProbs {
  const float* device = nullptr;
  std::span<const float> host;
};

// Philox counters of device speculation: a draw is keyed by (request seed, number of tokens the
// request had generated before the drawn position, kind), so a seeded request draws the same
// uniforms whatever batch it shares. (A round's next-token draw is keyed by the round's first
// position: where the correction lands is known only on the device.)
enum class SpeculationDraw : uint32_t {
  kAcceptTest = 0,  // the test of the draft at that position
  kNextToken = 1,   // the correction, bonus or plain token drawn at that position
  kDraft = 2,       // the draft model's draw at that position
};
// The uniform in [0, 1) (as f32, below 1) of one such draw (kernels::ref::PhiloxUniform).
float SpeculationUniform(uint64_t seed, int64_t num_generated, SpeculationDraw kind);
// A token tree's accept test of the `sibling`-th child (best first, < 256) of a node whose
// children sit at position num_generated (the tokens generated before them): siblings share a
// position, so the sibling's rank is part of the counter (apart from every SpeculationUniform).
float TreeSpeculationUniform(uint64_t seed, int64_t num_generated, int32_t sibling);

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  // "cpu (N threads)", "cuda:0 NVIDIA H100 80GB HBM3", ... for logs and /v1/models.
  virtual std::string device_name() const = 0;
  virtual int32_t num_kv_blocks() const = 0;
  virtual int32_t block_size() const = 0;
  // Context limit every buffer is sized for: options.max_model_len, or the model's.
  virtual int32_t max_model_len() const = 0;
  // Most rows one Step may draw (the device's logits buffer).
  virtual int32_t max_sample_rows() const = 0;
  // Longest chunk that may carry attention options (SequenceInput::attention: Vegas score
  // collection and sparse attention); unbounded where the runner takes any.
  virtual int32_t max_attention_option_tokens() const { return INT32_MAX; }
  // NSA targets: running totals of what the verification chunks with an SSV strategy
  // (SequenceInput::ssv) read; zeros where no chunk had one.
  virtual SsvLoadStats ssv_load_stats() const { return {}; }

  // Runs every chunk of `batch` (writing the KV of each new token) and draws one token per
  // row into (*out)[i] for rows[i]. Logprobs as the CPU Sampler returns them when the row's
  // params ask for them. Chunks must not ask for all_logits; rows name distinct (chunk, token)
  // pairs, at most max_sample_rows() of them. InvalidArgument for a malformed batch (nothing is
  // written then); Internal for a device failure.
  virtual absl::Status Step(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                            std::vector<SampleResult>* out) = 0;

  // A Step that verifies greedy drafts: rows[i]'s chunk holds the row's last committed token
  // followed by drafts[i] (exactly drafts[i].size() + 1 tokens; an empty draft is a plain row).
  // Rows with drafts must be greedy, without penalties, logprobs or banned ids; the total of
  // drafts[i].size() + 1 is at most max_sample_rows(). The default runs Step over every drafted
  // position and compares on the host; the CUDA runner keeps the argmax ids on the device and
  // runs the ballot-scan verify-and-pack kernel, reading back two ints per row.
  // Token trees (where SupportsTokenTrees()): a row whose chunk has a tree (SequenceInput::tree
  // starting at the chunk's first slot, parents[0] == -1 the last committed token, parents[1 + j]
  // draft j's parent + 1; runner_internal::TreeDraftParents) verifies the tree: the drafts kept
  // are the path from the root that follows the target's choice (Acceptor::VerifyTree), in
  // GreedyVerifyResult::path.
  virtual absl::Status StepGreedyVerify(std::span<const SequenceInput> batch,
                                        std::span<const SampleRow> rows,
                                        std::span<const std::span<const int32_t>> drafts,
                                        std::vector<GreedyVerifyResult>* out);

  // --- Speculation whose probabilities stay on the device (the CUDA runner). ---
  // Whether StepSampledVerify, StepDraft and the probability slots work; false (the CPU runner):
  // the engine verifies sampled drafts on the host (Forward and the Acceptor, the oracle).
  virtual bool SamplesSpeculationOnDevice() const { return false; }

  // Verification of any drafts, sampled or greedy, in one pass: rows[i]'s chunk holds its last
  // committed token and drafts[i] (as StepGreedyVerify); probs[i] says what drafts[i] were drawn
  // from. The target's processed distribution p at every position (bans while min_tokens is not
  // reached, penalties over the history plus the earlier drafts, temperature, min-p, top-k,
  // top-p; greedy rows one-hot at the argmax) is built on the device; speculative sampling
  // accepts draft j when u * q_j(d_j) < p_j(d_j), draws the correction from norm(max(0, p - q))
  // or the bonus token from p_K (kernels::VerifyStochastic), with uniforms from Philox keyed as
  // SpeculationDraw says. A draftless row draws its next token from p. The rows' positions fit
  // max_sample_rows(). Only accepted lengths and next tokens come back, and the raw logits rows
  // of rows that ask for logprobs (their committed tokens' logprobs are the host's, as Step's).
  // Unimplemented unless SamplesSpeculationOnDevice().
  // Token trees (where SupportsTokenTrees(), chunks as StepGreedyVerify's): every node is a
  // deterministic choice (probs[i] empty: q one-hot), verified by recursive rejection over
  // siblings (Acceptor::VerifyTree's rule; kernels::VerifyTreeStochastic); p at a node counts
  // its path's tokens as pending, and its accept tests' uniforms are TreeSpeculationUniform's.
  // A batch with a tree takes only deterministic drafts (InvalidArgument for a row with q).
  virtual absl::Status StepSampledVerify(std::span<const SequenceInput> batch,
                                         std::span<const SampleRow> rows,
                                         std::span<const std::span<const int32_t>> drafts,
                                         std::span<const DraftProbs> probs,
                                         std::vector<GreedyVerifyResult>* out);

  // Makes probability slots [0, n) exist: [n, vocab] f32 rows on the device, where StepDraft
  // leaves the distributions it drew from. Growing drops what earlier slots held; slot pointers
  // stay valid until the next ReserveProbSlots.
  virtual absl::Status ReserveProbSlots(int32_t n);
  // Device pointer of slot `slot` (rows slot, slot + 1, ... follow it); nullptr when none.
  virtual const float* prob_slot(int32_t slot) const;
  // A Step for a draft model: rows[i] is drawn from its processed distribution (as
  // StepSampledVerify builds p; the row's own banned ids and pending tokens apply), which stays
  // on the device in slot slots[i] (distinct slots). The draw's uniform is
  // SpeculationUniform(seed, num_generated, kDraft). Only ids come back.
  virtual absl::Status StepDraft(std::span<const SequenceInput> batch,
                                 std::span<const SampleRow> rows, std::span<const int32_t> slots,
                                 std::vector<SampleResult>* out);

  // Token trees (SequenceInput::tree, engine/model/token_tree.h): whether Step, Forward and
  // the verify calls take chunks with a tree, and MoveKv works.
  virtual bool SupportsTokenTrees() const { return false; }
  // After a tree's verification the accepted path's K/V move to consecutive slots: every
  // layer's K and V at slot `from` of each move's sequence are copied to slot `to`, in order.
  // InvalidArgument for a slot outside a move's blocks (nothing moved); Unimplemented unless
  // SupportsTokenTrees().
  virtual absl::Status MoveKv(std::span<const KvSlotMove> moves);

  // EAGLE-3 heads (engine/speculation/eagle3.h) read the target's own hidden states. After
  // CaptureHiddenStates(ids), every pass that runs the model (Step, StepGreedyVerify,
  // StepSampledVerify, Forward) also keeps, for each new token of its batch in batch order, the
  // residual stream at the input of target layers ids[i] (vLLM's convention: 0 is the embedding
  // output, j the output of layer j - 1), concatenated: captured_hidden_states() is the last
  // pass's [num_new_tokens, ids.size() * hidden] f32, host memory, valid until the next pass.
  // Empty ids stop it. InvalidArgument for ids outside [0, num_layers) or repeated;
  // Unimplemented where the runner cannot (the CUDA runner captures on its device, for the head
  // of RunnerOptions::eagle3_head only).
  virtual absl::Status CaptureHiddenStates(std::span<const int32_t> layer_ids);
  virtual std::span<const float> captured_hidden_states() const { return {}; }
  // The EAGLE-3 head of RunnerOptions::eagle3_head, or null.
  virtual Eagle3Compute* eagle3() { return nullptr; }

  // Tensor parallelism: OK while every rank of the runner's group is alive and in step; once a
  // rank died, stopped answering or failed, the reason (Unavailable naming the rank), for good.
  // A single-process runner is always OK. Thread-safe (a watchdog sets it; front ends read it).
  virtual absl::Status GroupStatus() const { return absl::OkStatus(); }

  // Runs `batch` like Step (same kernels and graphs) and returns logits instead of drawing:
  // *logits gets [num_rows, vocab] f32 rows, in chunk order, for the last token of each chunk
  // (every new token when all_logits). Goldens, tests and tools; copies logits to the host.
  virtual absl::Status Forward(std::span<const SequenceInput> batch,
                               std::vector<float>* logits) = 0;

  // Forward's rows ranked where they are (a draft model's token trees on a GPU: k ids and
  // log-probabilities per node instead of a row of the vocabulary): for each row of Forward, in
  // order, its k (1..16) largest raw logits' ids, best first (ties to the lower id), appended to
  // *ids, and their log-softmax over the row to *logprobs. Unimplemented unless
  // RanksCandidatesOnDevice().
  virtual bool RanksCandidatesOnDevice() const { return false; }
  virtual absl::Status ForwardCandidates(std::span<const SequenceInput> batch, int32_t k,
                                         std::vector<int32_t>* ids, std::vector<float>* logprobs);
};

// A device string ("cpu", "cuda", "cuda:N", "auto") resolved: auto is the first GPU when the build
// has CUDA and one is visible, else the CPU. InvalidArgument for anything else.
struct DeviceChoice {
  bool cuda = false;
  int32_t index = 0;  // GPU ordinal
};
absl::StatusOr<DeviceChoice> ParseDevice(std::string_view device);

// The runner `options.device` names. "auto" picks CUDA when the build has it and a GPU is
// visible, else the CPU. Errors name the device, file or size at fault (an unknown device,
// no GPU for "cuda", a build without CUDA, not enough GPU memory for the weights or the KV
// cache: ResourceExhausted with the bytes needed and available).
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const RunnerOptions& options);

// options.max_model_len checked against the model (0: the model's max_position_embeddings).
absl::StatusOr<int32_t> ResolveMaxModelLen(const ModelConfig& config, int32_t requested);

namespace runner_internal {

// StepGreedyVerify's argument checks (InvalidArgument naming the row), and its expansion of
// `rows` into one Step row per verified position: rows[i] becomes drafts[i].size() + 1 rows
// (token 0..K of its chunk), or stays one row when it has no drafts.
// Tests only: when true, StepSampledVerify accepts every draft the target gives any mass to (its
// tests draw u = 0), so the output follows the draft's distribution: a broken verifier whose
// output the GPU chi-square test must reject (its negative control).
inline bool verify_accepts_every_draft_for_test = false;

// StepSampledVerify's argument checks and expansion: rows[i] becomes drafts[i].size() + 1 rows
// (token j of its chunk, pending = drafts[i][0, j), num_generated + j, banned only while the
// request is below min_tokens at that position), or stays one row. A tree row's node (the root,
// then draft j) gets its path's tokens as pending and num_generated + its depth (the root 0, a
// root's child 1); those paths are kept in *path_tokens, which must outlive the expansion.
absl::Status ExpandSampledVerifyRows(std::span<const SequenceInput> batch,
                                     std::span<const SampleRow> rows,
                                     std::span<const std::span<const int32_t>> drafts,
                                     std::span<const DraftProbs> probs, int64_t vocab,
                                     std::vector<SampleRow>* expanded,
                                     std::vector<int32_t>* path_tokens);

// The expansion alone, checking only the rows' shape against their chunks (a tensor-parallel
// worker's rows carry no sampling state): each row with k drafts becomes k + 1 copies of it with
// token 0..k; a draftless row stays.
absl::Status ExpandDraftRows(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                             std::span<const std::span<const int32_t>> drafts,
                             std::vector<SampleRow>* expanded);

absl::Status ExpandVerifyRows(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                              std::span<const std::span<const int32_t>> drafts,
                              std::vector<SampleRow>* expanded);

// The drafts' parents (-1: the root) of a verification chunk holding a tree of k drafts
// (the verify calls' convention: chunk.tree starts at chunk.start_pos, covers the chunk,
// parents[0] == -1 and no other root), into *parents; cleared for a chunk without a tree.
// InvalidArgument naming `row` for a tree that breaks the convention.
absl::Status TreeDraftParents(const SequenceInput& chunk, size_t k, size_t row,
                              std::vector<int32_t>* parents);

}  // namespace runner_internal

}  // namespace specd
