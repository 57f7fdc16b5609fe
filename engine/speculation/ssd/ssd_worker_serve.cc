// SsdWorker's serving loop over the verifier's channel (ssd_worker.h): requests answered (or,
// when their drafts came from an offer, not), who serves each sequence of a request (Triage),
// the cache built between them (its first pass, CompleteRows, here) and offered as it
// completes, and the round timeline's stage times.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/monotonic_clock.h"
#include "engine/base/status.h"
#include "engine/speculation/ssd/ssd_worker.h"

namespace specd {

void SsdWorker::NoteStages(SpeculateResponse* response, int64_t triage_start, int64_t draft_start,
                           int64_t reply_start, int64_t reply_end) {
  response->receive_ns = receive_ns_;
  response->triage_ns = NanosBetween(triage_start, draft_start);
  response->draft_ns = NanosBetween(draft_start, reply_start);
  response->reply_ns = send_ns_ + NanosBetween(reply_start, reply_end);
  response->cache_build_ns = static_cast<uint64_t>(build_seconds_ * 1e9);
  receive_ns_ = 0;
  send_ns_ = 0;
  auto& seconds = stats_.stage_seconds;
  seconds[static_cast<int>(SsdSpeculatorStage::kTriage)] += response->triage_ns * 1e-9;
  seconds[static_cast<int>(SsdSpeculatorStage::kDraft)] += response->draft_ns * 1e-9;
  seconds[static_cast<int>(SsdSpeculatorStage::kReply)] +=
      NanosBetween(reply_start, reply_end) * 1e-9;
}

void SsdWorker::NoteReceived(const Channel& channel) {
  const int64_t now = MonotonicNanos();
  const int64_t first_byte = channel.last_recv_first_byte_ns();
  const uint64_t ns = first_byte > 0 ? NanosBetween(first_byte, now) : 0;
  receive_ns_ += ns;
  stats_.stage_seconds[static_cast<int>(SsdSpeculatorStage::kReceive)] += ns * 1e-9;
}

absl::Status SsdWorker::SendOffer(absl::Time build_start) {
  offer_.round_id = offer_round_;
  offer_.cache_build_ns =
      static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - build_start));
  offer_.receive_ns = unanswered_ns_.receive;
  offer_.triage_ns = unanswered_ns_.triage;
  offer_.draft_ns = unanswered_ns_.draft;
  stats_.offered += static_cast<int64_t>(offer_.drafts.size());
  return channel_->Send(offer_, absl::Seconds(30));
}

absl::Status SsdWorker::Triage(const SpeculateSeq& m, size_t i, const Seq& s,
                               std::optional<CachedDraft> cached, bool backup_tier, Round& round) {
  if (m.num_draft_tokens == 0) return absl::OkStatus();
  Result& r = round.results[i];
  const auto wanted = static_cast<size_t>(DraftsBeforeReply(m.num_draft_tokens));
  if (cached && cached->tokens.size() < wanted) {
    SPECD_RETURN_IF_ERROR(draft_->Adopt(m.seq_id, cached->branch_id));
    r.served = Served::kHit;
    Result& p = round.partial[i];
    p.draft.tokens = std::move(cached->tokens);
    SPECD_RETURN_IF_ERROR(MoveRows(cached->probs, cached->kept_probs, p));
    p.draft.candidates = std::move(cached->candidates);
    const std::vector<int32_t>& had = p.draft.tokens;
    round.resume_tokens.emplace_back(s.tokens);
    round.resume_tokens.back().insert(round.resume_tokens.back().end(), had.begin(), had.end());
    round.primary.push_back(InputFor(m.seq_id, s, round.resume_tokens.back(),
                                     static_cast<int32_t>(wanted - had.size())));
    round.primary_cache.push_back(CacheOptionsFor(s));
    round.primary_of.push_back(i);
    ++stats_.hits;
    ++stats_.hits_partial;
  } else if (cached) {
    SPECD_RETURN_IF_ERROR(draft_->Adopt(m.seq_id, cached->branch_id));
    r.served = Served::kHit;
    r.draft.tokens = std::move(cached->tokens);
    SPECD_RETURN_IF_ERROR(MoveRows(cached->probs, cached->kept_probs, r));
    r.draft.candidates = std::move(cached->candidates);
    ++stats_.hits;
  } else if (backup_tier) {
    r.served = Served::kBackup;
    ++stats_.misses_backup;
  } else {
    r.served = Served::kPrimary;
    round.primary.push_back(InputFor(m.seq_id, s, s.tokens, static_cast<int32_t>(wanted)));
    round.primary_cache.push_back(CacheOptionsFor(s));
    round.primary_of.push_back(i);
    round.any_miss = true;
    round.any_new = round.any_new || (m.flags & kSeqNew) != 0;
    ++stats_.misses_primary;
  }
  return absl::OkStatus();
}

int32_t SsdWorker::DraftsBeforeReply(int32_t num_draft_tokens) const {
  return draft_->parallel() ? num_draft_tokens + 1 : num_draft_tokens;
}

absl::Status SsdWorker::CompleteRows() {
  // One pass for all: a backup-served sequence has no candidates along its drafts, so the
  // draft's row at position 1 (from the context) gives the cache its likeliest outcomes, k = 0;
  // a sequence sent all K drafts of a sequential drafter (DraftsBeforeReply) still lacks the row
  // for k = K, its draft's next row (the drafter's state holds the K drafts: one position).
  std::vector<DraftInput> inputs;
  std::vector<DraftModelSpeculator::CacheDraftOptions> cache;  // [inputs]
  std::vector<std::vector<int32_t>> contexts;                  // the drafts' inputs point into it
  contexts.reserve(served_.size());
  for (uint64_t id : served_) {
    Seq& s = seqs_[id];
    if (s.served == Served::kBackup) {
      inputs.push_back(InputFor(id, s, s.tokens, 1));
    } else if (s.served != Served::kNone && s.num_draft_tokens > 0 &&
               s.drafts.size() == size_t(s.num_draft_tokens) && s.num_rows == s.num_draft_tokens) {
      contexts.emplace_back(s.tokens);
      contexts.back().insert(contexts.back().end(), s.drafts.begin(), s.drafts.end());
      inputs.push_back(InputFor(id, s, contexts.back(), 1));
    } else {
      continue;
    }
    cache.push_back(CacheOptionsFor(s));
  }
  if (inputs.empty()) return absl::OkStatus();
  std::vector<Draft> proposed;
  SPECD_RETURN_IF_ERROR(draft_->Propose(inputs, cache, &proposed, {}));
  for (size_t j = 0; j < inputs.size(); ++j) {
    Seq& s = seqs_[inputs[j].seq_id];
    std::vector<int32_t>& row = proposed[j].candidates;
    if (s.served == Served::kBackup) {
      s.candidates = std::move(row);
      s.num_rows = std::min<int32_t>(1, static_cast<int32_t>(s.candidates.size()) / f_max_);
    } else if (row.size() >= size_t(f_max_)) {  // empty: the KV is full (no branch for k = K)
      s.candidates.insert(s.candidates.end(), row.begin(), row.begin() + f_max_);
      ++s.num_rows;
    }
  }
  return absl::OkStatus();
}

absl::Status SsdWorker::ServeChannel(Channel& channel, NcclChannel* bulk) {
  // The link is the caller's: forgotten when serving ends, however it ends.
  struct Forget {
    NcclChannel*& link;
    Channel*& channel;
    ~Forget() {
      link = nullptr;
      channel = nullptr;
    }
  } forget{bulk_ = bulk, channel_ = &channel};
  Message message;
  Message reply = SpeculateResponse();
  bool pending = false;  // BuildCache stopped because `message` arrived
  // Whether the verifier's next message is already here (then the cache build stops).
  // Sticky: once a message is in, it stays pending until the loop handles it.
  bool link_error = false;
  auto arrived = [&] {
    if (pending || link_error) return true;
    absl::StatusOr<MessageType> type = channel.Recv(absl::ZeroDuration(), &message);
    pending = type.ok();
    if (pending) NoteReceived(channel);
    link_error = !pending && !absl::IsDeadlineExceeded(type.status());  // the next Recv says it
    return pending || link_error;
  };
  for (;;) {
    if (!pending) {
      absl::StatusOr<MessageType> type = channel.Recv(absl::InfiniteDuration(), &message);
      if (!type.ok()) return type.status();
      NoteReceived(channel);
    }
    pending = false;
    switch (TypeOf(message)) {
      case MessageType::kSpeculateRequest: {
        const auto& request = std::get<SpeculateRequest>(message);
        auto& response = std::get<SpeculateResponse>(reply);
        SPECD_RETURN_IF_ERROR(Handle(request, &response));
        offer_round_ = request.round_id;
        unanswered_ns_ = {};
        if (request.WantsResponse()) {
          const int64_t send_start = MonotonicNanos();
          SPECD_RETURN_IF_ERROR(channel.Send(reply, absl::Seconds(30)));
          SPECD_RETURN_IF_ERROR(SendRows());
          send_ns_ = NanosBetween(send_start, MonotonicNanos());
          stats_.stage_seconds[static_cast<int>(SsdSpeculatorStage::kReply)] += send_ns_ * 1e-9;
        } else {
          // Every drafts came from an offer (greedy: no q rows to send); the verifier verifies
          // them already. The offers that follow carry this request's stage times.
          ++stats_.offer_rounds;
          unanswered_ns_ = {response.receive_ns, response.triage_ns, response.draft_ns};
          bulk_ranges_.clear();
          bulk_blocks_.clear();
        }
        SPECD_RETURN_IF_ERROR(options_.config.ssd.complete_cache ? BuildCache()
                                                                 : BuildCache(arrived));
        break;
      }
      case MessageType::kRelease:
        for (uint64_t id : std::get<Release>(message).seq_ids) Drop(id);
        break;
      case MessageType::kShutdown:
        SPECD_LOG_INFO("ssd speculator: the verifier shut down ({})",
                       std::get<Shutdown>(message).reason);
        return absl::OkStatus();
      case MessageType::kHeartbeat:
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("ssd speculator: unexpected ",
                         std::string(MessageTypeName(TypeOf(message))), " message"));
    }
  }
}

}  // namespace specd
