// Wire <-> engine conversions of the gRPC API (proto/specd.proto): a specd.v1
// GenerateRequest becomes one validated, tokenized engine GenerateRequest per choice, and
// engine RequestOutputs become GenerateResponse messages. Pure functions over immutable
// inputs (no grpcpp here, so they are unit-tested without a server); any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "proto/specd.pb.h"

namespace specd {

class Tokenizer;

// What the conversions need to know of the served model.
struct ServedModel {
  const Tokenizer* tokenizer = nullptr;  // null: token ids only
  std::string served_model_name;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;  // the model's (config.json); 0: unknown
  std::string architecture;
  std::vector<int32_t> eos_ids;
  std::optional<int32_t> bos_id;
};

// Most choices one Generate call may ask for.
inline constexpr int32_t kMaxChoices = 16;
// Longest draft SpeculationOptions may ask for: kMaxSpeculativeTokens (engine/speculation, via
// engine.h).

// Checks and tokenizes `request`: one engine request per choice (n of them), each with
// `request_id` and `deadline`. InvalidArgument naming the field for bad values (speculation
// options included: unknown or not-yet-available methods, K outside [0, 64]), NotFound for
// another model's name, Unimplemented for options the engine lacks. Sampling ranges and
// whether the server can run the speculation method are checked again by Engine::Submit.
absl::StatusOr<std::vector<GenerateRequest>> ToEngineRequests(const v1::GenerateRequest& request,
                                                              const ServedModel& model,
                                                              const std::string& request_id,
                                                              absl::Time deadline);

// Appends one engine update of choice `index` to `response` (new tokens, text and, when
// `with_logprobs`, their logprobs); when the update finished the choice successfully, also
// sets finish_reason, usage and speculation_stats. Several updates may be merged into one
// response this way.
void AppendOutput(const RequestOutput& output, const Tokenizer* tokenizer, bool with_logprobs,
                  v1::GenerateResponse* response);

v1::FinishReason ToProto(FinishReason reason);

// config.json's architectures[0] and vocab_size, for GetModelInfo. Missing fields stay
// empty / 0; an unreadable file is an error.
absl::Status ReadModelFileInfo(const std::string& model_dir, ServedModel* model);

}  // namespace specd
