// Paths of the bundled stories260K files in the source tree, for tests that write synth models from
// its vocabulary or read it as a GGUF. KVQ_SOURCE_DIR is set for every test program by
// tests/CMakeLists.txt.
#pragma once

#include <string>

#ifndef KVQ_SOURCE_DIR
#error "KVQ_SOURCE_DIR (the source tree) must be defined: tests/CMakeLists.txt sets it"
#endif

namespace kvq::test {

/// models/stories260K/stories260K.gguf: the bundled model as a GGUF (its vocabulary seeds synth files).
inline std::string BundledGgufPath() { return std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf"; }

}  // namespace kvq::test
