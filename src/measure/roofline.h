// The compute ceiling of this machine, measured in the same run as a benchmark (as the read
// bandwidth is, read_bandwidth.h), so every rate kvq prints has a ceiling beside it: the peak
// f32 multiply-add rate and the peak int8 multiply-add rate (the int8 byte dot the weight kernels
// use), on every thread at once, for each vector width the CPU runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvq {

/// One measured peak: 10^9 multiply-adds per second over all threads.
struct PeakRate {
  std::string instruction;  ///< what was timed, e.g. "vfmadd231ps ymm", "vpdpbusd zmm"
  int32_t vector_bits = 0;  ///< 0 for the scalar loop
  double gmacs = 0;         ///< median over the repetitions
};

/// The peaks of one run. `best_*` is the highest of the widths measured: the ceiling a kernel is
/// held to, whichever width it uses.
struct ComputeRoofline {
  std::vector<PeakRate> f32;   ///< f32 FMA: scalar, then 256 and 512 bit where the CPU has them
  std::vector<PeakRate> int8;  ///< u8×s8 dot into i32: AVX2 maddubs+madd, AVX-512 VNNI vpdpbusd
  double best_f32_gmacs = 0;
  double best_int8_gmacs = 0;
  std::string best_f32_instruction, best_int8_instruction;
};

/// Times independent chains of each instruction (enough of them to hide its latency) on `threads`
/// threads at once, `reps` times after a warm-up; about 20 ms per repetition and width.
ComputeRoofline MeasureComputeRoofline(int32_t threads, int32_t reps);

}  // namespace kvq
