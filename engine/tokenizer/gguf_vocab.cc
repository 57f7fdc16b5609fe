#include "engine/tokenizer/gguf_vocab.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/tokenizer/string_view_compat.h"
#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

// tokenizer.ggml.token_type values.
enum TokenType : int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};
constexpr size_t kMaxTokens = size_t{1} << 24;

struct GgufVocab {
  const std::vector<std::string>* tokens = nullptr;
  std::vector<int64_t> types;  // one per token
  std::vector<double> scores;  // one per token
  absl::flat_hash_map<std::string, int32_t> lookup;
};

absl::StatusOr<GgufVocab> ReadVocab(const GgufMetadata& meta) {
  GgufVocab v;
  v.tokens = meta.GetStringArray("tokenizer.ggml.tokens");
  if (v.tokens == nullptr || v.tokens->empty()) {
    return absl::InvalidArgumentError("GGUF has no tokenizer.ggml.tokens string array");
  }
  const size_t n = v.tokens->size();
  if (n > kMaxTokens) return absl::InvalidArgumentError("GGUF vocabulary too large");
  v.types.assign(n, kNormal);
  v.scores.assign(n, 0.0);
  if (const auto* types = meta.GetIntArray("tokenizer.ggml.token_type")) {
    if (types->size() != n) return absl::InvalidArgumentError("token_type length != tokens");
    v.types = *types;
  }
  if (const auto* scores = meta.GetFloatArray("tokenizer.ggml.scores")) {
    if (scores->size() != n) return absl::InvalidArgumentError("scores length != tokens");
    v.scores = *scores;
  }
  v.lookup.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // Later duplicates win, as in llama.cpp's token_to_id.
    if (!(*v.tokens)[i].empty()) v.lookup.insert_or_assign((*v.tokens)[i], static_cast<int32_t>(i));
  }
  return v;
}

// Id table, flags and the added tokens (control, user-defined, unknown: matched in raw text).
absl::Status FillTokens(const GgufVocab& v, TokenizerParts* parts) {
  const size_t n = v.tokens->size();
  parts->pieces = *v.tokens;
  parts->flags.assign(n, TokenizerParts::kPresent);
  std::vector<AddedToken> added;
  for (size_t i = 0; i < n; ++i) {
    const int64_t type = v.types[i];
    if (type != kControl && type != kUnknown && type != kUserDefined) continue;
    const bool special = type != kUserDefined;
    parts->flags[i] |= TokenizerParts::kVerbatim | (special ? TokenizerParts::kSpecial : 0);
    if ((*v.tokens)[i].empty() || !IsValidUtf8((*v.tokens)[i])) continue;
    AddedToken t;
    t.id = static_cast<int32_t>(i);
    t.content = (*v.tokens)[i];
    t.special = special;
    added.push_back(std::move(t));
  }
  return parts->added.Build(std::move(added), nullptr);
}

// SentencePiece BPE merges: every split of a normal piece into two known pieces, ranked by
// the piece's score (higher first; equal scores share a rank so the leftmost pair wins).
void AddSpmMerges(const GgufVocab& v, BpeModel* model) {
  struct Candidate {
    double score;
    int32_t left, right, merged;
  };
  std::vector<Candidate> candidates;
  const auto& tokens = *v.tokens;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (v.types[id] != kNormal) continue;
    const std::string& piece = tokens[id];
    for (size_t cut = DecodeUtf8(piece, 0).len; cut < piece.size();
         cut += DecodeUtf8(piece, cut).len) {
      auto l = v.lookup.find(AsAbsl(std::string_view(piece).substr(0, cut)));
      auto r = v.lookup.find(AsAbsl(std::string_view(piece).substr(cut)));
      if (l == v.lookup.end() || r == v.lookup.end()) continue;
      candidates.push_back({v.scores[id], l->second, r->second, static_cast<int32_t>(id)});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  int32_t rank = -1;
  double last_score = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (i == 0 || candidates[i].score != last_score) ++rank;
    last_score = candidates[i].score;
    model->AddMergeIds(candidates[i].left, candidates[i].right, rank, candidates[i].merged);
  }
}

absl::Status AddBpeMerges(const GgufMetadata& meta, const GgufVocab& v, BpeModel* model) {
  const auto* merges = meta.GetStringArray("tokenizer.ggml.merges");
  if (merges == nullptr) return absl::InvalidArgumentError("GGUF gpt2 vocab has no merges");
  size_t skipped = 0;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string& m = (*merges)[rank];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos) {
      ++skipped;
      continue;
    }
    auto l = v.lookup.find(AsAbsl(std::string_view(m).substr(0, space)));
    auto r = v.lookup.find(AsAbsl(std::string_view(m).substr(space + 1)));
    auto merged = v.lookup.find(m.substr(0, space) + m.substr(space + 1));
    if (l == v.lookup.end() || r == v.lookup.end() || merged == v.lookup.end()) {
      ++skipped;
      continue;
    }
    model->AddMergeIds(l->second, r->second, static_cast<int32_t>(rank), merged->second);
  }
  if (skipped > 0) SPECD_LOG_WARN("GGUF: skipped {} merges naming unknown pieces", skipped);
  return absl::OkStatus();
}

// A special-token id key; out-of-range ids are ignored as llama.cpp does.
absl::StatusOr<std::optional<int32_t>> TokenIdKey(const GgufMetadata& meta, const char* key,
                                                  size_t n, std::optional<int32_t> fallback) {
  SPECD_ASSIGN_OR_RETURN(std::optional<int64_t> id, meta.GetInt(key));
  if (!id.has_value()) return fallback;
  if (*id < 0 || static_cast<size_t>(*id) >= n) {
    SPECD_LOG_WARN("GGUF: {} = {} out of range, ignored", key, *id);
    return fallback;
  }
  return static_cast<int32_t>(*id);
}

absl::Status SetSpecials(const GgufMetadata& meta, bool spm, bool default_add_bos,
                         TokenizerParts* parts) {
  const size_t n = parts->pieces.size();
  auto fallback = [&](int32_t id) -> std::optional<int32_t> {
    return spm && static_cast<size_t>(id) < n ? std::optional<int32_t>(id) : std::nullopt;
  };
  SPECD_ASSIGN_OR_RETURN(parts->bos_id,
                         TokenIdKey(meta, "tokenizer.ggml.bos_token_id", n, fallback(1)));
  SPECD_ASSIGN_OR_RETURN(auto eos_id,
                         TokenIdKey(meta, "tokenizer.ggml.eos_token_id", n, fallback(2)));
  SPECD_ASSIGN_OR_RETURN(auto add_bos, meta.GetBool("tokenizer.ggml.add_bos_token"));
  SPECD_ASSIGN_OR_RETURN(auto add_eos, meta.GetBool("tokenizer.ggml.add_eos_token"));
  if (add_bos.value_or(default_add_bos) && parts->bos_id) parts->prefix_ids = {*parts->bos_id};
  if (add_eos.value_or(false) && eos_id) parts->suffix_ids = {*eos_id};
  if (parts->bos_id) parts->bos_token = parts->pieces[*parts->bos_id];
  if (eos_id) {
    parts->eos_token = parts->pieces[*eos_id];
    parts->eos_ids = {*eos_id};
  }
  SPECD_ASSIGN_OR_RETURN(auto tmpl, meta.GetString("tokenizer.chat_template"));
  parts->chat_template = tmpl.value_or("");
  return absl::OkStatus();
}

absl::Status BuildSpm(const GgufMetadata& meta, GgufVocab vocab, TokenizerParts* parts) {
  SPECD_ASSIGN_OR_RETURN(auto add_prefix, meta.GetBool("tokenizer.ggml.add_space_prefix"));
  const bool add_space_prefix = add_prefix.value_or(true);
  SPECD_ASSIGN_OR_RETURN(auto unk, TokenIdKey(meta, "tokenizer.ggml.unknown_token_id",
                                              vocab.tokens->size(), std::optional<int32_t>(0)));
  BpeModel::Options opt;
  opt.byte_fallback = true;
  opt.unk_id = unk;
  opt.fuse_unk = true;
  auto model = std::make_unique<BpeModel>(vocab.lookup, opt);
  AddSpmMerges(vocab, model.get());
  model->EnableMetaspaceWordSplit();
  parts->model = std::move(model);
  parts->normalizer = MakeSpmNormalizer(add_space_prefix);
  parts->decoder = MakeSpmDecoder(add_space_prefix);
  return SetSpecials(meta, /*spm=*/true, /*default_add_bos=*/true, parts);
}

absl::Status BuildBpe(const GgufMetadata& meta, GgufVocab vocab, TokenizerParts* parts) {
  SPECD_ASSIGN_OR_RETURN(auto pre, meta.GetString("tokenizer.ggml.pre"));
  const std::string pre_name = pre.value_or("default");
  SPECD_ASSIGN_OR_RETURN(std::vector<std::string> patterns, GgufPreTokenizerPatterns(pre_name));
  SPECD_ASSIGN_OR_RETURN(parts->pre_tokenizer, MakeRegexByteLevelPreTokenizer(patterns));
  const bool llama3_like = pre_name == "llama3" || pre_name == "llama-v3" ||
                           pre_name == "llama-bpe" || pre_name == "falcon3" || pre_name == "tekken";
  BpeModel::Options opt;
  opt.ignore_merges = llama3_like;
  auto model = std::make_unique<BpeModel>(vocab.lookup, opt);
  SPECD_RETURN_IF_ERROR(AddBpeMerges(meta, vocab, model.get()));
  parts->model = std::move(model);
  parts->decoder = MakeByteLevelDecoder();
  const bool default_add_bos = llama3_like || pre_name == "chameleon";
  return SetSpecials(meta, /*spm=*/false, default_add_bos, parts);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerParts>> BuildGgufTokenizer(const GgufMetadata& meta) {
  SPECD_ASSIGN_OR_RETURN(auto model_name, meta.GetString("tokenizer.ggml.model"));
  if (!model_name.has_value())
    return absl::InvalidArgumentError("GGUF has no tokenizer.ggml.model");
  if (*model_name != "llama" && *model_name != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat("GGUF tokenizer model '", *model_name, "' is not supported"));
  }
  SPECD_ASSIGN_OR_RETURN(GgufVocab vocab, ReadVocab(meta));
  auto parts = std::make_unique<TokenizerParts>();
  SPECD_RETURN_IF_ERROR(FillTokens(vocab, parts.get()));
  if (*model_name == "llama") {
    SPECD_RETURN_IF_ERROR(BuildSpm(meta, std::move(vocab), parts.get()));
  } else {
    SPECD_RETURN_IF_ERROR(BuildBpe(meta, std::move(vocab), parts.get()));
  }
  return parts;
}

absl::StatusOr<std::unique_ptr<TokenizerParts>> LoadGgufTokenizer(const std::string& path) {
  SPECD_ASSIGN_OR_RETURN(GgufMetadata meta, GgufMetadata::ReadFile(path));
  auto parts = BuildGgufTokenizer(meta);
  if (!parts.ok()) {
    return absl::Status(parts.status().code(), absl::StrCat(path, ": ", parts.status().message()));
  }
  SPECD_LOG_INFO("tokenizer: loaded GGUF vocab {} ({} tokens, {} merges)", path,
                 (*parts)->pieces.size(), (*parts)->model->num_merges());
  return parts;
}

}  // namespace specd::tok
