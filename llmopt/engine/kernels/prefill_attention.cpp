// Prefill attention over the paged KV cache: the queries of prompt chunks (a row's new tokens, after any
// prefix it has cached) against that row's keys, causal, optionally within a sliding window.
//
// A tile is kLanes consecutive queries of one row and one KV head, with every query head that shares it
// (GQA); a work item is a run of kTilesPerRun such tiles, which read each chunk of keys from the cache once. The (query, head) pairs sit transposed in lanes (q_t[d] holds dimension d of kLanes of them), so
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

// Keys scored at once for a block of lane vectors: kBlock x kScoreKeys sums in registers (AVX2 has 16,
// AVX-512 32), beside kBlock queries and one broadcast key.
constexpr int kScoreKeys = kLanes >= 16 ? 8 : 4;
// Keys folded into the softmax state at once, in passes of kScoreKeys: the outputs are read, rescaled and
// written back once per chunk, so a longer chunk spends more of its time in multiply-adds.
constexpr int kChunk = 16;
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

// Keeps a loaded vector in a register: without it GCC folds the load into every multiply-add that uses it
// (one load per FMA instead of one per NV or kDims of them), and the load ports set the pace on AVX2.
inline void in_register(Vec& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#elif defined(__AVX2__)
  asm("" : "+x"(v));
#endif
}

// Lane vectors (of (query, head) pairs) attended together, as a register block: each key's broadcast feeds
// NV multiply-adds and each query's load kScoreKeys of them, instead of one load per multiply-add. With
// in_register below this took the kernel from 67 to 105 GFLOP/s on a 2-core AVX2 EPYC (130 new queries of
// 4 rows over 2,200 cached tokens, SmolLM2's 9 heads / 3 KV heads).
constexpr int kBlock = 3;

// Scores of the kChunk buffered keys for NV states' lanes, masked, folded into them (online softmax).
// key_pos[j]: position of buffered key j (+inf past the chunk's real keys); window_last[j]: the last query
// position whose window holds key j (+inf without a window).
template <int D, int NV>
void attend_keys(const float* keys, const float* values, const float* key_pos, const float* window_last, float scale,
                 LaneState<D>* s) {
  constexpr int kDotRun = kDotRunOf<D>;
  alignas(64) Vec score[NV][kChunk];
  for (int j0 = 0; j0 < kChunk; j0 += kScoreKeys) {
    // Dot products in runs of kDotRun dimensions added up afterwards, not one chain of D: at D = 256 one
    // chain's rounding error was 1.7x SDPA's against a float64 reference (mean 1.1e-6 against 6.3e-7).
    for (int d0 = 0; d0 < D; d0 += kDotRun) {
      Vec acc[NV][kScoreKeys];
      for (int v = 0; v < NV; ++v)
        for (int j = 0; j < kScoreKeys; ++j) acc[v][j] = vzero();
      for (int d = d0; d < d0 + kDotRun; ++d) {
        Vec q[NV];
        for (int v = 0; v < NV; ++v) {
          q[v] = vload(s[v].q_t + d * kLanes);
          in_register(q[v]);
        }
        for (int j = 0; j < kScoreKeys; ++j) {
          const Vec k = vset(keys[(j0 + j) * D + d]);
          for (int v = 0; v < NV; ++v) acc[v][j] = vfma(q[v], k, acc[v][j]);
        }
      }
      for (int v = 0; v < NV; ++v)
        for (int j = 0; j < kScoreKeys; ++j)
          score[v][j0 + j] = d0 == 0 ? acc[v][j] : vadd(score[v][j0 + j], acc[v][j]);
    }
  }
  const Vec minus_inf = vset(-std::numeric_limits<float>::infinity());
  Vec correction[NV];
  for (int v = 0; v < NV; ++v) {
    const Vec query_pos = s[v].query_pos;
    Vec chunk_max = minus_inf;
    for (int j = 0; j < kChunk; ++j) {
      Vec x = vwhere_le(vset(key_pos[j]), query_pos, vmul(score[v][j], vset(scale)), minus_inf);
      x = vwhere_le(query_pos, vset(window_last[j]), x, minus_inf);
      score[v][j] = x;
      chunk_max = vmax(chunk_max, x);
    }
    const Vec new_max = vmax(s[v].max, chunk_max);
    // A lane with no key yet (a window that starts past this chunk) keeps -inf as its max; subtracting a
    // finite stand-in keeps its exp's argument -inf instead of NaN.
    const Vec shift = vmax(new_max, vset(-std::numeric_limits<float>::max()));
    correction[v] = vexp(vsub(s[v].max, shift));
    Vec total = vzero();
    for (int j = 0; j < kChunk; ++j) {  // the weights, in place of the scores; a masked one is 0, not exp's ~1e-38
      score[v][j] = vwhere_le(score[v][j], minus_inf, vzero(), vexp(vsub(score[v][j], shift)));
      total = vadd(total, score[v][j]);
    }
    s[v].sum = vfma(s[v].sum, correction[v], total);
    s[v].max = new_max;
  }
  // The chunk's weighted values summed apart, then added to the rescaled output: two levels of sums
  // rather than one chain over the whole context (the same operations).
  for (int d0 = 0; d0 < D; d0 += kDims) {
    Vec acc[NV][kDims];
    for (int v = 0; v < NV; ++v)
      for (int u = 0; u < kDims; ++u) acc[v][u] = vzero();
    for (int j = 0; j < kChunk; ++j) {
      Vec w[NV];
      for (int v = 0; v < NV; ++v) {
        w[v] = score[v][j];
        in_register(w[v]);
      }
      for (int u = 0; u < kDims; ++u) {
        const Vec x = vset(values[j * D + d0 + u]);
        for (int v = 0; v < NV; ++v) acc[v][u] = vfma(w[v], x, acc[v][u]);
      }
    }
    for (int v = 0; v < NV; ++v)
      for (int u = 0; u < kDims; ++u) {
        float* out = s[v].out_t + (d0 + u) * kLanes;
        vstore(out, vfma(vload(out), correction[v], acc[v][u]));
      }
  }
}

// The lane states of one tile: its queries from q [tokens, heads, D] (the row's from `q_row`), transposed.
// Its count x group (query, head) pairs fill lane vectors head by head (lane l: head l / count, query l %
// count), so a full tile has a vector per head and a short one (a chunk's last few queries) only as many as
// its pairs need.
template <int D>
struct TileLanes {
  const Tile* tile;
  int64_t group, pairs;
  std::vector<float> buffer;  // q_t and out_t of each lane vector
  std::vector<LaneState<D>> states;

  TileLanes(const Tile& t, const float* q_row, int64_t heads, int64_t group_, int64_t start_pos)
      : tile(&t), group(group_), pairs(t.count * group_) {
    const int64_t vectors = (pairs + kLanes - 1) / kLanes;
    buffer.assign(2 * vectors * D * kLanes, 0.f);
    states.resize(vectors);
    for (int64_t v = 0; v < vectors; ++v) {
      LaneState<D>& s = states[v];
      s.q_t = buffer.data() + 2 * v * D * kLanes;
      s.out_t = s.q_t + D * kLanes;
      alignas(64) float lane_pos[kLanes];
      for (int i = 0; i < kLanes; ++i) {
        const int64_t l = v * kLanes + i;
        const float* q = q_row + (query_of(l) * heads + head_of(l)) * D;
        for (int d = 0; d < D; ++d) s.q_t[d * kLanes + i] = q[d];
        lane_pos[i] = (float)(start_pos + query_of(l));
      }
      s.query_pos = vload(lane_pos);
      s.max = vset(-std::numeric_limits<float>::infinity());
      s.sum = vzero();
    }
  }
  // The output row of lane l's query and head (lanes past the pairs repeat the last one).
  int64_t query_of(int64_t l) const { return tile->first + std::min(l, pairs - 1) % tile->count; }
  int64_t head_of(int64_t l) const { return tile->kv_head * group + std::min(l, pairs - 1) / tile->count; }

  void attend(const float* keys, const float* values, const float* key_pos, const float* window_last, float scale) {
    const int64_t vectors = (int64_t)states.size();
    for (int64_t v = 0; v < vectors; v += kBlock) {
      LaneState<D>* s = states.data() + v;
      switch (std::min<int64_t>(kBlock, vectors - v)) {
        case 3: attend_keys<D, 3>(keys, values, key_pos, window_last, scale, s); break;
        case 2: attend_keys<D, 2>(keys, values, key_pos, window_last, scale, s); break;
        default: attend_keys<D, 1>(keys, values, key_pos, window_last, scale, s); break;
      }
    }
  }

  void write(float* out_row, int64_t heads) const {
    for (int64_t v = 0; v < (int64_t)states.size(); ++v) {
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
};

// A run of tiles of one row and KV head (consecutive query chunks): each chunk of keys is read from the
// cache once for all of them, not once a tile; a tile whose keys end (causal) or have not begun (window)
// skips the chunk. Reading the keys once a tile cost 20 % of the kernel's time at 2,200 cached tokens.
template <int D>
void attend_tiles(const float* q_row, const float* k_cache, const float* v_cache, const int64_t* table,
                  int64_t block_size, int64_t kv_heads, int64_t group, int64_t start_pos, int64_t window,
                  float scale, const Tile* tiles, int64_t n_tiles, float* out_row) {
  const int64_t heads = kv_heads * group, row = kv_heads * D;  // floats between consecutive cached tokens
  const int64_t kv_head = tiles[0].kv_head;
  std::vector<TileLanes<D>> lanes;
  lanes.reserve(n_tiles);
  int64_t begin = tiles[0].begin, end = tiles[0].end;
  for (int64_t i = 0; i < n_tiles; ++i) {
    lanes.emplace_back(tiles[i], q_row, heads, group, start_pos);
    begin = std::min(begin, tiles[i].begin);
    end = std::max(end, tiles[i].end);
  }
  alignas(64) float keys[kChunk * D], values[kChunk * D];
  const float no_window = std::numeric_limits<float>::infinity();
  float key_pos[kChunk], window_last[kChunk];
  for (int64_t key = begin; key < end; key += kChunk) {
    const int64_t n = std::min<int64_t>(kChunk, end - key);
    for (int64_t j = 0; j < kChunk; ++j) {
      const int64_t pos = key + std::min(j, n - 1);  // past n: a copy, masked by its position
      const int64_t src = (table[pos / block_size] * block_size + pos % block_size) * row + kv_head * D;
      std::memcpy(keys + j * D, k_cache + src, D * sizeof(float));
      std::memcpy(values + j * D, v_cache + src, D * sizeof(float));
      key_pos[j] = j < n ? (float)(key + j) : std::numeric_limits<float>::infinity();
      window_last[j] = window > 0 ? (float)(key + j + window - 1) : no_window;
    }
    for (TileLanes<D>& l : lanes)
      if (key < l.tile->end && key + kChunk > l.tile->begin) l.attend(keys, values, key_pos, window_last, scale);
  }
  for (const TileLanes<D>& l : lanes) l.write(out_row, heads);
}

// Tiles sharing one read of their keys: 32 queries on AVX2, 64 on AVX-512.
constexpr int64_t kTilesPerRun = 4;

template <int D>
void prefill_attention(const float* qp, const float* kp, const float* vp, const int64_t* tp, const int64_t* lp,
                       const int64_t* np, int64_t batch, int64_t heads, int64_t kv_heads, int64_t block_size,
                       int64_t max_blocks, float scale, int64_t window, float* op) {
  const int64_t group = heads / kv_heads;
  std::vector<int64_t> first_query(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) first_query[b + 1] = first_query[b] + np[b];
  std::vector<Tile> tiles;
  std::vector<int64_t> run_start;             // index of each run's first tile; runs share a row and KV head
  std::vector<int64_t> work_before(1, 0);     // keys x lane vectors, to split the runs into parts of equal work
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = lp[b] - np[b];  // position of the row's first new token
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int64_t first = 0; first < np[b]; first += kLanes) {
        if ((first / kLanes) % kTilesPerRun == 0) {
          run_start.push_back((int64_t)tiles.size());
          work_before.push_back(work_before.back());
        }
        const int64_t count = std::min<int64_t>(kLanes, np[b] - first);
        const int64_t begin = window > 0 ? std::max<int64_t>(0, start + first - window + 1) : 0;
        tiles.push_back({b, first, count, h, begin, start + first + count});
        const int64_t vectors = (count * group + kLanes - 1) / kLanes;
        work_before.back() += (start + first + count - begin) * vectors;
      }
    }
  }
  run_start.push_back((int64_t)tiles.size());
  const int64_t threads = at::get_num_threads(), total = work_before.back();
  at::parallel_for(0, threads, 1, [&](int64_t lo, int64_t hi) {
    for (size_t i = 0; i + 1 < run_start.size(); ++i) {
      const int64_t middle = work_before[i] + work_before[i + 1];  // x 2
      if (middle < 2 * total * lo / threads || middle >= 2 * total * hi / threads) continue;
      const Tile& t = tiles[run_start[i]];
      attend_tiles<D>(qp + first_query[t.row] * heads * D, kp, vp, tp + t.row * max_blocks, block_size, kv_heads,
                      group, lp[t.row] - np[t.row], window, scale, &t, run_start[i + 1] - run_start[i],
                      op + first_query[t.row] * heads * D);
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
