#include "server/serve.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/tokenizer/jinja/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/http_server.h"
#include "server/http/router.h"
#include "server/metrics.h"
#include "server/serve_options.h"
#ifdef SPECD_HAVE_GRPC
#include "server/grpc/grpc_front_end.h"
#endif

namespace specd {
namespace {

#ifndef SPECD_VERSION
#define SPECD_VERSION "dev"
#endif

// Time the HTTP front end gets after the engine stopped to flush the last bytes.
constexpr absl::Duration kFlushGrace = absl::Seconds(5);

int32_t NumIoThreads() {
  const int32_t cores = static_cast<int32_t>(std::thread::hardware_concurrency());
  return std::clamp(cores / 8, 2, 4);
}

// SIGINT / SIGTERM write their number into a pipe that the main thread reads. A handler
// (rather than blocking the signals and sigwait) also covers threads that libraries start
// before main, e.g. OpenBLAS's pool, which would otherwise take the default action and kill
// the process.
int g_signal_pipe[2] = {-1, -1};

extern "C" void OnShutdownSignal(int sig) {
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &byte, 1);
}

absl::Status InstallShutdownSignals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  struct sigaction action = {};
  action.sa_handler = OnShutdownSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGTERM, &action, nullptr) != 0 || sigaction(SIGINT, &action, nullptr) != 0) {
    return absl::InternalError("sigaction failed");
  }
  return absl::OkStatus();
}

// Blocks until SIGINT or SIGTERM arrived (possibly already, while loading): its number; or until
// `failed()` (checked every 200 ms) says the engine cannot go on: 0.
int WaitForShutdownSignal(const std::function<bool()>& failed) {
  for (;;) {
    // poll() first: ThreadSanitizer runs a signal's handler only at an interceptor it treats
    // as blocking (poll is one, read is not), so a TSan build blocked in read() never wakes.
    pollfd readable = {g_signal_pipe[0], POLLIN, 0};
    const int ready = poll(&readable, 1, 200);
    if (ready < 0 && errno != EINTR) return SIGTERM;
    if (ready == 0) {
      if (failed()) return 0;
      continue;
    }
    char byte = 0;
    const ssize_t n = read(g_signal_pipe[0], &byte, 1);
    if (n == 1) return byte;
    if (n < 0 && errno == EINTR) continue;
    return SIGTERM;  // the pipe broke: shut down rather than spin
  }
}

http::ModelContext MakeModelContext(const ServeOptions& o, const Engine& engine,
                                    const ChatTemplate* chat_template) {
  http::ModelContext c;
  c.served_model_name = o.served_model_name;
  c.tokenizer = engine.tokenizer();
  c.chat_template = chat_template;
  c.max_model_len = engine.max_model_len();
  c.vocab_size = c.tokenizer ? c.tokenizer->vocab_size() : std::numeric_limits<int32_t>::max();
  c.speculative = engine.speculative_config();
  c.allow_special_tokens_in_content = o.allow_special_tokens_in_content;
  return c;
}

std::optional<ChatTemplate> LoadChatTemplate(const Engine& engine) {
  const Tokenizer* tok = engine.tokenizer();
  if (tok == nullptr || tok->chat_template().empty()) {
    SPECD_LOG_WARN("the model has no chat template: /v1/chat/completions will answer 400");
    return std::nullopt;
  }
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(tok->chat_template());
  if (!t.ok()) {
    SPECD_LOG_WARN("the model's chat template does not parse ({}): chat is off",
                   t.status().ToString());
    return std::nullopt;
  }
  return *std::move(t);
}

std::string Address(const std::string& host, int32_t port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

// The running daemon. Members are declared so that destruction is safe bottom-up: the
// gRPC front end, then the engine (its callbacks hold HTTP sessions), then the HTTP server,
// then what the router points at; the destructor stops HTTP before the engine goes.
class ServeProcess {
 public:
  explicit ServeProcess(ServeOptions options)
      : o_(std::move(options)),
        metrics_(std::make_shared<Metrics>()),
        router_(MakeRouterOptions(o_), metrics_.get()) {}
  ~ServeProcess() {
    router_.StopWorkers();  // they use the engine's tokenizer and the served model
    if (http_) http_->Shutdown(absl::ZeroDuration());
  }

  absl::Status StartHttp();
  absl::Status StartEngine();
  absl::Status StartGrpc();
  // Opens the API and prints the line scripts wait for.
  void Announce();
  void Drain(int sig);
  // Whether the engine failed for good (a tensor-parallel rank lost), and the shutdown then.
  bool EngineFailed() const;
  absl::Status Fail();

 private:
  static http::RouterOptions MakeRouterOptions(const ServeOptions& o) {
    http::RouterOptions r;
    r.api_key = o.api_key;
    if (o.request_timeout_s > 0) r.request_timeout = absl::Seconds(o.request_timeout_s);
    for (absl::string_view host : absl::StrSplit(o.allowed_hosts, ',', absl::SkipWhitespace())) {
      r.allowed_hosts.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(host)));
    }
    r.num_workers = o.api_worker_threads;
    return r;
  }

  const ServeOptions o_;
  std::shared_ptr<Metrics> metrics_;
  http::Router router_;
  std::optional<ChatTemplate> chat_template_;
  http::ServedModel served_;
  std::unique_ptr<http::HttpServer> http_;
  std::unique_ptr<Engine> engine_;
  std::string grpc_address_ = "off";
#ifdef SPECD_HAVE_GRPC
  std::unique_ptr<GrpcFrontEnd> grpc_;
#endif
};

// HTTP first, so that /health answers and /ready says 503 while the model loads.
absl::Status ServeProcess::StartHttp() {
  http::HttpServerOptions h;
  h.host = o_.host;
  h.port = o_.port;
  h.tls_cert_file = o_.ssl_certfile;
  h.tls_key_file = o_.ssl_keyfile;
  h.max_body_bytes = o_.max_request_body_bytes;
  h.write_timeout = absl::Seconds(o_.write_timeout_s);
  h.num_io_threads = NumIoThreads();
  SPECD_ASSIGN_OR_RETURN(http_, http::HttpServer::Start(h, &router_, metrics_.get()));
  SPECD_LOG_INFO("HTTP bound on {}; loading {}", Address(o_.host, http_->port()), o_.model);
  return absl::OkStatus();
}

absl::Status ServeProcess::StartEngine() {
  EngineOptions options = ToEngineOptions(o_);
  options.observer = metrics_;
  SPECD_ASSIGN_OR_RETURN(engine_, Engine::Create(options));
  SPECD_RETURN_IF_ERROR(engine_->Start());
  chat_template_ = LoadChatTemplate(*engine_);
  served_.engine = engine_.get();
  served_.context = MakeModelContext(o_, *engine_, chat_template_ ? &*chat_template_ : nullptr);
  served_.root = o_.model;
  served_.created = absl::ToUnixSeconds(absl::Now());
  return absl::OkStatus();
}

absl::Status ServeProcess::StartGrpc() {
  if (o_.grpc_port < 0) return absl::OkStatus();
#ifdef SPECD_HAVE_GRPC
  GrpcFrontEndOptions g;
  g.host = o_.host;
  g.port = o_.grpc_port;
  g.api_key = o_.api_key;
  g.tls_cert_file = o_.ssl_certfile;
  g.tls_key_file = o_.ssl_keyfile;
  g.served_model_name = o_.served_model_name;
  g.version = SPECD_VERSION;
  g.model_dir = o_.model;
  g.write_timeout = absl::Seconds(o_.write_timeout_s);
  SPECD_ASSIGN_OR_RETURN(grpc_, GrpcFrontEnd::Start(engine_.get(), g));
  grpc_address_ = Address(o_.host, grpc_->port());
#else
  SPECD_LOG_WARN("built without gRPC: --grpc-port is ignored");
#endif
  return absl::OkStatus();
}

void ServeProcess::Announce() {
  router_.SetModel(&served_);
  std::fprintf(stderr, "specd: listening http=%s grpc=%s model=%s\n",
               Address(o_.host, http_->port()).c_str(), grpc_address_.c_str(),
               o_.served_model_name.c_str());
  std::fflush(stderr);
}

// How long a failed engine gets to end its requests before the process exits anyway.
constexpr absl::Duration kFailStopGrace = absl::Seconds(15);

bool ServeProcess::EngineFailed() const { return engine_->Stats().failed; }

// The tensor-parallel group lost a rank: readiness fails, the engine has ended every request
// with the group's error (it refuses new ones), the front ends flush and close, and specd exits
// non-zero so that the orchestrator restarts the group.
absl::Status ServeProcess::Fail() {
  const std::string why = engine_->Stats().failure;
  SPECD_LOG_ERROR("engine failed: {}; shutting down", why);
  router_.SetDraining();
#ifdef SPECD_HAVE_GRPC
  if (grpc_) grpc_->SetServing(false);
#endif
  // The engine thread ends every request with the group's error. After a rank died it may also
  // be stuck in a device wait that only the communicator's abort releases, so Stop gets a
  // deadline.
  std::atomic<bool> stopped{false};
  std::thread stopper([this, &stopped] {
    engine_->Stop();
    stopped = true;
  });
  const absl::Time deadline = absl::Now() + kFailStopGrace;
  while (!stopped && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  http_->Shutdown(kFlushGrace);
#ifdef SPECD_HAVE_GRPC
  if (grpc_) grpc_->Shutdown(absl::Now() + kFlushGrace);
#endif
  if (stopped) {
    stopper.join();
  } else {
    SPECD_LOG_ERROR("the engine did not stop within {}s; exiting anyway",
                    absl::ToInt64Seconds(kFailStopGrace));
    stopper.detach();
  }
  // Exit without destructors: tearing the device down after a failed group can wait forever.
  std::fprintf(stderr, "specd serve: error: %s\n", why.c_str());
  std::fflush(nullptr);
  std::_Exit(1);
}

// Readiness fails and new requests get 503 at once; in-flight requests get up to the drain
// timeout; then the engine stops (aborting what is left) and both front ends flush and close.
void ServeProcess::Drain(int sig) {
  SPECD_LOG_INFO("signal {}: draining (up to {}s)", sig, o_.drain_timeout_s);
  router_.SetDraining();
#ifdef SPECD_HAVE_GRPC
  if (grpc_) grpc_->SetServing(false);
#endif
  engine_->BeginDrain();
  if (!engine_->WaitIdle(absl::Seconds(o_.drain_timeout_s))) {
    SPECD_LOG_WARN("drain timeout: aborting the requests still running");
  }
  engine_->Stop();
  http_->Shutdown(kFlushGrace);
#ifdef SPECD_HAVE_GRPC
  if (grpc_) grpc_->Shutdown(absl::Now() + kFlushGrace);
#endif
  SPECD_LOG_INFO("stopped");
}

}  // namespace

absl::Status RunServe(const std::vector<std::string>& args) {
  SPECD_ASSIGN_OR_RETURN(ServeOptions o, ParseServeOptions(args, std::getenv("SPECD_API_KEY")));
  if (o.help) {
    std::fputs(ServeUsage().c_str(), stdout);
    return absl::OkStatus();
  }
  SetLogLevel(o.log_level);
  if (o.speculative.enabled()) {
    SPECD_LOG_INFO("speculation: default method {}, K {}, draft model {}, EAGLE-3 head {}",
                   SpeculationMethodName(o.speculative.method),
                   o.speculative.num_speculative_tokens,
                   o.speculative.draft_model.empty() ? "none" : o.speculative.draft_model,
                   o.speculative.eagle3_model.empty() ? "none" : o.speculative.eagle3_model);
  }
  SPECD_RETURN_IF_ERROR(InstallShutdownSignals());
  ServeProcess process(std::move(o));
  SPECD_RETURN_IF_ERROR(process.StartHttp());
  SPECD_RETURN_IF_ERROR(process.StartEngine());
  SPECD_RETURN_IF_ERROR(process.StartGrpc());
  process.Announce();
  const int sig = WaitForShutdownSignal([&process] { return process.EngineFailed(); });
  if (sig == 0) return process.Fail();
  process.Drain(sig);
  return absl::OkStatus();
}

}  // namespace specd
