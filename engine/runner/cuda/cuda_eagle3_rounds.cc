// CudaEagle3Compute's round graphs (cuda_eagle3.h): a whole greedy round (the catch-up and the
// draft steps after it) in one captured graph, for the in-process head (DraftRound) and, ranking
// every step's candidates and keeping every step's prenorm row, for SSD's speculator
// (DraftRankedRound).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/runner/cuda/cuda_eagle3.h"
#include "engine/runner/cuda/cuda_eagle3_util.h"
#include "kernels/cuda/draft_vocab.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/sampling.h"

namespace specd {

using eagle3_cuda::Launch;
using eagle3_cuda::Offset;
using eagle3_cuda::ReplayOrCapture;
using eagle3_cuda::RoundGraphsEnabled;

// The catch-up pass of a round graph over round_in_: sequence g's rows (rows[first[g]] up to the
// next group's first) checked and staged, padded to `bucket` sequences of `per_seq` rows, and
// their upload queued; its prenorm rows go to half catch_up_half.
absl::StatusOr<CudaEagle3Compute::Pass> CudaEagle3Compute::StageRoundInputs(
    std::span<const Row> rows, std::span<const size_t> first, int32_t bucket, int32_t per_seq,
    int32_t catch_up_half) {
  const auto num = static_cast<int32_t>(first.size());
  // The catch-up's inputs: sequence g's rows at g * per_seq ..., front-padded by copies of its
  // first row at the positions before it (slot -1: no KV written; the verification attention
  // needs each run's queries at its last positions); a padding sequence's rows read the scratch
  // block, as the chain's padding does.
  const RoundLayout lay(max_rows_, options_.max_seqs);
  auto* in = round_in_host_.as<uint8_t>();
  auto* tokens = reinterpret_cast<int32_t*>(in + lay.tokens);
  auto* positions = reinterpret_cast<int32_t*>(in + lay.positions);
  auto* hidden = reinterpret_cast<int32_t*>(in + lay.hidden);
  auto* seq_lens = reinterpret_cast<int32_t*>(in + lay.seq_lens);
  auto* cu = reinterpret_cast<int32_t*>(in + lay.cu);
  auto* logits_rows = reinterpret_cast<int32_t*>(in + lay.logits_rows);
  auto* slots = reinterpret_cast<int64_t*>(in + lay.slots);
  const int32_t bs = options_.block_size;
  const int64_t read_base = pool_rows_ + int64_t{prenorm_half_} * max_logit_rows_;
  for (int32_t s = 0; s < bucket; ++s) {
    const int32_t base = s * per_seq;
    cu[s] = base;
    logits_rows[s] = base + per_seq - 1;
    if (s >= num) {
      seq_lens[s] = per_seq;
      for (int32_t j = 0; j < per_seq; ++j) {
        tokens[base + j] = 0;
        positions[base + j] = j;
        hidden[base + j] = 0;
        slots[base + j] = -1;
      }
      continue;
    }
    const size_t begin = first[s], end = s + 1 < num ? first[s + 1] : rows.size();
    const auto pad = per_seq - static_cast<int32_t>(end - begin);
    seq_lens[s] = rows[end - 1].position + 1;
    for (int32_t j = 0; j < per_seq; ++j) {
      const Row& r = rows[begin + std::max(0, j - pad)];
      const int32_t pos = rows[end - 1].position - (per_seq - 1 - j);
      const int64_t block = pos / bs;
      if (pos >= options_.max_model_len || block >= static_cast<int64_t>(r.block_table.size()) ||
          r.token < 0 || r.token >= config_.layer.vocab_size ||
          (r.hidden >= 0 ? r.hidden >= pool_rows_ : -int64_t{r.hidden} > max_logit_rows_)) {
        return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: catch-up row (position ",
                                                       r.position, ", token ", r.token, ", hidden ",
                                                       r.hidden, ") is malformed"));
      }
      tokens[base + j] = r.token;
      positions[base + j] = pos;
      hidden[base + j] = r.hidden >= 0 ? r.hidden : static_cast<int32_t>(read_base - r.hidden - 1);
      slots[base + j] = j < pad ? -1 : int64_t{r.block_table[block]} * bs + pos % bs;
    }
  }
  cu[bucket] = bucket * per_seq;
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(round_in_.as(), in, lay.bytes, cudaMemcpyHostToDevice, options_.stream),
      "EAGLE-3 round inputs"));
  const auto* dev = round_in_.as<uint8_t>();
  Pass p;
  p.tokens = reinterpret_cast<const int32_t*>(dev + lay.tokens);
  p.positions = reinterpret_cast<const int32_t*>(dev + lay.positions);
  p.hidden = reinterpret_cast<const int32_t*>(dev + lay.hidden);
  p.seq_lens = reinterpret_cast<const int32_t*>(dev + lay.seq_lens);
  p.cu_q_lens = reinterpret_cast<const int32_t*>(dev + lay.cu);
  p.rows = reinterpret_cast<const int32_t*>(dev + lay.logits_rows);
  p.slots = reinterpret_cast<const int64_t*>(dev + lay.slots);
  p.tables = graph_tables_.as<int32_t>();
  p.table_stride = max_blocks_per_seq_;
  p.num_groups = bucket;
  p.max_q_len = per_seq;
  p.n = int64_t{bucket} * per_seq;
  p.m = bucket;
  p.prenorm_dst = pool_rows_ + int64_t{catch_up_half} * max_logit_rows_;
  return p;
}

absl::Status CudaEagle3Compute::DraftRound(std::span<const Row> rows, int32_t steps,
                                           const ChainDraws* draws, std::vector<int32_t>* ids,
                                           bool* ran) {
  int32_t num = 0;
  return RunRound(rows, steps, draws, 0, ids, &num, ran);
}

absl::Status CudaEagle3Compute::DraftRankedRound(std::span<const Row> rows, int32_t steps,
                                                 int32_t k, std::span<const int32_t> keep_rows,
                                                 RankedRound* out, bool* ran) {
  *ran = false;
  if (k < 1 || k > kernels::kMaxTopK || steps < 1 || steps + 1 > kMaxChainSteps) {
    return absl::OkStatus();
  }
  int32_t seqs = 0;
  for (size_t i = 0; i < rows.size(); ++i) seqs += i == 0 || rows[i].seq != rows[i - 1].seq;
  if (seqs > kMaxRankedSeqs || seqs > max_logit_rows_ ||
      keep_rows.size() != static_cast<size_t>(steps + 1) * seqs) {
    return absl::OkStatus();
  }
  for (int32_t r : keep_rows) {
    if (r < 0 || r >= pool_rows_) {
      return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: keep row ", r));
    }
  }
  int32_t num = 0;
  SPECD_RETURN_IF_ERROR(RunRound(rows, steps, nullptr, k, &out->ids, &num, ran));
  if (!*ran) return absl::OkStatus();
  // Each step's prenorm rows from the keep rows to the caller's pool rows, queued after the
  // graph (kernels::CopyRows, kMaxRowCopies a launch; later passes read them in stream order).
  const int64_t h = config_.layer.hidden_size;
  auto* table = table_.as<__nv_bfloat16>();
  kernels::RowCopies copies;
  for (int32_t s = 0; s <= steps; ++s) {
    for (int32_t i = 0; i < num; ++i) {
      const int64_t from = keep_base_ + int64_t{s} * kMaxRankedSeqs + i;
      const int32_t to = keep_rows[static_cast<size_t>(s) * num + i];
      if (h % 8 != 0) {  // not 16-byte columns (no head shipped): one copy each
        SPECD_RETURN_IF_ERROR(cuda::Check(
            cudaMemcpyAsync(Offset(table, int64_t{to} * h), Offset(table, from * h),
                            static_cast<size_t>(h) * 2, cudaMemcpyDeviceToDevice, options_.stream),
            "EAGLE-3 head: kept rows"));
        continue;
      }
      copies.src[copies.count] = static_cast<int32_t>(from);
      copies.dst[copies.count] = to;
      if (++copies.count == kernels::kMaxRowCopies) {
        SPECD_RETURN_IF_ERROR(cuda::Check(kernels::CopyRows(copies, table, h, options_.stream),
                                          "EAGLE-3 head: kept rows"));
        copies.count = 0;
      }
    }
  }
  SPECD_RETURN_IF_ERROR(
      cuda::Check(kernels::CopyRows(copies, table, h, options_.stream), "EAGLE-3 head: kept rows"));
  // The candidates, as TopCandidates gives them (target ids, best first), [steps + 1, num, k].
  const int64_t per_step = int64_t{kMaxRankedSeqs} * k;
  const auto* host_ids = ranked_host_.as<int32_t>();
  const auto* host_lp = reinterpret_cast<const float*>(host_ids + (steps + 1) * per_step);
  out->candidates.clear();
  out->logprobs.clear();
  for (int32_t s = 0; s <= steps; ++s) {
    for (int64_t x = s * per_step; x < s * per_step + int64_t{num} * k; ++x) {
      out->candidates.push_back(d2t_[host_ids[x]]);
      out->logprobs.push_back(host_lp[x]);
    }
  }
  ++ranked_rounds_;
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::RunRound(std::span<const Row> rows, int32_t steps,
                                         const ChainDraws* draws, int32_t ranked_k,
                                         std::vector<int32_t>* ids, int32_t* num_out, bool* ran) {
  *ran = false;
  if (!RoundGraphsEnabled() || options_.eager || k_cache_ == nullptr || rows.empty() || steps < 1 ||
      steps >= kMaxChainSteps) {
    return absl::OkStatus();
  }
  // Groups: each sequence's rows, consecutive positions, chain rows, only the last drawing.
  std::vector<size_t> first;
  int32_t longest = 1;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (r.tree != nullptr || (r.slot >= 0 && r.slot != r.position)) return absl::OkStatus();
    if (i == 0 || r.seq != rows[i - 1].seq) {
      if (i > 0 && !rows[i - 1].logits) return absl::OkStatus();
      first.push_back(i);
    } else if (rows[i - 1].logits || r.position != rows[i - 1].position + 1) {
      return absl::OkStatus();
    }
    longest = std::max(longest, static_cast<int32_t>(i - first.back() + 1));
  }
  if (!rows.back().logits) return absl::OkStatus();
  const auto num = static_cast<int32_t>(first.size());
  int32_t per_seq = 1;  // catch-up rows per sequence in the graph
  while (per_seq < longest) per_seq *= 2;
  if (num > options_.max_seqs || per_seq > kMaxRoundRows || per_seq > options_.block_size) {
    return absl::OkStatus();
  }
  const int32_t bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), num);
  if (int64_t{bucket} * per_seq > max_rows_) return absl::OkStatus();
  if (ranked_k > 0 && (bucket > kMaxRankedSeqs || bucket > max_logit_rows_)) {
    return absl::OkStatus();
  }
  for (int32_t g = 0; g < num; ++g) {
    const size_t end = g + 1 < num ? first[g + 1] : rows.size();
    const auto pad = per_seq - static_cast<int32_t>(end - first[g]);
    if (rows[first[g]].position < pad) return absl::OkStatus();  // no earlier positions to pad
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  if (draws != nullptr) {
    if (draws->first_slot != 0) return absl::OkStatus();  // round graphs draw from slot 0 on
    SPECD_ASSIGN_OR_RETURN(const bool staged, StageDraws(*draws, num, bucket, steps + 1));
    if (!staged) return absl::OkStatus();
  }
  // The chain's inputs: sequence g's row at its last row's position + 1, reading the prenorm of
  // the catch-up's logits row g (the half the catch-up writes), its token the catch-up's argmax.
  const int32_t catch_up_half = 1 - prenorm_half_;
  round_chain_rows_.clear();
  for (int32_t g = 0; g < num; ++g) {
    const size_t last = (g + 1 < num ? first[g + 1] : rows.size()) - 1;
    Row c;
    c.seq = rows[last].seq;
    c.position = rows[last].position + 1;
    c.hidden = -g - 1;
    c.logits = true;
    c.block_table = rows[last].block_table;
    round_chain_rows_.push_back(c);
  }
  const GraphLayout g(options_.max_seqs, steps);
  SPECD_RETURN_IF_ERROR(StageGraphInputs(round_chain_rows_, bucket, steps, g, catch_up_half));
  SPECD_ASSIGN_OR_RETURN(const Pass p,
                         StageRoundInputs(rows, first, bucket, per_seq, catch_up_half));
  cudaStream_t st = options_.stream;
  // The catch-up writes half catch_up_half; chain step s writes the other half when s is even.
  auto step_half = [&](int32_t s) { return s % 2 == 0 ? 1 - catch_up_half : catch_up_half; };
  // A ranked round's step s (0: the catch-up): its rows' k best and log-probabilities, and its
  // prenorm rows (written at `prenorm_dst`) kept.
  const auto dv = static_cast<int32_t>(config_.draft_vocab_size);
  const int64_t per_step = int64_t{kMaxRankedSeqs} * std::max(1, ranked_k);
  auto* ranked_ids = ranked_.as<int32_t>();
  auto* ranked_lp = reinterpret_cast<float*>(ranked_ids + (steps + 1) * per_step);
  const int64_t h = config_.layer.hidden_size;
  auto rank = [&](int32_t s, int64_t prenorm_dst) -> absl::Status {
    if (ranked_k == 0) return absl::OkStatus();
    SPECD_RETURN_IF_ERROR(Launch(
        kernels::TopKRows(logits_.as<float>(), dv, bucket, dv, ranked_k, ranked_ids + s * per_step,
                          topk_workspace_.as(), topk_workspace_.bytes(), st),
        "TopKRows (ranked round)"));
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::LogSoftmaxAt(logits_.as<float>(), dv, bucket, dv, ranked_ids + s * per_step,
                                     ranked_k, ranked_lp + s * per_step, st),
               "LogSoftmaxAt (ranked round)"));
    auto* table = table_.as<__nv_bfloat16>();
    return cuda::Check(
        cudaMemcpyAsync(Offset(table, (keep_base_ + s * kMaxRankedSeqs) * h),
                        Offset(table, prenorm_dst * h), static_cast<size_t>(bucket * h * 2),
                        cudaMemcpyDeviceToDevice, st),
        "EAGLE-3 head: ranked round's prenorm rows");
  };
  auto enqueue = [&]() -> absl::Status {
    SPECD_RETURN_IF_ERROR(Body(p));
    SPECD_RETURN_IF_ERROR(PickIds(bucket, g.seqs, 0, draws, 0));
    SPECD_RETURN_IF_ERROR(rank(0, p.prenorm_dst));
    for (int32_t s = 0; s < steps; ++s) {
      const Pass step = GraphPass(g, bucket, s, step_half(s), /*after_round=*/true);
      SPECD_RETURN_IF_ERROR(Body(step));
      SPECD_RETURN_IF_ERROR(PickIds(bucket, g.seqs, s + 1, draws, s + 1));
      SPECD_RETURN_IF_ERROR(rank(s + 1, step.prenorm_dst));
    }
    if (ranked_k > 0) {
      SPECD_RETURN_IF_ERROR(
          cuda::Check(cudaMemcpyAsync(ranked_host_.as(), ranked_.as(),
                                      size_t(steps + 1) * per_step * 8, cudaMemcpyDeviceToHost, st),
                      "EAGLE-3 head: ranked round's candidates"));
    }
    return cuda::Check(cudaMemcpyAsync(chain_ids_host_.as(), chain_ids_.as(),
                                       size_t(steps + 1) * g.seqs * 4, cudaMemcpyDeviceToHost, st),
                       "EAGLE-3 head: round ids");
  };
  if (ranked_k > 0) {
    SPECD_RETURN_IF_ERROR(ReplayOrCapture(
        ranked_round_graphs_, std::make_tuple(bucket, per_seq, steps, catch_up_half, ranked_k), st,
        enqueue, "EAGLE-3 ranked round graph"));
  } else if (draws == nullptr) {
    SPECD_RETURN_IF_ERROR(ReplayOrCapture(round_graphs_,
                                          std::make_tuple(bucket, per_seq, steps, catch_up_half),
                                          st, enqueue, "EAGLE-3 round graph"));
  } else {
    SPECD_RETURN_IF_ERROR(
        ReplayOrCapture(sampled_round_graphs_,
                        std::make_tuple(bucket, per_seq, steps, catch_up_half, draws->slot_stride),
                        st, enqueue, "EAGLE-3 sampled round graph"));
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), "EAGLE-3 draft round"));
  ids->clear();
  const int32_t* host = chain_ids_host_.as<int32_t>();
  for (int32_t s = 0; s <= steps; ++s) {
    ids->insert(ids->end(), host + int64_t{s} * g.seqs, host + int64_t{s} * g.seqs + num);
  }
  prenorm_half_ = step_half(steps - 1);
  last_logit_rows_ = num;
  ready_k_ = 0;
  ++(draws == nullptr ? rounds_in_graph_ : sampled_rounds_in_graph_);
  *num_out = num;
  *ran = true;
  return absl::OkStatus();
}

}  // namespace specd
