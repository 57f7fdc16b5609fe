#include "engine/parallel/tp_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specd {

uint32_t TpBlockMirror::Update(int64_t seq_id, std::span<const int32_t> table, uint64_t step) {
  Mirror& m = mirrors_[seq_id];
  const size_t n = std::min(m.blocks.size(), table.size());
  const auto kept = static_cast<size_t>(
      std::mismatch(table.begin(), table.begin() + static_cast<ptrdiff_t>(n), m.blocks.begin())
          .first -
      table.begin());
  m.blocks.resize(kept);
  m.blocks.insert(m.blocks.end(), table.begin() + static_cast<ptrdiff_t>(kept), table.end());
  m.last_step = step;
  return static_cast<uint32_t>(kept);
}

void TpBlockMirror::Expire(uint64_t step, std::vector<int64_t>* released) {
  for (auto it = mirrors_.begin(); it != mirrors_.end();) {
    if (step - it->second.last_step >= kIdleSteps) {
      released->push_back(it->first);
      mirrors_.erase(it++);
    } else {
      ++it;
    }
  }
}

void EncodeTpStep(TpMethod method, std::span<const SequenceInput> batch,
                  std::span<const SampleRow> rows, std::span<const std::span<const int32_t>> drafts,
                  int32_t block_size, uint64_t step_id, TpBlockMirror* mirror, TpStep* out) {
  out->Clear();
  out->step_id = step_id;
  out->method = method;
  // Every kIdleSteps steps, mirrors idle that long go (before this step's chunks renew theirs).
  if (mirror != nullptr && step_id % TpBlockMirror::kIdleSteps == 0) {
    mirror->Expire(step_id, &out->released);
  }
  for (size_t c = 0; c < batch.size(); ++c) {
    const SequenceInput& in = batch[c];
    const int64_t end = int64_t{in.start_pos} + static_cast<int64_t>(in.tokens.size());
    const auto blocks = static_cast<size_t>(
        std::min<int64_t>((end + block_size - 1) / block_size, in.block_table.size()));
    const std::span<const int32_t> table = in.block_table.first(blocks);
    // A sequence twice in one batch (never from the engine) carries its tables whole.
    bool mirrored = mirror != nullptr && in.seq_id >= 0;
    for (size_t d = 0; mirrored && d < c; ++d) mirrored = batch[d].seq_id != in.seq_id;
    const uint32_t kept = mirrored ? mirror->Update(in.seq_id, table, step_id) : 0;
    out->seqs.push_back(TpSeq{in.start_pos, static_cast<uint32_t>(in.tokens.size()),
                              static_cast<uint32_t>(blocks), in.all_logits,
                              mirrored ? in.seq_id : -1, kept});
    out->tokens.insert(out->tokens.end(), in.tokens.begin(), in.tokens.end());
    out->block_ids.insert(out->block_ids.end(), table.begin() + kept, table.end());
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint16_t k = i < drafts.size() ? static_cast<uint16_t>(drafts[i].size()) : 0;
    const auto candidates = static_cast<uint8_t>(std::clamp(rows[i].num_candidates, 0, 255));
    out->rows.push_back(
        TpRow{rows[i].chunk, rows[i].token, k, candidates, NeedsFullLogits(rows[i])});
  }
}

void EncodeTpStep(const StepRequest& request, int32_t block_size, uint64_t step_id,
                  TpBlockMirror* mirror, TpStep* out) {
  const bool verify =
      request.kind == StepKind::kGreedyVerify || request.kind == StepKind::kSampledVerify;
  const std::span<const SampleRow> rows =
      request.kind == StepKind::kForward ? std::span<const SampleRow>() : request.rows;
  EncodeTpStep(request.kind, request.batch, rows,
               verify ? request.drafts : std::span<const std::span<const int32_t>>(), block_size,
               step_id, mirror, out);
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
  for (int64_t id : step.released) mirrors_.erase(id);
  size_t token = 0, block = 0;
  for (size_t c = 0; c < step.seqs.size(); ++c) {
    const TpSeq& s = step.seqs[c];
    SequenceInput in;
    in.tokens = std::span<const int32_t>(step.tokens).subspan(token, s.num_tokens);
    in.start_pos = s.start_pos;
    const auto carried = std::span<const int32_t>(step.block_ids)
                             .subspan(block, s.num_blocks - std::min(s.kept_blocks, s.num_blocks));
    if (s.seq_id < 0) {
      in.block_table = carried;
    } else {
      // The table lives in the mirror (a flat_hash_map moves vectors, not their storage, so the
      // span stays valid while later chunks add mirrors; one chunk per id per step).
      for (size_t d = 0; d < c; ++d) {  // a second chunk would move the first one's table
        if (step.seqs[d].seq_id == s.seq_id) {
          return absl::InvalidArgumentError(absl::StrCat(
              "TpStep ", step.step_id, " names sequence ", s.seq_id, " in chunks ", d, " and ", c));
        }
      }
      std::vector<int32_t>& m = mirrors_[s.seq_id];
      if (s.kept_blocks > m.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "TpStep ", step.step_id, " keeps ", s.kept_blocks, " block ids of sequence ", s.seq_id,
            "; this rank's mirror holds ", m.size()));
      }
      m.resize(s.kept_blocks);
      m.insert(m.end(), carried.begin(), carried.end());
      in.block_table = m;
      in.seq_id = s.seq_id;
    }
    in.all_logits = s.all_logits;
    batch_.push_back(in);
    token += s.num_tokens;
    block += carried.size();
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
    row.num_candidates = r.num_candidates;
    row.full_logits = r.full_logits;
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
  StepResult result;
  switch (method_) {
    case StepKind::kStep:
      result.samples = &sampled_;
      return runner.Run(StepRequest::Step(batch_, rows_), &result);
    case StepKind::kGreedyVerify:
      result.verified = &verified_;
      return runner.Run(StepRequest::GreedyVerify(batch_, rows_, drafts_), &result);
    case StepKind::kSampledVerify:
      result.verified = &verified_;
      return runner.Run(StepRequest::SampledVerify(batch_, rows_, drafts_, probs_), &result);
    case StepKind::kDraft:
      result.samples = &sampled_;
      return runner.Run(StepRequest::Draft(batch_, rows_, slots_), &result);
    case StepKind::kForward:
      result.logits = &logits_;
      return runner.Run(StepRequest::Forward(batch_), &result);
    case StepKind::kForwardCandidates:  // never on the wire (the decoder refuses it)
      break;
  }
  return absl::InvalidArgumentError("TpStep: unknown method");
}

}  // namespace specd
