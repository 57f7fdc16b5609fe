#include "engine/runner/cuda_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/runner/cuda_forward.h"
#include "engine/runner/cuda_sampling.h"
#include "engine/runner/cuda_util.h"
#include "engine/runner/cuda_weights.h"
#include "kernels/cuda/init.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/verify.h"

namespace specd {
namespace {

// Device memory set aside for the decode graphs (captured after the KV cache is allocated,
// because the graphs embed its address). Every buffer they touch is preallocated, so graphs
// only need room for their executable form; the log reports what capture really took.
constexpr int64_t kGraphReserveBytes = int64_t{256} << 20;

// Decode batch sizes that get a graph: 1, 2, 4, 8, 16, 24, 32, then coarser steps, up to `cap`
// (always included). A batch runs in the smallest bucket that holds it, padded.
std::vector<int32_t> DecodeBuckets(int32_t cap) {
  std::vector<int32_t> out;
  int32_t b = 1;
  while (b < cap) {
    out.push_back(b);
    const int32_t step = b < 8 ? b : b < 32 ? 8 : b < 128 ? 16 : b < 256 ? 32 : 64;
    b += step;
  }
  out.push_back(cap);
  return out;
}

// Byte offsets of one step's small inputs in the input region, packed for its sizes (a graph's
// bucket, or an eager step's real sizes), so one copy moves them all.
struct InputLayout {
  size_t slots = 0, token_ids = 0, positions = 0, seq_lens = 0, cu_q_lens = 0, logit_rows = 0;
  size_t bytes = 0;
};

InputLayout LayoutFor(int64_t num_tokens, int32_t num_seqs, int64_t num_rows) {
  InputLayout l;
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset = (offset + bytes + 15) / 16 * 16;
    return at;
  };
  l.slots = take(8 * num_tokens);
  l.token_ids = take(4 * num_tokens);
  l.positions = take(4 * num_tokens);
  l.seq_lens = take(4 * size_t(num_seqs));
  l.cu_q_lens = take(4 * (size_t(num_seqs) + 1));
  l.logit_rows = take(4 * num_rows);
  l.bytes = offset;
  return l;
}

template <typename T>
T* At(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(base) + offset);
}

// One prepared step: how to run it and where its logits rows are.
struct Launch {
  bool graph = false;  // replay graphs[bucket]: logits row i is chunk i
  int32_t bucket = 0;
  ForwardArgs args;
  int32_t num_rows = 0;                 // eager: logits rows, gathered through logit_rows
  const int32_t* logit_rows = nullptr;  // device
};

}  // namespace

int32_t CudaDeviceCount() { return cuda::DeviceCount(); }

struct CudaRunner::State {
  ~State();

  absl::Status SelectDevice(int32_t index);
  absl::Status LoadModel(const RunnerOptions& o);
  absl::Status AllocateBuffers();
  absl::Status SizeAndAllocateKv(const RunnerOptions& o);
  absl::Status WarmUpAndCapture();

  absl::Status Validate(std::span<const SequenceInput> batch) const;
  // The graph bucket a batch replays in, or 0 (eager): graphs need one token per sequence and
  // logits rows that are exactly the chunks in order.
  int32_t GraphBucket(std::span<const SequenceInput> batch, bool rows_are_chunks) const;
  // Fills the staging buffers for `batch` and queues their upload. bucket > 0: the graph layout,
  // padded to `bucket` sequences; 0: eager, logits rows gathered from `logit_rows`.
  absl::StatusOr<Launch> Prepare(std::span<const SequenceInput> batch,
                                 std::span<const int32_t> logit_rows, int32_t bucket);
  absl::Status Execute(const Launch& launch);
  // What a decode graph holds: the forward and the LM head of every padded row.
  absl::Status RunGraphBody(const Launch& launch);
  absl::Status Capture(int32_t bucket);
  absl::Status Sync(const char* what) { return cuda::Check(cudaStreamSynchronize(stream), what); }

  int32_t device = 0;
  std::string name;
  int32_t num_sms = 0;
  double utilization = 0.9;
  bool eager = false;
  ModelConfig config;
  int32_t max_model_len = 0;
  int32_t block_size = 16;
  ForwardLimits limits;
  int32_t num_kv_blocks = 0;  // usable blocks; block num_kv_blocks is the padding scratch block
  int64_t weight_bytes = 0;

  cudaStream_t stream = nullptr;
  CudaWeights weights;
  std::unique_ptr<CudaForward> forward;
  std::unique_ptr<GpuSampler> sampler;
  cuda::PinnedMemory inputs_host;  // the input region's staging twin
  cuda::DeviceMemory inputs;       // see LayoutFor
  cuda::PinnedMemory tables_host;  // [max_seqs, max_blocks_per_seq] int32
  cuda::DeviceMemory tables;       // [max_seqs, max_blocks_per_seq] int32
  std::vector<int32_t> buckets;    // ascending; empty when eager
  std::map<int32_t, cudaGraphExec_t> graphs;
  // Greedy verification (StepGreedyVerify): uploads, results on the device and read back.
  cuda::UploadArena verify_arena;
  cuda::DeviceMemory verify_out;   // [4 * max_rows + 1] int32, see StepGreedyVerify
  cuda::PinnedMemory verify_host;  // [2 * max_rows] int32
  // Device speculation: the draft rows' q for StepSampledVerify (gathered, grown on demand), and
  // StepDraft's probability slots.
  cuda::DeviceMemory verify_q;    // [num drafts, vocab] f32
  cuda::DeviceMemory prob_slots;  // [num_prob_slots, vocab] f32
  int32_t num_prob_slots = 0;
};

CudaRunner::State::~State() {
  cudaSetDevice(device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (auto& [bucket, exec] : graphs) cudaGraphExecDestroy(exec);
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
  WeightSource source{o.model_dir, o.load_format == "dummy", 0};
  SPECD_ASSIGN_OR_RETURN(const bool tied, OutputIsTied(config, source));
  weight_bytes = CudaWeightBytes(config, tied);
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
  SPECD_ASSIGN_OR_RETURN(weights, LoadCudaWeights(config, source, tied));
  return absl::OkStatus();
}

absl::Status CudaRunner::State::AllocateBuffers() {
  SPECD_ASSIGN_OR_RETURN(forward, CudaForward::Create(config, &weights, limits, num_sms));
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
                         cuda::PinnedMemory::Allocate(4 * 2 * rows, "verification results"));
  return absl::OkStatus();
}

absl::Status CudaRunner::State::SizeAndAllocateKv(const RunnerOptions& o) {
  const int64_t block_bytes = CudaForward::KvBlockBytes(config, block_size);
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
  return forward->AllocateKv(num_kv_blocks + 1);
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

int32_t CudaRunner::State::GraphBucket(std::span<const SequenceInput> batch,
                                       bool rows_are_chunks) const {
  if (!rows_are_chunks || buckets.empty() || batch.empty() ||
      batch.size() > static_cast<size_t>(buckets.back())) {
    return 0;
  }
  for (const SequenceInput& in : batch) {
    if (in.tokens.size() != 1) return 0;
  }
  return *std::lower_bound(buckets.begin(), buckets.end(), static_cast<int32_t>(batch.size()));
}

absl::StatusOr<Launch> CudaRunner::State::Prepare(std::span<const SequenceInput> batch,
                                                  std::span<const int32_t> logit_rows,
                                                  int32_t bucket) {
  const int32_t num_seqs = static_cast<int32_t>(batch.size());
  int64_t num_tokens = 0;
  bool decode = true;
  for (const SequenceInput& in : batch) {
    num_tokens += static_cast<int64_t>(in.tokens.size());
    decode = decode && in.tokens.size() == 1;
  }
  Launch launch;
  launch.graph = bucket > 0;
  launch.bucket = launch.graph ? bucket : num_seqs;
  const int64_t padded_tokens = launch.graph ? bucket : num_tokens;
  const int64_t num_rows = launch.graph ? 0 : static_cast<int64_t>(logit_rows.size());
  const InputLayout l = LayoutFor(padded_tokens, launch.bucket, num_rows);
  void* h = inputs_host.as();
  const int32_t stride = forward->max_blocks_per_seq();
  int32_t* tables_h = tables_host.as<int32_t>();
  int64_t t = 0;
  int32_t width = 1, max_q_len = 1, max_seq_len = 1;
  At<int32_t>(h, l.cu_q_lens)[0] = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const SequenceInput& in = batch[s];
    const int32_t n = static_cast<int32_t>(in.tokens.size()), len = in.start_pos + n;
    for (int32_t i = 0; i < n; ++i, ++t) {
      const int32_t pos = in.start_pos + i;
      At<int32_t>(h, l.token_ids)[t] = in.tokens[i];
      At<int32_t>(h, l.positions)[t] = pos;
      At<int64_t>(h, l.slots)[t] =
          int64_t{in.block_table[pos / block_size]} * block_size + pos % block_size;
    }
    At<int32_t>(h, l.seq_lens)[s] = len;
    At<int32_t>(h, l.cu_q_lens)[s + 1] = static_cast<int32_t>(t);
    const int32_t used = (len + block_size - 1) / block_size;
    std::copy_n(in.block_table.begin(), used, tables_h + int64_t{s} * stride);
    width = std::max(width, used);
    max_q_len = std::max(max_q_len, n);
    max_seq_len = std::max(max_seq_len, len);
  }
  for (int32_t s = num_seqs; s < launch.bucket; ++s, ++t) {  // graph padding: 1-token dummies
    At<int32_t>(h, l.token_ids)[t] = 0;
    At<int32_t>(h, l.positions)[t] = 0;
    At<int64_t>(h, l.slots)[t] = -1;
    At<int32_t>(h, l.seq_lens)[s] = 1;
    At<int32_t>(h, l.cu_q_lens)[s + 1] = static_cast<int32_t>(t + 1);
    tables_h[int64_t{s} * stride] = num_kv_blocks;  // the scratch block
  }
  std::copy(logit_rows.begin(), logit_rows.begin() + num_rows, At<int32_t>(h, l.logit_rows));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(inputs.as(), h, l.bytes, cudaMemcpyHostToDevice, stream), "step inputs"));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpy2DAsync(tables.as(), size_t{4} * stride, tables_h, size_t{4} * stride,
                        size_t{4} * width, launch.bucket, cudaMemcpyHostToDevice, stream),
      "block tables"));
  ForwardArgs& a = launch.args;
  a.num_tokens = padded_tokens;
  a.num_seqs = launch.bucket;
  a.decode = decode;
  // Graphs replay for every context length up to max_model_len: their split count is fixed.
  a.num_splits =
      decode ? forward->DecodeSplits(launch.bucket, launch.graph ? max_model_len : max_seq_len) : 1;
  a.max_q_len = max_q_len;
  a.token_ids = At<int32_t>(inputs.as(), l.token_ids);
  a.positions = At<int32_t>(inputs.as(), l.positions);
  a.slot_mapping = At<int64_t>(inputs.as(), l.slots);
  a.seq_lens = At<int32_t>(inputs.as(), l.seq_lens);
  a.cu_q_lens = At<int32_t>(inputs.as(), l.cu_q_lens);
  a.block_tables = tables.as<int32_t>();
  launch.num_rows = static_cast<int32_t>(num_rows);
  launch.logit_rows = At<int32_t>(inputs.as(), l.logit_rows);
  return launch;
}

absl::Status CudaRunner::State::RunGraphBody(const Launch& launch) {
  SPECD_RETURN_IF_ERROR(forward->Run(launch.args, stream));
  return forward->LmHead(nullptr, launch.bucket, launch.args.num_tokens, /*gather=*/false, stream);
}

// Graph: replay. Eager: the forward and the LM head of the first min(num_rows, max_rows)
// gathered rows.
absl::Status CudaRunner::State::Execute(const Launch& launch) {
  if (launch.graph) {
    return cuda::Check(cudaGraphLaunch(graphs.at(launch.bucket), stream), "cudaGraphLaunch");
  }
  SPECD_RETURN_IF_ERROR(forward->Run(launch.args, stream));
  if (launch.num_rows == 0) return absl::OkStatus();
  return forward->LmHead(launch.logit_rows, std::min(launch.num_rows, limits.max_rows),
                         launch.args.num_tokens, /*gather=*/true, stream);
}

// Runs the bucket's padded dummy batch eagerly first (cuBLASLt picks its algorithms outside
// capture, and the kernels see their shapes once), then captures the same launches.
absl::Status CudaRunner::State::Capture(int32_t bucket) {
  SPECD_ASSIGN_OR_RETURN(Launch launch, Prepare({}, {}, bucket));
  SPECD_RETURN_IF_ERROR(RunGraphBody(launch));
  SPECD_RETURN_IF_ERROR(Sync("decode warm-up"));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
  const absl::Status body = RunGraphBody(launch);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!body.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    SPECD_RETURN_IF_ERROR(body);
    return cuda::Check(end, "graph capture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of GPU memory instantiating the decode graph of batch ", bucket,
                     "; lower gpu_memory_utilization or use enforce_eager"));
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(inst, "cudaGraphInstantiate"));
  graphs[bucket] = exec;
  return absl::OkStatus();
}

absl::Status CudaRunner::State::WarmUpAndCapture() {
  // A two-token prefill into the scratch block: the prefill kernels see this model's shape now,
  // so a shape they cannot run fails at load, not on the first request.
  if (limits.max_tokens >= 2 && block_size >= 2) {
    const std::vector<int32_t> tokens = {0, 0}, table = {num_kv_blocks}, row = {1};
    const SequenceInput prefill{tokens, 0, table, false};
    SPECD_ASSIGN_OR_RETURN(Launch launch, Prepare({&prefill, 1}, row, 0));
    SPECD_RETURN_IF_ERROR(Execute(launch));
    SPECD_RETURN_IF_ERROR(Sync("prefill warm-up"));
  }
  if (eager) {
    SPECD_ASSIGN_OR_RETURN(Launch decode, Prepare({}, {}, 1));
    SPECD_RETURN_IF_ERROR(RunGraphBody(decode));
    return Sync("decode warm-up");
  }
  for (int32_t bucket : DecodeBuckets(limits.max_decode_batch)) {
    SPECD_RETURN_IF_ERROR(Capture(bucket));
    buckets.push_back(bucket);
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

}  // namespace

absl::StatusOr<std::unique_ptr<CudaRunner>> CudaRunner::Create(const RunnerOptions& o,
                                                               int32_t device) {
  auto s = std::make_unique<State>();
  s->utilization = o.gpu_memory_utilization;
  s->eager = o.enforce_eager;
  s->block_size = o.block_size;
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
  SPECD_RETURN_IF_ERROR(s->SizeAndAllocateKv(o));
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo before, cuda::GetMemoryInfo());
  SPECD_RETURN_IF_ERROR(ShapeError(s->WarmUpAndCapture(), s->config, s->block_size));
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo after, cuda::GetMemoryInfo());
  SPECD_LOG_INFO(
      "{}: {} weights {} ({}), buffers {}, KV cache {} ({} blocks of {} tokens), {} decode "
      "graphs [{}] took {}; {} free",
      s->name, o.load_format == "dummy" ? "random" : "loaded", cuda::FormatBytes(s->weight_bytes),
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
std::vector<int32_t> CudaRunner::graph_batch_sizes() const { return s_->buckets; }

absl::Status CudaRunner::Step(std::span<const SequenceInput> batch, std::span<const SampleRow> rows,
                              std::vector<SampleResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, rows, SampleMode::kIds));
  SPECD_RETURN_IF_ERROR(s_->Sync("step"));
  s_->sampler->Finish(rows, out);
  return absl::OkStatus();
}

absl::Status CudaRunner::StepGreedyVerify(std::span<const SequenceInput> batch,
                                          std::span<const SampleRow> rows,
                                          std::span<const std::span<const int32_t>> drafts,
                                          std::vector<GreedyVerifyResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  std::vector<SampleRow> expanded;
  SPECD_RETURN_IF_ERROR(runner_internal::ExpandVerifyRows(batch, rows, drafts, &expanded));
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kIdsOnDevice));
  // The ragged layout of kernels::DraftLayout is the expansion's: row i's K_i + 1 ids follow
  // the previous rows' (a draftless row is K_i = 0, its one id the drawn token).
  const int32_t n = static_cast<int32_t>(rows.size());
  std::vector<int32_t> cu(n + 1, 0), draft_tokens;
  int32_t max_draft_len = 0;
  for (int32_t i = 0; i < n; ++i) {
    cu[i + 1] = cu[i] + static_cast<int32_t>(drafts[i].size());
    max_draft_len = std::max(max_draft_len, static_cast<int32_t>(drafts[i].size()));
    draft_tokens.insert(draft_tokens.end(), drafts[i].begin(), drafts[i].end());
  }
  cuda::UploadArena& arena = s_->verify_arena;
  arena.Reset();
  const size_t cu_at = arena.Push(cu);
  const size_t drafts_at = draft_tokens.empty() ? 0 : arena.Push(draft_tokens);
  SPECD_RETURN_IF_ERROR(arena.Upload(s_->stream));
  int32_t* accepted = s_->verify_out.as<int32_t>();  // [n] accepted, [n] next, then packing
  int32_t* next = accepted + s_->limits.max_rows;
  kernels::PackArgs pack;
  pack.cu_committed = next + s_->limits.max_rows;                       // [n + 1]
  pack.committed_tokens = pack.cu_committed + s_->limits.max_rows + 1;  // [<= rows]
  const kernels::DraftLayout layout{arena.At<int32_t>(cu_at), n, max_draft_len};
  SPECD_RETURN_IF_ERROR(
      cuda::Check(kernels::VerifyGreedyAndPack(layout, arena.At<int32_t>(drafts_at),
                                               s_->sampler->device_ids(), accepted, next, pack,
                                               kernels::VerifyPackPath::kAuto, s_->stream),
                  "VerifyGreedyAndPack"));
  int32_t* host = s_->verify_host.as<int32_t>();
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(host, accepted, 2 * s_->limits.max_rows * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, s_->stream),
                  "copy of verification results"));
  SPECD_RETURN_IF_ERROR(s_->Sync("verification step"));
  std::vector<SampleResult> sampled;  // meaningful for logprobs rows only
  s_->sampler->Finish(expanded, &sampled);
  out->resize(rows.size());
  for (int32_t i = 0, at = 0; i < n; at += cu[i + 1] - cu[i] + 1, ++i) {
    GreedyVerifyResult& r = (*out)[i];
    if (drafts[i].empty() && rows[i].params->logprobs >= 0) {
      r.next = std::move(sampled[at]);
      continue;
    }
    r.num_accepted = host[i];
    r.next.id = host[s_->limits.max_rows + i];
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::StepSampledVerify(std::span<const SequenceInput> batch,
                                           std::span<const SampleRow> rows,
                                           std::span<const std::span<const int32_t>> drafts,
                                           std::span<const DraftProbs> probs,
                                           std::vector<GreedyVerifyResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  const int64_t vocab = s_->config.vocab_size;
  std::vector<SampleRow> expanded;
  SPECD_RETURN_IF_ERROR(
      runner_internal::ExpandSampledVerifyRows(batch, rows, drafts, probs, vocab, &expanded));
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, expanded, SampleMode::kProbs));
  // The ragged layout (kernels::DraftLayout) is the expansion's, as in StepGreedyVerify; the
  // logits buffer now holds p for every expanded row.
  const int32_t n = static_cast<int32_t>(rows.size());
  std::vector<int32_t> cu(n + 1, 0), draft_tokens, onehot_rows, onehot_cols;
  std::vector<float> uniforms;
  int32_t max_draft_len = 0;
  bool any_q = false;
  for (int32_t i = 0; i < n; ++i) {
    const auto k = static_cast<int32_t>(drafts[i].size());
    cu[i + 1] = cu[i] + k;
    max_draft_len = std::max(max_draft_len, k);
    draft_tokens.insert(draft_tokens.end(), drafts[i].begin(), drafts[i].end());
    any_q = any_q || (k > 0 && (probs[i].device != nullptr || !probs[i].host.empty()));
    for (int32_t j = 0; j < k; ++j) {
      uniforms.push_back(runner_internal::verify_accepts_every_draft_for_test
                             ? 0.0f
                             : SpeculationUniform(rows[i].seed, rows[i].num_generated + j,
                                                  SpeculationDraw::kAcceptTest));
    }
    // The next token's draw; its position is known only on the device (num_generated + k_i),
    // so its uniform is keyed by the round's first position.
    uniforms.push_back(
        SpeculationUniform(rows[i].seed, rows[i].num_generated, SpeculationDraw::kNextToken));
  }
  const int64_t num_drafts = cu[n];
  // q rows in layout order: copied from wherever the speculator left them; deterministic drafts
  // in a batch that also has sampled ones get one-hot rows.
  float* q = nullptr;
  if (any_q) {
    const size_t q_bytes = static_cast<size_t>(num_drafts) * vocab * sizeof(float);
    if (s_->verify_q.bytes() < q_bytes) {
      s_->verify_q = cuda::DeviceMemory();
      SPECD_ASSIGN_OR_RETURN(s_->verify_q,
                             cuda::DeviceMemory::Allocate(q_bytes, "draft probabilities"));
    }
    q = s_->verify_q.as<float>();
    // One copy per run of rows whose sources are adjacent too (a draft model's slots follow its
    // inputs, which follow the batch).
    const char* run_src = nullptr;
    char* run_dst = nullptr;
    size_t run_bytes = 0;
    auto flush = [&]() {
      if (run_bytes == 0) return absl::OkStatus();
      const size_t bytes = std::exchange(run_bytes, 0);
      return cuda::Check(cudaMemcpyAsync(run_dst, run_src, bytes, cudaMemcpyDefault, s_->stream),
                         "copy of q rows");
    };
    for (int32_t i = 0; i < n; ++i) {
      const size_t k = drafts[i].size();
      if (k == 0) continue;
      float* dst = q + static_cast<size_t>(cu[i]) * vocab;
      const size_t bytes = k * vocab * sizeof(float);
      if (probs[i].device != nullptr || !probs[i].host.empty()) {
        const auto* src = probs[i].device != nullptr
                              ? reinterpret_cast<const char*>(probs[i].device)
                              : reinterpret_cast<const char*>(probs[i].host.data());
        if (run_bytes > 0 && run_src + run_bytes == src &&
            run_dst + run_bytes == reinterpret_cast<char*>(dst)) {
          run_bytes += bytes;
          continue;
        }
        SPECD_RETURN_IF_ERROR(flush());
        run_src = src;
        run_dst = reinterpret_cast<char*>(dst);
        run_bytes = bytes;
        continue;
      }
      SPECD_RETURN_IF_ERROR(
          cuda::Check(cudaMemsetAsync(dst, 0, bytes, s_->stream), "one-hot q rows"));
      for (size_t j = 0; j < k; ++j) {
        onehot_rows.push_back(cu[i] + static_cast<int32_t>(j));
        onehot_cols.push_back(drafts[i][j]);
      }
    }
    SPECD_RETURN_IF_ERROR(flush());
  }
  cuda::UploadArena& arena = s_->verify_arena;
  arena.Reset();
  const size_t cu_at = arena.Push(cu);
  const size_t drafts_at = arena.Push(draft_tokens);  // an empty push still names the arena
  const size_t uniforms_at = arena.Push(uniforms);
  const size_t onehot_at = onehot_rows.empty() ? 0 : arena.Push(onehot_rows);
  const size_t onehot_cols_at = onehot_rows.empty() ? 0 : arena.Push(onehot_cols);
  SPECD_RETURN_IF_ERROR(arena.Upload(s_->stream));
  if (!onehot_rows.empty()) {
    SPECD_RETURN_IF_ERROR(
        cuda::Check(kernels::ScatterF32(q, vocab, arena.At<int32_t>(onehot_at),
                                        arena.At<int32_t>(onehot_cols_at),
                                        static_cast<int64_t>(onehot_rows.size()), 1.0f, s_->stream),
                    "ScatterF32 (one-hot q rows)"));
  }
  int32_t* accepted = s_->verify_out.as<int32_t>();  // [n] accepted, [n] next
  int32_t* next = accepted + s_->limits.max_rows;
  const kernels::DraftLayout layout{arena.At<int32_t>(cu_at), n, max_draft_len};
  SPECD_RETURN_IF_ERROR(cuda::Check(
      kernels::VerifyStochastic(layout, arena.At<int32_t>(drafts_at), q, s_->forward->logits(),
                                vocab, arena.At<float>(uniforms_at), accepted, next, s_->stream),
      "VerifyStochastic"));
  int32_t* host = s_->verify_host.as<int32_t>();
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(host, accepted, 2 * s_->limits.max_rows * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, s_->stream),
                  "copy of verification results"));
  SPECD_RETURN_IF_ERROR(s_->Sync("sampled verification step"));
  out->resize(rows.size());
  for (int32_t i = 0; i < n; ++i) {
    GreedyVerifyResult& r = (*out)[i];
    r.num_accepted = host[i];
    r.next.id = host[s_->limits.max_rows + i];
    if (r.next.id < 0 || r.num_accepted < 0 || r.num_accepted > cu[i + 1] - cu[i]) {
      return absl::InternalError(absl::StrCat("sampled verification: row ", i, " accepted ",
                                              r.num_accepted, " drafts and drew token ", r.next.id,
                                              " (a distribution without mass?)"));
    }
    const int32_t num_logprobs = rows[i].params->logprobs;
    if (num_logprobs < 0) continue;
    const size_t first = static_cast<size_t>(cu[i]) + i;  // row i's first expanded row
    for (int32_t j = 0; j < r.num_accepted; ++j) {
      r.accepted.push_back(
          RawTokenLogprobs(s_->sampler->RawRow(first + j), drafts[i][j], num_logprobs));
    }
    r.next = RawTokenLogprobs(s_->sampler->RawRow(first + r.num_accepted), r.next.id, num_logprobs);
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::ReserveProbSlots(int32_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ReserveProbSlots(", n, ")"));
  if (n <= s_->num_prob_slots) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(s_->Sync("probability slots"));  // nothing may still read the old ones
  s_->prob_slots = cuda::DeviceMemory();
  s_->num_prob_slots = 0;
  SPECD_ASSIGN_OR_RETURN(
      s_->prob_slots,
      cuda::DeviceMemory::Allocate(static_cast<size_t>(n) * s_->config.vocab_size * sizeof(float),
                                   "draft probability slots"));
  s_->num_prob_slots = n;
  return absl::OkStatus();
}

const float* CudaRunner::prob_slot(int32_t slot) const {
  if (slot < 0 || slot >= s_->num_prob_slots) return nullptr;
  return s_->prob_slots.as<float>() + static_cast<size_t>(slot) * s_->config.vocab_size;
}

absl::Status CudaRunner::StepDraft(std::span<const SequenceInput> batch,
                                   std::span<const SampleRow> rows, std::span<const int32_t> slots,
                                   std::vector<SampleResult>* out) {
  out->clear();
  if (batch.empty()) return absl::OkStatus();
  if (slots.size() != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepDraft: ", slots.size(), " slots for ", rows.size(), " rows"));
  }
  for (int32_t slot : slots) {
    if (slot < 0 || slot >= s_->num_prob_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepDraft: slot ", slot, " of ", s_->num_prob_slots, " reserved"));
    }
  }
  SPECD_RETURN_IF_ERROR(EnqueueStep(batch, rows, SampleMode::kProbs));
  const auto n = static_cast<int32_t>(rows.size());
  if (n == 0) return s_->Sync("draft step");
  std::vector<float> uniforms;
  for (const SampleRow& r : rows) {
    uniforms.push_back(SpeculationUniform(r.seed, r.num_generated, SpeculationDraw::kDraft));
  }
  std::vector<int32_t> slot_rows(slots.begin(), slots.end());
  cuda::UploadArena& arena = s_->verify_arena;
  arena.Reset();
  const size_t uniforms_at = arena.Push(uniforms);
  const size_t slots_at = arena.Push(slot_rows);
  SPECD_RETURN_IF_ERROR(arena.Upload(s_->stream));
  const int64_t vocab = s_->config.vocab_size;
  float* p = s_->forward->logits();
  int32_t* ids = s_->verify_out.as<int32_t>() + s_->limits.max_rows;
  // A layout without drafts: each row's token is drawn from its own distribution.
  const kernels::DraftLayout layout{nullptr, n, 0};
  SPECD_RETURN_IF_ERROR(cuda::Check(
      kernels::VerifyStochastic(layout, /*draft_tokens (none read)=*/arena.At<int32_t>(slots_at),
                                nullptr, p, vocab, arena.At<float>(uniforms_at),
                                s_->verify_out.as<int32_t>(), ids, s_->stream),
      "VerifyStochastic (draft draw)"));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      kernels::ScatterRows(p, vocab, n, static_cast<int32_t>(vocab), arena.At<int32_t>(slots_at),
                           s_->prob_slots.as<float>(), vocab, s_->stream),
      "ScatterRows (draft probabilities)"));
  int32_t* host = s_->verify_host.as<int32_t>();
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(host, ids, n * sizeof(int32_t), cudaMemcpyDeviceToHost, s_->stream),
      "copy of draft ids"));
  SPECD_RETURN_IF_ERROR(s_->Sync("draft step"));
  out->resize(rows.size());
  for (int32_t i = 0; i < n; ++i) {
    if (host[i] < 0) {
      return absl::InternalError(
          absl::StrCat("draft step: row ", i, " has a distribution without mass"));
    }
    (*out)[i].id = host[i];
  }
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
    if (r.chunk < 0 || static_cast<size_t>(r.chunk) >= batch.size() || r.sampler == nullptr ||
        r.params == nullptr || r.history == nullptr || r.token < -1 ||
        r.token >= static_cast<int64_t>(batch[r.chunk].tokens.size())) {
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
  SPECD_ASSIGN_OR_RETURN(Launch launch,
                         s_->Prepare(batch, logit_rows, s_->GraphBucket(batch, rows_are_chunks)));
  SPECD_RETURN_IF_ERROR(s_->Execute(launch));
  if (mode == SampleMode::kProbs) {
    return s_->sampler->EnqueueProbs(s_->forward->logits(), rows, s_->stream);
  }
  return s_->sampler->Enqueue(s_->forward->logits(), rows, s_->stream,
                              /*copy_ids=*/mode == SampleMode::kIds);
}

absl::Status CudaRunner::Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) {
  if (logits == nullptr) return absl::InvalidArgumentError("Forward: logits is null");
  logits->clear();
  if (batch.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  SPECD_RETURN_IF_ERROR(s_->Validate(batch));
  std::vector<int32_t> rows;
  bool all_logits = false;
  int32_t t = 0;
  for (const SequenceInput& in : batch) {
    const int32_t n = static_cast<int32_t>(in.tokens.size());
    for (int32_t i = in.all_logits ? 0 : n - 1; i < n; ++i) rows.push_back(t + i);
    all_logits = all_logits || in.all_logits;
    t += n;
  }
  SPECD_ASSIGN_OR_RETURN(Launch launch,
                         s_->Prepare(batch, rows, s_->GraphBucket(batch, !all_logits)));
  const size_t vocab = static_cast<size_t>(s_->config.vocab_size);
  logits->assign(rows.size() * vocab, 0.0f);
  if (launch.graph) {
    SPECD_RETURN_IF_ERROR(s_->Execute(launch));
    SPECD_RETURN_IF_ERROR(cuda::Check(
        cudaMemcpyAsync(logits->data(), s_->forward->logits(), logits->size() * sizeof(float),
                        cudaMemcpyDeviceToHost, s_->stream),
        "copy of logits"));
    return s_->Sync("forward");
  }
  SPECD_RETURN_IF_ERROR(s_->forward->Run(launch.args, s_->stream));
  for (size_t first = 0; first < rows.size(); first += s_->limits.max_rows) {  // LM head chunks
    const int32_t n =
        static_cast<int32_t>(std::min<size_t>(s_->limits.max_rows, rows.size() - first));
    SPECD_RETURN_IF_ERROR(s_->forward->LmHead(launch.logit_rows + first, n, launch.args.num_tokens,
                                              /*gather=*/true, s_->stream));
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaMemcpyAsync(logits->data() + first * vocab, s_->forward->logits(),
                                    n * vocab * sizeof(float), cudaMemcpyDeviceToHost, s_->stream),
                    "copy of logits"));
    SPECD_RETURN_IF_ERROR(s_->Sync("forward"));
  }
  return absl::OkStatus();
}

}  // namespace specd
