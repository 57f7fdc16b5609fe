// The seam between the engine loop and a compute backend. A ModelRunner owns a loaded model,
// its paged KV cache and whatever the device needs; each engine step hands it the scheduler's
// ragged batch (SequenceInput per scheduled chunk, block tables from the block manager) and the
// rows whose next token is drawn this step, and gets the drawn tokens back. The scheduler and
// block manager (engine/sched, engine/kv) are backend-independent: a runner only promises that
// it has num_kv_blocks() blocks of block_size() tokens and honours the block ids it is given.
// Every pass is one virtual call, Run(StepRequest, StepResult*) (step_request.h; the kinds and
// their contracts in engine/base/step_kind.h); Step, StepGreedyVerify, ... are its named wrappers.
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
#include "engine/runner/step_request.h"
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
  // CUDA: a round graph's query length (its longest chunk) rounded up to a multiple of this
  // (at most 16), so passes whose chunk lengths vary (SSD's cache waves) share fewer graph
  // shapes; the padding tokens cost compute, not correctness. 1: the exact length.
  int32_t round_graph_q_len_multiple = 1;
  // An EAGLE-3 head's folder (engine/runner/eagle3_compute.h): the runner holds the head beside
  // the model (on rank 0 of a tensor-parallel group: workers ignore it) and captures the hidden
  // states it reads. Empty: none.
  std::string eagle3_head;
  // Hidden states kept for a consumer outside the runner (an EAGLE-3 head in SSD's speculator):
  // the CUDA runner sets aside the capture of these layers' inputs (rank 0) before it sizes its
  // KV cache and captures its graphs, so that CaptureHiddenStates(these ids) can turn it on; the
  // CPU runner needs nothing in advance. Ignored when eagle3_head is set. Empty: none.
  std::vector<int32_t> capture_hidden_layers;
};

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
  // Captures now the CUDA round graphs that passes of up to `max_batch` sequences with chunks of
  // `q_lens` tokens would capture on first use (one logits row per sequence, or, with
  // `all_rows`, a row per token), so no pass stalls on a capture later. As many as the graph
  // budget holds; a no-op where graphs are not used.
  virtual absl::Status CaptureRoundGraphs(int32_t /*max_batch*/,
                                          std::span<const int32_t> /*q_lens*/, bool /*all_rows*/) {
    return absl::OkStatus();
  }
  // Longest chunk that may carry attention options (SequenceInput::attention: Vegas score
  // collection and sparse attention); unbounded where the runner takes any.
  virtual int32_t max_attention_option_tokens() const { return INT32_MAX; }
  // Selection slots kept on the device (ChunkAttention's select_slot and slot: Vegas selects
  // after verification and drafts from there without the host): slots [0, n) exist; 0 where
  // selections travel through the host (ChunkAttention's scores and layer_indices).
  virtual int32_t num_sparse_slots() const { return 0; }
  // NSA targets: running totals of what the verification chunks with an SSV strategy
  // (SequenceInput::ssv) read; zeros where no chunk had one.
  virtual SsvLoadStats ssv_load_stats() const { return {}; }

  // The one pass call: runs `request` (its kind's contract is the comment on its StepKind
  // value, engine/base/step_kind.h) and writes the outputs of its kind through `result`. Each
  // runner implements it with one switch over request.kind; a kind it does not run is
  // Unimplemented (Unsupported below). A new verification kind is a StepKind value and a case
  // in each runner's switch (a switch without a default: the compiler names the runners that
  // lack it).
  virtual absl::Status Run(const StepRequest& request, StepResult* result) = 0;

  // The pass calls by name: each builds its StepRequest and calls Run (callers and tests keep
  // these; runners override Run only).
  // StepKind::kStep.
  absl::Status Step(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                    std::vector<SampleResult>* out) {
    StepResult result;
    result.samples = out;
    return Run(StepRequest::Step(batch, rows), &result);
  }
  // StepKind::kGreedyVerify.
  absl::Status StepGreedyVerify(std::span<const SequenceInput> batch,
                                std::span<const SampleRow> rows,
                                std::span<const std::span<const int32_t>> drafts,
                                std::vector<GreedyVerifyResult>* out) {
    StepResult result;
    result.verified = out;
    return Run(StepRequest::GreedyVerify(batch, rows, drafts), &result);
  }
  // StepKind::kSampledVerify.
  absl::Status StepSampledVerify(std::span<const SequenceInput> batch,
                                 std::span<const SampleRow> rows,
                                 std::span<const std::span<const int32_t>> drafts,
                                 std::span<const DraftProbs> probs,
                                 std::vector<GreedyVerifyResult>* out) {
    StepResult result;
    result.verified = out;
    return Run(StepRequest::SampledVerify(batch, rows, drafts, probs), &result);
  }
  // StepKind::kDraft.
  absl::Status StepDraft(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                         std::span<const int32_t> slots, std::vector<SampleResult>* out) {
    StepResult result;
    result.samples = out;
    return Run(StepRequest::Draft(batch, rows, slots), &result);
  }
  // StepKind::kForward.
  absl::Status Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) {
    StepResult result;
    result.logits = logits;
    return Run(StepRequest::Forward(batch), &result);
  }
  // StepKind::kForwardCandidates.
  absl::Status ForwardCandidates(std::span<const SequenceInput> batch, int32_t k,
                                 std::vector<int32_t>* ids, std::vector<float>* logprobs) {
    StepResult result;
    result.candidate_ids = ids;
    result.candidate_logprobs = logprobs;
    return Run(StepRequest::ForwardCandidates(batch, k), &result);
  }

  // --- Speculation whose probabilities stay on the device (the CUDA runner). ---
  // Whether kSampledVerify, kDraft and the probability slots work; false (the CPU runner): the
  // engine verifies sampled drafts on the host (Forward and the Acceptor, the oracle).
  virtual bool SamplesSpeculationOnDevice() const { return false; }

  // Makes probability slots [0, n) exist: [n, vocab] f32 rows on the device, where StepDraft
  // leaves the distributions it drew from. Growing drops what earlier slots held; slot pointers
  // stay valid until the next ReserveProbSlots.
  virtual absl::Status ReserveProbSlots(int32_t n);
  // Device pointer of slot `slot` (rows slot, slot + 1, ... follow it); nullptr when none.
  virtual const float* prob_slot(int32_t slot) const;
  // Copies slots [first, first + n) to `out` ([n, vocab] f32, host), after every pass queued
  // before: the q rows a caller keeps past the next StepDraft (SSD's speculation cache).
  // InvalidArgument for slots outside the reserved ones or a short `out`; Unimplemented where
  // no slots exist.
  virtual absl::Status ReadProbSlots(int32_t first, int32_t n, std::span<float> out) const;
  // Kept rows: a second table of [n, vocab] f32 rows on the device, apart from the slots, where
  // q rows outlive the next StepDraft (SSD's speculation cache keeps its branches' rows there).
  // ReserveKeptRows(n) makes rows [0, n) exist (growing drops what they held); KeepProbSlots
  // queues the copy of slots [first_slot, first_slot + n) into kept rows [first_row, ...) on the
  // runner's stream (later passes' draws into those slots come after it); ReadKeptRows copies
  // kept rows [first_row, first_row + n) to `out` ([n, vocab] f32, host) after every pass queued
  // before. InvalidArgument for rows or slots outside the reserved ones or a short `out`;
  // Unimplemented where no slots exist.
  virtual absl::Status ReserveKeptRows(int32_t n);
  virtual absl::Status KeepProbSlots(int32_t first_slot, int32_t n, int32_t first_row);
  virtual absl::Status ReadKeptRows(int32_t first_row, int32_t n, std::span<float> out) const;
  // Copies kept rows, range after range, to consecutive rows at `device_out` ([sum of counts,
  // vocab] f32, device memory of this runner's GPU) after every pass queued before, and waits
  // for the copies: SSD's device data path gathers the served drafts' rows there to send them.
  // InvalidArgument for rows outside the reserved ones; Unimplemented where none are kept.
  struct RowRange {
    int32_t first = 0;
    int32_t count = 0;
  };
  virtual absl::Status CopyKeptRows(std::span<const RowRange> ranges, void* device_out) const;

  // Token trees (SequenceInput::tree, engine/model/token_tree.h): whether Step, Forward and
  // the verify calls take chunks with a tree, and MoveKv works.
  virtual bool SupportsTokenTrees() const { return false; }
  // NSA targets: whether chunks may carry a lossy SSV strategy (SequenceInput::ssv: shared mode,
  // or a reuse schedule); every NSA runner takes exact ones.
  virtual bool SupportsLossySsv() const { return false; }
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
  // The captured rows `ranges` of the last pass (indices into its new tokens, batch order),
  // range after range, appended to *out ([sum of counts, width] f32, host); `width`: the
  // capture's row width (ids.size() * hidden). For a consumer outside the runner (SSD's
  // speculator): the default reads captured_hidden_states(); the CUDA runner copies just these
  // rows from its device. OutOfRange when the last pass left fewer rows (none captured: none),
  // InvalidArgument for a width other than the capture's where the runner knows it.
  virtual absl::Status CopyCapturedRows(std::span<const RowRange> ranges, int64_t width,
                                        std::vector<float>* out) const;
  // The same rows left on the device for a consumer that moves them GPU to GPU (SSD's device
  // data path): copied to consecutive rows at `device_out` ([sum of counts, width] bf16, device
  // memory of this runner's GPU) after every pass queued before, and waited for. Unimplemented
  // unless CapturesOnDevice().
  virtual bool CapturesOnDevice() const { return false; }
  virtual absl::Status CopyCapturedRowsOnDevice(std::span<const RowRange> ranges, int64_t width,
                                                void* device_out) const;
  // The EAGLE-3 head of RunnerOptions::eagle3_head, or null.
  virtual Eagle3Compute* eagle3() { return nullptr; }

  // Tensor parallelism: OK while every rank of the runner's group is alive and in step; once a
  // rank died, stopped answering or failed, the reason (Unavailable naming the rank), for good.
  // A single-process runner is always OK. Thread-safe (a watchdog sets it; front ends read it).
  virtual absl::Status GroupStatus() const { return absl::OkStatus(); }

  // Whether kForwardCandidates works (ranks rows on the device).
  virtual bool RanksCandidatesOnDevice() const { return false; }

 protected:
  // kGreedyVerify over kStep: Step over every drafted position (runner_internal::
  // ExpandVerifyRows), the target's choices compared with the drafts on the host (chains:
  // AcceptGreedy; trees: kernels::ref::VerifyTreeGreedy). The CPU runner's kGreedyVerify.
  absl::Status GreedyVerifyByStep(const StepRequest& request, StepResult* result);
  // Unimplemented naming the call and this runner: a kind the runner does not run (kSampledVerify
  // and kDraft without device speculation, kForwardCandidates where rows are ranked on the host).
  absl::Status Unsupported(StepKind kind) const;
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
// An EAGLE-3 head without its target (SSD's speculator): the CPU compute, or the CUDA one on a
// "cuda:N" device (FailedPrecondition in a build without CUDA).
absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateStandaloneEagle3Compute(
    const StandaloneEagle3Options& options);

// options.max_model_len checked against the model (0: the model's max_position_embeddings).
absl::StatusOr<int32_t> ResolveMaxModelLen(const ModelConfig& config, int32_t requested);

namespace runner_internal {

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

// StepGreedyVerify's argument checks (InvalidArgument naming the row), and its expansion of
// `rows` into one Step row per verified position: rows[i] becomes drafts[i].size() + 1 rows
// (token 0..K of its chunk), or stays one row when it has no drafts.
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
