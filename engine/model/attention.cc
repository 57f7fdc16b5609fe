#include "engine/model/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace specd {
namespace {

// Below this many multiply-adds per (QK or PV) pass, attention stays on one thread.
constexpr int64_t kMinParallelMacs = int64_t{1} << 19;

struct HeadTask {
  const float* q;  // [head_dim] f32
  float* out;      // [head_dim] f32
  int32_t kv_head;
  int32_t first;  // first attended position of the contiguous run
  int32_t last;   // last attended position (the query's own)
  std::span<const int32_t> block_table;
  // Sparse attention: positions below `first` attended before the run (ascending).
  std::span<const int32_t> gathered;
  // Token trees: slots attended after the run (the token's ancestors and itself, ascending); the
  // run is then the prefix and may be empty (last = first - 1).
  std::span<const int32_t> tail;
  // Raw-score capture: scores of keys [first, min(capture_end, last + 1)) go to
  // capture[key]; null: none.
  float* capture = nullptr;
  int32_t capture_end = 0;
};

// Calls fn(block, first_slot, count, offset) for each block piece of positions
// [first, last], offset = position - first.
template <typename Fn>
void ForEachBlockRun(const HeadTask& task, int32_t block_size, Fn&& fn) {
  for (int32_t p = task.first; p <= task.last;) {
    const int32_t slot = p % block_size;
    const int32_t count = std::min(block_size - slot, task.last - p + 1);
    fn(task.block_table[p / block_size], slot, count, p - task.first);
    p += count;
  }
}

// scores: the gathered keys' first, then the run's.
void AttendOneHead(const HeadTask& task, const AttentionShape& shape, const CpuKvCache& kv,
                   int32_t layer, std::vector<float>& scores) {
  const KvCacheSpec& spec = kv.spec();
  const int lda = static_cast<int>(spec.slot_floats());
  const int head_dim = shape.head_dim;
  const int64_t head_offset = int64_t{task.kv_head} * head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const int32_t num_gathered = static_cast<int32_t>(task.gathered.size());
  const int32_t num_run = task.last - task.first + 1;
  const int32_t num_tail = static_cast<int32_t>(task.tail.size());
  const int32_t n = num_gathered + num_run + num_tail;
  scores.resize(n);
  const int32_t bs = spec.block_size;
  for (int32_t i = 0; i < num_gathered; ++i) {
    const int32_t p = task.gathered[i];
    const float* key = kv.KeySlot(layer, task.block_table[p / bs], p % bs) + head_offset;
    scores[i] = scale * cblas_sdot(head_dim, key, 1, task.q, 1);
  }
  float* run_scores = scores.data() + num_gathered;
  ForEachBlockRun(task, bs, [&](int32_t block, int32_t slot, int32_t count, int32_t offset) {
    const float* keys = kv.KeySlot(layer, block, slot) + head_offset;  // [count, lda]
    cblas_sgemv(CblasRowMajor, CblasNoTrans, count, head_dim, scale, keys, lda, task.q, 1, 0.0f,
                run_scores + offset, 1);
  });
  float* tail_scores = run_scores + num_run;
  for (int32_t i = 0; i < num_tail; ++i) {
    const int32_t p = task.tail[i];
    const float* key = kv.KeySlot(layer, task.block_table[p / bs], p % bs) + head_offset;
    tail_scores[i] = scale * cblas_sdot(head_dim, key, 1, task.q, 1);
  }
  if (task.capture != nullptr) {
    for (int32_t p = task.first; p < std::min(task.capture_end, task.last + 1); ++p) {
      task.capture[p] = run_scores[p - task.first];
    }
  }
  const float max_score = *std::max_element(scores.begin(), scores.end());
  double sum = 0.0;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    sum += s;
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (float& s : scores) s *= inv_sum;
  std::memset(task.out, 0, sizeof(float) * head_dim);
  for (int32_t i = 0; i < num_gathered; ++i) {
    const int32_t p = task.gathered[i];
    const float* value = kv.ValueSlot(layer, task.block_table[p / bs], p % bs) + head_offset;
    cblas_saxpy(head_dim, scores[i], value, 1, task.out, 1);
  }
  ForEachBlockRun(task, bs, [&](int32_t block, int32_t slot, int32_t count, int32_t offset) {
    const float* values = kv.ValueSlot(layer, block, slot) + head_offset;  // [count, lda]
    cblas_sgemv(CblasRowMajor, CblasTrans, count, head_dim, 1.0f, values, lda, run_scores + offset,
                1, 1.0f, task.out, 1);
  });
  for (int32_t i = 0; i < num_tail; ++i) {
    const int32_t p = task.tail[i];
    const float* value = kv.ValueSlot(layer, task.block_table[p / bs], p % bs) + head_offset;
    cblas_saxpy(head_dim, tail_scores[i], value, 1, task.out, 1);
  }
}

// The first attended position of the contiguous run, and the gathered positions before it, of a
// query at `pos` (window first, then the sparse keys).
void PlanKeys(const AttentionShape& shape, const SparseKeys* sparse, int32_t pos, HeadTask* task) {
  task->last = pos;
  const int32_t window_first =
      shape.sliding_window > 0 ? std::max(0, pos - shape.sliding_window + 1) : 0;
  task->first = window_first;
  task->gathered = {};
  if (sparse == nullptr || sparse->recent_start < 0) return;
  task->first = std::max(window_first, std::min(sparse->recent_start, pos));
  const auto lo = std::lower_bound(sparse->indices.begin(), sparse->indices.end(), window_first);
  const auto hi = std::lower_bound(lo, sparse->indices.end(), task->first);
  task->gathered = std::span<const int32_t>(lo, hi);
}

// A tree token at `pos`: the prefix [window_first, prefix) as the run, then the tree keys whose
// positions (prefix + their index) are inside the window.
void PlanTreeKeys(const AttentionShape& shape, int32_t pos, int32_t prefix,
                  std::span<const int32_t> keys, HeadTask* task) {
  const int32_t window_first =
      shape.sliding_window > 0 ? std::max(0, pos - shape.sliding_window + 1) : 0;
  task->gathered = {};
  task->first = std::min(window_first, prefix);
  task->last = prefix - 1;
  const int32_t skip = std::clamp(window_first - prefix, 0, static_cast<int32_t>(keys.size()));
  task->tail = keys.subspan(static_cast<size_t>(skip));
}

}  // namespace

void WriteKv(const TokenLayout& layout, const float* k, const float* v, int64_t row_stride,
             int32_t layer, CpuKvCache& kv) {
  const int32_t block_size = kv.spec().block_size;
  const size_t bytes = sizeof(float) * kv.spec().slot_floats();
  for (size_t t = 0; t < layout.positions.size(); ++t) {
    const int32_t slot = layout.slot(t);
    const int32_t block = layout.block_tables[layout.seq_of_token[t]][slot / block_size];
    std::memcpy(kv.KeySlot(layer, block, slot % block_size), k + t * row_stride, bytes);
    std::memcpy(kv.ValueSlot(layer, block, slot % block_size), v + t * row_stride, bytes);
  }
}

void PagedAttention(ThreadPool& pool, const AttentionShape& shape, const TokenLayout& layout,
                    const float* q, int64_t q_stride, const CpuKvCache& kv, int32_t layer,
                    float* out, std::span<const SparseKeys> sparse, const ScoreCapture* capture) {
  const int64_t num_tokens = static_cast<int64_t>(layout.positions.size());
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t out_stride = int64_t{shape.num_heads} * shape.head_dim;
  auto keys_of = [&](int64_t t, HeadTask* task) {
    if (layout.is_tree(t)) {
      PlanTreeKeys(shape, layout.positions[t], layout.tree_prefix[t], layout.tree_keys[t], task);
      return;
    }
    const int32_t s = layout.seq_of_token[t];
    PlanKeys(shape, sparse.empty() ? nullptr : &sparse[s], layout.positions[t], task);
  };
  auto body = [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / shape.num_heads;
      const int32_t h = static_cast<int32_t>(i % shape.num_heads);
      HeadTask task;
      task.q = q + t * q_stride + int64_t{h} * shape.head_dim;
      task.out = out + t * out_stride + int64_t{h} * shape.head_dim;
      task.kv_head = h / group;
      keys_of(t, &task);
      task.block_table = layout.block_tables[layout.seq_of_token[t]];
      if (capture != nullptr && capture->slot_of_token[t] >= 0) {
        const int32_t slot = capture->slot_of_token[t];
        task.capture = capture->out + (int64_t{slot} * shape.num_heads + h) * capture->stride;
        task.capture_end = capture->prefix[slot];
      }
      AttendOneHead(task, shape, kv, layer, scores);
    }
  };
  // A pool dispatch costs tens of microseconds: small work (decode at short context)
  // runs on the calling thread.
  int64_t attended = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    HeadTask task;
    keys_of(t, &task);
    attended +=
        static_cast<int64_t>(task.gathered.size() + task.tail.size()) + task.last - task.first + 1;
  }
  const int64_t num_tasks = num_tokens * shape.num_heads;
  if (attended * shape.num_heads * shape.head_dim < kMinParallelMacs || pool.num_threads() == 1) {
    body(0, num_tasks);
  } else {
    pool.ParallelFor(num_tasks, body);
  }
}

}  // namespace specd
