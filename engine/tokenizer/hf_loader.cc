#include "engine/tokenizer/hf_loader.h"

#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/base/log.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/tokenizer/hf_post_processor.h"
#include "engine/tokenizer/json_util.h"

namespace specd::tok {
namespace {

constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// What tokenizer_config.json contributes.
struct HfConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  std::string tokenizer_class;
  std::string chat_template;
  std::vector<AddedToken> added_tokens;  // from added_tokens_decoder
};

absl::StatusOr<AddedToken> ParseAddedToken(const Json& j, int64_t id) {
  if (!j.is_object()) return absl::InvalidArgumentError("added token must be an object");
  if (id < 0 || id > kMaxTokenId) {
    return absl::InvalidArgumentError(absl::StrCat("added token id ", id, " out of range"));
  }
  AddedToken t;
  t.id = static_cast<int32_t>(id);
  SPECD_ASSIGN_OR_RETURN(t.content, JsonString(j, "content"));
  SPECD_ASSIGN_OR_RETURN(t.single_word, JsonBoolOr(j, "single_word", false));
  SPECD_ASSIGN_OR_RETURN(t.lstrip, JsonBoolOr(j, "lstrip", false));
  SPECD_ASSIGN_OR_RETURN(t.rstrip, JsonBoolOr(j, "rstrip", false));
  SPECD_ASSIGN_OR_RETURN(t.special, JsonBoolOr(j, "special", false));
  SPECD_ASSIGN_OR_RETURN(t.normalized, JsonBoolOr(j, "normalized", !t.special));
  return t;
}

// bos_token / eos_token: a string, an AddedToken object, or null.
absl::StatusOr<std::optional<std::string>> ParseTokenName(const Json& config, const char* key) {
  const Json* v = JsonFind(config, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) return JsonString(*v, "content");
  return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a string or object"));
}

absl::StatusOr<std::string> ParseChatTemplate(const Json& config) {
  const Json* v = JsonFind(config, "chat_template");
  if (v == nullptr) return std::string();
  if (v->is_string()) return v->get<std::string>();
  if (!v->is_array()) return absl::InvalidArgumentError("'chat_template' must be string or list");
  for (const Json& item : *v) {  // the named-templates form: pick "default"
    SPECD_ASSIGN_OR_RETURN(std::string name, JsonStringOr(item, "name", ""));
    if (name == "default") return JsonString(item, "template");
  }
  return std::string();
}

absl::StatusOr<HfConfig> ParseConfig(const Json& config) {
  if (!config.is_object()) return absl::InvalidArgumentError("tokenizer_config must be an object");
  HfConfig c;
  SPECD_ASSIGN_OR_RETURN(c.bos_token, ParseTokenName(config, "bos_token"));
  SPECD_ASSIGN_OR_RETURN(c.eos_token, ParseTokenName(config, "eos_token"));
  if (JsonFind(config, "add_bos_token") != nullptr) {
    SPECD_ASSIGN_OR_RETURN(c.add_bos, JsonBoolOr(config, "add_bos_token", false));
  }
  if (JsonFind(config, "add_eos_token") != nullptr) {
    SPECD_ASSIGN_OR_RETURN(c.add_eos, JsonBoolOr(config, "add_eos_token", false));
  }
  SPECD_ASSIGN_OR_RETURN(c.tokenizer_class, JsonStringOr(config, "tokenizer_class", ""));
  SPECD_ASSIGN_OR_RETURN(c.chat_template, ParseChatTemplate(config));
  if (const Json* decoder = JsonFind(config, "added_tokens_decoder")) {
    if (!decoder->is_object()) return absl::InvalidArgumentError("bad 'added_tokens_decoder'");
    for (const auto& [key, value] : decoder->items()) {
      int64_t id = -1;
      if (!absl::SimpleAtoi(key, &id)) {
        return absl::InvalidArgumentError(absl::StrCat("bad added token id '", key, "'"));
      }
      SPECD_ASSIGN_OR_RETURN(AddedToken t, ParseAddedToken(value, id));
      c.added_tokens.push_back(std::move(t));
    }
  }
  return c;
}

absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> ParseVocab(const Json& model) {
  const Json* vocab = JsonFind(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return absl::InvalidArgumentError("model.vocab must be an object");
  }
  absl::flat_hash_map<std::string, int32_t> out;
  out.reserve(vocab->size());
  for (const auto& [piece, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat("bad id for vocab piece '", piece, "'"));
    }
    out.emplace(piece, static_cast<int32_t>(id.get<int64_t>()));
  }
  return out;
}

absl::Status AddMerges(const Json& model, BpeModel* bpe) {
  const Json* merges = JsonFind(model, "merges");
  if (merges == nullptr) return absl::OkStatus();
  if (!merges->is_array()) return absl::InvalidArgumentError("model.merges must be an array");
  int32_t rank = 0;
  for (const Json& m : *merges) {
    std::string left, right;
    if (m.is_string()) {  // "left right"
      std::vector<std::string> parts = absl::StrSplit(m.get<std::string>(), ' ');
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("bad merge '", m.get<std::string>(), "'"));
      }
      left = std::move(parts[0]);
      right = std::move(parts[1]);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError("a merge must be \"a b\" or [\"a\", \"b\"]");
    }
    SPECD_RETURN_IF_ERROR(bpe->AddMerge(left, right, rank++));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BpeModel>> ParseModel(
    const Json& model, absl::flat_hash_map<std::string, int32_t> vocab) {
  BpeModel::Options opt;
  SPECD_ASSIGN_OR_RETURN(opt.byte_fallback, JsonBoolOr(model, "byte_fallback", false));
  SPECD_ASSIGN_OR_RETURN(opt.fuse_unk, JsonBoolOr(model, "fuse_unk", false));
  SPECD_ASSIGN_OR_RETURN(opt.ignore_merges, JsonBoolOr(model, "ignore_merges", false));
  SPECD_ASSIGN_OR_RETURN(opt.continuing_subword_prefix,
                         JsonStringOr(model, "continuing_subword_prefix", ""));
  SPECD_ASSIGN_OR_RETURN(opt.end_of_word_suffix, JsonStringOr(model, "end_of_word_suffix", ""));
  SPECD_ASSIGN_OR_RETURN(std::string unk, JsonStringOr(model, "unk_token", ""));
  if (!unk.empty()) {
    auto it = vocab.find(unk);
    if (it != vocab.end()) {
      opt.unk_id = it->second;
    } else {
      SPECD_LOG_WARN("tokenizer: unk_token '{}' is not in the vocab; unknown chars are dropped",
                     unk);
    }
  }
  if (const Json* d = JsonFind(model, "dropout");
      d != nullptr && d->is_number() && d->get<double>() > 0) {
    SPECD_LOG_WARN("tokenizer: BPE dropout is ignored (inference is deterministic)");
  }
  auto bpe = std::make_unique<BpeModel>(std::move(vocab), std::move(opt));
  SPECD_RETURN_IF_ERROR(AddMerges(model, bpe.get()));
  return bpe;
}

// Fills `pieces`/`flags` from the model vocab and the added tokens.
void BuildIdTable(const absl::flat_hash_map<std::string, int32_t>& vocab,
                  const std::vector<AddedToken>& added, TokenizerParts* parts) {
  int64_t size = 0;
  for (const auto& [piece, id] : vocab) size = std::max<int64_t>(size, id + 1);
  for (const AddedToken& t : added) size = std::max<int64_t>(size, t.id + 1);
  parts->pieces.assign(size, std::string());
  parts->flags.assign(size, 0);
  for (const auto& [piece, id] : vocab) {
    parts->pieces[id] = piece;
    parts->flags[id] = TokenizerParts::kPresent;
  }
  for (const AddedToken& t : added) {
    parts->pieces[t.id] = t.content;
    parts->flags[t.id] = TokenizerParts::kPresent | (t.special ? TokenizerParts::kSpecial : 0);
  }
}

std::optional<int32_t> LookupToken(const TokenizerParts& parts, const std::string& token) {
  if (auto id = parts.added.FindByContent(token)) return id;
  return parts.model->Find(token);
}

// BOS/EOS ids and strings, and the config's add_bos_token / add_eos_token. Llama- and
// Gemma-class tokenizers rebuild their post-processor from those flags in transformers;
// other classes keep tokenizer.json's post-processor.
void ResolveSpecialTokens(const HfConfig& config, bool has_post_processor, TokenizerParts* parts) {
  auto resolve = [&](const std::optional<std::string>& name, std::string* token,
                     std::optional<int32_t>* id) {
    if (!name.has_value() || name->empty()) return;
    *token = *name;
    *id = LookupToken(*parts, *name);
    if (!id->has_value()) SPECD_LOG_WARN("tokenizer: special token '{}' not in vocab", *name);
  };
  std::optional<int32_t> eos_id;
  resolve(config.bos_token, &parts->bos_token, &parts->bos_id);
  resolve(config.eos_token, &parts->eos_token, &eos_id);
  const bool rebuilds = absl::StrContains(config.tokenizer_class, "Llama") ||
                        absl::StrContains(config.tokenizer_class, "Gemma");
  if ((rebuilds && (config.add_bos || config.add_eos)) || !has_post_processor) {
    const bool add_bos = config.add_bos.value_or(rebuilds);
    const bool add_eos = config.add_eos.value_or(false);
    parts->prefix_ids.clear();
    parts->suffix_ids.clear();
    if (add_bos && parts->bos_id) parts->prefix_ids.push_back(*parts->bos_id);
    if (add_eos && eos_id) parts->suffix_ids.push_back(*eos_id);
  }
  // Without a config, the post-processor's own tokens name BOS / EOS.
  if (!config.bos_token && !parts->prefix_ids.empty()) {
    parts->bos_id = parts->prefix_ids.front();
    parts->bos_token = parts->pieces[*parts->bos_id];
  }
  if (!config.eos_token && !parts->suffix_ids.empty()) {
    eos_id = parts->suffix_ids.back();
    parts->eos_token = parts->pieces[*eos_id];
  }
  if (eos_id) parts->eos_ids.push_back(*eos_id);
}

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& root, const HfConfig& config) {
  std::vector<AddedToken> added;
  absl::flat_hash_map<int32_t, bool> seen;
  if (const Json* list = JsonFind(root, "added_tokens")) {
    if (!list->is_array()) return absl::InvalidArgumentError("'added_tokens' must be an array");
    for (const Json& item : *list) {
      SPECD_ASSIGN_OR_RETURN(int64_t id, JsonInt(item, "id"));
      SPECD_ASSIGN_OR_RETURN(AddedToken t, ParseAddedToken(item, id));
      if (seen.emplace(t.id, true).second) added.push_back(std::move(t));
    }
  }
  for (const AddedToken& t : config.added_tokens) {
    if (seen.emplace(t.id, true).second) added.push_back(t);
  }
  return added;
}

absl::Status ParseComponents(const Json& root, TokenizerParts* parts) {
  if (const Json* n = JsonFind(root, "normalizer")) {
    SPECD_ASSIGN_OR_RETURN(parts->normalizer, NormalizerFromJson(*n));
  }
  if (const Json* p = JsonFind(root, "pre_tokenizer")) {
    SPECD_ASSIGN_OR_RETURN(parts->pre_tokenizer, PreTokenizerFromJson(*p));
  }
  if (const Json* d = JsonFind(root, "decoder")) {
    SPECD_ASSIGN_OR_RETURN(parts->decoder, DecoderFromJson(*d));
  }
  if (const Json* pp = JsonFind(root, "post_processor")) {
    SPECD_RETURN_IF_ERROR(ParsePostProcessor(*pp, &parts->prefix_ids, &parts->suffix_ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TokenizerParts>> Assemble(const Json& root, const HfConfig& config) {
  if (!root.is_object()) return absl::InvalidArgumentError("top level must be an object");
  const Json* model = JsonFind(root, "model");
  if (model == nullptr || !model->is_object()) return absl::InvalidArgumentError("bad 'model'");
  SPECD_ASSIGN_OR_RETURN(std::string type, JsonStringOr(*model, "type", "BPE"));
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrCat("unsupported tokenizer model '", type, "'"));
  }
  auto parts = std::make_unique<TokenizerParts>();
  SPECD_ASSIGN_OR_RETURN(auto vocab, ParseVocab(*model));
  SPECD_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ParseAddedTokens(root, config));
  BuildIdTable(vocab, added, parts.get());
  SPECD_ASSIGN_OR_RETURN(parts->model, ParseModel(*model, std::move(vocab)));
  parts->model->EnableMetaspaceWordSplit();
  SPECD_RETURN_IF_ERROR(ParseComponents(root, parts.get()));
  SPECD_RETURN_IF_ERROR(parts->added.Build(std::move(added), parts->normalizer.get()));
  for (int32_t id : parts->prefix_ids) {
    if (id < 0 || id >= static_cast<int32_t>(parts->pieces.size())) {
      return absl::InvalidArgumentError(absl::StrCat("post-processor id ", id, " out of range"));
    }
  }
  for (int32_t id : parts->suffix_ids) {
    if (id < 0 || id >= static_cast<int32_t>(parts->pieces.size())) {
      return absl::InvalidArgumentError(absl::StrCat("post-processor id ", id, " out of range"));
    }
  }
  ResolveSpecialTokens(config, JsonFind(root, "post_processor") != nullptr, parts.get());
  parts->chat_template = config.chat_template;
  return parts;
}

// tokenizer_config.json, then a chat_template.jinja beside it if the config has no template.
absl::StatusOr<HfConfig> LoadConfig(const std::filesystem::path& dir) {
  HfConfig config;
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    SPECD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path.string()));
    SPECD_ASSIGN_OR_RETURN(Json json, ParseJson(text, config_path.string()));
    auto parsed = ParseConfig(json);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path.string(), ": ", parsed.status().message()));
    }
    config = *std::move(parsed);
  }
  const auto jinja_path = dir / "chat_template.jinja";
  if (config.chat_template.empty() && std::filesystem::exists(jinja_path)) {
    SPECD_ASSIGN_OR_RETURN(config.chat_template, ReadFileToString(jinja_path.string()));
  }
  return config;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerParts>> LoadHfTokenizer(const std::string& dir) {
  const std::filesystem::path root_dir(dir);
  const std::string path = (root_dir / "tokenizer.json").string();
  SPECD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  SPECD_ASSIGN_OR_RETURN(Json root, ParseJson(text, path));
  SPECD_ASSIGN_OR_RETURN(HfConfig config, LoadConfig(root_dir));
  absl::StatusOr<std::unique_ptr<TokenizerParts>> parts;
  try {  // json accessors are checked; this only guards against a library throw
    parts = Assemble(root, config);
  } catch (const std::exception& e) {
    parts = absl::InvalidArgumentError(e.what());
  }
  if (!parts.ok()) {
    return absl::Status(parts.status().code(), absl::StrCat(path, ": ", parts.status().message()));
  }
  SPECD_LOG_INFO("tokenizer: loaded {} ({} ids, {} merges, {} added tokens)", path,
                 (*parts)->pieces.size(), (*parts)->model->num_merges(),
                 (*parts)->added.tokens().size());
  return parts;
}

}  // namespace specd::tok
