// Session::RunBatch (kvq/session.h): sessions at different positions, stepped together with mixes
// of prompt chunks (1..64 tokens, and longer) and decode tokens, end with exactly the bits —
// logits, kv_bytes and the cache itself (its snapshot file, byte for byte) — of each session run
// alone with Prefill of the same chunks; for every KV format (KIVI too: a session's cut is the same
// as alone), on the bundled f32 model and on tiny Q8_0 / Q4_0 synth models (repacked weights);
// greedy generation of several sessions stepped together equals Session::Generate of each prompt
// alone; every refusal names the item and runs nothing; a cache error clears every session of the
// batch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kvq/format.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "synth/synth.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";

std::unique_ptr<Model> LoadBundled(ModelOptions options = {}) {
  options.tokenizer_path = kDir + "tok512.bin";
  if (options.threads == 0) options.threads = 2;
  Result<std::unique_ptr<Model>> m = Model::Load(kDir + "stories260K.bin", options);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// A tiny synth model of weight type `type` (q8_0, q4_0: LoadModel repacks them into 16-row
// groups). Vocabulary 520 = 32·16 + 8: the classifier has 8 rows past its last 16-row group, so
// both of MatMul's row paths run.
std::unique_ptr<Model> LoadSynth(const std::string& type) {
  const SynthSpec spec{.arch = SynthArch::kLlama,
                       .dim = 64,
                       .n_layers = 2,
                       .n_heads = 4,
                       .n_kv_heads = 2,
                       .hidden_dim = 128,
                       .vocab_size = 520,
                       .context = 256,
                       .type = type,
                       .seed = 11};
  return test::LoadSynth(spec, "batch_" + type);
}

std::unique_ptr<Session> NewSession(const Model& model, const KvOptions& kv) {
  Result<std::unique_ptr<Session>> s = model.NewSession(kv);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(s).value() : nullptr;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The cache's contents as bytes: SavePrefix's snapshot (every page of every layer, residual rows,
// scales, the ids), so two sessions with equal files hold the same bits.
std::string CacheBytes(const Session& s, const std::string& name) {
  const std::string path =
      (fs::path(::testing::TempDir()) / (name + std::to_string(::getpid()) + ".snap")).string();
  const Status st = s.SavePrefix(path);
  EXPECT_TRUE(st.ok()) << st.message();
  std::string bytes = ReadFile(path);
  fs::remove(path);
  return bytes;
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i)
    best = logits[i] > logits[best] ? i : best;
  return best;
}

// Steps `n_sessions` sessions through a random schedule, batched (RunBatch) and alone (Prefill of
// the same chunks, one session at a time), and demands the same bits after every step. Each step
// gives each session nothing, its next decode token (the argmax of its logits, as a greedy server
// would), or a prompt chunk of 1..64 tokens — now and then a longer one, which RunBatch runs in
// blocks of 64 over several passes. `kv(i)` is session i's cache.
void ExpectBatchEqualsAlone(const Model& model, int32_t n_sessions,
                            const std::function<KvOptions(int32_t)>& kv, uint32_t seed,
                            int32_t steps) {
  const int32_t vocab = model.info().vocab_size;
  std::vector<std::unique_ptr<Session>> batched, alone;
  for (int32_t i = 0; i < n_sessions; ++i) {
    batched.push_back(NewSession(model, kv(i)));
    alone.push_back(NewSession(model, kv(i)));
    ASSERT_TRUE(batched.back() && alone.back());
  }
  std::mt19937 rng(seed);
  int32_t mixed_steps = 0;  // steps holding a decode token and a chunk of several tokens
  for (int32_t step = 0; step < steps; ++step) {
    std::vector<std::vector<int32_t>> chunks(n_sessions);
    bool any_decode = false, any_chunk = false;
    for (int32_t i = 0; i < n_sessions; ++i) {
      const int64_t room = batched[i]->context() - batched[i]->positions();
      const uint32_t pick = rng() % 8;
      int32_t n = 0;
      if (batched[i]->positions() == 0 || pick < 2) {
        n = 1 + static_cast<int32_t>(rng() % 64);
        if (pick == 0 && step % 3 == 0)
          n = 65 + static_cast<int32_t>(rng() % 70);  // several blocks
      } else if (pick < 6) {
        n = 1;  // a decode step
      }
      n = static_cast<int32_t>(std::min<int64_t>(n, room));
      if (n == 1 && !batched[i]->logits().empty() && pick >= 2) {
        chunks[i] = {Argmax(batched[i]->logits())};
        any_decode = true;
      } else {
        for (int32_t t = 0; t < n; ++t) chunks[i].push_back(static_cast<int32_t>(rng() % vocab));
        any_chunk = any_chunk || n > 1;
      }
    }
    mixed_steps += any_decode && any_chunk ? 1 : 0;
    std::vector<BatchItem> items;
    for (int32_t i = 0; i < n_sessions; ++i) {
      if (!chunks[i].empty()) items.push_back({.session = batched[i].get(), .tokens = chunks[i]});
    }
    if (items.empty()) continue;
    const Status s = Session::RunBatch(items);
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.message();
    for (int32_t i = 0; i < n_sessions; ++i) {
      if (!chunks[i].empty()) {
        ASSERT_TRUE(alone[i]->Prefill(chunks[i]).ok());
      }
      SCOPED_TRACE(::testing::Message()
                   << "step " << step << ", session " << i << " at " << alone[i]->positions());
      ASSERT_EQ(batched[i]->positions(), alone[i]->positions());
      ASSERT_TRUE(std::equal(batched[i]->tokens().begin(), batched[i]->tokens().end(),
                             alone[i]->tokens().begin()));
      ASSERT_TRUE(SameBits(batched[i]->logits(), alone[i]->logits()));
      ASSERT_EQ(batched[i]->kv_bytes(), alone[i]->kv_bytes());
    }
  }
  EXPECT_GE(mixed_steps, steps / 4)
      << "the schedule rarely mixed prefill chunks with decode tokens";
  for (int32_t i = 0; i < n_sessions; ++i) {
    EXPECT_GT(batched[i]->positions(), 0);
    EXPECT_EQ(CacheBytes(*batched[i], "kvq_batch_a"), CacheBytes(*alone[i], "kvq_batch_b"))
        << "session " << i;
  }
}

TEST(RunBatch, EachSessionGetsTheBitsItGetsAlone) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  uint32_t seed = 1;
  for (const FormatDesc* desc : Formats()) {  // every registered format
    const std::string f(desc->name);
    SCOPED_TRACE(f);
    const int32_t n = seed % 2 == 0 ? 8 : 5;
    ExpectBatchEqualsAlone(
        *m, n, [&](int32_t) { return KvOptions{.key_format = f, .value_format = f}; }, seed++, 14);
  }
}

TEST(RunBatch, QuantizedWeightsGiveTheBitsAlone) {
  for (const char* type : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(type);
    std::unique_ptr<Model> m = LoadSynth(type);
    ASSERT_NE(m, nullptr);
    for (const char* f : {"f16", "int4-kivi"}) {
      SCOPED_TRACE(f);
      ExpectBatchEqualsAlone(
          *m, 4, [&](int32_t) { return KvOptions{.key_format = f, .value_format = f}; }, 7, 12);
    }
  }
}

// Sessions of one model with different caches share a batch: formats, transforms (rotation,
// prerope keys, sinks), KIVI, per-layer plans and page sizes.
TEST(RunBatch, SessionsWithDifferentCachesShareABatch) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  const std::vector<KvOptions> caches = {
      {.key_format = "f16", .value_format = "f16"},
      {.key_format = "int4+rot", .value_format = "int4+rot"},
      {.key_format = "int4+prerope", .value_format = "int8"},
      {.key_format = "int2-kivi", .value_format = "int2-kivi"},
      {.key_format = "int4+sink4", .value_format = "fp4-e2m1", .page_positions = 32},
      {.layers = {{"f16", "f16"},
                  {"int8", "int4"},
                  {"int4-kivi", "int4-kivi"},
                  {"f32", "f32"},
                  {"bf16", "int8"}}},
  };
  ExpectBatchEqualsAlone(
      *m, static_cast<int32_t>(caches.size()), [&](int32_t i) { return caches[i]; }, 3, 16);
}

// A server's loop: each session joins with its prompt while the others decode; all greedy. The
// prompt is run as Generate runs it (all but the last token, then the last one), so the tokens
// must equal Session::Generate's for that prompt alone, for a per-token format and for KIVI.
TEST(RunBatch, GreedyGenerationSteppedTogetherEqualsGenerateAlone) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  const std::vector<std::string> prompts = {
      "Once upon a time", "Lily and Ben", "The cat sat",
      "One day, a little girl named Sue went to the park with her mom. She saw "
      "a big tree and wanted to climb it, but her mom said no.",
      "Tom"};
  constexpr int32_t kNew = 40;
  for (const char* f : {"f16", "int4-kivi"}) {
    SCOPED_TRACE(f);
    const KvOptions kv{.key_format = f, .value_format = f};
    std::vector<std::vector<int32_t>> want;
    for (const std::string& p : prompts) {
      std::unique_ptr<Session> s = NewSession(*m, kv);
      Result<Completion> c = s->Generate(p, {.max_tokens = kNew, .sampling = {.temperature = 0}});
      ASSERT_TRUE(c.ok()) << c.status().message();
      want.push_back(c->tokens);
    }
    const size_t n = prompts.size();
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<std::vector<int32_t>> ids(n), got(n), next(n);
    std::vector<int32_t> stage(n, 0);  // 0 waiting, 1 prompt head run, 2 generating, 3 done
    for (size_t i = 0; i < n; ++i) {
      sessions.push_back(NewSession(*m, kv));
      sessions.back()->SetSampler({.temperature = 0});
      ids[i] = m->Tokenize(prompts[i]);
    }
    for (int32_t step = 0; std::count(stage.begin(), stage.end(), 3) < static_cast<long>(n);
         ++step) {
      ASSERT_LT(step, 200);
      std::vector<BatchItem> items;
      for (size_t i = 0; i < n; ++i) {
        if (stage[i] == 0 && static_cast<size_t>(step) >= i) {  // session i joins at step i
          next[i].assign(ids[i].begin(), ids[i].end() - 1);
          stage[i] = 1;
          if (next[i].empty()) continue;  // a one-token prompt: its last token is all there is
        } else if (stage[i] == 1) {
          next[i] = {ids[i].back()};
          stage[i] = 2;
        } else if (stage[i] == 2) {
          Result<int32_t> t = sessions[i]->Sample();
          ASSERT_TRUE(t.ok());
          if (m->IsEndOfGeneration(*t) || *t == m->info().bos) {
            stage[i] = 3;
            continue;
          }
          got[i].push_back(*t);
          if (static_cast<int32_t>(got[i].size()) == kNew) {
            stage[i] = 3;
            continue;
          }
          next[i] = {*t};
        } else {
          continue;
        }
        items.push_back({.session = sessions[i].get(), .tokens = next[i]});
      }
      if (!items.empty()) {
        ASSERT_TRUE(Session::RunBatch(items).ok());
      }
    }
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], want[i]) << "prompt \"" << prompts[i] << "\"";
  }
}

struct Held {
  int64_t positions;
  std::vector<float> logits;
};

// Every refusal names the item and runs nothing: no session moves, no logits change.
TEST(RunBatch, RefusalsNameTheItemAndRunNothing) {
  std::unique_ptr<Model> m = LoadBundled({.context = 40});
  std::unique_ptr<Model> other = LoadBundled({.context = 40});
  ASSERT_TRUE(m && other);
  std::vector<std::unique_ptr<Session>> s;
  for (int i = 0; i < 3; ++i) s.push_back(NewSession(*m, {}));
  std::unique_ptr<Session> foreign = NewSession(*other, {});
  ASSERT_TRUE(s[0]->Prefill(std::vector<int32_t>{1, 5, 6}).ok());
  ASSERT_TRUE(s[2]->Prefill(std::vector<int32_t>(30, 7)).ok());
  const std::vector<int32_t> one{9}, two{9, 10}, bad{9, 512}, eleven(11, 8), none;
  auto held = [&] {
    std::vector<Held> h;
    for (const auto& x : s)
      h.push_back({x->positions(), std::vector<float>(x->logits().begin(), x->logits().end())});
    return h;
  };
  const std::vector<Held> before = held();
  auto refused = [&](std::vector<BatchItem> items, const std::vector<std::string>& parts) {
    const Status st = Session::RunBatch(items);
    ASSERT_FALSE(st.ok());
    for (const std::string& p : parts)
      EXPECT_NE(st.message().find(p), std::string::npos) << st.message();
    const std::vector<Held> after = held();
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_EQ(after[i].positions, before[i].positions) << st.message();
      EXPECT_TRUE(SameBits(after[i].logits, before[i].logits)) << st.message();
    }
  };
  refused({}, {"RunBatch: no items"});
  refused({{s[0].get(), one}, {nullptr, one}}, {"item 1", "null"});
  refused({{s[0].get(), one}, {s[1].get(), two}, {s[2].get(), none}}, {"item 2", "no tokens"});
  refused({{s[0].get(), one}, {s[1].get(), two}, {s[0].get(), two}},
          {"items 0 and 2 are the same session"});
  refused({{s[0].get(), one}, {foreign.get(), one}}, {"item 1", "another model"});
  refused({{s[1].get(), two}, {s[0].get(), bad}},
          {"item 1", "token 512 at index 1", "outside the vocabulary"});
  refused({{s[0].get(), two}, {s[1].get(), one}, {s[2].get(), eleven}},
          {"item 2", "holds 30 positions", "context is 40", "11 more tokens"});
  // The same batch, fixed, runs.
  ASSERT_TRUE(Session::RunBatch(
                  std::vector<BatchItem>{{s[0].get(), one}, {s[1].get(), two}, {s[2].get(), one}})
                  .ok());
  EXPECT_EQ(s[0]->positions(), 4);
  EXPECT_EQ(s[1]->positions(), 2);
  EXPECT_EQ(s[2]->positions(), 31);
}

// A cache that fails while the batch runs (its disk file cut short: attention cannot read a page
// back) leaves the earlier sessions holding part of the pass; every session is cleared, and the
// message says so. The sessions work again afterwards.
TEST(RunBatch, ACacheErrorClearsEverySessionOfTheBatch) {
  std::unique_ptr<Model> m = LoadBundled();
  ASSERT_NE(m, nullptr);
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("kvq_batch_disk_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::unique_ptr<Session> a = NewSession(*m, {}), b = NewSession(*m, {});
  std::unique_ptr<Session> disk =
      NewSession(*m, {.budgets = {.disk_dir = dir.string()}, .page_positions = 32});
  ASSERT_TRUE(a && b && disk);
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + i * 37 % 500);
  for (Session* s : {a.get(), b.get(), disk.get()}) ASSERT_TRUE(s->Prefill(prompt).ok());
  ASSERT_GT(disk->positions(), 32);  // page 0 of every layer is on disk
  int files = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    fs::resize_file(e.path(), 0);
    ++files;
  }
  ASSERT_EQ(files, 1);
  const std::vector<int32_t> t{5};
  const Status st =
      Session::RunBatch(std::vector<BatchItem>{{a.get(), t}, {b.get(), t}, {disk.get(), t}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shorter than expected"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("every session of the batch was cleared"), std::string::npos)
      << st.message();
  for (Session* s : {a.get(), b.get(), disk.get()}) {
    EXPECT_EQ(s->positions(), 0);
    EXPECT_TRUE(s->logits().empty());
    EXPECT_EQ(s->kv_bytes(), 0);
  }
  EXPECT_TRUE(Session::RunBatch(std::vector<BatchItem>{{a.get(), t}, {disk.get(), t}}).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvq
