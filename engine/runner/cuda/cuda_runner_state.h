// The CUDA runner's private state, shared by its source files: cuda_runner.cc (creation,
// buffers, plain steps), cuda_runner_graphs.cc (step inputs, CUDA-graph capture and replay),
// cuda_runner_speculation.cc (verification, draft steps, probability slots),
// cuda_runner_verify.cc (verification plans), cuda_runner_trees.cc (token trees) and
// cuda_runner_vegas.cc (Vegas attention options). Not part of the runner's API: only those files
// include it. Engine thread only (as CudaRunner).
#pragma once

#include <driver_types.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/communicator.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/model/model_config.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runner/cuda/cuda_eagle3.h"
#include "engine/runner/cuda/cuda_forward.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/cuda/cuda_sampling.h"
#include "engine/runner/cuda/cuda_weights.h"
#include "engine/runner/cuda/upload_arena.h"

namespace specd {
namespace cuda_runner_internal {

// Device memory set aside for CUDA graphs (captured after the KV cache is allocated, because the
// graphs embed its address): the decode graphs captured at load, then the round graphs captured
// on first use while what they took stays under it. Every buffer they touch is preallocated, so
// graphs only need room for their executable form; the logs report what capture really took.
inline constexpr int64_t kGraphReserveBytes = int64_t{256} << 20;

// Most tokens per sequence a round graph is padded to: a verification of 15 drafts. Runs up to
// here take the split-KV verification attention, whose grid depends only on the batch, the run
// length and the table width (kernels::kMaxVerifyQueryLen), so one graph serves every context.
inline constexpr int32_t kMaxRoundGraphQueryLen = 16;

// Most round graphs captured (a bound on capture time and host memory besides the byte budget).
inline constexpr int32_t kMaxRoundGraphs = 256;

// Which captured graph a step replays. Decode graphs (q_len 1, rows 0) take one token per
// sequence and give logits row i for chunk i; round graphs (verification steps, the draft's
// catch-up chunks) pad each of `bucket` sequences' chunks to at most q_len tokens and gather
// `rows` LM-head rows through the step's logit_rows, so logits row r is the step's r-th row as in
// an eager step.
struct GraphKey {
  int32_t bucket = 0;  // padded sequences; 0: the step runs eagerly
  int32_t q_len = 1;   // longest chunk the graph holds (its attention's max_q_len)
  int32_t rows = 0;    // gathered LM-head rows; 0: a decode graph (rows are the chunks)
  // Tensor parallelism: the LM head's vocabulary merge (CudaForward::LmHead's merge_k; 0 when
  // the shards are all-gathered, always at world size 1).
  int32_t merge_k = 0;
  // 1: a sparse draft step (Vegas): one token per sequence, each attending its selection slot's
  // lists (ChunkAttention::slot) and its recent keys; captured on first use like a round graph,
  // its rows the chunks as a decode graph's.
  int32_t sparse = 0;
  bool graph() const { return bucket > 0; }
  bool decode() const { return q_len == 1 && rows == 0 && sparse == 0; }
  auto operator<=>(const GraphKey&) const = default;
};

// Byte offsets of one step's small inputs in the input region, packed for its sizes (a graph's
// padded sizes, or an eager step's real sizes), so one copy moves them all.
struct InputLayout {
  size_t slots = 0, token_ids = 0, positions = 0, seq_lens = 0, cu_q_lens = 0, logit_rows = 0;
  size_t token_seqs = 0, nsa_groups = 0;       // NSA models' (ForwardNsa); room for every token
  size_t nsa_refresh = 0, nsa_flags = 0;       // ForwardNsa's refresh_every and group_flags
  size_t sparse_slots = 0, sparse_recent = 0;  // sparse draft graphs' ForwardVegas inputs
  size_t bytes = 0;
};
InputLayout LayoutFor(int64_t num_tokens, int32_t num_seqs, int64_t num_rows);

// One prepared step: how to run it and where its logits rows are.
struct Launch {
  GraphKey key;  // graph(): replay graphs[key]
  ForwardArgs args;
  int32_t num_rows = 0;                 // logits rows the step uses
  int32_t merge_k = 0;                  // the LM head's vocabulary merge (key.merge_k for graphs)
  const int32_t* logit_rows = nullptr;  // device; graphs: [key.rows], eager: [num_rows]
};

// A verification step planned on the host before anything is queued (State::PlanVerifyLayout,
// State::PlanSampledVerify; cuda_runner_verify.cc): everything the verify kernels read that
// the host decides, so that enqueueing it (State::EnqueueSampledVerify) only uploads and
// launches. Spans of `expanded` point into `path_tokens`: a plan is filled in place, not copied.
struct VerifyPlan {
  // The ragged layout (kernels::DraftLayout) of the call's rows: row i's drafts are
  // draft_tokens[cu[i], cu[i + 1]), and its K_i + 1 positions follow the earlier rows' in the
  // expansion and in the logits buffer (a draftless row is K_i = 0: its one position).
  std::vector<int32_t> cu;            // [num_rows + 1]
  std::vector<int32_t> draft_tokens;  // [cu[num_rows]]
  int32_t max_draft_len = 0;
  bool trees = false;            // some row's chunk holds a token tree
  std::vector<int32_t> parents;  // trees: [cu[num_rows]] each draft's parent (-1: the root)
  // kSampledVerify: the positions' rows for the forward and the processed p
  // (runner_internal::ExpandSampledVerifyRows; a tree node's pending tokens in path_tokens).
  std::vector<SampleRow> expanded;
  std::vector<int32_t> path_tokens;
  // The Philox draws, keyed as SpeculationDraw says: each row's accept tests (chains:
  // kAcceptTest at num_generated + j; trees: TreeSpeculationUniform), then its next-token draw
  // (kNextToken at the round's first position).
  std::vector<float> uniforms;  // [cu[num_rows] + num_rows]
  // Where each draft's q row comes from, in layout order: copied from the speculator's rows (a
  // device, this one or a peer, or the host; adjacent rows coalesced into one copy) or, for the
  // deterministic drafts of a batch that also has sampled ones, zeroed and set one-hot. No q at
  // all (every draft deterministic): the kernels read q as one-hot at each draft.
  struct QRows {
    const char* src = nullptr;  // the source's first byte; null: zero the rows
    size_t dst = 0;             // byte offset in the q buffer
    size_t bytes = 0;
  };
  bool any_q = false;
  std::vector<QRows> q_rows;
  std::vector<const float*> q_device_sources;     // each device-resident row set's pointer (peers)
  std::vector<int32_t> onehot_rows, onehot_cols;  // the one-hot entries of the zeroed rows
};

// Decode batch sizes that get a graph: 1, 2, 4, 8, 16, 24, 32, then coarser steps, up to `cap`
// (always included). A batch runs in the smallest bucket that holds it, padded.
std::vector<int32_t> DecodeBuckets(int32_t cap);

}  // namespace cuda_runner_internal

struct CudaRunner::State {
  using GraphKey = cuda_runner_internal::GraphKey;
  using Launch = cuda_runner_internal::Launch;
  ~State();

  // cuda_runner.cc
  absl::Status SelectDevice(int32_t index);
  absl::Status LoadModel(const RunnerOptions& o);
  absl::Status AllocateBuffers();
  absl::Status SizeAndAllocateKv(const RunnerOptions& o);
  // The smallest `value` over the tensor-parallel ranks (value itself without a communicator).
  absl::StatusOr<int32_t> MinOverRanks(int32_t value);
  absl::Status Validate(std::span<const SequenceInput> batch) const;
  absl::Status Sync(const char* what) { return cuda::Check(cudaStreamSynchronize(stream), what); }

  // cuda_runner_vegas.cc: Vegas attention options (ChunkAttention) of eager steps.
  // Whether any chunk of `batch` has options (the step then runs eagerly).
  static bool HasAttention(std::span<const SequenceInput> batch);
  // Validate's checks of chunk s's options: what the CPU Model checks, plus what the kernels need.
  absl::Status ValidateAttention(size_t s, const SequenceInput& in) const;
  // Plans the options of an eager step's batch into `vegas` (segments, score buffers) and queues
  // their upload (one copy: segment lengths, index lists, counts, recent starts); points
  // launch->args at it. Nothing without options.
  absl::Status PrepareVegas(std::span<const SequenceInput> batch, Launch* launch);
  // After the forward: queues the reduction of the collected scores to head-averaged weights
  // (kernels::VegasPrefixWeights) and the one copy of those weights to the host.
  absl::Status EnqueueScoreWeights();
  // The end of a step: Sync, then the weights copied into their chunks' spans.
  absl::Status SyncStep(const char* what);
  // Selection slots (ChunkAttention::select_slot / slot): whether every chunk of `batch` attends
  // a slot (a sparse draft step that can replay a graph); the slot lists grown to hold `kept`
  // tokens a layer (allocated on first use; growing copies what they held, drops the sparse
  // graphs that embed the old lists, and synchronises); the split count of a slot-sparse
  // segment of `num_seqs` one-token chunks, fixed by the decode bucket holding num_seqs so that
  // graph and eager steps reduce alike; the ForwardVegas of a sparse graph key's padded batch.
  static bool AllSlotSparse(std::span<const SequenceInput> batch);
  absl::Status EnsureSlotLists(int64_t kept);
  int32_t SlotSplits(int32_t num_seqs) const;
  void FillSlotVegas(int32_t num_seqs, int64_t num_tokens, const int32_t* cu_q_lens,
                     const int32_t* slots, const int32_t* recent, ForwardVegas* v) const;

  // cuda_runner_trees.cc: token trees (SequenceInput::tree) of eager steps.
  bool TreesSupported() const;
  static bool HasTree(std::span<const SequenceInput> batch);
  // Validate's checks of chunk s's tree: the CPU Model's, plus what the tree masks hold.
  absl::Status ValidateTree(size_t s, const SequenceInput& in) const;
  // Plans the tree masks of an eager step's batch (tree_mask, uploaded through tree_arena) and
  // points launch->args at them. Nothing without trees.
  absl::Status PrepareTrees(std::span<const SequenceInput> batch, Launch* launch);
  // Tree verification: every row's draft parents in kernels::DraftLayout order (a chain's -1,
  // 0, 1, ...) and whether any row has a tree (*parents is left empty when none has). Rows and
  // drafts are the verify call's, already expanded (their chunks checked).
  static absl::StatusOr<bool> LayoutParents(std::span<const SequenceInput> batch,
                                            std::span<const SampleRow> rows,
                                            std::span<const std::span<const int32_t>> drafts,
                                            std::vector<int32_t>* parents);
  // cuda_runner_verify.cc: the verify calls' plans. PlanVerifyLayout: cu, draft_tokens,
  // max_draft_len, trees and parents of a verify call's rows (already expanded: their chunks
  // checked). PlanSampledVerify: kSampledVerify's argument checks and expansion, its layout,
  // uniforms and q sources (InvalidArgument naming the row, before anything is queued).
  static absl::Status PlanVerifyLayout(std::span<const SequenceInput> batch,
                                       std::span<const SampleRow> rows,
                                       std::span<const std::span<const int32_t>> drafts,
                                       cuda_runner_internal::VerifyPlan* plan);
  static absl::Status PlanSampledVerify(std::span<const SequenceInput> batch,
                                        std::span<const SampleRow> rows,
                                        std::span<const std::span<const int32_t>> drafts,
                                        std::span<const DraftProbs> probs, int64_t vocab,
                                        cuda_runner_internal::VerifyPlan* plan);
  // After the forward left p in the logits buffer: the q rows gathered (verify_q grown when
  // needed), the plan's small arrays uploaded in one copy, the one-hot scatter, the verify
  // kernel (VerifyStochastic, or VerifyTreeStochastic with trees) and the copy of its results
  // to verify_host ([max_rows] accepted, [max_rows] next, tree paths). The caller synchronises.
  absl::Status EnqueueSampledVerify(const cuda_runner_internal::VerifyPlan& plan);
  // The accept tests' uniforms of one tree row's drafts (`parents`: its drafts' parents),
  // appended: TreeSpeculationUniform at the position of each draft's depth and its rank among
  // its siblings.
  static void TreeTestUniforms(const SampleRow& row, std::span<const int32_t> parents,
                               std::vector<float>* uniforms);

  // cuda_runner_graphs.cc
  absl::Status WarmUpAndCapture();
  // The graph a validated batch with `num_rows` logits rows can replay, or an eager key: decode
  // graphs need one token per sequence and rows that are exactly the chunks in order
  // (`rows_are_chunks`); round graphs need chunks of at most kMaxRoundGraphQueryLen tokens and
  // padded sizes within the buffers. Depends only on the batch's shape and the rows' count.
  // Decode graphs exist for merge_k 0 and, under tensor parallelism, 1.
  GraphKey GraphFor(std::span<const SequenceInput> batch, size_t num_rows, bool rows_are_chunks,
                    int32_t merge_k = 0) const;
  // GraphFor's round-graph key for `num_seqs` sequences whose longest chunk has `q_len` tokens
  // and `num_rows` rows (q_len rounded up to q_len_multiple); an eager key when none fits.
  GraphKey RoundKeyFor(int32_t num_seqs, size_t q_len, size_t num_rows, int32_t merge_k) const;
  // `key` once its graph exists: a round graph is captured on first use (which synchronises and
  // overwrites the staging buffers, so call it before Prepare). An eager key when graphs are
  // off, the round-graph budget is spent, or capture ran out of memory.
  absl::StatusOr<GraphKey> EnsureGraph(GraphKey key);
  // Fills the staging buffers for `batch` and queues their upload. A graph key: the graph's
  // padded layout; eager: the real sizes, logits rows gathered from `logit_rows`.
  absl::StatusOr<Launch> Prepare(std::span<const SequenceInput> batch,
                                 std::span<const int32_t> logit_rows, GraphKey key);
  // Prepare's part for NSA models: the token -> sequence map and the groups into the staged
  // inputs `h` (laid out by `l`), their counts into `nsa`.
  void NsaLayout(std::span<const SequenceInput> batch, const GraphKey& key, int32_t padded_seqs,
                 int64_t padded_tokens, void* h, const cuda_runner_internal::InputLayout& l,
                 ForwardNsa& nsa) const;
  absl::Status Execute(const Launch& launch);
  // What a graph holds: the forward and the LM head of its padded rows.
  absl::Status RunGraphBody(const Launch& launch);
  absl::Status Capture(GraphKey key);

  int32_t device = 0;
  // GPUs this one reads draft q rows from peer to peer (EnablePeerAccessTo).
  absl::flat_hash_set<int32_t> peers_enabled;
  // cuda_runner_speculation.cc: peer access to the GPU holding `ptr`, once.
  void EnablePeerAccessTo(const void* ptr);
  std::string name;
  int32_t num_sms = 0;
  double utilization = 0.9;
  bool eager = false;
  int32_t q_len_multiple = 1;  // RunnerOptions::round_graph_q_len_multiple
  ModelConfig config;
  int32_t max_model_len = 0;
  int32_t block_size = 16;
  ForwardLimits limits;
  int32_t num_kv_blocks = 0;  // usable blocks; block num_kv_blocks is the padding scratch block
  int64_t weight_bytes = 0;
  // Tensor parallelism: this rank's shard, the group's collectives (not owned; null for one
  // rank) and whether this is a worker rank (tp.rank != 0: it stops after the logits).
  TpShard shard;
  Communicator* comm = nullptr;
  bool worker = false;

  cudaStream_t stream = nullptr;
  CudaWeights weights;
  // RunnerOptions::eagle3_head (rank 0): the head, and the residual stream it reads, captured by
  // every forward pass ([max_tokens, 3 * hidden] bf16, CudaForward::SetCapture).
  std::unique_ptr<CudaEagle3Compute> eagle3;
  cuda::DeviceMemory capture;
  // The layers `capture` holds (the head's, or RunnerOptions::capture_hidden_layers), and the
  // last pass's tokens it holds rows of (Prepare).
  std::vector<int32_t> capture_layers;
  int64_t captured_tokens = 0;
  // RunnerOptions::capture_hidden_layers without a head: CopyCapturedRows' staging of the rows
  // it copies ([max_tokens, capture_layers.size() * hidden] bf16, pinned host).
  cuda::PinnedMemory capture_host;
  // cuda_runner.cc: loads the head and allocates its buffers and the capture (before the KV);
  // CreateCapture allocates the capture for capture_hidden_layers when no head does.
  absl::Status CreateEagle3(const RunnerOptions& o);
  absl::Status CreateCapture(const RunnerOptions& o);
  absl::Status AllocateCapture(std::vector<int32_t> ids, const char* what);
  std::unique_ptr<CudaForward> forward;
  std::unique_ptr<GpuSampler> sampler;
  cuda::PinnedMemory inputs_host;  // the input region's staging twin
  cuda::DeviceMemory inputs;       // see LayoutFor
  cuda::PinnedMemory tables_host;  // [max_seqs, max_blocks_per_seq] int32
  cuda::DeviceMemory tables;       // [max_seqs, max_blocks_per_seq] int32
  std::vector<int32_t> buckets;    // ascending; empty when eager
  std::map<GraphKey, cudaGraphExec_t> graphs;
  // Round graphs (GraphKey::decode() false): how many, and the device memory their capture took
  // (free memory before minus after, so it includes cuBLASLt's or the driver's growth).
  int32_t num_round_graphs = 0;
  int64_t round_graph_bytes = 0;
  int64_t decode_graph_bytes = 0;  // the same for the decode graphs captured at load
  bool round_graphs_full = false;  // budget spent or capture out of memory: new shapes run eager
  GraphStats stats;                // replay counters (graph_stats())
  // Verification (kGreedyVerify, kSampledVerify): uploads, results on the device and read back.
  cuda::UploadArena verify_arena;
  cuda::DeviceMemory verify_out;   // [4 * max_rows + 1] int32, see StepGreedyVerify
  cuda::PinnedMemory verify_host;  // [3 * max_rows] int32: accepted, next, tree paths
  // Device speculation: the draft rows' q for StepSampledVerify (gathered, grown on demand), and
  // StepDraft's probability slots.
  cuda::DeviceMemory verify_q;    // [num drafts, vocab] f32
  cuda::DeviceMemory prob_slots;  // [num_prob_slots, vocab] f32
  int32_t num_prob_slots = 0;
  cuda::DeviceMemory kept_rows;  // [num_kept_rows, vocab] f32 (ModelRunner::ReserveKeptRows)
  int32_t num_kept_rows = 0;
  // cuda_runner_speculation.cc: ModelRunner::ReserveProbSlots / prob_slot; the draw of rows
  // [0, rows.size()) of the logits buffer, processed already (GpuSampler::EnqueueProbs), as
  // StepDraft draws them (q into slots; (*ids)[i] -1: no mass), synchronised.
  absl::Status ReserveProbSlots(int32_t n);
  const float* ProbSlot(int32_t slot) const;
  absl::Status DrawProbRows(std::span<const SampleRow> rows, std::span<const int32_t> slots,
                            std::vector<int32_t>* ids);
  // ForwardCandidates: [cand_rows, kMaxTopK] ids and log-probabilities on the device and their
  // host copy (ids then log-probabilities), and the top-k workspace of one LM-head chunk; grown
  // on demand (ReserveCandidates, in cuda_runner_speculation.cc).
  cuda::DeviceMemory cand_ids, cand_logprobs, cand_workspace;
  cuda::PinnedMemory cand_host;
  int64_t cand_rows = 0;
  absl::Status ReserveCandidates(int64_t rows);
  // The EAGLE-3 head's sampled draws through the above (CudaEagle3Compute::Options::draws).
  class Eagle3Draws;
  std::unique_ptr<CudaEagle3Compute::DeviceDraws> eagle3_draws;
  std::unique_ptr<CudaEagle3Compute::DeviceDraws> MakeEagle3Draws();
  // Token trees (cuda_runner_trees.cc): the step's masks and their uploads; MoveKv's slots;
  // tree verification's parents and paths.
  kernels::AttentionTreeMask tree_mask;
  cuda::UploadArena tree_arena;
  cuda::UploadArena move_arena;
  // Vegas (cuda_runner_vegas.cc): the step's plan, its uploads, the collected logits and split
  // statistics on the device, their head-averaged weights on the device (followed, at
  // vegas_workspace_at, by the selection's workspace) and the weights' host copy (all grown on
  // demand), and the chunks waiting for theirs.
  ForwardVegas vegas;
  cuda::UploadArena vegas_arena;
  cuda::DeviceMemory vegas_scores;   // ForwardVegas::score_logits, then score_stats
  cuda::DeviceMemory vegas_weights;  // [num_layers, num_scored, 2, score_stride] f32 + workspace
  cuda::PinnedMemory vegas_weights_host;    // the weights' copy
  const int32_t* vegas_prefixes = nullptr;  // [num_scored] int32, device (vegas_arena): prefixes
  size_t vegas_weights_bytes = 0;           // this step's weights
  size_t vegas_workspace_at = 0;            // this step's workspace: offset in vegas_weights
  size_t vegas_workspace_bytes = 0;         // and size
  struct PendingScores {
    std::span<float> dst;  // [num_layers, 2, prefix] f32, host: ChunkAttention::scores
    int32_t scored = 0;    // index among the step's scored chunks
    int32_t prefix = 0;    // keys scored
  };
  std::vector<PendingScores> pending_scores;
  // Selection slots: [num_layers, num_sparse_slots + 1, slot_stride] int32 lists and
  // [num_layers, num_sparse_slots + 1] int32 counts on the device; the last slot is the graphs'
  // padding (count 0). slot_stride 0: not allocated yet.
  int32_t num_sparse_slots = 0;
  int64_t slot_stride = 0;
  cuda::DeviceMemory slot_lists, slot_counts;
  // This step's selections into slots, one VegasSelectTopK launch per budget: its out_rows
  // ([num_scored] int32 in vegas_arena: the chunk's slot, or -1 for the others).
  struct SlotSelect {
    SelectBudget budget;
    const int32_t* out_rows = nullptr;
  };
  std::vector<SlotSelect> slot_selects;
  ForwardVegas graph_vegas;  // a sparse graph key's (Prepare), read when it is captured
};

}  // namespace specd
