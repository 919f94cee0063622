// Weight-only int8 matmul for a few rows (kiln/model/int8_matmul.py): y = a @ (w * scale)^T with
// fp32 activations, int8 weights [N, K] and one fp32 scale per output channel.
//
// Decoding multiplies one to a few rows by every weight: the weights' bytes, not the arithmetic,
// set the pace, so reading int8 instead of fp32 is the gain. Each weight is widened to fp32 in
// registers and multiplied by the unrounded fp32 activations (torch's _weight_int8pack_mm rounds
// them to bf16 first), four output channels at a time so a row's activations are loaded once for
// four channels, two rows at a time so each widened weight serves two rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kChannels = 4;  // output channels a block
constexpr int64_t kGrain = 16;    // blocks a thread takes at least
// Blocks are contiguous: while one is multiplied, the one kAhead on is asked for a cache line at
// a time (the hardware prefetcher alone left a step 1.5x slower: each channel is a short stream)
constexpr int64_t kAhead = 2;

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

// R rows (1 or 2) times kChannels channels: 8 accumulators, 4 weights and a row in 13 registers
template <int R>
void block(const float* a, const int8_t* w, const float* scale, float* y, int64_t K, int64_t N) {
  const int64_t K8 = K - K % 8;
  __m256 acc[R][kChannels];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    if (k % 64 == 0)
      for (int c = 0; c < kChannels; ++c) __builtin_prefetch(w + (c + kChannels * kAhead) * K + k);
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
void block(const float* a, const int8_t* w, const float* scale, float* y, int64_t K, int64_t N) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChannels; ++c)
      y[r * N + c] = dot_tail(a + r * K, w + c * K, 0, K) * scale[c];
}
#endif

at::Tensor int8_mm(const at::Tensor& a, const at::Tensor& w, const at::Tensor& scales) {
  TORCH_CHECK(a.dim() == 2 && w.dim() == 2 && a.size(1) == w.size(1),
              "int8_mm: a [M, K] and w [N, K]");
  TORCH_CHECK(a.scalar_type() == at::kFloat && w.scalar_type() == at::kChar &&
                  scales.scalar_type() == at::kFloat,
              "int8_mm: fp32 a, int8 w, fp32 scales");
  TORCH_CHECK(a.is_contiguous() && w.is_contiguous() && scales.is_contiguous() &&
                  scales.numel() == w.size(0),
              "int8_mm: contiguous operands, a scale per output channel");
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
      for (; m + 2 <= M; m += 2) block<2>(ap + m * K, wp + n * K, sp + n, yp + m * N + n, K, N);
      if (m < M) block<1>(ap + m * K, wp + n * K, sp + n, yp + m * N + n, K, N);
    }
  });
  for (int64_t n = blocks * kChannels; n < N; ++n)  // the last N % 4 channels
    for (int64_t m = 0; m < M; ++m) yp[m * N + n] = dot_tail(ap + m * K, wp + n * K, 0, K) * sp[n];
  return y;
}

}  // namespace

TORCH_LIBRARY(kiln_int8, m) {
  m.def("mm(Tensor a, Tensor w, Tensor scales) -> Tensor");
  m.impl("mm", c10::DispatchKey::CPU, TORCH_FN(int8_mm));
}
