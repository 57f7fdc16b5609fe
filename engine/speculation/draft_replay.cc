#include "engine/speculation/draft_replay.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

// SplitMix64's finaliser over a running state.
uint64_t Mix(uint64_t h, uint64_t v) {
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t KeyOf(std::span<const int32_t> tokens) {
  uint64_t h = 0x5eed;
  for (size_t i = 0; i < DraftReplay::kKeyTokens; ++i) h = Mix(h, static_cast<uint32_t>(tokens[i]));
  return h;
}

constexpr uint64_t kDraftSalt = 1, kCandidateSalt = 2, kOtherSalt = 3;

}  // namespace

absl::StatusOr<std::unique_ptr<DraftReplay>> DraftReplay::Load(const DraftReplayOptions& options,
                                                               int32_t vocab) {
  std::ifstream in(options.file);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay: cannot read the trajectory file ", options.file));
  }
  std::vector<std::vector<int32_t>> trajectories;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto it = j.is_object() ? j.find("tokens") : j.end();
    if (j.is_discarded() || !j.is_object() || it == j.end() || !it->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("replay: ", options.file, ":", line_no, ": expected {\"tokens\": [ids]}"));
    }
    std::vector<int32_t> ids;
    for (const nlohmann::json& v : *it) {
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat("replay: ", options.file, ":", line_no, ": token ids must be integers"));
      }
      ids.push_back(v.get<int32_t>());
    }
    trajectories.push_back(std::move(ids));
  }
  absl::StatusOr<std::unique_ptr<DraftReplay>> replay =
      Create(options, vocab, std::move(trajectories));
  if (!replay.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay: ", options.file, ": ", replay.status().message()));
  }
  return replay;
}

absl::StatusOr<std::unique_ptr<DraftReplay>> DraftReplay::Create(
    const DraftReplayOptions& options, int32_t vocab,
    std::vector<std::vector<int32_t>> trajectories) {
  if (vocab < 2) return absl::InvalidArgumentError("replay needs a vocabulary of 2 or more");
  if (trajectories.empty()) return absl::InvalidArgumentError("no trajectories");
  absl::flat_hash_map<uint64_t, std::vector<size_t>> keys;
  for (size_t i = 0; i < trajectories.size(); ++i) {
    const std::vector<int32_t>& t = trajectories[i];
    if (t.size() < kKeyTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("trajectory ", i + 1, " has ", t.size(), " tokens; at least ", kKeyTokens));
    }
    for (int32_t id : t) {
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("trajectory ", i + 1, ": token id ", id, " outside [0, ", vocab, ")"));
      }
    }
    keys[KeyOf(t)].push_back(i);
  }
  std::unique_ptr<DraftReplay> r(new DraftReplay(options, vocab, std::move(trajectories)));
  r->by_key_ = std::move(keys);
  return r;
}

DraftReplay::DraftReplay(const DraftReplayOptions& options, int32_t vocab,
                         std::vector<std::vector<int32_t>> trajectories)
    : options_(options), vocab_(vocab), trajectories_(std::move(trajectories)) {}

const std::vector<int32_t>* DraftReplay::OnTrack(std::span<const int32_t> context,
                                                 std::span<const int32_t> drafts, size_t* index,
                                                 size_t* position) const {
  if (context.size() < kKeyTokens) return nullptr;
  auto it = by_key_.find(KeyOf(context));
  if (it == by_key_.end()) return nullptr;
  const size_t p = context.size() + drafts.size();
  for (size_t i : it->second) {  // the first trajectory the context and drafts follow
    const std::vector<int32_t>& t = trajectories_[i];
    if (p >= t.size() || !std::equal(context.begin(), context.end(), t.begin()) ||
        !std::equal(drafts.begin(), drafts.end(), t.begin() + context.size())) {
      continue;
    }
    *index = i;
    *position = p;
    return &t;
  }
  return nullptr;
}

double DraftReplay::Uniform(size_t index, size_t position, uint64_t salt) const {
  const uint64_t h = Mix(Mix(Mix(options_.seed, index), position), salt);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

int32_t DraftReplay::Other(size_t index, size_t position, int32_t token, uint64_t salt) const {
  const uint64_t h = Mix(Mix(Mix(options_.seed ^ 0xa5a5, index), position), salt);
  const auto shift = static_cast<int32_t>(1 + h % static_cast<uint64_t>(vocab_ - 1));
  return static_cast<int32_t>((static_cast<int64_t>(token) + shift) % vocab_);
}

int32_t DraftReplay::Draft(std::span<const int32_t> context, std::span<const int32_t> drafts,
                           int32_t model_token) const {
  size_t index = 0, p = 0;
  const std::vector<int32_t>* t = OnTrack(context, drafts, &index, &p);
  if (t == nullptr) return model_token;
  const int32_t right = (*t)[p];
  return Uniform(index, p, kDraftSalt) < options_.alpha ? right
                                                        : Other(index, p, right, kDraftSalt);
}

void DraftReplay::Candidates(std::span<const int32_t> context, std::span<const int32_t> drafts,
                             std::span<int32_t> candidates) const {
  size_t index = 0, p = 0;
  const std::vector<int32_t>* t = OnTrack(context, drafts, &index, &p);
  if (t == nullptr || candidates.size() < 2) return;
  const int32_t right = (*t)[p];
  if (candidates[0] == right) return;  // the draft is right: its alternatives never matter
  // Take the recorded token out of the row (and the draft's duplicates), keeping the order.
  std::vector<int32_t> rest;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (candidates[i] != right && candidates[i] != candidates[0]) rest.push_back(candidates[i]);
  }
  size_t at = 1;
  if (Uniform(index, p, kCandidateSalt) < options_.candidate_hit) candidates[at++] = right;
  for (size_t i = 0; at < candidates.size(); ++i) {
    if (i < rest.size()) {
      candidates[at++] = rest[i];
      continue;
    }
    // Fill with tokens that are neither the draft nor the recorded one (nor already there).
    candidates[at] = Fill(index, p, right, i, candidates.first(at));
    ++at;
  }
}

void DraftReplay::Children(std::span<const int32_t> context, std::span<const int32_t> path,
                           std::span<int32_t> children) const {
  size_t index = 0, p = 0;
  const std::vector<int32_t>* t = OnTrack(context, path, &index, &p);
  // A row as long as the vocabulary could not keep the recorded token out: left alone.
  if (t == nullptr || children.empty() || children.size() >= static_cast<size_t>(vocab_)) return;
  const int32_t right = (*t)[p];
  const int32_t best = Draft(context, path, children[0]);  // the same draw as the chain's
  std::vector<int32_t> rest;  // the model's children after the best, in order
  for (int32_t c : children) {
    if (c != right && c != best) rest.push_back(c);
  }
  children[0] = best;
  size_t at = 1;
  for (size_t i = 0; at < children.size(); ++i) {
    if (i < rest.size()) {
      children[at++] = rest[i];
      continue;
    }
    // The model had both the recorded token and the miss's token: the row keeps its length.
    children[at] = Fill(index, p, right, i - rest.size(), children.first(at));
    ++at;
  }
}

int32_t DraftReplay::Fill(size_t index, size_t position, int32_t right, size_t i,
                          std::span<const int32_t> taken) const {
  int32_t fill = Other(index, position, right, kOtherSalt + i);
  while (std::find(taken.begin(), taken.end(), fill) != taken.end()) {
    fill = (fill + 1) % vocab_;
    if (fill == right) fill = (fill + 1) % vocab_;
  }
  return fill;
}

}  // namespace specd
