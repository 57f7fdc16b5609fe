// The EAGLE-3 head on the target's GPU (Eagle3Compute for CudaRunner,
// engine/runner/eagle3_compute.h): bf16 weights (uploaded from the exact loader's,
// engine/model/eagle3_head.h, or random on the device for load_format "dummy", with the identity
// draft map), the head's one-layer paged KV cache with as many blocks as the target's (a head
// position uses the target's block table and slot: prefix-cached blocks then share the head's
// entries too), and its passes queued on the target's stream, between the target's passes, through
// the forward pass's kernels:
//   Fuse:    gather the captured rows ([tokens, 3 target hidden] bf16, CudaForward's capture),
//            fc GEMM into pool rows (one contiguous copy per run of rows).
//   Forward: embedding and hidden-input gathers, input_norm / hidden_norm side by side, the
//            2 * hidden wide qkv GEMM, RoPE + KV write, paged causal attention, o_proj, add +
//            norm, SiLU MLP, add + final norm, LM head over the draft vocabulary for the rows that
//            draw, argmax on the device; ids (and the rows the host processes) copied back once.
// Passes larger than the buffers run in pieces (a sequence's later rows see its earlier rows'
// KV). Engine thread only.
#pragma once

#include <driver_types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/model/model_config.h"
#include "engine/runner/cuda/upload_arena.h"
#include "engine/runner/eagle3_compute.h"
#include "engine/runner/model_runner.h"
#include "kernels/cuda/attention.h"

struct __nv_bfloat16;

namespace specd {

namespace kernels {
class Gemm;
struct SamplingRow;
}  // namespace kernels

class CudaEagle3Compute : public Eagle3Compute {
 public:
  // The target runner's sampled draws (CudaRunner): rows() holds max_rows() rows over the target
  // vocabulary ([rows, vocab] f32, device) that Draw turns into processed distributions and draws
  // from as ModelRunner::StepDraft does, q into the runner's probability slots.
  class DeviceDraws {
   public:
    virtual ~DeviceDraws() = default;
    virtual float* rows() = 0;
    virtual int32_t max_rows() const = 0;
    virtual absl::Status Draw(std::span<const SampleRow> rows, std::span<const int32_t> slots,
                              std::vector<int32_t>* ids) = 0;
    virtual absl::Status Reserve(int32_t n) = 0;
    virtual const float* slot(int32_t slot) const = 0;
    // Probability slots reserved (Reserve grows them, moving their storage()).
    virtual int32_t num_slots() const = 0;
    virtual const void* storage() const = 0;
    // Graph-capturable, no host work or synchronisation: rows()[0, n) turned in place into the
    // processed distributions of sampling[i] (device [n]; kernels::ProcessedProbs), row i drawn
    // with uniforms[i] (device [n]) into ids[i] (device [n]; -1: no mass) as Draw draws, and
    // copied into probability slot first_slot + i * slot_stride. scratch: [n] int32, device.
    // The caller checks that those slots are reserved.
    virtual absl::Status Enqueue(int32_t n, const kernels::SamplingRow* sampling,
                                 const float* uniforms, int32_t first_slot, int32_t slot_stride,
                                 int32_t* ids, int32_t* scratch) = 0;
  };
  struct Options {
    std::string dir;         // the head's folder
    std::string target_dir;  // the target's (its embedding when the head has none)
    bool dummy = false;      // random weights from config.json alone
    const ModelConfig* target = nullptr;
    // The target's whole token embedding on this device ([vocab, hidden] bf16), or null (a
    // tensor-parallel rank holds a shard): a head without an embedding of its own, and a dummy
    // head, use it instead of a copy.
    const __nv_bfloat16* target_embed = nullptr;
    int32_t max_tokens = 0;  // the target's step: captured rows, one Fuse, one piece of a pass
    int32_t max_seqs = 0;    // sequences of one pass: draft rows, pool regions
    int32_t max_model_len = 0;
    int32_t block_size = 16;
    int32_t num_sms = 0;
    int32_t device = 0;             // the target's GPU (selected on every call: the engine
                                    // thread also drives runners on other GPUs)
    cudaStream_t stream = nullptr;  // the target's
    bool eager = false;             // no graphs (enforce_eager)
    DeviceDraws* draws = nullptr;   // sampled drafts on the device (not owned); null: none
    // SSD's speculator (CreateStandaloneCudaEagle3Compute): no target beside it. SetHostCapture
    // (at most max_tokens rows a call) or SetDeviceCapture supplies the rows Fuse reads, the caller
    // allocates the KV blocks of its rows' block tables, and the compute owns `stream`.
    bool standalone = false;
  };
  // On the current device. InvalidArgument prefixed "EAGLE-3 head: " for a head that cannot
  // draft for the target; ResourceExhausted when its weights or buffers do not fit.
  static absl::StatusOr<std::unique_ptr<CudaEagle3Compute>> Create(const Options& options);
  ~CudaEagle3Compute() override;

  // Bytes of one KV block of the head's layer; AllocateKv(n) takes n of them.
  int64_t KvBlockBytes() const;
  absl::Status AllocateKv(int32_t num_blocks);
  // Captures the one-step graph of every batch bucket (both prenorm halves) now, so that no
  // capture lands inside a timed pass (SSD's speculator: its cache waves are such steps).
  // Needs the KV cache; a no-op with Options::eager. Returns the graphs captured.
  absl::StatusOr<int32_t> CaptureStepGraphs();
  // The target's capture: [rows, fc input] bf16 on the device (CudaForward::SetCapture).
  void set_capture(const __nv_bfloat16* capture, int64_t rows) {
    capture_ = capture;
    capture_rows_ = rows;
  }
  int64_t weight_bytes() const { return weight_bytes_; }
  // Standalone (Options::standalone): the target's config it holds, and the stream it owns.
  void AdoptTarget(ModelConfig target, cudaStream_t stream) {
    owned_target_ = std::move(target);
    options_.target = &owned_target_;
    options_.stream = stream;
    owns_stream_ = true;
  }
  int64_t buffer_bytes() const { return buffer_bytes_; }

  const Eagle3Config& config() const override { return config_; }
  std::span<const int32_t> draft_to_target() const override { return d2t_; }
  // Tree rows run eagerly with the attention's tree masks (kernels::AttentionTreeMask): a row's
  // KV goes to its slot, its RoPE position is its depth's.
  bool SupportsTrees() const override { return true; }
  // The head's KV shares the target's blocks (Eagle3Compute::ReadsPrefixCache).
  bool ReadsPrefixCache() const override { return true; }
  int32_t max_logit_rows() const override { return max_logit_rows_; }
  // kernels::TopKRows and kernels::LogSoftmaxAt over the draft vocabulary's logits rows.
  bool RanksOnDevice() const override { return true; }
  absl::Status TopCandidates(int32_t k, std::vector<int32_t>* ids,
                             std::vector<float>* logprobs) override;
  void PrefetchCandidates(int32_t k) override { prefetch_k_ = k; }
  // Chains: one captured graph runs a round's draft steps after the first, each step's draw
  // (greedy: the argmax mapped to target ids; sampled: Options::draws' Enqueue, q into the
  // slots) feeding the next; one read of the ids at the end.
  bool ChainsOnDevice() const override { return true; }
  absl::Status DraftChain(std::span<const Row> rows, int32_t steps, const ChainDraws* draws,
                          std::vector<int32_t>* ids, bool* ran) override;
  // A round in one captured graph: the catch-up (each sequence's rows front-padded to a power of
  // two of at most kMaxRoundRows, by copies of its first row that write no KV), its draw, then
  // the chained steps. Runs when every sequence has at least that many positions before its
  // catch-up.
  absl::Status DraftRound(std::span<const Row> rows, int32_t steps, const ChainDraws* draws,
                          std::vector<int32_t>* ids, bool* ran) override;
  // The same greedy round graph with every step's top k (kernels::TopKRows, LogSoftmaxAt) and
  // prenorm rows (into keep rows of table_) kept inside it, for at most kMaxRankedSeqs sequences;
  // the kept rows reach their pool rows by kernels::CopyRows after it.
  absl::Status DraftRankedRound(std::span<const Row> rows, int32_t steps, int32_t k,
                                std::span<const int32_t> keep_rows, RankedRound* out,
                                bool* ran) override;
  // Sampled drafts: kernels::ExpandColumns writes the rows over the target vocabulary into
  // Options::draws, which draws them. ReserveDrawSlots pads `seqs` to its graphs' bucket.
  bool DrawsOnDevice() const override { return options_.draws != nullptr; }
  absl::Status ReserveDrawSlots(int32_t seqs, int32_t per_seq) override;
  const float* draw_slot(int32_t slot) const override;
  absl::Status DrawRows(std::span<const int32_t> logits_rows, std::span<const SampleRow> rows,
                        std::span<const int32_t> slots, std::vector<int32_t>* ids) override;
  int32_t num_pool_regions() const override { return options_.max_seqs; }
  absl::Status Fuse(std::span<const int32_t> capture_rows,
                    std::span<const int32_t> pool_rows) override;
  absl::Status Forward(std::span<const Row> rows, std::span<const uint8_t> host_logits,
                       std::vector<int32_t>* ids, std::vector<float>* logits) override;
  // Standalone: the rows come from the host (bf16 on the device), pool rows are copied, and the
  // caller's block tables share blocks that CopyKvBlocks copies.
  bool Standalone() const override { return options_.standalone; }
  absl::Status SetHostCapture(std::span<const float> rows) override;
  bool TakesDeviceCapture() const override { return options_.standalone; }
  int64_t graphs_captured() const override {
    return static_cast<int64_t>(graphs_.size() + chain_graphs_.size() + round_graphs_.size() +
                                ranked_round_graphs_.size() + sampled_chain_graphs_.size() +
                                sampled_round_graphs_.size());
  }
  absl::Status SetDeviceCapture(const void* rows, int64_t n) override;
  absl::Status CopyHidden(std::span<const int32_t> from, std::span<const int32_t> to) override;
  bool PagedCache() const override { return options_.standalone; }
  int32_t kv_blocks() const override { return num_kv_blocks_; }
  int32_t kv_block_size() const override { return options_.block_size; }
  absl::Status CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> src_dst) override;

 private:
  struct Weights {
    const __nv_bfloat16 *embed = nullptr, *fc = nullptr, *input_norm = nullptr,
                        *hidden_norm = nullptr, *qkv = nullptr, *o = nullptr, *post_norm = nullptr,
                        *gate_up = nullptr, *down = nullptr, *norm = nullptr, *lm_head = nullptr;
  };
  // One piece's device inputs (Forward's arena, or a graph's fixed buffers).
  struct Pass {
    const int32_t *tokens = nullptr, *positions = nullptr, *hidden = nullptr;
    const int32_t *seq_lens = nullptr, *cu_q_lens = nullptr, *tables = nullptr, *rows = nullptr;
    const int64_t* slots = nullptr;
    int32_t table_stride = 0, num_groups = 0, max_q_len = 0, m = 0, logits_base = 0;
    int64_t n = 0;
    int64_t prenorm_dst = 0;  // table row of the first logits row's prenorm
    const kernels::AttentionTreeMask* tree = nullptr;  // tree rows' masks (eager pieces)
  };
  // Most steps one chained graph runs (DraftChain runs longer chains a Forward per step).
  static constexpr int32_t kMaxChainSteps = 32;
  // Most catch-up rows per sequence a round graph runs (the verification attention's longest
  // query run, kernels::kMaxVerifyQueryLen).
  static constexpr int32_t kMaxRoundRows = 16;
  // Sequences a ranked round takes (SSD's misses): its keep rows and candidates are sized by it.
  static constexpr int32_t kMaxRankedSeqs = 16;
  // Byte offsets of a graph's inputs (cuda_eagle3_graphs.cc) for `steps` steps of `seqs` rows.
  struct GraphLayout {
    GraphLayout(int64_t seqs, int32_t steps);
    int64_t seqs;
    size_t tokens, positions, hidden, seq_lens, rows, cu, slots, bytes;
  };
  // Byte offsets of a round graph's catch-up inputs (round_in_) for up to `rows` rows of up to
  // `seqs` sequences.
  struct RoundLayout {
    RoundLayout(int64_t rows, int64_t seqs);
    size_t tokens, positions, hidden, seq_lens, cu, logits_rows, slots, bytes;
  };
  explicit CudaEagle3Compute(const Options& options) : options_(options) {}
  // The kernels of one piece: embedding through the LM head of its rows that draw.
  absl::Status Body(const Pass& p);
  // A draft step (every row its sequence's only one, every row drawing on the device) through
  // the graph of its bucket; false in *ran when it must run eagerly.
  absl::Status RunStepGraph(std::span<const Row> rows, bool* ran);
  // Queues the ranking of the last pass's `m` logits rows (k best each) and their copy to
  // cand_host_; CollectCandidates reads that copy once the stream reached it.
  absl::Status EnqueueCandidates(int32_t k, int32_t m);
  void CollectCandidates(int32_t k, int32_t m, std::vector<int32_t>* ids,
                         std::vector<float>* logprobs) const;
  // Forward's prefetch (PrefetchCandidates) before its wait: ready_k_ = the k it ranked.
  absl::Status PrefetchForForward(int32_t m);
  absl::Status CaptureStepGraph(int32_t bucket, int32_t half, const Pass& p);
  // DraftRound's work, and DraftRankedRound's when ranked_k > 0 (its steps' candidates into
  // ranked_ and prenorm rows into the keep rows). *num: the sequences.
  absl::Status RunRound(std::span<const Row> rows, int32_t steps, const ChainDraws* draws,
                        int32_t ranked_k, std::vector<int32_t>* ids, int32_t* num, bool* ran);
  // DraftRound's catch-up pass: checks the groups' rows (group g starts at rows[first[g]]) and
  // queues the upload of round_in_ for them, padded to `bucket` sequences of `per_seq` rows.
  absl::StatusOr<Pass> StageRoundInputs(std::span<const Row> rows, std::span<const size_t> first,
                                        int32_t bucket, int32_t per_seq, int32_t catch_up_half);
  // Checks `rows` (one per sequence, chain rows that draw, `steps` positions each within their
  // block tables) and queues the upload of a graph's inputs for them, padded to `bucket`; step 0
  // reads its prenorm rows (Row::hidden < 0) from half `read_half`.
  absl::Status StageGraphInputs(std::span<const Row> rows, int32_t bucket, int32_t steps,
                                const GraphLayout& g, int32_t read_half);
  // Step `step` of a graph over graph_in_, writing prenorm half `half`. Its tokens: the
  // previous step's mapped ids (chain_ids_ row step - 1; step 0 reads graph_in_'s), or in a
  // round graph (after_round) chain_ids_ row `step` (row 0: the catch-up's).
  Pass GraphPass(const GraphLayout& g, int32_t bucket, int32_t step, int32_t half,
                 bool after_round = false) const;
  static size_t GraphInBytes(int64_t seqs);
  // A sampled graph's draw inputs (draw_in_): the sequences' SamplingRow [max_seqs] at 0, then
  // the uniforms of each draw, [kMaxChainSteps, max_seqs] f32, at DrawUniformsAt().
  size_t DrawUniformsAt() const;
  size_t DrawInBytes() const;
  // Checks `draws` for `num` sequences padded to `bucket` with `num_draws` draws each and queues
  // the upload of draw_in_ (padding rows greedy); false when a graph cannot make them (the slots
  // are not reserved for the padding, or the draws take more rows than the runner's). Drops the
  // sampled graphs when the slots have moved.
  absl::StatusOr<bool> StageDraws(const ChainDraws& draws, int32_t num, int32_t bucket,
                                  int32_t num_draws);
  // After a graph step's Body: its `bucket` ids into chain_ids_ row `row` (rows `seqs` apart):
  // the argmax mapped to target ids (draws null), or draw `draw` of draw_in_'s inputs with its
  // q rows in the slots.
  absl::Status PickIds(int32_t bucket, int64_t seqs, int32_t row, const ChainDraws* draws,
                       int32_t draw);
  absl::Status LoadWeights();
  absl::Status AllocateBuffers();
  // One piece of a pass: rows [begin, end) of `rows`; logits rows from logits_base on.
  absl::Status RunPiece(std::span<const Row> rows, size_t begin, size_t end, int32_t logits_base,
                        int32_t* num_logits);
  absl::Status Gemm(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t m,
                    int64_t n, int64_t k, void* y, int64_t ldy, bool f32_out);

  Options options_;
  ModelConfig owned_target_;  // standalone: the target's config (options_.target points here)
  bool owns_stream_ = false;
  int32_t num_kv_blocks_ = 0;
  // Standalone: SetHostCapture's rows on the device ([max_tokens, fc input] bf16) and their
  // host staging.
  cuda::DeviceMemory host_capture_;
  cuda::PinnedMemory host_capture_staging_;
  Eagle3Config config_;
  std::vector<int32_t> d2t_;  // draft id -> target id
  Weights w_;
  cuda::DeviceMemory weights_;
  int64_t weight_bytes_ = 0, buffer_bytes_ = 0;
  std::unique_ptr<kernels::Gemm> gemm_;
  kernels::AttentionShape shape_;
  int32_t max_blocks_per_seq_ = 0;
  int32_t max_rows_ = 0;  // rows of one piece
  const __nv_bfloat16* capture_ = nullptr;
  int64_t capture_rows_ = 0;
  // table_: [pool rows | prenorm of the logits rows, two halves of max_logit_rows_ alternating
  // by pass] x hidden.
  cuda::DeviceMemory table_;
  int64_t pool_rows_ = 0;
  int32_t prenorm_half_ = 0;                       // the half the last pass wrote
  cuda::DeviceMemory features_;                    // [max_tokens, fc input] bf16
  cuda::DeviceMemory fused_;                       // [max_tokens, hidden] bf16
  cuda::DeviceMemory e_, hin_, resid_, h_;         // [max_rows, hidden] bf16
  cuda::DeviceMemory cat_;                         // [max_rows, 2 hidden] bf16
  cuda::DeviceMemory qkv_, attn_, gate_up_, act_;  // [max_rows, ...] bf16
  cuda::DeviceMemory gathered_;                    // [max_logit_rows_, hidden] bf16
  cuda::DeviceMemory logits_;                      // [max_logit_rows_, draft vocab] f32
  cuda::DeviceMemory ids_;                         // [max_logit_rows_] int32
  cuda::PinnedMemory ids_host_;                    // [max_logit_rows_] int32
  cuda::PinnedMemory logits_host_;                 // [max_logit_rows_, draft vocab] f32
  cuda::DeviceMemory rope_, workspace_, kv_;
  __nv_bfloat16* k_cache_ = nullptr;
  __nv_bfloat16* v_cache_ = nullptr;
  // Draft-step graphs, by (bucket, the prenorm half they write): fixed inputs (graph_in_, its
  // staging twin; tables [max_seqs, max_blocks_per_seq_]) and the executables.
  std::vector<int32_t> buckets_;
  std::map<std::pair<int32_t, int32_t>, cudaGraphExec_t> graphs_;
  // Chained graphs by (bucket, steps, the half step 0 writes); each step's ids as target ids
  // ([kMaxChainSteps, max_seqs] int32, the next step's tokens) and their host copy.
  std::map<std::tuple<int32_t, int32_t, int32_t>, cudaGraphExec_t> chain_graphs_;
  cuda::DeviceMemory chain_ids_;
  cuda::PinnedMemory chain_ids_host_;
  // Round graphs by (bucket, catch-up rows per sequence, steps, the half the catch-up writes);
  // their catch-up inputs (RoundLayout) and the host twin.
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, cudaGraphExec_t> round_graphs_;
  cuda::DeviceMemory round_in_;
  cuda::PinnedMemory round_in_host_;
  // Ranked round graphs, keyed as round_graphs_ plus k; their candidates ([kMaxChainSteps,
  // kMaxRankedSeqs, kMaxTopK] draft ids, then log-probabilities) and the host twin; the keep rows
  // at table_ rows keep_base_ + step * kMaxRankedSeqs + i.
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t>, cudaGraphExec_t>
      ranked_round_graphs_;
  cuda::DeviceMemory ranked_;
  cuda::PinnedMemory ranked_host_;
  int64_t keep_base_ = 0;
  int64_t ranked_rounds_ = 0;
  std::vector<Row> round_chain_rows_;  // scratch
  // Sampled chain and round graphs, keyed as the greedy ones plus the slot layout (chains:
  // first slot, stride; rounds: stride), captured over the slots' storage draws_storage_ (a
  // move drops them).
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t>, cudaGraphExec_t>
      sampled_chain_graphs_, sampled_round_graphs_;
  const void* draws_storage_ = nullptr;
  cuda::DeviceMemory draw_in_;
  cuda::PinnedMemory draw_in_host_;
  // Rounds run by DraftRound's graphs, and DraftChain's graph launches, greedy and sampled
  // (logged at the end).
  int64_t rounds_in_graph_ = 0, chains_in_graph_ = 0;
  int64_t sampled_rounds_in_graph_ = 0, sampled_chains_in_graph_ = 0;
  cuda::DeviceMemory d2t_dev_;  // [draft vocab] int32: d2t_ on the device
  cuda::DeviceMemory graph_in_, graph_tables_;
  cuda::PinnedMemory graph_in_host_, graph_tables_host_;
  int32_t scratch_block_ = 0;             // the KV block padding rows point at
  cuda::UploadArena arena_;               // Forward's inputs
  cuda::UploadArena fuse_arena_;          // Fuse's
  std::vector<int32_t> tables_host_;      // scratch
  kernels::AttentionTreeMask tree_mask_;  // a piece's tree masks, in arena_
  int32_t last_logit_rows_ = 0;           // the last Forward's logits rows
  int32_t max_logit_rows_ = 0;            // rows one Forward may draw from (max_logit_rows())
  // TopCandidates: [max_seqs, kMaxTreeTopK] ids and log-probabilities, the top-k workspace.
  cuda::DeviceMemory cand_ids_, cand_logprobs_, topk_workspace_;
  cuda::PinnedMemory cand_host_;  // ids then log-probabilities
  int32_t prefetch_k_ = 0;        // PrefetchCandidates'
  int32_t ready_k_ = 0;           // cand_host_ holds the last Forward's rows ranked k best (0: not)
};

}  // namespace specd
