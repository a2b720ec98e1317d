// KvCache::Truncate (in place, what a server's prefix reuse needs): for every format, with and
// without rotation, a cache truncated to its TruncationPoint and then appended to holds the same
// bytes (its snapshot file, byte for byte) and attends to the same bits as a cache that was only
// ever appended those rows; specs whose rows depend on later ones (sinks, a residual) and a disk
// master refuse, and a refused truncation changes nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "kvq/kv_cache.h"
#include "test_util/random_rows.h"

namespace kvq {
namespace {

constexpr AttentionShape kShape{.n_heads = 4, .n_kv_heads = 2, .head_dim = 16};
constexpr RowShape kRow{.n_kv_heads = 2, .head_dim = 16};
constexpr int64_t kLayers = 2, kContext = 300;
const ModelFingerprint kModel{.n_layers = kLayers, .n_kv_heads = 2, .head_dim = 16, .weights_hash = 7};

std::unique_ptr<KvCache> MakeCache(const LayerFormats& f, KvBudgets budgets = {}) {
  Result<std::unique_ptr<KvCache>> c =
      KvCache::Create({.n_layers = kLayers, .n_kv_heads = kRow.n_kv_heads, .head_dim = kRow.head_dim,
                       .layers = {f}, .max_positions = kContext, .page_positions = 64, .budgets = budgets});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Appends rows [from, to) of k and v ([kContext][kv_dim] each) to every layer, in blocks of 23.
void AppendRows(KvCache& cache, const std::vector<float>& k, const std::vector<float>& v, int64_t from,
                int64_t to) {
  for (int64_t at = from; at < to; at += 23) {
    const int64_t n = std::min<int64_t>(23, to - at);
    for (int64_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(cache.Append(l, k.data() + at * kRow.elems(), v.data() + at * kRow.elems(), n).ok());
    }
  }
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> Attend(KvCache& cache, const std::vector<float>& q) {
  AttentionState state(kShape, 1);
  const AttentionOptions options{.scale = 0.25f, .kernel = AttentionKernel::kSimd, .threads = 1};
  EXPECT_TRUE(cache.Attend(1, options, q.data(), cache.positions(1) - 1, state).ok());
  std::vector<float> out(q.size());
  cache.FinishAttention(1, state, out.data());
  return out;
}

TEST(KvCacheTruncate, EqualsACacheThatNeverHeldTheDroppedRows) {
  const std::vector<float> k = kvq_test::Random(kContext * kRow.elems(), 1);
  const std::vector<float> v = kvq_test::Random(kContext * kRow.elems(), 2);
  const std::vector<float> k2 = kvq_test::Random(kContext * kRow.elems(), 3);  // what follows the cut
  const std::vector<float> q = kvq_test::Random(kShape.n_heads * kShape.head_dim, 4);
  const kvq_test::TempDir tmp;
  const std::string dir = tmp.path.string();
  int checked = 0;
  for (const FormatDesc* format : Formats()) {
    for (const char* transforms : {"", "+rot"}) {
      Result<KvSpec> spec = ParseKvSpec(std::string(format->name) + transforms);
      ASSERT_TRUE(spec.ok()) << spec.status().message();
      const LayerFormats f = LayerFormats::Both(*spec);
      const std::string name = LayerFormatsName(f);
      for (int64_t cut : {1, 31, 64, 100, 129, 200}) {
        std::unique_ptr<KvCache> cache = MakeCache(f);
        ASSERT_NE(cache, nullptr);
        AppendRows(*cache, k, v, 0, 250);
        const int64_t point = cache->TruncationPoint(cut);
        ASSERT_LE(point, cut) << name;
        ASSERT_EQ(point % f.key->key.rows_per_block, 0) << name;
        // Per-token codecs (one row per block) truncate at any position.
        if (f.key->key.rows_per_block == 1 && f.value->value.rows_per_block == 1) {
          ASSERT_EQ(point, cut) << name;
        }
        ASSERT_TRUE(cache->Truncate(point).ok()) << name;
        ASSERT_EQ(cache->positions(0), point);
        // Then both caches get the same new rows after the cut: k2/v2 from `point` on.
        std::unique_ptr<KvCache> fresh = MakeCache(f);
        std::vector<float> kk(k.begin(), k.begin() + point * kRow.elems());
        kk.insert(kk.end(), k2.begin() + point * kRow.elems(), k2.end());
        AppendRows(*fresh, kk, v, 0, 280);
        AppendRows(*cache, kk, v, point, 280);
        const std::vector<float> a = Attend(*cache, q), b = Attend(*fresh, q);
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << name << " cut " << cut << " at " << i;
        const std::string pa = dir + "/a.snap", pb = dir + "/b.snap";
        ASSERT_TRUE(cache->Save(pa, kModel).ok());
        ASSERT_TRUE(fresh->Save(pb, kModel).ok());
        ASSERT_EQ(FileBytes(pa), FileBytes(pb)) << name << " cut " << cut;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 2 * 6 * 10);
}

TEST(KvCacheTruncate, RefusesWhatItCannotDropExactly) {
  const std::vector<float> k = kvq_test::Random(kContext * kRow.elems(), 5);
  for (const char* text : {"int4+sink4", "int4+res32", "int2-kivi+res64"}) {
    Result<KvSpec> spec = ParseKvSpec(text);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    std::unique_ptr<KvCache> cache = MakeCache(LayerFormats::Both(*spec));
    ASSERT_NE(cache, nullptr);
    AppendRows(*cache, k, k, 0, 100);
    EXPECT_EQ(cache->TruncationPoint(64), 0) << text;
    const Status s = cache->Truncate(64);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find("cannot drop positions"), std::string::npos) << s.message();
    EXPECT_EQ(cache->positions(0), 100) << text;
    EXPECT_TRUE(cache->Truncate(0).ok()) << text;  // emptying is always exact
    EXPECT_EQ(cache->positions(1), 0) << text;
  }
  // A disk master's full pages are in its file: no in-place truncation.
  const kvq_test::TempDir tmp;
  std::unique_ptr<KvCache> disk = MakeCache(LayerFormats::Both(*ParseKvSpec("f16")), {.disk_dir = tmp.path.string()});
  ASSERT_NE(disk, nullptr);
  AppendRows(*disk, k, k, 0, 100);
  EXPECT_EQ(disk->TruncationPoint(50), 0);
  // Past what the cache holds.
  std::unique_ptr<KvCache> host = MakeCache(LayerFormats::Both(*ParseKvSpec("f16")));
  AppendRows(*host, k, k, 0, 100);
  EXPECT_FALSE(host->Truncate(101).ok());
  EXPECT_FALSE(host->Truncate(-1).ok());
  EXPECT_EQ(host->positions(0), 100);
}

}  // namespace
}  // namespace kvq
