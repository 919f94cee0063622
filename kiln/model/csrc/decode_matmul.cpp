// Matmuls for decode-sized batches (kiln/model/decode_matmul.py): a few rows of fp32 activations
// times a weight read once from memory. At these sizes the weight's bytes, not the arithmetic,
// set the pace, and a BLAS call spends them badly: MKL's sgemm reaches ~5 GB/s at 8 rows where
// one core streams 12-17, and torch's int8 weight-only kernel is no faster than fp32 on AVX2.
// Both ops keep fp32 accumulators in registers and ask for the weight's cache lines ahead of use
// (the hardware prefetcher alone left them 1.3-1.5x slower).
//
// int8: y = a @ (w * scale)^T, w [N, K] row-major int8, a scale per output channel. Two output
//   channels and up to four rows a block: each weight is widened to fp32 in registers once for
//   four rows (two channels, not four: a step 1.5x faster at one row, fewer streams in flight).
// fp32: y = a @ w, w [K, N] row-major (a column-major nn.Linear weight's storage). Sixteen output
//   channels and up to six rows a tile: one weight row of the tile serves six rows of a.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

// ---- int8, [N, K] weight ---------------------------------------------------------------------

constexpr int64_t kChannels = 2;  // output channels a block
constexpr int64_t kGrain = 32;    // blocks a thread takes at least
constexpr int64_t kBlocksAhead = 2;  // blocks are contiguous: the one two on is prefetched

// one row of a times one channel of w over k in [k0, K), scalar (tails, and without AVX2)
inline float dot_tail(const float* a, const int8_t* w, int64_t k0, int64_t K) {
  float sum = 0.f;
  for (int64_t k = k0; k < K; ++k) sum += a[k] * static_cast<float>(w[k]);
  return sum;
}

#ifdef __AVX2__
inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline __m256 widen(const int8_t* p) {  // 8 int8 -> 8 fp32
  __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// R rows (1, 2 or 4) times kChannels channels: 8 accumulators, 2 weights and a row at most.
// Not inlined: inside the caller GCC kept the accumulators on the stack (3x slower).
template <int R>
__attribute__((noinline)) void int8_block(const float* a, const int8_t* w, const float* scale,
                                          float* y, int64_t K, int64_t N) {
  const int64_t K8 = K - K % 8;
  __m256 acc[R][kChannels];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    if (k % 64 == 0)  // a cache line of each channel, kBlocksAhead blocks on
      for (int c = 0; c < kChannels; ++c)
        __builtin_prefetch(w + (c + kChannels * kBlocksAhead) * K + k);
    __m256 wv[kChannels];
    for (int c = 0; c < kChannels; ++c) wv[c] = widen(w + c * K + k);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_loadu_ps(a + r * K + k);
      for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm256_fmadd_ps(av, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c)
      y[r * N + c] = (hsum(acc[r][c]) + dot_tail(a + r * K, w + c * K, K8, K)) * scale[c];
}
#else
template <int R>
void int8_block(const float* a, const int8_t* w, const float* scale, float* y, int64_t K,
                int64_t N) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c)
      y[r * N + c] = dot_tail(a + r * K, w + c * K, 0, K) * scale[c];
}
#endif

at::Tensor int8_mm(const at::Tensor& a, const at::Tensor& w, const at::Tensor& scales) {
  TORCH_CHECK(a.dim() == 2 && w.dim() == 2 && a.size(1) == w.size(1),
              "decode int8 mm: a [M, K] and w [N, K]");
  TORCH_CHECK(a.scalar_type() == at::kFloat && w.scalar_type() == at::kChar &&
                  scales.scalar_type() == at::kFloat,
              "decode int8 mm: fp32 a, int8 w, fp32 scales");
  TORCH_CHECK(a.is_contiguous() && w.is_contiguous() && scales.is_contiguous() &&
                  scales.numel() == w.size(0),
              "decode int8 mm: contiguous operands, a scale per output channel");
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
  auto y = at::empty({M, N}, a.options());
  const float* ap = a.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t blocks = N / kChannels;
  at::parallel_for(0, blocks, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n = b * kChannels;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4)
        int8_block<4>(ap + m * K, wp + n * K, sp + n, yp + m * N + n, K, N);
      for (; m + 2 <= M; m += 2)
        int8_block<2>(ap + m * K, wp + n * K, sp + n, yp + m * N + n, K, N);
      if (m < M) int8_block<1>(ap + m * K, wp + n * K, sp + n, yp + m * N + n, K, N);
    }
  });
  for (int64_t n = blocks * kChannels; n < N; ++n)  // the last channel of an odd N
    for (int64_t m = 0; m < M; ++m) yp[m * N + n] = dot_tail(ap + m * K, wp + n * K, 0, K) * sp[n];
  return y;
}

// ---- fp32, [K, N] weight ---------------------------------------------------------------------

constexpr int64_t kTileVectors = 2;  // 16 output channels a tile
constexpr int64_t kRowsAhead = 16;   // weight rows prefetched ahead (one tile reads 64 B a row)

#ifdef __AVX2__
// R rows (up to 6) times V vectors of channels: 12 accumulators, 2 weights and a broadcast at
// most (the shape of BLIS's AVX2 microkernel)
template <int R, int V>
void fp32_tile(const float* a, const float* w, float* y, int64_t K, int64_t N) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* row = w + k * N;
    if (k + kRowsAhead < K) {  // the tile's span of that row: one line, two if unaligned
      __builtin_prefetch(row + kRowsAhead * N);
      __builtin_prefetch(row + kRowsAhead * N + V * 8 - 1);
    }
    __m256 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm256_loadu_ps(row + v * 8);
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(a + r * K + k);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(b, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(y + r * N + v * 8, acc[r][v]);
}

template <int V>
void fp32_rows(const float* a, const float* w, float* y, int64_t M, int64_t K, int64_t N) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) fp32_tile<6, V>(a + m * K, w, y + m * N, K, N);
  for (; m + 4 <= M; m += 4) fp32_tile<4, V>(a + m * K, w, y + m * N, K, N);
  for (; m + 2 <= M; m += 2) fp32_tile<2, V>(a + m * K, w, y + m * N, K, N);
  if (m < M) fp32_tile<1, V>(a + m * K, w, y + m * N, K, N);
}
constexpr int64_t kTile = kTileVectors * 8;
#else
constexpr int64_t kTile = 16;
#endif

// channels [n0, n1) of every row, scalar: the tail, and everything without AVX2
void fp32_scalar(const float* a, const float* w, float* y, int64_t M, int64_t K, int64_t N,
                 int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float sum = 0.f;
      for (int64_t k = 0; k < K; ++k) sum += a[m * K + k] * w[k * N + n];
      y[m * N + n] = sum;
    }
}

at::Tensor fp32_mm(const at::Tensor& a, const at::Tensor& w) {
  TORCH_CHECK(a.dim() == 2 && w.dim() == 2 && a.size(1) == w.size(0),
              "decode fp32 mm: a [M, K] and w [K, N]");
  TORCH_CHECK(a.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "decode fp32 mm: fp32 operands");
  TORCH_CHECK(a.is_contiguous() && w.is_contiguous(), "decode fp32 mm: contiguous operands");
  const int64_t M = a.size(0), K = a.size(1), N = w.size(1);
  auto y = at::empty({M, N}, a.options());
  const float* ap = a.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t tiles = N / kTile;
  at::parallel_for(0, tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
#ifdef __AVX2__
      fp32_rows<kTileVectors>(ap, wp + t * kTile, yp + t * kTile, M, K, N);
#else
      fp32_scalar(ap, wp, yp, M, K, N, t * kTile, (t + 1) * kTile);
#endif
    }
  });
  int64_t n = tiles * kTile;
#ifdef __AVX2__
  if (N - n >= 8) {  // one more vector of channels
    fp32_rows<1>(ap, wp + n, yp + n, M, K, N);
    n += 8;
  }
#endif
  fp32_scalar(ap, wp, yp, M, K, N, n, N);
  return y;
}

}  // namespace

TORCH_LIBRARY(kiln_decode, m) {
  m.def("int8_mm(Tensor a, Tensor w, Tensor scales) -> Tensor");
  m.def("fp32_mm(Tensor a, Tensor w) -> Tensor");
  m.impl("int8_mm", c10::DispatchKey::CPU, TORCH_FN(int8_mm));
  m.impl("fp32_mm", c10::DispatchKey::CPU, TORCH_FN(fp32_mm));
}
