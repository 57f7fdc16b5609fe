// Internal to the CUDA EAGLE-3 head (cuda_eagle3.cc, cuda_eagle3_load.cc, cuda_eagle3_graphs.cc,
// cuda_eagle3_rounds.cc): a kernel launch's error as a Status naming the head, bf16 pointer
// arithmetic, and the graphs' replay-or-capture.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/base/status.h"

namespace specd::eagle3_cuda {

inline absl::Status Launch(cudaError_t e, const char* kernel) {
  if (e == cudaSuccess) return absl::OkStatus();
  return cuda::Check(e, absl::StrCat("EAGLE-3 head: ", kernel));
}

inline __nv_bfloat16* Offset(__nv_bfloat16* p, int64_t elems) {
  return reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<uint16_t*>(p) + elems);
}

// SPECD_EAGLE3_ROUND_GRAPHS=0 turns round graphs off (the catch-up runs eagerly, drafts 2..K as
// one chained graph), kept for measuring what they save, side by side. Read once per process.
inline bool RoundGraphsEnabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("SPECD_EAGLE3_ROUND_GRAPHS");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

// Replays graphs[key], or on first use runs `enqueue` eagerly (which also lets cuBLASLt choose its
// algorithms outside capture) and captures it for the next calls. Capturing runs nothing; a
// second run would not repeat the first, as a step overwrites the prenorm half the one before it
// read.
template <typename Key>
absl::Status ReplayOrCapture(std::map<Key, cudaGraphExec_t>& graphs, const Key& key,
                             cudaStream_t st, const std::function<absl::Status()>& enqueue,
                             const char* what) {
  auto it = graphs.find(key);
  if (it != graphs.end()) {
    return cuda::Check(cudaGraphLaunch(it->second, st), "EAGLE-3 graph launch");
  }
  SPECD_RETURN_IF_ERROR(enqueue());
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), what));
  SPECD_ASSIGN_OR_RETURN(cudaGraphExec_t exec, cuda::CaptureGraph(st, enqueue, what));
  graphs[key] = exec;
  return absl::OkStatus();
}

}  // namespace specd::eagle3_cuda
