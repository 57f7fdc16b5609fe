// The SSD link's init exchange (ssd_init.h).
#include "engine/speculation/ssd/ssd_init.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/distributed/nccl_channel.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/ssd/ssd_protocol.h"

namespace specd {
namespace {

// How often OfferSsdInit asks whether to give up while the speculator loads its draft.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(100);

absl::Status InitFieldError(const char* field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("SsdInit.", field, ": ", problem));
}

// The values SsdInit's decoder leaves to the speculation's own rules.
absl::Status CheckSpeculation(const SsdInit& init) {
  if (init.draft_model.empty() && init.eagle3_head.empty()) {
    return InitFieldError("draft_model", "empty, and no eagle3_head: nothing to draft with");
  }
  if (!init.eagle3_head.empty() && (init.target_model.empty() || init.hidden_width == 0)) {
    return InitFieldError("target_model", "an EAGLE-3 head needs the target's directory and width");
  }
  if (init.num_speculative_tokens < 1 || init.num_speculative_tokens > kMaxSpeculativeTokens) {
    return InitFieldError(
        "num_speculative_tokens",
        absl::StrCat(init.num_speculative_tokens, " outside [1, ", kMaxSpeculativeTokens, "]"));
  }
  if (init.fan_out < 1 || init.fan_out > 64) {
    return InitFieldError("fan_out", absl::StrCat(init.fan_out, " outside [1, 64]"));
  }
  if (init.prompt_lookup_min < 1 || init.prompt_lookup_min > init.prompt_lookup_max) {
    return InitFieldError("prompt_lookup_min",
                          absl::StrCat(init.prompt_lookup_min, " outside [1, prompt_lookup_max ",
                                       init.prompt_lookup_max, "]"));
  }
  if (init.backup != "ngram" && init.backup != "random") {
    return InitFieldError("backup", absl::StrCat("\"", init.backup, "\" is not ngram or random"));
  }
  if (const absl::Status s = SsdInitLimits(init).Validate(); !s.ok()) {
    return InitFieldError("limits", std::string(s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

SsdInit MakeSsdInit(const SsdSpeculatorOptions& o) {
  const SpeculativeConfig& c = o.config;
  SsdInit init;
  init.vocab_size = static_cast<uint32_t>(o.vocab_size);
  init.max_num_seqs = static_cast<uint32_t>(o.max_num_seqs);
  init.max_model_len = static_cast<uint32_t>(o.max_model_len);
  init.max_num_batched_tokens = static_cast<uint32_t>(o.max_num_batched_tokens);
  init.draft_model = c.draft_model;
  init.device = o.device;
  init.num_threads = static_cast<uint32_t>(std::max(0, o.num_threads));
  init.block_size = static_cast<uint32_t>(o.block_size);
  init.load_format = o.load_format;
  init.gpu_memory_utilization = o.gpu_memory_utilization;
  init.draft_kv_cache_bytes = static_cast<uint64_t>(std::max<int64_t>(0, c.draft_kv_cache_bytes));
  init.num_speculative_tokens = static_cast<uint32_t>(c.num_speculative_tokens);
  init.prompt_lookup_min = static_cast<uint32_t>(c.prompt_lookup_min);
  init.prompt_lookup_max = static_cast<uint32_t>(c.prompt_lookup_max);
  init.fan_out = static_cast<uint32_t>(c.ssd.fan_out);
  init.geometric_fan_out = c.ssd.geometric_fan_out;
  init.critical_batch_size = static_cast<uint32_t>(c.ssd.critical_batch_size);
  init.backup = c.ssd.backup;
  init.complete_cache = c.ssd.complete_cache;
  init.parallel_drafting = c.parallel_drafting;
  init.time_budget = c.ssd.time_budget;
  init.cache_offers = c.ssd.cache_offers;
  // The device data path: offered when the target's GPU can join an NCCL link with the
  // speculator's, which must be another GPU (NCCL takes one rank per device).
  const absl::StatusOr<DeviceChoice> target = ParseDevice(o.target_device);
  const absl::StatusOr<DeviceChoice> draft = ParseDevice(o.device);
  const bool same_gpu =
      target.ok() && draft.ok() && target->cuda && draft->cuda && target->index == draft->index;
  init.bulk_link = c.ssd.device_data_path && NcclChannel::Available() && target.ok() &&
                   target->cuda && !same_gpu;
  if (c.ssd.eagle3_drafter) {
    init.eagle3_head = c.eagle3_model;
    init.target_model = o.target_model;
    init.hidden_width = static_cast<uint32_t>(std::max(0, o.hidden_width));
  }
  init.replay_file = c.replay.file;
  init.replay_alpha = c.replay.alpha;
  init.replay_candidate_hit = c.replay.candidate_hit;
  init.replay_seed = c.replay.seed;
  return init;
}

WireLimits SsdInitLimits(const SsdInit& init) {
  return SsdWireLimits(
      static_cast<int32_t>(init.vocab_size), static_cast<int32_t>(init.max_num_seqs),
      static_cast<int32_t>(init.max_model_len), static_cast<int32_t>(init.hidden_width));
}

absl::StatusOr<SsdWorkerOptions> SsdWorkerOptionsFrom(const SsdInit& init) {
  SPECD_RETURN_IF_ERROR(CheckSpeculation(init));
  SsdWorkerOptions w;
  SpeculativeConfig& c = w.config;
  c.method = SpeculationMethod::kSsd;
  c.draft_model = init.draft_model;
  c.num_speculative_tokens = static_cast<int32_t>(init.num_speculative_tokens);
  c.prompt_lookup_min = static_cast<int32_t>(init.prompt_lookup_min);
  c.prompt_lookup_max = static_cast<int32_t>(init.prompt_lookup_max);
  c.draft_kv_cache_bytes = static_cast<int64_t>(init.draft_kv_cache_bytes);
  c.speculator_device = init.device;
  c.ssd.fan_out = static_cast<int32_t>(init.fan_out);
  c.ssd.geometric_fan_out = init.geometric_fan_out;
  c.ssd.critical_batch_size = static_cast<int32_t>(init.critical_batch_size);
  c.ssd.backup = init.backup;
  c.ssd.complete_cache = init.complete_cache;
  c.parallel_drafting = init.parallel_drafting;
  c.ssd.time_budget = init.time_budget;
  c.ssd.cache_offers = init.cache_offers;
  c.eagle3_model = init.eagle3_head;
  c.ssd.eagle3_drafter = !init.eagle3_head.empty();
  w.target_model = init.target_model;
  w.hidden_width = static_cast<int32_t>(init.hidden_width);
  w.vocab_size = static_cast<int32_t>(init.vocab_size);
  c.ssd.gpu_memory_utilization = init.gpu_memory_utilization;
  c.replay.file = init.replay_file;
  c.replay.alpha = init.replay_alpha;
  c.replay.candidate_hit = init.replay_candidate_hit;
  c.replay.seed = init.replay_seed;
  RunnerOptions& r = w.draft;  // model_dir: SsdWorker::Create takes config.draft_model
  r.device = init.device;
  r.load_format = init.load_format;
  r.num_threads = static_cast<int32_t>(init.num_threads);
  r.max_model_len = static_cast<int32_t>(init.max_model_len);
  r.block_size = static_cast<int32_t>(init.block_size);
  r.kv_cache_bytes = c.draft_kv_cache_bytes;
  r.gpu_memory_utilization = init.gpu_memory_utilization;
  r.max_num_seqs = static_cast<int32_t>(init.max_num_seqs);
  r.max_num_batched_tokens = static_cast<int32_t>(init.max_num_batched_tokens);
  w.max_num_seqs = r.max_num_seqs;
  w.max_model_len = r.max_model_len;
  return w;
}

absl::Status OfferSsdInit(TcpChannel& channel, const SsdInit& init, absl::Duration timeout,
                          const std::function<bool()>& cancelled, SsdReady* answer) {
  SPECD_RETURN_IF_ERROR(channel.Send(init, absl::Seconds(10)));
  const absl::Time deadline = absl::Now() + timeout;
  Message message;
  for (;;) {
    if (cancelled && cancelled()) return absl::CancelledError("ssd: init given up");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("the speculator sent no SsdReady within ", absl::FormatDuration(timeout)));
    }
    absl::StatusOr<MessageType> type = channel.Recv(std::min(left, kCancelPoll), &message);
    if (!type.ok()) {
      if (absl::IsDeadlineExceeded(type.status())) continue;
      return type.status();
    }
    if (*type == MessageType::kHeartbeat) continue;
    if (const SsdReady* ready = std::get_if<SsdReady>(&message)) {
      if (answer != nullptr) *answer = *ready;
      if (ready->bulk_link && !init.bulk_link) {
        return absl::InvalidArgumentError("its SsdReady takes a device data path not offered");
      }
      if (!ready->ok) {
        return absl::FailedPreconditionError(absl::StrCat("its SsdReady says: ", ready->reason));
      }
      return channel.SetLimits(SsdInitLimits(init));
    }
    if (const Shutdown* s = std::get_if<Shutdown>(&message)) {
      return absl::UnavailableError(absl::StrCat("the speculator shut down: ", s->reason));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("expected SsdReady, got ", DistView(MessageTypeName(*type))));
  }
}

absl::StatusOr<SsdInit> ReceiveSsdInit(Channel& channel, absl::Duration timeout) {
  Message message;
  absl::StatusOr<MessageType> type = channel.Recv(timeout, &message);
  if (!type.ok()) {
    return absl::Status(type.status().code(), absl::StrCat("waiting for the verifier's SsdInit: ",
                                                           type.status().message()));
  }
  if (const SsdInit* init = std::get_if<SsdInit>(&message)) return *init;
  if (const Shutdown* s = std::get_if<Shutdown>(&message)) {
    return absl::UnavailableError(absl::StrCat("the verifier shut down: ", s->reason));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected the verifier's SsdInit, got ", DistView(MessageTypeName(*type))));
}

}  // namespace specd
