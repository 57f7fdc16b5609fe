// Field layouts of the SSD link's init exchange (messages.h: SsdInit, SsdReady), in the style of
// message_fields.cc: Check before encoding, Put in wire order, Get applying the same checks while
// it reads. The checks here keep every value castable to the engine's types; what the values
// mean (K, the fan-out, the backup's name) the speculator checks once it decoded them.
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/distributed/message_fields.h"

namespace specd::dist_internal {
namespace {

constexpr uint64_t kTextBytes = 2 + kMaxTextBytes;
// Sizes: 4 u32; draft_model, device; num_threads, block_size; load_format; gpu share, KV bytes;
// K, lookup min and max, fan_out; geometric; critical batch; backup; complete, parallel, time
// budget, bulk link; head, target, hidden width; cache offers; replay.
constexpr uint64_t kSsdInitBytes = 4 * 4 + 2 * kTextBytes + 2 * 4 + kTextBytes + 8 + 8 + 4 * 4 + 1 +
                                   4 + kTextBytes + 4 + 2 * kTextBytes + 4 + 1 + kTextBytes + 8 +
                                   8 + 8;
constexpr uint64_t kSsdReadyBytes = 1 + 2 * kTextBytes + 1;
// CacheOffer: round id and four stage times, the count; per draft seq id, k, bonus, length.
constexpr uint64_t kOfferFixedBytes = 5 * 8 + 4;
constexpr uint64_t kOfferDraftBytes = 8 + 2 + 4 + 2;
constexpr uint32_t kMaxInt32 = static_cast<uint32_t>(std::numeric_limits<int32_t>::max());

// A count the engine holds as int32: in [lo, 2^31).
void CheckCount(uint32_t v, uint32_t lo, const char* field, FieldErrors* e) {
  if (v < lo || v > kMaxInt32) {
    e->Fail(field, absl::StrCat(v, " outside [", lo, ", ", kMaxInt32, "]"));
  }
}

void CheckFraction(double v, bool zero_ok, const char* field, FieldErrors* e) {
  if (!(v >= 0.0 && v <= 1.0) || (!zero_ok && v == 0.0)) {  // NaN fails too
    e->Fail(field, absl::StrCat(v, " outside ", zero_ok ? "[0, 1]" : "(0, 1]"));
  }
}

// A bool byte: 0 or 1.
bool GetBool(ByteReader& r, const char* field) {
  const uint8_t v = r.U8(field);
  if (r.ok() && v > 1) r.Fail(field, absl::StrCat("not a bool: ", v));
  return v == 1;
}

}  // namespace

// ---- SsdInit ----
void Check(const SsdInit& m, const WireLimits&, FieldErrors* e) {
  CheckCount(m.vocab_size, 1, "vocab_size", e);
  CheckCount(m.max_num_seqs, 1, "max_num_seqs", e);
  CheckCount(m.max_model_len, 1, "max_model_len", e);
  CheckCount(m.max_num_batched_tokens, 1, "max_num_batched_tokens", e);
  CheckText(m.draft_model, "draft_model", e);
  CheckText(m.device, "device", e);
  CheckCount(m.num_threads, 0, "num_threads", e);
  CheckCount(m.block_size, 1, "block_size", e);
  CheckText(m.load_format, "load_format", e);
  CheckFraction(m.gpu_memory_utilization, false, "gpu_memory_utilization", e);
  if (m.draft_kv_cache_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    e->Fail("draft_kv_cache_bytes", absl::StrCat(m.draft_kv_cache_bytes, " > 2^63 - 1"));
  }
  CheckCount(m.num_speculative_tokens, 0, "num_speculative_tokens", e);
  CheckCount(m.prompt_lookup_min, 0, "prompt_lookup_min", e);
  CheckCount(m.prompt_lookup_max, 0, "prompt_lookup_max", e);
  CheckCount(m.fan_out, 0, "fan_out", e);
  CheckCount(m.critical_batch_size, 0, "critical_batch_size", e);
  CheckText(m.backup, "backup", e);
  CheckText(m.eagle3_head, "eagle3_head", e);
  CheckText(m.target_model, "target_model", e);
  if (m.eagle3_head.empty() != (m.hidden_width == 0)) {
    e->Fail("hidden_width", "set exactly when an EAGLE-3 head is named");
  }
  CheckText(m.replay_file, "replay_file", e);
  CheckFraction(m.replay_alpha, true, "replay_alpha", e);
  CheckFraction(m.replay_candidate_hit, true, "replay_candidate_hit", e);
}
void Put(const SsdInit& m, const WireLimits&, ByteWriter& w) {
  for (uint32_t v : {m.vocab_size, m.max_num_seqs, m.max_model_len, m.max_num_batched_tokens}) {
    w.U32(v);
  }
  w.Text(m.draft_model);
  w.Text(m.device);
  w.U32(m.num_threads);
  w.U32(m.block_size);
  w.Text(m.load_format);
  w.F64(m.gpu_memory_utilization);
  w.U64(m.draft_kv_cache_bytes);
  for (uint32_t v :
       {m.num_speculative_tokens, m.prompt_lookup_min, m.prompt_lookup_max, m.fan_out}) {
    w.U32(v);
  }
  w.U8(m.geometric_fan_out ? 1 : 0);
  w.U32(m.critical_batch_size);
  w.Text(m.backup);
  w.U8(m.complete_cache ? 1 : 0);
  w.U8(m.parallel_drafting ? 1 : 0);
  w.U8(m.time_budget ? 1 : 0);
  w.U8(m.bulk_link ? 1 : 0);
  w.Text(m.eagle3_head);
  w.Text(m.target_model);
  w.U32(m.hidden_width);
  w.U8(m.cache_offers ? 1 : 0);
  w.Text(m.replay_file);
  w.F64(m.replay_alpha);
  w.F64(m.replay_candidate_hit);
  w.U64(m.replay_seed);
}
void Get(ByteReader& r, const WireLimits& l, SsdInit* m) {
  m->vocab_size = r.U32("vocab_size");
  m->max_num_seqs = r.U32("max_num_seqs");
  m->max_model_len = r.U32("max_model_len");
  m->max_num_batched_tokens = r.U32("max_num_batched_tokens");
  r.Text("draft_model", kMaxTextBytes, &m->draft_model);
  r.Text("device", kMaxTextBytes, &m->device);
  m->num_threads = r.U32("num_threads");
  m->block_size = r.U32("block_size");
  r.Text("load_format", kMaxTextBytes, &m->load_format);
  m->gpu_memory_utilization = r.F64("gpu_memory_utilization");
  m->draft_kv_cache_bytes = r.U64("draft_kv_cache_bytes");
  m->num_speculative_tokens = r.U32("num_speculative_tokens");
  m->prompt_lookup_min = r.U32("prompt_lookup_min");
  m->prompt_lookup_max = r.U32("prompt_lookup_max");
  m->fan_out = r.U32("fan_out");
  m->geometric_fan_out = GetBool(r, "geometric_fan_out");
  m->critical_batch_size = r.U32("critical_batch_size");
  r.Text("backup", kMaxTextBytes, &m->backup);
  m->complete_cache = GetBool(r, "complete_cache");
  m->parallel_drafting = GetBool(r, "parallel_drafting");
  m->time_budget = GetBool(r, "time_budget");
  m->bulk_link = GetBool(r, "bulk_link");
  r.Text("eagle3_head", kMaxTextBytes, &m->eagle3_head);
  r.Text("target_model", kMaxTextBytes, &m->target_model);
  m->hidden_width = r.U32("hidden_width");
  m->cache_offers = GetBool(r, "cache_offers");
  r.Text("replay_file", kMaxTextBytes, &m->replay_file);
  m->replay_alpha = r.F64("replay_alpha");
  m->replay_candidate_hit = r.F64("replay_candidate_hit");
  m->replay_seed = r.U64("replay_seed");
  if (r.ok()) Check(*m, l, &r);
}

// ---- SsdReady ----
void Check(const SsdReady& m, const WireLimits&, FieldErrors* e) {
  CheckText(m.device, "device", e);
  CheckText(m.reason, "reason", e);
}
void Put(const SsdReady& m, const WireLimits&, ByteWriter& w) {
  w.U8(m.ok ? 1 : 0);
  w.Text(m.device);
  w.Text(m.reason);
  w.U8(m.bulk_link ? 1 : 0);
}
void Get(ByteReader& r, const WireLimits&, SsdReady* m) {
  m->ok = GetBool(r, "ok");
  r.Text("device", kMaxTextBytes, &m->device);
  r.Text("reason", kMaxTextBytes, &m->reason);
  m->bulk_link = GetBool(r, "bulk_link");
}

// ---- CacheOffer ----
namespace {
// An offered branch's fixed fields (its tokens are checked separately).
void CheckOfferedDraft(const OfferedDraft& d, const WireLimits& limits, FieldErrors* e) {
  if (d.accepted_len > limits.max_draft_tokens) {
    e->Fail("drafts[].accepted_len",
            absl::StrCat(d.accepted_len, " > max_draft_tokens ", limits.max_draft_tokens));
  }
  if (d.num_tokens > limits.max_draft_tokens) {
    e->Fail("drafts[].num_tokens",
            absl::StrCat(d.num_tokens, " > max_draft_tokens ", limits.max_draft_tokens));
  }
  const int32_t bonus[] = {d.bonus};
  CheckTokenIds(bonus, limits, "drafts[].bonus", e);
}
}  // namespace

void Check(const CacheOffer& m, const WireLimits& limits, FieldErrors* e) {
  if (m.drafts.size() > CacheOffer::MaxDrafts(limits)) {
    return e->Fail("num_drafts",
                   absl::StrCat(m.drafts.size(), " > limit ", CacheOffer::MaxDrafts(limits)));
  }
  for (size_t i = 0; i < m.drafts.size() && e->ok(); ++i) {
    const OfferedDraft& d = m.drafts[i];
    e->SetItem(i);
    CheckOfferedDraft(d, limits, e);
    if (uint64_t{d.token_offset} + d.num_tokens > m.tokens.size()) {
      return e->Fail("drafts[].token_offset", "tokens out of range of CacheOffer::tokens");
    }
    CheckTokenIds(m.TokensOf(d), limits, "drafts[].tokens", e);
  }
}
void Put(const CacheOffer& m, const WireLimits&, ByteWriter& w) {
  for (uint64_t v : {m.round_id, m.cache_build_ns, m.receive_ns, m.triage_ns, m.draft_ns}) w.U64(v);
  w.U32(static_cast<uint32_t>(m.drafts.size()));
  for (const OfferedDraft& d : m.drafts) {
    w.U64(d.seq_id);
    w.U16(d.accepted_len);
    w.I32(d.bonus);
    w.U16(static_cast<uint16_t>(d.num_tokens));
    w.I32Array(m.TokensOf(d));
  }
}
void Get(ByteReader& r, const WireLimits& limits, CacheOffer* m) {
  m->round_id = r.U64("round_id");
  m->cache_build_ns = r.U64("cache_build_ns");
  m->receive_ns = r.U64("receive_ns");
  m->triage_ns = r.U64("triage_ns");
  m->draft_ns = r.U64("draft_ns");
  const uint32_t n = r.U32("num_drafts");
  if (!r.ok()) return;
  if (n > CacheOffer::MaxDrafts(limits)) {
    return r.Fail("num_drafts", absl::StrCat(n, " > limit ", CacheOffer::MaxDrafts(limits)));
  }
  m->drafts.resize(n);
  m->tokens.clear();
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    r.SetItem(i);
    OfferedDraft& d = m->drafts[i];
    d.seq_id = r.U64("drafts[].seq_id");
    d.accepted_len = r.U16("drafts[].accepted_len");
    d.bonus = r.I32("drafts[].bonus");
    d.num_tokens = r.U16("drafts[].num_tokens");
    if (!r.ok()) return;
    CheckOfferedDraft(d, limits, &r);
    if (!r.ok()) return;
    d.token_offset = static_cast<uint32_t>(m->tokens.size());
    m->tokens.resize(d.token_offset + d.num_tokens);
    r.I32Array("drafts[].tokens", d.num_tokens, m->tokens.data() + d.token_offset);
    if (r.ok()) CheckTokenIds(m->TokensOf(d), limits, "drafts[].tokens", &r);
  }
}

uint64_t MaxSsdInitPayloadBytes(MessageType type, const WireLimits& limits) {
  switch (type) {
    case MessageType::kSsdInit:
      return kSsdInitBytes;
    case MessageType::kSsdReady:
      return kSsdReadyBytes;
    case MessageType::kCacheOffer:
      return kOfferFixedBytes +
             (kOfferDraftBytes + 4ull * limits.max_draft_tokens) * CacheOffer::MaxDrafts(limits);
    default:
      return 0;
  }
}

}  // namespace specd::dist_internal
