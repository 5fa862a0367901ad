// Packed int4 / int8 weights times int8 activations: the llama.cpp Q4 x Q8 scheme, with the weights laid
// out in panels of 16 output columns so that each panel is streamed once per call for all rows.
//
// Activations are quantized on the fly per row and per block of 32 inputs (symmetric: d = max|x| / 127,
// a = round(x / d)), or of 16 for weights in groups of 16 (Q6_K's); dot products are integer (u8 or s8
// weights x s8 activations into int32), and the scales and zero points are applied in fp32 once per block and per group:
//   y[m, n] = sum_b s[n, g(b)] * d[m, b] * sum_{k in b} q[n, k] a[m, k]  -  sum_g sz[n, g] * xs[m, g]
// with sz = s * z (the zero point times the scale) and xs[m, g] = sum_{b in g} d[m, b] * sum_{k in b} a[m, k],
// i.e. sum_k (q_k - z) a_k = sum_k q_k a_k - z sum_k a_k, so the weights need no unpacking to signed.
//
// Layout (llmopt/engine/layers/quantized_panels.py packs it): weights [panels, K * 16] bytes; the 16
// columns of a panel are interleaved by quads of 4 inputs, so one quad of one column is one int32 lane:
//   int8 (W8, stored q - 128 as s8): 64 bytes a quad, byte 4c + i = column c, input 4t + i;
//   int4 (W4, u8 0..15): 32 bytes a quad, byte 4c + i holds column c (low nibble) and c + 8 (high).
// scales: [panels, groups, 2, 16] fp32: s then sz for the panel's 16 columns.
// A row's 4 activations of a quad are broadcast to every lane, so no horizontal sums are needed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>

namespace llmopt_quant {
namespace {

constexpr int64_t kCols = 16;   // output columns per panel
constexpr int64_t kBlock = 32;  // inputs per activation scale; kSmallGroup for weights grouped by 16
constexpr int64_t kSmallGroup = 16;
// Rows per tile: 8 rows x 2 accumulators of 16 columns in AVX-512's 32 vector registers (12 rows ran
// 1.1-1.3x slower at 512 rows here); the AVX2 tile holds 4 rows x 4 accumulators in its 16.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int kMaxRows = 8;
#else
constexpr int kMaxRows = 4;
#endif

struct Activations {
  at::Tensor q;     // [M, K] int8
  at::Tensor d;     // [M, K / Block] fp32
  at::Tensor sums;  // [M, groups] fp32: xs above
  at::Tensor block_sums;  // [M, K / Block] int32: each block's sum of int8 values (gguf_matmul's zero points)
};

// The reference in tests/engine/test_quantized_matmul.py does the same fp32 operations in the same
// order (max, divide by 127, divide, round half to even), so the int8 values match bit for bit.
template <int Block>
Activations quantize(const at::Tensor& x, int64_t group) {
  const int64_t M = x.size(0), K = x.size(1), blocks = K / Block, groups = K / group;
  Activations a{at::empty({M, K}, x.options().dtype(at::kChar)), at::empty({M, blocks}, x.options()),
                at::zeros({M, groups}, x.options()), at::empty({M, blocks}, x.options().dtype(at::kInt))};
  const float* xp = x.data_ptr<float>();
  int8_t* qp = a.q.data_ptr<int8_t>();
  float* dp = a.d.data_ptr<float>();
  float* sp = a.sums.data_ptr<float>();
  int32_t* bp = a.block_sums.data_ptr<int32_t>();
  at::parallel_for(0, M, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = xp + m * K + b * Block;
        int8_t* qb = qp + m * K + b * Block;
        float d;
        int32_t sum = 0;
#if defined(__AVX512F__)
        // The same operations 16 lanes at a time (the scalar loop was 18 % of a 512 x 1536 matmul here):
        // the conversion rounds half to even as nearbyint does in the default rounding mode.
        const __m512 x0 = _mm512_loadu_ps(xb), x1 = Block == 32 ? _mm512_loadu_ps(xb + 16) : x0;
        d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1))) / 127.f;
        if (d == 0.f) {
          std::memset(qb, 0, Block);
        } else {
          const __m512 dv = _mm512_set1_ps(d);
          const __m512i v0 = _mm512_cvtps_epi32(_mm512_div_ps(x0, dv));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(v0));
          sum = _mm512_reduce_add_epi32(v0);
          if constexpr (Block == 32) {
            const __m512i v1 = _mm512_cvtps_epi32(_mm512_div_ps(x1, dv));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(v1));
            sum += _mm512_reduce_add_epi32(v1);
          }
        }
#else
        float amax = 0.f;
        for (int64_t i = 0; i < Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
        d = amax / 127.f;
        for (int64_t i = 0; i < Block; ++i) {
          const int32_t v = d == 0.f ? 0 : (int32_t)std::nearbyint(xb[i] / d);
          qb[i] = (int8_t)v;
          sum += v;
        }
#endif
        dp[m * blocks + b] = d;
        bp[m * blocks + b] = sum;
        sp[m * groups + b * Block / group] += d * (float)sum;
      }
  });
  return a;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// acc += per-lane dot of 4 u8 weights and 4 s8 activations. In place through asm: with the intrinsic, GCC
// copied every accumulator once per instruction (two register moves per dot product in the inner loop);
// without them prefill's 512-row GEMMs ran 1.1-1.5x faster here (AVX-512 VNNI, 2 threads).
inline __m512i dot_u8s8(__m512i acc, __m512i w, __m512i a) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(a));
  return acc;
}

// A panel's 16 columns in one 512-bit register: the same integer dot products and the same fp32 steps
// per column as the 256-bit tile below, so the same bits.
template <bool Four, int R, int Block>
void panel_tile(const uint8_t* w, int64_t K, int64_t group, const float* scales, const int8_t* a,
                const float* d, const float* sums, float* out, int64_t ldo) {
  constexpr int64_t kQuads = Block / 4;
  const int64_t blocks = K / Block, groups = K / group, per_group = group / Block;
  const __m512i nibble = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const float* sg = scales + g * 2 * kCols;
    const __m512 s = _mm512_loadu_ps(sg);
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      __m512i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
      for (int64_t t = b * kQuads; t < (b + 1) * kQuads; ++t) {
        __m512i wq;
        __mmask64 negative = 0;
        if constexpr (Four) {
          // The quad's 32 bytes in both halves; the upper half (columns 8-15) takes the high nibbles.
          const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * 32)));
          wq = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4), nibble);
        } else {
          const __m512i v = _mm512_loadu_si512(w + t * 64);
          wq = _mm512_abs_epi8(v), negative = _mm512_movepi8_mask(v);
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          int32_t quad;
          std::memcpy(&quad, a + r * K + t * 4, 4);
          const __m512i ab = _mm512_set1_epi32(quad);
          if constexpr (Four)
            dot[r] = dot_u8s8(dot[r], wq, ab);
          else
            dot[r] = dot_u8s8(dot[r], wq, _mm512_mask_sub_epi8(ab, negative, zero, ab));
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512 dr = _mm512_set1_ps(d[r * blocks + b]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(s, dr), acc[r]);
      }
    }
    const __m512 z = _mm512_loadu_ps(sg + kCols);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fnmadd_ps(z, _mm512_set1_ps(sums[r * groups + g]), acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}
#elif defined(__AVX2__) && defined(__FMA__)
// acc += per-lane dot of 4 u8 weights and 4 s8 activations. maddubs' int16 pairs cannot saturate here:
// int4 weights are at most 15 (2 * 15 * 127), and int8 ones come in as |w| <= 128 with the sign moved
// onto the activation (2 * 128 * 127 < 32767), as llama.cpp's mul_sum_i8_pairs does.
inline __m256i dot_u8s8(__m256i acc, __m256i w, __m256i a) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, w, a);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
#endif
}

template <bool Four, int R, int Block>
void panel_tile(const uint8_t* w, int64_t K, int64_t group, const float* scales, const int8_t* a,
                const float* d, const float* sums, float* out, int64_t ldo) {
  constexpr int64_t kQuads = Block / 4;
  const int64_t blocks = K / Block, groups = K / group, per_group = group / Block;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const float* sg = scales + g * 2 * kCols;
    const __m256 s0 = _mm256_loadu_ps(sg), s1 = _mm256_loadu_ps(sg + 8);
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      __m256i dot[R][2];
      for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
      for (int64_t t = b * kQuads; t < (b + 1) * kQuads; ++t) {
        __m256i w0, w1, v0, v1;
        if constexpr (Four) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * 32));
          w0 = _mm256_and_si256(v, nibble), w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        } else {
          v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * 64));
          v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * 64 + 32));
          w0 = _mm256_abs_epi8(v0), w1 = _mm256_abs_epi8(v1);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          int32_t quad;
          std::memcpy(&quad, a + r * K + t * 4, 4);
          const __m256i ab = _mm256_set1_epi32(quad);
          if constexpr (Four) {
            dot[r][0] = dot_u8s8(dot[r][0], w0, ab), dot[r][1] = dot_u8s8(dot[r][1], w1, ab);
          } else {
            dot[r][0] = dot_u8s8(dot[r][0], w0, _mm256_sign_epi8(ab, v0));
            dot[r][1] = dot_u8s8(dot[r][1], w1, _mm256_sign_epi8(ab, v1));
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256 dr = _mm256_set1_ps(d[r * blocks + b]);
        acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][0]), _mm256_mul_ps(s0, dr), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][1]), _mm256_mul_ps(s1, dr), acc[r][1]);
      }
    }
    const __m256 z0 = _mm256_loadu_ps(sg + kCols), z1 = _mm256_loadu_ps(sg + kCols + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 xs = _mm256_set1_ps(sums[r * groups + g]);
      acc[r][0] = _mm256_fnmadd_ps(z0, xs, acc[r][0]);
      acc[r][1] = _mm256_fnmadd_ps(z1, xs, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * ldo, acc[r][0]);
    _mm256_storeu_ps(out + r * ldo + 8, acc[r][1]);
  }
}
#else
// Scalar: the same integer dot products and the same fp32 steps, one column at a time.
template <bool Four, int R, int Block>
void panel_tile(const uint8_t* w, int64_t K, int64_t group, const float* scales, const int8_t* a,
                const float* d, const float* sums, float* out, int64_t ldo) {
  constexpr int64_t kQuads = Block / 4;
  const int64_t blocks = K / Block, groups = K / group, per_group = group / Block;
  float acc[R][kCols] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const float* sg = scales + g * 2 * kCols;
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      int32_t dot[R][kCols] = {};
      for (int64_t t = b * kQuads; t < (b + 1) * kQuads; ++t)
        for (int64_t c = 0; c < kCols; ++c)
          for (int64_t i = 0; i < 4; ++i) {
            const int32_t q = Four ? (w[t * 32 + (c % 8) * 4 + i] >> (c < 8 ? 0 : 4)) & 15
                                   : (int8_t)w[t * 64 + c * 4 + i];
            for (int r = 0; r < R; ++r) dot[r][c] += q * a[r * K + t * 4 + i];
          }
      for (int r = 0; r < R; ++r)
        for (int64_t c = 0; c < kCols; ++c) acc[r][c] += (float)dot[r][c] * (sg[c] * d[r * blocks + b]);
    }
    for (int r = 0; r < R; ++r)
      for (int64_t c = 0; c < kCols; ++c) acc[r][c] -= sg[kCols + c] * sums[r * groups + g];
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * ldo, acc[r], sizeof(acc[r]));
}
#endif

using TileFn = void (*)(const uint8_t*, int64_t, int64_t, const float*, const int8_t*, const float*,
                        const float*, float*, int64_t);
template <bool Four, int Block, size_t... R>
constexpr std::array<TileFn, sizeof...(R)> tiles(std::index_sequence<R...>) {
  return {(R == 0 ? nullptr : panel_tile<Four, (int)R, Block>)...};
}
using Rows = std::make_index_sequence<kMaxRows + 1>;
// kTiles[small groups][four][rows]: the tile function for that many rows (1 .. kMaxRows); groups of 16
// take activation blocks of 16 (Q6_K's, stored as int8).
constexpr std::array<TileFn, kMaxRows + 1> kTiles[2][2] = {
    {tiles<false, kBlock>(Rows{}), tiles<true, kBlock>(Rows{})},
    {tiles<false, kSmallGroup>(Rows{}), tiles<true, kSmallGroup>(Rows{})}};

// The activation block a weight's group size takes: 32, or 16 for groups of 16.
int64_t block_for(int64_t group) { return group == kSmallGroup ? kSmallGroup : kBlock; }

Activations quantize_for(const at::Tensor& x, int64_t group) {
  return group == kSmallGroup ? quantize<kSmallGroup>(x, group) : quantize<kBlock>(x, group);
}

}  // namespace

// x [M, K] fp32 -> (int8 [M, K], block scales [M, K / block], group sums [M, K / group], each block's
// int32 sum of its int8 values [M, K / block]), blocks of 16 for groups of 16, else 32. gguf_matmul.cpp,
// whose formats take blocks the size of a group, starts its dot products at a zero point times the last.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_activations_with_block_sums(
    const at::Tensor& x, int64_t group) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x: [M, K] fp32");
  TORCH_CHECK((group == kSmallGroup || group % kBlock == 0) && x.size(1) % group == 0,
              "K a multiple of the group, 16 or a multiple of 32");
  const Activations a = quantize_for(x.contiguous(), group);
  return {a.q, a.d, a.sums, a.block_sums};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x, int64_t group) {
  auto [q, d, sums, block_sums] = quantize_activations_with_block_sums(x, group);
  return {q, d, sums};
}

// x: [M, K] fp32; w: [panels, K * 16] int8 (W8) or [panels, K * 8] uint8 (W4); scales: [panels, groups, 2,
// 16] fp32. Returns x @ W^T: [M, panels * 16]. Also called by decode_layers (cpu_kernels.cpp).
at::Tensor quantized_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x: [M, K] fp32");
  TORCH_CHECK(w.scalar_type() == at::kByte || w.scalar_type() == at::kChar, "uint8 (int4) or int8 weights");
  const bool four = w.scalar_type() == at::kByte;
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0), groups = scales.size(1);
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(1) == K * (four ? 8 : 16), "w: [panels, K * 16 bits / 8]");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.dim() == 4 &&
                  scales.size(0) == panels && scales.size(2) == 2 && scales.size(3) == kCols,
              "scales: [panels, groups, 2, 16] fp32");
  TORCH_CHECK(groups > 0 && K % groups == 0 && ((K / groups) % kBlock == 0 || K / groups == kSmallGroup),
              "group size 16 or a multiple of 32");
  const int64_t group = K / groups, N = panels * kCols, block = block_for(group);
  auto out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const Activations a = quantize_for(x.contiguous(), group);
  const uint8_t* wp = reinterpret_cast<const uint8_t*>(w.data_ptr());
  const float* sp = scales.data_ptr<float>();
  const int8_t* ap = a.q.data_ptr<int8_t>();
  const float* dp = a.d.data_ptr<float>();
  const float* xs = a.sums.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t panel_bytes = w.size(1);
  // Rows in tiles inside each panel: a panel (at most K * 16 bytes) stays in cache between tiles, so the
  // weights come from memory once per call however many rows there are.
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t m = 0; m < M; m += kMaxRows) {
        const int64_t rows = std::min<int64_t>(kMaxRows, M - m);
        kTiles[block == kSmallGroup][four][rows](wp + p * panel_bytes, K, group, sp + p * groups * 2 * kCols,
                                                 ap + m * K, dp + m * (K / block), xs + m * groups,
                                                 op + m * N + p * kCols, N);
      }
  });
  return out;
}

}  // namespace llmopt_quant

TORCH_LIBRARY_FRAGMENT(llmopt, m) {
  m.def("quantized_matmul", &llmopt_quant::quantized_matmul);
  m.def("quantize_activations", &llmopt_quant::quantize_activations);
}
