// Tensor parallelism's weight shards on a real GPU (ctest label gpu; exits 77, "skipped", where
// no GPU is visible): a rank's slices of a checkpoint, and of a dummy model, loaded by
// cuda_weights at TP 2 and 4, equal the same slices of the world-size-1 load, on one GPU; and the
// dummy fill at an offset is the slice of the whole fill; and an NSA checkpoint loads under fla's
// names with its gate rows after v. The TP runner itself (NCCL, two GPUs, timing) is tested in
// cuda_tp_test.cc.
// Data: as cuda_runner_test ($SPECD_SHARED_DIR/models).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runner/cuda/cuda_weights.h"
#include "kernels/cuda/init.h"
#include "kernels/ref/bf16.h"
#include "tests/cuda_test_util.h"

namespace specd {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of tests/cuda_test_util.h

// Device bf16 tensor -> host bits.
std::vector<uint16_t> Download(const __nv_bfloat16* p, int64_t n) {
  std::vector<uint16_t> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// Rows [begin, begin + n) x columns [c0, c0 + nc) of a [rows, cols] matrix.
std::vector<uint16_t> Slice(const std::vector<uint16_t>& m, int64_t cols, int64_t begin, int64_t n,
                            int64_t c0, int64_t nc) {
  std::vector<uint16_t> out;
  for (int64_t r = begin; r < begin + n; ++r) {
    out.insert(out.end(), m.begin() + r * cols + c0, m.begin() + r * cols + c0 + nc);
  }
  return out;
}

// Every tensor of `shard` equals its slice of the world-size-1 load `full` (both on this GPU).
void ExpectShardIsSliceOfWhole(const ModelConfig& c, const TpShard& s, const CudaWeights& full,
                               const CudaWeights& part) {
  const int64_t h = c.hidden_size, hd = c.head_dim, q = c.q_size(), kv = c.kv_size();
  const int64_t ffn = c.intermediate_size, qn = s.q_size(c.head_dim), kn = s.kv_size(c.head_dim);
  const int64_t q0 = s.head_begin * hd, k0 = s.kv_head_begin * hd;
  const std::string where = absl::StrCat("rank ", s.rank, " of ", s.world_size, ": ");
  ASSERT_EQ(part.vocab_begin, s.vocab_begin);
  ASSERT_EQ(part.vocab_rows, s.vocab_local);
  EXPECT_EQ(
      Download(part.embed, s.vocab_local * h),
      Slice(Download(full.embed, int64_t{c.vocab_size} * h), h, s.vocab_begin, s.vocab_local, 0, h))
      << where << "embedding";
  EXPECT_EQ(part.tied, full.tied);
  if (part.tied) {
    EXPECT_EQ(part.lm_head, part.embed) << where;
  }
  EXPECT_EQ(Download(part.lm_head, s.vocab_local * h),
            Slice(Download(full.lm_head, int64_t{c.vocab_size} * h), h, s.vocab_begin,
                  s.vocab_local, 0, h))
      << where << "lm_head";
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const CudaLayerWeights &f = full.layers[l], &p = part.layers[l];
    const std::string at = absl::StrCat(where, "layer ", l, " ");
    const std::vector<uint16_t> qkv = Download(f.qkv, (q + 2 * kv) * h);
    std::vector<uint16_t> want = Slice(qkv, h, q0, qn, 0, h);
    for (int64_t base : {q, q + kv}) {
      const std::vector<uint16_t> kv_rows = Slice(qkv, h, base + k0, kn, 0, h);
      want.insert(want.end(), kv_rows.begin(), kv_rows.end());
    }
    EXPECT_EQ(Download(p.qkv, (qn + 2 * kn) * h), want) << at << "qkv";
    if (c.qkv_bias) {
      const std::vector<uint16_t> b = Download(f.qkv_bias, q + 2 * kv);
      std::vector<uint16_t> wb(b.begin() + q0, b.begin() + q0 + qn);
      for (int64_t base : {q, q + kv}) {
        wb.insert(wb.end(), b.begin() + base + k0, b.begin() + base + k0 + kn);
      }
      EXPECT_EQ(Download(p.qkv_bias, qn + 2 * kn), wb) << at << "qkv bias";
    }
    EXPECT_EQ(Download(p.o_proj, h * qn), Slice(Download(f.o_proj, h * q), q, 0, h, q0, qn))
        << at << "o_proj";
    EXPECT_EQ(p.o_bias != nullptr, f.o_bias != nullptr && s.rank == 0) << at << "o_proj bias";
    const std::vector<uint16_t> gu = Download(f.gate_up, 2 * ffn * h);
    std::vector<uint16_t> wgu = Slice(gu, h, s.intermediate_begin, s.intermediate, 0, h);
    const std::vector<uint16_t> up = Slice(gu, h, ffn + s.intermediate_begin, s.intermediate, 0, h);
    wgu.insert(wgu.end(), up.begin(), up.end());
    EXPECT_EQ(Download(p.gate_up, 2 * s.intermediate * h), wgu) << at << "gate_up";
    EXPECT_EQ(Download(p.down, h * s.intermediate),
              Slice(Download(f.down, h * ffn), ffn, 0, h, s.intermediate_begin, s.intermediate))
        << at << "down";
    EXPECT_EQ(Download(p.input_norm, h), Download(f.input_norm, h)) << at << "input norm";
  }
}

class CudaTpWeightsTest : public ::testing::TestWithParam<const char*> {};

// Real checkpoints (strided o_proj / down columns, Qwen2's q/k/v biases, a tied head) and the
// dummy model, at TP 2 (and TP 4 where the heads allow it: KV heads replicated).
TEST_P(CudaTpWeightsTest, AShardIsItsSliceOfTheWholeModel) {
  const std::string dir = ModelDir(GetParam());
  ASSERT_TRUE(DataPresent(dir));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  for (const bool dummy : {false, true}) {
    const WeightSource source{dir, dummy, 3};
    auto tied = OutputIsTied(*config, source);
    ASSERT_TRUE(tied.ok()) << tied.status();
    auto whole_shard = MakeTpShard(*config, {0, 1});
    ASSERT_TRUE(whole_shard.ok());
    auto whole = LoadCudaWeights(*config, *whole_shard, source, *tied);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(static_cast<int64_t>(whole->storage.bytes()),
              CudaWeightBytes(*config, *whole_shard, *tied));
    for (const int32_t n : {2, 4}) {
      auto shard_bytes = int64_t{0};
      for (int32_t r = 0; r < n; ++r) {
        auto s = MakeTpShard(*config, {r, n});
        if (!s.ok()) break;  // this model's heads do not divide by n
        auto part = LoadCudaWeights(*config, *s, source, *tied);
        ASSERT_TRUE(part.ok()) << part.status();
        shard_bytes += CudaWeightBytes(*config, *s, *tied);
        std::printf("[ %s%s ] rank %d of %d: %lld bytes\n", GetParam(), dummy ? " dummy" : "", r, n,
                    static_cast<long long>(CudaWeightBytes(*config, *s, *tied)));
        ExpectShardIsSliceOfWhole(*config, *s, *whole, *part);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTpWeightsTest,
                         ::testing::Values("tiny-random/llama3", "tiny-random/qwen2",
                                           "tiny-random/qwen3", "codepair/target"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '/' || ch == '-') ch = '_';
                           }
                           return name;
                         });

// An NSA checkpoint (fla's names: model.embeddings, attn_norm, attn.*, mlp_norm) loads with its
// gate logits' rows (g_proj, 3 per query head) after v in the fused projection, each tensor the
// checkpoint's values in bf16.
TEST(CudaNsaWeightsTest, FlaNamesLoadAndTheGateRowsFollowV) {
  const std::string dir = ModelDir("nsa-codepair");
  ASSERT_TRUE(DataPresent(dir));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->is_nsa());
  const WeightSource source{dir, false, 3};
  auto tied = OutputIsTied(*config, source);
  ASSERT_TRUE(tied.ok()) << tied.status();
  auto shard = MakeTpShard(*config, {0, 1});
  ASSERT_TRUE(shard.ok());
  auto w = LoadCudaWeights(*config, *shard, source, *tied);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(static_cast<int64_t>(w->storage.bytes()), CudaWeightBytes(*config, *shard, *tied));
  auto ckpt = SafetensorsCheckpoint::OpenDir(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const int64_t h = config->hidden_size, q = config->q_size(), kv = config->kv_size();
  const int64_t gates = config->gate_size();
  auto bits = [&](const std::string& name, const std::vector<int64_t>& shape) {
    auto f = ckpt->ReadF32(name, shape);
    EXPECT_TRUE(f.ok()) << f.status();
    std::vector<uint16_t> out;
    if (f.ok()) {
      for (float x : *f) out.push_back(kernels::FloatToBf16(x));
    }
    return out;
  };
  EXPECT_EQ(Download(w->embed, int64_t{config->vocab_size} * h),
            bits("model.embeddings.weight", {config->vocab_size, h}));
  for (int32_t l = 0; l < config->num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::vector<uint16_t> qkv = Download(w->layers[l].qkv, (q + 2 * kv + gates) * h);
    std::vector<uint16_t> want = bits(p + "attn.q_proj.weight", {q, h});
    for (const char* part : {"attn.k_proj.weight", "attn.v_proj.weight"}) {
      const std::vector<uint16_t> rows = bits(p + part, {kv, h});
      want.insert(want.end(), rows.begin(), rows.end());
    }
    const std::vector<uint16_t> g = bits(p + "attn.g_proj.weight", {gates, h});
    want.insert(want.end(), g.begin(), g.end());
    EXPECT_EQ(qkv, want) << "layer " << l << ": q, k, v, then the gates";
    EXPECT_EQ(Download(w->layers[l].input_norm, h), bits(p + "attn_norm.weight", {h}));
    EXPECT_EQ(Download(w->layers[l].post_norm, h), bits(p + "mlp_norm.weight", {h}));
  }
}

TEST(CudaTpFillTest, UniformFillAtAnOffsetIsTheSliceOfTheWholeFill) {
  const int64_t n = 50000, first = 12345, m = 20000;
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, (n + m) * 2), cudaSuccess);
  auto* whole = static_cast<__nv_bfloat16*>(d);
  auto* slice = reinterpret_cast<__nv_bfloat16*>(static_cast<uint16_t*>(d) + n);
  ASSERT_EQ(kernels::FillUniformBf16(whole, n, 77, -0.5f, 0.5f, nullptr), cudaSuccess);
  ASSERT_EQ(kernels::FillUniformBf16At(slice, m, 77, first, -0.5f, 0.5f, nullptr), cudaSuccess);
  const std::vector<uint16_t> w = Download(whole, n), s = Download(slice, m);
  EXPECT_TRUE(std::equal(s.begin(), s.end(), w.begin() + first));
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  return specd::cuda_test::RunUnlessNoGpu(argc, argv, "cuda_tp_weights_test");
}
