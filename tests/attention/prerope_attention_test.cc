// Pre-RoPE keys in attention (KvWindow::key_rope, what a "prerope" key spec reads): each key is
// decoded and roped at its own absolute position as it is read. Checked: f32 keys stored before
// RoPE give the same bits as the same keys roped before they were stored (one ApplyRope, the same
// f32 kernels); any windows give the same bits as one window for every format, both kernels,
// decode and prefill blocks, any thread count; a key roped one position off is caught.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "test_util/random_rows.h"
#include "formats/row_sequence.h"
#include "kvq/attention.h"
#include "kvq/rope.h"

namespace kvq {
namespace {

constexpr AttentionShape kShape{.n_heads = 8, .n_kv_heads = 2, .head_dim = 16};
constexpr RowShape kRow{.n_kv_heads = 2, .head_dim = 16};
using Windows = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) positions

using kvq_test::Random;

Windows Even(int64_t n, int64_t size) {
  Windows w;
  for (int64_t b = 0; b < n; b += size) w.emplace_back(b, std::min(n, b + size));
  return w;
}

// The default RoPE, and one with every parameter away from its default (NeoX pairing, a linear
// position scale, Llama 3.1 frequency factors), so a parameter that did not reach attention shows.
std::vector<RopeConfig> Ropes() {
  RopeConfig plain;
  RopeConfig scaled{.theta = 500.0f, .pairing = RopePairing::kHalves, .position_scale = 0.5f,
                    .freq_factors = Llama3RopeFreqFactors(
                        16, 500.0f, {.factor = 4, .low_freq_factor = 1, .high_freq_factor = 4,
                                     .original_context = 64})};
  return {plain, scaled};
}

// Everything attention leaves for a query block: out, then m, l, acc.
std::vector<float> Attend(const RowSequence& k, const RowSequence& v, const RopeParams* rope,
                          const Windows& windows, const std::vector<float>& q, int32_t n_tokens,
                          AttentionKernel kernel, int32_t threads = 1, int64_t position_chunk = 0) {
  const AttentionOptions o{.scale = 0.25f, .kernel = kernel, .threads = threads, .position_chunk = position_chunk};
  AttentionState state(kShape, n_tokens);
  const int64_t first_query = k.size() - n_tokens;
  for (const auto& [b, e] : windows) {
    const KvWindow w{.first_position = b, .k = k.View(b, e - b), .v = v.View(b, e - b), .key_rope = rope};
    AttendWindow(o, q.data(), first_query, w, state);
  }
  std::vector<float> all(q.size());
  FinishAttention(state, all.data());
  for (const std::vector<float>* x : {&state.m, &state.l, &state.acc, &state.merged_m, &state.merged_l, &state.merged_acc}) {
    all.insert(all.end(), x->begin(), x->end());
  }
  return all;
}

// keys [n][n_kv_heads][head_dim] roped at positions shift, shift + 1, ... (the model's call).
std::vector<float> Roped(std::vector<float> keys, int64_t n, const RopeParams& rope, int64_t shift) {
  for (int64_t p = 0; p < n; ++p) {
    ApplyRope(keys.data() + p * kRow.elems(), static_cast<int32_t>(kRow.elems()), kRow.head_dim, p + shift, rope);
  }
  return keys;
}

// The same function on the same numbers gives the same roped keys, and f32 rows are scored by the
// same f32 kernel (or reference dot) whether they come from blocks or from the roped tile, so the
// tolerance is zero: bit for bit. A key roped one position late must change the result.
TEST(PreRopeAttention, F32KeysRopedWhenReadEqualKeysRopedWhenStored) {
  const int64_t n = 100;
  const std::vector<float> k = Random(n * kRow.elems(), 1), v = Random(n * kRow.elems(), 2);
  const FormatDesc& f32 = **FindFormat("f32");
  for (const RopeConfig& rc : Ropes()) {
    const RopeParams rope = rc.Params();
    RowSequence raw(f32.key, kRow), roped(f32.key, kRow), late(f32.key, kRow), vs(f32.value, kRow);
    raw.Append(k.data(), n);
    roped.Append(Roped(k, n, rope, 0).data(), n);
    late.Append(Roped(k, n, rope, 1).data(), n);
    vs.Append(v.data(), n);
    for (int32_t tokens : {1, 5, 40}) {  // decode, one query block, two blocks (32 + 8)
      const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 3);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        SCOPED_TRACE(::testing::Message() << "theta " << rc.theta << " tokens " << tokens
                                          << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
        const std::vector<float> want = Attend(roped, vs, nullptr, {{0, n}}, q, tokens, kernel);
        EXPECT_EQ(Attend(raw, vs, &rope, {{0, n}}, q, tokens, kernel), want);
        EXPECT_EQ(Attend(raw, vs, &rope, Even(n, 7), q, tokens, kernel), want);
        EXPECT_NE(Attend(late, vs, nullptr, {{0, n}}, q, tokens, kernel), want)
            << "keys roped one position late went unnoticed";
      }
    }
  }
}

TEST(PreRopeAttention, AnyWindowsEqualOneWindowForEveryFormat) {
  const int64_t n = 96;
  const std::vector<float> k = Random(n * kRow.elems(), 4), v = Random(n * kRow.elems(), 5);
  const RopeConfig rc = Ropes()[1];
  const RopeParams rope = rc.Params();
  Windows uneven;
  for (int64_t b = 0, s = 1; b < n; b += s, s = s % 7 + 3) uneven.emplace_back(b, std::min(n, b + s));
  for (const FormatDesc* f : Formats()) {
    RowSequence ks(f->key, kRow), vs(f->value, kRow);
    ks.Append(k.data(), 40);  // two appends: fp8 calibrates on the first, KIVI groups straddle them
    ks.Append(k.data() + 40 * kRow.elems(), n - 40);
    vs.Append(v.data(), 40);
    vs.Append(v.data() + 40 * kRow.elems(), n - 40);
    for (int32_t tokens : {1, 12}) {
      const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 6);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        SCOPED_TRACE(::testing::Message() << f->name << " tokens " << tokens
                                          << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
        const std::vector<float> whole = Attend(ks, vs, &rope, {{0, n}}, q, tokens, kernel);
        for (int64_t size : {1, 5, 31, 32, 33, 64}) {
          ASSERT_EQ(Attend(ks, vs, &rope, Even(n, size), q, tokens, kernel), whole) << "windows of " << size;
        }
        EXPECT_EQ(Attend(ks, vs, &rope, uneven, q, tokens, kernel), whole) << "uneven windows";
        EXPECT_EQ(Attend(ks, vs, &rope, Even(n, 13), q, tokens, kernel, 3), whole) << "3 threads";
        // Without RoPE on read the scores are those of unroped keys: it must show.
        EXPECT_NE(Attend(ks, vs, nullptr, {{0, n}}, q, tokens, kernel), whole);
      }
    }
  }
}

// Position chunks split among threads (kvq/attention.h): pre-RoPE keys are roped at their absolute
// positions whichever thread reads their chunk, so 2, 3 and 8 threads, one window or many, give one
// thread's bits — every format, both kernels, decode and a prefill block, 300 positions in chunks of
// 64 (not a multiple).
TEST(PreRopeAttention, ChunksOnAnyThreadsGiveTheSameBits) {
  const int64_t n = 300, chunk = 64;
  const std::vector<float> k = Random(n * kRow.elems(), 6), v = Random(n * kRow.elems(), 7);
  const RopeConfig rc = Ropes()[1];  // the params point into it
  const RopeParams rope = rc.Params();
  for (const FormatDesc* f : Formats()) {
    RowSequence ks(f->key, kRow), vs(f->value, kRow);
    ks.Append(k.data(), n);
    vs.Append(v.data(), n);
    for (int32_t tokens : {1, 5}) {
      const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 8);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        const std::vector<float> want = Attend(ks, vs, &rope, {{0, n}}, q, tokens, kernel, 1, chunk);
        for (int32_t threads : {2, 3, 8}) {
          for (const Windows& w : {Windows{{0, n}}, Even(n, 50)}) {
            EXPECT_EQ(Attend(ks, vs, &rope, w, q, tokens, kernel, threads, chunk), want)
                << f->name << " tokens " << tokens << " threads " << threads << " windows " << w.size()
                << (kernel == AttentionKernel::kSimd ? " simd" : " scalar");
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvq
