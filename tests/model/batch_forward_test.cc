// DecoderModel::ForwardBatch: several segments (own caches, own positions, blocks of 1..64 tokens)
// in one pass give each segment the logits and the cache bytes of ForwardBlock of it alone; a
// segment without a logits pointer skips the classifier; the hooks see every segment's tokens at
// their positions; every refusal comes before anything runs; and a steady decode batch allocates
// nothing once warm (the attention states are pooled).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "model/decoder.h"
#include "model/llama2c.h"
#include "test_util/largest_allocation.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

std::unique_ptr<KvCache> MakeCache(const DecoderConfig& c, const std::string& spec, int64_t n) {
  Result<KvSpec> k = ParseKvSpec(spec);
  EXPECT_TRUE(k.ok()) << k.status().message();
  if (!k.ok()) return nullptr;
  Result<std::unique_ptr<KvCache>> r = KvCache::Create({.n_layers = c.n_layers,
                                                        .n_kv_heads = c.n_kv_heads,
                                                        .head_dim = c.head_dim(),
                                                        .layers = {LayerFormats::Both(*k)},
                                                        .key_rope = ModelRopeConfig(c),
                                                        .max_positions = n,
                                                        .page_positions = 64});
  EXPECT_TRUE(r.ok()) << spec << ": " << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::string CacheBytes(const KvCache& cache) {
  const std::string path =
      (fs::path(::testing::TempDir()) / ("kvq_batch_fwd_" + std::to_string(::getpid()))).string();
  const KvCacheConfig& c = cache.config();
  const Status s = cache.Save(
      path, {.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim});
  EXPECT_TRUE(s.ok()) << s.message();
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(path);
  return bytes;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class BatchForward : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<DecoderWeights> w = LoadLlama2c(kDir + "stories260K.bin");
    ASSERT_TRUE(w.ok());
    weights_ = std::move(w).value();
    tokens_.resize(600);
    for (size_t i = 0; i < tokens_.size(); ++i)
      tokens_[i] = static_cast<int32_t>((i * 37 + 11) % 512);
  }
  DecoderWeights weights_;
  std::vector<int32_t> tokens_;
};

// Four sequences at positions 0, 5, 37 and 70 (prefilled alone), then batches mixing blocks of
// 17, 64 and 1 tokens, and decode steps of all four: each segment's logits and cache equal those
// of the same blocks run alone, for per-token formats, a rotated spec, prerope keys and KIVI.
TEST_F(BatchForward, EachSegmentGetsTheBitsOfItsBlockAlone) {
  const DecoderConfig& c = weights_.config;
  for (const char* spec :
       {"f32", "f16", "int8", "int4", "fp4-e2m1", "int4-kivi", "int4+rot", "f16+prerope"}) {
    SCOPED_TRACE(spec);
    DecoderModel batch_model(weights_, 2), alone_model(weights_, 2);
    constexpr int kSeqs = 4;
    std::unique_ptr<KvCache> batched[kSeqs], alone[kSeqs];
    const int64_t start[kSeqs] = {0, 5, 37, 70};
    std::vector<float> logits_b[kSeqs], logits_a[kSeqs];
    for (int i = 0; i < kSeqs; ++i) {
      batched[i] = MakeCache(c, spec, 300);
      alone[i] = MakeCache(c, spec, 300);
      ASSERT_TRUE(batched[i] && alone[i]);
      logits_b[i].assign(c.vocab_size, 0.0f);
      logits_a[i].assign(c.vocab_size, 0.0f);
      if (start[i] > 0) {
        ASSERT_TRUE(batch_model
                        .ForwardBlock(tokens_.data() + 100 * i, start[i], 0, *batched[i],
                                      logits_b[i].data())
                        .ok());
        ASSERT_TRUE(
            alone_model
                .ForwardBlock(tokens_.data() + 100 * i, start[i], 0, *alone[i], logits_a[i].data())
                .ok());
      }
    }
    // Rounds of (tokens per segment); 0: the segment sits the round out.
    const int32_t rounds[][kSeqs] = {
        {17, 64, 1, 1}, {1, 1, 1, 1}, {1, 0, 64, 3}, {64, 1, 0, 1}, {1, 1, 1, 1}};
    int64_t pos[kSeqs] = {start[0], start[1], start[2], start[3]};
    for (const auto& round : rounds) {
      std::vector<ForwardSegment> segments;
      for (int i = 0; i < kSeqs; ++i) {
        if (round[i] == 0) continue;
        segments.push_back({.tokens = tokens_.data() + 100 * i + pos[i],
                            .n = round[i],
                            .pos = pos[i],
                            .cache = *batched[i],
                            .logits = logits_b[i].data()});
      }
      ASSERT_TRUE(batch_model.ForwardBatch(segments).ok());
      for (int i = 0; i < kSeqs; ++i) {
        if (round[i] == 0) continue;
        ASSERT_TRUE(alone_model
                        .ForwardBlock(tokens_.data() + 100 * i + pos[i], round[i], pos[i],
                                      *alone[i], logits_a[i].data())
                        .ok());
        pos[i] += round[i];
        EXPECT_TRUE(SameBits(logits_b[i], logits_a[i])) << "sequence " << i << " at " << pos[i];
        EXPECT_EQ(batched[i]->positions(c.n_layers - 1), pos[i]);
      }
    }
    for (int i = 0; i < kSeqs; ++i)
      EXPECT_EQ(CacheBytes(*batched[i]), CacheBytes(*alone[i])) << "sequence " << i;
  }
}

TEST_F(BatchForward, SegmentsWithoutLogitsPointerSkipTheClassifierAndHooksSeeEveryToken) {
  const DecoderConfig& c = weights_.config;
  DecoderModel model(weights_, 1);
  std::unique_ptr<KvCache> a = MakeCache(c, "f16", 100), b = MakeCache(c, "f16", 100);
  ASSERT_TRUE(a && b);
  std::vector<std::pair<int32_t, int64_t>> seen;  // (layer, pos) per on_qkv call
  const ForwardHooks hooks{
      .on_qkv = [&](int32_t l, int64_t p, const float*, const float*, const float*) {
        seen.push_back({l, p});
      }};
  model.set_hooks(&hooks);
  std::vector<float> logits(c.vocab_size, -7.0f);
  const ForwardSegment segments[] = {
      {.tokens = tokens_.data(), .n = 3, .pos = 0, .cache = *a, .logits = nullptr},
      {.tokens = tokens_.data(), .n = 2, .pos = 0, .cache = *b, .logits = logits.data()}};
  ASSERT_TRUE(model.ForwardBatch(segments).ok());
  model.set_hooks(nullptr);
  EXPECT_EQ(a->positions(0), 3);
  EXPECT_EQ(b->positions(0), 2);
  EXPECT_NE(logits[0], -7.0f);
  ASSERT_EQ(seen.size(), static_cast<size_t>(5 * c.n_layers));
  EXPECT_EQ(seen[0], std::make_pair(0, int64_t{0}));
  EXPECT_EQ(seen[2], std::make_pair(0, int64_t{2}));
  EXPECT_EQ(seen[3], std::make_pair(0, int64_t{0}));  // segment 1's first token
  EXPECT_EQ(seen[5], std::make_pair(1, int64_t{0}));
}

TEST_F(BatchForward, RefusalsComeBeforeAnythingRuns) {
  const DecoderConfig& c = weights_.config;
  DecoderModel model(weights_, 1);
  std::unique_ptr<KvCache> a = MakeCache(c, "f16", 100), b = MakeCache(c, "f16", 100);
  ASSERT_TRUE(a && b);
  Result<KvSpec> pre = ParseKvSpec("f16+prerope");
  ASSERT_TRUE(pre.ok());
  Result<std::unique_ptr<KvCache>> no_rope = KvCache::Create({.n_layers = c.n_layers,
                                                              .n_kv_heads = c.n_kv_heads,
                                                              .head_dim = c.head_dim(),
                                                              .layers = {LayerFormats::Both(*pre)},
                                                              .key_rope = std::nullopt,
                                                              .max_positions = 100,
                                                              .page_positions = 64});
  ASSERT_FALSE(
      no_rope.ok());  // Create refuses it already; ForwardBatch's check covers another model's RoPE
  RopeConfig other = ModelRopeConfig(c);
  other.theta *= 2;
  Result<std::unique_ptr<KvCache>> wrong_rope =
      KvCache::Create({.n_layers = c.n_layers,
                       .n_kv_heads = c.n_kv_heads,
                       .head_dim = c.head_dim(),
                       .layers = {LayerFormats::Both(*pre)},
                       .key_rope = other,
                       .max_positions = 100,
                       .page_positions = 64});
  ASSERT_TRUE(wrong_rope.ok());
  std::vector<float> logits(c.vocab_size);
  const int32_t bad[] = {3, 512};
  auto refused = [&](std::vector<ForwardSegment> segments, const std::string& part) {
    const Status s = model.ForwardBatch(segments);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
    for (const KvCache* k : {a.get(), b.get(), wrong_rope->get()})
      EXPECT_EQ(k->positions(0), 0) << s.message();
  };
  const int32_t* t = tokens_.data();
  refused({}, "no segments");
  refused(
      {{.tokens = t, .n = 2, .pos = 0, .cache = *a}, {.tokens = t, .n = 0, .pos = 0, .cache = *b}},
      "segment 1 has no tokens");
  refused({{.tokens = t, .n = 2, .pos = 0, .cache = *a},
           {.tokens = bad, .n = 2, .pos = 0, .cache = *b}},
          "segment 1: token 512 at index 1");
  refused({{.tokens = t, .n = 2, .pos = 0, .cache = *a},
           {.tokens = t, .n = 1, .pos = 0, .cache = *b},
           {.tokens = t, .n = 1, .pos = 0, .cache = *a}},
          "segments 0 and 2 share one KV cache");
  refused({{.tokens = t, .n = 2, .pos = 0, .cache = *a},
           {.tokens = t, .n = 1, .pos = 0, .cache = **wrong_rope}},
          "segment 1: the KV cache stores keys before RoPE");
}

// Once the pool holds a state per segment size, a decode step of a steady batch allocates nothing
// (the steps stay inside one cache page: a new page is one allocation by design).
TEST_F(BatchForward, SteadyDecodeBatchAllocatesNothing) {
  const DecoderConfig& c = weights_.config;
  for (int32_t threads : {1, 2}) {
    SCOPED_TRACE(threads);
    DecoderModel model(weights_, threads);
    constexpr int kSeqs = 3;
    std::unique_ptr<KvCache> caches[kSeqs];
    std::vector<float> logits[kSeqs];
    for (int i = 0; i < kSeqs; ++i) {
      caches[i] = MakeCache(c, "int4", 128);
      ASSERT_NE(caches[i], nullptr);
      logits[i].resize(c.vocab_size);
      ASSERT_TRUE(model.ForwardBlock(tokens_.data(), 10 + i, 0, *caches[i], logits[i].data()).ok());
    }
    auto step = [&] {
      std::vector<ForwardSegment> segments;
      for (int i = 0; i < kSeqs; ++i) {
        const int64_t p = caches[i]->positions(0);
        segments.push_back({.tokens = tokens_.data() + p,
                            .n = 1,
                            .pos = p,
                            .cache = *caches[i],
                            .logits = logits[i].data()});
      }
      kvq_test::g_allocations = 0;
      kvq_test::g_track_allocations = true;
      const Status s = model.ForwardBatch(segments);
      kvq_test::g_track_allocations = false;
      EXPECT_TRUE(s.ok()) << s.message();
      return kvq_test::g_allocations.load();
    };
    step();
    step();  // warm: the state pool, attention scratch, MatMul's activation scratch, the thread
             // pool
    EXPECT_EQ(step(), 0);
    EXPECT_EQ(step(), 0);
  }
}

}  // namespace
}  // namespace kvq
