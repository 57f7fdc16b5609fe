#include "engine/policy/cost_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using nlohmann::json;

constexpr const char* kNames[kNumPolicyMethods] = {"plain", "draft_model", "ngram", "ssd",
                                                   "vegas", "streaming",   "ssv",   "eagle3"};

// The grids of a method's JSON entry, by field name: ReadMethods and ToJson walk this table, so
// a new kind of pass (tree verification) is one more MethodCosts field and one more row here.
struct GridField {
  const char* name;
  std::optional<CostGrid> MethodCosts::*grid;
};
constexpr GridField kGridFields[] = {{"draft", &MethodCosts::draft},
                                     {"verify", &MethodCosts::verify}};
// Only the draft model may draft in parallel (MethodCosts::parallel).
constexpr const char kParallelField[] = "parallel";

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("cost profile: ", path, ": ", what));
}

using Segment = CostGrid::Segment;

// Where x falls on `axis`: the segment [i0, i1] and the fraction t along it (t > 1 past the
// last sample: the last segment extended; t = 0 before the first).
Segment Locate(const std::vector<int32_t>& axis, double x) {
  if (axis.size() == 1 || x <= axis.front()) return {0, 0, 0};
  const auto it = std::upper_bound(axis.begin(), axis.end(), x);
  const size_t i1 = it == axis.end() ? axis.size() - 1 : static_cast<size_t>(it - axis.begin());
  const size_t i0 = i1 - 1;
  return {i0, i1, (x - axis[i0]) / (axis[i1] - axis[i0])};
}

double Lerp(double a, double b, double t) { return a + (b - a) * t; }

absl::Status CheckAxis(const std::string& path, const std::vector<int32_t>& axis) {
  if (axis.empty()) return Bad(path, "must list at least one value");
  for (size_t i = 0; i < axis.size(); ++i) {
    if (axis[i] <= 0) return Bad(absl::StrCat(path, "[", i, "]"), "must be positive");
    if (i > 0 && axis[i] <= axis[i - 1]) {
      return Bad(absl::StrCat(path, "[", i, "]"), "must be greater than the value before it");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ReadAxis(const json& j, const std::string& path) {
  if (!j.is_array()) return Bad(path, "must be an array of positive integers");
  std::vector<int32_t> axis;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer() || j[i].get<int64_t>() <= 0 ||
        j[i].get<int64_t>() > (int64_t{1} << 30)) {
      return Bad(absl::StrCat(path, "[", i, "]"), "must be a positive integer");
    }
    axis.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  return axis;
}

// ms: [batch][tokens][context] nested arrays of the axes' sizes.
absl::StatusOr<std::vector<double>> ReadMs(const json& j, const std::string& path, size_t nb,
                                           size_t nt, size_t nc) {
  static constexpr const char* kPer[] = {"batch size", "tokens value", "context"};
  const size_t sizes[] = {nb, nt, nc};
  std::vector<double> ms;
  // Walk the three levels with an explicit stack of (node, path, level).
  std::vector<std::pair<const json*, std::string>> level = {{&j, path}};
  for (int depth = 0; depth < 3; ++depth) {
    std::vector<std::pair<const json*, std::string>> next;
    for (const auto& [node, p] : level) {
      if (!node->is_array() || node->size() != sizes[depth]) {
        return Bad(
            p, absl::StrCat("expected an array of ", sizes[depth], " (one per ", kPer[depth], ")",
                            node->is_array() ? absl::StrCat(", got ", node->size()) : ""));
      }
      for (size_t i = 0; i < node->size(); ++i) {
        const json& child = (*node)[i];
        const std::string cp = absl::StrCat(p, "[", i, "]");
        if (depth < 2) {
          next.push_back({&child, cp});
        } else if (!child.is_number() || !std::isfinite(child.get<double>()) ||
                   child.get<double>() <= 0) {
          return Bad(cp, "must be a positive number of milliseconds");
        } else {
          ms.push_back(child.get<double>());
        }
      }
    }
    level = std::move(next);
  }
  return ms;
}

absl::Status CheckKeys(const json& j, const std::string& path,
                       const std::vector<const char*>& known) {
  if (!j.is_object()) return Bad(path, "must be an object");
  for (const auto& [key, value] : j.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Bad(path.empty() ? key : absl::StrCat(path, ".", key),
                 absl::StrCat("unknown field (expected one of: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CostGrid> ReadGrid(const json& j, const std::string& path, bool plain) {
  if (absl::Status s = CheckKeys(j, path, {"batch", "tokens", "context", "ms"}); !s.ok()) return s;
  for (const char* field : {"batch", "context", "ms"}) {
    if (!j.contains(field)) return Bad(absl::StrCat(path, ".", field), "is missing");
  }
  auto batch = ReadAxis(j["batch"], path + ".batch");
  if (!batch.ok()) return batch.status();
  std::vector<int32_t> tokens = {1};
  if (j.contains("tokens")) {
    auto t = ReadAxis(j["tokens"], path + ".tokens");
    if (!t.ok()) return t.status();
    tokens = *std::move(t);
  }
  if (plain && tokens != std::vector<int32_t>{1}) {
    return Bad(path + ".tokens", "a plain step runs one token per sequence: must be [1]");
  }
  auto context = ReadAxis(j["context"], path + ".context");
  if (!context.ok()) return context.status();
  for (const auto& [name, axis] :
       {std::pair<const char*, const std::vector<int32_t>*>{"batch", &*batch},
        {"tokens", &tokens},
        {"context", &*context}}) {
    if (absl::Status s = CheckAxis(absl::StrCat(path, ".", name), *axis); !s.ok()) return s;
  }
  auto ms = ReadMs(j["ms"], path + ".ms", batch->size(), tokens.size(), context->size());
  if (!ms.ok()) return ms.status();
  return CostGrid::Create(*std::move(batch), std::move(tokens), *std::move(context),
                          *std::move(ms));
}

json GridToJson(const CostGrid& g) {
  json ms = json::array();
  size_t n = 0;
  for (size_t b = 0; b < g.batch_sizes().size(); ++b) {
    json per_batch = json::array();
    for (size_t t = 0; t < g.tokens().size(); ++t) {
      json per_tokens = json::array();
      for (size_t c = 0; c < g.contexts().size(); ++c) per_tokens.push_back(g.ms()[n++]);
      per_batch.push_back(std::move(per_tokens));
    }
    ms.push_back(std::move(per_batch));
  }
  return json{{"batch", g.batch_sizes()},
              {"tokens", g.tokens()},
              {"context", g.contexts()},
              {"ms", std::move(ms)}};
}

// Line and column (1-based) of byte offset `pos` in `text`.
std::string Where(std::string_view text, size_t pos) {
  pos = std::min(pos, text.size());
  const std::string_view before = text.substr(0, pos);
  const size_t line = 1 + std::count(before.begin(), before.end(), '\n');
  const size_t nl = before.rfind('\n');
  const size_t column = nl == std::string_view::npos ? pos + 1 : pos - nl;
  return absl::StrCat("line ", line, ", column ", column);
}

absl::StatusOr<json> ParseJson(std::string_view text) {
  // nlohmann reports where a syntax error is only through its exception; it stops here.
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost profile: ", Where(text, e.byte == 0 ? 0 : e.byte - 1),
                     ": not valid JSON (", e.what(), ")"));
  }
}

// The speculating methods' names, for errors.
std::string SpeculatingNames() {
  return absl::StrJoin(std::begin(kNames) + 1, std::end(kNames), ", ");
}

absl::StatusOr<MethodCosts> ReadMethod(const json& value, const std::string& path,
                                       PolicyMethod method) {
  std::vector<const char*> known;
  for (const GridField& field : kGridFields) known.push_back(field.name);
  known.push_back(kParallelField);
  if (absl::Status s = CheckKeys(value, path, known); !s.ok()) return s;
  MethodCosts costs;
  for (const GridField& field : kGridFields) {
    if (!value.contains(field.name)) continue;
    auto grid = ReadGrid(value[field.name], absl::StrCat(path, ".", field.name), false);
    if (!grid.ok()) return grid.status();
    costs.*field.grid = *std::move(grid);
  }
  if (value.contains(kParallelField)) {
    const std::string where = absl::StrCat(path, ".", kParallelField);
    if (method != PolicyMethod::kDraftModel) {
      return Bad(where, "only draft_model drafts in parallel (a parallel draft model's entry)");
    }
    if (!value[kParallelField].is_boolean()) return Bad(where, "must be true or false");
    costs.parallel = value[kParallelField].get<bool>();
    if (costs.parallel && !costs.draft) {
      return Bad(where, "a parallel draft model needs its \"draft\" grid (the pass's times)");
    }
  }
  return costs;
}

absl::Status ReadMethods(const json& j, CostProfile* profile) {
  if (!j.is_object()) return Bad("methods", "must be an object keyed by method name");
  for (const auto& [name, value] : j.items()) {
    const std::string path = absl::StrCat("methods.", name);
    auto method = ParsePolicyMethod(name);
    if (!method.ok() || *method == PolicyMethod::kPlain) {
      return Bad(path, absl::StrCat("unknown method (expected ", SpeculatingNames(), ")"));
    }
    auto costs = ReadMethod(value, path, *method);
    if (!costs.ok()) return costs.status();
    profile->SetMethod(*method, *std::move(costs));
  }
  return absl::OkStatus();
}

// "ssv": {"alpha": A, "strategies": {"mode/cC/rR": {"verify": GRID}, ...}}.
absl::Status ReadSsv(const json& j, CostProfile* profile) {
  if (absl::Status s = CheckKeys(j, "ssv", {"alpha", "strategies"}); !s.ok()) return s;
  if (j.contains("alpha")) {
    if (!j["alpha"].is_number() || !(j["alpha"].get<double>() > 0) ||
        !(j["alpha"].get<double>() < 1)) {
      return Bad("ssv.alpha", "must be a number in (0, 1)");
    }
    profile->ssv_alpha = j["alpha"].get<double>();
  }
  if (!j.contains("strategies")) return Bad("ssv.strategies", "is missing");
  const json& list = j["strategies"];
  if (!list.is_object() || list.empty()) {
    return Bad("ssv.strategies", "must be an object keyed by strategy (\"exact/c4/r1\")");
  }
  for (const auto& [name, value] : list.items()) {
    const std::string path = absl::StrCat("ssv.strategies.", name);
    SsvStrategy strategy;
    if (!ParseSsvStrategy(name, &strategy)) {
      return Bad(path, absl::StrCat("not a strategy (mode/cC/rR: mode exact or shared, C in [1, ",
                                    kMaxSsvGroupSize, "], R >= 1)"));
    }
    if (absl::Status s = CheckKeys(value, path, {"verify"}); !s.ok()) return s;
    if (!value.contains("verify")) return Bad(path + ".verify", "is missing");
    auto grid = ReadGrid(value["verify"], path + ".verify", false);
    if (!grid.ok()) return grid.status();
    profile->SetSsv(strategy, *std::move(grid));
  }
  return absl::OkStatus();
}

absl::Status ReadString(const json& j, const char* field, std::string* out) {
  if (!j.contains(field)) return absl::OkStatus();
  if (!j[field].is_string()) return Bad(field, "must be a string");
  *out = j[field].get<std::string>();
  return absl::OkStatus();
}

}  // namespace

const char* PolicyMethodName(PolicyMethod method) {
  const int i = static_cast<int>(method);
  return i >= 0 && i < kNumPolicyMethods ? kNames[i] : "unknown";
}

absl::StatusOr<PolicyMethod> ParsePolicyMethod(std::string_view name) {
  for (int i = 0; i < kNumPolicyMethods; ++i) {
    if (name == kNames[i]) return static_cast<PolicyMethod>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown speculation method \"", std::string(name),
                   "\" (expected one of: ", absl::StrJoin(kNames, ", "), ")"));
}

absl::StatusOr<CostGrid> CostGrid::Create(std::vector<int32_t> batch_sizes,
                                          std::vector<int32_t> tokens,
                                          std::vector<int32_t> contexts, std::vector<double> ms) {
  if (absl::Status s = CheckAxis("batch", batch_sizes); !s.ok()) return s;
  if (absl::Status s = CheckAxis("tokens", tokens); !s.ok()) return s;
  if (absl::Status s = CheckAxis("context", contexts); !s.ok()) return s;
  if (ms.size() != batch_sizes.size() * tokens.size() * contexts.size()) {
    return Bad("ms", absl::StrCat("expected ", batch_sizes.size() * tokens.size() * contexts.size(),
                                  " values ([batch][tokens][context]), got ", ms.size()));
  }
  for (size_t i = 0; i < ms.size(); ++i) {
    if (!std::isfinite(ms[i]) || ms[i] <= 0) {
      return Bad(absl::StrCat("ms[", i, "]"), "must be a positive number of milliseconds");
    }
  }
  CostGrid g;
  g.batch_sizes_ = std::move(batch_sizes);
  g.tokens_ = std::move(tokens);
  g.contexts_ = std::move(contexts);
  g.ms_ = std::move(ms);
  return g;
}

CostGrid CostGrid::Constant(double ms) {
  CostGrid g;
  g.batch_sizes_ = {1};
  g.tokens_ = {1};
  g.contexts_ = {1};
  g.ms_ = {ms};
  return g;
}

double CostGrid::Interpolate(const Segment& b, const Segment& t, const Segment& c) const {
  // Along context, then tokens, then batch; every corner is a measured sample.
  auto along_c = [&](size_t bi, size_t ti) {
    return Lerp(At(bi, ti, c.i0), At(bi, ti, c.i1), c.t);
  };
  auto along_t = [&](size_t bi) { return Lerp(along_c(bi, t.i0), along_c(bi, t.i1), t.t); };
  return Lerp(along_t(b.i0), along_t(b.i1), b.t);
}

double CostGrid::Ms(double batch, double tokens, double context) const {
  const Segment b = Locate(batch_sizes_, batch);
  const Segment t = Locate(tokens_, tokens);
  const Segment c = Locate(contexts_, context);
  const double v = Interpolate(b, t, c);
  if (b.t <= 1 && t.t <= 1 && c.t <= 1) return v;
  // Extended past the last sample: never below the time at the last sample, so a noisy last
  // segment cannot predict a cheaper step for a larger batch or context.
  auto clip = [](Segment s) {
    s.t = std::min(s.t, 1.0);
    return s;
  };
  return std::max(v, Interpolate(clip(b), clip(t), clip(c)));
}

void CostProfile::SetMethod(PolicyMethod method, MethodCosts costs) {
  if (method == PolicyMethod::kPlain) return;
  methods_[static_cast<int>(method)] = std::move(costs);
}

void CostProfile::SetSsv(SsvStrategy strategy, CostGrid verify) {
  for (SsvCosts& c : ssv_) {
    if (c.strategy == strategy) {
      c.verify = std::move(verify);
      return;
    }
  }
  ssv_.push_back({strategy, std::move(verify)});
}

bool CostProfile::Has(PolicyMethod method) const {
  return method == PolicyMethod::kPlain || methods_[static_cast<int>(method)].has_value();
}

const MethodCosts* CostProfile::Costs(PolicyMethod method) const {
  const auto& m = methods_[static_cast<int>(method)];
  return method != PolicyMethod::kPlain && m ? &*m : nullptr;
}

int32_t CostProfile::MaxK(PolicyMethod method) const {
  if (method == PolicyMethod::kPlain || !Has(method)) return 0;
  const MethodCosts& m = *methods_[static_cast<int>(method)];
  const CostGrid* verify = m.verify ? &*m.verify : verify_ ? &*verify_ : nullptr;
  int32_t k = verify ? verify->max_tokens() - 1 : 0;
  if (m.draft) k = std::min(k, m.draft->max_tokens());
  return std::max(k, 0);
}

double CostProfile::VerifyMs(PolicyMethod method, double batch, double tokens,
                             double context) const {
  const auto& m = methods_[static_cast<int>(method)];
  if (m && m->verify) return m->verify->Ms(batch, tokens, context);
  double ms = verify_ ? verify_->Ms(batch, tokens, context) : tokens * PlainMs(batch, context);
  for (const SsvCosts& c : ssv_) {
    if (!c.strategy.lossy()) ms = std::min(ms, c.verify.Ms(batch, tokens, context));
  }
  return ms;
}

double CostProfile::DraftMs(PolicyMethod method, double batch, double k, double context) const {
  const auto& m = methods_[static_cast<int>(method)];
  if (k <= 0 || !m || !m->draft) return 0;
  return m->draft->Ms(batch, k, context);
}

double CostProfile::CatchUpMsPerToken(PolicyMethod method, double context) const {
  const auto& m = methods_[static_cast<int>(method)];
  if (!m || !m->draft) return 0;
  const double batch = m->draft->batch_sizes().back();
  return m->draft->Ms(batch, 1, context) / batch;
}

absl::StatusOr<CostProfile> CostProfile::FromJson(std::string_view text) {
  auto parsed = ParseJson(text);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  if (absl::Status s = CheckKeys(
          j, "", {"version", "device", "models", "plain", "verify", "methods", "ssv", "calibrate"});
      !s.ok()) {
    return s;
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1) {
    return Bad("version", "must be 1");
  }
  if (!j.contains("plain")) return Bad("plain", "is missing");
  auto plain = ReadGrid(j["plain"], "plain", true);
  if (!plain.ok()) return plain.status();
  CostProfile profile(*std::move(plain));
  if (absl::Status s = ReadString(j, "device", &profile.device); !s.ok()) return s;
  if (absl::Status s = ReadString(j, "models", &profile.models); !s.ok()) return s;
  if (j.contains("calibrate")) {
    if (!j["calibrate"].is_boolean()) return Bad("calibrate", "must be true or false");
    profile.calibrate = j["calibrate"].get<bool>();
  }
  if (j.contains("verify")) {
    auto verify = ReadGrid(j["verify"], "verify", false);
    if (!verify.ok()) return verify.status();
    profile.SetVerify(*std::move(verify));
  }
  if (j.contains("methods")) {
    if (absl::Status s = ReadMethods(j["methods"], &profile); !s.ok()) return s;
  }
  if (j.contains("ssv")) {
    if (absl::Status s = ReadSsv(j["ssv"], &profile); !s.ok()) return s;
  }
  for (PolicyMethod m : kAllPolicyMethods) {
    const auto& costs = profile.methods_[static_cast<int>(m)];
    if (costs && !costs->verify && !profile.verify_) {
      return Bad(absl::StrCat("methods.", PolicyMethodName(m), ".verify"),
                 "is missing and the profile has no dense \"verify\" grid");
    }
  }
  return profile;
}

std::string CostProfile::ToJson() const {
  json j = {{"version", 1}, {"device", device}, {"models", models}, {"plain", GridToJson(plain_)}};
  if (!calibrate) j["calibrate"] = false;
  if (verify_) j["verify"] = GridToJson(*verify_);
  json methods = json::object();
  for (PolicyMethod m : kAllPolicyMethods) {
    const auto& costs = methods_[static_cast<int>(m)];
    if (!costs) continue;
    json entry = json::object();
    for (const GridField& field : kGridFields) {
      if (const auto& grid = (*costs).*field.grid) entry[field.name] = GridToJson(*grid);
    }
    if (costs->parallel) entry[kParallelField] = true;
    methods[PolicyMethodName(m)] = std::move(entry);
  }
  j["methods"] = std::move(methods);
  if (!ssv_.empty()) {
    json strategies = json::object();
    for (const SsvCosts& c : ssv_) {
      strategies[SsvStrategyName(c.strategy)] = {{"verify", GridToJson(c.verify)}};
    }
    j["ssv"] = {{"alpha", ssv_alpha}, {"strategies", std::move(strategies)}};
  }
  return j.dump(1);
}

absl::StatusOr<CostProfile> CostProfile::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cost profile: cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto profile = FromJson(text.str());
  if (!profile.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", profile.status().message()));
  }
  return profile;
}

absl::Status CostProfile::Save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << ToJson() << "\n";
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cost profile: cannot write ", path));
  return absl::OkStatus();
}

}  // namespace specd
