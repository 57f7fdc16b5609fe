// What a request and the server say about speculative decoding, and how the two combine.
// A request carries SpeculationParams (HTTP `speculation`, gRPC SpeculationOptions); the
// server's defaults come from `--speculative-config` (vLLM's JSON: method, model,
// num_speculative_tokens, prompt_lookup_min/max). ResolveSpeculation is the small policy that
// turns both into what runs: which speculator and how many draft tokens per round.
// Pure values and functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/draft_method.h"
#include "engine/base/ssv.h"

namespace specd {

// kDefault: the request said nothing (the server's default applies). kAuto: the engine's
// StrategyPolicy picks a method and K per request and step (engine/policy/strategy_policy.h).
// kSsd: speculative speculative decoding (Saguaro) with a speculator process on its own device.
// kVegas: the target drafts for itself with sparse attention over the prefix tokens the last
// verification pass scored highest; kStreaming: the same sparse drafting over attention sinks
// and a recent window of the same budget (StreamingLLM / MagicDec; Vegas's baseline).
// kEagle3: an EAGLE-3 head drafting from the target's own hidden states (engine/speculation/
// eagle3.h). The enum is DraftMethod, shared with the policy and the step pipeline; kSsv is not a
// request's method (an NSA target's verification: speculation.ssv).
using SpeculationMethod = DraftMethod;  // engine/base/draft_method.h

// "auto", "none", "draft_model" (also "draft"), "ngram", "ssd", "vegas", "streaming", "eagle3"
// (also "eagle-3"); "" is
// kDefault. "ssv" (a later issue) is InvalidArgument "not available yet"; anything else is
// InvalidArgument naming the accepted values.
absl::StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name);
const char* SpeculationMethodName(SpeculationMethod m);  // "none", "draft_model", "ngram", ...

// Longest draft one round may carry (requests and config alike).
inline constexpr int32_t kMaxSpeculativeTokens = 64;

// Token-tree drafts (Draft::parents, engine/model/token_tree.h): the drafter expands the top_k
// best children of the best paths into a tree of at most num_nodes drafts, no path longer than
// depth, and the target verifies the whole tree in one pass. Methods draft_model, eagle3 and
// ngram. Zero fields are unset: a request's take the server's, the server's the defaults below.
struct TreeShape {
  bool enabled = false;   // trees at all (false: chains)
  int32_t depth = 0;      // longest path (drafts); default: the request's K
  int32_t top_k = 0;      // children a node expands at most; default 2
  int32_t num_nodes = 0;  // drafts in the whole tree; default 16
};
inline constexpr int32_t kDefaultTreeTopK = 2;
inline constexpr int32_t kDefaultTreeNodes = 16;
inline constexpr int32_t kMaxTreeTopK = 16;
// Whether `m` drafts trees (draft_model, eagle3, ngram).
bool DraftsTrees(SpeculationMethod m);
// InvalidArgument naming `prefix`.field (message and field payload) for a set field out of
// range: depth and num_nodes in [1, kMaxSpeculativeTokens], top_k in [1, kMaxTreeTopK].
absl::Status ValidateTreeShape(const TreeShape& t, std::string_view prefix);

// Per-request options, as a front end read them (HTTP `speculation`, gRPC SpeculationOptions, the
// CLI): the front ends check syntax only (JSON / proto types, unknown fields, method names);
// Validate checks the values and the engine resolves them once, at Submit (ResolveSpeculation).
struct SpeculationParams {
  SpeculationMethod method = SpeculationMethod::kDefault;
  int32_t num_speculative_tokens = 0;  // 0: the server's default
  float saguaro_c = -1.0f;             // SSD: Saguaro down-weighting C in [0, 1]; < 0: default
  // Vegas / streaming budget (SparseDraftOptions); unset: the server's.
  double sparsity_ratio = -1;      // in (0, 1]; < 0: unset
  int32_t sparse_min_tokens = -1;  // HTTP / gRPC "min_tokens"; < 0: unset
  int32_t sparse_max_tokens = -1;  // HTTP / gRPC "max_tokens" (0: no cap); < 0: unset
  // speculation.policy: the longest K this request may run (0: no speculation); < 0: unset.
  int32_t policy_max_k = -1;
  // speculation.policy.forbid: methods this request refuses (speculating methods only).
  std::vector<SpeculationMethod> policy_forbid = {};
  // speculation.ssv (NSA targets: how verification attends, engine/base/ssv.h); unset fields
  // take the server's.
  int32_t ssv_group_size = 0;            // 0: unset
  std::optional<SsvMode> ssv_mode = {};  // unset: the server's
  int32_t ssv_refresh_every = 0;         // 0: unset
  bool ssv_strict = false;  // only lossless strategies (mode exact, every layer refreshes)
  // speculation.tree: a tree object (enabled; unset fields: the server's, else the defaults),
  // or "tree": false (tree_off: chains even where the server drafts trees).
  TreeShape tree = {};
  bool tree_off = false;
  bool has_ssv() const {
    return ssv_group_size != 0 || ssv_mode.has_value() || ssv_refresh_every != 0 || ssv_strict;
  }
  // The request's own values, without the server's: K in [0, kMaxSpeculativeTokens], C in
  // [0, 1], the sparse budget (ratio in (0, 1], counts not negative), policy max_k in
  // [0, kMaxSpeculativeTokens] and forbid entries that are speculating methods, ssv group size in
  // [1, kMaxSsvGroupSize], refresh_every >= 1 and no lossy value beside "strict", tree fields in
  // range. InvalidArgument whose message starts with the field's API path and whose field
  // payload (FieldOf, engine/base/status.h) is that path. ResolveSpeculation checks it first.
  absl::Status Validate() const;
};

// Vegas and streaming: how many prefix tokens a draft step attends besides the recent ones,
// k = clamp(ceil(ratio * prefix), min_tokens, max_tokens) (kernels::ref::VegasKeepCount).
struct SparseDraftOptions {
  double sparsity_ratio = 0.07;  // the paper's 7%
  int32_t min_tokens = 256;      // the reference fork's floor
  int32_t max_tokens = 0;        // 0: no cap
};
// InvalidArgument naming `prefix`.field (message and field payload) when the ratio is outside
// (0, 1], a count is negative, or a cap is below the floor.
absl::Status ValidateSparseDraftOptions(const SparseDraftOptions& o, std::string_view prefix);

// SSD's settings (method "ssd"; docs/architecture.md "SSD"): the speculator process, its
// speculation cache and the fallback tiers.
struct SsdOptions {
  int32_t fan_out = 3;            // F: cache budget per acceptance length, B = (K + 1) * F
  bool geometric_fan_out = true;  // F_k from the online alpha_p and r; false: F at every k
  // ("budget": "time") B from the measured costs: as many branches as the speculator's passes
  // build within the verifier's measured round (F until both are measured; at most 16 per
  // acceptance length); "fixed": B = (K + 1) * F. A complete cache is always fixed.
  bool time_budget = true;
  // ("data_path": "device") sampled drafts' q rows move from the speculator's GPU to the
  // verifier's on an NCCL link when both ends are on GPUs (TCP carries the rest); "host": inline
  // in the TCP responses, through both hosts' memory.
  bool device_data_path = true;
  // ("cache_offers") the speculator sends the verifier its greedy cache branches as its build
  // completes them (wire version 10), and a greedy round whose every outcome was offered takes
  // its drafts from the offer without asking: a hit then costs no round trip. false: every
  // round asks and waits for the response.
  bool cache_offers = true;
  // ("speculator_drafter": "eagle3") the speculator drafts with the EAGLE-3 head of
  // SpeculativeConfig::eagle3_model instead of the draft model: the verifier's target keeps the
  // head's layers' hidden states and sends those of every committed position with the outcome.
  // The default: "draft_model" when a draft model is named, else "eagle3".
  bool eagle3_drafter = false;
  float saguaro_c = -1.0f;          // default C for sampled requests; < 0: by temperature
  int32_t critical_batch_size = 0;  // b*: misses of batches this large go to the backup; 0: from
                                    // the measured hit rate and latencies (saguaro.h)
  std::string backup = "ngram";     // the fast backup speculator: "ngram" or "random"
  std::string address = "127.0.0.1:0";  // where the verifier listens for its speculator
  bool launch = true;         // the verifier starts (and restarts) the speculator process itself
  std::string binary;         // the specd executable it launches; "": this process's own
  int32_t timeout_ms = 2000;  // longest wait for drafts before a round goes without them
  // The speculation cache is built until the verifier's next request arrives (the paper's
  // verification window), or always completely before answering it ("cache_build":
  // "complete": deterministic hit rates, for tests and measurements of the cache itself).
  bool complete_cache = false;
  // The speculator process's gpu_memory_utilization (a fraction of the whole GPU, counting
  // memory others hold); 0: the verifier's. On the verifier's own GPU it must exceed the share
  // the verifier holds (e.g. verifier 0.45, speculator 0.9).
  double gpu_memory_utilization = 0;
  // The verifier's end of the link's security (engine/distributed/link_auth.h, tls.h). A launched
  // speculator gets a fresh secret per launch; without launch the verifier reads it from
  // secret_file (mode 0600; or $SPECD_SPECULATOR_SECRET) and the speculator from its own
  // --speculator-secret-file. TLS 1.3 with mutual certificates signed by tls_ca, all three files
  // or none, for speculators on other hosts (not with launch).
  std::string secret_file;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
};

// Benchmark-only controlled acceptance (JSON "replay": {"file": PATH, "alpha": A,
// "candidate_hit": H, "seed": S}; engine/speculation/draft_replay.h): the draft model still runs
// every forward pass, but for greedy rows whose context follows a recorded greedy continuation of
// the target, its draft equals the recorded next token with probability alpha (else another token),
// and the recorded token is its best alternative candidate with probability candidate_hit. Results
// measured with it are controlled-acceptance results, never a model's.
struct DraftReplayOptions {
  std::string
      file;  // JSONL, one {"tokens": [...]} per line (prompt + target continuation); "": off
  double alpha = 0.8;
  double candidate_hit = 0.9;
  uint64_t seed = 0;
  bool enabled() const { return !file.empty(); }
};

// The server's speculation settings (`--speculative-config`), immutable after parsing.
struct SpeculativeConfig {
  SpeculationMethod method = SpeculationMethod::kNone;  // default for requests that say nothing
  std::string draft_model;  // HF model dir of the draft (method draft_model); may be
                            // set with another default method, so requests can ask
  // The EAGLE-3 head's folder (LlamaForCausalLMEagle3): "model" when the method is eagle3, or
  // "eagle3_model" beside a draft model, so requests can ask for either.
  std::string eagle3_model;
  // The draft model drafts a whole round in one forward pass from K - 1 appended mask tokens
  // (PARD; `"parallel": true`, also vLLM's "parallel_drafting"): the draft's config.json names
  // its mask token (`pard_token`). With method ssd the speculator drafts this way, its cache's
  // branches included.
  bool parallel_drafting = false;
  int32_t num_speculative_tokens = 4;  // default K
  int32_t prompt_lookup_min = 1;       // n-gram: shortest suffix matched
  int32_t prompt_lookup_max = 4;       // n-gram: longest suffix matched
  int64_t draft_kv_cache_bytes = 0;    // draft model's KV pool; 0: the device default
  std::string speculator_device;       // where the draft runs ("cpu", "cuda:N"; JSON also takes
                                       // an integer N); "": the target's device
  SsdOptions ssd;                      // method ssd (the draft is `draft_model`)
  DraftReplayOptions replay;           // benchmarks only: controlled acceptance of the draft
  SparseDraftOptions sparse;           // methods vegas and streaming: the default budget
  SsvStrategy ssv;                     // NSA targets: the default verification strategy ("ssv")
  // Token trees for the tree-drafting methods ("tree": {"depth", "top_k", "num_nodes"}); not
  // enabled: chains unless a request asks.
  TreeShape tree = {};

  bool enabled() const {
    return method != SpeculationMethod::kNone || !draft_model.empty() || !eagle3_model.empty();
  }
};

// Parses vLLM-style JSON, e.g. {"method": "draft_model", "model": "DIR",
// "num_speculative_tokens": 4} or {"method": "ngram", "prompt_lookup_max": 4}. "" gives the
// default (no speculation). InvalidArgument naming the field for unknown fields, wrong types
// or out-of-range values, or a draft_model method without "model".
absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(std::string_view json);

// The JSON ParseSpeculativeConfig reads back into `config` (tests check the reader with it).
std::string SpeculativeConfigToJson(const SpeculativeConfig& config);

// What one request runs with.
struct ResolvedSpeculation {
  // kNone, kAuto (the policy picks per step), or the pinned method.
  SpeculationMethod method = SpeculationMethod::kNone;
  // K; 0 when method is kNone. For kAuto: the longest K the policy may pick (the request's
  // pinned K when k_pinned).
  int32_t num_speculative_tokens = 0;
  bool k_pinned = false;      // kAuto: the request gave K explicitly (the policy picks the method)
  float saguaro_c = -1.0f;    // SSD: the request's C, else the server's
  SparseDraftOptions sparse;  // vegas / streaming: the request's budget, else the server's
  uint32_t forbidden_bits = 0;  // speculation.policy.forbid: bit i is SpeculationMethod i
  SsvStrategy ssv;              // NSA targets: how the request's verification chunks attend
  // NSA targets: the request set no strategy field of its own ("strict" aside), so the SSV
  // planner (engine/policy/ssv_planner.h) picks its strategy per step when the cost profile
  // measured some; `ssv` is the fallback. ssv_strict: lossless strategies only.
  bool ssv_planned = false;
  bool ssv_strict = false;
  // A pinned tree-drafting method's tree (every field set), or none: chains. With a tree,
  // num_speculative_tokens is its num_nodes (the lookahead slots a round verifies).
  TreeShape tree = {};
  bool enabled() const { return method != SpeculationMethod::kNone; }
  bool Forbids(SpeculationMethod m) const {
    return (forbidden_bits >> static_cast<int>(m) & 1u) != 0;
  }
};

// Validates the request (SpeculationParams::Validate), then: the request's method (or the server
// default when it gave none); `auto` stays auto (the
// engine's policy decides per step; K is then its cap: the request's policy max_k, the server's
// K); K from the request, else the server's. speculation.policy: an explicit method the request
// forbids, or an explicit K above its max_k, is InvalidArgument; a server default the request
// forbids resolves to no speculation, and a server default K above max_k is lowered to it.
// InvalidArgument when the request asks for a draft model (or SSD, or an EAGLE-3 head: the
// server's eagle3_model) the server has not loaded,
// vegas / streaming on a server without sparse drafting (`has_sparse_drafting`: one rank, CPU or
// CUDA, dense target), K outside [0, kMaxSpeculativeTokens], C outside [0, 1], a bad sparse budget,
// a policy max_k outside [0, kMaxSpeculativeTokens] or a forbid entry that is not a speculating
// method (draft_model, ngram, ssd, vegas, streaming).
// speculation.ssv: the request's fields over the server's strategy; InvalidArgument when the
// target is not an NSA model (`target_is_nsa`), for values out of range, or for a lossy value the
// request asks for beside "strict": true. A strict request demotes a lossy server default to
// mode exact with every layer refreshing (the group size stays).
// speculation.tree: the request's fields over the server's tree over the defaults, for a pinned
// tree-drafting method (InvalidArgument for a request's tree with another method, auto included,
// or a field out of range; a server tree applies to those methods only); num_nodes is capped by
// policy max_k. Every error names its field as Validate's do.
absl::StatusOr<ResolvedSpeculation> ResolveSpeculation(const SpeculationParams& request,
                                                       const SpeculativeConfig& server,
                                                       bool has_draft_model, bool has_ssd = false,
                                                       bool has_sparse_drafting = true,
                                                       bool target_is_nsa = false);

}  // namespace specd
