#include "server/http/http_session.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
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
  void SetOnBackpressure(uint64_t seq, std::function<void(bool)> fn) {
    if (Current(seq)) on_backpressure_ = std::move(fn);
  }

 protected:
  // Transport hooks; each completes by calling the matching On* method.
  virtual void ReadHeader() = 0;  // OnHeader
  virtual void ReadBody() = 0;    // OnBody
  virtual void ReadSome() = 0;    // OnReadSome, into buffer_
  virtual void Write() = 0;       // OnWritten, writes some of writing_ from write_offset_
  virtual void SetTimeout(std::optional<Clock::duration> timeout) = 0;
  virtual void ShutdownSend() = 0;
  virtual void CloseSocket() = 0;

  void BeginRead();
  void OnHeader(beast::error_code ec);
  void OnBody(beast::error_code ec);
  void OnReadSome(beast::error_code ec, size_t n);
  void OnWritten(beast::error_code ec, size_t n);

  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string writing_;      // bytes of the write in flight
  size_t write_offset_ = 0;  // of them, already written

 private:
  bool Current(uint64_t seq) const { return seq == seq_ && exchange_open_ && !closed_; }
  void Dispatch();
  void FailRequest(beast::error_code ec);
  void Watch();
  void Enqueue(std::string bytes);
  int64_t PendingBytes() const {
    return static_cast<int64_t>(queued_.size() + writing_.size() - write_offset_);
  }
  void CheckBackpressure();
  void RelieveBackpressure();
  void ArmWriteTimer();
  void OnWriteTimer(beast::error_code ec);
  void EndExchangeCallbacks();
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
  std::function<void(bool)> on_backpressure_;
  bool backpressured_ = false;  // on_backpressure_(true) was the last call
  std::optional<asio::steady_timer> write_timer_;
  bool write_timer_armed_ = false;
  Clock::time_point last_write_progress_;
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
  void OnBackpressure(std::function<void(bool)> fn) override {
    session_->SetOnBackpressure(seq_, std::move(fn));
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
  request.host = std::string(msg[bhttp::field::host]);
  request.content_type = std::string(msg[bhttp::field::content_type]);
  request.content_encoding = std::string(msg[bhttp::field::content_encoding]);
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
  EndExchangeCallbacks();
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
  if (chunked_) {
    char size[20];
    std::snprintf(size, sizeof(size), "%zx\r\n", event.size());
    Enqueue(absl::StrCat(size, event, "\r\n"));
  } else {
    Enqueue(std::move(event));
  }
  CheckBackpressure();
}

void SessionBase::EndEvents(uint64_t seq) {
  if (!Current(seq)) return;
  exchange_open_ = false;
  EndExchangeCallbacks();
  Enqueue(chunked_ ? "0\r\n\r\n" : "");
}

void SessionBase::EndExchangeCallbacks() {
  on_disconnect_ = nullptr;
  on_backpressure_ = nullptr;
  backpressured_ = false;
}

void SessionBase::Enqueue(std::string bytes) {
  queued_ += bytes;
  if (write_pending_ || closed_) return;
  if (queued_.empty()) return ExchangeDone();
  writing_.swap(queued_);
  queued_.clear();
  write_offset_ = 0;
  write_pending_ = true;
  ArmWriteTimer();
  Write();
}

void SessionBase::OnWritten(beast::error_code ec, size_t n) {
  if (ec) {
    write_pending_ = false;
    writing_.clear();
    write_offset_ = 0;
    return ClientGone();
  }
  last_write_progress_ = Clock::now();
  write_offset_ += n;
  if (write_offset_ < writing_.size()) {
    Write();
  } else {
    write_pending_ = false;
    writing_.clear();
    write_offset_ = 0;
  }
  RelieveBackpressure();
  if (!write_pending_) Enqueue("");
}

// The client reads slower than the stream is made: past the cap, pause the producer.
void SessionBase::CheckBackpressure() {
  if (backpressured_ || !on_backpressure_ || PendingBytes() <= context_->max_queued_bytes) return;
  backpressured_ = true;
  SPECD_LOG_DEBUG("HTTP client is not reading ({} bytes queued): pausing its stream",
                  PendingBytes());
  on_backpressure_(true);
}

void SessionBase::RelieveBackpressure() {
  if (!backpressured_ || PendingBytes() >= context_->max_queued_bytes / 4) return;
  backpressured_ = false;
  if (on_backpressure_) on_backpressure_(false);
}

// While a write is pending, the timer checks that some of it was written within the write
// timeout (one timer per connection, re-armed only when it fires).
void SessionBase::ArmWriteTimer() {
  last_write_progress_ = Clock::now();
  if (write_timer_armed_) return;
  if (!write_timer_) write_timer_.emplace(executor());
  write_timer_armed_ = true;
  write_timer_->expires_at(last_write_progress_ + context_->write_timeout);
  write_timer_->async_wait([s = shared_from_this()](beast::error_code ec) { s->OnWriteTimer(ec); });
}

void SessionBase::OnWriteTimer(beast::error_code ec) {
  write_timer_armed_ = false;
  if (ec || closed_ || !write_pending_) return;
  const Clock::time_point due = last_write_progress_ + context_->write_timeout;
  if (Clock::now() < due) {
    write_timer_armed_ = true;
    write_timer_->expires_at(due);
    write_timer_->async_wait(
        [s = shared_from_this()](beast::error_code ec) { s->OnWriteTimer(ec); });
    return;
  }
  SPECD_LOG_INFO("HTTP client read nothing for {} ms ({} bytes queued): closing",
                 context_->write_timeout.count(), PendingBytes());
  ClientGone();
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
  EndExchangeCallbacks();
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
  if (write_timer_) write_timer_->cancel();
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
    stream_.async_write_some(
        asio::buffer(writing_.data() + write_offset_, writing_.size() - write_offset_),
        [s = self()](beast::error_code ec, size_t n) { s->OnWritten(ec, n); });
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
