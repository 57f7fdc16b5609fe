// Micro-benchmark of the CPU forward pass: prefill tokens/s for one long prompt and
// decode tokens/s at batch 1 (KV cache warm), best of N runs. Usage:
//   model_bench MODEL_DIR [--prompt N] [--decode N] [--threads N] [--repeats N]
// Single-threaded tool (the model uses its own pool).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"

namespace specd {
namespace {

struct BenchArgs {
  std::string dir;
  int32_t prompt_len = 512;
  int32_t decode_len = 128;
  int threads = 0;
  int repeats = 3;
};

bool ParseArgs(int argc, char** argv, BenchArgs* args) {
  if (argc < 2) return false;
  args->dir = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const int value = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--prompt") == 0) {
      args->prompt_len = value;
    } else if (std::strcmp(argv[i], "--decode") == 0) {
      args->decode_len = value;
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      args->threads = value;
    } else if (std::strcmp(argv[i], "--repeats") == 0) {
      args->repeats = value;
    } else {
      return false;
    }
  }
  return args->prompt_len > 0 && args->decode_len > 0 && args->repeats > 0;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Run(const BenchArgs& args) {
  LoadOptions opts;
  opts.num_threads = args.threads;
  auto model = Model::Load(args.dir, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& config = (*model)->config();
  const int32_t total = args.prompt_len + args.decode_len;
  const int32_t num_blocks = BlockTable::BlocksFor(total, 16);
  auto kv = CpuKvCache::Create((*model)->MakeKvCacheSpec(num_blocks));
  if (!kv.ok()) return 1;
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> prompt(args.prompt_len);
  for (int32_t i = 0; i < args.prompt_len; ++i) prompt[i] = (i * 7919 + 13) % config.vocab_size;
  std::vector<float> logits;

  // Best of `repeats` runs of each phase (the cache is simply overwritten per run).
  double prefill_s = 1e30, decode_s = 1e30;
  for (int rep = 0; rep < args.repeats; ++rep) {
    auto start = std::chrono::steady_clock::now();
    SequenceInput seq{prompt, 0, table, false};
    if (!(*model)->Forward({&seq, 1}, **kv, &logits).ok()) return 1;
    prefill_s = std::min(prefill_s, Seconds(start));
    int32_t token = 1;
    start = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < args.decode_len; ++i) {
      logits.clear();
      SequenceInput step{{&token, 1}, args.prompt_len + i, table, false};
      if (!(*model)->Forward({&step, 1}, **kv, &logits).ok()) return 1;
      token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    decode_s = std::min(decode_s, Seconds(start));
  }
  std::printf("model %s: %s, hidden %d, %d layers, vocab %d\n", args.dir.c_str(),
              config.architecture.c_str(), config.hidden_size, config.num_layers,
              config.vocab_size);
  std::printf("prefill: %d tokens in %.3f s = %.0f tokens/s\n", args.prompt_len, prefill_s,
              args.prompt_len / prefill_s);
  std::printf("decode:  %d tokens in %.3f s = %.1f tokens/s (batch 1, context %d..%d)\n",
              args.decode_len, decode_s, args.decode_len / decode_s, args.prompt_len, total);
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  specd::BenchArgs args;
  if (!specd::ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: %s MODEL_DIR [--prompt N] [--decode N] [--threads N] [--repeats N]\n",
                 argv[0]);
    return 2;
  }
  return specd::Run(args);
}
