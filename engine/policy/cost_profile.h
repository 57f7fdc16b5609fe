// What a step costs on this device, per speculation method: plain decode, draft and verification
// step times measured at start-up (or by a tool) on a grid of batch sizes x tokens per sequence x
// context lengths, interpolated in between. StrategyPolicy (strategy_policy.h) turns these times
// and the acceptance estimates into a method and K per request. Saved and loaded as JSON.
// Immutable values once built; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/draft_method.h"
#include "engine/base/ssv.h"

namespace specd {

// The strategies a request can run: the one DraftMethod enum (engine/base/draft_method.h), under
// the policy's name; kPlain is kNone, and kAuto / kDefault are never a strategy.
using PolicyMethod = DraftMethod;
// Parallel drafting (PARD) is not a method of its own: it is how the server's one draft model
// drafts (`"parallel": true` in --speculative-config, never a request's choice), its requests
// run and report "draft_model", and its acceptance and KV are the draft model's. Only the cost
// of drafting K tokens differs (one pass over K tokens per row instead of K one-token passes),
// and the draft grid's tokens axis already says what K costs: a parallel draft's profile
// measures that pass there (MethodCosts::parallel records it).
inline constexpr int kNumPolicyMethods = kNumDraftMethods;
inline constexpr std::array<PolicyMethod, kNumPolicyMethods> kAllPolicyMethods = {
    PolicyMethod::kPlain, PolicyMethod::kDraftModel, PolicyMethod::kNgram, PolicyMethod::kSsd,
    PolicyMethod::kVegas, PolicyMethod::kStreaming,  PolicyMethod::kSsv,   PolicyMethod::kEagle3};

// "plain", "draft_model", "ngram", "ssd", "vegas", "streaming", "ssv", "eagle3".
const char* PolicyMethodName(PolicyMethod method);
// The inverse of PolicyMethodName; InvalidArgument naming the accepted values.
absl::StatusOr<PolicyMethod> ParsePolicyMethod(std::string_view name);

// Step times (milliseconds) sampled on a grid: [batch_sizes] x [tokens] x [contexts], each axis
// strictly ascending and positive. Between samples the time is piecewise linear along each axis
// (trilinear): a decode step is close to affine in each of them (weights read once per step, plus
// compute per token, plus KV reads per context token), so linear pieces between measured points
// are accurate where log-scale pieces would bend the wrong way. Below an axis' first sample the
// time is held at the first sample; past its last it is extended along the last segment (never
// falling below the last sample), so a batch larger than any measured costs more, not the same.
// An axis of one sample is constant along it.
class CostGrid {
 public:
  // ms: [batch_sizes.size()][tokens.size()][contexts.size()] row-major, each > 0 and finite.
  // InvalidArgument naming what is wrong.
  static absl::StatusOr<CostGrid> Create(std::vector<int32_t> batch_sizes,
                                         std::vector<int32_t> tokens, std::vector<int32_t> contexts,
                                         std::vector<double> ms);
  // A grid with the same time at every point (synthetic profiles in tests).
  static CostGrid Constant(double ms);

  double Ms(double batch, double tokens, double context) const;

  const std::vector<int32_t>& batch_sizes() const { return batch_sizes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& contexts() const { return contexts_; }
  const std::vector<double>& ms() const { return ms_; }  // [batch][tokens][context]
  int32_t max_tokens() const { return tokens_.back(); }

  // Where a value falls on one axis: between samples i0 and i1, at fraction t (> 1 when extended
  // past the last sample). Public for the interpolation helpers in cost_profile.cc.
  struct Segment {
    size_t i0 = 0;
    size_t i1 = 0;
    double t = 0;
  };

 private:
  CostGrid() = default;
  double Interpolate(const Segment& b, const Segment& t, const Segment& c) const;
  double At(size_t b, size_t t, size_t c) const {
    return ms_[(b * tokens_.size() + t) * contexts_.size() + c];
  }

  std::vector<int32_t> batch_sizes_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> contexts_;
  std::vector<double> ms_;
};

// One speculating method's costs. draft: time to draft K tokens (the tokens axis) for a batch of
// rows of this method, the whole Speculate stage for them (for SSD: the time the verifier waits;
// for EAGLE-3: the head's K steps); absent: drafting is free (n-gram). verify: the target pass
// over a batch whose rows carry K + 1 tokens (the tokens axis); absent: the profile's dense
// verification. Each grid is one named field of the method's JSON entry (kGridFields in
// cost_profile.cc), so a later kind of pass (tree verification: [batch] x [tree nodes] x
// [context]) is one more optional grid here and one more row of that table.
struct MethodCosts {
  std::optional<CostGrid> draft;
  std::optional<CostGrid> verify;
  // draft_model only: the draft grid times one parallel (PARD) pass of K tokens per row, not K
  // one-token passes. The profile says so, so that a server whose draft model drafts the other
  // way can tell that the profile does not describe it (Engine::CreatePolicy warns).
  bool parallel = false;
};

// An NSA target's verification under one SSV strategy (engine/base/ssv.h): the target pass over a
// batch whose rows carry K + 1 tokens (the tokens axis), its chunks grouped, masked and scheduled
// as the strategy says. The SSV planner (specd_profile --ssv, ssv_bench --tune) measures one per
// candidate strategy; SsvPlanner (ssv_planner.h) chooses among them per request and step.
struct SsvCosts {
  SsvStrategy strategy;
  CostGrid verify;
};

// The whole profile: the plain decode step (tokens axis [1]), the dense verification pass, and
// the methods that were measured. A method missing here is never chosen by `auto`.
class CostProfile {
 public:
  explicit CostProfile(CostGrid plain) : plain_(std::move(plain)) {}

  // Parses the JSON written by ToJson:
  //   {"version": 1, "device": "...", "models": "...",
  //    "plain": GRID, "verify": GRID,
  //    "methods": {"draft_model": {"draft": GRID, "parallel": true}, "ngram": {},
  //                "eagle3": {"draft": GRID}},
  //    "ssv": {"alpha": 0.8, "strategies": {"exact/c4/r1": {"verify": GRID}, ...}},
  //    "calibrate": false}   (optional; default true; "parallel" too, default false)
  //   GRID = {"batch": [1, 8], "tokens": [1, 5], "context": [512, 8192],
  //           "ms": [[[b0t0c0, b0t0c1], [b0t1c0, b0t1c1]], [[...], [...]]]}   //
  //           [batch][tokens][context]
  // "tokens" may be omitted (then [1]). InvalidArgument naming the line and column of a syntax
  // error, or the field path (e.g. "methods.vegas.verify.ms[1][0]") of a bad value, an unknown
  // field or method, a missing "verify" while methods are listed, a "parallel" that is not a
  // boolean or is on a method other than draft_model, an SSV strategy name that does not parse
  // ("mode/cC/rR") or an alpha outside (0, 1).
  static absl::StatusOr<CostProfile> FromJson(std::string_view text);
  static absl::StatusOr<CostProfile> Load(const std::string& path);
  std::string ToJson() const;
  absl::Status Save(const std::string& path) const;

  void SetVerify(CostGrid verify) { verify_ = std::move(verify); }
  // Also marks `method` measured. kPlain is ignored (its costs are the plain grid).
  void SetMethod(PolicyMethod method, MethodCosts costs);

  // An SSV strategy's verification grid (replacing one of the same strategy).
  void SetSsv(SsvStrategy strategy, CostGrid verify);
  // Drops the SSV strategies (a dense target's server loading an NSA target's profile).
  void ClearSsv() { ssv_.clear(); }
  // The measured SSV strategies, in the order set (a loaded profile: by name); empty: none (a dense
  // target, or an NSA target's profile without the planner: verification is the dense grid, the
  // server's strategy). The dense "verify" grid of an NSA target is its model's own attention
  // (exact/c1/r1).
  const std::vector<SsvCosts>& ssv() const { return ssv_; }

  bool Has(PolicyMethod method) const;  // kPlain always; others when measured
  // The method's costs as measured; null for kPlain and methods the profile lacks.
  const MethodCosts* Costs(PolicyMethod method) const;
  // Longest K the profile measured for `method` (its verification and draft grids), 0 for plain.
  int32_t MaxK(PolicyMethod method) const;

  double PlainMs(double batch, double context) const { return plain_.Ms(batch, 1, context); }
  // The target pass for `batch` rows of `method` at `tokens` per row: the method's own grid, else
  // the cheapest of the dense grid and the lossless SSV strategies' (what SsvPlanner runs for a
  // request that allows only those). Without any (an unmeasured method pinned by a request)
  // `tokens` plain steps, a pessimistic guess.
  double VerifyMs(PolicyMethod method, double batch, double tokens, double context) const;
  // Drafting `k` tokens for `batch` rows of `method`; 0 when it has no draft grid.
  double DraftMs(PolicyMethod method, double batch, double k, double context) const;
  // A stateful drafter's catch-up (its KV for tokens it has not run: a request's prompt on
  // first use, the tokens committed while it was paused), per token: its one-token pass at the
  // largest measured batch over that batch. Its passes there are memory-bound, so this is an
  // upper bound on a prefill's cost per token. 0 without a draft grid.
  double CatchUpMsPerToken(PolicyMethod method, double context) const;

  std::string device;  // what the profile was measured on (free text)
  std::string models;  // the target / draft pair (free text)
  // Whether the policy may scale these times by the step times it observes (StrategyPolicy's
  // online calibration). false: the times are final (a synthetic profile in a test, or an
  // operator's pinned one).
  bool calibrate = true;
  // The acceptance (probability a draft token is accepted, a chain's alpha) the SSV planner ranks
  // strategies at before a request has measured its own. In (0, 1).
  double ssv_alpha = 0.8;

 private:
  CostGrid plain_;
  std::optional<CostGrid> verify_;
  std::array<std::optional<MethodCosts>, kNumPolicyMethods> methods_;
  std::vector<SsvCosts> ssv_;
};

}  // namespace specd
