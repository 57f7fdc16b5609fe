#include "tools/profile/profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/status.h"
#include "engine/model/model_config.h"
#include "engine/parallel/tp_group.h"
#include "engine/runner/eagle3_compute.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "kernels/ref/vegas.h"

namespace specd::profile {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

absl::Status CheckAxis(std::vector<int32_t>& axis, const char* flag) {
  std::sort(axis.begin(), axis.end());
  axis.erase(std::unique(axis.begin(), axis.end()), axis.end());
  if (axis.empty() || axis.front() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " needs one or more values >= 1"));
  }
  return absl::OkStatus();
}

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

// Blocks one point needs: the shared prefix's full blocks, then per sequence the blocks from the
// prefix's end to its context plus the longest verified chunk. distinct: no shared prefix (each
// sequence's whole context is its own).
struct BlockPlan {
  int32_t prefix_blocks = 0;
  int32_t tail_blocks = 0;  // per sequence
  int32_t Total(int32_t batch) const { return prefix_blocks + batch * tail_blocks; }
};
BlockPlan PlanBlocks(int32_t context, int32_t max_tokens, int32_t block_size, bool distinct) {
  BlockPlan plan;
  plan.prefix_blocks = distinct ? 0 : context / block_size;
  plan.tail_blocks = CeilDiv(context - plan.prefix_blocks * block_size + max_tokens, block_size);
  return plan;
}

// One runner's synthetic batch: `batch` greedy sequences of `context` tokens that share a
// prefilled prefix of whole blocks and each own the blocks after it.
class Probe {
 public:
  Probe(ModelRunner* runner, int32_t max_step_tokens, int32_t max_tokens, bool distinct,
        uint64_t seed)
      : runner_(runner),
        max_step_tokens_(max_step_tokens),
        max_tokens_(max_tokens),
        distinct_(distinct),
        rng_(seed) {}

  absl::Status CheckCapacity(int32_t max_batch, int32_t max_context) const {
    const int32_t need =
        PlanBlocks(max_context, max_tokens_, runner_->block_size(), distinct_).Total(max_batch);
    if (need > runner_->num_kv_blocks()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          runner_->device_name(), ": the largest point (batch ", max_batch, ", context ",
          max_context, ") needs ", need, " KV blocks, the pool has ", runner_->num_kv_blocks()));
    }
    return absl::OkStatus();
  }

  // Prefills the shared prefix (random ids) of `context` tokens' whole blocks.
  absl::Status SetContext(int32_t context) {
    context_ = context;
    plan_ = PlanBlocks(context, max_tokens_, runner_->block_size(), distinct_);
    prefix_table_.resize(plan_.prefix_blocks);
    for (int32_t i = 0; i < plan_.prefix_blocks; ++i) prefix_table_[i] = i;
    prefix_ids_ = RandomIds(plan_.prefix_blocks * runner_->block_size());
    std::vector<SequenceInput> chunks;
    for (int32_t start = 0; start < static_cast<int32_t>(prefix_ids_.size());
         start += max_step_tokens_) {
      const int32_t n = std::min<int32_t>(max_step_tokens_, prefix_ids_.size() - start);
      chunks.push_back(
          {std::span<const int32_t>(prefix_ids_).subspan(start, n), start, prefix_table_, false});
    }
    seqs_.clear();
    return Prefill(chunks);
  }

  // `batch` sequences on the prefix, each with its own tail prefilled up to the context.
  absl::Status SetBatch(int32_t batch) {
    const int32_t prefix_len = plan_.prefix_blocks * runner_->block_size();
    seqs_.clear();
    std::vector<SequenceInput> chunks;
    for (int32_t i = 0; i < batch; ++i) {
      auto s = std::make_unique<Seq>(rng_());
      s->table = prefix_table_;
      const int32_t first = plan_.prefix_blocks + i * plan_.tail_blocks;
      for (int32_t j = 0; j < plan_.tail_blocks; ++j) s->table.push_back(first + j);
      s->tail = RandomIds(context_ - prefix_len);
      // In pieces of at most a step (a distinct context is all tail).
      for (int32_t start = 0; start < static_cast<int32_t>(s->tail.size());
           start += max_step_tokens_) {
        const int32_t n = std::min<int32_t>(max_step_tokens_, s->tail.size() - start);
        chunks.push_back({std::span<const int32_t>(s->tail).subspan(start, n), prefix_len + start,
                          s->table, false, i});
      }
      seqs_.push_back(std::move(s));
    }
    return Prefill(chunks);
  }

  // One plain decode step: every sequence's next token at position `context`.
  absl::StatusOr<double> DecodeMs() { return Call(1, /*verify=*/false); }

  // Vegas' verification: `tokens` per sequence whose pass also selects, for the next round, the
  // budget's share of the context per layer: into sequence i's selection slot i on a runner that
  // keeps them on its device (ModelRunner::num_sparse_slots), else as scores to the host.
  absl::StatusOr<double> VegasVerifyMs(int32_t tokens, const SelectBudget& budget) {
    const bool slots = UsesSlots();
    attention_.assign(seqs_.size(), ChunkAttention{});
    scores_.resize(seqs_.size());
    for (size_t i = 0; i < seqs_.size(); ++i) {
      if (slots) {
        attention_[i].select_slot = static_cast<int32_t>(i);
        attention_[i].select_budget = budget;
      } else {
        scores_[i].resize(static_cast<size_t>(runner_->config().num_layers) * 2 * context_);
        attention_[i].scores = scores_[i];
      }
    }
    return Call(tokens, /*verify=*/true, nullptr, &attention_);
  }
  // One sparse draft step: every sequence's next token at position `context`, attending the
  // budget's count of the context per layer (Vegas: sequence i's slot, as VegasVerifyMs left it,
  // or the first that many positions as a host list; streaming: 4 sinks and the most recent
  // positions, as a host list) and itself.
  absl::StatusOr<double> SparseDraftMs(bool streaming, const SelectBudget& budget) {
    const int64_t kept = kernels::ref::VegasKeepCount(
        context_,
        {budget.ratio, budget.min_tokens,
         budget.max_tokens > 0 ? int64_t{budget.max_tokens} : std::numeric_limits<int64_t>::max()});
    const bool slots = !streaming && UsesSlots();
    const int32_t layers = runner_->config().num_layers;
    const auto sinks = static_cast<int32_t>(std::min<int64_t>(4, kept));
    list_.resize(static_cast<size_t>(streaming ? sinks : kept));
    std::iota(list_.begin(), list_.end(), 0);
    lists_.assign(static_cast<size_t>(layers), list_);
    attention_.assign(seqs_.size(), ChunkAttention{});
    for (size_t i = 0; i < seqs_.size(); ++i) {
      ChunkAttention& a = attention_[i];
      if (slots) {
        a.slot = static_cast<int32_t>(i);
        a.slot_count = static_cast<int32_t>(kept);
        a.recent_start = context_;
      } else {
        a.layer_indices = lists_;
        a.recent_start = streaming ? context_ - static_cast<int32_t>(kept - sinks) : context_;
      }
    }
    return Call(1, /*verify=*/false, nullptr, &attention_);
  }
  bool UsesSlots() const {
    return runner_->num_sparse_slots() >= static_cast<int32_t>(seqs_.size());
  }
  // One greedy verification step of `tokens` per sequence (tokens - 1 drafts), its chunks under
  // `ssv` (null: the model's own attention).
  absl::StatusOr<double> VerifyMs(int32_t tokens, const SsvStrategy* ssv = nullptr) {
    return Call(tokens, /*verify=*/true, ssv);
  }

  // The runner's EAGLE-3 head (RunnerOptions::eagle3_head), after SetBatch: a plain step whose
  // captured hidden states are fused into the head's scratch pool rows (one per sequence), then
  // each sequence's positions before the context through the head, so that its cache holds the
  // context as a drafting head's does (a paged cache would read stale slots anyway; the CPU's
  // holds only what ran).
  absl::Status PrepareHead();
  // One head draft step: a row per sequence at position `context`, argmax drawn, its hidden
  // input the previous step's prenorm output (the first call: the fused rows).
  absl::StatusOr<double> HeadStepMs();

 private:
  struct Seq {
    explicit Seq(uint64_t seed) : seed(seed), sampler(Greedy(), seed) {}
    static SamplingParams Greedy() {
      SamplingParams p;
      p.temperature = 0.0f;
      return p;
    }
    SamplingParams params = Greedy();
    uint64_t seed;
    Sampler sampler;
    TokenHistory history;
    std::vector<int32_t> table;  // the shared prefix's blocks, then its own
    std::vector<int32_t> tail;   // ids of [prefix end, context)
    std::vector<int32_t> chunk;  // this call's ids: a last token, then drafts
  };

  std::vector<int32_t> RandomIds(int32_t n) {  // never 0 (nothing is timed on zeros)
    std::uniform_int_distribution<int32_t> id(1, runner_->config().vocab_size - 1);
    std::vector<int32_t> ids(n);
    for (int32_t& t : ids) t = id(rng_);
    return ids;
  }

  // Runs `chunks` in steps of at most max_step_tokens_ tokens, drawing nothing.
  absl::Status Prefill(std::span<const SequenceInput> chunks) {
    size_t first = 0;
    while (first < chunks.size()) {
      size_t end = first;
      int64_t tokens = 0;
      while (end < chunks.size() &&
             tokens + chunks[end].tokens.size() <= static_cast<size_t>(max_step_tokens_)) {
        tokens += static_cast<int64_t>(chunks[end++].tokens.size());
      }
      if (end == first) ++end;  // a chunk longer than a step (never planned): run it alone
      out_.clear();
      SPECD_RETURN_IF_ERROR(runner_->Step(chunks.subspan(first, end - first), {}, &out_));
      first = end;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> Call(int32_t tokens, bool verify, const SsvStrategy* ssv = nullptr,
                              const std::vector<ChunkAttention>* attention = nullptr) {
    batch_.clear();
    rows_.clear();
    drafts_.clear();
    for (size_t i = 0; i < seqs_.size(); ++i) {
      Seq& s = *seqs_[i];
      s.chunk = RandomIds(tokens);
      batch_.push_back({s.chunk, context_, s.table, false, static_cast<int64_t>(i)});
      batch_.back().ssv = ssv;
      if (attention != nullptr) batch_.back().attention = &(*attention)[i];
      SampleRow row;
      row.chunk = static_cast<int32_t>(i);
      row.sampler = &s.sampler;
      row.params = &s.params;
      row.history = &s.history;
      row.seed = s.seed;
      rows_.push_back(row);
      drafts_.push_back(std::span<const int32_t>(s.chunk).subspan(1));
    }
    const Clock::time_point start = Clock::now();
    if (verify) {
      SPECD_RETURN_IF_ERROR(runner_->StepGreedyVerify(batch_, rows_, drafts_, &verified_));
    } else {
      out_.clear();
      SPECD_RETURN_IF_ERROR(runner_->Step(batch_, rows_, &out_));
    }
    return 1e3 * SecondsSince(start);
  }

  ModelRunner* runner_;
  int32_t max_step_tokens_;
  int32_t max_tokens_;  // longest verified chunk of the grid (tail blocks cover it)
  bool distinct_;       // no shared prefix: each sequence's context is its own
  std::mt19937_64 rng_;
  int32_t context_ = 0;
  BlockPlan plan_;
  std::vector<int32_t> prefix_table_;  // [prefix_blocks] block ids 0..prefix_blocks-1
  std::vector<int32_t> prefix_ids_;    // [prefix_blocks * block_size]
  std::vector<std::unique_ptr<Seq>> seqs_;
  std::vector<SequenceInput> batch_;
  std::vector<SampleRow> rows_;
  std::vector<std::span<const int32_t>> drafts_;
  std::vector<SampleResult> out_;
  std::vector<GreedyVerifyResult> verified_;
  std::vector<ChunkAttention> attention_;        // Vegas calls' per-sequence options
  std::vector<std::vector<float>> scores_;       // host scores (runners without slots)
  std::vector<int32_t> list_;                    // a sparse step's list (every layer's)
  std::vector<std::span<const int32_t>> lists_;  // [num_layers] views of list_
  std::vector<Eagle3Compute::Row> head_rows_;
  std::vector<int32_t> head_ids_;
  std::vector<float> head_logits_;
  bool head_primed_ = false;  // the last head pass drew a row per sequence (HeadStepMs)
};

absl::Status Probe::PrepareHead() {
  Eagle3Compute* head = runner_->eagle3();
  if (head == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(runner_->device_name(), " did not load the EAGLE-3 head"));
  }
  const auto batch = static_cast<int32_t>(seqs_.size());
  for (int32_t i = 0; i < batch; ++i) head->Release(i);  // a previous batch's caches
  SPECD_RETURN_IF_ERROR(DecodeMs().status());            // captures one hidden state per sequence
  std::vector<int32_t> captured(batch), pool(batch);
  for (int32_t i = 0; i < batch; ++i) {
    captured[i] = i;
    pool[i] = head->scratch_row(i);
  }
  SPECD_RETURN_IF_ERROR(head->Fuse(captured, pool));
  head_primed_ = false;
  head_rows_.clear();
  for (int32_t i = 0; i < batch; ++i) {
    const std::vector<int32_t> ids = RandomIds(context_);
    for (int32_t p = 0; p < context_; ++p) {
      head_rows_.push_back({.seq = i,
                            .token = ids[p],
                            .position = p,
                            .hidden = pool[i],
                            .logits = false,
                            .block_table = seqs_[i]->table});
      if (static_cast<int32_t>(head_rows_.size()) == max_step_tokens_) {
        SPECD_RETURN_IF_ERROR(head->Forward(head_rows_, {}, &head_ids_, &head_logits_));
        head_rows_.clear();
      }
    }
  }
  if (head_rows_.empty()) return absl::OkStatus();
  return head->Forward(head_rows_, {}, &head_ids_, &head_logits_);
}

absl::StatusOr<double> Probe::HeadStepMs() {
  Eagle3Compute* head = runner_->eagle3();
  const auto batch = static_cast<int32_t>(seqs_.size());
  head_rows_.clear();
  const std::vector<int32_t> ids = RandomIds(batch);
  for (int32_t i = 0; i < batch; ++i) {
    head->Truncate(i, context_);  // the step writes position `context` again
    head_rows_.push_back({.seq = i,
                          .token = ids[i],
                          .position = context_,
                          .hidden = head_primed_ ? -i - 1 : head->scratch_row(i),
                          .logits = true,
                          .block_table = seqs_[i]->table});
  }
  const std::vector<uint8_t> on_device(batch, 0);  // greedy: only the argmax comes back
  const Clock::time_point start = Clock::now();
  SPECD_RETURN_IF_ERROR(head->Forward(head_rows_, on_device, &head_ids_, &head_logits_));
  const double ms = 1e3 * SecondsSince(start);
  head_primed_ = true;
  return ms;
}

// Warm-up and timed calls per measurement within the budget: the mean call so far times the
// measurements left says how many calls each may still have.
class Budget {
 public:
  Budget(const ProfileOptions& o, int32_t num_measurements)
      : seconds_(o.budget_seconds),
        warmup_(o.warmup),
        repeats_(o.repeats),
        min_repeats_(o.repeats),
        left_(num_measurements),
        start_(Clock::now()) {}

  // Median milliseconds of `call`, after its warm-up.
  template <typename Call>
  absl::StatusOr<double> Measure(Call call) {
    if (elapsed() > seconds_) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "budget of %.1f s spent after %d measurements (%d left): measure a smaller grid or "
          "raise --budget-seconds",
          seconds_, done_, left_));
    }
    auto [warmup, repeats] = Plan();
    const Clock::time_point start = Clock::now();
    for (int32_t i = 0; i < warmup; ++i) SPECD_RETURN_IF_ERROR(call().status());
    std::vector<double> ms;
    for (int32_t i = 0; i < repeats; ++i) {
      SPECD_ASSIGN_OR_RETURN(double t, call());
      ms.push_back(t);
    }
    call_seconds_ += SecondsSince(start);
    num_calls_ += warmup + repeats;
    --left_;
    ++done_;
    return Median(std::move(ms));
  }

  double elapsed() const { return SecondsSince(start_); }
  int32_t min_repeats() const { return min_repeats_; }
  bool lowered() const { return min_repeats_ < repeats_; }

 private:
  std::pair<int32_t, int32_t> Plan() {
    if (num_calls_ == 0 || left_ == 0) return {warmup_, repeats_};
    const double per_call = call_seconds_ / num_calls_;
    // Two thirds of what is left: later points (larger batches and contexts) cost more.
    const double calls =
        (seconds_ - elapsed()) * (2.0 / 3.0) / (per_call * static_cast<double>(left_));
    const int32_t warmup = calls >= warmup_ + 1 ? warmup_ : std::min(warmup_, 1);
    const int32_t repeats = std::clamp(static_cast<int32_t>(calls) - warmup, 1, repeats_);
    min_repeats_ = std::min(min_repeats_, repeats);
    return {warmup, repeats};
  }

  double seconds_;
  int32_t warmup_, repeats_, min_repeats_;
  int32_t left_, done_ = 0;
  int64_t num_calls_ = 0;
  double call_seconds_ = 0;
  Clock::time_point start_;
};

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRunner(const ProfileOptions& o,
                                                          const std::string& dir, bool draft) {
  SPECD_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  const int32_t max_batch = o.batch_sizes.back(), max_context = o.contexts.back();
  const int32_t max_tokens = o.tokens.back();
  RunnerOptions r;
  r.model_dir = dir;
  r.device = o.device;
  r.load_format = o.load_format;
  r.num_threads = o.num_threads;
  r.max_model_len = max_context + max_tokens;
  r.max_num_seqs = max_batch;
  r.max_num_batched_tokens = std::max(o.max_num_batched_tokens, max_batch * max_tokens);
  // A parallel draft draws K rows per sequence in its pass, as verification does.
  r.max_sample_rows = draft && !o.parallel_draft ? 0 : max_batch * max_tokens;
  r.gpu_memory_utilization = o.gpu_memory_utilization;
  if (!draft) r.eagle3_head = o.eagle3_dir;
  // A pool sized for the largest point (f32 bytes: an upper bound for every runner; the head's
  // layer counted as one more), so that the target leaves the GPU's memory to the draft model.
  const int32_t num_layers = config.num_layers + (r.eagle3_head.empty() ? 0 : 1);
  int64_t token_bytes = int64_t{2} * num_layers * config.kv_size() * 4;
  // An NSA model's compressed-block cache: one more entry of K and V per compressed block, and at
  // least one per page.
  if (config.is_nsa()) {
    const int64_t every = std::min(config.nsa.block_size, r.block_size);
    token_bytes += (token_bytes + every - 1) / every;
  }
  r.kv_cache_bytes =
      int64_t{
          PlanBlocks(max_context, max_tokens, r.block_size, o.distinct_contexts).Total(max_batch) +
          2} *
      r.block_size * token_bytes;
  if (!draft && o.tensor_parallel_size > 1) {
    TpGroupOptions g;
    g.world_size = o.tensor_parallel_size;
    g.worker_binary = o.specd;
    return CreateTpGroup(r, g);
  }
  return CreateModelRunner(r);
}

std::string Folder(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

std::string FormatLine(int32_t batch, int32_t context, double plain,
                       const std::vector<int32_t>& tokens, const std::vector<double>& verify,
                       const std::string& drafters) {
  std::string line = absl::StrFormat("b=%d ctx=%d: plain %.3f ms, verify", batch, context, plain);
  for (size_t t = 0; t < tokens.size(); ++t) {
    absl::StrAppendFormat(&line, " t=%d %.3f", tokens[t], verify[t]);
  }
  return line + drafters;
}

// The drafters' K axis: 1 and the drafts of every verified length (tokens - 1 > 1).
std::vector<int32_t> DraftKs(const std::vector<int32_t>& tokens) {
  std::vector<int32_t> ks = {1};
  for (int32_t t : tokens) {
    if (t - 1 > 1) ks.push_back(t - 1);
  }
  return ks;
}

}  // namespace

absl::Status ProfileOptions::Validate() {
  if (model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  SPECD_RETURN_IF_ERROR(CheckAxis(batch_sizes, "--batch"));
  SPECD_RETURN_IF_ERROR(CheckAxis(contexts, "--context"));
  SPECD_RETURN_IF_ERROR(CheckAxis(tokens, "--tokens"));
  if (warmup < 0 || repeats < 1) {
    return absl::InvalidArgumentError("--warmup must be >= 0 and --repeats >= 1");
  }
  if (!(budget_seconds > 0)) return absl::InvalidArgumentError("--budget-seconds must be > 0");
  if (tensor_parallel_size < 1 || (tensor_parallel_size > 1 && specd.empty())) {
    return absl::InvalidArgumentError("-tp N > 1 needs --specd PATH (the workers' binary)");
  }
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("--max-num-batched-tokens must be >= 1");
  }
  if (parallel_draft && draft_dir.empty()) {
    return absl::InvalidArgumentError("--parallel needs --draft DIR (the parallel draft)");
  }
  if (sparse_drafting &&
      (!(sparsity_ratio > 0 && sparsity_ratio <= 1) || sparse_min_tokens < 0 ||
       sparse_max_tokens < 0 || (sparse_max_tokens > 0 && sparse_max_tokens < sparse_min_tokens))) {
    return absl::InvalidArgumentError(
        "--sparsity-ratio in (0, 1], --sparse-min-tokens >= 0, --sparse-max-tokens 0 or >= the "
        "minimum");
  }
  if (!(ssv_alpha > 0 && ssv_alpha < 1)) {
    return absl::InvalidArgumentError("--alpha must be in (0, 1)");
  }
  return absl::OkStatus();
}

std::string DescribeModels(const ProfileOptions& o) {
  const std::string random = o.load_format == "dummy" ? " (random weights)" : "";
  std::string text = Folder(o.model_dir) + random;
  if (!o.draft_dir.empty()) {
    absl::StrAppend(&text, " / ", Folder(o.draft_dir), random,
                    o.parallel_draft ? " (parallel)" : "");
  }
  if (!o.eagle3_dir.empty()) absl::StrAppend(&text, " / EAGLE-3 ", Folder(o.eagle3_dir), random);
  return text;
}

namespace {

// Milliseconds at every grid point, row-major as CostGrid takes them.
struct GridTimes {
  std::vector<double> plain;         // [batch][context]
  std::vector<double> verify;        // [batch][tokens][context]
  std::vector<double> draft;         // [batch][K][context] drafting K tokens (DraftKs); empty: none
  std::vector<double> head;          // [batch][K][context] the EAGLE-3 head's K steps; empty: none
  std::vector<double> vegas_verify;  // [batch][tokens][context] scored verification; empty: none
  std::vector<double> vegas_draft;   // [batch][K][context] K sparse draft steps
  std::vector<double> streaming_draft;   // [batch][K][context]
  std::vector<std::vector<double>> ssv;  // per strategy [batch][tokens][context]
};

// The runners a point is measured on: the target (holding the head, if any) and the draft.
struct Probes {
  Probe* target = nullptr;
  Probe* draft = nullptr;  // null: no draft model
  bool parallel = false;   // the draft drafts in one pass
  bool head = false;       // the target holds an EAGLE-3 head
  bool sparse = false;     // vegas and streaming (ProfileOptions::sparse_drafting)
  std::vector<int32_t> ks;
};

// The server's sparse drafting budget as a chunk's selection takes it.
SelectBudget SparseBudget(const ProfileOptions& o) {
  return {o.sparsity_ratio, o.sparse_min_tokens, o.sparse_max_tokens};
}

// The drafters at batch index b, context index c (the target's batch is set): K drafts' time
// at every K into times, and a progress note.
absl::StatusOr<std::string> MeasureDrafters(const ProfileOptions& o, const Probes& p, size_t b,
                                            size_t c, GridTimes& times, Budget& budget) {
  const size_t nk = p.ks.size(), nc = o.contexts.size();
  auto at = [&](size_t k) { return (b * nk + k) * nc + c; };
  std::string note;
  if (p.sparse) {
    // Vegas: its verification fills the slots its draft steps read (both timed); streaming:
    // sinks and a window as lists.
    const size_t nt = o.tokens.size();
    for (size_t t = 0; t < nt; ++t) {
      SPECD_ASSIGN_OR_RETURN(times.vegas_verify[(b * nt + t) * nc + c], budget.Measure([&] {
        return p.target->VegasVerifyMs(o.tokens[t], SparseBudget(o));
      }));
    }
    SPECD_ASSIGN_OR_RETURN(const double vegas, budget.Measure([&] {
      return p.target->SparseDraftMs(false, SparseBudget(o));
    }));
    SPECD_ASSIGN_OR_RETURN(const double streaming, budget.Measure([&] {
      return p.target->SparseDraftMs(true, SparseBudget(o));
    }));
    for (size_t k = 0; k < nk; ++k) {
      times.vegas_draft[at(k)] = p.ks[k] * vegas;
      times.streaming_draft[at(k)] = p.ks[k] * streaming;
    }
    absl::StrAppendFormat(&note, ", sparse step %.3f ms (streaming %.3f), scored verify t=%d %.3f",
                          vegas, streaming, o.tokens.back(),
                          times.vegas_verify[(b * nt + nt - 1) * nc + c]);
  }
  if (p.head) {
    SPECD_RETURN_IF_ERROR(p.target->PrepareHead());
    SPECD_ASSIGN_OR_RETURN(const double step,
                           budget.Measure([&] { return p.target->HeadStepMs(); }));
    for (size_t k = 0; k < nk; ++k) times.head[at(k)] = p.ks[k] * step;
    absl::StrAppendFormat(&note, ", head step %.3f ms", step);
  }
  if (p.draft == nullptr) return note;
  SPECD_RETURN_IF_ERROR(p.draft->SetBatch(o.batch_sizes[b]));
  // Drafting K tokens stepwise: K one-token passes (the first also catches up on the committed
  // tokens, one chunk per sequence, which costs about as much while the step is memory-bound).
  if (!p.parallel) {
    SPECD_ASSIGN_OR_RETURN(const double step, budget.Measure([&] { return p.draft->DecodeMs(); }));
    for (size_t k = 0; k < nk; ++k) times.draft[at(k)] = p.ks[k] * step;
    absl::StrAppendFormat(&note, ", draft step %.3f ms", step);
    return note;
  }
  absl::StrAppend(&note, ", parallel draft pass");
  for (size_t k = 0; k < nk; ++k) {
    SPECD_ASSIGN_OR_RETURN(times.draft[at(k)],
                           budget.Measure([&] { return p.draft->VerifyMs(p.ks[k]); }));
    absl::StrAppendFormat(&note, " K=%d %.3f", p.ks[k], times.draft[at(k)]);
  }
  return note;
}

// Every point, context by context (one prefix prefill per context and runner).
absl::StatusOr<GridTimes> MeasureGrid(const ProfileOptions& o, const Probes& p, Budget& budget) {
  const std::vector<int32_t>&batches = o.batch_sizes, &contexts = o.contexts, &tokens = o.tokens;
  const size_t nb = batches.size(), nt = tokens.size(), nc = contexts.size();
  const size_t drafted = nb * p.ks.size() * nc;
  GridTimes times{
      std::vector<double>(nb * nc),
      std::vector<double>(nb * nt * nc),
      std::vector<double>(p.draft ? drafted : 0),
      std::vector<double>(p.head ? drafted : 0),
      std::vector<double>(p.sparse ? nb * nt * nc : 0),
      std::vector<double>(p.sparse ? drafted : 0),
      std::vector<double>(p.sparse ? drafted : 0),
      std::vector<std::vector<double>>(o.ssv.size(), std::vector<double>(nb * nt * nc))};
  for (size_t c = 0; c < nc; ++c) {
    SPECD_RETURN_IF_ERROR(p.target->SetContext(contexts[c]));
    if (p.draft) SPECD_RETURN_IF_ERROR(p.draft->SetContext(contexts[c]));
    for (size_t b = 0; b < nb; ++b) {
      const size_t at = b * nc + c;
      SPECD_RETURN_IF_ERROR(p.target->SetBatch(batches[b]));
      SPECD_ASSIGN_OR_RETURN(times.plain[at], budget.Measure([&] { return p.target->DecodeMs(); }));
      std::vector<double> line(nt);
      for (size_t t = 0; t < nt; ++t) {
        SPECD_ASSIGN_OR_RETURN(line[t],
                               budget.Measure([&] { return p.target->VerifyMs(tokens[t]); }));
        times.verify[(b * nt + t) * nc + c] = line[t];
      }
      std::string ssv_note;
      for (size_t s = 0; s < o.ssv.size(); ++s) {
        absl::StrAppend(&ssv_note, ", ", SsvStrategyName(o.ssv[s]));
        for (size_t t = 0; t < nt; ++t) {
          double& ms = times.ssv[s][(b * nt + t) * nc + c];
          SPECD_ASSIGN_OR_RETURN(
              ms, budget.Measure([&] { return p.target->VerifyMs(tokens[t], &o.ssv[s]); }));
          absl::StrAppendFormat(&ssv_note, " t=%d %.3f", tokens[t], ms);
        }
      }
      SPECD_ASSIGN_OR_RETURN(const std::string drafters,
                             MeasureDrafters(o, p, b, c, times, budget));
      if (o.log) {
        o.log(FormatLine(batches[b], contexts[c], times.plain[at], tokens, line,
                         drafters + ssv_note));
      }
    }
  }
  return times;
}

absl::StatusOr<CostProfile> BuildProfile(const ProfileOptions& o, const Probes& p,
                                         const GridTimes& times) {
  const std::vector<int32_t>&batches = o.batch_sizes, &contexts = o.contexts;
  SPECD_ASSIGN_OR_RETURN(CostGrid plain, CostGrid::Create(batches, {1}, contexts, times.plain));
  CostProfile profile(std::move(plain));
  SPECD_ASSIGN_OR_RETURN(CostGrid verify,
                         CostGrid::Create(batches, o.tokens, contexts, times.verify));
  profile.SetVerify(std::move(verify));
  profile.SetMethod(PolicyMethod::kNgram, MethodCosts{});  // free drafts, dense verification
  if (p.draft) {
    MethodCosts costs;
    SPECD_ASSIGN_OR_RETURN(costs.draft, CostGrid::Create(batches, p.ks, contexts, times.draft));
    costs.parallel = p.parallel;
    profile.SetMethod(PolicyMethod::kDraftModel, std::move(costs));
  }
  if (p.head) {
    MethodCosts costs;
    SPECD_ASSIGN_OR_RETURN(costs.draft, CostGrid::Create(batches, p.ks, contexts, times.head));
    profile.SetMethod(PolicyMethod::kEagle3, std::move(costs));
  }
  if (p.sparse) {
    MethodCosts vegas, streaming;
    SPECD_ASSIGN_OR_RETURN(vegas.draft,
                           CostGrid::Create(batches, p.ks, contexts, times.vegas_draft));
    SPECD_ASSIGN_OR_RETURN(vegas.verify,
                           CostGrid::Create(batches, o.tokens, contexts, times.vegas_verify));
    SPECD_ASSIGN_OR_RETURN(streaming.draft,
                           CostGrid::Create(batches, p.ks, contexts, times.streaming_draft));
    profile.SetMethod(PolicyMethod::kVegas, std::move(vegas));
    profile.SetMethod(PolicyMethod::kStreaming, std::move(streaming));
  }
  for (size_t s = 0; s < o.ssv.size(); ++s) {
    SPECD_ASSIGN_OR_RETURN(CostGrid grid,
                           CostGrid::Create(batches, o.tokens, contexts, times.ssv[s]));
    profile.SetSsv(o.ssv[s], std::move(grid));
  }
  profile.ssv_alpha = o.ssv_alpha;
  return profile;
}

}  // namespace

namespace {

// The target (holding the EAGLE-3 head, when asked for) and the draft model (null: none).
struct Runners {
  std::unique_ptr<ModelRunner> target, draft;
};

absl::StatusOr<Runners> LoadRunners(const ProfileOptions& o) {
  Runners r;
  SPECD_ASSIGN_OR_RETURN(r.target, CreateRunner(o, o.model_dir, false));
  if (!o.eagle3_dir.empty() && r.target->eagle3() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EAGLE-3 head: the runner on ", r.target->device_name(), " did not load ", o.eagle3_dir));
  }
  if (o.sparse_drafting && r.target->config().is_nsa()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vegas: self-speculation drafts with dense attention; ", o.model_dir,
                     " is an NSA model"));
  }
  if (o.sparse_drafting && o.tensor_parallel_size > 1) {
    return absl::InvalidArgumentError("--vegas: self-speculation needs tensor parallelism off");
  }
  if (!o.ssv.empty() && !r.target->config().is_nsa()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ssv: SSV strategies verify NSA models; ", o.model_dir, " is not one"));
  }
  for (const SsvStrategy& s : o.ssv) {
    if (s.lossy() && !r.target->SupportsLossySsv()) {
      return absl::InvalidArgumentError(absl::StrCat("--ssv: ", r.target->device_name(),
                                                     " does not run lossy strategies (",
                                                     SsvStrategyName(s), ")"));
    }
  }
  if (o.draft_dir.empty()) return r;
  absl::StatusOr<std::unique_ptr<ModelRunner>> d = CreateRunner(o, o.draft_dir, true);
  if (!d.ok()) {
    return absl::Status(d.status().code(), absl::StrCat("draft model: ", d.status().message()));
  }
  r.draft = *std::move(d);
  return r;
}

}  // namespace

absl::StatusOr<ProfileReport> MeasureProfile(ProfileOptions o) {
  SPECD_RETURN_IF_ERROR(o.Validate());
  SPECD_ASSIGN_OR_RETURN(Runners runners, LoadRunners(o));
  ModelRunner* target = runners.target.get();
  ModelRunner* draft = runners.draft.get();
  const int32_t max_batch = o.batch_sizes.back(), max_tokens = o.tokens.back();
  const int32_t step_tokens = std::max(o.max_num_batched_tokens, max_batch * max_tokens);
  Probe target_probe(target, step_tokens, max_tokens, o.distinct_contexts, o.seed);
  SPECD_RETURN_IF_ERROR(target_probe.CheckCapacity(max_batch, o.contexts.back()));
  std::unique_ptr<Probe> draft_probe;
  if (draft) {
    draft_probe =
        std::make_unique<Probe>(draft, step_tokens, max_tokens, o.distinct_contexts, o.seed + 1);
    SPECD_RETURN_IF_ERROR(draft_probe->CheckCapacity(max_batch, o.contexts.back()));
  }
  if (o.log) {
    o.log(absl::StrCat("target on ", target->device_name(),
                       o.eagle3_dir.empty() ? "" : " (with its EAGLE-3 head)",
                       draft ? absl::StrCat(", draft on ", draft->device_name()) : "",
                       o.parallel_draft ? " (parallel)" : ""));
  }
  const Probes probes{.target = &target_probe,
                      .draft = draft_probe.get(),
                      .parallel = o.parallel_draft,
                      .head = !o.eagle3_dir.empty(),
                      .sparse = o.sparse_drafting,
                      .ks = DraftKs(o.tokens)};
  const size_t draft_measurements = !draft ? 0 : o.parallel_draft ? probes.ks.size() : 1;
  const size_t points = o.batch_sizes.size() * o.contexts.size();
  const size_t sparse_measurements = o.sparse_drafting ? o.tokens.size() + 2 : 0;
  Budget budget(o, static_cast<int32_t>(points * (1 + o.tokens.size() * (1 + o.ssv.size()) +
                                                  draft_measurements + (probes.head ? 1 : 0) +
                                                  sparse_measurements)));
  SPECD_ASSIGN_OR_RETURN(GridTimes times, MeasureGrid(o, probes, budget));
  SPECD_ASSIGN_OR_RETURN(CostProfile profile, BuildProfile(o, probes, times));
  profile.device = target->device_name();
  if (o.tensor_parallel_size > 1) {
    absl::StrAppend(&profile.device, ", tensor parallel ", o.tensor_parallel_size);
  }
  profile.models = DescribeModels(o);
  if (budget.lowered() && o.log) {
    o.log(absl::StrCat("note: the budget lowered repeats to ", budget.min_repeats(), " (of ",
                       o.repeats, ") for some points"));
  }
  return ProfileReport{std::move(profile), target->device_name(), budget.elapsed(),
                       budget.min_repeats()};
}

}  // namespace specd::profile
