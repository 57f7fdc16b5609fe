#include "server/http/http_server.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "server/http/http_session.h"

namespace specd::http {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using tcp = asio::ip::tcp;

absl::StatusOr<std::unique_ptr<asio::ssl::context>> MakeTls(const HttpServerOptions& o) {
  auto tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1);
  error_code ec;
  tls->use_certificate_chain_file(o.tls_cert_file, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ssl-certfile ", o.tls_cert_file, ": ", ec.message()));
  }
  tls->use_private_key_file(o.tls_key_file, asio::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ssl-keyfile ", o.tls_key_file, ": ", ec.message()));
  }
  return tls;
}

class HttpServerImpl final : public HttpServer {
 public:
  HttpServerImpl(Router* router, Metrics* metrics)
      : acceptor_(asio::make_strand(ioc_)), retry_timer_(acceptor_.get_executor()) {
    context_.router = router;
    context_.metrics = metrics;
  }
  ~HttpServerImpl() override { Shutdown(absl::ZeroDuration()); }

  absl::Status Init(const HttpServerOptions& options);
  int32_t port() const override { return port_; }
  void Shutdown(absl::Duration grace) override;

 private:
  absl::Status Bind(const std::string& host, int32_t port);
  void Accept();

  // Declared before ioc_: sessions destroyed with the io_context still use them.
  SessionContext context_;
  std::unique_ptr<asio::ssl::context> tls_;
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{ioc_.get_executor()};
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  std::vector<std::thread> threads_;
  int32_t port_ = 0;
  bool stopped_ = false;
};

absl::Status HttpServerImpl::Init(const HttpServerOptions& options) {
  context_.max_body_bytes = options.max_body_bytes;
  context_.max_queued_bytes = options.max_queued_bytes;
  context_.write_timeout = absl::ToChronoMilliseconds(options.write_timeout);
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    SPECD_ASSIGN_OR_RETURN(tls_, MakeTls(options));
  }
  SPECD_RETURN_IF_ERROR(Bind(options.host, options.port));
  Accept();
  const int32_t n = std::max(1, options.num_io_threads);
  for (int32_t i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
  return absl::OkStatus();
}

absl::Status HttpServerImpl::Bind(const std::string& host, int32_t port) {
  error_code ec;
  tcp::resolver resolver(ioc_);
  auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--host ", host, ": ", ec.message()));
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  auto fail = [&](const char* what) {
    return absl::UnavailableError(
        absl::StrCat("HTTP ", what, " ", host, ":", port, " failed: ", ec.message()));
  };
  if (acceptor_.open(endpoint.protocol(), ec); ec) return fail("open");
  if (acceptor_.set_option(asio::socket_base::reuse_address(true), ec); ec)
    return fail("setsockopt");
  if (acceptor_.bind(endpoint, ec); ec) return fail("bind");
  if (acceptor_.listen(asio::socket_base::max_listen_connections, ec); ec) return fail("listen");
  port_ = acceptor_.local_endpoint(ec).port();
  return absl::OkStatus();
}

void HttpServerImpl::Accept() {
  acceptor_.async_accept(asio::make_strand(ioc_), [this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      StartSession(std::move(socket), tls_.get(), &context_);
      return Accept();
    }
    // E.g. out of file descriptors: back off instead of spinning.
    SPECD_LOG_WARN("HTTP accept failed: {}", ec.message());
    retry_timer_.expires_after(std::chrono::milliseconds(100));
    retry_timer_.async_wait([this](error_code wait_ec) {
      if (!wait_ec) Accept();
    });
  });
}

void HttpServerImpl::Shutdown(absl::Duration grace) {
  if (stopped_) return;
  stopped_ = true;
  asio::post(acceptor_.get_executor(), [this] {
    error_code ec;
    acceptor_.close(ec);
    retry_timer_.cancel();
  });
  const absl::Time deadline = absl::Now() + grace;
  while (context_.num_open_exchanges.load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  work_.reset();
  ioc_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              Router* router, Metrics* metrics) {
  auto server = std::make_unique<HttpServerImpl>(router, metrics);
  SPECD_RETURN_IF_ERROR(server->Init(options));
  return server;
}

}  // namespace specd::http
