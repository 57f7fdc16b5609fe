// The SSD speculator (Kumar, Dao & May 2026, "Saguaro"; docs/architecture.md "SSD"): the loop
// of the `specd speculator` process, which holds the draft model on its own device and talks to
// the verifier over a Channel. Each round it receives the verification outcome of every
// sequence (k accepted drafts and the bonus token t*), answers with the next drafts, and then,
// while the verifier verifies them, precomputes the drafts for the likeliest next outcomes:
//   - cache hit: the outcome (k, t*) was precomputed; its branch's KV becomes the sequence's
//     (DraftModelSpeculator::Adopt) and the drafts go back at once;
//   - miss, batch below b*: the primary draft model re-drafts (the batch waits for it);
//   - miss, batch of b* or more: the backup speculator (n-gram or random tokens) drafts at
//     once, and only this sequence pays with poor drafts (dual-tier fallback).
// A branch still drafting when the verifier's next request arrives is kept with the drafts it
// has: a hit on it resumes it (a partial hit), which costs the remaining passes, not a re-draft.
// The cache (SpeculationCache): for acceptance length k the top-F_k candidates of the draft's
// own distribution at position k + 1 (without d_{k+1}, which would have been accepted), F_k from
// the geometric fan-out with alpha_p and r estimated online (or constant F); every branch
// forks the sequence's KV (no copy) and all branches of all sequences draft together, one
// forward pass per depth. Sampled requests draw from Saguaro's down-weighted distribution
// (cached top-F ids times C) and send those rows as q, so verification stays lossless; the
// down-weighted ids are the ones the cache holds there (one F at every k, d_{k+1} aside).
// Single-threaded: Serve owns everything.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/channel.h"
#include "engine/distributed/messages.h"
#include "engine/distributed/nccl_channel.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/saguaro/saguaro.h"
#include "engine/speculation/spec_config.h"
#include "engine/speculation/ssd/cache_budget.h"
#include "engine/speculation/ssd/cache_drafter.h"
#include "engine/speculation/ssd/ssd_stats.h"

namespace specd {

// In the speculator process, all of it but the seed comes from the verifier's SsdInit
// (ssd_init.h SsdWorkerOptionsFrom).
struct SsdWorkerOptions {
  SpeculativeConfig config;    // method ssd: draft model dir, K, fan-out, backup, b*
  RunnerOptions draft;         // the draft's runner (model_dir is config.draft_model)
  int32_t max_num_seqs = 256;  // the verifier's: sizes the wire limits
  int32_t max_model_len = 0;   // the verifier's context limit (0: the draft's)
  uint64_t seed = 0x5eed;      // backup random drafts
  // config.ssd.eagle3_drafter: the head (config.eagle3_model) drafts for the target in this
  // directory, whose hidden-state rows are hidden_width floats wide.
  std::string target_model;
  int32_t hidden_width = 0;
  int32_t vocab_size = 0;  // the verifier's (0: not checked against the head's)
  // Tests: wraps the drafter the worker loads (unset: none).
  std::function<std::unique_ptr<CacheDrafter>(std::unique_ptr<CacheDrafter>)> wrap_drafter;
};

// What the worker did, cumulative (the verifier also gets per-draft status in each response).
struct SsdWorkerStats {
  int64_t rounds = 0;
  int64_t hits = 0;
  int64_t hits_partial = 0;  // of hits: branches the build had not finished, resumed
  int64_t misses_primary = 0;
  int64_t misses_backup = 0;
  int64_t branches = 0;            // cached speculations built
  int64_t budget_branches = 0;     // the last time-budgeted build's budget (0: fixed or none yet)
  int64_t device_rows = 0;         // q rows sent GPU to GPU (the device data path)
  int64_t device_hidden_rows = 0;  // target hidden rows received GPU to GPU
  int64_t offered = 0;             // cache branches sent in CacheOffers
  int64_t offer_rounds = 0;        // requests whose drafts all came from an offer (no response)
  // Seconds per stage of the round (SsdSpeculatorStage order), what the responses report.
  std::array<double, kNumSsdSpeculatorStages> stage_seconds{};
};

// The drafting times behind b*, in seconds (moving averages).
struct TierSeconds {
  double verify = 0;   // the verifier's round: from our response to its next request
  double primary = 0;  // a primary re-draft of the misses
  double backup = 0;   // a backup draft
};

// b* from what the worker measured (saguaro.h CriticalBatchSize over 1..max_batch_size): p_hit
// is the share of sequence-rounds served from the cache (stats: hits over hits and misses),
// E_hit = E_miss the expected tokens of a round of K drafts at alpha_p, E_backup 1, and the
// tiers' times in verifier rounds. kNeverSwitch while a time is unmeasured (0).
int32_t MeasuredCriticalBatchSize(const SsdWorkerStats& stats, double alpha, int32_t K,
                                  const TierSeconds& seconds, int32_t max_batch_size);

class SsdWorker {
 public:
  // Loads the draft model (its own runner and KV).
  static absl::StatusOr<std::unique_ptr<SsdWorker>> Create(const SsdWorkerOptions& options);

  // Serves rounds over a connected channel whose init is done (ssd_process.h joins the verifier)
  // until the verifier sends Shutdown (OK) or the link breaks (Unavailable). With `bulk` (the
  // device data path the init agreed on) sampled drafts' q rows go GPU to GPU on it, right
  // after the response that announces them (probs_out_of_band), whenever every served row is
  // kept on the draft's device; otherwise inline.
  // With config.ssd.cache_offers the build sends the verifier its complete greedy branches after
  // each wave (CacheOffer), and a request whose every sequence took its drafts from an offer
  // (SpeculateRequest::WantsResponse false) is handled without a response.
  absl::Status ServeChannel(Channel& channel, NcclChannel* bulk = nullptr);
  // Forgets every sequence: a verifier that just joined knows none of them.
  void DropAll();

  // One round: the response to `request`. Then BuildCache precomputes the next outcomes' drafts.
  // Public for tests (ServeChannel calls both).
  // BuildCache stops before its next forward pass once `stop` returns true (the verifier's next
  // message arrived), keeping unfinished branches for partial hits. A request that wants no
  // response (every sequence's drafts came from an offer) still fills `response`, which is not
  // sent; its stage times then ride on the next offers.
  absl::Status Handle(const SpeculateRequest& request, SpeculateResponse* response);
  // A request's hidden rows sent out of band: received from the bulk link into its buffer on
  // the draft's GPU (nullptr when the request has none); the offsets are the request's.
  absl::StatusOr<const void*> ReceiveHidden(const SpeculateRequest& request);

  absl::Status BuildCache(const std::function<bool()>& stop = {});
  // Drops a sequence (the verifier's Release).
  void Drop(uint64_t seq_id);

  const SsdWorkerStats& stats() const { return stats_; }
  // The draft model's KV blocks: free now, and all of them (tests check nothing leaks).
  int32_t draft_free_blocks() const { return draft_->num_free_blocks(); }
  int32_t draft_total_blocks() const { return draft_->num_total_blocks(); }
  int32_t vocab_size() const;
  WireLimits limits() const;
  // Where the draft runs, for logs and the verifier's SsdReady.
  std::string draft_device() const { return draft_->device_name(); }
  // Whether sampled drafts' q rows stay on the draft's device (what the device data path sends).
  bool keeps_rows_on_device() const { return draft_->keeps_rows_on_device(); }
  // Whether the drafter reads the target's hidden states on its device (an EAGLE-3 head on a
  // GPU): the device data path then brings them there.
  bool reads_hidden_on_device() const { return draft_->reads_hidden_on_device(); }
  // b* in force: the configured critical batch size, or the one the measured hit rate and
  // latencies give (saguaro.h CriticalBatchSize).
  int32_t critical_batch_size() const;
  // Tests: the online estimates and the cache.
  const OutcomeStats& outcomes() const { return outcomes_; }
  const SpeculationCache& cache() const { return cache_; }
  const TierSeconds& tier_seconds() const { return seconds_; }

 private:
  // Who served a sequence's drafts this round.
  enum class Served { kNone, kHit, kPrimary, kBackup };
  struct Seq {
    std::vector<int32_t> tokens;  // committed context, as the verifier told it
    SamplingParams params;
    TokenHistory history;
    uint64_t seed = 0;
    float saguaro_c = 1.0f;
    int32_t num_draft_tokens = 0;  // K
    int32_t fan_out = 0;           // F per acceptance length
    std::vector<int32_t> drafts;   // sent this round (<= K)
    // The draft's candidates at positions 1..num_rows (row j: position j + 1), F_max each, best
    // first; num_rows = drafts + 1 when the draft model made the drafts (after CompleteRows for a
    // sequential re-draft), 1 after the backup.
    std::vector<int32_t> candidates;
    int32_t num_rows = 0;
    Served served = Served::kNone;
    uint64_t round = 0;
  };

  // What a request sequence gets this round: its drafts (K + 1 from a cache branch or a parallel
  // draft: the last one only gives the cache a row for k = K; K from a sequential re-draft,
  // whose row for k = K CompleteRows adds), their q rows, candidates, and how. The
  // q rows are on the host (draft.probs) or, all of them, in kept rows on the draft's device
  // (`kept`, in draft order; draft.probs then empty).
  struct Result {
    Served served = Served::kNone;
    Draft draft;
    std::vector<std::shared_ptr<const KeptProbs>> kept;
  };
  // Handle's state for one request, by request index.
  struct Round {
    explicit Round(size_t num_seqs);
    std::vector<Result> results;
    std::vector<DraftInput> primary;  // the draft model's pass: misses and partial hits
    std::vector<DraftModelSpeculator::CacheDraftOptions> primary_cache;  // [primary]
    std::vector<size_t> primary_of;                                      // [primary] request index
    // Partial hits: a branch the build was still drafting when this request came; it resumes
    // from the drafts it has (its context is the outcome's, its KV holds them), in the
    // primary's pass. resume_tokens holds their contexts (DraftInputs point into it).
    std::vector<std::vector<int32_t>> resume_tokens;
    std::vector<Result> partial;
    bool any_miss = false;  // a full re-draft is in the primary's pass (b* times it)
    bool any_new = false;   // ... of a new sequence (its prompt's prefill: not timed for b*)
  };

  SsdWorker(const SsdWorkerOptions& options, std::unique_ptr<CacheDrafter> draft,
            OutcomeStats stats);
  // Handle's phases. SyncOutcome: applies the outcome the verifier sent (records it, takes the
  // cached speculation for it, extends the context); nullptr for an unknown sequence.
  Seq* SyncOutcome(const SpeculateSeq& m, std::span<const int32_t> fresh,
                   std::optional<CachedDraft>* cached);
  // Who serves request sequence i: a hit (adopting its branch; a partial one resumes in the
  // primary's pass), the backup tier or the primary.
  // Gives the drafter `m`'s hidden rows (inline, or out of band in device_hidden_) for the
  // sequence's committed `tokens`.
  absl::Status AddHidden(const SpeculateRequest& request, const SpeculateSeq& m,
                         std::span<const int32_t> tokens);
  absl::Status Triage(const SpeculateSeq& m, size_t i, const Seq& s,
                      std::optional<CachedDraft> cached, bool backup_tier, Round& round);
  // The primary's pass over the misses and partial hits.
  absl::Status DraftMisses(Round& round);
  // Drafts a sequence gets before its response goes out: K for a sequential drafter (the row
  // for k = K, one more pass, waits for CompleteRows in the build, off the verifier's wait);
  // K + 1 for a parallel draft, whose one pass draws them all.
  int32_t DraftsBeforeReply(int32_t num_draft_tokens) const;
  // BuildCache's first pass: the candidate rows the served sequences still lack (a backup's
  // k = 0 row, a sequential drafter's row for k = K).
  absl::Status CompleteRows();
  // Appends the q rows of the next drafts (`probs` on the host, or `kept` on the device) to
  // `to`'s: kept while all of them are, else all brought to the host.
  absl::Status MoveRows(std::vector<float>& probs, std::shared_ptr<const KeptProbs>& kept,
                        Result& to);
  // `r`'s kept q rows brought to the host (draft.probs), the device blocks freed.
  absl::Status HostRows(Result& r);
  void DraftBackups(const SpeculateRequest& request, Round& round);
  // The response, in request order; each sequence remembers what it was sent. With the device
  // data path, the q rows it announces out of band wait in bulk_ranges_ for SendRows.
  absl::Status Reply(const SpeculateRequest& request, Round& round, SpeculateResponse* response);
  // After the response went out: the rows it announced gathered into the link's buffer and sent.
  absl::Status SendRows();
  // BuildCache's offer of a wave's complete greedy branches (offer_), sent on channel_ when
  // cache offers are on and the verifier's next message is not in yet; `build_start` dates the
  // build for the offer's cache_build_ns.
  absl::Status SendOffer(absl::Time build_start);
  // The round's timeline (MonotonicNanos stamps of Handle's phases): the response's stage
  // times since the last response, added to stats_.
  void NoteStages(SpeculateResponse* response, int64_t triage_start, int64_t draft_start,
                  int64_t reply_start, int64_t reply_end);
  // A message just arrived on `channel`: its read and decode from its first byte is receive time.
  void NoteReceived(const Channel& channel);
  DraftInput InputFor(uint64_t seq_id, const Seq& s, std::span<const int32_t> tokens,
                      int32_t num_drafts) const;
  // What the cache asks of the sequence's drafts: F_max candidates per position, and Saguaro
  // sampling with the cache's F when the sequence is Saguaro-sampled.
  DraftModelSpeculator::CacheDraftOptions CacheOptionsFor(const Seq& s) const;
  // F: the request's fan-out, at most the candidates kept per position.
  int32_t FanOutOf(const Seq& s) const;
  // Whether the sequence's drafts are drawn with Saguaro sampling (sampled, C in [0, 1)).
  static bool SaguaroSampled(const Seq& s);
  // F_0..F_K for the sequence's cache of `budget` branches (< 0: the fixed (K + 1) * F):
  // geometric (when configured) or even over k; always F at every k under Saguaro sampling,
  // whose one top-F set per row the cache must hold.
  std::vector<int32_t> FanOut(const Seq& s, int32_t budget = -1) const;
  // Whether this round's cache is sized by the measured costs (SsdOptions::time_budget, an
  // interruptible build, the window and the waves measured).
  bool TimeBudgetReady() const;
  // The draft's candidates at position k + 1 ([f_max_], k < num_rows), and d_{k+1} there
  // (kNoDraftToken past the drafts sent).
  std::span<const int32_t> CandidateRow(const Seq& s, int32_t k) const;
  static int32_t DraftAt(const Seq& s, int32_t k);
  std::vector<int32_t> BackupDraft(const Seq& s, int32_t num_drafts);
  void ReleaseBranches(uint64_t seq_id);

  SsdWorkerOptions options_;
  std::unique_ptr<CacheDrafter> draft_;  // the draft model or the EAGLE-3 head
  OutcomeStats outcomes_;
  SpeculationCache cache_;
  absl::node_hash_map<uint64_t, Seq> seqs_;  // node: DraftInputs point into a Seq
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> branches_;  // seq -> live branch ids
  uint64_t next_branch_id_ = uint64_t{1} << 63;                    // above every verifier seq id
  std::mt19937_64 rng_;
  SsdWorkerStats stats_;
  // Measured latencies (EMA, seconds) behind b*: the verifier's round (from our response to
  // its next request), a primary re-draft, a backup draft.
  TierSeconds seconds_;
  absl::Time last_response_ = absl::InfinitePast();
  double build_seconds_ = 0;  // the last BuildCache
  // The time budget: the verifier's window (EMA of SpeculateRequest::window_ns, seconds) and
  // what the build's waves cost.
  double window_seconds_ = 0;
  int32_t window_outliers_ = 0;  // window samples left out in a row
  WaveCostModel wave_cost_;
  // Receive and reply time since the last response (ns), for the next response's timeline: the
  // messages read since, and the last response's send.
  uint64_t receive_ns_ = 0;
  uint64_t send_ns_ = 0;
  std::vector<uint64_t> served_;  // sequences of the last response, in order
  // ServeChannel's channel while it serves (cache offers go out on it), the last request's
  // round id (the offers' round_id) and, when it got no response, its stage times (the offers
  // carry them); the offer being composed.
  Channel* channel_ = nullptr;
  uint64_t offer_round_ = 0;
  struct {
    uint64_t receive = 0, triage = 0, draft = 0;
  } unanswered_ns_;
  CacheOffer offer_;
  // The device data path (ServeChannel's), and the kept rows the last response announced: their
  // ranges in send order, and the blocks holding them (alive until they are gathered).
  NcclChannel* bulk_ = nullptr;
  // The last request's hidden rows received on the draft's GPU (ReceiveHidden; null: inline or
  // none).
  const void* device_hidden_ = nullptr;
  // SPECD_SSD_TRACE=1: where the speculator's rounds went, logged every kTraceRounds rounds
  // (diagnostics for side-by-side runs; off by default).
  struct TraceSums {
    int64_t rounds = 0, misses = 0, partial = 0, primary_inputs = 0;
    double receive_hidden = 0, add_hidden = 0, draft = 0, build = 0;
    CacheDrafter::Trace draft_passes, build_passes;
  };
  static constexpr int64_t kTraceRounds = 64;
  // A cache wave cut short counts as a cost sample at its passes' rate;
  // SPECD_SSD_CUT_WAVE_SAMPLES=0 leaves it out (only complete waves count), for side-by-side
  // runs.
  bool cut_wave_samples_ = true;
  bool trace_ = false;
  TraceSums trace_sums_;
  void LogTrace();
  std::vector<ModelRunner::RowRange> bulk_ranges_;
  std::vector<std::shared_ptr<const KeptProbs>> bulk_blocks_;
  int32_t f_max_ = 0;
};

}  // namespace specd
