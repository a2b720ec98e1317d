// The bundled stories260K (llama2.c checkpoint and tokenizer), loaded once per test program with
// one thread, for tests that need a real trained model and do not care about its options.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kvq/model.h"

namespace kvq::test {

inline const Model& BundledModel() {
  static const std::unique_ptr<Model> model = [] {
    const std::string dir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
    Result<std::unique_ptr<Model>> m =
        Model::Load(dir + "stories260K.bin", {.tokenizer_path = dir + "tok512.bin", .threads = 1});
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(m).value() : nullptr;
  }();
  return *model;
}

}  // namespace kvq::test
