#include "engine/speculation/ssd/ssd_worker.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/monotonic_clock.h"
#include "engine/base/status.h"
#include "engine/speculation/ngram.h"
#include "engine/speculation/ssd/cache_budget.h"
#include "engine/speculation/ssd/eagle3_drafter.h"
#include "engine/speculation/ssd/ssd_protocol.h"

namespace specd {
namespace {

// Most candidates kept per drafted position: the largest fan-out the geometric allocation can
// give one acceptance length is bounded by the budget, but the online fit of r only looks at
// the first few ranks, and more candidates cost host work per position.
constexpr int32_t kMaxCandidates = 16;

// Most branches drafted together in one forward pass of the cache build. A draft model's decode
// step costs about the same for 1 or a few dozen rows (it reads its weights once), so branches
// of every candidate rank share passes up to this many rows; beyond it, waves go by rank.
constexpr size_t kMaxBranchesPerPass = 64;
// A wave's offer fits one CacheOffer.
static_assert(kMaxBranchesPerPass <= kMaxOfferDrafts);
// The draft runner's round graphs round chunk lengths up to a multiple of this.
constexpr int32_t kWaveQueryLenMultiple = 4;
// Device memory for the cache's sampled q rows (DraftModelSpeculator::KeepProbsOnDevice): 1 GiB
// holds 256 branches of K 7 over a 128K vocabulary; branches past it keep theirs on the host.
constexpr int64_t kKeptRowsBytes = int64_t{1} << 30;

// SplitMix64's finaliser: seeds of different branches (or requests) must give unrelated draft
// streams; XOR of nearby integers collides (1000 ^ 1 == 1002 ^ 3).
uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Exponential moving average with weight 1/8 for the newest sample.
void Ema(double* avg, double sample) { *avg = *avg == 0 ? sample : *avg + (sample - *avg) / 8; }

// The share of the verifier's window the build plans for: a wave still running when the
// verifier's next request arrives delays the answer to it. With cache offers less: an offer
// must be in before the verifier's next round starts, and one that comes late costs that round
// a request and its response (a wave cut short costs only its remaining passes).
constexpr double kWindowShare = 0.9;
constexpr double kOfferWindowShare = 0.8;

}  // namespace

absl::StatusOr<std::unique_ptr<SsdWorker>> SsdWorker::Create(const SsdWorkerOptions& options) {
  const SpeculativeConfig& c = options.config;
  std::unique_ptr<CacheDrafter> draft;
  if (c.ssd.eagle3_drafter) {
    if (c.eagle3_model.empty() || options.target_model.empty() || options.hidden_width <= 0) {
      return absl::InvalidArgumentError(
          "ssd speculator: an EAGLE-3 head needs its and the target's directories and the "
          "width of the target's hidden-state rows");
    }
    SPECD_ASSIGN_OR_RETURN(
        std::unique_ptr<Eagle3CacheDrafter> head,
        CreateEagle3CacheDrafter(c.eagle3_model, options.target_model, options.draft.device,
                                 options.vocab_size,
                                 options.max_model_len > 0 ? options.max_model_len : 2048,
                                 options.draft.load_format == "dummy", c.draft_kv_cache_bytes));
    if (c.replay.enabled()) {
      SPECD_ASSIGN_OR_RETURN(std::unique_ptr<DraftReplay> replay,
                             DraftReplay::Load(c.replay, head->vocab_size()));
      SPECD_LOG_WARN(
          "ssd speculator: the head drafts in replay mode (controlled acceptance "
          "alpha {}): a benchmark setting",
          c.replay.alpha);
      head->set_replay(std::move(replay));
    }
    draft = std::move(head);
  } else {
    DraftModelDrafterOptions d;
    d.max_branches_per_pass = static_cast<int32_t>(kMaxBranchesPerPass);
    d.wave_query_len_multiple = kWaveQueryLenMultiple;
    d.kept_rows_bytes = kKeptRowsBytes;
    d.max_candidates = kMaxCandidates;
    SPECD_ASSIGN_OR_RETURN(draft, CreateDraftModelCacheDrafter(options, d));
  }
  if (options.wrap_drafter) draft = options.wrap_drafter(std::move(draft));
  OutcomeStatsOptions o;
  o.num_draft_tokens = kMaxSpeculativeTokens;  // per-k counters for any K a request asks for
  // A time budget may give one acceptance length up to kMaxCandidates branches.
  o.max_fan_out = c.ssd.time_budget && !c.ssd.complete_cache
                      ? kMaxCandidates
                      : std::min(kMaxCandidates, std::max(2, c.ssd.fan_out * 2));
  SPECD_ASSIGN_OR_RETURN(OutcomeStats stats, OutcomeStats::Create(o));
  return std::unique_ptr<SsdWorker>(new SsdWorker(options, std::move(draft), std::move(stats)));
}

SsdWorker::SsdWorker(const SsdWorkerOptions& options, std::unique_ptr<CacheDrafter> draft,
                     OutcomeStats stats)
    : options_(options), draft_(std::move(draft)), outcomes_(std::move(stats)), rng_(options.seed) {
  f_max_ = outcomes_.options().max_fan_out;
  const char* trace = std::getenv("SPECD_SSD_TRACE");
  trace_ = trace != nullptr && std::string_view(trace) == "1";
  draft_->set_trace(trace_);
  const char* cut = std::getenv("SPECD_SSD_CUT_WAVE_SAMPLES");
  cut_wave_samples_ = cut == nullptr || std::string_view(cut) != "0";
}

int32_t SsdWorker::vocab_size() const { return draft_->vocab_size(); }

WireLimits SsdWorker::limits() const {
  const int32_t len = options_.max_model_len > 0 ? options_.max_model_len : draft_->max_model_len();
  return SsdWireLimits(vocab_size(), options_.max_num_seqs, len,
                       options_.config.ssd.eagle3_drafter ? options_.hidden_width : 0);
}

int32_t MeasuredCriticalBatchSize(const SsdWorkerStats& stats, double alpha, int32_t K,
                                  const TierSeconds& seconds, int32_t max_batch_size) {
  if (seconds.verify <= 0 || seconds.primary <= 0) return kNeverSwitch;
  BatchRoundModel m;
  // Per sequence-round: stats.rounds counts requests, each of up to a batch of sequences.
  const int64_t served = stats.hits + stats.misses_primary + stats.misses_backup;
  m.p_hit = served > 0 ? double(stats.hits) / double(served) : 0.0;
  m.e_hit = m.e_miss = ExpectedTokensPerRound(alpha, K);
  m.e_backup = 1.0;
  m.t_p = seconds.primary / seconds.verify;
  m.t_b = seconds.backup / seconds.verify;
  return CriticalBatchSize(m, max_batch_size);
}

int32_t SsdWorker::critical_batch_size() const {
  if (options_.config.ssd.critical_batch_size > 0) return options_.config.ssd.critical_batch_size;
  if (outcomes_.num_rounds() < 16) return kNeverSwitch;  // the primary serves misses meanwhile
  return MeasuredCriticalBatchSize(stats_, outcomes_.Alpha(),
                                   options_.config.num_speculative_tokens, seconds_,
                                   options_.max_num_seqs);
}

int32_t SsdWorker::FanOutOf(const Seq& s) const { return std::clamp(s.fan_out, 1, f_max_); }

bool SsdWorker::SaguaroSampled(const Seq& s) {
  return !s.params.greedy() && s.saguaro_c >= 0.0f && s.saguaro_c < 1.0f;
}

std::span<const int32_t> SsdWorker::CandidateRow(const Seq& s, int32_t k) const {
  return std::span<const int32_t>(s.candidates).subspan(size_t(k) * f_max_, f_max_);
}

int32_t SsdWorker::DraftAt(const Seq& s, int32_t k) {
  return k < static_cast<int32_t>(s.drafts.size()) ? s.drafts[k] : kNoDraftToken;
}

std::vector<int32_t> SsdWorker::FanOut(const Seq& s, int32_t budget) const {
  const int32_t K = s.num_draft_tokens;
  const int32_t f = FanOutOf(s);
  // Saguaro sampling down-weights one top-F set per row (CacheDraftOptions::saguaro_fan_out),
  // which the cache must hold at every position: a Saguaro-sampled sequence gets F at every k.
  if (SaguaroSampled(s) || budget < 0) budget = (K + 1) * f;
  if (budget == 0) return std::vector<int32_t>(K + 1, 0);
  absl::StatusOr<std::vector<int32_t>> fan;
  if (SaguaroSampled(s)) {
    fan = ConstantFanOut(K, f);
  } else if (options_.config.ssd.geometric_fan_out) {
    fan = GeometricFanOut(K, budget, outcomes_.Alpha(), outcomes_.PowerLawR());
  } else {  // even over k, the remainder to the shortest acceptance lengths
    fan = std::vector<int32_t>(K + 1, budget / (K + 1));
    for (int32_t k = 0; k < budget % (K + 1); ++k) ++(*fan)[k];
  }
  if (!fan.ok()) return std::vector<int32_t>(K + 1, f);
  for (int32_t& x : *fan) x = std::min(x, f_max_);
  return *std::move(fan);
}

bool SsdWorker::TimeBudgetReady() const {
  const SsdOptions& o = options_.config.ssd;
  return o.time_budget && !o.complete_cache && window_seconds_ > 0 && wave_cost_.measured();
}

DraftInput SsdWorker::InputFor(uint64_t seq_id, const Seq& s, std::span<const int32_t> tokens,
                               int32_t num_drafts) const {
  DraftInput in;
  in.seq_id = seq_id;
  in.tokens = tokens;
  in.num_draft_tokens = num_drafts;
  in.params = &s.params;
  in.history = &s.history;
  in.seed = s.seed;  // the request's own seed: its drafts repeat like the target's draws
  // Device draws key a draft's uniform by (seed, position): the context length makes every
  // position's its own (without it each round would redraw with the same uniforms, and a draft
  // would depend on the drafts that decided earlier tokens).
  in.num_generated = static_cast<int64_t>(tokens.size());
  return in;
}

DraftModelSpeculator::CacheDraftOptions SsdWorker::CacheOptionsFor(const Seq& s) const {
  DraftModelSpeculator::CacheDraftOptions o;
  o.num_candidates = f_max_;
  o.saguaro_fan_out = SaguaroSampled(s) ? FanOutOf(s) : 0;  // the cache's F (FanOut)
  o.saguaro_c = s.saguaro_c;
  return o;
}

std::vector<int32_t> SsdWorker::BackupDraft(const Seq& s, int32_t num_drafts) {
  if (options_.config.ssd.backup == "random") {
    std::uniform_int_distribution<int32_t> id(0, vocab_size() - 1);
    std::vector<int32_t> out(num_drafts);
    for (int32_t& t : out) t = id(rng_);
    return out;
  }
  return NgramLookup(s.tokens, options_.config.prompt_lookup_min, options_.config.prompt_lookup_max,
                     num_drafts);
}

void SsdWorker::ReleaseBranches(uint64_t seq_id) {
  auto it = branches_.find(seq_id);
  if (it == branches_.end()) return;
  for (uint64_t b : it->second) draft_->Release(b);
  branches_.erase(it);
}

void SsdWorker::Drop(uint64_t seq_id) {
  ReleaseBranches(seq_id);
  cache_.Clear(seq_id);
  draft_->Release(seq_id);
  seqs_.erase(seq_id);
}

absl::Status SsdWorker::Handle(const SpeculateRequest& request, SpeculateResponse* response) {
  const absl::Time start = absl::Now();
  if (last_response_ != absl::InfinitePast()) {
    Ema(&seconds_.verify, absl::ToDoubleSeconds(start - last_response_));
  }
  response->Clear();
  response->round_id = request.round_id;
  if (request.window_ns > 0) {
    // A pause of the verifier (between requests, a prefill step) is no verification window: a
    // sample over twice the current estimate is left out, unless the estimate is stale (eight
    // such samples in a row: the rounds really got longer).
    const double w = request.window_ns * 1e-9;
    if (window_seconds_ <= 0 || w <= 2 * window_seconds_ || ++window_outliers_ >= 8) {
      Ema(&window_seconds_, w);
      window_outliers_ = 0;
    }
  }
  ++stats_.rounds;
  const int32_t batch = static_cast<int32_t>(request.seqs.size());
  const bool backup_tier = batch >= critical_batch_size();
  Round round(request.seqs.size());
  served_.clear();
  // The hidden rows' transfer on the device data path belongs to the receive stage.
  const int64_t receive_start = MonotonicNanos();
  SPECD_ASSIGN_OR_RETURN(device_hidden_, ReceiveHidden(request));
  const int64_t triage_start = MonotonicNanos();
  const int64_t misses_before = stats_.misses_primary, partial_before = stats_.hits_partial;
  if (device_hidden_ != nullptr) {
    const uint64_t ns = NanosBetween(receive_start, triage_start);
    receive_ns_ += ns;
    stats_.stage_seconds[static_cast<int>(SsdSpeculatorStage::kReceive)] += ns * 1e-9;
  }
  for (size_t i = 0; i < request.seqs.size(); ++i) {
    const SpeculateSeq& m = request.seqs[i];
    std::optional<CachedDraft> cached;
    Seq* s = SyncOutcome(m, request.TokensOf(m), &cached);
    if (s == nullptr) continue;  // unknown (we restarted): the verifier resends it whole
    SPECD_RETURN_IF_ERROR(Triage(m, i, *s, std::move(cached), backup_tier, round));
    // The target's hidden states of the committed positions (a head reads them; after Triage,
    // which made a hit's branch the sequence's).
    if (m.num_hidden == 0) continue;
    SPECD_RETURN_IF_ERROR(AddHidden(request, m, s->tokens));
  }
  const int64_t draft_start = MonotonicNanos();
  if (trace_) trace_sums_.build_passes.Add(draft_->TakeTrace());
  SPECD_RETURN_IF_ERROR(DraftMisses(round));
  if (trace_) {
    TraceSums& t = trace_sums_;
    ++t.rounds;
    t.receive_hidden += NanosBetween(receive_start, triage_start) * 1e-9;
    t.add_hidden += NanosBetween(triage_start, draft_start) * 1e-9;  // with triage
    t.draft += NanosBetween(draft_start, MonotonicNanos()) * 1e-9;
    t.misses += stats_.misses_primary - misses_before;
    t.partial += stats_.hits_partial - partial_before;
    t.primary_inputs += static_cast<int64_t>(round.primary.size());
    t.draft_passes.Add(draft_->TakeTrace());
    t.build += build_seconds_;
    LogTrace();
  }
  DraftBackups(request, round);
  const int64_t reply_start = MonotonicNanos();
  SPECD_RETURN_IF_ERROR(Reply(request, round, response));
  last_response_ = absl::Now();
  NoteStages(response, triage_start, draft_start, reply_start, MonotonicNanos());
  // Busy since the last response: the cache built after it, then this answer.
  response->busy_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(last_response_ - start) +
                                            build_seconds_ * 1e9);
  return absl::OkStatus();
}

SsdWorker::Round::Round(size_t num_seqs) : results(num_seqs), partial(num_seqs) {
  resume_tokens.reserve(num_seqs);  // spans into it must stay valid
}

SsdWorker::Seq* SsdWorker::SyncOutcome(const SpeculateSeq& m, std::span<const int32_t> fresh,
                                       std::optional<CachedDraft>* cached) {
  const bool is_new = (m.flags & kSeqNew) != 0;
  if (is_new) Drop(m.seq_id);
  auto it = seqs_.find(m.seq_id);
  if (!is_new && it == seqs_.end()) return nullptr;
  if (is_new) it = seqs_.try_emplace(m.seq_id).first;
  Seq& s = it->second;
  served_.push_back(m.seq_id);
  s.params.temperature = m.sampling.temperature;
  s.params.top_p = m.sampling.top_p;
  s.params.top_k = m.sampling.top_k;
  s.params.min_p = m.sampling.min_p;
  s.seed = m.sampling.seed;
  s.saguaro_c = m.saguaro_c;
  s.num_draft_tokens = m.num_draft_tokens;
  s.fan_out = std::max<int32_t>(1, m.fan_out);
  // The outcome of the last round: fresh = d_1..d_k, t* when the verifier verified our drafts.
  const int32_t k = m.accepted_len;
  const bool verified = !is_new && fresh.size() == size_t(k) + 1 && size_t(k) <= s.drafts.size() &&
                        std::equal(fresh.begin(), fresh.begin() + k, s.drafts.begin());
  if (verified) {
    *cached = cache_.Take(m.seq_id, s.round, k, fresh[k]);
    RoundOutcome outcome;
    outcome.accepted_len = k;
    outcome.num_draft_tokens = static_cast<int32_t>(s.drafts.size());
    outcome.cache_hit = cached->has_value();
    if (k < s.num_rows)
      outcome.bonus_rank = CachedBonusRank(CandidateRow(s, k), DraftAt(s, k), fresh[k]);
    outcomes_.Record(outcome);
  }
  if (cached->has_value()) {
    std::vector<uint64_t>& live = branches_[m.seq_id];
    live.erase(std::remove(live.begin(), live.end(), (*cached)->branch_id), live.end());
  }
  ReleaseBranches(m.seq_id);  // stale branches go before the sequence drafts again
  if (is_new) {
    s.tokens.assign(fresh.begin(), fresh.end());
    s.history = TokenHistory();
    s.history.AddPrompt(s.tokens);
  } else {
    s.tokens.insert(s.tokens.end(), fresh.begin(), fresh.end());
  }
  return &s;
}

absl::Status SsdWorker::DraftMisses(Round& round) {
  if (round.primary.empty()) return absl::OkStatus();
  const absl::Time t = absl::Now();
  const int64_t captured = draft_->graphs_captured();
  std::vector<Draft> proposed;
  SPECD_RETURN_IF_ERROR(draft_->Propose(round.primary, round.primary_cache, &proposed, {}));
  for (size_t j = 0; j < round.primary.size(); ++j) {
    // A partial hit: the drafts it had, then the rest (an empty rest: the KV was full; the
    // drafts it had still stand). A miss had none.
    Result& r = round.results[round.primary_of[j]];
    Result& resumed = round.partial[round.primary_of[j]];
    Draft& rest = proposed[j];
    r.draft.tokens = std::move(resumed.draft.tokens);
    r.draft.probs = std::move(resumed.draft.probs);
    r.draft.candidates = std::move(resumed.draft.candidates);
    r.kept = std::move(resumed.kept);
    r.draft.tokens.insert(r.draft.tokens.end(), rest.tokens.begin(), rest.tokens.end());
    r.draft.candidates.insert(r.draft.candidates.end(), rest.candidates.begin(),
                              rest.candidates.end());
    SPECD_RETURN_IF_ERROR(MoveRows(rest.probs, rest.kept_probs, r));
  }
  // b* compares a full re-draft with the backup: resumed branches alone are no sample of it.
  // A new sequence's first drafts include its prompt's prefill, which no later miss pays: such
  // a pass is no sample either (every request starts with one, so it would dominate the
  // average at high hit rates and send later misses to the backup, which drafts nothing on
  // unfamiliar text). Nor is a pass that captured a CUDA graph (the first re-draft of its shape:
  // tens of times a replay, and as the first sample it would send every later miss to the
  // backup, which then never times the primary again). A one-off stall counts at most twice
  // the average.
  if (round.any_miss && !round.any_new && draft_->graphs_captured() == captured) {
    double sample = absl::ToDoubleSeconds(absl::Now() - t);
    if (seconds_.primary > 0) sample = std::min(sample, 2 * seconds_.primary);
    Ema(&seconds_.primary, sample);
  }
  return absl::OkStatus();
}

void SsdWorker::DraftBackups(const SpeculateRequest& request, Round& round) {
  const absl::Time start = absl::Now();
  bool any_backup = false;
  for (size_t i = 0; i < request.seqs.size(); ++i) {
    if (round.results[i].served != Served::kBackup) continue;
    round.results[i].draft.tokens =
        BackupDraft(seqs_[request.seqs[i].seq_id], request.seqs[i].num_draft_tokens);
    any_backup = true;
  }
  if (any_backup) Ema(&seconds_.backup, absl::ToDoubleSeconds(absl::Now() - start));
}

absl::Status SsdWorker::BuildCache(const std::function<bool()>& stop) {
  const absl::Time start = absl::Now();
  SPECD_RETURN_IF_ERROR(CompleteRows());
  std::vector<DraftInput> inputs;
  std::vector<DraftModelSpeculator::CacheDraftOptions> cache;  // [inputs]
  std::vector<Draft> proposed;
  // Every branch: the sequence's context, d_1..d_k, then a candidate t* for position k + 1.
  // Branches are ordered by candidate rank (every sequence's best candidate at every k first,
  // then the second best, ...) and drafted in waves of at most kMaxBranchesPerPass, one batched
  // Propose per wave, and the build stops as soon as `stop` (checked before every forward
  // pass) says the verifier's next request is there: the cache is whatever fitted into the
  // verification window (the paper's budget B is the most it holds), plus the unfinished
  // branches of the wave in progress, which a hit resumes.
  struct Branch {
    uint64_t seq_id, branch_id;
    int32_t k, bonus;
    int32_t fan;  // F_k: the fan-out of its acceptance length, larger for likelier outcomes
    std::vector<int32_t> tokens;
  };
  // A parallel draft's branch draws its K + 1 rows in one pass: fewer branches share a pass.
  int32_t rows_per_branch = 1;
  std::vector<uint64_t> building;
  for (uint64_t id : served_) {
    const Seq& s = seqs_[id];
    if (s.served == Served::kNone || s.num_rows == 0) continue;
    building.push_back(id);
    if (draft_->parallel()) rows_per_branch = std::max(rows_per_branch, s.num_draft_tokens + 1);
  }
  // A head reruns the positions whose target hidden states just arrived, once, before the
  // branches fork from them.
  SPECD_RETURN_IF_ERROR(draft_->PrepareForks(building));
  const size_t per_pass = std::max<size_t>(
      1, std::min<size_t>(kMaxBranchesPerPass,
                          static_cast<size_t>(draft_->max_rows_per_pass() / rows_per_branch)));
  // The time budget: as many branches as the measured waves build within the verifier's
  // measured window, evenly over the sequences (at most what each can use: f_max_ per
  // acceptance length). Something is always built, even when not one wave fits: a draft
  // model's passes still shorten a hit (partial hits resume), and the cost is measured again (a
  // first wave that captured graphs must not stop the builds for good).
  std::vector<int32_t> budget(building.size(), -1);
  if (TimeBudgetReady() && !building.empty()) {
    std::vector<int32_t> cap(building.size());
    int32_t max_branches = 0, fixed = 0;
    for (size_t i = 0; i < building.size(); ++i) {
      const Seq& s = seqs_[building[i]];
      const int32_t rows = std::min<int32_t>(s.num_rows, static_cast<int32_t>(s.drafts.size()) + 1);
      cap[i] = rows * f_max_;
      max_branches += cap[i];
      fixed += std::min(cap[i], rows * FanOutOf(s));
    }
    // The window started about when our response went out.
    const double spent = absl::ToDoubleSeconds(absl::Now() - last_response_);
    const double share = options_.config.ssd.cache_offers ? kOfferWindowShare : kWindowShare;
    // The floor: a draft model's wave runs a pass per draft and stops between them, so one wave
    // of F's budget costs at most a pass past the window; a parallel draft's wave is one pass
    // that cannot stop: one branch per sequence (the likeliest outcome) keeps it measured.
    const int32_t floor = std::min(fixed, draft_->parallel() ? static_cast<int32_t>(building.size())
                                                             : static_cast<int32_t>(per_pass));
    const int32_t total = std::max(BranchesWithin(wave_cost_, share * window_seconds_ - spent,
                                                  static_cast<int32_t>(per_pass), max_branches),
                                   floor);
    budget = SplitBudget(total, cap);
    stats_.budget_branches = total;
  }
  std::vector<std::vector<Branch>> waves;
  for (size_t i = 0; i < building.size(); ++i) {
    const uint64_t id = building[i];
    Seq& s = seqs_[id];
    cache_.BeginRound(id, s.round);
    const int32_t K = s.num_draft_tokens;
    const std::vector<int32_t> fan = FanOut(s, budget[i]);
    const int32_t max_k = std::min<int32_t>(s.num_rows - 1, static_cast<int32_t>(s.drafts.size()));
    for (int32_t k = 0; k <= max_k; ++k) {
      const int32_t f = fan[std::min(k, K)];
      if (f == 0) continue;
      size_t rank = 0;
      for (int32_t t : CachedCandidates(CandidateRow(s, k), DraftAt(s, k), f)) {
        if (waves.size() <= rank) waves.resize(rank + 1);
        Branch br{id, 0, k, t, f, {}};
        br.tokens.reserve(s.tokens.size() + k + 1);
        br.tokens.assign(s.tokens.begin(), s.tokens.end());
        br.tokens.insert(br.tokens.end(), s.drafts.begin(), s.drafts.begin() + k);
        br.tokens.push_back(t);
        waves[rank++].push_back(std::move(br));
      }
    }
  }
  // Ranks share passes up to kMaxBranchesPerPass rows (and what one runner Step draws), in rank
  // order and within a rank by outcome likelihood (F_k), so a build cut short has the likeliest
  // outcomes.
  std::vector<std::vector<Branch>> passes;
  for (std::vector<Branch>& rank : waves) {
    std::stable_sort(rank.begin(), rank.end(),
                     [](const Branch& a, const Branch& b) { return a.fan > b.fan; });
    for (Branch& br : rank) {
      if (passes.empty() || passes.back().size() == per_pass) passes.emplace_back();
      passes.back().push_back(std::move(br));
    }
  }
  for (std::vector<Branch>& wave : passes) {
    // The verifier's next request ends the build, even mid-wave: the other branches of the
    // wave are of no use once the outcome is known, and the one that matches it (if any) goes
    // on alone as a partial hit. When verification is quicker than the first pass of a wave, as
    // for a tiny target, the cache stays empty and SSD falls back to plain speculation.
    if (stop && stop()) break;
    const absl::Time wave_start = absl::Now();
    bool stopped = false;  // the wave was cut short: its time is no sample of a wave's cost
    auto wave_stop = [&] {
      stopped = stopped || (stop && stop());
      return stopped;
    };
    inputs.clear();
    cache.clear();
    for (Branch& br : wave) {
      const Seq& s = seqs_[br.seq_id];
      br.branch_id = next_branch_id_++;
      SPECD_RETURN_IF_ERROR(
          draft_->Fork(br.seq_id, br.branch_id, static_cast<int32_t>(s.tokens.size()) + br.k));
      branches_[br.seq_id].push_back(br.branch_id);
      inputs.push_back(InputFor(br.branch_id, s, br.tokens, s.num_draft_tokens + 1));
      inputs.back().seed = Mix(s.seed, br.branch_id);
      cache.push_back(CacheOptionsFor(s));
    }
    SPECD_RETURN_IF_ERROR(draft_->Propose(inputs, cache, &proposed, wave_stop));
    const double wave_seconds = absl::ToDoubleSeconds(absl::Now() - wave_start);
    if (!stopped) {
      wave_cost_.Add(static_cast<double>(wave.size()), wave_seconds);
    } else {
      // Cut short after `done` of its passes: the passes' rate still says what the whole wave
      // costs. Without this sample a budget too large for the window would never shrink: its
      // waves would always be cut, and only complete waves taught the model.
      size_t done = 0, full = 0;
      for (size_t j = 0; j < wave.size(); ++j) {
        done = std::max(done, proposed[j].tokens.size());
        full = std::max(full, static_cast<size_t>(std::max(0, inputs[j].num_draft_tokens)));
      }
      if (cut_wave_samples_ && done > 0 && done <= full && !draft_->parallel()) {
        wave_cost_.Add(static_cast<double>(wave.size()),
                       wave_seconds * static_cast<double>(full) / static_cast<double>(done));
      }
    }
    const bool offering = options_.config.ssd.cache_offers && channel_ != nullptr;
    offer_.Clear();
    for (size_t j = 0; j < wave.size(); ++j) {
      Branch& br = wave[j];
      Draft& d = proposed[j];
      // Empty: the draft's KV is full (this outcome will miss); short: the build was stopped
      // mid-branch, and a hit resumes it from the drafts it has (Handle).
      if (d.tokens.empty()) continue;
      const Seq& s = seqs_[br.seq_id];
      // A complete greedy branch (its K drafts and the row for k = K) is the verifier's to take
      // without asking; a sampled one needs its q rows, a short one its remaining passes.
      if (offering && s.params.greedy() && d.tokens.size() > size_t(s.num_draft_tokens)) {
        offer_.AddDraft(br.seq_id, static_cast<uint16_t>(br.k), br.bonus,
                        std::span<const int32_t>(d.tokens).first(s.num_draft_tokens));
      }
      CachedDraft c;
      c.tokens = std::move(d.tokens);
      c.probs = std::move(d.probs);
      c.kept_probs = std::move(d.kept_probs);
      c.candidates = std::move(d.candidates);
      c.branch_id = br.branch_id;
      cache_.Insert(br.seq_id, s.round, br.k, br.bonus, std::move(c));
      ++stats_.branches;
    }
    // Not once the verifier's next message is in: it asked already, or needs no offer.
    if (!offer_.drafts.empty() && !(stop && stop())) SPECD_RETURN_IF_ERROR(SendOffer(start));
  }
  build_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
  stats_.stage_seconds[static_cast<int>(SsdSpeculatorStage::kBuild)] += build_seconds_;
  return absl::OkStatus();
}

void SsdWorker::DropAll() {
  std::vector<uint64_t> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  for (uint64_t id : ids) Drop(id);
}

}  // namespace specd
