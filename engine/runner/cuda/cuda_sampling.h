// Draws the next token of every sampled row on the GPU from the LM head's f32 logits: banned ids
// (min_tokens) set to -inf, penalties (repetition / presence / frequency, when any row has them),
// then argmax when every row is greedy, else temperature / min-p / top-k / top-p and a Philox
// draw keyed by (request seed, tokens drawn so far), so a seeded request repeats in any batch.
// Rows that ask for logprobs are the exception: their raw logits row is copied to the host and
// the request's CPU Sampler handles it (exact CPU semantics, including top-n logprobs and its own
// seeded RNG). Rows that ask for candidates (SampleRow::num_candidates, SSD's draft) also get
// the ids of their largest raw logits, ranked on the GPU (kernels::TopKRows). Only ids (and
// those logits rows) come back: one synchronisation per step, which the caller does between
// Enqueue and Finish. Engine thread only.
#pragma once

#include <driver_types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/runner/cuda/upload_arena.h"
#include "engine/runner/model_runner.h"

namespace specd {

class GpuSampler {
 public:
  static absl::StatusOr<std::unique_ptr<GpuSampler>> Create(int32_t max_rows, int32_t vocab);

  // Queues sampling of rows[i] from logits row i (logits: [rows.size(), vocab] f32, device,
  // modified in place) and the copies back, on `stream`. copy_ids false: the ids stay on the
  // device (device_ids(), for greedy verification), only logprobs rows come back.
  absl::Status Enqueue(float* logits, std::span<const SampleRow> rows, cudaStream_t stream,
                       bool copy_ids = true);
  // Queues, on `stream`, the processed distribution of rows[i] over logits row i, in place
  // (kernels::ProcessedProbs after bans and penalties; a row's pending tokens count as output):
  // speculation on the device reads p and q rows from there. Rows that ask for candidates get the
  // ids of the processed row's best entries (Candidates), and rows with Saguaro sampling
  // (SampleRow::saguaro_fan_out) have those ids down-weighted in the row: what the draft is then
  // drawn from. Only the raw logits of rows that ask for logprobs come back (RawRow).
  absl::Status EnqueueProbs(float* logits, std::span<const SampleRow> rows, cudaStream_t stream);
  // After EnqueueProbs and a synchronisation: row i's first n candidates (at most what the rows
  // asked for), best first; empty when none were ranked.
  std::vector<int32_t> Candidates(size_t i, int32_t n) const;
  // After EnqueueProbs and a synchronisation: row i's raw logits on the host when it asks for
  // logprobs, else empty.
  std::span<const float> RawRow(size_t i) const;
  // After the stream is synchronised: the drawn tokens, rows[i] -> (*out)[i]. Without copy_ids
  // only the rows that ask for logprobs (drawn on the host) are meaningful.
  void Finish(std::span<const SampleRow> rows, std::vector<SampleResult>* out);
  // [rows of the last Enqueue] int32, device: the ids drawn by the kernels (not those of
  // logprobs rows, which the host draws in Finish).
  const int32_t* device_ids() const { return ids_.as<int32_t>(); }

 private:
  GpuSampler(int32_t max_rows, int32_t vocab) : max_rows_(max_rows), vocab_(vocab) {}
  // What one step launches; Pack fills the upload arena.
  struct Work;
  // probs: every row gets its SamplingRow (greedy rows temperature 0), for ProcessedProbs.
  Work Pack(std::span<const SampleRow> rows, bool probs);
  // Uploads the packed inputs and queues the bans and penalties over logits rows [0, n).
  absl::Status Process(float* logits, int32_t n, const Work& w, cudaStream_t stream);
  absl::Status CopyLogprobRows(const float* logits, std::span<const SampleRow> rows,
                               cudaStream_t stream);

  int32_t max_rows_;
  int32_t vocab_;
  cuda::UploadArena arena_;
  cuda::DeviceMemory workspace_;    // penalty / sampling scratch
  cuda::DeviceMemory ids_;          // [max_rows] int32
  cuda::PinnedMemory host_ids_;     // [max_rows] int32
  cuda::PinnedMemory host_logits_;  // [num logprob rows, vocab] f32, grown on demand
  std::vector<int32_t> cpu_slot_;   // [rows of the last Enqueue] row in host_logits_, or -1
  cuda::DeviceMemory topk_workspace_;
  cuda::DeviceMemory topk_ids_;   // [max_rows, kMaxSampleCandidates] int32
  cuda::PinnedMemory host_topk_;  // the same, on the host
  int32_t topk_ = 0;              // candidates ranked per row by the last Enqueue (0: none)
};

}  // namespace specd
