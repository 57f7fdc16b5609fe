// HTTP/1.1 connections on Boost.Beast, plain or TLS: reads requests (100-continue,
// body limit -> 413), hands them to the Router as Exchanges, writes whole replies or
// chunked server-sent events, keeps connections alive, and watches the socket while a
// request is in flight so that a client that leaves is noticed at once (its exchange's
// OnDisconnect runs). Bytes queued for a client that does not read are capped: past the cap
// the exchange's OnBackpressure pauses its producer, and a client that reads nothing for the
// write timeout is closed. One strand per connection; no thread per connection.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <memory>

namespace specd {
class Metrics;
}  // namespace specd

namespace specd::http {

class Router;

// What every session of a server shares; outlives them.
struct SessionContext {
  Router* router = nullptr;
  Metrics* metrics = nullptr;  // may be null
  int64_t max_body_bytes = 8 << 20;
  // Bytes queued for one connection past which its event stream is paused (resumed below a
  // quarter of it). A whole reply may exceed it once; it is written, not split.
  int64_t max_queued_bytes = int64_t{4} << 20;
  // A connection whose pending write makes no progress this long is closed (its request
  // aborted).
  std::chrono::milliseconds write_timeout{60'000};
  std::atomic<int64_t> num_open_exchanges{0};  // requests being answered right now
};

// Starts serving an accepted socket (whose executor is a strand) until the client or the
// server closes it. tls: null for plain HTTP.
void StartSession(boost::asio::ip::tcp::socket socket, boost::asio::ssl::context* tls,
                  SessionContext* context);

}  // namespace specd::http
