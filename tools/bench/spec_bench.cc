// spec_bench: end-to-end decoding throughput with and without speculation, side by side in one
// process: the engine's offline GenerateBatch over the codepair prompts at several batch sizes,
// plain decoding against the draft model and n-gram lookup at K draft tokens, on the CPU or a
// GPU. Every request generates exactly --max-tokens tokens (EOS ignored), greedy unless
// --temperature is given. Prints, per batch size and method: tokens/s, its ratio to plain
// decoding, tokens per verification round and per-position acceptance. With --ssd it then runs
// SSD too (a second engine, after the first is gone: the verifier on --device, the `specd
// speculator` process it launches on --speculator-device) and reports its speculation-cache
// hit rate.
// Controlled acceptance (--replay-alpha A; benchmarks only, engine/speculation/draft_replay.h):
// plain decoding first records the target's greedy continuation of every prompt; then the draft
// model (and SSD's) runs every forward pass but drafts the recorded next token with probability A
// (and puts it among its cache candidates with probability --replay-hit), so draft speculation
// and SSD are compared at a set acceptance with real costs. With --load-format dummy (random
// weights from config.json, CUDA) and --random-prompts N (prompts of N random ids; also the
// default when the model has no tokenizer) any shapes run without weights on disk.
//
//   spec_bench [--model DIR] [--draft DIR] [--device cpu|cuda] [--batches 1,16] [--k 4]
//              [--max-tokens 128] [--temperature 0] [--top-p 1] [--prompts FILE] [--repeats 2]
//              [--load-format auto|dummy] [--random-prompts LEN] [--max-model-len 2048]
//              [--gpu-memory-utilization 0.9] [--speculator-gpu-memory-utilization U]
//              [--max-num-seqs N] [--tensor-parallel-size N --specd PATH]
//              [--replay-alpha A [--replay-hit H] [--replay-file PATH]]
//              [--ssd --specd PATH [--speculator-device cuda:1] [--fan-out 3] [--saguaro-c C]
//               [--cache-build interruptible|complete]]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "engine/model/model_config.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/bench/timed_batch.h"

namespace specd {
namespace {

struct Flags {
  std::string model = "models/codepair/target";
  std::string draft = "models/codepair/draft";
  std::string device = "cpu";
  std::string prompts = "models/codepair/prompts.jsonl";
  std::vector<int> batches = {1, 16};
  int k = 4;
  int max_tokens = 128;
  float temperature = 0;
  float top_p = 1;
  int repeats = 2;
  int threads = 0;
  bool ssd = false;
  std::string specd;                 // the specd binary SSD launches as its speculator (and TP
                                     // groups as their workers)
  int32_t tensor_parallel_size = 1;  // --tensor-parallel-size / -tp: target ranks
  std::string speculator_device;     // "": the verifier's device
  int fan_out = 3;
  float saguaro_c = -1;
  std::string cache_build = "interruptible";
  std::string load_format = "auto";
  int random_prompts = 0;  // prompt length in random ids; 0: the prompts file
  int max_model_len = 2048;
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 0;                          // 0: the engine's default
  double speculator_gpu_memory_utilization = 0;  // 0: the verifier's
  double replay_alpha = -1;                      // < 0: no replay
  double replay_hit = 0.9;
  std::string replay_file;  // "": a file in /tmp
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    bool ok = true;
    if (a == "--model")
      f->model = value();
    else if (a == "--draft")
      f->draft = value();
    else if (a == "--device")
      f->device = value();
    else if (a == "--prompts")
      f->prompts = value();
    else if (a == "--k")
      ok = absl::SimpleAtoi(value(), &f->k) && f->k >= 1 && f->k <= 64;
    else if (a == "--max-tokens")
      ok = absl::SimpleAtoi(value(), &f->max_tokens) && f->max_tokens > 0;
    else if (a == "--temperature")
      ok = absl::SimpleAtof(value(), &f->temperature);
    else if (a == "--top-p")
      ok = absl::SimpleAtof(value(), &f->top_p) && f->top_p > 0 && f->top_p <= 1;
    else if (a == "--repeats")
      ok = absl::SimpleAtoi(value(), &f->repeats) && f->repeats > 0;
    else if (a == "--threads")
      ok = absl::SimpleAtoi(value(), &f->threads);
    else if (a == "--ssd")
      f->ssd = true;
    else if (a == "--specd")
      f->specd = value();
    else if (a == "--tensor-parallel-size" || a == "-tp")
      ok = absl::SimpleAtoi(value(), &f->tensor_parallel_size) && f->tensor_parallel_size >= 1;
    else if (a == "--speculator-device")
      f->speculator_device = value();
    else if (a == "--cache-build")
      ok = (f->cache_build = value()) == "complete" || f->cache_build == "interruptible";
    else if (a == "--fan-out")
      ok = absl::SimpleAtoi(value(), &f->fan_out) && f->fan_out >= 1;
    else if (a == "--saguaro-c")
      ok = absl::SimpleAtof(value(), &f->saguaro_c) && f->saguaro_c >= 0 && f->saguaro_c <= 1;
    else if (a == "--load-format")
      ok = (f->load_format = value()) == "auto" || f->load_format == "dummy";
    else if (a == "--random-prompts")
      ok = absl::SimpleAtoi(value(), &f->random_prompts) && f->random_prompts >= 8;
    else if (a == "--gpu-memory-utilization")
      ok = absl::SimpleAtod(value(), &f->gpu_memory_utilization) && f->gpu_memory_utilization > 0 &&
           f->gpu_memory_utilization <= 1;
    else if (a == "--speculator-gpu-memory-utilization")
      ok = absl::SimpleAtod(value(), &f->speculator_gpu_memory_utilization) &&
           f->speculator_gpu_memory_utilization > 0 && f->speculator_gpu_memory_utilization <= 1;
    else if (a == "--max-num-seqs")
      ok = absl::SimpleAtoi(value(), &f->max_num_seqs) && f->max_num_seqs > 0;
    else if (a == "--max-model-len")
      ok = absl::SimpleAtoi(value(), &f->max_model_len) && f->max_model_len > 0;
    else if (a == "--replay-alpha")
      ok = absl::SimpleAtod(value(), &f->replay_alpha) && f->replay_alpha >= 0 &&
           f->replay_alpha <= 1;
    else if (a == "--replay-hit")
      ok = absl::SimpleAtod(value(), &f->replay_hit) && f->replay_hit >= 0 && f->replay_hit <= 1;
    else if (a == "--replay-file")
      ok = !(f->replay_file = value()).empty();
    else if (a == "--batches") {
      f->batches.clear();
      for (absl::string_view s : absl::StrSplit(value(), ',')) {
        int b = 0;
        ok = ok && absl::SimpleAtoi(s, &b) && b > 0;
        f->batches.push_back(b);
      }
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "spec_bench: bad flag or value: %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

struct Run {
  double tokens_per_s = 0;
  double tokens_per_round = 0;  // 0 without speculation
  std::string acceptance;
  double hit_rate = -1;  // SSD: drafts served from the speculation cache; < 0 otherwise
  double wait_ms = 0;    // SSD: verifier time waiting for drafts, per round with the speculator
  double busy_ms = 0;    // SSD: speculator compute (answer + cache build), per round
  double cache_ms = 0;   // SSD: ... of which cache construction, per round
  double step_draft_ms = 0, step_verify_ms = 0;  // per speculative step (engine's timers)
  int equal = -1;  // replay: requests whose output equals their trajectory
  int requests = 0;
  int settle_runs = 0;  // replay: runs until the output equalled the trajectories (< 0: never)
};

// Replay: the trajectory (prompt + the target's greedy output) of each prompt in force.
std::vector<std::vector<int32_t>> g_recorded;

// Best of `repeats` runs of `batch` prompts (cycling through the file) with `spec`.
Run Measure(Engine& engine, Acceptance& acc, const std::vector<std::vector<int32_t>>& prompts,
            int batch, SpeculationParams spec, const Flags& f) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < batch; ++i) {
    GenerateRequest r;
    r.prompt_ids = prompts[i % prompts.size()];
    r.params.temperature = f.temperature;
    r.params.top_p = f.top_p;
    r.params.seed = 7 + i;
    r.params.max_tokens = f.max_tokens;
    r.params.ignore_eos = true;
    r.speculation = spec;
    requests.push_back(std::move(r));
  }
  Run best;
  for (int rep = 0; rep < f.repeats; ++rep) {
    acc.Take();
    acc.TakeStepTimes();
    const SsdStats before = acc.ssd();
    const TimedBatch batch_run = RunTimedBatch(engine, requests, "spec_bench");
    Run run;
    run.tokens_per_s = batch_run.tokens_per_s();
    if (!g_recorded.empty() && f.temperature == 0) {
      run.equal = 0;
      run.requests = batch;
      for (int i = 0; i < batch; ++i) {
        const std::vector<int32_t>& want = g_recorded[i % g_recorded.size()];
        const std::vector<int32_t> got = batch_run.results[i].ids();
        const size_t n = requests[i].prompt_ids.size();
        run.equal +=
            got.size() <= want.size() - n && std::equal(got.begin(), got.end(), want.begin() + n);
      }
    }
    run.tokens_per_round = batch_run.tokens_per_round();
    run.acceptance = acc.Take();
    std::tie(run.step_draft_ms, run.step_verify_ms) = acc.TakeStepTimes();
    const SsdStats after = acc.ssd();
    const int64_t hits = after.drafts_hit - before.drafts_hit;
    const int64_t told = hits + after.drafts_miss_primary - before.drafts_miss_primary +
                         after.drafts_miss_backup - before.drafts_miss_backup;
    if (told > 0) run.hit_rate = static_cast<double>(hits) / told;
    const int64_t remote = after.rounds - before.rounds;
    if (remote > 0) {
      run.wait_ms = 1e3 * (after.wait_seconds - before.wait_seconds) / remote;
      run.busy_ms = 1e3 * (after.speculator_busy_seconds - before.speculator_busy_seconds) / remote;
      run.cache_ms =
          1e3 * (after.speculator_cache_seconds - before.speculator_cache_seconds) / remote;
    }
    if (run.tokens_per_s > best.tokens_per_s) best = run;
  }
  return best;
}

// One short request: CUDA graphs, caches, the speculator's first contact.
Flags WarmUp(const Flags& f) {
  Flags w = f;
  w.max_tokens = 8;
  w.repeats = 1;
  return w;
}

std::unique_ptr<Engine> MakeEngine(const Flags& f, const SpeculativeConfig& spec,
                                   std::shared_ptr<Acceptance> acc) {
  EngineOptions o;
  o.model_dir = f.model;
  o.device = f.device;
  o.num_threads = f.threads;
  o.max_model_len = f.max_model_len;
  o.load_format = f.load_format;
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  if (f.max_num_seqs > 0) o.max_num_seqs = f.max_num_seqs;  // also caps the KV pool
  o.observer = std::move(acc);
  o.speculative = spec;
  o.tensor_parallel.size = f.tensor_parallel_size;
  o.tensor_parallel.worker_binary = f.specd;  // "": this binary, which is not specd
  if (f.tensor_parallel_size > 1 && f.specd.empty()) {
    std::fprintf(stderr, "spec_bench: --tensor-parallel-size needs --specd PATH (its workers)\n");
    std::exit(2);
  }
  auto engine = Engine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "spec_bench: %s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(engine);
}

void PrintRow(int batch, const char* method, const Run& r, double plain) {
  char hits[160] = "";
  if (r.hit_rate >= 0) {
    std::snprintf(hits, sizeof(hits),
                  "  (cache hits %.1f%%; per round: verifier waits %.3f ms, speculator answers "
                  "in %.3f ms and builds the cache in %.3f ms)",
                  100 * r.hit_rate, r.wait_ms, r.busy_ms - r.cache_ms, r.cache_ms);
  }
  char equal[128] = "";
  if (r.equal >= 0) {
    std::snprintf(equal, sizeof(equal), "  [output = trajectory: %d of %d; settled %s %d runs]",
                  r.equal, r.requests, r.settle_runs > 0 ? "after" : "NOT after",
                  std::abs(r.settle_runs));
  }
  std::printf(
      "%-6d %-12s %12.1f %8.2fx %10.2f  %s  {per step: draft %.2f ms, verify %.2f ms}%s%s\n", batch,
      method, r.tokens_per_s, r.tokens_per_s / plain, r.tokens_per_round, r.acceptance.c_str(),
      r.step_draft_ms, r.step_verify_ms, hits, equal);
}

// The prompts: random ids (--random-prompts, or a model without a tokenizer), else the file's.
std::vector<std::vector<int32_t>> LoadPrompts(const Flags& f, const Engine& engine) {
  std::vector<std::vector<int32_t>> prompts;
  if (f.random_prompts > 0 || engine.tokenizer() == nullptr) {
    const int len = f.random_prompts > 0 ? f.random_prompts : 128;
    const int count = std::max(16, *std::max_element(f.batches.begin(), f.batches.end()));
    std::mt19937_64 rng(1234);
    std::uniform_int_distribution<int32_t> id(0, engine.model_config().vocab_size - 1);
    prompts.resize(count);
    for (auto& p : prompts) {
      p.resize(len);
      for (int32_t& t : p) t = id(rng);
    }
    return prompts;
  }
  std::ifstream in(f.prompts);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto ids =
        engine.tokenizer()->Encode(nlohmann::json::parse(line)["prompt"].get<std::string>(), true);
    if (ids.ok()) prompts.push_back(*ids);
  }
  return prompts;
}

void PrintHeader() {
  std::printf("%-6s %-12s %12s %9s %10s  %s\n", "batch", "method", "tokens/s", "vs plain",
              "tok/round", "acceptance by position");
}

// SSD after the other engine is gone (one verifier at a time on the device).
SpeculativeConfig SsdConfig(const Flags& f, const SpeculativeConfig& draft) {
  SpeculativeConfig ssd = draft;
  ssd.method = SpeculationMethod::kSsd;
  ssd.speculator_device = f.speculator_device;
  ssd.ssd.binary = f.specd;
  ssd.ssd.fan_out = f.fan_out;
  ssd.ssd.saguaro_c = f.saguaro_c;
  ssd.ssd.complete_cache = f.cache_build == "complete";
  ssd.ssd.gpu_memory_utilization = f.speculator_gpu_memory_utilization;
  return ssd;
}

void RunSsd(const Flags& f, const SpeculativeConfig& draft, std::shared_ptr<Acceptance> acc,
            const std::vector<std::vector<int32_t>>& prompts, const std::vector<double>& plain) {
  std::unique_ptr<Engine> engine = MakeEngine(f, SsdConfig(f, draft), acc);
  std::printf("ssd: verifier on %s, speculator on %s, fan-out %d (geometric), C %s, %s cache\n",
              engine->device_name().c_str(),
              f.speculator_device.empty() ? f.device.c_str() : f.speculator_device.c_str(),
              f.fan_out, f.saguaro_c < 0 ? "by temperature" : std::to_string(f.saguaro_c).c_str(),
              f.cache_build.c_str());
  Measure(*engine, *acc, prompts, 1, {SpeculationMethod::kSsd, f.k}, WarmUp(f));
  for (size_t i = 0; i < f.batches.size(); ++i) {
    PrintRow(f.batches[i], "ssd",
             Measure(*engine, *acc, prompts, f.batches[i], {SpeculationMethod::kSsd, f.k}, f),
             plain[i]);
  }
}

// Greedy requests for prompts [0, batch) of `tokens` tokens each.
std::vector<GenerateRequest> GreedyRequests(const std::vector<std::vector<int32_t>>& prompts,
                                            int batch, int tokens, SpeculationParams spec) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < batch; ++i) {
    GenerateRequest r;
    r.prompt_ids = prompts[i % prompts.size()];
    r.params.temperature = 0;  // greedy: what the replay follows
    r.params.max_tokens = tokens;
    r.params.ignore_eos = true;
    r.speculation = spec;
    requests.push_back(std::move(r));
  }
  return requests;
}

bool WriteTrajectories(const std::string& path, const std::vector<std::vector<int32_t>>& t) {
  std::ofstream out(path);
  for (const auto& ids : t) out << nlohmann::json{{"tokens", ids}}.dump() << "\n";
  out.close();
  return static_cast<bool>(out);
}

// Controlled acceptance: plain decoding records every prompt's greedy continuation; then each
// speculative method replays it. Random-weight models have near-tied logits, and a verification
// chunk rounds differently from a decode step, so the target's greedy output can depend on where
// rounds start. Each (method, batch) therefore first settles: it runs with the trajectories, and
// as long as its output differs from them they become its output and it runs again (a run whose
// rounds start where the last one's did repeats it exactly). The timed runs then follow their
// trajectories, so acceptance is the set alpha.
int MainReplay(const Flags& f) {
  constexpr int kMaxSettleRuns = 5;
  auto acc = std::make_shared<Acceptance>();
  std::unique_ptr<Engine> engine = MakeEngine(f, SpeculativeConfig(), acc);
  const std::vector<std::vector<int32_t>> prompts = LoadPrompts(f, *engine);
  if (prompts.empty()) {
    std::fprintf(stderr, "spec_bench: no prompts in %s\n", f.prompts.c_str());
    return 1;
  }
  std::printf(
      "spec_bench: %s on %s, draft %s, K %d, %d tokens per request, %zu prompts of %zu ids; "
      "CONTROLLED ACCEPTANCE: drafts replay the target's greedy output with alpha %.2f, candidate "
      "hit %.2f (the draft still runs every forward pass)\n",
      f.model.c_str(), engine->device_name().c_str(), f.draft.c_str(), f.k, f.max_tokens,
      prompts.size(), prompts[0].size(), f.replay_alpha, f.replay_hit);
  Measure(*engine, *acc, prompts, 1, {SpeculationMethod::kNone, 0}, WarmUp(f));
  std::vector<double> plain;
  for (int batch : f.batches) {
    plain.push_back(
        Measure(*engine, *acc, prompts, batch, {SpeculationMethod::kNone, 0}, f).tokens_per_s);
  }
  // Trajectories a round's worth longer than the timed runs, so their last rounds follow too.
  const int settle_tokens = f.max_tokens + f.k + 2;
  auto plain_out = engine->GenerateBatch(GreedyRequests(
      prompts, static_cast<int>(prompts.size()), settle_tokens, {SpeculationMethod::kNone, 0}));
  if (!plain_out.ok()) {
    std::fprintf(stderr, "spec_bench: recording: %s\n", plain_out.status().ToString().c_str());
    return 1;
  }
  std::vector<std::vector<int32_t>> recorded;
  for (size_t i = 0; i < prompts.size(); ++i) {
    recorded.push_back(prompts[i]);
    for (int32_t id : (*plain_out)[i].ids()) recorded.back().push_back(id);
  }
  engine.reset();
  const std::string path = f.replay_file.empty()
                               ? "/tmp/spec_bench_replay_" + std::to_string(::getpid()) + ".jsonl"
                               : f.replay_file;
  PrintHeader();
  for (size_t i = 0; i < f.batches.size(); ++i) {
    std::printf("%-6d %-12s %12.1f %9s %10s  %s\n", f.batches[i], "none", plain[i], "1.00x", "-",
                "-");
  }
  SpeculativeConfig draft;
  draft.draft_model = f.draft;
  draft.num_speculative_tokens = f.k;
  draft.replay.file = path;
  draft.replay.alpha = f.replay_alpha;
  draft.replay.candidate_hit = f.replay_hit;
  SpeculativeConfig ssd = SsdConfig(f, draft);
  std::vector<std::pair<SpeculationMethod, const SpeculativeConfig*>> methods = {
      {SpeculationMethod::kDraftModel, &draft}};
  if (f.ssd) methods.push_back({SpeculationMethod::kSsd, &ssd});
  for (const auto& [method, config] : methods) {
    for (size_t b = 0; b < f.batches.size(); ++b) {
      const int batch = f.batches[b];
      std::vector<std::vector<int32_t>> trajectories = recorded;
      int runs = 0;
      bool settled = false;
      while (!settled && runs < kMaxSettleRuns) {
        engine.reset();  // one verifier (and speculator) at a time
        if (!WriteTrajectories(path, trajectories)) {
          std::fprintf(stderr, "spec_bench: cannot write %s\n", path.c_str());
          return 1;
        }
        engine = MakeEngine(f, *config, acc);
        Measure(*engine, *acc, prompts, 1, {method, f.k}, WarmUp(f));
        auto out =
            engine->GenerateBatch(GreedyRequests(prompts, batch, settle_tokens, {method, f.k}));
        if (!out.ok()) {
          std::fprintf(stderr, "spec_bench: %s\n", out.status().ToString().c_str());
          return 1;
        }
        ++runs;
        settled = true;
        for (int i = 0; i < batch; ++i) {
          std::vector<int32_t> t = prompts[i % prompts.size()];
          for (int32_t id : (*out)[i].ids()) t.push_back(id);
          settled = settled && t == trajectories[i % prompts.size()];
          trajectories[i % prompts.size()] = std::move(t);
        }
      }
      g_recorded = trajectories;  // what Measure compares outputs with
      Run run = Measure(*engine, *acc, prompts, batch, {method, f.k}, f);
      run.settle_runs = settled ? runs : -runs;
      PrintRow(batch, SpeculationMethodName(method), run, plain[b]);
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  if (f.ssd && f.specd.empty()) {
    std::fprintf(stderr, "spec_bench: --ssd needs --specd PATH (the specd binary)\n");
    return 2;
  }
  if (f.replay_alpha >= 0) {
    if (f.temperature != 0) {
      std::fprintf(stderr, "spec_bench: --replay-alpha replays greedy output: temperature 0\n");
      return 2;
    }
    return MainReplay(f);
  }
  auto acc = std::make_shared<Acceptance>();
  SpeculativeConfig draft;
  draft.draft_model = f.draft;
  draft.num_speculative_tokens = f.k;
  std::unique_ptr<Engine> engine = MakeEngine(f, draft, acc);
  const std::vector<std::vector<int32_t>> prompts = LoadPrompts(f, *engine);
  if (prompts.empty()) {
    std::fprintf(stderr, "spec_bench: no prompts in %s\n", f.prompts.c_str());
    return 1;
  }
  std::printf(
      "spec_bench: %s on %s, draft %s, K %d, %d tokens per request, temperature %.2f, "
      "top_p %.2f\n",
      f.model.c_str(), engine->device_name().c_str(), f.draft.c_str(), f.k, f.max_tokens,
      f.temperature, f.top_p);
  // Warm-up (CUDA graphs, caches).
  Measure(*engine, *acc, prompts, 1, {SpeculationMethod::kNone, 0}, WarmUp(f));
  PrintHeader();
  std::vector<double> plain;
  for (int batch : f.batches) {
    const Run p = Measure(*engine, *acc, prompts, batch, {SpeculationMethod::kNone, 0}, f);
    plain.push_back(p.tokens_per_s);
    std::printf("%-6d %-12s %12.1f %9s %10s  %s\n", batch, "none", p.tokens_per_s, "1.00x", "-",
                "-");
    for (SpeculationMethod m : {SpeculationMethod::kDraftModel, SpeculationMethod::kNgram}) {
      PrintRow(batch, SpeculationMethodName(m), Measure(*engine, *acc, prompts, batch, {m, f.k}, f),
               p.tokens_per_s);
    }
  }
  if (!f.ssd) return 0;
  engine.reset();  // one verifier at a time on the device
  RunSsd(f, draft, acc, prompts, plain);
  return 0;
}
}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
