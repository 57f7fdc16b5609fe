// Verification launchers (layer 2): validate sizes, choose the copy width and the path, launch,
// report the error.
#include <climits>
#include <cstdint>

#include "kernels/cuda/verify.cuh"
#include "kernels/cuda/verify.h"

namespace specd::kernels {
namespace {

static_assert(kMaxFusedVerifyBatch == kFusedMaxBatch);
static_assert(kMaxFusedVerifyBatch <= kFusedThreads, "the block scan takes one length per thread");
static_assert(kMaxVerifyVocab == ref::kMaxVerifyVocab);
static_assert(kMaxTreeVerifyDrafts == kTreeMaxDrafts);

constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kFusedMaxAutoBatch = 128;
// Measured on an H100 (verify_bench, docs/benchmarks.md, acceptance 0.9): the fused kernel won
// with up to 72-147 KiB of KV rows (256 B rows: batch 32 at K 8; 1 KiB rows: batch 16; 4 KiB
// rows and K 128: batch 1) and lost from 132-147 KiB on (batch 64 with 256 B rows, K 128 at
// batch 4). 128 KiB splits the two.
constexpr int64_t kFusedMaxAutoKvBytes = int64_t{128} << 10;

bool ValidLayout(const DraftLayout& layout) {
  if (layout.batch < 0 || layout.max_draft_len < 0 || layout.max_draft_len >= INT_MAX) {
    return false;
  }
  // Every row index (num_drafts + batch rows) fits int32.
  return layout.batch <= (int64_t{INT_MAX} - 1) / (layout.max_draft_len + 1);
}

LayoutView View(const DraftLayout& layout) {
  return {layout.cu_draft_lens, static_cast<int>(layout.max_draft_len)};
}

bool ValidPack(const PackArgs& pack) {
  if (pack.cu_committed == nullptr || pack.committed_tokens == nullptr) return false;
  if (pack.slot_mapping != nullptr && pack.committed_slots == nullptr) return false;
  if (pack.kv_row_bytes < 0) return false;
  if (pack.kv_row_bytes > 0 && (pack.kv == nullptr || pack.packed_kv == nullptr)) return false;
  return true;
}

PackView ViewOf(const PackArgs& pack) {
  const bool has_kv = pack.kv_row_bytes > 0;
  return {pack.cu_committed,
          pack.committed_tokens,
          pack.slot_mapping,
          pack.committed_slots,
          has_kv ? static_cast<const unsigned char*>(pack.kv) : nullptr,
          has_kv ? static_cast<unsigned char*>(pack.packed_kv) : nullptr,
          pack.kv_row_bytes};
}

// Calls f(V{}) with the widest copy unit the row size and both KV pointers allow, or with a
// void* tag when there are no KV rows.
template <typename F>
cudaError_t WithCopyUnit(const PackArgs& pack, F&& f) {
  if (pack.kv_row_bytes == 0) return f(static_cast<void*>(nullptr));
  auto fits = [&](int64_t bytes) {
    return pack.kv_row_bytes % bytes == 0 && IsAligned(pack.kv, bytes) &&
           IsAligned(pack.packed_kv, bytes);
  };
  if (fits(16)) return f(static_cast<uint4*>(nullptr));
  if (fits(4)) return f(static_cast<uint32_t*>(nullptr));
  return f(static_cast<unsigned char*>(nullptr));
}

template <typename V>
cudaError_t LaunchPack(const DraftLayout& layout, const int32_t* draft_tokens,
                       const int32_t* accepted_lens, const int32_t* next_tokens,
                       const PackArgs& pack, cudaStream_t stream) {
  CommittedPrefixSumKernel<<<1, kScanThreads, 0, stream>>>(static_cast<int>(layout.batch),
                                                           accepted_lens, pack.cu_committed);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  constexpr bool kHasKv = !std::is_void_v<V>;
  constexpr int kRows = kHasKv ? kPackKvRowsPerBlock : kPackTokenRowsPerBlock;
  constexpr int kThreads = kHasKv ? kPackKvRowsPerBlock * kWarpSize : kPackTokenRowsPerBlock;
  const dim3 grid(static_cast<unsigned>(layout.batch),
                  static_cast<unsigned>(CeilDiv(layout.max_draft_len + 1, kRows)));
  PackCommittedKernel<V><<<grid, kThreads, 0, stream>>>(View(layout), draft_tokens, accepted_lens,
                                                        next_tokens, ViewOf(pack));
  return cudaGetLastError();
}

template <typename V>
cudaError_t LaunchFused(const DraftLayout& layout, const int32_t* draft_tokens,
                        const int32_t* target_tokens, int32_t* accepted_lens, int32_t* next_tokens,
                        const PackArgs& pack, cudaStream_t stream) {
  VerifyGreedyAndPackFusedKernel<V>
      <<<1, kFusedThreads, 0, stream>>>(View(layout), static_cast<int>(layout.batch), draft_tokens,
                                        target_tokens, accepted_lens, next_tokens, ViewOf(pack));
  return cudaGetLastError();
}

template <int kVec>
cudaError_t LaunchStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                             const float* draft_probs, const float* target_probs, int64_t vocab,
                             const float* uniforms, int32_t* accepted_lens, int32_t* next_tokens,
                             cudaStream_t stream) {
  VerifyStochasticKernel<kVec>
      <<<static_cast<unsigned>(layout.batch), kStochasticThreads, 0, stream>>>(
          View(layout), draft_tokens, draft_probs, target_probs, static_cast<int>(vocab), uniforms,
          accepted_lens, next_tokens);
  return cudaGetLastError();
}

template <int kVec>
cudaError_t LaunchTreeStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                                 const int32_t* parents, const float* target_probs, int64_t vocab,
                                 const float* uniforms, int32_t* accepted_lens,
                                 int32_t* next_tokens, int32_t* paths, cudaStream_t stream) {
  VerifyTreeStochasticKernel<kVec>
      <<<static_cast<unsigned>(layout.batch), kTreeStochasticThreads, 0, stream>>>(
          View(layout), draft_tokens, parents, target_probs, static_cast<int>(vocab), uniforms,
          accepted_lens, next_tokens, paths);
  return cudaGetLastError();
}

// The vocabulary and row-count checks of the stochastic launchers.
bool ValidVocab(const DraftLayout& layout, int64_t vocab) {
  if (vocab < 1 || vocab > kMaxVerifyVocab) return false;
  const int64_t max_rows = layout.batch * (layout.max_draft_len + 1);
  return max_rows <= (int64_t{1} << 62) / vocab;
}

bool ValidGreedyArgs(const DraftLayout& layout, const int32_t* draft_tokens,
                     const int32_t* target_tokens, const int32_t* accepted_lens,
                     const int32_t* next_tokens) {
  return ValidLayout(layout) && draft_tokens != nullptr && target_tokens != nullptr &&
         accepted_lens != nullptr && next_tokens != nullptr;
}

}  // namespace

cudaError_t VerifyGreedyBallot(const DraftLayout& layout, const int32_t* draft_tokens,
                               const int32_t* target_tokens, int32_t* accepted_lens,
                               int32_t* next_tokens, cudaStream_t stream) {
  if (!ValidGreedyArgs(layout, draft_tokens, target_tokens, accepted_lens, next_tokens)) {
    return cudaErrorInvalidValue;
  }
  if (layout.batch == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(CeilDiv(layout.batch, kBallotWarpsPerBlock));
  VerifyGreedyBallotKernel<<<blocks, kBallotWarpsPerBlock * kWarpSize, 0, stream>>>(
      View(layout), static_cast<int>(layout.batch), draft_tokens, target_tokens, accepted_lens,
      next_tokens);
  return cudaGetLastError();
}

cudaError_t VerifyGreedySerial(const DraftLayout& layout, const int32_t* draft_tokens,
                               const int32_t* target_tokens, int32_t* accepted_lens,
                               int32_t* next_tokens, cudaStream_t stream) {
  if (!ValidGreedyArgs(layout, draft_tokens, target_tokens, accepted_lens, next_tokens)) {
    return cudaErrorInvalidValue;
  }
  if (layout.batch == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(CeilDiv(layout.batch, kSerialThreads));
  VerifyGreedySerialKernel<<<blocks, kSerialThreads, 0, stream>>>(
      View(layout), static_cast<int>(layout.batch), draft_tokens, target_tokens, accepted_lens,
      next_tokens);
  return cudaGetLastError();
}

cudaError_t PackAccepted(const DraftLayout& layout, const int32_t* draft_tokens,
                         const int32_t* accepted_lens, const int32_t* next_tokens,
                         const PackArgs& pack, cudaStream_t stream) {
  if (!ValidLayout(layout) || draft_tokens == nullptr || accepted_lens == nullptr ||
      next_tokens == nullptr || !ValidPack(pack)) {
    return cudaErrorInvalidValue;
  }
  const int64_t rows_per_block =
      pack.kv_row_bytes > 0 ? kPackKvRowsPerBlock : kPackTokenRowsPerBlock;
  if (CeilDiv(layout.max_draft_len + 1, rows_per_block) > kMaxGridY) return cudaErrorInvalidValue;
  if (layout.batch == 0) return cudaSuccess;
  return WithCopyUnit(pack, [&](auto* unit) {
    using V = std::remove_pointer_t<decltype(unit)>;
    return LaunchPack<V>(layout, draft_tokens, accepted_lens, next_tokens, pack, stream);
  });
}

bool PreferFusedVerifyPack(const DraftLayout& layout, int64_t kv_row_bytes) {
  if (layout.batch > kFusedMaxAutoBatch) return false;
  const int64_t max_rows = layout.batch * (layout.max_draft_len + 1);
  return kv_row_bytes <= 0 || max_rows <= kFusedMaxAutoKvBytes / kv_row_bytes;
}

cudaError_t VerifyGreedyAndPack(const DraftLayout& layout, const int32_t* draft_tokens,
                                const int32_t* target_tokens, int32_t* accepted_lens,
                                int32_t* next_tokens, const PackArgs& pack, VerifyPackPath path,
                                cudaStream_t stream) {
  if (!ValidGreedyArgs(layout, draft_tokens, target_tokens, accepted_lens, next_tokens) ||
      !ValidPack(pack)) {
    return cudaErrorInvalidValue;
  }
  if (path == VerifyPackPath::kAuto) {
    path = PreferFusedVerifyPack(layout, pack.kv_row_bytes) ? VerifyPackPath::kFused
                                                            : VerifyPackPath::kMultiBlock;
  }
  if (path == VerifyPackPath::kMultiBlock) {
    if (const cudaError_t err = VerifyGreedyBallot(layout, draft_tokens, target_tokens,
                                                   accepted_lens, next_tokens, stream);
        err != cudaSuccess) {
      return err;
    }
    return PackAccepted(layout, draft_tokens, accepted_lens, next_tokens, pack, stream);
  }
  if (layout.batch > kMaxFusedVerifyBatch) return cudaErrorInvalidValue;
  if (layout.batch == 0) return cudaSuccess;
  return WithCopyUnit(pack, [&](auto* unit) {
    using V = std::remove_pointer_t<decltype(unit)>;
    return LaunchFused<V>(layout, draft_tokens, target_tokens, accepted_lens, next_tokens, pack,
                          stream);
  });
}

cudaError_t VerifyStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                             const float* draft_probs, const float* target_probs, int64_t vocab,
                             const float* uniforms, int32_t* accepted_lens, int32_t* next_tokens,
                             cudaStream_t stream) {
  if (!ValidLayout(layout) || draft_tokens == nullptr || target_probs == nullptr ||
      uniforms == nullptr || accepted_lens == nullptr || next_tokens == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (!ValidVocab(layout, vocab)) return cudaErrorInvalidValue;
  if (layout.batch == 0) return cudaSuccess;
  const bool vectorize = vocab % 4 == 0 && IsAligned(target_probs, 16) &&
                         (draft_probs == nullptr || IsAligned(draft_probs, 16));
  if (vectorize) {
    return LaunchStochastic<4>(layout, draft_tokens, draft_probs, target_probs, vocab, uniforms,
                               accepted_lens, next_tokens, stream);
  }
  return LaunchStochastic<1>(layout, draft_tokens, draft_probs, target_probs, vocab, uniforms,
                             accepted_lens, next_tokens, stream);
}

cudaError_t VerifyTreeGreedy(const DraftLayout& layout, const int32_t* draft_tokens,
                             const int32_t* parents, const int32_t* target_tokens,
                             int32_t* accepted_lens, int32_t* next_tokens, int32_t* paths,
                             cudaStream_t stream) {
  if (!ValidGreedyArgs(layout, draft_tokens, target_tokens, accepted_lens, next_tokens) ||
      parents == nullptr || paths == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (layout.batch == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(CeilDiv(layout.batch, kTreeGreedyWarpsPerBlock));
  VerifyTreeGreedyKernel<<<blocks, kTreeGreedyWarpsPerBlock * kWarpSize, 0, stream>>>(
      View(layout), static_cast<int>(layout.batch), draft_tokens, parents, target_tokens,
      accepted_lens, next_tokens, paths);
  return cudaGetLastError();
}

cudaError_t VerifyTreeStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                                 const int32_t* parents, const float* target_probs, int64_t vocab,
                                 const float* uniforms, int32_t* accepted_lens,
                                 int32_t* next_tokens, int32_t* paths, cudaStream_t stream) {
  if (!ValidLayout(layout) || draft_tokens == nullptr || parents == nullptr ||
      target_probs == nullptr || uniforms == nullptr || accepted_lens == nullptr ||
      next_tokens == nullptr || paths == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (layout.max_draft_len > kMaxTreeVerifyDrafts || !ValidVocab(layout, vocab)) {
    return cudaErrorInvalidValue;
  }
  if (layout.batch == 0) return cudaSuccess;
  if (vocab % 4 == 0 && IsAligned(target_probs, 16)) {
    return LaunchTreeStochastic<4>(layout, draft_tokens, parents, target_probs, vocab, uniforms,
                                   accepted_lens, next_tokens, paths, stream);
  }
  return LaunchTreeStochastic<1>(layout, draft_tokens, parents, target_probs, vocab, uniforms,
                                 accepted_lens, next_tokens, paths, stream);
}

}  // namespace specd::kernels
