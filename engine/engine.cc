#include "engine/engine.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/stop_checker.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace specd {

const char* FinishReasonName(FinishReason r) {
  return r == FinishReason::kStop ? "stop" : "length";
}

std::vector<int32_t> GenerateResult::ids() const {
  std::vector<int32_t> out;
  out.reserve(tokens.size());
  for (const auto& t : tokens) out.push_back(t.id);
  return out;
}

// Per-request state while it runs.
struct Engine::Sequence {
  const GenerateRequest* request;
  BlockTable blocks;
  Sampler sampler;
  TokenHistory history;
  std::optional<IncrementalDetokenizer> detok;
  StopChecker stop;
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t num_computed = 0;     // positions whose KV is in the cache
  GenerateResult result;
  bool finished = false;
};

namespace {

uint64_t SeedFor(const SamplingParams& p) {
  if (p.seed) return *p.seed;
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  std::unique_ptr<Engine> engine(new Engine());
  LoadOptions load;
  load.num_threads = options.num_threads;
  SPECD_ASSIGN_OR_RETURN(engine->model_, Model::Load(options.model_dir, load));
  const ModelConfig& config = engine->model_->config();
  if (std::filesystem::exists(std::filesystem::path(options.model_dir) / "tokenizer.json")) {
    SPECD_ASSIGN_OR_RETURN(engine->tokenizer_, Tokenizer::FromDir(options.model_dir));
  }
  engine->max_model_len_ = config.max_position_embeddings;
  if (options.max_model_len > 0) {
    if (options.max_model_len > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_model_len ", options.max_model_len, " exceeds the model's max_position_embeddings ",
          config.max_position_embeddings));
    }
    engine->max_model_len_ = options.max_model_len;
  }
  engine->eos_ids_ = config.generation.eos_token_ids;
  if (engine->tokenizer_) {
    for (int32_t id : engine->tokenizer_->eos_ids()) {
      if (std::find(engine->eos_ids_.begin(), engine->eos_ids_.end(), id) ==
          engine->eos_ids_.end()) {
        engine->eos_ids_.push_back(id);
      }
    }
  }
  engine->block_size_ = options.block_size;
  KvCacheSpec probe = engine->model_->MakeKvCacheSpec(1, options.block_size);
  const int64_t block_bytes = probe.total_bytes();
  const int32_t num_blocks = static_cast<int32_t>(
      std::max<int64_t>(BlockTable::BlocksFor(engine->max_model_len_, options.block_size),
                        options.kv_cache_bytes / block_bytes));
  SPECD_ASSIGN_OR_RETURN(engine->kv_, CpuKvCache::Create(engine->model_->MakeKvCacheSpec(
                                          num_blocks, options.block_size)));
  engine->allocator_ = std::make_unique<BlockAllocator>(num_blocks);
  SPECD_LOG_INFO("engine: model {} loaded, {} KV blocks of {} tokens, max_model_len {}",
                 options.model_dir, num_blocks, options.block_size, engine->max_model_len_);
  return engine;
}

Engine::~Engine() = default;

const ModelConfig& Engine::model_config() const { return model_->config(); }

std::optional<int32_t> Engine::model_bos_id() const {
  return model_->config().generation.bos_token_id;
}

absl::Status Engine::Validate(const GenerateRequest& request) const {
  const int32_t vocab = model_->config().vocab_size;
  SPECD_RETURN_IF_ERROR(request.params.Validate(vocab));
  if (request.prompt_ids.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (int32_t id : request.prompt_ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(request.prompt_ids.size()) >= max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", request.prompt_ids.size(),
                                                   " tokens; the context limit is ",
                                                   max_model_len_));
  }
  if (!request.params.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError("stop strings need a tokenizer; this model has none");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Engine::Sequence>> Engine::Admit(
    std::span<const GenerateRequest> requests) {
  std::vector<Sequence> seqs;
  seqs.reserve(requests.size());
  for (const GenerateRequest& r : requests) SPECD_RETURN_IF_ERROR(Validate(r));
  for (const GenerateRequest& r : requests) {
    Sequence s{&r,
               BlockTable(block_size_),
               Sampler(r.params, SeedFor(r.params)),
               {},
               {},
               StopChecker(r.params.stop),
               r.prompt_ids,
               0,
               {},
               false};
    s.history.AddPrompt(r.prompt_ids);
    s.result.prompt_ids = r.prompt_ids;
    if (tokenizer_) s.detok.emplace(*tokenizer_, r.prompt_ids, /*skip_special=*/true);
    const int32_t needed =
        std::min<int64_t>(max_model_len_, int64_t{r.params.max_tokens} + r.prompt_ids.size());
    if (absl::Status st = s.blocks.EnsureCapacity(needed, *allocator_); !st.ok()) {
      seqs.push_back(std::move(s));
      Release(seqs);
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache too small for this batch: ", st.message()));
    }
    seqs.push_back(std::move(s));
  }
  return seqs;
}

void Engine::Release(std::vector<Sequence>& seqs) {
  for (Sequence& s : seqs) s.blocks.Release(*allocator_).IgnoreError();
}

// Runs every unfinished sequence's uncomputed tokens through the model; one logits row
// per unfinished sequence, in order.
absl::Status Engine::Step(std::vector<Sequence>& seqs, std::vector<float>* logits) {
  std::vector<SequenceInput> batch;
  for (Sequence& s : seqs) {
    if (s.finished) continue;
    SequenceInput in;
    in.tokens = std::span<const int32_t>(s.tokens).subspan(s.num_computed);
    in.start_pos = s.num_computed;
    in.block_table = s.blocks.ids();
    batch.push_back(in);
  }
  logits->clear();
  SPECD_RETURN_IF_ERROR(model_->Forward(batch, *kv_, logits));
  for (Sequence& s : seqs) {
    if (!s.finished) s.num_computed = static_cast<int32_t>(s.tokens.size());
  }
  return absl::OkStatus();
}

namespace {

bool Contains(const std::vector<int32_t>& v, int32_t id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

}  // namespace

void Engine::SampleNext(Sequence& s, size_t index, std::span<float> logits,
                        const TokenCallback& on_token) {
  const SamplingParams& p = s.request->params;
  const int32_t num_generated = static_cast<int32_t>(s.result.tokens.size());
  std::vector<int32_t> banned;
  if (num_generated < p.min_tokens) {
    banned = p.stop_token_ids;
    if (!p.ignore_eos) banned.insert(banned.end(), eos_ids_.begin(), eos_ids_.end());
  }
  SampleResult r = s.sampler.Sample(logits, s.history, banned);
  s.tokens.push_back(r.id);
  s.history.AddOutput(r.id);
  s.result.tokens.push_back({r.id, r.logprob, std::move(r.top)});

  bool stop = (!p.ignore_eos && Contains(eos_ids_, r.id)) || Contains(p.stop_token_ids, r.id);
  if (s.detok) stop |= s.stop.Append(s.detok->Push(r.id));
  const bool length =
      num_generated + 1 >= p.max_tokens || static_cast<int32_t>(s.tokens.size()) >= max_model_len_;
  s.finished = stop || length;
  if (s.finished && s.detok && !s.stop.stopped()) stop |= s.stop.Append(s.detok->Flush());
  const std::string text = s.stop.TakeStreamable(s.finished);
  if (on_token) on_token(index, s.result.tokens.back(), text);
  if (s.finished) {
    s.result.text = s.stop.text();
    s.result.finish_reason = stop ? FinishReason::kStop : FinishReason::kLength;
  }
}

absl::StatusOr<std::vector<GenerateResult>> Engine::GenerateBatch(
    std::span<const GenerateRequest> requests, const TokenCallback& on_token) {
  SPECD_ASSIGN_OR_RETURN(std::vector<Sequence> seqs, Admit(requests));
  const int32_t vocab = model_->config().vocab_size;
  std::vector<float> logits;
  absl::Status status;
  for (bool running = true; running && status.ok();) {
    status = Step(seqs, &logits);
    if (!status.ok()) break;
    running = false;
    size_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].finished) continue;
      SampleNext(seqs[i], i, std::span<float>(logits).subspan(row++ * vocab, vocab), on_token);
      running |= !seqs[i].finished;
    }
  }
  Release(seqs);
  SPECD_RETURN_IF_ERROR(status);
  std::vector<GenerateResult> results;
  results.reserve(seqs.size());
  for (Sequence& s : seqs) results.push_back(std::move(s.result));
  return results;
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                                const TokenCallback& on_token) {
  SPECD_ASSIGN_OR_RETURN(std::vector<GenerateResult> results,
                         GenerateBatch(std::span<const GenerateRequest>(&request, 1), on_token));
  return std::move(results.front());
}

}  // namespace specd
