// Field layouts of every message type: what the encoder checks before writing (Check), the field
// order on the wire (Put), and the decoder, which applies the same checks while it reads (Get).
#include "engine/distributed/message_fields.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specd::dist_internal {

void CheckText(const std::string& text, const char* field, FieldErrors* e) {
  if (text.size() > kMaxTextBytes)
    e->Fail(field, absl::StrCat("length ", text.size(), " > limit ", kMaxTextBytes));
}

void CheckTokenIds(std::span<const int32_t> ids, const WireLimits& limits, const char* field,
                   FieldErrors* e) {
  const int64_t vocab = limits.vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab)) {
      return e->Fail(field, absl::StrCat("token ", i, " is ", ids[i], ", outside [0, ",
                                         vocab > 0 ? absl::StrCat(vocab) : "2^31", ")"));
    }
  }
}

namespace {

// Frozen Hello/HelloAck layouts may grow in later versions; this bounds what we read of them.
constexpr uint64_t kRequestFixedBytes = 8 + 8 + 1 + 4;
constexpr uint64_t kRequestSeqBytes = 8 + 1 + 2 + 2 + 2 + 4 + 4 + 4 + 4 + 8 + 4 + 4 + 4 + 4;
constexpr uint64_t kResponseFixedBytes = 8 + 8 + 8 + 4 * 8 + 1 + 4;
constexpr uint64_t kResponseDraftBytes = 8 + 1 + 1 + 2;

// --- shared checks --------------------------------------------------------------------------

bool InUnitInterval(float v) { return v >= 0.0f && v <= 1.0f; }  // false for NaN

// The fixed fields of one request sequence (its tokens are checked separately).
void CheckSeq(const SpeculateSeq& s, const WireLimits& limits, FieldErrors* e) {
  if (s.flags & ~kSeqKnownFlags)
    e->Fail("seqs[].flags", absl::StrFormat("unknown bits 0x%02x", s.flags & ~kSeqKnownFlags));
  if (s.accepted_len > limits.max_draft_tokens) {
    e->Fail("seqs[].accepted_len",
            absl::StrCat(s.accepted_len, " > max_draft_tokens ", limits.max_draft_tokens));
  }
  if (s.accepted_len > s.num_tokens) {
    e->Fail("seqs[].accepted_len", absl::StrCat(s.accepted_len, " > num_tokens ", s.num_tokens));
  }
  if ((s.flags & kSeqNew) && (s.accepted_len != 0 || s.num_tokens == 0)) {
    e->Fail("seqs[].num_tokens", "a new sequence needs its prompt and accepted_len 0");
  }
  if (s.num_draft_tokens > limits.max_draft_tokens) {
    e->Fail("seqs[].num_draft_tokens",
            absl::StrCat(s.num_draft_tokens, " > max_draft_tokens ", limits.max_draft_tokens));
  }
  if (s.fan_out > limits.max_fan_out) {
    e->Fail("seqs[].fan_out", absl::StrCat(s.fan_out, " > max_fan_out ", limits.max_fan_out));
  }
  const DraftSampling& p = s.sampling;
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f)) {
    e->Fail("seqs[].temperature", absl::StrCat(p.temperature, " is not finite and >= 0"));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    e->Fail("seqs[].top_p", absl::StrCat(p.top_p, " outside (0, 1]"));
  if (p.top_k < -1) e->Fail("seqs[].top_k", absl::StrCat(p.top_k, " < -1"));
  if (!InUnitInterval(p.min_p)) e->Fail("seqs[].min_p", absl::StrCat(p.min_p, " outside [0, 1]"));
  if (!InUnitInterval(s.saguaro_c))
    e->Fail("seqs[].saguaro_c", absl::StrCat(s.saguaro_c, " outside [0, 1]"));
  if ((s.flags & kSeqWantProbs) && limits.vocab_size == 0) {
    e->Fail("seqs[].flags", "q rows wanted but vocab_size is 0");
  }
  if (s.num_tokens > limits.max_seq_tokens) {
    e->Fail("seqs[].num_tokens",
            absl::StrCat(s.num_tokens, " > max_seq_tokens ", limits.max_seq_tokens));
  }
}

void CheckDraft(const SpeculateDraft& d, const WireLimits& limits, FieldErrors* e) {
  if (static_cast<uint8_t>(d.status) > static_cast<uint8_t>(DraftStatus::kMissBackup)) {
    e->Fail("drafts[].status", absl::StrCat("unknown value ", static_cast<int>(d.status)));
  }
  if (d.num_tokens > limits.max_draft_tokens) {
    e->Fail("drafts[].num_tokens",
            absl::StrCat(d.num_tokens, " > max_draft_tokens ", limits.max_draft_tokens));
  }
  if (d.has_probs && limits.vocab_size == 0)
    e->Fail("drafts[].has_probs", "set but vocab_size is 0");
}

void PutLimits(const WireLimits& l, ByteWriter& w) {
  for (uint32_t v : {l.max_batch, l.max_draft_tokens, l.max_fan_out, l.vocab_size, l.max_seq_tokens,
                     l.max_request_tokens, l.max_prob_rows, l.max_release_ids, l.hidden_width,
                     l.max_hidden_rows}) {
    w.U32(v);
  }
}

void GetLimits(ByteReader& r, WireLimits* l) {
  for (uint32_t* v : {&l->max_batch, &l->max_draft_tokens, &l->max_fan_out, &l->vocab_size,
                      &l->max_seq_tokens, &l->max_request_tokens, &l->max_prob_rows,
                      &l->max_release_ids, &l->hidden_width, &l->max_hidden_rows}) {
    *v = r.U32("limits");
  }
}

// A u16 length and that many bytes, at most `max_bytes`.
void CheckBytes(const std::vector<uint8_t>& bytes, size_t max_bytes, const char* field,
                FieldErrors* e) {
  if (bytes.size() > max_bytes)
    e->Fail(field, absl::StrCat("length ", bytes.size(), " > limit ", max_bytes));
}

void PutBytes(const std::vector<uint8_t>& bytes, ByteWriter& w) {
  w.U16(static_cast<uint16_t>(bytes.size()));
  w.Bytes(bytes);
}

void GetBytes(ByteReader& r, size_t max_bytes, const char* field, std::vector<uint8_t>* out) {
  const uint16_t n = r.U16(field);
  if (!r.ok()) return;
  if (n > max_bytes) return r.Fail(field, absl::StrCat("length ", n, " > limit ", max_bytes));
  if (r.remaining() < n) {
    r.Bytes(field, n, nullptr);  // records the truncation without writing
    return;
  }
  out->resize(n);
  r.Bytes(field, n, out->data());
}

}  // namespace

void Check(const Hello& m, const WireLimits&, FieldErrors* e) {
  if (m.role < Role::kVerifier || m.role > Role::kTpWorker) e->Fail("role", "unknown role");
  CheckText(m.model_fingerprint, "model_fingerprint", e);
  CheckBytes(m.nonce, kHelloNonceBytes, "nonce", e);
}
void Put(const Hello& m, const WireLimits&, ByteWriter& w) {
  w.U8(static_cast<uint8_t>(m.role));
  w.U16(m.protocol_version);
  w.Text(m.model_fingerprint);
  PutLimits(m.limits, w);
  if (m.protocol_version >= 2) PutBytes(m.nonce, w);  // appended in version 2
}
void Get(ByteReader& r, const WireLimits&, Hello* m) {
  const uint8_t role = r.U8("role");
  if (r.ok() && (role < 1 || role > 4)) r.Fail("role", absl::StrCat("unknown value ", role));
  m->role = static_cast<Role>(role);
  m->protocol_version = r.U16("protocol_version");
  r.Text("model_fingerprint", kMaxTextBytes, &m->model_fingerprint);
  GetLimits(r, &m->limits);
  m->nonce.clear();  // appended in version 2: a version-1 Hello ends here
  if (r.ok() && m->protocol_version >= 2) GetBytes(r, kHelloNonceBytes, "nonce", &m->nonce);
}

void Check(const HelloAck& m, const WireLimits&, FieldErrors* e) {
  CheckText(m.reason, "reason", e);
  CheckBytes(m.proof, kMaxProofBytes, "proof", e);
}
void Put(const HelloAck& m, const WireLimits&, ByteWriter& w) {
  w.U8(m.accepted ? 1 : 0);
  w.Text(m.reason);
  PutBytes(m.proof, w);  // appended in version 2
}
void Get(ByteReader& r, const WireLimits&, HelloAck* m) {
  const uint8_t accepted = r.U8("accepted");
  if (r.ok() && accepted > 1) r.Fail("accepted", absl::StrCat("not a bool: ", accepted));
  m->accepted = accepted == 1;
  r.Text("reason", kMaxTextBytes, &m->reason);
  m->proof.clear();  // a version-1 verifier's HelloAck ends here
  if (r.ok() && r.remaining() > 0) GetBytes(r, kMaxProofBytes, "proof", &m->proof);
}

void Check(const HelloAuth& m, const WireLimits&, FieldErrors* e) {
  CheckBytes(m.proof, kMaxProofBytes, "proof", e);
}
void Put(const HelloAuth& m, const WireLimits&, ByteWriter& w) { PutBytes(m.proof, w); }
void Get(ByteReader& r, const WireLimits&, HelloAuth* m) {
  GetBytes(r, kMaxProofBytes, "proof", &m->proof);
}

void Check(const SpeculateRequest& m, const WireLimits& limits, FieldErrors* e) {
  if (m.seqs.size() > limits.max_batch) {
    return e->Fail("num_seqs", absl::StrCat(m.seqs.size(), " > max_batch ", limits.max_batch));
  }
  uint64_t total = 0, hidden_rows = 0;
  for (size_t i = 0; i < m.seqs.size() && e->ok(); ++i) {
    const SpeculateSeq& s = m.seqs[i];
    e->SetItem(i);
    CheckSeq(s, limits, e);
    if (uint64_t{s.token_offset} + s.num_tokens > m.tokens.size()) {
      return e->Fail("seqs[].token_offset", "tokens out of range of SpeculateRequest::tokens");
    }
    CheckTokenIds(m.TokensOf(s), limits, "seqs[].tokens", e);
    total += s.num_tokens;
    if (m.hidden_out_of_band && s.num_hidden > 0 &&
        s.hidden_offset != hidden_rows * limits.hidden_width) {
      return e->Fail("seqs[].hidden_offset", "out-of-band rows not in the sequences' order");
    }
    hidden_rows += s.num_hidden;
    if (!m.hidden_out_of_band && s.num_hidden > 0 &&
        s.hidden_offset + uint64_t{s.num_hidden} * limits.hidden_width > m.hidden.size()) {
      return e->Fail("seqs[].hidden_offset", "rows out of range of SpeculateRequest::hidden");
    }
  }
  if (m.hidden_out_of_band && !m.hidden.empty()) {
    e->Fail("hidden", "inline rows with hidden_out_of_band");
  }
  if (total > limits.max_request_tokens) {
    e->Fail("tokens",
            absl::StrCat(total, " new tokens > max_request_tokens ", limits.max_request_tokens));
  }
  if (hidden_rows > limits.max_hidden_rows) {
    e->Fail("hidden",
            absl::StrCat(hidden_rows, " hidden rows > max_hidden_rows ", limits.max_hidden_rows));
  }
}
void Put(const SpeculateRequest& m, const WireLimits& limits, ByteWriter& w) {
  w.U64(m.round_id);
  w.U64(m.window_ns);
  w.U8(m.hidden_out_of_band ? 1 : 0);
  w.U32(static_cast<uint32_t>(m.seqs.size()));
  for (const SpeculateSeq& s : m.seqs) {
    w.U64(s.seq_id);
    w.U8(s.flags);
    w.U16(s.accepted_len);
    w.U16(s.num_draft_tokens);
    w.U16(s.fan_out);
    w.F32(s.sampling.temperature);
    w.F32(s.sampling.top_p);
    w.I32(s.sampling.top_k);
    w.F32(s.sampling.min_p);
    w.U64(s.sampling.seed);
    w.F32(s.saguaro_c);
    w.U32(s.num_tokens);
    w.I32Array(m.TokensOf(s));
    w.U32(s.hidden_position);
    w.U32(s.num_hidden);
    w.F32Array(m.HiddenOf(s, limits.hidden_width));
  }
}
void Get(ByteReader& r, const WireLimits& limits, SpeculateRequest* m) {
  m->round_id = r.U64("round_id");
  m->window_ns = r.U64("window_ns");
  const uint8_t out_of_band = r.U8("hidden_out_of_band");
  if (r.ok() && out_of_band > 1) r.Fail("hidden_out_of_band", "not a bool");
  m->hidden_out_of_band = out_of_band == 1;
  const uint32_t num_seqs = r.U32("num_seqs");
  if (!r.ok()) return;
  if (num_seqs > limits.max_batch) {
    return r.Fail("num_seqs", absl::StrCat(num_seqs, " > max_batch ", limits.max_batch));
  }
  m->seqs.resize(num_seqs);
  m->tokens.clear();
  m->hidden.clear();
  uint64_t hidden_rows = 0;
  for (uint32_t i = 0; i < num_seqs && r.ok(); ++i) {
    r.SetItem(i);
    SpeculateSeq& s = m->seqs[i];
    s.seq_id = r.U64("seqs[].seq_id");
    s.flags = r.U8("seqs[].flags");
    s.accepted_len = r.U16("seqs[].accepted_len");
    s.num_draft_tokens = r.U16("seqs[].num_draft_tokens");
    s.fan_out = r.U16("seqs[].fan_out");
    s.sampling.temperature = r.F32("seqs[].temperature");
    s.sampling.top_p = r.F32("seqs[].top_p");
    s.sampling.top_k = r.I32("seqs[].top_k");
    s.sampling.min_p = r.F32("seqs[].min_p");
    s.sampling.seed = r.U64("seqs[].seed");
    s.saguaro_c = r.F32("seqs[].saguaro_c");
    s.num_tokens = r.U32("seqs[].num_tokens");
    if (!r.ok()) return;
    CheckSeq(s, limits, &r);
    if (!r.ok()) return;
    s.token_offset = static_cast<uint32_t>(m->tokens.size());
    if (uint64_t{s.token_offset} + s.num_tokens > limits.max_request_tokens) {
      return r.Fail("seqs[].num_tokens",
                    absl::StrCat("request total > max_request_tokens ", limits.max_request_tokens));
    }
    m->tokens.resize(s.token_offset + s.num_tokens);
    r.I32Array("seqs[].tokens", s.num_tokens, m->tokens.data() + s.token_offset);
    if (r.ok()) CheckTokenIds(m->TokensOf(s), limits, "seqs[].tokens", &r);
    s.hidden_position = r.U32("seqs[].hidden_position");
    s.num_hidden = r.U32("seqs[].num_hidden");
    if (!r.ok()) return;
    // As AddSeq / AddHidden / AddHiddenOutOfBand set it.
    s.hidden_offset = s.num_hidden == 0       ? 0
                      : m->hidden_out_of_band ? hidden_rows * limits.hidden_width
                                              : m->hidden.size();
    hidden_rows += s.num_hidden;
    if (hidden_rows > limits.max_hidden_rows) {
      return r.Fail("seqs[].num_hidden",
                    absl::StrCat("request total > max_hidden_rows ", limits.max_hidden_rows));
    }
    if (uint64_t{s.hidden_position} + s.num_hidden > limits.max_seq_tokens) {
      return r.Fail("seqs[].hidden_position",
                    absl::StrCat(s.hidden_position, " + ", s.num_hidden, " > max_seq_tokens ",
                                 limits.max_seq_tokens));
    }
    const size_t floats = size_t{s.num_hidden} * limits.hidden_width;
    if (floats == 0 || m->hidden_out_of_band) continue;
    m->hidden.resize(s.hidden_offset + floats);
    r.F32Array("seqs[].hidden", floats, m->hidden.data() + s.hidden_offset);
  }
}

void Check(const SpeculateResponse& m, const WireLimits& limits, FieldErrors* e) {
  if (m.drafts.size() > limits.max_batch) {
    return e->Fail("num_seqs", absl::StrCat(m.drafts.size(), " > max_batch ", limits.max_batch));
  }
  if (m.probs_out_of_band && !m.probs.empty())
    e->Fail("probs", "inline rows with probs_out_of_band");
  uint64_t inline_rows = 0;
  for (size_t i = 0; i < m.drafts.size() && e->ok(); ++i) {
    const SpeculateDraft& d = m.drafts[i];
    e->SetItem(i);
    CheckDraft(d, limits, e);
    if (uint64_t{d.token_offset} + d.num_tokens > m.tokens.size()) {
      return e->Fail("drafts[].token_offset", "tokens out of range of SpeculateResponse::tokens");
    }
    CheckTokenIds(m.TokensOf(d), limits, "drafts[].tokens", e);
    if (d.has_probs && !m.probs_out_of_band) {
      inline_rows += d.num_tokens;
      if (d.probs_offset + uint64_t{d.num_tokens} * limits.vocab_size > m.probs.size()) {
        e->Fail("drafts[].probs_offset", "q rows out of range of SpeculateResponse::probs");
      }
    }
  }
  if (inline_rows > limits.max_prob_rows) {
    e->Fail("probs",
            absl::StrCat(inline_rows, " inline q rows > max_prob_rows ", limits.max_prob_rows));
  }
}
void Put(const SpeculateResponse& m, const WireLimits& limits, ByteWriter& w) {
  w.U64(m.round_id);
  w.U64(m.busy_ns);
  w.U64(m.cache_build_ns);
  for (uint64_t ns : {m.receive_ns, m.triage_ns, m.draft_ns, m.reply_ns}) w.U64(ns);
  w.U8(m.probs_out_of_band ? 1 : 0);
  w.U32(static_cast<uint32_t>(m.drafts.size()));
  for (const SpeculateDraft& d : m.drafts) {
    w.U64(d.seq_id);
    w.U8(static_cast<uint8_t>(d.status));
    w.U8(d.has_probs ? 1 : 0);
    w.U16(static_cast<uint16_t>(d.num_tokens));
    w.I32Array(m.TokensOf(d));
    if (d.has_probs && !m.probs_out_of_band) w.F32Array(m.ProbsOf(d, limits.vocab_size));
  }
}
void Get(ByteReader& r, const WireLimits& limits, SpeculateResponse* m) {
  m->round_id = r.U64("round_id");
  m->busy_ns = r.U64("busy_ns");
  m->cache_build_ns = r.U64("cache_build_ns");
  m->receive_ns = r.U64("receive_ns");
  m->triage_ns = r.U64("triage_ns");
  m->draft_ns = r.U64("draft_ns");
  m->reply_ns = r.U64("reply_ns");
  const uint8_t oob = r.U8("probs_out_of_band");
  const uint32_t num_drafts = r.U32("num_seqs");
  if (!r.ok()) return;
  if (oob > 1) return r.Fail("probs_out_of_band", absl::StrCat("not a bool: ", oob));
  if (num_drafts > limits.max_batch) {
    return r.Fail("num_seqs", absl::StrCat(num_drafts, " > max_batch ", limits.max_batch));
  }
  m->probs_out_of_band = oob == 1;
  m->drafts.resize(num_drafts);
  m->tokens.clear();
  m->probs.clear();
  uint64_t inline_rows = 0;
  for (uint32_t i = 0; i < num_drafts && r.ok(); ++i) {
    r.SetItem(i);
    SpeculateDraft& d = m->drafts[i];
    d.seq_id = r.U64("drafts[].seq_id");
    d.status = static_cast<DraftStatus>(r.U8("drafts[].status"));
    const uint8_t has_probs = r.U8("drafts[].has_probs");
    d.num_tokens = r.U16("drafts[].num_tokens");
    if (!r.ok()) return;
    if (has_probs > 1) return r.Fail("drafts[].has_probs", absl::StrCat("not a bool: ", has_probs));
    d.has_probs = has_probs == 1;
    CheckDraft(d, limits, &r);
    if (!r.ok()) return;
    d.token_offset = static_cast<uint32_t>(m->tokens.size());
    m->tokens.resize(d.token_offset + d.num_tokens);
    r.I32Array("drafts[].tokens", d.num_tokens, m->tokens.data() + d.token_offset);
    if (r.ok()) CheckTokenIds(m->TokensOf(d), limits, "drafts[].tokens", &r);
    d.probs_offset = m->probs.size();
    if (!d.has_probs || m->probs_out_of_band || !r.ok()) continue;
    inline_rows += d.num_tokens;
    if (inline_rows > limits.max_prob_rows) {
      return r.Fail("drafts[].has_probs",
                    absl::StrCat("inline q rows > max_prob_rows ", limits.max_prob_rows));
    }
    const uint64_t n = uint64_t{d.num_tokens} * limits.vocab_size;
    m->probs.resize(d.probs_offset + n);
    r.F32Array("drafts[].probs", n, m->probs.data() + d.probs_offset);
  }
}

void Check(const Release& m, const WireLimits& limits, FieldErrors* e) {
  if (m.seq_ids.size() > limits.max_release_ids) {
    e->Fail("num_seq_ids",
            absl::StrCat(m.seq_ids.size(), " > max_release_ids ", limits.max_release_ids));
  }
}
void Put(const Release& m, const WireLimits&, ByteWriter& w) {
  w.U32(static_cast<uint32_t>(m.seq_ids.size()));
  w.U64Array(m.seq_ids);
}
void Get(ByteReader& r, const WireLimits& limits, Release* m) {
  const uint32_t n = r.U32("num_seq_ids");
  if (!r.ok()) return;
  if (n > limits.max_release_ids) {
    return r.Fail("num_seq_ids", absl::StrCat(n, " > max_release_ids ", limits.max_release_ids));
  }
  m->seq_ids.resize(n);
  r.U64Array("seq_ids", n, m->seq_ids.data());
}

void Check(const Heartbeat&, const WireLimits&, FieldErrors*) {}
void Put(const Heartbeat& m, const WireLimits&, ByteWriter& w) {
  w.U64(static_cast<uint64_t>(m.sent_unix_ns));
}
void Get(ByteReader& r, const WireLimits&, Heartbeat* m) {
  m->sent_unix_ns = static_cast<int64_t>(r.U64("sent_unix_ns"));
}

void Check(const Shutdown& m, const WireLimits&, FieldErrors* e) {
  CheckText(m.reason, "reason", e);
}
void Put(const Shutdown& m, const WireLimits&, ByteWriter& w) { w.Text(m.reason); }
void Get(ByteReader& r, const WireLimits&, Shutdown* m) {
  r.Text("reason", kMaxTextBytes, &m->reason);
}

void Check(const BulkLinkInit& m, const WireLimits&, FieldErrors* e) {
  if (m.kind != 1) e->Fail("kind", absl::StrCat("unknown bulk link kind ", m.kind));
  if (m.token.size() > kMaxBulkTokenBytes) {
    e->Fail("token", absl::StrCat("length ", m.token.size(), " > limit ", kMaxBulkTokenBytes));
  }
}
void Put(const BulkLinkInit& m, const WireLimits&, ByteWriter& w) {
  w.U32(m.kind);
  w.U16(static_cast<uint16_t>(m.token.size()));
  w.Bytes(m.token);
}
void Get(ByteReader& r, const WireLimits&, BulkLinkInit* m) {
  m->kind = r.U32("kind");
  if (r.ok() && m->kind != 1)
    return r.Fail("kind", absl::StrCat("unknown bulk link kind ", m->kind));
  const uint16_t n = r.U16("token_bytes");
  if (r.ok() && n > kMaxBulkTokenBytes) {
    return r.Fail("token_bytes", absl::StrCat(n, " > limit ", kMaxBulkTokenBytes));
  }
  if (!r.ok()) return;
  m->token.resize(n);
  r.Bytes("token", n, m->token.data());
}

// Largest payload of `type` under `limits`.
uint64_t MaxPayloadBytesOf(MessageType type, const WireLimits& l) {
  switch (type) {
    case MessageType::kHello:
    case MessageType::kHelloAck:
      return kMaxHandshakePayloadBytes;
    case MessageType::kSpeculateRequest:
      return kRequestFixedBytes + kRequestSeqBytes * l.max_batch + 4ull * l.max_request_tokens +
             4ull * l.hidden_width * l.max_hidden_rows;
    case MessageType::kSpeculateResponse:
      return kResponseFixedBytes + (kResponseDraftBytes + 4ull * l.max_draft_tokens) * l.max_batch +
             4ull * l.vocab_size * l.max_prob_rows;
    case MessageType::kRelease:
      return 4 + 8ull * l.max_release_ids;
    case MessageType::kHeartbeat:
      return 8;
    case MessageType::kShutdown:
      return 2 + kMaxTextBytes;
    case MessageType::kBulkLinkInit:
      return 4 + 2 + kMaxBulkTokenBytes;
    case MessageType::kHelloAuth:
      return 2 + kMaxProofBytes;
    case MessageType::kTpInit:
    case MessageType::kTpReady:
    case MessageType::kTpStep:
    case MessageType::kTpJoin:
      return MaxTpPayloadBytes(type, l);
    case MessageType::kSsdInit:
    case MessageType::kSsdReady:
    case MessageType::kCacheOffer:
      return MaxSsdInitPayloadBytes(type, l);
  }
  return 0;
}

}  // namespace specd::dist_internal
