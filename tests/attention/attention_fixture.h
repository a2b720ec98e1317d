// Shared fixture for attention tests: a K and a V RowSequence of random rows in a format, random
// queries, and a runner that feeds any list of position windows to AttendWindow.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "formats/row_sequence.h"
#include "kvq/attention.h"
#include "kvq/format.h"

namespace kvq::testing_attention {

using Windows = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) positions

/// Windows of `size` positions covering [0, n).
inline Windows Even(int64_t n, int64_t size) {
  Windows w;
  for (int64_t b = 0; b < n; b += size) w.emplace_back(b, std::min(n, b + size));
  return w;
}

struct Result {
  std::vector<float> out, m, l, acc;
  std::vector<int64_t> attended;
  std::vector<float> merged_m, merged_l, merged_acc;  // the chunks before the open one
};

/// A state's numbers and its FinishAttention output.
inline Result ResultOf(const AttentionState& state) {
  const AttentionShape s = state.shape();
  Result r{std::vector<float>(int64_t{state.n_tokens()} * s.n_heads * s.head_dim), state.m, state.l, state.acc,
           state.attended, state.merged_m, state.merged_l, state.merged_acc};
  FinishAttention(state, r.out.data());
  return r;
}

class Cache {
 public:
  Cache(const FormatDesc& format, AttentionShape shape, int64_t n_positions, int32_t n_tokens,
        uint32_t seed)
      : shape_(shape),
        row_{.n_kv_heads = shape.n_kv_heads, .head_dim = shape.head_dim},
        k_(format.key, row_),
        v_(format.value, row_),
        n_positions_(n_positions),
        n_tokens_(n_tokens) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(n_positions * row_.elems()), v(k.size());
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    k_.Append(k.data(), n_positions);
    v_.Append(v.data(), n_positions);
    q_.resize(int64_t{n_tokens} * shape.n_heads * shape.head_dim);
    for (float& x : q_) x = dist(rng);
  }

  /// Query tokens sit at the last n_tokens positions (the query of a decode step is the newest).
  int64_t first_query_position() const { return n_positions_ - n_tokens_; }
  const std::vector<float>& q() const { return q_; }
  const RowSequence& k() const { return k_; }
  const RowSequence& v() const { return v_; }
  AttentionShape shape() const { return shape_; }
  int64_t n_positions() const { return n_positions_; }

  KvWindow Window(int64_t begin, int64_t end) const {
    return {.first_position = begin, .k = k_.View(begin, end - begin), .v = v_.View(begin, end - begin)};
  }

  /// Runs the windows in order; `between` (if set) is applied to the state at each boundary.
  template <class Between>
  Result Run(const AttentionOptions& o, const Windows& windows, Between between) const {
    AttentionState state(shape_, n_tokens_);
    for (size_t i = 0; i < windows.size(); ++i) {
      if (i > 0) between(state);
      AttendWindow(o, q_.data(), first_query_position(), Window(windows[i].first, windows[i].second),
                   state);
    }
    return ResultOf(state);
  }
  Result Run(const AttentionOptions& o, const Windows& windows) const {
    return Run(o, windows, [](AttentionState&) {});
  }

 private:
  AttentionShape shape_;
  RowShape row_;
  RowSequence k_, v_;
  int64_t n_positions_;
  int32_t n_tokens_;
  std::vector<float> q_;
};

inline AttentionOptions Options(AttentionShape s, AttentionKernel kernel, float softcap = 0.0f) {
  return {.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim)), .softcap = softcap,
          .kernel = kernel, .threads = 1};
}

/// Compares every float of two results with `same(x, y)`; reports the first difference.
template <class Same>
::testing::AssertionResult CompareResults(const Result& a, const Result& b, const Same& same) {
  if (a.attended != b.attended) return ::testing::AssertionFailure() << "attended counts differ";
  const std::pair<const std::vector<float>*, const std::vector<float>*> pairs[] = {
      {&a.out, &b.out}, {&a.m, &b.m}, {&a.l, &b.l}, {&a.acc, &b.acc},
      {&a.merged_m, &b.merged_m}, {&a.merged_l, &b.merged_l}, {&a.merged_acc, &b.merged_acc}};
  const char* names[] = {"out", "m", "l", "acc", "merged_m", "merged_l", "merged_acc"};
  for (int p = 0; p < 7; ++p) {
    const auto& x = *pairs[p].first;
    const auto& y = *pairs[p].second;
    if (x.size() != y.size()) return ::testing::AssertionFailure() << names[p] << " sizes differ";
    for (size_t i = 0; i < x.size(); ++i) {
      if (!same(x[i], y[i])) {
        return ::testing::AssertionFailure() << names[p] << "[" << i << "]: " << x[i] << " vs " << y[i];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

/// Every float equal (==, no tolerance); reports the first difference.
inline ::testing::AssertionResult BitIdentical(const Result& a, const Result& b) {
  return CompareResults(a, b, [](float x, float y) { return x == y; });
}

/// Byte equality of every float (memcmp: also tells −0 from +0, which == does not).
inline ::testing::AssertionResult SameBytes(const Result& a, const Result& b) {
  return CompareResults(a, b, [](float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; });
}

}  // namespace kvq::testing_attention
