// The speculator process's joins (ssd_process.h).
#include "engine/speculation/ssd/ssd_process.h"

#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/distributed/nccl_channel.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/ssd/ssd_init.h"
#include "engine/speculation/ssd/ssd_protocol.h"
#include "engine/speculation/ssd/ssd_worker.h"

namespace specd {
namespace {

// How long the verifier may take to send its SsdInit after the handshake (it sends it at once).
constexpr absl::Duration kInitWait = absl::Seconds(30);
// Pause before joining again after a failed init: the same init would fail the same way at once.
constexpr absl::Duration kRejoinAfterFailedInit = absl::Seconds(2);
// How long joining the device data path's NCCL link may take (its first init loads NCCL).
constexpr absl::Duration kBulkLinkWait = absl::Seconds(60);

// The process's state across joins: the worker and the init its draft was loaded for.
class SpeculatorProcess {
 public:
  explicit SpeculatorProcess(const SsdProcessOptions& options) : options_(options) {}

  // One join: connect, init, serve until the verifier leaves.
  absl::Status JoinAndServe();
  // Whether the last join failed at its init.
  bool init_failed() const { return init_failed_; }

 private:
  absl::StatusOr<std::unique_ptr<TcpChannel>> Connect();
  // The verifier's init with this process's overrides.
  SsdInit Overridden(SsdInit init) const;
  // A worker for `init`: the current one when it was loaded for an equal init, else a new one.
  absl::Status Load(const SsdInit& init);

  const SsdProcessOptions& options_;
  std::unique_ptr<SsdWorker> worker_;
  SsdInit loaded_for_;
  bool init_failed_ = false;
};

absl::StatusOr<std::unique_ptr<TcpChannel>> SpeculatorProcess::Connect() {
  const std::string& address = options_.connect;
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port == 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--connect '", address, "' is not HOST:PORT"));
  }
  ConnectOptions connect;
  connect.timeout = options_.connect_timeout;
  if (options_.tls.enabled()) {
    SPECD_ASSIGN_OR_RETURN(connect.tls,
                           TlsContext::Create(options_.tls, TlsContext::Side::kClient));
  }
  SPECD_ASSIGN_OR_RETURN(
      std::unique_ptr<TcpChannel> channel,
      TcpChannel::Connect(address.substr(0, colon), static_cast<uint16_t>(port),
                          SsdHello(Role::kSpeculator), options_.secret, connect));
  SPECD_LOG_INFO("ssd speculator: joined the verifier at {}", address);
  return channel;
}

SsdInit SpeculatorProcess::Overridden(SsdInit init) const {
  if (!options_.device.empty()) init.device = options_.device;
  if (options_.num_threads >= 0) init.num_threads = static_cast<uint32_t>(options_.num_threads);
  return init;
}

absl::Status SpeculatorProcess::Load(const SsdInit& init) {
  if (worker_ != nullptr && init == loaded_for_) return absl::OkStatus();
  worker_.reset();  // its memory goes before the next draft loads
  SPECD_ASSIGN_OR_RETURN(const SsdWorkerOptions w, SsdWorkerOptionsFrom(init));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<SsdWorker> worker, SsdWorker::Create(w));
  if (worker->vocab_size() != static_cast<int32_t>(init.vocab_size)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the draft ", init.draft_model, " has ", worker->vocab_size(), " token ids, the target ",
        init.vocab_size, ": the draft must propose the target's ids"));
  }
  SPECD_LOG_INFO("ssd speculator: draft {} on {} (K {}, fan-out {}, backup {})", init.draft_model,
                 worker->draft_device(), init.num_speculative_tokens, init.fan_out, init.backup);
  worker_ = std::move(worker);
  loaded_for_ = init;
  return absl::OkStatus();
}

absl::Status SpeculatorProcess::JoinAndServe() {
  init_failed_ = false;
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<TcpChannel> channel, Connect());
  absl::StatusOr<SsdInit> init = ReceiveSsdInit(*channel, kInitWait);
  absl::Status loaded = init.ok() ? Load(Overridden(*init)) : init.status();
  // The verifier sends its first round once it has our SsdReady: the limits change before.
  if (loaded.ok()) loaded = channel->SetLimits(SsdInitLimits(*init));
  SsdReady ready;
  ready.ok = loaded.ok();
  int32_t bulk_device = -1;  // the draft's GPU when the device data path is taken
  if (ready.ok) {
    ready.device = worker_->draft_device().substr(0, kMaxTextBytes);
    absl::StatusOr<DeviceChoice> device = ParseDevice(Overridden(*init).device);
    if (init->bulk_link && NcclChannel::Available() && device.ok() && device->cuda &&
        (worker_->keeps_rows_on_device() || worker_->reads_hidden_on_device())) {
      ready.bulk_link = true;
      bulk_device = device->index;
    }
  } else {
    ready.reason = std::string(loaded.message()).substr(0, kMaxTextBytes);
  }
  // After a malformed SsdInit the channel is closed and nothing goes out: the verifier sees it.
  const absl::Status answered = channel->Send(ready, absl::Seconds(10));
  if (!loaded.ok()) {
    init_failed_ = true;
    return loaded;
  }
  SPECD_RETURN_IF_ERROR(answered);
  // The device data path: both ends join its NCCL link before the first round (a failure here
  // makes the verifier offer it no more: the next join sends q rows inline).
  std::unique_ptr<NcclChannel> bulk;
  if (ready.bulk_link) {
    absl::StatusOr<std::unique_ptr<NcclChannel>> link =
        NcclChannel::Create(*channel, Role::kSpeculator, bulk_device, kBulkLinkWait);
    if (!link.ok()) {
      return absl::Status(link.status().code(),
                          absl::StrCat("the device data path: ", link.status().message()));
    }
    bulk = *std::move(link);
  }
  worker_->DropAll();  // a verifier that just joined knows none of our sequences
  const absl::Status served = worker_->ServeChannel(*channel, bulk.get());
  // Whatever ended the link, the verifier is gone from it: nothing to finalize together.
  if (bulk != nullptr) bulk->Abort();
  return served;
}

}  // namespace

absl::Status RunSsdSpeculator(const SsdProcessOptions& options) {
  SpeculatorProcess process(options);
  for (;;) {
    const absl::Status s = process.JoinAndServe();
    if (s.ok() || !options.reconnect) return s;
    SPECD_LOG_WARN("ssd speculator: {}; connecting again", s.ToString());
    if (process.init_failed()) absl::SleepFor(kRejoinAfterFailedInit);
  }
}

}  // namespace specd
