// One HTTP request's way back to its client, as handlers see it: a whole reply, or a
// stream of server-sent events. Sessions (http_session.h) implement it over a socket;
// handlers (router.h, generation.h) never see Beast. An exchange ends with Reply() or
// EndEvents(); calls after that, or after the client left, do nothing.
// Threads: Post() from any thread; everything else on the session's strand (where the
// handler was called and where Post() runs its function).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace specd::http {

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void Reply(HttpReply reply) = 0;
  // 200 text/event-stream; then SendEvent() with "data: ...\n\n" strings; EndEvents().
  virtual void BeginEvents() = 0;
  virtual void SendEvent(std::string event) = 0;
  virtual void EndEvents() = 0;
  // Runs fn on the session's strand (any thread). Dropped if the server stopped.
  virtual void Post(std::function<void()> fn) = 0;
  // fn runs on the strand if the client disconnects before the exchange ended.
  virtual void OnDisconnect(std::function<void()> fn) = 0;
  // Event streams' flow control: fn(true) runs on the strand when more bytes wait for the
  // client than the connection's cap (it stopped reading), fn(false) once they drained below
  // a quarter of it; the handler pauses its producers in between. A client that reads nothing
  // for the write timeout is treated as gone (OnDisconnect). Default: no flow control.
  virtual void OnBackpressure(std::function<void(bool paused)> /*fn*/) {}
};

// A JSON reply.
HttpReply JsonReply(int status, std::string body);
// The OpenAI error reply for a non-OK status (errors.h's table), Retry-After included.
HttpReply ErrorReply(const absl::Status& status);

}  // namespace specd::http
