// The "prerope" key transform through the cache: the spec's grammar and refusals; keys appended
// before RoPE and roped as attention reads them give, through every tier (resident, host master
// streamed, disk master streamed) and with sinks and a residual, the same bits as one window; an
// f32+prerope cache gives the same bits as an f32 cache of keys roped before they were appended,
// and a key roped one position off is caught; snapshots keep the transform and refuse a cache
// without it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "test_util/random_rows.h"
#include "formats/row_sequence.h"
#include "kvq/kv_cache.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

using kvq_test::TempDir;

using kvq_test::Random;

constexpr AttentionShape kShape{.n_heads = 8, .n_kv_heads = 2, .head_dim = 16};
constexpr RowShape kRow{.n_kv_heads = 2, .head_dim = 16};

// Every RoPE parameter away from its default, so one that did not reach attention shows.
RopeConfig TestRope() {
  return {.theta = 500.0f, .pairing = RopePairing::kHalves, .position_scale = 0.5f,
          .freq_factors = Llama3RopeFreqFactors(
              16, 500.0f, {.factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 64})};
}

KvSpec Spec(const std::string& text) {
  Result<KvSpec> s = ParseKvSpec(text);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : KvSpec{};
}

KvCacheConfig Config(LayerFormats f, int64_t layers, int64_t max_positions, KvBudgets budgets = {},
                     int32_t page = 64) {
  return {.n_layers = layers, .n_kv_heads = kRow.n_kv_heads, .head_dim = kRow.head_dim, .layers = {f},
          .key_rope = TestRope(), .max_positions = max_positions, .page_positions = page,
          .budgets = budgets};
}

std::unique_ptr<KvCache> MakeCache(const KvCacheConfig& config) {
  Result<std::unique_ptr<KvCache>> c = KvCache::Create(config);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;  // null: the caller ASSERTs
}

std::vector<float> AttendAll(KvCache& cache, const std::vector<float>& q, int32_t n_tokens,
                             AttentionKernel kernel, int64_t layer = 0) {
  AttentionState state(kShape, n_tokens);
  const Status s = cache.Attend(layer, {.scale = 0.25f, .kernel = kernel, .threads = 1}, q.data(),
                                cache.positions(layer) - n_tokens, state);
  EXPECT_TRUE(s.ok()) << s.message();
  std::vector<float> out(q.size());
  cache.FinishAttention(layer, state, out.data());
  return out;
}

// Uneven append blocks, as a prefill and then decode steps would write.
template <class Fn>
void InBlocks(int64_t n, Fn append) {
  for (int64_t done = 0, step = 5; done < n; done += step, step = step * 3 % 97 + 1) {
    append(done, std::min(step, n - done));
  }
}

void AppendAll(KvCache& c, const std::vector<float>& k, const std::vector<float>& v, int64_t n) {
  InBlocks(n, [&](int64_t at, int64_t m) {
    ASSERT_TRUE(c.Append(0, k.data() + at * kRow.elems(), v.data() + at * kRow.elems(), m).ok());
  });
}

TEST(PreRopeSpec, ParsesPrintsAndRefusesWhatItCannotDo) {
  const KvSpec s = Spec("int2-kivi+prerope+res64+sink4");
  EXPECT_TRUE(s.transforms.pre_rope);
  EXPECT_EQ(KvSpecName(s), "int2-kivi+sink4+res64+prerope");
  EXPECT_EQ(*ParseKvSpec(KvSpecName(s)), s);
  EXPECT_FALSE(Spec("int4").transforms.pre_rope);
  const Result<KvSpec> twice = ParseKvSpec("int4+prerope+prerope");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("'prerope' is given twice"), std::string::npos);
  EXPECT_NE(ParseKvSpec("int4+pre").status().message().find("prerope"), std::string::npos)
      << "the list of known transforms names prerope";

  const Status rot = CheckKvSpec(Spec("int4+rot+prerope"), kRow);
  ASSERT_FALSE(rot.ok());
  EXPECT_NE(rot.message().find("int4+rot+prerope: prerope and rot do not combine"), std::string::npos) << rot.message();
  const Status odd = CheckKvSpec(Spec("f32+prerope"), {.n_kv_heads = 1, .head_dim = 15});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.message().find("even head_dim"), std::string::npos) << odd.message();
  EXPECT_TRUE(CheckKvSpec(Spec("int4+prerope"), kRow).ok());
  const Status value = CheckValueSpec(Spec("int4+prerope"), kRow);
  ASSERT_FALSE(value.ok());
  EXPECT_NE(value.message().find("int4+prerope for values: prerope is a key transform"), std::string::npos)
      << value.message();

  // The cache: a value spec with it, a key spec without RoPE parameters, wrong frequency factors.
  const KvSpec int4 = Spec("int4"), pre = Spec("int4+prerope");
  const Result<KvTierPlan> on_values = KvCache::Plan(Config(LayerFormats::Of(int4, pre), 1, 100));
  ASSERT_FALSE(on_values.ok());
  EXPECT_NE(on_values.status().message().find("prerope is a key transform"), std::string::npos);
  KvCacheConfig no_rope = Config(LayerFormats::Of(pre, int4), 2, 100);
  no_rope.key_rope.reset();
  EXPECT_TRUE(KvCache::Plan(no_rope).ok()) << "counting bytes needs no RoPE parameters";
  const Result<std::unique_ptr<KvCache>> missing = KvCache::Create(no_rope);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("layer 0: KV spec int4+prerope stores keys before RoPE"),
            std::string::npos) << missing.status().message();
  no_rope.layers = {LayerFormats::Of(int4, int4)};
  EXPECT_TRUE(KvCache::Create(no_rope).ok()) << "a cache without prerope needs no RoPE parameters";
  KvCacheConfig bad_factors = Config(LayerFormats::Of(pre, int4), 1, 100);
  bad_factors.key_rope->freq_factors.resize(3);
  const Result<KvTierPlan> factors = KvCache::Plan(bad_factors);
  ASSERT_FALSE(factors.ok());
  EXPECT_NE(factors.status().message().find("key_rope has 3 frequency factors; head_dim 16 needs 8"),
            std::string::npos) << factors.status().message();
}

// f32 stores numbers exactly and ApplyRope is one function: an f32+prerope cache reads the very
// keys an f32 cache of roped keys holds, scored by the same f32 kernel — so the tolerance is zero.
TEST(PreRopeCache, F32PreRopeEqualsF32OfRopedKeysAndCatchesAnOffByOne) {
  const int64_t n = 150;
  const std::vector<float> k = Random(n * kRow.elems(), 1), v = Random(n * kRow.elems(), 2);
  const RopeConfig rope = TestRope();
  std::vector<float> roped = k, late = k;
  for (int64_t p = 0; p < n; ++p) {
    ApplyRope(roped.data() + p * kRow.elems(), 32, 16, p, rope.Params());
    ApplyRope(late.data() + p * kRow.elems(), 32, 16, p + 1, rope.Params());
  }
  const KvSpec f32 = Spec("f32");
  for (const char* spec : {"f32+prerope", "f32+prerope+sink4+res40"}) {
    for (int32_t tokens : {1, 3}) {
      const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 3);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        SCOPED_TRACE(::testing::Message() << spec << " tokens " << tokens
                                          << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
        auto pre = MakeCache(Config(LayerFormats::Of(Spec(spec), f32), 1, 300));
        auto plain = MakeCache(Config(LayerFormats::Of(f32, f32), 1, 300));
        auto wrong = MakeCache(Config(LayerFormats::Of(f32, f32), 1, 300));
        ASSERT_TRUE(pre && plain && wrong);
        AppendAll(*pre, k, v, n);
        AppendAll(*plain, roped, v, n);
        AppendAll(*wrong, late, v, n);
        const std::vector<float> want = AttendAll(*plain, q, tokens, kernel);
        EXPECT_EQ(AttendAll(*pre, q, tokens, kernel), want);
        EXPECT_NE(AttendAll(*wrong, q, tokens, kernel), want) << "keys roped one position late went unnoticed";
      }
    }
  }
}

// Every format, alone and with sinks and a residual: every tier equals the same spec read as one
// window (one page holding every position), and plain prerope equals RowSequences of the same
// rows attended as one window with RoPE on read.
TEST(PreRopeCache, EveryTierIsBitIdenticalToOneWindowForEveryFormat) {
  const int64_t n = 300;  // 4.7 pages of 64; 300 % 32 = 12: KIVI's last key group is incomplete
  const std::vector<float> k = Random(n * kRow.elems(), 4), v = Random(n * kRow.elems(), 5);
  const RopeConfig rope = TestRope();
  const RopeParams params = rope.Params();
  for (const FormatDesc* f : Formats()) {
    for (const std::string extra : {"", "+sink4+res40"}) {
      const KvSpec key = Spec(std::string(f->name) + "+prerope" + extra);
      const KvSpec value = Spec(std::string(f->name) + extra);
      const LayerFormats layer = LayerFormats::Of(key, value);
      for (int32_t tokens : {1, 3}) {
        const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 6);
        for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
          SCOPED_TRACE(::testing::Message() << KvSpecName(key) << " tokens " << tokens
                                            << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
          auto one_page = MakeCache(Config(layer, 1, 1000, {}, 1024));
          ASSERT_NE(one_page, nullptr);
          AppendAll(*one_page, k, v, n);
          const std::vector<float> want = AttendAll(*one_page, q, tokens, kernel);
          if (extra.empty()) {  // the cache's one window against the attention layer's own
            RowSequence ks(f->key, kRow), vs(f->value, kRow);
            InBlocks(n, [&](int64_t at, int64_t m) {
              ks.Append(k.data() + at * kRow.elems(), m);
              vs.Append(v.data() + at * kRow.elems(), m);
            });
            AttentionState state(kShape, tokens);
            AttendWindow({.scale = 0.25f, .kernel = kernel, .threads = 1}, q.data(), n - tokens,
                         {.first_position = 0, .k = ks.View(0, n), .v = vs.View(0, n), .key_rope = &params},
                         state);
            std::vector<float> out(q.size());
            FinishAttention(state, out.data());
            ASSERT_EQ(out, want);
          }
          TempDir dir;
          auto resident = MakeCache(Config(layer, 1, 1000));
          ASSERT_NE(resident, nullptr);
          const int64_t three_pages = 3 * resident->plan().slot_bytes;
          auto host = MakeCache(Config(layer, 1, 1000, {.device_bytes = three_pages}));
          auto disk = MakeCache(Config(layer, 1, 1000, {.device_bytes = three_pages, .disk_dir = dir.path.string()}));
          ASSERT_TRUE(host && disk);
          for (KvCache* c : {resident.get(), host.get(), disk.get()}) {
            AppendAll(*c, k, v, n);
            ASSERT_EQ(AttendAll(*c, q, tokens, kernel), want);
          }
          EXPECT_GE(host->plan().device_slots, 2);
        }
      }
    }
  }
}

TEST(PreRopeCache, SnapshotsKeepTheTransformAndContinueExactly) {
  const ModelFingerprint model{.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .weights_hash = 0x1234};
  const int64_t prefix = 77, more = 50;
  const LayerFormats layer = LayerFormats::Of(Spec("int2-kivi+prerope+sink4"), Spec("int4"));
  TempDir dir;
  const std::string path = (dir.path / "prefix.kvq").string();
  std::vector<std::vector<float>> k, v;
  for (int l = 0; l < 2; ++l) {
    k.push_back(Random((prefix + more) * kRow.elems(), 30 + l));
    v.push_back(Random((prefix + more) * kRow.elems(), 40 + l));
  }
  auto whole = MakeCache(Config(layer, 2, 500));
  auto first = MakeCache(Config(layer, 2, 500));
  auto second = MakeCache(Config(layer, 2, 500, {.device_bytes = 1 << 15, .disk_dir = dir.path.string()}));
  ASSERT_TRUE(whole && first && second);
  const int64_t e = kRow.elems();
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(whole->Append(l, k[l].data(), v[l].data(), prefix).ok());
    ASSERT_TRUE(whole->Append(l, k[l].data() + prefix * e, v[l].data() + prefix * e, more).ok());
    ASSERT_TRUE(first->Append(l, k[l].data(), v[l].data(), prefix).ok());
  }
  ASSERT_TRUE(first->Save(path, model).ok());
  const Result<std::vector<int32_t>> loaded = second->Load(path, model);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(second->Append(l, k[l].data() + prefix * e, v[l].data() + prefix * e, more).ok());
  }
  const std::vector<float> q = Random(2 * kShape.n_heads * kShape.head_dim, 50);
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(AttendAll(*second, q, 2, AttentionKernel::kSimd, l), AttendAll(*whole, q, 2, AttentionKernel::kSimd, l));
  }
  // Keys stored before RoPE read back only as such: a cache without prerope refuses the file.
  auto roped_keys = MakeCache(Config(LayerFormats::Of(Spec("int2-kivi+sink4"), Spec("int4")), 2, 500));
  ASSERT_NE(roped_keys, nullptr);
  const Result<std::vector<int32_t>> refused = roped_keys->Load(path, model);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("int2-kivi+sink4+prerope"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(roped_keys->positions(0), 0);
}

}  // namespace
}  // namespace kvq
