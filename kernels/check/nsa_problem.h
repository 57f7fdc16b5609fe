// NSA test problems for the op table (op_table_nsa.cc) and the NSA GPU test
// (kernels/cuda/nsa_cuda_test.cc): a batch of sequences in a paged bf16 cache behind shuffled
// tables, each with K + 1 consecutive verification queries ending at its last position, the
// compressed cache of its complete blocks, gates, a compressed-branch output, and block
// selections whose adjacent queries share a controlled fraction of blocks (SSV's premise). Keys
// carry a per-block bias so compressed logits, and hence selections, are well separated. Slots
// no query may read hold NaN (check shapes), so a masking or addressing mistake shows up as an
// infinite error. Test and tool code only; one thread.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/check/cuda_check.h"
#include "kernels/cuda/nsa.h"
#include "kernels/ref/nsa.h"

namespace specd::kernels::check {

struct NsaProblemSpec {
  NsaShape shape;
  int32_t batch = 1;
  int32_t context = 0;         // sequence 0's length; its last query sits at context - 1
  int32_t context_step = 0;    // sequence s is context - s * context_step tokens long
  int32_t queries = 1;         // K + 1 consecutive queries per sequence (<= kNsaMaxGroupSize)
  int32_t group_size = 1;      // C: NsaAttend's groups (NsaSelect takes one group per sequence)
  bool shared = false;         // SSV mode shared: a group attends its first query's selection
  double overlap = 0.7;        // fraction of query t's blocks query t + 1 keeps
  int32_t padding_tokens = 0;  // extra tokens of sequence -1 (each its own group) at the end
  bool poison = true;          // NaN in unreadable slots; false (perf shapes): pooled random data
  uint64_t seed = 1;
};

// Host data of one problem (bf16 as bits).
struct NsaProblem {
  NsaProblemSpec spec;
  int32_t max_blocks_per_seq = 0;
  int64_t num_pages = 0;
  std::vector<int32_t> tables;         // [batch, max_blocks_per_seq]
  std::vector<int32_t> lens;           // [batch]
  std::vector<int32_t> positions;      // [num_tokens]
  std::vector<int32_t> token_seqs;     // [num_tokens]
  std::vector<int32_t> select_groups;  // [num_select_groups, 2]
  std::vector<int32_t> attend_groups;  // [num_attend_groups, 2]
  std::vector<int32_t> selections;     // [num_tokens, num_kv_heads, S] (overlap-controlled)
  std::vector<uint16_t> k, v;          // [num_pages, num_kv_heads, page_size, head_dim]
  std::vector<uint16_t> cmp_k, cmp_v;  // [num_pages, num_kv_heads, epp, head_dim]
  std::vector<uint16_t> q;             // [num_tokens, num_q_heads, head_dim]
  std::vector<uint16_t> gates;         // [num_tokens, 3 num_q_heads]
  std::vector<uint16_t> o_cmp;         // [num_tokens, num_q_heads, head_dim]

  int64_t num_tokens() const { return static_cast<int64_t>(positions.size()); }
  int32_t max_context() const { return spec.context; }
  ref::NsaShape RefShape() const;
  // The selection token t attends in the spec's mode (its own, or its group's first's).
  int64_t AttendedToken(int64_t t) const;
  // Least bytes each op reads: compress (the completed blocks' K/V), select (every visible
  // compressed entry, q), attend (each group's union of keys up to its last query, q, o_cmp,
  // gates; and out written).
  int64_t CompressBytes() const;
  int64_t SelectBytes() const;
  int64_t AttendBytes() const;
  // Attend group g's union for kv head h: [p_last / B + 1] flags of the blocks it reads (the
  // attended selections' and the window range's); empty for a padding or empty group.
  std::vector<char> UnionBlocks(int64_t group, int64_t kv_head) const;
  // NaN into every K/V row (of k_bits / v_bits, this problem's cache layout) that no attend
  // group loads: a kernel reading beyond its union then fails.
  void PoisonUnread(std::vector<uint16_t>* k_bits, std::vector<uint16_t>* v_bits) const;
};

NsaProblem MakeNsaProblem(const NsaProblemSpec& spec);

// Query selections with adjacent overlap: query 0 takes the forced blocks {0, i - 1, i} and
// random others up to min(S, i + 1); query t + 1 keeps round(overlap * S) of query t's blocks
// (its forced blocks count, and are always kept), then fills with blocks query t lacks.
// positions: one sequence's queries, ascending. Returns [queries, S] int32, ascending, -1 padded.
std::vector<int32_t> OverlapSelections(const std::vector<int32_t>& positions, int64_t block_size,
                                       int64_t block_counts, double overlap, std::mt19937_64& rng);

// The fraction of query t + 1's blocks that query t also selected, averaged over adjacent pairs
// of the same sequence and kv head (selections [num_tokens, kv_heads, S]).
double MeasuredOverlap(const NsaProblem& p);

// The references of NsaSelect (o_cmp and the own selections; fp64 and the bf16-rounded fp32
// baseline, block scores in fp64) and NsaAttend (over `selections` and `o_cmp_bits`, in the
// problem's mode and attend groups).
struct NsaSelectReference {
  std::vector<double> o_cmp64, o_cmp_baseline, scores;  // scores [T, kv_heads, score_stride]
  std::vector<int32_t> selections;
  int64_t score_stride = 0;
};
NsaSelectReference RunSelectReference(const NsaProblem& p);
struct NsaAttendReference {
  std::vector<double> out64, out_baseline;
};
NsaAttendReference RunAttendReference(const NsaProblem& p, const std::vector<int32_t>& selections,
                                      const std::vector<uint16_t>& o_cmp_bits);

// Selections of the kernel against the reference's, (token, kv head) by (token, kv head): one
// differs only by a near tie when every block in one and not the other scores within `tol` of
// the S-th highest score (the reference's fp64 block scores).
struct SelectionComparison {
  int64_t compared = 0, equal = 0, near_ties = 0, mismatches = 0;
};
SelectionComparison CompareSelections(const NsaProblem& p, const std::vector<int32_t>& kernel,
                                      const NsaSelectReference& ref, double tol);

// Device copies of a problem's inputs, and its outputs' buffers.
struct NsaDevice {
  DeviceBuffer k, v, cmp_k, cmp_v, tables, positions, token_seqs, select_groups, attend_groups,
      selections, q, gates, o_cmp, out, selections_out;

  explicit NsaDevice(const NsaProblem& p);
  void Upload(const NsaProblem& p);  // inputs; outputs poisoned
  NsaCache Cache() const;
  NsaTokens Tokens() const;
  NsaGroups SelectGroups() const;
  NsaGroups AttendGroups() const;
  int64_t num_tokens = 0;
  int32_t max_blocks_per_seq = 0, num_select_groups = 0, num_attend_groups = 0;
  int32_t queries = 0, group_size = 0;
};

}  // namespace specd::kernels::check
