#include "server/http/openai_format.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/json_fields.h"

namespace specd::http {

void Usage::AddByMethod(const std::vector<RequestUsage::MethodUsage>& counts) {
  for (const RequestUsage::MethodUsage& c : counts) {
    auto it = std::find_if(by_method.begin(), by_method.end(),
                           [&](const auto& m) { return std::string_view(m.method) == c.method; });
    if (it == by_method.end()) {
      by_method.push_back({.method = c.method});
      it = by_method.end() - 1;
    }
    it->num_drafts += c.num_drafts;
    it->num_draft_tokens += c.num_draft_tokens;
    it->num_accepted_tokens += c.num_accepted_tokens;
  }
}

namespace {

// JSON has no -inf; like vLLM, report impossible tokens as -9999.
constexpr float kMinLogprob = -9999.0f;

float Clamp(float logprob) { return std::max(logprob, kMinLogprob); }

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Event(const Json& j) { return absl::StrCat("data: ", Dump(j), "\n\n"); }

// Code points in UTF-8 text (OpenAI's text_offset counts characters).
int64_t NumChars(std::string_view text) {
  return std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; });
}

// GPT-2 byte-level BPE writes each byte as one code point: printable Latin-1 as itself,
// the other 68 bytes as 256 + k in byte order. Returns -1 for other code points.
int ByteLevelByte(uint32_t cp) {
  auto printable = [](uint32_t b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  };
  if (cp < 256) return printable(cp) ? static_cast<int>(cp) : -1;
  uint32_t k = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    if (printable(b)) continue;
    if (k++ == cp) return static_cast<int>(b);
  }
  return -1;
}

// Decodes `piece` as byte-level BPE symbols; false if it is not one.
bool ByteLevelBytes(std::string_view piece, std::vector<uint8_t>* out) {
  for (size_t i = 0; i < piece.size();) {
    const auto c = static_cast<uint8_t>(piece[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < piece.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(piece[i + 1]) & 0x3Fu);
      len = 2;
    } else if (c >= 0x80) {
      return false;  // byte-level symbols are all below U+0800
    }
    const int b = ByteLevelByte(cp);
    if (b < 0) return false;
    out->push_back(static_cast<uint8_t>(b));
    i += len;
  }
  return true;
}

// The tokenizer for token strings, or null to report "token_id:N".
const Tokenizer* Strings(const ResponseMeta& meta) {
  return meta.tokens_as_ids ? nullptr : meta.tokenizer;
}

Json ChatTokenLogprob(const Tokenizer* tok, int32_t id, float logprob) {
  const std::vector<uint8_t> bytes = TokenBytes(tok, id);
  return Json{{"token", TokenText(tok, id)}, {"logprob", Clamp(logprob)}, {"bytes", bytes}};
}

Json ChatLogprobs(const ResponseMeta& meta, std::span<const GeneratedToken> tokens) {
  Json content = Json::array();
  for (const GeneratedToken& t : tokens) {
    Json entry = ChatTokenLogprob(Strings(meta), t.id, t.logprob);
    Json top = Json::array();
    for (size_t k = 0; k < t.top.size() && k < static_cast<size_t>(meta.top_logprobs); ++k) {
      top.push_back(ChatTokenLogprob(Strings(meta), t.top[k].id, t.top[k].logprob));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return Json{{"content", std::move(content)}, {"refusal", nullptr}};
}

Json CompletionLogprobs(const ResponseMeta& meta, std::span<const GeneratedToken> tokens,
                        int64_t* text_offset) {
  Json out = {{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  for (const GeneratedToken& t : tokens) {
    const std::string text = TokenText(meta.tokenizer, t.id);
    out["tokens"].push_back(meta.tokens_as_ids ? TokenText(nullptr, t.id) : text);
    out["token_logprobs"].push_back(Clamp(t.logprob));
    Json top = Json::object();
    for (size_t k = 0; k < t.top.size() && k < static_cast<size_t>(meta.top_logprobs); ++k) {
      const std::string alt = TokenText(Strings(meta), t.top[k].id);
      if (!top.contains(alt)) top[alt] = Clamp(t.top[k].logprob);
    }
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(*text_offset);
    *text_offset += NumChars(text);
  }
  return out;
}

Json LogprobsJson(const ResponseMeta& meta, std::span<const GeneratedToken> tokens,
                  int64_t* text_offset) {
  if (!meta.logprobs) return nullptr;
  return meta.endpoint == Endpoint::kChat ? ChatLogprobs(meta, tokens)
                                          : CompletionLogprobs(meta, tokens, text_offset);
}

Json UsageJson(const Usage& u) {
  Json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.report_speculation) {
    // Tokens committed per verification round (vLLM's mean acceptance length).
    const double mean =
        u.num_drafts > 0 ? 1.0 + static_cast<double>(u.num_accepted_tokens) / u.num_drafts : 0.0;
    j["speculation"] = {{"num_drafts", u.num_drafts},
                        {"num_draft_tokens", u.num_draft_tokens},
                        {"num_accepted_tokens", u.num_accepted_tokens},
                        {"mean_accepted_length", mean}};
    if (!u.by_method.empty()) {
      Json by_method = Json::object();
      for (const RequestUsage::MethodUsage& m : u.by_method) {
        by_method[m.method] = {{"num_drafts", m.num_drafts},
                               {"num_draft_tokens", m.num_draft_tokens},
                               {"num_accepted_tokens", m.num_accepted_tokens}};
      }
      j["speculation"]["by_method"] = std::move(by_method);
    }
    if (u.draft_context_stop > 0) j["speculation"]["draft_context_stop"] = u.draft_context_stop;
    if (u.report_ssd) {
      j["speculation"]["ssd"] = {
          {"cache_hit_drafts", u.num_cache_hit_drafts},
          {"cache_hit_rate",
           u.num_drafts > 0 ? static_cast<double>(u.num_cache_hit_drafts) / u.num_drafts : 0.0},
          {"cache_hit_draft_tokens", u.num_cache_hit_draft_tokens},
          {"cache_hit_accepted_tokens", u.num_cache_hit_accepted_tokens},
          {"cache_miss_drafts", u.num_cache_miss_drafts},
          {"wait_seconds", u.ssd_wait_seconds}};
    }
  }
  return j;
}

Json Envelope(const ResponseMeta& meta, bool chunk) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  const char* object =
      chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return Json{{"id", meta.id},
              {"object", object},
              {"created", meta.created},
              {"model", meta.model},
              {"system_fingerprint", nullptr},
              {"choices", Json::array()}};
}

// One streamed choice; `delta` is the chat delta or the completion text.
std::string ChunkEvent(const ResponseMeta& meta, int32_t index, Json delta, Json logprobs,
                       const char* finish_reason) {
  Json body = Envelope(meta, /*chunk=*/true);
  Json choice = {{"index", index}};
  choice[meta.endpoint == Endpoint::kChat ? "delta" : "text"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason ? Json(finish_reason) : Json(nullptr);
  body["choices"].push_back(std::move(choice));
  if (meta.include_usage) body["usage"] = nullptr;
  return Event(body);
}

}  // namespace

std::string TokenText(const Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return absl::StrCat("token_id:", id);
  const int32_t ids[] = {id};
  absl::StatusOr<std::string> text = tokenizer->Decode(ids, /*skip_special=*/false);
  return text.ok() ? *text : absl::StrCat("token_id:", id);
}

std::vector<uint8_t> TokenBytes(const Tokenizer* tokenizer, int32_t id) {
  const std::string text = TokenText(tokenizer, id);
  std::vector<uint8_t> bytes;
  if (tokenizer != nullptr && text.find("\xEF\xBF\xBD") != std::string::npos) {
    // Part of a multi-byte character: the raw bytes are in the vocabulary piece.
    std::string_view piece = tokenizer->IdToToken(id);
    unsigned byte = 0;
    if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' &&
        std::sscanf(std::string(piece.substr(3, 2)).c_str(), "%2x", &byte) == 1) {
      return {static_cast<uint8_t>(byte)};
    }
    if (ByteLevelBytes(piece, &bytes)) return bytes;
    bytes.clear();
  }
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string FormatResponse(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                           const Usage& usage) {
  Json body = Envelope(meta, /*chunk=*/false);
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    int64_t text_offset = 0;
    Json choice = {{"index", i}};
    if (meta.endpoint == Endpoint::kChat) {
      choice["message"] = {
          {"role", "assistant"}, {"content", c.text}, {"tool_calls", Json::array()}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = LogprobsJson(meta, c.tokens, &text_offset);
    choice["finish_reason"] = FinishReasonName(c.finish_reason);
    body["choices"].push_back(std::move(choice));
  }
  body["usage"] = UsageJson(usage);
  return Dump(body);
}

std::string ContentEvent(const ResponseMeta& meta, int32_t index, std::string_view text,
                         std::span<const GeneratedToken> tokens, int64_t* text_offset) {
  Json delta = meta.endpoint == Endpoint::kChat ? Json{{"content", text}} : Json(text);
  return ChunkEvent(meta, index, std::move(delta), LogprobsJson(meta, tokens, text_offset),
                    nullptr);
}

std::string RoleEvent(const ResponseMeta& meta, int32_t index) {
  return ChunkEvent(meta, index, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
}

std::string FinishEvent(const ResponseMeta& meta, int32_t index, FinishReason reason) {
  Json delta = meta.endpoint == Endpoint::kChat ? Json::object() : Json("");
  return ChunkEvent(meta, index, std::move(delta), nullptr, FinishReasonName(reason));
}

std::string UsageEvent(const ResponseMeta& meta, const Usage& usage) {
  Json body = Envelope(meta, /*chunk=*/true);
  body["usage"] = UsageJson(usage);
  return Event(body);
}

std::string ErrorEvent(const ApiError& error) {
  return absl::StrCat("data: ", ErrorBody(error), "\n\n");
}

std::string DoneEvent() { return "data: [DONE]\n\n"; }

}  // namespace specd::http
