// The CUDA backend behind ModelRunner: bf16 weights (safetensors, or random on the device for
// load_format "dummy") and a paged bf16 KV cache on one GPU, the forward pass of CudaForward,
// sampling on the GPU (GpuSampler). Decode steps (one new token per sequence) replay a CUDA graph
// captured per batch-size bucket at load; steps of short chunks (verification of K drafts, the
// draft model's catch-up) replay a round graph captured on first use per (bucket, longest chunk,
// LM-head rows), each chunk padded to the longest. Their inputs live in fixed device buffers
// filled by two copies from pinned staging memory, and the only synchronisation of a step is the
// read of the sampled ids or verification results. Steps whose chunks carry attention options
// (Vegas: score collection, sparse drafting; cuda_runner_vegas.cc) run eagerly. The KV cache
// takes what gpu_memory_utilization leaves after weights, buffers and a graph reserve (or
// kv_cache_bytes). Created on any thread; then one thread at a time (it selects its device on
// every call, so the engine thread may differ from the creating one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/model_runner.h"

namespace specd {

// The standalone EAGLE-3 head of SSD's speculator on GPU `device` (cuda_eagle3.cc).
absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateStandaloneCudaEagle3Compute(
    const StandaloneEagle3Options& options, int32_t device);

// Visible CUDA devices; 0 when there is none or no driver.
int32_t CudaDeviceCount();

class CudaRunner : public ModelRunner {
 public:
  // On GPU `device`. ResourceExhausted when the weights or the smallest KV cache (one
  // max_model_len sequence) do not fit under gpu_memory_utilization; InvalidArgument for a
  // model the kernels cannot run (found by a warm-up pass) or a bad checkpoint.
  static absl::StatusOr<std::unique_ptr<CudaRunner>> Create(const RunnerOptions& options,
                                                            int32_t device);
  ~CudaRunner() override;

  const ModelConfig& config() const override;
  std::string device_name() const override;
  int32_t num_kv_blocks() const override;
  int32_t block_size() const override;
  int32_t max_model_len() const override;
  int32_t max_sample_rows() const override;
  // The Vegas kernels' longest run (kernels::kMaxVerifyQueryLen).
  int32_t max_attention_option_tokens() const override;
  int32_t num_sparse_slots() const override;

  // Every StepKind, one switch: kStep draws on the GPU; kGreedyVerify keeps the argmax ids on the
  // device and kernels::VerifyGreedyAndPack (fused ballot scan and packing of the committed
  // tokens) turns them into two ints per row, the only values read back; kForward copies the
  // logits to the host; kForwardCandidates is kernels::TopKRows and kernels::LogSoftmaxAt over
  // the logits buffer (one process); kSampledVerify and kDraft are below.
  absl::Status Run(const StepRequest& request, StepResult* result) override;
  bool RanksCandidatesOnDevice() const override;
  // EAGLE-3: the head of RunnerOptions::eagle3_head runs on this GPU (cuda_eagle3.h) and reads
  // the hidden states on the device; without a head, RunnerOptions::capture_hidden_layers sets
  // a capture aside for a consumer elsewhere (SSD's speculator). CaptureHiddenStates accepts
  // only those layers (the capture is in every graph from creation on); nothing is kept on the
  // host (captured_hidden_states() is empty): CopyCapturedRows copies the rows asked for from
  // the device (bf16, widened to f32) once the passes queued before finished.
  absl::Status CaptureHiddenStates(std::span<const int32_t> layer_ids) override;
  absl::Status CopyCapturedRows(std::span<const RowRange> ranges, int64_t width,
                                std::vector<float>* out) const override;
  // With a capture for a consumer elsewhere (no head here): the rows stay bf16 on this GPU.
  bool CapturesOnDevice() const override;
  absl::Status CopyCapturedRowsOnDevice(std::span<const RowRange> ranges, int64_t width,
                                        void* device_out) const override;
  Eagle3Compute* eagle3() override;

  // Speculation with p and q on this GPU: GpuSampler::EnqueueProbs builds the processed rows in
  // the logits buffer; kSampledVerify plans on the host (a VerifyPlan: the ragged layout, the
  // Philox uniforms, where each q row comes from; cuda_runner_verify.cc), then only enqueues
  // the copies and kernels::VerifyStochastic; a kDraft step is the zero-draft case, and
  // kernels::ScatterRows keeps the draft's rows in the probability slots.
  bool SamplesSpeculationOnDevice() const override { return true; }
  absl::Status ReserveProbSlots(int32_t n) override;
  const float* prob_slot(int32_t slot) const override;
  absl::Status ReadProbSlots(int32_t first, int32_t n, std::span<float> out) const override;
  absl::Status ReserveKeptRows(int32_t n) override;
  absl::Status KeepProbSlots(int32_t first_slot, int32_t n, int32_t first_row) override;
  absl::Status ReadKeptRows(int32_t first_row, int32_t n, std::span<float> out) const override;
  absl::Status CopyKeptRows(std::span<const RowRange> ranges, void* device_out) const override;

  // Token trees (cuda_runner_trees.cc) at world size 1 on a model without a sliding window:
  // tree chunks run eagerly with the attention's tree masks (kernels::AttentionTreeMask);
  // verification walks the trees on the device (kernels::VerifyTreeGreedy / VerifyTreeStochastic)
  // and MoveKv is kernels::MoveKvSlots.
  bool SupportsTokenTrees() const override;
  // Shared mode and reuse schedules run in the NSA kernels (per group and per token).
  bool SupportsLossySsv() const override { return true; }
  // NSA models: the totals the NSA kernels count on the device (CudaNsaAttention::LoadStats),
  // copied back now, after the work queued so far (one small synchronous copy); zeros without
  // NSA. A device error is logged, and the totals of the last copy that completed returned.
  SsvLoadStats ssv_load_stats() const override;
  absl::Status MoveKv(std::span<const KvSlotMove> moves) override;

  // Decode batch sizes with a captured graph, ascending (empty with enforce_eager).
  std::vector<int32_t> graph_batch_sizes() const;
  absl::Status CaptureRoundGraphs(int32_t max_batch, std::span<const int32_t> q_lens,
                                  bool all_rows) override;
  // Graph replays so far and the round graphs captured (tests and benchmarks check that
  // speculation rounds replay graphs; all zero with enforce_eager).
  struct GraphStats {
    int64_t decode_launches = 0;    // one token per sequence
    int64_t round_launches = 0;     // chunks padded to the longest (verification, catch-up)
    int32_t round_graphs = 0;       // captured round graphs
    int64_t round_graph_bytes = 0;  // device memory their capture took
  };
  GraphStats graph_stats() const;
  int64_t graph_launches() const {
    const GraphStats s = graph_stats();
    return s.decode_launches + s.round_launches;
  }

 private:
  struct State;  // device, model, buffers, graphs: cuda_runner_state.h
  // CopyCapturedRows(OnDevice)'s checks: a capture for a consumer, its width, ranges in the last
  // pass.
  absl::Status CheckCapturedRows(std::span<const RowRange> ranges, int64_t width,
                                 const char* what) const;
  // What EnqueueStep queues after the forward pass.
  enum class SampleMode {
    kIds,          // draws, ids copied back
    kIdsOnDevice,  // draws, ids stay on the device (greedy verification)
    kProbs,        // processed distributions in the logits buffer, nothing drawn
  };
  // Run's kinds (cuda_runner.cc: kStep, kForward, kForwardCandidates; cuda_runner_speculation.cc:
  // kGreedyVerify, kSampledVerify, kDraft).
  absl::Status DrawRows(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                        std::vector<SampleResult>* out);
  absl::Status VerifyGreedy(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                            std::span<const std::span<const int32_t>> drafts,
                            std::vector<GreedyVerifyResult>* out);
  absl::Status VerifySampled(const StepRequest& request, std::vector<GreedyVerifyResult>* out);
  absl::Status DrawDraftRows(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                             std::span<const int32_t> slots, std::vector<SampleResult>* out);
  absl::Status ForwardLogits(std::span<const SequenceInput> batch, std::vector<float>* logits);
  absl::Status RankCandidates(std::span<const SequenceInput> batch, int32_t k,
                              std::vector<int32_t>* ids, std::vector<float>* logprobs);
  // Forward's pass: `take(first, n)` after the LM head wrote rows [first, first + n) of the
  // pass's rows into the logits buffer (rows 0..n-1 there); the caller synchronises.
  absl::Status ForwardRows(std::span<const SequenceInput> batch, size_t* num_rows,
                           const std::function<absl::Status(size_t, int32_t)>& take);
  // Step up to the queued sampling; the caller synchronises.
  absl::Status EnqueueStep(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                           SampleMode mode);
  explicit CudaRunner(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
  mutable SsvLoadStats ssv_last_;  // ssv_load_stats' last totals read (engine thread)
};

}  // namespace specd
