#include "engine/runner/cuda/cuda_sampling.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "kernels/cuda/init.h"
#include "kernels/cuda/sampling.h"

namespace specd {

// What one step's sampling launches, with the arena offsets of its inputs.
struct GpuSampler::Work {
  int64_t num_banned = 0;
  size_t banned_rows = 0, banned_cols = 0;  // [num_banned] int32 each
  bool penalties = false;
  size_t penalty_params = 0;                  // [rows, 3] f32
  size_t prompt_ids = 0, prompt_offsets = 0;  // CSR over rows
  size_t output_ids = 0, output_offsets = 0;  // CSR over rows, ids repeated by count
  bool sample = false;                        // any row draws (else argmax only)
  size_t sampling_rows = 0;                   // [rows] kernels::SamplingRow
  size_t saguaro_fan_out = 0, saguaro_c = 0;  // [rows] int32 / f32 (EnqueueProbs, when any)
  std::vector<int32_t> cpu_slot;              // [rows] index into host_logits_, or -1
};

absl::StatusOr<std::unique_ptr<GpuSampler>> GpuSampler::Create(int32_t max_rows, int32_t vocab) {
  std::unique_ptr<GpuSampler> s(new GpuSampler(max_rows, vocab));
  const size_t workspace = std::max(kernels::SampleWorkspaceBytes(max_rows, vocab),
                                    kernels::PenaltyWorkspaceBytes(max_rows, vocab));
  SPECD_ASSIGN_OR_RETURN(s->workspace_,
                         cuda::DeviceMemory::Allocate(workspace, "sampling workspace"));
  SPECD_ASSIGN_OR_RETURN(s->ids_, cuda::DeviceMemory::Allocate(max_rows * 4, "sampled ids"));
  SPECD_ASSIGN_OR_RETURN(s->host_ids_, cuda::PinnedMemory::Allocate(max_rows * 4, "sampled ids"));
  const int32_t k = std::min(kMaxSampleCandidates, vocab);
  const size_t topk_bytes = static_cast<size_t>(max_rows) * kMaxSampleCandidates * 4;
  SPECD_ASSIGN_OR_RETURN(s->topk_ids_, cuda::DeviceMemory::Allocate(topk_bytes, "candidate ids"));
  SPECD_ASSIGN_OR_RETURN(s->host_topk_, cuda::PinnedMemory::Allocate(topk_bytes, "candidate ids"));
  if (const size_t ws = kernels::TopKWorkspaceBytes(max_rows, vocab, k); ws > 0) {
    SPECD_ASSIGN_OR_RETURN(s->topk_workspace_,
                           cuda::DeviceMemory::Allocate(ws, "candidate ranking workspace"));
  }
  return s;
}

GpuSampler::Work GpuSampler::Pack(std::span<const SampleRow> rows, bool probs) {
  Work w;
  std::vector<int32_t> banned_rows, banned_cols, prompt_ids, output_ids;
  std::vector<int32_t> prompt_offsets = {0}, output_offsets = {0};
  std::vector<float> penalties;
  std::vector<kernels::SamplingRow> sampling(rows.size());
  int32_t num_cpu = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& row = rows[i];
    const SamplingParams& p = *row.params;
    const bool on_cpu = !probs && p.logprobs >= 0;  // probabilities: every row on the device
    w.cpu_slot.push_back(on_cpu ? num_cpu++ : -1);
    sampling[i] = kernels::SamplingRow{0.0f, 0, 1.0f, 0.0f, row.seed, 0};
    if (on_cpu) {
      penalties.insert(penalties.end(), {1.0f, 0.0f, 0.0f});
    } else {
      for (int32_t id : row.banned) {
        if (id < 0 || id >= vocab_) continue;
        banned_rows.push_back(static_cast<int32_t>(i));
        banned_cols.push_back(id);
      }
      penalties.insert(penalties.end(),
                       {p.repetition_penalty, p.presence_penalty, p.frequency_penalty});
      if (p.has_penalties()) {
        w.penalties = true;
        prompt_ids.insert(prompt_ids.end(), row.history->prompt_tokens().begin(),
                          row.history->prompt_tokens().end());
        for (const auto& [id, count] : row.history->output_counts()) {
          output_ids.insert(output_ids.end(), count, id);
        }
        output_ids.insert(output_ids.end(), row.pending.begin(), row.pending.end());
      }
      if (!p.greedy()) {
        w.sample = true;
        sampling[i] = kernels::SamplingRow{p.temperature, std::max(0, p.top_k),
                                           p.top_p,       p.min_p,
                                           row.seed,      static_cast<uint64_t>(row.num_generated)};
      }
    }
    prompt_offsets.push_back(static_cast<int32_t>(prompt_ids.size()));
    output_offsets.push_back(static_cast<int32_t>(output_ids.size()));
  }
  arena_.Reset();
  w.num_banned = static_cast<int64_t>(banned_rows.size());
  if (w.num_banned > 0) {
    w.banned_rows = arena_.Push(banned_rows);
    w.banned_cols = arena_.Push(banned_cols);
  }
  if (w.penalties) {
    w.penalty_params = arena_.Push(penalties);
    w.prompt_ids = arena_.Push(prompt_ids);
    w.prompt_offsets = arena_.Push(prompt_offsets);
    w.output_ids = arena_.Push(output_ids);
    w.output_offsets = arena_.Push(output_offsets);
  }
  w.sample = w.sample || probs;  // probabilities: greedy rows become one-hot rows
  if (w.sample) w.sampling_rows = arena_.Push(sampling);
  return w;
}

absl::Status GpuSampler::CopyLogprobRows(const float* logits, std::span<const SampleRow> rows,
                                         cudaStream_t stream) {
  size_t num_cpu = 0;
  for (const SampleRow& row : rows) num_cpu += row.params->logprobs >= 0 ? 1 : 0;
  const size_t row_bytes = static_cast<size_t>(vocab_) * sizeof(float);
  if (num_cpu * row_bytes > host_logits_.bytes()) {  // no copy is in flight between steps
    host_logits_ = cuda::PinnedMemory();
    SPECD_ASSIGN_OR_RETURN(host_logits_,
                           cuda::PinnedMemory::Allocate(num_cpu * row_bytes, "logprobs rows"));
  }
  size_t k = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].params->logprobs < 0) continue;
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaMemcpyAsync(host_logits_.as<float>() + k * vocab_, logits + i * vocab_,
                                    row_bytes, cudaMemcpyDeviceToHost, stream),
                    "copy of a logprobs row"));
    ++k;
  }
  return absl::OkStatus();
}

absl::Status GpuSampler::Enqueue(float* logits, std::span<const SampleRow> rows,
                                 cudaStream_t stream, bool copy_ids) {
  const int32_t n = static_cast<int32_t>(rows.size());
  if (n == 0) return absl::OkStatus();
  if (n > max_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step: ", n, " sample rows; the runner holds at most ", max_rows_));
  }
  // Raw rows first: the kernels below modify the logits in place.
  SPECD_RETURN_IF_ERROR(CopyLogprobRows(logits, rows, stream));
  topk_ = 0;
  for (const SampleRow& row : rows) {
    if (row.num_candidates < 0 || row.num_candidates > std::min(kMaxSampleCandidates, vocab_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Step: ", row.num_candidates, " candidates; at most ", kMaxSampleCandidates));
    }
    if (row.saguaro_fan_out != 0) {
      return absl::InvalidArgumentError("Step: Saguaro sampling is for draft draws (StepDraft)");
    }
    topk_ = std::max(topk_, row.num_candidates);
  }
  if (topk_ > 0) {  // every row is ranked (one launch); rows keep what they asked for
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::TopKRows(logits, vocab_, n, vocab_, topk_, topk_ids_.as<int32_t>(),
                                      topk_workspace_.as(), topk_workspace_.bytes(), stream),
                    "TopKRows"));
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaMemcpyAsync(host_topk_.as(), topk_ids_.as(),
                                    static_cast<size_t>(n) * topk_ * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream),
                    "copy of candidate ids"));
  }
  Work w = Pack(rows, /*probs=*/false);
  SPECD_RETURN_IF_ERROR(Process(logits, n, w, stream));
  if (w.sample) {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::SampleRows(logits, vocab_, n, vocab_,
                            arena_.At<kernels::SamplingRow>(w.sampling_rows), ids_.as<int32_t>(),
                            nullptr, workspace_.as(), workspace_.bytes(), stream),
        "SampleRows"));
  } else {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::ArgmaxRows(logits, vocab_, n, vocab_, ids_.as<int32_t>(), stream), "ArgmaxRows"));
  }
  cpu_slot_ = std::move(w.cpu_slot);
  if (!copy_ids) return absl::OkStatus();
  return cuda::Check(cudaMemcpyAsync(host_ids_.as(), ids_.as(), n * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream),
                     "copy of sampled ids");
}

absl::Status GpuSampler::EnqueueProbs(float* logits, std::span<const SampleRow> rows,
                                      cudaStream_t stream) {
  const int32_t n = static_cast<int32_t>(rows.size());
  cpu_slot_.assign(rows.size(), -1);
  topk_ = 0;
  if (n == 0) return absl::OkStatus();
  if (n > max_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step: ", n, " sample rows; the runner holds at most ", max_rows_));
  }
  // SSD's cache draws: candidates and Saguaro's cached ids are the processed row's best ids
  // (one TopKRows over every row, k the largest either asks for).
  bool saguaro = false;
  for (const SampleRow& row : rows) {
    const int32_t most = std::min(kMaxSampleCandidates, vocab_);
    if (row.num_candidates < 0 || row.num_candidates > most || row.saguaro_fan_out < 0 ||
        row.saguaro_fan_out > most) {
      return absl::InvalidArgumentError(absl::StrCat("StepDraft: ", row.num_candidates,
                                                     " candidates and Saguaro fan-out ",
                                                     row.saguaro_fan_out, "; at most ", most));
    }
    const bool down = row.saguaro_fan_out > 0 && row.saguaro_c < 1.0f;  // false for NaN
    saguaro = saguaro || down;
    topk_ = std::max({topk_, row.num_candidates, down ? row.saguaro_fan_out : 0});
  }
  // Raw rows of the logprobs rows first (RawRow), as Enqueue: the kernels below rewrite them.
  SPECD_RETURN_IF_ERROR(CopyLogprobRows(logits, rows, stream));
  for (int32_t i = 0, k = 0; i < n; ++i) cpu_slot_[i] = rows[i].params->logprobs >= 0 ? k++ : -1;
  Work w = Pack(rows, /*probs=*/true);
  if (saguaro) {
    std::vector<int32_t> fan_out(rows.size());
    std::vector<float> c(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      fan_out[i] = rows[i].saguaro_fan_out;
      c[i] = rows[i].saguaro_c;
    }
    w.saguaro_fan_out = arena_.Push(fan_out);
    w.saguaro_c = arena_.Push(c);
  }
  SPECD_RETURN_IF_ERROR(Process(logits, n, w, stream));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(kernels::ProcessedProbs(logits, vocab_, n, vocab_,
                                          arena_.At<kernels::SamplingRow>(w.sampling_rows), logits,
                                          vocab_, stream),
                  "ProcessedProbs"));
  if (topk_ == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(
      cuda::Check(kernels::TopKRows(logits, vocab_, n, vocab_, topk_, topk_ids_.as<int32_t>(),
                                    topk_workspace_.as(), topk_workspace_.bytes(), stream),
                  "TopKRows (draft rows)"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(host_topk_.as(), topk_ids_.as(),
                                  static_cast<size_t>(n) * topk_ * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream),
                  "copy of candidate ids"));
  if (!saguaro) return absl::OkStatus();
  return cuda::Check(
      kernels::SaguaroDownweightRows(logits, vocab_, n, vocab_, topk_ids_.as<int32_t>(), topk_,
                                     arena_.At<int32_t>(w.saguaro_fan_out),
                                     arena_.At<float>(w.saguaro_c), stream),
      "SaguaroDownweightRows");
}

std::vector<int32_t> GpuSampler::Candidates(size_t i, int32_t n) const {
  if (n <= 0 || topk_ == 0) return {};
  const int32_t* top = host_topk_.as<int32_t>() + i * static_cast<size_t>(topk_);
  return std::vector<int32_t>(top, top + std::min(n, topk_));
}

absl::Status GpuSampler::Process(float* logits, int32_t n, const Work& w, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(arena_.Upload(stream));
  if (w.num_banned > 0) {
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::ScatterF32(logits, vocab_, arena_.At<int32_t>(w.banned_rows),
                                        arena_.At<int32_t>(w.banned_cols), w.num_banned,
                                        -std::numeric_limits<float>::infinity(), stream),
                    "ScatterF32 (banned ids)"));
  }
  if (w.penalties) {
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::ApplyPenalties(
                        logits, vocab_, n, vocab_, arena_.At<int32_t>(w.prompt_ids),
                        arena_.At<int32_t>(w.prompt_offsets), arena_.At<int32_t>(w.output_ids),
                        arena_.At<int32_t>(w.output_offsets), arena_.At<float>(w.penalty_params),
                        workspace_.as(), workspace_.bytes(), stream),
                    "ApplyPenalties"));
  }
  return absl::OkStatus();
}

std::span<const float> GpuSampler::RawRow(size_t i) const {
  if (i >= cpu_slot_.size() || cpu_slot_[i] < 0) return {};
  return {host_logits_.as<float>() + static_cast<size_t>(cpu_slot_[i]) * vocab_,
          static_cast<size_t>(vocab_)};
}

void GpuSampler::Finish(std::span<const SampleRow> rows, std::vector<SampleResult>* out) {
  out->clear();
  out->reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (cpu_slot_[i] >= 0) {
      std::span<float> logits(host_logits_.as<float>() + static_cast<size_t>(cpu_slot_[i]) * vocab_,
                              vocab_);
      out->push_back(rows[i].sampler->Sample(logits, *rows[i].history, rows[i].banned));
    } else {
      SampleResult r;
      r.id = host_ids_.as<int32_t>()[i];
      out->push_back(std::move(r));
    }
    if (rows[i].num_candidates > 0) {
      const int32_t* top = host_topk_.as<int32_t>() + i * static_cast<size_t>(topk_);
      out->back().candidates.assign(top, top + rows[i].num_candidates);
    }
  }
}

}  // namespace specd
