// The tokenizer tests' shared fixtures: llama.cpp's test-tokenizer-0 known-answer files
// (tests/testdata/vocab/<name>.gguf.inp/.out) and a tokenizer loaded from a vocabulary GGUF.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "text/tokenizer.h"

namespace kvq::test {

inline const std::string kVocabDir = std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/";

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The .inp convention: every input is followed by "\n__ggml_vocab_test__\n", so an input holds no
/// trailing newline of its own unless it is part of the text (the input "\n" is written as an
/// empty line before the separator line).
inline std::vector<std::string> ReadInputs(const std::string& path) {
  const std::string all = ReadFile(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  size_t at = 0;
  for (size_t hit; (hit = all.find(sep, at)) != std::string::npos; at = hit + sep.size()) {
    inputs.push_back(all.substr(at, hit - at));
  }
  EXPECT_EQ(at, all.size()) << path << " does not end with the separator";
  return inputs;
}

/// The .out convention: one line of space-separated ids per input, without BOS (an empty line
/// for the empty input).
inline std::vector<std::vector<int32_t>> ReadOutputs(const std::string& path) {
  std::istringstream in(ReadFile(path));
  std::vector<std::vector<int32_t>> outputs;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    outputs.emplace_back();
    for (int32_t id; ids >> id;) outputs.back().push_back(id);
  }
  return outputs;
}

struct LoadedVocab {
  std::unique_ptr<GgufFile> file;
  Tokenizer tok;
};

/// The tokenizer of a vocabulary GGUF; aborts the test program if it does not load (every test
/// after it would fail for the same reason).
inline LoadedVocab LoadVocab(const std::string& path) {
  Result<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) std::abort();
  Result<Tokenizer> t = Tokenizer::LoadGguf(**f);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) std::abort();
  return {std::move(f).value(), std::move(t).value()};
}

}  // namespace kvq::test
