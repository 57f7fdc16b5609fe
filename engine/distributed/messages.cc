// Frames of the SSD channel's messages (layout in messages.h): the header, the checksum, version
// rules and limits; the per-type fields are in message_fields.cc.
#include "engine/distributed/messages.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/status.h"
#include "engine/distributed/message_fields.h"

namespace specd {
namespace {

using dist_internal::MaxPayloadBytesOf;

constexpr uint16_t kNumMessageTypes = 16;
bool KnownType(uint16_t type) { return type >= 1 && type <= kNumMessageTypes; }
bool IsHandshake(MessageType t) { return t == MessageType::kHello || t == MessageType::kHelloAck; }

// The version-dependent parts of a decoded Hello/HelloAck: a Hello's version is the frame's,
// and a HelloAck of version 2 or later carries its proof field (an empty one is 2 bytes).
absl::Status CheckHandshakeVersion(const FrameHeader& header, size_t payload_bytes,
                                   const Message& message) {
  if (const Hello* hello = std::get_if<Hello>(&message);
      header.type == MessageType::kHello && hello->protocol_version != header.version) {
    return absl::InvalidArgumentError(
        absl::StrCat("Hello.protocol_version ", hello->protocol_version,
                     " differs from the frame header's ", header.version));
  }
  if (const HelloAck* ack = std::get_if<HelloAck>(&message);
      header.type == MessageType::kHelloAck && header.version >= 2 &&
      payload_bytes < 1 + 2 + ack->reason.size() + 2) {
    return absl::InvalidArgumentError("HelloAck.proof: truncated (absent in a version-2 frame)");
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view MessageTypeName(MessageType type) {
  static constexpr std::string_view kNames[] = {
      "Hello",     "HelloAck",  "SpeculateRequest", "SpeculateResponse",
      "Release",   "Heartbeat", "Shutdown",         "BulkLinkInit",
      "HelloAuth", "TpInit",    "TpReady",          "TpStep",
      "TpJoin",    "SsdInit",   "SsdReady",         "CacheOffer"};
  const auto i = static_cast<uint16_t>(type);
  return KnownType(i) ? kNames[i - 1] : "Unknown";
}

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kVerifier:
      return "verifier";
    case Role::kSpeculator:
      return "speculator";
    case Role::kTpLeader:
      return "tensor-parallel leader";
    case Role::kTpWorker:
      return "tensor-parallel worker";
  }
  return "unknown";
}

std::string_view DraftStatusName(DraftStatus status) {
  switch (status) {
    case DraftStatus::kNone:
      return "none";
    case DraftStatus::kHit:
      return "hit";
    case DraftStatus::kMissPrimary:
      return "miss-primary";
    case DraftStatus::kMissBackup:
      return "miss-backup";
  }
  return "unknown";
}

absl::Status WireLimits::Validate() const {
  if (max_batch == 0) return absl::InvalidArgumentError("WireLimits.max_batch must be >= 1");
  if (max_draft_tokens == 0 || max_draft_tokens > 0xFFFF) {
    return absl::InvalidArgumentError("WireLimits.max_draft_tokens must be in [1, 65535]");
  }
  if (max_fan_out > 0xFFFF)
    return absl::InvalidArgumentError("WireLimits.max_fan_out must be <= 65535");
  if (max_seq_tokens == 0 || max_seq_tokens > max_request_tokens) {
    return absl::InvalidArgumentError(
        "WireLimits.max_seq_tokens must be in [1, max_request_tokens]");
  }
  if (vocab_size > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("WireLimits.vocab_size must fit int32");
  }
  if ((hidden_width == 0) != (max_hidden_rows == 0)) {
    return absl::InvalidArgumentError(
        "WireLimits.hidden_width and max_hidden_rows are both 0 or both set");
  }
  if (MaxFrameBytes() > 0xFFFFFFFFull) {
    return absl::InvalidArgumentError(
        absl::StrCat("WireLimits allow a ", MaxFrameBytes(), "-byte frame (> 4 GiB): lower ",
                     "max_prob_rows (send q rows out of band) or max_request_tokens"));
  }
  return absl::OkStatus();
}

uint64_t WireLimits::MaxPayloadBytes() const {
  uint64_t max = 0;
  for (uint16_t t = 1; t <= kNumMessageTypes; ++t)
    max = std::max(max, MaxPayloadBytesOf(MessageType{t}, *this));
  return max;
}

void SpeculateRequest::Clear() {
  hidden_out_of_band = false;
  seqs.clear();
  tokens.clear();
  hidden.clear();
}

void SpeculateRequest::AddHidden(SpeculateSeq& seq, uint32_t position, std::span<const float> rows,
                                 size_t width) {
  seq.hidden_position = position;
  seq.hidden_offset = hidden.size();
  seq.num_hidden = width > 0 ? static_cast<uint32_t>(rows.size() / width) : 0;
  hidden.insert(hidden.end(), rows.begin(), rows.begin() + size_t{seq.num_hidden} * width);
}

void SpeculateRequest::AddHiddenOutOfBand(SpeculateSeq& seq, uint32_t position, uint32_t n,
                                          size_t width) {
  seq.hidden_position = position;
  seq.hidden_offset = NumHiddenRows() * width;
  seq.num_hidden = n;
}

uint64_t SpeculateRequest::NumHiddenRows() const {
  uint64_t rows = 0;
  for (const SpeculateSeq& s : seqs) rows += s.num_hidden;
  return rows;
}

std::span<const float> SpeculateRequest::HiddenOf(const SpeculateSeq& seq, size_t width) const {
  if (hidden_out_of_band) return {};
  return std::span<const float>(hidden).subspan(seq.hidden_offset, size_t{seq.num_hidden} * width);
}

SpeculateSeq& SpeculateRequest::AddSeq(const SpeculateSeq& seq,
                                       std::span<const int32_t> new_tokens) {
  SpeculateSeq& s = seqs.emplace_back(seq);
  s.token_offset = static_cast<uint32_t>(tokens.size());
  s.num_tokens = static_cast<uint32_t>(new_tokens.size());
  s.hidden_position = 0;
  s.num_hidden = 0;
  s.hidden_offset = 0;
  tokens.insert(tokens.end(), new_tokens.begin(), new_tokens.end());
  return s;
}

std::span<const int32_t> SpeculateRequest::TokensOf(const SpeculateSeq& seq) const {
  return std::span<const int32_t>(tokens).subspan(seq.token_offset, seq.num_tokens);
}

bool SpeculateRequest::WantsResponse() const {
  return seqs.empty() || std::any_of(seqs.begin(), seqs.end(), [](const SpeculateSeq& s) {
           return (s.flags & kSeqOfferHit) == 0;
         });
}

void CacheOffer::Clear() {
  round_id = cache_build_ns = receive_ns = triage_ns = draft_ns = 0;
  drafts.clear();
  tokens.clear();
}

OfferedDraft& CacheOffer::AddDraft(uint64_t seq_id, uint16_t accepted_len, int32_t bonus,
                                   std::span<const int32_t> draft) {
  OfferedDraft& d = drafts.emplace_back();
  d.seq_id = seq_id;
  d.accepted_len = accepted_len;
  d.bonus = bonus;
  d.token_offset = static_cast<uint32_t>(tokens.size());
  d.num_tokens = static_cast<uint32_t>(draft.size());
  tokens.insert(tokens.end(), draft.begin(), draft.end());
  return d;
}

std::span<const int32_t> CacheOffer::TokensOf(const OfferedDraft& draft) const {
  return std::span<const int32_t>(tokens).subspan(draft.token_offset, draft.num_tokens);
}

uint64_t CacheOffer::MaxDrafts(const WireLimits& limits) {
  return limits.max_fan_out > 0 ? kMaxOfferDrafts : 0;
}

void SpeculateResponse::Clear() {
  drafts.clear();
  tokens.clear();
  probs.clear();
}

SpeculateDraft& SpeculateResponse::AddDraft(uint64_t seq_id, DraftStatus status,
                                            std::span<const int32_t> draft,
                                            std::span<const float> draft_probs, bool has_probs) {
  SpeculateDraft& d = drafts.emplace_back();
  d.seq_id = seq_id;
  d.status = status;
  d.has_probs = has_probs || !draft_probs.empty();
  d.token_offset = static_cast<uint32_t>(tokens.size());
  d.num_tokens = static_cast<uint32_t>(draft.size());
  d.probs_offset = probs.size();
  tokens.insert(tokens.end(), draft.begin(), draft.end());
  probs.insert(probs.end(), draft_probs.begin(), draft_probs.end());
  return d;
}

std::span<const int32_t> SpeculateResponse::TokensOf(const SpeculateDraft& draft) const {
  return std::span<const int32_t>(tokens).subspan(draft.token_offset, draft.num_tokens);
}

std::span<const float> SpeculateResponse::ProbsOf(const SpeculateDraft& draft,
                                                  uint32_t vocab_size) const {
  if (!draft.has_probs || probs_out_of_band) return {};
  return std::span<const float>(probs).subspan(draft.probs_offset,
                                               uint64_t{draft.num_tokens} * vocab_size);
}

uint64_t SpeculateResponse::NumProbRows() const {
  uint64_t rows = 0;
  for (const SpeculateDraft& d : drafts) rows += d.has_probs ? d.num_tokens : 0;
  return rows;
}

MessageType TypeOf(const Message& message) { return static_cast<MessageType>(message.index() + 1); }

absl::Status EncodeFrame(MessageRef message, uint64_t sequence, const WireLimits& limits,
                         FrameBuffer* frame) {
  const MessageType type = message.type();
  FieldErrors errors(MessageTypeName(type));
  message.Visit([&](const auto& m) { dist_internal::Check(m, limits, &errors); });
  if (!errors.ok()) return errors.status();

  frame->Resize(kFrameHeaderBytes);
  ByteWriter w(frame);
  message.Visit([&](const auto& m) { dist_internal::Put(m, limits, w); });
  const uint64_t payload_bytes = frame->size() - kFrameHeaderBytes;
  if (payload_bytes > MaxPayloadBytesOf(type, limits)) {
    return absl::InvalidArgumentError(absl::StrCat(DistView(MessageTypeName(type)), ": payload ",
                                                   payload_bytes, " bytes > limit ",
                                                   MaxPayloadBytesOf(type, limits)));
  }
  const Hello* hello = message.GetIf<Hello>();
  const uint16_t version = hello != nullptr ? hello->protocol_version : kProtocolVersion;
  const std::span<const uint8_t> payload = frame->bytes().subspan(kFrameHeaderBytes);
  uint8_t* h = frame->data();  // header layout: see messages.h
  StoreLittleEndian<uint32_t>(h, kWireMagic);
  StoreLittleEndian<uint16_t>(h + 4, version);
  StoreLittleEndian<uint16_t>(h + 6, static_cast<uint16_t>(type));
  StoreLittleEndian<uint64_t>(h + 8, sequence);
  StoreLittleEndian<uint32_t>(h + 16, static_cast<uint32_t>(payload_bytes));
  StoreLittleEndian<uint32_t>(h + 20, Crc32c(payload));
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes,
                                              const WireLimits& limits) {
  if (bytes.size() < kFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame header: truncated (", bytes.size(),
                                                   " of ", kFrameHeaderBytes, " bytes)"));
  }
  ByteReader r(bytes.first(kFrameHeaderBytes), "frame header");
  FrameHeader h;
  h.magic = r.U32("magic");
  h.version = r.U16("version");
  const uint16_t type = r.U16("type");
  h.sequence = r.U64("sequence");
  h.payload_bytes = r.U32("payload_bytes");
  h.checksum = r.U32("checksum");
  if (h.magic != kWireMagic) {
    return absl::DataLossError(absl::StrFormat(
        "frame header: bad magic 0x%08x (want 0x%08x \"SPCD\"): not a specd dist peer, or the "
        "stream lost sync",
        h.magic, kWireMagic));
  }
  if (!KnownType(type)) {
    return absl::InvalidArgumentError(absl::StrCat("frame header: unknown message type ", type));
  }
  h.type = static_cast<MessageType>(type);
  if (h.version != kProtocolVersion && !IsHandshake(h.type)) {
    return absl::FailedPreconditionError(
        absl::StrCat("frame header: ", DistView(MessageTypeName(h.type)), " has protocol version ",
                     h.version, "; this side speaks version ", kProtocolVersion));
  }
  const uint64_t max = MaxPayloadBytesOf(h.type, limits);
  if (h.payload_bytes > max) {
    return absl::InvalidArgumentError(absl::StrCat("frame header: payload_bytes ", h.payload_bytes,
                                                   " > limit ", max, " for ",
                                                   DistView(MessageTypeName(h.type))));
  }
  return h;
}

absl::Status DecodePayload(const FrameHeader& header, std::span<const uint8_t> payload,
                           const WireLimits& limits, Message* message) {
  const absl::string_view name = DistView(MessageTypeName(header.type));
  if (payload.size() != header.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": payload is ", payload.size(),
                                                   " bytes, header says ", header.payload_bytes));
  }
  if (const uint32_t crc = Crc32c(payload); crc != header.checksum) {
    return absl::DataLossError(
        absl::StrFormat("%s: payload checksum 0x%08x != header's 0x%08x "
                        "(corrupted in transit)",
                        name, crc, header.checksum));
  }
  ByteReader r(payload, MessageTypeName(header.type));
  auto decode = [&]<typename T>(T*) {
    if (!std::holds_alternative<T>(*message)) message->emplace<T>();
    dist_internal::Get(r, limits, &std::get<T>(*message));
  };
  switch (header.type) {
    case MessageType::kHello:
      decode(static_cast<Hello*>(nullptr));
      break;
    case MessageType::kHelloAck:
      decode(static_cast<HelloAck*>(nullptr));
      break;
    case MessageType::kSpeculateRequest:
      decode(static_cast<SpeculateRequest*>(nullptr));
      break;
    case MessageType::kSpeculateResponse:
      decode(static_cast<SpeculateResponse*>(nullptr));
      break;
    case MessageType::kRelease:
      decode(static_cast<Release*>(nullptr));
      break;
    case MessageType::kHeartbeat:
      decode(static_cast<Heartbeat*>(nullptr));
      break;
    case MessageType::kShutdown:
      decode(static_cast<Shutdown*>(nullptr));
      break;
    case MessageType::kBulkLinkInit:
      decode(static_cast<BulkLinkInit*>(nullptr));
      break;
    case MessageType::kHelloAuth:
      decode(static_cast<HelloAuth*>(nullptr));
      break;
    case MessageType::kTpInit:
      decode(static_cast<TpInit*>(nullptr));
      break;
    case MessageType::kTpReady:
      decode(static_cast<TpReady*>(nullptr));
      break;
    case MessageType::kTpStep:
      decode(static_cast<TpStep*>(nullptr));
      break;
    case MessageType::kTpJoin:
      decode(static_cast<TpJoin*>(nullptr));
      break;
    case MessageType::kSsdInit:
      decode(static_cast<SsdInit*>(nullptr));
      break;
    case MessageType::kSsdReady:
      decode(static_cast<SsdReady*>(nullptr));
      break;
    case MessageType::kCacheOffer:
      decode(static_cast<CacheOffer*>(nullptr));
      break;
  }
  if (!r.ok()) return r.status();
  SPECD_RETURN_IF_ERROR(CheckHandshakeVersion(header, payload.size(), *message));
  // A handshake message of a later version may carry fields appended after ours.
  const bool may_extend = IsHandshake(header.type) && header.version > kProtocolVersion;
  if (r.remaining() != 0 && !may_extend) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", r.remaining(), " unexpected bytes after the last field"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> DecodeFrame(std::span<const uint8_t> frame, const WireLimits& limits,
                                        Message* message) {
  SPECD_ASSIGN_OR_RETURN(const FrameHeader header, DecodeFrameHeader(frame, limits));
  SPECD_RETURN_IF_ERROR(DecodePayload(header, frame.subspan(kFrameHeaderBytes), limits, message));
  return header;
}

std::string HelloMismatch(const Hello& local, const Hello& peer) {
  if (local.protocol_version != peer.protocol_version) {
    return absl::StrCat("protocol version mismatch: ", DistView(RoleName(local.role)), " speaks ",
                        local.protocol_version, ", ", DistView(RoleName(peer.role)), " speaks ",
                        peer.protocol_version);
  }
  if (local.role == peer.role) {
    return absl::StrCat("both ends are ", DistView(RoleName(local.role)), "s");
  }
  // The SSD link pairs a verifier with a speculator, the tensor-parallel link a leader (rank 0)
  // with a worker rank.
  const auto is_ssd = [](Role r) { return r == Role::kVerifier || r == Role::kSpeculator; };
  if (is_ssd(local.role) != is_ssd(peer.role)) {
    return absl::StrCat("a ", DistView(RoleName(local.role)), " does not talk to a ",
                        DistView(RoleName(peer.role)));
  }
  if (local.model_fingerprint != peer.model_fingerprint) {
    return absl::StrCat("model fingerprint mismatch: \"", local.model_fingerprint, "\" vs \"",
                        peer.model_fingerprint, "\"");
  }
  const WireLimits& a = local.limits;
  const WireLimits& b = peer.limits;
  const std::pair<const char*, std::pair<uint32_t, uint32_t>> fields[] = {
      {"max_batch", {a.max_batch, b.max_batch}},
      {"max_draft_tokens", {a.max_draft_tokens, b.max_draft_tokens}},
      {"max_fan_out", {a.max_fan_out, b.max_fan_out}},
      {"vocab_size", {a.vocab_size, b.vocab_size}},
      {"max_seq_tokens", {a.max_seq_tokens, b.max_seq_tokens}},
      {"max_request_tokens", {a.max_request_tokens, b.max_request_tokens}},
      {"max_prob_rows", {a.max_prob_rows, b.max_prob_rows}},
      {"max_release_ids", {a.max_release_ids, b.max_release_ids}}};
  for (const auto& [field, values] : fields) {
    if (values.first != values.second) {
      return absl::StrCat("limits.", field, " differs: ", DistView(RoleName(local.role)), " ",
                          values.first, ", ", DistView(RoleName(peer.role)), " ", values.second);
    }
  }
  return "";
}

}  // namespace specd

namespace specd {

WireLimits TpWireLimits() {
  WireLimits l;
  l.max_batch = 4096;       // chunks of one runner call
  l.max_draft_tokens = 64;  // drafts of one verified row
  l.max_fan_out = 0;        // (SSD only)
  l.vocab_size = 0;         // token ids are checked by the worker's runner
  l.max_seq_tokens = 1u << 20;
  l.max_request_tokens = 1u << 20;  // tokens (and sample rows) of one runner call
  l.max_prob_rows = 0;              // (SSD only)
  l.max_release_ids = 0;            // (SSD only)
  return l;
}

void TpStep::Clear() {
  seqs.clear();
  tokens.clear();
  block_ids.clear();
  rows.clear();
  released.clear();
}

}  // namespace specd
