// One /v1/completions or /v1/chat/completions request in flight: submits its n x prompts
// engine requests, turns the engine's per-request outputs into one OpenAI response or an
// SSE stream of chunks (pausing its engine requests while the client does not read), and
// aborts every engine request at once when the client leaves or reads nothing for the
// connection's write timeout.
// Threads: Start and all handling run on the exchange's strand; engine callbacks (engine
// thread) only Post onto it.
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "server/http/exchange.h"
#include "server/http/openai_api.h"
#include "server/http/openai_format.h"

namespace specd {
class Engine;
}  // namespace specd

namespace specd::http {

// Submits and answers through `exchange`. The engine must outlive every callback (the
// server stops the engine before its I/O threads). timeout: per-request deadline
// (absl::InfiniteDuration() for none).
void StartGeneration(Engine* engine, GenerationSpec spec, ResponseMeta meta,
                     std::shared_ptr<Exchange> exchange, absl::Duration timeout);

}  // namespace specd::http
