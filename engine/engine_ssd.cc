// SSD in the engine (docs/architecture.md "SSD"): the verifier's SsdSpeculator, created with the
// engine when --speculative-config says method ssd, and the body of the `specd speculator`
// process it launches (RunSpeculatorProcess). Everything the speculator must share with the
// verifier (the draft's settings, the batch and context limits, the device) reaches it in the
// SsdInit after the authenticated handshake (engine/speculation/ssd/ssd_init.h); its command line
// names only the verifier's address, and the link's secret travels in its environment.
#include <csignal>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/distributed/link_auth.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/model/eagle3_head.h"
#include "engine/speculation/ssd/ssd_process.h"
#include "engine/speculation/ssd/ssd_speculator.h"
#include "engine/step/speculator_set.h"

namespace specd {

absl::Status CaptureForSsdHead(const SpeculativeConfig& spec, const ModelConfig& target,
                               RunnerOptions* runner) {
  const std::string file = spec.eagle3_model + "/config.json";
  absl::StatusOr<Eagle3Config> head;
  if (absl::StatusOr<std::string> text = ReadFileToString(file); text.ok()) {
    head = ParseEagle3Config(*text, file, target);
  } else {
    head = text.status();
  }
  if (!head.ok()) {
    return absl::Status(head.status().code(),
                        absl::StrCat("--speculative-config: the SSD speculator's EAGLE-3 head: ",
                                     head.status().message()));
  }
  runner->capture_hidden_layers = head->aux_layer_ids;
  return absl::OkStatus();
}

absl::Status Engine::CreateSsd(const RunnerOptions& target) {
  const SpeculativeConfig& spec = options_.speculative;
  SsdSpeculatorOptions o;
  o.config = spec;
  o.vocab_size = runner_->config().vocab_size;
  o.max_num_seqs = options_.max_num_seqs;
  o.max_model_len = max_model_len_;
  o.max_num_batched_tokens = options_.max_num_batched_tokens;
  o.target_device = target.device;
  o.device = spec.speculator_device.empty() ? target.device : spec.speculator_device;
  o.num_threads = target.num_threads;
  o.block_size = target.block_size;
  o.load_format = target.load_format;  // as an in-process draft inherits it
  o.gpu_memory_utilization = spec.ssd.gpu_memory_utilization > 0 ? spec.ssd.gpu_memory_utilization
                                                                 : target.gpu_memory_utilization;
  if (HeadDraftsInSsdSpeculator(spec)) {
    // The head reads the target's embedding and shapes, and rows of its layers' hidden states.
    o.target_model = options_.model_dir;
    o.hidden_width =
        static_cast<int32_t>(target.capture_hidden_layers.size()) * runner_->config().hidden_size;
  }
  absl::StatusOr<std::unique_ptr<SsdSpeculator>> ssd = SsdSpeculator::Create(o);
  if (!ssd.ok()) {
    return absl::Status(ssd.status().code(), absl::StrCat("ssd: ", ssd.status().message()));
  }
  speculators_->set_ssd(*std::move(ssd));
  SPECD_LOG_INFO("engine: SSD speculator with {} {} on {} (K {}, fan-out {} {}, backup {})",
                 o.hidden_width > 0 ? "EAGLE-3 head" : "draft",
                 o.hidden_width > 0 ? spec.eagle3_model : spec.draft_model, o.device,
                 spec.num_speculative_tokens, spec.ssd.fan_out,
                 spec.ssd.geometric_fan_out ? "geometric" : "constant", spec.ssd.backup);
  return absl::OkStatus();
}

namespace {

// The link secret of this speculator process: the one its verifier launched it with (taken out
// of the environment at once), else --speculator-secret-file, else a $SPECD_SPECULATOR_SECRET
// set by hand.
absl::StatusOr<LinkSecret> SpeculatorSecret(const SpeculatorProcessOptions& options) {
  absl::StatusOr<LinkSecret> from_env = TakeLinkSecretFromEnv();
  if (from_env.ok() || !absl::IsNotFound(from_env.status())) return from_env;
  if (!options.secret_file.empty()) return ReadLinkSecretFile(options.secret_file);
  return absl::FailedPreconditionError(absl::StrCat(
      "the speculator needs the link secret: --speculator-secret-file FILE (mode 0600) or $",
      kLinkSecretEnv, " (a verifier that launches its speculator sets it)"));
}

}  // namespace

absl::Status RunSpeculatorProcess(const SpeculatorProcessOptions& options) {
  SsdProcessOptions p;
  SPECD_ASSIGN_OR_RETURN(p.secret, SpeculatorSecret(options));
  p.connect = options.connect;
  p.connect_timeout = options.connect_timeout;
  p.reconnect = options.reconnect;
  p.tls = TlsFiles{options.tls_cert, options.tls_key, options.tls_ca};
  p.device = options.device;
  p.num_threads = options.num_threads;
  std::signal(SIGPIPE, SIG_IGN);
  SPECD_LOG_INFO("ssd speculator: connecting to {}", options.connect);
  return RunSsdSpeculator(p);
}

}  // namespace specd
