#include "tools/profile/profile_tool.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/policy/cost_profile.h"
#include "engine/policy/ssv_planner.h"
#include "tools/profile/profiler.h"

namespace specd::profile {
namespace {

constexpr char kUsage[] =
    R"( --model DIR [--draft DIR [--parallel]] [--eagle3 DIR]
         [--output FILE] [--ssv lossless|all|STRATEGY,...] [--alpha 0.8] [--distinct-contexts]
         [--vegas [--sparsity-ratio 0.07] [--sparse-min-tokens 256] [--sparse-max-tokens 0]]
         [--device auto|cpu|cuda|cuda:N] [--load-format auto|dummy] [--threads N]
         [-tp N --specd PATH] [--batch 1,4,16,64] [--context 512,4096,16384]
         [--tokens 1,2,5,9] [--warmup 2] [--repeats 5] [--budget-seconds 300]
         [--gpu-memory-utilization 0.9] [--max-num-batched-tokens 2048] [--seed 1234]

Measures, on the device, the step times StrategyPolicy (`auto` speculation) weighs, and writes
them as a cost profile (JSON, engine/policy/cost_profile.h; default FILE cost_profile.json):
  plain    one decode step of B sequences at context C (the runner's Step), per --batch x
           --context point
  verify   one greedy verification step of B sequences x T tokens (the last token and T - 1
           drafts, StepGreedyVerify), per --batch x --tokens x --context point
  methods  ngram: drafting is free (no draft entry), dense verification;
           draft_model (with --draft): drafting K tokens = K one-token steps of the draft
           model at (B, C), K = 1 and every T - 1 > 1 (its catch-up chunk is not measured);
           with --parallel (a PARD draft, as "parallel": true in --speculative-config): one
           pass of K tokens per sequence drawing K rows, measured at every such K
           eagle3 (with --eagle3, the head's folder): drafting K tokens = K steps of the head
           (a row per sequence at context C, its cache holding the context), dense verification
  ssv      (the SSV planner; --ssv, an NSA target): per strategy ("mode/cC/rR"; "lossless":
           exact C 1, 2, 4, 8; "all": those and shared C 2, 4, 8, reuse R 2), verification as
           `verify` with every chunk under it. Printed: per drafter, batch and context, the
           (strategy, K) pairs ranked by expected tokens/s at --alpha (a chain's acceptance);
           the server picks per request and step from the grids with each request's measured
           acceptance (engine/policy/ssv_planner.h). ssv_bench --tune is this with --ssv lossless
           by default.
  vegas    (--vegas; a dense target, one rank): verify a verification whose chunks also select
           the next round's KV (--sparsity-ratio 0.07, --sparse-min-tokens 256,
           --sparse-max-tokens 0: the server's sparse budget), drafting K tokens = K sparse draft
           steps over that selection; streaming: the same steps over sinks and a window, dense
           verification
Not measured (its method is absent, so `auto` never picks it): ssd (needs a speculator
process); vegas and streaming without --vegas.
Each time is the median of --repeats calls after --warmup calls, on random token ids; the
sequences of a point share one prefilled prefix of C tokens and own the blocks they write
(--distinct-contexts: each sequence prefills its own C tokens, so attention reads B contexts
as a batch of different prompts does; the shared prefix is prefix caching's case).
--budget-seconds caps the measuring (loading excluded): repeats are lowered (to 1) when the
rest would not fit, and the run fails (no file) if a measurement is due once it is spent. Prints each point as it goes, then a table.
-tp N: the target on N GPUs (`specd worker` processes of --specd PATH); the draft on --device.
Exit status: 0 written, 1 failed, 2 bad flags.
)";

struct Flags {
  ProfileOptions profile;
  std::string output = "cost_profile.json";
};

// --ssv's value: a named set or a list of strategy names.
bool ParseSsvList(const std::string& text, std::vector<SsvStrategy>* out) {
  std::vector<std::string> names;
  if (text == "lossless" || text == "all") {
    names = {"exact/c1/r1", "exact/c2/r1", "exact/c4/r1", "exact/c8/r1"};
    if (text == "all") {
      for (const char* lossy : {"shared/c2/r1", "shared/c4/r1", "shared/c8/r1", "exact/c1/r2"}) {
        names.push_back(lossy);
      }
    }
  } else {
    names = absl::StrSplit(text, ',', absl::SkipEmpty());
  }
  out->clear();
  for (const std::string& name : names) {
    SsvStrategy s;
    if (!ParseSsvStrategy(name, &s)) return false;
    out->push_back(s);
  }
  return !out->empty();
}

bool ParseList(const std::string& text, std::vector<int32_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) return false;
    out->push_back(v);
  }
  return !out->empty();
}

// false: print the usage (bad flags, or --help with *help set).
bool ParseFlags(const char* program, int argc, char** argv, Flags* f, bool* help) {
  ProfileOptions& o = f->profile;
  using Setter = std::function<bool(const std::string&)>;
  auto text = [](std::string* field) {
    return Setter([=](const std::string& v) { return *field = v, true; });
  };
  auto number = [](int32_t* field) {
    return Setter([=](const std::string& v) { return absl::SimpleAtoi(v, field); });
  };
  auto list = [](std::vector<int32_t>* field) {
    return Setter([=](const std::string& v) { return ParseList(v, field); });
  };
  const std::vector<std::pair<std::string, Setter>> flags = {
      {"--model", text(&o.model_dir)},
      {"--draft", text(&o.draft_dir)},
      {"--eagle3", text(&o.eagle3_dir)},
      {"--output", text(&f->output)},
      {"-o", text(&f->output)},
      {"--device", text(&o.device)},
      {"--load-format",
       [&o](const std::string& v) {
         return (o.load_format = v) == "auto" || o.load_format == "dummy";
       }},
      {"--threads", number(&o.num_threads)},
      {"-tp", number(&o.tensor_parallel_size)},
      {"--tensor-parallel-size", number(&o.tensor_parallel_size)},
      {"--specd", text(&o.specd)},
      {"--batch", list(&o.batch_sizes)},
      {"--context", list(&o.contexts)},
      {"--tokens", list(&o.tokens)},
      {"--warmup", number(&o.warmup)},
      {"--repeats", number(&o.repeats)},
      {"--budget-seconds",
       [&o](const std::string& v) { return absl::SimpleAtod(v, &o.budget_seconds); }},
      {"--gpu-memory-utilization",
       [&o](const std::string& v) { return absl::SimpleAtod(v, &o.gpu_memory_utilization); }},
      {"--max-num-batched-tokens", number(&o.max_num_batched_tokens)},
      {"--seed", [&o](const std::string& v) { return absl::SimpleAtoi(v, &o.seed); }},
      {"--ssv", [&o](const std::string& v) { return ParseSsvList(v, &o.ssv); }},
      {"--alpha", [&o](const std::string& v) { return absl::SimpleAtod(v, &o.ssv_alpha); }},
      {"--sparsity-ratio",
       [&o](const std::string& v) {
         return absl::SimpleAtod(v, &o.sparsity_ratio) && o.sparsity_ratio > 0 &&
                o.sparsity_ratio <= 1;
       }},
      {"--sparse-min-tokens", number(&o.sparse_min_tokens)},
      {"--sparse-max-tokens", number(&o.sparse_max_tokens)},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return false;
    }
    if (arg == "--parallel") {  // the switches (no value)
      o.parallel_draft = true;
      continue;
    }
    if (arg == "--distinct-contexts") {
      o.distinct_contexts = true;
      continue;
    }
    if (arg == "--vegas") {
      o.sparse_drafting = true;
      continue;
    }
    auto flag = std::find_if(flags.begin(), flags.end(), [&](auto& e) { return e.first == arg; });
    if (flag == flags.end() || i + 1 >= argc || !flag->second(argv[++i])) {
      std::fprintf(stderr, "%s: bad or unknown flag %s\n", program, argv[i]);
      return false;
    }
  }
  return true;
}

void PrintTable(const ProfileOptions& o, const ProfileReport& r) {
  const CostProfile& p = r.profile;
  // Drafting K = 1 and the longest K measured, per drafter in the profile.
  std::vector<PolicyMethod> drafters;
  for (PolicyMethod m : {PolicyMethod::kDraftModel, PolicyMethod::kEagle3}) {
    if (p.Has(m)) drafters.push_back(m);
  }
  std::printf(
      "\nspecd_profile: %s; %s; %.1f s, median of %d%s calls per point\n", p.device.c_str(),
      p.models.c_str(), r.seconds, o.repeats,
      r.min_repeats < o.repeats ? absl::StrFormat(" (down to %d)", r.min_repeats).c_str() : "");
  std::string header = absl::StrFormat("%6s %8s %10s", "batch", "context", "plain_ms");
  for (int32_t t : o.tokens)
    absl::StrAppendFormat(&header, " %10s", absl::StrFormat("verify_t%d", t));
  for (PolicyMethod m : drafters) {
    for (int32_t k : {1, p.MaxK(m)}) {
      absl::StrAppendFormat(&header, " %16s", absl::StrFormat("%s_k%d", PolicyMethodName(m), k));
    }
  }
  std::printf("%s\n", header.c_str());
  if (!p.ssv().empty()) {
    std::printf(
        "(verify: the cheapest of the dense pass and the lossless SSV strategies, as the "
        "policy prices it; each strategy's own times are in the progress lines)\n");
  }
  for (int32_t b : o.batch_sizes) {
    for (int32_t c : o.contexts) {
      std::string line = absl::StrFormat("%6d %8d %10.3f", b, c, p.PlainMs(b, c));
      for (int32_t t : o.tokens) {
        absl::StrAppendFormat(&line, " %10.3f", p.VerifyMs(PolicyMethod::kPlain, b, t, c));
      }
      for (PolicyMethod m : drafters) {
        for (int32_t k : {1, p.MaxK(m)})
          absl::StrAppendFormat(&line, " %16.3f", p.DraftMs(m, b, k, c));
      }
      std::printf("%s\n", line.c_str());
    }
  }
}

// The SSV planner's ranking: per drafter (n-gram's free drafts included), batch and context, the
// (strategy, K) pairs by expected tokens/s at the profile's alpha, best first.
void PrintSsvRanking(const ProfileOptions& o, const CostProfile& p) {
  if (p.ssv().empty()) return;
  const SsvPlanner planner(p);
  std::printf(
      "\nSSV ranking at alpha %.2f (expected tokens/s of one sequence's rounds; round = "
      "draft + verification):\n",
      p.ssv_alpha);
  for (PolicyMethod m : {PolicyMethod::kNgram, PolicyMethod::kDraftModel, PolicyMethod::kEagle3}) {
    if (!p.Has(m)) continue;
    for (int32_t b : o.batch_sizes) {
      for (int32_t c : o.contexts) {
        struct Entry {
          SsvRanked r;
          int32_t k;
        };
        std::vector<Entry> entries;
        for (int32_t t : o.tokens) {
          if (t < 2) continue;
          for (const SsvRanked& r : planner.Rank(m, b, t - 1, c, /*allow_lossy=*/true, nullptr)) {
            entries.push_back({r, t - 1});
          }
        }
        std::stable_sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) {
          return x.r.tokens_per_second > y.r.tokens_per_second;
        });
        std::string line = absl::StrFormat("  %-11s b=%-3d ctx=%-6d", PolicyMethodName(m), b, c);
        for (const Entry& e : entries) {
          const SsvStrategy& s = p.ssv()[e.r.index].strategy;
          absl::StrAppendFormat(&line, " %s K%d %.1f (%.2f ms)%s;", SsvStrategyName(s), e.k,
                                e.r.tokens_per_second, e.r.round_ms, s.lossy() ? " lossy" : "");
        }
        std::printf("%s\n", line.c_str());
      }
    }
  }
}

}  // namespace

int RunProfileTool(const char* program, int argc, char** argv, bool tune_ssv) {
  Flags f;
  if (tune_ssv) ParseSsvList("lossless", &f.profile.ssv);
  bool help = false;
  if (!ParseFlags(program, argc, argv, &f, &help)) {
    std::fprintf(help ? stdout : stderr, "usage: %s%s", program, kUsage);
    return help ? 0 : 2;
  }
  if (absl::Status s = f.profile.Validate(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(s.message()).c_str());
    std::fprintf(stderr, "usage: %s%s", program, kUsage);
    return 2;
  }
  f.profile.log = [](std::string_view line) {
    std::printf("%.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(stdout);
  };
  absl::StatusOr<ProfileReport> report = MeasureProfile(f.profile);
  if (!report.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, report.status().ToString().c_str());
    return 1;
  }
  PrintTable(f.profile, *report);
  PrintSsvRanking(f.profile, report->profile);
  if (absl::Status s = report->profile.Save(f.output); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s\n", f.output.c_str());
  return 0;
}

}  // namespace specd::profile
