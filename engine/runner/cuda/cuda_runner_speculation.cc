// CudaRunner's speculation on the device: greedy verification (argmax ids kept on the GPU and
// the ballot-scan verify-and-pack kernel), sampled verification (p built on the GPU,
// kernels::VerifyStochastic), the draft model's sampled steps and their probability slots. The
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

absl::Status CudaRunner::StepGreedyVerify(std::span<const SequenceInput> batch,
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
  std::vector<int32_t> parents;  // token trees: every row's, in layout order
  SPECD_ASSIGN_OR_RETURN(const bool trees, State::LayoutParents(batch, rows, drafts, &parents));
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kIdsOnDevice));
  // The ragged layout of kernels::DraftLayout is the expansion's: row i's K_i + 1 ids follow
  // the previous rows' (a draftless row is K_i = 0, its one id the drawn token).
  const int32_t n = static_cast<int32_t>(rows.size());
  std::vector<int32_t> cu(n + 1, 0), draft_tokens;
  int32_t max_draft_len = 0;
  for (int32_t i = 0; i < n; ++i) {
    cu[i + 1] = cu[i] + static_cast<int32_t>(drafts[i].size());
    max_draft_len = std::max(max_draft_len, static_cast<int32_t>(drafts[i].size()));
    draft_tokens.insert(draft_tokens.end(), drafts[i].begin(), drafts[i].end());
  }
  cuda::UploadArena& arena = s_->verify_arena;
  arena.Reset();
  const size_t cu_at = arena.Push(cu);
  const size_t drafts_at = draft_tokens.empty() ? 0 : arena.Push(draft_tokens);
  const size_t parents_at = trees ? arena.Push(parents) : 0;
  SPECD_RETURN_IF_ERROR(arena.Upload(s_->stream));
  const int32_t max_rows = s_->limits.max_rows;
  int32_t* accepted = s_->verify_out.as<int32_t>();  // [n] accepted, [n] next, then packing
  int32_t* next = accepted + max_rows;
  const kernels::DraftLayout layout{arena.At<int32_t>(cu_at), n, max_draft_len};
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
    if (trees && !parents.empty() && batch[rows[i].chunk].tree != nullptr) {
      const int32_t* path = host + 2 * max_rows + cu[i];
      r.path.assign(path, path + r.num_accepted);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::StepSampledVerify(std::span<const SequenceInput> batch,
                                           std::span<const SampleRow> rows,
                                           std::span<const std::span<const int32_t>> drafts,
                                           std::span<const DraftProbs> probs,
                                           std::vector<GreedyVerifyResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  const int64_t vocab = s_->config.vocab_size;
  std::vector<SampleRow> expanded;
  if (s_->worker) {  // tensor-parallel worker: rank 0's logits rows (probs unused), then stop
    SPECD_RETURN_IF_ERROR(runner_internal::ExpandDraftRows(batch, rows, drafts, &expanded));
    SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kProbs));
    return s_->Sync("sampled verification step");
  }
  std::vector<int32_t> path_tokens;
  SPECD_RETURN_IF_ERROR(runner_internal::ExpandSampledVerifyRows(batch, rows, drafts, probs, vocab,
                                                                 &expanded, &path_tokens));
  std::vector<int32_t> parents;  // token trees: every row's, in layout order
  SPECD_ASSIGN_OR_RETURN(const bool trees, State::LayoutParents(batch, rows, drafts, &parents));
  if (trees) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!drafts[i].empty() && (probs[i].device != nullptr || !probs[i].host.empty())) {
        return absl::InvalidArgumentError(
            absl::StrCat("StepSampledVerify: row ", i,
                         " carries draft probabilities in a step with token trees"));
      }
    }
  }
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kProbs));
  // The ragged layout (kernels::DraftLayout) is the expansion's, as in StepGreedyVerify; the
  // logits buffer now holds p for every expanded row.
  const int32_t n = static_cast<int32_t>(rows.size());
  std::vector<int32_t> cu(n + 1, 0), draft_tokens, onehot_rows, onehot_cols;
  std::vector<float> uniforms;
  int32_t max_draft_len = 0;
  bool any_q = false;
  for (int32_t i = 0; i < n; ++i) {
    const auto k = static_cast<int32_t>(drafts[i].size());
    cu[i + 1] = cu[i] + k;
    max_draft_len = std::max(max_draft_len, k);
    draft_tokens.insert(draft_tokens.end(), drafts[i].begin(), drafts[i].end());
    any_q = any_q || (k > 0 && (probs[i].device != nullptr || !probs[i].host.empty()));
    const bool tree = trees && batch[rows[i].chunk].tree != nullptr;
    if (tree) {
      State::TreeTestUniforms(rows[i], std::span<const int32_t>(parents).subspan(cu[i], k),
                              &uniforms);
      if (runner_internal::verify_accepts_every_draft_for_test) {
        std::fill(uniforms.end() - k, uniforms.end(), 0.0f);
      }
    }
    for (int32_t j = 0; j < k && !tree; ++j) {
      uniforms.push_back(runner_internal::verify_accepts_every_draft_for_test
                             ? 0.0f
                             : SpeculationUniform(rows[i].seed, rows[i].num_generated + j,
                                                  SpeculationDraw::kAcceptTest));
    }
    // The next token's draw; its position is known only on the device (num_generated + k_i),
    // so its uniform is keyed by the round's first position.
    uniforms.push_back(
        SpeculationUniform(rows[i].seed, rows[i].num_generated, SpeculationDraw::kNextToken));
  }
  const int64_t num_drafts = cu[n];
  // q rows in layout order: copied from wherever the speculator left them; deterministic drafts
  // in a batch that also has sampled ones get one-hot rows.
  float* q = nullptr;
  if (any_q) {
    const size_t q_bytes = static_cast<size_t>(num_drafts) * vocab * sizeof(float);
    if (s_->verify_q.bytes() < q_bytes) {
      s_->verify_q = cuda::DeviceMemory();
      SPECD_ASSIGN_OR_RETURN(s_->verify_q,
                             cuda::DeviceMemory::Allocate(q_bytes, "draft probabilities"));
    }
    q = s_->verify_q.as<float>();
    // One copy per run of rows whose sources are adjacent too (a draft model's slots follow its
    // inputs, which follow the batch).
    const char* run_src = nullptr;
    char* run_dst = nullptr;
    size_t run_bytes = 0;
    auto flush = [&]() {
      if (run_bytes == 0) return absl::OkStatus();
      const size_t bytes = std::exchange(run_bytes, 0);
      return cuda::Check(cudaMemcpyAsync(run_dst, run_src, bytes, cudaMemcpyDefault, s_->stream),
                         "copy of q rows");
    };
    for (int32_t i = 0; i < n; ++i) {
      const size_t k = drafts[i].size();
      if (k == 0) continue;
      float* dst = q + static_cast<size_t>(cu[i]) * vocab;
      const size_t bytes = k * vocab * sizeof(float);
      if (probs[i].device != nullptr || !probs[i].host.empty()) {
        const auto* src = probs[i].device != nullptr
                              ? reinterpret_cast<const char*>(probs[i].device)
                              : reinterpret_cast<const char*>(probs[i].host.data());
        if (probs[i].device != nullptr) s_->EnablePeerAccessTo(probs[i].device);
        if (run_bytes > 0 && run_src + run_bytes == src &&
            run_dst + run_bytes == reinterpret_cast<char*>(dst)) {
          run_bytes += bytes;
          continue;
        }
        SPECD_RETURN_IF_ERROR(flush());
        run_src = src;
        run_dst = reinterpret_cast<char*>(dst);
        run_bytes = bytes;
        continue;
      }
      SPECD_RETURN_IF_ERROR(
          cuda::Check(cudaMemsetAsync(dst, 0, bytes, s_->stream), "one-hot q rows"));
      for (size_t j = 0; j < k; ++j) {
        onehot_rows.push_back(cu[i] + static_cast<int32_t>(j));
        onehot_cols.push_back(drafts[i][j]);
      }
    }
    SPECD_RETURN_IF_ERROR(flush());
  }
  cuda::UploadArena& arena = s_->verify_arena;
  arena.Reset();
  const size_t cu_at = arena.Push(cu);
  const size_t drafts_at = arena.Push(draft_tokens);  // an empty push still names the arena
  const size_t uniforms_at = arena.Push(uniforms);
  const size_t onehot_at = onehot_rows.empty() ? 0 : arena.Push(onehot_rows);
  const size_t onehot_cols_at = onehot_rows.empty() ? 0 : arena.Push(onehot_cols);
  const size_t parents_at = trees ? arena.Push(parents) : 0;
  SPECD_RETURN_IF_ERROR(arena.Upload(s_->stream));
  if (!onehot_rows.empty()) {
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::ScatterF32(q, vocab, arena.At<int32_t>(onehot_at),
                                        arena.At<int32_t>(onehot_cols_at),
                                        static_cast<int64_t>(onehot_rows.size()), 1.0f, s_->stream),
                    "ScatterF32 (one-hot q rows)"));
  }
  const int32_t max_rows = s_->limits.max_rows;
  int32_t* accepted = s_->verify_out.as<int32_t>();  // [n] accepted, [n] next, tree paths
  int32_t* next = accepted + max_rows;
  const kernels::DraftLayout layout{arena.At<int32_t>(cu_at), n, max_draft_len};
  if (trees) {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::VerifyTreeStochastic(layout, arena.At<int32_t>(drafts_at),
                                      arena.At<int32_t>(parents_at), s_->forward->logits(), vocab,
                                      arena.At<float>(uniforms_at), accepted, next, next + max_rows,
                                      s_->stream),
        "VerifyTreeStochastic"));
  } else {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::VerifyStochastic(layout, arena.At<int32_t>(drafts_at), q, s_->forward->logits(),
                                  vocab, arena.At<float>(uniforms_at), accepted, next, s_->stream),
        "VerifyStochastic"));
  }
  int32_t* host = s_->verify_host.as<int32_t>();
  const size_t results = size_t{2} * max_rows + (trees ? static_cast<size_t>(cu[n]) : 0);
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemcpyAsync(host, accepted, results * sizeof(int32_t),
                                                    cudaMemcpyDeviceToHost, s_->stream),
                                    "copy of verification results"));
  SPECD_RETURN_IF_ERROR(s_->SyncStep("sampled verification step"));
  out->resize(rows.size());
  for (int32_t i = 0; i < n; ++i) {
    GreedyVerifyResult& r = (*out)[i];
    r.num_accepted = host[i];
    r.next.id = host[max_rows + i];
    const bool tree = trees && batch[rows[i].chunk].tree != nullptr;
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

absl::Status CudaRunner::StepDraft(std::span<const SequenceInput> batch,
                                   std::span<const SampleRow> rows, std::span<const int32_t> slots,
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
