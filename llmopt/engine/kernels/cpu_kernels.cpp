// The engine's CPU kernels: decode attention over the paged KV cache, the dense fp32 linear layer on
// panel-packed weights, and the small element-wise steps of a decoder layer fused into one pass each.
//
// Decode attention (one query token per sequence):
// Reads each cached key and value once for all the query heads that share its KV head (GQA), with an
// online softmax (running max and sum), so nothing of size [context] is gathered or stored. Replaces
// gather-then-SDPA, whose copies and fixed costs dominated decoding here.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vector_math.h"  // sum_lanes (the sums of a block's dot-product vectors), max_of, exp_inplace

namespace llmopt_quant {  // quantized_matmul.cpp: packed int4 / int8 weights x int8 activations
at::Tensor quantized_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales);
}

namespace llmopt_gguf {  // gguf_matmul.cpp: a GGUF file's blocks in panels x int8 activations
at::Tensor gguf_matmul(const at::Tensor& x, const at::Tensor& data, const at::Tensor& index);
}

namespace llmopt_int8_kv {  // int8_kv_attention.cpp: the int8 KV cache's write and decode attention
at::Tensor paged_decode_attention_int8(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                       const at::Tensor& block_tables, const at::Tensor& context_lens,
                                       double scale, int64_t window);
at::Tensor rope_and_cache_int8(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slots,
                               int64_t heads);
}  // namespace llmopt_int8_kv

namespace {

constexpr int kMaxGroup = 16;
constexpr int kMaxBlock = 64;

// exp over n floats in place. std::exp does not vectorize without -ffast-math; this is Cephes' expf
// (exp(x) = 2^k * p(x - k ln 2), a degree-7 polynomial, about 1 ulp), 16 lanes at a time.
inline void exp_inplace(float* x, int64_t n) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1;
    __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    v = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-88.3762626647949f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), v);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    _mm512_mask_storeu_ps(x + i, mask, _mm512_scalef_ps(p, k));
  }
#elif defined(__AVX2__)
  llmopt_simd::exp_inplace(x, n);  // the same polynomial, 8 lanes at a time
#else
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
#endif
}

// scores[t] = scale * q . k[t * row] for the n (<= kMaxBlock) keys of one block.
template <int D>
void block_scores(const float* q, const float* k, int64_t row, int64_t n, float scale, float* scores) {
#ifdef __AVX512F__
  constexpr int kVecs = D / 16;
  __m512 qv[kVecs];
  for (int i = 0; i < kVecs; ++i) qv[i] = _mm512_loadu_ps(q + 16 * i);
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    __m512 dots[16];
    for (int t = 0; t < 16; ++t) {
      dots[t] = _mm512_setzero_ps();
      if (t0 + t >= n) continue;
      const float* kt = k + (t0 + t) * row;
      for (int i = 0; i < kVecs; ++i) dots[t] = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(kt + 16 * i), dots[t]);
    }
    const __mmask16 mask = n - t0 >= 16 ? 0xFFFF : (1u << (n - t0)) - 1;
    _mm512_mask_storeu_ps(scores + t0, mask, _mm512_mul_ps(llmopt_simd::sum_lanes(dots), _mm512_set1_ps(scale)));
  }
#elif defined(__AVX2__)
  // 8 keys at a time, their dot-product vectors summed across lanes in one transposing step. The plain
  // loop below sums each key's products horizontally on its own: on a 2-core AVX2 EPYC decode attention
  // then streamed 8.6 GB/s of the 25 the machine reads (benchmarks/kernels.py).
  constexpr int kVecs = D / 8;
  __m256 qv[kVecs];
  for (int i = 0; i < kVecs; ++i) qv[i] = _mm256_loadu_ps(q + 8 * i);
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    __m256 dots[8];
    for (int t = 0; t < 8; ++t) {
      dots[t] = _mm256_setzero_ps();
      if (t0 + t >= n) continue;
      const float* kt = k + (t0 + t) * row;
      for (int i = 0; i < kVecs; ++i) dots[t] = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(kt + 8 * i), dots[t]);
    }
    const __m256 sums = _mm256_mul_ps(llmopt_simd::sum_lanes(dots), _mm256_set1_ps(scale));
    if (n - t0 >= 8) {
      _mm256_storeu_ps(scores + t0, sums);
    } else {
      alignas(32) float last[8];
      _mm256_store_ps(last, sums);
      for (int64_t t = 0; t < n - t0; ++t) scores[t0 + t] = last[t];
    }
  }
#else
  for (int64_t t = 0; t < n; ++t) {
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < D; ++d) dot += q[d] * k[t * row + d];
    scores[t] = dot * scale;
  }
#endif
}

// Token t's key and value rows of the next block, asked for into L2.
template <int D>
inline void prefetch_token(const float* next_k, const float* next_v, int64_t t, int64_t row) {
  for (int d = 0; d < D; d += 16) {
    __builtin_prefetch(next_k + t * row + d, 0, 2);
    __builtin_prefetch(next_v + t * row + d, 0, 2);
  }
}

// acc = acc * correction + sum over t of weights[t] * v[t * row], for the n values of one block. Also asks
// for the next block's first `ahead` tokens (`next_k`, `next_v`, same row stride), a token per token of
// this one: the prefetches spread among the arithmetic keep memory streaming, where asking for a whole
// block at once (hundreds of lines) stalled the core until they were in flight.
template <int D>
void add_weighted_values(const float* weights, const float* v, int64_t row, int64_t n, float correction,
                         float* acc, const float* next_k, const float* next_v, int64_t ahead) {
#ifdef __AVX512F__
  constexpr int kVecs = D / 16;
  __m512 a[kVecs];
  const __m512 c = _mm512_set1_ps(correction);
  for (int i = 0; i < kVecs; ++i) a[i] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * i), c);
  for (int64_t t = 0; t < n; ++t) {
    if (t < ahead) prefetch_token<D>(next_k, next_v, t, row);
    const __m512 w = _mm512_set1_ps(weights[t]);
    for (int i = 0; i < kVecs; ++i) a[i] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + t * row + 16 * i), a[i]);
  }
  for (int i = 0; i < kVecs; ++i) _mm512_storeu_ps(acc + 16 * i, a[i]);
#elif defined(__AVX2__)
  constexpr int kVecs = D / 8;
  __m256 a[kVecs];
  const __m256 c = _mm256_set1_ps(correction);
  for (int i = 0; i < kVecs; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), c);
  for (int64_t t = 0; t < n; ++t) {
    if (t < ahead) prefetch_token<D>(next_k, next_v, t, row);
    const __m256 w = _mm256_set1_ps(weights[t]);
    for (int i = 0; i < kVecs; ++i) a[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + t * row + 8 * i), a[i]);
  }
  for (int i = 0; i < kVecs; ++i) _mm256_storeu_ps(acc + 8 * i, a[i]);
#else
#pragma omp simd
  for (int d = 0; d < D; ++d) acc[d] *= correction;
  for (int64_t t = 0; t < n; ++t) {
    if (t < ahead) prefetch_token<D>(next_k, next_v, t, row);
#pragma omp simd
    for (int d = 0; d < D; ++d) acc[d] += weights[t] * v[t * row + d];
  }
#endif
}

// The running softmax of one query head over the keys read so far, as kept in the workspace: the
// weighted sum of values (D floats), then the running max and the running sum of exponentials.
template <int D>
constexpr int64_t kState = D + 2;

// Folds one block's n keys and values (consecutive tokens `row` floats apart) into the states of the
// `group` query heads q [group, D] that share their KV head: scores for the whole block, one rescale
// of the running sums per block (none when the running max holds: exp(0) is 1), then the weighted
// values, during which the first head asks for the next block's `ahead` tokens of this KV head.
template <int D>
void attend_block(const float* q, const float* k, const float* v, int64_t row, int64_t n, int64_t group,
                  float scale, float* states, const float* next_k, const float* next_v, int64_t ahead) {
  alignas(64) float scores[kMaxBlock];
  for (int64_t g = 0; g < group; ++g) {
    float* acc = states + g * kState<D>;
    float& running_max = acc[D];
    float& running_sum = acc[D + 1];
    block_scores<D>(q + g * D, k, row, n, scale, scores);
    const float new_max = std::max(running_max, llmopt_simd::max_of(scores, n));
    const float correction = new_max == running_max ? 1.f : std::exp(running_max - new_max);
    running_max = new_max;
    float block_sum = 0.f;
#pragma omp simd
    for (int64_t t = 0; t < n; ++t) scores[t] -= new_max;
    exp_inplace(scores, n);
#pragma omp simd reduction(+ : block_sum)
    for (int64_t t = 0; t < n; ++t) block_sum += scores[t];
    running_sum = running_sum * correction + block_sum;
    add_weighted_values<D>(scores, v, row, n, correction, acc, next_k, next_v, g == 0 ? ahead : 0);
  }
}

// Positions [begin, end) of one sequence's context for KV heads [h0, h1): states [heads, kState<D>] of
// the row (those heads' query heads written). A block holds all KV heads of its tokens contiguously, so
// its heads are read one after another while it is in cache, and the next block (anywhere in the pool:
// the hardware prefetcher cannot see it coming) is asked for while this one is computed. Measured
// against a thread per KV head reading its rows across the whole context (30 layers, 2,144-token
// contexts, AVX-512, 2 threads, spans as decode_attention cuts them): one row 13.2 -> 8.4 ms, four rows
// 38.9 -> 32.0 ms; then asking for the next block token by token inside the value loop (add_weighted_values)
// rather than all at once: one row 7.9 -> 6.9 ms, four rows 30.8 -> 25.3 ms (means of 4 alternating runs),
// about 15 of the ~27 GB/s two threads stream here.
template <int D>
void attend_span(const float* q, const float* k_cache, const float* v_cache, const int64_t* block_table,
                 int64_t begin, int64_t end, int64_t block_size, int64_t kv_heads, int64_t h0, int64_t h1,
                 int64_t group, float scale, float* states) {
  const int64_t row = kv_heads * D;  // floats between consecutive tokens of one block
  for (int64_t g = h0 * group; g < h1 * group; ++g) {
    float* acc = states + g * kState<D>;
    std::fill(acc, acc + D, 0.f);
    acc[D] = -std::numeric_limits<float>::infinity();
    acc[D + 1] = 0.f;
  }
  for (int64_t start = begin / block_size * block_size; start < end; start += block_size) {
    const int64_t skip = std::max<int64_t>(0, begin - start);
    const int64_t n = std::min(block_size, end - start) - skip;
    const bool more = start + block_size < end;
    const int64_t next = more ? block_table[start / block_size + 1] * block_size * row : 0;
    const int64_t ahead = more ? std::min(block_size, end - start - block_size) : 0;
    const int64_t offset = (block_table[start / block_size] * block_size + skip) * row;
    for (int64_t h = h0; h < h1; ++h)
      attend_block<D>(q + h * group * D, k_cache + offset + h * D, v_cache + offset + h * D, row, n, group,
                      scale, states + h * group * kState<D>, k_cache + next + h * D, v_cache + next + h * D,
                      ahead);
  }
}

// out [D] of one query head from its states over `spans` spans (kState<D> floats each, `stride` apart):
// each span's sums rescaled to the largest running max (one span: exp(0) = 1, so acc / sum exactly). A
// span is never empty, so every sum is at least 1.
template <int D>
void merge_spans(const float* states, int64_t spans, int64_t stride, float* out) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < spans; ++s) max = std::max(max, states[s * stride + D]);
  alignas(64) float acc[D] = {};
  float sum = 0.f;
  for (int64_t s = 0; s < spans; ++s) {
    const float* st = states + s * stride;
    const float w = std::exp(st[D] - max);
    sum += st[D + 1] * w;
#pragma omp simd
    for (int d = 0; d < D; ++d) acc[d] += st[d] * w;
  }
  const float inv = 1.f / sum;
  for (int d = 0; d < D; ++d) out[d] = acc[d] * inv;
}

template <int D>
void decode_attention(const float* qp, const float* kp, const float* vp, const int64_t* tp, const int64_t* lp,
                      int64_t batch, int64_t heads, int64_t kv_heads, int64_t block_size, int64_t max_blocks,
                      float scale, int64_t window, float* op) {
  const int64_t group = heads / kv_heads;
  // Each sequence's context in up to kMaxSpans spans of at least kMinSpanBlocks blocks, attended apart
  // and merged by their softmax states (flash-decoding's split-K), so that one long row keeps every
  // thread busy (its 3 KV heads as the work items left one of 2 threads idle a third of the time). The
  // spans follow from the row's own length alone, never from the batch, so a row's result is the same
  // whatever rows share its step.
  constexpr int64_t kMaxSpans = 8, kMinSpanBlocks = 16;
  std::vector<int64_t> first_item(batch + 1, 0);  // row b's spans are items first_item[b] .. [b + 1]
  std::vector<int64_t> span_blocks(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = window > 0 ? std::max<int64_t>(0, lp[b] - window) : 0;  // a window's first
    const int64_t blocks = (lp[b] + block_size - 1) / block_size - first / block_size;
    const int64_t spans = std::clamp<int64_t>(blocks / kMinSpanBlocks, 1, kMaxSpans);
    span_blocks[b] = (blocks + spans - 1) / spans;
    first_item[b + 1] = first_item[b] + (blocks + span_blocks[b] - 1) / span_blocks[b];
  }
  std::vector<float> states(first_item[batch] * heads * kState<D>);
  // Few spans (short contexts, small batches) are also cut by KV head, which changes no arithmetic.
  const int64_t spans = first_item[batch];
  const int64_t cuts = std::min(kv_heads, (2 * at::get_num_threads() + spans - 1) / spans);
  const int64_t per_cut = (kv_heads + cuts - 1) / cuts;
  at::parallel_for(0, spans * cuts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t i = item / cuts, h0 = item % cuts * per_cut, h1 = std::min(kv_heads, h0 + per_cut);
      if (h0 >= h1) continue;
      const int64_t b = std::upper_bound(first_item.begin(), first_item.end(), i) - first_item.begin() - 1;
      const int64_t len = lp[b], first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t span_start = (first / block_size + (i - first_item[b]) * span_blocks[b]) * block_size;
      const int64_t begin = std::max(first, span_start);
      const int64_t end = std::min(len, span_start + span_blocks[b] * block_size);
      attend_span<D>(qp + b * heads * D, kp, vp, tp + b * max_blocks, begin, end, block_size,
                     kv_heads, h0, h1, group, scale, states.data() + i * heads * kState<D>);
    }
  });
  const int64_t stride = heads * kState<D>;  // between the spans of one row
  at::parallel_for(0, batch * heads, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / heads, h = i % heads;
      merge_spans<D>(states.data() + first_item[b] * stride + h * kState<D>, first_item[b + 1] - first_item[b],
                     stride, op + i * D);
    }
  });
}

// q: [B, heads, D] fp32; k_cache, v_cache: [blocks, block_size, kv_heads, D] fp32;
// block_tables: [B, max_blocks] int64; context_lens: [B] int64; window: attend to the last `window`
// positions only (0: the whole context). Returns [B, heads, D].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                  int64_t window) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
  TORCH_CHECK(group <= kMaxGroup && block_size <= kMaxBlock, "group size <= 16 and block size <= 64");
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = at::empty_like(q);
  if (batch == 0) return out;
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t max_blocks = tables.size(1);
  const float sc = (float)scale;
  switch (dim) {
    case 32: decode_attention<32>(qp, kp, vp, tp, lp, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    case 64: decode_attention<64>(qp, kp, vp, tp, lp, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    case 128: decode_attention<128>(qp, kp, vp, tp, lp, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    case 256: decode_attention<256>(qp, kp, vp, tp, lp, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    default: TORCH_CHECK(false, "head_dim must be 32, 64, 128 or 256");
  }
  return out;
}

// Dense linear on weights packed in panels: w [N / 32, K, 32] holds output columns 32p..32p+31 of the
// [K, N] weight contiguously, so each thread streams whole panels front to back (the hardware
// prefetcher sees one sequential stream) and applies each loaded weight to up to 8 input rows held in
// registers. MKL's sgemm, on the plain [K, N] layout, reads the weights at a third of the machine's
// bandwidth for the 2-32 row batches of decoding; this reads them at close to full bandwidth.
constexpr int64_t kPanel = 32;
constexpr int64_t kPrefetch = 32;  // weight rows (of one panel) ahead: 4 KB, measured best of 0/8/32/64
// With more than 8 input rows, the rows are taken 64 at a time (their partial sums stay in L1) and a
// panel 192 weight rows (24 KB) at a time; every group of 8 input rows works on that block while it is
// in L1, and each group prefetches its share of the next block, so memory keeps streaming while the
// groups compute. Measured here against the previous scheme (64-row weight blocks, a fixed prefetch
// distance): 1.24x at 16 rows, 1.11x at 512 (then level with MKL's sgemm on the plain layout in the best
// runs, up to 25 % behind in medians).
constexpr int64_t kBlockRows = 192;
constexpr int64_t kRowBlock = 64;

template <int MR>
void panel_rows(const float* x, int64_t K, const float* w, int64_t k0, int64_t k1, float* out, int64_t ldo,
                int64_t cols, const float* prefetch, int64_t prefetch_stride) {
#ifdef __AVX512F__
  const __mmask16 lo = cols >= 16 ? 0xFFFF : (1u << cols) - 1;
  const __mmask16 hi = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1;
  __m512 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lo, out + r * ldo);
    acc[r][1] = k0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(hi, out + r * ldo + 16);
  }
  for (int64_t k = k0; k < k1; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(prefetch + (k - k0) * prefetch_stride), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(w + k * kPanel), w1 = _mm512_loadu_ps(w + k * kPanel + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 xr = _mm512_set1_ps(x[r * K + k]);
      acc[r][0] = _mm512_fmadd_ps(xr, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xr, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(out + r * ldo, lo, acc[r][0]);
    _mm512_mask_storeu_ps(out + r * ldo + 16, hi, acc[r][1]);
  }
#else
  float acc[MR][kPanel] = {};
  for (int r = 0; r < MR; ++r)
    for (int64_t c = 0; c < cols && k0 > 0; ++c) acc[r][c] = out[r * ldo + c];
  for (int64_t k = k0; k < k1; ++k)
    for (int r = 0; r < MR; ++r) {
      const float xr = x[r * K + k];
#pragma omp simd
      for (int c = 0; c < kPanel; ++c) acc[r][c] += xr * w[k * kPanel + c];
    }
  for (int r = 0; r < MR; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * ldo + c] = acc[r][c];
#endif
}

using PanelFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int64_t,
                        const float*, int64_t);
constexpr PanelFn kPanelRows[] = {nullptr,         panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                  panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>};

// x: [M, K] fp32; w: [ceil(N / 32), K, 32] fp32 (columns past N are zero). Returns x @ W: [M, N].
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, int64_t n) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && w.size(2) == kPanel && w.size(1) == x.size(1), "shapes");
  TORCH_CHECK(w.size(0) == (n + kPanel - 1) / kPanel && w.is_contiguous(), "w: [ceil(n / 32), K, 32]");
  auto input = x.contiguous();
  const int64_t M = input.size(0), K = input.size(1), panels = w.size(0);
  auto out = at::empty({M, n}, input.options());
  const float* xp = input.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  if (M == 0) return out;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* panel = wp + p * K * kPanel;
      const int64_t cols = std::min(kPanel, n - p * kPanel);
      if (M <= 8) {  // one pass, prefetching a fixed distance ahead (into the next panel at the end)
        kPanelRows[M](xp, K, panel, 0, K, op + p * kPanel, n, cols, panel + kPrefetch * kPanel, kPanel);
        continue;
      }
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
        const int64_t m1 = std::min(M, m0 + kRowBlock), groups = (m1 - m0 + 7) / 8;
        for (int64_t k0 = 0; k0 < K; k0 += kBlockRows) {
          const int64_t k1 = std::min(K, k0 + kBlockRows);
          for (int64_t m = m0; m < m1; m += 8) {
            // Weights are contiguous across panels, so the next block starts at row k1 (of this panel
            // or, past its end, of the next): group g prefetches one line per step from its share.
            const float* next = panel + (k1 + (m - m0) / 8 * kBlockRows / groups) * kPanel;
            const int64_t rows = std::min<int64_t>(8, m1 - m);
            kPanelRows[rows](xp + m * K, K, panel, k0, k1, op + m * n + p * kPanel, n, cols, next, 16);
          }
        }
      }
    }
  });
  return out;
}

// Rotary embedding of q and k, written where attention wants them: returns q [T, heads, D] and stores
// k (rotated) and v in the paged cache at each token's slot. qkv: [T, (heads + 2 kv_heads) * D];
// cos, sin: [T, D]; caches: [blocks, block_size, kv_heads, D]; slots: [T] int64.
at::Tensor rope_and_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                          const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slots,
                          int64_t heads) {
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous caches");
  auto in = qkv.contiguous();
  auto c = cos.contiguous(), s = sin.contiguous(), sl = slots.contiguous();
  const int64_t T = in.size(0), kv_heads = k_cache.size(2), D = k_cache.size(3), half = D / 2;
  TORCH_CHECK(in.size(1) == (heads + 2 * kv_heads) * D && c.size(-1) == D, "shapes");
  auto q = at::empty({T, heads, D}, in.options());
  const float* ip = in.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const int64_t* slp = sl.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  float* kp = k_cache.data_ptr<float>();
  float* vp = v_cache.data_ptr<float>();
  const int64_t width = in.size(1);
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = ip + t * width;
      const float* ct = cp + t * D;
      const float* st = sp + t * D;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const float* src = row + h * D;
        float* dst = h < heads ? qp + (t * heads + h) * D : kp + (slp[t] * kv_heads + h - heads) * D;
        // x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x[half:], x[:half])
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) dst[i] = src[i] * ct[i] - src[i + half] * st[i];
#pragma omp simd
        for (int64_t i = half; i < D; ++i) dst[i] = src[i] * ct[i] + src[i - half] * st[i];
      }
      std::copy(row + (heads + kv_heads) * D, row + width, vp + slp[t] * kv_heads * D);
    }
  });
  return q;
}

// silu(gate) * up, with gate and up the two halves of each row of x: [T, 2I] -> [T, I].
at::Tensor silu_mul(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "x: [T, 2I], gate then up");
  auto in = x.contiguous();
  const int64_t T = in.size(0), I = in.size(1) / 2;
  auto out = at::empty({T, I}, in.options());
  const float* ip = in.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = ip + t * 2 * I;
      const float* up = gate + I;
      float* o = op + t * I;
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) o[i] = -gate[i];
      exp_inplace(o, I);
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) o[i] = gate[i] / (1.f + o[i]) * up[i];
    }
  });
  return out;
}

// RMSNorm over the last dimension, one row at a time: weight * x / sqrt(mean(x^2) + eps). One pass
// instead of the six ATen ops (pow, sum, div, add, rsqrt, mul) that F.rms_norm runs on CPU.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "fp32 only");
  auto input = x.contiguous();
  const int64_t dim = input.size(-1), rows = input.numel() / dim;
  TORCH_CHECK(weight.numel() == dim, "weight size must match the last dimension");
  auto out = at::empty_like(input);
  const float* xp = input.data_ptr<float>();
  const float* wp = weight.contiguous().data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * dim;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < dim; ++i) sum += row[i] * row[i];
      const float inv = 1.f / std::sqrt(sum / dim + (float)eps);
      float* o = op + r * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) o[i] = wp[i] * (row[i] * inv);
    }
  });
  return out;
}

// One linear layer of decode_layers: a panel-packed fp32 weight (no scales), or the int8 / int4 weights
// of llmopt/quant/linear.py with their bf16 scales, activations cast to bf16 around the call as
// QuantizedLinear does.
at::Tensor any_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  if (w.scalar_type() == at::kFloat) return packed_linear(x, w, w.size(0) * kPanel);
  // an int64 panel index: a GGUF file's blocks (llmopt/engine/layers/gguf_panels.py).
  if (scales.scalar_type() == at::kLong) return llmopt_gguf::gguf_matmul(x, w, scales);
  // fp32 scales: the packed int4 / int8 panels of llmopt/engine/layers/quantized_panels.py.
  if (scales.scalar_type() == at::kFloat) return llmopt_quant::quantized_matmul(x, w, scales);
  const at::Tensor x16 = x.to(at::kBFloat16);
  if (w.scalar_type() == at::kChar) return at::_weight_int8pack_mm(x16, w, scales).to(at::kFloat);
  TORCH_CHECK(w.scalar_type() == at::kByte && scales.dim() == 3, "int4 weights with [groups, out, 2] scales");
  return at::_weight_int4pack_mm_for_cpu(x16, w, x.size(1) / scales.size(0), scales).to(at::kFloat);
}

// Every decoder layer of a step whose tokens are all decode rows (one query each, no prefill chunk), in
// one call: the same kernels as the per-layer path, in the same order, without ~15 Python-level op
// calls per layer (about 4 ms of a 30 ms batch-1 step here). weights, per layer: input_norm, qkv, qkv
// scales, qkv bias (empty for none: Qwen2's layers have one), o, o scales, post_attention_norm, gate_up,
// gate_up scales, down, down scales (see any_linear). kv_cache: [layers, 2, blocks, block, kv_heads, D].
at::Tensor decode_layers(const at::Tensor& embeddings, std::vector<at::Tensor> weights, double eps,
                         const at::Tensor& kv_cache, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& context_lens,
                         int64_t heads) {
  constexpr size_t kPerLayer = 11;
  TORCH_CHECK(weights.size() == kPerLayer * kv_cache.size(0), "11 a layer");
  // An int8 cache (rows of D int8 values and a 4-byte scale) has its own write and attention.
  const bool int8 = kv_cache.scalar_type() == at::kChar;
  const int64_t tokens = embeddings.size(0), dim = kv_cache.size(-1) - (int8 ? 4 : 0);
  const double scale = 1.0 / std::sqrt((double)dim);
  at::Tensor hidden = embeddings.contiguous().clone();
  for (int64_t layer = 0; layer < kv_cache.size(0); ++layer) {
    const at::Tensor* w = weights.data() + kPerLayer * layer;
    const at::Tensor k_cache = kv_cache[layer][0], v_cache = kv_cache[layer][1];
    at::Tensor x = rms_norm(hidden, w[0], eps);
    at::Tensor qkv = any_linear(x, w[1], w[2]);
    if (w[3].numel()) qkv.add_(w[3]);
    w += 1;  // past the bias: the rest as before
    at::Tensor q = int8 ? llmopt_int8_kv::rope_and_cache_int8(qkv, cos, sin, k_cache, v_cache, slots, heads)
                        : rope_and_cache(qkv, cos, sin, k_cache, v_cache, slots, heads);
    at::Tensor attn =
        int8 ? llmopt_int8_kv::paged_decode_attention_int8(q, k_cache, v_cache, block_tables, context_lens, scale, 0)
             : paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, 0);
    hidden.add_(any_linear(attn.view({tokens, -1}), w[3], w[4]));
    x = rms_norm(hidden, w[5], eps);
    hidden.add_(any_linear(silu_mul(any_linear(x, w[6], w[7])), w[8], w[9]));
  }
  return hidden;
}

// Gemma 3's decoder layers (models/gemma3.py Gemma3Layer) for a decode-only step in one call, the same
// kernels and ATen ops in the same order as the per-layer path. Gemma's per-layer Python calls cost more
// than Llama's (four norms, q/k norm, GeGLU): 19 ms of a 270M Q4_K_M decode step at 1 row, of which
// ~10 ms in its 18 layers. weights, per layer: input_norm, qkv, qkv scales, q_norm, k_norm, o, o scales,
// post_attention_norm, pre_feedforward_norm, gate_up, gate_up scales, down, down scales,
// post_feedforward_norm (norm weights hold Gemma's 1 + w). windows: per layer, 0 for a global layer;
// cos / sin: [T, 2 D], the global layers' table then the local layers'.
at::Tensor decode_gemma3_layers(const at::Tensor& embeddings, std::vector<at::Tensor> weights, double eps,
                                const at::Tensor& kv_cache, const at::Tensor& cos, const at::Tensor& sin,
                                const at::Tensor& slots, const at::Tensor& block_tables,
                                const at::Tensor& context_lens, int64_t heads, std::vector<int64_t> windows,
                                double scale) {
  constexpr size_t kPerLayer = 14;
  const int64_t layers = kv_cache.size(0);
  TORCH_CHECK(weights.size() == kPerLayer * layers && (int64_t)windows.size() == layers, "14 a layer");
  const bool int8 = kv_cache.scalar_type() == at::kChar;
  const int64_t tokens = embeddings.size(0), dim = kv_cache.size(-1) - (int8 ? 4 : 0);
  const int64_t kv_heads = kv_cache.size(-2);
  TORCH_CHECK(cos.size(-1) == 2 * dim && sin.size(-1) == 2 * dim, "cos / sin: the global and local tables");
  const at::Tensor ropes[2][2] = {{cos.narrow(-1, 0, dim).contiguous(), sin.narrow(-1, 0, dim).contiguous()},
                                  {cos.narrow(-1, dim, dim).contiguous(), sin.narrow(-1, dim, dim).contiguous()}};
  at::Tensor hidden = embeddings.contiguous().clone();
  for (int64_t layer = 0; layer < layers; ++layer) {
    const at::Tensor* w = weights.data() + kPerLayer * layer;
    const int64_t window = windows[layer];
    const at::Tensor k_cache = kv_cache[layer][0], v_cache = kv_cache[layer][1];
    const at::Tensor& layer_cos = ropes[window > 0][0];
    const at::Tensor& layer_sin = ropes[window > 0][1];
    const at::Tensor qkv = any_linear(rms_norm(hidden, w[0], eps), w[1], w[2]);
    const at::Tensor qk = qkv.narrow(1, 0, (heads + kv_heads) * dim).view({tokens, heads + kv_heads, dim});
    const at::Tensor normed = at::cat({rms_norm(qk.narrow(1, 0, heads), w[3], eps).flatten(1),
                                       rms_norm(qk.narrow(1, heads, kv_heads), w[4], eps).flatten(1),
                                       qkv.narrow(1, (heads + kv_heads) * dim, kv_heads * dim)},
                                      1);
    const at::Tensor q =
        int8 ? llmopt_int8_kv::rope_and_cache_int8(normed, layer_cos, layer_sin, k_cache, v_cache, slots, heads)
             : rope_and_cache(normed, layer_cos, layer_sin, k_cache, v_cache, slots, heads);
    const at::Tensor attn =
        int8 ? llmopt_int8_kv::paged_decode_attention_int8(q.contiguous(), k_cache, v_cache, block_tables,
                                                           context_lens, scale, window)
             : paged_decode_attention(q.contiguous(), k_cache, v_cache, block_tables, context_lens, scale, window);
    hidden.add_(rms_norm(any_linear(attn.view({tokens, -1}), w[5], w[6]), w[7], eps));
    const at::Tensor gate_up = any_linear(rms_norm(hidden, w[8], eps), w[9], w[10]);
    const int64_t inter = gate_up.size(1) / 2;
    const at::Tensor act = at::gelu(gate_up.narrow(1, 0, inter), "tanh") * gate_up.narrow(1, inter, inter);
    hidden.add_(rms_norm(any_linear(act, w[11], w[12]), w[13], eps));
  }
  return hidden;
}

}  // namespace

TORCH_LIBRARY(llmopt, m) {
  m.def("paged_decode_attention", &paged_decode_attention);
  m.def("rms_norm", &rms_norm);
  m.def("packed_linear", &packed_linear);
  m.def("rope_and_cache", &rope_and_cache);
  m.def("silu_mul", &silu_mul);
  m.def("decode_layers", &decode_layers);
  m.def("decode_gemma3_layers", &decode_gemma3_layers);
}
