// CudaEagle3Compute's captured graphs and device draws (cuda_eagle3.h): the one-step graph of a
// draft step (one row per sequence), the chained graph of a round's greedy draft steps after the
// first, and the sampled draws handed to the target runner (the round graphs of a whole round:
// cuda_eagle3_rounds.cc).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <string_view>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/runner/cuda/cuda_eagle3.h"
#include "engine/runner/cuda/cuda_eagle3_util.h"
#include "kernels/cuda/draft_vocab.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/sampling.h"

namespace specd {
namespace {

using eagle3_cuda::Launch;
using eagle3_cuda::ReplayOrCapture;

size_t Align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// SPECD_EAGLE3_SAMPLED_GRAPHS=0 turns the sampled chain and round graphs off (sampled rounds run a
// pass and a draw per step, as before them), for the same kind of side-by-side measurement.
bool SampledGraphsEnabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("SPECD_EAGLE3_SAMPLED_GRAPHS");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

}  // namespace

// The inputs of a graph of `steps` draft steps over `seqs` rows (int32 unless said): the first
// step's tokens [seqs] (later steps read the previous step's mapped ids), each step's positions,
// hidden rows and seq_lens [steps, seqs] and slots [steps, seqs] int64, and the rows' shared
// logits rows [seqs] (0, 1, ...) and cu_q_lens [seqs + 1].
CudaEagle3Compute::GraphLayout::GraphLayout(int64_t seqs_, int32_t steps) : seqs(seqs_) {
  const auto n = static_cast<size_t>(seqs_), k = static_cast<size_t>(steps);
  tokens = 0;
  positions = Align16(4 * n);
  hidden = positions + Align16(4 * n * k);
  seq_lens = hidden + Align16(4 * n * k);
  rows = seq_lens + Align16(4 * n * k);
  cu = rows + Align16(4 * n);
  slots = cu + Align16(4 * (n + 1));
  bytes = slots + 8 * n * k;
}

size_t CudaEagle3Compute::GraphInBytes(int64_t seqs) {
  return GraphLayout(seqs, kMaxChainSteps).bytes;
}

CudaEagle3Compute::RoundLayout::RoundLayout(int64_t rows, int64_t seqs) {
  const auto n = static_cast<size_t>(rows), s = static_cast<size_t>(seqs);
  tokens = 0;
  positions = Align16(4 * n);
  hidden = positions + Align16(4 * n);
  seq_lens = hidden + Align16(4 * n);
  cu = seq_lens + Align16(4 * s);
  logits_rows = cu + Align16(4 * (s + 1));
  slots = logits_rows + Align16(4 * s);
  bytes = slots + 8 * n;
}

CudaEagle3Compute::Pass CudaEagle3Compute::GraphPass(const GraphLayout& g, int32_t bucket,
                                                     int32_t step, int32_t half,
                                                     bool after_round) const {
  const auto* base = graph_in_.as<uint8_t>();
  const int64_t at = int64_t{step} * g.seqs;
  Pass p;
  if (after_round) {
    p.tokens = chain_ids_.as<int32_t>() + at;
  } else {
    p.tokens = step == 0 ? reinterpret_cast<const int32_t*>(base + g.tokens)
                         : chain_ids_.as<int32_t>() + (at - g.seqs);
  }
  p.positions = reinterpret_cast<const int32_t*>(base + g.positions) + at;
  p.hidden = reinterpret_cast<const int32_t*>(base + g.hidden) + at;
  p.seq_lens = reinterpret_cast<const int32_t*>(base + g.seq_lens) + at;
  p.slots = reinterpret_cast<const int64_t*>(base + g.slots) + at;
  p.rows = reinterpret_cast<const int32_t*>(base + g.rows);
  p.cu_q_lens = reinterpret_cast<const int32_t*>(base + g.cu);
  p.tables = graph_tables_.as<int32_t>();
  p.table_stride = max_blocks_per_seq_;
  p.num_groups = bucket;
  p.max_q_len = 1;
  p.n = bucket;
  p.m = bucket;
  p.prenorm_dst = pool_rows_ + int64_t{half} * max_logit_rows_;
  return p;
}

absl::Status CudaEagle3Compute::StageGraphInputs(std::span<const Row> rows, int32_t bucket,
                                                 int32_t steps, const GraphLayout& g,
                                                 int32_t read_half) {
  const auto num = static_cast<int32_t>(rows.size());
  const int32_t bs = options_.block_size;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const int32_t last = r.position + steps - 1;
    const int32_t used = last / bs + 1;
    if (!r.logits || r.tree != nullptr || (r.slot >= 0 && r.slot != r.position) || r.position < 0 ||
        last >= options_.max_model_len || r.token < 0 || r.token >= config_.layer.vocab_size ||
        static_cast<int32_t>(r.block_table.size()) < used ||
        (r.hidden >= 0 ? r.hidden >= pool_rows_ : -int64_t{r.hidden} > max_logit_rows_)) {
      return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: draft row ", i, " (position ",
                                                     r.position, ", token ", r.token, ", hidden ",
                                                     r.hidden, ") is malformed"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (rows[j].seq == r.seq) {
        return absl::InvalidArgumentError(
            absl::StrCat("EAGLE-3 head: two draft rows of sequence ", r.seq));
      }
    }
  }
  auto* in = graph_in_host_.as<uint8_t>();
  auto* tokens = reinterpret_cast<int32_t*>(in + g.tokens);
  auto* positions = reinterpret_cast<int32_t*>(in + g.positions);
  auto* hidden = reinterpret_cast<int32_t*>(in + g.hidden);
  auto* seq_lens = reinterpret_cast<int32_t*>(in + g.seq_lens);
  auto* out_rows = reinterpret_cast<int32_t*>(in + g.rows);
  auto* cu = reinterpret_cast<int32_t*>(in + g.cu);
  auto* slots = reinterpret_cast<int64_t*>(in + g.slots);
  int32_t* tables = graph_tables_host_.as<int32_t>();
  // Step 0 reads half read_half, step s > 0 the half step s - 1 wrote.
  int32_t width = 1;
  cu[0] = 0;
  for (int32_t i = 0; i < bucket; ++i) {
    cu[i + 1] = i + 1;
    out_rows[i] = i;
    tokens[i] = i < num ? rows[i].token : 0;
    int32_t* table = tables + int64_t{i} * max_blocks_per_seq_;
    if (i >= num) table[0] = scratch_block_;
  }
  for (int32_t s = 0; s < steps; ++s) {
    const int64_t at = int64_t{s} * g.seqs;
    const int64_t read_base = pool_rows_ + int64_t{read_half} * max_logit_rows_;
    for (int32_t i = 0; i < bucket; ++i) {
      if (i >= num) {  // padding: writes no KV, reads the scratch block
        positions[at + i] = 0;
        hidden[at + i] = s == 0 ? 0 : static_cast<int32_t>(read_base + i);
        seq_lens[at + i] = 1;
        slots[at + i] = -1;
        continue;
      }
      const Row& r = rows[i];
      const int32_t pos = r.position + s;
      positions[at + i] = pos;
      hidden[at + i] =
          s == 0 ? (r.hidden >= 0 ? r.hidden : static_cast<int32_t>(read_base - r.hidden - 1))
                 : static_cast<int32_t>(read_base + i);
      seq_lens[at + i] = pos + 1;
      slots[at + i] = int64_t{r.block_table[pos / bs]} * bs + pos % bs;
    }
    read_half = 1 - read_half;
  }
  for (int32_t i = 0; i < num; ++i) {
    const int32_t used = (rows[i].position + steps - 1) / bs + 1;
    std::copy_n(rows[i].block_table.begin(), used, tables + int64_t{i} * max_blocks_per_seq_);
    width = std::max(width, used);
  }
  cudaStream_t st = options_.stream;
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(graph_in_.as(), in, g.bytes, cudaMemcpyHostToDevice, st),
                  "EAGLE-3 graph inputs"));
  return cuda::Check(cudaMemcpy2DAsync(graph_tables_.as(), size_t{4} * max_blocks_per_seq_, tables,
                                       size_t{4} * max_blocks_per_seq_, size_t{4} * width,
                                       size_t(bucket), cudaMemcpyHostToDevice, st),
                     "EAGLE-3 graph block tables");
}

absl::Status CudaEagle3Compute::RunStepGraph(std::span<const Row> rows, bool* ran) {
  *ran = false;
  const auto num = static_cast<int32_t>(rows.size());
  if (options_.eager || k_cache_ == nullptr || num > options_.max_seqs) return absl::OkStatus();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].tree != nullptr || (rows[i].slot >= 0 && rows[i].slot != rows[i].position)) {
      return absl::OkStatus();  // tree rows run eagerly, with their masks
    }
    for (size_t j = 0; j < i; ++j) {
      if (rows[j].seq == rows[i].seq) return absl::OkStatus();  // not one row per sequence
    }
  }
  const int32_t bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), num);
  const GraphLayout g(options_.max_seqs, 1);
  SPECD_RETURN_IF_ERROR(StageGraphInputs(rows, bucket, 1, g, prenorm_half_));
  cudaStream_t st = options_.stream;
  const int32_t half = 1 - prenorm_half_;  // the half this pass writes
  const std::pair<int32_t, int32_t> key{bucket, half};
  if (!graphs_.contains(key)) {
    SPECD_RETURN_IF_ERROR(CaptureStepGraph(bucket, half, GraphPass(g, bucket, 0, half)));
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaGraphLaunch(graphs_.at(key), st), "EAGLE-3 graph launch"));
  SPECD_RETURN_IF_ERROR(PrefetchForForward(num));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), "EAGLE-3 draft step"));
  prenorm_half_ = half;
  *ran = true;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> CudaEagle3Compute::CaptureStepGraphs() {
  if (options_.eager || k_cache_ == nullptr) return 0;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const GraphLayout g(options_.max_seqs, 1);
  int32_t captured = 0;
  for (int32_t bucket : buckets_) {
    for (int32_t half : {0, 1}) {
      if (graphs_.contains({bucket, half})) continue;
      // Padding rows only: the warm-up writes no KV and reads the scratch block.
      SPECD_RETURN_IF_ERROR(StageGraphInputs({}, bucket, 1, g, 1 - half));
      SPECD_RETURN_IF_ERROR(CaptureStepGraph(bucket, half, GraphPass(g, bucket, 0, half)));
      ++captured;
    }
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 step graphs"));
  return captured;
}

// The step's kernels, the argmax and the copy of the ids to the host: run once eagerly (cuBLASLt
// chooses its algorithms outside capture; the inputs are the real step's), then captured.
absl::Status CudaEagle3Compute::CaptureStepGraph(int32_t bucket, int32_t half, const Pass& p) {
  cudaStream_t st = options_.stream;
  const auto dv = static_cast<int32_t>(config_.draft_vocab_size);
  auto enqueue = [&]() -> absl::Status {
    SPECD_RETURN_IF_ERROR(Body(p));
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::ArgmaxRows(logits_.as<float>(), dv, bucket, dv, ids_.as<int32_t>(), st),
               "ArgmaxRows"));
    return cuda::Check(
        cudaMemcpyAsync(ids_host_.as(), ids_.as(), size_t(bucket) * 4, cudaMemcpyDeviceToHost, st),
        "EAGLE-3 head: ids");
  };
  SPECD_RETURN_IF_ERROR(enqueue());
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), "EAGLE-3 graph warm-up"));
  SPECD_ASSIGN_OR_RETURN(cudaGraphExec_t exec,
                         cuda::CaptureGraph(st, enqueue, "EAGLE-3 draft-step graph"));
  graphs_[{bucket, half}] = exec;
  return absl::OkStatus();
}

size_t CudaEagle3Compute::DrawUniformsAt() const {
  return Align16(sizeof(kernels::SamplingRow) *
                 static_cast<size_t>(std::max(1, options_.max_seqs)));
}

size_t CudaEagle3Compute::DrawInBytes() const {
  return DrawUniformsAt() + size_t{4} * kMaxChainSteps * std::max(1, options_.max_seqs);
}

absl::StatusOr<bool> CudaEagle3Compute::StageDraws(const ChainDraws& draws, int32_t num,
                                                   int32_t bucket, int32_t num_draws) {
  DeviceDraws* dd = options_.draws;
  if (!SampledGraphsEnabled() || dd == nullptr || draw_in_.bytes() == 0 ||
      static_cast<int32_t>(draws.rows.size()) != num || num_draws < 1 ||
      num_draws > kMaxChainSteps || bucket > dd->max_rows() || bucket > max_logit_rows_ ||
      draws.first_slot < 0 || draws.slot_stride < num_draws) {
    return false;
  }
  // The padding rows draw too (greedy rows): their slots must be reserved as well.
  const int64_t last_slot =
      int64_t{draws.first_slot} + int64_t{bucket - 1} * draws.slot_stride + num_draws - 1;
  if (last_slot >= dd->num_slots()) return false;
  for (const SampleRow& r : draws.rows) {
    const SamplingParams& p = *r.params;
    if (p.greedy() || p.has_penalties() || !r.banned.empty()) {
      return absl::InvalidArgumentError(
          "EAGLE-3 head: a sampled graph takes sampled rows without penalties or bans");
    }
  }
  if (draws_storage_ != dd->storage()) {  // the slots moved: graphs copying into them are stale
    for (auto* graphs : {&sampled_chain_graphs_, &sampled_round_graphs_}) {
      for (auto& [key, exec] : *graphs) cudaGraphExecDestroy(exec);
      graphs->clear();
    }
    draws_storage_ = dd->storage();
  }
  auto* in = draw_in_host_.as<uint8_t>();
  auto* sampling = reinterpret_cast<kernels::SamplingRow*>(in);
  auto* uniforms = reinterpret_cast<float*>(in + DrawUniformsAt());
  const int64_t seqs = std::max(1, options_.max_seqs);
  for (int32_t i = 0; i < bucket; ++i) {
    if (i >= num) {  // padding: a one-hot row at its argmax
      sampling[i] = kernels::SamplingRow{0.0f, 0, 1.0f, 0.0f, 0, 0};
      for (int32_t d = 0; d < num_draws; ++d) uniforms[d * seqs + i] = 0.0f;
      continue;
    }
    const SampleRow& r = draws.rows[i];
    const SamplingParams& p = *r.params;
    // As GpuSampler packs a sampled row (ProcessedProbs reads neither seed nor offset).
    sampling[i] = kernels::SamplingRow{p.temperature, std::max(0, p.top_k),
                                       p.top_p,       p.min_p,
                                       r.seed,        static_cast<uint64_t>(r.num_generated)};
    for (int32_t d = 0; d < num_draws; ++d) {
      uniforms[d * seqs + i] =
          SpeculationUniform(r.seed, r.num_generated + d, SpeculationDraw::kDraft);
    }
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(draw_in_.as(), in, DrawInBytes(), cudaMemcpyHostToDevice, options_.stream),
      "EAGLE-3 sampled graph inputs"));
  return true;
}

absl::Status CudaEagle3Compute::PickIds(int32_t bucket, int64_t seqs, int32_t row,
                                        const ChainDraws* draws, int32_t draw) {
  cudaStream_t st = options_.stream;
  const auto dv = static_cast<int32_t>(config_.draft_vocab_size);
  int32_t* out = chain_ids_.as<int32_t>() + int64_t{row} * seqs;
  if (draws == nullptr) {
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::ArgmaxRows(logits_.as<float>(), dv, bucket, dv, ids_.as<int32_t>(), st),
               "ArgmaxRows"));
    return Launch(kernels::MapIds(ids_.as<int32_t>(), bucket, d2t_dev_.as<int32_t>(), dv, out, st),
                  "MapIds");
  }
  const int32_t vocab = config_.layer.vocab_size;
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::ExpandColumns(logits_.as<float>(), dv, bucket, dv, d2t_dev_.as<int32_t>(),
                                    options_.draws->rows(), vocab, vocab,
                                    -std::numeric_limits<float>::infinity(), st),
             "ExpandColumns"));
  const auto* in = draw_in_.as<uint8_t>();
  return options_.draws->Enqueue(
      bucket, reinterpret_cast<const kernels::SamplingRow*>(in),
      reinterpret_cast<const float*>(in + DrawUniformsAt()) + int64_t{draw} * seqs,
      draws->first_slot + draw, draws->slot_stride, out, ids_.as<int32_t>());
}

absl::Status CudaEagle3Compute::DraftChain(std::span<const Row> rows, int32_t steps,
                                           const ChainDraws* draws, std::vector<int32_t>* ids,
                                           bool* ran) {
  *ran = false;
  const auto num = static_cast<int32_t>(rows.size());
  if (options_.eager || k_cache_ == nullptr || num == 0 || num > options_.max_seqs || steps < 1 ||
      steps > kMaxChainSteps) {
    if (draws != nullptr) return absl::OkStatus();                     // sampled: by the caller
    return Eagle3Compute::DraftChain(rows, steps, nullptr, ids, ran);  // a Forward per step
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const int32_t bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), num);
  if (draws != nullptr) {
    SPECD_ASSIGN_OR_RETURN(const bool staged, StageDraws(*draws, num, bucket, steps));
    if (!staged) return absl::OkStatus();
  }
  const GraphLayout g(options_.max_seqs, steps);
  SPECD_RETURN_IF_ERROR(StageGraphInputs(rows, bucket, steps, g, prenorm_half_));
  cudaStream_t st = options_.stream;
  const int32_t first_half = 1 - prenorm_half_;  // the half step 0 writes
  // Step s writes half first_half, 1 - first_half, ... and draws the next step's tokens.
  auto enqueue = [&]() -> absl::Status {
    for (int32_t s = 0; s < steps; ++s) {
      const int32_t half = s % 2 == 0 ? first_half : 1 - first_half;
      SPECD_RETURN_IF_ERROR(Body(GraphPass(g, bucket, s, half)));
      SPECD_RETURN_IF_ERROR(PickIds(bucket, g.seqs, s, draws, s));
    }
    return cuda::Check(cudaMemcpyAsync(chain_ids_host_.as(), chain_ids_.as(),
                                       size_t(steps) * g.seqs * 4, cudaMemcpyDeviceToHost, st),
                       "EAGLE-3 head: chain ids");
  };
  if (draws == nullptr) {
    SPECD_RETURN_IF_ERROR(ReplayOrCapture(chain_graphs_, std::make_tuple(bucket, steps, first_half),
                                          st, enqueue, "EAGLE-3 chained draft graph"));
  } else {
    SPECD_RETURN_IF_ERROR(ReplayOrCapture(
        sampled_chain_graphs_,
        std::make_tuple(bucket, steps, first_half, draws->first_slot, draws->slot_stride), st,
        enqueue, "EAGLE-3 sampled chained draft graph"));
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), "EAGLE-3 draft chain"));
  ids->clear();
  const int32_t* host = chain_ids_host_.as<int32_t>();
  for (int32_t s = 0; s < steps; ++s) {
    ids->insert(ids->end(), host + int64_t{s} * g.seqs, host + int64_t{s} * g.seqs + num);
  }
  prenorm_half_ = (steps - 1) % 2 == 0 ? first_half : 1 - first_half;
  last_logit_rows_ = num;
  ready_k_ = 0;
  ++(draws == nullptr ? chains_in_graph_ : sampled_chains_in_graph_);
  *ran = true;
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::ReserveDrawSlots(int32_t seqs, int32_t per_seq) {
  if (options_.draws == nullptr) return Eagle3Compute::ReserveDrawSlots(seqs, per_seq);
  if (seqs < 0 || per_seq < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EAGLE-3 head: ", seqs, " x ", per_seq, " draw slots"));
  }
  // The graphs' padding rows draw into slots of their own.
  const auto it = std::lower_bound(buckets_.begin(), buckets_.end(), seqs);
  const int64_t padded = it != buckets_.end() ? *it : seqs;
  const int64_t n = padded * per_seq;
  if (n > INT32_MAX) return absl::InvalidArgumentError("EAGLE-3 head: too many draw slots");
  return options_.draws->Reserve(static_cast<int32_t>(n));
}

const float* CudaEagle3Compute::draw_slot(int32_t slot) const {
  return options_.draws != nullptr ? options_.draws->slot(slot) : nullptr;
}

absl::Status CudaEagle3Compute::DrawRows(std::span<const int32_t> logits_rows,
                                         std::span<const SampleRow> rows,
                                         std::span<const int32_t> slots,
                                         std::vector<int32_t>* ids) {
  ids->clear();
  if (options_.draws == nullptr) return Eagle3Compute::DrawRows(logits_rows, rows, slots, ids);
  const auto n = static_cast<int32_t>(rows.size());
  if (logits_rows.size() != rows.size() || slots.size() != rows.size() ||
      n > options_.draws->max_rows()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EAGLE-3 head: ", logits_rows.size(), " logits rows, ", rows.size(), " sample rows and ",
        slots.size(), " slots to draw (at most ", options_.draws->max_rows(), ")"));
  }
  for (int32_t r : logits_rows) {
    if (r < 0 || r >= last_logit_rows_) {
      return absl::InvalidArgumentError(
          absl::StrCat("EAGLE-3 head: draw from logits row ", r, " of ", last_logit_rows_));
    }
  }
  if (n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const auto dv = static_cast<int32_t>(config_.draft_vocab_size);
  const int32_t vocab = config_.layer.vocab_size;
  float* dst = options_.draws->rows();
  // One launch per run of consecutive logits rows.
  for (int32_t i = 0; i < n;) {
    int32_t j = i + 1;
    while (j < n && logits_rows[j] == logits_rows[j - 1] + 1) ++j;
    SPECD_RETURN_IF_ERROR(Launch(
        kernels::ExpandColumns(logits_.as<float>() + int64_t{logits_rows[i]} * dv, dv, j - i, dv,
                               d2t_dev_.as<int32_t>(), dst + int64_t{i} * vocab, vocab, vocab,
                               -std::numeric_limits<float>::infinity(), options_.stream),
        "ExpandColumns"));
    i = j;
  }
  return options_.draws->Draw(rows, slots, ids);
}

}  // namespace specd
