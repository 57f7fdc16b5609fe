// The SSD link's init exchange (docs/architecture.md "SSD"), as TpInit is the tensor-parallel
// group's: right after the authenticated Hello the verifier sends an SsdInit with everything the
// speculator must share with it (the vocabulary, the batch and context limits, the draft's fields
// of the speculative config, the draft's device and runner as the verifier chose them), and the
// speculator answers SsdReady once its draft is loaded, or with why it could not start. Both ends
// shake hands under SsdHandshakeLimits() and then switch the channel to SsdInitLimits(init).
// Pure functions, but for the exchange's two halves, which block on their channel; any thread.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/channel.h"
#include "engine/distributed/messages.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/speculation/ssd/ssd_speculator.h"
#include "engine/speculation/ssd/ssd_worker.h"

namespace specd {

// The verifier's settings for its speculator, as the message.
SsdInit MakeSsdInit(const SsdSpeculatorOptions& o);

// The limits both ends use once the init is done: SsdWireLimits of its vocabulary and limits.
WireLimits SsdInitLimits(const SsdInit& init);

// What the speculator's SsdWorker runs with. InvalidArgument naming the SsdInit field for values
// a verifier could not have sent (K outside [1, kMaxSpeculativeTokens], a fan-out outside
// [1, 64], lookup lengths out of order, an unknown backup, no draft, limits that do not
// Validate()).
absl::StatusOr<SsdWorkerOptions> SsdWorkerOptionsFrom(const SsdInit& init);

// The verifier's half, on a freshly admitted channel: sends `init` and waits up to `timeout` for
// the speculator's SsdReady (its draft loads meanwhile; `cancelled`, when given, is asked about
// every 100 ms), then switches the channel to SsdInitLimits(init). FailedPrecondition with the
// speculator's reason when it could not start; Cancelled; DeadlineExceeded; the channel's error
// when it broke or the peer sent something else. The channel is unusable after an error. The
// SsdReady goes to `ready` when given (whether the speculator took the device data path).
absl::Status OfferSsdInit(TcpChannel& channel, const SsdInit& init, absl::Duration timeout,
                          const std::function<bool()>& cancelled = {}, SsdReady* ready = nullptr);

// The speculator's half: the verifier's SsdInit, waiting up to `timeout`. Errors say what came
// instead (a malformed or oversized SsdInit: the decoder's error naming the field; a Shutdown:
// Unavailable), prefixed with what was awaited.
absl::StatusOr<SsdInit> ReceiveSsdInit(Channel& channel, absl::Duration timeout);

}  // namespace specd
