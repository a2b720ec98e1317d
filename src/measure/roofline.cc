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
__attribute__((target("avx2,fma"))) double Fma256() {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) double Fma512() {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);  // not _mm512_reduce_add_ps: GCC 12's header warns in it
  return lanes[0];
}

// AVX2's int8 dot: maddubs (u8×s8 pairs -> i16) then madd by ones (-> i32) and an add: 32
// multiply-adds per three instructions, the sequence the AVX2 weight kernels use.
__attribute__((target("avx2"))) double Dot256Avx2() {
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i u = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  __m256i s8 = _mm256_set1_epi8(-2);
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s8), ones));
    }
    s8 = _mm256_xor_si256(s8, acc[0]);  // loop-carried, so the products cannot be hoisted
  }
  __m256i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_epi32(s, acc[c]);
  return _mm256_extract_epi32(s, 0);
}

// AVX-512 VNNI vpdpbusd, EVEX encoded (avx512vnni, not the VEX avxvnni: see quant_rows-inl.h).
__attribute__((target("avx512f,avx512vl,avx512vnni,no-avxvnni"))) double Dot256Vnni() {
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i u = _mm256_set1_epi8(3), s8 = _mm256_set1_epi8(-2);
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_dpbusd_epi32(acc[c], u, s8);
  }
  __m256i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_epi32(s, acc[c]);
  return _mm256_extract_epi32(s, 0);
}

__attribute__((target("avx512f,avx512vnni,no-avxvnni"))) double Dot512Vnni() {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i u = _mm512_set1_epi8(3), s8 = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], u, s8);
  }
  __m512i s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_epi32(s, acc[c]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  return lanes[0];
}
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
