#include "engine/speculation/saguaro/saguaro.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/ref/sampling.h"

namespace specd {
namespace {

absl::Status ValidateFanOutArgs(int32_t K, int32_t budget, double alpha_p, double r) {
  if (K < 1) return absl::InvalidArgumentError(absl::StrCat("fan-out: K must be >= 1, got ", K));
  if (budget < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fan-out: budget must be >= 1, got ", budget));
  }
  if (std::isnan(alpha_p)) return absl::InvalidArgumentError("fan-out: alpha_p is NaN");
  if (!(r > 0) || !std::isfinite(r)) {
    return absl::InvalidArgumentError(absl::StrCat("fan-out: r must be finite and > 0, got ", r));
  }
  return absl::OkStatus();
}

// Largest-remainder (Hamilton) rounding of non-negative shares that sum to `total`: floors,
// then one more for the largest remainders (ties to the lower index) until the sum is `total`.
std::vector<int32_t> RoundLargestRemainder(const std::vector<double>& shares, int32_t total) {
  std::vector<int32_t> counts(shares.size());
  int64_t assigned = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    counts[i] = static_cast<int32_t>(std::floor(shares[i]));
    assigned += counts[i];
  }
  std::vector<size_t> order(shares.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return shares[a] - counts[a] > shares[b] - counts[b];
  });
  // Floors never exceed the shares, so at most shares.size() units remain (fewer by rounding).
  for (size_t i = 0; assigned < total; i = (i + 1) % order.size(), ++assigned) ++counts[order[i]];
  return counts;
}

// Lifts every zero count to 1 by taking one from the largest count (the highest index among
// equals). Needs sum(counts) >= counts.size(), which guarantees a count >= 2 while a zero remains.
void EnsureEachAtLeastOne(std::vector<int32_t>& counts) {
  for (int32_t& c : counts) {
    if (c > 0) continue;
    size_t donor = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] >= counts[donor]) donor = i;
    }
    --counts[donor];
    c = 1;
  }
}

BatchRoundModel Clamped(const BatchRoundModel& m) {
  BatchRoundModel c = m;
  c.p_hit = std::clamp(std::isnan(m.p_hit) ? 0.0 : m.p_hit, 0.0, 1.0);
  for (double* v : {&c.e_hit, &c.e_miss, &c.e_backup, &c.t_p, &c.t_b}) {
    *v = std::isnan(*v) ? 0.0 : std::max(*v, 0.0);
  }
  return c;
}

}  // namespace

// ---- fan-out ------------------------------------------------------------------------------

absl::StatusOr<std::vector<double>> GeometricFanOutShares(int32_t K, int32_t budget, double alpha_p,
                                                          double r) {
  if (absl::Status s = ValidateFanOutArgs(K, budget, alpha_p, r); !s.ok()) return s;
  const double a = std::clamp(alpha_p, kMinFanOutAlpha, kMaxFanOutAlpha);
  const double e = 1.0 / (1.0 + r);
  std::vector<double> shares(K + 1);
  for (int32_t k = 0; k < K; ++k) shares[k] = std::pow(a, k * e);
  // All K accepted: the bonus token comes from the sharper target distribution p_K, not a
  // residual, so it is easier to predict and the position gets the (1 - a)^(-1/(1+r)) boost.
  shares[K] = std::pow(a, K * e) * std::pow(1.0 - a, -e);
  const double sum = std::accumulate(shares.begin(), shares.end(), 0.0);
  for (double& s : shares) s *= budget / sum;
  return shares;
}

absl::StatusOr<std::vector<int32_t>> GeometricFanOut(int32_t K, int32_t budget, double alpha_p,
                                                     double r) {
  absl::StatusOr<std::vector<double>> shares = GeometricFanOutShares(K, budget, alpha_p, r);
  if (!shares.ok()) return shares.status();
  std::vector<int32_t> fan_out = RoundLargestRemainder(*shares, budget);
  if (budget >= K + 1) EnsureEachAtLeastOne(fan_out);
  return fan_out;
}

absl::StatusOr<std::vector<int32_t>> ConstantFanOut(int32_t K, int32_t fan_out) {
  if (K < 1) return absl::InvalidArgumentError(absl::StrCat("fan-out: K must be >= 1, got ", K));
  if (fan_out < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fan-out: F must be >= 1, got ", fan_out));
  }
  return std::vector<int32_t>(K + 1, fan_out);
}

// ---- OutcomeStats -------------------------------------------------------------------------

int32_t BonusRank(std::span<const int32_t> candidates, int32_t token) {
  const auto it = std::find(candidates.begin(), candidates.end(), token);
  return it == candidates.end() ? kNotInTopF : static_cast<int32_t>(it - candidates.begin());
}

std::vector<int32_t> CachedCandidates(std::span<const int32_t> row, int32_t draft_token,
                                      int32_t fan_out) {
  std::vector<int32_t> ids;
  for (int32_t t : row) {
    if (static_cast<int32_t>(ids.size()) >= fan_out) break;
    if (t != draft_token) ids.push_back(t);
  }
  return ids;
}

int32_t CachedBonusRank(std::span<const int32_t> row, int32_t draft_token, int32_t token) {
  if (token == draft_token) return kNotInTopF;
  const int32_t rank = BonusRank(row, token);
  if (rank == kNotInTopF) return kNotInTopF;
  const auto before = row.first(static_cast<size_t>(rank));
  return std::find(before.begin(), before.end(), draft_token) == before.end() ? rank : rank - 1;
}

absl::Status ValidateOutcomeStatsOptions(const OutcomeStatsOptions& o) {
  auto bad = [](const char* field, double value) {
    return absl::InvalidArgumentError(absl::StrCat("outcome stats: bad ", field, ": ", value));
  };
  if (o.num_draft_tokens < 1) return bad("num_draft_tokens (>= 1)", o.num_draft_tokens);
  if (o.max_fan_out < 2) return bad("max_fan_out (>= 2)", o.max_fan_out);
  if (!(o.prior_alpha > 0 && o.prior_alpha < 1)) {
    return bad("prior_alpha (in (0, 1))", o.prior_alpha);
  }
  if (!(o.min_r > 0)) return bad("min_r (> 0)", o.min_r);
  if (!(o.max_r >= o.min_r) || !std::isfinite(o.max_r)) return bad("max_r (>= min_r)", o.max_r);
  if (!(o.prior_r >= o.min_r && o.prior_r <= o.max_r)) {
    return bad("prior_r (in [min_r, max_r])", o.prior_r);
  }
  if (!(o.half_life_rounds >= 0) || !std::isfinite(o.half_life_rounds)) {
    return bad("half_life_rounds (>= 0)", o.half_life_rounds);
  }
  if (!(o.min_misses > 0)) return bad("min_misses (> 0)", o.min_misses);
  if (!(o.min_rounds >= 1)) return bad("min_rounds (>= 1)", o.min_rounds);
  if (o.half_life_rounds > 0) {
    // Under decay the weight of all rounds ever seen approaches 1 / (1 - decay) from below.
    const double ceiling = 1.0 / (1.0 - std::exp2(-1.0 / o.half_life_rounds));
    if (o.min_rounds >= ceiling) {
      return bad("min_rounds (unreachable under the half-life)", o.min_rounds);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OutcomeStats> OutcomeStats::Create(const OutcomeStatsOptions& options) {
  if (absl::Status s = ValidateOutcomeStatsOptions(options); !s.ok()) return s;
  return OutcomeStats(options);
}

OutcomeStats::OutcomeStats(const OutcomeStatsOptions& options)
    : options_(options),
      decay_(options.half_life_rounds > 0 ? std::exp2(-1.0 / options.half_life_rounds) : 1.0),
      rank_weight_(options.max_fan_out + 1, 0.0),
      rounds_by_len_(options.num_draft_tokens + 1, 0),
      hits_by_len_(options.num_draft_tokens + 1, 0) {}

void OutcomeStats::Record(const RoundOutcome& outcome) {
  const int32_t K = options_.num_draft_tokens;
  rounds_ = rounds_ * decay_ + 1;
  accepted_ *= decay_;
  rejections_ *= decay_;
  for (double& w : rank_weight_) w *= decay_;

  // The round's own K: the options' K is only the largest any round may have.
  const int32_t round_k = outcome.num_draft_tokens < 0 ? K : std::min(outcome.num_draft_tokens, K);
  const int32_t k = std::clamp(outcome.accepted_len, 0, round_k);
  accepted_ += k;
  if (k < round_k) rejections_ += 1;  // all accepted: no rejection was observed (truncation)
  const bool ranked = outcome.bonus_rank >= 0 && outcome.bonus_rank < options_.max_fan_out;
  rank_weight_[ranked ? outcome.bonus_rank : options_.max_fan_out] += 1;

  ++num_rounds_;
  ++rounds_by_len_[k];
  if (outcome.cache_hit) ++hits_by_len_[k];
}

double OutcomeStats::Alpha() const {
  const double trials = accepted_ + rejections_;
  if (rounds_ < options_.min_rounds || trials <= 0) return options_.prior_alpha;
  return std::clamp(accepted_ / trials, 0.0, 1.0);
}

double OutcomeStats::HitRate(int32_t fan_out) const {
  if (rounds_ <= 0 || fan_out < 1) return 0;
  const int32_t f = std::min(fan_out, options_.max_fan_out);
  const double hits = std::accumulate(rank_weight_.begin(), rank_weight_.begin() + f, 0.0);
  return std::clamp(hits / rounds_, 0.0, 1.0);
}

double OutcomeStats::PowerLawR() const {
  if (rounds_ < options_.min_rounds) return options_.prior_r;
  // Points (log F, log miss(F)); miss(F) = weight of ranks >= F (the last bucket: not in the
  // top Fmax) over all rounds. Summed from the tail so small miss weights stay exact.
  std::vector<std::pair<double, double>> points;
  double misses = 0;
  for (int32_t f = options_.max_fan_out; f >= 1; --f) {
    misses += rank_weight_[f];
    if (misses >= options_.min_misses) points.emplace_back(std::log(f), std::log(misses / rounds_));
  }
  if (points.size() < 2) return options_.prior_r;
  double mean_x = 0, mean_y = 0;
  for (const auto& [x, y] : points) {
    mean_x += x;
    mean_y += y;
  }
  mean_x /= points.size();
  mean_y /= points.size();
  double sxy = 0, sxx = 0;
  for (const auto& [x, y] : points) {
    sxy += (x - mean_x) * (y - mean_y);
    sxx += (x - mean_x) * (x - mean_x);
  }
  return std::clamp(-sxy / sxx, options_.min_r, options_.max_r);
}

// ---- Saguaro sampling ---------------------------------------------------------------------

std::vector<int32_t> TopF(std::span<const float> scores, int32_t fan_out) {
  const size_t n = std::min<size_t>(std::max(fan_out, 0), scores.size());
  if (n == 0) return {};
  std::vector<int32_t> top(n);  // the ranking the GPU's TopKRows reproduces bit for bit
  const auto vocab = static_cast<int32_t>(scores.size());
  kernels::ref::TopKRows(scores.data(), vocab, 1, vocab, static_cast<int32_t>(n), top.data());
  return top;
}

void SaguaroDownweight(std::span<float> probs, std::span<const int32_t> cached_ids,
                       float downweight) {
  // One row of the kernels' reference (kernels/ref/sampling.h SaguaroDownweightRows).
  const auto fan_out = static_cast<int32_t>(cached_ids.size());
  kernels::ref::SaguaroDownweightRows(probs.data(), static_cast<int64_t>(probs.size()), 1,
                                      static_cast<int32_t>(probs.size()), cached_ids.data(),
                                      fan_out, &fan_out, &downweight);
}

float DefaultDownweight(float temperature) {
  if (std::isnan(temperature) || temperature <= 0.0f) return 1.0f;
  return std::clamp(1.0f - 0.5f * temperature, 0.3f, 1.0f);
}

// ---- speedup and b* -----------------------------------------------------------------------

double SsdSpeedup(double p_hit, double e_hit, double e_miss, double t_p, double t_b) {
  const double tokens = p_hit * e_hit + (1 - p_hit) * e_miss;
  const double time = p_hit * std::max(1.0, t_p) + (1 - p_hit) * (1 + t_b);
  return tokens / time;
}

double ExpectedTokensPerRound(double alpha, int32_t K) {
  const double a = std::clamp(std::isnan(alpha) ? 0.0 : alpha, 0.0, 1.0);
  double sum = 0, term = 1;
  for (int32_t k = 0; k <= std::max(K, 0); ++k, term *= a) sum += term;
  return sum;
}

double ExpectedRoundTime(const BatchRoundModel& model, int32_t batch_size, FallbackTier tier) {
  const BatchRoundModel m = Clamped(model);
  const double all_hit = std::pow(m.p_hit, std::max(batch_size, 1));
  const double miss_time = 1 + (tier == FallbackTier::kPrimary ? m.t_p : m.t_b);
  return all_hit * std::max(1.0, m.t_p) + (1 - all_hit) * miss_time;
}

double ExpectedBatchTokens(const BatchRoundModel& model, int32_t batch_size, FallbackTier tier) {
  const BatchRoundModel m = Clamped(model);
  const double e_fallback = tier == FallbackTier::kPrimary ? m.e_miss : m.e_backup;
  return std::max(batch_size, 1) * (m.p_hit * m.e_hit + (1 - m.p_hit) * e_fallback);
}

double BatchThroughput(const BatchRoundModel& model, int32_t batch_size, FallbackTier tier) {
  return ExpectedBatchTokens(model, batch_size, tier) /
         ExpectedRoundTime(model, batch_size, tier);  // time >= 1
}

int32_t CriticalBatchSize(const BatchRoundModel& model, int32_t max_batch_size) {
  for (int32_t b = 1; b <= max_batch_size; ++b) {
    const double primary = BatchThroughput(model, b, FallbackTier::kPrimary);
    const double backup = BatchThroughput(model, b, FallbackTier::kBackup);
    if (backup > primary * (1 + 1e-12)) return b;  // margin: equal tiers never "win" by rounding
  }
  return kNeverSwitch;
}

// ---- SpeculationCache ---------------------------------------------------------------------

void SpeculationCache::BeginRound(uint64_t seq_id, uint64_t round) {
  const auto [it, inserted] = seqs_.try_emplace(seq_id);
  if (inserted || round > it->second.round) {
    it->second.round = round;
    it->second.entries.clear();
  }
}

bool SpeculationCache::Insert(uint64_t seq_id, uint64_t round, int32_t accepted_len,
                              int32_t bonus_token, CachedDraft draft) {
  BeginRound(seq_id, round);
  SeqRound& seq = seqs_.at(seq_id);
  if (seq.round != round) return false;  // stale: an older round finished long ago
  seq.entries.insert_or_assign(std::make_pair(accepted_len, bonus_token), std::move(draft));
  return true;
}

const CachedDraft* SpeculationCache::Find(uint64_t seq_id, uint64_t round, int32_t accepted_len,
                                          int32_t bonus_token) const {
  const auto seq = seqs_.find(seq_id);
  if (seq == seqs_.end() || seq->second.round != round) return nullptr;
  const auto entry = seq->second.entries.find(std::make_pair(accepted_len, bonus_token));
  return entry == seq->second.entries.end() ? nullptr : &entry->second;
}

const CachedDraft* SpeculationCache::Lookup(uint64_t seq_id, uint64_t round, int32_t accepted_len,
                                            int32_t bonus_token) const {
  return Find(seq_id, round, accepted_len, bonus_token);
}

std::optional<CachedDraft> SpeculationCache::Take(uint64_t seq_id, uint64_t round,
                                                  int32_t accepted_len, int32_t bonus_token) {
  if (Find(seq_id, round, accepted_len, bonus_token) == nullptr) return std::nullopt;
  auto& entries = seqs_.at(seq_id).entries;
  auto node = entries.extract(std::make_pair(accepted_len, bonus_token));
  return std::move(node.mapped());
}

std::vector<int32_t> SpeculationCache::BonusTokens(uint64_t seq_id, int32_t accepted_len) const {
  std::vector<int32_t> tokens;
  const auto seq = seqs_.find(seq_id);
  if (seq == seqs_.end()) return tokens;
  for (const auto& [outcome, draft] : seq->second.entries) {
    if (outcome.first == accepted_len) tokens.push_back(outcome.second);
  }
  std::sort(tokens.begin(), tokens.end());
  return tokens;
}

void SpeculationCache::Clear(uint64_t seq_id) { seqs_.erase(seq_id); }

int64_t SpeculationCache::num_entries(uint64_t seq_id) const {
  const auto seq = seqs_.find(seq_id);
  return seq == seqs_.end() ? 0 : static_cast<int64_t>(seq->second.entries.size());
}

}  // namespace specd
