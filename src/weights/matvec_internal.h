// Constants and the quantised-activation view shared by the MatVec translation units (matvec.cc,
// its per-target bodies in matvec_quant-inl.h, and the plain references in matvec_reference.cc).
// Not part of the API: see matvec.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvq::matvec_internal {

constexpr int64_t kBlockElems = 32;  // Q8_0, Q4_0 and the quantised activation: elements per block
constexpr int64_t kQ8Bytes = 34;     // f16 d + 32 int8
constexpr int64_t kQ4Bytes = 18;     // f16 d + 16 bytes of nibbles
constexpr int64_t kLaneElems = 4;    // elements one int32 lane of an x86 byte dot product sums

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;  // little-endian host (x86-64, AArch64)
}

/// One token's activation quantised by QuantizeActivation, as the Q8_0/Q4_0 row kernels read it.
struct QuantizedX {
  const int8_t* q = nullptr;         // [cols] codes in [-127, 127]
  const float* d = nullptr;          // [cols / 32] scale per block
  // [cols / 4] what each int32 lane of the x86 kernels starts from (filled per target by
  // PrepareActivationHere, see matvec_quant-inl.h): minus the unsigned-byte bias times the sum of
  // the 4 codes the lane covers, so the lane ends exactly at Σ code·q (or a fixed power-of-two
  // multiple of it).
  const int32_t* offset = nullptr;
};

}  // namespace kvq::matvec_internal
