// What the two ends of SSD's channel agree on (engine/distributed/messages.h carries it): the Hello
// both send, under small fixed limits (the speculator learns the verifier's batch and context
// limits only from the SsdInit that follows), the wire limits both then switch to, built from the
// SsdInit's values, and how many q rows one response may carry. Shared by the verifier's
// SsdSpeculator and the speculator process (ssd_init.h). Pure; any thread.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/distributed/messages.h"
#include "engine/speculation/spec_config.h"

namespace specd {

// Most sampled drafts' q rows ([vocab] f32 each) one SpeculateResponse carries inline; sampled
// sequences beyond it get no drafts that round (lossless: they decode plainly).
inline constexpr uint32_t kSsdMaxProbRows = 256;

// Most bytes of target hidden states one SpeculateRequest carries (an EAGLE-3 head in the
// speculator): rows past it are not sent (the head then lacks those positions: drafts accept
// less, nothing else).
inline constexpr int64_t kSsdMaxHiddenBytes = int64_t{1} << 30;

// Limits for a verifier batching up to max_num_seqs sequences over `vocab` ids and prompts of up
// to max_model_len tokens; hidden_width > 0: requests carry hidden-state rows that wide.
inline WireLimits SsdWireLimits(int32_t vocab, int32_t max_num_seqs, int32_t max_model_len,
                                int32_t hidden_width = 0) {
  WireLimits l;
  l.max_batch = static_cast<uint32_t>(max_num_seqs);
  l.max_draft_tokens = static_cast<uint32_t>(kMaxSpeculativeTokens);
  l.max_fan_out = 64;
  l.vocab_size = static_cast<uint32_t>(vocab);
  l.max_seq_tokens = static_cast<uint32_t>(max_model_len);
  l.max_request_tokens = static_cast<uint32_t>(
      std::min<int64_t>(int64_t{max_num_seqs} * max_model_len, int64_t{4} << 20));
  l.max_prob_rows = kSsdMaxProbRows;
  l.max_release_ids = 4096;
  if (hidden_width > 0) {
    l.hidden_width = static_cast<uint32_t>(hidden_width);
    l.max_hidden_rows = static_cast<uint32_t>(std::max<int64_t>(
        1, std::min<int64_t>(l.max_request_tokens,
                             kSsdMaxHiddenBytes / (int64_t{hidden_width} * int64_t{4}))));
  }
  return l;
}

// The limits of the handshake and the init exchange (Hello, SsdInit, SsdReady have fixed sizes):
// no room for a round's messages until both ends switched to SsdWireLimits.
inline WireLimits SsdHandshakeLimits() {
  WireLimits l;
  l.max_batch = 1;
  l.max_draft_tokens = 1;
  l.max_fan_out = 0;
  l.vocab_size = 0;
  l.max_seq_tokens = 1;
  l.max_request_tokens = 1;
  l.max_prob_rows = 0;
  l.max_release_ids = 0;
  return l;
}

// Both ends' Hello: the same fingerprint and the handshake limits (what both models must share,
// the vocabulary, is checked by the speculator against the SsdInit once its draft is loaded).
inline Hello SsdHello(Role role) {
  Hello h;
  h.role = role;
  h.model_fingerprint = "specd-ssd";
  h.limits = SsdHandshakeLimits();
  return h;
}

}  // namespace specd
