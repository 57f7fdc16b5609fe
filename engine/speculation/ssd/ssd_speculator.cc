#include "engine/speculation/ssd/ssd_speculator.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/monotonic_clock.h"
#include "engine/base/status.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/tls.h"
#include "engine/speculation/saguaro/saguaro.h"
#include "engine/speculation/ssd/ssd_init.h"
#include "engine/speculation/ssd/ssd_protocol.h"

namespace specd {
namespace {

// Extra wait per prompt token of the round's new sequences (the speculator prefills them before
// it drafts; a CPU draft model runs some thousands of tokens per second).
constexpr absl::Duration kPrefillAllowancePerToken = absl::Milliseconds(1);

// Least time between two launches of the speculator process (a crash loop must not spin).
constexpr absl::Duration kRelaunchInterval = absl::Seconds(2);

absl::StatusOr<std::pair<std::string, uint16_t>> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("speculator_address '", address, "' is not HOST:PORT"));
  }
  return std::make_pair(address.substr(0, colon), static_cast<uint16_t>(port));
}

// The link secret of a speculator started by hand: the secret file, else the environment.
absl::StatusOr<LinkSecret> RemoteSecret(const SsdOptions& ssd) {
  if (!ssd.secret_file.empty()) return ReadLinkSecretFile(ssd.secret_file);
  if (const char* hex = std::getenv(kLinkSecretEnv); hex != nullptr) {
    return LinkSecretFromHex(hex);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "\"launch_speculator\": false needs the link secret: \"speculator_secret_file\" (64 hex "
      "digits, mode 0600; e.g. openssl rand -hex 32) or $",
      kLinkSecretEnv));
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

SsdSpeculator::SsdSpeculator(const SsdSpeculatorOptions& o)
    : options_(o),
      limits_(SsdInitLimits(MakeSsdInit(o))),  // the acceptor's: the speculator's too
      local_(o.config.prompt_lookup_min, o.config.prompt_lookup_max) {
  const char* trace = std::getenv("SPECD_SSD_TRACE");
  trace_ = trace != nullptr && std::string_view(trace) == "1";
}

SsdSpeculator::~SsdSpeculator() {
  if (bulk_) bulk_->Abort();  // the speculator ends its half without finalizing together
  if (channel_) {
    channel_->Send(Shutdown{"verifier stopping"}, absl::Milliseconds(100)).IgnoreError();
    channel_->Close();
  }
  process_.Kill();
}

absl::Status SsdSpeculator::StartListening() {
  const SsdOptions& ssd = options_.config.ssd;
  SPECD_ASSIGN_OR_RETURN(auto address, SplitAddress(ssd.address));
  std::shared_ptr<const TlsContext> tls;
  const TlsFiles files{ssd.tls_cert, ssd.tls_key, ssd.tls_ca};
  if (files.enabled()) {
    SPECD_ASSIGN_OR_RETURN(tls, TlsContext::Create(files, TlsContext::Side::kServer));
  } else if (!ssd.launch && !IsLoopbackHost(address.first)) {
    SPECD_LOG_WARN(
        "ssd: the speculator link on {} is authenticated but not encrypted: set "
        "speculator_tls_cert/_key/_ca for a speculator on another host",
        ssd.address);
  }
  AcceptPolicy policy;
  if (!ssd.launch) {
    SPECD_ASSIGN_OR_RETURN(policy.secret, RemoteSecret(ssd));
  }
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<TcpListener> listener,
                         TcpListener::Listen(address.first, address.second,
                                             SsdHello(Role::kVerifier), std::move(tls)));
  if (ssd.launch) policy.expected_pid = INT32_MAX;  // nobody until the first launch
  const absl::StatusOr<DeviceChoice> target = ParseDevice(options_.target_device);
  acceptor_ = std::make_unique<SsdAcceptor>(std::move(listener), policy, MakeSsdInit(options_),
                                            options_.init_timeout,
                                            target.ok() && target->cuda ? target->index : -1);
  SPECD_LOG_INFO("ssd: listening for the speculator on {}:{}", address.first, port());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SsdSpeculator>> SsdSpeculator::Create(
    const SsdSpeculatorOptions& o) {
  std::unique_ptr<SsdSpeculator> s(new SsdSpeculator(o));
  SPECD_RETURN_IF_ERROR(s->StartListening());
  s->MaybeLaunch();
  if (o.config.ssd.launch && !s->process_.Running()) {
    return absl::InternalError("ssd: the speculator process did not start");
  }
  // Wait for the first speculator; a launched one that exits first (a bad draft model, a
  // missing GPU) is a startup error, reported with the reason it printed.
  const absl::Time deadline = absl::Now() + o.startup_timeout;
  while (!s->channel_) {
    if (SsdLink link = s->acceptor_->WaitFor(absl::Milliseconds(100))) {
      s->Adopt(std::move(link));
      break;
    }
    if (o.config.ssd.launch && !s->process_.Running()) {
      const int status = s->process_.exit_status();
      return absl::FailedPreconditionError(
          absl::StrCat("ssd: the speculator process (", s->launch_command_, ") exited ",
                       WIFEXITED(status) ? absl::StrCat("with status ", WEXITSTATUS(status))
                                         : absl::StrCat("on signal ", WTERMSIG(status)),
                       " before joining; its error is in the log above"));
    }
    if (absl::Now() >= deadline) {
      SPECD_LOG_WARN("ssd: no speculator joined within {}; drafting locally until one does",
                     absl::FormatDuration(o.startup_timeout));
      break;
    }
  }
  return s;
}

int32_t SsdSpeculator::port() const { return acceptor_->port(); }

void SsdSpeculator::MaybeLaunch() {
  if (!options_.config.ssd.launch || process_.Running()) return;
  pid_ = -1;
  const absl::Time now = absl::Now();
  if (now - last_launch_ < kRelaunchInterval) return;
  last_launch_ = now;
  std::string binary = options_.config.ssd.binary;
  if (binary.empty()) {
    absl::StatusOr<std::string> self = SelfExecutable();
    if (!self.ok()) {
      SPECD_LOG_ERROR("ssd: cannot launch the speculator: {}", self.status().ToString());
      return;
    }
    binary = *self;
  }
  // A fresh secret per launch, in the child's environment (argv is public in `ps`).
  absl::StatusOr<LinkSecret> secret = NewLinkSecret();
  if (!secret.ok()) {
    SPECD_LOG_ERROR("ssd: cannot launch the speculator: {}", secret.status().ToString());
    return;
  }
  // Its settings come in the SsdInit once it joined: the command line names only where to join.
  const std::vector<std::string> argv = {binary, "speculator", "--connect",
                                         absl::StrCat("127.0.0.1:", port())};
  launch_command_ = absl::StrCat(binary, " speculator");
  acceptor_->BeginLaunch(*secret);
  absl::StatusOr<Subprocess> p =
      Subprocess::Spawn(argv, {absl::StrCat(kLinkSecretEnv, "=", LinkSecretToHex(*secret))});
  acceptor_->EndLaunch(p.ok() ? p->pid() : 0);
  if (!p.ok()) {
    SPECD_LOG_ERROR("ssd: cannot launch the speculator: {}", p.status().ToString());
    return;
  }
  process_ = *std::move(p);
  pid_ = process_.pid();
  ++stats_.launches;
  SPECD_LOG_INFO("ssd: launched the speculator (pid {})", process_.pid());
}

void SsdSpeculator::Adopt(SsdLink link) {
  if (channel_) {
    SPECD_LOG_INFO("ssd: an authenticated speculator replaces the current link");
    if (bulk_) bulk_->Abort();
    channel_->Close();
  }
  SPECD_LOG_INFO("ssd: speculator joined from {} (q rows {})", link.channel->peer_address(),
                 link.bulk ? "GPU to GPU" : "over TCP");
  bytes_before_.sent = stats_.bytes_sent;
  bytes_before_.received = stats_.bytes_received;
  channel_ = std::move(link.channel);
  device_hidden_.reset();
  row_link_.reset();
  bulk_ = std::move(link.bulk);
  stats_.device_data_path = bulk_ != nullptr;
  if (bulk_ != nullptr && wants_hidden()) {
    // The hidden rows go GPU to GPU from now on; those kept on the host are not sent.
    hidden_.clear();
    row_link_ = NcclRowLink(*bulk_, options_.config.ssd.timeout_ms);
    device_hidden_ = std::make_unique<DeviceHiddenStore>(
        *row_link_, static_cast<size_t>(limits_.hidden_width) * 2, MaxHiddenRows());
  }
  for (auto& [id, s] : seqs_) s = SeqState{};  // it knows nothing: every sequence goes whole
  released_.clear();
  offers_.clear();
  offers_round_ = 0;
  ++stats_.connects;
  stats_.connected = true;
}

void SsdSpeculator::LinkDown(const absl::Status& why) {
  SPECD_LOG_WARN("ssd: speculator link lost ({}); drafting locally until one rejoins",
                 why.ToString());
  ++stats_.link_failures;
  stats_.connected = false;
  stats_.device_data_path = false;
  if (bulk_) bulk_->Abort();  // a receive the speculator never sends for ends now
  device_hidden_.reset();     // its rows live in the link's buffers
  row_link_.reset();
  bulk_.reset();
  if (channel_) channel_->Close();
  channel_.reset();
  offers_.clear();
  offers_round_ = 0;
  // A launched speculator that stopped answering is replaced; a dead one is reaped.
  if (options_.config.ssd.launch) {
    pid_ = -1;
    process_.Kill();
  }
}

void SsdSpeculator::OnVerified(std::span<const VerifiedRound> rounds) {
  for (const VerifiedRound& r : rounds) {
    auto it = seqs_.find(r.seq_id);
    if (it == seqs_.end() || !it->second.synced || it->second.num_remote_drafts == 0) continue;
    it->second.accepted_len = std::min(r.num_accepted, it->second.num_remote_drafts);
  }
}

void SsdSpeculator::DropHidden(uint64_t seq_id) {
  hidden_.erase(seq_id);
  if (device_hidden_) device_hidden_->Erase(seq_id);
}

void SsdSpeculator::Release(uint64_t seq_id) {
  DropHidden(seq_id);
  offers_.erase(seq_id);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  if (it->second.synced && channel_) released_.push_back(seq_id);
  seqs_.erase(it);
}

absl::Status SsdSpeculator::Propose(std::span<const DraftInput> inputs,
                                    std::vector<Draft>* drafts) {
  drafts->assign(inputs.size(), Draft{});
  round_open_ = false;
  if (SsdLink joined = acceptor_->Take()) Adopt(std::move(joined));
  stats_.refused_joins = acceptor_->refused();
  if (!channel_) MaybeLaunch();
  if (channel_) {
    const absl::Status s = RemoteRound(inputs, drafts);
    if (s.ok()) return s;
    LinkDown(s);
    drafts->assign(inputs.size(), Draft{});
  }
  ++stats_.local_rounds;
  SPECD_RETURN_IF_ERROR(local_.Propose(inputs, drafts));
  for (Draft& d : *drafts) d.origin = DraftOrigin::kLocal;
  return absl::OkStatus();
}

absl::Status SsdSpeculator::RemoteRound(std::span<const DraftInput> inputs,
                                        std::vector<Draft>* drafts) {
  const absl::Duration timeout = absl::Milliseconds(options_.config.ssd.timeout_ms);
  const int64_t start_ns = MonotonicNanos();
  SPECD_RETURN_IF_ERROR(SendReleases(timeout));
  if (options_.config.ssd.cache_offers) {
    SPECD_RETURN_IF_ERROR(ReadOffers());
    SPECD_ASSIGN_OR_RETURN(const bool offered, OfferedRound(inputs, drafts, start_ns));
    if (offered) return absl::OkStatus();
  }
  const int64_t offers_ns = MonotonicNanos();
  std::vector<int32_t> sent(inputs.size(), -1);  // request index of each input, or -1
  const int64_t new_tokens = SyncOutcomes(inputs, sent);
  const int64_t synced_ns = MonotonicNanos();
  SPECD_RETURN_IF_ERROR(SendRequest(timeout));
  Trace(start_ns, offers_ns, synced_ns, false);
  // New sequences make the speculator prefill their prompts first: allow for that.
  SPECD_RETURN_IF_ERROR(AwaitResponse(timeout + kPrefillAllowancePerToken * new_tokens));
  const auto& request = std::get<SpeculateRequest>(request_);
  const auto& response = std::get<SpeculateResponse>(reply_);
  if (response.drafts.size() != request.seqs.size()) {
    return absl::InternalError(absl::StrCat("ssd: ", response.drafts.size(), " drafts for ",
                                            request.seqs.size(), " sequences"));
  }
  SPECD_RETURN_IF_ERROR(ReceiveRows(response, timeout));
  stats_.speculator_busy_seconds += response.busy_ns * 1e-9;
  stats_.speculator_cache_seconds += response.cache_build_ns * 1e-9;
  AddSpeculatorStages({response.receive_ns, response.triage_ns, response.draft_ns,
                       response.cache_build_ns, response.reply_ns});
  const int64_t lookup_ns = MonotonicNanos();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (sent[i] >= 0)
      TakeDraft(inputs[i], request.seqs[sent[i]], response.drafts[sent[i]], (*drafts)[i]);
  }
  const int64_t end_ns = MonotonicNanos();
  // Transfer: building and sending the request, then reading the reply from its first byte
  // (and checking it, and the device data path's receive of its q rows); wait: between the two.
  round_.at(SsdVerifierStage::kTransfer) =
      NanosToSeconds(start_ns, stamps_.sent) + NanosToSeconds(stamps_.first_byte, lookup_ns);
  round_.at(SsdVerifierStage::kWait) = NanosToSeconds(stamps_.sent, stamps_.first_byte);
  round_.at(SsdVerifierStage::kCacheLookup) = NanosToSeconds(lookup_ns, end_ns);
  round_open_ = true;
  return absl::OkStatus();
}

absl::Status SsdSpeculator::SendReleases(absl::Duration timeout) {
  if (released_.empty()) return absl::OkStatus();
  specd::Release release;
  const size_t n = std::min<size_t>(released_.size(), limits_.max_release_ids);
  release.seq_ids.assign(released_.begin(), released_.begin() + n);
  released_.erase(released_.begin(), released_.begin() + n);
  return channel_->Send(release, timeout);
}

int64_t SsdSpeculator::SyncOutcomes(std::span<const DraftInput> inputs, std::vector<int32_t>& sent,
                                    bool offer_hits) {
  auto& request = std::get<SpeculateRequest>(request_);
  request.Clear();
  request.round_id = ++round_id_;
  uint64_t budget = limits_.max_request_tokens;
  request.hidden_out_of_band = device_hidden_ != nullptr;
  uint64_t hidden_budget = MaxHiddenRows();
  int64_t new_tokens = 0;
  for (size_t i = 0; i < inputs.size() && request.seqs.size() < limits_.max_batch; ++i) {
    const DraftInput& in = inputs[i];
    SeqState& s = seqs_[in.seq_id];
    if (s.synced && in.tokens.size() < s.num_sent) {  // preempted and restarted
      s = SeqState{};
      DropHidden(in.seq_id);
    }
    SpeculateSeq m;
    m.seq_id = in.seq_id;
    std::span<const int32_t> fresh = in.tokens;
    if (s.synced) {
      fresh = fresh.subspan(s.num_sent);
      // fresh: the drafts OnVerified said were accepted (none when it said nothing), then the
      // target's next token and anything committed since.
      m.accepted_len = static_cast<uint16_t>(std::min<size_t>(
          static_cast<size_t>(std::max(s.accepted_len, 0)), fresh.empty() ? 0 : fresh.size() - 1));
    } else {
      m.flags |= kSeqNew;
    }
    if (offer_hits) m.flags |= kSeqOfferHit;
    if (fresh.empty() || fresh.size() > limits_.max_seq_tokens || fresh.size() > budget) continue;
    budget -= fresh.size();
    if (m.flags & kSeqNew) new_tokens += static_cast<int64_t>(fresh.size());
    const SamplingParams& p = *in.params;
    m.num_draft_tokens = static_cast<uint16_t>(
        std::min<int32_t>(in.num_draft_tokens, static_cast<int32_t>(limits_.max_draft_tokens)));
    m.fan_out = static_cast<uint16_t>(
        std::min<int32_t>(options_.config.ssd.fan_out, static_cast<int32_t>(limits_.max_fan_out)));
    if (!p.greedy()) {
      m.flags |= kSeqWantProbs;
      m.sampling = {p.temperature, p.top_p, std::max(0, p.top_k), p.min_p, in.seed};
      const float c = in.speculation != nullptr ? in.speculation->saguaro_c : -1.0f;
      m.saguaro_c = c >= 0.0f ? c : DefaultDownweight(p.temperature);
    }
    SpeculateSeq& added = request.AddSeq(m, fresh);
    if (wants_hidden()) AttachHidden(in, s, added, &hidden_budget);
    sent[i] = static_cast<int32_t>(request.seqs.size()) - 1;
    s.synced = true;
    s.num_sent = in.tokens.size();
    s.accepted_len = 0;
    s.num_remote_drafts = 0;
    s.round = request.round_id;
  }
  return new_tokens;
}

absl::Status SsdSpeculator::SendRequest(absl::Duration timeout) {
  // The window the speculator's cache build had: since its last response came in (or, after a
  // round drafted from an offer, since that round's request went out).
  const int64_t now = MonotonicNanos();
  std::get<SpeculateRequest>(request_).window_ns =
      stamps_.first_byte > 0 && now > stamps_.first_byte
          ? static_cast<uint64_t>(now - stamps_.first_byte)
          : 0;
  SPECD_RETURN_IF_ERROR(channel_->Send(request_, timeout));
  stamps_.frame_sent = MonotonicNanos();
  if (device_hidden_) {
    // The request's hidden rows, GPU to GPU, after it: the speculator posts their receive once
    // it read it (the link's first transfer also waits for the peer to connect).
    SPECD_ASSIGN_OR_RETURN(const int64_t rows, device_hidden_->SendQueued());
    stats_.device_hidden_rows += rows;
  }
  stamps_.sent = MonotonicNanos();
  return absl::OkStatus();
}

absl::Status SsdSpeculator::AwaitResponse(absl::Duration wait) {
  const uint64_t round_id = std::get<SpeculateRequest>(request_).round_id;
  const absl::Time start = absl::Now();
  for (;;) {
    const absl::Duration left = wait - (absl::Now() - start);
    absl::StatusOr<MessageType> type =
        channel_->Recv(std::max(left, absl::ZeroDuration()), &reply_);
    if (!type.ok()) return type.status();
    if (*type == MessageType::kSpeculateResponse &&
        std::get<SpeculateResponse>(reply_).round_id == round_id) {
      break;
    }
    if (*type == MessageType::kShutdown) return absl::UnavailableError("the speculator shut down");
  }
  stats_.wait_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  // The reply's first byte arrived after the request went out (clamped: a transport that does
  // not know counts the whole receive as waiting).
  const int64_t received = std::max(MonotonicNanos(), stamps_.sent);
  const int64_t first_byte = channel_->last_recv_first_byte_ns();
  stamps_.first_byte = first_byte > 0 ? std::clamp(first_byte, stamps_.sent, received) : received;
  ++stats_.rounds;
  stats_.bytes_sent = bytes_before_.sent + static_cast<int64_t>(channel_->bytes_sent());
  stats_.bytes_received = bytes_before_.received + static_cast<int64_t>(channel_->bytes_received());
  return absl::OkStatus();
}

absl::Status SsdSpeculator::ReceiveRows(const SpeculateResponse& response, absl::Duration timeout) {
  bulk_rows_ = nullptr;
  if (!response.probs_out_of_band) return absl::OkStatus();
  if (bulk_ == nullptr) {
    return absl::FailedPreconditionError("ssd: q rows sent out of band without a device data path");
  }
  bulk_offsets_.clear();
  uint64_t rows = 0;
  for (const SpeculateDraft& d : response.drafts) {
    bulk_offsets_.push_back(rows);
    rows += d.has_probs ? d.num_tokens : 0;
  }
  if (rows == 0) return absl::OkStatus();
  const size_t bytes = rows * static_cast<size_t>(options_.vocab_size) * sizeof(float);
  SPECD_ASSIGN_OR_RETURN(void* buffer, bulk_->Buffer(bytes));
  SPECD_RETURN_IF_ERROR(bulk_->Recv(buffer, bytes, bulk_->stream()));
  // Verification reads the rows on the target's stream: they must be complete first.
  SPECD_RETURN_IF_ERROR(bulk_->Synchronize(bulk_->stream(), timeout));
  bulk_rows_ = static_cast<const float*>(buffer);
  stats_.device_rows += static_cast<int64_t>(rows);
  return absl::OkStatus();
}

void SsdSpeculator::AddSpeculatorStages(const SpeculatorStagesNs& ns) {
  SsdTimeline& t = stats_.timeline;
  ++t.speculator_rounds;
  for (int i = 0; i < kNumSsdSpeculatorStages; ++i) t.speculator[i] += ns[i] * 1e-9;
}

void SsdSpeculator::EndRound(const EngineRoundSeconds& engine) {
  if (!round_open_) return;
  round_open_ = false;
  round_.at(SsdVerifierStage::kVerify) = engine.verify;
  round_.at(SsdVerifierStage::kSampling) = engine.sampling;
  round_.at(SsdVerifierStage::kCommit) = engine.commit;
  double measured = 0;
  for (int i = 0; i < kNumSsdVerifierStages; ++i) {
    if (i != static_cast<int>(SsdVerifierStage::kRest)) measured += round_.verifier[i];
  }
  round_.at(SsdVerifierStage::kRest) = std::max(0.0, engine.round - measured);
  SsdTimeline& t = stats_.timeline;
  ++t.verifier_rounds;
  t.verifier_round_seconds += engine.round;
  for (int i = 0; i < kNumSsdVerifierStages; ++i) t.verifier[i] += round_.verifier[i];
}

void SsdSpeculator::TakeDraft(const DraftInput& in, const SpeculateSeq& m, const SpeculateDraft& d,
                              Draft& out) {
  const auto& response = std::get<SpeculateResponse>(reply_);
  SeqState& s = seqs_[in.seq_id];
  if (!(m.flags & kSeqNew)) {  // the speculator was told an outcome: count it by k
    CountOutcome(m.accepted_len, d.status == DraftStatus::kHit);
  }
  switch (d.status) {
    case DraftStatus::kHit:
      ++stats_.drafts_hit;
      break;
    case DraftStatus::kMissPrimary:
      ++stats_.drafts_miss_primary;
      break;
    case DraftStatus::kMissBackup:
      ++stats_.drafts_miss_backup;
      break;
    case DraftStatus::kNone:
      ++stats_.drafts_none;
      if (!(m.flags & kSeqNew)) s = SeqState{};  // it lost the sequence: resend it whole
      break;
  }
  const std::span<const int32_t> tokens = response.TokensOf(d);
  out.origin = d.status == DraftStatus::kHit          ? DraftOrigin::kCacheHit
               : d.status == DraftStatus::kMissBackup ? DraftOrigin::kBackup
                                                      : DraftOrigin::kPrimary;
  out.tokens.assign(tokens.begin(), tokens.end());
  s.num_remote_drafts = static_cast<int32_t>(out.tokens.size());
  if (!in.params->greedy() && !out.tokens.empty() && d.has_probs && bulk_rows_ != nullptr) {
    const auto index = static_cast<size_t>(&d - response.drafts.data());
    out.device_probs =
        bulk_rows_ + bulk_offsets_[index] * static_cast<uint64_t>(options_.vocab_size);
  } else if (!in.params->greedy() && !out.tokens.empty()) {
    const std::span<const float> rows =
        response.ProbsOf(d, static_cast<uint32_t>(options_.vocab_size));
    out.probs.assign(rows.begin(), rows.end());  // empty: deterministic (backup) drafts
  }
}

void SsdSpeculator::CountOutcome(size_t k, bool hit) {
  if (stats_.outcomes_by_accepted_len.size() <= k) {
    stats_.outcomes_by_accepted_len.resize(k + 1);
    stats_.hits_by_accepted_len.resize(k + 1);
  }
  ++stats_.outcomes_by_accepted_len[k];
  stats_.hits_by_accepted_len[k] += hit ? 1 : 0;
}

}  // namespace specd
