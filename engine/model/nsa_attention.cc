#include "engine/model/nsa_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>

namespace specd {
namespace {

// Below this many attended keys (times heads) in a batch, NSA attention stays on one thread: a
// pool dispatch costs tens of microseconds.
constexpr int64_t kMinParallelKeys = int64_t{1} << 14;

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Softmax over `logits` in place (max-subtracted exponentials, the sum in double as in
// attention.cc).
void SoftmaxInPlace(std::span<float> logits) {
  if (logits.empty()) return;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float& s : logits) {
    s = std::exp(s - max_logit);
    sum += s;
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (float& s : logits) s *= inv_sum;
}

// Softmax of each row of logits ([rows, cols] f32) in place.
void SoftmaxRows(float* logits, int32_t rows, int32_t cols) {
  for (int32_t r = 0; r < rows; ++r) {
    SoftmaxInPlace(std::span<float>(logits + int64_t{r} * cols, cols));
  }
}

}  // namespace

// Per-thread scratch of AttendToken.
struct NsaAttention::Task {
  std::vector<float> logits;        // [group, keys] of one branch
  std::vector<float> block_scores;  // [own_block + 1] selection scores
  std::vector<int32_t> positions;   // [keys] attended positions of a branch
  std::vector<float> keys;          // [keys, head_dim] gathered from the cache
  std::vector<float> values;        // [keys, head_dim] gathered from the cache
  std::vector<float> cmp_out;       // [group, head_dim] compressed branch
  std::vector<float> slc_out;       // [group, head_dim] selected branch
  std::vector<float> swa_out;       // [group, head_dim] window branch
};

NsaAttention::NsaAttention(const NsaShape& shape, int32_t num_layers)
    : shape_(shape),
      scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)))),
      last_selection_(num_layers),
      last_margin_(num_layers, std::numeric_limits<float>::infinity()) {}

float NsaAttention::LastRunSelectionMargin(int32_t layer) const {
  if (layer < 0 || layer >= static_cast<int32_t>(last_margin_.size())) {
    return std::numeric_limits<float>::infinity();
  }
  return last_margin_[layer];
}

std::span<const int32_t> NsaAttention::LastTokenSelection(int32_t layer, int32_t kv_head) const {
  if (layer < 0 || layer >= static_cast<int32_t>(last_selection_.size())) return {};
  const auto& per_head = last_selection_[layer];
  if (kv_head < 0 || kv_head >= static_cast<int32_t>(per_head.size())) return {};
  return per_head[kv_head];
}

std::vector<int32_t> NsaSelectBlocks(std::span<float> scores, int32_t own_block, int32_t group,
                                     int32_t count, float* margin) {
  for (int32_t forced : {0, own_block - 1, own_block}) {
    if (forced >= 0) scores[forced] = static_cast<float>(group);
  }
  std::vector<int32_t> order(own_block + 1);
  std::iota(order.begin(), order.end(), 0);
  if (margin != nullptr) *margin = std::numeric_limits<float>::infinity();
  if (static_cast<int32_t>(order.size()) > count) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
    if (margin != nullptr) *margin = scores[order[count - 1]] - scores[order[count]];
    order.resize(count);
    std::sort(order.begin(), order.end());
  }
  return order;
}

void NsaAttention::Compress(const TokenLayout& layout, CpuKvCache& kv, int32_t layer) {
  const int32_t bs = shape_.nsa.block_size, kv_bs = kv.spec().block_size;
  const int64_t entry_floats = int64_t{shape_.num_kv_heads} * 2 * shape_.head_dim;
  const size_t num_seqs = layout.block_tables.size();
  seq_begin_.assign(num_seqs, INT32_MAX);
  seq_end_.assign(num_seqs, -1);
  for (size_t t = 0; t < layout.positions.size(); ++t) {
    const int32_t s = layout.seq_of_token[t];
    seq_begin_[s] = std::min(seq_begin_[s], layout.positions[t]);
    seq_end_[s] = std::max(seq_end_[s], layout.positions[t]);
  }
  // With the cache's compressed entries (KvCacheSpec::compressed_block_size), only the blocks
  // this pass completes are averaged (their last position is among its new tokens: a rewritten
  // position's block is rewritten up to its end before anything reads it); the others were when
  // their last position was written. Without them, every complete block is.
  const bool kept = kv.spec().compressed_block_size == bs;
  cmp_.resize(num_seqs);
  for (size_t s = 0; s < num_seqs; ++s) {
    const int32_t num_blocks = (seq_end_[s] + 1) / bs;
    std::vector<float>& cmp = cmp_[s];
    cmp.assign(int64_t{num_blocks} * entry_floats, 0.0f);
    const std::span<const int32_t> table = layout.block_tables[s];
    const int32_t first_new = kept ? seq_begin_[s] / bs : 0;
    for (int32_t c = first_new; c < num_blocks; ++c) {
      MeanOfBlock(table, kv, layer, c, &cmp[int64_t{c} * entry_floats]);
      if (!kept) continue;
      const int32_t last = (c + 1) * bs - 1;
      std::copy_n(&cmp[int64_t{c} * entry_floats], entry_floats,
                  kv.CompressedEntry(layer, table[last / kv_bs], (last % kv_bs) / bs));
    }
    for (int32_t c = 0; c < std::min(first_new, num_blocks); ++c) {
      const int32_t last = (c + 1) * bs - 1;
      std::copy_n(kv.CompressedEntry(layer, table[last / kv_bs], (last % kv_bs) / bs), entry_floats,
                  &cmp[int64_t{c} * entry_floats]);
    }
  }
}

void NsaAttention::MeanOfBlock(std::span<const int32_t> table, const CpuKvCache& kv, int32_t layer,
                               int32_t c, float* mean) const {
  const int32_t bs = shape_.nsa.block_size, kv_bs = kv.spec().block_size;
  const int32_t hd = shape_.head_dim, kv_heads = shape_.num_kv_heads;
  for (int32_t j = c * bs; j < (c + 1) * bs; ++j) {
    const int32_t block = table[j / kv_bs], slot = j % kv_bs;
    for (int32_t g = 0; g < kv_heads; ++g) {
      float* m = mean + int64_t{g} * 2 * hd;
      const float* key = kv.KeySlot(layer, block, slot) + int64_t{g} * hd;
      const float* value = kv.ValueSlot(layer, block, slot) + int64_t{g} * hd;
      for (int32_t d = 0; d < hd; ++d) {
        m[d] += key[d];
        m[hd + d] += value[d];
      }
    }
  }
  for (int64_t d = 0; d < int64_t{kv_heads} * 2 * hd; ++d) mean[d] /= static_cast<float>(bs);
}

// out = softmax(scale * Q . K[positions]^T) . V[positions] for the `group` query heads of KV head
// `kv_head`, the keys and values gathered from the paged cache so each branch is two GEMMs.
// q: [group, head_dim] f32; out: [group, head_dim] f32.
void NsaAttention::AttendPositions(const float* q, std::span<const int32_t> table,
                                   const CpuKvCache& kv, int32_t layer, int32_t kv_head, Task& task,
                                   float* out) const {
  const int32_t hd = shape_.head_dim, kv_bs = kv.spec().block_size;
  const int32_t group = shape_.num_heads / shape_.num_kv_heads;
  const int32_t n = static_cast<int32_t>(task.positions.size());
  const int64_t offset = int64_t{kv_head} * hd;
  task.keys.resize(int64_t{n} * hd);
  task.values.resize(int64_t{n} * hd);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = task.positions[i];
    const int32_t block = table[p / kv_bs], slot = p % kv_bs;
    std::memcpy(&task.keys[int64_t{i} * hd], kv.KeySlot(layer, block, slot) + offset,
                sizeof(float) * hd);
    std::memcpy(&task.values[int64_t{i} * hd], kv.ValueSlot(layer, block, slot) + offset,
                sizeof(float) * hd);
  }
  task.logits.resize(int64_t{group} * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, group, n, hd, scale_, q, hd,
              task.keys.data(), hd, 0.0f, task.logits.data(), n);
  SoftmaxRows(task.logits.data(), group, n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, group, hd, n, 1.0f, task.logits.data(), n,
              task.values.data(), hd, 0.0f, out, hd);
}

// The compressed branch of the group's heads into task.cmp_out, and the block scores (its
// probabilities summed over the heads, in head order) into task.block_scores.
void NsaAttention::AttendCompressed(const float* q, const std::vector<float>& cmp,
                                    int32_t num_visible, int32_t own_block, int32_t kv_head,
                                    Task& task) const {
  const int32_t hd = shape_.head_dim;
  const int32_t group = shape_.num_heads / shape_.num_kv_heads;
  task.block_scores.assign(own_block + 1, 0.0f);
  task.cmp_out.assign(int64_t{group} * hd, 0.0f);
  if (num_visible == 0) return;
  const int64_t ld = int64_t{shape_.num_kv_heads} * 2 * hd;  // [blocks, kv_heads, 2, head_dim]
  const float* keys = cmp.data() + int64_t{kv_head} * 2 * hd;
  task.logits.resize(int64_t{group} * num_visible);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, group, num_visible, hd, scale_, q, hd, keys,
              static_cast<int>(ld), 0.0f, task.logits.data(), num_visible);
  SoftmaxRows(task.logits.data(), group, num_visible);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, group, hd, num_visible, 1.0f,
              task.logits.data(), num_visible, keys + hd, static_cast<int>(ld), 0.0f,
              task.cmp_out.data(), hd);
  for (int32_t h = 0; h < group; ++h) {
    for (int32_t c = 0; c < num_visible; ++c) {
      task.block_scores[c] += task.logits[int64_t{h} * num_visible + c];
    }
  }
}

void NsaAttention::SelectToken(int64_t t, const TokenLayout& layout, const float* q,
                               int64_t q_stride, Task& task) {
  const int32_t bs = shape_.nsa.block_size, hd = shape_.head_dim;
  const int32_t group = shape_.num_heads / shape_.num_kv_heads;
  const int32_t p = layout.positions[t], s = layout.seq_of_token[t];
  const int32_t own_block = p / bs, num_visible = (p + 1) / bs;
  for (int32_t g = 0; g < shape_.num_kv_heads; ++g) {
    const float* qg = q + t * q_stride + int64_t{g} * group * hd;  // [group, head_dim]
    AttendCompressed(qg, cmp_[s], num_visible, own_block, g, task);
    std::copy(task.cmp_out.begin(), task.cmp_out.end(),
              cmp_out_.begin() + (t * shape_.num_heads + int64_t{g} * group) * hd);
    float margin = 0;
    own_[t * shape_.num_kv_heads + g] =
        NsaSelectBlocks(task.block_scores, own_block, group, shape_.nsa.block_counts, &margin);
    token_margin_[t] = std::min(token_margin_[t], margin);
  }
}

void NsaAttention::AttendToken(int64_t t, const TokenLayout& layout, const float* q,
                               int64_t q_stride, const float* gate_logits, int64_t gate_stride,
                               const CpuKvCache& kv, int32_t layer, float* out, Task& task) const {
  const int32_t bs = shape_.nsa.block_size, hd = shape_.head_dim;
  const int32_t group = shape_.num_heads / shape_.num_kv_heads;
  const int32_t p = layout.positions[t], s = layout.seq_of_token[t];
  const std::span<const int32_t> table = layout.block_tables[s];
  task.slc_out.resize(int64_t{group} * hd);
  task.swa_out.resize(int64_t{group} * hd);
  for (int32_t g = 0; g < shape_.num_kv_heads; ++g) {
    const float* qg = q + t * q_stride + int64_t{g} * group * hd;  // [group, head_dim]
    // Selected branch: every key up to p of the selected blocks (the own block truncated).
    task.positions.clear();
    for (int32_t b : *effective_[t * shape_.num_kv_heads + g]) {
      for (int32_t j = b * bs; j < (b + 1) * bs && j <= p; ++j) task.positions.push_back(j);
    }
    AttendPositions(qg, table, kv, layer, g, task, task.slc_out.data());
    // Window branch: the keys p - window_size + 1 .. p.
    task.positions.clear();
    for (int32_t j = std::max(0, p - shape_.nsa.window_size + 1); j <= p; ++j) {
      task.positions.push_back(j);
    }
    AttendPositions(qg, table, kv, layer, g, task, task.swa_out.data());
    for (int32_t hh = 0; hh < group; ++hh) {
      const int64_t h = int64_t{g} * group + hh;
      const float* gate = gate_logits + t * gate_stride + 3 * h;
      const float g_cmp = Sigmoid(gate[0]), g_slc = Sigmoid(gate[1]), g_swa = Sigmoid(gate[2]);
      float* o = out + (t * shape_.num_heads + h) * hd;
      const float* o_cmp = &cmp_out_[(t * shape_.num_heads + h) * hd];
      const float* o_slc = &task.slc_out[hh * hd];
      const float* o_swa = &task.swa_out[hh * hd];
      for (int32_t d = 0; d < hd; ++d) {
        o[d] = g_slc * o_slc[d] + g_cmp * o_cmp[d] + g_swa * o_swa[d];
      }
    }
  }
}

void NsaAttention::ResolveSelections(const TokenLayout& layout,
                                     std::span<const SsvStrategy* const> ssv, int32_t layer) {
  const int64_t num_tokens = static_cast<int64_t>(layout.positions.size());
  const int32_t kv_heads = shape_.num_kv_heads;
  effective_.resize(num_tokens * kv_heads);
  for (int64_t i = 0; i < num_tokens * kv_heads; ++i) effective_[i] = &own_[i];
  if (ssv.empty()) return;
  if (static_cast<int64_t>(kept_.size()) != num_tokens * kv_heads)
    kept_.resize(num_tokens * kv_heads);
  first_token_.assign(layout.block_tables.size(), -1);
  for (int64_t t = num_tokens - 1; t >= 0; --t) {
    first_token_[layout.seq_of_token[t]] = static_cast<int32_t>(t);
  }
  // Refresh layers keep their selections for the reuse layers after them (layer 0 always
  // refreshes, and Forward runs the layers in order, so kept_ is this batch's).
  for (int64_t t = 0; t < num_tokens; ++t) {
    const SsvStrategy* st = ssv[layout.seq_of_token[t]];
    if (st == nullptr || !st->Refreshes(layer)) continue;
    for (int32_t g = 0; g < kv_heads; ++g) kept_[t * kv_heads + g] = own_[t * kv_heads + g];
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t s = layout.seq_of_token[t];
    const SsvStrategy* st = ssv[s];
    if (st == nullptr) continue;
    const int64_t first = first_token_[s];
    const int64_t source =
        st->mode == SsvMode::kShared ? first + (t - first) / st->group_size * st->group_size : t;
    for (int32_t g = 0; g < kv_heads; ++g) {
      effective_[t * kv_heads + g] = &kept_[source * kv_heads + g];
    }
  }
  CountLoads(layout, ssv, layer);
}

void NsaAttention::CountLoads(const TokenLayout& layout, std::span<const SsvStrategy* const> ssv,
                              int32_t layer) {
  const int64_t num_tokens = static_cast<int64_t>(layout.positions.size());
  const int32_t bs = shape_.nsa.block_size, window = shape_.nsa.window_size;
  const int32_t kv_heads = shape_.num_kv_heads;
  std::vector<int32_t> keys, group_keys, merged, group_blocks;
  // A query's keys: its effective blocks' positions up to its own, and its window (ascending).
  auto query_keys = [&](int64_t t, int32_t g, std::vector<int32_t>& out) {
    const int32_t p = layout.positions[t];
    out.clear();
    for (int32_t b : *effective_[t * kv_heads + g]) {
      for (int32_t j = b * bs; j < (b + 1) * bs && j <= p; ++j) out.push_back(j);
    }
    for (int32_t j = std::max(0, p - window + 1); j <= p; ++j) out.push_back(j);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  };
  auto merge_into = [&](std::vector<int32_t>& acc, std::span<const int32_t> add) {
    merged.clear();
    std::set_union(acc.begin(), acc.end(), add.begin(), add.end(), std::back_inserter(merged));
    acc.swap(merged);
  };
  for (int64_t begin = 0; begin < num_tokens;) {
    const int32_t s = layout.seq_of_token[begin];
    int64_t end = begin;
    while (end < num_tokens && layout.seq_of_token[end] == s) ++end;
    const SsvStrategy* st = ssv[s];
    if (st != nullptr) {
      for (int32_t g = 0; g < kv_heads; ++g) {
        for (int64_t t = begin; t < end; ++t) {
          const std::vector<int32_t>& own = own_[t * kv_heads + g];
          // Overlap on refresh layers only: a reuse layer's own selection is not computed on
          // the GPU (skipping it is what the schedule buys), and the two backends count alike.
          if (t > begin && !own.empty() && st->Refreshes(layer)) {
            const std::vector<int32_t>& prev = own_[(t - 1) * kv_heads + g];
            merged.clear();
            std::set_intersection(own.begin(), own.end(), prev.begin(), prev.end(),
                                  std::back_inserter(merged));
            ssv_stats_.overlap_sum += static_cast<double>(merged.size()) / own.size();
            ++ssv_stats_.overlap_pairs;
          }
        }
        for (int64_t g0 = begin; g0 < end; g0 += st->group_size) {
          group_keys.clear();
          group_blocks.clear();
          for (int64_t t = g0; t < std::min(end, g0 + st->group_size); ++t) {
            query_keys(t, g, keys);
            const std::vector<int32_t>& blocks = *effective_[t * kv_heads + g];
            ++ssv_stats_.queries;
            ssv_stats_.per_query_keys += static_cast<int64_t>(keys.size());
            ssv_stats_.per_query_blocks += static_cast<int64_t>(blocks.size());
            merge_into(group_keys, keys);
            merge_into(group_blocks, blocks);
          }
          ssv_stats_.grouped_keys += static_cast<int64_t>(group_keys.size());
          ssv_stats_.grouped_blocks += static_cast<int64_t>(group_blocks.size());
        }
      }
    }
    begin = end;
  }
}

void NsaAttention::Run(ThreadPool& pool, const TokenLayout& layout, const float* q,
                       int64_t q_stride, const float* gate_logits, int64_t gate_stride,
                       CpuKvCache& kv, int32_t layer, float* out,
                       std::span<const SsvStrategy* const> ssv) {
  const int64_t num_tokens = static_cast<int64_t>(layout.positions.size());
  if (num_tokens == 0) return;
  Compress(layout, kv, layer);
  cmp_out_.resize(num_tokens * shape_.num_heads * shape_.head_dim);
  own_.resize(num_tokens * shape_.num_kv_heads);
  token_margin_.assign(num_tokens, std::numeric_limits<float>::infinity());
  const int64_t keys_per_token =
      int64_t{shape_.nsa.block_counts} * shape_.nsa.block_size + shape_.nsa.window_size;
  const bool serial =
      num_tokens * keys_per_token * shape_.num_heads < kMinParallelKeys || pool.num_threads() == 1;
  auto for_tokens = [&](auto&& fn) {
    auto body = [&](int64_t begin, int64_t end) {
      Task task;
      for (int64_t t = begin; t < end; ++t) fn(t, task);
    };
    if (serial) {
      body(0, num_tokens);
    } else {
      pool.ParallelFor(num_tokens, body);
    }
  };
  // Phase 1: the compressed branch and each query's own selection; then which selection each
  // query attends (its own, or per the sequence's SSV strategy); phase 2: the selected and
  // window branches and the gates.
  for_tokens([&](int64_t t, Task& task) { SelectToken(t, layout, q, q_stride, task); });
  const int32_t kv_heads = shape_.num_kv_heads;
  last_selection_[layer].assign(own_.begin() + (num_tokens - 1) * kv_heads, own_.end());
  last_margin_[layer] = *std::min_element(token_margin_.begin(), token_margin_.end());
  ResolveSelections(layout, ssv, layer);
  for_tokens([&](int64_t t, Task& task) {
    AttendToken(t, layout, q, q_stride, gate_logits, gate_stride, kv, layer, out, task);
  });
}

}  // namespace specd
