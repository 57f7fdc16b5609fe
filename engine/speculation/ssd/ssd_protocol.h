// What the two ends of SSD's channel agree on (engine/distributed/messages.h carries it): the wire
// limits both build from the same inputs (the handshake refuses a peer whose limits differ), the
// model fingerprint, and how many q rows one response may carry. Shared by the verifier's
// SsdSpeculator and the speculator process's SsdWorker. Pure; any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/distributed/messages.h"
#include "engine/speculation/spec_config.h"

namespace specd {

// Most sampled drafts' q rows ([vocab] f32 each) one SpeculateResponse carries inline; sampled
// sequences beyond it get no drafts that round (lossless: they decode plainly).
inline constexpr uint32_t kSsdMaxProbRows = 256;

// Limits for a verifier batching up to max_num_seqs sequences over `vocab` ids and prompts of up
// to max_model_len tokens.
inline WireLimits SsdWireLimits(int32_t vocab, int32_t max_num_seqs, int32_t max_model_len) {
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
  return l;
}

// What both models must share: the vocabulary (the draft proposes the target's ids).
inline std::string SsdFingerprint(int32_t vocab) { return absl::StrCat("ssd;vocab=", vocab); }

}  // namespace specd
