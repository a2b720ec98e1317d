// The tiers give the same bits (docs/design.md §4) where a user sees them: the logits of decode steps on
// a tiny synth model whose cache was filled by FillContext (encoded pool + page copies + a partial
// page) are bit-identical with the master in host RAM read in place, streamed through a working set
// of three pages, and on disk — for int4, KIVI int4 (groups, a residual) and fp8 (calibrated).
// RunContextBench reports that, and each tier's bytes, bounds and limiter, and refuses a context
// past the model's unless told.
#include "measure/context_bench.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "kvq/kv_memory.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kModelContext = 2048;
constexpr int64_t kContext = 1800;  // 7 pages of 256 (4 encoded, 3 copied) + 8 positions

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::path(::testing::TempDir()) /
           fmt::format("kvq_context_bench_{}_{}", getpid(), counter++);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
};

// A tiny Q4_0 llama (dim 64, 2 layers, 4 query heads over 2 KV heads of 16), or null (the failure
// recorded): callers ASSERT.
std::unique_ptr<DecoderModel> TinyModel(const TempDir& dir) {
  const SynthSpec spec{.arch = SynthArch::kLlama,
                       .dim = 64,
                       .n_layers = 2,
                       .n_heads = 4,
                       .n_kv_heads = 2,
                       .hidden_dim = 128,
                       .context = kModelContext,
                       .type = "q4_0",
                       .seed = 11};
  const std::string path = (dir.path / "tiny.gguf").string();
  const Status written = WriteSynthModel(
      spec, std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf", path);
  EXPECT_TRUE(written.ok()) << written.message();
  if (!written.ok()) return nullptr;
  Result<LoadedModel> loaded = LoadModel(path, "");
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return nullptr;
  return std::make_unique<DecoderModel>(std::move(loaded->weights), 2);
}

std::unique_ptr<KvCache> Cache(const DecoderConfig& c, const FormatDesc* f, KvBudgets budgets) {
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create({.n_layers = c.n_layers,
                                                            .n_kv_heads = c.n_kv_heads,
                                                            .head_dim = c.head_dim(),
                                                            .layers = {{f, f}},
                                                            .max_positions = kContext + 3,
                                                            .page_positions = 256,
                                                            .budgets = std::move(budgets)});
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  return cache.ok() ? std::move(cache).value() : nullptr;
}

// The logits [3][vocab] of three decode steps (tokens 5, 6, 7) after the fill.
std::vector<std::vector<float>> ThreeSteps(DecoderModel& model, KvCache& cache) {
  std::vector<std::vector<float>> logits(3, std::vector<float>(model.config().vocab_size));
  for (int32_t s = 0; s < 3; ++s) {
    const Status st = model.Forward(5 + s, kContext + s, cache, logits[s].data());
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return logits;
}

bool BitIdentical(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0)
      return false;
  }
  return true;
}

TEST(ContextBench, DecodeLogitsAreBitIdenticalAcrossTiers) {
  TempDir dir;
  const std::unique_ptr<DecoderModel> model = TinyModel(dir);
  ASSERT_NE(model, nullptr);
  const DecoderConfig& c = model->config();
  for (const char* name : {"int4", "int4-kivi", "fp8-e4m3"}) {
    SCOPED_TRACE(name);
    const FormatDesc* f = *FindFormat(name);
    auto host = Cache(c, f, {});
    ASSERT_NE(host, nullptr);
    const int64_t three_pages = 3 * host->plan().slot_bytes;
    auto streamed = Cache(c, f, {.device_bytes = three_pages});
    auto disk = Cache(c, f, {.device_bytes = three_pages, .disk_dir = dir.path.string()});
    ASSERT_NE(streamed, nullptr);
    ASSERT_NE(disk, nullptr);
    ASSERT_EQ(host->plan().device_slots, 0);
    ASSERT_EQ(streamed->plan().device_slots, 3);
    ASSERT_FALSE(disk->plan().disk_file.empty());
    for (KvCache* cache : {host.get(), streamed.get(), disk.get()}) {
      ASSERT_TRUE(FillContext(*cache, kContext, 3, {}, "").ok());
      for (int64_t l = 0; l < c.n_layers; ++l) ASSERT_EQ(cache->positions(l), kContext);
    }
    const std::vector<std::vector<float>> want = ThreeSteps(*model, *host);
    EXPECT_TRUE(BitIdentical(ThreeSteps(*model, *streamed), want))
        << "host master streamed through 3 pages";
    EXPECT_TRUE(BitIdentical(ThreeSteps(*model, *disk), want)) << "disk master";
    EXPECT_GT(streamed->device_peak_bytes(), 0);
    EXPECT_LE(streamed->device_peak_bytes(), streamed->plan().device_bytes);
    // The comparison can fail: another fill (seed) changes the logits.
    auto other = Cache(c, f, {});
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(FillContext(*other, kContext, 4, {}, "").ok());
    EXPECT_FALSE(BitIdentical(ThreeSteps(*model, *other), want));
  }
}

TEST(ContextBench, ReportsBytesPerTierBoundsAndIdentity) {
  TempDir dir;
  const std::unique_ptr<DecoderModel> model = TinyModel(dir);
  ASSERT_NE(model, nullptr);
  const DecoderConfig& c = model->config();
  ContextBenchConfig config{.formats = {*FindFormat("int4"), *FindFormat("int8")},
                            .tiers = {CacheTier::kHost, CacheTier::kStreamed, CacheTier::kDisk},
                            .contexts = {kContext},
                            .reps = 2,
                            .disk_dir = dir.path.string(),
                            .read_bandwidth_bytes = 64 << 20};
  Result<ContextBenchReport> report = RunContextBench(*model, config, {});
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_GT(report->read_gbps, 0);
  EXPECT_GT(report->disk_read_gbps, 0);
  EXPECT_GT(report->weights_ms, 0);
  ASSERT_EQ(report->rows.size(), 6u);
  const KvShape shape{.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  for (size_t i = 0; i < 6; ++i) {
    const ContextBenchRow& r = report->rows[i];
    SCOPED_TRACE(fmt::format("{}/{}", r.format, CacheTierName(r.tier)));
    EXPECT_EQ(r.format, i < 3 ? "int4" : "int8");
    EXPECT_EQ(r.tier, config.tiers[i % 3]);
    EXPECT_TRUE(r.logits_identical);
    EXPECT_EQ(r.compared_with, "host");
    EXPECT_EQ(r.kv_bytes, *KvBytesForContext(**FindFormat(r.format), shape, kContext));
    EXPECT_DOUBLE_EQ(r.attention_macs, 2.0 * kContext * c.n_layers * c.n_heads * c.head_dim());
    EXPECT_LE(r.ms_min, r.ms_median);
    EXPECT_GE(r.ms_max, r.ms_median);
    EXPECT_GT(r.memory_ms, 0);
    EXPECT_GT(r.compute_ms, 0);
    const bool on_disk = r.tier == CacheTier::kDisk;
    EXPECT_EQ(r.disk_ms > 0, on_disk);
    EXPECT_EQ(r.plan.disk_bytes > 0, on_disk);
    EXPECT_EQ(r.plan.device_bytes > 0, r.tier != CacheTier::kHost);
    if (!on_disk) {
      EXPECT_EQ(r.plan.host_bytes, r.plan.total_bytes);
    } else {
      EXPECT_LT(r.plan.host_bytes, r.plan.total_bytes / 2);
    }
    EXPECT_EQ(r.copy_ms > 0, r.tier != CacheTier::kHost);
    if (r.tier == CacheTier::kHost) {
      EXPECT_EQ(r.wait_ms, 0);
    }
    const std::string bound = r.memory_ms > r.compute_ms ? "memory" : "compute";
    const std::string streamed = r.tier == CacheTier::kDisk ? "disk" : "stream";
    EXPECT_EQ(r.limiter, r.copy_ms > std::max(r.memory_ms, r.compute_ms) ? streamed : bound);
  }
  EXPECT_FALSE(fs::exists(report->rows[2].plan.disk_file))
      << "the disk arm's file outlived the run";
}

TEST(ContextBench, ContextPastTheModelNeedsTheFlag) {
  TempDir dir;
  const std::unique_ptr<DecoderModel> model = TinyModel(dir);
  ASSERT_NE(model, nullptr);
  ContextBenchConfig config{.formats = {*FindFormat("int4")},
                            .tiers = {CacheTier::kHost},
                            .contexts = {kModelContext},
                            .reps = 1,
                            .read_bandwidth_bytes = 16 << 20};
  Result<ContextBenchReport> refused = RunContextBench(*model, config, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("past the model's context of 2048"), std::string::npos)
      << refused.status().message();
  config.past_model_context = true;
  Result<ContextBenchReport> allowed = RunContextBench(*model, config, {});
  ASSERT_TRUE(allowed.ok()) << allowed.status().message();
  EXPECT_EQ(allowed->rows.at(0).context, kModelContext);
  EXPECT_FALSE(ParseCacheTier("ram").ok());
  EXPECT_EQ(*ParseCacheTier("disk"), CacheTier::kDisk);
}

}  // namespace
}  // namespace kvq
