// Internal: reads an HF post_processor (TemplateProcessing, ByteLevel, RobertaProcessing,
// BertProcessing, Sequence) into the ids it puts before and after a single sequence —
// all that add_special needs. Called at load; any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer/json_util.h"

namespace specd::tok {

absl::Status ParsePostProcessor(const Json& json, std::vector<int32_t>* prefix,
                                std::vector<int32_t>* suffix);

}  // namespace specd::tok
