#include "engine/verification/verifier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/base/monotonic_clock.h"

namespace specd {
namespace {

int64_t NumPositions(std::span<const Draft> drafts) {
  int64_t n = 0;
  for (const Draft& d : drafts) n += static_cast<int64_t>(d.tokens.size()) + 1;
  return n;
}

bool AnyTree(std::span<const Draft> drafts) {
  return std::any_of(drafts.begin(), drafts.end(),
                     [](const Draft& d) { return !d.parents.empty(); });
}

// Sampled trees verify on the device only beside deterministic drafts (one-hot q everywhere).
bool AnyDraftProbs(std::span<const Draft> drafts) {
  return std::any_of(drafts.begin(), drafts.end(), [](const Draft& d) {
    return !d.tokens.empty() && (d.device_probs != nullptr || !d.probs.empty());
  });
}

bool AnyDrafts(std::span<const Draft> drafts) {
  return std::any_of(drafts.begin(), drafts.end(),
                     [](const Draft& d) { return !d.tokens.empty(); });
}

absl::Status CheckSizes(const VerifyInput& in) {
  if (in.drafts.size() != in.rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("verify: ", in.drafts.size(), " drafts for ", in.rows.size(), " rows"));
  }
  return absl::OkStatus();
}

// The runner's per-row verification results as the tokens each row commits.
void ToOutcomes(std::span<const Draft> drafts, std::vector<GreedyVerifyResult>& verified,
                std::vector<RowOutcome>* out) {
  out->resize(verified.size());
  for (size_t k = 0; k < verified.size(); ++k) {
    RowOutcome& o = (*out)[k];
    GreedyVerifyResult& v = verified[k];
    const std::vector<int32_t>& tokens = drafts[k].tokens;
    o.num_drafts = static_cast<int32_t>(tokens.size());
    o.num_accepted = v.num_accepted;
    o.tokens.clear();
    o.path.clear();
    if (!v.accepted.empty()) {  // with their logprobs
      for (SampleResult& a : v.accepted) o.tokens.push_back(std::move(a));
    } else {
      for (int32_t j = 0; j < v.num_accepted; ++j) {
        const int32_t draft = v.path.empty() ? j : v.path[j];
        o.tokens.push_back({tokens[draft], 0.0f, {}, {}});
      }
    }
    o.tokens.push_back(std::move(v.next));
    o.path = std::move(v.path);
  }
}

}  // namespace

// ---- GreedyVerifier ----

bool GreedyVerifier::Fits(std::span<const SampleRow> rows, std::span<const Draft> drafts) const {
  if (AnyTree(drafts) && !runner_->SupportsTokenTrees()) return false;
  for (size_t k = 0; k < rows.size() && k < drafts.size(); ++k) {
    if (drafts[k].tokens.empty()) continue;
    const SamplingParams& p = *rows[k].params;
    if (!p.greedy() || p.has_penalties() || p.logprobs >= 0 || !rows[k].banned.empty()) {
      return false;
    }
  }
  return NumPositions(drafts) <= runner_->max_sample_rows();
}

absl::Status GreedyVerifier::Verify(const VerifyInput& in, std::vector<RowOutcome>* out) {
  if (absl::Status s = CheckSizes(in); !s.ok()) return s;
  if (!AnyDrafts(in.drafts)) {  // a plain step
    if (absl::Status s = runner_->Step(in.batch, in.rows, &sampled_); !s.ok()) return s;
    out->resize(in.rows.size());
    for (size_t k = 0; k < in.rows.size(); ++k) {
      RowOutcome& o = (*out)[k];
      o.num_drafts = 0;
      o.num_accepted = 0;
      o.tokens.clear();
      o.path.clear();
      o.tokens.push_back(std::move(sampled_[k]));
    }
    return absl::OkStatus();
  }
  draft_spans_.clear();
  for (const Draft& d : in.drafts) draft_spans_.emplace_back(d.tokens);
  if (absl::Status s = runner_->StepGreedyVerify(in.batch, in.rows, draft_spans_, &verified_);
      !s.ok()) {
    return s;
  }
  ToOutcomes(in.drafts, verified_, out);
  return absl::OkStatus();
}

// ---- SampledVerifier ----

bool SampledVerifier::Fits(std::span<const SampleRow> rows, std::span<const Draft> drafts) const {
  if (!runner_->SamplesSpeculationOnDevice() || rows.size() != drafts.size()) return false;
  if (AnyTree(drafts) && (!runner_->SupportsTokenTrees() || AnyDraftProbs(drafts))) return false;
  return NumPositions(drafts) <= runner_->max_sample_rows();
}

absl::Status SampledVerifier::Verify(const VerifyInput& in, std::vector<RowOutcome>* out) {
  if (absl::Status s = CheckSizes(in); !s.ok()) return s;
  draft_spans_.clear();
  draft_probs_.clear();
  for (const Draft& d : in.drafts) {
    draft_spans_.emplace_back(d.tokens);
    draft_probs_.push_back(DraftProbs{d.device_probs, d.probs});
  }
  if (absl::Status s =
          runner_->StepSampledVerify(in.batch, in.rows, draft_spans_, draft_probs_, &verified_);
      !s.ok()) {
    return s;
  }
  ToOutcomes(in.drafts, verified_, out);
  return absl::OkStatus();
}

// ---- HostVerifier ----

absl::Status HostVerifier::Verify(const VerifyInput& in, std::vector<RowOutcome>* out) {
  if (absl::Status s = CheckSizes(in); !s.ok()) return s;
  for (size_t k = 0; k < in.rows.size(); ++k) {
    if (in.drafts[k].tokens.empty()) continue;
    const size_t chunk = static_cast<size_t>(in.rows[k].chunk);
    if (chunk >= in.batch.size() || !in.batch[chunk].all_logits ||
        in.batch[chunk].tokens.size() != in.drafts[k].tokens.size() + 1 ||
        k >= in.acceptors.size() || in.acceptors[k] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("host verification: drafted row ", k,
                       " needs an all_logits chunk of its last token and drafts, and an acceptor"));
    }
  }
  for (size_t k = 0; k < in.rows.size(); ++k) {
    const Draft& d = in.drafts[k];
    if (d.parents.empty()) continue;
    if (d.parents.size() != d.tokens.size() || in.batch[in.rows[k].chunk].tree == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host verification: tree row ", k, " needs a parent per draft and a chunk with a tree"));
    }
  }
  sampling_seconds_ = 0;
  if (absl::Status s = runner_->Forward(in.batch, &logits_); !s.ok()) return s;
  const int64_t sampling_start = MonotonicNanos();
  const size_t vocab = static_cast<size_t>(runner_->config().vocab_size);
  // First logits row of each chunk: one row per chunk, one per token for drafted decodes.
  first_row_.assign(in.batch.size() + 1, 0);
  for (size_t i = 0; i < in.batch.size(); ++i) {
    first_row_[i + 1] = first_row_[i] + (in.batch[i].all_logits ? in.batch[i].tokens.size() : 1);
  }
  if (logits_.size() != first_row_.back() * vocab) {
    return absl::InternalError(absl::StrCat("verification pass returned ", logits_.size(),
                                            " logits, expected ", first_row_.back() * vocab));
  }
  auto row_logits = [&](size_t row, size_t count) {
    return std::span<float>(logits_).subspan(row * vocab, count * vocab);
  };
  out->resize(in.rows.size());
  for (size_t k = 0; k < in.rows.size(); ++k) {
    const SampleRow& r = in.rows[k];
    const size_t row = first_row_[r.chunk];
    const Draft& d = in.drafts[k];
    RowOutcome& o = (*out)[k];
    o.num_drafts = static_cast<int32_t>(d.tokens.size());
    o.num_accepted = 0;
    o.tokens.clear();
    o.path.clear();
    if (d.tokens.empty()) {
      o.tokens.push_back(r.sampler->Sample(row_logits(row, 1), *r.history, r.banned));
      continue;
    }
    BannedIds banned;
    banned.ids = r.banned;
    banned.num_positions =
        static_cast<int32_t>(std::max<int64_t>(0, int64_t{r.params->min_tokens} - r.num_generated));
    if (!d.parents.empty()) {
      const AcceptResult a = in.acceptors[k]->VerifyTree(
          row_logits(row, d.tokens.size() + 1), d.tokens, d.parents, *r.history, banned, &o.path);
      // Each committed token's logprobs are its parent node's row's (the root's: row 0).
      int32_t node = 0;
      for (int32_t j = 0; j <= a.num_accepted; ++j) {
        const int32_t id = j < a.num_accepted ? d.tokens[o.path[j]] : a.next_token;
        o.tokens.push_back(RawTokenLogprobs(row_logits(row + node, 1), id, r.params->logprobs));
        if (j < a.num_accepted) node = o.path[j] + 1;
      }
      o.num_accepted = a.num_accepted;
      continue;
    }
    const AcceptResult a = in.acceptors[k]->Verify(row_logits(row, d.tokens.size() + 1), d.tokens,
                                                   d.probs, *r.history, banned);
    // The target's raw logprobs for every committed token.
    for (int32_t j = 0; j <= a.num_accepted; ++j) {
      const int32_t id = j < a.num_accepted ? d.tokens[j] : a.next_token;
      o.tokens.push_back(RawTokenLogprobs(row_logits(row + j, 1), id, r.params->logprobs));
    }
    o.num_accepted = a.num_accepted;
  }
  sampling_seconds_ = NanosToSeconds(sampling_start, MonotonicNanos());
  return absl::OkStatus();
}

}  // namespace specd
