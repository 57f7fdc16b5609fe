#include "server/flags.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specd {

void FlagParser::Add(const std::string& name, std::string* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, std::optional<std::string>* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, int32_t* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, std::optional<int64_t>* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, int64_t* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, double* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, float* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, bool* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, absl::Duration* out, std::string help) {
  flags_[name] = {out, std::move(help)};
}
void FlagParser::Add(const std::string& name, Negated out, std::string help) {
  flags_[name] = {out, std::move(help)};
}

absl::Status FlagParser::Set(const std::string& name, Flag& flag, const std::string& value) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": bad value '", value, "'"));
  };
  struct Visitor {
    const std::string& value;
    bool operator()(std::string* p) const { return *p = value, true; }
    bool operator()(std::optional<std::string>* p) const { return *p = value, true; }
    bool operator()(int32_t* p) const { return absl::SimpleAtoi(value, p); }
    bool operator()(std::optional<int64_t>* p) const {
      int64_t v;
      if (!absl::SimpleAtoi(value, &v)) return false;
      *p = v;
      return true;
    }
    bool operator()(int64_t* p) const { return absl::SimpleAtoi(value, p); }
    bool operator()(float* p) const { return absl::SimpleAtof(value, p); }
    bool operator()(double* p) const { return absl::SimpleAtod(value, p); }
    bool operator()(bool* p) const { return absl::SimpleAtob(value, p); }
    bool operator()(absl::Duration* p) const {
      double seconds;
      if (!absl::SimpleAtod(value, &seconds) || std::isnan(seconds)) return false;
      *p = absl::Seconds(seconds);  // +-inf: +-InfiniteDuration
      return true;
    }
    bool operator()(Negated n) const {
      bool v;
      if (!absl::SimpleAtob(value, &v)) return false;
      *n.out = !v;
      return true;
    }
  };
  return std::visit(Visitor{value}, flag.target) ? absl::OkStatus() : bad();
}

void FlagParser::Alias(const std::string& short_name, const std::string& name) {
  aliases_[short_name] = name;
}

absl::Status FlagParser::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg.rfind("--", 0) != 0 && arg.size() > 1 && arg[0] == '-') {
      const std::string short_name = arg.substr(1, arg.find('=') - 1);
      if (auto a = aliases_.find(short_name); a != aliases_.end()) {
        arg = absl::StrCat("--", a->second, arg.substr(1 + short_name.size()));
      }
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end())
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!has_value) {
      if (std::holds_alternative<bool*>(it->second.target) ||
          std::holds_alternative<Negated>(it->second.target)) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    if (auto s = Set(name, it->second, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagParser::Usage() const {
  std::string out;
  for (const auto& [name, flag] : flags_)
    absl::StrAppend(&out, "  --", name, "  ", flag.help, "\n");
  return out;
}

absl::Status ParseIdList(const std::string& text, std::vector<int32_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id) || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad token id '", part, "'"));
    }
    out->push_back(id);
  }
  if (out->empty()) return absl::InvalidArgumentError("empty token id list");
  return absl::OkStatus();
}

}  // namespace specd
