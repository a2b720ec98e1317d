// How a prompt is cut into forward blocks changes no bit: for every registered KV format and every
// set of transforms the cache accepts, prefilling a prompt one token at a time, in blocks of 7, of
// 64, or whole leaves the same logits and the same cache contents (every block, residual and sink
// row), and the next decode step agrees too — resident and streamed through a two-page working set.
#include <gtest/gtest.h>

#include <random>

#include "cache/snapshot.h"
#include "model/decoder.h"
#include "model/llama2c.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
constexpr int32_t kPrompt = 100;  // positions: over two pages of 64, with groups completed mid-block

// Every subset of the transforms, as spec suffixes; those CheckKvSpec refuses are skipped by the
// caller (rot with prerope).
std::vector<std::string> TransformSets() {
  const char* parts[] = {"+rot", "+sink4", "+res16", "+prerope"};
  std::vector<std::string> sets;
  for (int mask = 0; mask < 16; ++mask) {
    std::string s;
    for (int i = 0; i < 4; ++i) {
      if (mask & (1 << i)) s += parts[i];
    }
    sets.push_back(s);
  }
  return sets;
}

struct Prefilled {
  std::vector<float> logits;       // [vocab] after the prompt
  std::vector<float> next_logits;  // [vocab] after one more decode step
  SnapshotImage image;             // the cache after the prompt
};

// Prefills the prompt in blocks of `cut` (the last block takes what is left), then decodes one token.
Prefilled PrefillInCuts(DecoderModel& model, const KvCacheConfig& config, const std::vector<int32_t>& prompt,
                        int32_t cut) {
  Prefilled out;
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(config);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  if (!cache.ok()) return out;
  const DecoderConfig& c = model.config();
  out.logits.resize(c.vocab_size);
  out.next_logits.resize(c.vocab_size);
  for (int32_t pos = 0; pos < kPrompt; pos += cut) {
    const int32_t n = std::min(cut, kPrompt - pos);
    const Status s = model.ForwardBlock(prompt.data() + pos, n, pos, **cache, out.logits.data());
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return out;
  }
  const ModelFingerprint fp{.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  Result<SnapshotImage> image = (*cache)->Export(fp);
  EXPECT_TRUE(image.ok()) << image.status().message();
  if (image.ok()) out.image = std::move(image).value();
  const Status s = model.Forward(11, kPrompt, **cache, out.next_logits.data());
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

void ExpectSameCache(const SnapshotImage& a, const SnapshotImage& b, const std::string& what) {
  ASSERT_EQ(a.n_positions, b.n_positions) << what;
  ASSERT_EQ(a.layers.size(), b.layers.size()) << what;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const SnapshotLayer& x = a.layers[l];
    const SnapshotLayer& y = b.layers[l];
    EXPECT_EQ(x.key_bytes, y.key_bytes) << what << " layer " << l;
    EXPECT_EQ(x.value_bytes, y.value_bytes) << what << " layer " << l;
    EXPECT_EQ(x.residual, y.residual) << what << " layer " << l;
    EXPECT_EQ(x.sinks, y.sinks) << what << " layer " << l;
    EXPECT_EQ(x.key_scale, y.key_scale) << what << " layer " << l;
    EXPECT_EQ(x.value_scale, y.value_scale) << what << " layer " << l;
  }
}

TEST(PromptCut, EveryFormatAndTransformGivesTheSameBitsForEveryCut) {
  Result<DecoderWeights> w = LoadLlama2c(kDir + "stories260K.bin");
  ASSERT_TRUE(w.ok()) << w.status().message();
  const DecoderConfig& c = w->config;
  DecoderModel model(*w, 1);  // one model for every run: its activations and attention states are reused
  std::vector<int32_t> prompt(kPrompt);
  std::mt19937 rng(5);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
  const RowShape row{.n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  int32_t specs = 0, grouped = 0;
  for (const FormatDesc* f : Formats()) {
    for (const std::string& transforms : TransformSets()) {
      const std::string name = std::string(f->name) + transforms;
      Result<KvSpec> spec = ParseKvSpec(name);
      ASSERT_TRUE(spec.ok()) << spec.status().message();
      const LayerFormats layer = LayerFormats::Both(*spec);
      if (!CheckKvSpec(layer.Key(), row).ok() || !CheckValueSpec(layer.Value(), row).ok()) continue;
      ++specs;
      grouped += f->key.rows_per_block > 1 || spec->transforms.residual > 0 ? 1 : 0;
      KvCacheConfig config{.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
                           .layers = {layer}, .key_rope = ModelRopeConfig(c), .max_positions = 256,
                           .page_positions = 64};
      const Prefilled one = PrefillInCuts(model, config, prompt, 1);
      for (int32_t cut : {7, 64, kPrompt}) {
        const Prefilled other = PrefillInCuts(model, config, prompt, cut);
        const std::string what = name + " cut " + std::to_string(cut);
        EXPECT_EQ(other.logits, one.logits) << what;
        EXPECT_EQ(other.next_logits, one.next_logits) << what;
        ExpectSameCache(other.image, one.image, what);
      }
      // Streamed through a working set of two pages: the windows come from the slots.
      Result<KvTierPlan> plan = KvCache::Plan(config);
      ASSERT_TRUE(plan.ok()) << plan.status().message();
      config.budgets.device_bytes = 2 * plan->slot_bytes;
      for (int32_t cut : {7}) {
        const Prefilled streamed = PrefillInCuts(model, config, prompt, cut);
        const std::string what = name + " streamed, cut " + std::to_string(cut);
        EXPECT_EQ(streamed.logits, one.logits) << what;
        EXPECT_EQ(streamed.next_logits, one.next_logits) << what;
        ExpectSameCache(streamed.image, one.image, what);
      }
    }
  }
  // Every format with 12 transform sets (16 subsets less the 4 pairing rot with prerope).
  EXPECT_EQ(specs, static_cast<int32_t>(Formats().size()) * 12);
  EXPECT_GT(grouped, 0);
}

}  // namespace
}  // namespace kvq
