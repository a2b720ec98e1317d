// Integer score kernels (numerics in int_score.h): a query quantiser and an integer dot per path,
// chosen by CPU features at run time rather than per Highway target — the sums are exact, so the
// path changes no bit. x86 paths are intrinsics in functions with their own target attributes
// (the EVEX avx512vnni, never the VEX avxvnni: see weights/quant_rows-inl.h).
#include "formats/int_score.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "base/float_codes.h"
#include "formats/codec_helpers.h"

namespace kvq::int_score {
namespace {

constexpr int32_t kMaxGroup = 8;  // query heads scored together
constexpr float kTiny = 0x1p-64f;  // amax below this: the head quantises to zeros (int_score.h)

// Quantised query heads, PreparedHeadBytes(hd) bytes each (64-byte aligned), laid out as the
// path's dot reads them: [qq: hd int8, padded to a multiple of 64][d: f32][sum: int32][padding].
// qq is in natural element order for int8 and the portable path; for int4 on x86, per chunk of
// 2W elements (W = the kernel's code bytes per chunk: ChunkBytes) the W even elements then the W
// odd ones, matching the low and high nibbles of W code bytes. d = amax / 127 (or 0, or NaN); sum = Σ qq, the offset-binary
// codes' bias term.
int64_t QqBytes(int32_t hd) { return (int64_t{hd} + 63) / 64 * 64; }

// G consecutive prepared heads, starting at `first`.
struct Group {
  const uint8_t* first;
  int64_t stride;  // PreparedHeadBytes(hd)
  int64_t qq_bytes;
  const int8_t* qq(int h) const { return reinterpret_cast<const int8_t*>(first + h * stride); }
  float d(int h) const {
    float v;
    std::memcpy(&v, first + h * stride + qq_bytes, 4);
    return v;
  }
  int32_t sum(int h) const {
    int32_t v;
    std::memcpy(&v, first + h * stride + qq_bytes + 4, 4);
    return v;
  }
};

struct HeadScale {
  float d, inv;
  bool zero;  // the head quantises to zeros
};
inline HeadScale ScaleFor(float amax, bool finite) {
  if (!finite) return {std::numeric_limits<float>::quiet_NaN(), 0.0f, true};
  if (!(amax >= kTiny)) return {0.0f, 0.0f, true};
  return {amax / 127.0f, 127.0f / amax, false};
}

struct RowRef {
  const uint8_t* codes;
  float s;  // the head row's f16 scale
};
inline RowRef RowAt(const RowTile& t, int32_t i, int32_t kv_head, int32_t code_bytes) {
  const uint8_t* p = t.block + int64_t{i} * t.stride_bytes + int64_t{kv_head} * (2 + code_bytes);
  return {p + 2, F16ToF32(format_internal::LoadU16(p))};
}

// ---- Portable path: plain integer loops in element order.

template <int kBits>
void ScoreGroupPortable(const Group& g, int32_t n, const RowTile& t, int32_t kv_head, int32_t hd,
                        float* scores) {
  constexpr int32_t kBias = 1 << (kBits - 1);
  for (int32_t i = 0; i < t.n_rows; ++i) {
    const RowRef row = RowAt(t, i, kv_head, hd * kBits / 8);
    for (int32_t h = 0; h < n; ++h) {
      int32_t dot = 0;
      for (int32_t j = 0; j < hd; ++j) {
        dot += (static_cast<int32_t>(format_internal::UnpackCode(row.codes, j, kBits)) - kBias) * g.qq(h)[j];
      }
      scores[h * kMaxTileRows + i] = (row.s * g.d(h)) * static_cast<float>(dot);
    }
  }
}

#if defined(__x86_64__)
#define KVQ_INT_SCORE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVQ_INT_SCORE_VNNI \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,no-avxvnni")))

// One head, step 1 on 8-lane vectors, codes in natural order (hd a multiple of 32). The same
// operations as QuantizeHeadReference (max is exact; IEEE divide, multiply and RNE conversion).
KVQ_INT_SCORE_AVX2 void QuantizeHeadAvx2(const float* x, int32_t hd, int8_t* qq, float* d, int32_t* sum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  __m256 m = _mm256_setzero_ps();
  __m256i bad = _mm256_setzero_si256();  // lanes that saw an inf or NaN
  for (int32_t j = 0; j < hd; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(v), exp_mask);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exp_mask));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0.0f;
  for (float l : lanes) amax = std::max(amax, l);
  const HeadScale hs = ScaleFor(amax, _mm256_testz_si256(bad, bad) != 0);
  *d = hs.d;
  if (hs.zero) {
    std::memset(qq, 0, hd);
    *sum = 0;
    return;
  }
  const __m256 inv = _mm256_set1_ps(hs.inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i sums = _mm256_setzero_si256();
  for (int32_t j = 0; j < hd; j += 32) {
    __m256i k[4];
    for (int v = 0; v < 4; ++v) {
      const __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * v), inv), lo), hi);
      k[v] = _mm256_cvtps_epi32(t);  // MXCSR's round-to-nearest-even, as std::nearbyint
      sums = _mm256_add_epi32(sums, k[v]);
    }
    // packs works per 128-bit lane: dwords come out as k0.lo k1.lo k2.lo k3.lo k0.hi ...; the
    // permute restores element order. Values are in ±127, so nothing saturates.
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(k[0], k[1]), _mm256_packs_epi32(k[2], k[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qq + j),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  alignas(32) int32_t s8[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s8), sums);
  int32_t total = 0;
  for (int32_t v : s8) total += v;
  *sum = total;
}

// Natural-order codes [hd] -> the int4 layout for vectors of W bytes (see Group). Each 64
// natural bytes split into 32 even and 32 odd; for W = 64 two such halves sit side by side.
KVQ_INT_SCORE_AVX2 void SplitNibblePlanesAvx2(const int8_t* nat, int32_t hd, int32_t w, int8_t* out) {
  const __m256i low_byte = _mm256_set1_epi16(0x00FF);
  for (int32_t c = 0; c < hd; c += 2 * w) {
    for (int32_t k = 0; k < w / 32; ++k) {
      const __m256i n0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nat + c + 64 * k));
      const __m256i n1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nat + c + 64 * k + 32));
      const __m256i even = _mm256_packus_epi16(_mm256_and_si256(n0, low_byte), _mm256_and_si256(n1, low_byte));
      const __m256i odd = _mm256_packus_epi16(_mm256_srli_epi16(n0, 8), _mm256_srli_epi16(n1, 8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c + 32 * k), _mm256_permute4x64_epi64(even, 0xD8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c + w + 32 * k), _mm256_permute4x64_epi64(odd, 0xD8));
    }
  }
}

// out lane L = Σ lanes of u[L] for 8 vectors: a 128-bit swap-and-add, then two hadds; the hadd
// tree leaves lane L holding input j = [0,2,4,6,1,3,5,7][L], so inputs are fed in that order.
KVQ_INT_SCORE_AVX2 inline __m256i Reduce8(const __m256i* u) {
  __m256i v[8];
  for (int j = 0; j < 8; ++j) v[j] = u[(j % 2) * 4 + j / 2];
  __m256i t[4];
  for (int p = 0; p < 4; ++p) {
    t[p] = _mm256_add_epi32(_mm256_permute2x128_si256(v[2 * p], v[2 * p + 1], 0x20),
                            _mm256_permute2x128_si256(v[2 * p], v[2 * p + 1], 0x31));
  }
  return _mm256_hadd_epi32(_mm256_hadd_epi32(t[0], t[1]), _mm256_hadd_epi32(t[2], t[3]));
}

// G heads against the tile's rows, R = 8/G rows at a time so that the G·R (row, head) sums are
// reduced together: lane L = h·R + r. int8: sign trick (maddubs(|c|, sign(q, c)), pairs ≤ 32512
// so nothing saturates); int4: maddubs(nibble, q) (pairs ≤ 3810), bias −8·Σq added once.
template <int kBits, int G>
KVQ_INT_SCORE_AVX2 void ScoreGroupAvx2(const Group& g, const RowTile& t, int32_t kv_head, int32_t hd,
                                       float* scores) {
  constexpr int R = 8 / G;
  constexpr int32_t kBias = 1 << (kBits - 1);
  const int32_t code_bytes = hd * kBits / 8;
  const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F), flip = _mm256_set1_epi8(-128);
  __m256i init[G];
  alignas(32) float dl[8];  // [lane] d of the lane's head
  for (int h = 0; h < G; ++h) {
    init[h] = kBits == 8 ? _mm256_setzero_si256() : _mm256_setr_epi32(-kBias * g.sum(h), 0, 0, 0, 0, 0, 0, 0);
    for (int r = 0; r < R; ++r) dl[h * R + r] = g.d(h);
  }
  const __m256 dv = _mm256_load_ps(dl);
  for (int32_t i0 = 0; i0 < t.n_rows; i0 += R) {
    const int nr = std::min<int32_t>(R, t.n_rows - i0);
    __m256i acc[8];
    alignas(32) float sl[8];  // [lane] s of the lane's row
    for (int r = 0; r < R; ++r) {
      if (r >= nr) {
        for (int h = 0; h < G; ++h) acc[h * R + r] = _mm256_setzero_si256(), sl[h * R + r] = 0.0f;
        continue;
      }
      const RowRef row = RowAt(t, i0 + r, kv_head, code_bytes);
      for (int h = 0; h < G; ++h) acc[h * R + r] = init[h], sl[h * R + r] = row.s;
      for (int32_t c = 0; c < code_bytes; c += 32) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.codes + c));
        if constexpr (kBits == 8) {
          const __m256i centred = _mm256_xor_si256(x, flip);  // raw − 128 as a signed byte
          const __m256i mag = _mm256_abs_epi8(centred);
          for (int h = 0; h < G; ++h) {
            const __m256i qv = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.qq(h) + c));
            const __m256i p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(qv, centred));
            acc[h * R + r] = _mm256_add_epi32(acc[h * R + r], _mm256_madd_epi16(p, ones));
          }
        } else {
          static_assert(kBits == 4);
          const __m256i lo = _mm256_and_si256(x, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
          for (int h = 0; h < G; ++h) {
            const int8_t* qc = g.qq(h) + 2 * c;
            const __m256i p = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(qc))),
                _mm256_maddubs_epi16(hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(qc + 32))));
            acc[h * R + r] = _mm256_add_epi32(acc[h * R + r], _mm256_madd_epi16(p, ones));
          }
        }
      }
    }
    const __m256 dot = _mm256_cvtepi32_ps(Reduce8(acc));  // exact: |I| < 2^24
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(sl), dv), dot));
    for (int h = 0; h < G; ++h) {
      for (int r = 0; r < nr; ++r) scores[h * kMaxTileRows + i0 + r] = out[h * R + r];
    }
  }
}

// GCC 12's AVX-512 intrinsics start their masked builtins from a self-initialised "undefined"
// vector, which -Wmaybe-uninitialized reports at every use; nothing here reads one.
#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no -Wmaybe-uninitialized (and warns of an unknown group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"

// out lane L = Σ lanes of u[L] for 16 vectors: 256-bit, 128-bit, 64-bit and 32-bit halving
// rounds; the tree leaves lane 4k + m holding input k + 4m, so inputs are fed in that order.
KVQ_INT_SCORE_VNNI inline __m512i Reduce16(const __m512i* u) {
  __m512i v[16];
  for (int j = 0; j < 16; ++j) v[j] = u[4 * (j % 4) + j / 4];
  __m512i t[8], w[4], x[2];
  for (int p = 0; p < 8; ++p) {
    t[p] = _mm512_add_epi32(_mm512_shuffle_i64x2(v[2 * p], v[2 * p + 1], 0x44),
                            _mm512_shuffle_i64x2(v[2 * p], v[2 * p + 1], 0xEE));
  }
  for (int p = 0; p < 4; ++p) {
    w[p] = _mm512_add_epi32(_mm512_shuffle_i64x2(t[2 * p], t[2 * p + 1], 0x88),
                            _mm512_shuffle_i64x2(t[2 * p], t[2 * p + 1], 0xDD));
  }
  for (int p = 0; p < 2; ++p) {
    x[p] = _mm512_add_epi32(_mm512_unpacklo_epi64(w[2 * p], w[2 * p + 1]),
                            _mm512_unpackhi_epi64(w[2 * p], w[2 * p + 1]));
  }
  const __m512 a = _mm512_castsi512_ps(x[0]), b = _mm512_castsi512_ps(x[1]);
  return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                          _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xDD)));
}

// One head, step 1 on 16-lane vectors, codes in natural order (hd a multiple of 32). amax is
// an integer max over the magnitudes' bit patterns (the same order as the floats'; inf and NaN
// are the patterns ≥ 0x7F800000, so one max also finds them). No clamp: |q_i·inv| ≤
// fl(amax·inv) ≤ 127·(1 + u)² rounds to at most 127, so the reference's clamp never binds
// (and vpmovsdb saturates anyway).
KVQ_INT_SCORE_VNNI void QuantizeHead512(const float* x, int32_t hd, int8_t* qq, float* d, int32_t* sum) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = _mm512_setzero_si512();
  for (int32_t j = 0; j < hd; j += 32) {
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + j), abs_mask));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + j + 16), abs_mask));
  }
  const uint32_t amax_bits = _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  const HeadScale hs = ScaleFor(amax, amax_bits < 0x7F800000u);
  *d = hs.d;
  if (hs.zero) {
    std::memset(qq, 0, hd);
    *sum = 0;
    return;
  }
  const __m512 inv = _mm512_set1_ps(hs.inv);
  __m512i sums = _mm512_setzero_si512();
  for (int32_t j = 0; j < hd; j += 16) {
    const __m512i k = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j), inv));  // RNE (MXCSR)
    sums = _mm512_add_epi32(sums, k);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qq + j), _mm512_cvtsepi32_epi8(k));
  }
  *sum = _mm512_reduce_add_epi32(sums);
}

// As ScoreGroupAvx2 with 64-byte vectors and vpdpbusd (u8 raw codes × s8 query, straight to
// int32 lanes), R = 16/G rows at a time, chunk-outer so each query chunk is loaded once per
// batch. The codes are offset-binary, so vpdpbusd reads them as stored and the bias
// −2^(b−1)·Σq is the accumulator's starting value. Rows past the tile's end repeat its first
// row (valid memory) and are not stored: every lane does the same work whatever n_rows is.
// kHalfChunks (int4 rows of whole 32-byte chunks but not 64-byte ones, e.g. head_dim 64): each
// 32-byte chunk is broadcast to both halves of a vector and its high half shifted right by 4, so
// one vector holds the chunk's 32 low nibbles then its 32 high ones — the order of the query's
// 64 elements in the W = 32 layout (Group) — and one 64-byte vpdpbusd per row and head serves
// the chunk, where the 256-bit kernel (ScoreGroupVnni256) took two, and 16 lanes are reduced at
// once. The integer sums are the same, so the bits are too.
template <int kBits, int G, bool kHalfChunks = false>
KVQ_INT_SCORE_VNNI void ScoreGroupVnni(const Group& g, const RowTile& t, int32_t kv_head, int32_t hd,
                                       float* scores) {
  static_assert(!kHalfChunks || kBits == 4);
  constexpr int32_t kChunk = kHalfChunks ? 32 : 64;  // code bytes per vector
  constexpr int R = 16 / G;
  constexpr int32_t kBias = 1 << (kBits - 1);
  const int32_t code_bytes = hd * kBits / 8;
  const int64_t head_offset = int64_t{kv_head} * (2 + code_bytes);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512i init[G];
  alignas(64) float dl[16];    // [lane] d of the lane's head
  alignas(64) int32_t rl[16];  // [lane] the lane's row within the batch
  for (int h = 0; h < G; ++h) {
    init[h] = _mm512_maskz_set1_epi32(1, -kBias * g.sum(h));
    for (int r = 0; r < R; ++r) dl[h * R + r] = g.d(h), rl[h * R + r] = r;
  }
  const __m512 dv = _mm512_load_ps(dl);
  const __m512i row_of_lane = _mm512_load_si512(rl);
  for (int32_t i0 = 0; i0 < t.n_rows; i0 += R) {
    const int nr = std::min<int32_t>(R, t.n_rows - i0);
    const uint8_t* rows[R];
    alignas(32) uint16_t half[16] = {};  // [row] f16 scale
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      rows[r] = t.block + int64_t{i0 + (r < nr ? r : 0)} * t.stride_bytes + head_offset;
      std::memcpy(&half[r], rows[r], 2);
    }
    __m512i acc[G * R];
#pragma GCC unroll 16
    for (int k = 0; k < G * R; ++k) acc[k] = init[k / R];
    for (int32_t c = 0; c < code_bytes; c += kChunk) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        if constexpr (kHalfChunks) {
          // Words 0-15 shifted by 0, words 16-31 by 4: the low nibbles, then the high ones.
          constexpr int64_t kFour = 0x0004000400040004;  // four 16-bit shifts of 4
          const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, kFour, kFour, kFour, kFour);
          const __m512i both = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + 2 + c)));
          const __m512i x = _mm512_and_si512(_mm512_srlv_epi16(both, shift), nibble);
#pragma GCC unroll 8
          for (int h = 0; h < G; ++h) {
            acc[h * R + r] =
                _mm512_dpbusd_epi32(acc[h * R + r], x, _mm512_load_si512(g.qq(h) + 2 * c));
          }
          continue;
        }
        const __m512i x = _mm512_loadu_si512(rows[r] + 2 + c);
        if constexpr (kBits == 8) {
#pragma GCC unroll 8
          for (int h = 0; h < G; ++h) {
            acc[h * R + r] = _mm512_dpbusd_epi32(acc[h * R + r], x, _mm512_load_si512(g.qq(h) + c));
          }
        } else {
          static_assert(kBits == 4);
          const __m512i lo = _mm512_and_si512(x, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), nibble);
#pragma GCC unroll 8
          for (int h = 0; h < G; ++h) {
            const int8_t* qc = g.qq(h) + 2 * c;
            acc[h * R + r] = _mm512_dpbusd_epi32(acc[h * R + r], lo, _mm512_load_si512(qc));
            acc[h * R + r] = _mm512_dpbusd_epi32(acc[h * R + r], hi, _mm512_load_si512(qc + 64));
          }
        }
      }
    }
    const __m512 dot = _mm512_cvtepi32_ps(Reduce16(acc));  // exact: |I| < 2^24
    // Exact f16 -> f32 (F16C), the same values as F16ToF32.
    const __m512 s = _mm512_permutexvar_ps(row_of_lane, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(half))));
    const __m512 out = _mm512_mul_ps(_mm512_mul_ps(s, dv), dot);
    // Head h's lanes h·R .. h·R + nr − 1 go to scores[h][i0 ..]: a masked store from an address
    // h·R lanes early (masked lanes are neither read nor written).
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      const __mmask16 mask = static_cast<__mmask16>(((1u << nr) - 1u) << (h * R));
      _mm512_mask_storeu_ps(scores + h * (kMaxTileRows - R) + i0, mask, out);
    }
  }
}

// ScoreGroupAvx2's layout and row batches (R = 8/G rows, 32-byte code chunks) with 256-bit
// vpdpbusd: for int8 rows whose codes are a multiple of 32 bytes but not of 64 (head_dim 32, 96,
// ...), which ScoreGroupVnni's 64-byte chunks do not divide (int4 rows of that kind take its half
// chunks). As there, the raw offset-binary codes are multiplied as stored and the bias
// −2^(b−1)·Σq is the starting value, so int8 needs no sign trick; one instruction replaces
// maddubs, madd and add.
template <int kBits, int G>
KVQ_INT_SCORE_VNNI void ScoreGroupVnni256(const Group& g, const RowTile& t, int32_t kv_head, int32_t hd,
                                          float* scores) {
  constexpr int R = 8 / G;
  constexpr int32_t kBias = 1 << (kBits - 1);
  const int32_t code_bytes = hd * kBits / 8;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256i init[G];
  alignas(32) float dl[8];  // [lane] d of the lane's head
  for (int h = 0; h < G; ++h) {
    init[h] = _mm256_setr_epi32(-kBias * g.sum(h), 0, 0, 0, 0, 0, 0, 0);
    for (int r = 0; r < R; ++r) dl[h * R + r] = g.d(h);
  }
  const __m256 dv = _mm256_load_ps(dl);
  for (int32_t i0 = 0; i0 < t.n_rows; i0 += R) {
    const int nr = std::min<int32_t>(R, t.n_rows - i0);
    __m256i acc[8];
    alignas(32) float sl[8];  // [lane] s of the lane's row
    for (int r = 0; r < R; ++r) {
      if (r >= nr) {
        for (int h = 0; h < G; ++h) acc[h * R + r] = _mm256_setzero_si256(), sl[h * R + r] = 0.0f;
        continue;
      }
      const RowRef row = RowAt(t, i0 + r, kv_head, code_bytes);
      for (int h = 0; h < G; ++h) acc[h * R + r] = init[h], sl[h * R + r] = row.s;
      for (int32_t c = 0; c < code_bytes; c += 32) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.codes + c));
        if constexpr (kBits == 8) {
          for (int h = 0; h < G; ++h) {
            const __m256i qv = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.qq(h) + c));
            acc[h * R + r] = _mm256_dpbusd_epi32(acc[h * R + r], x, qv);
          }
        } else {
          static_assert(kBits == 4);
          const __m256i lo = _mm256_and_si256(x, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
          for (int h = 0; h < G; ++h) {
            const int8_t* qc = g.qq(h) + 2 * c;
            acc[h * R + r] = _mm256_dpbusd_epi32(acc[h * R + r], lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(qc)));
            acc[h * R + r] = _mm256_dpbusd_epi32(acc[h * R + r], hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(qc + 32)));
          }
        }
      }
    }
    const __m256 dot = _mm256_cvtepi32_ps(Reduce8(acc));  // exact: |I| < 2^24
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(sl), dv), dot));
    for (int h = 0; h < G; ++h) {
      for (int r = 0; r < nr; ++r) scores[h * kMaxTileRows + i0 + r] = out[h * R + r];
    }
  }
}
#pragma GCC diagnostic pop
#endif  // __x86_64__

// A path whose vectors do not divide the head row's codes hands over to a narrower one (the
// same bits: the integer sums are exact). The VNNI path takes rows of whole 32-byte chunks
// (64-byte ones through ScoreGroupVnni, the others through ScoreGroupVnni256).
Path PathFor(Path path, int32_t hd, int32_t bits) {
  const int32_t code_bytes = hd * bits / 8;
  if (path != Path::kPortable && code_bytes % 32 != 0) path = Path::kPortable;
  return path;
}

#if defined(__x86_64__)
// The code bytes per chunk the path's kernel reads: 64 for VNNI rows of whole 64-byte chunks, else
// 32 (the int4 query layout's W, see Group).
int32_t ChunkBytes(Path path, int32_t hd, int32_t bits) {
  return path == Path::kAvx512Vnni && hd * bits / 8 % 64 == 0 ? 64 : 32;
}
#endif

// Heads q [n][hd] -> prepared [n][PreparedHeadBytes(hd)] in `path`'s layout (Group). Each head
// is quantised on its own, so its bytes do not depend on the heads around it.
template <int kBits>
void PrepareHeads(Path path, const float* q, int32_t n, int32_t hd, uint8_t* prepared) {
  const int64_t stride = PreparedHeadBytes(hd), qq_bytes = QqBytes(hd);
  for (int32_t h = 0; h < n; ++h) {
    const float* x = q + int64_t{h} * hd;
    uint8_t* head = prepared + h * stride;
    int8_t* qq = reinterpret_cast<int8_t*>(head);
    float d;
    int32_t sum;
#if defined(__x86_64__)
    if (path != Path::kPortable) {
      // The 16-lane quantiser where the path has it and the row is whole 64-element chunks
      // (always for the VNNI path, whose rows are whole 64-byte code chunks).
      const auto quantize = path == Path::kAvx512Vnni ? &QuantizeHead512 : &QuantizeHeadAvx2;
      if constexpr (kBits == 8) {
        quantize(x, hd, qq, &d, &sum);
      } else {
        alignas(64) int8_t natural[kMaxHeadDim];  // [hd]
        quantize(x, hd, natural, &d, &sum);
        SplitNibblePlanesAvx2(natural, hd, ChunkBytes(path, hd, kBits), qq);
      }
    } else {
      QuantizeHeadReference(x, hd, qq, &d, &sum);
    }
#else
    static_cast<void>(path);  // only the portable path off x86-64
    QuantizeHeadReference(x, hd, qq, &d, &sum);
#endif
    std::memcpy(head + qq_bytes, &d, 4);
    std::memcpy(head + qq_bytes + 4, &sum, 4);
  }
}

template <int kBits, int G>
void ScoreGroup(Path path, const Group& g, const RowTile& t, int32_t kv_head, int32_t hd, float* scores) {
#if defined(__x86_64__)
  if (path == Path::kAvx512Vnni) {
    if (ChunkBytes(path, hd, kBits) == 64) return ScoreGroupVnni<kBits, G>(g, t, kv_head, hd, scores);
    if constexpr (kBits == 4) return ScoreGroupVnni<4, G, true>(g, t, kv_head, hd, scores);
    return ScoreGroupVnni256<kBits, G>(g, t, kv_head, hd, scores);
  }
  if (path == Path::kAvx2) return ScoreGroupAvx2<kBits, G>(g, t, kv_head, hd, scores);
#else
  static_cast<void>(path);  // only the portable path off x86-64
#endif
  ScoreGroupPortable<kBits>(g, G, t, kv_head, hd, scores);
}

// n_q prepared heads against the tile, in groups of 8, then 4, 2, 1.
template <int kBits>
void ScorePreparedHeads(Path path, const uint8_t* prepared, int32_t n_q, const RowTile& t, int32_t kv_head,
                        int32_t hd, float* scores) {
  const int64_t stride = PreparedHeadBytes(hd);
  for (int32_t h = 0; h < n_q;) {
    const int32_t left = n_q - h;
    const int32_t n = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const Group g{prepared + h * stride, stride, QqBytes(hd)};
    float* out = scores + h * kMaxTileRows;
    switch (n) {
      case 8: ScoreGroup<kBits, 8>(path, g, t, kv_head, hd, out); break;
      case 4: ScoreGroup<kBits, 4>(path, g, t, kv_head, hd, out); break;
      case 2: ScoreGroup<kBits, 2>(path, g, t, kv_head, hd, out); break;
      default: ScoreGroup<kBits, 1>(path, g, t, kv_head, hd, out); break;
    }
    h += n;
  }
}

// The unprepared score: up to kMaxGroup heads at a time prepared on the stack, then scored.
template <int kBits>
void ScoreAll(Path path, const float* q, int32_t n_q, const RowTile& t, int32_t kv_head,
              const CodecArgs& a, float* scores) {
  const int32_t hd = a.shape.head_dim;
  path = PathFor(path, hd, kBits);
  alignas(64) uint8_t prepared[kMaxGroup * (kMaxHeadDim + 64)];  // [≤ kMaxGroup][PreparedHeadBytes(hd)]
  for (int32_t h = 0; h < n_q; h += kMaxGroup) {
    const int32_t n = std::min(kMaxGroup, n_q - h);
    PrepareHeads<kBits>(path, q + int64_t{h} * hd, n, hd, prepared);
    ScorePreparedHeads<kBits>(path, prepared, n, t, kv_head, hd, scores + h * kMaxTileRows);
  }
}
}  // namespace

#if defined(__x86_64__)
// CPUID leaf 1, ECX bit 29 (what GCC's __builtin_cpu_supports("f16c") reads; clang 14's builtin
// does not know "f16c").
static bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

bool Supported(Path path) {
  switch (path) {
    case Path::kPortable: return true;
#if defined(__x86_64__)
    case Path::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    case Path::kAvx512Vnni:
      return Supported(Path::kAvx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
    default: return false;
  }
}

Path Best() {
  static const Path kBest = Supported(Path::kAvx512Vnni) ? Path::kAvx512Vnni
                            : Supported(Path::kAvx2)     ? Path::kAvx2
                                                         : Path::kPortable;
  return kBest;
}

const char* PathName(Path path) {
  switch (path) {
    case Path::kPortable: return "portable";
    case Path::kAvx2: return "AVX2 maddubs";
    case Path::kAvx512Vnni: return "AVX-512 VNNI";
  }
  return "?";
}

void QuantizeHeadReference(const float* q, int32_t head_dim, int8_t* qq, float* d, int32_t* sum) {
  float amax = 0.0f;
  bool finite = true;
  for (int32_t i = 0; i < head_dim; ++i) {
    finite = finite && std::isfinite(q[i]);
    amax = std::max(amax, std::fabs(q[i]));
  }
  const HeadScale hs = ScaleFor(amax, finite);
  *d = hs.d;
  int32_t total = 0;
  for (int32_t i = 0; i < head_dim; ++i) {
    qq[i] = hs.zero ? 0 : static_cast<int8_t>(std::nearbyint(std::clamp(q[i] * hs.inv, -127.0f, 127.0f)));
    total += qq[i];
  }
  *sum = total;
}

void IntTokenScore(Path path, int32_t bits, const float* q, int32_t n_q, const RowTile& tile,
                   int32_t kv_head, const CodecArgs& args, float* scores) {
  if (bits == 8) {
    ScoreAll<8>(path, q, n_q, tile, kv_head, args, scores);
  } else {
    ScoreAll<4>(path, q, n_q, tile, kv_head, args, scores);
  }
}

void Int8TokenScore(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
                    const CodecArgs& args, float* scores) {
  ScoreAll<8>(Best(), q, n_q, tile, kv_head, args, scores);
}
void Int4TokenScore(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
                    const CodecArgs& args, float* scores) {
  ScoreAll<4>(Best(), q, n_q, tile, kv_head, args, scores);
}

int64_t PreparedHeadBytes(int32_t head_dim) { return QqBytes(head_dim) + 64; }

void PrepareQuery(Path path, int32_t bits, const float* q, int32_t n_q, const CodecArgs& args,
                  uint8_t* prepared) {
  const int32_t hd = args.shape.head_dim;
  if (bits == 8) {
    PrepareHeads<8>(PathFor(path, hd, 8), q, n_q, hd, prepared);
  } else {
    PrepareHeads<4>(PathFor(path, hd, 4), q, n_q, hd, prepared);
  }
}

void ScorePrepared(Path path, int32_t bits, const uint8_t* prepared, int32_t n_q, const RowTile& tile,
                   int32_t kv_head, const CodecArgs& args, float* scores) {
  const int32_t hd = args.shape.head_dim;
  if (bits == 8) {
    ScorePreparedHeads<8>(PathFor(path, hd, 8), prepared, n_q, tile, kv_head, hd, scores);
  } else {
    ScorePreparedHeads<4>(PathFor(path, hd, 4), prepared, n_q, tile, kv_head, hd, scores);
  }
}

int64_t PreparedQueryHeadBytes(const CodecArgs& args) { return PreparedHeadBytes(args.shape.head_dim); }
void Int8PrepareQuery(const float* q, int32_t n_q, const CodecArgs& args, uint8_t* prepared) {
  PrepareQuery(Best(), 8, q, n_q, args, prepared);
}
void Int4PrepareQuery(const float* q, int32_t n_q, const CodecArgs& args, uint8_t* prepared) {
  PrepareQuery(Best(), 4, q, n_q, args, prepared);
}
void Int8ScorePrepared(const uint8_t* prepared, int32_t n_q, const RowTile& tile, int32_t kv_head,
                       const CodecArgs& args, float* scores) {
  ScorePrepared(Best(), 8, prepared, n_q, tile, kv_head, args, scores);
}
void Int4ScorePrepared(const uint8_t* prepared, int32_t n_q, const RowTile& tile, int32_t kv_head,
                       const CodecArgs& args, float* scores) {
  ScorePrepared(Best(), 4, prepared, n_q, tile, kv_head, args, scores);
}

}  // namespace kvq::int_score
