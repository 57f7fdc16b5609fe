// Internal to the CUDA EAGLE-3 head (cuda_eagle3.cc, cuda_eagle3_load.cc, cuda_eagle3_graphs.cc):
// a kernel launch's error as a Status naming the head, and bf16 pointer arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/base/cuda/cuda_util.h"

namespace specd::eagle3_cuda {

inline absl::Status Launch(cudaError_t e, const char* kernel) {
  if (e == cudaSuccess) return absl::OkStatus();
  return cuda::Check(e, absl::StrCat("EAGLE-3 head: ", kernel));
}

inline __nv_bfloat16* Offset(__nv_bfloat16* p, int64_t elems) {
  return reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<uint16_t*>(p) + elems);
}

}  // namespace specd::eagle3_cuda
