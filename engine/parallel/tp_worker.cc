// A worker rank of a tensor-parallel group (`specd worker`, tp_group.h): joins rank 0, loads its
// shard, and repeats rank 0's runner calls until told to stop. Two threads: the main thread runs
// the calls; a link thread receives them (queueing them for the main thread), sends heartbeats
// and watches rank 0, so that a rank 0 that died or went silent ends this process even while the
// main thread waits inside a collective.
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/base/subprocess.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/parallel/tp_codec.h"
#include "engine/parallel/tp_group.h"
#include "engine/parallel/tp_handshake.h"

namespace specd {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

// Calls from rank 0, handed from the link thread to the main thread.
class StepQueue {
 public:
  void Push(TpStep step) {
    std::lock_guard lock(mu_);
    steps_.push_back(std::move(step));
    cv_.notify_one();
  }
  void Close(absl::Status why) {
    std::lock_guard lock(mu_);
    if (closed_.ok()) closed_ = why.ok() ? absl::CancelledError("shut down") : why;
    cv_.notify_one();
  }
  // The next call, or the reason the queue closed (Cancelled: rank 0 shut the group down).
  absl::StatusOr<TpStep> Pop() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return !steps_.empty() || !closed_.ok(); });
    if (!steps_.empty()) {
      TpStep step = std::move(steps_.front());
      steps_.pop_front();
      return step;
    }
    return closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TpStep> steps_;
  absl::Status closed_;  // OK while open
};

// The link thread's loop (see the file comment). A lost rank 0 aborts the communicator and ends
// the process: the main thread may be inside a collective that will never complete.
void ServeLink(TcpChannel& link, Communicator& comm, StepQueue& queue, absl::Duration timeout,
               int32_t rank) {
  Message message;
  absl::Time heard = absl::Now(), sent = absl::InfinitePast();
  for (;;) {
    const absl::Time now = absl::Now();
    if (now - sent >= tp_handshake::kHeartbeatInterval) {
      sent = now;
      (void)link.Send(Heartbeat{absl::ToUnixNanos(now)}, tp_handshake::kHeartbeatInterval);
    }
    absl::StatusOr<MessageType> got = link.Recv(tp_handshake::kHeartbeatInterval, &message);
    absl::Status lost;
    if (got.ok()) {
      heard = absl::Now();
      if (*got == MessageType::kTpStep) {
        queue.Push(std::move(std::get<TpStep>(message)));
      } else if (*got == MessageType::kShutdown) {
        SPECD_LOG_INFO("worker rank {}: rank 0 shut the group down ({})", rank,
                       std::get<Shutdown>(message).reason);
        queue.Close(absl::OkStatus());
        return;
      } else if (*got != MessageType::kHeartbeat) {
        lost = absl::InternalError(absl::StrCat("rank 0 sent ", DistView(MessageTypeName(*got))));
      }
    } else if (absl::IsDeadlineExceeded(got.status())) {
      if (absl::Now() - heard > timeout) {
        lost = absl::UnavailableError(
            absl::StrCat("rank 0 sent nothing for ", absl::FormatDuration(absl::Now() - heard)));
      }
    } else {
      lost = absl::UnavailableError(absl::StrCat("rank 0 is gone: ", got.status().message()));
    }
    if (!lost.ok()) {
      SPECD_LOG_ERROR("worker rank {}: {}; exiting", rank, std::string(lost.message()));
      queue.Close(lost);
      // The main thread may never return from a device collective, and the abort itself may
      // wait on the device: give it a moment on its own thread, then end the process here.
      std::thread([&comm] { comm.Abort(); }).detach();
      std::this_thread::sleep_for(std::chrono::seconds(2));
      std::fflush(nullptr);
      std::_Exit(1);
    }
  }
}

absl::StatusOr<LinkSecret> WorkerSecret(const TpWorkerOptions& o) {
  absl::StatusOr<LinkSecret> env = TakeLinkSecretFromEnv(kTpSecretEnv);
  if (env.ok() || !absl::IsNotFound(env.status())) return env;
  if (!o.secret_file.empty()) return ReadLinkSecretFile(o.secret_file);
  return absl::FailedPreconditionError(
      absl::StrCat("a worker needs the group's secret: --secret-file FILE (mode 0600, the same "
                   "as rank 0's --tp-secret-file) or $",
                   kTpSecretEnv, " (set for the workers rank 0 launches)"));
}

// One rank: join, load, serve.
absl::Status RunRank(const TpWorkerOptions& o) {
  SPECD_ASSIGN_OR_RETURN(const LinkSecret secret, WorkerSecret(o));
  ConnectOptions connect;
  connect.timeout = o.connect_timeout;
  absl::StatusOr<std::unique_ptr<TcpChannel>> connected =
      TcpChannel::Connect(o.master_addr, static_cast<uint16_t>(o.master_port),
                          tp_handshake::TpHello(Role::kTpWorker), secret, connect);
  if (!connected.ok()) {
    return absl::Status(connected.status().code(),
                        absl::StrCat("worker rank ", o.rank, ": joining rank 0 at ", o.master_addr,
                                     ":", o.master_port, ": ", connected.status().message()));
  }
  TcpChannel& link = **connected;
  SPECD_RETURN_IF_ERROR(
      link.Send(TpJoin{static_cast<uint32_t>(o.rank), HostName()}, absl::Seconds(10)));
  SPECD_ASSIGN_OR_RETURN(const TpInit init, tp_handshake::RecvAs<TpInit>(link, o.connect_timeout));
  if (static_cast<int32_t>(init.rank) != o.rank) {
    return absl::InternalError(
        absl::StrCat("rank 0 assigned rank ", init.rank, " to rank ", o.rank));
  }
  const absl::Duration timeout = absl::Milliseconds(init.timeout_ms);
  // Our device and the communicator; then the shard, loaded while the other ranks load theirs.
  SPECD_ASSIGN_OR_RETURN(const DeviceChoice device,
                         ParseDevice(o.device == "auto" && init.comm_kind == "nccl"
                                         ? absl::StrCat("cuda:", o.rank)
                                         : (o.device == "auto" ? "cpu" : o.device)));
  RunnerOptions options = tp_handshake::RunnerOptionsFrom(
      init, device.cuda ? absl::StrCat("cuda:", device.index) : "cpu", o.num_threads);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = tp_handshake::CreateCommunicator(
      init.comm_kind, init.comm_token, o.rank, static_cast<int32_t>(init.world_size), device.index,
      timeout);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      comm.ok() ? (options.comm = comm->get(), CreateModelRunner(options))
                : absl::StatusOr<std::unique_ptr<ModelRunner>>(comm.status());
  TpReady ready;
  ready.ok = runner.ok();
  if (runner.ok()) {
    ready.num_kv_blocks = static_cast<uint32_t>((*runner)->num_kv_blocks());
    ready.device = absl::StrCat((*runner)->device_name(), " on ", HostName());
  } else {
    ready.reason = std::string(runner.status().message()).substr(0, kMaxTextBytes);
  }
  SPECD_RETURN_IF_ERROR(link.Send(ready, absl::Seconds(10)));
  if (!runner.ok()) return runner.status();
  SPECD_LOG_INFO("worker rank {} of {}: {} ready, {} KV blocks", o.rank, init.world_size,
                 ready.device, ready.num_kv_blocks);
  if (o.on_ready) o.on_ready();

  StepQueue queue;
  std::thread link_thread([&] { ServeLink(link, **comm, queue, timeout, o.rank); });
  TpCall call;
  absl::Status status;
  for (;;) {
    absl::StatusOr<TpStep> step = queue.Pop();
    if (!step.ok()) {
      if (!absl::IsCancelled(step.status())) status = step.status();
      break;
    }
    status = call.Decode(*step);
    if (status.ok()) status = call.Run(**runner);
    if (!status.ok()) {
      SPECD_LOG_ERROR("worker rank {}: step {} failed: {}", o.rank, step->step_id,
                      std::string(status.message()));
      (void)link.Send(Shutdown{std::string(absl::StrCat("step failed: ", status.message()))
                                   .substr(0, kMaxTextBytes)},
                      absl::Seconds(1));
      link.Close();
      // The communicator and the device may be in any state now (ncclCommAbort can wait for
      // device work): end the process without tearing them down.
      std::fflush(nullptr);
      std::_Exit(1);
    }
  }
  link_thread.join();
  runner->reset();  // before its communicator
  return status;
}

// A node of a multi-node group: its ranks as child processes.
absl::Status RunNode(const TpWorkerOptions& o) {
  if (o.world_size < 2 || o.nnodes < 1 || o.world_size % o.nnodes != 0 || o.node_rank < 1 ||
      o.node_rank >= o.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "specd worker without --rank needs --tensor-parallel-size (a multiple of --nnodes) and "
        "--node-rank in [1, nnodes): got size ",
        o.world_size, ", nnodes ", o.nnodes, ", node rank ", o.node_rank));
  }
  const int32_t per_node = o.world_size / o.nnodes;
  SPECD_ASSIGN_OR_RETURN(const std::string self, SelfExecutable());
  std::vector<Subprocess> children;
  for (int32_t local = 0; local < per_node; ++local) {
    const int32_t rank = o.node_rank * per_node + local;
    std::vector<std::string> argv = {self,
                                     "worker",
                                     "--master-addr",
                                     o.master_addr,
                                     "--master-port",
                                     absl::StrCat(o.master_port),
                                     "--rank",
                                     absl::StrCat(rank),
                                     "--tensor-parallel-size",
                                     absl::StrCat(o.world_size),
                                     "--device",
                                     o.device == "cpu" ? "cpu" : absl::StrCat("cuda:", local),
                                     "--threads",
                                     absl::StrCat(o.num_threads),
                                     "--connect-timeout",
                                     absl::StrCat(absl::ToInt64Seconds(o.connect_timeout))};
    if (!o.secret_file.empty()) {
      argv.push_back("--secret-file");
      argv.push_back(o.secret_file);
    }
    SPECD_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(argv));
    children.push_back(std::move(child));
  }
  if (o.on_ready) o.on_ready();
  // The node lives as long as all its ranks do; the first one to fail ends the others.
  for (;;) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].Running()) continue;
      const int status = children[i].exit_status();
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        bool all_done = true;
        for (Subprocess& c : children) all_done = all_done && !c.Running();
        if (all_done) return absl::OkStatus();
        continue;
      }
      return absl::UnavailableError(absl::StrCat("worker rank ", o.node_rank * per_node + i,
                                                 " exited (wait status ", status, ")"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace

absl::Status RunTpWorker(const TpWorkerOptions& options) {
  if (options.rank < 0) return RunNode(options);
  if (options.rank == 0) {
    return absl::InvalidArgumentError(
        "rank 0 is `specd serve` (or `specd generate`); workers are ranks 1 and up");
  }
  return RunRank(options);
}

}  // namespace specd
