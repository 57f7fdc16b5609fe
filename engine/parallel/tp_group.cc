// Rank 0 of a tensor-parallel group: the rendezvous (CreateTpGroup) and the runner the engine
// drives (TpLeaderRunner). See tp_group.h.
#include "engine/parallel/tp_group.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/base/subprocess.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/nccl_communicator.h"
#include "engine/distributed/shm_communicator.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/model/model_config.h"
#include "engine/model/tensor_parallel.h"
#include "engine/parallel/tp_codec.h"
#include "engine/parallel/tp_handshake.h"

namespace specd {
namespace {

struct WorkerLink {
  int32_t rank = 0;
  std::string device;
  std::unique_ptr<TcpChannel> link;
};

// Rank 0's runner: each call that runs the model is first sent to every worker (TpStep), then
// made on the local shard. Engine thread for the ModelRunner calls; one watchdog thread per
// worker reads its heartbeats and sends ours.
class TpLeaderRunner final : public ModelRunner {
 public:
  TpLeaderRunner(std::unique_ptr<Communicator> comm, std::unique_ptr<ModelRunner> local,
                 std::vector<WorkerLink> workers, std::vector<Subprocess> children,
                 int32_t num_kv_blocks, absl::Duration timeout)
      : comm_(std::move(comm)),
        local_(std::move(local)),
        workers_(std::move(workers)),
        children_(std::move(children)),
        num_kv_blocks_(num_kv_blocks),
        timeout_(timeout) {
    std::vector<std::string> devices = {local_->device_name()};
    for (const WorkerLink& w : workers_) devices.push_back(w.device);
    device_name_ = absl::StrCat("tensor-parallel ", workers_.size() + 1, " (", comm_->name(),
                                "): ", absl::StrJoin(devices, ", "));
    for (WorkerLink& w : workers_) watchers_.emplace_back([this, &w] { Watch(w); });
  }

  ~TpLeaderRunner() override {
    stopping_ = true;
    for (WorkerLink& w : workers_) {
      (void)w.link->Send(Shutdown{"rank 0 is shutting down"}, absl::Seconds(1));
    }
    for (std::thread& t : watchers_) t.join();
    for (WorkerLink& w : workers_) w.link->Close();
    // Launched workers exit on the Shutdown; give them a moment, then the Subprocess destructor
    // kills what is left.
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (Subprocess& c : children_) {
      while (c.Running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    }
    local_.reset();  // before the communicator it uses (its graphs hold the communicator)
    if (aborter_.joinable()) {
      if (comm_->on_device()) {
        // A failed group on GPUs: the abort may still wait on the device. The communicator is
        // left to the process's exit rather than destroyed under it.
        aborter_.detach();
        (void)comm_.release();
      } else {
        aborter_.join();  // a host communicator's abort only raises flags
      }
    }
  }

  const ModelConfig& config() const override { return local_->config(); }
  std::string device_name() const override { return device_name_; }
  int32_t num_kv_blocks() const override { return num_kv_blocks_; }
  int32_t block_size() const override { return local_->block_size(); }
  int32_t max_model_len() const override { return local_->max_model_len(); }
  int32_t max_sample_rows() const override { return local_->max_sample_rows(); }
  bool SamplesSpeculationOnDevice() const override { return local_->SamplesSpeculationOnDevice(); }
  // The target's probability slots are never drafted into (the draft model has its own runner).
  absl::Status ReserveProbSlots(int32_t n) override { return local_->ReserveProbSlots(n); }
  const float* prob_slot(int32_t slot) const override { return local_->prob_slot(slot); }
  // EAGLE-3: rank 0's residual stream is the whole one (the all-reduce ran), so the head reads
  // it there; workers keep nothing.
  absl::Status CaptureHiddenStates(std::span<const int32_t> layer_ids) override {
    return local_->CaptureHiddenStates(layer_ids);
  }
  std::span<const float> captured_hidden_states() const override {
    return local_->captured_hidden_states();
  }
  absl::Status CopyCapturedRows(std::span<const RowRange> ranges, int64_t width,
                                std::vector<float>* out) const override {
    return local_->CopyCapturedRows(ranges, width, out);
  }
  bool CapturesOnDevice() const override { return local_->CapturesOnDevice(); }
  absl::Status CopyCapturedRowsOnDevice(std::span<const RowRange> ranges, int64_t width,
                                        void* device_out) const override {
    return local_->CopyCapturedRowsOnDevice(ranges, width, device_out);
  }
  Eagle3Compute* eagle3() override { return local_->eagle3(); }

  absl::Status GroupStatus() const override {
    std::lock_guard lock(mu_);
    return failed_;
  }

  // One call forwarded: every kind that runs the model on every rank is encoded once and sent
  // to each worker, then made on the local shard. kForwardCandidates is not a group's (rows are
  // ranked on the host: RanksCandidatesOnDevice() is false).
  absl::Status Run(const StepRequest& request, StepResult* result) override {
    switch (request.kind) {
      case StepKind::kStep:
      case StepKind::kGreedyVerify:
      case StepKind::kSampledVerify:
      case StepKind::kDraft:
      case StepKind::kForward:
        SPECD_RETURN_IF_ERROR(Broadcast(request));
        return Checked(local_->Run(request, result));
      case StepKind::kForwardCandidates:
        break;
    }
    return Unsupported(request.kind);
  }

 private:
  // Sends the call to every worker. A group that already failed refuses.
  absl::Status Broadcast(const StepRequest& request) {
    SPECD_RETURN_IF_ERROR(GroupStatus());
    if (request.batch.empty()) return absl::OkStatus();  // the runners run nothing either
    EncodeTpStep(request, local_->block_size(), next_step_++, &mirror_, &step_);
    for (WorkerLink& w : workers_) {
      const absl::Status s = w.link->Send(step_, timeout_);
      if (!s.ok()) {
        Fail(absl::UnavailableError(absl::StrCat("tensor-parallel rank ", w.rank,
                                                 ": sending the step failed: ", s.message())));
        return GroupStatus();
      }
    }
    return absl::OkStatus();
  }

  // A local call after a broadcast: its failure may be the group's (a collective aborted), and
  // any failure leaves the workers where rank 0 may not be, so the group is failed either way.
  absl::Status Checked(absl::Status local) {
    if (local.ok()) return local;
    const absl::Status group = GroupStatus();
    if (!group.ok()) return group;
    Fail(absl::UnavailableError(
        absl::StrCat("tensor-parallel rank 0 failed a step: ", local.message())));
    return GroupStatus();
  }

  void Fail(absl::Status why) {
    {
      std::lock_guard lock(mu_);
      if (!failed_.ok()) return;
      failed_ = why;
    }
    SPECD_LOG_ERROR("tensor-parallel group failed: {}", std::string(why.message()));
    for (WorkerLink& w : workers_) w.link->Close();  // the other workers exit
    // A collective in flight returns once the communicator is aborted. The abort runs on its own
    // thread: ncclCommAbort may wait for device work (seen on H200s with graph-captured
    // collectives), and whoever noticed the failure (the engine thread, a watchdog) must not.
    aborter_ = std::thread([comm = comm_.get()] { comm->Abort(); });
  }

  // One worker's watchdog: its heartbeats in, ours out; a closed link, a Shutdown or silence
  // past the timeout fails the group.
  void Watch(WorkerLink& w) {
    Message message;
    absl::Time heard = absl::Now(), sent = absl::InfinitePast();
    while (!stopping_) {
      const absl::Time now = absl::Now();
      if (now - sent >= tp_handshake::kHeartbeatInterval) {
        sent = now;
        const absl::Status s =
            w.link->Send(Heartbeat{absl::ToUnixNanos(now)}, tp_handshake::kHeartbeatInterval);
        if (!s.ok() && !absl::IsDeadlineExceeded(s) && !stopping_) {
          return Fail(absl::UnavailableError(
              absl::StrCat("tensor-parallel rank ", w.rank, " is gone: ", s.message())));
        }
      }
      absl::StatusOr<MessageType> got = w.link->Recv(tp_handshake::kHeartbeatInterval, &message);
      if (stopping_) return;
      if (got.ok() && *got == MessageType::kHeartbeat) {
        heard = absl::Now();
      } else if (got.ok() && *got == MessageType::kShutdown) {
        return Fail(absl::UnavailableError(absl::StrCat(
            "tensor-parallel rank ", w.rank, " stopped: ", std::get<Shutdown>(message).reason)));
      } else if (got.ok()) {
        return Fail(
            absl::InternalError(absl::StrCat("tensor-parallel rank ", w.rank, " sent ",
                                             DistView(MessageTypeName(*got)), " out of turn")));
      } else if (absl::IsDeadlineExceeded(got.status())) {
        if (absl::Now() - heard > timeout_) {
          return Fail(absl::UnavailableError(
              absl::StrCat("tensor-parallel rank ", w.rank, " sent nothing for ",
                           absl::FormatDuration(absl::Now() - heard), " (timeout ",
                           absl::FormatDuration(timeout_), ")")));
        }
      } else {
        return Fail(absl::UnavailableError(
            absl::StrCat("tensor-parallel rank ", w.rank, " is gone: ", got.status().message())));
      }
    }
  }

  std::unique_ptr<Communicator> comm_;  // declared before local_, which uses it
  std::unique_ptr<ModelRunner> local_;
  std::vector<WorkerLink> workers_;
  std::vector<Subprocess> children_;
  const int32_t num_kv_blocks_;
  const absl::Duration timeout_;
  std::string device_name_;
  TpStep step_;           // reused across calls
  TpBlockMirror mirror_;  // what the workers hold of each sequence's block table
  uint64_t next_step_ = 0;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  absl::Status failed_;  // guarded by mu_
  std::vector<std::thread> watchers_;
  std::thread aborter_;  // Fail's comm_->Abort(), once
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateTpGroup(const RunnerOptions& runner,
                                                           const TpGroupOptions& group) {
  const int32_t n = group.world_size;
  SPECD_RETURN_IF_ERROR(tp_handshake::ValidateGroup(group));
  // Shapes that do not shard fail here, before any process starts.
  SPECD_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(runner.model_dir));
  SPECD_RETURN_IF_ERROR(MakeTpShard(config, TensorParallel{0, n}).status());
  SPECD_ASSIGN_OR_RETURN(const DeviceChoice device, ParseDevice(runner.device));
  SPECD_ASSIGN_OR_RETURN(const std::string comm_kind,
                         tp_handshake::CommunicatorKind(group.communicator, device.cuda, group));
  const int32_t per_node = n / group.nnodes;

  // The secret: fresh for a group on one host; the shared file across hosts.
  LinkSecret secret;
  if (group.nnodes == 1) {
    SPECD_ASSIGN_OR_RETURN(secret, NewLinkSecret());
  } else if (!group.secret_file.empty()) {
    SPECD_ASSIGN_OR_RETURN(secret, ReadLinkSecretFile(group.secret_file));
  } else {  // $SPECD_TP_SECRET (a Kubernetes Secret); taken out of the environment at once
    SPECD_ASSIGN_OR_RETURN(secret, TakeLinkSecretFromEnv(kTpSecretEnv));
  }
  const Hello hello = tp_handshake::TpHello(Role::kTpLeader);
  SPECD_ASSIGN_OR_RETURN(
      std::unique_ptr<TcpListener> listener,
      TcpListener::Listen(group.nnodes == 1 ? "127.0.0.1" : "", group.master_port, hello));

  // This node's workers.
  const int32_t threads = tp_handshake::ThreadsPerRank(runner.num_threads, per_node);
  std::string self = group.worker_binary;
  if (self.empty()) {
    SPECD_ASSIGN_OR_RETURN(self, SelfExecutable());
  }
  std::vector<Subprocess> children;
  for (int32_t rank = 1; rank < per_node; ++rank) {
    std::vector<std::string> argv = {
        self,
        "worker",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        absl::StrCat(listener->port()),
        "--rank",
        absl::StrCat(rank),
        "--device",
        device.cuda ? absl::StrCat("cuda:", device.index + rank) : "cpu",
        "--threads",
        absl::StrCat(threads),
        "--connect-timeout",
        absl::StrCat(absl::ToInt64Seconds(group.timeout))};
    SPECD_ASSIGN_OR_RETURN(
        Subprocess child,
        Subprocess::Spawn(argv, {absl::StrCat(kTpSecretEnv, "=", LinkSecretToHex(secret))}));
    children.push_back(std::move(child));
  }
  SPECD_LOG_INFO(
      "tensor-parallel: {} ranks on {} node(s), {} communicator; rank 0 waits on port {}", n,
      group.nnodes, comm_kind, listener->port());

  // Every worker joins: handshake, then TpJoin naming its rank.
  std::vector<WorkerLink> workers;
  const absl::Time deadline = absl::Now() + group.timeout;
  while (static_cast<int32_t>(workers.size()) < n - 1) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (!children[i].Running()) {
        return absl::UnavailableError(absl::StrCat("tensor-parallel rank ", i + 1,
                                                   " exited before joining (wait status ",
                                                   children[i].exit_status(), "); see its log"));
      }
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("tensor-parallel: ", workers.size(), " of ",
                                                      n - 1, " worker ranks joined within ",
                                                      absl::FormatDuration(group.timeout)));
    }
    absl::StatusOr<std::unique_ptr<TcpChannel>> link =
        listener->Accept(absl::Milliseconds(200), AcceptPolicy{secret, 0});
    if (absl::IsDeadlineExceeded(link.status())) continue;
    if (!link.ok()) {
      SPECD_LOG_WARN("tensor-parallel: refused a connection: {}",
                     std::string(link.status().message()));
      continue;
    }
    SPECD_ASSIGN_OR_RETURN(TpJoin join, tp_handshake::RecvAs<TpJoin>(**link, absl::Seconds(10)));
    const int32_t rank = static_cast<int32_t>(join.rank);
    const bool taken = std::any_of(workers.begin(), workers.end(),
                                   [rank](const WorkerLink& w) { return w.rank == rank; });
    if (rank < 1 || rank >= n || taken) {
      SPECD_LOG_WARN("tensor-parallel: refused a worker from {} claiming rank {}", join.host, rank);
      (*link)->Close();
      continue;
    }
    SPECD_LOG_INFO("tensor-parallel: rank {} joined from {}", rank, join.host);
    workers.push_back(WorkerLink{rank, "", *std::move(link)});
  }
  listener->Close();

  // What to load and how to meet: the communicator's id goes to everyone.
  SPECD_ASSIGN_OR_RETURN(std::vector<uint8_t> token, tp_handshake::NewCommToken(comm_kind));
  TpInit init = tp_handshake::MakeTpInit(runner, n, comm_kind, token, group.timeout);
  for (WorkerLink& w : workers) {
    init.rank = static_cast<uint32_t>(w.rank);
    SPECD_RETURN_IF_ERROR(w.link->Send(init, absl::Seconds(10)));
  }
  // Rank 0 joins the communicator and loads its shard while the workers do the same (the
  // runners' warm-up runs collectives, so every rank must be here at once).
  SPECD_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> comm,
      tp_handshake::CreateCommunicator(comm_kind, token, 0, n, device.index, group.timeout));
  RunnerOptions local = runner;
  local.tp = TensorParallel{0, n};
  local.comm = comm.get();
  local.num_threads = threads;
  absl::StatusOr<std::unique_ptr<ModelRunner>> shard = CreateModelRunner(local);
  if (!shard.ok()) {
    comm->Abort();
    return absl::Status(shard.status().code(),
                        absl::StrCat("tensor-parallel rank 0: ", shard.status().message()));
  }
  int32_t num_kv_blocks = (*shard)->num_kv_blocks();
  for (WorkerLink& w : workers) {
    SPECD_ASSIGN_OR_RETURN(TpReady ready, tp_handshake::RecvAs<TpReady>(*w.link, group.timeout));
    if (!ready.ok) {
      comm->Abort();
      return absl::UnavailableError(
          absl::StrCat("tensor-parallel rank ", w.rank, " failed to start: ", ready.reason));
    }
    w.device = ready.device;
    num_kv_blocks = std::min<int32_t>(num_kv_blocks, static_cast<int32_t>(ready.num_kv_blocks));
  }
  std::sort(workers.begin(), workers.end(),
            [](const WorkerLink& a, const WorkerLink& b) { return a.rank < b.rank; });
  return std::unique_ptr<ModelRunner>(new TpLeaderRunner(std::move(comm), *std::move(shard),
                                                         std::move(workers), std::move(children),
                                                         num_kv_blocks, group.timeout));
}

}  // namespace specd
