// The one enum of speculation methods: how a request's speculation is configured
// (SpeculationMethod, engine/speculation/spec_config.h), which strategies `auto`'s policy prices
// (PolicyMethod, engine/policy/cost_profile.h) and which speculator the step pipeline drives
// (engine/step/speculator_set.h). Both old names are aliases of it.
//
// Values kNone .. kEagle3 are the strategies a row can run in one step, numbered densely so that
// per-method tables (policy estimates, usage, metrics) index by them; kAuto and kDefault are a
// request's choices that resolve to one of those. New drafting methods go before kAuto (and raise
// kNumDraftMethods); a request's speculation.policy.forbid is a bit set over the values.
#pragma once

#include <cstdint>

namespace specd {

enum class DraftMethod : int8_t {
  kNone = 0,        // no drafts: one token per step (K 0)
  kPlain = kNone,   // the policy's name for it
  kDraftModel = 1,  // a smaller model drafts K tokens (stateful: its own KV)
  kNgram = 2,       // prompt lookup (stateless, drafting costs ~nothing)
  kSsd = 3,         // speculative speculative decoding: a speculator process (stateful)
  kVegas = 4,       // self-speculation with sparse attention chosen by verification scores
  kStreaming = 5,   // self-speculation with a streaming (sink + window) attention
  kSsv = 6,         // sparse verification of NSA models (how an NSA target verifies; no drafter)
  kEagle3 = 7,      // an EAGLE-3 head drafts K tokens from the target's own hidden states
  kAuto = 8,        // a request's choice: the strategy policy picks a method and K per step
  kDefault = 9,     // a request that said nothing: the server's default applies
};

// Strategies a row can run in one step: kNone .. kEagle3.
inline constexpr int kNumDraftMethods = 8;

// The index of a strategy in per-method tables (0 .. kNumDraftMethods - 1).
constexpr int DraftMethodIndex(DraftMethod m) { return static_cast<int>(m); }

}  // namespace specd
