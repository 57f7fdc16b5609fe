// An EAGLE-3 draft head (Li et al. 2025, arXiv 2503.01840) in the checkpoint format vLLM and
// SGLang load as `LlamaForCausalLMEagle3`: `fc` fuses three of the target's hidden states into
// one, a single Llama decoder layer reads [its token embedding, that hidden state] (q/k/v
// projections 2 * hidden wide), and an LM head over a reduced draft vocabulary maps back to the
// target's ids through `d2t` (target id = draft id + d2t[draft id]). The head's own output
// before its final norm is the hidden state of its next draft step. This is the exact fp32 CPU
// forward (the oracle for a device one), with a small per-sequence KV cache of its one layer.
// Load on any thread; Forward on one thread at a time (it uses the head's scratch buffers).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/token_tree.h"

namespace specd {

struct Eagle3Config {
  // The decoder layer's shape (a Llama config with num_layers 1; vocab_size is the target's).
  ModelConfig layer;
  int32_t draft_vocab_size = 0;    // rows of lm_head
  int32_t target_hidden_size = 0;  // width of each target hidden state fc reads
  // The target layers whose input residual stream fc reads, in fc's column order (vLLM's
  // `eagle_aux_hidden_state_layer_ids`: 0 is the embedding output, j the output of layer j - 1;
  // SGLang numbers explicit ids one lower). Absent in the config: vLLM's default
  // (2, L / 2, L - 3) for a target of L layers.
  std::vector<int32_t> aux_layer_ids;
  // The residual of the layer is the hidden input after hidden_norm (true) or before (false,
  // the EAGLE-3 default).
  bool norm_before_residual = false;
};

// Parses the head's config.json against the target it drafts for; `file` names it in errors.
// InvalidArgument naming the field for a head that cannot draft for `target`: an architecture
// other than LlamaForCausalLMEagle3 (the speculators library's Eagle3Speculator layout is not
// read yet), more than one decoder layer, a vocab_size or target_hidden_size that is not the
// target's, a draft_vocab_size outside [1, vocab], or aux layer ids that are not three ids in
// [0, target.num_layers).
absl::StatusOr<Eagle3Config> ParseEagle3Config(std::string_view json_text, std::string_view file,
                                               const ModelConfig& target);

class Eagle3Head {
 public:
  // One sequence's cache of the head's layer: K and V of the slots it ran, ascending (there may
  // be gaps: positions whose target hidden state the head never saw). A chain's slot is its
  // position; a draft tree's nodes sit in slots of their own (Row::tree).
  struct Kv {
    std::vector<int32_t> slots;  // [n]
    std::vector<float> k;        // [n, num_kv_heads * head_dim] after RoPE (at the row's position)
    std::vector<float> v;        // [n, num_kv_heads * head_dim]
    int32_t size() const { return static_cast<int32_t>(slots.size()); }
    // Drops every entry at slot `slot` or later.
    void Truncate(int32_t slot);
  };

  // One position to run. Rows of one sequence are consecutive with ascending slots above every
  // slot its cache holds; each row's K/V joins the cache at its slot and later rows may see it.
  struct Row {
    int32_t token = 0;     // the input embedding's id (target vocabulary)
    int32_t position = 0;  // RoPE position
    int32_t slot = -1;     // its cache slot; -1: `position`
    // A tree row (engine/model/token_tree.h; not owned): node slot - tree->start of the tree
    // region, attending the cache's slots before the region, its ancestors' and its own. nullptr:
    // a chain row, attending every slot up to its own.
    const TokenTree* tree = nullptr;
    const float* hidden = nullptr;  // [hidden] f32: fc's output, or the head's own prenorm
    Kv* kv = nullptr;               // the sequence's cache (not owned)
    bool logits = false;            // this row's logits are wanted
    int32_t cache_slot() const { return slot < 0 ? position : slot; }
  };

  // Loads dir/config.json and dir/model.safetensors (or an index and shards). The token
  // embedding is the checkpoint's `embed_tokens.weight` when it has one, else the target's
  // (`target_dir`'s `model.embed_tokens.weight`, as vLLM shares it). InvalidArgument naming the
  // file and tensor for a missing or misshapen tensor, a missing `d2t` when the draft vocabulary
  // is reduced, or a `d2t` that maps outside the vocabulary or two draft ids to one target id.
  static absl::StatusOr<std::unique_ptr<Eagle3Head>> Load(const std::string& dir,
                                                          const std::string& target_dir,
                                                          const ModelConfig& target);

  const Eagle3Config& config() const { return config_; }
  int32_t hidden_size() const { return config_.layer.hidden_size; }
  int32_t vocab_size() const { return config_.layer.vocab_size; }
  // Columns of the fused target hidden states fc reads: aux_layer_ids.size() * target hidden.
  int64_t fc_input_size() const {
    return static_cast<int64_t>(config_.aux_layer_ids.size()) * config_.target_hidden_size;
  }
  // Draft id -> target id ([draft_vocab_size]).
  std::span<const int32_t> draft_to_target() const { return draft_to_target_; }

  // fc: features [rows, fc_input_size()] f32 -> out [rows, hidden] f32.
  void Fuse(const float* features, int64_t rows, float* out) const;

  // Runs `rows`: prenorm gets [rows.size(), hidden] f32 (the next step's hidden inputs) and
  // logits [number of rows with .logits, vocab_size()] f32 over the TARGET vocabulary, -inf at
  // ids outside the draft vocabulary, in row order. InvalidArgument for a token outside the
  // vocabulary, a null hidden state or cache, a slot not above its cache's last one, or a tree
  // row outside its tree (nothing is written then).
  absl::Status Forward(std::span<const Row> rows, std::vector<float>* prenorm,
                       std::vector<float>* logits);

  // The parameters as loaded (f32, row-major, nn.Linear layout [out, in]).
  struct Weights {
    std::vector<float> embed;        // [vocab, hidden]
    std::vector<float> fc;           // [hidden, fc_input]
    std::vector<float> input_norm;   // [hidden] on the embedding
    std::vector<float> hidden_norm;  // [hidden] on the hidden input
    std::vector<float> qkv;          // [q_size + 2 * kv_size, 2 * hidden]: q, k, v rows stacked
    std::vector<float> o;            // [hidden, q_size]
    std::vector<float> post_norm;    // [hidden]
    std::vector<float> gate_up;      // [2 * intermediate, hidden]: gate rows, then up rows
    std::vector<float> down;         // [hidden, intermediate]
    std::vector<float> norm;         // [hidden] final
    std::vector<float> lm_head;      // [draft_vocab, hidden]
  };
  // A device backend uploads them (engine/runner/cuda/cuda_eagle3.h).
  const Weights& weights() const { return w_; }
  // Whether the checkpoint has no embedding of its own (weights().embed is the target's).
  bool shares_target_embedding() const { return shares_target_embedding_; }

 private:
  explicit Eagle3Head(Eagle3Config config) : config_(std::move(config)) {}
  absl::Status LoadWeights(const std::string& dir, const std::string& target_dir);
  absl::Status LoadDraftMap(const std::string& dir);
  // Checks row r of `rows` as Forward's comment says.
  static absl::Status CheckRow(std::span<const Row> rows, size_t r, int32_t vocab);
  // Attention of row r over the entries of its cache it sees (Row); q [q_size] -> out.
  void Attend(const Row& row, const float* q, float* out);

  Eagle3Config config_;
  Weights w_;
  std::vector<int32_t> draft_to_target_;  // [draft_vocab]
  bool shares_target_embedding_ = false;
  std::vector<float> inv_freq_;  // [head_dim / 2] RoPE
  // Scratch, [rows, ...] f32.
  std::vector<float> x_, qkv_, attn_, proj_, residual_, gate_up_, act_, normed_, scores_;
  std::vector<float> cos_, sin_;
  std::vector<int32_t> keys_, path_;  // Attend's cache entries and tree path
};

}  // namespace specd
