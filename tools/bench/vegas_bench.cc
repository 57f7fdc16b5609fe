// vegas_bench: end-to-end decoding throughput of self-speculation at long context -- plain
// decoding against Vegas and streaming (StreamingLLM sinks + window at the same budget) over a
// grid of K and sparsity ratios -- with the engine's offline GenerateBatch, one engine, on the
// CPU or a GPU. Prompts: the held-out window of codepair-long/golden.json (8,192 ids, then its
// 2,048-id window appended for longer contexts), cut to --context ids, request i rotated by
// i * 997 ids so no two requests share a prefix (a prefix-cache hit would read one KV for all);
// every prompt is prefilled once before timing, so the timed runs decode from the prefix cache.
// Every request generates exactly --max-tokens tokens (EOS ignored), greedy. Prints, per batch
// and (method, K, ratio): tokens/s, its ratio to plain decoding, tokens per verification round
// (accepted + 1), acceptance by draft position, and the mean draft and verification time of a
// speculative step.
//
//   vegas_bench [--model DIR] [--device cuda] [--context 8192] [--batches 1,8] [--ks 4,6,8]
//               [--ratios 0.05,0.07,0.1] [--min-tokens 256] [--max-tokens 128] [--repeats 2]
//               [--methods vegas,streaming] [--max-model-len 16384]
//               [--gpu-memory-utilization 0.9]
//
// --tune: the Vegas paper's three-step tuning instead of the grid, at the first batch size, on
// --prompts FILE (a JSON array of token-id arrays, or of objects with "prompt_ids", as
// golden.json has them; each cut to --context ids from its end; default: the held-out windows
// above): (1) at the largest K of --ks, the ratios of --ratios in ascending order until the
// tokens per round stop growing by more than --plateau (relative; the ratio before the step
// that did not is kept); (2) at that ratio, every K of --ks by tokens/s; (3) at that K, the
// kept ratio's neighbours in --ratios by tokens/s. Prints every measurement and the choice, and
// writes it with --write FILE as a --speculative-config JSON ({"method": "vegas",
// "num_speculative_tokens", "sparsity_ratio", "min_tokens"}).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "tools/bench/flag_parse.h"
#include "tools/bench/timed_batch.h"

namespace specd {
namespace {

struct Flags {
  std::string model = "models/codepair-long";
  std::string device = "cuda";
  int context = 8192;
  std::vector<int> batches = {1, 8};
  std::vector<int> ks = {4, 6, 8};
  std::vector<double> ratios = {0.05, 0.07, 0.1};
  std::vector<SpeculationMethod> methods = {SpeculationMethod::kVegas,
                                            SpeculationMethod::kStreaming};
  int min_tokens = 256;  // the sparse budget's floor (the Vegas fork's default)
  int max_tokens = 128;
  int repeats = 2;
  int max_model_len = 16384;
  double gpu_memory_utilization = 0.9;
  bool tune = false;
  std::string prompts_file;  // --tune: prompts; "": golden.json's held-out windows
  double plateau = 0.02;  // --tune: a ratio step growing tokens per round less than this ends (1)
  std::string write;      // --tune: where the choice goes
};

bool ParseMethods(const std::string& s, std::vector<SpeculationMethod>* out) {
  out->clear();
  for (absl::string_view item : absl::StrSplit(s, ',')) {
    if (item == "vegas") {
      out->push_back(SpeculationMethod::kVegas);
    } else if (item == "streaming") {
      out->push_back(SpeculationMethod::kStreaming);
    } else {
      return false;
    }
  }
  return !out->empty();
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  return ParseEachFlag(argc, argv, "vegas_bench", [f](const std::string& a, const auto& value) {
    bool ok = true;
    if (a == "--model") {
      f->model = value();
    } else if (a == "--device") {
      f->device = value();
    } else if (a == "--context") {
      ok = absl::SimpleAtoi(value(), &f->context) && f->context >= 64;
    } else if (a == "--batches") {
      ok = ParseIntList(value(), 1, std::numeric_limits<int>::max(), &f->batches);
    } else if (a == "--ks") {
      ok = ParseIntList(value(), 1, 15, &f->ks);
    } else if (a == "--ratios") {
      ok = ParseFractionList(value(), &f->ratios);
    } else if (a == "--methods") {
      ok = ParseMethods(value(), &f->methods);
    } else if (a == "--min-tokens") {
      ok = absl::SimpleAtoi(value(), &f->min_tokens) && f->min_tokens >= 0;
    } else if (a == "--max-tokens") {
      ok = absl::SimpleAtoi(value(), &f->max_tokens) && f->max_tokens > 0;
    } else if (a == "--repeats") {
      ok = absl::SimpleAtoi(value(), &f->repeats) && f->repeats > 0;
    } else if (a == "--max-model-len") {
      ok = absl::SimpleAtoi(value(), &f->max_model_len) && f->max_model_len > 0;
    } else if (a == "--tune") {
      f->tune = true;
    } else if (a == "--prompts") {
      f->prompts_file = value();
      ok = !f->prompts_file.empty();
    } else if (a == "--plateau") {
      ok = absl::SimpleAtod(value(), &f->plateau) && f->plateau >= 0 && f->plateau < 1;
    } else if (a == "--write") {
      f->write = value();
      ok = !f->write.empty();
    } else if (a == "--gpu-memory-utilization") {
      ok = absl::SimpleAtod(value(), &f->gpu_memory_utilization) && f->gpu_memory_utilization > 0 &&
           f->gpu_memory_utilization <= 1;
    } else {
      ok = false;
    }
    return ok;
  });
}

struct Result {
  double tokens_per_s = 0, tokens_per_round = 0, draft_ms = 0, verify_ms = 0;
  std::string acceptance;
};

std::vector<GenerateRequest> Requests(const std::vector<std::vector<int32_t>>& prompts, int batch,
                                      int max_tokens, const SpeculationParams& spec) {
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < batch; ++i) {
    GenerateRequest r;
    r.prompt_ids = prompts[i];
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.speculation = spec;
    requests.push_back(std::move(r));
  }
  return requests;
}

// Best of f.repeats runs by tokens/s.
Result Measure(Engine& engine, Acceptance& obs, const std::vector<std::vector<int32_t>>& prompts,
               int batch, const SpeculationParams& spec, const Flags& f) {
  const std::vector<GenerateRequest> requests = Requests(prompts, batch, f.max_tokens, spec);
  Result best;
  for (int rep = 0; rep < f.repeats; ++rep) {
    obs.Take();
    obs.TakeStepTimes();
    const TimedBatch batch_run = RunTimedBatch(engine, requests, "vegas_bench");
    Result run;
    run.tokens_per_s = batch_run.tokens_per_s();
    run.tokens_per_round = batch_run.tokens_per_round();
    run.acceptance = obs.Take();
    std::tie(run.draft_ms, run.verify_ms) = obs.TakeStepTimes();
    if (run.tokens_per_s > best.tokens_per_s) best = run;
  }
  return best;
}

// golden.json's held-out windows, the 8,192-id one first, each request's prompt rotated.
std::vector<std::vector<int32_t>> LoadPrompts(const Flags& f, int count) {
  std::ifstream in(f.model + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!golden.is_array() || golden.size() < 2) return {};
  std::vector<int32_t> text = golden[1]["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> more = golden[0]["prompt_ids"].get<std::vector<int32_t>>();
  text.insert(text.end(), more.begin(), more.end());
  if (static_cast<int>(text.size()) < f.context) return {};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p = text;
    std::rotate(p.begin(), p.begin() + (static_cast<size_t>(i) * 997) % p.size(), p.end());
    p.resize(f.context);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// --prompts FILE: a JSON array of id arrays or of {"prompt_ids": [...]} objects, each cut to
// its last `context` ids, repeated in turn up to `count` prompts (each rotated by 997 ids per
// repetition, so no two share a prefix). Empty when the file is unreadable or a prompt shorter.
std::vector<std::vector<int32_t>> LoadPromptFile(const Flags& f, int count) {
  std::ifstream in(f.prompts_file);
  const nlohmann::json list = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array() || list.empty()) return {};
  std::vector<std::vector<int32_t>> file;
  for (const nlohmann::json& e : list) {
    const nlohmann::json& ids = e.is_object() ? e.value("prompt_ids", nlohmann::json()) : e;
    if (!ids.is_array()) return {};
    std::vector<int32_t> p;
    for (const nlohmann::json& id : ids) {
      if (!id.is_number_integer()) return {};
      p.push_back(id.get<int32_t>());
    }
    if (static_cast<int>(p.size()) < f.context) return {};
    p.erase(p.begin(), p.end() - f.context);
    file.push_back(std::move(p));
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p = file[i % file.size()];
    const size_t turn = i / file.size();
    std::rotate(p.begin(), p.begin() + (turn * 997) % p.size(), p.end());
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// The paper's three steps (see the top of the file); returns 0 or an exit status.
int Tune(Engine& engine, Acceptance& obs, const std::vector<std::vector<int32_t>>& prompts,
         const Flags& f) {
  const int batch = f.batches.front();
  std::vector<double> ratios = f.ratios;
  std::sort(ratios.begin(), ratios.end());
  std::vector<int> ks = f.ks;
  std::sort(ks.begin(), ks.end());
  auto run = [&](int k, double ratio, const char* step) {
    SpeculationParams spec{SpeculationMethod::kVegas, k};
    spec.sparsity_ratio = ratio;
    spec.sparse_min_tokens = f.min_tokens;
    const Result r = Measure(engine, obs, prompts, batch, spec, f);
    std::printf("%-10s %3d %6.3f %12.1f %10.2f  %s\n", step, k, ratio, r.tokens_per_s,
                r.tokens_per_round, r.acceptance.c_str());
    std::fflush(stdout);
    return r;
  };
  const double plain_tps =
      Measure(engine, obs, prompts, batch, {SpeculationMethod::kNone, 0}, f).tokens_per_s;
  std::printf(
      "vegas tune: batch %d, context %d, plain decoding %.1f tokens/s\n%-10s %3s %6s %12s %10s  "
      "%s\n",
      batch, f.context, plain_tps, "step", "K", "ratio", "tokens/s", "tok/round",
      "acceptance by position");
  // (1) The accepted length against the ratio at the largest K, until it plateaus.
  const int k_max = ks.back();
  size_t kept = 0;
  double last = run(k_max, ratios[0], "1 ratio").tokens_per_round;
  for (size_t i = 1; i < ratios.size(); ++i) {
    const double now = run(k_max, ratios[i], "1 ratio").tokens_per_round;
    if (now < last * (1.0 + f.plateau)) break;  // ratios[i] bought too little: keep the one before
    kept = i;
    last = now;
  }
  // (2) K at that ratio, by tokens/s.
  int best_k = k_max;
  double best_tps = -1;
  for (int k : ks) {
    const double tps = run(k, ratios[kept], "2 K").tokens_per_s;
    if (tps > best_tps) std::tie(best_k, best_tps) = std::pair{k, tps};
  }
  // (3) The ratio's neighbours at that K, by tokens/s.
  double best_ratio = ratios[kept];
  for (size_t i : {kept - 1, kept + 1}) {
    if (i >= ratios.size()) continue;  // kept - 1 wraps when kept is 0
    const double tps = run(best_k, ratios[i], "3 ratio").tokens_per_s;
    if (tps > best_tps) std::tie(best_ratio, best_tps) = std::pair{ratios[i], tps};
  }
  const nlohmann::json choice = {{"method", "vegas"},
                                 {"num_speculative_tokens", best_k},
                                 {"sparsity_ratio", best_ratio},
                                 {"min_tokens", f.min_tokens}};
  std::printf(
      "vegas tune: K %d, sparsity_ratio %.3f (%.1f tokens/s at batch %d, %.2fx plain): %s\n",
      best_k, best_ratio, best_tps, batch, best_tps / plain_tps, choice.dump().c_str());
  if (!f.write.empty()) {
    std::ofstream out(f.write);
    out << choice.dump(2) << "\n";
    if (!out.good()) {
      std::fprintf(stderr, "vegas_bench: cannot write %s\n", f.write.c_str());
      return 1;
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  const int most =
      f.tune ? f.batches.front() : *std::max_element(f.batches.begin(), f.batches.end());
  const std::vector<std::vector<int32_t>> prompts =
      f.prompts_file.empty() ? LoadPrompts(f, most) : LoadPromptFile(f, most);
  if (prompts.empty()) {
    std::fprintf(
        stderr, "vegas_bench: %s has no prompts of at least %d ids\n",
        f.prompts_file.empty() ? (f.model + "/golden.json").c_str() : f.prompts_file.c_str(),
        f.context);
    return 1;
  }
  auto obs = std::make_shared<Acceptance>();
  EngineOptions o;
  o.model_dir = f.model;
  o.device = f.device;
  o.max_model_len = f.max_model_len;
  o.max_num_seqs = std::max(16, most);
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  o.observer = obs;
  auto created = Engine::Create(o);
  if (!created.ok()) {
    std::fprintf(stderr, "vegas_bench: %s\n", created.status().ToString().c_str());
    return 1;
  }
  Engine& engine = **created;
  std::printf(
      "vegas_bench: %s on %s, context %d, %d tokens per request (greedy), sparse floor %d "
      "tokens, best of %d\n",
      f.model.c_str(), engine.device_name().c_str(), f.context, f.max_tokens, f.min_tokens,
      f.repeats);
  // Prefill every prompt once (its KV stays in the prefix cache) and warm up.
  Flags warm = f;
  warm.max_tokens = 8;
  warm.repeats = 1;
  Measure(engine, *obs, prompts, most, {SpeculationMethod::kNone, 0}, warm);
  if (f.tune) return Tune(engine, *obs, prompts, f);
  std::printf("%-6s %-10s %3s %6s %12s %9s %10s  %-28s %s\n", "batch", "method", "K", "ratio",
              "tokens/s", "vs plain", "tok/round", "per step: draft / verify ms",
              "acceptance by position");
  for (int batch : f.batches) {
    const Result plain = Measure(engine, *obs, prompts, batch, {SpeculationMethod::kNone, 0}, f);
    std::printf("%-6d %-10s %3s %6s %12.1f %8.2fx %10s\n", batch, "none", "-", "-",
                plain.tokens_per_s, 1.0, "-");
    for (SpeculationMethod m : f.methods) {
      for (int k : f.ks) {
        for (double ratio : f.ratios) {
          SpeculationParams spec{m, k};
          spec.sparsity_ratio = ratio;
          spec.sparse_min_tokens = f.min_tokens;
          const Result r = Measure(engine, *obs, prompts, batch, spec, f);
          std::printf("%-6d %-10s %3d %6.3f %12.1f %8.2fx %10.2f  %9.2f / %-16.2f %s\n", batch,
                      SpeculationMethodName(m), k, ratio, r.tokens_per_s,
                      r.tokens_per_s / plain.tokens_per_s, r.tokens_per_round, r.draft_ms,
                      r.verify_ms, r.acceptance.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
