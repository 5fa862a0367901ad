// The engine's CPU kernels: decode attention over the paged KV cache, and RMSNorm.
//
// Decode attention (one query token per sequence):
// Reads each cached key and value once for all the query heads that share its KV head (GQA), with an
// online softmax (running max and sum), so nothing of size [context] is gathered or stored. Replaces
// gather-then-SDPA, whose copies and fixed costs dominated decoding here.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int kMaxGroup = 16;
constexpr int kMaxBlock = 64;

template <int D>
void decode_heads(const float* q, const float* k_cache, const float* v_cache, const int64_t* block_table,
                  int64_t context_len, int64_t block_size, int64_t kv_heads, int64_t kv_head, int64_t group,
                  float scale, float* out) {
  // q and out: [group, D], the query heads of this KV head. One block of the context at a time: scores
  // for the whole block, one rescale of the running sums per block, then the weighted values.
  alignas(64) float acc[kMaxGroup][D] = {};
  float running_max[kMaxGroup], running_sum[kMaxGroup];
  alignas(64) float scores[kMaxGroup][kMaxBlock];
  for (int64_t g = 0; g < group; ++g) {
    running_max[g] = -std::numeric_limits<float>::infinity();
    running_sum[g] = 0.f;
  }
  const int64_t row = kv_heads * D;  // floats between consecutive tokens of one block
  for (int64_t start = 0; start < context_len; start += block_size) {
    const int64_t n = std::min(block_size, context_len - start);
    const int64_t block = block_table[start / block_size];
    const float* k = k_cache + (block * block_size * kv_heads + kv_head) * D;
    const float* v = v_cache + (block * block_size * kv_heads + kv_head) * D;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * D;
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < n; ++t) {
        const float* kt = k + t * row;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; ++d) dot += qg[d] * kt[d];
        scores[g][t] = dot * scale;
        block_max = std::max(block_max, scores[g][t]);
      }
      const float new_max = std::max(running_max[g], block_max);
      const float correction = std::exp(running_max[g] - new_max);
      running_max[g] = new_max;
      float block_sum = 0.f;
#pragma omp simd reduction(+ : block_sum)
      for (int64_t t = 0; t < n; ++t) {
        scores[g][t] = std::exp(scores[g][t] - new_max);
        block_sum += scores[g][t];
      }
      running_sum[g] = running_sum[g] * correction + block_sum;
      float* a = acc[g];
#pragma omp simd
      for (int d = 0; d < D; ++d) a[d] *= correction;
      for (int64_t t = 0; t < n; ++t) {
        const float* vt = v + t * row;
        const float w = scores[g][t];
#pragma omp simd
        for (int d = 0; d < D; ++d) a[d] += w * vt[d];
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float inv = 1.f / running_sum[g];
    for (int d = 0; d < D; ++d) out[g * D + d] = acc[g][d] * inv;
  }
}

// q: [B, heads, D] fp32; k_cache, v_cache: [blocks, block_size, kv_heads, D] fp32;
// block_tables: [B, max_blocks] int64; context_lens: [B] int64. Returns [B, heads, D].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  TORCH_CHECK(group <= kMaxGroup && block_size <= kMaxBlock, "group size <= 16 and block size <= 64");
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / kv_heads, h = i % kv_heads;
      const float* qh = qp + (b * heads + h * group) * dim;
      float* oh = op + (b * heads + h * group) * dim;
      const int64_t* table = tp + b * max_blocks;
      switch (dim) {
        case 32: decode_heads<32>(qh, kp, vp, table, lp[b], block_size, kv_heads, h, group, (float)scale, oh); break;
        case 64: decode_heads<64>(qh, kp, vp, table, lp[b], block_size, kv_heads, h, group, (float)scale, oh); break;
        case 128: decode_heads<128>(qh, kp, vp, table, lp[b], block_size, kv_heads, h, group, (float)scale, oh); break;
        default: TORCH_CHECK(false, "head_dim must be 32, 64 or 128");
      }
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

}  // namespace

TORCH_LIBRARY(llmopt, m) {
  m.def("paged_decode_attention", &paged_decode_attention);
  m.def("rms_norm", &rms_norm);
}
