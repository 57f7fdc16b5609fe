// SsdSpeculator's side of the target's hidden states for an EAGLE-3 head in the speculator
// (ssd_speculator.h): each target pass's rows kept (on the host, or on the target's GPU for the
// device data path) and the committed ones attached to the next request.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/speculation/ssd/ssd_speculator.h"

namespace specd {

absl::Status SsdSpeculator::OnTargetPass(std::span<const SequenceInput> batch,
                                         std::span<const uint8_t> wanted,
                                         const ModelRunner& target) {
  if (!wants_hidden()) return absl::OkStatus();
  if (wanted.size() != batch.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ssd: ", wanted.size(), " flags for ",
                                                   batch.size(), " chunks of the target pass"));
  }
  // The pass recomputed each wanted chunk from its start: what its sequence held from there on
  // is stale (a tree chunk's nodes are not the sequence's positions: only dropped).
  hidden_ranges_.clear();
  int32_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    const auto n = static_cast<int32_t>(in.tokens.size());
    if (wanted[i] && in.seq_id >= 0) {
      if (auto it = hidden_.find(static_cast<uint64_t>(in.seq_id)); it != hidden_.end()) {
        TruncateHidden(it->second, in.start_pos);
      }
      if (device_hidden_) device_hidden_->Truncate(static_cast<uint64_t>(in.seq_id), in.start_pos);
      if (in.tree == nullptr && n > 0) hidden_ranges_.push_back({row, n});
    }
    row += n;
  }
  if (hidden_ranges_.empty()) return absl::OkStatus();
  if (device_hidden_ && target.CapturesOnDevice()) {
    int64_t rows = 0;
    for (const ModelRunner::RowRange& r : hidden_ranges_) rows += r.count;
    const absl::Status kept = KeepOnDevice(batch, wanted, target, rows);
    if (!kept.ok() && !short_capture_logged_) {
      // The head then lacks these positions: its drafts accept less, nothing else.
      SPECD_LOG_DEBUG("ssd: the target pass's hidden states stay off the device path: {}",
                      kept.ToString());
      short_capture_logged_ = true;
    }
    return absl::OkStatus();
  }
  hidden_copy_.clear();
  const size_t width = limits_.hidden_width;
  const absl::Status copied =
      target.CopyCapturedRows(hidden_ranges_, static_cast<int64_t>(width), &hidden_copy_);
  if (!copied.ok()) {
    // The head then lacks these positions: its drafts accept less, nothing else.
    if (!short_capture_logged_) {
      SPECD_LOG_DEBUG("ssd: the target pass left no hidden states for the speculator's head: {}",
                      copied.ToString());
      short_capture_logged_ = true;
    }
    return absl::OkStatus();
  }
  size_t at = 0;  // first row of the next wanted chunk in hidden_copy_
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    if (!wanted[i] || in.seq_id < 0 || in.tree != nullptr || in.tokens.empty()) continue;
    const size_t floats = in.tokens.size() * width;
    StoreHidden(static_cast<uint64_t>(in.seq_id), in.start_pos,
                std::span<const float>(hidden_copy_).subspan(at, floats));
    at += floats;
  }
  return absl::OkStatus();
}

absl::Status SsdSpeculator::KeepOnDevice(std::span<const SequenceInput> batch,
                                         std::span<const uint8_t> wanted, const ModelRunner& target,
                                         int64_t rows) {
  absl::StatusOr<void*> to = device_hidden_->BeginPass(rows);
  if (!to.ok()) {
    // The link's stream did not drain: its last send never completed (the speculator stalled
    // or died), so the link is down.
    if (channel_) LinkDown(to.status());
    return absl::OkStatus();
  }
  SPECD_RETURN_IF_ERROR(target.CopyCapturedRowsOnDevice(hidden_ranges_, limits_.hidden_width, *to));
  int64_t at = 0;  // the next wanted chunk's first row in the pass's copy
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    if (!wanted[i] || in.seq_id < 0 || in.tree != nullptr || in.tokens.empty()) continue;
    const auto n = static_cast<int32_t>(in.tokens.size());
    device_hidden_->Store(static_cast<uint64_t>(in.seq_id), in.start_pos, at, n);
    at += n;
  }
  return absl::OkStatus();
}

void SsdSpeculator::TruncateHidden(HiddenRun& run, int32_t from) const {
  const int32_t keep = std::clamp(from - run.first, 0, HiddenRows(run));
  run.rows.resize(static_cast<size_t>(keep) * limits_.hidden_width);
}

void SsdSpeculator::StoreHidden(uint64_t seq_id, int32_t position, std::span<const float> rows) {
  HiddenRun& run = hidden_[seq_id];
  TruncateHidden(run, position);
  // Rows before a gap can never end the run a request sends: a new run starts here.
  if (run.rows.empty() || run.first + HiddenRows(run) != position) {
    run.rows.clear();
    run.first = position;
  }
  run.rows.insert(run.rows.end(), rows.begin(), rows.end());
}

void SsdSpeculator::AttachHidden(const DraftInput& in, SeqState& s, SpeculateSeq& m,
                                 uint64_t* budget) {
  // Positions [.., end) have the target's hidden states; the last committed token's (the
  // bonus, or the first sampled token) is computed by the next pass.
  const auto end = static_cast<int32_t>(in.tokens.size()) - 1;
  if (device_hidden_) {
    int32_t first = 0, count = 0;
    if (device_hidden_->Run(in.seq_id, &first, &count)) {
      const int32_t from = std::max(first, s.hidden_sent);
      const bool room = *budget > 0;
      if (first + count >= end && from < end && room) {
        const auto n = static_cast<int32_t>(std::min<uint64_t>(end - from, *budget));
        device_hidden_->Queue(in.seq_id, end - n, n);
        std::get<SpeculateRequest>(request_).AddHiddenOutOfBand(
            m, static_cast<uint32_t>(end - n), static_cast<uint32_t>(n), limits_.hidden_width);
        *budget -= static_cast<uint64_t>(n);
        stats_.hidden_rows += n;
      }
      device_hidden_->Erase(in.seq_id);
    }
    hidden_.erase(in.seq_id);  // kept before the device path came up: not sent
    s.hidden_sent = std::max(s.hidden_sent, end);
    return;
  }
  auto it = hidden_.find(in.seq_id);
  if (it != hidden_.end()) {
    const HiddenRun& run = it->second;
    const int32_t from = std::max(run.first, s.hidden_sent);
    const uint64_t room = *budget;
    // Only a run reaching the last committed token's predecessor is the sequence's present.
    if (run.first + HiddenRows(run) >= end && from < end && room > 0) {
      // Too many for the request: the latest positions, which the head needs most.
      const auto n = static_cast<int32_t>(std::min<uint64_t>(end - from, room));
      const size_t width = limits_.hidden_width;
      const size_t offset = static_cast<size_t>(end - n - run.first) * width;
      std::get<SpeculateRequest>(request_).AddHidden(
          m, static_cast<uint32_t>(end - n),
          std::span<const float>(run.rows).subspan(offset, static_cast<size_t>(n) * width), width);
      *budget -= static_cast<uint64_t>(n);
      stats_.hidden_rows += n;
    }
    // Sent, past sending (older than what went), or a rejected draft's: nothing stays.
    hidden_.erase(it);
  }
  s.hidden_sent = std::max(s.hidden_sent, end);
}

}  // namespace specd
