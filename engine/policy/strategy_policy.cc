#include "engine/policy/strategy_policy.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"

// The step-time model. One engine step runs every speculator's Speculate stage one after the
// other, then one target pass over the whole batch (engine/step/step_pipeline.h):
//   step_ms = sum over methods m with rows:   DraftMs(m, n_m, max K of m's rows, mean context of m)
//           + sum over stateful drafters d:   DraftMs(d, rows keeping d in sync, 1, their context)
//           + sum over rows r running a stateful drafter d that must catch up first:
//                 catch-up tokens x CatchUpMsPerToken(d) / (r's remaining tokens / its expected
//                 tokens per round)   (a one-time cost spread over the request's rounds)
//           + target pass
// A drafter runs as many passes as its longest draft, so a method's drafting costs the max K of
// its rows at its batch (an EAGLE-3 head: K head steps; a parallel draft model: one pass of K
// tokens per row; either way what the method's draft grid says K costs). The target pass is padded
// to the longest row (the CUDA runner's verification graphs are keyed by the longest chunk, and
// every row runs that many positions):
//   no row speculates:  PlainMs(B, mean context)
//   otherwise:          sum over methods m (plain rows count as dense verification)
//                       of (n_m / B) * VerifyMs(m, B, T, mean context),  T = 1 + max K
// i.e. each row pays its share of its own verification kind at the whole batch's shape (mixed
// batches verify dense, Vegas and SSV rows in one pass). A round commits the accepted drafts plus
// one token: ExpectedCommittedTokens over the request's rates; a plain row commits 1.
//
// The search. The objective (expected tokens / step time) does not split by request, since
// padding and a method's max K couple rows. Two starts: the best "uniform" assignment (every
// request that may run method m at K does, the rest plain; this finds switching a whole loaded
// batch off, which no single-request move finds because one row alone does not shrink the
// padding) and the held assignment; each is improved by coordinate ascent (one request's
// strategy at a time, max_sweeps passes). Explicit choices restrict a request's candidates.
//
// Hysteresis. The held assignment (each request's last strategy) gives way to the best found when
// either (a) the batch's rate beats the held one's by switch_margin on switch_patience
// consecutive steps, or (b) for one request, moving it alone beats the held rate by
// switch_margin / B (its share of the batch) on switch_patience consecutive steps. New requests
// take the best assignment's strategy at once.
//
// Amortisation. A search costs O(sweeps x B x candidates) step-time evaluations: ~0.25-0.5 ms at
// B 64 with K up to 8, as long as a whole step of a small model on a GPU. So it runs once every
// search interval steps (sized from its measured time against the step's, PolicyOptions), and
// the steps between hold: O(B), each request keeps its strategy and a new one is placed by one
// coordinate move against the rest.

namespace specd {

struct StrategyPolicy::Row {
  uint64_t id = 0;
  int64_t context = 0;
  bool pinned = false;
  std::vector<Strategy> candidates;  // what the request may run this step
  // [method][k]: expected committed tokens at K k (filled up to the method's largest candidate K)
  std::array<std::vector<double>, kNumPolicyMethods> expected;
  MethodSet sync_eligible;  // stateful drafters holding state for the request, still allowed
  int32_t max_k = 0;        // largest K among the candidates
  // [method]: a stateful drafter's one-time catch-up for the request (ms), and the tokens the
  // request may still generate (0: unknown, nothing amortised).
  std::array<double, kNumPolicyMethods> catch_up_ms{};
  int64_t remaining_tokens = 0;

  // The catch-up's share of one step under `s`: spread over the rounds the request is expected
  // to have left.
  double CatchUpPerStep(const Strategy& s) const {
    const double once = catch_up_ms[static_cast<int>(s.method)];
    if (once <= 0 || remaining_tokens <= 0) return 0;
    return once / std::max(1.0, static_cast<double>(remaining_tokens) / Expected(s));
  }

  double Expected(const Strategy& s) const {
    const auto& e = expected[static_cast<int>(s.method)];
    return s.k < static_cast<int32_t>(e.size()) ? e[s.k] : 1;
  }
  bool Allows(const Strategy& s) const {
    return std::find(candidates.begin(), candidates.end(), s) != candidates.end();
  }
};

namespace {

bool Speculates(PolicyMethod m) { return m != PolicyMethod::kPlain; }

// Weight of a new sample in the search's and the step's timing averages.
constexpr double kTimingWeight = 0.2;

double Rate(const StepEstimate& e) { return e.tokens_per_second(); }

// The candidate of `row` closest to "method m at K": m at the largest K <= `k` it allows, else
// plain, else (a request pinned to another method) its candidate with K nearest `k`.
Strategy Pick(const StrategyPolicy::Row& row, PolicyMethod m, int32_t k) {
  std::optional<Strategy> best;
  for (const Strategy& c : row.candidates) {
    if (c.method == m && c.k <= k && (!best || c.k > best->k)) best = c;
  }
  if (best) return *best;
  if (row.Allows(Strategy{})) return Strategy{};
  Strategy nearest = row.candidates.front();
  for (const Strategy& c : row.candidates) {
    if (std::abs(c.k - k) < std::abs(nearest.k - k)) nearest = c;
  }
  return nearest;
}

}  // namespace

absl::Status PolicyOptions::Validate() const {
  if (max_k < 1 || max_k > kMaxPolicyK) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy max_k ", max_k, " not in [1, ", kMaxPolicyK, "]"));
  }
  if (!(switch_margin >= 0) || switch_patience < 1 || max_sweeps < 0) {
    return absl::InvalidArgumentError(
        "policy switch_margin must be >= 0, switch_patience >= 1, max_sweeps >= 0");
  }
  if (!(max_search_share >= 0) || max_search_interval < 1) {
    return absl::InvalidArgumentError(
        "policy max_search_share must be >= 0, max_search_interval >= 1");
  }
  return acceptance.Validate();
}

MethodSet ApplicableMethods(const PolicyEnvironment& env, const PolicyOptions& options,
                            int64_t context_len) {
  MethodSet s = {PolicyMethod::kPlain, PolicyMethod::kNgram};
  if (env.draft_model_loaded) s.Add(PolicyMethod::kDraftModel);
  if (env.eagle3_loaded) s.Add(PolicyMethod::kEagle3);
  if (env.speculator_connected) s.Add(PolicyMethod::kSsd);
  if (env.target_is_nsa) {
    s.Add(PolicyMethod::kSsv);
  } else if (context_len >= options.min_sparse_draft_context) {
    s.Add(PolicyMethod::kVegas);
    s.Add(PolicyMethod::kStreaming);
  }
  return s;
}

StrategyPolicy::StrategyPolicy(CostProfile profile, PolicyOptions options)
    : profile_(std::move(profile)), options_(options), acceptance_(options.acceptance) {}

StrategyPolicy::~StrategyPolicy() = default;

absl::StatusOr<std::unique_ptr<StrategyPolicy>> StrategyPolicy::Create(CostProfile profile,
                                                                       PolicyOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return std::unique_ptr<StrategyPolicy>(new StrategyPolicy(std::move(profile), options));
}

MethodSet StrategyPolicy::Allowed(const PolicyRequest& request) const {
  return ApplicableMethods(env_, options_, request.context_len) & request.allowed &
         ~request.forbidden;
}

int32_t StrategyPolicy::Cap(const PolicyRequest& request) const {
  return std::clamp(std::min(options_.max_k, request.max_k), 0, kMaxPolicyK);
}

void StrategyPolicy::MakeRow(const PolicyRequest& request, Row& row) const {
  StartRow(request, row);
  MethodSet allowed = Allowed(request);
  const int32_t cap = Cap(request);
  auto add_range = [&](PolicyMethod m, int32_t max_k) {
    for (int32_t k = 1; k <= max_k; ++k) row.candidates.push_back({m, k});
  };
  if (request.pinned_method || request.pinned_k >= 0) {
    // Explicit choices win over the policy, its caps and its applicability rules.
    row.pinned = true;
    const int32_t pinned_k = std::min(request.pinned_k, kMaxPolicyK);
    const PolicyMethod m = request.pinned_method.value_or(PolicyMethod::kPlain);
    if (pinned_k == 0 || (request.pinned_method && !Speculates(m))) {
      row.candidates.push_back({});
    } else if (request.pinned_method && pinned_k > 0) {
      row.candidates.push_back({m, pinned_k});
    } else if (request.pinned_method) {
      add_range(m, std::max(1, std::min(cap, profile_.Has(m) ? profile_.MaxK(m) : cap)));
    } else {
      for (PolicyMethod pm : kAllPolicyMethods) {
        if (Speculates(pm) && allowed.Has(pm) && profile_.Has(pm)) {
          row.candidates.push_back({pm, pinned_k});
        }
      }
      if (row.candidates.empty()) row.candidates.push_back({});
    }
    allowed.Add(m);
  } else {
    row.candidates.push_back({});
    for (PolicyMethod m : kAllPolicyMethods) {
      if (Speculates(m) && allowed.Has(m) && profile_.Has(m)) {
        add_range(m, std::min(cap, profile_.MaxK(m)));
      }
    }
  }
  FinishRow(request, allowed, row);
}

void StrategyPolicy::MakeHeldRow(const PolicyRequest& request, const Strategy& held,
                                 Row& row) const {
  StartRow(request, row);
  // As Pick: the held method at the largest K <= its held K that the request allows now, else
  // plain (always a candidate of a request that pinned nothing).
  const MethodSet allowed = Allowed(request);
  Strategy s;
  if (Speculates(held.method) && allowed.Has(held.method) && profile_.Has(held.method)) {
    const int32_t k = std::min({held.k, Cap(request), profile_.MaxK(held.method)});
    if (k > 0) s = {held.method, k};
  }
  row.candidates.push_back(s);
  FinishRow(request, allowed, row);
}

void StrategyPolicy::StartRow(const PolicyRequest& request, Row& row) const {
  row.id = request.id;
  row.context = request.context_len;
  row.pinned = false;
  row.candidates.clear();
  row.remaining_tokens = request.remaining_tokens;
  for (PolicyMethod m : kAllPolicyMethods) {
    const auto i = static_cast<size_t>(m);
    row.catch_up_ms[i] =
        kStatefulDrafters.Has(m) && request.catch_up_tokens[i] > 0
            ? static_cast<double>(request.catch_up_tokens[i]) *
                  profile_.CatchUpMsPerToken(m, static_cast<double>(request.context_len))
            : 0;
  }
}

void StrategyPolicy::FinishRow(const PolicyRequest& request, MethodSet allowed, Row& row) const {
  FillExpected(row);
  row.sync_eligible = {};
  if (options_.sync_paused_drafters) {
    if (auto it = held_.find(request.id); it != held_.end()) {
      row.sync_eligible = it->second.used_stateful & allowed & kStatefulDrafters;
    }
  }
}

void StrategyPolicy::FillExpected(Row& row) const {
  std::array<int32_t, kNumPolicyMethods> longest;
  longest.fill(-1);
  row.max_k = 0;
  for (const Strategy& c : row.candidates) {
    row.max_k = std::max(row.max_k, c.k);
    int32_t& l = longest[static_cast<int>(c.method)];
    l = std::max(l, c.k);
  }
  for (PolicyMethod m : kAllPolicyMethods) {
    auto& e = row.expected[static_cast<int>(m)];
    const int32_t k = longest[static_cast<int>(m)];
    if (k < 0) {
      e.clear();
    } else {
      acceptance_.ExpectedCommittedUpTo(row.id, m, k, &e);
    }
  }
}

void StrategyPolicy::Tally::Add(const Row& row, const Strategy& s, int sign) {
  const int m = static_cast<int>(s.method);
  num_rows[m] += sign;
  num_at_k[m][s.k] += sign;
  context[m] += sign * row.context;
  all_context += sign * row.context;
  num_at_k_all[s.k] += sign;
  expected_tokens += sign * row.Expected(s);
  catch_up_ms += sign * row.CatchUpPerStep(s);
  if (row.sync_eligible.empty()) return;
  for (PolicyMethod d : kAllPolicyMethods) {
    if (d != s.method && row.sync_eligible.Has(d)) {
      num_sync[static_cast<int>(d)] += sign;
      sync_context[static_cast<int>(d)] += sign * row.context;
    }
  }
}

StepEstimate StrategyPolicy::Cost(const Tally& tally, int32_t batch_size) const {
  StepEstimate est;
  if (batch_size <= 0) return est;
  est.expected_tokens = tally.expected_tokens;
  auto longest = [&](const std::array<int32_t, kMaxPolicyK + 1>& counts) {
    int32_t k = tally.max_k;
    while (k > 0 && counts[k] == 0) --k;
    return k;
  };
  const double batch = batch_size;
  const double mean_context = tally.all_context / batch;
  const int32_t longest_all = longest(tally.num_at_k_all);
  // The batch and its mean context are fixed while a decision searches: the target pass's time
  // depends only on (method, longest K) then, so it is looked up once per decision.
  if (verify_cache_batch_ != batch || verify_cache_context_ != mean_context) {
    verify_cache_batch_ = batch;
    verify_cache_context_ = mean_context;
    for (auto& per_k : verify_cache_) per_k.fill(-1);
  }
  auto verify_ms = [&](PolicyMethod m, int32_t k) {
    double& ms = verify_cache_[static_cast<int>(m)][k];
    if (ms < 0) {
      ms = k == 0 ? profile_.PlainMs(batch, mean_context)
                  : profile_.VerifyMs(m, batch, k + 1, mean_context);
    }
    return ms;
  };
  if (longest_all == 0) est.step_ms = verify_ms(PolicyMethod::kPlain, 0);
  for (PolicyMethod m : kAllPolicyMethods) {
    const int i = static_cast<int>(m);
    const int32_t n = tally.num_rows[i];
    if (n > 0 && longest_all > 0) est.step_ms += n / batch * verify_ms(m, longest_all);
    if (Speculates(m) && n > 0) {
      est.step_ms += profile_.DraftMs(m, n, longest(tally.num_at_k[i]), tally.context[i] / n);
    }
    if (tally.num_sync[i] > 0) {
      est.step_ms +=
          profile_.DraftMs(m, tally.num_sync[i], 1, tally.sync_context[i] / tally.num_sync[i]);
    }
  }
  est.step_ms += tally.catch_up_ms;
  est.modelled_ms = est.step_ms;
  est.step_ms *= Calibration(longest_all > 0, batch_size);
  return est;
}

namespace {

int CalibBucket(int32_t batch, int num_buckets) {
  int b = 0;
  while (b + 1 < num_buckets && (2 << b) <= batch) ++b;  // bucket b: batch in [2^b, 2^(b+1))
  return b;
}

}  // namespace

double StrategyPolicy::Calibration(bool speculative, int32_t batch) const {
  const int b = CalibBucket(batch, kCalibBuckets);
  const Calib& plain = calib_[0][b];
  const Calib& spec = calib_[1][b];
  // A plain step is what the profile measures most directly: unseen, it is taken as modelled.
  // An unseen speculative step is taken to carry the plain step's host work, no more.
  if (!speculative) return plain.samples > 0 ? plain.factor : 1;
  if (spec.samples > 0) return spec.factor;
  return plain.samples > 0 ? plain.factor : 1;
}

StrategyPolicy::Tally StrategyPolicy::Count(const std::vector<Row>& rows,
                                            const std::vector<Strategy>& choice) const {
  Tally tally;
  for (size_t i = 0; i < rows.size(); ++i) {
    tally.max_k = std::max({tally.max_k, rows[i].max_k, choice[i].k});
    tally.Add(rows[i], choice[i], +1);
  }
  return tally;
}

StepEstimate StrategyPolicy::Evaluate(const std::vector<Row>& rows,
                                      const std::vector<Strategy>& choice) const {
  return Cost(Count(rows, choice), static_cast<int32_t>(rows.size()));
}

std::vector<Strategy> StrategyPolicy::BestUniform(const std::vector<Row>& rows) const {
  std::vector<Strategy> best(rows.size()), trial(rows.size());
  double best_rate = -1;
  auto consider = [&](PolicyMethod m, int32_t k) {
    for (size_t i = 0; i < rows.size(); ++i) trial[i] = Pick(rows[i], m, k);
    const double rate = Rate(Evaluate(rows, trial));
    if (rate > best_rate) {
      best_rate = rate;
      best = trial;
    }
  };
  consider(PolicyMethod::kPlain, 0);
  int32_t longest = 0;
  for (const Row& row : rows) {
    for (const Strategy& c : row.candidates) longest = std::max(longest, c.k);
  }
  for (PolicyMethod m : kAllPolicyMethods) {
    if (!Speculates(m)) continue;
    for (int32_t k = 1; k <= longest; ++k) consider(m, k);
  }
  return best;
}

void StrategyPolicy::LocalSearch(const std::vector<Row>& rows,
                                 std::vector<Strategy>& choice) const {
  const int32_t batch = static_cast<int32_t>(rows.size());
  Tally tally = Count(rows, choice);
  double rate = Rate(Cost(tally, batch));
  for (int32_t sweep = 0; sweep < options_.max_sweeps; ++sweep) {
    bool changed = false;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].candidates.size() > 1) changed |= Move(rows[i], batch, tally, choice[i], rate);
    }
    if (!changed) break;
  }
}

bool StrategyPolicy::Move(const Row& row, int32_t batch, Tally& tally, Strategy& choice,
                          double& rate) const {
  const Strategy held = choice;
  tally.Add(row, held, -1);
  for (const Strategy& c : row.candidates) {
    if (c == held) continue;
    tally.Add(row, c, +1);
    // A strict improvement (relative, so rounding never cycles).
    if (const double r = Rate(Cost(tally, batch)); r > rate * (1 + 1e-9)) {
      rate = r;
      choice = c;
    }
    tally.Add(row, c, -1);
  }
  tally.Add(row, choice, +1);
  return !(choice == held);
}

PolicyDecision StrategyPolicy::Decide(std::span<const PolicyRequest> requests) {
  acceptance_.Tick();
  const size_t batch = requests.size();
  const bool search = steps_since_search_ + 1 >= stats_.search_interval ||
                      last_search_batch_ == 0 || 2 * batch <= last_search_batch_ ||
                      batch >= 2 * last_search_batch_;
  const auto start = std::chrono::steady_clock::now();
  if (!search) {
    ++steps_since_search_;
    PolicyDecision decision = Hold(requests);
    last_decide_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return decision;
  }
  PolicyDecision decision = Search(requests);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  last_decide_seconds_ = seconds;
  stats_.search_seconds =
      stats_.num_searches == 0
          ? seconds
          : stats_.search_seconds + kTimingWeight * (seconds - stats_.search_seconds);
  ++stats_.num_searches;
  steps_since_search_ = 0;
  last_search_batch_ = std::max<size_t>(batch, 1);
  return decision;
}

void StrategyPolicy::NoteStepSeconds(double seconds, bool decode_only) {
  if (!(seconds > 0)) return;
  // The decision's own time is the policy's, not the step's that the profile models.
  const double step_ms = 1000 * (seconds - last_decide_seconds_);
  if (profile_.calibrate && decode_only && last_batch_ > 0 && last_modelled_ms_ > 0 &&
      step_ms > 0) {
    // From the factor in use, at most halving or doubling per sample: one slow step (a CUDA
    // graph captured for a new shape, a page fault) must not rule a kind of step out.
    const double current = Calibration(last_speculative_, last_batch_);
    const double ratio = std::clamp(step_ms / last_modelled_ms_, current / 2, current * 2);
    Calib& c = calib_[last_speculative_ ? 1 : 0][CalibBucket(last_batch_, kCalibBuckets)];
    c.factor = current + kTimingWeight * (ratio - current);
    ++c.samples;
  }
  step_seconds_ =
      step_seconds_ == 0 ? seconds : step_seconds_ + kTimingWeight * (seconds - step_seconds_);
  int32_t interval = 1;
  if (options_.max_search_share > 0 && stats_.num_searches > 0) {
    const double budget = options_.max_search_share * step_seconds_;
    interval = static_cast<int32_t>(std::clamp(std::ceil(stats_.search_seconds / budget), 1.0,
                                               static_cast<double>(options_.max_search_interval)));
  }
  stats_.search_interval = interval;
}

void StrategyPolicy::KeepLastDecision() {
  acceptance_.Tick();
  ++steps_since_search_;
  last_decide_seconds_ = 0;
  ++stats_.num_decisions;
  for (int m = 0; m < kNumPolicyMethods; ++m)
    stats_.rows_by_method[m] += stats_.last_rows_by_method[m];
}

bool StrategyPolicy::SearchDue() const { return steps_since_search_ + 1 >= stats_.search_interval; }

PolicyDecision StrategyPolicy::Search(std::span<const PolicyRequest> requests) {
  rows_.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) MakeRow(requests[i], rows_[i]);
  const std::vector<Row>& rows = rows_;

  // The best assignment found from both starts.
  std::vector<Strategy> best = BestUniform(rows);
  LocalSearch(rows, best);
  // The held assignment: each request's last strategy while it is still a candidate; new
  // requests (and those whose strategy became invalid) take the best one's at once.
  std::vector<Strategy> held = best;
  std::vector<bool> is_held(rows.size(), false);
  for (size_t i = 0; i < rows.size(); ++i) {
    auto it = held_.find(rows[i].id);
    if (it != held_.end() && rows[i].Allows(it->second.strategy)) {
      held[i] = it->second.strategy;
      is_held[i] = true;
    }
  }
  if (held != best) {
    std::vector<Strategy> from_held = held;
    LocalSearch(rows, from_held);
    if (Rate(Evaluate(rows, from_held)) > Rate(Evaluate(rows, best))) best = from_held;
  }

  // Hysteresis, in steps: the searches since the last switch, each search_interval steps apart.
  const int32_t patience = std::max<int32_t>(
      1, (options_.switch_patience + stats_.search_interval - 1) / stats_.search_interval);
  // (a) The whole batch.
  Tally held_tally = Count(rows, held);
  const double held_rate = Rate(Cost(held_tally, rows.size()));
  const double batch = std::max<double>(1, rows.size());
  const bool batch_better = Rate(Evaluate(rows, best)) > held_rate * (1 + options_.switch_margin);
  streak_ = batch_better ? streak_ + 1 : 0;
  std::vector<Strategy> chosen = held;
  PolicyDecision decision;
  decision.searched = true;
  if (streak_ >= patience) {
    chosen = best;
    streak_ = 0;
    decision.switched = chosen != held;
  }
  // (b) One request at a time, against its share of the batch.
  for (size_t i = 0; i < rows.size(); ++i) {
    auto it = held_.find(rows[i].id);
    if (!is_held[i] || it == held_.end()) continue;
    int32_t& row_streak = it->second.streak;
    if (best[i] == held[i] || decision.switched) {
      row_streak = 0;
      continue;
    }
    held_tally.Add(rows[i], held[i], -1);
    held_tally.Add(rows[i], best[i], +1);
    const bool better =
        Rate(Cost(held_tally, rows.size())) > held_rate * (1 + options_.switch_margin / batch);
    held_tally.Add(rows[i], best[i], -1);
    held_tally.Add(rows[i], held[i], +1);
    row_streak = better ? row_streak + 1 : 0;
    if (row_streak >= patience) {
      chosen[i] = best[i];
      row_streak = 0;
      decision.switched = true;
    }
  }
  return Finish(rows, chosen, std::move(decision));
}

PolicyDecision StrategyPolicy::Hold(std::span<const PolicyRequest> requests) {
  rows_.resize(requests.size());
  choice_.assign(requests.size(), Strategy{});
  std::vector<Row>& rows = rows_;
  bool any_new = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PolicyRequest& q = requests[i];
    auto it = held_.find(q.id);
    if (q.pinned_method || q.pinned_k >= 0 || it == held_.end()) {
      MakeRow(q, rows[i]);
      any_new |= rows[i].candidates.size() > 1;
      choice_[i] = rows[i].Allows(Strategy{}) ? Strategy{} : rows[i].candidates.front();
    } else {
      MakeHeldRow(q, it->second.strategy, rows[i]);
      choice_[i] = rows[i].candidates.front();
    }
  }
  if (any_new) {
    // Each request not placed yet (the only rows with several candidates) takes its best
    // candidate against the rest, one at a time.
    const int32_t batch = static_cast<int32_t>(rows.size());
    Tally tally = Count(rows, choice_);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].candidates.size() <= 1) continue;
      double rate = Rate(Cost(tally, batch));
      Move(rows[i], batch, tally, choice_[i], rate);
    }
  }
  return Finish(rows, choice_, PolicyDecision{});
}

PolicyDecision StrategyPolicy::Finish(const std::vector<Row>& rows,
                                      const std::vector<Strategy>& chosen,
                                      PolicyDecision decision) {
  const StepEstimate est = Evaluate(rows, chosen);
  last_modelled_ms_ = est.modelled_ms;
  last_batch_ = static_cast<int32_t>(rows.size());
  last_speculative_ =
      std::any_of(chosen.begin(), chosen.end(), [](const Strategy& c) { return c.k > 0; });
  stats_.last_calibration = est.modelled_ms > 0 ? est.step_ms / est.modelled_ms : 1;
  decision.expected_tokens = est.expected_tokens;
  decision.step_ms = est.step_ms;
  decision.tokens_per_second = est.tokens_per_second();
  decision.rows.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    Held& h = held_[rows[i].id];
    h.strategy = chosen[i];
    if (kStatefulDrafters.Has(chosen[i].method)) h.used_stateful.Add(chosen[i].method);
    PolicyRow out{.id = rows[i].id,
                  .strategy = chosen[i],
                  .pinned = rows[i].pinned,
                  .expected_tokens = rows[i].Expected(chosen[i]),
                  .drafters_to_sync = {}};
    for (PolicyMethod d : kAllPolicyMethods) {
      if (d != chosen[i].method && rows[i].sync_eligible.Has(d)) out.drafters_to_sync.Add(d);
    }
    decision.rows.push_back(out);
  }
  Record(decision);
  return decision;
}

void StrategyPolicy::Record(const PolicyDecision& decision) {
  ++stats_.num_decisions;
  if (decision.switched) ++stats_.num_switches;
  stats_.last_rows_by_method.fill(0);
  for (const PolicyRow& row : decision.rows) {
    const int m = static_cast<int>(row.strategy.method);
    ++stats_.rows_by_method[m];
    ++stats_.last_rows_by_method[m];
  }
  stats_.last_tokens_per_second = decision.tokens_per_second;
  stats_.last_step_ms = decision.step_ms;
  stats_.last_expected_tokens = decision.expected_tokens;
}

void StrategyPolicy::OnVerified(uint64_t request, PolicyMethod method, int32_t num_drafts,
                                int32_t accepted) {
  acceptance_.Observe(request, method, num_drafts, accepted);
}

void StrategyPolicy::Forget(uint64_t request) {
  acceptance_.Forget(request);
  held_.erase(request);
}

StepEstimate StrategyPolicy::Estimate(std::span<const PolicyRequest> requests,
                                      std::span<const Strategy> strategies) const {
  std::vector<Row> rows;
  std::vector<Strategy> choice(strategies.begin(), strategies.end());
  choice.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    Strategy& c = choice[i];
    c.k = Speculates(c.method) ? std::clamp(c.k, 0, kMaxPolicyK) : 0;
    MakeRow(requests[i], rows.emplace_back());
    // Expected tokens for a strategy outside the request's candidates too.
    auto& e = rows[i].expected[static_cast<int>(choice[i].method)];
    for (int32_t k = static_cast<int32_t>(e.size()); k <= choice[i].k; ++k) {
      e.push_back(acceptance_.ExpectedCommitted(requests[i].id, choice[i].method, k));
    }
  }
  return Evaluate(rows, choice);
}

}  // namespace specd
