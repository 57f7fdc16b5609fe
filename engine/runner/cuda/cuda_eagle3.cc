#include "engine/runner/cuda/cuda_eagle3.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/base/float16.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/model/token_tree.h"
#include "engine/runner/cuda/cuda_eagle3_util.h"
#include "engine/runner/cuda/cuda_forward.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"

namespace specd {

using eagle3_cuda::Launch;
using eagle3_cuda::Offset;

CudaEagle3Compute::~CudaEagle3Compute() {
  cudaSetDevice(options_.device);
  if (options_.stream != nullptr) cudaStreamSynchronize(options_.stream);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : chain_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : round_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : sampled_chain_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : sampled_round_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : ranked_round_graphs_) cudaGraphExecDestroy(exec);
  if (rounds_in_graph_ + chains_in_graph_ + sampled_rounds_in_graph_ + sampled_chains_in_graph_ +
          ranked_rounds_ >
      0) {
    SPECD_LOG_INFO(
        "EAGLE-3 head: {} greedy rounds in one graph ({} of them ranked), {} chained graphs after "
        "an eager catch-up; sampled: {} rounds in one graph, {} chained graphs",
        rounds_in_graph_, ranked_rounds_, chains_in_graph_, sampled_rounds_in_graph_,
        sampled_chains_in_graph_);
  }
  if (owns_stream_ && options_.stream != nullptr) cudaStreamDestroy(options_.stream);
}

absl::StatusOr<std::unique_ptr<CudaEagle3Compute>> CudaEagle3Compute::Create(
    const Options& options) {
  std::unique_ptr<CudaEagle3Compute> c(new CudaEagle3Compute(options));
  absl::Status s = c->LoadWeights();
  if (s.ok()) s = c->AllocateBuffers();
  if (!s.ok() && !absl::StartsWith(s.message(), "EAGLE-3 head: ")) {
    return absl::Status(s.code(), absl::StrCat("EAGLE-3 head: ", s.message()));
  }
  SPECD_RETURN_IF_ERROR(s);
  return c;
}

absl::Status CudaEagle3Compute::Gemm(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                     int64_t m, int64_t n, int64_t k, void* y, int64_t ldy,
                                     bool f32_out) {
  std::string error;
  if (gemm_->Run(x, ldx, w, nullptr, m, n, k, y, ldy,
                 f32_out ? kernels::GemmOut::kF32 : kernels::GemmOut::kBf16, options_.stream,
                 &error)) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat("EAGLE-3 head: GEMM [", m, ", ", k, "] x [", n, ", ", k, "]^T: ", error));
}

absl::Status CudaEagle3Compute::Fuse(std::span<const int32_t> capture_rows,
                                     std::span<const int32_t> pool_rows) {
  if (capture_rows.size() != pool_rows.size()) {
    return absl::InvalidArgumentError("EAGLE-3 head: Fuse of mismatched row lists");
  }
  if (capture_rows.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  if (capture_ == nullptr) return absl::FailedPreconditionError("EAGLE-3 head: no capture");
  for (size_t i = 0; i < capture_rows.size(); ++i) {
    if (capture_rows[i] < 0 || capture_rows[i] >= capture_rows_ || pool_rows[i] < 0 ||
        pool_rows[i] >= pool_rows_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EAGLE-3 head: Fuse of captured row ", capture_rows[i], " into pool row ", pool_rows[i]));
    }
  }
  const ModelConfig& l = config_.layer;
  const int64_t h = l.hidden_size,
                f = static_cast<int64_t>(config_.aux_layer_ids.size()) * config_.target_hidden_size;
  auto* table = table_.as<__nv_bfloat16>();
  for (size_t at = 0; at < capture_rows.size(); at += options_.max_tokens) {
    const size_t n = std::min<size_t>(options_.max_tokens, capture_rows.size() - at);
    fuse_arena_.Reset();
    const size_t ids = fuse_arena_.Push(capture_rows.data() + at, n * 4);
    SPECD_RETURN_IF_ERROR(fuse_arena_.Upload(options_.stream));
    SPECD_RETURN_IF_ERROR(Launch(
        kernels::EmbeddingGather(fuse_arena_.At<int32_t>(ids), static_cast<int64_t>(n), capture_, 0,
                                 capture_rows_, f, features_.as<__nv_bfloat16>(), options_.stream),
        "EmbeddingGather (captured rows)"));
    SPECD_RETURN_IF_ERROR(Gemm(features_.as<__nv_bfloat16>(), f, w_.fc, static_cast<int64_t>(n), h,
                               f, fused_.as(), h, false));
    // One copy per run of consecutive pool rows.
    for (size_t i = 0; i < n;) {
      size_t j = i + 1;
      while (j < n && pool_rows[at + j] == pool_rows[at + j - 1] + 1) ++j;
      SPECD_RETURN_IF_ERROR(cuda::Check(
          cudaMemcpyAsync(Offset(table, int64_t{pool_rows[at + i]} * h),
                          Offset(fused_.as<__nv_bfloat16>(), static_cast<int64_t>(i) * h),
                          (j - i) * h * 2, cudaMemcpyDeviceToDevice, options_.stream),
          "EAGLE-3 head: pool rows"));
      i = j;
    }
    // The arena's staging is refilled by the next piece. (The next call comes after a
    // synchronisation: the target's step, or a Forward, ends with one.)
    if (at + n < capture_rows.size()) {
      SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 Fuse"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::SetHostCapture(std::span<const float> rows) {
  if (!options_.standalone) return Eagle3Compute::SetHostCapture(rows);
  const int64_t f = static_cast<int64_t>(config_.aux_layer_ids.size()) * config_.target_hidden_size;
  const int64_t n = static_cast<int64_t>(rows.size()) / f;
  if (n * f != static_cast<int64_t>(rows.size()) || n > options_.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: ", rows.size(),
                                                   " floats of target rows (rows of ", f,
                                                   ", at most ", options_.max_tokens, ")"));
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  // The staging is free: the last upload was waited for.
  auto* staged = host_capture_staging_.as<uint16_t>();
  for (size_t i = 0; i < rows.size(); ++i) staged[i] = FloatToBf16(rows[i]);
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemcpyAsync(host_capture_.as(), staged, rows.size() * 2,
                                                    cudaMemcpyHostToDevice, options_.stream),
                                    "EAGLE-3 head: target rows"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head: target rows"));
  set_capture(host_capture_.as<__nv_bfloat16>(), n);
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::SetDeviceCapture(const void* rows, int64_t n) {
  if (!options_.standalone) return Eagle3Compute::SetDeviceCapture(rows, n);
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  // The last Fuse may still read the rows before (and its upload arena is refilled next).
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head: device target rows"));
  set_capture(static_cast<const __nv_bfloat16*>(rows), rows == nullptr ? 0 : n);
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::CopyHidden(std::span<const int32_t> from,
                                           std::span<const int32_t> to) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError("EAGLE-3 head: CopyHidden of mismatched row lists");
  }
  if (from.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const int64_t h = config_.layer.hidden_size;
  // The last pass's prenorm rows: the half it wrote (Forward flipped prenorm_half_ to it).
  const int64_t prenorm_base = pool_rows_ + int64_t{prenorm_half_} * max_logit_rows_;
  auto* table = table_.as<__nv_bfloat16>();
  // One kernel launch per kMaxRowCopies rows (a pass's rows were one cudaMemcpyAsync each:
  // 0.1 ms a pass of 24 branches), in order, as the copies were.
  kernels::RowCopies copies;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t src = from[i] >= 0 ? from[i] : prenorm_base + (-int64_t{from[i]} - 1);
    if ((from[i] >= 0 && from[i] >= pool_rows_) ||
        (from[i] < 0 && -int64_t{from[i]} > max_logit_rows_) || to[i] < 0 || to[i] >= pool_rows_) {
      return absl::InvalidArgumentError(
          absl::StrCat("EAGLE-3 head: CopyHidden of row ", from[i], " into pool row ", to[i]));
    }
    if (src == to[i]) continue;
    if (h % 8 != 0) {  // not 16-byte columns (no head shipped): one copy each
      SPECD_RETURN_IF_ERROR(cuda::Check(
          cudaMemcpyAsync(Offset(table, int64_t{to[i]} * h), Offset(table, src * h),
                          static_cast<size_t>(h) * 2, cudaMemcpyDeviceToDevice, options_.stream),
          "EAGLE-3 head: hidden rows"));
      continue;
    }
    copies.src[copies.count] = static_cast<int32_t>(src);
    copies.dst[copies.count] = to[i];
    if (++copies.count == kernels::kMaxRowCopies) {
      SPECD_RETURN_IF_ERROR(cuda::Check(kernels::CopyRows(copies, table, h, options_.stream),
                                        "EAGLE-3 head: hidden rows"));
      copies.count = 0;
    }
  }
  return cuda::Check(kernels::CopyRows(copies, table, h, options_.stream),
                     "EAGLE-3 head: hidden rows");
}

absl::Status CudaEagle3Compute::CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> src_dst) {
  if (k_cache_ == nullptr) return absl::FailedPreconditionError("EAGLE-3 head: no KV cache");
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const int64_t half = KvBlockBytes() / 4;  // one block's K (or V), in elements
  for (const auto& [src, dst] : src_dst) {
    if (src < 0 || dst < 0 || src >= num_kv_blocks_ || dst >= num_kv_blocks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("EAGLE-3 head: KV block copy ", src, " -> ", dst));
    }
    for (__nv_bfloat16* cache : {k_cache_, v_cache_}) {
      SPECD_RETURN_IF_ERROR(cuda::Check(
          cudaMemcpyAsync(Offset(cache, dst * half), Offset(cache, src * half),
                          static_cast<size_t>(half) * 2, cudaMemcpyDeviceToDevice, options_.stream),
          "EAGLE-3 head: KV block copy"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::RunPiece(std::span<const Row> rows, size_t begin, size_t end,
                                         int32_t logits_base, int32_t* num_logits) {
  const ModelConfig& l = config_.layer;
  const auto n = static_cast<int64_t>(end - begin);
  const int32_t bs = options_.block_size;
  const int64_t read_base = pool_rows_ + int64_t{prenorm_half_} * max_logit_rows_;
  const int64_t write_base = pool_rows_ + int64_t{1 - prenorm_half_} * max_logit_rows_;
  std::vector<int32_t> tokens, positions, hidden, seq_lens, cu = {0}, logit_rows;
  std::vector<int64_t> slots;
  // Groups: runs of one sequence's consecutive slots in one tree or none (the attention's
  // "sequences").
  std::vector<size_t> group_first;
  int32_t width = 1, max_q_len = 1;
  bool any_tree = false;
  auto slot_of = [](const Row& r) { return r.slot >= 0 ? r.slot : r.position; };
  for (size_t i = begin; i < end; ++i) {
    const Row& r = rows[i];
    const int32_t slot = slot_of(r);
    const bool new_group = i == begin || r.seq != rows[i - 1].seq ||
                           slot != slot_of(rows[i - 1]) + 1 || r.tree != rows[i - 1].tree;
    if (new_group) group_first.push_back(i);
    any_tree = any_tree || r.tree != nullptr;
    const int64_t block = slot / bs;
    const bool tree_ok =
        r.tree == nullptr ||
        (slot >= r.tree->start &&
         slot - int64_t{r.tree->start} < static_cast<int64_t>(r.tree->parents.size()) &&
         r.tree->parents.size() <= size_t{64} * kernels::kMaxTreeMaskWords);
    if (r.position < 0 || r.position >= options_.max_model_len || slot < 0 ||
        slot >= options_.max_model_len || block >= static_cast<int64_t>(r.block_table.size()) ||
        r.token < 0 || r.token >= l.vocab_size || !tree_ok) {
      return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: row ", i, " (position ",
                                                     r.position, ", slot ", slot, ", token ",
                                                     r.token, ") is malformed"));
    }
    tokens.push_back(r.token);
    positions.push_back(r.position);
    slots.push_back(int64_t{r.block_table[block]} * bs + slot % bs);
    if (r.hidden >= 0) {
      if (r.hidden >= pool_rows_) {
        return absl::InvalidArgumentError(
            absl::StrCat("EAGLE-3 head: row ", i, " reads pool row ", r.hidden));
      }
      hidden.push_back(r.hidden);
    } else {
      const int64_t k = -int64_t{r.hidden} - 1;
      if (k >= max_logit_rows_) {
        return absl::InvalidArgumentError(
            absl::StrCat("EAGLE-3 head: row ", i, " reads logits row ", k));
      }
      hidden.push_back(static_cast<int32_t>(read_base + k));
    }
    if (r.logits) logit_rows.push_back(static_cast<int32_t>(i - begin));
  }
  const auto num_groups = static_cast<int32_t>(group_first.size());
  for (int32_t g = 0; g < num_groups; ++g) {
    const size_t first = group_first[g];
    const size_t last = (g + 1 < num_groups ? group_first[g + 1] : end) - 1;
    const int32_t len = slot_of(rows[last]) + 1;
    seq_lens.push_back(len);
    cu.push_back(cu.back() + static_cast<int32_t>(last - first + 1));
    max_q_len = std::max(max_q_len, static_cast<int32_t>(last - first + 1));
    width = std::max(width, (len + bs - 1) / bs);
  }
  tables_host_.assign(static_cast<size_t>(num_groups) * width, 0);
  for (int32_t g = 0; g < num_groups; ++g) {
    const Row& r = rows[group_first[g]];
    const int32_t used = (seq_lens[g] + bs - 1) / bs;
    if (static_cast<int32_t>(r.block_table.size()) < used) {
      return absl::InvalidArgumentError("EAGLE-3 head: a block table is too short");
    }
    std::copy_n(r.block_table.begin(), used, tables_host_.begin() + int64_t{g} * width);
  }
  const auto m = static_cast<int32_t>(logit_rows.size());
  *num_logits = m;
  // Tree rows: each group's tree start (INT32_MAX: none) and each row's mask (its node's
  // ancestors and itself, bits of the slots after the start).
  std::vector<int32_t> tree_starts;
  std::vector<uint64_t> masks;
  size_t words = 1;
  if (any_tree) {
    for (size_t i = begin; i < end; ++i) {
      if (rows[i].tree != nullptr)
        words = std::max(words, (rows[i].tree->parents.size() + 63) / 64);
    }
    tree_starts.assign(static_cast<size_t>(num_groups), INT32_MAX);
    masks.assign(static_cast<size_t>(n) * words, 0);
    for (int32_t g = 0; g < num_groups; ++g) {
      const TokenTree* tree = rows[group_first[g]].tree;
      if (tree != nullptr) tree_starts[g] = tree->start;
    }
    for (size_t i = begin; i < end; ++i) {
      const Row& r = rows[i];
      if (r.tree == nullptr) continue;
      SetTreeMaskBits(r.tree->parents, slot_of(r) - r.tree->start,
                      std::span<uint64_t>(masks).subspan((i - begin) * words, words));
    }
  }
  arena_.Reset();
  const size_t a_tokens = arena_.Push(tokens), a_pos = arena_.Push(positions),
               a_slots = arena_.Push(slots), a_hidden = arena_.Push(hidden),
               a_lens = arena_.Push(seq_lens), a_cu = arena_.Push(cu),
               a_tables = arena_.Push(tables_host_), a_rows = arena_.Push(logit_rows);
  const size_t a_starts = any_tree ? arena_.Push(tree_starts) : 0;
  const size_t a_masks = any_tree ? arena_.Push(masks) : 0;
  SPECD_RETURN_IF_ERROR(arena_.Upload(options_.stream));
  Pass p;
  p.tokens = arena_.At<int32_t>(a_tokens);
  p.positions = arena_.At<int32_t>(a_pos);
  p.slots = arena_.At<int64_t>(a_slots);
  p.hidden = arena_.At<int32_t>(a_hidden);
  p.seq_lens = arena_.At<int32_t>(a_lens);
  p.cu_q_lens = arena_.At<int32_t>(a_cu);
  p.tables = arena_.At<int32_t>(a_tables);
  p.rows = arena_.At<int32_t>(a_rows);
  p.table_stride = width;
  p.num_groups = num_groups;
  p.max_q_len = max_q_len;
  p.n = n;
  p.m = m;
  p.prenorm_dst = write_base + logits_base;
  p.logits_base = logits_base;
  if (any_tree) {
    tree_mask_.tree_starts = arena_.At<int32_t>(a_starts);
    tree_mask_.masks = arena_.At<uint64_t>(a_masks);
    tree_mask_.mask_words = static_cast<int32_t>(words);
    p.tree = &tree_mask_;
  }
  return Body(p);
}

absl::Status CudaEagle3Compute::Body(const Pass& p) {
  const ModelConfig& l = config_.layer;
  const int64_t h = l.hidden_size, q = l.q_size(), kvs = l.kv_size(), qw = q + 2 * kvs;
  const int64_t inter = l.intermediate_size, dv = config_.draft_vocab_size;
  const auto eps = static_cast<float>(l.rms_norm_eps);
  const int64_t n = p.n;
  const int32_t m = p.m;
  cudaStream_t st = options_.stream;
  auto* table = table_.as<__nv_bfloat16>();
  auto* e = e_.as<__nv_bfloat16>();
  auto* hin = hin_.as<__nv_bfloat16>();
  auto* resid = resid_.as<__nv_bfloat16>();
  auto* hb = h_.as<__nv_bfloat16>();
  auto* cat = cat_.as<__nv_bfloat16>();
  auto* qkv = qkv_.as<__nv_bfloat16>();
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::EmbeddingGather(p.tokens, n, w_.embed, 0, l.vocab_size, h, e, st),
             "EmbeddingGather (tokens)"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::EmbeddingGather(p.hidden, n, table, 0,
                                      pool_rows_ + 2 * int64_t{max_logit_rows_}, h, hin, st),
             "EmbeddingGather (hidden inputs)"));
  SPECD_RETURN_IF_ERROR(Launch(kernels::RmsNorm(e, w_.input_norm, n, h, eps, e, st), "RmsNorm"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::RmsNorm(hin, w_.hidden_norm, n, h, eps, hb, st), "RmsNorm (hidden)"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpy2DAsync(cat, size_t(4 * h), e, size_t(2 * h), size_t(2 * h), size_t(n),
                                    cudaMemcpyDeviceToDevice, st),
                  "EAGLE-3 head: [embedding, hidden]"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpy2DAsync(Offset(cat, h), size_t(4 * h), hb, size_t(2 * h), size_t(2 * h),
                                    size_t(n), cudaMemcpyDeviceToDevice, st),
                  "EAGLE-3 head: [embedding, hidden]"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(resid, config_.norm_before_residual ? hb : hin, size_t(n * h * 2),
                                  cudaMemcpyDeviceToDevice, st),
                  "EAGLE-3 head: residual"));
  SPECD_RETURN_IF_ERROR(Gemm(cat, 2 * h, w_.qkv, n, qw, 2 * h, qkv, qw, false));
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::RopeAndWriteKvCache(p.positions, n, qkv, qw, Offset(qkv, q), qw,
                                   Offset(qkv, q + kvs), qw, l.head_dim, rope_.as<float>(), nullptr,
                                   nullptr, eps, p.slots, shape_, k_cache_, v_cache_, st),
      "RopeAndWriteKvCache"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::PagedPrefillAttention(qkv, qw, k_cache_, v_cache_, p.tables, p.table_stride,
                                            p.cu_q_lens, p.seq_lens, p.num_groups, n, p.max_q_len,
                                            shape_, attn_.as<__nv_bfloat16>(), q, workspace_.as(),
                                            workspace_.bytes(), st, p.tree),
             "PagedPrefillAttention"));
  SPECD_RETURN_IF_ERROR(Gemm(attn_.as<__nv_bfloat16>(), q, w_.o, n, h, q, hb, h, false));
  SPECD_RETURN_IF_ERROR(Launch(kernels::FusedAddRmsNorm(hb, resid, w_.post_norm, n, h, eps, hb, st),
                               "FusedAddRmsNorm"));
  SPECD_RETURN_IF_ERROR(Gemm(hb, h, w_.gate_up, n, 2 * inter, h, gate_up_.as(), 2 * inter, false));
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::SiluAndMul(gate_up_.as<__nv_bfloat16>(), n, inter, act_.as<__nv_bfloat16>(), st),
      "SiluAndMul"));
  SPECD_RETURN_IF_ERROR(Gemm(act_.as<__nv_bfloat16>(), inter, w_.down, n, h, inter, hb, h, false));
  // resid becomes the prenorm output, hb its final norm.
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::FusedAddRmsNorm(hb, resid, w_.norm, n, h, eps, hb, st), "FusedAddRmsNorm"));
  if (m == 0) return absl::OkStatus();
  const int32_t* rows_dev = p.rows;
  // The next pass's hidden inputs: the prenorm rows of the rows that draw.
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::EmbeddingGather(rows_dev, m, resid, 0, n, h, Offset(table, p.prenorm_dst * h), st),
      "EmbeddingGather (prenorm rows)"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::EmbeddingGather(rows_dev, m, hb, 0, n, h, gathered_.as<__nv_bfloat16>(), st),
             "EmbeddingGather (logits rows)"));
  return Gemm(gathered_.as<__nv_bfloat16>(), h, w_.lm_head, m, dv, h,
              logits_.as<float>() + int64_t{p.logits_base} * dv, dv, true);
}

absl::Status CudaEagle3Compute::Forward(std::span<const Row> rows,
                                        std::span<const uint8_t> host_logits,
                                        std::vector<int32_t>* ids, std::vector<float>* logits) {
  ids->clear();
  logits->clear();
  int64_t m = 0;
  for (const Row& r : rows) m += r.logits ? 1 : 0;
  if (m > max_logit_rows_ || static_cast<int64_t>(host_logits.size()) != m) {
    return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: ", m, " rows draw (at most ",
                                                   max_logit_rows_, ") with ", host_logits.size(),
                                                   " host-logits flags"));
  }
  if (rows.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const int64_t dv = config_.draft_vocab_size;
  const int64_t vocab = config_.layer.vocab_size;
  bool any_host = false;
  for (uint8_t f : host_logits) any_host = any_host || f != 0;
  ready_k_ = 0;
  if (!any_host && m == static_cast<int64_t>(rows.size())) {
    bool ran = false;
    SPECD_RETURN_IF_ERROR(RunStepGraph(rows, &ran));
    last_logit_rows_ = static_cast<int32_t>(m);
    if (ran) {
      for (int64_t k = 0; k < m; ++k) ids->push_back(d2t_[ids_host_.as<int32_t>()[k]]);
      return absl::OkStatus();
    }
  }
  last_logit_rows_ = static_cast<int32_t>(m);
  int32_t done = 0;
  for (size_t begin = 0; begin < rows.size(); begin += max_rows_) {
    const size_t end = std::min(rows.size(), begin + static_cast<size_t>(max_rows_));
    int32_t count = 0;
    SPECD_RETURN_IF_ERROR(RunPiece(rows, begin, end, done, &count));
    done += count;
    // The arena's staging is refilled by the next piece.
    if (end < rows.size()) {
      SPECD_RETURN_IF_ERROR(
          cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head pass"));
    }
  }
  prenorm_half_ = 1 - prenorm_half_;
  cudaStream_t st = options_.stream;
  if (m > 0) {
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::ArgmaxRows(logits_.as<float>(), dv, static_cast<int32_t>(m),
                                   static_cast<int32_t>(dv), ids_.as<int32_t>(), st),
               "ArgmaxRows"));
    SPECD_RETURN_IF_ERROR(cuda::Check(
        cudaMemcpyAsync(ids_host_.as(), ids_.as(), size_t(m) * 4, cudaMemcpyDeviceToHost, st),
        "EAGLE-3 head: ids"));
    if (any_host) {
      SPECD_RETURN_IF_ERROR(
          cuda::Check(cudaMemcpyAsync(logits_host_.as(), logits_.as(), size_t(m * dv * 4),
                                      cudaMemcpyDeviceToHost, st),
                      "EAGLE-3 head: logits"));
    }
  }
  SPECD_RETURN_IF_ERROR(PrefetchForForward(static_cast<int32_t>(m)));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), "EAGLE-3 head pass"));
  for (int64_t k = 0; k < m; ++k) {
    ids->push_back(d2t_[ids_host_.as<int32_t>()[k]]);
    if (!host_logits[k]) continue;
    const size_t at = logits->size();
    logits->resize(at + vocab, -std::numeric_limits<float>::infinity());
    const float* src = logits_host_.as<float>() + k * dv;
    for (int64_t d = 0; d < dv; ++d) (*logits)[at + d2t_[d]] = src[d];
  }
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::EnqueueCandidates(int32_t k, int32_t m) {
  const auto dv = static_cast<int32_t>(config_.draft_vocab_size);
  const size_t n = static_cast<size_t>(m) * k;
  cudaStream_t st = options_.stream;
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::TopKRows(logits_.as<float>(), dv, m, dv, k, cand_ids_.as<int32_t>(),
                               topk_workspace_.as(), topk_workspace_.bytes(), st),
             "TopKRows (tree candidates)"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::LogSoftmaxAt(logits_.as<float>(), dv, m, dv, cand_ids_.as<int32_t>(), k,
                                   cand_logprobs_.as<float>(), st),
             "LogSoftmaxAt (tree candidates)"));
  auto* host_ids = cand_host_.as<int32_t>();
  auto* host_lp = reinterpret_cast<float*>(host_ids + n);
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(host_ids, cand_ids_.as(), n * 4, cudaMemcpyDeviceToHost, st),
                  "EAGLE-3 head: candidates"));
  return cuda::Check(
      cudaMemcpyAsync(host_lp, cand_logprobs_.as(), n * 4, cudaMemcpyDeviceToHost, st),
      "EAGLE-3 head: candidates");
}

void CudaEagle3Compute::CollectCandidates(int32_t k, int32_t m, std::vector<int32_t>* ids,
                                          std::vector<float>* logprobs) const {
  const size_t n = static_cast<size_t>(m) * k;
  const auto* host_ids = cand_host_.as<int32_t>();
  const auto* host_lp = reinterpret_cast<const float*>(host_ids + n);
  for (size_t i = 0; i < n; ++i) ids->push_back(d2t_[host_ids[i]]);
  logprobs->insert(logprobs->end(), host_lp, host_lp + n);
}

absl::Status CudaEagle3Compute::PrefetchForForward(int32_t m) {
  if (prefetch_k_ < 1 || prefetch_k_ > kernels::kMaxTopK || m == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(EnqueueCandidates(prefetch_k_, m));
  ready_k_ = prefetch_k_;
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::TopCandidates(int32_t k, std::vector<int32_t>* ids,
                                              std::vector<float>* logprobs) {
  const int32_t m = last_logit_rows_;
  if (k < 1 || k > kernels::kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: ", k, " candidates a row"));
  }
  if (m == 0) return absl::OkStatus();
  if (k == ready_k_) {  // the Forward ranked them already
    ready_k_ = 0;
    CollectCandidates(k, m, ids, logprobs);
    return absl::OkStatus();
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(EnqueueCandidates(k, m));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head candidates"));
  CollectCandidates(k, m, ids, logprobs);
  return absl::OkStatus();
}

}  // namespace specd
