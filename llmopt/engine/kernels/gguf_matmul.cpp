// GGUF-quantized weights times int8 activations, each type at its own width: the file's blocks, 16 rows
// interleaved into a panel (llmopt/engine/layers/gguf_panels.py packs them), so that one 64-byte load
// holds the same 4 bytes of 16 rows and every lane of an int32 dot product is one output column. The
// quantized values, sub-scales and super-block scales are the file's own bytes (6-bit K-quant scales
// unpacked to one byte each), so a Q4_K_M model reads about what the file holds per token (0.578 bytes a
// weight for Q4_K, 0.82 for Q6_K), where widening to the generic int4 / int8 panels of
// quantized_matmul.cpp read 0.75 and 1.5.
//
// Per panel and super-block (SB inputs: 256 for K-quants, 32 for the others), in this order:
//   d [16] fp16; dm [16] fp16 (types with a per-block offset); sc [groups][16] (K-quants' sub-scales,
//   u8, or i8 for Q3_K and Q6_K); m [groups][16] u8 (sub-offsets); the value words [words][16] u32 (a
//   row's bytes 4w..4w+3 of its qs, Q8_0's plus 128); the high-bit words [words][16] u32 (qh / hmask;
//   Q5_0 / Q5_1's as 8 masks of 64 bits, see add_fifth_bits).
// A group (16 or 32 inputs, the activation block too) has scale s = d * sc and offset o (dm * m, dm, or
// a constant zero point times s): w = s * q - o, so y = sum_g s d_a sum(q a) - o xs_g, with xs_g the
// group's dequantized activation sum, as quantized_matmul.cpp computes it. Q8_0, stored as q + 128, takes
// y = sum_g s d_a (sum(q a) - 128 sum(a)) instead: its dot products start at -128 times the activation
// block's int8 sum (see zero_point).
// AVX-512 VNNI + BW only: other CPUs get the generic panels (gguf_panels.supported() in Python).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace llmopt_quant {
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_activations_with_block_sums(
    const at::Tensor& x, int64_t group);
}

namespace llmopt_gguf {
namespace {

// ggml's type ids.
enum GgmlType : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

// How each type's activations are quantized: int8 with a scale per block of the type's group, 32 or 16
// inputs. llama.cpp takes one scale per 256 for K-quants (Q8_K), which would let a super-block's groups
// add up in integers; tried for Q6_K, it was no faster here (9.05 against 9.36 ms for the 1.5B's
// fourteen Q6_K ffn_down at one row) and it parted the real Gemma 3 270M's greedy starts from the exact
// arithmetic's on 4 of 10 prompts where blocks of 16 part on 2 (tests/engine/models/test_gemma3_gguf.py).
enum Activations : int { kBlock32 = 0, kBlock16 = 1 };
int activations_of(int64_t type) { return type == Q2_K || type == Q3_K || type == Q6_K ? kBlock16 : kBlock32; }
// The constant a type's values are stored above, where its dot products start at -z times the activation
// block's int8 sum (0: none). Q8_0's bytes are stored plus 128 (gguf_panels.py), vpdpbusd's u8 operand as
// loaded, and the start takes the 128 back exactly: one instruction a row, where moving the sign onto the
// activation took three, and the same bits. Q4_0 / Q5_0 (8, 16), Q3_K (4) and Q6_K (32) could start at
// theirs in place of their offset's multiply-add, but that moves their outputs by fp32 rounding, for
// little: 1.03x at 4 rows and 1.08x at 8 on the 1.5B's Q6_K ffn_down, and the Gemma 3 270M (Q5_0 where
// its widths are not whole super-blocks) then parted from the exact arithmetic on one more greedy start
// of ten (tests/engine/models/test_gemma3_gguf.py).
int32_t zero_point(int64_t type) { return type == Q8_0 ? 128 : 0; }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int kMaxRows = 8;  // rows a tile holds, as quantized_matmul.cpp's AVX-512 tile

// acc += per-lane dot of 4 u8 weights and 4 s8 activations, in place (see quantized_matmul.cpp).
inline __m512i dot_u8s8(__m512i acc, __m512i w, __m512i a) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(a));
  return acc;
}

struct Rows {
  const int8_t* a;     // int8 activations [R, K]
  const float* d;      // their scale per group [R, groups]
  const float* sums;   // their dequantized sum per group [R, groups]
  const int32_t* zero; // -zero_point(type) times their int8 sum per group [R, groups]; null without one
  int64_t K, groups;
};

template <int R>
inline void dot_quad(__m512i (&dot)[R], __m512i w, const Rows& x, int64_t k) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    // The row's 4 activations broadcast by the instruction itself ({1to16}): one load-op, where a
    // separate vpbroadcastd took an instruction of its own for every dot product.
    const int32_t* quad = reinterpret_cast<const int32_t*>(x.a + r * x.K + k);
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(dot[r]) : "v"(w), "m"(*quad));
  }
}

template <int R>
inline void clear(__m512i (&dot)[R]) {
  for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
}

// dot = -z sum(a) for group g: the dot products then add up to sum((q - z) a).
template <int R>
inline void start_at_zero_point(__m512i (&dot)[R], const Rows& x, int64_t g) {
  for (int r = 0; r < R; ++r) dot[r] = _mm512_set1_epi32(x.zero[r * x.groups + g]);
}

// acc += s * d_a * dot - o * xs for group g.
template <int R, bool Offset = true>
inline void add_group(__m512 (&acc)[R], const __m512i (&dot)[R], __m512 s, __m512 o, const Rows& x, int64_t g) {
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(s, _mm512_set1_ps(x.d[r * x.groups + g])), acc[r]);
    if constexpr (Offset) acc[r] = _mm512_fnmadd_ps(o, _mm512_set1_ps(x.sums[r * x.groups + g]), acc[r]);
  }
}

inline __m512 halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 bytes_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 bytes_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512i load(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline __m512i low_nibbles(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline __m512i high_nibbles(__m512i v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
// (v >> shift) & 3 per byte.
inline __m512i crumbs(__m512i v, int shift) {
  return _mm512_and_si512(_mm512_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm512_set1_epi8(0x03));
}
// q + add where the byte's `bit` is set in h.
inline __m512i add_where(__m512i q, __m512i h, uint8_t bit, int8_t add) {
  return _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)bit)), q, _mm512_set1_epi8(add));
}
// q + 16 where the 64-bit mask at p has the byte's bit: Q5_0 / Q5_1's fifth bits, which gguf_panels.py
// spreads into one mask per word and half (spread here, they took 8 of a word's 15 instructions).
inline __m512i add_fifth_bits(__m512i q, const uint8_t* p) {
  uint64_t bits;
  std::memcpy(&bits, p, 8);
  return _mm512_mask_add_epi8(q, _cvtu64_mask64(bits), q, _mm512_set1_epi8(16));
}

// Q4_0, Q4_1, Q5_0, Q5_1: one group of 32 a super-block; word w holds inputs 4w.. (low nibbles) and
// 16 + 4w.. (high nibbles); Q5's fifth bits are 8 masks, the low nibbles' of words 0-3, then the high's.
template <int64_t Type, int R>
const uint8_t* legacy4(const uint8_t* p, int64_t sb, const Rows& x, __m512 (&acc)[R]) {
  constexpr bool kOffset = Type == Q4_1 || Type == Q5_1, kFifth = Type == Q5_0 || Type == Q5_1;
  const __m512 d = halves(p);
  p += 32;
  __m512 o = _mm512_mul_ps(d, _mm512_set1_ps(Type == Q4_0 ? 8.f : 16.f));
  if constexpr (kOffset) o = halves(p), p += 32;
  const uint8_t* words = p;
  p += 4 * 64;
  const uint8_t* fifth = p;
  if constexpr (kFifth) p += 64;
  __m512i dot[R];
  clear(dot);
#pragma GCC unroll 16
  for (int w = 0; w < 4; ++w) {
    const __m512i v = load(words + w * 64);
    __m512i lo = low_nibbles(v), hi = high_nibbles(v);
    if constexpr (kFifth) lo = add_fifth_bits(lo, fifth + 8 * w), hi = add_fifth_bits(hi, fifth + 32 + 8 * w);
    dot_quad(dot, lo, x, sb * 32 + 4 * w);
    dot_quad(dot, hi, x, sb * 32 + 16 + 4 * w);
  }
  add_group(acc, dot, d, o, x, sb);
  return p;
}

// Q8_0: the signed bytes plus 128, its zero point.
template <int R>
const uint8_t* q8_0(const uint8_t* p, int64_t sb, const Rows& x, __m512 (&acc)[R]) {
  const __m512 d = halves(p);
  p += 32;
  __m512i dot[R];
  start_at_zero_point(dot, x, sb);
#pragma GCC unroll 16
  for (int w = 0; w < 8; ++w, p += 64) dot_quad(dot, load(p), x, sb * 32 + 4 * w);
  add_group<R, false>(acc, dot, d, d, x, sb);
  return p;
}

// Q4_K, Q5_K: 8 groups of 32; words 8c..8c+7 hold inputs 64c + 4w.. (low nibbles, group 2c) and
// 64c + 32 + 4w.. (high, group 2c + 1); Q5_K's high-bit word w has bit 2c / 2c + 1 of those inputs.
template <int64_t Type, int R>
const uint8_t* q45_k(const uint8_t* p, int64_t sb, const Rows& x, __m512 (&acc)[R]) {
  const __m512 d = halves(p), dm = halves(p + 32);
  const uint8_t *sc = p + 64, *m = sc + 8 * 16, *words = m + 8 * 16, *qh = words + 32 * 64;
#pragma GCC unroll 16
  for (int c = 0; c < 4; ++c) {
    __m512i lo_dot[R], hi_dot[R];
    clear(lo_dot), clear(hi_dot);
  #pragma GCC unroll 16
    for (int w = 0; w < 8; ++w) {
      const __m512i v = load(words + (8 * c + w) * 64);
      __m512i lo = low_nibbles(v), hi = high_nibbles(v);
      if constexpr (Type == Q5_K) {
        const __m512i h = load(qh + w * 64);
        lo = add_where(lo, h, 1 << (2 * c), 16), hi = add_where(hi, h, 2 << (2 * c), 16);
      }
      dot_quad(lo_dot, lo, x, sb * 256 + 64 * c + 4 * w);
      dot_quad(hi_dot, hi, x, sb * 256 + 64 * c + 32 + 4 * w);
    }
  #pragma GCC unroll 16
    for (int half = 0; half < 2; ++half) {
      const int g = 2 * c + half;
      const __m512 s = _mm512_mul_ps(d, bytes_u8(sc + 16 * g)), o = _mm512_mul_ps(dm, bytes_u8(m + 16 * g));
      add_group(acc, half ? hi_dot : lo_dot, s, o, x, sb * 8 + g);
    }
  }
  return words + 32 * 64 + (Type == Q5_K ? 8 * 64 : 0);
}

// Q6_K: 16 groups of 16, w = d * sc * (q - 32). In half h, ql word w (< 8) holds inputs 128h + 4w..
// (low nibbles, group 8h + w / 4) and 128h + 64 + 4w.. (high, group 8h + 4 + w / 4); word w + 8 the same
// 32 inputs on. qh word 8h + w holds all four's two high bits: crumbs 0 and 2 for word w, 1 and 3 for
// word w + 8, so one load serves both words.
inline __m512i select_low_nibble(__m512i nibbles, __m512i high) {  // (nibbles & 0x0F) | (high & 0xF0)
  return _mm512_ternarylogic_epi32(nibbles, high, _mm512_set1_epi8(0x0F), 0xE4);
}

// One ql word's pair (w, w + 8) decoded: its four quads with their 6-bit values. The pair's words and
// their qh word lie side by side (gguf_panels.q6_k_triples), 192 bytes a (half, word).
struct Q6Quads {
  __m512i lo1, hi1, lo2, hi2;
};
inline Q6Quads q6_quads(const uint8_t* triples, int h, int w) {
  const uint8_t* t = triples + (8 * h + w) * 192;
  const __m512i v1 = load(t), v2 = load(t + 64), bits = load(t + 128), crumbs = _mm512_set1_epi8(0x33);
  const __m512i a = _mm512_and_si512(bits, crumbs), b = _mm512_and_si512(_mm512_srli_epi16(bits, 2), crumbs);
  return {select_low_nibble(v1, _mm512_slli_epi16(a, 4)), select_low_nibble(_mm512_srli_epi16(v1, 4), a),
          select_low_nibble(v2, _mm512_slli_epi16(b, 4)), select_low_nibble(_mm512_srli_epi16(v2, 4), b)};
}

// Groups whose dot products are in flight together: four at up to 4 rows; at 8 rows four groups' 32
// chains are every vector register, and the 8-row tile spilled 381 times a super-block (Q6_K ran at half
// Q4_K's multiply-adds a second, cache-resident); two there still give 16 independent chains.
template <int R>
constexpr int kQ6InFlight = R > 4 ? 2 : 4;

template <int R>
const uint8_t* q6_k(const uint8_t* p, int64_t sb, const Rows& x, __m512 (&acc)[R]) {
  const __m512 d = halves(p);
  const uint8_t *sc = p + 64, *triples = sc + 16 * 16;  // d, 32 bytes of padding, sc
  const int64_t k0 = sb * 256, g0 = sb * 16;
  const int starts[4] = {0, 64, 32, 96};  // of lo1, hi1, lo2, hi2 in a half, beside the word's own 16j + 4i
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      // The four groups of words 4j.. 4j + 3 and their partners, kQ6InFlight at a time: independent dot
      // chains (one group at a time left 3-5 rows latency-bound: the 1.5B's output layer took 13.1 ms at
      // 3 rows against 6.8 at 2; four in flight, 1.3-1.5x one row at 3-4 rows).
      const int groups[4] = {8 * h + j, 8 * h + 4 + j, 8 * h + 2 + j, 8 * h + 6 + j};
#pragma GCC unroll 2
      for (int first = 0; first < 4; first += kQ6InFlight<R>) {
        __m512i dots[kQ6InFlight<R>][R];
        for (auto& dot : dots) clear(dot);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const Q6Quads q = q6_quads(triples, h, 4 * j + i);  // the quads not in flight are never computed
          const __m512i quads[4] = {q.lo1, q.hi1, q.lo2, q.hi2};
          const int64_t k = k0 + 128 * h + 16 * j + 4 * i;
#pragma GCC unroll 4
          for (int t = 0; t < kQ6InFlight<R>; ++t) dot_quad(dots[t], quads[first + t], x, k + starts[first + t]);
        }
#pragma GCC unroll 4
        for (int t = 0; t < kQ6InFlight<R>; ++t) {
          const __m512 s = _mm512_mul_ps(d, bytes_i8(sc + 16 * groups[first + t]));
          add_group(acc, dots[t], s, _mm512_mul_ps(s, _mm512_set1_ps(32.f)), x, g0 + groups[first + t]);
        }
      }
    }
  return triples + 48 * 64;
}

// Q2_K, Q3_K: 16 groups of 16; in half h, words 8h + w hold crumb j of inputs 128h + 32j + 4w..,
// group 8h + 2j + w / 4; Q3_K's hmask word w has the third bit of those inputs as bit 4h + j.
template <int64_t Type, int R>
const uint8_t* q23_k(const uint8_t* p, int64_t sb, const Rows& x, __m512 (&acc)[R]) {
  constexpr bool kThree = Type == Q3_K;
  const __m512 d = halves(p);
  const __m512 dm = kThree ? d : halves(p + 32);
  const uint8_t* sc = p + (kThree ? 32 : 64);
  const uint8_t* m = sc + 16 * 16;  // Q2_K's sub-offsets
  const uint8_t* words = kThree ? sc + 16 * 16 : m + 16 * 16;
  const uint8_t* hmask = words + 16 * 64;
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m512i dot[R];
        clear(dot);
  #pragma GCC unroll 16
        for (int i = 0; i < 4; ++i) {
          const int w = 4 * half + i;
          __m512i q = crumbs(load(words + (8 * h + w) * 64), 2 * j);
          if constexpr (kThree) q = add_where(q, load(hmask + w * 64), 1 << (4 * h + j), 4);
          dot_quad(dot, q, x, sb * 256 + 128 * h + 32 * j + 4 * w);
        }
        const int g = 8 * h + 2 * j + half;
        if constexpr (kThree) {
          const __m512 s = _mm512_mul_ps(d, bytes_i8(sc + 16 * g));
          add_group(acc, dot, s, _mm512_mul_ps(s, _mm512_set1_ps(4.f)), x, sb * 16 + g);
        } else {
          add_group(acc, dot, _mm512_mul_ps(d, bytes_u8(sc + 16 * g)), _mm512_mul_ps(dm, bytes_u8(m + 16 * g)), x,
                    sb * 16 + g);
        }
      }
    }
  }
  return kThree ? hmask + 8 * 64 : words + 16 * 64;
}

// How far ahead of the super-block it reads a tile asks for the panels' bytes into L2. The hardware's
// own prefetcher alone left DRAM reads and the dot products taking turns once a step has a few rows: the
// 1.5B's linears at 5 rows took 44.4 ms, about their read (25.7) plus their arithmetic from L3 (~22),
// and 26.8 ms with this (taking turns in one process: 1.31-1.38x at 3 rows, 1.52-1.56x at 5, 1.50x at
// 8). Measured 4-64 KB ahead: into L1 (T0) every distance was slower; into L2 (T1) 12-24 KB were alike.
constexpr int64_t kPrefetchAhead = 16384;

template <int64_t Type, int R>
void panel_tile(const uint8_t* p, const Rows& x, float* out, int64_t ldo, bool prefetch) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  constexpr int64_t kSuper = Type >= Q2_K ? 256 : 32;
  for (int64_t sb = 0; sb < x.K / kSuper; ++sb) {
    const uint8_t* start = p;
    if constexpr (Type == Q8_0) p = q8_0<R>(p, sb, x, acc);
    else if constexpr (Type == Q4_K || Type == Q5_K) p = q45_k<Type, R>(p, sb, x, acc);
    else if constexpr (Type == Q6_K) p = q6_k<R>(p, sb, x, acc);
    else if constexpr (Type == Q2_K || Type == Q3_K) p = q23_k<Type, R>(p, sb, x, acc);
    else p = legacy4<Type, R>(p, sb, x, acc);
    // Past the thread's last panel it asks for bytes it will not read (another thread's, or none: a
    // prefetch never faults).
    if (prefetch)
      for (const uint8_t* line = start; line < p; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(line) + kPrefetchAhead, _MM_HINT_T1);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}

// Whether a one-row call prefetches too. It depends on the CPU's own prefetcher: on a Zen 4 one row's tile
// read too little between its loads for the hardware to fall behind, and asking anyway ran the 1.5B's
// linears at 0.90-0.94x the speed without; on a Zen 5 the 1.5B's one-row step took 17.7 ms with it
// against 23-28 without.
// Process-wide because it is the machine's property: the engine times its own one-row step both ways at
// warm-up and sets it (gguf_panels.choose_one_row_prefetch).
std::atomic<bool> one_row_prefetch{false};

template <int64_t Type>
void panel_rows(const uint8_t* p, Rows x, int64_t M, float* out, int64_t ldo) {
  for (int64_t m = 0; m < M; m += kMaxRows) {
    // Later tiles of a prefill find the panel in cache.
    const bool prefetch = m == 0 && (M > 1 || one_row_prefetch.load(std::memory_order_relaxed));
    const Rows tile{x.a + m * x.K, x.d + m * x.groups, x.sums + m * x.groups,
                    x.zero == nullptr ? nullptr : x.zero + m * x.groups, x.K, x.groups};
    switch (std::min<int64_t>(kMaxRows, M - m)) {
      case 1: panel_tile<Type, 1>(p, tile, out + m * ldo, ldo, prefetch); break;
      case 2: panel_tile<Type, 2>(p, tile, out + m * ldo, ldo, prefetch); break;
      case 3: panel_tile<Type, 3>(p, tile, out + m * ldo, ldo, prefetch); break;
      case 4: panel_tile<Type, 4>(p, tile, out + m * ldo, ldo, prefetch); break;
      case 5: panel_tile<Type, 5>(p, tile, out + m * ldo, ldo, prefetch); break;
      case 6: panel_tile<Type, 6>(p, tile, out + m * ldo, ldo, prefetch); break;
      case 7: panel_tile<Type, 7>(p, tile, out + m * ldo, ldo, prefetch); break;
      default: panel_tile<Type, 8>(p, tile, out + m * ldo, ldo, prefetch); break;
    }
  }
}

void run_panel(int64_t type, const uint8_t* p, const Rows& x, int64_t M, float* out, int64_t ldo) {
  switch (type) {
    case Q4_0: return panel_rows<Q4_0>(p, x, M, out, ldo);
    case Q4_1: return panel_rows<Q4_1>(p, x, M, out, ldo);
    case Q5_0: return panel_rows<Q5_0>(p, x, M, out, ldo);
    case Q5_1: return panel_rows<Q5_1>(p, x, M, out, ldo);
    case Q8_0: return panel_rows<Q8_0>(p, x, M, out, ldo);
    case Q2_K: return panel_rows<Q2_K>(p, x, M, out, ldo);
    case Q3_K: return panel_rows<Q3_K>(p, x, M, out, ldo);
    case Q4_K: return panel_rows<Q4_K>(p, x, M, out, ldo);
    case Q5_K: return panel_rows<Q5_K>(p, x, M, out, ldo);
    case Q6_K: return panel_rows<Q6_K>(p, x, M, out, ldo);
    default: TORCH_CHECK(false, "gguf_matmul: no kernel for ggml type ", type);
  }
}

// -z times each block sum (a plain loop: as an ATen op it cost 3.4 us a call, most of a small layer's).
std::vector<int32_t> zero_starts(const at::Tensor& block_sums, int32_t z) {
  const int32_t* sums = block_sums.data_ptr<int32_t>();
  std::vector<int32_t> starts(block_sums.numel());
  for (size_t i = 0; i < starts.size(); ++i) starts[i] = -z * sums[i];
  return starts;
}

// Each panel type's activations: quantized once per block size the panels use (32 and 16 in a Q4_K_M
// fused q/k/v), with the type's zero point's starts where it has one. Owns what its Rows point at.
struct TypedActivations {
  static constexpr int kTypes = Q6_K + 1;
  Rows of[kTypes]{};
  at::Tensor kept[2][4];
  std::vector<int32_t> zeros[kTypes];

  void prepare(const at::Tensor& x, const int64_t* idx, int64_t panels) {
    const int64_t K = x.size(1);
    Rows by_kind[2]{};
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t type = idx[2 * p + 1];
      TORCH_CHECK(type >= 0 && type < kTypes, "gguf_matmul: no kernel for ggml type ", type);
      if (of[type].a != nullptr) continue;
      const int kind = activations_of(type);
      if (by_kind[kind].a == nullptr) {
        const int64_t group = kind == kBlock16 ? 16 : 32;
        TORCH_CHECK(K % group == 0, "K a multiple of the type's block of ", group);
        auto [q, d, sums, block_sums] = llmopt_quant::quantize_activations_with_block_sums(x, group);
        kept[kind][0] = q, kept[kind][1] = d, kept[kind][2] = sums, kept[kind][3] = block_sums;
        by_kind[kind] = Rows{q.data_ptr<int8_t>(), d.data_ptr<float>(), sums.data_ptr<float>(), nullptr, K, K / group};
      }
      of[type] = by_kind[kind];
      if (const int32_t z = zero_point(type)) {
        zeros[type] = zero_starts(kept[kind][3], z);
        of[type].zero = zeros[type].data();
      }
    }
  }
};
#endif

}  // namespace

bool supported() {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return true;
#else
  return false;
#endif
}

// x: [M, K] fp32; data: uint8, the panels' bytes; index: [panels, 2] int64, each panel's byte offset in
// data and its ggml type. Returns x @ W^T: [M, panels * 16]. Also called by decode_layers.
at::Tensor gguf_matmul(const at::Tensor& x, const at::Tensor& data, const at::Tensor& index) {
  TORCH_CHECK(supported(), "gguf_matmul needs AVX-512 VNNI and BW");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x: [M, K] fp32");
  TORCH_CHECK(data.scalar_type() == at::kByte && data.is_contiguous(), "data: uint8");
  TORCH_CHECK(index.scalar_type() == at::kLong && index.dim() == 2 && index.size(1) == 2 && index.is_contiguous(),
              "index: [panels, 2] int64");
  const int64_t M = x.size(0), K = x.size(1), panels = index.size(0), N = panels * 16;
  TORCH_CHECK(K % 256 == 0 || K % 32 == 0, "K a multiple of 32");
  auto out = at::empty({M, N}, x.options());
  if (M == 0 || panels == 0) return out;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const int64_t* idx = index.data_ptr<int64_t>();
  TypedActivations activations;
  activations.prepare(x.contiguous(), idx, panels);
  const uint8_t* base = data.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t type = idx[2 * p + 1];
      run_panel(type, base + idx[2 * p], activations.of[type], M, op + p * 16, N);
    }
  });
#endif
  return out;
}

}  // namespace llmopt_gguf

TORCH_LIBRARY_FRAGMENT(llmopt, m) {
  m.def("gguf_matmul", &llmopt_gguf::gguf_matmul);
  m.def("gguf_matmul_supported", []() { return llmopt_gguf::supported(); });
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  m.def("gguf_set_one_row_prefetch", [](bool on) { llmopt_gguf::one_row_prefetch.store(on); });
  m.def("gguf_one_row_prefetch", []() { return llmopt_gguf::one_row_prefetch.load(); });
#endif
}
