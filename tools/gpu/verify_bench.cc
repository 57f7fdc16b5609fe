// verify_bench: the verification kernels (kernels/cuda/verify.h) on the batched-verification
// study's synthetic workload: for each sequence k_i ~ Binomial(K, alpha) and the target agrees
// with the drafts before k_i and differs at k_i. Times per call (CUDA events around each launch,
// 20 warm-ups, median and p95 of 200, as the study and tools/gpu/verify_torch_bench.py):
//   ballot      VerifyGreedyBallot (acceptance only)
//   serial      VerifyGreedySerial (acceptance only, the divergent baseline)
//   fused       VerifyGreedyAndPack, fused path: acceptance + prefix sum + packed tokens and slots
//   multiblock  the same outputs through VerifyGreedyBallot + PackAccepted (3 launches)
// over batch {1, 4, 16, 32, 64} x K {4, 8, 16, 64, 128} x alpha {0.3, 0.6, 0.9}; then the fused
// kernel against the multi-block path with KV rows (kv_bytes per row) up to batch 1024 (the
// crossover, and what PreferFusedVerifyPack picks); then the issue-5 summary lines. Every
// configuration is checked once against kernels/ref/verify.h before it is timed.
//   verify_bench [--quick] [--iters N]
// Rows: "row IMPL BATCH K ALPHA KV_BYTES MEDIAN_US P95_US", the format verify_torch_bench.py
// prints and reads back with --compare. Exit status: 0 when everything ran and matched the
// reference, 1 on a mismatch, 2 on bad flags, 77 when no GPU is visible. One thread.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/check/cuda_check.h"
#include "kernels/cuda/verify.h"
#include "kernels/ref/verify.h"

namespace specd {
namespace {

namespace kc = kernels::check;

constexpr int32_t kVocab = 4096;  // the study's synthetic vocabulary
constexpr int kWarmup = 20;

struct Options {
  bool quick = false;
  int iters = 200;
};

struct Config {
  int64_t batch = 0;
  int64_t k = 0;
  double alpha = 0;
  int64_t kv_bytes = 0;
};

struct Timing {
  double median_us = 0;
  double p95_us = 0;
};

// The study's generator (seed 7): drafts uniform over the vocabulary, k_i ~ Binomial(K, alpha),
// targets equal to the drafts before k_i and different at k_i; KV slots and rows random.
struct HostInputs {
  std::vector<int32_t> cu, drafts, targets, slots;
  std::vector<uint8_t> kv;
};

HostInputs MakeInputs(const Config& c) {
  std::mt19937_64 rng(7 + c.batch * 1000003 + c.k * 1009 + static_cast<int64_t>(c.alpha * 100));
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  HostInputs in;
  in.cu.resize(c.batch + 1);
  for (int64_t i = 0; i <= c.batch; ++i) in.cu[i] = static_cast<int32_t>(i * c.k);
  in.drafts.resize(c.batch * c.k);
  for (int32_t& d : in.drafts) d = token(rng);
  in.targets.resize(c.batch * (c.k + 1));
  for (int64_t i = 0; i < c.batch; ++i) {
    const int32_t accepted = std::binomial_distribution<int32_t>(c.k, c.alpha)(rng);
    int32_t* t = in.targets.data() + i * (c.k + 1);
    for (int64_t j = 0; j <= c.k; ++j) t[j] = j < c.k ? in.drafts[i * c.k + j] : token(rng);
    if (accepted < c.k) t[accepted] = (t[accepted] + 1 + token(rng) % (kVocab - 1)) % kVocab;
  }
  in.slots.resize(in.targets.size());
  for (int32_t& s : in.slots) s = static_cast<int32_t>(rng() % (1u << 24));
  in.kv.resize(in.targets.size() * c.kv_bytes);  // up to ~0.5 GB: 8 random bytes per draw
  for (size_t i = 0; i < in.kv.size(); i += 8) {
    const uint64_t bits = rng();
    std::memcpy(in.kv.data() + i, &bits, std::min<size_t>(8, in.kv.size() - i));
  }
  return in;
}

// Device buffers of one configuration and its outputs.
class Workload {
 public:
  explicit Workload(const Config& c)
      : config_(c),
        in_(MakeInputs(c)),
        rows_(static_cast<int64_t>(in_.targets.size())),
        cu_(in_.cu.size() * 4),
        drafts_(in_.drafts.size() * 4),
        targets_(in_.targets.size() * 4),
        slots_in_(in_.slots.size() * 4),
        kv_(in_.kv.size()),
        accepted_(c.batch * 4),
        next_(c.batch * 4),
        cu_committed_((c.batch + 1) * 4),
        tokens_(rows_ * 4),
        slots_out_(rows_ * 4),
        packed_kv_(in_.kv.size()) {
    cu_.Upload(in_.cu);
    drafts_.Upload(in_.drafts);
    targets_.Upload(in_.targets);
    slots_in_.Upload(in_.slots);
    kv_.Upload(in_.kv);
  }

  kernels::DraftLayout Layout() const { return {cu_.as<int32_t>(), config_.batch, config_.k}; }

  cudaError_t Ballot(cudaStream_t s) {
    return kernels::VerifyGreedyBallot(Layout(), drafts_.as<int32_t>(), targets_.as<int32_t>(),
                                       accepted_.as<int32_t>(), next_.as<int32_t>(), s);
  }
  cudaError_t Serial(cudaStream_t s) {
    return kernels::VerifyGreedySerial(Layout(), drafts_.as<int32_t>(), targets_.as<int32_t>(),
                                       accepted_.as<int32_t>(), next_.as<int32_t>(), s);
  }
  cudaError_t Pack(kernels::VerifyPackPath path, cudaStream_t s) {
    const kernels::PackArgs pack{cu_committed_.as<int32_t>(),
                                 tokens_.as<int32_t>(),
                                 slots_in_.as<int32_t>(),
                                 slots_out_.as<int32_t>(),
                                 kv_.as<void>(),
                                 packed_kv_.as<void>(),
                                 config_.kv_bytes};
    return kernels::VerifyGreedyAndPack(Layout(), drafts_.as<int32_t>(), targets_.as<int32_t>(),
                                        accepted_.as<int32_t>(), next_.as<int32_t>(), pack, path,
                                        s);
  }

  void PoisonOutputs() {
    for (kc::DeviceBuffer* b :
         {&accepted_, &next_, &cu_committed_, &tokens_, &slots_out_, &packed_kv_}) {
      b->Poison();
    }
  }

  // Compares the last launch's outputs with the reference; `packed` when it packed too.
  bool MatchesReference(bool packed) const {
    const kernels::ref::DraftLayout layout{in_.cu.data(), config_.batch, config_.k};
    std::vector<int32_t> accepted(config_.batch), next(config_.batch);
    kernels::ref::VerifyGreedy(layout, in_.drafts.data(), in_.targets.data(), accepted.data(),
                               next.data());
    bool ok = accepted_.Download<int32_t>() == accepted && next_.Download<int32_t>() == next;
    if (!packed) return ok;
    std::vector<int32_t> cu(config_.batch + 1), tokens(rows_, -1), slots(rows_, -1);
    std::vector<uint8_t> kv(in_.kv.size(), 0xff);
    const kernels::ref::PackArgs pack{cu.data(),     tokens.data(), in_.slots.data(), slots.data(),
                                      in_.kv.data(), kv.data(),     config_.kv_bytes};
    kernels::ref::PackAccepted(layout, in_.drafts.data(), accepted.data(), next.data(), pack);
    ok = ok && cu_committed_.Download<int32_t>() == cu && tokens_.Download<int32_t>() == tokens &&
         slots_out_.Download<int32_t>() == slots;
    if (config_.kv_bytes > 0) ok = ok && packed_kv_.Download<uint8_t>() == kv;
    return ok;
  }

 private:
  Config config_;
  HostInputs in_;
  int64_t rows_;                   // batch * (K + 1) verified positions
  kc::DeviceBuffer cu_;            // [batch + 1] int32
  kc::DeviceBuffer drafts_;        // [batch * K] int32
  kc::DeviceBuffer targets_;       // [rows] int32
  kc::DeviceBuffer slots_in_;      // [rows] int32
  kc::DeviceBuffer kv_;            // [rows, kv_bytes]
  kc::DeviceBuffer accepted_;      // [batch] int32
  kc::DeviceBuffer next_;          // [batch] int32
  kc::DeviceBuffer cu_committed_;  // [batch + 1] int32
  kc::DeviceBuffer tokens_;        // [rows] int32
  kc::DeviceBuffer slots_out_;     // [rows] int32
  kc::DeviceBuffer packed_kv_;     // [rows, kv_bytes]
};

// Per-call times: an event pair around each launch, one synchronisation at the end (the study's
// protocol; verify_torch_bench.py does the same).
Timing TimeCalls(const std::function<cudaError_t(cudaStream_t)>& launch, int iters) {
  for (int i = 0; i < kWarmup; ++i) SPECD_CUDA_CHECK(launch(nullptr));
  std::vector<cudaEvent_t> start(iters), stop(iters);
  for (int i = 0; i < iters; ++i) {
    SPECD_CUDA_CHECK(cudaEventCreate(&start[i]));
    SPECD_CUDA_CHECK(cudaEventCreate(&stop[i]));
  }
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < iters; ++i) {
    SPECD_CUDA_CHECK(cudaEventRecord(start[i], nullptr));
    SPECD_CUDA_CHECK(launch(nullptr));
    SPECD_CUDA_CHECK(cudaEventRecord(stop[i], nullptr));
  }
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    SPECD_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = ms * 1e3;
    SPECD_CUDA_CHECK(cudaEventDestroy(start[i]));
    SPECD_CUDA_CHECK(cudaEventDestroy(stop[i]));
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 95 / 100)]};
}

using Key = std::tuple<std::string, int64_t, int64_t, double, int64_t>;

class Bench {
 public:
  explicit Bench(const Options& options) : options_(options) {}

  // Checks one implementation on a configuration, times it and prints its row.
  bool Run(const std::string& impl, const Config& c, Workload& w, bool packs,
           const std::function<cudaError_t(cudaStream_t)>& launch) {
    w.PoisonOutputs();
    SPECD_CUDA_CHECK(launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    if (!w.MatchesReference(packs)) {
      std::printf("MISMATCH %s batch=%lld K=%lld alpha=%.2f kv=%lld\n", impl.c_str(),
                  static_cast<long long>(c.batch), static_cast<long long>(c.k), c.alpha,
                  static_cast<long long>(c.kv_bytes));
      return false;
    }
    const Timing t = TimeCalls(launch, options_.iters);
    std::printf("row %-12s %5lld %4lld %5.2f %6lld %9.2f %9.2f\n", impl.c_str(),
                static_cast<long long>(c.batch), static_cast<long long>(c.k), c.alpha,
                static_cast<long long>(c.kv_bytes), t.median_us, t.p95_us);
    results_[{impl, c.batch, c.k, c.alpha, c.kv_bytes}] = t;
    return true;
  }

  bool Sweep() {
    std::vector<int64_t> batches = {1, 4, 16, 32, 64}, ks = {4, 8, 16, 64, 128};
    std::vector<double> alphas = {0.3, 0.6, 0.9};
    if (options_.quick) {
      batches = {1, 32};
      ks = {8, 128};
      alphas = {0.9};
    }
    std::printf("# sweep: acceptance + packing of tokens and KV slots (kv_bytes 0)\n");
    PrintHeader();
    bool ok = true;
    for (int64_t batch : batches) {
      for (int64_t k : ks) {
        for (double alpha : alphas) {
          const Config c{batch, k, alpha, 0};
          Workload w(c);
          using kernels::VerifyPackPath;
          ok &= Run("ballot", c, w, false, [&](cudaStream_t s) { return w.Ballot(s); });
          ok &= Run("serial", c, w, false, [&](cudaStream_t s) { return w.Serial(s); });
          ok &= Run("fused", c, w, true,
                    [&](cudaStream_t s) { return w.Pack(VerifyPackPath::kFused, s); });
          ok &= Run("multiblock", c, w, true,
                    [&](cudaStream_t s) { return w.Pack(VerifyPackPath::kMultiBlock, s); });
        }
      }
    }
    return ok;
  }

  // Fused against multi-block with KV rows: the crossover in batch and row size.
  bool Crossover() {
    std::vector<int64_t> batches = {1, 16, 32, 64, 128, 256, 512, 1024}, kv = {0, 256, 1024, 4096};
    std::vector<int64_t> ks = {8, 128};
    if (options_.quick) {
      batches = {32, 256};
      kv = {0, 4096};
    }
    std::printf("# crossover: fused vs multi-block, alpha 0.9, KV rows of kv_bytes\n");
    PrintHeader();
    bool ok = true;
    for (int64_t k : ks) {
      for (int64_t bytes : kv) {
        for (int64_t batch : batches) {
          const Config c{batch, k, 0.9, bytes};
          Workload w(c);
          using kernels::VerifyPackPath;
          ok &= Run("fused", c, w, true,
                    [&](cudaStream_t s) { return w.Pack(VerifyPackPath::kFused, s); });
          ok &= Run("multiblock", c, w, true,
                    [&](cudaStream_t s) { return w.Pack(VerifyPackPath::kMultiBlock, s); });
        }
      }
    }
    PrintCrossover(ks, kv, batches);
    return ok;
  }

  void Summary() const {
    std::printf("# summary\n");
    const auto* ballot = Find("ballot", 32, 128, 0.9, 0);
    const auto* serial = Find("serial", 32, 128, 0.9, 0);
    if (ballot && serial) {
      const double ratio = serial->median_us / ballot->median_us;
      std::printf(
          "ballot vs serial at batch 32 K 128 alpha 0.9: %.2f us vs %.2f us = %.2fx "
          "(target >= 1.5x: %s)\n",
          ballot->median_us, serial->median_us, ratio, ratio >= 1.5 ? "met" : "NOT met");
    }
    std::printf(
        "PyTorch ratios (target >= 10x at batch <= 32, K 8): "
        "python3 tools/gpu/verify_torch_bench.py --compare <this output>\n");
  }

 private:
  static void PrintHeader() {
    std::printf("row %-12s %5s %4s %5s %6s %9s %9s\n", "impl", "batch", "K", "alpha", "kv_B",
                "median_us", "p95_us");
  }

  const Timing* Find(const std::string& impl, int64_t batch, int64_t k, double alpha,
                     int64_t kv) const {
    const auto it = results_.find({impl, batch, k, alpha, kv});
    return it == results_.end() ? nullptr : &it->second;
  }

  // One line per (K, kv_bytes): the fused/multi-block ratio per batch, the largest batch where
  // the fused kernel still wins, and the batch where the auto rule switches.
  void PrintCrossover(const std::vector<int64_t>& ks, const std::vector<int64_t>& kv,
                      const std::vector<int64_t>& batches) const {
    std::printf("# crossover table: fused time / multi-block time per batch (<1: fused wins)\n");
    for (int64_t k : ks) {
      for (int64_t bytes : kv) {
        std::printf("crossover K=%-3lld kv_B=%-5lld", static_cast<long long>(k),
                    static_cast<long long>(bytes));
        int64_t last_win = 0, auto_switch = 0;
        for (int64_t batch : batches) {
          const auto* f = Find("fused", batch, k, 0.9, bytes);
          const auto* m = Find("multiblock", batch, k, 0.9, bytes);
          if (!f || !m) continue;
          const double ratio = f->median_us / m->median_us;
          std::printf(" b%lld:%.2f", static_cast<long long>(batch), ratio);
          if (ratio < 1.0) last_win = batch;
          const kernels::DraftLayout layout{nullptr, batch, k};
          if (auto_switch == 0 && !kernels::PreferFusedVerifyPack(layout, bytes)) {
            auto_switch = batch;
          }
        }
        std::printf("  | fused wins up to batch %lld; auto switches to multi-block at %s\n",
                    static_cast<long long>(last_win),
                    auto_switch ? std::to_string(auto_switch).c_str() : "none");
      }
    }
  }

  Options options_;
  std::map<Key, Timing> results_;
};

bool ParseArgs(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      options->quick = true;
    } else if (arg == "--iters" && i + 1 < argc) {
      options->iters = std::atoi(argv[++i]);
      if (options->iters < 1) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  specd::Options options;
  if (!specd::ParseArgs(argc, argv, &options)) {
    std::fprintf(stderr, "usage: verify_bench [--quick] [--iters N]\n");
    return 2;
  }
  if (specd::kernels::check::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "verify_bench: no CUDA device\n");
    return specd::kernels::check::kSkipExitCode;
  }
  cudaDeviceProp prop{};
  SPECD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# verify_bench on %s (%d SMs), %d iterations after %d warm-ups, median/p95 us\n",
              prop.name, prop.multiProcessorCount, options.iters, specd::kWarmup);
  specd::Bench bench(options);
  bool ok = bench.Sweep();
  ok &= bench.Crossover();
  bench.Summary();
  return ok ? 0 : 1;
}
