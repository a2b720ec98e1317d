// The cache's contract (docs/design.md §4): attention through every tier — resident, host master +
// a device working set of a few pages, disk master + working set — gives the same bits as one
// window over the same rows, for every format (KIVI with an incomplete last group included);
// the working set never holds more than its budget, even at 100x its size in context; the disk
// tier serves a cache larger than the host budget and cleans up; impossible budgets are refused
// at creation; snapshots restore a cache that continues exactly as the uninterrupted one.
#include "test_util/random_rows.h"
#include "kvq/kv_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "cache/page_copies.h"
#include "cache/snapshot.h"
#include "formats/row_sequence.h"
#include "formats/transforms/hadamard.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

using kvq_test::TempDir;

using kvq_test::Random;

constexpr AttentionShape kShape{.n_heads = 8, .n_kv_heads = 2, .head_dim = 16};
constexpr RowShape kRow{.n_kv_heads = 2, .head_dim = 16};

AttentionOptions Options(AttentionKernel kernel) {
  return {.scale = 0.25f, .kernel = kernel, .threads = 1};
}

std::unique_ptr<KvCache> MakeCache(LayerFormats f, int64_t layers, int64_t max_positions,
                                   KvBudgets budgets, int32_t page = 64) {
  Result<std::unique_ptr<KvCache>> c = KvCache::Create({.n_layers = layers,
                                                        .n_kv_heads = kRow.n_kv_heads,
                                                        .head_dim = kRow.head_dim,
                                                        .layers = {f},
                                                        .max_positions = max_positions,
                                                        .page_positions = page,
                                                        .budgets = budgets});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;  // null: the caller ASSERTs, no dereference
}

// out of attention over `cache` layer 0 for tokens at the last n_tokens positions.
std::vector<float> AttendAll(KvCache& cache, const std::vector<float>& q, int32_t n_tokens,
                             AttentionKernel kernel, int64_t layer = 0) {
  AttentionState state(kShape, n_tokens);
  const Status s = cache.Attend(layer, Options(kernel), q.data(), cache.positions(layer) - n_tokens, state);
  EXPECT_TRUE(s.ok()) << s.message();
  std::vector<float> out(q.size());
  FinishAttention(state, out.data());
  return out;
}

// Uneven append blocks, as a prefill and then decode steps would write (the first block is what
// fp8 calibrates on, so the oracle and the caches must see the same blocks).
template <class Fn>
void InBlocks(int64_t n, Fn append) {
  for (int64_t done = 0, step = 5; done < n; done += step, step = step * 3 % 97 + 1) {
    append(done, std::min(step, n - done));
  }
}

// The oracle: the same rows in RowSequences, attended as one window.
std::vector<float> OneWindow(LayerFormats f, const std::vector<float>& k, const std::vector<float>& v,
                             int64_t n, const std::vector<float>& q, int32_t n_tokens, AttentionKernel kernel) {
  RowSequence ks(f.key->key, kRow), vs(f.value->value, kRow);
  InBlocks(n, [&](int64_t at, int64_t m) {
    ks.Append(k.data() + at * kRow.elems(), m);
    vs.Append(v.data() + at * kRow.elems(), m);
  });
  AttentionState state(kShape, n_tokens);
  AttendWindow(Options(kernel), q.data(), n - n_tokens, {.first_position = 0, .k = ks.View(0, n), .v = vs.View(0, n)}, state);
  std::vector<float> out(q.size());
  FinishAttention(state, out.data());
  return out;
}

std::vector<LayerFormats> FormatPairs() {
  std::vector<LayerFormats> pairs;
  for (const FormatDesc* f : Formats()) pairs.push_back({f, f});
  pairs.push_back({*FindFormat("int4-kivi"), *FindFormat("int8")});   // K and V differ
  pairs.push_back({*FindFormat("fp8-e4m3"), *FindFormat("fp4-e2m1")});
  return pairs;
}

TEST(KvCache, EveryTierIsBitIdenticalToOneWindow) {
  const int64_t n = 300;  // 4.7 pages of 64; 300 % 32 = 12: KIVI's last key group is incomplete
  const std::vector<float> k = Random(n * kRow.elems(), 1), v = Random(n * kRow.elems(), 2);
  for (LayerFormats f : FormatPairs()) {
    for (int32_t tokens : {1, 3}) {
      const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 3);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        SCOPED_TRACE(::testing::Message() << f.key->name << "/" << f.value->name << " tokens " << tokens
                                          << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
        const std::vector<float> want = OneWindow(f, k, v, n, q, tokens, kernel);
        TempDir dir;
        // Page bytes for this pair, to size a working set of three pages.
        auto resident = MakeCache(f, 1, 1000, {});
        ASSERT_NE(resident, nullptr);
        const int64_t three_pages = 3 * resident->plan().slot_bytes;
        auto host_streamed = MakeCache(f, 1, 1000, {.device_bytes = three_pages});
        auto disk_streamed = MakeCache(f, 1, 1000, {.device_bytes = three_pages, .disk_dir = dir.path.string()});
        ASSERT_NE(host_streamed, nullptr);
        ASSERT_NE(disk_streamed, nullptr);
        for (KvCache* c : {resident.get(), host_streamed.get(), disk_streamed.get()}) {
          InBlocks(n, [&](int64_t at, int64_t m) {
            ASSERT_TRUE(c->Append(0, k.data() + at * kRow.elems(), v.data() + at * kRow.elems(), m).ok());
          });
          ASSERT_EQ(AttendAll(*c, q, tokens, kernel), want);
        }
        EXPECT_EQ(resident->plan().device_slots, 0);
        EXPECT_GE(host_streamed->plan().device_slots, 2);
        EXPECT_FALSE(disk_streamed->plan().disk_file.empty());
      }
    }
  }
}

// One layer per registered format, layer l holding K in format l and V in format l + 1 (mod the
// count), so every format sits beside others as K and as V, streamed through one working set.
TEST(KvCache, LayersMayUseDifferentFormats) {
  const int64_t n = 130;
  const std::span<const FormatDesc* const> all = Formats();
  const int64_t n_layers = static_cast<int64_t>(all.size());
  ASSERT_GE(n_layers, 2);
  std::vector<LayerFormats> layers;
  for (int64_t l = 0; l < n_layers; ++l) layers.push_back({all[l], all[(l + 1) % n_layers]});
  TempDir dir;
  Result<std::unique_ptr<KvCache>> c = KvCache::Create(
      {.n_layers = n_layers, .n_kv_heads = 2, .head_dim = 16, .layers = layers,
       .max_positions = 200, .page_positions = 32,
       .budgets = {.device_bytes = 1 << 16, .disk_dir = dir.path.string()}});
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::vector<float> q = Random(kShape.n_heads * kShape.head_dim, 9);
  for (int64_t l = 0; l < n_layers; ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l << ": K " << layers[l].key->name << ", V "
                                      << layers[l].value->name);
    const std::vector<float> k = Random(n * kRow.elems(), 10 + l), v = Random(n * kRow.elems(), 20 + l);
    InBlocks(n, [&](int64_t at, int64_t m) {
      ASSERT_TRUE((*c)->Append(l, k.data() + at * kRow.elems(), v.data() + at * kRow.elems(), m).ok());
    });
    const LayerFormats f = (*c)->config().layers[l];
    EXPECT_EQ(AttendAll(**c, q, 1, AttentionKernel::kSimd, l), OneWindow(f, k, v, n, q, 1, AttentionKernel::kSimd));
  }
}

TEST(KvCache, WorkingSetStaysWithinBudgetAt100xContext) {
  const LayerFormats f{*FindFormat("int4"), *FindFormat("int4")};
  auto probe = MakeCache(f, 1, 100, {}, 32);
  ASSERT_NE(probe, nullptr);
  const int64_t budget = 3 * probe->plan().slot_bytes + 64;  // room for three 32-position pages
  auto c = MakeCache(f, 1, 20000, {.device_bytes = budget}, 32);
  ASSERT_NE(c, nullptr);
  const int64_t budget_positions = c->plan().device_positions;
  const int64_t n = 100 * budget_positions;
  ASSERT_LE(n, 20000);
  const std::vector<float> k = Random(n * kRow.elems(), 4), v = Random(n * kRow.elems(), 5);
  InBlocks(n, [&](int64_t at, int64_t m) {
    ASSERT_TRUE(c->Append(0, k.data() + at * kRow.elems(), v.data() + at * kRow.elems(), m).ok());
  });
  const std::vector<float> q = Random(kShape.n_heads * kShape.head_dim, 6);
  EXPECT_EQ(AttendAll(*c, q, 1, AttentionKernel::kSimd), OneWindow(f, k, v, n, q, 1, AttentionKernel::kSimd));
  EXPECT_GT(c->device_peak_bytes(), 0);
  EXPECT_LE(c->device_peak_bytes(), budget);
  EXPECT_LE(c->plan().device_bytes, budget);
  int64_t kv_bytes = 0;
  for (const Codec* codec : {&f.key->key, &f.value->value}) kv_bytes += BytesForRows(*codec, kRow, n);
  EXPECT_GE(kv_bytes, 90 * budget);  // the context really is ~100x what the device holds
}

TEST(KvCache, DiskTierServesMoreThanTheHostBudgetAndCleansUp) {
  const LayerFormats f{*FindFormat("f32"), *FindFormat("f32")};
  TempDir dir;
  const int64_t n = 1000;
  const std::vector<float> k = Random(n * kRow.elems(), 7), v = Random(n * kRow.elems(), 8);
  const std::vector<float> q = Random(kShape.n_heads * kShape.head_dim, 9);
  std::string file;
  {
    auto c = MakeCache(f, 1, n, {.host_bytes = 64 << 10, .disk_dir = dir.path.string()});
    ASSERT_NE(c, nullptr);
    file = c->plan().disk_file;
    ASSERT_TRUE(fs::exists(file));
    InBlocks(n, [&](int64_t at, int64_t m) {
      ASSERT_TRUE(c->Append(0, k.data() + at * kRow.elems(), v.data() + at * kRow.elems(), m).ok());
    });
    EXPECT_GT(fs::file_size(file), uint64_t{64 << 10});  // more than the host may hold
    EXPECT_EQ(AttendAll(*c, q, 1, AttentionKernel::kSimd), OneWindow(f, k, v, n, q, 1, AttentionKernel::kSimd));
    // Without a disk, the same host budget is refused at creation.
    Result<std::unique_ptr<KvCache>> no_disk = KvCache::Create(
        {.n_layers = 1, .n_kv_heads = 2, .head_dim = 16, .layers = {f}, .max_positions = n,
         .page_positions = 64, .budgets = {.host_bytes = 64 << 10}});
    ASSERT_FALSE(no_disk.ok());
    EXPECT_NE(no_disk.status().message().find("--kv-disk"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(file)) << "the disk tier's file outlived its cache";
  {
    auto kept = MakeCache(f, 1, n, {.disk_dir = dir.path.string(), .keep_disk_file = true});
    ASSERT_NE(kept, nullptr);
    file = kept->plan().disk_file;
  }
  EXPECT_TRUE(fs::exists(file)) << "keep_disk_file was ignored";
}

// Page copies (how kvq bench context fills a million positions): the same bits as appending the
// copied pages' rows again, on the host and the disk tier, for a plain, a grouped + mixed and a
// calibrated format; and refused off a page boundary, from a page that is not there, or past the
// context.
TEST(KvCache, PageCopiesAreTheSameBitsAsAppendingTheRowsAgain) {
  constexpr int64_t kPage = 64, kPool = 2 * kPage, kTail = 10;
  const std::vector<float> k = Random(kPool * kRow.elems(), 21),
                           v = Random(kPool * kRow.elems(), 22);
  const std::vector<float> q = Random(kShape.n_heads * kShape.head_dim, 23);
  const std::vector<LayerFormats> pairs = {{*FindFormat("int4"), *FindFormat("int4")},
                                           {*FindFormat("int4-kivi"), *FindFormat("int8")},
                                           {*FindFormat("fp8-e4m3"), *FindFormat("fp8-e4m3")}};
  for (LayerFormats f : pairs) {
    for (bool disk : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << f.key->name << "/" << f.value->name << (disk ? " disk" : " host"));
      TempDir dir;
      const KvBudgets budgets{.disk_dir = disk ? dir.path.string() : ""};
      auto copied = MakeCache(f, 1, 1000, budgets), appended = MakeCache(f, 1, 1000, budgets);
      ASSERT_NE(copied, nullptr);
      ASSERT_NE(appended, nullptr);
      // copied: the pool (pages 0, 1), then 3 copies (pages 0, 1, 0), then 10 rows by Append.
      ASSERT_TRUE(copied->Append(0, k.data(), v.data(), kPool).ok());
      ASSERT_TRUE(AppendPageCopies(*copied, 0, 0, 2, 3).ok());
      ASSERT_TRUE(copied->Append(0, k.data(), v.data(), kTail).ok());
      // appended: the same rows, every one encoded (the pool first, as the block fp8 calibrates
      // on).
      ASSERT_TRUE(appended->Append(0, k.data(), v.data(), kPool).ok());
      for (int64_t page : {0, 1, 0}) {
        const int64_t at = page * kPage * kRow.elems();
        ASSERT_TRUE(appended->Append(0, k.data() + at, v.data() + at, kPage).ok());
      }
      ASSERT_TRUE(appended->Append(0, k.data(), v.data(), kTail).ok());
      ASSERT_EQ(copied->positions(0), 5 * kPage + kTail);
      ASSERT_EQ(appended->positions(0), copied->positions(0));
      EXPECT_EQ(AttendAll(*copied, q, 1, AttentionKernel::kSimd),
                AttendAll(*appended, q, 1, AttentionKernel::kSimd));

      // Refusals: off a page boundary (10 rows into page 5), a page that is not there, the context.
      Status s = AppendPageCopies(*copied, 0, 0, 1, 1);
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("page boundary"), std::string::npos) << s.message();
      auto fresh = MakeCache(f, 1, 4 * kPage, budgets);
      ASSERT_NE(fresh, nullptr);
      ASSERT_TRUE(fresh->Append(0, k.data(), v.data(), kPage).ok());
      s = AppendPageCopies(*fresh, 0, 0, 2, 1);
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("are not among layer 0's 1 full pages"), std::string::npos)
          << s.message();
      s = AppendPageCopies(*fresh, 0, 0, 1, 4);
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find("would pass the context"), std::string::npos) << s.message();
      EXPECT_EQ(fresh->positions(0), kPage) << "a refused copy appended something";
      ASSERT_TRUE(AppendPageCopies(*fresh, 0, 0, 1, 3).ok());
      EXPECT_EQ(fresh->positions(0), 4 * kPage);
    }
  }
}

// Pages encoded elsewhere (how the WebGPU path's encoders write behind to the master): for every
// registered format without a calibrated codec, pages built here with the codecs' encode_block in
// LayerPageLayout's layout, appended whole, then rows by Append: the master's bytes, page by page,
// and attention equal a cache that appended every row; refused off a page boundary, past the
// context, and for a spec with a transform.
TEST(KvCache, EncodedPagesAreTheSameBitsAsAppendingTheirRows) {
  constexpr int64_t kPage = 64, kPages = 3, kTail = 10, n = kPages * kPage + kTail;
  const int64_t elems = kRow.elems();
  const std::vector<float> k = Random(n * elems, 31), v = Random(n * elems, 32);
  const std::vector<float> q = Random(kShape.n_heads * kShape.head_dim, 33);
  int formats = 0;
  for (const FormatDesc* f : Formats()) {
    if (f->key.calibrated || f->value.calibrated) continue;
    ++formats;
    SCOPED_TRACE(f->name);
    auto encoded = MakeCache({f, f}, 1, n, {}), appended = MakeCache({f, f}, 1, n, {});
    ASSERT_NE(encoded, nullptr);
    ASSERT_NE(appended, nullptr);
    const KvCache::PageLayout layout = encoded->LayerPageLayout(0);
    ASSERT_GT(layout.page_bytes, layout.value_offset);
    std::vector<uint8_t> pages(kPages * layout.page_bytes, 0);  // [kPages][page_bytes]
    const CodecArgs args{.shape = kRow};
    for (int which = 0; which < 2; ++which) {
      const Codec& codec = which == 0 ? f->key : f->value;
      const std::vector<float>& x = which == 0 ? k : v;
      const int32_t g = codec.rows_per_block;
      for (int64_t first = 0; first < kPages * kPage; first += g) {
        uint8_t* page = pages.data() + (first / kPage) * layout.page_bytes +
                        (which == 0 ? 0 : layout.value_offset);
        codec.encode_block(x.data() + first * elems,
                           page + (first % kPage) / g * codec.block_bytes(kRow), args);
      }
    }
    ASSERT_TRUE(encoded->AppendEncodedPages(0, pages.data(), kPages).ok());
    ASSERT_TRUE(
        encoded
            ->Append(0, k.data() + kPages * kPage * elems, v.data() + kPages * kPage * elems, kTail)
            .ok());
    ASSERT_TRUE(appended->Append(0, k.data(), v.data(), n).ok());
    ASSERT_EQ(encoded->positions(0), n);
    for (int64_t page = 0; page <= kPages; ++page) {
      std::vector<uint8_t> a(layout.page_bytes), b(layout.page_bytes);
      ASSERT_TRUE(encoded->ReadPage(0, page, a.data()).ok());
      ASSERT_TRUE(appended->ReadPage(0, page, b.data()).ok());
      EXPECT_TRUE(a == b) << "page " << page << " differs";
    }
    EXPECT_EQ(AttendAll(*encoded, q, 1, AttentionKernel::kSimd),
              AttendAll(*appended, q, 1, AttentionKernel::kSimd));
    // Refusals: 10 rows into a page; past the context; nothing appended by either.
    Status s = encoded->AppendEncodedPages(0, pages.data(), 1);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("page boundary"), std::string::npos) << s.message();
    auto small = MakeCache({f, f}, 1, 2 * kPage, {});
    ASSERT_NE(small, nullptr);
    s = small->AppendEncodedPages(0, pages.data(), 3);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("would pass the context"), std::string::npos) << s.message();
    EXPECT_EQ(small->positions(0), 0);
    EXPECT_FALSE(small->ReadPage(0, 0, pages.data()).ok()) << "a page of an empty layer was read";
  }
  EXPECT_GE(formats, 8);
  // rot: pages encoding the rows rotated with the cache's signs (the WebGPU resident path's) are
  // Append's pages of the rows themselves.
  const Result<KvSpec> rot = ParseKvSpec("int4+rot");
  ASSERT_TRUE(rot.ok());
  auto rotated = MakeCache(LayerFormats::Both(*rot), 1, n, {}), rot_appended = MakeCache(LayerFormats::Both(*rot), 1, n, {});
  ASSERT_NE(rotated, nullptr);
  ASSERT_NE(rot_appended, nullptr);
  const KvCache::PageLayout rot_layout = rotated->LayerPageLayout(0);
  std::vector<uint8_t> rot_pages(kPages * rot_layout.page_bytes, 0);  // [kPages][page_bytes]
  const std::vector<float> signs = RotationSigns(kDefaultRotationSeed, kRow.head_dim);
  for (int which = 0; which < 2; ++which) {
    std::vector<float> x = which == 0 ? k : v;  // [n][n_kv_heads][head_dim], rotated per head
    RotateHeads(signs.data(), kRow.head_dim, n * kRow.n_kv_heads, x.data());
    const Codec& codec = which == 0 ? rot->format->key : rot->format->value;
    for (int64_t row = 0; row < kPages * kPage; ++row) {
      codec.encode_block(x.data() + row * elems, rot_pages.data() + (row / kPage) * rot_layout.page_bytes +
                                                     (which == 0 ? 0 : rot_layout.value_offset) +
                                                     (row % kPage) * codec.block_bytes(kRow),
                         {.shape = kRow});
    }
  }
  ASSERT_EQ(rot->format->key.rows_per_block, 1);
  ASSERT_TRUE(rotated->AppendEncodedPages(0, rot_pages.data(), kPages).ok());
  ASSERT_TRUE(rot_appended->Append(0, k.data(), v.data(), kPages * kPage).ok());
  for (int64_t page = 0; page < kPages; ++page) {
    std::vector<uint8_t> a(rot_layout.page_bytes), b(rot_layout.page_bytes);
    ASSERT_TRUE(rotated->ReadPage(0, page, a.data()).ok());
    ASSERT_TRUE(rot_appended->ReadPage(0, page, b.data()).ok());
    EXPECT_TRUE(a == b) << "int4+rot page " << page << " differs";
  }
  // prerope (the WebGPU resident path's): pages of the keys before RoPE, KIVI's groups among them,
  // are Append's pages of the same rows, and attention (roping them as it reads) equals its.
  const Result<KvSpec> pre = ParseKvSpec("int4-kivi+prerope");
  ASSERT_TRUE(pre.ok());
  const RopeConfig rope{.theta = 10000.0f, .pairing = RopePairing::kHalves};
  std::unique_ptr<KvCache> pre_caches[2];  // [0] pages appended, [1] rows appended
  for (std::unique_ptr<KvCache>& c : pre_caches) {
    Result<std::unique_ptr<KvCache>> made = KvCache::Create({.n_layers = 1, .n_kv_heads = kRow.n_kv_heads,
                                                             .head_dim = kRow.head_dim, .layers = {LayerFormats::Both(*pre)}, .key_rope = rope,
                                                             .max_positions = n, .page_positions = kPage});
    ASSERT_TRUE(made.ok()) << made.status().message();
    c = std::move(made).value();
  }
  const KvCache::PageLayout pre_layout = pre_caches[0]->LayerPageLayout(0);
  std::vector<uint8_t> pre_pages(kPages * pre_layout.page_bytes, 0);  // [kPages][page_bytes]
  for (int which = 0; which < 2; ++which) {
    const Codec& codec = which == 0 ? pre->format->key : pre->format->value;
    const std::vector<float>& x = which == 0 ? k : v;  // as given: the keys before RoPE
    const int32_t g = codec.rows_per_block;
    for (int64_t first = 0; first < kPages * kPage; first += g) {
      codec.encode_block(x.data() + first * elems, pre_pages.data() + (first / kPage) * pre_layout.page_bytes +
                                                       (which == 0 ? 0 : pre_layout.value_offset) +
                                                       (first % kPage) / g * codec.block_bytes(kRow),
                         {.shape = kRow});
    }
  }
  ASSERT_EQ(pre->format->key.rows_per_block, 32);
  ASSERT_TRUE(pre_caches[0]->AppendEncodedPages(0, pre_pages.data(), kPages).ok());
  ASSERT_TRUE(pre_caches[1]->Append(0, k.data(), v.data(), kPages * kPage).ok());
  for (int64_t page = 0; page < kPages; ++page) {
    std::vector<uint8_t> a(pre_layout.page_bytes), b(pre_layout.page_bytes);
    ASSERT_TRUE(pre_caches[0]->ReadPage(0, page, a.data()).ok());
    ASSERT_TRUE(pre_caches[1]->ReadPage(0, page, b.data()).ok());
    EXPECT_TRUE(a == b) << "int4-kivi+prerope page " << page << " differs";
  }
  for (std::unique_ptr<KvCache>& c : pre_caches) {
    ASSERT_TRUE(c->Append(0, k.data() + kPages * kPage * elems, v.data() + kPages * kPage * elems, kTail).ok());
  }
  EXPECT_EQ(AttendAll(*pre_caches[0], q, 1, AttentionKernel::kScalar),
            AttendAll(*pre_caches[1], q, 1, AttentionKernel::kScalar));
  // Transforms whose rows the bytes do not carry are refused.
  const Result<KvSpec> sink = ParseKvSpec("int4+sink4");
  ASSERT_TRUE(sink.ok());
  auto sunk = MakeCache(LayerFormats::Both(*sink), 1, n, {});
  ASSERT_NE(sunk, nullptr);
  std::vector<uint8_t> page(sunk->LayerPageLayout(0).page_bytes, 0);
  const Status s = sunk->AppendEncodedPages(0, page.data(), 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("without transforms but rot and prerope"), std::string::npos) << s.message();
  EXPECT_EQ(sunk->positions(0), 0);
}

// A disk master that loses bytes (here: truncated under the cache) gives an error naming the file,
// not garbage attention.
TEST(KvCache, ShortDiskReadIsAnErrorNamingTheFile) {
  const LayerFormats f{*FindFormat("int8"), *FindFormat("int8")};
  TempDir dir;
  auto c = MakeCache(f, 1, 1000, {.disk_dir = dir.path.string()});
  ASSERT_NE(c, nullptr);
  const std::vector<float> x = Random(300 * kRow.elems(), 3);
  ASSERT_TRUE(c->Append(0, x.data(), x.data(), 300).ok());  // 4 full pages written out
  fs::resize_file(c->plan().disk_file, 100);
  const std::vector<float> q = Random(kShape.n_heads * kShape.head_dim, 4);
  AttentionState state(kShape, 1);
  const Status s = c->Attend(0, Options(AttentionKernel::kSimd), q.data(), 299, state);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(c->plan().disk_file), std::string::npos) << s.message();
}

TEST(KvCache, ImpossibleConfigurationsAreRefusedAtCreation) {
  const LayerFormats f16{*FindFormat("f16"), *FindFormat("f16")};
  const auto why = [](const KvCacheConfig& c) {
    Result<std::unique_ptr<KvCache>> r = KvCache::Create(c);
    return r.ok() ? std::string("(accepted)") : r.status().message();
  };
  const KvCacheConfig ok{.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .layers = {f16}, .max_positions = 4096, .page_positions = 64};
  EXPECT_EQ(why(ok), "(accepted)");
  KvCacheConfig c = ok;
  c.budgets.device_bytes = 1000;  // less than two pages
  EXPECT_NE(why(c).find("--kv-device-budget"), std::string::npos) << why(c);
  c = ok;
  c.budgets.host_bytes = 1 << 19;  // 4,096 positions × 2 layers need 1 MiB
  EXPECT_NE(why(c).find("--kv-host-budget"), std::string::npos) << why(c);
  c = ok;
  c.budgets.disk_dir = "/nonexistent/kvq";
  EXPECT_NE(why(c).find("/nonexistent/kvq"), std::string::npos) << why(c);
  c = ok;
  c.page_positions = 48;
  EXPECT_NE(why(c).find("multiple of 32"), std::string::npos) << why(c);
  c = ok;
  c.max_positions = 0;
  EXPECT_NE(why(c).find("positive"), std::string::npos) << why(c);
  c = ok;
  c.head_dim = 12;
  c.layers = {{*FindFormat("int4-kivi"), *FindFormat("int4-kivi")}};
  EXPECT_NE(why(c).find("head_dim"), std::string::npos) << why(c);
  c = ok;
  c.max_positions = int64_t{1} << 62;
  EXPECT_NE(why(c).find("64-bit"), std::string::npos) << why(c);
  // Appending past the context is refused too.
  auto cache = MakeCache(f16, 1, 10, {});
  ASSERT_NE(cache, nullptr);
  const std::vector<float> x = Random(11 * kRow.elems(), 1);
  EXPECT_FALSE(cache->Append(0, x.data(), x.data(), 11).ok());
  EXPECT_EQ(cache->positions(0), 0);
}

// A hybrid's fixed state is host memory the tiers count: host_bytes = the KV at full context plus
// the state (or, with a disk master, the pages being filled plus the state), and a host budget
// that holds the KV but not the state too is refused, naming it.
TEST(KvCache, TierPlanCountsTheFixedStateInHostMemory) {
  const LayerFormats f16{*FindFormat("f16"), *FindFormat("f16")};
  KvCacheConfig c{.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .layers = {f16}, .max_positions = 4096,
                  .page_positions = 64};
  const Result<KvTierPlan> plain = KvCache::Plan(c);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->total_bytes, 2 * 4096 * 2 * 32 * 2);  // layers × positions × K,V × numbers × 2 B
  EXPECT_EQ(plain->state_bytes, 0);
  EXPECT_EQ(plain->host_bytes, plain->total_bytes);
  c.state_floats = 1000;
  const Result<KvTierPlan> hybrid = KvCache::Plan(c);
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().message();
  EXPECT_EQ(hybrid->total_bytes, plain->total_bytes);
  EXPECT_EQ(hybrid->state_bytes, 4000);
  EXPECT_EQ(hybrid->host_bytes, plain->total_bytes + 4000);
  EXPECT_NE(hybrid->Describe().find("fixed recurrent state of 3.91 KiB"), std::string::npos) << hybrid->Describe();
  c.budgets.host_bytes = plain->total_bytes + 3999;
  Result<std::unique_ptr<KvCache>> refused = KvCache::Create(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("with the model's fixed recurrent state, 3.91 KiB"), std::string::npos)
      << refused.status().message();
  c.budgets.host_bytes = plain->total_bytes + 4000;
  EXPECT_TRUE(KvCache::Create(c).ok());
  // A disk master: the host holds the pages being filled and the state.
  c.budgets = {.disk_dir = ::testing::TempDir()};
  c.state_floats = 0;
  const Result<KvTierPlan> disk = KvCache::Plan(c);
  c.state_floats = 1000;
  const Result<KvTierPlan> disk_hybrid = KvCache::Plan(c);
  ASSERT_TRUE(disk.ok() && disk_hybrid.ok());
  EXPECT_EQ(disk_hybrid->host_bytes, disk->host_bytes + 4000);
}

// Truncate with a saved state (a speculative verifier's rollback on a hybrid): where a twin cache
// without a state could drop to n in place, the rows past n go and the state becomes the saved one
// exactly; elsewhere (a grouped codec outside the last Append's rows) it is refused, changing
// nothing. A cache without a state, a state of another size and n = 0 are refused; plain Truncate
// of a state cache still refuses to roll back.
TEST(KvCache, TruncateWithASavedStateRestoresIt) {
  int restored_count = 0;
  for (const LayerFormats& f : FormatPairs()) {
    SCOPED_TRACE(::testing::Message() << f.key->name << "/" << f.value->name);
    KvCacheConfig c{.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .layers = {f}, .max_positions = 256,
                    .page_positions = 64, .state_floats = 10};
    Result<std::unique_ptr<KvCache>> made = KvCache::Create(c);
    c.state_floats = 0;
    Result<std::unique_ptr<KvCache>> twin = KvCache::Create(c);
    ASSERT_TRUE(made.ok() && twin.ok());
    KvCache& cache = **made;
    const std::vector<float> x = Random(50 * kRow.elems(), 7);
    for (int l = 0; l < 2; ++l) {
      ASSERT_TRUE(cache.Append(l, x.data(), x.data(), 45).ok());
      ASSERT_TRUE((*twin)->Append(l, x.data(), x.data(), 45).ok());
    }
    std::vector<float> saved(10);
    for (int i = 0; i < 10; ++i) saved[i] = 0.5f + i;
    std::copy(saved.begin(), saved.end(), cache.state());
    for (int l = 0; l < 2; ++l) {
      ASSERT_TRUE(cache.Append(l, x.data(), x.data(), 5).ok());
      ASSERT_TRUE((*twin)->Append(l, x.data(), x.data(), 5).ok());
    }
    for (int i = 0; i < 10; ++i) cache.state()[i] = -1.0f;  // what the 5 rows folded in
    EXPECT_FALSE(cache.Truncate(45).ok());                    // no saved state: cannot roll back
    EXPECT_FALSE(cache.Truncate(45, std::vector<float>(9)).ok());
    EXPECT_FALSE(cache.Truncate(0, saved).ok());
    EXPECT_EQ(cache.positions(0), 50);
    const Status restored = cache.Truncate(45, saved);
    if ((*twin)->TruncationPoint(45) == 45) {
      ASSERT_TRUE(restored.ok()) << restored.message();
      EXPECT_EQ(cache.positions(0), 45);
      EXPECT_EQ(cache.positions(1), 45);
      EXPECT_EQ(std::vector<float>(cache.state(), cache.state() + 10), saved);
      ++restored_count;
    } else {
      EXPECT_FALSE(restored.ok());
      EXPECT_EQ(cache.positions(0), 50);
      EXPECT_EQ(cache.state()[0], -1.0f);
    }
  }
  EXPECT_GT(restored_count, 0);
  auto plain = MakeCache({*FindFormat("f16"), *FindFormat("f16")}, 1, 10, {});
  ASSERT_NE(plain, nullptr);
  const Status refused = plain->Truncate(0, std::vector<float>(3));
  EXPECT_NE(refused.message().find("holds none"), std::string::npos) << refused.message();
}

// Save after a prefix, load into a fresh cache, continue: the same bits as never stopping.
TEST(KvCacheSnapshot, SaveLoadContinueEqualsUninterrupted) {
  const ModelFingerprint model{.n_layers = 2, .n_kv_heads = 2, .head_dim = 16, .weights_hash = 0x1234};
  for (LayerFormats f : FormatPairs()) {
    SCOPED_TRACE(::testing::Message() << f.key->name << "/" << f.value->name);
    TempDir dir;
    const std::string path = (dir.path / "prefix.kvq").string();
    const int64_t prefix = 77, more = 50;  // 77 % 32 = 13: a KIVI residual in the snapshot
    std::vector<std::vector<float>> k, v;
    for (int l = 0; l < 2; ++l) {
      k.push_back(Random((prefix + more) * kRow.elems(), 30 + l));
      v.push_back(Random((prefix + more) * kRow.elems(), 40 + l));
    }
    auto whole = MakeCache(f, 2, 500, {});
    auto first = MakeCache(f, 2, 500, {});
    auto second = MakeCache(f, 2, 500, {.device_bytes = 1 << 15, .disk_dir = dir.path.string()});
    for (int l = 0; l < 2; ++l) {  // the uninterrupted run: the prefix's prefill, then more
      ASSERT_TRUE(whole->Append(l, k[l].data(), v[l].data(), prefix).ok());
      ASSERT_TRUE(whole->Append(l, k[l].data() + prefix * kRow.elems(), v[l].data() + prefix * kRow.elems(), more).ok());
      ASSERT_TRUE(first->Append(l, k[l].data(), v[l].data(), prefix).ok());
    }
    ASSERT_TRUE(first->Save(path, model).ok());
    const Result<std::vector<int32_t>> loaded = second->Load(path, model);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    for (int l = 0; l < 2; ++l) {
      ASSERT_TRUE(second->Append(l, k[l].data() + prefix * kRow.elems(), v[l].data() + prefix * kRow.elems(), more).ok());
    }
    const std::vector<float> q = Random(2 * kShape.n_heads * kShape.head_dim, 50);
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(AttendAll(*second, q, 2, AttentionKernel::kSimd, l), AttendAll(*whole, q, 2, AttentionKernel::kSimd, l));
    }
  }
}

TEST(KvCacheSnapshot, MismatchesAreRefusedAndNothingIsLoaded) {
  const ModelFingerprint model{.n_layers = 1, .n_kv_heads = 2, .head_dim = 16, .weights_hash = 42};
  const LayerFormats int4{*FindFormat("int4"), *FindFormat("int4")};
  TempDir dir;
  const std::string path = (dir.path / "p.kvq").string();
  auto saved = MakeCache(int4, 1, 100, {});
  const std::vector<float> x = Random(40 * kRow.elems(), 1);
  ASSERT_TRUE(saved->Append(0, x.data(), x.data(), 40).ok());
  ASSERT_TRUE(saved->Save(path, model).ok());

  auto other_format = MakeCache({*FindFormat("int8"), *FindFormat("int8")}, 1, 100, {});
  ASSERT_TRUE(other_format->Append(0, x.data(), x.data(), 5).ok());
  const Result<std::vector<int32_t>> s1 = other_format->Load(path, model);
  EXPECT_FALSE(s1.ok());
  EXPECT_NE(s1.status().message().find(path), std::string::npos) << s1.status().message();
  EXPECT_EQ(other_format->positions(0), 5) << "a refused snapshot changed the cache";

  auto same_format = MakeCache(int4, 1, 100, {});
  ModelFingerprint another = model;
  another.weights_hash = 43;
  EXPECT_FALSE(same_format->Load(path, another).ok());
  EXPECT_FALSE(same_format->Load((dir.path / "missing.kvq").string(), model).ok());
  EXPECT_EQ(same_format->positions(0), 0);
  // A context too small for the snapshot is refused, not truncated.
  auto small = MakeCache(int4, 1, 39, {});
  EXPECT_FALSE(small->Load(path, model).ok());
  EXPECT_EQ(small->positions(0), 0);
}

}  // namespace
}  // namespace kvq
