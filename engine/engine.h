// The engine facade: loads a model directory (weights, tokenizer, chat template) and
// generates tokens for a batch of requests on the CPU backend. This is the only header
// server/ includes. Not thread-safe: one caller (the engine thread) at a time.
//
// This first engine runs a static batch (all requests prefill together, then decode in
// lockstep until each finishes); the continuous-batching scheduler of engine/sched
// replaces the loop without changing these types.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"

namespace specd {

class Model;
class Tokenizer;
class CpuKvCache;
class BlockAllocator;
struct ModelConfig;

struct EngineOptions {
  std::string model_dir;
  int32_t num_threads = 0;              // 0: one per core
  int32_t max_model_len = 0;            // 0: the model's max_position_embeddings
  int32_t block_size = 16;              // KV block size in tokens
  int64_t kv_cache_bytes = 64ll << 20;  // at least one max_model_len sequence fits
};

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;  // [num_prompt_tokens], BOS included if wanted
  SamplingParams params;
};

enum class FinishReason { kStop, kLength };
const char* FinishReasonName(FinishReason r);

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;           // when params.logprobs >= 0
  std::vector<TokenLogprob> top;  // [params.logprobs]
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<GeneratedToken> tokens;  // generated, EOS included when it ended the request
  std::string text;                    // detokenized output, stop string removed
  FinishReason finish_reason = FinishReason::kLength;

  std::vector<int32_t> ids() const;
};

// Called for each generated token with the request's index in the batch and the text that
// became safe to stream (may be empty).
using TokenCallback = std::function<void(size_t index, const GeneratedToken&, std::string_view)>;

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  // Null when the model directory has no tokenizer.json (token ids only).
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const ModelConfig& model_config() const;
  int32_t max_model_len() const { return max_model_len_; }
  // EOS ids of the model: generation_config.json's merged with the tokenizer's.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // BOS id from config.json / generation_config.json, for prompts given as nothing.
  std::optional<int32_t> model_bos_id() const;

  // Checks a request before any work is done: InvalidArgument for bad params or prompts.
  absl::Status Validate(const GenerateRequest& request) const;

  absl::StatusOr<std::vector<GenerateResult>> GenerateBatch(
      std::span<const GenerateRequest> requests, const TokenCallback& on_token = {});
  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                          const TokenCallback& on_token = {});

 private:
  Engine() = default;
  struct Sequence;
  absl::StatusOr<std::vector<Sequence>> Admit(std::span<const GenerateRequest> requests);
  absl::Status Step(std::vector<Sequence>& seqs, std::vector<float>* logits);
  void SampleNext(Sequence& s, size_t index, std::span<float> logits,
                  const TokenCallback& on_token);
  void Release(std::vector<Sequence>& seqs);

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<CpuKvCache> kv_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::vector<int32_t> eos_ids_;
  int32_t max_model_len_ = 0;
  int32_t block_size_ = 16;
};

}  // namespace specd
