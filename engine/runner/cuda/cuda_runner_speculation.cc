// CudaRunner's speculation on the device: greedy verification (argmax ids kept on the GPU and
// the ballot-scan verify-and-pack kernel), sampled verification (p built on the GPU,
// kernels::VerifyStochastic, over a VerifyPlan from cuda_runner_verify.cc), the draft model's
// sampled steps and their probability slots. The
// forward passes go through EnqueueStep, so verification and catch-up steps replay round graphs
// (cuda_runner_graphs.cc). See cuda_runner_state.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/cuda/cuda_runner_state.h"
#include "kernels/cuda/init.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/verify.h"

namespace specd {

using cuda_runner_internal::VerifyPlan;

absl::Status CudaRunner::VerifyGreedy(std::span<const SequenceInput> batch,
                                      std::span<const SampleRow> rows,
                                      std::span<const std::span<const int32_t>> drafts,
                                      std::vector<GreedyVerifyResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  std::vector<SampleRow> expanded;
  if (s_->worker) {  // tensor-parallel worker: rank 0's logits rows, then stop
    SPECD_RETURN_IF_ERROR(runner_internal::ExpandDraftRows(batch, rows, drafts, &expanded));
    SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kIdsOnDevice));
    return s_->Sync("verification step");
  }
  SPECD_RETURN_IF_ERROR(runner_internal::ExpandVerifyRows(batch, rows, drafts, &expanded));
  // The ragged layout of kernels::DraftLayout is the expansion's: row i's K_i + 1 ids follow
  // the previous rows' (a draftless row is K_i = 0, its one id the drawn token).
  VerifyPlan plan;
  SPECD_RETURN_IF_ERROR(State::PlanVerifyLayout(batch, rows, drafts, &plan));
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kIdsOnDevice));
  const std::vector<int32_t>& cu = plan.cu;
  const bool trees = plan.trees;
  const int32_t n = static_cast<int32_t>(rows.size());
  cuda::UploadArena& arena = s_->verify_arena;
  arena.Reset();
  const size_t cu_at = arena.Push(cu);
  const size_t drafts_at = plan.draft_tokens.empty() ? 0 : arena.Push(plan.draft_tokens);
  const size_t parents_at = trees ? arena.Push(plan.parents) : 0;
  SPECD_RETURN_IF_ERROR(arena.Upload(s_->stream));
  const int32_t max_rows = s_->limits.max_rows;
  int32_t* accepted = s_->verify_out.as<int32_t>();  // [n] accepted, [n] next, then packing
  int32_t* next = accepted + max_rows;
  const kernels::DraftLayout layout{arena.At<int32_t>(cu_at), n, plan.max_draft_len};
  if (trees) {  // paths after next: [num_drafts] (<= max_rows)
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::VerifyTreeGreedy(layout, arena.At<int32_t>(drafts_at),
                                  arena.At<int32_t>(parents_at), s_->sampler->device_ids(),
                                  accepted, next, next + max_rows, s_->stream),
        "VerifyTreeGreedy"));
  } else {
    kernels::PackArgs pack;
    pack.cu_committed = next + max_rows;                       // [n + 1]
    pack.committed_tokens = pack.cu_committed + max_rows + 1;  // [<= rows]
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::VerifyGreedyAndPack(layout, arena.At<int32_t>(drafts_at),
                                                 s_->sampler->device_ids(), accepted, next, pack,
                                                 kernels::VerifyPackPath::kAuto, s_->stream),
                    "VerifyGreedyAndPack"));
  }
  int32_t* host = s_->verify_host.as<int32_t>();
  const size_t results = size_t{2} * max_rows + (trees ? static_cast<size_t>(cu[n]) : 0);
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemcpyAsync(host, accepted, results * sizeof(int32_t),
                                                    cudaMemcpyDeviceToHost, s_->stream),
                                    "copy of verification results"));
  SPECD_RETURN_IF_ERROR(s_->SyncStep("verification step"));
  std::vector<SampleResult> sampled;  // meaningful for logprobs rows only
  s_->sampler->Finish(expanded, &sampled);
  out->resize(rows.size());
  for (int32_t i = 0, at = 0; i < n; at += cu[i + 1] - cu[i] + 1, ++i) {
    GreedyVerifyResult& r = (*out)[i];
    if (drafts[i].empty() && rows[i].params->logprobs >= 0) {
      r.next = std::move(sampled[at]);
      continue;
    }
    r.num_accepted = host[i];
    r.next.id = host[max_rows + i];
    if (trees && !plan.parents.empty() && batch[rows[i].chunk].tree != nullptr) {
      const int32_t* path = host + 2 * max_rows + cu[i];
      r.path.assign(path, path + r.num_accepted);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::VerifySampled(const StepRequest& request,
                                       std::vector<GreedyVerifyResult>* out) {
  const std::span<const SequenceInput> batch = request.batch;
  const std::span<const SampleRow> rows = request.rows;
  const std::span<const std::span<const int32_t>> drafts = request.drafts;
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  if (s_->worker) {  // tensor-parallel worker: rank 0's logits rows (probs unused), then stop
    std::vector<SampleRow> expanded;
    SPECD_RETURN_IF_ERROR(runner_internal::ExpandDraftRows(batch, rows, drafts, &expanded));
    SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kProbs));
    return s_->Sync("sampled verification step");
  }
  // Planned on the host (every check made before anything is queued), then the forward leaves
  // p for every expanded row in the logits buffer and the plan is enqueued behind it.
  VerifyPlan plan;
  SPECD_RETURN_IF_ERROR(
      State::PlanSampledVerify(batch, rows, drafts, request.probs, s_->config.vocab_size, &plan));
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, plan.expanded, SampleMode::kProbs));
  SPECD_RETURN_IF_ERROR(s_->EnqueueSampledVerify(plan));
  SPECD_RETURN_IF_ERROR(s_->SyncStep("sampled verification step"));
  const int32_t* host = s_->verify_host.as<int32_t>();
  const int32_t max_rows = s_->limits.max_rows;
  const std::vector<int32_t>& cu = plan.cu;
  const int32_t n = static_cast<int32_t>(rows.size());
  out->resize(rows.size());
  for (int32_t i = 0; i < n; ++i) {
    GreedyVerifyResult& r = (*out)[i];
    r.num_accepted = host[i];
    r.next.id = host[max_rows + i];
    const bool tree = plan.trees && batch[rows[i].chunk].tree != nullptr;
    if (r.next.id < 0 || r.num_accepted < 0 || r.num_accepted > cu[i + 1] - cu[i]) {
      return absl::InternalError(absl::StrCat("sampled verification: row ", i, " accepted ",
                                              r.num_accepted, " drafts and drew token ", r.next.id,
                                              " (a distribution without mass?)"));
    }
    if (tree) {
      const int32_t* path = host + 2 * max_rows + cu[i];
      r.path.assign(path, path + r.num_accepted);
    }
    const int32_t num_logprobs = rows[i].params->logprobs;
    if (num_logprobs < 0) continue;
    // Each committed token's logprobs are the row of the node before it (the root's first).
    const size_t first = static_cast<size_t>(cu[i]) + i;  // row i's first expanded row
    size_t node = 0;
    for (int32_t j = 0; j < r.num_accepted; ++j) {
      const int32_t draft = tree ? r.path[j] : j;
      r.accepted.push_back(
          RawTokenLogprobs(s_->sampler->RawRow(first + node), drafts[i][draft], num_logprobs));
      node = static_cast<size_t>(draft) + 1;
    }
    r.next = RawTokenLogprobs(s_->sampler->RawRow(first + node), r.next.id, num_logprobs);
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::State::ReserveProbSlots(int32_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ReserveProbSlots(", n, ")"));
  if (n <= num_prob_slots) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(Sync("probability slots"));  // nothing may still read the old ones
  prob_slots = cuda::DeviceMemory();
  num_prob_slots = 0;
  SPECD_ASSIGN_OR_RETURN(prob_slots, cuda::DeviceMemory::Allocate(
                                         static_cast<size_t>(n) * config.vocab_size * sizeof(float),
                                         "draft probability slots"));
  num_prob_slots = n;
  return absl::OkStatus();
}

const float* CudaRunner::State::ProbSlot(int32_t slot) const {
  if (slot < 0 || slot >= num_prob_slots) return nullptr;
  return prob_slots.as<float>() + static_cast<size_t>(slot) * config.vocab_size;
}

absl::Status CudaRunner::ReserveKeptRows(int32_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ReserveKeptRows(", n, ")"));
  if (n <= s_->num_kept_rows) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(s_->Sync("kept rows"));  // nothing may still copy into the old ones
  s_->kept_rows = cuda::DeviceMemory();
  s_->num_kept_rows = 0;
  SPECD_ASSIGN_OR_RETURN(
      s_->kept_rows,
      cuda::DeviceMemory::Allocate(static_cast<size_t>(n) * s_->config.vocab_size * sizeof(float),
                                   "kept probability rows"));
  s_->num_kept_rows = n;
  return absl::OkStatus();
}

absl::Status CudaRunner::KeepProbSlots(int32_t first_slot, int32_t n, int32_t first_row) {
  if (first_slot < 0 || first_row < 0 || n < 0 || int64_t{first_slot} + n > s_->num_prob_slots ||
      int64_t{first_row} + n > s_->num_kept_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("KeepProbSlots: slots [", first_slot, ", ", int64_t{first_slot} + n, ") of ",
                     s_->num_prob_slots, " into kept rows [", first_row, ", ",
                     int64_t{first_row} + n, ") of ", s_->num_kept_rows));
  }
  if (n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  const size_t row_bytes = static_cast<size_t>(s_->config.vocab_size) * sizeof(float);
  return cuda::Check(
      cudaMemcpyAsync(s_->kept_rows.as<float>() + int64_t{first_row} * s_->config.vocab_size,
                      s_->ProbSlot(first_slot), static_cast<size_t>(n) * row_bytes,
                      cudaMemcpyDeviceToDevice, s_->stream),
      "copy into kept rows");
}

absl::Status CudaRunner::ReadKeptRows(int32_t first_row, int32_t n, std::span<float> out) const {
  const int64_t vocab = s_->config.vocab_size;
  if (first_row < 0 || n < 0 || int64_t{first_row} + n > s_->num_kept_rows ||
      static_cast<int64_t>(out.size()) < int64_t{n} * vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadKeptRows: rows [", first_row, ", ", int64_t{first_row} + n, ") of ",
                     s_->num_kept_rows, " into ", out.size(), " floats"));
  }
  if (n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(out.data(), s_->kept_rows.as<float>() + int64_t{first_row} * vocab,
                      static_cast<size_t>(n) * static_cast<size_t>(vocab) * sizeof(float),
                      cudaMemcpyDeviceToHost, s_->stream),
      "copy of kept rows"));
  return s_->Sync("kept rows");
}

absl::Status CudaRunner::CopyKeptRows(std::span<const RowRange> ranges, void* device_out) const {
  const int64_t vocab = s_->config.vocab_size;
  for (const RowRange& r : ranges) {
    if (r.first < 0 || r.count < 0 || int64_t{r.first} + r.count > s_->num_kept_rows) {
      return absl::InvalidArgumentError(absl::StrCat("CopyKeptRows: rows [", r.first, ", ",
                                                     int64_t{r.first} + r.count, ") of ",
                                                     s_->num_kept_rows));
    }
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  auto* out = static_cast<float*>(device_out);
  for (const RowRange& r : ranges) {
    if (r.count == 0) continue;
    const size_t floats = static_cast<size_t>(r.count) * static_cast<size_t>(vocab);
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaMemcpyAsync(out, s_->kept_rows.as<float>() + int64_t{r.first} * vocab,
                                    floats * sizeof(float), cudaMemcpyDeviceToDevice, s_->stream),
                    "copy of kept rows"));
    out += floats;
  }
  return s_->Sync("kept rows");
}

absl::Status CudaRunner::State::ReserveCandidates(int64_t rows) {
  if (rows <= cand_rows) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(Sync("candidate buffers"));  // nothing may still use the old ones
  const int64_t n = std::max<int64_t>(rows, limits.max_rows);
  const auto count = static_cast<size_t>(n) * kernels::kMaxTopK;
  cand_rows = 0;
  SPECD_ASSIGN_OR_RETURN(cand_ids, cuda::DeviceMemory::Allocate(count * 4, "candidates"));
  SPECD_ASSIGN_OR_RETURN(cand_logprobs, cuda::DeviceMemory::Allocate(count * 4, "candidates"));
  SPECD_ASSIGN_OR_RETURN(cand_host, cuda::PinnedMemory::Allocate(count * 8, "candidates"));
  if (cand_workspace.bytes() == 0) {
    const size_t ws = kernels::TopKWorkspaceBytes(
        limits.max_rows, static_cast<int32_t>(config.vocab_size), kernels::kMaxTopK);
    SPECD_ASSIGN_OR_RETURN(
        cand_workspace, cuda::DeviceMemory::Allocate(std::max<size_t>(ws, 16), "top-k workspace"));
  }
  cand_rows = n;
  return absl::OkStatus();
}

absl::Status CudaRunner::ReserveProbSlots(int32_t n) { return s_->ReserveProbSlots(n); }

const float* CudaRunner::prob_slot(int32_t slot) const { return s_->ProbSlot(slot); }

absl::Status CudaRunner::ReadProbSlots(int32_t first, int32_t n, std::span<float> out) const {
  const int64_t vocab = s_->config.vocab_size;
  if (first < 0 || n < 0 || int64_t{first} + n > s_->num_prob_slots ||
      static_cast<int64_t>(out.size()) < int64_t{n} * vocab) {
    return absl::InvalidArgumentError(absl::StrCat("ReadProbSlots: slots [", first, ", ",
                                                   int64_t{first} + n, ") of ", s_->num_prob_slots,
                                                   " reserved into ", out.size(), " floats"));
  }
  if (n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(out.data(), s_->ProbSlot(first),
                      static_cast<size_t>(n) * static_cast<size_t>(vocab) * sizeof(float),
                      cudaMemcpyDeviceToHost, s_->stream),
      "copy of probability slots"));
  return s_->Sync("probability slots");
}

absl::Status CudaRunner::State::DrawProbRows(std::span<const SampleRow> rows,
                                             std::span<const int32_t> slots,
                                             std::vector<int32_t>* ids) {
  const auto n = static_cast<int32_t>(rows.size());
  ids->clear();
  if (n == 0) return SyncStep("draft step");
  std::vector<float> uniforms;
  for (const SampleRow& r : rows) {
    uniforms.push_back(SpeculationUniform(r.seed, r.num_generated, SpeculationDraw::kDraft));
  }
  std::vector<int32_t> slot_rows(slots.begin(), slots.end());
  verify_arena.Reset();
  const size_t uniforms_at = verify_arena.Push(uniforms);
  const size_t slots_at = verify_arena.Push(slot_rows);
  SPECD_RETURN_IF_ERROR(verify_arena.Upload(stream));
  const int64_t vocab = config.vocab_size;
  float* p = forward->logits();
  int32_t* drawn = verify_out.as<int32_t>() + limits.max_rows;
  // A layout without drafts: each row's token is drawn from its own distribution.
  const kernels::DraftLayout layout{nullptr, n, 0};
  SPECD_RETURN_IF_ERROR(cuda::Check(
      kernels::VerifyStochastic(
          layout, /*draft_tokens (none read)=*/verify_arena.At<int32_t>(slots_at), nullptr, p,
          vocab, verify_arena.At<float>(uniforms_at), verify_out.as<int32_t>(), drawn, stream),
      "VerifyStochastic (draft draw)"));
  SPECD_RETURN_IF_ERROR(cuda::Check(kernels::ScatterRows(p, vocab, n, static_cast<int32_t>(vocab),
                                                         verify_arena.At<int32_t>(slots_at),
                                                         prob_slots.as<float>(), vocab, stream),
                                    "ScatterRows (draft probabilities)"));
  int32_t* host = verify_host.as<int32_t>();
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(host, drawn, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
                  "copy of draft ids"));
  SPECD_RETURN_IF_ERROR(SyncStep("draft step"));
  ids->assign(host, host + n);
  return absl::OkStatus();
}

absl::Status CudaRunner::DrawDraftRows(std::span<const SequenceInput> batch,
                                       std::span<const SampleRow> rows,
                                       std::span<const int32_t> slots,
                                       std::vector<SampleResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  if (slots.size() != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepDraft: ", slots.size(), " slots for ", rows.size(), " rows"));
  }
  for (int32_t slot : slots) {
    if (slot < 0 || slot >= s_->num_prob_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepDraft: slot ", slot, " of ", s_->num_prob_slots, " reserved"));
    }
  }
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, rows, SampleMode::kProbs));
  std::vector<int32_t> ids;
  SPECD_RETURN_IF_ERROR(s_->DrawProbRows(rows, slots, &ids));
  out->resize(rows.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      return absl::InternalError(
          absl::StrCat("draft step: row ", i, " has a distribution without mass"));
    }
    (*out)[i].id = ids[i];
    (*out)[i].candidates = s_->sampler->Candidates(i, rows[i].num_candidates);
  }
  return absl::OkStatus();
}

// The EAGLE-3 head's sampled draws (CudaEagle3Compute::DeviceDraws): its rows over the target
// vocabulary go into the forward pass's logits buffer, which the head's draws may reuse (they run
// between the target's passes, after the last pass's logits were read), and are drawn as
// StepDraft draws, q into the probability slots.
class CudaRunner::State::Eagle3Draws : public CudaEagle3Compute::DeviceDraws {
 public:
  explicit Eagle3Draws(State* s) : s_(s) {}
  float* rows() override { return s_->forward->logits(); }
  int32_t max_rows() const override { return s_->limits.max_rows; }
  absl::Status Draw(std::span<const SampleRow> rows, std::span<const int32_t> slots,
                    std::vector<int32_t>* ids) override {
    for (int32_t slot : slots) {
      if (slot < 0 || slot >= s_->num_prob_slots) {
        return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: draw slot ", slot, " of ",
                                                       s_->num_prob_slots, " reserved"));
      }
    }
    SPECD_RETURN_IF_ERROR(s_->sampler->EnqueueProbs(s_->forward->logits(), rows, s_->stream));
    return s_->DrawProbRows(rows, slots, ids);
  }
  absl::Status Reserve(int32_t n) override { return s_->ReserveProbSlots(n); }
  const float* slot(int32_t slot) const override { return s_->ProbSlot(slot); }
  int32_t num_slots() const override { return s_->num_prob_slots; }
  const void* storage() const override { return s_->prob_slots.as(); }
  // DrawProbRows' kernels over device inputs (the sampler's penalties and bans aside: the
  // caller's rows have none), q copied into the slots with one strided copy.
  absl::Status Enqueue(int32_t n, const kernels::SamplingRow* sampling, const float* uniforms,
                       int32_t first_slot, int32_t slot_stride, int32_t* ids,
                       int32_t* scratch) override {
    if (n <= 0) return absl::OkStatus();
    if (n > s_->limits.max_rows || first_slot < 0 || slot_stride < 1 ||
        int64_t{first_slot} + int64_t{n - 1} * slot_stride >= s_->num_prob_slots) {
      return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: ", n, " draws into slot ",
                                                     first_slot, " + i * ", slot_stride, " of ",
                                                     s_->num_prob_slots, " reserved"));
    }
    const int64_t vocab = s_->config.vocab_size;
    float* p = s_->forward->logits();
    cudaStream_t st = s_->stream;
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::ProcessedProbs(p, vocab, n, static_cast<int32_t>(vocab), sampling, p, vocab, st),
        "ProcessedProbs (EAGLE-3 draws)"));
    const kernels::DraftLayout layout{nullptr, n, 0};
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::VerifyStochastic(layout, /*draft_tokens (none read)=*/ids, nullptr, p,
                                              vocab, uniforms, scratch, ids, st),
                    "VerifyStochastic (EAGLE-3 draws)"));
    const size_t row_bytes = static_cast<size_t>(vocab) * sizeof(float);
    return cuda::Check(cudaMemcpy2DAsync(s_->prob_slots.as<float>() + int64_t{first_slot} * vocab,
                                         row_bytes * slot_stride, p, row_bytes, row_bytes,
                                         static_cast<size_t>(n), cudaMemcpyDeviceToDevice, st),
                       "EAGLE-3 draw probabilities");
  }

 private:
  State* s_;
};

std::unique_ptr<CudaEagle3Compute::DeviceDraws> CudaRunner::State::MakeEagle3Draws() {
  return std::make_unique<Eagle3Draws>(this);
}

// A draft model on another GPU leaves its q rows there: with peer access on, the copies into
// this GPU (cudaMemcpyDefault) go peer to peer over NVLink / PCIe instead of being staged through
// host memory, which is what the driver does between GPUs without it. Enabled lazily, once per
// peer (enabling it for every visible GPU at start would create a context on each of them in
// every process); a pair that cannot reach each other keeps the staged copy.
void CudaRunner::State::EnablePeerAccessTo(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  const int32_t peer = attr.device;
  if (attr.type != cudaMemoryTypeDevice || peer == device || peers_enabled.contains(peer)) return;
  peers_enabled.insert(peer);
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess || !can) {
    cudaGetLastError();
    SPECD_LOG_WARN("{}: no peer access to cuda:{}; q rows are staged through the host", name, peer);
    return;
  }
  if (const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
    SPECD_LOG_WARN("{}: enabling peer access to cuda:{}: {}", name, peer, cudaGetErrorString(e));
  }
  cudaGetLastError();  // clear a refused or repeated enable
}

}  // namespace specd
