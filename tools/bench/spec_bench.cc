// spec_bench: end-to-end decoding throughput with and without speculation, side by side in one
// process: the engine's offline GenerateBatch over the codepair prompts at several batch sizes,
// plain decoding against the draft model (and an EAGLE-3 head, --eagle3) and n-gram lookup at each
// K of --ks (or the one --k), and token trees (--trees depth/top_k/num_nodes,...: the draft model,
// n-gram and --eagle3), on the CPU or a GPU. Every request generates exactly --max-tokens tokens
// (EOS ignored), greedy unless --temperature is given. Prints, per batch size and method:
// tokens/s, its ratio to plain decoding, tokens per verification round, per-position acceptance
// (a tree's up to its depth) and the speculative step's draft / verify / rest milliseconds
// (spec_bench_row.h). With --ssd it then runs
// SSD too (a second engine, after the first is gone: the verifier on --device, the `specd
// speculator` process it launches on --speculator-device) and reports its speculation-cache
// hit rate.
// `auto` (--auto, issue 20): also requests with method auto (the engine's StrategyPolicy picks
// method and K per request and step, K up to the largest of --ks) under the cost profile
// --cost-profile FILE (specd_profile's; without it the engine's default rule). With --auto or
// several K the run ends with a summary per batch size: plain, the best fixed choice (plain or one
// method at one K) and auto, auto's ratios to both, PASS when auto >= 0.95x the best fixed choice
// and >= plain (else MISS), and what auto used (its request-steps by method, and its requests'
// usage.speculation.by_method).
// Controlled acceptance (--replay-alpha A; benchmarks only, engine/speculation/draft_replay.h):
// plain decoding first records the target's greedy continuation of every prompt; then the draft
// model (and SSD's) runs every forward pass but drafts the recorded next token with probability A
// (and puts it among its cache candidates with probability --replay-hit), so draft speculation
// and SSD are compared at a set acceptance with real costs (n-gram drafts as it always does; an
// EAGLE-3 head, --eagle3, replays as the draft model does). Trees replay too: a node on the
// recorded path has the recorded next token among its children with probability A, at the same
// positions as a chain's hits (DraftReplay::Children), so a tree of depth D accepts about
// A + A^2 + ... + A^D drafts per round when its selection keeps the recorded path. With
// --load-format dummy (random weights from config.json, CUDA) and --random-prompts N (prompts of N
// random ids; also the default when the model has no tokenizer) any shapes run without weights on
// disk. Vegas and streaming (--vegas, --streaming) replay the same way while every sparse draft
// pass runs for real; with --draft none and --auto, auto runs on their engine and may pick them
// where its cost profile (specd_profile --vegas) says they pay.
// A point's first run captures its round graphs (GPU) and prefills its prompts (later runs hit
// the prefix cache), so with --repeats 1 every point first runs once untimed; with more repeats
// the best of them is reported.
// --decode-phase adds each row's rate while every request of the batch decodes (from the last
// request's first token to the first request's end): with long prompts and --no-prefix-caching
// (so an EAGLE-3 head builds its own KV over each prompt, as for a new request) the prefill,
// which speculation does not change, would otherwise dominate the run; --max-num-batched-tokens
// at the prompt length keeps a batch's prefills few, and --max-tokens must be long enough that
// no request finishes while another still prefills (a shorter window prints "too short").
//
//   spec_bench [--model DIR] [--draft DIR [--parallel]] [--eagle3 HEAD_DIR] [--device cpu|cuda]
//              [--batches 1,16]
//              [--k 4 | --ks 1,2,4,8] [--trees D/T/N,...] [--auto [--cost-profile FILE]]
//              [--max-tokens 128] [--temperature 0] [--top-p 1] [--prompts FILE] [--repeats 2]
//              [--load-format auto|dummy] [--random-prompts LEN] [--max-model-len 2048]
//              [--gpu-memory-utilization 0.9] [--speculator-gpu-memory-utilization U]
//              [--max-num-seqs N] [--max-num-batched-tokens N] [--no-prefix-caching]
//              [--decode-phase]
//              [--tensor-parallel-size N --specd PATH]
//              [--replay-alpha A [--replay-hit H] [--replay-file PATH]]
//              [--vegas] [--streaming] [--sparsity-ratio 0.07] [--sparse-min-tokens 256]
//              (self-speculation points; --draft none skips the draft model)
//              [--ssv-group-size C (an NSA target's verification: SSV exact, groups of C)]
//              [--ssv mode/cC/rR (the server's SSV strategy, lossy ones too; a --cost-profile
//               with SSV strategies picks per request and step instead: the planner)]
//              [--ssd --specd PATH [--speculator-device cuda:1] [--fan-out 3] [--saguaro-c C]
//               [--cache-build interruptible|complete] [--cache-budget time|fixed]
//               [--data-path device|host] [--cache-offers 0|1] [--critical-batch-size B]
//               [--ssd-drafter draft_model|eagle3 (the head of --eagle3 in the speculator)]]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/model/model_config.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/bench/spec_bench_flags.h"
#include "tools/bench/spec_bench_row.h"
#include "tools/bench/sweep_summary.h"
#include "tools/bench/timed_batch.h"

namespace specd {
namespace {

using Flags = SpecBenchFlags;
using Prompts = std::vector<std::vector<int32_t>>;

// Replay: the trajectory (prompt + the target's greedy output) of each prompt in force.
Prompts g_recorded;

// Best of `repeats` runs of `batch` prompts (cycling through the file) with `spec`.
Run Measure(Engine& engine, StepObserver& acc, const Prompts& prompts, int batch,
            SpeculationParams spec, const Flags& f) {
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
    acc.TakeStepSplit();
    acc.TakePolicyRows();
    acc.TakePolicyCost();
    acc.TakeSsvUse();
    const SsdStats before = acc.ssd();
    acc.TakeDecodePhase();
    const TimedBatch batch_run = RunTimedBatch(engine, requests, "spec_bench");
    Run run;
    run.tokens_per_s = batch_run.tokens_per_s();
    if (f.decode_phase) {
      const Acceptance::DecodePhase phase = acc.TakeDecodePhase();
      run.decode_tokens_per_s = phase.tokens_per_s >= 0 ? phase.tokens_per_s : kDecodeNotTimed;
      run.decode_draft_ms = phase.draft_ms;
      run.decode_verify_ms = phase.verify_ms;
    }
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
    run.ssv_used = acc.TakeSsvUse();
    run.acceptance = acc.Take();
    // A tree's drafts are its nodes; no path is longer than its depth.
    if (spec.tree.enabled) run.acceptance = FirstPositions(run.acceptance, spec.tree.depth);
    const StepObserver::StepSplit split = acc.TakeStepSplit();
    run.step_draft_ms = split.draft_ms;
    run.step_verify_ms = split.verify_ms;
    run.step_rest_ms = split.rest_ms;
    if (spec.method == SpeculationMethod::kAuto) {
      run.auto_used =
          DescribeAutoUse(acc.TakePolicyRows(), batch_run.results) + "; " + acc.TakePolicyCost();
    }
    const SsdStats after = acc.ssd();
    const int64_t hits = after.drafts_hit - before.drafts_hit;
    const int64_t told = hits + after.drafts_miss_primary - before.drafts_miss_primary +
                         after.drafts_miss_backup - before.drafts_miss_backup;
    if (told > 0) run.hit_rate = static_cast<double>(hits) / told;
    run.misses_primary = after.drafts_miss_primary - before.drafts_miss_primary;
    run.misses_backup = after.drafts_miss_backup - before.drafts_miss_backup;
    run.drafts_none = after.drafts_none - before.drafts_none;
    run.local_rounds = after.local_rounds - before.local_rounds;
    run.offer_rounds = after.offer_rounds - before.offer_rounds;
    if (batch_run.seconds > 0) {
      run.round_share =
          (after.timeline.verifier_round_seconds - before.timeline.verifier_round_seconds) /
          batch_run.seconds;
    }
    const int64_t remote = after.rounds - before.rounds;
    if (remote > 0) {
      run.wait_ms = 1e3 * (after.wait_seconds - before.wait_seconds) / remote;
      run.busy_ms = 1e3 * (after.speculator_busy_seconds - before.speculator_busy_seconds) / remote;
      run.cache_ms =
          1e3 * (after.speculator_cache_seconds - before.speculator_cache_seconds) / remote;
      run.device_rows = static_cast<double>(after.device_rows - before.device_rows) / remote;
      run.hidden_rows = static_cast<double>(after.hidden_rows - before.hidden_rows) / remote;
      run.device_hidden_rows =
          static_cast<double>(after.device_hidden_rows - before.device_hidden_rows) / remote;
      run.tcp_bytes = static_cast<double>(after.bytes_sent - before.bytes_sent +
                                          after.bytes_received - before.bytes_received) /
                      remote;
    }
    run.ssd_timeline = SsdTimelineLine(before.timeline, after.timeline);
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

// Measure, after one untimed run of the same point when a single repeat would otherwise time
// the first run of its shapes (round graphs captured on first use) and its prompts' prefill (the
// runs after it hit the prefix cache).
Run MeasurePoint(Engine& engine, StepObserver& acc, const Prompts& prompts, int batch,
                 SpeculationParams spec, const Flags& f) {
  if (f.repeats == 1) Measure(engine, acc, prompts, batch, spec, f);
  return Measure(engine, acc, prompts, batch, spec, f);
}

std::unique_ptr<Engine> MakeEngine(const Flags& f, const SpeculativeConfig& spec,
                                   std::shared_ptr<StepObserver> acc) {
  EngineOptions o;
  o.model_dir = f.model;
  o.device = f.device;
  o.num_threads = f.threads;
  o.max_model_len = f.max_model_len;
  o.load_format = f.load_format;
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  if (f.max_num_seqs > 0) o.max_num_seqs = f.max_num_seqs;  // also caps the KV pool
  if (f.max_num_batched_tokens > 0) o.max_num_batched_tokens = f.max_num_batched_tokens;
  o.enable_prefix_caching = f.prefix_caching;
  o.observer = std::move(acc);
  o.speculative = spec;
  if (!f.ssv.empty()) (void)ParseSsvStrategy(f.ssv, &o.speculative.ssv);  // the flags checked it
  if (f.ssv_group_size > 0) o.speculative.ssv.group_size = f.ssv_group_size;
  o.cost_profile = f.cost_profile;
  o.tensor_parallel.size = f.tensor_parallel_size;
  o.tensor_parallel.worker_binary = f.specd;  // "": this binary, which is not specd
  if (f.ssd_drafter == "eagle3" && f.eagle3.empty()) {
    std::fprintf(stderr, "spec_bench: --ssd-drafter eagle3 needs the head (--eagle3 HEAD_DIR)\n");
    std::exit(2);
  }
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

// The draft model at the largest K (fixed requests ask for their own K; auto's cap).
SpeculativeConfig DraftConfig(const Flags& f) {
  SpeculativeConfig draft;
  if (f.has_draft()) draft.draft_model = f.draft;
  draft.eagle3_model = f.eagle3;
  draft.parallel_drafting = f.parallel;
  draft.num_speculative_tokens = f.max_k();
  return draft;
}

// A row's method: the name alone when one K runs (the output of --k), else with its K.
std::string MethodLabel(const Flags& f, const SpeculationParams& spec) {
  const SpeculationMethod m = spec.method;
  if (spec.tree.enabled) {
    return absl::StrCat(SpeculationMethodName(m), " tree ", spec.tree.depth, "/", spec.tree.top_k,
                        "/", spec.tree.num_nodes);
  }
  if (m == SpeculationMethod::kAuto || (f.ks.size() == 1 && f.trees.empty())) {
    return SpeculationMethodName(m);
  }
  return absl::StrCat(SpeculationMethodName(m), " k=", spec.num_speculative_tokens);
}

// Prints a speculative point's row and adds it to the batch's sweep.
void Record(const Flags& f, BatchSweep& sweep, SpeculationParams spec, const Run& r) {
  PrintRow(sweep.batch, MethodLabel(f, spec), r, sweep.plain_tokens_per_s,
           sweep.plain_decode_tokens_per_s);
  if (!r.ssv_used.empty()) {
    std::printf("  batch %d %s: verification rounds by SSV strategy: %s\n", sweep.batch,
                MethodLabel(f, spec).c_str(), r.ssv_used.c_str());
  }
  if (spec.method == SpeculationMethod::kAuto) {
    sweep.auto_tokens_per_s = r.tokens_per_s;
    sweep.auto_used = r.auto_used;
  } else {
    sweep.fixed.push_back(
        {spec.tree.enabled ? MethodLabel(f, spec) : SpeculationMethodName(spec.method),
         spec.tree.enabled ? 0 : spec.num_speculative_tokens, r.tokens_per_s});
  }
}

// The speculative points of one batch: each of `methods` at each K, then auto when `with_auto`.
std::vector<SpeculationParams> Points(const Flags& f,
                                      std::initializer_list<SpeculationMethod> methods,
                                      bool with_auto) {
  std::vector<SpeculationParams> points;
  for (int k : f.ks) {
    for (SpeculationMethod m : methods) points.push_back({m, k});
  }
  // Trees: the methods that grow them (an EAGLE-3 head drafts a chain of the depth until it
  // grows trees with DraftTreeBuilder; its rows then measure its trees, replayed included).
  for (const SpecBenchFlags::Tree& t : f.trees) {
    for (SpeculationMethod m : methods) {
      if (!DraftsTrees(m)) continue;
      SpeculationParams p{m, 0};
      p.tree = TreeShape{true, t.depth, t.top_k, t.num_nodes};
      points.push_back(p);
    }
  }
  if (with_auto) points.push_back({SpeculationMethod::kAuto, 0});  // K up to the engine's
  return points;
}

// The self-speculation points (--vegas, --streaming) at each K, with the flags' sparse budget.
std::vector<SpeculationParams> SparsePoints(const Flags& f) {
  std::vector<SpeculationParams> points;
  for (int k : f.ks) {
    for (SpeculationMethod m : f.sparse_methods) {
      SpeculationParams p{m, k};
      p.sparsity_ratio = f.sparsity_ratio;
      p.sparse_min_tokens = f.sparse_min_tokens;
      points.push_back(p);
    }
  }
  return points;
}

// The prompts: random ids (--random-prompts, or a model without a tokenizer), else the file's.
Prompts LoadPrompts(const Flags& f, const Engine& engine) {
  Prompts prompts;
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

// "K 4" or "K 1,2,4" (plus auto's cap with --auto).
std::string DescribeKs(const Flags& f) {
  std::string out = "K ";
  for (size_t i = 0; i < f.ks.size(); ++i) absl::StrAppend(&out, i ? "," : "", f.ks[i]);
  if (f.run_auto) {
    absl::StrAppend(&out, "; auto up to K ", f.max_k(), " with cost profile ",
                    f.cost_profile.empty() ? "(the engine's default rule)" : f.cost_profile);
  }
  return out;
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
  ssd.ssd.time_budget = f.cache_budget == "time";
  ssd.ssd.device_data_path = f.data_path == "device";
  ssd.ssd.cache_offers = f.cache_offers == 1;
  ssd.ssd.critical_batch_size = f.critical_batch_size;
  ssd.ssd.eagle3_drafter = f.ssd_drafter == "eagle3";
  ssd.ssd.gpu_memory_utilization = f.speculator_gpu_memory_utilization;
  return ssd;
}

void RunSsd(const Flags& f, const SpeculativeConfig& draft, std::shared_ptr<StepObserver> acc,
            const Prompts& prompts, std::vector<BatchSweep>& sweeps) {
  std::unique_ptr<Engine> engine = MakeEngine(f, SsdConfig(f, draft), acc);
  std::printf(
      "ssd: verifier on %s, speculator on %s (%s), fan-out %d (geometric, %s budget), C %s, %s "
      "cache, q rows via %s, cache offers %s\n",
      engine->device_name().c_str(),
      f.speculator_device.empty() ? f.device.c_str() : f.speculator_device.c_str(),
      f.ssd_drafter == "eagle3" ? "EAGLE-3 head"
      : f.parallel              ? "parallel draft"
                                : "draft model",
      f.fan_out, f.cache_budget == "time" && f.cache_build != "complete" ? "time" : "fixed",
      f.saguaro_c < 0 ? "by temperature" : std::to_string(f.saguaro_c).c_str(),
      f.cache_build.c_str(), f.data_path.c_str(), f.cache_offers == 1 ? "on" : "off");
  Measure(*engine, *acc, prompts, 1, {SpeculationMethod::kSsd, f.max_k()}, WarmUp(f));
  for (BatchSweep& sweep : sweeps) {
    for (int k : f.ks) {
      const SpeculationParams spec = {SpeculationMethod::kSsd, k};
      Record(f, sweep, spec, MeasurePoint(*engine, *acc, prompts, sweep.batch, spec, f));
    }
  }
}

// Greedy requests for prompts [0, batch) of `tokens` tokens each.
std::vector<GenerateRequest> GreedyRequests(const Prompts& prompts, int batch, int tokens,
                                            SpeculationParams spec) {
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

bool WriteTrajectories(const std::string& path, const Prompts& t) {
  std::ofstream out(path);
  for (const auto& ids : t) out << nlohmann::json{{"tokens", ids}}.dump() << "\n";
  out.close();
  return static_cast<bool>(out);
}

// Controlled acceptance: plain decoding records every prompt's greedy continuation; then each
// speculative point replays it. Random-weight models have near-tied logits, and a verification
// chunk rounds differently from a decode step, so the target's greedy output can depend on where
// rounds start. Each point therefore first settles: it runs with the trajectories, and as long as
// its output differs from them they become its output and it runs again (a run whose rounds start
// where the last one's did repeats it exactly). The timed run then follows its trajectories, so
// acceptance is the set alpha. One engine at a time: it is made again only when the point's
// config or the trajectories it replays changed, and each point's first settling run is also its
// warm-up (its round graphs).
class Replayer {
 public:
  Replayer(const Flags& f, std::shared_ptr<StepObserver> acc, const Prompts& prompts,
           Prompts recorded, std::string path)
      : f_(f),
        acc_(std::move(acc)),
        prompts_(prompts),
        trajectories_(std::move(recorded)),
        path_(std::move(path)) {}

  // Settles `spec` at `batch` on an engine made with `config` (kept alive by the caller), then
  // measures it; nullopt after printing why it failed.
  std::optional<Run> SettleAndMeasure(const SpeculativeConfig& config, SpeculationParams spec,
                                      int batch) {
    constexpr int kMaxSettleRuns = 5;
    // N-gram drafts from the context, not the replay: its settling run is only a warm-up.
    const bool replays = spec.method != SpeculationMethod::kNgram;
    int runs = 0;
    bool settled = false;
    while (!settled && runs < kMaxSettleRuns) {
      if ((engine_ == nullptr || config_ != &config || stale_) && !Remake(config, spec)) {
        return std::nullopt;
      }
      auto out = engine_->GenerateBatch(GreedyRequests(prompts_, batch, SettleTokens(), spec));
      if (!out.ok()) {
        std::fprintf(stderr, "spec_bench: %s\n", out.status().ToString().c_str());
        return std::nullopt;
      }
      ++runs;
      settled = true;
      for (int i = 0; i < batch; ++i) {
        std::vector<int32_t> t = prompts_[i % prompts_.size()];
        for (int32_t id : (*out)[i].ids()) t.push_back(id);
        std::vector<int32_t>& want = trajectories_[i % prompts_.size()];
        if (t == want) continue;
        settled = false;
        if (replays) {
          want = std::move(t);
          stale_ = true;
        }
      }
      if (!replays) break;
    }
    g_recorded = trajectories_;  // what Measure compares outputs with
    Run run = Measure(*engine_, *acc_, prompts_, batch, spec, f_);
    run.settle_runs = settled ? runs : -runs;
    return run;
  }

  // Trajectories a round's worth longer than the timed runs, so their last rounds follow too.
  int SettleTokens() const { return f_.max_tokens + f_.max_round() + 2; }

 private:
  bool Remake(const SpeculativeConfig& config, SpeculationParams spec) {
    engine_.reset();  // one verifier (and speculator) at a time
    if (!WriteTrajectories(path_, trajectories_)) {
      std::fprintf(stderr, "spec_bench: cannot write %s\n", path_.c_str());
      return false;
    }
    engine_ = MakeEngine(f_, config, acc_);
    config_ = &config;
    stale_ = false;
    Measure(*engine_, *acc_, prompts_, 1, spec, WarmUp(f_));
    return true;
  }

  const Flags& f_;
  std::shared_ptr<StepObserver> acc_;
  const Prompts& prompts_;
  Prompts trajectories_;  // [prompt] prompt + the target's greedy continuation
  std::string path_;      // the replay file the engine reads them from
  std::unique_ptr<Engine> engine_;
  const SpeculativeConfig* config_ = nullptr;  // engine_'s
  bool stale_ = false;                         // the trajectories changed since engine_ read them
};

int MainReplay(const Flags& f) {
  auto acc = std::make_shared<StepObserver>();
  std::unique_ptr<Engine> engine = MakeEngine(f, SpeculativeConfig(), acc);
  const Prompts prompts = LoadPrompts(f, *engine);
  if (prompts.empty()) {
    std::fprintf(stderr, "spec_bench: no prompts in %s\n", f.prompts.c_str());
    return 1;
  }
  std::printf(
      "spec_bench: %s on %s, draft %s, %s, %d tokens per request, %zu prompts of %zu ids; "
      "CONTROLLED ACCEPTANCE: drafts replay the target's greedy output with alpha %.2f, candidate "
      "hit %.2f (the draft still runs every forward pass)\n",
      f.model.c_str(), engine->device_name().c_str(), f.draft.c_str(), DescribeKs(f).c_str(),
      f.max_tokens, prompts.size(), prompts[0].size(), f.replay_alpha, f.replay_hit);
  Measure(*engine, *acc, prompts, 1, {SpeculationMethod::kNone, 0}, WarmUp(f));
  std::vector<BatchSweep> sweeps;
  for (int batch : f.batches) {
    BatchSweep& sweep = sweeps.emplace_back();
    sweep.batch = batch;
    const Run plain = MeasurePoint(*engine, *acc, prompts, batch, {SpeculationMethod::kNone, 0}, f);
    sweep.plain_tokens_per_s = plain.tokens_per_s;
    sweep.plain_decode_tokens_per_s = plain.decode_tokens_per_s;
    sweep.fixed.push_back({"none", 0, sweep.plain_tokens_per_s});
  }
  const std::string path = f.replay_file.empty()
                               ? "/tmp/spec_bench_replay_" + std::to_string(::getpid()) + ".jsonl"
                               : f.replay_file;
  SpeculativeConfig draft = DraftConfig(f);
  draft.replay.file = path;
  draft.replay.alpha = f.replay_alpha;
  draft.replay.candidate_hit = f.replay_hit;
  const SpeculativeConfig ssd = SsdConfig(f, draft);
  Prompts recorded;
  {
    const int tokens = f.max_tokens + f.max_round() + 2;  // Replayer::SettleTokens
    auto plain_out = engine->GenerateBatch(GreedyRequests(prompts, static_cast<int>(prompts.size()),
                                                          tokens, {SpeculationMethod::kNone, 0}));
    if (!plain_out.ok()) {
      std::fprintf(stderr, "spec_bench: recording: %s\n", plain_out.status().ToString().c_str());
      return 1;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      recorded.push_back(prompts[i]);
      for (int32_t id : (*plain_out)[i].ids()) recorded.back().push_back(id);
    }
  }
  engine.reset();
  PrintHeader();
  for (const BatchSweep& sweep : sweeps) {
    PrintPlainRow(sweep.batch, sweep.plain_tokens_per_s, sweep.plain_decode_tokens_per_s);
  }
  Replayer replayer(f, acc, prompts, std::move(recorded), path);
  // Every point of the draft-model engine, then SSD's: one engine each. N-gram (which ignores
  // the replay) joins the draft model's points when sweeping, for the best fixed choice.
  std::vector<std::pair<const SpeculativeConfig*, std::vector<SpeculationParams>>> engines;
  if (f.has_draft()) {
    engines.push_back(
        {&draft, f.sweeps() ? Points(f, {SpeculationMethod::kDraftModel, SpeculationMethod::kNgram},
                                     f.run_auto)
                            : Points(f, {SpeculationMethod::kDraftModel}, false)});
  }
  // Vegas / streaming replay the same trajectories (their sparse draft passes run for real).
  // Without a draft model, auto runs on their engine (it may pick them, n-gram or plain).
  if (!f.sparse_methods.empty()) {
    std::vector<SpeculationParams> points = SparsePoints(f);
    if (f.run_auto && !f.has_draft()) {
      SpeculationParams p{SpeculationMethod::kAuto, 0};  // K up to the engine's
      p.sparsity_ratio = f.sparsity_ratio;               // the budget Vegas / streaming draft with
      p.sparse_min_tokens = f.sparse_min_tokens;
      points.push_back(p);
    }
    engines.push_back({&draft, std::move(points)});
  }
  // An EAGLE-3 head replays the same trajectories (its passes run for real).
  if (!f.eagle3.empty())
    engines.push_back({&draft, Points(f, {SpeculationMethod::kEagle3}, false)});
  if (f.ssd) engines.push_back({&ssd, Points(f, {SpeculationMethod::kSsd}, false)});
  for (const auto& [config, points] : engines) {
    for (BatchSweep& sweep : sweeps) {
      for (const SpeculationParams& spec : points) {
        std::optional<Run> run = replayer.SettleAndMeasure(*config, spec, sweep.batch);
        if (!run) return 1;
        Record(f, sweep, spec, *run);
      }
    }
  }
  if (f.sweeps()) PrintSweepSummary(sweeps);
  return 0;
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run stopped at its time limit keeps its rows
  Flags f;
  if (!ParseSpecBenchFlags(argc, argv, &f)) return 2;
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
  auto acc = std::make_shared<StepObserver>();
  const SpeculativeConfig draft = DraftConfig(f);
  std::unique_ptr<Engine> engine = MakeEngine(f, draft, acc);
  const Prompts prompts = LoadPrompts(f, *engine);
  if (prompts.empty()) {
    std::fprintf(stderr, "spec_bench: no prompts in %s\n", f.prompts.c_str());
    return 1;
  }
  std::printf(
      "spec_bench: %s on %s, draft %s, %s, %d tokens per request, temperature %.2f, "
      "top_p %.2f\n",
      f.model.c_str(), engine->device_name().c_str(), f.draft.c_str(), DescribeKs(f).c_str(),
      f.max_tokens, f.temperature, f.top_p);
  // Warm-up (CUDA graphs, caches).
  Measure(*engine, *acc, prompts, 1, {SpeculationMethod::kNone, 0}, WarmUp(f));
  PrintHeader();
  std::vector<BatchSweep> sweeps;
  for (int batch : f.batches) {
    BatchSweep& sweep = sweeps.emplace_back();
    sweep.batch = batch;
    const Run plain = MeasurePoint(*engine, *acc, prompts, batch, {SpeculationMethod::kNone, 0}, f);
    sweep.plain_tokens_per_s = plain.tokens_per_s;
    sweep.plain_decode_tokens_per_s = plain.decode_tokens_per_s;
    sweep.fixed.push_back({"none", 0, sweep.plain_tokens_per_s});
    PrintPlainRow(batch, sweep.plain_tokens_per_s, sweep.plain_decode_tokens_per_s);
    std::vector<SpeculationParams> points;
    if (f.has_draft()) {
      points =
          f.eagle3.empty()
              ? Points(f, {SpeculationMethod::kDraftModel, SpeculationMethod::kNgram}, f.run_auto)
              : Points(f,
                       {SpeculationMethod::kDraftModel, SpeculationMethod::kEagle3,
                        SpeculationMethod::kNgram},
                       f.run_auto);
    } else {
      points = f.eagle3.empty()
                   ? Points(f, {SpeculationMethod::kNgram}, f.run_auto)
                   : Points(f, {SpeculationMethod::kEagle3, SpeculationMethod::kNgram}, f.run_auto);
    }
    for (const SpeculationParams& p : SparsePoints(f)) points.push_back(p);
    for (const SpeculationParams& spec : points) {
      Record(f, sweep, spec, MeasurePoint(*engine, *acc, prompts, batch, spec, f));
    }
  }
  if (f.ssd) {
    engine.reset();  // one verifier at a time on the device
    RunSsd(f, draft, acc, prompts, sweeps);
  }
  if (f.sweeps()) PrintSweepSummary(sweeps);
  return 0;
}
}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
