#include "engine/parallel/tp_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specd {

void EncodeTpStep(TpMethod method, std::span<const SequenceInput> batch,
                  std::span<const SampleRow> rows, std::span<const std::span<const int32_t>> drafts,
                  int32_t block_size, uint64_t step_id, TpStep* out) {
  out->Clear();
  out->step_id = step_id;
  out->method = method;
  for (const SequenceInput& in : batch) {
    const int64_t end = int64_t{in.start_pos} + static_cast<int64_t>(in.tokens.size());
    const int64_t blocks =
        std::min<int64_t>((end + block_size - 1) / block_size, in.block_table.size());
    out->seqs.push_back(TpSeq{in.start_pos, static_cast<uint32_t>(in.tokens.size()),
                              static_cast<uint32_t>(blocks), in.all_logits});
    out->tokens.insert(out->tokens.end(), in.tokens.begin(), in.tokens.end());
    out->block_ids.insert(out->block_ids.end(), in.block_table.begin(),
                          in.block_table.begin() + blocks);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint16_t k = i < drafts.size() ? static_cast<uint16_t>(drafts[i].size()) : 0;
    out->rows.push_back(TpRow{rows[i].chunk, rows[i].token, k});
  }
}

namespace {
SamplingParams GreedyParams() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}
}  // namespace

TpCall::TpCall() : greedy_(GreedyParams()), sampler_(greedy_, 0) {}

absl::Status TpCall::Decode(const TpStep& step) {
  method_ = step.method;
  batch_.clear();
  rows_.clear();
  drafts_.clear();
  probs_.clear();
  slots_.clear();
  size_t token = 0, block = 0;
  for (const TpSeq& s : step.seqs) {
    SequenceInput in;
    in.tokens = std::span<const int32_t>(step.tokens).subspan(token, s.num_tokens);
    in.start_pos = s.start_pos;
    in.block_table = std::span<const int32_t>(step.block_ids).subspan(block, s.num_blocks);
    in.all_logits = s.all_logits;
    batch_.push_back(in);
    token += s.num_tokens;
    block += s.num_blocks;
  }
  const bool verify = method_ == TpMethod::kGreedyVerify || method_ == TpMethod::kSampledVerify;
  for (size_t i = 0; i < step.rows.size(); ++i) {
    const TpRow& r = step.rows[i];
    SampleRow row;
    row.chunk = r.chunk;
    row.token = r.token;
    row.sampler = &sampler_;
    row.params = &greedy_;
    row.history = &history_;
    rows_.push_back(row);
    if (r.num_drafts > 0 && !verify) {
      return absl::InvalidArgumentError(
          absl::StrCat("TpStep row ", i, " carries drafts in a call that verifies none"));
    }
    // A verified row's chunk is its last committed token followed by its drafts.
    drafts_.push_back(batch_[r.chunk].tokens.subspan(1, r.num_drafts));
    probs_.push_back(DraftProbs{});
    slots_.push_back(static_cast<int32_t>(i));
  }
  return absl::OkStatus();
}

absl::Status TpCall::Run(ModelRunner& runner) {
  switch (method_) {
    case TpMethod::kStep:
      return runner.Step(batch_, rows_, &sampled_);
    case TpMethod::kGreedyVerify:
      return runner.StepGreedyVerify(batch_, rows_, drafts_, &verified_);
    case TpMethod::kSampledVerify:
      return runner.StepSampledVerify(batch_, rows_, drafts_, probs_, &verified_);
    case TpMethod::kDraft:
      return runner.StepDraft(batch_, rows_, slots_, &sampled_);
    case TpMethod::kForward:
      return runner.Forward(batch_, &logits_);
  }
  return absl::InvalidArgumentError("TpStep: unknown method");
}

}  // namespace specd
