// HTTP/1.1 connections on Boost.Beast, plain or TLS: reads requests (100-continue,
// body limit -> 413), hands them to the Router as Exchanges, writes whole replies or
// chunked server-sent events, keeps connections alive, and watches the socket while a
// request is in flight so that a client that leaves is noticed at once (its exchange's
// OnDisconnect runs). One strand per connection; no thread per connection.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
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
  std::atomic<int64_t> num_open_exchanges{0};  // requests being answered right now
};

// Starts serving an accepted socket (whose executor is a strand) until the client or the
// server closes it. tls: null for plain HTTP.
void StartSession(boost::asio::ip::tcp::socket socket, boost::asio::ssl::context* tls,
                  SessionContext* context);

}  // namespace specd::http
