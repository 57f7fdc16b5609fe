// Test helpers shared by messages_test.cc and distributed_test.cc: small limits, deterministic
// requests/responses derived from a round id (so two processes can check each other's messages
// without sharing state), one sample of every message type, and frame re-sealing for corruption
// tests. Test code only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/distributed/link_auth.h"
#include "engine/distributed/messages.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/distributed/wire.h"

namespace specd::distributed_test {

// Calls of the global operator new so far in this process (distributed_test_alloc.cc replaces it
// with a counting one), for the tests that steady-state encode/send/receive never allocate.
int64_t AllocationCount();

inline WireLimits TestLimits() {
  WireLimits l;
  l.max_batch = 8;
  l.max_draft_tokens = 6;
  l.max_fan_out = 16;
  l.vocab_size = 50;
  l.max_seq_tokens = 64;
  l.max_request_tokens = 256;
  l.max_prob_rows = 48;  // max_batch * max_draft_tokens: every draft may be sampled
  l.max_release_ids = 32;
  l.hidden_width = 3;  // an EAGLE-3 head's target rows (tiny)
  l.max_hidden_rows = 40;
  return l;
}

// The link secret both ends of a test hold (any fixed bytes).
inline LinkSecret TestSecret() {
  LinkSecret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = static_cast<uint8_t>(0xA5 ^ (i * 7));
  return s;
}

// Accept anyone who proves it holds TestSecret().
inline AcceptPolicy TestPolicy() { return AcceptPolicy{.secret = TestSecret()}; }

inline Hello MakeHello(Role role) {
  return Hello{.role = role,
               .protocol_version = kProtocolVersion,
               .model_fingerprint = "test-model;vocab=50;draft=0x5eed",
               .limits = TestLimits(),
               .nonce = {}};
}

// The verifier's request of round `round`: ragged, some new sequences (prompts), some sampled.
inline SpeculateRequest MakeRequest(uint64_t round, const WireLimits& limits) {
  std::mt19937 rng(static_cast<uint32_t>(round * 2654435761u + 1));
  SpeculateRequest r;
  r.round_id = round;
  const uint32_t num_seqs = 1 + static_cast<uint32_t>(round % limits.max_batch);
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
  uint32_t hidden_left = limits.max_hidden_rows;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    SpeculateSeq s;
    s.seq_id = 1000 + i;
    const bool is_new = (round + i) % 7 == 0;
    s.flags =
        static_cast<uint8_t>((is_new ? kSeqNew : 0) | ((round + i) % 3 == 0 ? kSeqWantProbs : 0) |
                             ((round + i) % 11 == 5 ? kSeqRelease : 0));
    s.accepted_len = is_new ? 0 : static_cast<uint16_t>(rng() % (limits.max_draft_tokens + 1));
    s.num_draft_tokens = static_cast<uint16_t>(1 + rng() % limits.max_draft_tokens);
    s.fan_out = static_cast<uint16_t>(rng() % (limits.max_fan_out + 1));
    if (s.flags & kSeqWantProbs) {
      s.sampling = DraftSampling{
          .temperature = 0.7f, .top_p = 0.9f, .top_k = 40, .min_p = 0.05f, .seed = round * 31 + i};
    }
    s.saguaro_c = 0.25f * static_cast<float>(rng() % 5);
    tokens.resize(is_new ? 1 + rng() % 20 : s.accepted_len + 1u);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % limits.vocab_size);
    SpeculateSeq& added = r.AddSeq(s, tokens);
    // Some sequences carry the target's hidden rows of the positions they commit.
    const auto rows = static_cast<uint32_t>(std::min<size_t>(tokens.size() - 1, hidden_left));
    if (limits.hidden_width > 0 && (round + i) % 2 == 0 && rows > 0) {
      hidden.resize(size_t{rows} * limits.hidden_width);
      for (float& h : hidden) h = static_cast<float>(rng() % 1000) / 8.0f - 60.0f;
      r.AddHidden(added, static_cast<uint32_t>(rng() % 8), hidden, limits.hidden_width);
      hidden_left -= rows;
    }
  }
  return r;
}

// The speculator's answer to `request`: drafts derived from each sequence's tokens, q rows for
// sampled sequences, statuses cycling through all four.
inline SpeculateResponse MakeResponse(const SpeculateRequest& request, const WireLimits& limits) {
  SpeculateResponse r;
  r.round_id = request.round_id;
  r.busy_ns = 1000 * request.round_id + 17;
  r.cache_build_ns = 500 * request.round_id;
  r.receive_ns = 11 * request.round_id + 1;
  r.triage_ns = 13 * request.round_id + 2;
  r.draft_ns = 17 * request.round_id + 3;
  r.reply_ns = 19 * request.round_id + 4;
  std::vector<int32_t> draft;
  std::vector<float> probs;
  for (const SpeculateSeq& s : request.seqs) {
    int64_t sum = 0;
    for (int32_t t : request.TokensOf(s)) sum += t;
    draft.resize(s.num_draft_tokens);
    for (size_t j = 0; j < draft.size(); ++j) {
      draft[j] = static_cast<int32_t>((sum + 7 * j + request.round_id) % limits.vocab_size);
    }
    probs.clear();
    if (s.flags & kSeqWantProbs) {
      probs.resize(draft.size() * limits.vocab_size);
      for (size_t k = 0; k < probs.size(); ++k) {
        probs[k] = static_cast<float>((k + request.round_id) % 97) / 97.0f;
      }
    }
    const auto status = static_cast<DraftStatus>((s.seq_id + request.round_id) % 4);
    r.AddDraft(s.seq_id, status, draft, probs);
  }
  return r;
}

// A CacheOffer of three branches (two outcomes of one sequence, one of another).
inline CacheOffer MakeOffer() {
  CacheOffer o;
  o.round_id = 13;
  o.cache_build_ns = 4'200'000;
  o.receive_ns = 31'000;
  o.triage_ns = 12'000;
  o.draft_ns = 0;
  const int32_t a[] = {5, 6, 7, 8}, b[] = {9, 1, 2, 3}, c[] = {4};
  o.AddDraft(7, 0, 11, a);
  o.AddDraft(7, 2, 12, b);
  o.AddDraft(0xFFFFFFFFFFFFFFFFull, 1, 49, c);
  return o;
}

// One non-trivial message of every type, in variant order.
inline std::vector<Message> AllSampleMessages() {
  const WireLimits limits = TestLimits();
  const SpeculateRequest request = MakeRequest(13, limits);
  std::vector<uint8_t> token(128);
  for (size_t i = 0; i < token.size(); ++i) token[i] = static_cast<uint8_t>(i * 37);
  return {MakeHello(Role::kSpeculator),
          HelloAck{.accepted = false,
                   .reason = "limits.max_batch differs",
                   .proof = std::vector<uint8_t>(32, 0x5a)},
          request,
          MakeResponse(request, limits),
          Release{.seq_ids = {1, 0xFFFFFFFFFFFFFFFFull, 42}},
          Heartbeat{.sent_unix_ns = 1718000000123456789},
          Shutdown{.reason = "draining"},
          BulkLinkInit{.kind = 1, .token = token},
          HelloAuth{.proof = std::vector<uint8_t>(32, 0xc3)},
          TpInit{.rank = 1,
                 .world_size = 2,
                 .model_dir = "/models/target",
                 .load_format = "auto",
                 .comm_kind = "shm",
                 .comm_token = {'a', 'b', '0', '1'},
                 .max_num_seqs = 8,
                 .kv_cache_bytes = 1 << 20},
          TpReady{.ok = true, .num_kv_blocks = 77, .device = "cpu (2 threads)", .reason = ""},
          TpStep{.step_id = 9,
                 .method = TpMethod::kGreedyVerify,
                 .seqs = {TpSeq{0, 3, 1, false, -1, 0}, TpSeq{40, 2, 3, false, 12, 1}},
                 .tokens = {1, 2, 3, 4, 5},
                 .block_ids = {0, 6, 7},  // the second chunk keeps 1 of its mirror's ids
                 .rows = {TpRow{0, -1, 0, 0, false}, TpRow{1, 0, 1, 4, true}},
                 .released = {3, 8}},
          TpJoin{.rank = 1, .host = "node-a"},
          SsdInit{.vocab_size = 50,
                  .max_num_seqs = 8,
                  .max_model_len = 1024,
                  .max_num_batched_tokens = 512,
                  .draft_model = "/models/draft",
                  .device = "cuda:1",
                  .num_threads = 3,
                  .block_size = 32,
                  .load_format = "dummy",
                  .gpu_memory_utilization = 0.45,
                  .draft_kv_cache_bytes = 1 << 24,
                  .num_speculative_tokens = 5,
                  .prompt_lookup_min = 2,
                  .prompt_lookup_max = 3,
                  .fan_out = 4,
                  .geometric_fan_out = false,
                  .critical_batch_size = 12,
                  .backup = "random",
                  .complete_cache = true,
                  .eagle3_head = "/models/head",
                  .target_model = "/models/target",
                  .hidden_width = 1152,
                  .cache_offers = true,
                  .replay_file = "/data/replay.jsonl",
                  .replay_alpha = 0.6,
                  .replay_candidate_hit = 0.85,
                  .replay_seed = 0xFFFFFFFFFFull},
          SsdReady{.ok = false, .device = "", .reason = "no such draft: /models/draft"},
          MakeOffer()};
}

// Encodes `message` into a plain byte vector (test convenience; fails the process on error).
inline std::vector<uint8_t> Encode(const Message& message, uint64_t sequence,
                                   const WireLimits& limits) {
  FrameBuffer buffer;
  const absl::Status status = EncodeFrame(message, sequence, limits, &buffer);
  if (!status.ok()) return {};
  return std::vector<uint8_t>(buffer.bytes().begin(), buffer.bytes().end());
}

// Makes the header's payload_bytes and checksum agree with the frame's current payload, so a
// corrupted payload reaches the field checks instead of failing the checksum.
inline void Reseal(std::vector<uint8_t>* frame) {
  const uint32_t payload = static_cast<uint32_t>(frame->size() - kFrameHeaderBytes);
  const uint32_t crc = Crc32c(std::span<const uint8_t>(*frame).subspan(kFrameHeaderBytes));
  for (int i = 0; i < 4; ++i) {
    (*frame)[16 + i] = static_cast<uint8_t>(payload >> (8 * i));
    (*frame)[20 + i] = static_cast<uint8_t>(crc >> (8 * i));
  }
}

}  // namespace specd::distributed_test
