#include "engine/runner/cuda/cuda_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/base/log.h"
#include "engine/base/ssv.h"
#include "engine/base/status.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runner/cuda/cuda_forward.h"
#include "engine/runner/cuda/cuda_runner_state.h"
#include "engine/runner/cuda/cuda_sampling.h"
#include "engine/runner/cuda/cuda_weights.h"
#include "kernels/cuda/init.h"
#include "kernels/cuda/nsa.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/verify.h"

namespace specd {

using cuda_runner_internal::kGraphReserveBytes;
using cuda_runner_internal::LayoutFor;

int32_t CudaDeviceCount() { return cuda::DeviceCount(); }

CudaRunner::State::~State() {
  cudaSetDevice(device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (auto& [bucket, exec] : graphs) cudaGraphExecDestroy(exec);
  eagle3.reset();
  sampler.reset();
  forward.reset();
  weights = CudaWeights();
  if (stream != nullptr) cudaStreamDestroy(stream);
}

absl::Status CudaRunner::State::SelectDevice(int32_t index) {
  const int32_t count = cuda::DeviceCount();
  if (index >= count) {
    return count == 0 ? absl::FailedPreconditionError(
                            absl::StrCat("device cuda:", index, ": no CUDA device is visible"))
                      : absl::InvalidArgumentError(absl::StrCat(
                            "device cuda:", index, ": only ", count, " CUDA devices are visible"));
  }
  device = index;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(device), "cudaSetDevice"));
  cudaDeviceProp prop;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaGetDeviceProperties(&prop, device), "device properties"));
  name = absl::StrCat("cuda:", device, " ", prop.name);
  num_sms = prop.multiProcessorCount;
  return cuda::Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
}

absl::Status CudaRunner::State::LoadModel(const RunnerOptions& o) {
  SPECD_ASSIGN_OR_RETURN(config, LoadModelConfig(o.model_dir));
  SPECD_ASSIGN_OR_RETURN(max_model_len, ResolveMaxModelLen(config, o.max_model_len));
  SPECD_ASSIGN_OR_RETURN(shard, MakeTpShard(config, o.tp));
  WeightSource source{o.model_dir, o.load_format == "dummy", 0};
  SPECD_ASSIGN_OR_RETURN(const bool tied, OutputIsTied(config, source));
  weight_bytes = CudaWeightBytes(config, shard, tied);
  SPECD_ASSIGN_OR_RETURN(cuda::MemoryInfo mem, cuda::GetMemoryInfo());
  const int64_t budget = static_cast<int64_t>(utilization * mem.total);
  const int64_t allowed = std::min(budget - mem.used(), mem.free);
  if (weight_bytes > allowed) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model weights need ", cuda::FormatBytes(weight_bytes), " (bf16) but ", name, " allows ",
        cuda::FormatBytes(std::max<int64_t>(0, allowed)), ": gpu_memory_utilization ", utilization,
        " of ", cuda::FormatBytes(mem.total), " is ", cuda::FormatBytes(budget), ", ",
        cuda::FormatBytes(mem.used()), " already in use (CUDA context, other processes), ",
        cuda::FormatBytes(mem.free), " free"));
  }
  SPECD_ASSIGN_OR_RETURN(weights, LoadCudaWeights(config, shard, source, tied));
  return absl::OkStatus();
}

absl::Status CudaRunner::State::AllocateBuffers() {
  SPECD_ASSIGN_OR_RETURN(forward,
                         CudaForward::Create(config, shard, comm, &weights, limits, num_sms));
  SPECD_ASSIGN_OR_RETURN(sampler, GpuSampler::Create(limits.max_rows, config.vocab_size));
  const size_t input_bytes = LayoutFor(limits.max_tokens, limits.max_seqs, limits.max_tokens).bytes;
  SPECD_ASSIGN_OR_RETURN(inputs_host, cuda::PinnedMemory::Allocate(input_bytes, "step inputs"));
  SPECD_ASSIGN_OR_RETURN(inputs, cuda::DeviceMemory::Allocate(input_bytes, "step inputs"));
  const size_t table_bytes =
      size_t{4} * limits.max_seqs * static_cast<size_t>(forward->max_blocks_per_seq());
  SPECD_ASSIGN_OR_RETURN(tables_host, cuda::PinnedMemory::Allocate(table_bytes, "block tables"));
  SPECD_ASSIGN_OR_RETURN(tables, cuda::DeviceMemory::Allocate(table_bytes, "block tables"));
  const size_t rows = static_cast<size_t>(limits.max_rows);
  SPECD_ASSIGN_OR_RETURN(verify_out,
                         cuda::DeviceMemory::Allocate(4 * (4 * rows + 1), "verification results"));
  SPECD_ASSIGN_OR_RETURN(verify_host,
                         cuda::PinnedMemory::Allocate(4 * 3 * rows, "verification results"));
  return absl::OkStatus();
}

absl::Status CudaRunner::State::CreateEagle3(const RunnerOptions& o) {
  if (o.eagle3_head.empty() || worker) return absl::OkStatus();
  CudaEagle3Compute::Options e;
  e.dir = o.eagle3_head;
  e.target_dir = o.model_dir;
  e.dummy = o.load_format == "dummy";
  e.target = &config;
  e.target_embed = shard.world_size == 1 ? weights.embed : nullptr;
  e.max_tokens = static_cast<int32_t>(limits.max_tokens);
  e.max_seqs = limits.max_seqs;
  e.max_model_len = max_model_len;
  e.block_size = block_size;
  e.num_sms = num_sms;
  e.device = device;
  e.stream = stream;
  e.eager = eager;
  eagle3_draws = MakeEagle3Draws();
  e.draws = eagle3_draws.get();
  SPECD_ASSIGN_OR_RETURN(eagle3, CudaEagle3Compute::Create(e));
  SPECD_RETURN_IF_ERROR(
      AllocateCapture(eagle3->config().aux_layer_ids, "EAGLE-3 hidden-state capture"));
  eagle3->set_capture(capture.as<__nv_bfloat16>(), limits.max_tokens);
  SPECD_LOG_INFO("{}: EAGLE-3 head {}: weights {}, buffers {}, capture {}", name, o.eagle3_head,
                 cuda::FormatBytes(eagle3->weight_bytes()),
                 cuda::FormatBytes(eagle3->buffer_bytes()),
                 cuda::FormatBytes(static_cast<int64_t>(capture.bytes())));
  return absl::OkStatus();
}

absl::Status CudaRunner::State::AllocateCapture(std::vector<int32_t> ids, const char* what) {
  const size_t bytes = static_cast<size_t>(limits.max_tokens * static_cast<int64_t>(ids.size()) *
                                           config.hidden_size * int64_t{2});  // bf16
  SPECD_ASSIGN_OR_RETURN(capture, cuda::DeviceMemory::Allocate(bytes, what));
  capture_layers = std::move(ids);
  forward->SetCapture(capture_layers, capture.as<__nv_bfloat16>());
  return absl::OkStatus();
}

absl::Status CudaRunner::State::CreateCapture(const RunnerOptions& o) {
  const std::vector<int32_t>& ids = o.capture_hidden_layers;
  if (ids.empty() || eagle3 != nullptr || worker) return absl::OkStatus();
  for (int32_t id : ids) {
    if (id < 0 || id >= config.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("hidden-state capture: layer id ", id,
                                                     " is outside [0, ", config.num_layers, ")"));
    }
  }
  SPECD_RETURN_IF_ERROR(AllocateCapture(ids, "hidden-state capture"));
  SPECD_ASSIGN_OR_RETURN(capture_host,
                         cuda::PinnedMemory::Allocate(capture.bytes(), "hidden-state capture"));
  SPECD_LOG_INFO("{}: hidden states of layers {} kept for the speculator: capture {} (+ {} host)",
                 name, absl::StrJoin(capture_layers, ","),
                 cuda::FormatBytes(static_cast<int64_t>(capture.bytes())),
                 cuda::FormatBytes(static_cast<int64_t>(capture_host.bytes())));
  return absl::OkStatus();
}

absl::Status CudaRunner::State::SizeAndAllocateKv(const RunnerOptions& o) {
  // A rank's cache holds its KV heads only (and rank 0 the EAGLE-3 head's layer beside it).
  const int64_t block_bytes =
      CudaForward::KvBlockBytes(LocalModelConfig(config, shard), block_size) +
      (eagle3 != nullptr ? eagle3->KvBlockBytes() : 0);
  const int64_t blocks_per_seq = forward->max_blocks_per_seq();
  const int64_t reserve = eager ? 0 : kGraphReserveBytes;
  SPECD_ASSIGN_OR_RETURN(cuda::MemoryInfo mem, cuda::GetMemoryInfo());
  const int64_t budget = static_cast<int64_t>(utilization * mem.total);
  int64_t blocks = 0;
  if (o.kv_cache_bytes > 0) {
    blocks = std::max(blocks_per_seq, o.kv_cache_bytes / block_bytes);
    if ((blocks + 1) * block_bytes + reserve > mem.free) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache of ", blocks, " blocks needs ", cuda::FormatBytes((blocks + 1) * block_bytes),
          " (plus ", cuda::FormatBytes(reserve), " for CUDA graphs) but ", name, " has ",
          cuda::FormatBytes(mem.free), " free after weights (", cuda::FormatBytes(weight_bytes),
          ") and buffers (", cuda::FormatBytes(forward->buffer_bytes()), ")"));
    }
  } else {
    const int64_t available = budget - mem.used() - reserve;
    blocks = std::min(available, mem.free - reserve) / block_bytes - 1;  // -1: scratch block
    if (blocks < blocks_per_seq) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache: one max_model_len sequence (", max_model_len, " tokens) needs ",
          cuda::FormatBytes((blocks_per_seq + 1) * block_bytes), " but gpu_memory_utilization ",
          utilization, " of ", cuda::FormatBytes(mem.total), " on ", name, " leaves ",
          cuda::FormatBytes(std::max<int64_t>(0, available)), " after weights (",
          cuda::FormatBytes(weight_bytes), "), buffers (",
          cuda::FormatBytes(forward->buffer_bytes()), "), the CUDA graph reserve (",
          cuda::FormatBytes(reserve),
          ") and other memory in use (CUDA context, other "
          "processes); raise gpu_memory_utilization or lower max_model_len"));
    }
    // More blocks than every sequence at full length could use only bloat the block manager.
    blocks = std::min<int64_t>(blocks, int64_t{limits.max_seqs} * blocks_per_seq);
  }
  num_kv_blocks =
      static_cast<int32_t>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max() - 1));
  SPECD_ASSIGN_OR_RETURN(num_kv_blocks, MinOverRanks(num_kv_blocks));
  if (eagle3 != nullptr) SPECD_RETURN_IF_ERROR(eagle3->AllocateKv(num_kv_blocks + 1));
  return forward->AllocateKv(num_kv_blocks + 1);
}

// Rank 0's block manager hands out block ids that every rank's cache must hold, so all ranks take
// the smallest count any of them can afford (their free memory differs).
absl::StatusOr<int32_t> CudaRunner::State::MinOverRanks(int32_t value) {
  if (comm == nullptr) return value;
  const int32_t n = comm->world_size();
  SPECD_ASSIGN_OR_RETURN(cuda::DeviceMemory values,
                         cuda::DeviceMemory::Allocate(size_t{4} * n, "KV block agreement"));
  std::vector<int32_t> host(n, value);
  int32_t* own = values.as<int32_t>() + shard.rank;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemcpyAsync(own, &value, 4, cudaMemcpyHostToDevice, stream),
                                    "KV block agreement"));
  SPECD_RETURN_IF_ERROR(comm->AllGather(own, values.as(), 1, CommDataType::kI32, stream));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(host.data(), values.as(), size_t{4} * n, cudaMemcpyDeviceToHost, stream),
      "KV block agreement"));
  SPECD_RETURN_IF_ERROR(Sync("KV block agreement"));
  return *std::min_element(host.begin(), host.end());
}

absl::Status CudaRunner::State::Validate(std::span<const SequenceInput> batch) const {
  if (batch.size() > static_cast<size_t>(limits.max_seqs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch.size(), " sequences; the runner holds ", limits.max_seqs));
  }
  int64_t num_tokens = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    const int64_t end = int64_t{in.start_pos} + static_cast<int64_t>(in.tokens.size());
    auto bad = [s](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", what));
    };
    if (in.tokens.empty() || in.start_pos < 0) return bad("no tokens or a negative start_pos");
    if (in.attention != nullptr) SPECD_RETURN_IF_ERROR(ValidateAttention(s, in));
    if (in.tree != nullptr) SPECD_RETURN_IF_ERROR(ValidateTree(s, in));
    if (in.ssv != nullptr) {
      // Every strategy runs in the NSA kernels: groups of at most kNsaMaxGroupSize tokens,
      // shared mode per group, reuse schedules per token (State::NsaLayout).
      if (!config.is_nsa()) return bad("an SSV strategy needs an NSA model");
      SPECD_RETURN_IF_ERROR(ValidateSsvStrategy(*in.ssv, "ssv."));
      if (in.ssv->group_size > kernels::kNsaMaxGroupSize) {
        return bad(absl::StrCat("SSV strategy ", SsvStrategyName(*in.ssv), ": groups of at most ",
                                kernels::kNsaMaxGroupSize, " tokens on the CUDA runner"));
      }
    }
    if (end > max_model_len) {
      return bad(
          absl::StrCat("positions up to ", end - 1, " exceed max_model_len ", max_model_len));
    }
    const int64_t needed = (end + block_size - 1) / block_size;
    if (static_cast<int64_t>(in.block_table.size()) < needed) {
      return bad(
          absl::StrCat("block table has ", in.block_table.size(), " blocks, ", needed, " needed"));
    }
    for (int64_t b = 0; b < needed; ++b) {
      if (in.block_table[b] < 0 || in.block_table[b] >= num_kv_blocks) {
        return bad(
            absl::StrCat("block id ", in.block_table[b], " outside [0, ", num_kv_blocks, ")"));
      }
    }
    for (int32_t id : in.tokens) {
      if (id < 0 || id >= config.vocab_size) {
        return bad(absl::StrCat("token id ", id, " outside the vocabulary"));
      }
    }
    num_tokens += static_cast<int64_t>(in.tokens.size());
  }
  if (num_tokens > limits.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", num_tokens, " tokens; the runner holds ", limits.max_tokens));
  }
  return absl::OkStatus();
}

// ---- CudaRunner ----

CudaRunner::CudaRunner(std::unique_ptr<State> state) : s_(std::move(state)) {}
CudaRunner::~CudaRunner() = default;

namespace {

// A warm-up launch the kernels reject means the model's shape is unsupported, not a bug.
absl::Status ShapeError(const absl::Status& s, const ModelConfig& c, int32_t block_size) {
  if (s.ok() || s.message().find("cudaErrorInvalidValue") == std::string_view::npos) return s;
  return absl::InvalidArgumentError(absl::StrCat(
      "the CUDA kernels cannot run this model (head_dim ", c.head_dim, ", ", c.num_heads,
      " query / ", c.num_kv_heads, " KV heads, block_size ", block_size, "): ", s.message()));
}

// What the CUDA forward cannot run, refused before the device is touched: NSA models under
// tensor parallelism (their heads' selections are not sharded yet; the CPU refuses it too).
absl::Status CheckCudaSupports(const RunnerOptions& o) {
  SPECD_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(o.model_dir));
  if (config.is_nsa() && o.tp.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.model_dir, ": NSA models do not run under tensor parallelism yet (world size ",
        o.tp.world_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaRunner>> CudaRunner::Create(const RunnerOptions& o,
                                                               int32_t device) {
  auto s = std::make_unique<State>();
  s->utilization = o.gpu_memory_utilization;
  s->eager = o.enforce_eager;
  s->q_len_multiple =
      std::clamp(o.round_graph_q_len_multiple, 1, cuda_runner_internal::kMaxRoundGraphQueryLen);
  s->block_size = o.block_size;
  s->comm = o.comm;
  s->worker = o.tp.rank != 0;
  // Refused before the device is touched, so the answer is the same with or without a GPU.
  SPECD_RETURN_IF_ERROR(CheckCudaSupports(o));
  SPECD_RETURN_IF_ERROR(s->SelectDevice(device));
  SPECD_RETURN_IF_ERROR(s->LoadModel(o));
  ForwardLimits& l = s->limits;
  l.max_tokens = o.max_num_batched_tokens;
  l.max_seqs = o.max_num_seqs;
  const int32_t max_decode = std::min(o.max_num_seqs, o.max_num_batched_tokens);
  l.max_rows =
      o.max_sample_rows > 0 ? std::min(o.max_sample_rows, o.max_num_batched_tokens) : max_decode;
  l.max_rows = std::max(l.max_rows, max_decode);
  l.max_model_len = s->max_model_len;
  l.block_size = o.block_size;
  l.max_decode_batch = max_decode;  // a decode step has at most this many sequences
  SPECD_RETURN_IF_ERROR(s->AllocateBuffers());
  // Vegas' selections stay on the device, a slot per sequence the runner holds at once.
  if (s->forward->SupportsVegas().ok()) s->num_sparse_slots = o.max_num_seqs;
  SPECD_RETURN_IF_ERROR(s->CreateEagle3(o));
  SPECD_RETURN_IF_ERROR(s->CreateCapture(o));  // before the KV's size and the graphs
  SPECD_RETURN_IF_ERROR(s->SizeAndAllocateKv(o));
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo before, cuda::GetMemoryInfo());
  SPECD_RETURN_IF_ERROR(ShapeError(s->WarmUpAndCapture(), s->config, s->block_size));
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo after, cuda::GetMemoryInfo());
  SPECD_LOG_INFO(
      "{}{}: {} weights {} ({}), buffers {}, KV cache {} ({} blocks of {} tokens), {} decode "
      "graphs [{}] took {}; {} free",
      s->name,
      o.tp.world_size > 1
          ? absl::StrCat(" (tensor-parallel rank ", o.tp.rank, " of ", o.tp.world_size, ")")
          : std::string(),
      o.load_format == "dummy" ? "random" : "loaded", cuda::FormatBytes(s->weight_bytes),
      o.model_dir, cuda::FormatBytes(s->forward->buffer_bytes()),
      cuda::FormatBytes(s->forward->kv_bytes()), s->num_kv_blocks, s->block_size, s->graphs.size(),
      absl::StrJoin(s->buckets, ","), cuda::FormatBytes(before.free - after.free),
      cuda::FormatBytes(after.free));
  return std::unique_ptr<CudaRunner>(new CudaRunner(std::move(s)));
}

const ModelConfig& CudaRunner::config() const { return s_->config; }
std::string CudaRunner::device_name() const { return s_->name; }
int32_t CudaRunner::num_kv_blocks() const { return s_->num_kv_blocks; }
int32_t CudaRunner::block_size() const { return s_->block_size; }
int32_t CudaRunner::max_model_len() const { return s_->max_model_len; }
int32_t CudaRunner::max_sample_rows() const { return s_->limits.max_rows; }
int32_t CudaRunner::num_sparse_slots() const { return s_->num_sparse_slots; }
std::vector<int32_t> CudaRunner::graph_batch_sizes() const { return s_->buckets; }
CudaRunner::GraphStats CudaRunner::graph_stats() const {
  GraphStats stats = s_->stats;
  stats.round_graphs = s_->num_round_graphs;
  stats.round_graph_bytes = s_->round_graph_bytes;
  return stats;
}

absl::Status CudaRunner::Run(const StepRequest& request, StepResult* result) {
  switch (request.kind) {
    case StepKind::kStep:
      return DrawRows(request.batch, request.rows, result->samples);
    case StepKind::kGreedyVerify:
      return VerifyGreedy(request.batch, request.rows, request.drafts, result->verified);
    case StepKind::kSampledVerify:
      return VerifySampled(request, result->verified);
    case StepKind::kDraft:
      return DrawDraftRows(request.batch, request.rows, request.slots, result->samples);
    case StepKind::kForward:
      return ForwardLogits(request.batch, result->logits);
    case StepKind::kForwardCandidates:
      return RankCandidates(request.batch, request.k, result->candidate_ids,
                            result->candidate_logprobs);
  }
  return absl::InvalidArgumentError("Run: unknown step kind");
}

absl::Status CudaRunner::DrawRows(std::span<const SequenceInput> batch,
                                  std::span<const SampleRow> rows, std::vector<SampleResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, rows, SampleMode::kIds));
  SPECD_RETURN_IF_ERROR(s_->SyncStep("step"));
  if (s_->worker) return absl::OkStatus();
  s_->sampler->Finish(rows, out);
  return absl::OkStatus();
}

absl::Status CudaRunner::EnqueueStep(std::span<const SequenceInput> batch,
                                     std::span<const SampleRow> rows, SampleMode mode) {
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(s_->Validate(batch));
  std::vector<int32_t> logit_rows;
  bool rows_are_chunks = rows.size() == batch.size();
  for (size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& r = rows[i];
    // A tensor-parallel worker's rows carry only chunk and token (it never samples).
    const bool unsampleable =
        !s_->worker && (r.sampler == nullptr || r.params == nullptr || r.history == nullptr);
    if (r.chunk < 0 || static_cast<size_t>(r.chunk) >= batch.size() || unsampleable ||
        r.token < -1 || r.token >= static_cast<int64_t>(batch[r.chunk].tokens.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step: sample row ", i, " (chunk ", r.chunk, ") is malformed"));
    }
    if (batch[r.chunk].all_logits) return absl::InvalidArgumentError("Step: all_logits chunk");
    rows_are_chunks = rows_are_chunks && r.chunk == static_cast<int32_t>(i) && r.token < 0;
  }
  if (rows.size() > static_cast<size_t>(s_->limits.max_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step: ", rows.size(), " rows; at most ", s_->limits.max_rows));
  }
  // Token index of each chunk's first token in the flattened batch.
  std::vector<int32_t> first(batch.size() + 1, 0);
  for (size_t c = 0; c < batch.size(); ++c) {
    first[c + 1] = first[c] + static_cast<int32_t>(batch[c].tokens.size());
  }
  for (const SampleRow& r : rows) {
    logit_rows.push_back(r.token >= 0 ? first[r.chunk] + r.token : first[r.chunk + 1] - 1);
  }
  std::vector<int32_t> sorted = logit_rows;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("Step: two sample rows name the same token");
  }
  // Tensor parallelism: greedy rows merge the vocabulary shards by their best logits (every
  // rank's rows agree, VocabMergeK); probabilities need the full rows.
  const int32_t merge_k =
      s_->shard.world_size > 1 && mode != SampleMode::kProbs ? VocabMergeK(rows) : 0;
  // Captures a round graph on first use, before Prepare fills the staging buffers. Steps with
  // attention options (Vegas) run eagerly, but for sparse draft steps over selection slots.
  State::GraphKey key;
  if (!State::HasTree(batch)) {
    SPECD_ASSIGN_OR_RETURN(
        key, s_->EnsureGraph(s_->GraphFor(batch, rows.size(), rows_are_chunks, merge_k)));
  }
  SPECD_ASSIGN_OR_RETURN(State::Launch launch, s_->Prepare(batch, logit_rows, key));
  launch.merge_k = merge_k;  // also when the step runs eagerly
  SPECD_RETURN_IF_ERROR(s_->PrepareVegas(batch, &launch));
  SPECD_RETURN_IF_ERROR(s_->PrepareTrees(batch, &launch));
  SPECD_RETURN_IF_ERROR(s_->Execute(launch));
  SPECD_RETURN_IF_ERROR(s_->EnqueueScoreWeights());
  if (s_->worker) return absl::OkStatus();  // a tensor-parallel worker stops after the logits
  if (mode == SampleMode::kProbs) {
    return s_->sampler->EnqueueProbs(s_->forward->logits(), rows, s_->stream);
  }
  return s_->sampler->Enqueue(s_->forward->logits(), rows, s_->stream,
                              /*copy_ids=*/mode == SampleMode::kIds);
}

absl::Status CudaRunner::ForwardRows(std::span<const SequenceInput> batch, size_t* num_rows,
                                     const std::function<absl::Status(size_t, int32_t)>& take) {
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(s_->Validate(batch));
  std::vector<int32_t> rows;
  int32_t t = 0;
  for (const SequenceInput& in : batch) {
    const int32_t n = static_cast<int32_t>(in.tokens.size());
    for (int32_t i = in.all_logits ? 0 : n - 1; i < n; ++i) rows.push_back(t + i);
    t += n;
  }
  *num_rows = rows.size();
  // Rows in chunk order, at least one per chunk: as many as chunks means one each, the last.
  // Attention options (Vegas draft steps, scored verification) run eagerly, but for sparse draft
  // steps over selection slots (GraphFor).
  State::GraphKey key;
  if (!State::HasTree(batch)) {
    SPECD_ASSIGN_OR_RETURN(
        key, s_->EnsureGraph(s_->GraphFor(batch, rows.size(), rows.size() == batch.size())));
  }
  SPECD_ASSIGN_OR_RETURN(State::Launch launch, s_->Prepare(batch, rows, key));
  SPECD_RETURN_IF_ERROR(s_->PrepareVegas(batch, &launch));
  SPECD_RETURN_IF_ERROR(s_->PrepareTrees(batch, &launch));
  if (launch.key.graph()) {
    SPECD_RETURN_IF_ERROR(s_->Execute(launch));
    SPECD_RETURN_IF_ERROR(take(0, static_cast<int32_t>(rows.size())));
    return s_->Sync("forward");
  }
  SPECD_RETURN_IF_ERROR(s_->forward->Run(launch.args, s_->stream));
  SPECD_RETURN_IF_ERROR(s_->EnqueueScoreWeights());
  for (size_t first = 0; first < rows.size(); first += s_->limits.max_rows) {  // LM head chunks
    const int32_t n =
        static_cast<int32_t>(std::min<size_t>(s_->limits.max_rows, rows.size() - first));
    SPECD_RETURN_IF_ERROR(s_->forward->LmHead(launch.logit_rows + first, n, launch.args.num_tokens,
                                              /*gather=*/true, /*merge_k=*/0, s_->stream));
    SPECD_RETURN_IF_ERROR(take(first, n));
    SPECD_RETURN_IF_ERROR(s_->SyncStep("forward"));
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::ForwardLogits(std::span<const SequenceInput> batch,
                                       std::vector<float>* logits) {
  if (logits == nullptr) return absl::InvalidArgumentError("Forward: logits is null");
  logits->clear();
  if (batch.empty()) return absl::OkStatus();
  const size_t vocab = static_cast<size_t>(s_->config.vocab_size);
  const bool copy = !s_->worker;  // a tensor-parallel worker runs the same launches, returns none
  size_t num_rows = 0;
  return ForwardRows(batch, &num_rows, [&](size_t first, int32_t n) -> absl::Status {
    if (!copy) return absl::OkStatus();
    if (first == 0) logits->assign(num_rows * vocab, 0.0f);
    return cuda::Check(
        cudaMemcpyAsync(logits->data() + first * vocab, s_->forward->logits(),
                        n * vocab * sizeof(float), cudaMemcpyDeviceToHost, s_->stream),
        "copy of logits");
  });
}

bool CudaRunner::RanksCandidatesOnDevice() const { return s_->shard.world_size == 1; }

SsvLoadStats CudaRunner::ssv_load_stats() const {
  const CudaNsaAttention* nsa = s_->forward != nullptr ? s_->forward->nsa() : nullptr;
  if (nsa == nullptr) return {};
  const absl::Status device = cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice");
  absl::StatusOr<SsvLoadStats> stats = device.ok() ? nsa->LoadStats(s_->stream) : device;
  if (stats.ok()) {
    ssv_last_ = *stats;
  } else {
    SPECD_LOG_ERROR("{}: SSV load counters: {}", s_->name, stats.status().ToString());
  }
  return ssv_last_;
}

absl::Status CudaRunner::RankCandidates(std::span<const SequenceInput> batch, int32_t k,
                                        std::vector<int32_t>* ids, std::vector<float>* logprobs) {
  ids->clear();
  logprobs->clear();
  if (!RanksCandidatesOnDevice()) return Unsupported(StepKind::kForwardCandidates);
  if (k < 1 || k > kernels::kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardCandidates: ", k, " a row"));
  }
  if (batch.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  int64_t total = 0;
  for (const SequenceInput& in : batch) {
    total += in.all_logits ? static_cast<int64_t>(in.tokens.size()) : 1;
  }
  SPECD_RETURN_IF_ERROR(s_->ReserveCandidates(total));
  const auto vocab = static_cast<int32_t>(s_->config.vocab_size);
  auto* cand_ids = s_->cand_ids.as<int32_t>();
  auto* cand_lp = s_->cand_logprobs.as<float>();
  auto* host_ids = s_->cand_host.as<int32_t>();
  auto* host_lp = reinterpret_cast<float*>(host_ids + s_->cand_rows * kernels::kMaxTopK);
  size_t num_rows = 0;
  SPECD_RETURN_IF_ERROR(ForwardRows(batch, &num_rows, [&](size_t first, int32_t n) -> absl::Status {
    const size_t at = first * k, count = static_cast<size_t>(n) * k;
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::TopKRows(s_->forward->logits(), vocab, n, vocab, k, cand_ids + at,
                          s_->cand_workspace.as(), s_->cand_workspace.bytes(), s_->stream),
        "TopKRows (candidates)"));
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::LogSoftmaxAt(s_->forward->logits(), vocab, n, vocab, cand_ids + at, k,
                                          cand_lp + at, s_->stream),
                    "LogSoftmaxAt (candidates)"));
    SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemcpyAsync(host_ids + at, cand_ids + at, count * 4,
                                                      cudaMemcpyDeviceToHost, s_->stream),
                                      "copy of candidates"));
    return cuda::Check(
        cudaMemcpyAsync(host_lp + at, cand_lp + at, count * 4, cudaMemcpyDeviceToHost, s_->stream),
        "copy of candidates");
  }));
  ids->assign(host_ids, host_ids + num_rows * k);
  logprobs->assign(host_lp, host_lp + num_rows * k);
  return absl::OkStatus();
}

absl::Status CudaRunner::CaptureHiddenStates(std::span<const int32_t> layer_ids) {
  if (layer_ids.empty()) return absl::OkStatus();
  const std::vector<int32_t>& own = s_->capture_layers;
  if (s_->capture.as() != nullptr &&
      std::equal(layer_ids.begin(), layer_ids.end(), own.begin(), own.end())) {
    return absl::OkStatus();  // captured on the device since creation (every graph holds it)
  }
  return absl::UnimplementedError(
      absl::StrCat(s_->name,
                   ": hidden states are captured only for the layers set at creation (the head of "
                   "RunnerOptions::eagle3_head, or RunnerOptions::capture_hidden_layers)"));
}

absl::Status CudaRunner::CheckCapturedRows(std::span<const RowRange> ranges, int64_t width,
                                           const char* what) const {
  const State& s = *s_;
  if (s.capture_host.as() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        s.name, ": no hidden states kept for a consumer (RunnerOptions::capture_hidden_layers)"));
  }
  const int64_t own = static_cast<int64_t>(s.capture_layers.size()) * s.config.hidden_size;
  if (width != own) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rows of ", width, " floats; the capture's are ", own));
  }
  for (const RowRange& r : ranges) {
    if (r.first < 0 || r.count < 0 || int64_t{r.first} + r.count > s.captured_tokens) {
      return absl::OutOfRangeError(absl::StrCat(what, ": rows [", r.first, ", ",
                                                int64_t{r.first} + r.count, ") of ",
                                                s.captured_tokens, " captured by the last pass"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::CopyCapturedRows(std::span<const RowRange> ranges, int64_t width,
                                          std::vector<float>* out) const {
  State& s = *s_;
  SPECD_RETURN_IF_ERROR(CheckCapturedRows(ranges, width, "CopyCapturedRows"));
  const int64_t own = width;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s.device), "cudaSetDevice"));
  // After every pass queued before; the ranges land one after another in the staging buffer.
  const size_t row_bytes = static_cast<size_t>(own) * sizeof(uint16_t);  // bf16
  auto* staged = s.capture_host.as<uint16_t>();
  int64_t at = 0;
  for (const RowRange& r : ranges) {
    if (r.count == 0) continue;
    SPECD_RETURN_IF_ERROR(cuda::Check(
        cudaMemcpyAsync(staged + at * own, s.capture.as<uint16_t>() + int64_t{r.first} * own,
                        row_bytes * static_cast<size_t>(r.count), cudaMemcpyDeviceToHost, s.stream),
        "copy of captured hidden states"));
    at += r.count;
  }
  SPECD_RETURN_IF_ERROR(s.Sync("copy of captured hidden states"));
  // bf16 is the high half of an f32.
  const size_t first = out->size();
  out->resize(first + static_cast<size_t>(at * own));
  float* dst = out->data() + first;
  for (int64_t i = 0; i < at * own; ++i) {
    const uint32_t bits = uint32_t{staged[i]} << 16;
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
  return absl::OkStatus();
}

bool CudaRunner::CapturesOnDevice() const { return s_->capture_host.as() != nullptr; }

absl::Status CudaRunner::CopyCapturedRowsOnDevice(std::span<const RowRange> ranges, int64_t width,
                                                  void* device_out) const {
  State& s = *s_;
  SPECD_RETURN_IF_ERROR(CheckCapturedRows(ranges, width, "CopyCapturedRowsOnDevice"));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s.device), "cudaSetDevice"));
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(uint16_t);  // bf16
  auto* dst = static_cast<uint16_t*>(device_out);
  int64_t at = 0;
  for (const RowRange& r : ranges) {
    if (r.count == 0) continue;
    SPECD_RETURN_IF_ERROR(cuda::Check(
        cudaMemcpyAsync(dst + at * width, s.capture.as<uint16_t>() + int64_t{r.first} * width,
                        row_bytes * static_cast<size_t>(r.count), cudaMemcpyDeviceToDevice,
                        s.stream),
        "device copy of captured hidden states"));
    at += r.count;
  }
  return s.Sync("device copy of captured hidden states");
}

Eagle3Compute* CudaRunner::eagle3() { return s_->eagle3.get(); }

}  // namespace specd
