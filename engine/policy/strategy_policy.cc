#include "engine/policy/strategy_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

// The step-time model. One engine step runs every speculator's Speculate stage one after the
// other, then one target pass over the whole batch (engine/engine_step.cc):
//   step_ms = sum over methods m with rows:   DraftMs(m, n_m, max K of m's rows, mean context of m)
//           + sum over stateful drafters d:   DraftMs(d, rows keeping d in sync, 1, their context)
//           + target pass
// A drafter runs as many passes as its longest draft, so a method's drafting costs the max K of
// its rows at its batch. The target pass is padded to the longest row (the CUDA runner's
// verification graphs are keyed by the longest chunk, and every row runs that many positions):
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
  return acceptance.Validate();
}

MethodSet ApplicableMethods(const PolicyEnvironment& env, const PolicyOptions& options,
                            int64_t context_len) {
  MethodSet s = {PolicyMethod::kPlain, PolicyMethod::kNgram};
  if (env.draft_model_loaded) s.Add(PolicyMethod::kDraftModel);
  if (env.speculator_connected) s.Add(PolicyMethod::kSsd);
  if (env.target_is_nsa) {
    s.Add(PolicyMethod::kSsv);
  } else if (context_len >= options.min_sparse_draft_context) {
    s.Add(PolicyMethod::kVegas);
    s.Add(PolicyMethod::kStreaming);
  }
  return s;
}

absl::StatusOr<std::unique_ptr<StrategyPolicy>> StrategyPolicy::Create(CostProfile profile,
                                                                       PolicyOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return std::unique_ptr<StrategyPolicy>(new StrategyPolicy(std::move(profile), options));
}

StrategyPolicy::Row StrategyPolicy::MakeRow(const PolicyRequest& request) const {
  Row row;
  row.id = request.id;
  row.context = request.context_len;
  MethodSet allowed =
      ApplicableMethods(env_, options_, request.context_len) & request.allowed & ~request.forbidden;
  const int32_t cap = std::clamp(std::min(options_.max_k, request.max_k), 0, kMaxPolicyK);
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
  for (const Strategy& c : row.candidates) {
    row.max_k = std::max(row.max_k, c.k);
    auto& e = row.expected[static_cast<int>(c.method)];
    if (static_cast<int32_t>(e.size()) > c.k) continue;
    e.resize(c.k + 1);
    for (int32_t k = 0; k <= c.k; ++k) e[k] = acceptance_.ExpectedCommitted(row.id, c.method, k);
  }
  if (options_.sync_paused_drafters) {
    if (auto it = held_.find(request.id); it != held_.end()) {
      row.sync_eligible = it->second.used_stateful & allowed & kStatefulDrafters;
    }
  }
  return row;
}

void StrategyPolicy::Tally::Add(const Row& row, const Strategy& s, int sign) {
  const int m = static_cast<int>(s.method);
  num_rows[m] += sign;
  num_at_k[m][s.k] += sign;
  context[m] += sign * row.context;
  all_context += sign * row.context;
  num_at_k_all[s.k] += sign;
  expected_tokens += sign * row.Expected(s);
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
  return est;
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
      if (rows[i].candidates.size() <= 1) continue;
      const Strategy held = choice[i];
      Strategy best = held;
      tally.Add(rows[i], held, -1);
      for (const Strategy& c : rows[i].candidates) {
        if (c == held) continue;
        tally.Add(rows[i], c, +1);
        // A strict improvement (relative, so rounding never cycles).
        if (const double r = Rate(Cost(tally, batch)); r > rate * (1 + 1e-9)) {
          rate = r;
          best = c;
        }
        tally.Add(rows[i], c, -1);
      }
      tally.Add(rows[i], best, +1);
      choice[i] = best;
      changed |= !(best == held);
    }
    if (!changed) break;
  }
}

PolicyDecision StrategyPolicy::Decide(std::span<const PolicyRequest> requests) {
  std::vector<Row> rows;
  rows.reserve(requests.size());
  for (const PolicyRequest& r : requests) rows.push_back(MakeRow(r));

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

  // Hysteresis (a): the whole batch.
  Tally held_tally = Count(rows, held);
  const double held_rate = Rate(Cost(held_tally, rows.size()));
  const double batch = std::max<double>(1, rows.size());
  const bool batch_better = Rate(Evaluate(rows, best)) > held_rate * (1 + options_.switch_margin);
  streak_ = batch_better ? streak_ + 1 : 0;
  std::vector<Strategy> chosen = held;
  PolicyDecision decision;
  if (streak_ >= options_.switch_patience) {
    chosen = best;
    streak_ = 0;
    decision.switched = chosen != held;
  }
  // Hysteresis (b): one request at a time, against its share of the batch.
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
    if (row_streak >= options_.switch_patience) {
      chosen[i] = best[i];
      row_streak = 0;
      decision.switched = true;
    }
  }

  const StepEstimate est = Evaluate(rows, chosen);
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
    rows.push_back(MakeRow(requests[i]));
    // Expected tokens for a strategy outside the request's candidates too.
    auto& e = rows[i].expected[static_cast<int>(choice[i].method)];
    for (int32_t k = static_cast<int32_t>(e.size()); k <= choice[i].k; ++k) {
      e.push_back(acceptance_.ExpectedCommitted(requests[i].id, choice[i].method, k));
    }
  }
  return Evaluate(rows, choice);
}

}  // namespace specd
