// Typed, versioned messages of the SSD channel between the verifier (rank 0) and the speculator
// process (docs/architecture.md, "Processes and threads"), and their wire format. Each round the
// verifier sends the verification outcome of every sequence (SpeculateRequest: k accepted + bonus
// token t*, or a new sequence's prompt); the speculator answers with the next drafts and how it
// got them (SpeculateResponse: cache hit, miss served by the primary or backup speculator).
//
// Frame = 24-byte header + payload, every field little-endian and written one by one (no struct
// memcpy, no padding):
//   u32 magic "SPCD" | u16 protocol version | u16 message type | u64 sequence number |
//   u32 payload bytes | u32 CRC-32C of the payload
// The Hello and HelloAck payloads are frozen across protocol versions (later versions may only
// append fields), so peers of different versions can still tell each other why they refuse.
//
// Allocation: EncodeFrame takes a MessageRef (no copy into a Message) and writes into a
// caller-owned FrameBuffer reserved once with limits.MaxFrameBytes(), so steady-state encoding
// never allocates; DecodeFrame reuses the vectors of the Message it decodes into (same
// alternative as last time), so decoding into a kept Message allocates only until its vectors
// reached their high-water marks. Both are checked by distributed_test with a counting operator
// new. Decoding validates every length and value against the receiver's WireLimits; bad bytes give
// an absl::Status naming the field, never a crash. Plain values and functions: any thread, one
// thread per object.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/step_kind.h"
#include "engine/distributed/wire.h"

namespace specd {

inline constexpr uint32_t kWireMagic = 0x44435053;  // bytes "SPCD" on the wire
// Version 2: the handshake authenticates (Hello.nonce, HelloAuth, HelloAck.proof; link_auth.h).
// Version 3: TpStep carries block-table deltas against the workers' mirrors (TpSeq::seq_id,
// kept_blocks; TpStep::released) and each row's vocabulary-merge needs (TpRow).
// Version 4: the SSD speculator gets its settings in SsdInit after the handshake (no longer on its
// command line) and answers SsdReady; SSD Hellos carry fixed handshake limits.
// Version 5: SpeculateResponse carries the speculator's stage times (receive, triage, draft,
// reply) beside busy_ns and cache_build_ns: the SSD round's timeline.
// Version 6: SsdInit says whether the speculator drafts in parallel (parallel_drafting) and
// sizes its cache by the measured verification time (time_budget); SpeculateRequest carries
// that time (window_ns).
// Version 7: the device data path. SsdInit offers it (bulk_link) and SsdReady accepts it; the
// two ends then join an NCCL link (BulkLinkInit), and sampled drafts' q rows travel on it
// (SpeculateResponse::probs_out_of_band).
// Version 8: an EAGLE-3 head in the speculator. SsdInit names it (eagle3_head, target_model);
// each SpeculateSeq carries the target's hidden states of the positions it commits
// (hidden_position, num_hidden), under the limits' hidden_width and max_hidden_rows.
// Version 9: on the device data path those hidden states travel on the NCCL link as bf16 rows
// (SpeculateRequest::hidden_out_of_band), not in the frame.
// Version 10: cache offers. With SsdInit.cache_offers the speculator sends the verifier each
// complete greedy cache branch as its build finishes a wave (CacheOffer); a round whose every
// outcome was offered takes its drafts from the offer and sends a request that gets no
// response (every sequence flagged kSeqOfferHit).
inline constexpr uint16_t kProtocolVersion = 10;
inline constexpr size_t kFrameHeaderBytes = 24;
inline constexpr size_t kMaxTextBytes = 1024;      // fingerprints, reasons
inline constexpr size_t kMaxBulkTokenBytes = 512;  // BulkLinkInit::token (ncclUniqueId: 128)
inline constexpr size_t kHelloNonceBytes = 32;     // Hello::nonce (version >= 2)
inline constexpr size_t kMaxProofBytes = 64;       // HelloAuth::proof, HelloAck::proof

// The message type on the wire (u16). Values are stable; new types get new values.
enum class MessageType : uint16_t {
  kHello = 1,
  kHelloAck = 2,
  kSpeculateRequest = 3,
  kSpeculateResponse = 4,
  kRelease = 5,
  kHeartbeat = 6,
  kShutdown = 7,
  kBulkLinkInit = 8,
  kHelloAuth = 9,
  kTpInit = 10,
  kTpReady = 11,
  kTpStep = 12,
  kTpJoin = 13,
  kSsdInit = 14,
  kSsdReady = 15,
  kCacheOffer = 16,
};
// "SpeculateRequest", ...; "Unknown" for values outside the enum (static storage).
std::string_view MessageTypeName(MessageType type);

// Which end of a channel a process is: the SSD link (verifier accepts, speculator connects) or
// the tensor-parallel control link (rank 0, the leader, accepts; each worker rank connects).
enum class Role : uint8_t { kVerifier = 1, kSpeculator = 2, kTpLeader = 3, kTpWorker = 4 };
// "verifier" / "speculator" (static storage).
std::string_view RoleName(Role role);

// The maxima both ends are configured with. They bound every decoded length (so a corrupt length
// cannot make the receiver allocate gigabytes) and size the preallocated frame buffers. Both ends
// must agree exactly; the Hello handshake checks it.
struct WireLimits {
  uint32_t max_batch = 256;                // sequences in one SpeculateRequest / Response
  uint32_t max_draft_tokens = 16;          // K: draft tokens per sequence
  uint32_t max_fan_out = 64;               // Saguaro fan-out budget per sequence
  uint32_t vocab_size = 0;                 // token ids are < vocab_size; q rows are vocab_size wide
  uint32_t max_seq_tokens = 131072;        // new committed tokens of one sequence in one request
  uint32_t max_request_tokens = 1u << 20;  // new committed tokens of all sequences, one request
  // q rows ([k, vocab] f32 per sampled draft) carried inline in one SpeculateResponse. Large
  // vocabularies at large batch should send rows over the bulk link (probs_out_of_band) instead.
  uint32_t max_prob_rows = 256;
  uint32_t max_release_ids = 4096;  // seq ids in one Release
  // Version >= 8: target hidden-state rows (SpeculateSeq::num_hidden) of hidden_width floats
  // each, at most max_hidden_rows in one SpeculateRequest (both 0: none travel).
  uint32_t hidden_width = 0;
  uint32_t max_hidden_rows = 0;

  // InvalidArgument when a field is out of range or the largest frame would exceed 4 GiB.
  absl::Status Validate() const;
  // Largest payload of any message type under these limits, in bytes.
  uint64_t MaxPayloadBytes() const;
  // kFrameHeaderBytes + MaxPayloadBytes(): what to reserve in a FrameBuffer.
  uint64_t MaxFrameBytes() const { return kFrameHeaderBytes + MaxPayloadBytes(); }

  bool operator==(const WireLimits&) const = default;
};

// First message of each side after connecting: the connecting side (the speculator) sends first,
// the accepting side (the verifier) answers with its own Hello and a HelloAck.
struct Hello {
  Role role = Role::kVerifier;
  uint16_t protocol_version = kProtocolVersion;  // also written as the frame header's version
  // What both ends must share, e.g. "vocab=32000;draft=<hash of the draft config>" (<= 1 KiB).
  std::string model_fingerprint;
  WireLimits limits;
  // Version >= 2: kHelloNonceBytes fresh random bytes, the challenge the peer's proof answers
  // (appended to the frozen layout; empty in a version-1 Hello).
  std::vector<uint8_t> nonce;

  bool operator==(const Hello&) const = default;
};

// The verifier's verdict on a Hello (and, from version 2, on the speculator's HelloAuth). A
// refused peer is disconnected after this message.
struct HelloAck {
  bool accepted = false;
  std::string reason;  // why not, for logs (<= 1 KiB); empty when accepted
  // Version >= 2, when accepted: the verifier's proof that it holds the link secret
  // (link_auth.h LinkProof); appended to the frozen layout.
  std::vector<uint8_t> proof;

  bool operator==(const HelloAck&) const = default;
};

// SpeculateSeq::flags bits; other bits are rejected.
inline constexpr uint8_t kSeqNew = 1;        // first request for this seq_id: tokens = its prompt
inline constexpr uint8_t kSeqRelease = 2;    // last one: drop the sequence after this round
inline constexpr uint8_t kSeqWantProbs = 4;  // sampled request: return q rows with the drafts
// Version >= 10: the verifier took this outcome's drafts from a CacheOffer (the branch offered
// for it, first num_draft_tokens tokens); a request whose every sequence says so gets no
// response.
inline constexpr uint8_t kSeqOfferHit = 8;
inline constexpr uint8_t kSeqKnownFlags = kSeqNew | kSeqRelease | kSeqWantProbs | kSeqOfferHit;

// The request's sampling parameters, which sampled drafts follow (see engine/sample).
struct DraftSampling {
  float temperature = 0.0f;  // 0 = greedy drafts
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 or -1 = off
  float min_p = 0.0f;        // [0, 1]
  uint64_t seed = 0;         // the request's resolved seed

  bool operator==(const DraftSampling&) const = default;
};

// One sequence of a SpeculateRequest: the outcome of its last verification and what to draft.
struct SpeculateSeq {
  uint64_t seq_id = 0;
  uint8_t flags = 0;              // kSeq* bits
  uint16_t accepted_len = 0;      // k: leading new tokens that were accepted drafts (0 if new)
  uint16_t num_draft_tokens = 0;  // K wanted for the next round (<= max_draft_tokens)
  uint16_t fan_out = 0;           // speculation-cache budget (<= max_fan_out)
  DraftSampling sampling;
  float saguaro_c = 1.0f;  // Saguaro down-weighting constant C in [0, 1]
  // New committed tokens: the k accepted drafts then the bonus token t*, or the prompt when
  // kSeqNew. They live in SpeculateRequest::tokens[token_offset, token_offset + num_tokens).
  uint32_t token_offset = 0;
  uint32_t num_tokens = 0;
  // Version >= 8, an EAGLE-3 head in the speculator: the target's hidden states (the head's aux
  // layers, concatenated: WireLimits::hidden_width floats a row) at the sequence's positions
  // [hidden_position, hidden_position + num_hidden): what the target computed since the last
  // request for positions now committed, the bonus token's excepted (not run yet). They live in
  // SpeculateRequest::hidden from hidden_offset (floats) on.
  uint32_t hidden_position = 0;
  uint32_t num_hidden = 0;
  uint64_t hidden_offset = 0;

  bool operator==(const SpeculateSeq&) const = default;
};

// Verifier -> speculator, once per round for the batch. Ragged: all sequences' tokens are
// concatenated in `tokens` so reuse across rounds keeps every vector's capacity.
struct SpeculateRequest {
  uint64_t round_id = 0;
  // Version >= 6: the verifier's time from reading its last response to sending this request,
  // in nanoseconds: the window the speculator's cache build had (0: no earlier round).
  uint64_t window_ns = 0;
  // Version >= 9: the hidden rows travel on the bulk link (NcclChannel) right after this frame,
  // [sum of num_hidden, hidden_width] bf16 in seqs' order (a sequence's first row is its
  // hidden_offset / hidden_width); `hidden` is then empty.
  bool hidden_out_of_band = false;
  std::vector<SpeculateSeq> seqs;  // [num_seqs] (<= max_batch)
  std::vector<int32_t> tokens;     // [sum of num_tokens] new committed token ids
  std::vector<float> hidden;       // [sum of num_hidden, hidden_width] target hidden states

  // Empties seqs, tokens and hidden, keeping their capacity.
  void Clear();
  // Appends `seq` with `new_tokens` (sets its token_offset and num_tokens, no hidden rows);
  // returns it.
  SpeculateSeq& AddSeq(const SpeculateSeq& seq, std::span<const int32_t> new_tokens);
  // Gives `seq` (the last one added) the hidden rows `rows` ([n, width] f32) of positions
  // [position, position + n).
  void AddHidden(SpeculateSeq& seq, uint32_t position, std::span<const float> rows, size_t width);
  // With hidden_out_of_band: gives `seq` (the last one added) `n` rows of positions
  // [position, position + n) that travel on the bulk link after those of the earlier sequences.
  void AddHiddenOutOfBand(SpeculateSeq& seq, uint32_t position, uint32_t n, size_t width);
  // Rows of all sequences (inline or out of band).
  uint64_t NumHiddenRows() const;
  // The new committed tokens of `seq` (which must be one of seqs).
  std::span<const int32_t> TokensOf(const SpeculateSeq& seq) const;
  // Its hidden rows ([num_hidden, width] f32).
  std::span<const float> HiddenOf(const SpeculateSeq& seq, size_t width) const;
  // False when every sequence took its drafts from an offer (kSeqOfferHit): no response then.
  bool WantsResponse() const;

  bool operator==(const SpeculateRequest&) const = default;
};

// How the speculator produced a draft (Saguaro: cache hit, or which fallback served the miss).
enum class DraftStatus : uint8_t { kNone = 0, kHit = 1, kMissPrimary = 2, kMissBackup = 3 };
// "none", "hit", "miss-primary", "miss-backup" (static storage; for logs and metrics labels).
std::string_view DraftStatusName(DraftStatus status);

// One sequence's draft in a SpeculateResponse.
struct SpeculateDraft {
  uint64_t seq_id = 0;
  DraftStatus status = DraftStatus::kNone;
  bool has_probs = false;  // q rows exist for these tokens (inline or on the bulk link)
  // Draft tokens: SpeculateResponse::tokens[token_offset, token_offset + num_tokens), k <= K.
  uint32_t token_offset = 0;
  uint32_t num_tokens = 0;
  // With has_probs and inline rows: probs[probs_offset, probs_offset + num_tokens * vocab).
  uint64_t probs_offset = 0;

  bool operator==(const SpeculateDraft&) const = default;
};

// Speculator -> verifier, one per SpeculateRequest (same round_id).
struct SpeculateResponse {
  uint64_t round_id = 0;
  uint64_t busy_ns = 0;         // speculator busy time since its last response
  uint64_t cache_build_ns = 0;  // of which building the speculation cache
  // Version >= 5: the speculator's other stages since its last response (the SSD round's
  // timeline, ssd_stats.h SsdTimeline), in its monotonic nanoseconds: reading and decoding this
  // request (from its first byte), triage (the outcomes applied, the cache looked up, each
  // sequence's tier chosen), drafting the misses (primary re-drafts, partial hits' remaining
  // passes, backups), and replying (sending the last response, composing this one).
  uint64_t receive_ns = 0;
  uint64_t triage_ns = 0;
  uint64_t draft_ns = 0;
  uint64_t reply_ns = 0;
  // q rows travel on the bulk link (NcclChannel) in draft order, not in this frame; `probs`
  // is then empty and the receiver posts a bulk receive of NumProbRows() rows.
  bool probs_out_of_band = false;
  std::vector<SpeculateDraft> drafts;  // [num_seqs]
  std::vector<int32_t> tokens;         // [sum of num_tokens] draft token ids
  std::vector<float> probs;            // [sum of num_tokens with has_probs, vocab] f32 (inline)

  // Empties everything, keeping capacity.
  void Clear();
  // Appends a draft; `probs` ([tokens.size(), vocab] f32) is empty for greedy/deterministic
  // drafts. With probs_out_of_band, pass has_probs = true and empty probs.
  SpeculateDraft& AddDraft(uint64_t seq_id, DraftStatus status, std::span<const int32_t> draft,
                           std::span<const float> draft_probs, bool has_probs = false);
  // The draft tokens of `draft` (which must be one of drafts).
  std::span<const int32_t> TokensOf(const SpeculateDraft& draft) const;
  // Inline q rows of `draft` ([num_tokens, vocab_size] f32); empty without inline rows.
  std::span<const float> ProbsOf(const SpeculateDraft& draft, uint32_t vocab_size) const;
  // Number of q rows the response carries (inline or out of band).
  uint64_t NumProbRows() const;

  bool operator==(const SpeculateResponse&) const = default;
};

// Version >= 10, most branches one CacheOffer carries (a cache build's wave has fewer; a larger
// one would go in several offers).
inline constexpr uint32_t kMaxOfferDrafts = 1024;

// One offered cache branch: the drafts for the outcome (accepted_len k, bonus token t*) of a
// sequence's drafts under verification.
struct OfferedDraft {
  uint64_t seq_id = 0;
  uint16_t accepted_len = 0;
  int32_t bonus = 0;
  // CacheOffer::tokens[token_offset, token_offset + num_tokens) (<= max_draft_tokens).
  uint32_t token_offset = 0;
  uint32_t num_tokens = 0;

  bool operator==(const OfferedDraft&) const = default;
};

// Speculator -> verifier, version >= 10, with SsdInit.cache_offers: after each wave of the cache
// build that follows request round_id, the greedy branches that wave completed (a sampled
// sequence's need q rows and are never offered). The speculator's stage times ride along, for the
// round timeline of a round that takes its drafts from the offer (no response carries them):
// cache_build_ns the build so far, and receive / triage / draft of request round_id when it got
// no response (else 0: its response carried them).
struct CacheOffer {
  uint64_t round_id = 0;
  uint64_t cache_build_ns = 0;
  uint64_t receive_ns = 0;
  uint64_t triage_ns = 0;
  uint64_t draft_ns = 0;
  std::vector<OfferedDraft> drafts;  // <= MaxDrafts(limits)
  std::vector<int32_t> tokens;

  void Clear();
  OfferedDraft& AddDraft(uint64_t seq_id, uint16_t accepted_len, int32_t bonus,
                         std::span<const int32_t> draft);
  std::span<const int32_t> TokensOf(const OfferedDraft& draft) const;
  // Most drafts one offer carries under `limits`: kMaxOfferDrafts on a link with a speculation
  // cache (max_fan_out > 0), none on others (the handshake's and tensor-parallel limits).
  static uint64_t MaxDrafts(const WireLimits& limits);

  bool operator==(const CacheOffer&) const = default;
};

// Verifier -> speculator: drop these sequences (finished, aborted, preempted).
struct Release {
  std::vector<uint64_t> seq_ids;  // <= max_release_ids

  bool operator==(const Release&) const = default;
};

// Either direction, when idle: proves liveness of a stopped-but-connected peer.
struct Heartbeat {
  int64_t sent_unix_ns = 0;  // sender's wall clock

  bool operator==(const Heartbeat&) const = default;
};

// Either direction: the sender is going away on purpose (not a crash).
struct Shutdown {
  std::string reason;  // <= 1 KiB

  bool operator==(const Shutdown&) const = default;
};

// Verifier -> speculator, right after the handshake when a bulk link (NCCL) is used: the opaque
// token the peer needs to join it (an ncclUniqueId).
struct BulkLinkInit {
  uint32_t kind = 1;           // 1 = NCCL 2-rank communicator
  std::vector<uint8_t> token;  // <= kMaxBulkTokenBytes

  bool operator==(const BulkLinkInit&) const = default;
};

// Speculator -> verifier, version >= 2, after the two Hellos: its proof that it holds the link
// secret (link_auth.h LinkProof over both nonces). The verifier answers with its HelloAck.
struct HelloAuth {
  std::vector<uint8_t> proof;  // <= kMaxProofBytes

  bool operator==(const HelloAuth&) const = default;
};

// Verifier -> speculator, version >= 4, once right after the handshake: everything the speculator
// must share with the verifier. Both ends shake hands under small fixed limits and then switch to
// the ones vocab_size, max_num_seqs and max_model_len give (SsdWireLimits,
// engine/speculation/ssd/ssd_protocol.h). Plain fields, as the verifier resolved them; the
// speculator's own checks of their values come after decoding.
struct SsdInit {
  // The verifier's vocabulary and batch and context limits.
  uint32_t vocab_size = 0;
  uint32_t max_num_seqs = 0;
  uint32_t max_model_len = 0;
  uint32_t max_num_batched_tokens = 0;  // tokens of one draft forward pass
  // The draft and its runner, as the verifier set them up for its speculator.
  std::string draft_model;  // the draft's HF directory (<= 1 KiB)
  std::string device;       // "cpu", "cuda:N", ...
  uint32_t num_threads = 0;
  uint32_t block_size = 16;
  std::string load_format;  // "auto" | "dummy"
  double gpu_memory_utilization = 0.9;
  uint64_t draft_kv_cache_bytes = 0;  // 0: the device's default
  // The speculation: K, the n-gram backup's suffix lengths, the cache and the fallback tiers.
  uint32_t num_speculative_tokens = 0;
  uint32_t prompt_lookup_min = 1;
  uint32_t prompt_lookup_max = 4;
  uint32_t fan_out = 0;
  bool geometric_fan_out = true;
  uint32_t critical_batch_size = 0;
  std::string backup;  // "ngram" | "random"
  bool complete_cache = false;
  bool parallel_drafting = false;  // the draft drafts a round in one pass (its pard_token)
  bool time_budget = true;         // the cache's size from the measured verification time
  // Version >= 7: the verifier offers the device data path (its target is on a GPU and the
  // build has NCCL): q rows GPU to GPU on an NCCL link beside this channel, not inline.
  bool bulk_link = false;
  // Version >= 8: the speculator drafts with this EAGLE-3 head (its directory; "" a draft model),
  // for the target in target_model (the head's embedding and the target's shapes), and each
  // request carries the target's hidden states, hidden_width floats a row.
  std::string eagle3_head;
  std::string target_model;
  uint32_t hidden_width = 0;
  // Version >= 10: the speculator sends CacheOffers (SsdOptions::cache_offers).
  bool cache_offers = false;
  // Benchmarks' controlled acceptance (DraftReplayOptions); replay_file "" is off.
  std::string replay_file;
  double replay_alpha = 0;
  double replay_candidate_hit = 0;
  uint64_t replay_seed = 0;

  bool operator==(const SsdInit&) const = default;
};

// Speculator -> verifier, version >= 4, once per SsdInit: its draft is loaded (ok), or why it
// could not start. The verifier drops a link that is not ok.
struct SsdReady {
  bool ok = false;
  std::string device;  // the draft's device, for logs (<= 1 KiB)
  std::string reason;  // when !ok (<= 1 KiB)
  // Version >= 7: the speculator takes the offered device data path (its draft is on a GPU and
  // keeps q rows there); both ends then join the NCCL link (NcclChannel::Create) before the
  // first round.
  bool bulk_link = false;

  bool operator==(const SsdReady&) const = default;
};

// ---- The tensor-parallel control link (engine/parallel): rank 0 -> each worker rank. ----

// The limits both ends of a tensor-parallel control link use (fixed, so a worker can shake hands
// before it knows the engine's options): TpStep's sizes are bounded by them and kMaxTpBlockIds.
WireLimits TpWireLimits();
inline constexpr uint32_t kMaxTpBlockIds = 1u << 22;  // block ids in one TpStep (16 MiB)
inline constexpr uint32_t kMaxTpReleased = 1u << 16;  // mirrors dropped in one TpStep

// Worker -> rank 0, first after the handshake: which rank it is (its --rank or, on a node of a
// multi-node group, node_rank * ranks per node + its local index) and where it runs.
struct TpJoin {
  uint32_t rank = 0;
  std::string host;  // for logs (<= 1 KiB)

  bool operator==(const TpJoin&) const = default;
};

// Rank 0 -> worker, once after the handshake: what to load and how to join the collectives.
struct TpInit {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string model_dir;    // <= 1 KiB
  std::string load_format;  // "auto" | "dummy"
  // The communicator: "shm" (comm_token: the group id) or "nccl" (comm_token: ncclUniqueId).
  std::string comm_kind;
  std::vector<uint8_t> comm_token;  // <= kMaxBulkTokenBytes
  uint32_t block_size = 16;
  uint32_t max_model_len = 0;
  uint32_t max_num_seqs = 0;
  uint32_t max_num_batched_tokens = 0;
  uint32_t max_sample_rows = 0;
  uint64_t kv_cache_bytes = 0;
  float gpu_memory_utilization = 0.9f;
  bool enforce_eager = false;
  uint32_t timeout_ms = 60000;  // how long a rank waits for a peer (collectives, the link)

  bool operator==(const TpInit&) const = default;
};

// Worker -> rank 0, once: loaded (its KV block count) or why not.
struct TpReady {
  bool ok = false;
  uint32_t num_kv_blocks = 0;
  std::string device;  // the worker's device name, for logs
  std::string reason;  // when !ok (<= 1 KiB)

  bool operator==(const TpReady&) const = default;
};

// Which ModelRunner call a TpStep repeats: the runner's own pass kinds (StepKind,
// engine/base/step_kind.h: one enum for the call and the wire), kStep..kForward on the wire
// (1..5, a u8); kForwardCandidates never travels and the decoder refuses it.
using TpMethod = StepKind;

// One chunk of a TpStep's batch (a SequenceInput): its tokens and new block ids follow the
// earlier chunks' in TpStep::tokens and TpStep::block_ids. A chunk of a sequence the worker
// mirrors (seq_id >= 0) keeps the mirror's first kept_blocks ids and appends the
// num_blocks - kept_blocks ids it carries; one without (seq_id -1, kept_blocks 0) carries all.
struct TpSeq {
  int32_t start_pos = 0;
  uint32_t num_tokens = 0;
  uint32_t num_blocks = 0;  // block ids covering [0, start_pos + num_tokens)
  bool all_logits = false;
  int64_t seq_id = -1;
  uint32_t kept_blocks = 0;  // <= num_blocks

  bool operator==(const TpSeq&) const = default;
};

// One sample row: which logits rank 0 computes ((chunk, token) as SampleRow) and, for the
// verification methods, how many of the chunk's tokens after the first are drafts.
// num_candidates and full_logits are what the worker's runner needs to merge the vocabulary
// shards as rank 0 does (VocabMergeK in engine/runner/model_runner.h).
struct TpRow {
  int32_t chunk = 0;
  int32_t token = -1;
  uint16_t num_drafts = 0;
  uint8_t num_candidates = 0;
  bool full_logits = false;

  bool operator==(const TpRow&) const = default;
};

// Rank 0 -> worker, once per runner call that runs the model: the call itself, so the worker
// runs the same forward and the same collectives on its shard. Ragged like SpeculateRequest.
struct TpStep {
  uint64_t step_id = 0;
  TpMethod method = TpMethod::kStep;
  std::vector<TpSeq> seqs;         // [num_seqs] <= limits.max_batch
  std::vector<int32_t> tokens;     // [sum of num_tokens] <= limits.max_request_tokens
  std::vector<int32_t> block_ids;  // [sum of num_blocks - kept_blocks] <= kMaxTpBlockIds
  std::vector<TpRow> rows;         // [num_rows] <= limits.max_request_tokens
  // Sequences whose mirrors the worker drops before this step's chunks (rank 0 dropped them).
  std::vector<int64_t> released;  // <= kMaxTpReleased

  // Empties everything, keeping capacity.
  void Clear();

  bool operator==(const TpStep&) const = default;
};

// One message; the alternative's index + 1 is its MessageType.
using Message = std::variant<Hello, HelloAck, SpeculateRequest, SpeculateResponse, Release,
                             Heartbeat, Shutdown, BulkLinkInit, HelloAuth, TpInit, TpReady, TpStep,
                             TpJoin, SsdInit, SsdReady, CacheOffer>;
// The MessageType of the alternative `message` holds.
MessageType TypeOf(const Message& message);

namespace dist_internal {  // helpers for MessageStruct / MessageRef
template <typename T, typename V>
struct IsAlternative;
template <typename T, typename... Ts>
struct IsAlternative<T, std::variant<Ts...>> : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {
};
template <typename T, typename... Ts>
constexpr size_t IndexOf(const std::variant<Ts...>*) {
  size_t i = 0;
  ((std::is_same_v<T, Ts> ? true : (++i, false)) || ...);
  return i;
}
template <typename V>
struct ConstPointers;
template <typename... Ts>
struct ConstPointers<std::variant<Ts...>> {
  using type = std::variant<const Ts*...>;
};
}  // namespace dist_internal

// True for the message structs (Hello, SpeculateRequest, ...).
template <typename T>
concept MessageStruct = dist_internal::IsAlternative<T, Message>::value;

// The MessageType of struct T, at compile time.
template <MessageStruct T>
constexpr MessageType MessageTypeOf() {
  return static_cast<MessageType>(dist_internal::IndexOf<T>(static_cast<const Message*>(nullptr)) +
                                  1);
}

// A non-owning reference to one message of any type: what EncodeFrame and Channel::Send take, so
// a caller's SpeculateRequest is encoded where it is, never copied into a Message first (a copy
// would allocate every round). Converts implicitly from each message struct and from a Message;
// the referenced message must outlive the call. Trivially copyable.
class MessageRef {
 public:
  template <MessageStruct T>
  MessageRef(const T& message) : ptr_(&message) {}  // NOLINT(google-explicit-constructor)
  MessageRef(const Message& message)                // NOLINT(google-explicit-constructor)
      : ptr_(std::visit([](const auto& m) -> Pointers { return &m; }, message)) {}

  // The referenced message's type.
  MessageType type() const { return static_cast<MessageType>(ptr_.index() + 1); }
  // Calls f(const T&) with the referenced message.
  template <typename F>
  decltype(auto) Visit(F&& f) const {
    return std::visit([&](const auto* m) -> decltype(auto) { return f(*m); }, ptr_);
  }
  // The message when it is a T, else nullptr.
  template <MessageStruct T>
  const T* GetIf() const {
    const T* const* p = std::get_if<const T*>(&ptr_);
    return p != nullptr ? *p : nullptr;
  }

 private:
  using Pointers = dist_internal::ConstPointers<Message>::type;
  Pointers ptr_;
};

// A decoded frame header.
struct FrameHeader {
  uint32_t magic = kWireMagic;
  uint16_t version = kProtocolVersion;
  MessageType type = MessageType::kHeartbeat;
  uint64_t sequence = 0;  // per direction and connection: 0, 1, 2, ...
  uint32_t payload_bytes = 0;
  uint32_t checksum = 0;  // CRC-32C of the payload
};

// Validates `message` against `limits` and encodes it with `sequence` into `frame` (replacing
// its contents; allocates only when frame->Capacity() < limits.MaxFrameBytes()). Errors:
// InvalidArgument naming the offending field. Any thread.
absl::Status EncodeFrame(MessageRef message, uint64_t sequence, const WireLimits& limits,
                         FrameBuffer* frame);

// Decodes and checks the first kFrameHeaderBytes of `bytes`: magic (DataLoss), type
// (InvalidArgument), version (FailedPrecondition unless it is a Hello/HelloAck, whose layout is
// frozen), payload size against limits (InvalidArgument).
absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes,
                                              const WireLimits& limits);

// Checks the payload's checksum (DataLoss) and decodes it into *message, validating every field
// against `limits` (InvalidArgument naming the field). *message keeps its storage when it
// already holds header.type's alternative.
absl::Status DecodePayload(const FrameHeader& header, std::span<const uint8_t> payload,
                           const WireLimits& limits, Message* message);

// DecodeFrameHeader + DecodePayload over one whole frame (exactly its bytes: extra bytes are an
// error).
absl::StatusOr<FrameHeader> DecodeFrame(std::span<const uint8_t> frame, const WireLimits& limits,
                                        Message* message);

// Why two Hellos cannot talk (empty when they can): protocol versions, opposite roles, equal
// fingerprints and limits. Symmetric, so both ends reach the same verdict.
std::string HelloMismatch(const Hello& local, const Hello& peer);

}  // namespace specd
