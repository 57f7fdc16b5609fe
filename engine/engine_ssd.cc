// SSD in the engine (docs/architecture.md "SSD"): the verifier's SsdSpeculator, created with the
// engine when --speculative-config says method ssd, and the body of the `specd speculator`
// process it launches (RunSpeculatorProcess). The speculator process gets everything that must
// match the verifier on its command line: the speculative config as JSON, the batch and context
// limits (the wire limits both ends build from them must agree) and the device; the link's
// secret travels in its environment, never on the command line.
#include <csignal>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/distributed/link_auth.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/speculation/ssd/ssd_speculator.h"
#include "engine/speculation/ssd/ssd_worker.h"
#include "engine/step/speculator_set.h"

namespace specd {

absl::Status Engine::CreateSsd(const RunnerOptions& target) {
  const SpeculativeConfig& spec = options_.speculative;
  SsdSpeculatorOptions o;
  o.config = spec;
  o.vocab_size = runner_->config().vocab_size;
  o.max_num_seqs = options_.max_num_seqs;
  o.max_model_len = max_model_len_;
  const std::string device =
      spec.speculator_device.empty() ? target.device : spec.speculator_device;
  o.launch_args = {
      "--speculative-config",
      SpeculativeConfigToJson(spec),
      "--device",
      device,
      "--threads",
      absl::StrCat(target.num_threads),
      "--block-size",
      absl::StrCat(target.block_size),
      "--max-num-seqs",
      absl::StrCat(options_.max_num_seqs),
      "--max-model-len",
      absl::StrCat(max_model_len_),
      "--max-num-batched-tokens",
      absl::StrCat(options_.max_num_batched_tokens),
      "--gpu-memory-utilization",
      absl::StrCat(spec.ssd.gpu_memory_utilization > 0 ? spec.ssd.gpu_memory_utilization
                                                       : target.gpu_memory_utilization),
      "--load-format",
      target.load_format};  // as an in-process draft inherits it
  absl::StatusOr<std::unique_ptr<SsdSpeculator>> ssd = SsdSpeculator::Create(o);
  if (!ssd.ok()) {
    return absl::Status(ssd.status().code(), absl::StrCat("ssd: ", ssd.status().message()));
  }
  speculators_->set_ssd(*std::move(ssd));
  SPECD_LOG_INFO("engine: SSD speculator with draft {} on {} (K {}, fan-out {} {}, backup {})",
                 spec.draft_model, device, spec.num_speculative_tokens, spec.ssd.fan_out,
                 spec.ssd.geometric_fan_out ? "geometric" : "constant", spec.ssd.backup);
  return absl::OkStatus();
}

namespace {

// The link secret of this speculator process: the one its verifier launched it with (taken out
// of the environment at once), else the secret file (--speculator-secret-file, else the
// config's speculator_secret_file), else a $SPECD_SPECULATOR_SECRET set by hand.
absl::StatusOr<LinkSecret> SpeculatorSecret(const SpeculatorProcessOptions& options) {
  absl::StatusOr<LinkSecret> from_env = TakeLinkSecretFromEnv();
  if (from_env.ok() || !absl::IsNotFound(from_env.status())) return from_env;
  const std::string& file =
      !options.secret_file.empty() ? options.secret_file : options.speculative.ssd.secret_file;
  if (!file.empty()) return ReadLinkSecretFile(file);
  return absl::FailedPreconditionError(absl::StrCat(
      "the speculator needs the link secret: --speculator-secret-file FILE (mode 0600) or $",
      kLinkSecretEnv, " (a verifier that launches its speculator sets it)"));
}

}  // namespace

absl::Status RunSpeculatorProcess(const SpeculatorProcessOptions& options) {
  SsdWorkerOptions w;
  SPECD_ASSIGN_OR_RETURN(w.link_secret, SpeculatorSecret(options));
  w.config = options.speculative;
  static_cast<DeviceOptions&>(w.draft) = options;
  static_cast<BatchLimits&>(w.draft) = options;
  w.draft.kv_cache_bytes = options.speculative.draft_kv_cache_bytes;
  w.max_num_seqs = options.max_num_seqs;
  w.max_model_len = options.max_model_len;
  std::signal(SIGPIPE, SIG_IGN);
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<SsdWorker> worker, SsdWorker::Create(w));
  SPECD_LOG_INFO("ssd speculator: draft {} on {}, connecting to {}",
                 options.speculative.draft_model, options.device, options.connect);
  for (;;) {
    const absl::Status s = worker->Serve(options.connect, options.connect_timeout);
    if (s.ok() || !options.reconnect) return s;
    SPECD_LOG_WARN("ssd speculator: {}; connecting again", s.ToString());
  }
}

}  // namespace specd
