// SsdSpeculator's cache offers (wire version 10; ssd_speculator.h): the offers read off the link
// before a round asks, the round that takes its drafts from them, and the verifier's trace of its
// transfer stage (SPECD_SSD_TRACE=1).
#include <algorithm>
#include <string_view>

#include "engine/base/log.h"
#include "engine/base/monotonic_clock.h"
#include "engine/base/status.h"
#include "engine/speculation/ssd/ssd_speculator.h"

namespace specd {

void SsdSpeculator::Trace(int64_t start_ns, int64_t offers_ns, int64_t synced_ns, bool offered) {
  if (!trace_) return;
  auto& t = trace_sums_;
  ++t.rounds;
  t.offer_rounds += offered ? 1 : 0;
  t.offers += NanosToSeconds(start_ns, offers_ns);
  t.sync += NanosToSeconds(offers_ns, synced_ns);
  t.frame += NanosToSeconds(synced_ns, stamps_.frame_sent);
  t.hidden += NanosToSeconds(stamps_.frame_sent, stamps_.sent);
  if (t.rounds < kTraceRounds) return;
  const double r = static_cast<double>(t.rounds);
  SPECD_LOG_INFO(
      "ssd trace (verifier), ms a round over {} rounds ({} from offers): releases and offers "
      "read {:.3f}, lookup and outcomes {:.3f}, request frame sent {:.3f}, hidden rows' "
      "transfer enqueued {:.3f}",
      t.rounds, t.offer_rounds, 1e3 * t.offers / r, 1e3 * t.sync / r, 1e3 * t.frame / r,
      1e3 * t.hidden / r);
  t = {};
}

absl::Status SsdSpeculator::ReadOffers() {
  for (;;) {
    absl::StatusOr<MessageType> type = channel_->Recv(absl::ZeroDuration(), &inbox_);
    if (!type.ok()) {
      return absl::IsDeadlineExceeded(type.status()) ? absl::OkStatus() : type.status();
    }
    if (*type == MessageType::kShutdown) return absl::UnavailableError("the speculator shut down");
    if (*type != MessageType::kCacheOffer) continue;
    const auto& offer = std::get<CacheOffer>(inbox_);
    if (offer.round_id != round_id_) continue;  // for outcomes already past
    if (offers_round_ != round_id_) {
      for (auto& [id, offered] : offers_) offered.clear();
      offer_tokens_.clear();
      offers_round_ = round_id_;
    }
    for (const OfferedDraft& d : offer.drafts) {
      const std::span<const int32_t> tokens = offer.TokensOf(d);
      offers_[d.seq_id].push_back(
          {d.accepted_len, d.bonus, static_cast<uint32_t>(offer_tokens_.size()), d.num_tokens});
      offer_tokens_.insert(offer_tokens_.end(), tokens.begin(), tokens.end());
    }
    offer_stages_ = {offer.receive_ns, offer.triage_ns, offer.draft_ns, offer.cache_build_ns, 0};
  }
}

const SsdSpeculator::Offered* SsdSpeculator::FindOffered(const DraftInput& in,
                                                         const SeqState& s) const {
  // As the speculator applies an outcome (SsdWorker::SyncOutcome): k accepted drafts of the
  // ones it sent in the last round, then the bonus token, nothing more.
  if (!s.synced || s.round != offers_round_ || s.num_remote_drafts == 0 || !in.params->greedy() ||
      in.tokens.size() < s.num_sent) {
    return nullptr;
  }
  const auto k = static_cast<size_t>(std::max(s.accepted_len, 0));
  const int32_t want = std::min<int32_t>(in.num_draft_tokens, limits_.max_draft_tokens);
  if (in.tokens.size() - s.num_sent != k + 1 || want <= 0) return nullptr;
  auto it = offers_.find(in.seq_id);
  if (it == offers_.end()) return nullptr;
  const int32_t bonus = in.tokens[s.num_sent + k];
  for (const Offered& o : it->second) {
    if (o.k == k && o.bonus == bonus && o.num_tokens >= static_cast<uint32_t>(want)) return &o;
  }
  return nullptr;
}

absl::StatusOr<bool> SsdSpeculator::OfferedRound(std::span<const DraftInput> inputs,
                                                 std::vector<Draft>* drafts, int64_t start_ns) {
  if (inputs.empty() || offers_round_ != round_id_ || offers_.empty()) return false;
  const int64_t lookup_ns = MonotonicNanos();
  // Every input's offered branch first: a round that asks keeps its drafts untouched.
  offered_.clear();
  for (const DraftInput& in : inputs) {
    auto it = seqs_.find(in.seq_id);
    const Offered* o = it == seqs_.end() ? nullptr : FindOffered(in, it->second);
    if (o == nullptr) return false;
    offered_.push_back(o);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int32_t want = std::min<int32_t>(inputs[i].num_draft_tokens, limits_.max_draft_tokens);
    const auto from = offer_tokens_.begin() + offered_[i]->offset;
    Draft& d = (*drafts)[i];
    d.tokens.assign(from, from + want);
    d.origin = DraftOrigin::kCacheHit;
  }
  const int64_t lookup_end_ns = MonotonicNanos();
  offered_sent_.assign(inputs.size(), -1);
  SyncOutcomes(inputs, offered_sent_, /*offer_hits=*/true);
  const int64_t synced_ns = MonotonicNanos();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (offered_sent_[i] < 0) {  // not in the request: the speculator does not adopt the branch
      (*drafts)[i] = Draft{};
      continue;
    }
    seqs_[inputs[i].seq_id].num_remote_drafts = static_cast<int32_t>((*drafts)[i].tokens.size());
    CountOutcome(offered_[i]->k, /*hit=*/true);
    ++stats_.drafts_hit;
  }
  SPECD_RETURN_IF_ERROR(SendRequest(absl::Milliseconds(options_.config.ssd.timeout_ms)));
  Trace(start_ns, lookup_ns, synced_ns, true);
  // No response: the speculator's build for these drafts' outcomes starts once it read this.
  stamps_.first_byte = stamps_.sent;
  ++stats_.rounds;
  ++stats_.offer_rounds;
  stats_.bytes_sent = bytes_before_.sent + static_cast<int64_t>(channel_->bytes_sent());
  stats_.bytes_received = bytes_before_.received + static_cast<int64_t>(channel_->bytes_received());
  AddSpeculatorStages(offer_stages_);
  const double build = offer_stages_[static_cast<int>(SsdSpeculatorStage::kBuild)] * 1e-9;
  stats_.speculator_cache_seconds += build;
  for (uint64_t ns : offer_stages_) stats_.speculator_busy_seconds += ns * 1e-9;
  round_.at(SsdVerifierStage::kTransfer) =
      NanosToSeconds(start_ns, lookup_ns) + NanosToSeconds(lookup_end_ns, MonotonicNanos());
  round_.at(SsdVerifierStage::kWait) = 0;
  round_.at(SsdVerifierStage::kCacheLookup) = NanosToSeconds(lookup_ns, lookup_end_ns);
  round_open_ = true;
  return true;
}

}  // namespace specd
