// The verifier's side of SSD (docs/architecture.md "SSD"): a Speculator whose drafts come from
// the speculator process (SsdWorker, `specd speculator`) over a Channel. Each Propose sends the
// round's outcomes (the tokens each sequence committed since its last drafts: k accepted drafts
// and the bonus token, or a new sequence's prompt; k as OnVerified told it) and waits for the
// drafts, which the speculator usually has ready from its speculation cache. The verifier listens
// (TCP rendezvous, so the speculator may run on another host) and, unless told otherwise, launches
// the speculator process itself and launches it again after it dies. Faults never cost a request:
// when the speculator does not answer within the timeout, its link breaks or it dies, the round
// goes on with local n-gram drafts (lossless like any draft), the link is dropped (a launched
// speculator is killed), and a new speculator that connects later rejoins: every sequence is sent
// to it whole again. Only an authenticated speculator joins (SsdAcceptor,
// engine/distributed/link_auth.h): a launched one gets a fresh secret per launch in its environment
// and must be that process; one started by hand proves it holds the secret file's secret, over TLS
// when configured; it then receives its settings in an SsdInit and answers SsdReady once its
// draft is loaded (ssd_init.h), all on the acceptor's thread. A refused connection or a failed
// init never touches the current link or the launched process. With an EAGLE-3 head in the
// speculator (hidden_width > 0), the engine hands over each target pass's hidden states
// (OnTargetPass); each sequence's rows wait here until the next request carries those of its
// committed positions to the speculator: on the host, inline in the request, or, on the device
// data path, bf16 on the target's GPU (DeviceHiddenStore), sent GPU to GPU on the NCCL link right
// after the request. With cache offers (the default; SsdOptions::cache_offers) the speculator
// also sends its complete greedy cache branches as it builds them; a round whose every outcome
// was offered takes its drafts from the offer, sends the outcomes and waits for nothing.
// Engine thread only.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/base/subprocess.h"
#include "engine/distributed/channel.h"
#include "engine/distributed/messages.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/ngram.h"
#include "engine/speculation/spec_config.h"
#include "engine/speculation/speculator.h"
#include "engine/speculation/ssd/device_hidden_store.h"
#include "engine/speculation/ssd/ssd_acceptor.h"
#include "engine/speculation/ssd/ssd_stats.h"

namespace specd {

// What the verifier knows of its speculator. Everything the speculator must share with it (the
// vocabulary, the limits, config's draft fields, the draft's runner below) reaches it in the
// SsdInit each joining speculator gets after the handshake (ssd_init.h); a launched one is started
// as `<binary> speculator --connect 127.0.0.1:PORT`, nothing more.
struct SsdSpeculatorOptions {
  SpeculativeConfig config;  // method ssd: draft model, K, fan-out, address, launch, timeout
  int32_t vocab_size = 0;    // the target's
  int32_t max_num_seqs = 256;
  int32_t max_model_len = 0;
  int32_t max_num_batched_tokens = 2048;  // tokens of one draft forward pass
  // The target's device: on a GPU, the device data path (config.ssd.device_data_path) brings the
  // speculator's q rows there over NCCL.
  std::string target_device = "cpu";
  // An EAGLE-3 head in the speculator (config.ssd.eagle3_drafter): the target's directory (the
  // head's embedding and the target's shapes) and the width of a hidden-state row the target
  // captures (the head's aux layers times the target's hidden size).
  std::string target_model;
  int32_t hidden_width = 0;
  // Most hidden-state rows one request carries, below the wire limit's (0: the wire limit's,
  // WireLimits::max_hidden_rows): rows beyond it are not sent, the latest kept first.
  int32_t max_hidden_rows = 0;
  // The draft's runner, as the verifier sets it up for its speculator.
  std::string device = "cpu";  // config.speculator_device, else the target's
  int32_t num_threads = 0;     // CPU threads; 0: one per core
  int32_t block_size = 16;
  std::string load_format = "auto";
  double gpu_memory_utilization = 0.9;                  // config.ssd's, else the target's
  absl::Duration startup_timeout = absl::Seconds(120);  // first connection (the draft loads)
  // How long a speculator that joined may take to load its draft and answer the SsdInit.
  absl::Duration init_timeout = absl::Minutes(10);
};

class SsdSpeculator : public Speculator {
 public:
  // Listens on config.ssd.address, launches the speculator when config.ssd.launch and waits up
  // to startup_timeout for it to join (without one it starts anyway, drafting locally).
  // Without launch the link secret comes from config.ssd.secret_file or $SPECD_SPECULATOR_SECRET
  // (FailedPrecondition when neither is set).
  static absl::StatusOr<std::unique_ptr<SsdSpeculator>> Create(const SsdSpeculatorOptions& o);
  ~SsdSpeculator() override;

  absl::Status Propose(std::span<const DraftInput> inputs, std::vector<Draft>* drafts) override;
  // Records each sequence's accepted length; the next Propose sends it with the outcome.
  void OnVerified(std::span<const VerifiedRound> rounds) override;
  void Release(uint64_t seq_id) override;

  // An EAGLE-3 head drafts in the speculator: requests carry the target's hidden states.
  bool wants_hidden() const { return limits_.hidden_width > 0; }
  // After a target pass: `batch` as run and which of its chunks belong to sequences that may
  // draft with SSD (`wanted[i]` for batch[i]). Keeps each wanted chunk's rows of the captured
  // hidden states (`target`'s CopyCapturedRows: the chunk's tokens at their offset in batch
  // order, hidden_width floats a row) for positions [start_pos, start_pos + n), replacing what
  // the sequence held from start_pos on (a later chunk supersedes rejected drafts' rows). A tree
  // chunk only drops them. A runner that hands over fewer rows than the pass had tokens leaves
  // nothing stored for the pass (logged once, at debug). InvalidArgument for a `wanted` of
  // another size. No-op unless wants_hidden().
  absl::Status OnTargetPass(std::span<const SequenceInput> batch, std::span<const uint8_t> wanted,
                            const ModelRunner& target);

  // The engine's stages of the round whose drafts the last Propose fetched from the speculator
  // (seconds, MonotonicNanos-based): the step's verification pass without host acceptance, the
  // host acceptance (HostVerifier; 0 when acceptance ran in the pass), the commit, and the
  // step's wall time from its start to the commit's end. Completes the round's timeline in
  // stats().timeline (the rest of the step: what its stages leave of round_seconds). Ignored
  // when that Propose drafted locally, or was already ended.
  struct EngineRoundSeconds {
    double verify = 0, sampling = 0, commit = 0, round = 0;
  };
  void EndRound(const EngineRoundSeconds& engine);
  // The last Propose's wait for the speculator's reply (SsdVerifierStage::kWait; 0 when it
  // drafted locally): what each of its sequences waited, for their usage.
  double last_wait_seconds() const { return round_open_ ? round_.at(SsdVerifierStage::kWait) : 0; }

  const SsdStats& stats() const { return stats_; }
  // The port the verifier listens on (the speculator connects there).
  int32_t port() const;
  // The launched speculator's pid, -1 when none runs (tests stop and kill it). Any thread.
  int32_t speculator_pid() const { return pid_.load(); }

 private:
  // What the speculator knows of a sequence.
  struct SeqState {
    bool synced = false;       // the speculator holds its context up to num_sent tokens
    size_t num_sent = 0;       // committed tokens the speculator was told
    int32_t accepted_len = 0;  // of its last drafts, told by OnVerified (0: told nothing)
    // Drafts of the speculator's last reply handed to the engine (0: none, or the round used
    // local drafts): only an outcome of those is the speculator's to hear.
    int32_t num_remote_drafts = 0;
    // Hidden rows: positions below it were sent to the speculator (or can no longer be).
    int32_t hidden_sent = 0;
    uint64_t round = 0;  // the request that last carried it (its drafts' cache is that round's)
  };
  // A branch a CacheOffer offered: the drafts for outcome (k, bonus), offer_tokens_[offset, +n).
  struct Offered {
    uint16_t k = 0;
    int32_t bonus = 0;
    uint32_t offset = 0, num_tokens = 0;
  };
  // A sequence's target hidden states not sent yet: one run of consecutive positions.
  struct HiddenRun {
    int32_t first = 0;        // the position of its first row
    std::vector<float> rows;  // [n, hidden_width] f32, host: positions [first, first + n)
  };

  explicit SsdSpeculator(const SsdSpeculatorOptions& o);
  // Listens (with TLS when configured) and starts accepting under the first policy.
  absl::Status StartListening();
  // Makes an admitted speculator's channel the link (replacing an older one): it knows nothing,
  // so every sequence goes to it whole.
  void Adopt(SsdLink link);
  // Starts the speculator process when we launch it and none runs (at most every few seconds).
  void MaybeLaunch();
  void LinkDown(const absl::Status& why);
  absl::Status RemoteRound(std::span<const DraftInput> inputs, std::vector<Draft>* drafts);
  // RemoteRound's phases: the Release of finished sequences (what fits one message); the
  // request (each input's outcome since its last drafts, or its prompt; sent[i] its request
  // index or -1 when it does not fit), returning the new sequences' prompt tokens; the send and
  // the wait for the matching response; one input's drafts from the response, and the counts.
  absl::Status SendReleases(absl::Duration timeout);
  int64_t SyncOutcomes(std::span<const DraftInput> inputs, std::vector<int32_t>& sent,
                       bool offer_hits = false);
  // Sends request_ (with its hidden rows on the device data path after it).
  absl::Status SendRequest(absl::Duration timeout);
  // Waits up to `wait` for the response to request_.
  absl::Status AwaitResponse(absl::Duration wait);
  // Cache offers: reads every message already in without waiting, keeping the offers of the
  // last request's round (offers_); a Shutdown is Unavailable.
  absl::Status ReadOffers();
  // When every input's outcome was offered (greedy, synced, in the last request, wanting no
  // more drafts than the offer holds): their drafts from the offer, the request sent with each
  // sequence flagged kSeqOfferHit and no response awaited; true. Otherwise nothing, false.
  absl::StatusOr<bool> OfferedRound(std::span<const DraftInput> inputs, std::vector<Draft>* drafts,
                                    int64_t start_ns);
  // The offered branch for `in`'s outcome, or nullptr.
  const Offered* FindOffered(const DraftInput& in, const SeqState& s) const;
  // Counts `in`'s outcome (accepted length k) and whether the cache had it.
  void CountOutcome(size_t k, bool hit);
  // The response's q rows that travel on the device data path received into bulk_'s buffer on
  // the target's GPU (row offsets per response draft in bulk_offsets_); nothing when inline.
  absl::Status ReceiveRows(const SpeculateResponse& response, absl::Duration timeout);
  // The speculator's stage times (a response's or a cache offer's, ns in SsdSpeculatorStage
  // order) into the timeline.
  using SpeculatorStagesNs = std::array<uint64_t, kNumSsdSpeculatorStages>;
  void AddSpeculatorStages(const SpeculatorStagesNs& ns);
  void TakeDraft(const DraftInput& in, const SpeculateSeq& m, const SpeculateDraft& d, Draft& out);
  // Hidden rows: the run's positions [from, ...) dropped; `rows` ([n, hidden_width]) of
  // positions [position, position + n) appended (a gap before them replaces the run).
  void TruncateHidden(HiddenRun& run, int32_t from) const;
  void StoreHidden(uint64_t seq_id, int32_t position, std::span<const float> rows);
  // Gives `m` (just added for `in`) the stored rows of the positions the speculator lacks: the
  // run ending at the last committed token's predecessor, at most *budget rows (the latest
  // ones), then drops everything stored for the sequence.
  void AttachHidden(const DraftInput& in, SeqState& s, SpeculateSeq& m, uint64_t* budget);
  // OnTargetPass on the device data path: the wanted chunks' rows (hidden_ranges_) copied into
  // device_hidden_ on the target's GPU.
  absl::Status KeepOnDevice(std::span<const SequenceInput> batch, std::span<const uint8_t> wanted,
                            const ModelRunner& target, int64_t rows);
  // Forgets `seq_id`'s stored hidden rows (host and device).
  void DropHidden(uint64_t seq_id);
  // Most hidden rows one request carries (the wire limit's, or options_.max_hidden_rows).
  int32_t MaxHiddenRows() const {
    const uint32_t wire = limits_.max_hidden_rows;
    return static_cast<int32_t>(
        options_.max_hidden_rows > 0 ? std::min<uint32_t>(wire, options_.max_hidden_rows) : wire);
  }
  int32_t HiddenRows(const HiddenRun& run) const {
    return static_cast<int32_t>(run.rows.size() / limits_.hidden_width);
  }

  SsdSpeculatorOptions options_;
  WireLimits limits_;
  std::unique_ptr<SsdAcceptor> acceptor_;
  std::unique_ptr<TcpChannel> channel_;
  // The device data path beside channel_ (null: q rows inline), the rows the last response sent
  // on it ([rows, vocab] f32 on the target's GPU, valid until the next Propose), and each
  // response draft's first row there.
  std::unique_ptr<NcclChannel> bulk_;
  // The hidden rows on the device data path (wants_hidden() and a bulk link), else null.
  std::unique_ptr<DeviceRowLink> row_link_;
  std::unique_ptr<DeviceHiddenStore> device_hidden_;
  const float* bulk_rows_ = nullptr;
  std::vector<uint64_t> bulk_offsets_;
  Subprocess process_;
  std::atomic<int32_t> pid_{-1};  // process_'s pid for other threads
  absl::Time last_launch_ = absl::InfinitePast();
  std::string launch_command_;  // for errors
  struct {
    int64_t sent = 0, received = 0;
  } bytes_before_;  // bytes of the links before the current one
  NgramSpeculator local_;
  absl::flat_hash_map<uint64_t, SeqState> seqs_;
  absl::flat_hash_map<uint64_t, HiddenRun> hidden_;   // wants_hidden(): rows not sent yet (host)
  std::vector<ModelRunner::RowRange> hidden_ranges_;  // OnTargetPass's scratch
  std::vector<float> hidden_copy_;                    // [rows, hidden_width] its copy
  bool short_capture_logged_ = false;
  std::vector<uint64_t> released_;
  Message request_ = SpeculateRequest();
  Message reply_;
  // Cache offers of request offers_round_'s round (SsdOptions::cache_offers), by sequence; the
  // last one's speculator stage times; ReadOffers' message.
  absl::flat_hash_map<uint64_t, std::vector<Offered>> offers_;
  std::vector<int32_t> offer_tokens_;
  uint64_t offers_round_ = 0;
  SpeculatorStagesNs offer_stages_{};  // SsdSpeculatorStage order (reply: 0)
  Message inbox_;
  std::vector<const Offered*> offered_;  // OfferedRound's scratch: each input's offered branch
  std::vector<int32_t> offered_sent_;    // ... and its request index
  uint64_t round_id_ = 0;
  // The verifier's stages of the round in progress (transfer, wait, cache lookup: what Propose
  // measured), open from a remote round's Propose until EndRound adds it to stats_.timeline.
  SsdTimeline round_;
  bool round_open_ = false;
  // SendRequest's and AwaitResponse's MonotonicNanos stamps: the request's frame sent, the
  // request sent (its hidden rows' transfer enqueued after the frame), the reply's first byte.
  struct {
    int64_t frame_sent = 0, sent = 0, first_byte = 0;
  } stamps_;
  // SPECD_SSD_TRACE=1: where the verifier's transfer stage goes (offers read, outcomes synced,
  // the frame sent, the hidden rows' transfer enqueued), logged every kTraceRounds rounds.
  static constexpr int64_t kTraceRounds = 64;
  bool trace_ = false;
  struct {
    int64_t rounds = 0, offer_rounds = 0;
    double offers = 0, sync = 0, frame = 0, hidden = 0;
  } trace_sums_;
  // A remote round's stamps since `start_ns`: `offers_ns` after ReadOffers, `synced_ns` after
  // SyncOutcomes (then stamps_).
  void Trace(int64_t start_ns, int64_t offers_ns, int64_t synced_ns, bool offered);
  SsdStats stats_;
};

}  // namespace specd
