// Paged attention kernel templates (layer 1 of kernels/cuda; launchers and their contracts in
// attention.h / attention.cu), one header per kernel family so each stays readable:
//   attention_common.cuh   constants, PTX wrappers, softmax helpers, the KV-cache write
//   attention_decode.cuh   split-KV decode (registers)
//   attention_decode_pipe.cuh  split-KV decode through a cp.async ring (head_dim 128)
//   attention_prefill.cuh  prefill (flash-attention 2 over the paged cache)
//   attention_verify.cuh   split-KV attention for short query runs (speculative verification)
//   attention_combine.cuh  the merge of split-KV partial rows (decode and verification)
// Include from .cu files only.
#pragma once

#include "kernels/cuda/attention_combine.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_decode_pipe.cuh"
#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/attention_verify.cuh"
