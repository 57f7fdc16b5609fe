// attention_bench: paged decode attention (kernels::PagedDecodeAttention: the split-KV kernel and
// its combine) against the device-to-device copy bandwidth measured in the same run, at
// Llama-3.1-8B shapes (32 q heads, 8 kv heads, head_dim 128, block 16), context 32768, batch 1
// and 8. Rate = KV bytes read / time; copy rate = bytes read + written / time. Each number is
// the median of --iters launches timed one by one with CUDA events, rotating over KV caches
// (shuffled block tables) that together exceed L2 several times; the KV data are a random tile
// repeated (setup stays fast), and a few outputs are spot-checked against an fp64 reference so a
// layout bug cannot pass as a rate. A split-count sweep comes first, the result table last.
// --sweep adds tuning probes: wide split sweeps, batch 1 at other contexts (time = fixed cost +
// bytes / rate), and batch 64 x 512 tokens unsplit (batch 1's bytes and CTA count without the
// combine kernel). Last, verification attention (8 queries per sequence over the same KV, through
// PagedPrefillAttention and its split-KV verification kernel) against decode, after a sweep of
// forced split counts around ChooseVerifySplits' choice.
//   attention_bench [--iters N] [--context N] [--sweep 0|1]
// Exit status: 0 when every launch ran and passed its spot check, 1 otherwise, 2 on bad flags,
// 77 when no GPU is visible. One thread.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/check/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/ref/bf16.h"

namespace specd {
namespace {

namespace kc = kernels::check;

constexpr int64_t kTile = int64_t{1} << 20;           // random bf16 values repeated through the KV
constexpr int64_t kRotationBytes = int64_t{1} << 31;  // KV bytes the rotation spans (L2: 50 MB)
constexpr size_t kCopyBytes = size_t{512} << 20;
constexpr int kWarmup = 5;
constexpr int32_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

struct Options {
  int iters = 50;
  int32_t context = 32768;
  bool sweep = false;
};

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--iters") {
      o->iters = std::atoi(argv[i + 1]);
    } else if (arg == "--context") {
      o->context = std::atoi(argv[i + 1]);
    } else if (arg == "--sweep") {
      o->sweep = std::atoi(argv[i + 1]) != 0;
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && o->iters > 0 && o->context > 0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median milliseconds of `iters` calls of launch(i), each between its own pair of events.
template <typename Launch>
double MedianMs(int iters, cudaStream_t stream, const Launch& launch) {
  for (int i = 0; i < kWarmup; ++i) SPECD_CUDA_CHECK(launch(i));
  std::vector<cudaEvent_t> events(2 * iters);
  for (cudaEvent_t& e : events) SPECD_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    SPECD_CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
    SPECD_CUDA_CHECK(launch(i));
    SPECD_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
  }
  SPECD_CUDA_CHECK(cudaEventSynchronize(events.back()));
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float elapsed = 0;
    SPECD_CUDA_CHECK(cudaEventElapsedTime(&elapsed, events[2 * i], events[2 * i + 1]));
    ms[i] = elapsed;
  }
  for (cudaEvent_t& e : events) SPECD_CUDA_CHECK(cudaEventDestroy(e));
  return Median(ms);
}

// Bytes read + written per second by cudaMemcpyAsync device to device.
double CopyGbPerS(int iters, cudaStream_t stream) {
  kc::DeviceBuffer src(kCopyBytes), dst(kCopyBytes);
  SPECD_CUDA_CHECK(cudaMemset(src.as<void>(), 0x3c, kCopyBytes));  // not zeros
  const double ms = MedianMs(iters, stream, [&](int) {
    return cudaMemcpyAsync(dst.as<void>(), src.as<void>(), kCopyBytes, cudaMemcpyDeviceToDevice,
                           stream);
  });
  return 2.0 * kCopyBytes / (ms * 1e6);
}

// Fills n bf16 values at dst with `tile` repeated: one upload, then doubling device copies.
void FillTiled(uint16_t* dst, int64_t n, const std::vector<uint16_t>& tile) {
  const int64_t first = std::min<int64_t>(n, static_cast<int64_t>(tile.size()));
  SPECD_CUDA_CHECK(cudaMemcpy(dst, tile.data(), first * 2, cudaMemcpyHostToDevice));
  for (int64_t filled = first; filled < n; filled *= 2) {
    SPECD_CUDA_CHECK(
        cudaMemcpy(dst + filled, dst, std::min(filled, n - filled) * 2, cudaMemcpyDeviceToDevice));
  }
}

kernels::AttentionShape Shape() {
  kernels::AttentionShape s;
  s.num_q_heads = kHeads;
  s.num_kv_heads = kKvHeads;
  s.head_dim = kHeadDim;
  s.block_size = kBlockSize;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  return s;
}

// `num_sets` independent batches of `batch` sequences of `context` tokens over one KV pool, each
// set's blocks shuffled across the pool (as a long-running block allocator leaves them).
struct DecodeSetup {
  int32_t batch, context, blocks_per_seq, num_sets;
  int64_t pool_blocks, block_values;
  std::vector<uint16_t> tile, q_bits;
  std::vector<int32_t> tables;  // [num_sets, batch, blocks_per_seq]
  kc::DeviceBuffer k_cache, v_cache, block_tables, seq_lens, q, out;

  DecodeSetup(int32_t batch_in, int32_t context_in, std::mt19937_64& rng)
      : batch(batch_in),
        context(context_in),
        blocks_per_seq((context_in + kBlockSize - 1) / kBlockSize),
        num_sets(static_cast<int32_t>(std::max<int64_t>(2, kRotationBytes / KvBytes()))),
        pool_blocks(static_cast<int64_t>(num_sets) * batch * blocks_per_seq),
        block_values(static_cast<int64_t>(kKvHeads) * kBlockSize * kHeadDim),
        k_cache(pool_blocks * block_values * 2),
        v_cache(pool_blocks * block_values * 2),
        block_tables(pool_blocks * sizeof(int32_t)),
        seq_lens(batch * sizeof(int32_t)),
        q(static_cast<size_t>(batch) * kHeads * kHeadDim * 2),
        out(static_cast<size_t>(batch) * kHeads * kHeadDim * 2) {
    tile = kc::RandomBf16(kTile, -1.0f, 1.0f, rng);
    FillTiled(k_cache.as<uint16_t>(), pool_blocks * block_values, tile);
    // V is the tile shifted, so K and V of a token differ.
    std::vector<uint16_t> v_tile(tile.begin() + 4099, tile.end());
    v_tile.insert(v_tile.end(), tile.begin(), tile.begin() + 4099);
    FillTiled(v_cache.as<uint16_t>(), pool_blocks * block_values, v_tile);
    tables.resize(pool_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
    block_tables.Upload(tables);
    seq_lens.Upload(std::vector<int32_t>(batch, context));
    q_bits = kc::RandomBf16(static_cast<size_t>(batch) * kHeads * kHeadDim, -8.0f, 8.0f, rng);
    q.Upload(q_bits);
  }

  int64_t KvBytes() const {
    return static_cast<int64_t>(batch) * context * kKvHeads * kHeadDim * 2 * 2;
  }
  const int32_t* Tables(int set) const {
    return block_tables.as<int32_t>() + static_cast<int64_t>(set) * batch * blocks_per_seq;
  }
  // Element e of the pool holds tile[e % kTile] (K) or v_tile[e % kTile] (V).
  double CacheValue(int64_t element, bool value) const {
    const int64_t i = element % kTile;
    const uint16_t bits = value ? tile[(i + 4099) % kTile] : tile[i];
    return kernels::Bf16ToFloat(bits);
  }
};

cudaError_t LaunchDecode(const DecodeSetup& s, int set, int32_t splits,
                         const kc::DeviceBuffer& workspace, cudaStream_t stream) {
  auto* q = reinterpret_cast<const __nv_bfloat16*>(s.q.as<uint16_t>());
  auto* k = reinterpret_cast<const __nv_bfloat16*>(s.k_cache.as<uint16_t>());
  auto* v = reinterpret_cast<const __nv_bfloat16*>(s.v_cache.as<uint16_t>());
  auto* out = reinterpret_cast<__nv_bfloat16*>(s.out.as<uint16_t>());
  return kernels::PagedDecodeAttention(q, kHeads * kHeadDim, k, v, s.Tables(set), s.blocks_per_seq,
                                       s.seq_lens.as<int32_t>(), s.batch, splits, Shape(), out,
                                       kHeads * kHeadDim, workspace.as<void>(), workspace.bytes(),
                                       stream);
}

// fp64 attention of (seq, head) of set 0, compared with the kernel's bf16 output.
bool SpotCheck(const DecodeSetup& s, const std::vector<uint16_t>& out, int seq, int head) {
  const int kv_head = head / (kHeads / kKvHeads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  std::vector<double> scores(s.context), acc(kHeadDim, 0.0);
  const uint16_t* q = s.q_bits.data() + (static_cast<int64_t>(seq) * kHeads + head) * kHeadDim;
  auto row = [&](int pos) {
    const int64_t block = s.tables[static_cast<int64_t>(seq) * s.blocks_per_seq + pos / kBlockSize];
    return ((block * kKvHeads + kv_head) * kBlockSize + pos % kBlockSize) * kHeadDim;
  };
  for (int pos = 0; pos < s.context; ++pos) {
    double dot = 0;
    for (int d = 0; d < kHeadDim; ++d)
      dot += kernels::Bf16ToFloat(q[d]) * s.CacheValue(row(pos) + d, false);
    scores[pos] = dot * scale;
  }
  const double max_score = *std::max_element(scores.begin(), scores.end());
  double sum = 0, max_ref = 0, max_err = 0;
  for (int pos = 0; pos < s.context; ++pos) {
    const double p = std::exp(scores[pos] - max_score);
    sum += p;
    for (int d = 0; d < kHeadDim; ++d) acc[d] += p * s.CacheValue(row(pos) + d, true);
  }
  const uint16_t* got = out.data() + (static_cast<int64_t>(seq) * kHeads + head) * kHeadDim;
  for (int d = 0; d < kHeadDim; ++d) {
    max_ref = std::max(max_ref, std::abs(acc[d] / sum));
    max_err = std::max(max_err, std::abs(kernels::Bf16ToFloat(got[d]) - acc[d] / sum));
  }
  const bool ok = max_err <= 1e-2 * max_ref + 2e-3;  // a layout bug is O(max_ref) off
  if (!ok) {
    std::printf("  spot check failed: seq %d head %d: max error %.3g, max |ref| %.3g\n", seq, head,
                max_err, max_ref);
  }
  return ok;
}

struct Result {
  int32_t splits;
  double us, kv_gbps;
};

// Median time of `splits`-way launches rotating over the sets.
Result TimeDecode(const DecodeSetup& s, int32_t splits, int iters, cudaStream_t stream) {
  kc::DeviceBuffer workspace(kernels::PagedDecodeWorkspaceBytes(s.batch, splits, Shape()));
  const double ms = MedianMs(iters, stream, [&](int i) {
    return LaunchDecode(s, i % s.num_sets, splits, workspace, stream);
  });
  return {splits, ms * 1e3, s.KvBytes() / (ms * 1e6)};
}

// Verification attention (issue 5): K + 1 = 8 queries per sequence (the last 8 positions,
// causal) over the same KV, through the kernel the engine runs for multi-token chunks
// (PagedPrefillAttention). Median microseconds, rotating over the sets.
// Verification attention: 8 queries per sequence over the same KV, through
// PagedPrefillAttention (which picks the split-KV verification kernel and its split count, given
// the workspace it asks for) or, with splits > 0, PagedVerifyAttention with that many splits.
// Microseconds per launch (median).
double TimeVerify(const DecodeSetup& s, int32_t splits, int iters, cudaStream_t stream) {
  constexpr int32_t kQueries = 8;
  const int64_t tokens = static_cast<int64_t>(s.batch) * kQueries;
  std::mt19937_64 rng(7);
  kc::DeviceBuffer q(static_cast<size_t>(tokens) * kHeads * kHeadDim * 2);
  kc::DeviceBuffer out(static_cast<size_t>(tokens) * kHeads * kHeadDim * 2);
  q.Upload(kc::RandomBf16(static_cast<size_t>(tokens) * kHeads * kHeadDim, -8.0f, 8.0f, rng));
  std::vector<int32_t> cu(s.batch + 1);
  for (int32_t i = 0; i <= s.batch; ++i) cu[i] = i * kQueries;
  kc::DeviceBuffer cu_q_lens(cu.size() * sizeof(int32_t));
  cu_q_lens.Upload(cu);
  kc::DeviceBuffer workspace(splits > 0
                                 ? kernels::PagedVerifyWorkspaceBytes(tokens, splits, Shape())
                                 : kernels::PagedPrefillWorkspaceBytes(tokens, s.batch, Shape()));
  auto* k = reinterpret_cast<const __nv_bfloat16*>(s.k_cache.as<uint16_t>());
  auto* v = reinterpret_cast<const __nv_bfloat16*>(s.v_cache.as<uint16_t>());
  auto* qp = reinterpret_cast<const __nv_bfloat16*>(q.as<uint16_t>());
  auto* op = reinterpret_cast<__nv_bfloat16*>(out.as<uint16_t>());
  const double ms = MedianMs(iters, stream, [&](int i) {
    if (splits > 0) {
      return kernels::PagedVerifyAttention(
          qp, kHeads * kHeadDim, k, v, s.Tables(i % s.num_sets), s.blocks_per_seq,
          cu_q_lens.as<int32_t>(), s.seq_lens.as<int32_t>(), s.batch, tokens, kQueries, splits,
          Shape(), op, kHeads * kHeadDim, workspace.as<void>(), workspace.bytes(), stream);
    }
    return kernels::PagedPrefillAttention(
        qp, kHeads * kHeadDim, k, v, s.Tables(i % s.num_sets), s.blocks_per_seq,
        cu_q_lens.as<int32_t>(), s.seq_lens.as<int32_t>(), s.batch, tokens, kQueries, Shape(), op,
        kHeads * kHeadDim, workspace.as<void>(), workspace.bytes(), stream);
  });
  return ms * 1e3;
}

// Runs set 0 once with `splits` and spot-checks a few outputs.
bool CheckDecode(DecodeSetup& s, int32_t splits, cudaStream_t stream) {
  kc::DeviceBuffer workspace(kernels::PagedDecodeWorkspaceBytes(s.batch, splits, Shape()));
  s.out.Poison();
  SPECD_CUDA_CHECK(LaunchDecode(s, 0, splits, workspace, stream));
  SPECD_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto out = s.out.Download<uint16_t>();
  bool ok = true;
  for (const auto& [seq, head] : {std::pair{0, 0}, std::pair{0, 13}, std::pair{s.batch - 1, 31}}) {
    ok = SpotCheck(s, out, seq, head) && ok;
  }
  return ok;
}

// The --sweep probes (see the file comment); each line's percentages are of `copy_gbps`.
bool RunProbes(const Options& options, int num_sms, double copy_gbps, std::mt19937_64& rng,
               cudaStream_t stream) {
  bool ok = true;
  auto pct = [&](const Result& r) { return 100.0 * r.kv_gbps / copy_gbps; };
  for (const int32_t batch : {1, 8}) {
    DecodeSetup s(batch, options.context, rng);
    std::printf("probe: splits, batch %d:", batch);
    const std::vector<int32_t> splits =
        batch == 1 ? std::vector<int32_t>{8, 16, 24, 33, 44, 50, 66, 88, 99, 132, 198, 256}
                   : std::vector<int32_t>{2, 4, 6, 8, 12, 16, 24};
    for (const int32_t n : splits) {
      const Result r = TimeDecode(s, n, options.iters, stream);
      std::printf("  %d: %.1fus %.1f%%", n, r.us, pct(r));
    }
    std::printf("\n");
  }
  std::printf("probe: batch 1 by context (chosen splits):");
  for (const int32_t context : {4096, 8192, 16384, 65536}) {
    DecodeSetup s(1, context, rng);
    const int32_t chosen = kernels::ChooseDecodeSplits(1, context, num_sms, Shape());
    const Result r = TimeDecode(s, chosen, options.iters, stream);
    std::printf("  %d (%d): %.1fus %.1f%%", context, chosen, r.us, pct(r));
  }
  std::printf("\n");
  {
    DecodeSetup s(64, 512, rng);
    ok = CheckDecode(s, 1, stream) && ok;
    const Result r = TimeDecode(s, 1, options.iters, stream);
    std::printf("probe: batch 64 x 512 tokens, 1 split (no combine): %.1fus %.1f%%\n", r.us,
                pct(r));
  }
  return ok;
}

int Main(int argc, char** argv) {
  Options options;
  if (!ParseArgs(argc, argv, &options)) {
    std::fprintf(stderr, "usage: attention_bench [--iters N] [--context N] [--sweep 0|1]\n");
    return 2;
  }
  if (kc::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device visible\n");
    return kc::kSkipExitCode;
  }
  cudaDeviceProp prop;
  SPECD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("attention_bench: device 0: %s, sm_%d%d, %d SMs, L2 %d MiB; median of %d launches\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              options.iters);
  cudaStream_t stream;
  SPECD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = CopyGbPerS(options.iters, stream);
  std::mt19937_64 rng(20240601);
  bool all_ok = true;
  std::vector<std::pair<DecodeSetup*, Result>> rows;
  std::vector<std::unique_ptr<DecodeSetup>> setups;
  for (const int32_t batch : {1, 8}) {
    setups.push_back(std::make_unique<DecodeSetup>(batch, options.context, rng));
    DecodeSetup& s = *setups.back();
    const int32_t chosen =
        kernels::ChooseDecodeSplits(batch, options.context, prop.multiProcessorCount, Shape());
    all_ok = CheckDecode(s, chosen, stream) && all_ok;
    std::printf("split sweep, batch %d (chosen %d; %d KV sets of %.0f MiB rotate):", batch, chosen,
                s.num_sets, s.KvBytes() / 1048576.0);
    for (const int32_t splits : {chosen / 2, chosen * 3 / 4, chosen * 3 / 2, chosen * 2}) {
      if (splits < 1 || splits == chosen) continue;
      const Result r = TimeDecode(s, splits, options.iters, stream);
      std::printf("  %d: %.1f%%", splits, 100.0 * r.kv_gbps / copy_gbps);
    }
    std::printf("\n");
    rows.emplace_back(setups.back().get(), TimeDecode(s, chosen, options.iters, stream));
  }
  if (options.sweep) {
    all_ok = RunProbes(options, prop.multiProcessorCount, copy_gbps, rng, stream) && all_ok;
  }
  std::printf("memcpy D2D %zu MiB: %.1f GB/s (bytes read + written)\n", kCopyBytes >> 20,
              copy_gbps);
  std::printf("paged decode, Llama-3.1-8B shapes (hq 32, hkv 8, d 128, block 16), context %d:\n",
              options.context);
  std::printf("%-6s %7s %10s %12s %9s %8s\n", "batch", "splits", "us/launch", "KV GB/s", "%memcpy",
              "target");
  for (const auto& [setup, r] : rows) {
    std::printf("%-6d %7d %10.1f %12.1f %8.1f%% %7d%%\n", setup->batch, r.splits, r.us, r.kv_gbps,
                100.0 * r.kv_gbps / copy_gbps, setup->batch == 1 ? 85 : 90);
  }
  std::printf("verification attention (8 queries per sequence, causal, same KV) vs decode:\n");
  for (const auto& [setup, r] : rows) {
    const int32_t chosen = kernels::ChooseVerifySplits(setup->batch, 8, options.context,
                                                       prop.multiProcessorCount, Shape());
    std::printf("verify split sweep, batch %d (chosen %d):", setup->batch, chosen);
    for (const int32_t splits : {chosen / 2, chosen * 2 / 3, chosen * 3 / 2}) {
      if (splits < 1 || splits == chosen || splits > 256) continue;
      std::printf("  %d: %.1fus", splits, TimeVerify(*setup, splits, options.iters, stream));
    }
    std::printf("\n");
  }
  for (const auto& [setup, r] : rows) {
    const double us = TimeVerify(*setup, 0, options.iters, stream);
    std::printf("batch %d: verify %.1f us, decode %.1f us: %.2fx (target <= 1.15x)\n", setup->batch,
                us, r.us, us / r.us);
  }
  SPECD_CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("attention_bench: %s\n", all_ok ? "ok" : "FAILED (spot check)");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
