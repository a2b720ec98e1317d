// A whole file's bytes, for tests that compare files or cut them (the GGUF reader, header and synth
// writer tests). An unreadable path gives no bytes; the tests then fail on what they expected.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kvq::test {

inline std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace kvq::test
