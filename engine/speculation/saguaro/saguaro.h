// The math of SSD (speculative speculative decoding, Kumar, Dao & May, ICLR 2026) and its
// Saguaro optimisations, as small pure functions and value classes: while the verifier checks
// round T's drafts, the speculator precomputes round T+1's drafts for the likeliest verification
// outcomes (k accepted, bonus token t*) and keeps them in a SpeculationCache. This file decides
// how many bonus tokens to cache per k (geometric fan-out, paper Theorem 12), learns alpha_p and
// the power-law exponent r online (OutcomeStats), shifts draft mass off cached tokens so the
// bonus token lands in the cache more often (Saguaro sampling, Theorem 15), and picks the
// fallback tier from the speedup model (Theorem 7, critical batch size b*). No I/O, no globals;
// free functions any thread, classes one thread at a time (the engine or speculator thread).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

// ---- Challenge 1: geometric fan-out -------------------------------------------------------

// alpha_p is clamped into [kMinFanOutAlpha, kMaxFanOutAlpha] before allocating: at 0 every
// position past k = 0 would get nothing, at 1 the boost (1 - alpha_p)^(-1/(1+r)) is infinite.
inline constexpr double kMinFanOutAlpha = 0.01;
inline constexpr double kMaxFanOutAlpha = 0.99;

// The real-valued Theorem 12 allocation of `budget` speculations over acceptance lengths
// k = 0..K, before rounding: F_k = F_0 * a^(k/(1+r)) for k < K and
// F_K = F_0 * a^(K/(1+r)) * (1 - a)^(-1/(1+r)), with a = alpha_p clamped as above and F_0 chosen
// so the entries sum to `budget`. [K + 1] doubles.
// InvalidArgument unless K >= 1, budget >= 1, r > 0 and finite, alpha_p not NaN.
absl::StatusOr<std::vector<double>> GeometricFanOutShares(int32_t K, int32_t budget, double alpha_p,
                                                          double r);

// GeometricFanOutShares rounded to integers by largest remainder (ties to the lower k), so the
// entries sum to exactly `budget`. When budget >= K + 1 every F_k >= 1 (each position can hit):
// a position rounded to 0 takes one speculation from the position with the most (the highest k
// among equals, which keeps F_0 >= F_1 >= ... >= F_{K-1}). With budget < K + 1 some F_k are 0.
// [K + 1] fan-outs F_0..F_K; same errors as GeometricFanOutShares.
absl::StatusOr<std::vector<int32_t>> GeometricFanOut(int32_t K, int32_t budget, double alpha_p,
                                                     double r);

// A fixed fan-out F at every acceptance length (the paper's benchmarks use F = 3; the budget is
// then (K + 1) * F). [K + 1] copies of fan_out. InvalidArgument unless K >= 1 and fan_out >= 1.
absl::StatusOr<std::vector<int32_t>> ConstantFanOut(int32_t K, int32_t fan_out);

// ---- online estimates of alpha_p and r ----------------------------------------------------

// The rank a bonus token gets when it is not among the top max_fan_out draft candidates.
inline constexpr int32_t kNotInTopF = -1;

// 0-based position of `token` in `candidates` (best first, as TopF returns them), or kNotInTopF.
int32_t BonusRank(std::span<const int32_t> candidates, int32_t token);

// No draft token at a position (k = K: every draft was accepted, nothing was drafted past them).
inline constexpr int32_t kNoDraftToken = -1;

// The bonus tokens the speculation cache holds for acceptance length k at fan-out F: the first
// fan_out ids of the draft's candidate row at position k + 1 (best first) other than the draft
// token d_{k+1} there. d_{k+1} is never the bonus token of outcome k: it was rejected, and the
// residual max(p - q, 0) is 0 wherever a draft can be rejected. min(fan_out, ids left) ids.
//   row [Fmax] candidate ids, best first; draft_token d_{k+1} or kNoDraftToken
std::vector<int32_t> CachedCandidates(std::span<const int32_t> row, int32_t draft_token,
                                      int32_t fan_out);

// The rank the power law of cache misses is fit over: the 0-based position of `token` among
// the row's ids other than the draft token (so the cache holds it at fan-out F exactly when the
// rank is below F, as CachedCandidates), or kNotInTopF.
int32_t CachedBonusRank(std::span<const int32_t> row, int32_t draft_token, int32_t token);

// One verification round of one sequence, as OutcomeStats records it.
struct RoundOutcome {
  int32_t accepted_len = 0;  // k in [0, K]: drafts the verifier kept
  // 0-based rank of the bonus token t* among the draft's candidates at position k (TopF of the
  // draft's row there, up to max_fan_out of them); kNotInTopF when t* is not among them.
  int32_t bonus_rank = kNotInTopF;
  bool cache_hit = false;  // whether the speculation cache held (k, t*) this round
  // The drafts verified this round (the round's own K, at most the options' K): a round that
  // accepted all of them saw no rejection. Negative: the options' K.
  int32_t num_draft_tokens = -1;
};

struct OutcomeStatsOptions {
  int32_t num_draft_tokens = 7;  // K
  int32_t max_fan_out = 8;       // Fmax: ranks 0..Fmax-1 are told apart; r is fit over 1..Fmax
  double prior_alpha = 0.8;      // alpha_p until min_rounds rounds (decayed) are seen
  double prior_r = 1.0;          // r until at least two fan-outs have min_misses misses each
  // Old rounds count half after this many newer ones, so the estimates follow a drifting
  // workload. 0: never forget (plain MLE over everything recorded).
  double half_life_rounds = 256;
  double min_rounds = 32;  // decayed rounds needed before alpha_p (and r) leave their priors
  double min_misses = 8;   // decayed misses a fan-out F needs to enter the r fit (log 0 aside,
                           // a few misses give a uselessly noisy log miss rate)
  double min_r = 0.05;     // the fitted r is clamped into [min_r, max_r]: fan-out needs r > 0,
  double max_r = 10.0;     // and a huge r (miss rate collapsing at F = 2) is noise
};

// InvalidArgument naming the field: K >= 1, max_fan_out >= 2 (a line needs two points),
// prior_alpha in (0, 1), 0 < min_r <= prior_r <= max_r, half_life_rounds >= 0, min_rounds >= 1
// and reachable under the decay (min_rounds <= 1 / (1 - 2^(-1/half_life))), min_misses > 0.
absl::Status ValidateOutcomeStatsOptions(const OutcomeStatsOptions& options);

// Online estimates of the two parameters the geometric fan-out needs, from observed rounds:
//  - alpha_p, the per-token acceptance rate: the MLE of a geometric distribution truncated at K,
//    accepted / (accepted + rejections), where a round with k < K counts k acceptances and one
//    rejection, and a round with k = K counts K acceptances and no rejection, K being the
//    round's own (RoundOutcome::num_draft_tokens; rounds of one stats object may differ);
//  - r, the exponent of the paper's power law for cache misses, 1 - p_hit(F) = F^(-r), where
//    p_hit(F) is the share of rounds whose bonus token ranked below F among the draft's
//    candidates. Least squares of log miss(F) against log F over F = 1..Fmax, with an intercept
//    (miss(F) = c * F^(-r)): real drafts hit at F = 1 already (c < 1), and the Theorem 12
//    allocation depends on r alone, so c is fit but never needs to be 1.
// Every sum decays by 2^(-1/half_life) per recorded round. Cumulative per-acceptance-length
// counters (never decayed) are kept for metrics. A value class; one thread at a time.
class OutcomeStats {
 public:
  // InvalidArgument as ValidateOutcomeStatsOptions.
  static absl::StatusOr<OutcomeStats> Create(const OutcomeStatsOptions& options);

  // Records one round. accepted_len is clamped into [0, the round's K]; a bonus_rank >=
  // max_fan_out (or negative) counts as kNotInTopF.
  void Record(const RoundOutcome& outcome);

  // alpha_p in [0, 1]; prior_alpha until min_rounds (decayed) rounds have been recorded.
  double Alpha() const;
  // r in [min_r, max_r]; prior_r until min_rounds rounds are recorded and at least two fan-outs
  // F in 1..Fmax have min_misses (decayed) misses each.
  double PowerLawR() const;
  // Observed share of rounds whose bonus token ranked below fan_out (decayed); fan_out in
  // 1..max_fan_out, else 0 for fan_out < 1 and the share at max_fan_out above it. 0 before any
  // round.
  double HitRate(int32_t fan_out) const;

  // Cumulative counts since creation, for metrics (Prometheus counters), indexed by k = 0..K.
  std::span<const int64_t> rounds_by_accepted_len() const { return rounds_by_len_; }    // [K + 1]
  std::span<const int64_t> cache_hits_by_accepted_len() const { return hits_by_len_; }  // [K + 1]
  int64_t num_rounds() const { return num_rounds_; }
  const OutcomeStatsOptions& options() const { return options_; }

 private:
  explicit OutcomeStats(const OutcomeStatsOptions& options);

  OutcomeStatsOptions options_;
  double decay_;                        // per-round multiplier, 1 without decay
  double rounds_ = 0;                   // decayed number of rounds
  double accepted_ = 0;                 // decayed accepted drafts
  double rejections_ = 0;               // decayed rounds that ended in a rejection
  std::vector<double> rank_weight_;     // [max_fan_out + 1] decayed rounds by bonus rank;
                                        // the last entry: not in the top max_fan_out
  std::vector<int64_t> rounds_by_len_;  // [K + 1]
  std::vector<int64_t> hits_by_len_;    // [K + 1]
  int64_t num_rounds_ = 0;
};

// ---- Challenge 2: Saguaro sampling --------------------------------------------------------

// The ids of the fan_out largest entries of `scores` (probabilities or logits), largest first,
// ties to the lower id, so the result is deterministic. min(fan_out, size) ids; empty for
// fan_out <= 0. NaN ranks below everything. Entries that tie at 0 (ids a top-k/top-p filter
// removed) are ranked by id like any other tie: drop them when only drawable ids are wanted.
//   scores [vocab]
std::vector<int32_t> TopF(std::span<const float> scores, int32_t fan_out);

// Saguaro sampling (paper section 4.2): sigma_{F,C}(z) is proportional to C * exp(z_t) for t in
// the cached top-F ids and exp(z_t) elsewhere. On a row q that is already a distribution (the
// draft's processed row: temperature, top-k, top-p, ... as ProcessedProbs makes it) this is:
// multiply the cached ids' entries by C and renormalise. The draft token is then drawn from the
// result q', and q' is what verification must be given as draft_probs: speculative sampling is
// lossless for any draft distribution as long as it is the one the draft was drawn from, so C
// changes speed (acceptance down, residual mass and thus cache hits onto the cached ids up),
// never the output distribution.
//   probs       [vocab] in/out: q, replaced by q' (entries >= 0)
//   cached_ids  [F] ids in [0, vocab); duplicates and out-of-range ids are ignored
//   downweight  C, clamped into [0, 1]; C = 1 leaves q unchanged
// When C = 0 and every bit of mass is on cached ids the row is left unchanged: the scaled row
// would be all zeros, from which no draft can be drawn, and q itself is the limit of q' as
// C -> 0 in that case. An all-zero row is left unchanged too.
void SaguaroDownweight(std::span<float> probs, std::span<const int32_t> cached_ids,
                       float downweight);

// The default down-weighting constant C for a request's temperature, used when the request
// does not set one (it is configurable per request): C = 1 for greedy (T <= 0, where the bonus
// token is the target's argmax and the draft's top-1 already predicts it well; the paper finds
// C = 1 optimal there), else clamp(1 - 0.5 * T, 0.3, 1): 0.5 at T = 1, 0.3 from T = 1.4 on.
// The paper finds C* falls with temperature but gives no closed form; this is a simple
// monotone default. NaN gives 1.
float DefaultDownweight(float temperature);

// ---- Challenge 3: speedup and the critical batch size b* ----------------------------------

// Theorem 7: expected speedup of SSD over autoregressive decoding,
//   (p_hit * E_hit + (1 - p_hit) * E_miss) / (p_hit * max(1, T_p) + (1 - p_hit) * (1 + T_b)).
// Times are in units of one verification pass: t_p is the primary speculator's time to draft a
// round (T_p), t_b the backup speculator's (T_b); e_hit / e_miss are expected tokens per round
// after a cache hit / miss (E_hit, E_miss); p_hit in [0, 1]. Preconditions: t_p, t_b >= 0 (the
// denominator is then >= 1).
double SsdSpeedup(double p_hit, double e_hit, double e_miss, double t_p, double t_b);

// Expected tokens of one standard speculative round with K drafts at per-token acceptance
// alpha (Leviathan et al.): sum_{k=0}^{K} alpha^k = (1 - alpha^(K+1)) / (1 - alpha). A sensible
// E_hit and E_miss. alpha is clamped into [0, 1].
double ExpectedTokensPerRound(double alpha, int32_t K);

// Who drafts for a sequence whose verification outcome missed the cache.
enum class FallbackTier {
  kPrimary,  // the neural draft model re-drafts: good drafts, but the whole batch waits T_p
  kBackup,   // a fast backup (n-gram, random tokens): the batch waits only T_b, poor drafts
};

// The batch model behind b* (paper section 4.3), for b sequences verified together. Each
// sequence hits independently with probability p_hit. A round cannot start until every sequence
// has drafts, so its time (in verification passes) is
//   all b hit (probability p_hit^b):  max(1, T_p)  (drafting overlapped verification; the next
//                                      cache is ready when the longer of the two ends)
//   otherwise:                         1 + T_p  (primary tier: the primary re-drafts the misses)
//                                      1 + T_b  (backup tier)
// and each sequence yields E_hit tokens after a hit and, after a miss, E_miss with the primary
// tier or E_backup with the backup tier (a backup draft is mostly rejected: about the one token
// verification always yields). Throughput is expected tokens per round over expected time per
// round (the ratio of Theorem 7); at b = 1 the backup tier's is exactly SsdSpeedup(p_hit, E_hit,
// E_backup, T_p, T_b), the primary tier's SsdSpeedup(p_hit, E_hit, E_miss, T_p, T_p).
// Out-of-range fields are clamped: p_hit into [0, 1], the rest to >= 0.
struct BatchRoundModel {
  double p_hit = 0.9;   // per-sequence cache hit probability
  double e_hit = 3.0;   // E_hit: expected tokens per sequence and round after a hit
  double e_miss = 3.0;  // E_miss: ... after a miss re-drafted by the primary speculator
  double e_backup = 1;  // E_backup: ... after a miss drafted by the backup speculator
  double t_p = 0.3;     // T_p: primary drafting time of one round, in verification passes
  double t_b = 0.01;    // T_b: backup drafting time, in verification passes
};

// Expected wall time of one round of a batch of batch_size sequences, in verification passes.
double ExpectedRoundTime(const BatchRoundModel& model, int32_t batch_size, FallbackTier tier);
// Expected tokens one round yields for the whole batch.
double ExpectedBatchTokens(const BatchRoundModel& model, int32_t batch_size, FallbackTier tier);
// ExpectedBatchTokens / ExpectedRoundTime: tokens per verification-pass time.
double BatchThroughput(const BatchRoundModel& model, int32_t batch_size, FallbackTier tier);

// kNeverSwitch: the backup tier never beats the primary one within max_batch_size.
inline constexpr int32_t kNeverSwitch = std::numeric_limits<int32_t>::max();

// b*: the smallest batch size in 1..max_batch_size at which the backup tier's throughput beats
// the primary tier's (strictly); use the backup tier for batches of b* or more. kNeverSwitch
// when there is none, e.g. p_hit = 1 (no misses), or a backup no faster than the primary.
// Both tiers' throughputs differ only through p_hit^b, which falls with b, so once the backup
// wins it keeps winning.
int32_t CriticalBatchSize(const BatchRoundModel& model, int32_t max_batch_size = 1024);

// ---- the speculation cache ----------------------------------------------------------------

// One precomputed speculation: the next round's drafts for one outcome (k, t*).
struct KeptProbs;  // engine/speculation/speculator.h

struct CachedDraft {
  std::vector<int32_t> tokens;  // [K] draft ids continuing from the outcome's context
  // [K, vocab] f32: the rows the drafts were drawn from (for sampled requests, as
  // Draft::probs); empty for greedy requests. The cache does not look inside.
  std::vector<float> probs;
  // Or the same rows kept on the draft's device (Draft::kept_probs); freed with the entry.
  std::shared_ptr<const KeptProbs> kept_probs;
  uint64_t branch_id = 0;           // the draft model's sequence holding this branch's KV
  std::vector<int32_t> candidates;  // [K, F] the draft's top ids at each drafted position
};

// S^T of the paper: per sequence, the speculations precomputed for round `round`, keyed by the
// outcome (accepted_len k, bonus token t*). Each sequence has one current round (the largest
// round it has been given); entries of older rounds are dropped when a newer round begins and
// can never hit: Lookup and Take name the round they want and miss unless it is current.
// Round numbers are the caller's (e.g. the verifier's round counter for the sequence), strictly
// increasing per sequence. One thread at a time.
class SpeculationCache {
 public:
  // Makes `round` the sequence's current round, dropping entries of older rounds. A round
  // older than the current one is ignored.
  void BeginRound(uint64_t seq_id, uint64_t round);

  // Stores the speculation for outcome (accepted_len, bonus_token) of `round`, replacing one
  // stored for the same outcome. A newer round begins that round first; an entry for an older
  // round is stale and dropped: returns false then, true when stored.
  bool Insert(uint64_t seq_id, uint64_t round, int32_t accepted_len, int32_t bonus_token,
              CachedDraft draft);

  // The speculation for the outcome if `round` is the sequence's current round and it was
  // inserted, else nullptr. The pointer is valid until the next non-const call.
  const CachedDraft* Lookup(uint64_t seq_id, uint64_t round, int32_t accepted_len,
                            int32_t bonus_token) const;

  // As Lookup, but moves the speculation out (on a hit it is used once) and removes the entry.
  std::optional<CachedDraft> Take(uint64_t seq_id, uint64_t round, int32_t accepted_len,
                                  int32_t bonus_token);

  // The bonus tokens cached for acceptance length accepted_len of the sequence's current round,
  // ascending (tests and debugging: the cache holds what the fan-out and Saguaro agree on).
  std::vector<int32_t> BonusTokens(uint64_t seq_id, int32_t accepted_len) const;

  // Drops everything of a sequence, its round counter included (it finished or was preempted).
  void Clear(uint64_t seq_id);

  int64_t num_entries(uint64_t seq_id) const;  // entries of the sequence's current round
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  struct SeqRound {
    uint64_t round = 0;
    // (accepted_len, bonus_token) -> speculation
    absl::flat_hash_map<std::pair<int32_t, int32_t>, CachedDraft> entries;
  };
  const CachedDraft* Find(uint64_t seq_id, uint64_t round, int32_t accepted_len,
                          int32_t bonus_token) const;

  absl::flat_hash_map<uint64_t, SeqRound> seqs_;
};

}  // namespace specd
