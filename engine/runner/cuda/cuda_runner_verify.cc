// CudaRunner's verification plans (cuda_runner_internal::VerifyPlan): what the verify kernels
// read that the host decides (the ragged layout, the Philox uniforms, where each q row comes
// from) is planned before the forward pass is queued; enqueueing a plan only uploads it and
// launches. See cuda_runner_state.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/cuda/cuda_runner_state.h"
#include "kernels/cuda/init.h"
#include "kernels/cuda/verify.h"

namespace specd {
namespace runner_internal {

// Tests only (declared in engine/testing/test_flags.h, not in a production header): when true,
// the sampled verification's accept tests draw u = 0, so every draft the target gives any mass
// to is kept and the output follows the draft's distribution: a broken verifier whose output
// the GPU chi-square test must reject (its negative control).
bool verify_accepts_every_draft_for_test = false;

}  // namespace runner_internal

using cuda_runner_internal::VerifyPlan;

absl::Status CudaRunner::State::PlanVerifyLayout(std::span<const SequenceInput> batch,
                                                 std::span<const SampleRow> rows,
                                                 std::span<const std::span<const int32_t>> drafts,
                                                 VerifyPlan* plan) {
  SPECD_ASSIGN_OR_RETURN(plan->trees, LayoutParents(batch, rows, drafts, &plan->parents));
  const auto n = static_cast<int32_t>(rows.size());
  plan->cu.assign(n + 1, 0);
  plan->draft_tokens.clear();
  plan->max_draft_len = 0;
  for (int32_t i = 0; i < n; ++i) {
    const auto k = static_cast<int32_t>(drafts[i].size());
    plan->cu[i + 1] = plan->cu[i] + k;
    plan->max_draft_len = std::max(plan->max_draft_len, k);
    plan->draft_tokens.insert(plan->draft_tokens.end(), drafts[i].begin(), drafts[i].end());
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::State::PlanSampledVerify(std::span<const SequenceInput> batch,
                                                  std::span<const SampleRow> rows,
                                                  std::span<const std::span<const int32_t>> drafts,
                                                  std::span<const DraftProbs> probs, int64_t vocab,
                                                  VerifyPlan* plan) {
  SPECD_RETURN_IF_ERROR(runner_internal::ExpandSampledVerifyRows(
      batch, rows, drafts, probs, vocab, &plan->expanded, &plan->path_tokens));
  SPECD_RETURN_IF_ERROR(PlanVerifyLayout(batch, rows, drafts, plan));
  auto has_q = [&](size_t i) { return probs[i].device != nullptr || !probs[i].host.empty(); };
  if (plan->trees) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!drafts[i].empty() && has_q(i)) {
        return absl::InvalidArgumentError(
            absl::StrCat("StepSampledVerify: row ", i,
                         " carries draft probabilities in a step with token trees"));
      }
    }
  }
  const auto n = static_cast<int32_t>(rows.size());
  const std::vector<int32_t>& cu = plan->cu;
  plan->uniforms.clear();
  plan->any_q = false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = cu[i + 1] - cu[i];
    plan->any_q = plan->any_q || (k > 0 && has_q(i));
    // (A draftless row's chunk is checked only by the forward, later: it has no tests here.)
    const bool tree = plan->trees && k > 0 && batch[rows[i].chunk].tree != nullptr;
    if (tree) {
      TreeTestUniforms(rows[i], std::span<const int32_t>(plan->parents).subspan(cu[i], k),
                       &plan->uniforms);
      if (runner_internal::verify_accepts_every_draft_for_test) {
        std::fill(plan->uniforms.end() - k, plan->uniforms.end(), 0.0f);
      }
    }
    for (int32_t j = 0; j < k && !tree; ++j) {
      plan->uniforms.push_back(runner_internal::verify_accepts_every_draft_for_test
                                   ? 0.0f
                                   : SpeculationUniform(rows[i].seed, rows[i].num_generated + j,
                                                        SpeculationDraw::kAcceptTest));
    }
    // The next token's draw; its position is known only on the device (num_generated + k_i),
    // so its uniform is keyed by the round's first position.
    plan->uniforms.push_back(
        SpeculationUniform(rows[i].seed, rows[i].num_generated, SpeculationDraw::kNextToken));
  }
  // q rows in layout order: copied from wherever the speculator left them (one copy per run of
  // rows whose sources are adjacent too: a draft model's slots follow its inputs, which follow
  // the batch); deterministic drafts in a batch that also has sampled ones get one-hot rows.
  plan->q_rows.clear();
  plan->q_device_sources.clear();
  plan->onehot_rows.clear();
  plan->onehot_cols.clear();
  if (!plan->any_q) return absl::OkStatus();
  for (int32_t i = 0; i < n; ++i) {
    const size_t k = drafts[i].size();
    if (k == 0) continue;
    const size_t dst = static_cast<size_t>(cu[i]) * vocab * sizeof(float);
    const size_t bytes = k * vocab * sizeof(float);
    if (has_q(i)) {
      const auto* src = probs[i].device != nullptr
                            ? reinterpret_cast<const char*>(probs[i].device)
                            : reinterpret_cast<const char*>(probs[i].host.data());
      if (probs[i].device != nullptr) plan->q_device_sources.push_back(probs[i].device);
      VerifyPlan::QRows* last = plan->q_rows.empty() ? nullptr : &plan->q_rows.back();
      if (last != nullptr && last->src != nullptr && last->src + last->bytes == src &&
          last->dst + last->bytes == dst) {
        last->bytes += bytes;
        continue;
      }
      plan->q_rows.push_back({src, dst, bytes});
      continue;
    }
    plan->q_rows.push_back({nullptr, dst, bytes});
    for (size_t j = 0; j < k; ++j) {
      plan->onehot_rows.push_back(cu[i] + static_cast<int32_t>(j));
      plan->onehot_cols.push_back(drafts[i][j]);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::State::EnqueueSampledVerify(const VerifyPlan& plan) {
  const int64_t vocab = config.vocab_size;
  const auto n = static_cast<int32_t>(plan.cu.size()) - 1;
  const int64_t num_drafts = plan.cu[n];
  float* q = nullptr;
  if (plan.any_q) {
    const size_t q_bytes = static_cast<size_t>(num_drafts) * vocab * sizeof(float);
    if (verify_q.bytes() < q_bytes) {
      verify_q = cuda::DeviceMemory();
      SPECD_ASSIGN_OR_RETURN(verify_q,
                             cuda::DeviceMemory::Allocate(q_bytes, "draft probabilities"));
    }
    q = verify_q.as<float>();
    for (const float* src : plan.q_device_sources) EnablePeerAccessTo(src);
    char* base = reinterpret_cast<char*>(q);
    for (const VerifyPlan::QRows& r : plan.q_rows) {
      SPECD_RETURN_IF_ERROR(
          r.src == nullptr
              ? cuda::Check(cudaMemsetAsync(base + r.dst, 0, r.bytes, stream), "one-hot q rows")
              : cuda::Check(
                    cudaMemcpyAsync(base + r.dst, r.src, r.bytes, cudaMemcpyDefault, stream),
                    "copy of q rows"));
    }
  }
  verify_arena.Reset();
  const size_t cu_at = verify_arena.Push(plan.cu);
  const size_t drafts_at = verify_arena.Push(plan.draft_tokens);  // an empty push still names it
  const size_t uniforms_at = verify_arena.Push(plan.uniforms);
  const bool onehot = !plan.onehot_rows.empty();
  const size_t onehot_at = onehot ? verify_arena.Push(plan.onehot_rows) : 0;
  const size_t onehot_cols_at = onehot ? verify_arena.Push(plan.onehot_cols) : 0;
  const size_t parents_at = plan.trees ? verify_arena.Push(plan.parents) : 0;
  SPECD_RETURN_IF_ERROR(verify_arena.Upload(stream));
  if (onehot) {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::ScatterF32(q, vocab, verify_arena.At<int32_t>(onehot_at),
                            verify_arena.At<int32_t>(onehot_cols_at),
                            static_cast<int64_t>(plan.onehot_rows.size()), 1.0f, stream),
        "ScatterF32 (one-hot q rows)"));
  }
  const int32_t max_rows = limits.max_rows;
  int32_t* accepted = verify_out.as<int32_t>();  // [n] accepted, [n] next, tree paths
  int32_t* next = accepted + max_rows;
  const kernels::DraftLayout layout{verify_arena.At<int32_t>(cu_at), n, plan.max_draft_len};
  if (plan.trees) {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::VerifyTreeStochastic(layout, verify_arena.At<int32_t>(drafts_at),
                                      verify_arena.At<int32_t>(parents_at), forward->logits(),
                                      vocab, verify_arena.At<float>(uniforms_at), accepted, next,
                                      next + max_rows, stream),
        "VerifyTreeStochastic"));
  } else {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::VerifyStochastic(layout, verify_arena.At<int32_t>(drafts_at), q, forward->logits(),
                                  vocab, verify_arena.At<float>(uniforms_at), accepted, next,
                                  stream),
        "VerifyStochastic"));
  }
  const size_t results = size_t{2} * max_rows + (plan.trees ? static_cast<size_t>(num_drafts) : 0);
  return cuda::Check(cudaMemcpyAsync(verify_host.as<int32_t>(), accepted, results * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream),
                     "copy of verification results");
}

}  // namespace specd
