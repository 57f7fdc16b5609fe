// ssv_bench: what SSV's strategies (engine/base/ssv.h) cost in quality and what they save in KV
// reads, on an NSA model on the CPU (nsa-codepair, its draft the codepair draft). Prompts: the
// model's golden.json (the beginnings of held-out files). For each strategy:
//  - teacher-forced log-likelihood: each prompt's first --prefix ids prefilled, the rest run in
//    verification chunks of K + 1 ids under the strategy, as if every draft were accepted (each
//    chunk's KV stays, as an accepted round's does); the mean negative log-likelihood per scored
//    id, against the model's own (no strategy, the same chunks);
//  - greedy speculative decoding with the draft model (K drafts per round, --tokens ids per
//    prompt, EOS ignored): agreement with strict decoding (ids equal before the first
//    difference, and prompts equal throughout), acceptance, and what each verification query
//    read per layer and KV head, alone and grouped, from the engine's SSV metrics (bytes: keys x
//    head_dim x 2 (K and V) x 2 (bf16), the GPU's cache format).
// The CPU computes a group query by query, so this tool measures reads and quality, not time.
// `ssv_bench --tune [specd_profile's flags]` is the planner: it measures each strategy's
// verification on the device and writes them, ranked, into a cost profile (tools/profile).
//
//   ssv_bench [--model DIR] [--draft DIR] [--k 7] [--tokens 64] [--prefix 64]
//             [--strategies exact/c1/r1,exact/c4/r1,shared/c4/r1,exact/c1/r2] [--threads 2]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/base/mapped_file.h"
#include "engine/engine.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "nlohmann/json.hpp"
#include "tools/bench/flag_parse.h"
#include "tools/profile/profile_tool.h"

namespace specd {
namespace {

struct Flags {
  std::string model = std::string(SPECD_SHARED_DIR) + "/models/nsa-codepair";
  std::string draft = std::string(SPECD_SHARED_DIR) + "/models/codepair/draft";
  int k = 7;
  int tokens = 64;
  int prefix = 64;
  int threads = 2;
  std::vector<SsvStrategy> strategies;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  std::string strategies =
      "exact/c1/r1,exact/c2/r1,exact/c4/r1,exact/c8/r1,shared/c2/r1,"
      "shared/c4/r1,shared/c8/r1,exact/c1/r2,exact/c1/r3,shared/c4/r2";
  const bool ok = ParseEachFlag(argc, argv, "ssv_bench", [&](const std::string& flag, auto value) {
    if (flag == "--model") return !(f->model = value()).empty();
    if (flag == "--draft") return !(f->draft = value()).empty();
    if (flag == "--strategies") return !(strategies = value()).empty();
    int* ints[] = {&f->k, &f->tokens, &f->prefix, &f->threads};
    const char* names[] = {"--k", "--tokens", "--prefix", "--threads"};
    for (int i = 0; i < 4; ++i) {
      if (flag == names[i]) return absl::SimpleAtoi(value(), ints[i]) && *ints[i] > 0;
    }
    return false;
  });
  if (!ok) return false;
  for (const std::string& s : std::vector<std::string>(absl::StrSplit(strategies, ','))) {
    SsvStrategy st;
    if (!ParseSsvStrategy(s, &st)) {
      std::fprintf(stderr, "ssv_bench: bad strategy %s (mode/cC/rR)\n", s.c_str());
      return false;
    }
    f->strategies.push_back(st);
  }
  return true;
}

std::vector<std::vector<int32_t>> ReadPrompts(const std::string& model) {
  absl::StatusOr<std::string> text = ReadFileToString(model + "/golden.json");
  if (!text.ok()) return {};
  const nlohmann::json list = nlohmann::json::parse(*text, nullptr, false);
  std::vector<std::vector<int32_t>> out;
  if (!list.is_array()) return out;
  for (const nlohmann::json& e : list) out.push_back(e["prompt_ids"].get<std::vector<int32_t>>());
  return out;
}

// Negative log-likelihood (nats) of each prompt's ids after the prefix, scored by verification
// chunks of `chunk` ids under `ssv` (null: the model's own attention). Returns {sum, count}.
std::pair<double, int64_t> TeacherForcedNll(Model& model, CpuKvCache& kv,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            int prefix, int chunk, const SsvStrategy* ssv) {
  const int64_t vocab = model.config().vocab_size;
  double nll = 0;
  int64_t count = 0;
  for (const std::vector<int32_t>& ids : prompts) {
    const int32_t n = static_cast<int32_t>(ids.size());
    std::vector<int32_t> table(kv.spec().num_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::vector<float> logits;
    const SequenceInput pre{std::span(ids).subspan(0, prefix), 0, table, false};
    if (!model.Forward(std::span(&pre, 1), kv, &logits).ok()) return {NAN, 0};
    // A chunk starts at the last id whose KV is in: its rows predict the chunk's next ids.
    for (int32_t start = prefix - 1; start + 1 < n; start += chunk - 1) {
      const int32_t len = std::min(chunk, n - start);
      SequenceInput in{std::span(ids).subspan(start, len), start, table, true};
      in.ssv = ssv;
      logits.clear();
      if (!model.Forward(std::span(&in, 1), kv, &logits).ok()) return {NAN, 0};
      for (int32_t r = 0; r + 1 < len; ++r) {
        const float* row = logits.data() + r * vocab;
        const float max = *std::max_element(row, row + vocab);
        double sum = 0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double{row[v]} - max);
        nll += std::log(sum) + max - row[ids[start + r + 1]];
        ++count;
      }
    }
  }
  return {nll, count};
}

class SsvTotals : public EngineObserver {
 public:
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    std::lock_guard lock(mu_);
    stats_ += m.ssv;
  }
  SsvLoadStats Take() {
    std::lock_guard lock(mu_);
    SsvLoadStats s = stats_;
    stats_ = {};
    return s;
  }

 private:
  std::mutex mu_;
  SsvLoadStats stats_;
};

int Main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  const std::vector<std::vector<int32_t>> prompts = ReadPrompts(f.model);
  if (prompts.empty()) {
    std::fprintf(stderr, "ssv_bench: no prompts in %s/golden.json\n", f.model.c_str());
    return 1;
  }
  LoadOptions load;
  load.num_threads = f.threads;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(f.model, load);
  if (!model.ok() || !(*model)->config().is_nsa()) {
    std::fprintf(stderr, "ssv_bench: %s is not an NSA model: %s\n", f.model.c_str(),
                 model.ok() ? "" : std::string(model.status().message()).c_str());
    return 1;
  }
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  absl::StatusOr<std::unique_ptr<CpuKvCache>> kv =
      CpuKvCache::Create((*model)->MakeKvCacheSpec(static_cast<int32_t>(longest / 16 + 2)));
  if (!kv.ok()) return 1;

  auto observer = std::make_shared<SsvTotals>();
  EngineOptions options;
  options.model_dir = f.model;
  options.num_threads = f.threads;
  options.max_model_len = 2048;
  options.speculative.draft_model = f.draft;
  options.observer = observer;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "ssv_bench: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  auto requests = [&](const SsvStrategy* st) {
    std::vector<GenerateRequest> out;
    for (const auto& p : prompts) {
      GenerateRequest r;
      r.prompt_ids = p;
      r.params.temperature = 0;
      r.params.max_tokens = f.tokens;
      r.params.ignore_eos = true;
      r.speculation.method = SpeculationMethod::kDraftModel;
      r.speculation.num_speculative_tokens = f.k;
      if (st != nullptr) {
        r.speculation.ssv_group_size = st->group_size;
        r.speculation.ssv_mode = st->mode;
        r.speculation.ssv_refresh_every = st->refresh_every;
      }
      out.push_back(std::move(r));
    }
    return out;
  };
  // Strict greedy output: plain decoding.
  std::vector<GenerateRequest> plain = requests(nullptr);
  for (GenerateRequest& r : plain) r.speculation.method = SpeculationMethod::kNone;
  absl::StatusOr<std::vector<GenerateResult>> want = (*engine)->GenerateBatch(plain);
  if (!want.ok()) return 1;
  const auto [base_nll, base_count] =
      TeacherForcedNll(**model, **kv, prompts, f.prefix, f.k + 1, nullptr);
  const int head_dim = (*model)->config().head_dim;
  std::printf(
      "nsa-codepair, %zu held-out prompts; teacher-forced NLL over %lld ids (chunks of %d after "
      "%d prefilled): %.4f nats/id without a strategy\n",
      prompts.size(), (long long)base_count, f.k + 1, f.prefix, base_nll / base_count);
  std::printf(
      "| strategy | lossy | NLL (nats/id) | dNLL | greedy ids equal to strict before the first "
      "difference | prompts identical | acceptance | keys/query alone | keys/query grouped | "
      "KV bytes/query grouped (bf16) | grouped / alone | adjacent overlap |\n");
  std::printf(
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const SsvStrategy& st : f.strategies) {
    const auto [nll, count] = TeacherForcedNll(**model, **kv, prompts, f.prefix, f.k + 1, &st);
    observer->Take();
    absl::StatusOr<std::vector<GenerateResult>> got = (*engine)->GenerateBatch(requests(&st));
    if (!got.ok()) {
      std::fprintf(stderr, "ssv_bench: %s\n", std::string(got.status().message()).c_str());
      return 1;
    }
    const SsvLoadStats s = observer->Take();
    int64_t equal = 0, total = 0, identical = 0, drafts = 0, accepted = 0;
    for (size_t i = 0; i < got->size(); ++i) {
      const std::vector<int32_t> a = (*got)[i].ids(), b = (*want)[i].ids();
      size_t j = 0;
      while (j < a.size() && j < b.size() && a[j] == b[j]) ++j;
      equal += static_cast<int64_t>(j);
      total += static_cast<int64_t>(b.size());
      identical += a == b;
      drafts += (*got)[i].usage.num_draft_tokens;
      accepted += (*got)[i].usage.num_accepted_tokens;
    }
    const double q = std::max<double>(1, s.queries);
    std::printf(
        "| %s | %s | %.5f | %+.5f | %.1f%% | %lld/%zu | %.3f | %.1f | %.1f | %.0f | %.3f | %.3f "
        "|\n",
        SsvStrategyName(st).c_str(), st.lossy() ? "yes" : "no", nll / count,
        (nll - base_nll) / count, 100.0 * equal / std::max<int64_t>(1, total), (long long)identical,
        got->size(), drafts ? double(accepted) / drafts : 0.0, s.per_query_keys / q,
        s.grouped_keys / q, s.grouped_keys / q * head_dim * 2 * 2,
        double(s.grouped_keys) / std::max<int64_t>(1, s.per_query_keys),
        s.overlap_pairs ? s.overlap_sum / s.overlap_pairs : 0.0);
  }
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  // The planner: the strategies' speed on the device, ranked, into a cost profile.
  if (argc >= 2 && std::string_view(argv[1]) == "--tune") {
    return specd::profile::RunProfileTool("ssv_bench --tune", argc - 1, argv + 1,
                                          /*tune_ssv=*/true);
  }
  return specd::Main(argc, argv);
}
