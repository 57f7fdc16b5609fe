#include "kernels/check/nsa_problem.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ref/bf16.h"

namespace specd::kernels::check {
namespace {

constexpr uint16_t kNaNBits = 0xffff;
constexpr size_t kPoolSize = size_t{1} << 22;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// n bf16 values from a fixed random pool at a random offset (perf shapes: fast to make).
std::vector<uint16_t> Pooled(size_t n, std::mt19937_64& rng) {
  static const std::vector<uint16_t> pool = [] {
    std::mt19937_64 pool_rng(0x9001);
    return RandomBf16(kPoolSize, -1.0f, 1.0f, pool_rng);
  }();
  std::vector<uint16_t> out(n);
  size_t offset = rng() % kPoolSize;
  for (size_t i = 0; i < n;) {
    const size_t run = std::min(n - i, kPoolSize - offset);
    std::copy_n(pool.begin() + offset, run, out.begin() + i);
    i += run;
    offset = (offset + 7919) % kPoolSize;
  }
  return out;
}

std::vector<uint16_t> Values(size_t n, float lo, float hi, bool random, std::mt19937_64& rng) {
  return random ? RandomBf16(n, lo, hi, rng) : Pooled(n, rng);
}

// Row of position `pos` (kv head h) in a paged cache of the problem's shape.
int64_t CacheRow(const NsaProblem& p, int64_t seq, int64_t pos, int64_t h) {
  const NsaShape& s = p.spec.shape;
  const int64_t page = p.tables[seq * p.max_blocks_per_seq + pos / s.page_size];
  return ((page * s.num_kv_heads + h) * s.page_size + pos % s.page_size) * s.head_dim;
}

// Fills each sequence's K/V rows: a per-(block, kv head) bias plus noise, so block means differ.
void FillKv(NsaProblem& p, std::mt19937_64& rng) {
  const NsaShape& s = p.spec.shape;
  const size_t values =
      static_cast<size_t>(p.num_pages) * s.num_kv_heads * s.page_size * s.head_dim;
  if (!p.spec.poison) {
    p.k = Pooled(values, rng);
    p.v = Pooled(values, rng);
    return;
  }
  p.k.assign(values, kNaNBits);
  p.v.assign(values, kNaNBits);
  std::uniform_real_distribution<float> bias(-1.5f, 1.5f), noise(-0.5f, 0.5f), value(-2.0f, 2.0f);
  std::vector<float> block_bias(s.head_dim);
  for (int64_t seq = 0; seq < p.spec.batch; ++seq) {
    for (int64_t h = 0; h < s.num_kv_heads; ++h) {
      for (int64_t pos = 0; pos < p.lens[seq]; ++pos) {
        if (pos % s.block_size == 0) {
          for (float& b : block_bias) b = bias(rng);
        }
        const int64_t row = CacheRow(p, seq, pos, h);
        for (int64_t x = 0; x < s.head_dim; ++x) {
          p.k[row + x] = FloatToBf16(block_bias[x] + noise(rng));
          p.v[row + x] = FloatToBf16(value(rng));
        }
      }
    }
  }
}

// Every complete block's means (ref::NsaCompress in fp32, rounded to bf16); NaN elsewhere.
void FillCompressed(NsaProblem& p, std::mt19937_64& rng) {
  const NsaShape& s = p.spec.shape;
  const size_t values =
      static_cast<size_t>(p.num_pages) * s.num_kv_heads * NsaEntriesPerPage(s) * s.head_dim;
  if (!p.spec.poison) {
    p.cmp_k = Pooled(values, rng);
    p.cmp_v = Pooled(values, rng);
    return;
  }
  std::vector<int32_t> ends, seqs;
  for (int32_t seq = 0; seq < p.spec.batch; ++seq) {
    for (int32_t e = s.block_size - 1; e < p.lens[seq]; e += s.block_size) {
      ends.push_back(e);
      seqs.push_back(seq);
    }
  }
  std::vector<float> k = WidenToFloat(p.k), v = WidenToFloat(p.v);
  std::vector<float> ck(values, std::nanf("")), cv(values, std::nanf(""));
  ref::NsaCompress(k.data(), v.data(), p.tables.data(), p.max_blocks_per_seq, ends.data(),
                   seqs.data(), static_cast<int64_t>(ends.size()), p.RefShape(), ck.data(),
                   cv.data());
  p.cmp_k.resize(values);
  p.cmp_v.resize(values);
  for (size_t i = 0; i < values; ++i) {
    p.cmp_k[i] = std::isnan(ck[i]) ? kNaNBits : FloatToBf16(ck[i]);
    p.cmp_v[i] = std::isnan(cv[i]) ? kNaNBits : FloatToBf16(cv[i]);
  }
}

void MakeTokens(NsaProblem& p) {
  const NsaProblemSpec& spec = p.spec;
  for (int32_t seq = 0; seq < spec.batch; ++seq) {
    const int32_t first = static_cast<int32_t>(p.positions.size());
    const int32_t queries = std::min(spec.queries, p.lens[seq]);
    for (int32_t i = 0; i < queries; ++i) {
      p.positions.push_back(p.lens[seq] - queries + i);
      p.token_seqs.push_back(seq);
    }
    p.select_groups.insert(p.select_groups.end(), {first, queries});
    for (int32_t g = 0; g < queries; g += spec.group_size) {
      p.attend_groups.insert(p.attend_groups.end(),
                             {first + g, std::min(spec.group_size, queries - g)});
    }
  }
  for (int32_t i = 0; i < spec.padding_tokens; ++i) {
    const int32_t t = static_cast<int32_t>(p.positions.size());
    p.positions.push_back(0);
    p.token_seqs.push_back(-1);
    p.select_groups.insert(p.select_groups.end(), {t, 1});
    p.attend_groups.insert(p.attend_groups.end(), {t, 1});
  }
}

}  // namespace

ref::NsaShape NsaProblem::RefShape() const {
  const NsaShape& s = spec.shape;
  return {s.num_q_heads, s.num_kv_heads, s.head_dim,    s.page_size,
          s.block_size,  s.block_counts, s.window_size, static_cast<double>(s.scale)};
}

int64_t NsaProblem::AttendedToken(int64_t t) const {
  if (!spec.shared) return t;
  for (size_t g = 0; g < attend_groups.size(); g += 2) {
    if (t >= attend_groups[g] && t < attend_groups[g] + attend_groups[g + 1]) {
      return attend_groups[g];
    }
  }
  return t;
}

std::vector<int32_t> OverlapSelections(const std::vector<int32_t>& positions, int64_t block_size,
                                       int64_t block_counts, double overlap, std::mt19937_64& rng) {
  const int64_t num = static_cast<int64_t>(positions.size());
  std::vector<int32_t> out(num * block_counts, -1), prev;
  for (int64_t t = 0; t < num; ++t) {
    const int32_t own = static_cast<int32_t>(positions[t] / block_size);
    std::vector<char> taken(own + 1, 0), in_prev(own + 1, 0);
    for (int32_t b : prev) {
      if (b <= own) in_prev[b] = 1;
    }
    std::vector<int32_t> sel;
    auto take = [&](int32_t b) {
      if (b < 0 || b > own || taken[b]) return;
      taken[b] = 1;
      sel.push_back(b);
    };
    if (own + 1 <= block_counts) {
      for (int32_t b = 0; b <= own; ++b) take(b);
    } else {
      for (int32_t b : {0, own - 1, own}) take(b);
      int64_t shared = 0;
      for (int32_t b : sel) shared += in_prev[b];
      const int64_t target = std::llround(overlap * static_cast<double>(block_counts));
      std::vector<int32_t> keep(prev);
      std::shuffle(keep.begin(), keep.end(), rng);
      for (int32_t b : keep) {
        if (shared >= target || static_cast<int64_t>(sel.size()) >= block_counts) break;
        if (b <= own && !taken[b]) take(b), ++shared;
      }
      std::vector<int32_t> fresh(own + 1);
      std::iota(fresh.begin(), fresh.end(), 0);
      std::shuffle(fresh.begin(), fresh.end(), rng);
      for (int pass = 0; pass < 2; ++pass) {  // blocks query t lacks, then any
        for (int32_t b : fresh) {
          if (static_cast<int64_t>(sel.size()) >= block_counts) break;
          if (pass == 1 || !in_prev[b]) take(b);
        }
      }
    }
    std::sort(sel.begin(), sel.end());
    std::copy(sel.begin(), sel.end(), out.begin() + t * block_counts);
    prev = sel;
  }
  return out;
}

double MeasuredOverlap(const NsaProblem& p) {
  const int64_t kv = p.spec.shape.num_kv_heads, count = p.spec.shape.block_counts;
  double sum = 0;
  int64_t pairs = 0;
  for (int64_t t = 1; t < p.num_tokens(); ++t) {
    if (p.token_seqs[t] < 0 || p.token_seqs[t] != p.token_seqs[t - 1]) continue;
    for (int64_t h = 0; h < kv; ++h) {
      const int32_t* a = &p.selections[(t * kv + h) * count];
      const int32_t* b = &p.selections[((t - 1) * kv + h) * count];
      int64_t size = 0, common = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (a[i] < 0) continue;
        ++size;
        common += std::find(b, b + count, a[i]) != b + count;
      }
      if (size > 0) sum += static_cast<double>(common) / size, ++pairs;
    }
  }
  return pairs > 0 ? sum / pairs : 0.0;
}

NsaProblem MakeNsaProblem(const NsaProblemSpec& spec) {
  NsaProblem p;
  p.spec = spec;
  const NsaShape& s = spec.shape;
  std::mt19937_64 rng(spec.seed * 0x9e3779b97f4a7c15ULL + spec.context * 131 + spec.batch);
  for (int32_t seq = 0; seq < spec.batch; ++seq) {
    p.lens.push_back(std::max(1, spec.context - seq * spec.context_step));
    const int64_t pages = CeilDiv(p.lens.back(), s.page_size);
    p.max_blocks_per_seq = std::max(p.max_blocks_per_seq, static_cast<int32_t>(pages) + 1);
    p.num_pages += pages;
  }
  p.num_pages += 2;  // owned by nobody
  std::vector<int32_t> pool(p.num_pages);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.tables.assign(static_cast<size_t>(spec.batch) * p.max_blocks_per_seq, -1);
  size_t next = 0;
  for (int32_t seq = 0; seq < spec.batch; ++seq) {
    for (int64_t i = 0; i < CeilDiv(p.lens[seq], s.page_size); ++i) {
      p.tables[seq * p.max_blocks_per_seq + i] = pool[next++];
    }
  }
  MakeTokens(p);
  const int64_t kv = s.num_kv_heads, count = s.block_counts;
  p.selections.assign(p.num_tokens() * kv * count, -1);
  for (size_t g = 0; g < p.select_groups.size(); g += 2) {
    const int32_t first = p.select_groups[g], n = p.select_groups[g + 1];
    if (p.token_seqs[first] < 0) continue;
    const std::vector<int32_t> pos(p.positions.begin() + first, p.positions.begin() + first + n);
    for (int64_t h = 0; h < kv; ++h) {
      const std::vector<int32_t> sel =
          OverlapSelections(pos, s.block_size, count, spec.overlap, rng);
      for (int32_t i = 0; i < n; ++i) {
        std::copy_n(sel.begin() + i * count, count,
                    p.selections.begin() + ((first + i) * kv + h) * count);
      }
    }
  }
  FillKv(p, rng);
  FillCompressed(p, rng);
  const size_t rows = static_cast<size_t>(p.num_tokens()) * s.num_q_heads;
  p.q = Values(rows * s.head_dim, -1.0f, 1.0f, spec.poison, rng);
  p.gates = Values(rows * 3, -3.0f, 3.0f, spec.poison, rng);
  p.o_cmp = Values(rows * s.head_dim, -1.0f, 1.0f, spec.poison, rng);
  return p;
}

int64_t NsaProblem::CompressBytes() const {
  const NsaShape& s = spec.shape;
  int64_t blocks = 0;
  for (int64_t t = 0; t < num_tokens(); ++t) {
    blocks += token_seqs[t] >= 0 && (positions[t] + 1) % s.block_size == 0;
  }
  return blocks * s.num_kv_heads * s.head_dim * 2 * 2 * (s.block_size + 1);
}

int64_t NsaProblem::SelectBytes() const {
  const NsaShape& s = spec.shape;
  int64_t entries = 0;
  for (size_t g = 0; g < select_groups.size(); g += 2) {
    const int32_t last = select_groups[g] + select_groups[g + 1] - 1;
    if (token_seqs[last] >= 0) entries += (positions[last] + 1) / s.block_size;
  }
  const int64_t rows = num_tokens() * s.num_q_heads * s.head_dim * 2;
  return entries * s.num_kv_heads * s.head_dim * 2 * 2 + 2 * rows +
         num_tokens() * s.num_kv_heads * s.block_counts * 4;
}

std::vector<char> NsaProblem::UnionBlocks(int64_t group, int64_t kv_head) const {
  const NsaShape& s = spec.shape;
  const int64_t bs = s.block_size, count = s.block_counts;
  const int32_t first = attend_groups[2 * group], n = attend_groups[2 * group + 1];
  if (n <= 0 || token_seqs[first] < 0) return {};
  const int64_t p_first = positions[first], p_last = positions[first + n - 1];
  std::vector<char> used(p_last / bs + 1, 0);
  for (int64_t b = std::max<int64_t>(0, p_first - s.window_size + 1) / bs; b <= p_last / bs; ++b) {
    used[b] = 1;
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t* sel = &selections[(AttendedToken(first + i) * s.num_kv_heads + kv_head) * count];
    for (int64_t k = 0; k < count; ++k) {
      if (sel[k] >= 0 && sel[k] <= positions[first + i] / bs) used[sel[k]] = 1;
    }
  }
  return used;
}

int64_t NsaProblem::AttendBytes() const {
  const NsaShape& s = spec.shape;
  const int64_t bs = s.block_size;
  int64_t keys = 0;
  for (int64_t g = 0; g < static_cast<int64_t>(attend_groups.size() / 2); ++g) {
    for (int64_t h = 0; h < s.num_kv_heads; ++h) {
      const std::vector<char> used = UnionBlocks(g, h);
      if (used.empty()) continue;
      const int64_t p_last = positions[attend_groups[2 * g] + attend_groups[2 * g + 1] - 1];
      for (int64_t b = 0; b <= p_last / bs; ++b) {
        if (used[b]) keys += std::min(bs, p_last + 1 - b * bs);
      }
    }
  }
  const int64_t rows = num_tokens() * s.num_q_heads;
  return keys * s.head_dim * 2 * 2 + rows * (3 * s.head_dim * 2 + 3 * 2);
}

void NsaProblem::PoisonUnread(std::vector<uint16_t>* k_bits, std::vector<uint16_t>* v_bits) const {
  const NsaShape& s = spec.shape;
  const int64_t bs = s.block_size;
  for (int64_t h = 0; h < s.num_kv_heads; ++h) {
    for (int32_t seq = 0; seq < spec.batch; ++seq) {
      std::vector<char> read(lens[seq], 0);
      for (int64_t g = 0; g < static_cast<int64_t>(attend_groups.size() / 2); ++g) {
        if (token_seqs[attend_groups[2 * g]] != seq) continue;
        const std::vector<char> used = UnionBlocks(g, h);
        const int64_t p_last = positions[attend_groups[2 * g] + attend_groups[2 * g + 1] - 1];
        for (int64_t j = 0; j <= p_last; ++j) read[j] |= used[j / bs];
      }
      for (int64_t j = 0; j < lens[seq]; ++j) {
        if (read[j]) continue;
        const int64_t row = CacheRow(*this, seq, j, h);
        std::fill_n(k_bits->begin() + row, s.head_dim, kNaNBits);
        std::fill_n(v_bits->begin() + row, s.head_dim, kNaNBits);
      }
    }
  }
}

NsaSelectReference RunSelectReference(const NsaProblem& p) {
  const NsaShape& s = p.spec.shape;
  const ref::NsaShape rs = p.RefShape();
  const int64_t t = p.num_tokens(), row = int64_t{s.num_q_heads} * s.head_dim;
  NsaSelectReference r;
  r.score_stride = CeilDiv(p.max_context(), s.block_size) + 1;
  r.o_cmp64.assign(t * row, 0.0);
  r.scores.assign(t * s.num_kv_heads * r.score_stride, 0.0);
  r.selections.assign(t * s.num_kv_heads * s.block_counts, -1);
  const std::vector<double> q64 = WidenToDouble(p.q), ck64 = WidenToDouble(p.cmp_k),
                            cv64 = WidenToDouble(p.cmp_v);
  ref::NsaSelect(q64.data(), row, ck64.data(), cv64.data(), p.tables.data(), p.max_blocks_per_seq,
                 p.positions.data(), p.token_seqs.data(), t, rs, r.o_cmp64.data(), row,
                 r.selections.data(), r.scores.data(), r.score_stride);
  std::vector<float> o32(t * row, 0.0f);
  std::vector<int32_t> sel32(r.selections.size());
  const std::vector<float> q32 = WidenToFloat(p.q), ck32 = WidenToFloat(p.cmp_k),
                           cv32 = WidenToFloat(p.cmp_v);
  ref::NsaSelect(q32.data(), row, ck32.data(), cv32.data(), p.tables.data(), p.max_blocks_per_seq,
                 p.positions.data(), p.token_seqs.data(), t, rs, o32.data(), row, sel32.data(),
                 static_cast<float*>(nullptr), 0, ref::ProbRounding::kBf16);
  r.o_cmp_baseline = RoundToBf16(o32);
  for (int64_t i = 0; i < t; ++i) {  // padding rows: neither reference writes them
    if (p.token_seqs[i] >= 0) continue;
    std::fill_n(r.o_cmp64.begin() + i * row, row, 0.0);
    std::fill_n(r.o_cmp_baseline.begin() + i * row, row, 0.0);
  }
  return r;
}

NsaAttendReference RunAttendReference(const NsaProblem& p, const std::vector<int32_t>& selections,
                                      const std::vector<uint16_t>& o_cmp_bits) {
  const NsaShape& s = p.spec.shape;
  const ref::NsaShape rs = p.RefShape();
  const int64_t t = p.num_tokens(), row = int64_t{s.num_q_heads} * s.head_dim;
  const int64_t groups = static_cast<int64_t>(p.attend_groups.size() / 2);
  NsaAttendReference r;
  r.out64.assign(t * row, 0.0);
  ref::NsaAttend(WidenToDouble(p.q).data(), row, WidenToDouble(p.k).data(),
                 WidenToDouble(p.v).data(), p.tables.data(), p.max_blocks_per_seq,
                 p.positions.data(), p.token_seqs.data(), p.attend_groups.data(), groups,
                 selections.data(), p.spec.shared, WidenToDouble(o_cmp_bits).data(), row,
                 WidenToDouble(p.gates).data(), 3 * s.num_q_heads, rs, r.out64.data(), row);
  std::vector<float> out32(t * row, 0.0f);
  ref::NsaAttend(WidenToFloat(p.q).data(), row, WidenToFloat(p.k).data(), WidenToFloat(p.v).data(),
                 p.tables.data(), p.max_blocks_per_seq, p.positions.data(), p.token_seqs.data(),
                 p.attend_groups.data(), groups, selections.data(), p.spec.shared,
                 WidenToFloat(o_cmp_bits).data(), row, WidenToFloat(p.gates).data(),
                 3 * s.num_q_heads, rs, out32.data(), row, ref::ProbRounding::kBf16);
  r.out_baseline = RoundToBf16(out32);
  return r;
}

SelectionComparison CompareSelections(const NsaProblem& p, const std::vector<int32_t>& kernel,
                                      const NsaSelectReference& ref, double tol) {
  const int64_t kv = p.spec.shape.num_kv_heads, count = p.spec.shape.block_counts;
  SelectionComparison c;
  for (int64_t t = 0; t < p.num_tokens(); ++t) {
    for (int64_t h = 0; h < kv; ++h) {
      ++c.compared;
      const int32_t* a = &kernel[(t * kv + h) * count];
      const int32_t* b = &ref.selections[(t * kv + h) * count];
      if (std::equal(a, a + count, b)) {
        ++c.equal;
        continue;
      }
      if (p.token_seqs[t] < 0) {
        ++c.mismatches;
        continue;
      }
      const double* scores = &ref.scores[(t * kv + h) * ref.score_stride];
      const int64_t n = p.positions[t] / p.spec.shape.block_size + 1;
      std::vector<double> sorted(scores, scores + n);
      std::sort(sorted.rbegin(), sorted.rend());
      const double kth = sorted[std::min<int64_t>(count, n) - 1];
      bool near = true;
      for (const int32_t* sel : {a, b}) {
        const int32_t* other = sel == a ? b : a;
        for (int64_t i = 0; i < count; ++i) {
          if (sel[i] < 0 && other[i] < 0) continue;
          const bool shared =
              sel[i] >= 0 && std::find(other, other + count, sel[i]) != other + count;
          if (shared) continue;
          near = near && sel[i] >= 0 && sel[i] < n && std::abs(scores[sel[i]] - kth) <= tol;
        }
      }
      ++(near ? c.near_ties : c.mismatches);
    }
  }
  return c;
}

NsaDevice::NsaDevice(const NsaProblem& p)
    : k(p.k.size() * 2),
      v(p.v.size() * 2),
      cmp_k(p.cmp_k.size() * 2),
      cmp_v(p.cmp_v.size() * 2),
      tables(p.tables.size() * 4),
      positions(p.positions.size() * 4),
      token_seqs(p.token_seqs.size() * 4),
      select_groups(p.select_groups.size() * 4),
      attend_groups(p.attend_groups.size() * 4),
      selections(p.selections.size() * 4),
      q(p.q.size() * 2),
      gates(p.gates.size() * 2),
      o_cmp(p.o_cmp.size() * 2),
      out(p.o_cmp.size() * 2),
      selections_out(p.selections.size() * 4),
      num_tokens(p.num_tokens()),
      max_blocks_per_seq(p.max_blocks_per_seq),
      num_select_groups(static_cast<int32_t>(p.select_groups.size() / 2)),
      num_attend_groups(static_cast<int32_t>(p.attend_groups.size() / 2)),
      queries(p.spec.queries),
      group_size(p.spec.group_size) {
  Upload(p);
}

void NsaDevice::Upload(const NsaProblem& p) {
  k.Upload(p.k);
  v.Upload(p.v);
  cmp_k.Upload(p.cmp_k);
  cmp_v.Upload(p.cmp_v);
  tables.Upload(p.tables);
  positions.Upload(p.positions);
  token_seqs.Upload(p.token_seqs);
  select_groups.Upload(p.select_groups);
  attend_groups.Upload(p.attend_groups);
  selections.Upload(p.selections);
  q.Upload(p.q);
  gates.Upload(p.gates);
  o_cmp.Upload(p.o_cmp);
  out.Poison();
  selections_out.Poison();
}

NsaCache NsaDevice::Cache() const {
  return {k.as<__nv_bfloat16>(),     v.as<__nv_bfloat16>(), cmp_k.as<__nv_bfloat16>(),
          cmp_v.as<__nv_bfloat16>(), tables.as<int32_t>(),  max_blocks_per_seq};
}

NsaTokens NsaDevice::Tokens() const {
  return {positions.as<int32_t>(), token_seqs.as<int32_t>(), num_tokens};
}

NsaGroups NsaDevice::SelectGroups() const {
  return {select_groups.as<int32_t>(), num_select_groups, std::max(1, queries)};
}

NsaGroups NsaDevice::AttendGroups() const {
  return {attend_groups.as<int32_t>(), num_attend_groups, std::max(1, group_size)};
}

}  // namespace specd::kernels::check
