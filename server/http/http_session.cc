#include "server/http/http_session.h"

#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "server/http/errors.h"
#include "server/http/exchange.h"
#include "server/http/router.h"
#include "server/metrics.h"

namespace specd::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Clock = std::chrono::steady_clock;

constexpr auto kIdleTimeout = std::chrono::seconds(75);       // keep-alive, header, body
constexpr auto kHandshakeTimeout = std::chrono::seconds(30);  // TLS
constexpr auto kLingerTimeout = std::chrono::seconds(2);      // draining after "close"
constexpr uint32_t kHeaderLimit = 64 * 1024;
constexpr size_t kReadChunk = 4096;

std::string ReplyBytes(const HttpReply& r, bool keep_alive) {
  std::string out = absl::StrCat(
      "HTTP/1.1 ", r.status, " ",
      std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(r.status))),
      "\r\nServer: specd\r\nContent-Type: ", r.content_type, "\r\nContent-Length: ", r.body.size(),
      "\r\nConnection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  for (const auto& [name, value] : r.headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
  absl::StrAppend(&out, "\r\n", r.body);
  return out;
}

// The stream-independent part of a connection: request/exchange state machine and the
// write queue. Transport hooks are implemented per stream type below. Strand only.
class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  explicit SessionBase(SessionContext* context) : context_(context) {}
  virtual ~SessionBase() {
    if (in_exchange_) context_->num_open_exchanges.fetch_sub(1);
  }

  virtual asio::any_io_executor executor() = 0;

  // Exchange calls (seq: the request they belong to; stale ones are ignored).
  void Reply(uint64_t seq, HttpReply reply);
  void BeginEvents(uint64_t seq);
  void SendEvent(uint64_t seq, std::string event);
  void EndEvents(uint64_t seq);
  void SetOnDisconnect(uint64_t seq, std::function<void()> fn) {
    if (Current(seq)) on_disconnect_ = std::move(fn);
  }

 protected:
  // Transport hooks; each completes by calling the matching On* method.
  virtual void ReadHeader() = 0;  // OnHeader
  virtual void ReadBody() = 0;    // OnBody
  virtual void ReadSome() = 0;    // OnReadSome, into buffer_
  virtual void Write() = 0;       // OnWritten, writes writing_
  virtual void SetTimeout(std::optional<Clock::duration> timeout) = 0;
  virtual void ShutdownSend() = 0;
  virtual void CloseSocket() = 0;

  void BeginRead();
  void OnHeader(beast::error_code ec);
  void OnBody(beast::error_code ec);
  void OnReadSome(beast::error_code ec, size_t n);
  void OnWritten(beast::error_code ec);

  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string writing_;  // bytes of the write in flight

 private:
  bool Current(uint64_t seq) const { return seq == seq_ && exchange_open_ && !closed_; }
  void Dispatch();
  void FailRequest(beast::error_code ec);
  void Watch();
  void Enqueue(std::string bytes);
  void ExchangeDone();
  void ClientGone();
  void CloseGracefully();
  void Close();

  SessionContext* context_;
  uint64_t seq_ = 0;
  bool in_exchange_ = false;    // a request is being answered (until its bytes are written)
  bool exchange_open_ = false;  // its handler may still write
  bool keep_alive_ = true;
  bool chunked_ = false;
  bool watching_ = false;  // a ReadSome is pending
  bool resume_read_ = false;
  bool lingering_ = false;
  bool closed_ = false;
  bool write_pending_ = false;
  std::string queued_;
  std::function<void()> on_disconnect_;
};

class SessionExchange : public Exchange {
 public:
  SessionExchange(std::shared_ptr<SessionBase> session, uint64_t seq)
      : session_(std::move(session)), seq_(seq) {}
  void Reply(HttpReply reply) override { session_->Reply(seq_, std::move(reply)); }
  void BeginEvents() override { session_->BeginEvents(seq_); }
  void SendEvent(std::string event) override { session_->SendEvent(seq_, std::move(event)); }
  void EndEvents() override { session_->EndEvents(seq_); }
  void Post(std::function<void()> fn) override {
    asio::post(session_->executor(), [session = session_, fn = std::move(fn)] { fn(); });
  }
  void OnDisconnect(std::function<void()> fn) override {
    session_->SetOnDisconnect(seq_, std::move(fn));
  }

 private:
  std::shared_ptr<SessionBase> session_;
  uint64_t seq_;
};

void SessionBase::BeginRead() {
  SetTimeout(kIdleTimeout);
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(static_cast<uint64_t>(context_->max_body_bytes));
  ReadHeader();
}

void SessionBase::OnHeader(beast::error_code ec) {
  if (ec) return FailRequest(ec);
  auto expect = parser_->get().find(bhttp::field::expect);
  if (expect != parser_->get().end() && beast::iequals(expect->value(), "100-continue")) {
    Enqueue("HTTP/1.1 100 Continue\r\n\r\n");
  }
  if (parser_->is_done()) return Dispatch();
  ReadBody();
}

void SessionBase::OnBody(beast::error_code ec) {
  if (ec) return FailRequest(ec);
  Dispatch();
}

void SessionBase::FailRequest(beast::error_code ec) {
  absl::Status status;
  if (ec == bhttp::error::body_limit) {
    status =
        WithHttpStatus(absl::InvalidArgumentError(absl::StrCat("request body is larger than ",
                                                               context_->max_body_bytes, " bytes")),
                       413);
  } else if (ec == bhttp::error::header_limit) {
    status = WithHttpStatus(absl::InvalidArgumentError("request headers are too large"), 431);
  } else if (ec.category() == beast::error_code(bhttp::error::bad_method).category() &&
             ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
    status = absl::InvalidArgumentError(absl::StrCat("malformed HTTP request: ", ec.message()));
  } else {
    return Close();  // the client went away or timed out
  }
  keep_alive_ = false;
  ++seq_;
  in_exchange_ = exchange_open_ = true;
  context_->num_open_exchanges.fetch_add(1);
  Reply(seq_, ErrorReply(status));
}

void SessionBase::Dispatch() {
  bhttp::request<bhttp::string_body> msg = parser_->release();
  HttpRequest request;
  request.method = std::string(msg.method_string());
  request.target = std::string(msg.target());
  request.authorization = std::string(msg[bhttp::field::authorization]);
  request.body = std::move(msg.body());
  keep_alive_ = msg.keep_alive();
  chunked_ = msg.version() >= 11;
  ++seq_;
  in_exchange_ = exchange_open_ = true;
  context_->num_open_exchanges.fetch_add(1);
  SetTimeout(std::nullopt);
  // Our code reports errors as statuses; this only catches a throwing library (JSON,
  // allocation) so that one request fails with a 500 instead of the process.
  try {
    context_->router->Handle(request, std::make_shared<SessionExchange>(shared_from_this(), seq_));
  } catch (const std::exception& e) {
    SPECD_LOG_ERROR("{} {}: unexpected exception: {}", request.method, request.target, e.what());
    Reply(seq_, ErrorReply(absl::InternalError("internal error")));
  }
  // Watch for a hang-up while the answer is being made. Bytes already buffered are a
  // pipelined request: then only a failed write reveals a client that left.
  if (exchange_open_ && !watching_ && buffer_.size() == 0) Watch();
}

void SessionBase::Watch() {
  if (closed_) return;
  watching_ = true;
  ReadSome();
}

void SessionBase::OnReadSome(beast::error_code ec, size_t n) {
  watching_ = false;
  if (ec) return in_exchange_ ? ClientGone() : Close();
  buffer_.commit(n);
  if (lingering_) {
    buffer_.consume(buffer_.size());
    return Watch();
  }
  if (resume_read_) {
    resume_read_ = false;
    return BeginRead();
  }
  // Bytes of a pipelined request: kept for BeginRead once this exchange is done.
}

void SessionBase::Reply(uint64_t seq, HttpReply reply) {
  if (!Current(seq)) return;
  exchange_open_ = false;
  on_disconnect_ = nullptr;
  if (context_->metrics) context_->metrics->OnHttpResponse(reply.status);
  if (reply.status == 413 || reply.status == 431) keep_alive_ = false;
  Enqueue(ReplyBytes(reply, keep_alive_));
}

void SessionBase::BeginEvents(uint64_t seq) {
  if (!Current(seq)) return;
  if (context_->metrics) context_->metrics->OnHttpResponse(200);
  if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the stream is the close
  Enqueue(absl::StrCat("HTTP/1.1 200 OK\r\nServer: specd\r\nContent-Type: text/event-stream\r\n",
                       "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n",
                       chunked_ ? "Transfer-Encoding: chunked\r\n" : "",
                       "Connection: ", keep_alive_ ? "keep-alive" : "close", "\r\n\r\n"));
}

void SessionBase::SendEvent(uint64_t seq, std::string event) {
  if (!Current(seq) || event.empty()) return;
  if (!chunked_) return Enqueue(std::move(event));
  char size[20];
  std::snprintf(size, sizeof(size), "%zx\r\n", event.size());
  Enqueue(absl::StrCat(size, event, "\r\n"));
}

void SessionBase::EndEvents(uint64_t seq) {
  if (!Current(seq)) return;
  exchange_open_ = false;
  on_disconnect_ = nullptr;
  Enqueue(chunked_ ? "0\r\n\r\n" : "");
}

void SessionBase::Enqueue(std::string bytes) {
  queued_ += bytes;
  if (write_pending_ || closed_) return;
  if (queued_.empty()) return ExchangeDone();
  writing_.swap(queued_);
  queued_.clear();
  write_pending_ = true;
  Write();
}

void SessionBase::OnWritten(beast::error_code ec) {
  write_pending_ = false;
  writing_.clear();
  if (ec) return ClientGone();
  Enqueue("");
}

// Called when nothing is left to write: the answer is complete once the handler is done.
void SessionBase::ExchangeDone() {
  if (!in_exchange_ || exchange_open_) return;
  in_exchange_ = false;
  context_->num_open_exchanges.fetch_sub(1);
  if (!keep_alive_) return CloseGracefully();
  if (watching_) {
    resume_read_ = true;  // the pending read becomes the start of the next request
    SetTimeout(kIdleTimeout);
    return;
  }
  BeginRead();
}

void SessionBase::ClientGone() {
  if (std::function<void()> fn = std::move(on_disconnect_); fn && exchange_open_) fn();
  on_disconnect_ = nullptr;
  Close();
}

// Half-close, then read and drop what the client still sends, so that our last reply is
// not lost to a TCP reset (e.g. a 413 sent before the body arrived).
void SessionBase::CloseGracefully() {
  ShutdownSend();
  lingering_ = true;
  SetTimeout(kLingerTimeout);
  if (!watching_) Watch();
}

void SessionBase::Close() {
  if (closed_) return;
  closed_ = true;
  exchange_open_ = false;
  if (in_exchange_) {
    in_exchange_ = false;
    context_->num_open_exchanges.fetch_sub(1);
  }
  CloseSocket();
}

template <typename Stream>
class Session final : public SessionBase {
 public:
  template <typename... Args>
  Session(SessionContext* context, Args&&... args)
      : SessionBase(context), stream_(std::forward<Args>(args)...) {}

  void Start();
  asio::any_io_executor executor() override { return stream_.get_executor(); }

 private:
  std::shared_ptr<Session> self() { return std::static_pointer_cast<Session>(shared_from_this()); }
  beast::tcp_stream& tcp() { return beast::get_lowest_layer(stream_); }

  void ReadHeader() override {
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [s = self()](beast::error_code ec, size_t) { s->OnHeader(ec); });
  }
  void ReadBody() override {
    bhttp::async_read(stream_, buffer_, *parser_,
                      [s = self()](beast::error_code ec, size_t) { s->OnBody(ec); });
  }
  void ReadSome() override {
    stream_.async_read_some(buffer_.prepare(kReadChunk),
                            [s = self()](beast::error_code ec, size_t n) { s->OnReadSome(ec, n); });
  }
  void Write() override {
    asio::async_write(stream_, asio::buffer(writing_),
                      [s = self()](beast::error_code ec, size_t) { s->OnWritten(ec); });
  }
  void SetTimeout(std::optional<Clock::duration> timeout) override {
    if (timeout) {
      tcp().expires_after(*timeout);
    } else {
      tcp().expires_never();
    }
  }
  void ShutdownSend() override {
    beast::error_code ec;
    tcp().socket().shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  }
  void CloseSocket() override {
    beast::error_code ec;
    tcp().socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    tcp().close();
  }

  Stream stream_;
};

template <>
void Session<beast::tcp_stream>::Start() {
  BeginRead();
}

template <>
void Session<beast::ssl_stream<beast::tcp_stream>>::Start() {
  SetTimeout(kHandshakeTimeout);
  stream_.async_handshake(asio::ssl::stream_base::server, [s = self()](beast::error_code ec) {
    if (ec) {
      SPECD_LOG_DEBUG("TLS handshake failed: {}", ec.message());
      return s->CloseSocket();
    }
    s->BeginRead();
  });
}

}  // namespace

void StartSession(asio::ip::tcp::socket socket, asio::ssl::context* tls, SessionContext* context) {
  if (tls == nullptr) {
    std::make_shared<Session<beast::tcp_stream>>(context, std::move(socket))->Start();
  } else {
    std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(context, std::move(socket),
                                                                    *tls)
        ->Start();
  }
}

}  // namespace specd::http
