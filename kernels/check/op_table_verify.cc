// Verification ops of the table: greedy acceptance (ballot and serial scans), fused
// verify-and-pack (both paths), stochastic acceptance and the token-tree walks (greedy and
// sampled), each against kernels/ref/verify.h.
// Every output is an integer or a copied byte, so "within tolerance" here means equal: the
// reference is its own baseline and the atol of CompareWithReference stays below 1.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "kernels/check/op_families.h"
#include "kernels/cuda/verify.h"
#include "kernels/ref/verify.h"

namespace specd::kernels::check {
namespace {

constexpr int32_t kGreedyVocab = 32000;

// What a verify case needs beyond OpShape; looked up by the shape's label.
struct VerifyParams {
  int64_t batch = 0;
  int64_t max_draft_len = 0;
  bool ragged = false;
  int64_t kv_row_bytes = 0;  // fused pack
  int64_t vocab = 0;         // stochastic
  bool point_mass = false;   // stochastic: deterministic drafts (no q rows)
};

// Ragged draft counts: the first sequence has none, the last the maximum, the rest uniform.
std::vector<int32_t> CuDraftLens(const VerifyParams& v) {
  std::vector<int32_t> cu(v.batch + 1, 0);
  std::mt19937_64 rng(0xd1a6 + v.batch * 131 + v.max_draft_len);
  std::uniform_int_distribution<int64_t> len(0, v.max_draft_len);
  for (int64_t i = 0; i < v.batch; ++i) {
    int64_t k = v.max_draft_len;
    if (v.ragged && i == 0 && v.batch > 1) k = 0;
    if (v.ragged && i > 0 && i + 1 < v.batch) k = len(rng);
    cu[i + 1] = static_cast<int32_t>(cu[i] + k);
  }
  return cu;
}

int64_t NumPositions(const VerifyParams& v) { return CuDraftLens(v).back() + v.batch; }

OpShape ShapeOf(const VerifyParams& v) {
  OpShape s;
  s.batch = v.batch;
  s.n = v.max_draft_len;
  s.vocab = v.vocab;
  s.num_tokens = NumPositions(v);
  // The test name is op_numtokens x width: keep (positions, width) unique per op.
  s.width = v.vocab > 0 ? v.vocab : (v.kv_row_bytes > 0 ? v.kv_row_bytes : v.max_draft_len);
  std::string label = "b=" + std::to_string(v.batch) + " K=" + std::to_string(v.max_draft_len);
  if (v.ragged) label += " ragged";
  if (v.kv_row_bytes > 0) label += " kv=" + std::to_string(v.kv_row_bytes) + "B";
  if (v.vocab > 0) label += " V=" + std::to_string(v.vocab);
  if (v.point_mass) label += " point-mass";
  s.label = label;
  return s;
}

ErrorCheck Exact(std::string name, const std::vector<int32_t>& kernel,
                 const std::vector<int32_t>& ref) {
  const std::vector<double> k(kernel.begin(), kernel.end()), r(ref.begin(), ref.end());
  return CompareWithReference(std::move(name), k, r, r);
}

ErrorCheck ExactBytes(std::string name, const std::vector<uint8_t>& kernel,
                      const std::vector<uint8_t>& ref) {
  const std::vector<double> k(kernel.begin(), kernel.end()), r(ref.begin(), ref.end());
  return CompareWithReference(std::move(name), k, r, r);
}

// Drafts and target tokens as the study's generator: sequence i accepts k_i ~ Binomial(K_i,
// alpha) (alpha cycling 0.3, 0.6, 0.9; every 4th sequence accepts all, every 5th none); the
// target agrees before k_i and differs at k_i.
struct GreedyInputs {
  std::vector<int32_t> cu, drafts, targets, slots;
  std::vector<uint8_t> kv;
};

GreedyInputs MakeGreedyInputs(const VerifyParams& v) {
  GreedyInputs in;
  in.cu = CuDraftLens(v);
  std::mt19937_64 rng(0x9eed + v.batch * 7919 + v.max_draft_len * 31 + v.ragged);
  std::uniform_int_distribution<int32_t> token(0, kGreedyVocab - 1);
  in.drafts.resize(in.cu.back());
  for (int32_t& d : in.drafts) d = token(rng);
  in.targets.resize(in.cu.back() + v.batch);
  const double alphas[] = {0.3, 0.6, 0.9};
  for (int64_t i = 0; i < v.batch; ++i) {
    const int32_t start = in.cu[i], num = in.cu[i + 1] - start;
    int32_t k = std::binomial_distribution<int32_t>(num, alphas[i % 3])(rng);
    if (i % 4 == 3) k = num;
    if (i % 5 == 4) k = 0;
    int32_t* t = in.targets.data() + start + i;
    for (int32_t j = 0; j <= num; ++j) t[j] = j < num ? in.drafts[start + j] : token(rng);
    if (k < num) t[k] = (in.drafts[start + k] + 1 + token(rng) % (kGreedyVocab - 1)) % kGreedyVocab;
  }
  in.slots.resize(in.targets.size());
  std::uniform_int_distribution<int32_t> slot(0, 1 << 20);
  for (int32_t& s : in.slots) s = slot(rng);
  in.kv.resize(in.targets.size() * v.kv_row_bytes);
  for (uint8_t& b : in.kv) b = static_cast<uint8_t>(rng());
  return in;
}

// Device copies of the greedy inputs and the acceptance outputs.
class GreedyBuffers {
 public:
  explicit GreedyBuffers(const VerifyParams& v)
      : params_(v),
        in_(MakeGreedyInputs(v)),
        cu_(in_.cu.size() * sizeof(int32_t)),
        drafts_(in_.drafts.size() * sizeof(int32_t)),
        targets_(in_.targets.size() * sizeof(int32_t)),
        accepted_(v.batch * sizeof(int32_t)),
        next_(v.batch * sizeof(int32_t)) {
    cu_.Upload(in_.cu);
    drafts_.Upload(in_.drafts);
    targets_.Upload(in_.targets);
  }

  DraftLayout Layout() const {
    return {params_.ragged ? cu_.as<int32_t>() : nullptr, params_.batch, params_.max_draft_len};
  }
  ref::DraftLayout RefLayout() const {
    return {params_.ragged ? in_.cu.data() : nullptr, params_.batch, params_.max_draft_len};
  }

  const VerifyParams& params() const { return params_; }
  const GreedyInputs& in() const { return in_; }
  const int32_t* drafts() const { return drafts_.as<int32_t>(); }
  const int32_t* targets() const { return targets_.as<int32_t>(); }
  DeviceBuffer& accepted() { return accepted_; }
  DeviceBuffer& next() { return next_; }

  // The reference's acceptance results.
  void Reference(std::vector<int32_t>* accepted, std::vector<int32_t>* next) const {
    accepted->assign(params_.batch, -1);
    next->assign(params_.batch, -1);
    ref::VerifyGreedy(RefLayout(), in_.drafts.data(), in_.targets.data(), accepted->data(),
                      next->data());
  }

  int64_t TokenBytes() const {
    return static_cast<int64_t>((in_.drafts.size() + in_.targets.size()) * sizeof(int32_t)) +
           2 * params_.batch * static_cast<int64_t>(sizeof(int32_t));
  }

 private:
  VerifyParams params_;
  GreedyInputs in_;
  DeviceBuffer cu_;        // [batch + 1] int32
  DeviceBuffer drafts_;    // [num_drafts] int32
  DeviceBuffer targets_;   // [num_drafts + batch] int32
  DeviceBuffer accepted_;  // [batch] int32
  DeviceBuffer next_;      // [batch] int32
};

// verify_ballot and verify_serial.
class GreedyScanCase : public OpCase {
 public:
  GreedyScanCase(const VerifyParams& v, bool ballot) : ballot_(ballot), buffers_(v) {}

  cudaError_t Launch(cudaStream_t stream) override {
    auto* accepted = buffers_.accepted().as<int32_t>();
    auto* next = buffers_.next().as<int32_t>();
    return ballot_ ? VerifyGreedyBallot(buffers_.Layout(), buffers_.drafts(), buffers_.targets(),
                                        accepted, next, stream)
                   : VerifyGreedySerial(buffers_.Layout(), buffers_.drafts(), buffers_.targets(),
                                        accepted, next, stream);
  }

  int64_t BytesMoved() const override { return buffers_.TokenBytes(); }

  std::vector<ErrorCheck> Check() override {
    buffers_.accepted().Poison();
    buffers_.next().Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> accepted, next;
    buffers_.Reference(&accepted, &next);
    return {Exact("accepted_lens", buffers_.accepted().Download<int32_t>(), accepted),
            Exact("next_tokens", buffers_.next().Download<int32_t>(), next)};
  }

 private:
  bool ballot_;
  GreedyBuffers buffers_;
};

// verify_fused_pack: Launch runs the auto path; Check runs the fused and the multi-block path
// (where the fused one fits), including the untouched rows past the committed ones.
class FusedPackCase : public OpCase {
 public:
  explicit FusedPackCase(const VerifyParams& v)
      : buffers_(v),
        rows_(static_cast<int64_t>(buffers_.in().targets.size())),
        cu_committed_((v.batch + 1) * sizeof(int32_t)),
        tokens_(rows_ * sizeof(int32_t)),
        slot_mapping_(rows_ * sizeof(int32_t)),
        slots_(rows_ * sizeof(int32_t)),
        kv_(rows_ * v.kv_row_bytes),
        packed_kv_(rows_ * v.kv_row_bytes) {
    slot_mapping_.Upload(buffers_.in().slots);
    kv_.Upload(buffers_.in().kv);
  }

  cudaError_t Launch(cudaStream_t stream) override { return Run(VerifyPackPath::kAuto, stream); }

  int64_t BytesMoved() const override {
    std::vector<int32_t> accepted, next;
    buffers_.Reference(&accepted, &next);
    int64_t committed = 0;
    for (int32_t k : accepted) committed += k + 1;
    const int64_t kv = buffers_.params().kv_row_bytes;
    return buffers_.TokenBytes() + committed * (3 * 4 + 2 * kv) + (buffers_.params().batch + 1) * 4;
  }

  std::vector<ErrorCheck> Check() override {
    std::vector<ErrorCheck> checks;
    const bool fits = buffers_.params().batch <= kMaxFusedVerifyBatch;
    for (VerifyPackPath path : {VerifyPackPath::kFused, VerifyPackPath::kMultiBlock}) {
      if (path == VerifyPackPath::kFused && !fits) continue;
      const std::string prefix = path == VerifyPackPath::kFused ? "fused " : "multi-block ";
      for (ErrorCheck& c : CheckPath(path)) {
        c.output = prefix + c.output;
        checks.push_back(std::move(c));
      }
    }
    return checks;
  }

 private:
  cudaError_t Run(VerifyPackPath path, cudaStream_t stream) {
    const PackArgs pack{
        cu_committed_.as<int32_t>(),   tokens_.as<int32_t>(), slot_mapping_.as<int32_t>(),
        slots_.as<int32_t>(),          kv_.as<void>(),        packed_kv_.as<void>(),
        buffers_.params().kv_row_bytes};
    return VerifyGreedyAndPack(buffers_.Layout(), buffers_.drafts(), buffers_.targets(),
                               buffers_.accepted().as<int32_t>(), buffers_.next().as<int32_t>(),
                               pack, path, stream);
  }

  std::vector<ErrorCheck> CheckPath(VerifyPackPath path) {
    for (DeviceBuffer* b :
         {&buffers_.accepted(), &buffers_.next(), &cu_committed_, &tokens_, &slots_, &packed_kv_}) {
      b->Poison();
    }
    SPECD_CUDA_CHECK(Run(path, nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());

    const GreedyInputs& in = buffers_.in();
    std::vector<int32_t> accepted, next;
    buffers_.Reference(&accepted, &next);
    // Poisoned like the device buffers, so rows the kernel must not touch compare equal too.
    std::vector<int32_t> cu(buffers_.params().batch + 1, -1), tokens(rows_, -1), slots(rows_, -1);
    std::vector<uint8_t> packed(rows_ * buffers_.params().kv_row_bytes, 0xff);
    const ref::PackArgs pack{cu.data(),
                             tokens.data(),
                             in.slots.data(),
                             slots.data(),
                             in.kv.data(),
                             packed.data(),
                             buffers_.params().kv_row_bytes};
    ref::PackAccepted(buffers_.RefLayout(), in.drafts.data(), accepted.data(), next.data(), pack);
    std::vector<ErrorCheck> checks = {
        Exact("accepted_lens", buffers_.accepted().Download<int32_t>(), accepted),
        Exact("next_tokens", buffers_.next().Download<int32_t>(), next),
        Exact("cu_committed", cu_committed_.Download<int32_t>(), cu),
        Exact("committed_tokens", tokens_.Download<int32_t>(), tokens),
        Exact("committed_slots", slots_.Download<int32_t>(), slots)};
    if (buffers_.params().kv_row_bytes > 0) {
      checks.push_back(ExactBytes("packed_kv", packed_kv_.Download<uint8_t>(), packed));
    }
    return checks;
  }

  GreedyBuffers buffers_;
  int64_t rows_;               // num_drafts + batch
  DeviceBuffer cu_committed_;  // [batch + 1] int32
  DeviceBuffer tokens_;        // [rows] int32
  DeviceBuffer slot_mapping_;  // [rows] int32
  DeviceBuffer slots_;         // [rows] int32
  DeviceBuffer kv_;            // [rows, kv_row_bytes] bytes
  DeviceBuffer packed_kv_;     // [rows, kv_row_bytes] bytes
};

// A peaked random distribution (softmax of 3 * normal logits).
std::vector<float> RandomDistribution(int64_t vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<float> row(vocab);
  double sum = 0;
  for (float& x : row) sum += (x = std::exp(logit(rng)));
  for (float& x : row) x = static_cast<float>(x / sum);
  return row;
}

// verify_stochastic inputs: q rows random, drafts drawn from them, p rows a random mix of the
// draft's distribution (q, or one-hot at the draft for point-mass drafts) and another one
// (acceptance from ~0 to 1; every 3rd sequence p = q: all accepted, bonus draws), independent
// uniforms. Sequence 1's first p row is q / 2 (not a distribution), so a rejection there leaves
// an empty residual and exercises the fallback draw.
struct StochasticInputs {
  std::vector<int32_t> cu, drafts;
  std::vector<float> q, p, uniforms;  // q empty for point-mass drafts
};

StochasticInputs MakeStochasticInputs(const VerifyParams& v) {
  StochasticInputs in;
  in.cu = CuDraftLens(v);
  const int64_t num_drafts = in.cu.back(), vocab = v.vocab;
  std::mt19937_64 rng(0x5a3d + v.batch * 7919 + v.max_draft_len * 31 + vocab);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  in.q.resize(num_drafts * vocab);
  in.drafts.resize(num_drafts);
  for (int64_t r = 0; r < num_drafts; ++r) {
    const auto row = RandomDistribution(vocab, rng);
    std::copy(row.begin(), row.end(), in.q.begin() + r * vocab);
    in.drafts[r] = std::discrete_distribution<int32_t>(row.begin(), row.end())(rng);
    if (v.point_mass) {
      std::fill(in.q.begin() + r * vocab, in.q.begin() + (r + 1) * vocab, 0.0f);
      in.q[r * vocab + in.drafts[r]] = 1.0f;
    }
  }
  in.p.resize((num_drafts + v.batch) * vocab);
  for (int64_t i = 0; i < v.batch; ++i) {
    const int64_t num = in.cu[i + 1] - in.cu[i];
    for (int64_t j = 0; j <= num; ++j) {
      const int64_t draft_row = in.cu[i] + j;
      auto row = RandomDistribution(vocab, rng);
      const float keep = i % 3 == 2 ? 1.0f : uniform(rng);
      for (int64_t x = 0; j < num && x < vocab; ++x) {
        const float q = in.q[draft_row * vocab + x];
        row[x] = i == 1 && j == 0 ? 0.5f * q : keep * q + (1 - keep) * row[x];
      }
      std::copy(row.begin(), row.end(), in.p.begin() + (draft_row + i) * vocab);
    }
  }
  in.uniforms.resize(num_drafts + v.batch);
  for (float& u : in.uniforms) u = uniform(rng);
  if (v.point_mass) in.q.clear();
  return in;
}

template <typename T>
DeviceBuffer Uploaded(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  buffer.Upload(host);
  return buffer;
}

class StochasticCase : public OpCase {
 public:
  explicit StochasticCase(const VerifyParams& v)
      : params_(v),
        in_(MakeStochasticInputs(v)),
        cu_(Uploaded(in_.cu)),
        drafts_(Uploaded(in_.drafts)),
        q_(Uploaded(in_.q)),
        p_(Uploaded(in_.p)),
        uniforms_(Uploaded(in_.uniforms)),
        accepted_(v.batch * sizeof(int32_t)),
        next_(v.batch * sizeof(int32_t)) {}

  cudaError_t Launch(cudaStream_t stream) override {
    const DraftLayout layout{params_.ragged ? cu_.as<int32_t>() : nullptr, params_.batch,
                             params_.max_draft_len};
    return VerifyStochastic(layout, drafts_.as<int32_t>(),
                            params_.point_mass ? nullptr : q_.as<float>(), p_.as<float>(),
                            params_.vocab, uniforms_.as<float>(), accepted_.as<int32_t>(),
                            next_.as<int32_t>(), stream);
  }

  // At least one row of p per sequence, read once.
  int64_t BytesMoved() const override {
    return params_.batch * params_.vocab * static_cast<int64_t>(sizeof(float));
  }

  std::vector<ErrorCheck> Check() override {
    accepted_.Poison();
    next_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> accepted(params_.batch, -1), next(params_.batch, -1);
    const ref::DraftLayout layout{params_.ragged ? in_.cu.data() : nullptr, params_.batch,
                                  params_.max_draft_len};
    ref::VerifyStochastic(layout, in_.drafts.data(), params_.point_mass ? nullptr : in_.q.data(),
                          in_.p.data(), params_.vocab, in_.uniforms.data(), accepted.data(),
                          next.data());
    return {Exact("accepted_lens", accepted_.Download<int32_t>(), accepted),
            Exact("next_tokens", next_.Download<int32_t>(), next)};
  }

 private:
  VerifyParams params_;
  StochasticInputs in_;
  DeviceBuffer cu_;        // [batch + 1] int32
  DeviceBuffer drafts_;    // [num_drafts] int32
  DeviceBuffer q_;         // [num_drafts, vocab] f32 (empty: point mass)
  DeviceBuffer p_;         // [num_drafts + batch, vocab] f32
  DeviceBuffer uniforms_;  // [num_drafts + batch] f32
  DeviceBuffer accepted_;  // [batch] int32
  DeviceBuffer next_;      // [batch] int32
};

// verify_tree_greedy and verify_tree_stochastic inputs. Sequence i's tree: a chain (i % 3 == 0),
// 4 beams (draft j under draft j - 4, the first 4 under the root), or a random recursive tree.
// Drafts mostly follow the target: greedy, draft j copies the target token at its parent's
// position with probability 0.7 (else a random token); sampled, it is the parent row's spike
// (0.6), a draw from that row (0.2) or a random token (0.2). Sampled rows: verify_stochastic's
// random distributions with 30-95% of the mass moved to one token (the spike, targets[r]).
struct TreeInputs {
  std::vector<int32_t> cu, drafts, parents, targets;
  std::vector<float> p, uniforms;  // sampled only
};

TreeInputs MakeTreeInputs(const VerifyParams& v) {
  TreeInputs in;
  in.cu = CuDraftLens(v);
  const int64_t positions = in.cu.back() + v.batch;
  const bool sampled = v.vocab > 0;
  const int64_t vocab = sampled ? v.vocab : kGreedyVocab;
  std::mt19937_64 rng(0x7ee + v.batch * 7919 + v.max_draft_len * 31 + vocab + v.ragged);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1);
  in.targets.resize(positions);
  if (sampled) {
    in.p.resize(positions * vocab);
    for (int64_t r = 0; r < positions; ++r) {  // a random row with a spike of 30-95% at targets[r]
      auto row = RandomDistribution(vocab, rng);
      const float spike = 0.3f + 0.65f * uniform(rng);
      in.targets[r] = token(rng);
      for (float& x : row) x *= 1.0f - spike;
      row[in.targets[r]] += spike;
      std::copy(row.begin(), row.end(), in.p.begin() + r * vocab);
    }
    in.uniforms.resize(positions);
    for (float& u : in.uniforms) u = uniform(rng);
  } else {
    for (int32_t& t : in.targets) t = token(rng);
  }
  in.drafts.resize(in.cu.back());
  in.parents.resize(in.cu.back());
  for (int64_t i = 0; i < v.batch; ++i) {
    const int64_t start = in.cu[i], k = in.cu[i + 1] - start;
    for (int64_t j = 0; j < k; ++j) {
      int32_t parent = static_cast<int32_t>(j) - 1;
      if (i % 3 == 1) parent = j < 4 ? -1 : static_cast<int32_t>(j) - 4;
      if (i % 3 == 2) parent = static_cast<int32_t>(rng() % (j + 1)) - 1;
      in.parents[start + j] = parent;
      const int64_t from = start + i + parent + 1;  // the parent's position
      const float pick = uniform(rng);
      int32_t& d = in.drafts[start + j];
      if (!sampled) {
        d = pick < 0.7f ? in.targets[from] : token(rng);
      } else if (pick < 0.6f) {
        d = in.targets[from];
      } else if (pick < 0.8f) {
        const float* row = in.p.data() + from * vocab;
        float u = uniform(rng);
        d = static_cast<int32_t>(vocab - 1);
        for (int64_t x = 0; x < vocab; ++x) {
          if ((u -= row[x]) < 0) {
            d = static_cast<int32_t>(x);
            break;
          }
        }
      } else {
        d = token(rng);
      }
    }
  }
  return in;
}

// Output poison: no token, length or draft index (and not -1, the draw of a row without mass).
constexpr int kTreePoisonByte = 0x5a;

class TreeCase : public OpCase {
 public:
  explicit TreeCase(const VerifyParams& v)
      : params_(v),
        in_(MakeTreeInputs(v)),
        cu_(Uploaded(in_.cu)),
        drafts_(Uploaded(in_.drafts)),
        parents_(Uploaded(in_.parents)),
        targets_(Uploaded(in_.targets)),
        p_(Uploaded(in_.p)),
        uniforms_(Uploaded(in_.uniforms)),
        accepted_(v.batch * sizeof(int32_t)),
        next_(v.batch * sizeof(int32_t)),
        paths_(std::max<size_t>(in_.drafts.size(), 1) * sizeof(int32_t)) {}

  cudaError_t Launch(cudaStream_t stream) override {
    const DraftLayout layout{params_.ragged ? cu_.as<int32_t>() : nullptr, params_.batch,
                             params_.max_draft_len};
    if (params_.vocab == 0) {
      return VerifyTreeGreedy(layout, drafts_.as<int32_t>(), parents_.as<int32_t>(),
                              targets_.as<int32_t>(), accepted_.as<int32_t>(), next_.as<int32_t>(),
                              paths_.as<int32_t>(), stream);
    }
    return VerifyTreeStochastic(layout, drafts_.as<int32_t>(), parents_.as<int32_t>(),
                                p_.as<float>(), params_.vocab, uniforms_.as<float>(),
                                accepted_.as<int32_t>(), next_.as<int32_t>(), paths_.as<int32_t>(),
                                stream);
  }

  // Greedy: the tokens, parents and outputs; sampled: at least one row of p per sequence.
  int64_t BytesMoved() const override {
    if (params_.vocab > 0) return params_.batch * params_.vocab * int64_t{sizeof(float)};
    return static_cast<int64_t>((2 * in_.drafts.size() + in_.targets.size() + 2 * params_.batch) *
                                sizeof(int32_t));
  }

  std::vector<ErrorCheck> Check() override {
    for (DeviceBuffer* out : {&accepted_, &next_, &paths_}) {
      SPECD_CUDA_CHECK(cudaMemset(out->as<void>(), kTreePoisonByte, out->bytes()));
    }
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    int32_t poison;
    std::memset(&poison, kTreePoisonByte, sizeof(poison));
    std::vector<int32_t> accepted(params_.batch, poison), next(params_.batch, poison);
    std::vector<int32_t> paths(paths_.bytes() / sizeof(int32_t), poison);
    const ref::DraftLayout layout{params_.ragged ? in_.cu.data() : nullptr, params_.batch,
                                  params_.max_draft_len};
    if (params_.vocab == 0) {
      ref::VerifyTreeGreedy(layout, in_.drafts.data(), in_.parents.data(), in_.targets.data(),
                            accepted.data(), next.data(), paths.data());
    } else {
      ref::VerifyTreeStochastic(layout, in_.drafts.data(), in_.parents.data(), in_.p.data(),
                                params_.vocab, in_.uniforms.data(), accepted.data(), next.data(),
                                paths.data());
    }
    return {Exact("accepted_lens", accepted_.Download<int32_t>(), accepted),
            Exact("next_tokens", next_.Download<int32_t>(), next),
            Exact("paths", paths_.Download<int32_t>(), paths)};
  }

 private:
  VerifyParams params_;
  TreeInputs in_;
  DeviceBuffer cu_;        // [batch + 1] int32
  DeviceBuffer drafts_;    // [num_drafts] int32
  DeviceBuffer parents_;   // [num_drafts] int32
  DeviceBuffer targets_;   // [num_drafts + batch] int32
  DeviceBuffer p_;         // [num_drafts + batch, vocab] f32 (sampled)
  DeviceBuffer uniforms_;  // [num_drafts + batch] f32 (sampled)
  DeviceBuffer accepted_;  // [batch] int32
  DeviceBuffer next_;      // [batch] int32
  DeviceBuffer paths_;     // [max(num_drafts, 1)] int32
};

std::vector<VerifyParams> TreeGreedyCheckParams() {
  return {{1, 8, false, 0, 0, false},   {3, 64, true, 0, 0, false},   {32, 16, true, 0, 0, false},
          {32, 64, false, 0, 0, false}, {100, 64, true, 0, 0, false}, {4, 300, true, 0, 0, false}};
}

std::vector<VerifyParams> TreeStochasticCheckParams() {
  return {{1, 8, false, 0, 32000, false},  {3, 64, true, 0, 1001, false},
          {32, 16, true, 0, 4096, false},  {4, 64, true, 0, 128256, false},
          {32, 64, false, 0, 1000, false}, {2, 0, false, 0, 50000, false}};
}

std::vector<VerifyParams> TreePerfParams(bool sampled) {
  const int64_t vocab = sampled ? 128256 : 0;
  return {{1, 16, false, 0, vocab, false},
          {32, 8, false, 0, vocab, false},
          {8, 64, true, 0, vocab, false}};
}

// batch {1, 3, 32, 100} x K {1, 4, 8, 31, 32, 33, 128}, uniform; ragged at batch 3, 32, 100.
std::vector<VerifyParams> GreedyCheckParams(bool with_kv) {
  // Row sizes cycle over the copy units: 16-byte, 4-byte, 1-byte and none.
  const int64_t kv_sizes[] = {256, 2004, 2002, 0, 4096};
  std::vector<VerifyParams> out;
  int index = 0;
  for (bool ragged : {false, true}) {
    for (int64_t batch : {1, 3, 32, 100}) {
      if (ragged && batch == 1) continue;
      for (int64_t k : {1, 4, 8, 31, 32, 33, 128}) {
        const int64_t kv = with_kv ? kv_sizes[index++ % 5] : 0;
        out.push_back({batch, k, ragged, kv, 0, false});
      }
    }
  }
  if (with_kv) {
    out.push_back({1000, 8, true, 256, 0, false});  // past the auto rule's batch
    out.push_back({1500, 4, true, 0, 0, false});    // past the fused kernel's batch
  }
  return out;
}

std::vector<VerifyParams> GreedyPerfParams(bool with_kv) {
  std::vector<VerifyParams> out = {
      {32, 8, false, 0, 0, false}, {32, 128, false, 0, 0, false}, {64, 128, true, 0, 0, false}};
  if (with_kv) {
    out.push_back({32, 8, false, 256, 0, false});
    out.push_back({32, 128, false, 1024, 0, false});
    out.push_back({32, 128, false, 4096, 0, false});
  }
  return out;
}

std::vector<VerifyParams> StochasticCheckParams() {
  return {{1, 1, false, 0, 1000, false},  {1, 4, false, 0, 32000, false},
          {3, 8, false, 0, 1001, false},  {3, 33, true, 0, 4096, false},
          {32, 4, true, 0, 32000, false}, {32, 128, false, 0, 1000, false},
          {100, 8, true, 0, 4096, false}, {4, 4, false, 0, 128256, false},
          {3, 8, false, 0, 32000, true},  {32, 31, true, 0, 2048, true},
          {2, 0, false, 0, 50000, false}};
}

std::vector<VerifyParams> StochasticPerfParams() {
  return {{1, 4, false, 0, 128256, false}, {32, 8, false, 0, 128256, false}};
}

// One op whose shapes map back to their params through the label.
OpSpec MakeSpec(std::string name, const std::vector<VerifyParams>& check,
                const std::vector<VerifyParams>& perf,
                std::function<std::unique_ptr<OpCase>(const VerifyParams&)> make) {
  return MakeLabelledSpec<VerifyParams>(std::move(name), check, perf, ShapeOf, std::move(make));
}

}  // namespace

void AddVerifyOps(std::vector<OpSpec>* table) {
  table->push_back(MakeSpec(
      "verify_ballot", GreedyCheckParams(false), GreedyPerfParams(false),
      [](const VerifyParams& v) { return std::make_unique<GreedyScanCase>(v, /*ballot=*/true); }));
  table->push_back(MakeSpec(
      "verify_serial", GreedyCheckParams(false), GreedyPerfParams(false),
      [](const VerifyParams& v) { return std::make_unique<GreedyScanCase>(v, /*ballot=*/false); }));
  table->push_back(
      MakeSpec("verify_fused_pack", GreedyCheckParams(true), GreedyPerfParams(true),
               [](const VerifyParams& v) { return std::make_unique<FusedPackCase>(v); }));
  table->push_back(
      MakeSpec("verify_stochastic", StochasticCheckParams(), StochasticPerfParams(),
               [](const VerifyParams& v) { return std::make_unique<StochasticCase>(v); }));
  table->push_back(MakeSpec("verify_tree_greedy", TreeGreedyCheckParams(), TreePerfParams(false),
                            [](const VerifyParams& v) { return std::make_unique<TreeCase>(v); }));
  table->push_back(MakeSpec("verify_tree_stochastic", TreeStochasticCheckParams(),
                            TreePerfParams(true),
                            [](const VerifyParams& v) { return std::make_unique<TreeCase>(v); }));
}

}  // namespace specd::kernels::check
