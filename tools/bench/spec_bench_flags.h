// spec_bench's command line: the flags (documented at the top of spec_bench.cc) and their
// parser, which checks each value's range and prints the flag it refused. Main thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/base/ssv.h"
#include "engine/speculation/spec_config.h"
#include "tools/bench/flag_parse.h"

namespace specd {

struct SpecBenchFlags {
  std::string model = "models/codepair/target";
  std::string draft = "models/codepair/draft";
  std::string eagle3;     // --eagle3 DIR: an EAGLE-3 head, measured beside the draft model
  bool parallel = false;  // --parallel: the draft drafts a round in one pass (PARD)
  std::string device = "cpu";
  std::string prompts = "models/codepair/prompts.jsonl";
  std::vector<int> batches = {1, 16};
  std::vector<int> ks = {4};  // --ks (or --k): the fixed methods run at each
  // --trees D/T/N,...: token trees (depth, top_k, num_nodes) the draft model and n-gram also run
  struct Tree {
    int depth = 0, top_k = 0, num_nodes = 0;
  };
  std::vector<Tree> trees;
  bool run_auto = false;     // --auto: also method auto (K up to the largest of ks)
  std::string cost_profile;  // --cost-profile: auto's profile; "": the engine's default rule
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
  std::string cache_budget = "time";  // SSD: "time" (the measured window) or "fixed" (F)
  std::string data_path = "device";   // SSD: q rows GPU to GPU ("device") or over TCP ("host")
  int cache_offers = 1;               // SSD: the speculator offers its greedy branches (1) or not
  int critical_batch_size = 0;        // SSD: b* (0: measured; large: misses never go to backup)
  int ssv_group_size = 0;  // NSA targets: --ssv-group-size C (SSV exact; 0: the server's default)
  std::string ssv;         // NSA targets: --ssv mode/cC/rR, the server's strategy ("": default)
  std::string ssd_drafter = "draft_model";  // SSD: the speculator's drafter ("eagle3": --eagle3)
  std::string load_format = "auto";
  int random_prompts = 0;  // prompt length in random ids; 0: the prompts file
  int max_model_len = 2048;
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 0;                          // 0: the engine's default
  int max_num_batched_tokens = 0;                // 0: the engine's default (a step's token cap)
  double speculator_gpu_memory_utilization = 0;  // 0: the verifier's
  double replay_alpha = -1;                      // < 0: no replay
  double replay_hit = 0.9;
  std::string replay_file;  // "": a file in /tmp
  // --no-prefix-caching: every run prefills its prompts. With the cache on (the engine's
  // default), a point's timed run hits the prompts its untimed run prefilled, and an EAGLE-3 head
  // never sees the target's hidden states of those positions, so it drafts with less context
  // than a request with a new prompt has (engine/speculation/eagle3.h).
  bool prefix_caching = true;
  // --decode-phase: each row also reports its tokens per second while every request decodes
  // (with --no-prefix-caching, long prompts' prefill is then measured but left out of that rate).
  bool decode_phase = false;
  // --vegas / --streaming: self-speculation points (the target drafts over a sparse selection of
  // its own KV; replayed under --replay-alpha like a draft model), at --sparsity-ratio R with a
  // floor of --sparse-min-tokens N.
  std::vector<SpeculationMethod> sparse_methods;
  double sparsity_ratio = 0.07;
  int sparse_min_tokens = 256;

  // --draft none: no draft model (its points are skipped; n-gram, EAGLE-3, Vegas still run).
  bool has_draft() const { return draft != "none"; }
  int max_k() const { return *std::max_element(ks.begin(), ks.end()); }
  // The most drafts one round may accept: the largest K or tree depth.
  int max_round() const {
    int most = max_k();
    for (const Tree& t : trees) most = std::max(most, t.depth);
    return most;
  }
  // Whether the run ends with the sweep summary (several K, or auto beside the fixed choices).
  bool sweeps() const { return run_auto || ks.size() > 1 || !trees.empty(); }
};

inline bool ParseSpecBenchFlags(int argc, char** argv, SpecBenchFlags* f) {
  return ParseEachFlag(argc, argv, "spec_bench", [f](const std::string& a, const auto& value) {
    bool ok = true;
    if (a == "--model") {
      f->model = value();
    } else if (a == "--draft") {
      f->draft = value();
    } else if (a == "--parallel") {
      f->parallel = true;
    } else if (a == "--eagle3") {
      ok = !(f->eagle3 = value()).empty();
    } else if (a == "--device") {
      f->device = value();
    } else if (a == "--prompts") {
      f->prompts = value();
    } else if (a == "--k") {
      f->ks.assign(1, 0);
      ok = absl::SimpleAtoi(value(), &f->ks[0]) && f->ks[0] >= 1 && f->ks[0] <= 64;
    } else if (a == "--ks") {
      ok = ParseIntList(value(), 1, 64, &f->ks);
    } else if (a == "--trees") {
      f->trees.clear();
      const std::vector<std::string> items = absl::StrSplit(value(), ',');
      for (const std::string& item : items) {
        std::vector<int> v;
        ok = ok && ParseIntList(absl::StrReplaceAll(item, {{"/", ","}}), 1, 64, &v) &&
             v.size() == 3 && v[1] <= 16;
        if (ok) f->trees.push_back({v[0], v[1], v[2]});
      }
    } else if (a == "--auto") {
      f->run_auto = true;
    } else if (a == "--cost-profile") {
      ok = !(f->cost_profile = value()).empty();
    } else if (a == "--max-tokens") {
      ok = absl::SimpleAtoi(value(), &f->max_tokens) && f->max_tokens > 0;
    } else if (a == "--temperature") {
      ok = absl::SimpleAtof(value(), &f->temperature);
    } else if (a == "--top-p") {
      ok = absl::SimpleAtof(value(), &f->top_p) && f->top_p > 0 && f->top_p <= 1;
    } else if (a == "--repeats") {
      ok = absl::SimpleAtoi(value(), &f->repeats) && f->repeats > 0;
    } else if (a == "--threads") {
      ok = absl::SimpleAtoi(value(), &f->threads);
    } else if (a == "--ssd") {
      f->ssd = true;
    } else if (a == "--specd") {
      f->specd = value();
    } else if (a == "--tensor-parallel-size" || a == "-tp") {
      ok = absl::SimpleAtoi(value(), &f->tensor_parallel_size) && f->tensor_parallel_size >= 1;
    } else if (a == "--speculator-device") {
      f->speculator_device = value();
    } else if (a == "--critical-batch-size") {
      ok = absl::SimpleAtoi(value(), &f->critical_batch_size) && f->critical_batch_size >= 0;
    } else if (a == "--ssd-drafter") {
      ok = (f->ssd_drafter = value()) == "draft_model" || f->ssd_drafter == "eagle3";
    } else if (a == "--cache-offers") {
      ok = absl::SimpleAtoi(value(), &f->cache_offers) &&
           (f->cache_offers == 0 || f->cache_offers == 1);
    } else if (a == "--data-path") {
      ok = (f->data_path = value()) == "device" || f->data_path == "host";
    } else if (a == "--cache-budget") {
      ok = (f->cache_budget = value()) == "time" || f->cache_budget == "fixed";
    } else if (a == "--cache-build") {
      ok = (f->cache_build = value()) == "complete" || f->cache_build == "interruptible";
    } else if (a == "--fan-out") {
      ok = absl::SimpleAtoi(value(), &f->fan_out) && f->fan_out >= 1;
    } else if (a == "--saguaro-c") {
      ok = absl::SimpleAtof(value(), &f->saguaro_c) && f->saguaro_c >= 0 && f->saguaro_c <= 1;
    } else if (a == "--load-format") {
      ok = (f->load_format = value()) == "auto" || f->load_format == "dummy";
    } else if (a == "--random-prompts") {
      ok = absl::SimpleAtoi(value(), &f->random_prompts) && f->random_prompts >= 8;
    } else if (a == "--gpu-memory-utilization") {
      ok = absl::SimpleAtod(value(), &f->gpu_memory_utilization) && f->gpu_memory_utilization > 0 &&
           f->gpu_memory_utilization <= 1;
    } else if (a == "--speculator-gpu-memory-utilization") {
      ok = absl::SimpleAtod(value(), &f->speculator_gpu_memory_utilization) &&
           f->speculator_gpu_memory_utilization > 0 && f->speculator_gpu_memory_utilization <= 1;
    } else if (a == "--no-prefix-caching") {
      f->prefix_caching = false;
    } else if (a == "--decode-phase") {
      f->decode_phase = true;
    } else if (a == "--vegas" || a == "--streaming") {
      const SpeculationMethod m =
          a == "--vegas" ? SpeculationMethod::kVegas : SpeculationMethod::kStreaming;
      if (std::find(f->sparse_methods.begin(), f->sparse_methods.end(), m) ==
          f->sparse_methods.end()) {
        f->sparse_methods.push_back(m);
      }
    } else if (a == "--sparsity-ratio") {
      ok = absl::SimpleAtod(value(), &f->sparsity_ratio) && f->sparsity_ratio > 0 &&
           f->sparsity_ratio <= 1;
    } else if (a == "--sparse-min-tokens") {
      ok = absl::SimpleAtoi(value(), &f->sparse_min_tokens) && f->sparse_min_tokens >= 0;
    } else if (a == "--max-num-seqs") {
      ok = absl::SimpleAtoi(value(), &f->max_num_seqs) && f->max_num_seqs > 0;
    } else if (a == "--max-num-batched-tokens") {
      ok = absl::SimpleAtoi(value(), &f->max_num_batched_tokens) && f->max_num_batched_tokens > 0;
    } else if (a == "--max-model-len") {
      ok = absl::SimpleAtoi(value(), &f->max_model_len) && f->max_model_len > 0;
    } else if (a == "--replay-alpha") {
      ok = absl::SimpleAtod(value(), &f->replay_alpha) && f->replay_alpha >= 0 &&
           f->replay_alpha <= 1;
    } else if (a == "--replay-hit") {
      ok = absl::SimpleAtod(value(), &f->replay_hit) && f->replay_hit >= 0 && f->replay_hit <= 1;
    } else if (a == "--replay-file") {
      ok = !(f->replay_file = value()).empty();
    } else if (a == "--ssv-group-size") {
      ok = absl::SimpleAtoi(value(), &f->ssv_group_size) && f->ssv_group_size >= 1 &&
           f->ssv_group_size <= 16;
    } else if (a == "--ssv") {
      SsvStrategy s;
      ok = ParseSsvStrategy(f->ssv = value(), &s);
    } else if (a == "--batches") {
      ok = ParseIntList(value(), 1, 1 << 20, &f->batches);
    } else {
      ok = false;
    }
    return ok;
  });
}

}  // namespace specd
