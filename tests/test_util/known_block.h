// A hand-built weight block and the values it must decode to, for the weight-type conformance
// suite (tests/weights/weight_type_conformance_test.cc) and the per-type case files beside it
// (tests/weights/known_blocks/<name>.h), plus little-endian byte helpers to build them.
#pragma once

#include <cstdint>
#include <vector>

namespace kvq::test {

struct KnownBlock {
  std::vector<uint8_t> bytes;  // one block, block_bytes long
  std::vector<float> values;   // [block_elems], computed in the test, not by the decoder
};

inline std::vector<uint8_t> U16(uint16_t v) {
  return {static_cast<uint8_t>(v & 0xFF), static_cast<uint8_t>(v >> 8)};
}
inline std::vector<uint8_t> U32(uint32_t v) {
  return {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
          static_cast<uint8_t>(v >> 24)};
}

}  // namespace kvq::test
