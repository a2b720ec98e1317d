// The model with "prerope" key specs (ForwardBlock appends keys before RoPE; attention ropes them
// as it reads them): with f32 keys the logits are those of the plain f32 cache bit for bit, in
// prefill blocks and decode steps; a cache without the model's RoPE parameters is refused; and,
// teacher-forced on the bundled model and text, what prerope does to int4-kivi and int2-kivi
// (printed; the f32 arm must be exact).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "model/decoder.h"
#include "model/llama2c.h"
#include "model/load_model.h"

namespace kvq {
namespace {

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

KvSpec Spec(const std::string& text) {
  Result<KvSpec> s = ParseKvSpec(text);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : KvSpec{};
}

// A cache for keys of spec `key` and values of its format alone (prerope is a key transform).
std::unique_ptr<KvCache> MakeCache(const DecoderConfig& c, const std::string& key, int64_t n,
                                   std::optional<RopeConfig> rope) {
  const KvSpec k = Spec(key);
  Result<std::unique_ptr<KvCache>> r = KvCache::Create(
      {.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(),
       .layers = {LayerFormats::Of(k, {k.format, {}})}, .key_rope = std::move(rope), .max_positions = n,
       .page_positions = DefaultPagePositions(n)});
  EXPECT_TRUE(r.ok()) << key << ": " << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(PreRopeForward, F32PreRopeLogitsEqualF32InBlocksAndSteps) {
  Result<DecoderWeights> w = LoadLlama2c(kDir + "stories260K.bin");
  ASSERT_TRUE(w.ok());
  const DecoderConfig c = w->config;
  DecoderModel model(*w, 2);
  std::vector<int32_t> tokens(150);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
  auto plain = MakeCache(c, "f32", 256, std::nullopt);
  auto pre = MakeCache(c, "f32+prerope", 256, ModelRopeConfig(c));
  ASSERT_TRUE(plain && pre);
  std::vector<float> a(c.vocab_size), b(c.vocab_size);
  ASSERT_TRUE(model.ForwardBlock(tokens.data(), 64, 0, *plain, a.data()).ok());
  ASSERT_TRUE(model.ForwardBlock(tokens.data(), 64, 0, *pre, b.data()).ok());
  ASSERT_EQ(a, b) << "after the 64-token prefill";
  for (int32_t p = 64; p < 150; ++p) {
    ASSERT_TRUE(model.Forward(tokens[p], p, *plain, a.data()).ok());
    ASSERT_TRUE(model.Forward(tokens[p], p, *pre, b.data()).ok());
    ASSERT_EQ(a, b) << "at position " << p;
  }
  // A cache that ropes with other parameters than the model's is refused, not silently wrong.
  RopeConfig other = ModelRopeConfig(c);
  other.theta *= 2;
  auto wrong = MakeCache(c, "f32+prerope", 256, other);
  ASSERT_NE(wrong, nullptr);
  const Status s = model.ForwardBlock(tokens.data(), 4, 0, *wrong, a.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("KvCacheConfig::key_rope"), std::string::npos) << s.message();
}

struct Fidelity {
  int64_t top1 = 0, positions = 0;
  double kl = 0;  // mean KL(reference ‖ arm), nats
};

// Teacher-forced, one decode step per token (as `kvq eval fidelity` runs an arm).
Result<std::vector<std::vector<float>>> RunArm(DecoderModel& model, const std::vector<int32_t>& tokens,
                                               const std::string& key) {
  const DecoderConfig& c = model.config();
  const KvSpec k = Spec(key);
  std::unique_ptr<KvCache> cache = MakeCache(c, key, static_cast<int64_t>(tokens.size()),
                                             k.transforms.pre_rope ? std::optional(ModelRopeConfig(c)) : std::nullopt);
  if (!cache) return Status::Error("no cache for " + key);
  std::vector<std::vector<float>> logits(tokens.size(), std::vector<float>(c.vocab_size));
  for (size_t p = 0; p < tokens.size(); ++p) {
    if (Status s = model.Forward(tokens[p], static_cast<int64_t>(p), *cache, logits[p].data()); !s.ok()) return s;
  }
  return logits;
}

Fidelity Compare(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& arm) {
  Fidelity f;
  for (size_t p = 0; p < ref.size(); ++p) {
    const std::vector<float>& x = ref[p];
    const std::vector<float>& y = arm[p];
    const auto top = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
    f.top1 += top(x) == top(y);
    const auto lse = [](const std::vector<float>& v) {
      const double m = *std::max_element(v.begin(), v.end());
      double s = 0;
      for (float z : v) s += std::exp(z - m);
      return m + std::log(s);
    };
    const double lx = lse(x), ly = lse(y);
    double kl = 0;
    for (size_t i = 0; i < x.size(); ++i) kl += std::exp(x[i] - lx) * ((x[i] - lx) - (y[i] - ly));
    f.kl += kl;
    ++f.positions;
  }
  f.kl /= static_cast<double>(f.positions);
  return f;
}

TEST(PreRopeForward, TeacherForcedFidelityOnTheBundledModel) {
  Result<LoadedModel> loaded = LoadModel(kDir + "stories260K.bin", kDir + "tok512.bin");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  std::ifstream in(std::string(KVQ_SOURCE_DIR) + "/data/eval/tinystories-eval.txt");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> tokens = loaded->tokenizer.Encode(text.str(), loaded->tokenizer.add_bos());
  DecoderModel model(loaded->weights, 2);
  tokens.resize(std::min<size_t>(tokens.size(), model.config().seq_len));
  Result<std::vector<std::vector<float>>> ref = RunArm(model, tokens, "f32");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  for (const char* key : {"f32+prerope", "int4-kivi", "int4-kivi+prerope", "int2-kivi", "int2-kivi+prerope"}) {
    Result<std::vector<std::vector<float>>> arm = RunArm(model, tokens, key);
    ASSERT_TRUE(arm.ok()) << arm.status().message();
    const Fidelity f = Compare(*ref, *arm);
    std::printf("prerope fidelity: K %-18s V plain, %lld positions: top-1 %lld (%.2f%%), mean KL %.6f nats\n", key,
                static_cast<long long>(f.positions), static_cast<long long>(f.top1),
                100.0 * static_cast<double>(f.top1) / static_cast<double>(f.positions), f.kl);
    if (std::string(key) == "f32+prerope") {
      EXPECT_EQ(*arm, *ref) << "f32 keys roped on read must give the reference's logits exactly";
    }
  }
}

}  // namespace
}  // namespace kvq
