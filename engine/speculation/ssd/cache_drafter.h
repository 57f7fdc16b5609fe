// What drafts in SSD's speculator (ssd_worker.h): the drafter the worker re-drafts misses with and
// builds its speculation cache from. Two kinds:
//   - a draft model (DraftModelCacheDrafter over DraftModelSpeculator, sequential or parallel):
//     its own runner and paged KV, forks share KV blocks;
//   - an EAGLE-3 head (Eagle3CacheDrafter, eagle3_drafter.h): one decoder layer reading the
//     target's hidden states, which the verifier sends with each outcome (AddTargetRows).
// Both draft every sequence and branch of a call together (one forward pass per depth), report
// candidates per drafted position and draw sampled drafts with Saguaro sampling
// (DraftModelSpeculator::CacheDraftOptions). Single-threaded: the worker's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/speculator.h"

namespace specd {

class CacheDrafter {
 public:
  using CacheDraftOptions = DraftModelSpeculator::CacheDraftOptions;
  virtual ~CacheDrafter() = default;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t max_model_len() const = 0;
  virtual std::string device_name() const = 0;
  // Rows one forward pass may draw from (branches of a pass times the rows each draws).
  virtual int32_t max_rows_per_pass() const = 0;
  // A branch drafts its K + 1 rows in one pass (parallel drafting) rather than one per depth.
  virtual bool parallel() const { return false; }

  // DraftModelSpeculator's Propose with cache options and `stop` (checked before every pass).
  virtual absl::Status Propose(std::span<const DraftInput> inputs,
                               std::span<const CacheDraftOptions> cache, std::vector<Draft>* drafts,
                               const std::function<bool()>& stop) = 0;
  // SSD's branches: DraftModelSpeculator::Fork / Adopt / Release.
  virtual absl::Status Fork(uint64_t parent, uint64_t child, int32_t num_tokens) = 0;
  virtual absl::Status Adopt(uint64_t parent, uint64_t child) = 0;
  virtual void Release(uint64_t seq_id) = 0;

  // The target's hidden states of `seq_id` at positions [position, position + n) ([n, width]
  // f32), `tokens` its committed context. Only a head reads them.
  virtual absl::Status AddTargetRows(uint64_t /*seq_id*/, std::span<const int32_t> /*tokens*/,
                                     int32_t /*position*/, std::span<const float> /*rows*/) {
    return absl::OkStatus();
  }
  // The same from rows on the drafter's GPU ([n, width] bf16, valid during the call), when
  // reads_hidden_on_device() (an EAGLE-3 head on a GPU: SSD's device data path sends them).
  virtual bool reads_hidden_on_device() const { return false; }
  virtual absl::Status AddTargetRowsOnDevice(uint64_t /*seq_id*/,
                                             std::span<const int32_t> /*tokens*/,
                                             int32_t /*position*/, const void* /*rows*/,
                                             int32_t /*n*/) {
    return absl::UnimplementedError("this drafter reads no hidden states on a device");
  }
  // Before the cache's branches fork from these sequences: whatever makes their state current
  // (a head reruns the positions whose target hidden states arrived).
  virtual absl::Status PrepareForks(std::span<const uint64_t> /*seq_ids*/) {
    return absl::OkStatus();
  }

  // Sampled q rows kept on the drafter's device (DraftModelSpeculator::KeepProbsOnDevice).
  virtual bool keeps_rows_on_device() const { return false; }
  virtual absl::Status ReadKeptProbs(const KeptProbs& kept, std::vector<float>* probs) const;
  virtual absl::Status CopyKeptRows(std::span<const ModelRunner::RowRange> ranges, void* dst) const;

  // The drafter's own counters since the last call (SPECD_SSD_TRACE=1's log lines; zero where
  // it keeps none): Propose's passes and their rows, and seconds in them.
  struct Trace {
    int64_t passes = 0, rows = 0;
    int64_t rounds = 0;  // passes that ran as one round on the device (a head's ranked rounds)
    double forward = 0, candidates = 0, copies = 0;
    void Add(const Trace& t) {
      passes += t.passes;
      rounds += t.rounds;
      rows += t.rows;
      forward += t.forward;
      candidates += t.candidates;
      copies += t.copies;
    }
  };
  virtual Trace TakeTrace() { return {}; }
  // CUDA graphs captured so far (a pass that captured one took many times its replay: the
  // worker's b* leaves such a pass out of its timings); 0 where the drafter captures none.
  virtual int64_t graphs_captured() const { return 0; }
  // Turns the counters on (off by default: the timing stays out of the passes).
  virtual void set_trace(bool /*on*/) {}

  // KV blocks free and in all (tests check nothing leaks); 0 where the drafter has none.
  virtual int32_t num_free_blocks() const { return 0; }
  virtual int32_t num_total_blocks() const { return 0; }
};

// The draft model's drafter.
class DraftModelCacheDrafter : public CacheDrafter {
 public:
  explicit DraftModelCacheDrafter(std::unique_ptr<DraftModelSpeculator> draft)
      : draft_(std::move(draft)) {}

  int32_t vocab_size() const override { return draft_->runner().config().vocab_size; }
  int32_t max_model_len() const override { return draft_->runner().max_model_len(); }
  std::string device_name() const override { return draft_->runner().device_name(); }
  int32_t max_rows_per_pass() const override { return draft_->runner().max_sample_rows(); }
  bool parallel() const override { return draft_->parallel(); }
  absl::Status Propose(std::span<const DraftInput> inputs, std::span<const CacheDraftOptions> cache,
                       std::vector<Draft>* drafts, const std::function<bool()>& stop) override {
    return draft_->Propose(inputs, cache, drafts, stop);
  }
  absl::Status Fork(uint64_t parent, uint64_t child, int32_t num_tokens) override {
    return draft_->Fork(parent, child, num_tokens);
  }
  absl::Status Adopt(uint64_t parent, uint64_t child) override {
    return draft_->Adopt(parent, child);
  }
  void Release(uint64_t seq_id) override { draft_->Release(seq_id); }
  bool keeps_rows_on_device() const override {
    return draft_->runner().SamplesSpeculationOnDevice();
  }
  absl::Status ReadKeptProbs(const KeptProbs& kept, std::vector<float>* probs) const override {
    return draft_->ReadKeptProbs(kept, probs);
  }
  absl::Status CopyKeptRows(std::span<const ModelRunner::RowRange> ranges,
                            void* dst) const override {
    return draft_->runner().CopyKeptRows(ranges, dst);
  }
  int32_t num_free_blocks() const override { return draft_->num_free_blocks(); }
  int32_t num_total_blocks() const override { return draft_->runner().num_kv_blocks(); }

  DraftModelSpeculator& draft() { return *draft_; }

 private:
  std::unique_ptr<DraftModelSpeculator> draft_;
};

struct SsdWorkerOptions;
// The draft model's settings in SSD (ssd_worker.cc's constants).
struct DraftModelDrafterOptions {
  int32_t max_branches_per_pass = 64;   // rows of the cache's waves: graphs captured for them
  int32_t wave_query_len_multiple = 4;  // RunnerOptions::round_graph_q_len_multiple
  int64_t kept_rows_bytes = 0;          // device memory for sampled branches' q rows
  int32_t max_candidates = 16;          // branches per acceptance length at most
};
// Loads options.config.draft_model on its runner (options.draft), captures its waves' round
// graphs, and sets parallel drafting, replay and kept q rows as the config asks.
absl::StatusOr<std::unique_ptr<CacheDrafter>> CreateDraftModelCacheDrafter(
    const SsdWorkerOptions& options, const DraftModelDrafterOptions& d);

}  // namespace specd
