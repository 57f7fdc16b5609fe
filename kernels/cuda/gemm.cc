// cuBLASLt GEMM wrapper. Row-major y[m, n] = x[m, k] W[n, k]^T is, read column-major, the
// product D[n, m] = W[n, k] x^T[k, m]: W's row-major bytes are a column-major [k, n] matrix with
// ld k, taken transposed (TRANSA = T), and x's are a column-major [k, m] matrix with ld ldx
// (TRANSB = N); D is column-major [n, m] with ld ldy. That is the "TN" layout every Hopper
// cuBLASLt kernel supports, and the bias (length n = D's rows) broadcasts along m as
// CUBLASLT_EPILOGUE_BIAS defines it.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <compare>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "kernels/cuda/gemv.h"

namespace specd::kernels {
namespace {

constexpr uint16_t kBf16One = 0x3f80;
// Rows per rank-1 bias update (the length of the owned ones vector).
constexpr int64_t kOnesRows = 65536;

bool Ok(cublasStatus_t status, const char* what, std::string* error) {
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  if (error != nullptr) {
    *error = std::string(what) + ": " + cublasLtGetStatusName(status) + " (" +
             cublasLtGetStatusString(status) + ")";
  }
  return false;
}

bool Ok(cudaError_t status, const char* what, std::string* error) {
  if (status == cudaSuccess) return true;
  if (error != nullptr) {
    *error = std::string(what) + ": " + cudaGetErrorName(status) + " (" +
             cudaGetErrorString(status) + ")";
  }
  return false;
}

// Largest power of two (<= 256, cuBLASLt's default assumption) dividing the address.
uint32_t AlignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// How a plan adds the bias: not at all, in the epilogue, or (f32 output, where cuBLASLt may
// reject a bf16 bias vector) as a second rank-1 GEMM y += ones[m] bias[n]^T.
enum class BiasMode { kNone, kEpilogue, kRank1 };

// One matmul configuration: D[rows_d, cols_d] = op(A) op(B) (+ C). Everything the heuristic's
// choice depends on.
struct PlanKey {
  int64_t m = 0, n = 0, k = 0, ldx = 0, ldy = 0;
  GemmOut out = GemmOut::kBf16;
  BiasMode bias = BiasMode::kNone;
  bool rank1_update = false;  // the plan is the rank-1 bias update itself
  uint32_t align_x = 0, align_w = 0, align_y = 0, align_bias = 0;

  auto operator<=>(const PlanKey&) const = default;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;  // set the bias pointer before each call
  bool rank1_bias = false;     // follow with the rank-1 bias update

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

cudaDataType_t OutType(GemmOut out) { return out == GemmOut::kBf16 ? CUDA_R_16BF : CUDA_R_32F; }

template <typename T>
cublasStatus_t SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                       const T& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

template <typename T>
cublasStatus_t SetPref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                       const T& value) {
  return cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
}

// Descriptor and layouts of the main product (see the file comment) or of the rank-1 bias
// update D[n, m] += bias[n, 1] ones[m, 1]^T ("NT": both vectors contiguous, k = 1, beta = 1).
bool DescribePlan(const PlanKey& key, const void* bias, Plan* plan, std::string* error) {
  if (!Ok(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate", error)) {
    return false;
  }
  const cublasOperation_t trans_a = key.rank1_update ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t trans_b = key.rank1_update ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (!Ok(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, trans_a), "TRANSA", error) ||
      !Ok(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, trans_b), "TRANSB", error)) {
    return false;
  }
  if (!key.rank1_update && key.bias == BiasMode::kEpilogue) {
    plan->bias_epilogue = true;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_16BF;  // the default is D's type; ours is always bf16
    if (!Ok(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue), "EPILOGUE", error) ||
        !Ok(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type), "BIAS_DATA_TYPE",
            error) ||
        !Ok(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias), "BIAS_POINTER", error)) {
      return false;
    }
  }
  plan->rank1_bias = !key.rank1_update && key.bias == BiasMode::kRank1;
  const auto rows = [](int64_t v) { return static_cast<uint64_t>(v); };
  cublasStatus_t status;
  if (key.rank1_update) {
    status = cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, rows(key.n), 1, key.n);
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, rows(key.m), 1, key.m);
    }
  } else {
    status = cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, rows(key.k), rows(key.n), key.k);
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, rows(key.k), rows(key.m), key.ldx);
    }
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status =
        cublasLtMatrixLayoutCreate(&plan->c, OutType(key.out), rows(key.n), rows(key.m), key.ldy);
  }
  return Ok(status, "cublasLtMatrixLayoutCreate", error);
}

bool ChooseAlgorithm(cublasLtHandle_t handle, const PlanKey& key, size_t workspace_bytes,
                     Plan* plan, std::string* error) {
  cublasLtMatmulPreference_t pref = nullptr;
  if (!Ok(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", error)) {
    return false;
  }
  const uint64_t max_workspace = workspace_bytes;
  // A is W (main) or the bias (rank-1); B is x or the owned ones vector (256-byte aligned).
  const uint32_t align_a = key.rank1_update ? key.align_bias : key.align_w;
  const uint32_t align_b = key.rank1_update ? 256u : key.align_x;
  bool ok =
      Ok(SetPref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace),
         "MAX_WORKSPACE_BYTES", error) &&
      Ok(SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a), "ALIGN_A", error) &&
      Ok(SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b), "ALIGN_B", error) &&
      Ok(SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y), "ALIGN_C",
         error) &&
      Ok(SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y), "ALIGN_D", error);
  if (ok) {
    cublasLtMatmulHeuristicResult_t result{};
    int num_results = 0;
    ok = Ok(cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                           pref, 1, &result, &num_results),
            "cublasLtMatmulAlgoGetHeuristic", error);
    if (ok && (num_results == 0 || result.state != CUBLAS_STATUS_SUCCESS)) {
      ok = false;
      if (error != nullptr) *error = "cuBLASLt has no algorithm for this GEMM";
    }
    if (ok) plan->algo = result.algo;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return ok;
}

std::string ShapeText(const PlanKey& key) {
  return "m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
         " k=" + std::to_string(key.k) + (key.rank1_update ? " (rank-1 bias update)" : "");
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* ones = nullptr;  // [kOnesRows] bf16 1.0: the rank-1 bias update's other vector
  bool f32_bias_epilogue = true;
  bool small_m_gemv = true;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (ones != nullptr) cudaFree(ones);
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  // The cached plan for key, built on first use. A rejected f32-output bias epilogue falls back
  // to the rank-1 update, and the fallback is what gets cached.
  const Plan* GetPlan(PlanKey key, const void* bias, std::string* error) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    auto plan = std::make_unique<Plan>();
    std::string reason;
    bool ok = DescribePlan(key, bias, plan.get(), &reason) &&
              ChooseAlgorithm(handle, key, workspace_bytes, plan.get(), &reason);
    if (!ok && !key.rank1_update && key.bias == BiasMode::kEpilogue && key.out == GemmOut::kF32) {
      PlanKey fallback = key;
      fallback.bias = BiasMode::kRank1;
      plan = std::make_unique<Plan>();
      ok = DescribePlan(fallback, bias, plan.get(), &reason) &&
           ChooseAlgorithm(handle, fallback, workspace_bytes, plan.get(), &reason);
    }
    if (!ok) {
      if (error != nullptr) *error = "GEMM " + ShapeText(key) + ": " + reason;
      return nullptr;
    }
    return plans.emplace(key, std::move(plan)).first->second.get();
  }

  bool Matmul(const Plan& plan, const void* a, const void* b, float beta, void* d,
              cudaStream_t stream, std::string* error) {
    const float alpha = 1.0f;
    return Ok(cublasLtMatmul(handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.c, d,
                             plan.c, &plan.algo, workspace, workspace_bytes, stream),
              "cublasLtMatmul", error);
  }

  // y[r, :] += bias for every row r < m, kOnesRows rows per rank-1 GEMM.
  bool AddBiasRank1(const void* bias, int64_t m, int64_t n, void* y, int64_t ldy,
                    cudaStream_t stream, std::string* error) {
    for (int64_t row = 0; row < m; row += kOnesRows) {
      float* y_rows = static_cast<float*>(y) + row * ldy;
      PlanKey key;
      key.m = std::min(kOnesRows, m - row);
      key.n = n;
      key.k = 1;
      key.ldy = ldy;
      key.out = GemmOut::kF32;
      key.rank1_update = true;
      key.align_bias = AlignmentOf(bias);
      key.align_y = AlignmentOf(y_rows);
      const Plan* plan = GetPlan(key, bias, error);
      if (plan == nullptr || !Matmul(*plan, bias, ones, 1.0f, y_rows, stream, error)) return false;
    }
    return true;
  }
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

std::unique_ptr<Gemm> Gemm::Create(size_t workspace_bytes, std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->workspace_bytes = workspace_bytes;
  if (!Ok(cublasLtCreate(&impl->handle), "cublasLtCreate", error)) return nullptr;
  if (workspace_bytes > 0 &&
      !Ok(cudaMalloc(&impl->workspace, workspace_bytes), "cudaMalloc(workspace)", error)) {
    return nullptr;
  }
  const std::vector<uint16_t> ones(kOnesRows, kBf16One);
  if (!Ok(cudaMalloc(&impl->ones, kOnesRows * sizeof(uint16_t)), "cudaMalloc(ones)", error) ||
      !Ok(cudaMemcpy(impl->ones, ones.data(), kOnesRows * sizeof(uint16_t), cudaMemcpyHostToDevice),
          "cudaMemcpy(ones)", error)) {
    return nullptr;
  }
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

void Gemm::set_f32_bias_epilogue(bool enabled) { impl_->f32_bias_epilogue = enabled; }

void Gemm::set_small_m_gemv(bool enabled) { impl_->small_m_gemv = enabled; }

bool Gemm::Run(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
               const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, void* y, int64_t ldy,
               GemmOut out_type, cudaStream_t stream, std::string* error) {
  if (m < 0 || n < 1 || k < 1 || ldx < k || ldy < n || x == nullptr || w == nullptr ||
      y == nullptr) {
    if (error != nullptr) *error = "Gemm::Run: invalid sizes or null operands";
    return false;
  }
  if (m == 0) return true;
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (impl_->small_m_gemv && m <= kMaxGemvRows && k >= 8 && k % 8 == 0 && ldx % 8 == 0 &&
      aligned16(x) && aligned16(w) && n / 16 < std::numeric_limits<int32_t>::max()) {
    // Decode-sized m: the tensor-core GEMV streams W at close to copy bandwidth (gemv.h).
    const cudaError_t e = GemvBf16(x, ldx, w, bias, m, n, k, y, ldy, out_type, stream);
    if (e == cudaSuccess) return true;
    if (error != nullptr) *error = std::string("GemvBf16: ") + cudaGetErrorString(e);
    return false;
  }
  PlanKey key;
  key.m = m;
  key.n = n;
  key.k = k;
  key.ldx = ldx;
  key.ldy = ldy;
  key.out = out_type;
  if (bias != nullptr) {
    key.bias = out_type == GemmOut::kBf16 || impl_->f32_bias_epilogue ? BiasMode::kEpilogue
                                                                      : BiasMode::kRank1;
    key.align_bias = AlignmentOf(bias);
  }
  key.align_x = AlignmentOf(x);
  key.align_w = AlignmentOf(w);
  key.align_y = AlignmentOf(y);
  const Plan* plan = impl_->GetPlan(key, bias, error);
  if (plan == nullptr) return false;
  if (plan->bias_epilogue &&
      !Ok(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias)),
          "BIAS_POINTER", error)) {
    return false;
  }
  if (!impl_->Matmul(*plan, w, x, 0.0f, y, stream, error)) return false;
  return !plan->rank1_bias || impl_->AddBiasRank1(bias, m, n, y, ldy, stream, error);
}

}  // namespace specd::kernels
