// SsdWorker's rows (ssd_worker.h): where a served draft's q rows are (the host, or kept rows on
// the draft's device), the response that announces them, and their send on the device data path;
// the target's hidden rows a request brings (inline, or received on the device data path); and
// the SPECD_SSD_TRACE log line.
#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/speculation/ssd/ssd_protocol.h"
#include "engine/speculation/ssd/ssd_worker.h"

namespace specd {

absl::Status SsdWorker::MoveRows(std::vector<float>& probs, std::shared_ptr<const KeptProbs>& kept,
                                 Result& to) {
  if (kept != nullptr && to.draft.probs.empty()) {
    to.kept.push_back(std::move(kept));
    return absl::OkStatus();
  }
  if (kept == nullptr && probs.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(HostRows(to));  // rows on the host on either side: all go there
  if (kept != nullptr) {
    SPECD_RETURN_IF_ERROR(draft_->ReadKeptProbs(*kept, &probs));
    kept.reset();
  }
  to.draft.probs.insert(to.draft.probs.end(), probs.begin(), probs.end());
  return absl::OkStatus();
}

absl::Status SsdWorker::HostRows(Result& r) {
  std::vector<float> rows;
  for (const std::shared_ptr<const KeptProbs>& k : r.kept) {
    SPECD_RETURN_IF_ERROR(draft_->ReadKeptProbs(*k, &rows));
    r.draft.probs.insert(r.draft.probs.end(), rows.begin(), rows.end());
  }
  r.kept.clear();
  return absl::OkStatus();
}

absl::Status SsdWorker::Reply(const SpeculateRequest& request, Round& round,
                              SpeculateResponse* response) {
  uint32_t prob_rows = 0;
  const size_t vocab = static_cast<size_t>(vocab_size());
  // Sampled drafts need their q rows (a backup's deterministic drafts have none: one-hot). They
  // go GPU to GPU when the link has a device data path and every such draft keeps its rows on
  // the draft's device; otherwise all of them inline.
  auto has_rows = [&](size_t i) {
    return (request.seqs[i].flags & kSeqWantProbs) != 0 &&
           round.results[i].served != Served::kBackup && !round.results[i].draft.tokens.empty();
  };
  bool out_of_band = bulk_ != nullptr;
  for (size_t i = 0; i < request.seqs.size(); ++i) {
    if (has_rows(i) && round.results[i].kept.empty()) out_of_band = false;
  }
  bulk_ranges_.clear();
  bulk_blocks_.clear();
  for (size_t i = 0; i < request.seqs.size(); ++i) {
    const SpeculateSeq& m = request.seqs[i];
    auto it = seqs_.find(m.seq_id);
    if (it == seqs_.end()) {
      response->AddDraft(m.seq_id, DraftStatus::kNone, {}, {});
      continue;
    }
    Seq& s = it->second;
    Result& r = round.results[i];
    const bool rows_wanted = has_rows(i);
    if (rows_wanted && !out_of_band) SPECD_RETURN_IF_ERROR(HostRows(r));
    size_t n = std::min<size_t>(r.draft.tokens.size(), m.num_draft_tokens);
    size_t have = r.draft.probs.size() / vocab;
    for (const std::shared_ptr<const KeptProbs>& k : r.kept) have += k->num_rows;
    if (rows_wanted && (have < n || (!out_of_band && prob_rows + n > kSsdMaxProbRows))) n = 0;
    s.drafts.assign(r.draft.tokens.begin(), r.draft.tokens.begin() + n);
    // A backup that found nothing still served the sequence (it decodes plainly, and the cache
    // is built for k = 0); a draft model that gave nothing (KV full, no room for q rows) did not.
    s.served = n > 0 || r.served == Served::kBackup ? r.served : Served::kNone;
    s.candidates = std::move(r.draft.candidates);
    s.num_rows = r.served == Served::kBackup
                     ? 0
                     : std::min<int32_t>(static_cast<int32_t>(s.candidates.size()) / f_max_,
                                         static_cast<int32_t>(n) + 1);
    ++s.round;
    const DraftStatus status = s.served == Served::kHit       ? DraftStatus::kHit
                               : s.served == Served::kPrimary ? DraftStatus::kMissPrimary
                               : s.served == Served::kBackup  ? DraftStatus::kMissBackup
                                                              : DraftStatus::kNone;
    std::span<const float> rows;
    const bool with_rows = rows_wanted && n > 0;
    if (with_rows && out_of_band) {
      // The first n rows of the kept blocks, in order.
      auto left = static_cast<int32_t>(n);
      for (size_t b = 0; b < r.kept.size() && left > 0; ++b) {
        const int32_t take = std::min(left, r.kept[b]->num_rows);
        bulk_ranges_.push_back({r.kept[b]->first_row, take});
        bulk_blocks_.push_back(r.kept[b]);
        left -= take;
      }
    } else if (with_rows) {
      rows = std::span<const float>(r.draft.probs).first(n * vocab);
    }
    if (with_rows) prob_rows += static_cast<uint32_t>(n);
    response->AddDraft(m.seq_id, status, s.drafts, rows, with_rows);
  }
  response->probs_out_of_band = out_of_band && prob_rows > 0;
  return absl::OkStatus();
}

absl::Status SsdWorker::SendRows() {
  if (bulk_ranges_.empty()) return absl::OkStatus();
  int64_t rows = 0;
  for (const ModelRunner::RowRange& r : bulk_ranges_) rows += r.count;
  const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(vocab_size()) * 4;
  // The last round's send is done (the verifier received it before sending this round's
  // request): the buffer is free. Then gather, and send on the link's stream, which the build
  // that follows does not wait for.
  SPECD_RETURN_IF_ERROR(bulk_->Synchronize(bulk_->stream(), absl::Seconds(30)));
  SPECD_ASSIGN_OR_RETURN(void* buffer, bulk_->Buffer(bytes));
  SPECD_RETURN_IF_ERROR(draft_->CopyKeptRows(bulk_ranges_, buffer));
  bulk_ranges_.clear();
  bulk_blocks_.clear();
  SPECD_RETURN_IF_ERROR(bulk_->Send(buffer, bytes, bulk_->stream()));
  stats_.device_rows += rows;
  return absl::OkStatus();
}

absl::Status SsdWorker::AddHidden(const SpeculateRequest& request, const SpeculateSeq& m,
                                  std::span<const int32_t> tokens) {
  const auto position = static_cast<int32_t>(m.hidden_position);
  if (request.hidden_out_of_band) {
    if (device_hidden_ == nullptr) return absl::OkStatus();
    return draft_->AddTargetRowsOnDevice(
        m.seq_id, tokens, position, static_cast<const uint16_t*>(device_hidden_) + m.hidden_offset,
        static_cast<int32_t>(m.num_hidden));
  }
  return draft_->AddTargetRows(
      m.seq_id, tokens, position,
      request.HiddenOf(m, static_cast<size_t>(std::max(0, options_.hidden_width))));
}

absl::StatusOr<const void*> SsdWorker::ReceiveHidden(const SpeculateRequest& request) {
  if (!request.hidden_out_of_band) return nullptr;
  const uint64_t rows = request.NumHiddenRows();
  if (rows == 0) return nullptr;
  if (bulk_ == nullptr || !draft_->reads_hidden_on_device()) {
    return absl::FailedPreconditionError(
        "ssd speculator: hidden rows sent out of band without a device data path");
  }
  const size_t bytes = rows * static_cast<size_t>(options_.hidden_width) * 2;  // bf16
  // Slot 1: slot 0 holds the q rows the last response sent (SendRows).
  SPECD_ASSIGN_OR_RETURN(void* buffer, bulk_->Buffer(bytes, 1));
  SPECD_RETURN_IF_ERROR(bulk_->Recv(buffer, bytes, bulk_->stream()));
  SPECD_RETURN_IF_ERROR(bulk_->Synchronize(bulk_->stream(), absl::Seconds(30)));
  stats_.device_hidden_rows += static_cast<int64_t>(rows);
  return buffer;
}

void SsdWorker::LogTrace() {
  TraceSums& t = trace_sums_;
  if (!trace_ || t.rounds < kTraceRounds) return;
  const double r = static_cast<double>(t.rounds);
  auto passes = [&](const CacheDrafter::Trace& p) {
    return absl::StrFormat(
        "%.2f passes (%.1f rows; %lld rounds on the device), forward %.3f, candidates %.3f, "
        "copies %.3f",
        p.passes / r, p.rows / std::max<double>(1.0, p.passes), static_cast<long long>(p.rounds),
        1e3 * p.forward / r, 1e3 * p.candidates / r, 1e3 * p.copies / r);
  };
  SPECD_LOG_INFO(
      "ssd trace, ms a round over {} rounds: receive hidden {:.3f}, add hidden {:.3f}; draft "
      "{:.3f} ({} misses, {} partial hits, {} inputs; {}); build {:.3f} ({})",
      t.rounds, 1e3 * t.receive_hidden / r, 1e3 * t.add_hidden / r, 1e3 * t.draft / r, t.misses,
      t.partial, t.primary_inputs, passes(t.draft_passes), 1e3 * t.build / r,
      passes(t.build_passes));
  t = TraceSums{};
}

}  // namespace specd
