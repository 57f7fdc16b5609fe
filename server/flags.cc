#include "server/flags.h"

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
      if (std::holds_alternative<bool*>(it->second.target)) {
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

void AddTensorParallelFlags(FlagParser& p, int32_t* size, int32_t* nnodes, int32_t* node_rank,
                            std::string* master_addr, int32_t* master_port,
                            std::string* secret_file, double* timeout_s,
                            std::string* communicator) {
  if (size != nullptr) {
    p.Add("tensor-parallel-size", size,
          "ranks the target is split over, one process each (default 1; alias -tp)");
    p.Alias("tp", "tensor-parallel-size");
  }
  if (nnodes != nullptr) p.Add("nnodes", nnodes, "hosts of the tensor-parallel group (default 1)");
  if (node_rank != nullptr)
    p.Add("node-rank", node_rank, "this host's index in the group (0..nnodes-1)");
  if (master_addr != nullptr) {
    p.Add("master-addr", master_addr,
          "rank 0's address, where workers connect (default 127.0.0.1)");
  }
  if (master_port != nullptr) {
    p.Add("master-port", master_port, "rank 0's rendezvous port (0 = a free one; one host only)");
  }
  if (secret_file != nullptr) {
    p.Add("tp-secret-file", secret_file,
          "several hosts: the group's secret, 64 hex digits, mode 0600, the same on every host");
  }
  if (timeout_s != nullptr) {
    p.Add("tp-timeout", timeout_s,
          "seconds a silent rank or a stuck collective may take before the group fails (60)");
  }
  if (communicator != nullptr) {
    p.Add("tp-communicator", communicator, "auto (GPUs: nccl, CPUs: shm) | nccl | shm");
  }
}

absl::Status CheckTensorParallelFlags(int32_t size, int32_t nnodes, int32_t node_rank,
                                      int32_t master_port, double timeout_s,
                                      const std::string& communicator) {
  if (size < 1 || size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel-size: ", size, " is outside [1, 1024]"));
  }
  if (nnodes < 1 || size % nnodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes: ", nnodes, " does not divide --tensor-parallel-size ", size));
  }
  if (node_rank < 0 || node_rank >= nnodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node-rank: ", node_rank, " is outside [0, ", nnodes, ")"));
  }
  if (master_port < 0 || master_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--master-port: ", master_port));
  }
  if (!(timeout_s > 0)) return absl::InvalidArgumentError("--tp-timeout: must be positive");
  if (communicator != "auto" && communicator != "nccl" && communicator != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp-communicator: '", communicator, "' is not one of auto, nccl, shm"));
  }
  return absl::OkStatus();
}

}  // namespace specd
