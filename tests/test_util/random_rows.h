// Test data shared by the cache and attention tests: rows of standard-normal numbers from a seed,
// and a scratch folder removed when it goes out of scope.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace kvq_test {

/// n numbers drawn from N(0, 1) by mt19937(seed): the same numbers on every run and platform.
inline std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

/// A fresh folder under the test's temporary directory, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::path(::testing::TempDir()) /
           ("kvq_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  static inline int counter = 0;
};

}  // namespace kvq_test
