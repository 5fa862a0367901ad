// The int8 KV cache (--kv-cache-dtype int8): its write (rotary embedding, then each key and value row
// quantized) and decode attention over it.
//
// Layout: the cache is int8 [blocks, block_size, kv_heads, D + 4]; each token-head row holds its D values
// quantized symmetrically (x = scale * q, scale = max|x| / 127) followed by the fp32 scale's 4 bytes, so
// the cache stays one tensor that block tables, prefix caching and preemption handle as before, and a
// row and its scale arrive in the same cache lines. Attention dequantizes one block of one KV head into
// an fp32 buffer (once for all the query heads that share it) and runs the fp32 kernel's online softmax
// over it: the cache is read at a quarter of the fp32 bytes, the arithmetic is unchanged.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "vector_math.h"

namespace {

using namespace llmopt_simd;

constexpr int kMaxGroup = 16;
constexpr int kMaxBlock = 64;
constexpr int64_t kScaleBytes = 4;

inline float row_scale(const int8_t* row, int64_t dim) {
  float scale;
  std::memcpy(&scale, row + dim, sizeof scale);
  return scale;
}

// x (D floats) into one cache row: D int8 values and their scale.
inline void quantize_row(const float* x, int64_t dim, int8_t* row) {
  float amax = 0.f;
  for (int64_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float scale = amax / 127.f;
  const float divisor = scale > 0.f ? scale : 1.f;  // an all-zero row stays zero
  // Division rather than a multiply by 1 / scale: the same rounding as the PyTorch path's x / scale.
  for (int64_t d = 0; d < dim; ++d)
    row[d] = (int8_t)std::max(-127.f, std::min(127.f, std::nearbyint(x[d] / divisor)));
  std::memcpy(row + dim, &scale, sizeof scale);
}

// n cache rows (stride `row` bytes) into dst [n, D] fp32, each row times its scale.
template <int D>
void dequantize_rows(const int8_t* src, int64_t row, int64_t n, float* dst) {
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* r = src + t * row;
    const float scale = row_scale(r, D);
#if defined(__AVX512F__) || defined(__AVX2__)
    const Vec s = vset(scale);
    for (int d = 0; d < D; d += kLanes) vstore(dst + t * D + d, vmul(s, vload_i8(r + d)));
#else
    for (int d = 0; d < D; ++d) dst[t * D + d] = scale * r[d];
#endif
  }
}

// scores[t] = scale * q . k[t] over n contiguous fp32 keys; scores has room for n rounded up to kLanes.
template <int D>
void block_scores(const float* q, const float* k, int64_t n, float scale, float* scores) {
#if defined(__AVX512F__) || defined(__AVX2__)
  constexpr int kVecs = D / kLanes;
  for (int64_t t0 = 0; t0 < n; t0 += kLanes) {
    Vec dots[kLanes];  // kLanes keys at a time, their dot products summed by one transposing tree
    for (int t = 0; t < kLanes; ++t) {
      dots[t] = vzero();
      if (t0 + t >= n) continue;
      const float* kt = k + (t0 + t) * D;
      for (int i = 0; i < kVecs; ++i) dots[t] = vfma(vload(q + kLanes * i), vload(kt + kLanes * i), dots[t]);
    }
    vstore(scores + t0, vmul(sum_lanes(dots), vset(scale)));
  }
#else
  for (int64_t t = 0; t < n; ++t) {
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < D; ++d) dot += q[d] * k[t * D + d];
    scores[t] = dot * scale;
  }
#endif
}

// acc = acc * correction + sum over t of weights[t] * v[t], over n contiguous fp32 values.
template <int D>
void add_weighted_values(const float* weights, const float* v, int64_t n, float correction, float* acc) {
#if defined(__AVX512F__) || defined(__AVX2__)
  constexpr int kVecs = D / kLanes;
  Vec a[kVecs];
  const Vec c = vset(correction);
  for (int i = 0; i < kVecs; ++i) a[i] = vmul(vload(acc + kLanes * i), c);
  for (int64_t t = 0; t < n; ++t) {
    const Vec w = vset(weights[t]);
    for (int i = 0; i < kVecs; ++i) a[i] = vfma(w, vload(v + t * D + kLanes * i), a[i]);
  }
  for (int i = 0; i < kVecs; ++i) vstore(acc + kLanes * i, a[i]);
#else
  for (int d = 0; d < D; ++d) acc[d] *= correction;
  for (int64_t t = 0; t < n; ++t)
#pragma omp simd
    for (int d = 0; d < D; ++d) acc[d] += weights[t] * v[t * D + d];
#endif
}

// The query heads q, out [group, D] of one KV head over positions [first, context_len) of one sequence.
template <int D>
void decode_heads(const float* q, const int8_t* k_cache, const int8_t* v_cache, const int64_t* block_table,
                  int64_t first, int64_t context_len, int64_t block_size, int64_t kv_heads, int64_t kv_head,
                  int64_t group, float scale, float* out) {
  alignas(64) float acc[kMaxGroup][D] = {};
  alignas(64) float keys[kMaxBlock * D], values[kMaxBlock * D];
  alignas(64) float scores[kMaxBlock];
  float running_max[kMaxGroup], running_sum[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    running_max[g] = -std::numeric_limits<float>::infinity();
    running_sum[g] = 0.f;
  }
  const int64_t row = kv_heads * (D + kScaleBytes);  // bytes between consecutive tokens of one block
  for (int64_t start = first / block_size * block_size; start < context_len; start += block_size) {
    const int64_t lo = std::max<int64_t>(0, first - start), hi = std::min(block_size, context_len - start);
    const int64_t n = hi - lo;
    const int64_t base = (block_table[start / block_size] * block_size * kv_heads + kv_head) * (D + kScaleBytes);
    if (start + block_size < context_len) {
      // Blocks sit anywhere in the pool: ask for this head's rows of the next one while this one computes.
      const int64_t next = (block_table[start / block_size + 1] * block_size * kv_heads + kv_head) * (D + kScaleBytes);
      const int64_t rows = std::min(block_size, context_len - start - block_size);
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t d = 0; d < D + kScaleBytes; d += 64) {
          __builtin_prefetch(k_cache + next + t * row + d);
          __builtin_prefetch(v_cache + next + t * row + d);
        }
    }
    dequantize_rows<D>(k_cache + base + lo * row, row, n, keys);
    dequantize_rows<D>(v_cache + base + lo * row, row, n, values);
    for (int64_t g = 0; g < group; ++g) {
      block_scores<D>(q + g * D, keys, n, scale, scores);
      const float new_max = std::max(running_max[g], max_of(scores, n));
      const float correction = std::exp(running_max[g] - new_max);
      running_max[g] = new_max;
      for (int64_t t = 0; t < n; ++t) scores[t] -= new_max;
      exp_inplace(scores, n);
      float block_sum = 0.f;
      for (int64_t t = 0; t < n; ++t) block_sum += scores[t];
      running_sum[g] = running_sum[g] * correction + block_sum;
      add_weighted_values<D>(scores, values, n, correction, acc[g]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float inv = 1.f / running_sum[g];
    for (int d = 0; d < D; ++d) out[g * D + d] = acc[g][d] * inv;
  }
}

void check_cache(const at::Tensor& cache) {
  TORCH_CHECK(cache.scalar_type() == at::kChar && cache.dim() == 4 && cache.is_contiguous(),
              "int8 cache [blocks, block_size, kv_heads, head_dim + 4], contiguous");
}

}  // namespace

// Defined outside the anonymous namespace: decode_layers (cpu_kernels.cpp) calls them for an int8 cache.
namespace llmopt_int8_kv {

// q: [B, heads, D] fp32; caches: int8 [blocks, block_size, kv_heads, D + 4]; block_tables: [B, max_blocks]
// int64; context_lens: [B] int64; window > 0: each row attends to its last `window` positions only.
at::Tensor paged_decode_attention_int8(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                       const at::Tensor& block_tables, const at::Tensor& context_lens,
                                       double scale, int64_t window) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous() && q.dim() == 3, "q: fp32 [B, heads, D]");
  check_cache(k_cache);
  check_cache(v_cache);
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
  TORCH_CHECK(k_cache.size(3) == dim + kScaleBytes, "cache rows: head_dim int8 values and a 4-byte scale");
  TORCH_CHECK(group <= kMaxGroup && block_size <= kMaxBlock, "group size <= 16 and block size <= 64");
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: the whole context)");
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const int8_t* kp = k_cache.data_ptr<int8_t>();
  const int8_t* vp = v_cache.data_ptr<int8_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t max_blocks = tables.size(1);
  float* op = out.data_ptr<float>();
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / kv_heads, h = i % kv_heads;
      const float* qh = qp + (b * heads + h * group) * dim;
      float* oh = op + (b * heads + h * group) * dim;
      const int64_t* table = tp + b * max_blocks;
      const int64_t first = window > 0 ? std::max<int64_t>(0, lp[b] - window) : 0;
      const float s = (float)scale;
      switch (dim) {
        case 32: decode_heads<32>(qh, kp, vp, table, first, lp[b], block_size, kv_heads, h, group, s, oh); break;
        case 64: decode_heads<64>(qh, kp, vp, table, first, lp[b], block_size, kv_heads, h, group, s, oh); break;
        case 128: decode_heads<128>(qh, kp, vp, table, first, lp[b], block_size, kv_heads, h, group, s, oh); break;
        case 256: decode_heads<256>(qh, kp, vp, table, first, lp[b], block_size, kv_heads, h, group, s, oh); break;
        default: TORCH_CHECK(false, "head_dim must be 32, 64, 128 or 256");
      }
    }
  });
  return out;
}

// rope_and_cache (cpu_kernels.cpp) for an int8 cache: returns q [T, heads, D] rotated and writes each
// token's rotated keys and its values, quantized, at its slot. qkv: [T, (heads + 2 kv_heads) * D] fp32;
// cos, sin: [T, D]; caches: int8 [blocks, block_size, kv_heads, D + 4]; slots: [T] int64.
at::Tensor rope_and_cache_int8(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slots,
                               int64_t heads) {
  TORCH_CHECK(qkv.scalar_type() == at::kFloat, "qkv: fp32");
  check_cache(k_cache);
  check_cache(v_cache);
  auto in = qkv.contiguous();
  auto c = cos.contiguous(), s = sin.contiguous(), sl = slots.contiguous();
  const int64_t T = in.size(0), kv_heads = k_cache.size(2), D = k_cache.size(3) - kScaleBytes, half = D / 2;
  TORCH_CHECK(in.size(1) == (heads + 2 * kv_heads) * D && c.size(-1) == D && D <= 256, "shapes");
  auto q = at::empty({T, heads, D}, in.options());
  const float* ip = in.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const int64_t* slp = sl.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  int8_t* kp = k_cache.data_ptr<int8_t>();
  int8_t* vp = v_cache.data_ptr<int8_t>();
  const int64_t width = in.size(1), row = D + kScaleBytes;
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    float rotated[256];
    for (int64_t t = begin; t < end; ++t) {
      const float* x = ip + t * width;
      const float* ct = cp + t * D;
      const float* st = sp + t * D;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        const float* src = x + h * D;
        float* dst = h < heads ? qp + (t * heads + h) * D : rotated;
        // x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x[half:], x[:half])
        for (int64_t i = 0; i < half; ++i) dst[i] = src[i] * ct[i] - src[i + half] * st[i];
        for (int64_t i = half; i < D; ++i) dst[i] = src[i] * ct[i] + src[i - half] * st[i];
        if (h >= heads) quantize_row(rotated, D, kp + (slp[t] * kv_heads + h - heads) * row);
      }
      for (int64_t h = 0; h < kv_heads; ++h)
        quantize_row(x + (heads + kv_heads + h) * D, D, vp + (slp[t] * kv_heads + h) * row);
    }
  });
  return q;
}

}  // namespace llmopt_int8_kv

TORCH_LIBRARY_FRAGMENT(llmopt, m) {
  m.def("paged_decode_attention_int8", &llmopt_int8_kv::paged_decode_attention_int8);
  m.def("rope_and_cache_int8", &llmopt_int8_kv::rope_and_cache_int8);
}
