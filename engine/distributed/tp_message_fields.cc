// Field layouts of the tensor-parallel control link's messages (messages.h: TpInit, TpReady,
// TpStep), in the style of message_fields.cc: Check before encoding, Put in wire order, Get
// applying the same checks while it reads.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/distributed/message_fields.h"

namespace specd::dist_internal {
namespace {

constexpr uint64_t kTpInitBytes =
    4 + 4 + 3 * (2 + kMaxTextBytes) + 2 + kMaxBulkTokenBytes + 5 * 4 + 8 + 4 + 1 + 4;
constexpr uint64_t kTpSeqBytes = 4 + 4 + 4 + 1 + 8 + 4;
constexpr uint64_t kTpRowBytes = 4 + 4 + 2 + 1 + 1;

// The sizes of a TpStep that do not depend on its arrays' contents.
void CheckStepSizes(size_t num_seqs, size_t num_rows, const WireLimits& l, FieldErrors* e) {
  if (num_seqs > l.max_batch) {
    e->Fail("num_seqs", absl::StrCat(num_seqs, " > max_batch ", l.max_batch));
  } else if (num_rows > l.max_request_tokens) {
    e->Fail("num_rows", absl::StrCat(num_rows, " > max_request_tokens ", l.max_request_tokens));
  }
}

// Block ids a chunk carries (those its mirror lacks).
uint64_t CarriedBlocks(const TpSeq& s) {
  return s.num_blocks - std::min(s.kept_blocks, s.num_blocks);
}

// One chunk's fixed fields; `tokens` and `blocks` are the running totals after it.
void CheckSeq(const TpSeq& s, uint64_t tokens, uint64_t blocks, const WireLimits& l,
              FieldErrors* e) {
  if (s.start_pos < 0) return e->Fail("seqs[].start_pos", absl::StrCat(s.start_pos, " < 0"));
  if (s.num_tokens == 0) return e->Fail("seqs[].num_tokens", "0: a chunk runs at least one token");
  if (tokens > l.max_request_tokens) {
    return e->Fail("seqs[].num_tokens",
                   absl::StrCat("total ", tokens, " > max_request_tokens ", l.max_request_tokens));
  }
  if (uint64_t{s.num_blocks} > uint64_t{static_cast<uint32_t>(s.start_pos)} + s.num_tokens) {
    return e->Fail("seqs[].num_blocks", absl::StrCat(s.num_blocks, " > the chunk's positions"));
  }
  if (s.kept_blocks > s.num_blocks || (s.seq_id < 0 && s.kept_blocks != 0)) {
    return e->Fail("seqs[].kept_blocks", absl::StrCat(s.kept_blocks, " kept of ", s.num_blocks,
                                                      " blocks (sequence ", s.seq_id, ")"));
  }
  if (blocks > kMaxTpBlockIds) {
    e->Fail("seqs[].num_blocks", absl::StrCat("total ", blocks, " > ", kMaxTpBlockIds));
  }
}

// A row against the chunks it names.
void CheckRow(const TpRow& row, std::span<const TpSeq> seqs, const WireLimits& l, FieldErrors* e) {
  if (row.chunk < 0 || static_cast<size_t>(row.chunk) >= seqs.size()) {
    return e->Fail("rows[].chunk", absl::StrCat(row.chunk, " outside [0, ", seqs.size(), ")"));
  }
  const int64_t n = seqs[row.chunk].num_tokens;
  if (row.token < -1 || row.token >= n) {
    return e->Fail("rows[].token", absl::StrCat(row.token, " outside [-1, ", n, ")"));
  }
  if (row.num_drafts > l.max_draft_tokens || row.num_drafts >= n) {
    e->Fail("rows[].num_drafts", absl::StrCat(row.num_drafts, " drafts in a chunk of ", n,
                                              " tokens (at most ", l.max_draft_tokens, ")"));
  }
}

bool KnownMethod(uint8_t m) { return m >= 1 && m <= static_cast<uint8_t>(TpMethod::kForward); }

}  // namespace

// ---- TpInit ----
void Check(const TpInit& m, const WireLimits&, FieldErrors* e) {
  if (m.world_size < 2 || m.rank == 0 || m.rank >= m.world_size) {
    e->Fail("rank", absl::StrCat("rank ", m.rank, " of ", m.world_size, " is not a worker rank"));
  }
  CheckText(m.model_dir, "model_dir", e);
  CheckText(m.load_format, "load_format", e);
  CheckText(m.comm_kind, "comm_kind", e);
  if (m.comm_token.size() > kMaxBulkTokenBytes) {
    e->Fail("comm_token", absl::StrCat("length ", m.comm_token.size(), " > ", kMaxBulkTokenBytes));
  }
  if (!(m.gpu_memory_utilization > 0.0f && m.gpu_memory_utilization <= 1.0f)) {
    e->Fail("gpu_memory_utilization", absl::StrCat(m.gpu_memory_utilization, " outside (0, 1]"));
  }
}
void Put(const TpInit& m, const WireLimits&, ByteWriter& w) {
  w.U32(m.rank);
  w.U32(m.world_size);
  w.Text(m.model_dir);
  w.Text(m.load_format);
  w.Text(m.comm_kind);
  w.U16(static_cast<uint16_t>(m.comm_token.size()));
  w.Bytes(m.comm_token);
  for (uint32_t v : {m.block_size, m.max_model_len, m.max_num_seqs, m.max_num_batched_tokens,
                     m.max_sample_rows}) {
    w.U32(v);
  }
  w.U64(m.kv_cache_bytes);
  w.F32(m.gpu_memory_utilization);
  w.U8(m.enforce_eager ? 1 : 0);
  w.U32(m.timeout_ms);
}
void Get(ByteReader& r, const WireLimits& l, TpInit* m) {
  m->rank = r.U32("rank");
  m->world_size = r.U32("world_size");
  r.Text("model_dir", kMaxTextBytes, &m->model_dir);
  r.Text("load_format", kMaxTextBytes, &m->load_format);
  r.Text("comm_kind", kMaxTextBytes, &m->comm_kind);
  const uint16_t n = r.U16("comm_token_bytes");
  if (r.ok() && n > kMaxBulkTokenBytes) {
    return r.Fail("comm_token_bytes", absl::StrCat(n, " > ", kMaxBulkTokenBytes));
  }
  if (!r.ok()) return;
  m->comm_token.resize(n);
  r.Bytes("comm_token", n, m->comm_token.data());
  for (uint32_t* v : {&m->block_size, &m->max_model_len, &m->max_num_seqs,
                      &m->max_num_batched_tokens, &m->max_sample_rows}) {
    *v = r.U32("sizes");
  }
  m->kv_cache_bytes = r.U64("kv_cache_bytes");
  m->gpu_memory_utilization = r.F32("gpu_memory_utilization");
  const uint8_t eager = r.U8("enforce_eager");
  if (r.ok() && eager > 1) return r.Fail("enforce_eager", absl::StrCat("not a bool: ", eager));
  m->enforce_eager = eager == 1;
  m->timeout_ms = r.U32("timeout_ms");
  if (r.ok()) Check(*m, l, &r);
}

// ---- TpReady ----
void Check(const TpReady& m, const WireLimits&, FieldErrors* e) {
  CheckText(m.device, "device", e);
  CheckText(m.reason, "reason", e);
}
void Put(const TpReady& m, const WireLimits&, ByteWriter& w) {
  w.U8(m.ok ? 1 : 0);
  w.U32(m.num_kv_blocks);
  w.Text(m.device);
  w.Text(m.reason);
}
void Get(ByteReader& r, const WireLimits&, TpReady* m) {
  const uint8_t ok = r.U8("ok");
  if (r.ok() && ok > 1) return r.Fail("ok", absl::StrCat("not a bool: ", ok));
  m->ok = ok == 1;
  m->num_kv_blocks = r.U32("num_kv_blocks");
  r.Text("device", kMaxTextBytes, &m->device);
  r.Text("reason", kMaxTextBytes, &m->reason);
}

// ---- TpStep ----
void Check(const TpStep& m, const WireLimits& l, FieldErrors* e) {
  if (!KnownMethod(static_cast<uint8_t>(m.method))) return e->Fail("method", "unknown method");
  CheckStepSizes(m.seqs.size(), m.rows.size(), l, e);
  uint64_t tokens = 0, blocks = 0;
  for (size_t i = 0; i < m.seqs.size() && e->ok(); ++i) {
    e->SetItem(i);
    tokens += m.seqs[i].num_tokens;
    blocks += CarriedBlocks(m.seqs[i]);
    CheckSeq(m.seqs[i], tokens, blocks, l, e);
  }
  if (e->ok() && (tokens != m.tokens.size() || blocks != m.block_ids.size())) {
    e->Fail("seqs",
            absl::StrCat("chunks hold ", tokens, " tokens and ", blocks, " block ids; the arrays ",
                         m.tokens.size(), " and ", m.block_ids.size()));
  }
  for (size_t i = 0; i < m.rows.size() && e->ok(); ++i) {
    e->SetItem(i);
    CheckRow(m.rows[i], m.seqs, l, e);
  }
  if (e->ok() && m.released.size() > kMaxTpReleased) {
    e->Fail("released", absl::StrCat(m.released.size(), " > ", kMaxTpReleased));
  }
}
void Put(const TpStep& m, const WireLimits&, ByteWriter& w) {
  w.U64(m.step_id);
  w.U8(static_cast<uint8_t>(m.method));
  w.U32(static_cast<uint32_t>(m.seqs.size()));
  for (const TpSeq& s : m.seqs) {
    w.I32(s.start_pos);
    w.U32(s.num_tokens);
    w.U32(s.num_blocks);
    w.U8(s.all_logits ? 1 : 0);
    w.U64(static_cast<uint64_t>(s.seq_id));
    w.U32(s.kept_blocks);
  }
  w.I32Array(m.tokens);
  w.I32Array(m.block_ids);
  w.U32(static_cast<uint32_t>(m.rows.size()));
  for (const TpRow& row : m.rows) {
    w.I32(row.chunk);
    w.I32(row.token);
    w.U16(row.num_drafts);
    w.U8(row.num_candidates);
    w.U8(row.full_logits ? 1 : 0);
  }
  w.U32(static_cast<uint32_t>(m.released.size()));
  for (int64_t id : m.released) w.U64(static_cast<uint64_t>(id));
}
void Get(ByteReader& r, const WireLimits& l, TpStep* m) {
  m->step_id = r.U64("step_id");
  const uint8_t method = r.U8("method");
  if (!r.ok()) return;
  if (!KnownMethod(method)) return r.Fail("method", absl::StrCat("unknown value ", method));
  m->method = static_cast<TpMethod>(method);
  const uint32_t num_seqs = r.U32("num_seqs");
  if (!r.ok()) return;
  CheckStepSizes(num_seqs, 0, l, &r);
  if (!r.ok()) return;
  m->seqs.resize(num_seqs);
  uint64_t tokens = 0, blocks = 0;
  for (uint32_t i = 0; i < num_seqs && r.ok(); ++i) {
    r.SetItem(i);
    TpSeq& s = m->seqs[i];
    s.start_pos = r.I32("seqs[].start_pos");
    s.num_tokens = r.U32("seqs[].num_tokens");
    s.num_blocks = r.U32("seqs[].num_blocks");
    const uint8_t all = r.U8("seqs[].all_logits");
    if (!r.ok()) return;
    if (all > 1) return r.Fail("seqs[].all_logits", absl::StrCat("not a bool: ", all));
    s.all_logits = all == 1;
    s.seq_id = static_cast<int64_t>(r.U64("seqs[].seq_id"));
    s.kept_blocks = r.U32("seqs[].kept_blocks");
    if (!r.ok()) return;
    tokens += s.num_tokens;
    blocks += CarriedBlocks(s);
    CheckSeq(s, tokens, blocks, l, &r);
  }
  if (!r.ok()) return;
  m->tokens.resize(tokens);
  r.I32Array("tokens", tokens, m->tokens.data());
  m->block_ids.resize(blocks);
  r.I32Array("block_ids", blocks, m->block_ids.data());
  const uint32_t num_rows = r.U32("num_rows");
  if (!r.ok()) return;
  CheckStepSizes(num_seqs, num_rows, l, &r);
  if (!r.ok()) return;
  m->rows.resize(num_rows);
  for (uint32_t i = 0; i < num_rows && r.ok(); ++i) {
    r.SetItem(i);
    TpRow& row = m->rows[i];
    row.chunk = r.I32("rows[].chunk");
    row.token = r.I32("rows[].token");
    row.num_drafts = r.U16("rows[].num_drafts");
    row.num_candidates = r.U8("rows[].num_candidates");
    const uint8_t full = r.U8("rows[].full_logits");
    if (r.ok() && full > 1) return r.Fail("rows[].full_logits", absl::StrCat("not a bool: ", full));
    row.full_logits = full == 1;
    if (r.ok()) CheckRow(row, m->seqs, l, &r);
  }
  if (!r.ok()) return;
  const uint32_t num_released = r.U32("num_released");
  if (!r.ok()) return;
  if (num_released > kMaxTpReleased) {
    return r.Fail("num_released", absl::StrCat(num_released, " > ", kMaxTpReleased));
  }
  m->released.resize(num_released);
  for (uint32_t i = 0; i < num_released && r.ok(); ++i) {
    r.SetItem(i);
    m->released[i] = static_cast<int64_t>(r.U64("released[]"));
  }
}

// ---- TpJoin ----
void Check(const TpJoin& m, const WireLimits&, FieldErrors* e) { CheckText(m.host, "host", e); }
void Put(const TpJoin& m, const WireLimits&, ByteWriter& w) {
  w.U32(m.rank);
  w.Text(m.host);
}
void Get(ByteReader& r, const WireLimits&, TpJoin* m) {
  m->rank = r.U32("rank");
  r.Text("host", kMaxTextBytes, &m->host);
}

uint64_t MaxTpPayloadBytes(MessageType type, const WireLimits& l) {
  switch (type) {
    case MessageType::kTpJoin:
      return 4 + 2 + kMaxTextBytes;
    case MessageType::kTpInit:
      return kTpInitBytes;
    case MessageType::kTpReady:
      return 1 + 4 + 2 * (2 + kMaxTextBytes);
    case MessageType::kTpStep:
      return 8 + 1 + 4 + kTpSeqBytes * l.max_batch + 4ull * l.max_request_tokens +
             4ull * kMaxTpBlockIds + 4 + kTpRowBytes * l.max_request_tokens + 4 +
             8ull * kMaxTpReleased;
    default:
      return 0;
  }
}

}  // namespace specd::dist_internal
