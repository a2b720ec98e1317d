// Peak compute rates (see roofline.h). Each kernel runs kChains independent accumulator chains
// (an FMA or a VNNI dot has a latency of 4-5 cycles and two ports on the cores kvq targets, so
// 12 chains keep both ports busy), a fixed number of iterations per call, on every thread of the
// pool at once; the rate is total multiply-adds over wall time. The inputs are loop-carried, so
// the compiler can neither hoist nor drop the work. x86 kernels are compiled for their ISA with
// target attributes and run only where the CPU reports it (__builtin_cpu_supports).
#include "measure/roofline.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "base/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvq {
namespace {

constexpr int kChains = 12;
constexpr int64_t kIters = 1 << 18;  // per call: 12·2^18 instructions, a few ms per thread

// Multiply-adds per call of each kernel = kChains · kIters · macs_per_instruction. The scalar loop
// is the ceiling only where no vector kernel below runs (x86 without AVX2, other CPUs).
double ScalarFma() {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 1.0f + c;
  const float a = 0.999999f, b = 1e-7f;
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;  // contracted to an FMA where the ISA has one
  }
  float s = 0;
  for (float x : acc) s += x;
  return s;
}

#if defined(__x86_64__)
// The x86 loops are inline assembly: with an array of intrinsic accumulators GCC 12 copies every
// accumulator through another register each iteration (two moves per vpdpbusd, measured: the
// 512-bit peak read 30% low), and the moves take the very ports being measured. Twelve named
// registers, one instruction each per iteration, nothing else in the loop but the counter.
#define KVQ_ROOFLINE_X12(op) \
  op " %0\n\t" op " %1\n\t" op " %2\n\t" op " %3\n\t" op " %4\n\t" op " %5\n\t" op " %6\n\t" \
  op " %7\n\t" op " %8\n\t" op " %9\n\t" op " %10\n\t" op " %11"
#define KVQ_ROOFLINE_LOOP(type, reg, asm_op, init, a_val, b_val)                                      \
  type c0 = init, c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0, c9 = c0,    \
       c10 = c0, c11 = c0;                                                                            \
  type a = a_val, b = b_val;                                                                          \
  for (int64_t i = 0; i < kIters; ++i) {                                                              \
    __asm__ volatile(KVQ_ROOFLINE_X12(asm_op)                                                         \
                     : "+" reg(c0), "+" reg(c1), "+" reg(c2), "+" reg(c3), "+" reg(c4), "+" reg(c5), \
                       "+" reg(c6), "+" reg(c7), "+" reg(c8), "+" reg(c9), "+" reg(c10), "+" reg(c11) \
                     : reg(a), reg(b));                                                               \
  }

// Operands 12 and 13 are a and b; AT&T order: sources first, destination (accumulator) last.
__attribute__((target("avx2,fma"))) double Fma256() {
  KVQ_ROOFLINE_LOOP(__m256, "x", "vfmadd231ps %12, %13,", _mm256_set1_ps(1.0f), _mm256_set1_ps(0.999999f),
                    _mm256_set1_ps(1e-7f))
  return _mm256_cvtss_f32(_mm256_add_ps(c0, c11));
}

__attribute__((target("avx512f"))) double Fma512() {
  KVQ_ROOFLINE_LOOP(__m512, "v", "vfmadd231ps %12, %13,", _mm512_set1_ps(1.0f), _mm512_set1_ps(0.999999f),
                    _mm512_set1_ps(1e-7f))
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(c0, c11));
  return lanes[0];
}

// AVX2's int8 dot: maddubs (u8×s8 pairs -> i16), madd by ones (-> i32) and an add: 32
// multiply-adds per three instructions, the sequence the AVX2 weight kernels use. Intrinsics
// (three dependent instructions per chain leave GCC nothing to copy).
__attribute__((target("avx2"))) double Dot256Avx2() {
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i u = _mm256_set1_epi8(3), s8 = _mm256_set1_epi8(-2);
  __asm__ volatile("" : "+x"(u), "+x"(s8));  // opaque operands: the products cannot be folded
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s8), ones));
    }
    __asm__ volatile("" : "+x"(s8));  // and not hoisted out of the loop
  }
  __m256i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_epi32(s, acc[c]);
  return _mm256_extract_epi32(s, 0);
}

// AVX-512 VNNI vpdpbusd, EVEX encoded (as the weight kernels: see quant_rows-inl.h).
__attribute__((target("avx512f,avx512vl,avx512vnni,no-avxvnni"))) double Dot256Vnni() {
  KVQ_ROOFLINE_LOOP(__m256i, "v", "vpdpbusd %13, %12,", _mm256_set1_epi32(1), _mm256_set1_epi8(3),
                    _mm256_set1_epi8(-2))
  return _mm256_extract_epi32(_mm256_add_epi32(c0, c11), 0);
}

__attribute__((target("avx512f,avx512vnni,no-avxvnni"))) double Dot512Vnni() {
  KVQ_ROOFLINE_LOOP(__m512i, "v", "vpdpbusd %13, %12,", _mm512_set1_epi32(1), _mm512_set1_epi8(3),
                    _mm512_set1_epi8(-2))
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, _mm512_add_epi32(c0, c11));
  return lanes[0];
}
#undef KVQ_ROOFLINE_LOOP
#undef KVQ_ROOFLINE_X12
#endif

// Runs `kernel` once per thread, all threads at once, `reps` times after a warm-up; the median
// rate in 10^9 multiply-adds per second.
double TimeRate(const std::function<double()>& kernel, double macs_per_instruction, int32_t threads,
                int32_t reps) {
  std::vector<double> rates;
  volatile double sink = 0;
  for (int32_t r = 0; r <= reps; ++r) {
    std::vector<double> out(threads);
    const auto t0 = std::chrono::steady_clock::now();
    ThreadPool::Shared(threads).Run(threads, [&](int64_t t, int32_t) { out[t] = kernel(); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (double x : out) sink = sink + x;
    if (r > 0) rates.push_back(static_cast<double>(threads) * kChains * kIters * macs_per_instruction / s / 1e9);
  }
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

ComputeRoofline MeasureComputeRoofline(int32_t threads, int32_t reps) {
  threads = std::max(1, threads);
  reps = std::max(1, reps);
  ComputeRoofline out;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    out.f32.push_back({"mul+add (scalar)", 0, TimeRate(ScalarFma, 1, threads, reps)});
  } else {
    out.f32.push_back({"vfmadd231ps ymm", 256, TimeRate(Fma256, 8, threads, reps)});
    out.int8.push_back({"vpmaddubsw+vpmaddwd ymm", 256, TimeRate(Dot256Avx2, 32, threads, reps)});
  }
  if (__builtin_cpu_supports("avx512f")) {
    out.f32.push_back({"vfmadd231ps zmm", 512, TimeRate(Fma512, 16, threads, reps)});
  }
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) {
    out.int8.push_back({"vpdpbusd ymm", 256, TimeRate(Dot256Vnni, 32, threads, reps)});
    out.int8.push_back({"vpdpbusd zmm", 512, TimeRate(Dot512Vnni, 64, threads, reps)});
  }
#else
  out.f32.push_back({"mul+add (scalar)", 0, TimeRate(ScalarFma, 1, threads, reps)});
#endif
  for (const PeakRate& p : out.f32) {
    if (p.gmacs > out.best_f32_gmacs) out.best_f32_gmacs = p.gmacs, out.best_f32_instruction = p.instruction;
  }
  for (const PeakRate& p : out.int8) {
    if (p.gmacs > out.best_int8_gmacs) out.best_int8_gmacs = p.gmacs, out.best_int8_instruction = p.instruction;
  }
  return out;
}

}  // namespace kvq
