// NSA ops of the check table (kernels/cuda/nsa.h), each over an NsaProblem (nsa_problem.h):
//   nsa_compress  block means of the blocks the verification queries complete; bit-exact
//   nsa_select    the compressed branch (the flash-attention rule) and the own selections
//                 (equal to the reference's up to near ties: fails on any other difference)
//   nsa_attend    the SSV grouped attend (C = 1 is the per-query kernel), modes exact and shared,
//                 over selections with adjacent overlap 0.5 / 0.7 / 0.9; the flash-attention rule
//   nsa_decode    one token per sequence: select, then attend over its own selections
// Perf rows are nsa-8b's shapes (32 q heads, 2 kv heads, head_dim 128, B 64, S 16, W 512) at 4K /
// 32K / 64K, batch 1 and 8, K + 1 = 8 queries; BytesMoved is what each op must read (attend: the
// groups' unions), so grouped and per-query attend rows compare by time and by GB/s.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/check/nsa_problem.h"
#include "kernels/check/op_families.h"

namespace specd::kernels::check {
namespace {

enum class NsaOp { kCompress, kSelect, kAttend, kDecode };

struct NsaParams {
  NsaOp op = NsaOp::kAttend;
  NsaProblemSpec spec;
  std::string name;  // shape name for the label
};

NsaShape Shape(int32_t q_heads, int32_t kv_heads, int32_t d, int32_t page, int32_t block,
               int32_t count, int32_t window) {
  return {q_heads, kv_heads, d,      page,
          block,   count,    window, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
}
NsaShape Nsa8b(int32_t page = 16) { return Shape(32, 2, 128, page, 64, 16, 512); }
NsaShape Codepair() { return Shape(16, 1, 32, 16, 32, 8, 64); }
NsaShape Dim64() { return Shape(8, 2, 64, 32, 16, 4, 40); }  // B < page: two entries per page

int NumSms() {
  int device = 0, num_sms = 0;
  SPECD_CUDA_CHECK(cudaGetDevice(&device));
  SPECD_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  return num_sms;
}

std::string Label(const NsaParams& p) {
  const NsaProblemSpec& s = p.spec;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s ctx=%d b=%d q=%d", p.name.c_str(), s.context, s.batch,
                s.queries);
  std::string label = buf;
  if (p.op == NsaOp::kAttend) {
    std::snprintf(buf, sizeof(buf), " C=%d %s ov=%.1f", s.group_size, s.shared ? "shared" : "exact",
                  s.overlap);
    label += buf;
  }
  return label;
}

OpShape ShapeOf(const NsaParams& p) {
  const NsaProblemSpec& s = p.spec;
  OpShape o;
  o.batch = s.batch;
  o.num_tokens = int64_t{s.batch} * s.queries + s.padding_tokens;
  o.width = s.group_size * 1000 + static_cast<int64_t>(std::lround(s.overlap * 10)) * 10 +
            (s.shared ? 1 : 0);
  o.num_heads = s.shape.num_q_heads;
  o.num_kv_heads = s.shape.num_kv_heads;
  o.head_dim = s.shape.head_dim;
  o.context = s.context;
  o.block_size = s.shape.page_size;
  o.window = s.shape.window_size;
  o.label = Label(p);
  return o;
}

// Kernel rows of padding tokens are unspecified: zeroed before comparing.
std::vector<double> WithoutPadding(const NsaProblem& p, std::vector<double> values) {
  const int64_t row = int64_t{p.spec.shape.num_q_heads} * p.spec.shape.head_dim;
  for (int64_t t = 0; t < p.num_tokens(); ++t) {
    if (p.token_seqs[t] < 0) std::fill_n(values.begin() + t * row, row, 0.0);
  }
  return values;
}

class NsaCase : public OpCase {
 public:
  explicit NsaCase(const NsaParams& params)
      : params_(params), problem_(MakeNsaProblem(params.spec)), dev_(problem_) {
    const NsaShape& s = problem_.spec.shape;
    const int num_sms = NumSms();
    const int32_t ctx = problem_.max_context();
    const NsaGroups sg = dev_.SelectGroups(), ag = dev_.AttendGroups();
    select_splits_ = NsaSelectSplits(sg.num_groups, sg.max_group_size, ctx, num_sms, s);
    attend_splits_ = NsaAttendSplits(ag.num_groups, ag.max_group_size, ctx, num_sms, s);
    const size_t bytes =
        std::max(NsaSelectWorkspaceBytes(problem_.num_tokens(), select_splits_, ctx, s),
                 NsaAttendWorkspaceBytes(problem_.num_tokens(), ag.num_groups, ag.max_group_size,
                                         attend_splits_, ctx, s));
    workspace_ = std::make_unique<DeviceBuffer>(std::max<size_t>(bytes, 256));
    if (params_.op == NsaOp::kAttend && problem_.spec.poison) {
      std::vector<uint16_t> k = problem_.k, v = problem_.v;
      problem_.PoisonUnread(&k, &v);
      dev_.k.Upload(k);
      dev_.v.Upload(v);
    }
    if (params_.op == NsaOp::kCompress) dev_.cmp_k.Poison(), dev_.cmp_v.Poison();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    switch (params_.op) {
      case NsaOp::kCompress:
        return NsaCompress(dev_.Cache(), dev_.Tokens(), problem_.spec.shape, stream);
      case NsaOp::kSelect:
        return Select(stream);
      case NsaOp::kAttend:
        return Attend(dev_.selections.as<int32_t>(), stream);
      case NsaOp::kDecode: {
        const cudaError_t err = Select(stream);
        return err != cudaSuccess ? err : Attend(dev_.selections_out.as<int32_t>(), stream);
      }
    }
    return cudaErrorInvalidValue;
  }

  int64_t BytesMoved() const override {
    switch (params_.op) {
      case NsaOp::kCompress:
        return problem_.CompressBytes();
      case NsaOp::kSelect:
        return problem_.SelectBytes();
      case NsaOp::kAttend:
        return problem_.AttendBytes();
      case NsaOp::kDecode:
        return problem_.SelectBytes() + problem_.AttendBytes();
    }
    return 0;
  }

  std::vector<ErrorCheck> Check() override {
    if (params_.op == NsaOp::kCompress) return CheckCompress();
    std::vector<ErrorCheck> checks;
    const bool select = params_.op != NsaOp::kAttend;
    if (select) dev_.o_cmp.Poison();
    dev_.out.Poison();
    dev_.selections_out.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> o_cmp_bits = problem_.o_cmp;
    std::vector<int32_t> selections = problem_.selections;
    if (select) {
      const NsaSelectReference ref = RunSelectReference(problem_);
      o_cmp_bits = dev_.o_cmp.Download<uint16_t>();
      checks.push_back(CompareWithReference("o_cmp",
                                            WithoutPadding(problem_, WidenToDouble(o_cmp_bits)),
                                            ref.o_cmp_baseline, ref.o_cmp64));
      selections = dev_.selections_out.Download<int32_t>();
      const SelectionComparison c = CompareSelections(problem_, selections, ref, 1e-4);
      ErrorCheck sel;
      sel.output = "selections (" + std::to_string(c.near_ties) + " near ties of " +
                   std::to_string(c.compared) + ")";
      sel.kernel_error = static_cast<double>(c.mismatches);
      sel.passed = c.mismatches == 0;
      checks.push_back(sel);
      if (params_.op == NsaOp::kSelect) return checks;
    }
    const NsaAttendReference ref = RunAttendReference(problem_, selections, o_cmp_bits);
    checks.push_back(CompareWithReference(
        "out", WithoutPadding(problem_, WidenToDouble(dev_.out.Download<uint16_t>())),
        ref.out_baseline, ref.out64));
    return checks;
  }

 private:
  cudaError_t Select(cudaStream_t stream) {
    const NsaShape& s = problem_.spec.shape;
    return NsaSelect(dev_.q.as<__nv_bfloat16>(), int64_t{s.num_q_heads} * s.head_dim, dev_.Cache(),
                     dev_.Tokens(), dev_.SelectGroups(), s, problem_.max_context(), select_splits_,
                     dev_.o_cmp.as<__nv_bfloat16>(), int64_t{s.num_q_heads} * s.head_dim,
                     dev_.selections_out.as<int32_t>(), workspace_->as<void>(), workspace_->bytes(),
                     stream);
  }

  cudaError_t Attend(const int32_t* selections, cudaStream_t stream) {
    const NsaShape& s = problem_.spec.shape;
    const int64_t row = int64_t{s.num_q_heads} * s.head_dim;
    return NsaAttend(dev_.q.as<__nv_bfloat16>(), row, dev_.Cache(), dev_.Tokens(),
                     dev_.AttendGroups(), selections, problem_.spec.shared,
                     dev_.o_cmp.as<__nv_bfloat16>(), row, dev_.gates.as<__nv_bfloat16>(),
                     3 * int64_t{s.num_q_heads}, s, problem_.max_context(), attend_splits_,
                     dev_.out.as<__nv_bfloat16>(), row, workspace_->as<void>(), workspace_->bytes(),
                     stream);
  }

  // The entries of the blocks the tokens complete equal the host's bf16 means bit for bit; every
  // other entry keeps its poison.
  std::vector<ErrorCheck> CheckCompress() {
    dev_.cmp_k.Poison();
    dev_.cmp_v.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> k = dev_.cmp_k.Download<uint16_t>();
    const std::vector<uint16_t> v = dev_.cmp_v.Download<uint16_t>();
    const ref::NsaShape rs = problem_.RefShape();
    std::vector<char> written(k.size(), 0);
    int64_t wrong = 0;
    for (int64_t t = 0; t < problem_.num_tokens(); ++t) {
      const int32_t p = problem_.positions[t], seq = problem_.token_seqs[t];
      if (seq < 0 || (p + 1) % rs.block_size != 0) continue;
      const int32_t* table = &problem_.tables[seq * problem_.max_blocks_per_seq];
      for (int64_t h = 0; h < rs.num_kv_heads; ++h) {
        const int64_t entry = ref::NsaEntryOffset(table, p / rs.block_size, h, rs);
        for (int64_t x = 0; x < rs.head_dim; ++x) {
          written[entry + x] = 1;
          wrong += k[entry + x] != problem_.cmp_k[entry + x];
          wrong += v[entry + x] != problem_.cmp_v[entry + x];
        }
      }
    }
    int64_t touched = 0;
    for (size_t i = 0; i < k.size(); ++i) {
      touched += !written[i] && (k[i] != 0xffff || v[i] != 0xffff);
    }
    ErrorCheck means{"means (bits differing)", static_cast<double>(wrong), 0, 0, wrong == 0};
    ErrorCheck others{"untouched entries written", static_cast<double>(touched), 0, 0,
                      touched == 0};
    return {means, others};
  }

  NsaParams params_;
  NsaProblem problem_;
  NsaDevice dev_;
  int32_t select_splits_ = 1, attend_splits_ = 1;
  std::unique_ptr<DeviceBuffer> workspace_;
};

NsaParams Params(NsaOp op, const std::string& name, const NsaShape& shape, int32_t batch,
                 int32_t context, int32_t queries, int32_t group_size = 1, bool shared = false,
                 double overlap = 0.7, bool check = true) {
  NsaParams p;
  p.op = op;
  p.name = name;
  p.spec.shape = shape;
  p.spec.batch = batch;
  p.spec.context = context;
  p.spec.context_step = check ? 37 : 0;
  p.spec.queries = queries;
  p.spec.group_size = group_size;
  p.spec.shared = shared;
  p.spec.overlap = overlap;
  p.spec.padding_tokens = check ? 1 : 0;
  p.spec.poison = check;
  return p;
}

std::vector<NsaParams> CheckRows(NsaOp op) {
  std::vector<NsaParams> rows;
  const int q = op == NsaOp::kDecode ? 1 : 8;
  for (int c : op == NsaOp::kAttend ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1}) {
    for (bool shared : op == NsaOp::kAttend && c > 1 ? std::vector<bool>{false, true}
                                                     : std::vector<bool>{false}) {
      rows.push_back(Params(op, "codepair", Codepair(), 2, 1000, q, c, shared, 0.7));
      rows.push_back(
          Params(op, "d64", Dim64(), 3, 777, op == NsaOp::kDecode ? 1 : 5, c, shared, 0.5));
      // 3008: the last query ends a block (the compress row has a block to write).
      rows.push_back(Params(op, "nsa8b", Nsa8b(64), 1, op == NsaOp::kCompress ? 3008 : 3001, q, c,
                            shared, 0.9));
      rows.push_back(Params(op, "short", Nsa8b(32), 2, 300, q, c, shared, 0.7));
    }
  }
  return rows;
}

std::vector<NsaParams> PerfRows(NsaOp op) {
  std::vector<NsaParams> rows;
  for (int32_t context : {4096, 32768, 65536}) {
    for (int32_t batch : {1, 8}) {
      if (op == NsaOp::kAttend) {
        for (double overlap : {0.5, 0.7, 0.9}) {
          for (int c : {1, 2, 4, 8}) {
            if (c != 4 && overlap != 0.7 && c != 1) continue;
            rows.push_back(
                Params(op, "nsa8b", Nsa8b(), batch, context, 8, c, false, overlap, false));
          }
        }
        rows.push_back(Params(op, "nsa8b", Nsa8b(), batch, context, 8, 4, true, 0.7, false));
      } else {
        rows.push_back(Params(op, "nsa8b", Nsa8b(), batch, context, op == NsaOp::kDecode ? 1 : 8, 1,
                              false, 0.7, false));
      }
    }
  }
  return rows;
}

OpSpec Spec(const std::string& name, NsaOp op) {
  return MakeLabelledSpec<NsaParams>(
      name, CheckRows(op), PerfRows(op), ShapeOf,
      [](const NsaParams& p) -> std::unique_ptr<OpCase> { return std::make_unique<NsaCase>(p); });
}

}  // namespace

void AddNsaOps(std::vector<OpSpec>* table) {
  table->push_back(Spec("nsa_compress", NsaOp::kCompress));
  table->push_back(Spec("nsa_select", NsaOp::kSelect));
  table->push_back(Spec("nsa_attend", NsaOp::kAttend));
  table->push_back(Spec("nsa_decode", NsaOp::kDecode));
}

}  // namespace specd::kernels::check
