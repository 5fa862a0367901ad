// Prefill attention over the paged KV cache: the queries of prompt chunks (a row's new tokens, after any
// prefix it has cached) against that row's keys, causal, optionally within a sliding window.
//
// A work item is kLanes consecutive queries of one row and one KV head, with every query head that shares
// it (GQA). The (query, head) pairs sit transposed in lanes (q_t[d] holds dimension d of kLanes of them), so
// a key's score for all of them is D fused multiply-adds with that key's value broadcast, the softmax over keys is
// lane-wise (running max and sum per query, no horizontal reductions), and so is the weighted sum of values.
// Keys and values are read kChunk at a time from the cache into a small contiguous buffer, once for all the
// heads of the group. Keys past a query's position, or before its window, are masked in the scores.
// Replaces gathering every row's blocks and SDPA's flash kernel, which on CPU computes whole 512-key blocks
// (no causal skip inside one) with GQA heads apart: docs/architecture.md names the benchmark.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "vector_math.h"

namespace llmopt_prefill {

using namespace llmopt_simd;

// Keys scored at once: their scores are registers (AVX2 has 16 of them, AVX-512 32).
constexpr int kKeys = kLanes >= 16 ? 16 : 8;
// Keys folded into the softmax state at once, in passes of kKeys: the outputs are read, rescaled and
// written back once per chunk, so a longer chunk spends more of its time in multiply-adds.
constexpr int kChunk = 2 * kKeys;
// Dimensions of a dot product summed in one chain (D is 32 or a multiple of 64).
template <int D>
constexpr int kDotRunOf = D < 64 ? D : 64;
// Dimensions of the output updated at once from the chunk's weights (independent FMA chains).
constexpr int kDims = kLanes >= 16 ? 8 : 4;

struct Tile {
  int64_t row, first, count, kv_head;  // `count` (<= kLanes) queries of `row` from its query `first`
  int64_t begin, end;                   // the keys any of them attends: positions [begin, end)
};

// The running state of kLanes (query, head) pairs: their queries and outputs transposed ([D][kLanes]), and
// per lane the query's position and the softmax's running max and sum.
template <int D>
struct LaneState {
  float* q_t;
  float* out_t;
  Vec query_pos, max, sum;
};

// Scores of the kChunk buffered keys for one state's lanes, masked, folded into it (online softmax).
// key_pos[j]: position of buffered key j (+inf past the chunk's real keys); window_last[j]: the last query
// position whose window holds key j (+inf without a window).
template <int D>
void attend_keys(const float* keys, const float* values, const float* key_pos, const float* window_last, float scale,
                 LaneState<D>& s) {
  constexpr int kDotRun = kDotRunOf<D>;
  const Vec query_pos = s.query_pos;
  Vec score[kChunk];
  for (int j0 = 0; j0 < kChunk; j0 += kKeys) {
    // Dot products in runs of kDotRun dimensions added up afterwards, not one chain of D: at D = 256 one
    // chain's rounding error was 1.7x SDPA's against a float64 reference (mean 1.1e-6 against 6.3e-7).
    for (int d0 = 0; d0 < D; d0 += kDotRun) {
      Vec acc[kKeys];
      for (int j = 0; j < kKeys; ++j) acc[j] = vzero();
      for (int d = d0; d < d0 + kDotRun; ++d) {
        const Vec q = vload(s.q_t + d * kLanes);
        for (int j = 0; j < kKeys; ++j) acc[j] = vfma(q, vset(keys[(j0 + j) * D + d]), acc[j]);
      }
      for (int j = 0; j < kKeys; ++j) score[j0 + j] = d0 == 0 ? acc[j] : vadd(score[j0 + j], acc[j]);
    }
  }
  const Vec minus_inf = vset(-std::numeric_limits<float>::infinity());
  Vec chunk_max = minus_inf;
  for (int j = 0; j < kChunk; ++j) {
    score[j] = vwhere_le(vset(key_pos[j]), query_pos, vmul(score[j], vset(scale)), minus_inf);
    score[j] = vwhere_le(query_pos, vset(window_last[j]), score[j], minus_inf);
    chunk_max = vmax(chunk_max, score[j]);
  }
  const Vec new_max = vmax(s.max, chunk_max);
  // A lane with no key yet (a window that starts past this chunk) keeps -inf as its max; subtracting a
  // finite stand-in keeps its exp's argument -inf instead of NaN.
  const Vec shift = vmax(new_max, vset(-std::numeric_limits<float>::max()));
  const Vec correction = vexp(vsub(s.max, shift));
  Vec total = vzero();
  for (int j = 0; j < kChunk; ++j) {  // the weights, in place of the scores; a masked one is 0, not exp's ~1e-38
    score[j] = vwhere_le(score[j], minus_inf, vzero(), vexp(vsub(score[j], shift)));
    total = vadd(total, score[j]);
  }
  s.sum = vfma(s.sum, correction, total);
  s.max = new_max;
  // The chunk's weighted values summed apart, then added to the rescaled output: two levels of sums
  // rather than one chain over the whole context (the same operations).
  for (int d0 = 0; d0 < D; d0 += kDims) {
    Vec acc[kDims];
    for (int u = 0; u < kDims; ++u) acc[u] = vzero();
    for (int j = 0; j < kChunk; ++j)
      for (int u = 0; u < kDims; ++u) acc[u] = vfma(score[j], vset(values[j * D + d0 + u]), acc[u]);
    for (int u = 0; u < kDims; ++u)
      vstore(s.out_t + (d0 + u) * kLanes, vfma(vload(s.out_t + (d0 + u) * kLanes), correction, acc[u]));
  }
}

// One tile: its queries from q [tokens, heads, D] (the row's from `q_row`), its outputs into out. Its
// count x group (query, head) pairs fill lane vectors head by head (lane l: head l / count, query l % count),
// so a full tile has a vector per head and a short one (a chunk's last few queries) only as many as its pairs
// need; the keys and values are read once for all of them.
template <int D>
void attend_tile(const float* q_row, const float* k_cache, const float* v_cache, const int64_t* table,
                 int64_t block_size, int64_t kv_heads, int64_t group, int64_t start_pos, int64_t window,
                 float scale, const Tile& t, float* out_row) {
  const int64_t heads = kv_heads * group, row = kv_heads * D;  // floats between consecutive cached tokens
  const int64_t pairs = t.count * group, vectors = (pairs + kLanes - 1) / kLanes;
  std::vector<float> buffers(2 * vectors * D * kLanes + 2 * kChunk * D);
  float* keys = buffers.data() + 2 * vectors * D * kLanes;
  float* values = keys + kChunk * D;
  // The output row of lane l's query and head (lanes past the pairs repeat the last one).
  const auto query_of = [&](int64_t l) { return t.first + std::min(l, pairs - 1) % t.count; };
  const auto head_of = [&](int64_t l) { return t.kv_head * group + std::min(l, pairs - 1) / t.count; };
  std::vector<LaneState<D>> states(vectors);
  for (int64_t v = 0; v < vectors; ++v) {
    LaneState<D>& s = states[v];
    s.q_t = buffers.data() + 2 * v * D * kLanes;
    s.out_t = s.q_t + D * kLanes;
    alignas(64) float lane_pos[kLanes];
    for (int i = 0; i < kLanes; ++i) {
      const int64_t l = v * kLanes + i;
      const float* q = q_row + (query_of(l) * heads + head_of(l)) * D;
      for (int d = 0; d < D; ++d) s.q_t[d * kLanes + i] = q[d];
      lane_pos[i] = (float)(start_pos + query_of(l));
    }
    std::fill(s.out_t, s.out_t + D * kLanes, 0.f);
    s.query_pos = vload(lane_pos);
    s.max = vset(-std::numeric_limits<float>::infinity());
    s.sum = vzero();
  }
  const float no_window = std::numeric_limits<float>::infinity();
  float key_pos[kChunk], window_last[kChunk];
  for (int64_t key = t.begin; key < t.end; key += kChunk) {
    const int64_t n = std::min<int64_t>(kChunk, t.end - key);
    for (int64_t j = 0; j < kChunk; ++j) {
      const int64_t pos = key + std::min(j, n - 1);  // past n: a copy, masked by its position
      const int64_t src = (table[pos / block_size] * block_size + pos % block_size) * row + t.kv_head * D;
      std::memcpy(keys + j * D, k_cache + src, D * sizeof(float));
      std::memcpy(values + j * D, v_cache + src, D * sizeof(float));
      key_pos[j] = j < n ? (float)(key + j) : std::numeric_limits<float>::infinity();
      window_last[j] = window > 0 ? (float)(key + j + window - 1) : no_window;
    }
    for (LaneState<D>& s : states) attend_keys<D>(keys, values, key_pos, window_last, scale, s);
  }
  for (int64_t v = 0; v < vectors; ++v) {
    const LaneState<D>& s = states[v];
    alignas(64) float sum[kLanes];
    vstore(sum, s.sum);
    for (int64_t i = 0; i < kLanes && v * kLanes + i < pairs; ++i) {
      float* o = out_row + (query_of(v * kLanes + i) * heads + head_of(v * kLanes + i)) * D;
      const float inv = 1.f / sum[i];
      for (int d = 0; d < D; ++d) o[d] = s.out_t[d * kLanes + i] * inv;
    }
  }
}

template <int D>
void prefill_attention(const float* qp, const float* kp, const float* vp, const int64_t* tp, const int64_t* lp,
                       const int64_t* np, int64_t batch, int64_t heads, int64_t kv_heads, int64_t block_size,
                       int64_t max_blocks, float scale, int64_t window, float* op) {
  const int64_t group = heads / kv_heads;
  std::vector<int64_t> first_query(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) first_query[b + 1] = first_query[b] + np[b];
  std::vector<Tile> tiles;
  std::vector<int64_t> work_before(1, 0);  // keys x lane vectors, to split the tiles into runs of equal work
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = lp[b] - np[b];  // position of the row's first new token
    for (int64_t first = 0; first < np[b]; first += kLanes) {
      const int64_t count = std::min<int64_t>(kLanes, np[b] - first);
      const int64_t begin = window > 0 ? std::max<int64_t>(0, start + first - window + 1) : 0;
      for (int64_t h = 0; h < kv_heads; ++h) {
        tiles.push_back({b, first, count, h, begin, start + first + count});
        const int64_t vectors = (count * group + kLanes - 1) / kLanes;
        work_before.push_back(work_before.back() + (start + first + count - begin) * vectors);
      }
    }
  }
  const int64_t threads = at::get_num_threads(), total = work_before.back();
  at::parallel_for(0, threads, 1, [&](int64_t lo, int64_t hi) {
    for (size_t i = 0; i < tiles.size(); ++i) {
      const int64_t middle = work_before[i] + work_before[i + 1];  // x 2
      if (middle < 2 * total * lo / threads || middle >= 2 * total * hi / threads) continue;
      const Tile& t = tiles[i];
      attend_tile<D>(qp + first_query[t.row] * heads * D, kp, vp, tp + t.row * max_blocks, block_size, kv_heads,
                     group, lp[t.row] - np[t.row], window, scale, t, op + first_query[t.row] * heads * D);
    }
  });
}

// q: [tokens, heads, D] fp32, the rows' new tokens one row after another; k_cache, v_cache: [blocks,
// block_size, kv_heads, D] fp32, the new tokens' keys and values already written; block_tables: [B,
// max_blocks]; context_lens: [B] (cached + new); query_lens: [B] new tokens per row (>= 1); window: attend
// to the last `window` positions only (0: all). Returns [tokens, heads, D].
at::Tensor paged_prefill_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& block_tables, const at::Tensor& context_lens,
                                   const at::Tensor& query_lens, double scale, int64_t window) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs");
  const int64_t heads = q.size(1), dim = q.size(2), batch = block_tables.size(0);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of kv_heads");
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto news = query_lens.contiguous();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* np = news.data_ptr<int64_t>();
  const int64_t max_blocks = tables.size(1);
  int64_t tokens = 0;
  for (int64_t b = 0; b < batch; ++b) {  // on the raw lengths: this runs once a layer, in every prefill step
    TORCH_CHECK(np[b] >= 1 && np[b] <= lp[b], "0 < query_lens <= context_lens");
    TORCH_CHECK(lp[b] <= max_blocks * block_size, "context_lens beyond the block tables");
    tokens += np[b];
  }
  TORCH_CHECK(tokens == q.size(0), "query_lens must add up to q's tokens");
  auto out = at::empty_like(q);
  if (batch == 0) return out;
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = (float)scale;
  switch (dim) {
    case 32: prefill_attention<32>(qp, kp, vp, tp, lp, np, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    case 64: prefill_attention<64>(qp, kp, vp, tp, lp, np, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    case 128: prefill_attention<128>(qp, kp, vp, tp, lp, np, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    case 256: prefill_attention<256>(qp, kp, vp, tp, lp, np, batch, heads, kv_heads, block_size, max_blocks, sc, window, op); break;
    default: TORCH_CHECK(false, "head_dim must be 32, 64, 128 or 256");
  }
  return out;
}

}  // namespace llmopt_prefill

TORCH_LIBRARY_FRAGMENT(llmopt, m) { m.def("paged_prefill_attention", &llmopt_prefill::paged_prefill_attention); }
