// decode_bench: the CUDA runner end to end on a model built from config.json alone (random bf16
// weights, --load-format dummy), against ceilings measured in the same process: the device's
// copy bandwidth (the decode roofline) and its bf16 GEMM rate (the prefill ceiling). It times
// decode steps at batch 1 per context with their roofline ratio, decode throughput per batch,
// time to first token per prompt length and prefill TFLOP/s, then prints the targets of issue 4.
//   decode_bench --model-dir ../shared/models/shapes/llama-3.1-8b [--quick]
// Exit status: 0 when every measurement ran (whether or not it met its target), 1 when one
// failed, 2 on bad arguments, 77 when no GPU is visible. One thread.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/base/status.h"
#include "engine/parallel/tp_group.h"
#include "engine/runner/model_runner.h"
#include "kernels/check/cuda_check.h"
#include "tools/gpu/decode_bench_roofline.h"

namespace specd::decode_bench {
namespace {

namespace kc = kernels::check;
using Clock = std::chrono::steady_clock;

constexpr double kDecodeTargetShort = 0.85;  // of the roofline, contexts below kLongContext
constexpr double kDecodeTargetLong = 0.80;   // from kLongContext on
constexpr int32_t kLongContext = 16384;
constexpr double kPrefillTarget = 0.60;  // of the bf16 GEMM rate
constexpr int64_t kGemmSize = 8192;
constexpr size_t kCopyBytes = size_t{1} << 30;

struct Options {
  std::string model_dir;
  std::vector<int32_t> contexts = {512, 32768};             // batch-1 decode step
  std::vector<int32_t> batches = {1, 8, 32, 64};            // decode throughput
  std::vector<int32_t> ttft_prompts = {1024, 8192, 32768};  // time to first token
  int32_t batch_context = 512;                              // context of each throughput sequence
  int32_t prefill_tokens = 4096;
  int32_t max_model_len = 32768 + 1024;
  int32_t max_num_batched_tokens = 8192;
  double gpu_memory_utilization = 0.9;
  int32_t warmup_steps = 8;
  int32_t decode_steps = 64;  // timed decode steps per measurement (median)
  int32_t repeats = 3;        // timed prefills per measurement (median), after one warm-up
  int32_t copy_repeats = 20;  // copies and GEMMs (median)
  // Tensor parallelism: the runner is rank 0 of a group of this many GPUs (cuda:0..N-1), its
  // workers `specd worker` processes of --specd; rooflines are per GPU (bytes / N).
  int32_t tensor_parallel_size = 1;
  std::string specd;
};

constexpr char kUsage[] =
    "usage: decode_bench --model-dir DIR [--quick] [--contexts 512,32768] [--batches 1,8,32,64]\n"
    "         [--ttft 1024,8192,32768] [--prefill-tokens 4096] [--batch-context 512]\n"
    "         [--max-model-len 33792] [--max-num-batched-tokens 8192]\n"
    "         [--gpu-memory-utilization 0.9] [--decode-steps 64] [--repeats 3]\n"
    "         [--tensor-parallel-size N --specd PATH]\n"
    "  DIR holds a config.json (weights are random, made on the device).\n"
    "  --quick: contexts 512, batches 1,8, ttft 1024, 16 decode steps, 1 repeat.\n";

bool ParseList(const std::string& text, std::vector<int32_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) return false;
    out->push_back(v);
  }
  return !out->empty();
}

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") {  // first, so that explicit flags override it
      o->contexts = {512};
      o->batches = {1, 8};
      o->ttft_prompts = {1024};
      o->decode_steps = 16;
      o->repeats = 1;
      o->copy_repeats = 5;
    }
  }
  using Setter = std::function<bool(const std::string&)>;
  auto to_int = [](int32_t* field) {
    return Setter([=](auto& v) { return absl::SimpleAtoi(v, field); });
  };
  auto to_list = [](std::vector<int32_t>* field) {
    return Setter([=](auto& v) { return ParseList(v, field); });
  };
  const std::vector<std::pair<std::string, Setter>> flags = {
      {"--model-dir",
       [o](auto& v) {
         o->model_dir = v;
         return true;
       }},
      {"--contexts", to_list(&o->contexts)},
      {"--tensor-parallel-size", to_int(&o->tensor_parallel_size)},
      {"-tp", to_int(&o->tensor_parallel_size)},
      {"--specd", Setter([o](auto& v) { return o->specd = v, true; })},
      {"--batches", to_list(&o->batches)},
      {"--ttft", to_list(&o->ttft_prompts)},
      {"--prefill-tokens", to_int(&o->prefill_tokens)},
      {"--batch-context", to_int(&o->batch_context)},
      {"--max-model-len", to_int(&o->max_model_len)},
      {"--max-num-batched-tokens", to_int(&o->max_num_batched_tokens)},
      {"--gpu-memory-utilization",
       [o](auto& v) { return absl::SimpleAtod(v, &o->gpu_memory_utilization); }},
      {"--decode-steps", to_int(&o->decode_steps)},
      {"--repeats", to_int(&o->repeats)},
  };
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") continue;
    auto flag =
        std::find_if(flags.begin(), flags.end(), [&](auto& f) { return f.first == argv[i]; });
    if (flag == flags.end() || i + 1 >= argc || !flag->second(argv[++i])) return false;
  }
  return !o->model_dir.empty() && o->decode_steps > 0 && o->repeats > 0 && o->prefill_tokens > 0 &&
         o->batch_context > 0 && o->max_num_batched_tokens > 0;
}

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// ---- Driving the runner the way the engine does: ragged batches over paged KV.

// Block ids handed out in order from [0, num_blocks); Reset() frees them all at once.
class KvBlocks {
 public:
  KvBlocks(int32_t num_blocks, int32_t block_size) : num_blocks_(num_blocks), size_(block_size) {}
  void Reset() { next_ = 0; }
  // Extends `table` until it covers num_tokens tokens.
  absl::Status Cover(std::vector<int32_t>* table, int64_t num_tokens) {
    while (static_cast<int64_t>(table->size()) * size_ < num_tokens) {
      if (next_ == num_blocks_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("all ", num_blocks_, " KV blocks in use (lower the contexts or batches)"));
      }
      table->push_back(next_++);
    }
    return absl::OkStatus();
  }

 private:
  int32_t num_blocks_, size_, next_ = 0;
};

SamplingParams GreedyParams() {
  SamplingParams params;
  params.temperature = 0.0f;
  return params;
}

// One greedy request, as the engine would hold it.
struct Sequence {
  Sequence(std::vector<int32_t> prompt, uint64_t seed)
      : tokens(std::move(prompt)),
        prompt_len(static_cast<int32_t>(tokens.size())),
        params(GreedyParams()),
        seed(seed),
        sampler(params, seed) {}
  std::vector<int32_t> tokens;  // [prompt_len + drawn] prompt, then the drawn ids
  int32_t prompt_len = 0;
  int32_t num_cached = 0;  // tokens whose KV is in the cache
  std::vector<int32_t> block_table;
  SamplingParams params;
  uint64_t seed = 0;
  Sampler sampler;
  TokenHistory history;
};
using Sequences = std::vector<std::unique_ptr<Sequence>>;

class Driver {
 public:
  Driver(ModelRunner* runner, int32_t max_step_tokens)
      : runner_(runner),
        max_step_tokens_(max_step_tokens),
        blocks_(runner->num_kv_blocks(), runner->block_size()),
        rng_(1234) {}

  int32_t max_model_len() const { return runner_->max_model_len(); }

  // `num` sequences of `prompt_len` random ids (never zeros), on freshly reset KV blocks.
  Sequences NewSequences(int32_t num, int32_t prompt_len) {
    blocks_.Reset();
    std::uniform_int_distribution<int32_t> id(1, runner_->config().vocab_size - 1);
    Sequences seqs;
    for (int32_t i = 0; i < num; ++i) {
      std::vector<int32_t> prompt(prompt_len);
      for (int32_t& t : prompt) t = id(rng_);
      seqs.push_back(std::make_unique<Sequence>(std::move(prompt), rng_()));
    }
    return seqs;
  }

  // Runs every prompt in steps of at most max_step_tokens (sequences packed together, the last
  // chunk of each drawing its first token).
  absl::Status Prefill(const Sequences& seqs) {
    size_t first = 0;  // first sequence with prompt tokens left
    while (first < seqs.size()) {
      std::vector<SequenceInput> batch;
      std::vector<Sequence*> chunk_seqs, drawn;
      std::vector<SampleRow> rows;
      int32_t budget = max_step_tokens_;
      for (size_t i = first; i < seqs.size() && budget > 0; ++i) {
        Sequence& s = *seqs[i];
        const int32_t n = std::min(s.prompt_len - s.num_cached, budget);
        SPECD_RETURN_IF_ERROR(blocks_.Cover(&s.block_table, s.num_cached + n));
        batch.push_back({std::span<const int32_t>(s.tokens).subspan(s.num_cached, n), s.num_cached,
                         s.block_table, false});
        chunk_seqs.push_back(&s);
        if (s.num_cached + n == s.prompt_len) {
          rows.push_back(RowOf(s, static_cast<int32_t>(batch.size()) - 1));
          drawn.push_back(&s);
        }
        budget -= n;
      }
      SPECD_RETURN_IF_ERROR(Run(batch, rows, drawn));
      for (size_t i = 0; i < batch.size(); ++i) {
        chunk_seqs[i]->num_cached += static_cast<int32_t>(batch[i].tokens.size());
      }
      while (first < seqs.size() && seqs[first]->num_cached == seqs[first]->prompt_len) ++first;
    }
    return absl::OkStatus();
  }

  // One decode step of every (prefilled) sequence: milliseconds of Step; adds the keys it
  // attends to, over all sequences, to *keys_read.
  absl::StatusOr<double> Decode(const Sequences& seqs, const ModelCosts& costs,
                                int64_t* keys_read) {
    std::vector<SequenceInput> batch;
    std::vector<SampleRow> rows;
    std::vector<Sequence*> drawn;
    for (const std::unique_ptr<Sequence>& s : seqs) {
      SPECD_RETURN_IF_ERROR(blocks_.Cover(&s->block_table, s->num_cached + 1));
      batch.push_back(
          {std::span<const int32_t>(s->tokens).last(1), s->num_cached, s->block_table, false});
      rows.push_back(RowOf(*s, static_cast<int32_t>(batch.size()) - 1));
      drawn.push_back(s.get());
      *keys_read += KeysRead(costs, s->num_cached);
    }
    const Clock::time_point start = Clock::now();
    SPECD_RETURN_IF_ERROR(Run(batch, rows, drawn));
    const double ms = MsSince(start);
    for (Sequence* s : drawn) ++s->num_cached;
    return ms;
  }

  // One greedy verification step as the engine runs it (speculation issue 5): each sequence's
  // last token plus k draft ids (random), a row at every one of the k + 1 positions (the
  // target's choice after each). Milliseconds of Step. Nothing is committed: the next call
  // overwrites the same KV slots.
  absl::StatusOr<double> Verify(const Sequences& seqs, int32_t k) {
    std::vector<SequenceInput> batch;
    std::vector<SampleRow> rows;
    std::vector<std::vector<int32_t>> chunks;
    chunks.reserve(seqs.size());
    std::uniform_int_distribution<int32_t> id(1, runner_->config().vocab_size - 1);
    for (const std::unique_ptr<Sequence>& s : seqs) {
      SPECD_RETURN_IF_ERROR(blocks_.Cover(&s->block_table, s->num_cached + k + 1));
      std::vector<int32_t>& chunk = chunks.emplace_back(1, s->tokens.back());
      for (int32_t j = 0; j < k; ++j) chunk.push_back(id(rng_));
      batch.push_back({chunk, s->num_cached, s->block_table, false});
      for (int32_t j = 0; j <= k; ++j) {
        SampleRow row = RowOf(*s, static_cast<int32_t>(batch.size()) - 1);
        row.token = j;
        rows.push_back(row);
      }
    }
    const Clock::time_point start = Clock::now();
    out_.clear();
    SPECD_RETURN_IF_ERROR(runner_->Step(batch, rows, &out_));
    return MsSince(start);
  }

 private:
  static SampleRow RowOf(Sequence& s, int32_t chunk) {
    SampleRow row;
    row.chunk = chunk;
    row.sampler = &s.sampler;
    row.params = &s.params;
    row.history = &s.history;
    row.seed = s.seed;
    row.num_generated = static_cast<int64_t>(s.tokens.size()) - s.prompt_len;
    return row;
  }

  // Step, then each drawn id appended to its sequence.
  absl::Status Run(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                   std::span<Sequence* const> drawn) {
    out_.clear();
    SPECD_RETURN_IF_ERROR(runner_->Step(batch, rows, &out_));
    if (out_.size() != rows.size()) {
      return absl::InternalError(
          absl::StrCat("Step drew ", out_.size(), " ids for ", rows.size(), " rows"));
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      if (out_[i].id < 0 || out_[i].id >= runner_->config().vocab_size) {
        return absl::InternalError(absl::StrCat("Step drew id ", out_[i].id, " (outside vocab)"));
      }
      drawn[i]->tokens.push_back(out_[i].id);
    }
    return absl::OkStatus();
  }

  ModelRunner* runner_;
  int32_t max_step_tokens_;
  KvBlocks blocks_;
  std::mt19937_64 rng_;
  std::vector<SampleResult> out_;
};

// ---- Measurements, each a row of the final table.

struct Row {
  std::string metric, value, target, ratio, verdict;
};

struct DecodeTiming {
  double ms_per_step = 0;    // median
  double keys_per_step = 0;  // mean keys attended per step, summed over the batch
};

// `batch` sequences with `context` prompt tokens each: prefill, warm-up steps, then the median
// of options.decode_steps timed steps.
absl::StatusOr<DecodeTiming> TimeDecode(Driver& driver, const ModelCosts& costs, int32_t batch,
                                        int32_t context, const Options& o) {
  if (context + o.warmup_steps + o.decode_steps + 1 > driver.max_model_len()) {
    return absl::InvalidArgumentError(absl::StrCat("context ", context, " + steps exceeds ",
                                                   "max_model_len ", driver.max_model_len()));
  }
  Sequences seqs = driver.NewSequences(batch, context);
  SPECD_RETURN_IF_ERROR(driver.Prefill(seqs));
  int64_t keys = 0;
  for (int32_t i = 0; i < o.warmup_steps; ++i) {
    SPECD_RETURN_IF_ERROR(driver.Decode(seqs, costs, &keys).status());
  }
  keys = 0;
  std::vector<double> ms;
  for (int32_t i = 0; i < o.decode_steps; ++i) {
    SPECD_ASSIGN_OR_RETURN(double t, driver.Decode(seqs, costs, &keys));
    ms.push_back(t);
  }
  return DecodeTiming{Median(ms), static_cast<double>(keys) / o.decode_steps};
}

std::string Percent(double ratio) { return absl::StrFormat("%.1f%%", 100.0 * ratio); }

Row TargetRow(std::string metric, std::string value, double ratio, double target) {
  return {std::move(metric), std::move(value), absl::StrFormat(">= %.0f%%", 100 * target),
          Percent(ratio), ratio >= target ? "PASS" : "MISS"};
}

absl::Status MeasureDecodeLatency(Driver& driver, const ModelCosts& costs, const Options& o,
                                  const Ceilings& ceilings, std::vector<Row>* rows) {
  for (int32_t context : o.contexts) {
    SPECD_ASSIGN_OR_RETURN(DecodeTiming t, TimeDecode(driver, costs, 1, context, o));
    // Per GPU: a rank reads 1/N of the weights and of the KV.
    const double roof =
        RooflineMs(costs, 1, t.keys_per_step, ceilings.copy_bytes_per_s) / o.tensor_parallel_size;
    const double ratio = roof / t.ms_per_step;
    std::printf("decode b=1 ctx=%d: %.3f ms/step, %.1f tok/s, roofline %.3f ms (%s)\n", context,
                t.ms_per_step, 1e3 / t.ms_per_step, roof, Percent(ratio).c_str());
    std::fflush(stdout);
    rows->push_back(
        TargetRow(absl::StrCat("decode step b=1 ctx=", context),
                  absl::StrFormat("%.3f ms (%.0f tok/s)", t.ms_per_step, 1e3 / t.ms_per_step),
                  ratio, context < kLongContext ? kDecodeTargetShort : kDecodeTargetLong));
  }
  return absl::OkStatus();
}

// A verification step over K drafts at batch 1 against a plain decode step, alternated on the
// same sequence (context 512 + the steps taken): target at most 1.15x (issue 5).
absl::Status MeasureVerify(Driver& driver, const ModelCosts& costs, const Options& o,
                           std::vector<Row>* rows) {
  constexpr int32_t kContext = 512;
  constexpr double kTarget = 1.15;
  for (int32_t k : {4, 8}) {
    Sequences seqs = driver.NewSequences(1, kContext);
    SPECD_RETURN_IF_ERROR(driver.Prefill(seqs));
    int64_t keys = 0;
    for (int32_t i = 0; i < o.warmup_steps; ++i) {
      SPECD_RETURN_IF_ERROR(driver.Decode(seqs, costs, &keys).status());
      SPECD_RETURN_IF_ERROR(driver.Verify(seqs, k).status());
    }
    std::vector<double> decode_ms, verify_ms;
    for (int32_t i = 0; i < o.decode_steps; ++i) {
      SPECD_ASSIGN_OR_RETURN(double v, driver.Verify(seqs, k));
      SPECD_ASSIGN_OR_RETURN(double d, driver.Decode(seqs, costs, &keys));
      verify_ms.push_back(v);
      decode_ms.push_back(d);
    }
    const double v = Median(verify_ms), d = Median(decode_ms);
    std::printf("verify b=1 ctx=%d K=%d: %.3f ms, decode %.3f ms, %.2fx\n", kContext, k, v, d,
                v / d);
    std::fflush(stdout);
    rows->push_back({absl::StrCat("verify step K=", k, " b=1 ctx=", kContext),
                     absl::StrFormat("%.3f ms (decode %.3f)", v, d),
                     absl::StrFormat("<= %.2fx", kTarget), absl::StrFormat("%.2fx", v / d),
                     v / d <= kTarget ? "PASS" : "MISS"});
  }
  return absl::OkStatus();
}

absl::Status MeasureThroughput(Driver& driver, const ModelCosts& costs, const Options& o,
                               const Ceilings& ceilings, std::vector<Row>* rows) {
  for (int32_t batch : o.batches) {
    SPECD_ASSIGN_OR_RETURN(DecodeTiming t, TimeDecode(driver, costs, batch, o.batch_context, o));
    const double tok_s = batch * 1e3 / t.ms_per_step;
    const double ratio = RooflineMs(costs, batch, t.keys_per_step, ceilings.copy_bytes_per_s) /
                         o.tensor_parallel_size / t.ms_per_step;
    std::printf("decode b=%d ctx=%d: %.3f ms/step, %.1f tok/s (roofline %s)\n", batch,
                o.batch_context, t.ms_per_step, tok_s, Percent(ratio).c_str());
    std::fflush(stdout);
    rows->push_back({absl::StrCat("throughput b=", batch, " ctx=", o.batch_context),
                     absl::StrFormat("%.0f tok/s", tok_s), "-", Percent(ratio) + " roof", "-"});
  }
  return absl::OkStatus();
}

// Prefill of one prompt, first token drawn included: one warm-up, then the median of repeats.
absl::StatusOr<double> TimePrefillMs(Driver& driver, int32_t prompt_len, const Options& o) {
  if (prompt_len + 1 > driver.max_model_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt ", prompt_len, " exceeds max_model_len ", driver.max_model_len()));
  }
  std::vector<double> ms;
  for (int32_t i = -1; i < o.repeats; ++i) {
    Sequences seqs = driver.NewSequences(1, prompt_len);
    const Clock::time_point start = Clock::now();
    SPECD_RETURN_IF_ERROR(driver.Prefill(seqs));
    if (i >= 0) ms.push_back(MsSince(start));
  }
  return Median(ms);
}

absl::Status MeasureTtft(Driver& driver, const Options& o, std::vector<Row>* rows) {
  for (int32_t prompt : o.ttft_prompts) {
    SPECD_ASSIGN_OR_RETURN(double ms, TimePrefillMs(driver, prompt, o));
    std::printf("ttft prompt=%d: %.1f ms (%.0f prompt tok/s)\n", prompt, ms, prompt * 1e3 / ms);
    std::fflush(stdout);
    rows->push_back(
        {absl::StrCat("ttft prompt=", prompt), absl::StrFormat("%.1f ms", ms), "-", "-", "-"});
  }
  return absl::OkStatus();
}

absl::Status MeasurePrefill(Driver& driver, const ModelCosts& costs, const Options& o,
                            const Ceilings& ceilings, std::vector<Row>* rows) {
  SPECD_ASSIGN_OR_RETURN(double ms, TimePrefillMs(driver, o.prefill_tokens, o));
  double keys = 0;  // keys attended, summed over the prompt's tokens
  for (int64_t p = 0; p < o.prefill_tokens; ++p) keys += static_cast<double>(KeysRead(costs, p));
  const double flops = 2.0 * static_cast<double>(costs.layer_matmul_params) * o.prefill_tokens +
                       2.0 * static_cast<double>(costs.lm_head_params) +
                       4.0 * static_cast<double>(costs.attention_width) * keys;
  const double rate = flops / (ms * 1e-3);
  const double ratio = rate / (ceilings.gemm_flop_per_s * o.tensor_parallel_size);
  std::printf("prefill %d tokens: %.1f ms, %.1f TFLOP/s, %s of the GEMM rate\n", o.prefill_tokens,
              ms, rate * 1e-12, Percent(ratio).c_str());
  std::fflush(stdout);
  rows->push_back(TargetRow(absl::StrCat("prefill ", o.prefill_tokens, " tokens"),
                            absl::StrFormat("%.1f TFLOP/s (%.1f ms)", rate * 1e-12, ms), ratio,
                            kPrefillTarget));
  return absl::OkStatus();
}

// ---- Main.

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

absl::StatusOr<Ceilings> MeasureCeilings(const Options& o, std::vector<Row>* rows) {
  Ceilings ceilings;
  ceilings.copy_bytes_per_s = MeasureCopyBandwidth(kCopyBytes, o.copy_repeats);
  std::printf("copy bandwidth: %.1f GB/s (1 GiB device-to-device, read + write)\n",
              ceilings.copy_bytes_per_s * 1e-9);
  SPECD_ASSIGN_OR_RETURN(ceilings.gemm_flop_per_s, MeasureGemmRate(kGemmSize, o.copy_repeats));
  std::printf("gemm bf16 %lld^3: %.1f TFLOP/s (cuBLASLt, random data)\n",
              static_cast<long long>(kGemmSize), ceilings.gemm_flop_per_s * 1e-12);
  std::fflush(stdout);
  rows->push_back({"copy bandwidth", absl::StrFormat("%.1f GB/s", ceilings.copy_bytes_per_s * 1e-9),
                   "-", "-", "-"});
  rows->push_back({"gemm 8192^3 bf16",
                   absl::StrFormat("%.1f TFLOP/s", ceilings.gemm_flop_per_s * 1e-12), "-", "-",
                   "-"});
  return ceilings;
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRunner(const Options& o) {
  RunnerOptions r;
  r.model_dir = o.model_dir;
  r.device = "cuda";
  r.load_format = "dummy";
  r.max_model_len = o.max_model_len;
  r.max_num_seqs = std::max(1, *std::max_element(o.batches.begin(), o.batches.end()));
  // The verify measure draws K + 1 = 9 rows at batch 1 (more than --quick's 8 sequences).
  r.max_sample_rows = std::max(r.max_num_seqs, 9);
  r.max_num_batched_tokens = o.max_num_batched_tokens;
  r.gpu_memory_utilization = o.gpu_memory_utilization;
  const Clock::time_point start = Clock::now();
  std::unique_ptr<ModelRunner> runner;
  if (o.tensor_parallel_size > 1) {
    TpGroupOptions g;
    g.world_size = o.tensor_parallel_size;
    g.worker_binary = o.specd;
    SPECD_ASSIGN_OR_RETURN(runner, CreateTpGroup(r, g));
  } else {
    SPECD_ASSIGN_OR_RETURN(runner, CreateModelRunner(r));
  }
  std::printf("runner: %s, %d KV blocks of %d tokens, loaded in %.1f s\n",
              runner->device_name().c_str(), runner->num_kv_blocks(), runner->block_size(),
              MsSince(start) * 1e-3);
  return runner;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf("\ndecode_bench summary\n%-28s %-28s %-10s %-14s %s\n", "metric", "value", "target",
              "ratio", "result");
  int32_t met = 0, targets = 0;
  for (const Row& r : rows) {
    std::printf("%-28s %-28s %-10s %-14s %s\n", r.metric.c_str(), r.value.c_str(), r.target.c_str(),
                r.ratio.c_str(), r.verdict.c_str());
    if (r.verdict != "-") ++targets;
    if (r.verdict == "PASS") ++met;
  }
  std::printf("targets met: %d/%d\n", met, targets);
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (kc::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "decode_bench: no GPU visible\n");
    return kc::kSkipExitCode;
  }
  cudaDeviceProp prop{};
  SPECD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("decode_bench: %s, %s, model %s\n", prop.name, UtcNow().c_str(), o.model_dir.c_str());
  std::vector<Row> rows;
  // The ceilings first: the runner then takes most of the remaining memory for its KV cache.
  absl::StatusOr<Ceilings> ceilings = MeasureCeilings(o, &rows);
  if (!ceilings.ok()) {
    std::fprintf(stderr, "decode_bench: %s\n", ceilings.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateRunner(o);
  if (!runner.ok()) {
    std::fprintf(stderr, "decode_bench: %s\n", runner.status().ToString().c_str());
    return 1;
  }
  const ModelCosts costs = CountCosts((*runner)->config());
  std::printf("weights read per decode step: %.3f GB; KV %.1f KiB per token\n",
              costs.step_weight_bytes * 1e-9, costs.kv_bytes_per_token / 1024.0);
  Driver driver(runner->get(), o.max_num_batched_tokens);
  const std::vector<std::pair<const char*, std::function<absl::Status()>>> steps = {
      {"decode latency", [&] { return MeasureDecodeLatency(driver, costs, o, *ceilings, &rows); }},
      {"verify", [&] { return MeasureVerify(driver, costs, o, &rows); }},
      {"throughput", [&] { return MeasureThroughput(driver, costs, o, *ceilings, &rows); }},
      {"ttft", [&] { return MeasureTtft(driver, o, &rows); }},
      {"prefill", [&] { return MeasurePrefill(driver, costs, o, *ceilings, &rows); }},
  };
  int exit_code = 0;
  for (const auto& [name, step] : steps) {
    if (absl::Status s = step(); !s.ok()) {
      std::fprintf(stderr, "decode_bench: %s failed: %s\n", name, s.ToString().c_str());
      rows.push_back({name, "FAILED", "-", "-", "FAIL"});
      exit_code = 1;
    }
  }
  PrintTable(rows);
  return exit_code;
}

}  // namespace
}  // namespace specd::decode_bench

int main(int argc, char** argv) { return specd::decode_bench::Main(argc, argv); }
