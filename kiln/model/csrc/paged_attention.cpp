// Decode attention read in place from a paged KV cache (kiln/model/paged_attention.py).
//
// One query token per row, its keys and values in fixed-size blocks of a pool listed by the
// row's block table: scores, softmax and the weighted sum of values are computed straight from
// the blocks, so each key and value is read once and nothing is copied (the torch path gathers
// every row's blocks into a padded buffer first, then attention reads it again). Accumulation is
// fp32 for fp32 and bf16 pools alike. Vectorized with ATen's at::vec (the ISA torch itself uses
// here, chosen by CPU_CAPABILITY at build time).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

inline Vec load(const float* p) { return Vec::loadu(p); }
inline Vec load(const at::BFloat16* p) {
  Vec out;
  at::vec::load_fp32_from_bf16(p, out);
  return out;
}

// the cache lines of the slot kAhead positions on, asked for while this one is computed
constexpr int64_t kAhead = 4;

template <typename T>
inline void prefetch(const T* pool, const int64_t* blocks, int64_t block, int64_t slot_stride,
                     int64_t pos) {
  const char* p =
      reinterpret_cast<const char*>(pool + (blocks[pos / block] * block + pos % block) * slot_stride);
  for (int64_t b = 0; b < slot_stride * static_cast<int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(p + b);
}

// One row: its heads x group queries over its keys, slot after slot, so a slot's keys (then
// values) for every head are one contiguous read and a block one sequential stream (a step's
// keys/values come from memory, not cache: the bandwidth, not the arithmetic, sets the pace).
// C and VC (head_dim and value width in vectors) are template parameters so a key's or value's
// vectors stay in registers.
template <typename T, int C, int VC>
void attend_row(const T* qrow, const T* kp, const T* vp, const int64_t* blocks, int64_t block,
                int heads, int group, int64_t first, int64_t count, float scale,
                std::vector<float>& scores, std::vector<Vec>& work, T* orow) {
  constexpr int64_t L = Vec::size();
  constexpr int64_t dim = C * L, vdim = VC * L;
  const int queries = heads * group;  // query q = h * group + g
  const int64_t k_slot = heads * dim, v_slot = heads * vdim;
  work.resize(static_cast<size_t>(queries) * (C + VC));
  Vec* qv = work.data();                         // [queries][C]
  Vec* acc = work.data() + queries * C;          // [queries][VC]
  for (int q = 0; q < queries; ++q)
    for (int c = 0; c < C; ++c) qv[q * C + c] = load(qrow + q * dim + c * L) * Vec(scale);
  scores.resize(static_cast<size_t>(queries) * count);
  std::vector<float> top(queries, -std::numeric_limits<float>::infinity());
  // scores: each key read once, against every query head of its group
  for (int64_t t = 0; t < count; ++t) {
    const int64_t pos = first + t;
    const T* slot = kp + (blocks[pos / block] * block + pos % block) * k_slot;
    if (t + kAhead < count) prefetch(kp, blocks, block, k_slot, pos + kAhead);
    for (int h = 0; h < heads; ++h) {
      Vec kc[C];
      for (int c = 0; c < C; ++c) kc[c] = load(slot + h * dim + c * L);
      for (int g = 0; g < group; ++g) {
        const int q = h * group + g;
        Vec a = qv[q * C] * kc[0];
        for (int c = 1; c < C; ++c) a = at::vec::fmadd(qv[q * C + c], kc[c], a);
        const float s = a.reduce_add();
        scores[q * count + t] = s;
        top[q] = std::max(top[q], s);
      }
    }
  }
  // softmax numerators in place (exp_u20: torch's own vectorized exp), and their sums
  std::vector<float> total(queries);
  for (int q = 0; q < queries; ++q) {
    float* s = scores.data() + q * count;
    const Vec shift(top[q]);
    Vec sum(0.f);
    int64_t t = 0;
    for (; t + L <= count; t += L) {
      const Vec e = (Vec::loadu(s + t) - shift).exp_u20();
      e.store(s + t);
      sum = sum + e;
    }
    float rest = 0.f;
    for (; t < count; ++t) {
      s[t] = std::exp(s[t] - top[q]);
      rest += s[t];
    }
    total[q] = sum.reduce_add() + rest;
  }
  // weighted sum of values: each value read once
  for (int q = 0; q < queries * VC; ++q) acc[q] = Vec(0.f);
  for (int64_t t = 0; t < count; ++t) {
    const int64_t pos = first + t;
    const T* slot = vp + (blocks[pos / block] * block + pos % block) * v_slot;
    if (t + kAhead < count) prefetch(vp, blocks, block, v_slot, pos + kAhead);
    for (int h = 0; h < heads; ++h) {
      Vec vc[VC];
      for (int c = 0; c < VC; ++c) vc[c] = load(slot + h * vdim + c * L);
      for (int g = 0; g < group; ++g) {
        const int q = h * group + g;
        const Vec p(scores[q * count + t]);
        for (int c = 0; c < VC; ++c) acc[q * VC + c] = at::vec::fmadd(p, vc[c], acc[q * VC + c]);
      }
    }
  }
  for (int q = 0; q < queries; ++q) {
    const Vec inv(1.f / total[q]);
    float buf[VC * L];
    for (int c = 0; c < VC; ++c) (acc[q * VC + c] * inv).store(buf + c * L);
    for (int64_t d = 0; d < vdim; ++d) orow[q * vdim + d] = static_cast<T>(buf[d]);
  }
}

template <typename T, int C, int VC>
void decode_kernel(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                   const at::Tensor& table, const at::Tensor& lengths, double scale,
                   int64_t window, at::Tensor& out) {
  const int64_t rows = q.size(0), kv_heads = q.size(1), group = q.size(2), dim = q.size(3);
  const int64_t vdim = v_pool.size(3), block = k_pool.size(1), width = table.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_pool.data_ptr<T>();
  const T* vp = v_pool.data_ptr<T>();
  const int64_t* tp = table.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<Vec> work;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = lp[r];
      const int64_t first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      attend_row<T, C, VC>(qp + r * kv_heads * group * dim, kp, vp, tp + r * width, block,
                           static_cast<int>(kv_heads), static_cast<int>(group), first, n - first,
                           static_cast<float>(scale), scores, work,
                           op + r * kv_heads * group * vdim);
    }
  });
}

// head widths the op takes, in vectors: 64 and 128 (and 32 and 256 on narrower vectors)
template <typename T>
void dispatch(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
              const at::Tensor& table, const at::Tensor& lengths, double scale, int64_t window,
              at::Tensor& out) {
  const int64_t L = Vec::size();
  const int64_t c = q.size(3) / L, vc = v_pool.size(3) / L;
#define KILN_CASE(C)                                                                  \
  if (c == C && vc == C) {                                                             \
    return decode_kernel<T, C, C>(q, k_pool, v_pool, table, lengths, scale, window, out); \
  }
  KILN_CASE(2)
  KILN_CASE(4)
  KILN_CASE(8)
  KILN_CASE(16)
#undef KILN_CASE
  TORCH_CHECK(false, "head_dim ", q.size(3), "/", v_pool.size(3), " not taken");
}

at::Tensor decode(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                  const at::Tensor& table, const at::Tensor& lengths, double scale,
                  int64_t window) {
  constexpr int64_t L = Vec::size();
  TORCH_CHECK(q.dim() == 4 && k_pool.dim() == 4 && v_pool.dim() == 4, "4-D q and pools");
  TORCH_CHECK(q.is_contiguous() && k_pool.is_contiguous() && v_pool.is_contiguous(),
              "contiguous q and pools");
  TORCH_CHECK(q.scalar_type() == k_pool.scalar_type() && q.scalar_type() == v_pool.scalar_type(),
              "q and pools of one dtype");
  TORCH_CHECK(q.size(3) == k_pool.size(3) && q.size(3) == v_pool.size(3) && q.size(3) % L == 0,
              "one head_dim for q, keys and values, a multiple of ", L);
  TORCH_CHECK(table.scalar_type() == at::kLong && lengths.scalar_type() == at::kLong &&
                  table.is_contiguous() && lengths.is_contiguous(),
              "int64 contiguous table and lengths");
  auto out = at::empty({q.size(0), q.size(1), q.size(2), v_pool.size(3)}, q.options());
  if (q.scalar_type() == at::kFloat) {
    dispatch<float>(q, k_pool, v_pool, table, lengths, scale, window, out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "float32 or bfloat16");
    dispatch<at::BFloat16>(q, k_pool, v_pool, table, lengths, scale, window, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(kiln_paged, m) {
  m.def("decode(Tensor q, Tensor k_pool, Tensor v_pool, Tensor table, Tensor lengths, "
        "float scale, int window) -> Tensor");
  m.impl("decode", c10::DispatchKey::CPU, TORCH_FN(decode));
}
