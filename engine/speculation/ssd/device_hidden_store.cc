#include "engine/speculation/ssd/device_hidden_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/base/status.h"
#include "engine/distributed/nccl_channel.h"

namespace specd {
namespace {

constexpr int kSendSlot = 1;
constexpr int64_t kMinArenaRows = 256;

class NcclLink : public DeviceRowLink {
 public:
  NcclLink(NcclChannel& link, int64_t timeout_ms) : link_(link), timeout_ms_(timeout_ms) {}
  absl::StatusOr<void*> Buffer(size_t bytes, int slot) override {
    return link_.Buffer(bytes, slot);
  }
  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    return link_.Copy(dst, src, bytes);
  }
  // Queued by the link's thread: the engine thread goes on to the next verification pass.
  absl::Status Send(const void* data, size_t bytes) override {
    return link_.SendAsync(data, bytes, link_.stream());
  }
  absl::Status Synchronize() override {
    return link_.Synchronize(link_.stream(), absl::Milliseconds(timeout_ms_));
  }

 private:
  NcclChannel& link_;
  int64_t timeout_ms_;
};

}  // namespace

std::unique_ptr<DeviceRowLink> NcclRowLink(NcclChannel& link, int64_t timeout_ms) {
  return std::make_unique<NcclLink>(link, timeout_ms);
}

DeviceHiddenStore::DeviceHiddenStore(DeviceRowLink& link, size_t row_bytes,
                                     int32_t max_rows_per_seq)
    : link_(link), row_bytes_(row_bytes), max_rows_per_seq_(std::max(1, max_rows_per_seq)) {}

int64_t DeviceHiddenStore::live_rows() const {
  int64_t rows = 0;
  for (const auto& [seq, run] : runs_) rows += run.count;
  return rows;
}

absl::StatusOr<void*> DeviceHiddenStore::BeginPass(int64_t rows) {
  SPECD_RETURN_IF_ERROR(link_.Synchronize());
  const int64_t live = live_rows();
  if (live == 0) top_ = 0;
  if (arena_ == nullptr || top_ + rows > capacity_) {
    // Into the other buffer, with room for twice what is needed now.
    SPECD_RETURN_IF_ERROR(Compact(std::max(kMinArenaRows, 2 * (live + rows))));
  }
  pass_top_ = top_;
  top_ += rows;
  return static_cast<uint8_t*>(arena_) + static_cast<size_t>(pass_top_) * row_bytes_;
}

absl::Status DeviceHiddenStore::Compact(int64_t capacity) {
  const int slot = arena_ == nullptr ? arena_slot_ : 5 - arena_slot_;
  SPECD_ASSIGN_OR_RETURN(void* to, link_.Buffer(static_cast<size_t>(capacity) * row_bytes_, slot));
  int64_t at = 0;
  for (auto& [seq, run] : runs_) {
    for (Segment& s : run.segments) {
      SPECD_RETURN_IF_ERROR(
          link_.Copy(static_cast<uint8_t*>(to) + static_cast<size_t>(at) * row_bytes_,
                     static_cast<const uint8_t*>(arena_) + static_cast<size_t>(s.row) * row_bytes_,
                     static_cast<size_t>(s.count) * row_bytes_));
      s.row = at;
      at += s.count;
    }
    // One segment now: the run's rows are consecutive.
    if (run.segments.size() > 1) {
      run.segments.front().count = run.count;
      run.segments.resize(1);
    }
  }
  // The copies read the old buffer: it is reused by the next compaction only after them.
  SPECD_RETURN_IF_ERROR(link_.Synchronize());
  arena_ = to;
  arena_slot_ = slot;
  capacity_ = capacity;
  top_ = at;
  return absl::OkStatus();
}

void DeviceHiddenStore::DropFront(RowRun& run, int32_t n) const {
  run.first += n;
  run.count -= n;
  while (n > 0 && !run.segments.empty()) {
    Segment& s = run.segments.front();
    const int32_t take = std::min(n, s.count);
    s.row += take;
    s.count -= take;
    n -= take;
    if (s.count == 0) run.segments.erase(run.segments.begin());
  }
}

void DeviceHiddenStore::Truncate(uint64_t seq, int32_t from) {
  auto it = runs_.find(seq);
  if (it == runs_.end()) return;
  RowRun& run = it->second;
  int32_t keep = std::clamp(from - run.first, 0, run.count);
  run.count = keep;
  size_t i = 0;
  for (; i < run.segments.size() && keep > 0; ++i) {
    run.segments[i].count = std::min(run.segments[i].count, keep);
    keep -= run.segments[i].count;
  }
  run.segments.resize(i);
  if (run.count == 0) runs_.erase(it);
}

void DeviceHiddenStore::Store(uint64_t seq, int32_t position, int64_t pass_row, int32_t n) {
  if (n <= 0) return;
  Truncate(seq, position);
  RowRun& run = runs_[seq];
  // Rows before a gap can never end the run a request sends: a new run starts here.
  if (run.count == 0 || run.first + run.count != position) {
    run = RowRun{};
    run.first = position;
  }
  const int64_t row = pass_top_ + pass_row;
  if (!run.segments.empty() && run.segments.back().row + run.segments.back().count == row) {
    run.segments.back().count += n;
  } else {
    run.segments.push_back({row, n});
  }
  run.count += n;
  if (run.count > max_rows_per_seq_) DropFront(run, run.count - max_rows_per_seq_);
}

bool DeviceHiddenStore::Run(uint64_t seq, int32_t* first, int32_t* count) const {
  auto it = runs_.find(seq);
  if (it == runs_.end()) return false;
  *first = it->second.first;
  *count = it->second.count;
  return true;
}

void DeviceHiddenStore::Queue(uint64_t seq, int32_t from, int32_t n) {
  auto it = runs_.find(seq);
  if (it == runs_.end()) return;
  const RowRun& run = it->second;
  int32_t skip = from - run.first;
  for (const Segment& s : run.segments) {
    if (n <= 0) break;
    if (skip >= s.count) {
      skip -= s.count;
      continue;
    }
    const int32_t take = std::min(n, s.count - skip);
    if (!queued_.empty() && queued_.back().row + queued_.back().count == s.row + skip) {
      queued_.back().count += take;
    } else {
      queued_.push_back({s.row + skip, take});
    }
    n -= take;
    skip = 0;
  }
}

absl::StatusOr<int64_t> DeviceHiddenStore::SendQueued() {
  std::vector<Segment> pieces = std::exchange(queued_, {});
  int64_t rows = 0;
  for (const Segment& s : pieces) rows += s.count;
  if (rows == 0) return 0;
  const size_t bytes = static_cast<size_t>(rows) * row_bytes_;
  SPECD_ASSIGN_OR_RETURN(void* staging, link_.Buffer(bytes, kSendSlot));
  size_t at = 0;
  for (const Segment& s : pieces) {
    SPECD_RETURN_IF_ERROR(
        link_.Copy(static_cast<uint8_t*>(staging) + at,
                   static_cast<const uint8_t*>(arena_) + static_cast<size_t>(s.row) * row_bytes_,
                   static_cast<size_t>(s.count) * row_bytes_));
    at += static_cast<size_t>(s.count) * row_bytes_;
  }
  SPECD_RETURN_IF_ERROR(link_.Send(staging, bytes));
  return rows;
}

void DeviceHiddenStore::Clear() {
  runs_.clear();
  queued_.clear();
  arena_ = nullptr;
  capacity_ = 0;
  top_ = 0;
}

}  // namespace specd
