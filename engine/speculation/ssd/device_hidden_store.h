// The verifier's side of the hidden states on SSD's device data path (docs/architecture.md
// "SSD"): with an EAGLE-3 head in the speculator and both ends on GPUs, the target's hidden
// states of each pass stay bf16 on the target's GPU until a request sends them, GPU to GPU, on
// the NCCL link (SpeculateRequest::hidden_out_of_band). This store keeps, per sequence, one run
// of consecutive positions as segments of an arena in the link's device buffers; a pass appends
// its rows at the arena's top, a request gathers the rows it sends into a staging buffer and
// sends them in one transfer, and the arena is compacted (copied into the other of two buffers)
// when it fills. The device work goes through DeviceRowLink (the NCCL link, or host memory in
// tests), on one stream: copies, the gather and the send are ordered there. Engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

class NcclChannel;

// The device operations the store needs, all on one stream of one device.
class DeviceRowLink {
 public:
  virtual ~DeviceRowLink() = default;
  // A buffer of at least `bytes` in slot `slot` (growing it drops its contents).
  virtual absl::StatusOr<void*> Buffer(size_t bytes, int slot) = 0;
  // Enqueues a device-to-device copy.
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // Enqueues sending `bytes` at `data` to the peer.
  virtual absl::Status Send(const void* data, size_t bytes) = 0;
  // Waits until everything enqueued finished (DeadlineExceeded: the peer stalled or died).
  virtual absl::Status Synchronize() = 0;
};

// The NCCL link's buffers (slots 1-3: the q rows' receive keeps slot 0) and stream.
std::unique_ptr<DeviceRowLink> NcclRowLink(NcclChannel& link, int64_t timeout_ms);

class DeviceHiddenStore {
 public:
  // Rows of `row_bytes` bytes (hidden_width bf16); a sequence keeps at most `max_rows_per_seq`
  // (its latest: a request sends no more).
  DeviceHiddenStore(DeviceRowLink& link, size_t row_bytes, int32_t max_rows_per_seq);

  // Before a pass's rows are copied in: waits for the link's stream (the last request's gather
  // and send read the arena), makes room for `rows` more rows at the arena's top and returns
  // where they go ([rows, width] bf16 on the device).
  absl::StatusOr<void*> BeginPass(int64_t rows);
  // Drops `seq`'s rows of positions `from` and later.
  void Truncate(uint64_t seq, int32_t from);
  // `seq`'s rows of positions [position, position + n) are rows [pass_row, pass_row + n) of the
  // pass's copy (BeginPass): appended to its run (a gap before them starts a new run).
  void Store(uint64_t seq, int32_t position, int64_t pass_row, int32_t n);

  // `seq`'s run: its first position and row count (false: none).
  bool Run(uint64_t seq, int32_t* first, int32_t* count) const;
  // The request being built sends `seq`'s rows of positions [from, from + n) after those queued
  // before (within its run).
  void Queue(uint64_t seq, int32_t from, int32_t n);
  // Forgets `seq`'s rows (sent, or the sequence ended).
  void Erase(uint64_t seq) { runs_.erase(seq); }
  // Gathers the queued rows and enqueues their send (nothing when none was queued); returns the
  // rows sent.
  absl::StatusOr<int64_t> SendQueued();
  // Forgets everything (a new link: the arena's buffers belong to the old one).
  void Clear();

  int64_t arena_rows() const { return capacity_; }  // tests
  int64_t live_rows() const;

 private:
  struct Segment {
    int64_t row = 0;  // in the arena
    int32_t count = 0;
  };
  struct RowRun {
    int32_t first = 0;  // position of its first row
    int32_t count = 0;
    std::vector<Segment> segments;
  };
  // Copies the live segments into the other arena buffer (at least `capacity` rows), in order.
  absl::Status Compact(int64_t capacity);
  void DropFront(RowRun& run, int32_t n) const;

  DeviceRowLink& link_;
  size_t row_bytes_;
  int32_t max_rows_per_seq_;
  int arena_slot_ = 2;  // 2 or 3; slot 1 is the send staging
  void* arena_ = nullptr;
  int64_t capacity_ = 0;  // rows
  int64_t top_ = 0;       // first free row
  int64_t pass_top_ = 0;  // BeginPass's first row
  absl::flat_hash_map<uint64_t, RowRun> runs_;
  std::vector<Segment> queued_;
};

}  // namespace specd
