// kvq serve behind a router: two replicas sharing prefix snapshots through a redis-server the test
// starts (--prefix-store), and the KV events a router subscribes to (--kv-events). Everything on
// 127.0.0.1, started and stopped here, every wait bounded; tiny synth models.
//
// What each test proves (and how it could fail):
// - a prefix computed on A is restored on B, which never saw it: B's log and metrics count the
//   restored tokens (every full block the prompt shares, less its last token), its reply equals
//   A's; a prompt sharing only 3 blocks restores exactly those 3. Timings are printed, not asserted
//   (the machine running the suite may be loaded).
// - Redis killed: both replicas answer 200 with the same text as before, the metric says down,
//   and after Redis returns they write and restore through it again.
// - a flipped byte in a stored value: refused, recomputed (same reply), and replaced; a value of
//   another model or KV spec put under a replica's own key is refused too.
// - the events: a subscriber recomputes every BlockStored's chained hashes from its token ids with
//   its own code, sees the prompt's blocks stored, BlockRemoved when another prompt evicts them,
//   AllBlocksCleared on POST /reset_prefix_cache, and gets the batches it missed from the replay
//   socket.
#include <gtest/gtest.h>
#include <unistd.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "synth/synth.h"
#include "test_util/serve_processes.h"

namespace kvq::test {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A model file in the test's temporary folder, removed when it goes out of scope (after the
// replicas declared after it, which read it, have stopped).
struct ModelFile {
  std::string path;
  explicit ModelFile(std::string p) : path(std::move(p)) {}
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;
  ~ModelFile() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  operator const std::string&() const { return path; }
};

// A tiny Llama (dim 128, 4 layers, 4,096 positions) with stories260K's vocabulary; `seed` makes
// another model of the same shape.
// A hybrid (`hybrid`: Qwen3.5's tiny preset, Gated DeltaNet layers holding a recurrent state).
ModelFile WriteModel(const std::string& tag, uint32_t seed, bool hybrid = false) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) /
                            ("kvq_scale_out_" + tag + "_" + std::to_string(getpid()) + ".gguf")).string();
  SynthSpec spec{.arch = SynthArch::kLlama, .dim = 128, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
                 .hidden_dim = 256, .context = 4096, .type = "q8_0", .seed = seed};
  if (hybrid) {
    Result<SynthSpec> preset = SynthPreset("tiny-qwen35");
    EXPECT_TRUE(preset.ok());
    if (preset.ok()) spec = *preset;
    spec.seed = seed;
  }
  const Status s = WriteSynthModel(spec, std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf", path);
  EXPECT_TRUE(s.ok()) << s.message();
  return ModelFile{path};
}

struct Reply {
  int status = -1;
  std::string text;
  int64_t prompt_tokens = -1;
  int64_t reused = -1;
  double ttft = 0;  // the server's own TTFT for the request
};

// A greedy completion of `prompt`, with the prompt and reused token counts of its log line.
Reply Complete(Replica& r, const std::string& prompt, int max_tokens = 8) {
  // ignore_eos: replies of the same length whatever the random weights make of the prompt.
  const size_t from = r.log.size();
  httplib::Client c("127.0.0.1", r.port);
  c.set_read_timeout(std::chrono::seconds(60));
  httplib::Result res = c.Post(
      "/v1/completions",
      json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}}.dump(),
      "application/json");
  Reply out;
  if (!res) return out;
  out.status = res->status;
  if (res->status == 200) out.text = json::parse(res->body)["choices"][0]["text"].get<std::string>();
  std::vector<std::string> g;
  if (r.ReadUntil(std::regex("POST /v1/completions 200 in [0-9.]+ s; prompt (\\d+) tokens \\((\\d+) reused\\), "
                             "generated \\d+, TTFT ([0-9.]+) s"),
                  nullptr, from, 30, &g)) {
    out.prompt_tokens = std::stoll(g[1]);
    out.reused = std::stoll(g[2]);
    out.ttft = std::stod(g[3]);
  }
  return out;
}

// A sample's value in /metrics ("name" or "name{labels}"); NaN when absent.
double Metric(int port, const std::string& sample) {
  httplib::Client c("127.0.0.1", port);
  httplib::Result res = c.Get("/metrics");
  if (!res) return std::nan("");
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  }
  return std::nan("");
}

// Waits (up to 20 s) until a sample reaches `at_least`: a replica saves a snapshot to the shared
// store after the reply is out, so the next request may come before it is there.
bool WaitMetric(int port, const std::string& sample, double at_least) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!(Metric(port, sample) >= at_least)) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}
bool WaitSaved(Replica& r, double count) {
  return WaitMetric(r.port, "kvq_prefix_store_snapshots_saved_total", count);
}

std::vector<int32_t> Tokenize(int port, const std::string& text) {
  httplib::Client c("127.0.0.1", port);
  httplib::Result res = c.Post("/tokenize", json{{"content", text}, {"add_special", true}}.dump(), "application/json");
  EXPECT_TRUE(res && res->status == 200);
  return res ? json::parse(res->body)["tokens"].get<std::vector<int32_t>>() : std::vector<int32_t>{};
}

std::string Detokenize(int port, const std::vector<int32_t>& ids) {
  httplib::Client c("127.0.0.1", port);
  httplib::Result res = c.Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  EXPECT_TRUE(res && res->status == 200);
  return res ? json::parse(res->body)["content"].get<std::string>() : "";
}

void ResetPrefixCache(int port) {
  httplib::Client c("127.0.0.1", port);
  httplib::Result res = c.Post("/reset_prefix_cache", "", "application/json");
  EXPECT_TRUE(res && res->status == 200);
}

// Words drawn with `seed` until the text is at least `tokens` tokens long.
std::string Text(int port, size_t tokens, uint32_t seed) {
  static const char* kWords[] = {"once", "upon", "a", "time", "there", "was", "little", "girl", "named", "lily",
                                 "she", "liked", "to", "play", "in", "the", "park", "with", "her", "dog",
                                 "one", "day", "they", "saw", "big", "red", "ball", "and", "happy", "sun"};
  std::mt19937 rng(seed);
  std::string text = "Once";
  while (Tokenize(port, text).size() < tokens) {
    for (int i = 0; i < 200; ++i) text += std::string(" ") + kWords[rng() % std::size(kWords)];
  }
  return text;
}

std::vector<std::string> ReplicaFlags(const std::string& model, const std::string& store) {
  return {"-m", model, "--parallel", "1", "--prefix-store", store, "--kv-block-size", "16"};
}

TEST(ScaleOut, APrefixComputedOnOneReplicaIsRestoredOnAnother) {
  RedisServer redis;
  const ModelFile model = WriteModel("a", 5);
  Replica a(ReplicaFlags(model, redis.url())), b(ReplicaFlags(model, redis.url()));
  ASSERT_GT(a.port, 0) << a.log;
  ASSERT_GT(b.port, 0) << b.log;
  const std::string text = Text(a.port, 2000, 1);

  const Reply cold = Complete(a, text);
  ASSERT_EQ(cold.status, 200);
  EXPECT_EQ(cold.reused, 0);
  ASSERT_TRUE(WaitSaved(a, 1));
  const Reply warm = Complete(b, text);
  ASSERT_EQ(warm.status, 200);
  EXPECT_EQ(warm.text, cold.text);
  const int64_t n = warm.prompt_tokens;
  EXPECT_GE(n, 2000);
  EXPECT_EQ(warm.reused, std::min(n / 16 * 16, n - 1)) << b.log;
  EXPECT_EQ(Metric(b.port, "kvq_prefix_hits_total{source=\"remote\"}"), 1);
  EXPECT_GT(Metric(b.port, "kvq_prefix_store_bytes_total{medium=\"remote\",direction=\"read\"}"), 0);
  EXPECT_GT(Metric(a.port, "kvq_prefix_store_bytes_total{medium=\"remote\",direction=\"written\"}"), 0);
  std::printf("a %lld-token prompt: TTFT %.3f s computed on replica A, %.3f s restored on replica B (%lld tokens "
              "restored): %.1fx\n", static_cast<long long>(n), cold.ttft, warm.ttft,
              static_cast<long long>(warm.reused), warm.ttft > 0 ? cold.ttft / warm.ttft : 0.0);

  // A prompt sharing 3 full blocks (and a few tokens) restores exactly those 3, with A's reply.
  ResetPrefixCache(b.port);  // B's own session would otherwise lend it the prefix
  const std::vector<int32_t> ids = Tokenize(b.port, text);
  const std::string other = Detokenize(b.port, {ids.begin() + 1, ids.begin() + 52}) + " zebra purple moon rocket";
  const std::vector<int32_t> other_ids = Tokenize(b.port, other);
  const size_t common = static_cast<size_t>(
      std::mismatch(ids.begin(), ids.end(), other_ids.begin(), other_ids.end()).first - ids.begin());
  ASSERT_GE(common, 48u);
  ASSERT_LT(common, 64u);
  const size_t before = b.log.size();
  const Reply three = Complete(b, other);
  EXPECT_EQ(three.reused, 48);
  EXPECT_TRUE(b.ReadUntil(std::regex("restored 48 tokens \\(3 blocks\\)"), nullptr, before)) << b.log;
  EXPECT_EQ(three.text, Complete(a, other).text);
}

TEST(ScaleOut, ARedisOutageLeavesEveryRequestAnsweredAndTheReplicasReconnect) {
  RedisServer redis;
  const ModelFile model = WriteModel("b", 5);
  Replica a(ReplicaFlags(model, redis.url())), b(ReplicaFlags(model, redis.url()));
  ASSERT_GT(a.port, 0) << a.log;
  ASSERT_GT(b.port, 0) << b.log;
  const std::string p1 = Text(a.port, 200, 2), p2 = Text(a.port, 200, 3), p3 = Text(a.port, 200, 4);
  const Reply a1 = Complete(a, p1);
  ASSERT_EQ(a1.status, 200);
  ASSERT_TRUE(WaitSaved(a, 1));
  EXPECT_GT(Complete(b, p1).reused, 0);  // through Redis
  const Reply p2_alone = Complete(a, p2);

  redis.Kill();
  for (Replica* r : {&a, &b}) {
    const Reply x = Complete(*r, p2), y = Complete(*r, p1);
    EXPECT_EQ(x.status, 200);
    EXPECT_EQ(y.status, 200);
    EXPECT_EQ(x.text, p2_alone.text);
    EXPECT_EQ(y.text, a1.text);
    EXPECT_TRUE(r->ReadUntil(std::regex("prefix store: redis://\\S+ unreachable"))) << r->log;
    EXPECT_EQ(Metric(r->port, "kvq_prefix_store_up"), 0);
    EXPECT_GE(Metric(r->port, "kvq_prefix_store_errors_total"), 1);
  }

  redis.Start();  // same port, empty
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past the replicas' retry interval
  const Reply a3 = Complete(a, p3);
  EXPECT_EQ(a3.status, 200);
  EXPECT_TRUE(a.ReadUntil(std::regex("prefix store: redis://\\S+ is back"))) << a.log;
  EXPECT_EQ(Metric(a.port, "kvq_prefix_store_up"), 1);
  ASSERT_TRUE(WaitSaved(a, 2)) << a.log;
  const Reply b3 = Complete(b, p3);  // B restores what A saved after the outage
  EXPECT_GT(b3.reused, 0) << b.log;
  EXPECT_EQ(b3.text, a3.text);
  EXPECT_EQ(Metric(b.port, "kvq_prefix_store_up"), 1);
}

// The one snapshot key under `ns` (a replica's namespace); "" when there is not exactly one.
std::string SnapshotKey(redisContext* c, const std::string& ns) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "KEYS %s:snap:*", ns.c_str()));
  std::string key = r && r->type == REDIS_REPLY_ARRAY && r->elements == 1 ? r->element[0]->str : "";
  freeReplyObject(r);
  return key;
}
std::string Get(redisContext* c, const std::string& key) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %s", key.c_str()));
  std::string v = r && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
  freeReplyObject(r);
  return v;
}
void Set(redisContext* c, const std::string& key, const std::string& value) {
  freeReplyObject(redisCommand(c, "SET %s %b", key.c_str(), value.data(), value.size()));
}
std::string Namespace(Replica& r) {
  std::string ns;
  EXPECT_TRUE(r.ReadUntil(std::regex("prefix store: redis://\\S+ \\(keys (\\S+):\\*\\)"), &ns)) << r.log;
  return ns;
}

TEST(ScaleOut, DamagedAndForeignValuesAreRefusedRecomputedAndReplaced) {
  RedisServer redis;
  const ModelFile model = WriteModel("c", 5), other_model = WriteModel("d", 6);
  Replica a(ReplicaFlags(model, redis.url()));
  ASSERT_GT(a.port, 0) << a.log;
  const std::string text = Text(a.port, 300, 5);
  const Reply a1 = Complete(a, text);
  ASSERT_EQ(a1.status, 200);
  ASSERT_TRUE(WaitSaved(a, 1));
  redisContext* c = redis.Connect();
  ASSERT_NE(c, nullptr);
  const std::string key = SnapshotKey(c, Namespace(a));
  ASSERT_FALSE(key.empty());
  const std::string original = Get(c, key);
  ASSERT_GT(original.size(), 1000u);
  std::string damaged = original;
  damaged[damaged.size() / 2] ^= 0x10;
  Set(c, key, damaged);

  Replica b(ReplicaFlags(model, redis.url()));
  const Reply b1 = Complete(b, text);
  EXPECT_EQ(b1.status, 200);
  EXPECT_EQ(b1.reused, 0);
  EXPECT_EQ(b1.text, a1.text);
  EXPECT_TRUE(b.ReadUntil(std::regex("prefix store: \\S+ refused: .*; deleted"))) << b.log;
  EXPECT_EQ(Metric(b.port, "kvq_prefix_snapshots_refused_total"), 1);
  EXPECT_TRUE(WaitSaved(b, 1));
  EXPECT_EQ(Get(c, key), original);  // B's recomputed snapshot replaced it, bit for bit

  // Another model, and the same model with another KV spec: their own keys never name A's value
  // (each starts cold), and A's value put under their key is refused by the snapshot's checks.
  for (const std::vector<std::string>& flags :
       {ReplicaFlags(other_model, redis.url()), [&] {
          std::vector<std::string> f = ReplicaFlags(model, redis.url());
          f.insert(f.end(), {"--kv", "int8"});
          return f;
        }()}) {
    Replica x(flags);
    ASSERT_GT(x.port, 0) << x.log;
    const Reply x1 = Complete(x, text);
    EXPECT_EQ(x1.reused, 0) << x.log;
    ASSERT_TRUE(WaitSaved(x, 1));
    const std::string own = SnapshotKey(c, Namespace(x));
    ASSERT_FALSE(own.empty());
    ASSERT_NE(own, key);
    Set(c, own, original);
    ResetPrefixCache(x.port);
    const Reply x2 = Complete(x, text);
    EXPECT_EQ(x2.reused, 0) << x.log;
    EXPECT_EQ(x2.text, x1.text);
    EXPECT_TRUE(x.ReadUntil(std::regex("prefix store: \\S+ refused: "))) << x.log;
  }
  redisFree(c);
}

// A recurrent state cannot be cut back to a block: a hybrid restores only a snapshot whose every
// token starts the prompt (a conversation's next turn), never one it would have to cut.
TEST(ScaleOut, AHybridRestoresOnlyASnapshotThatIsAllAPrefixOfThePrompt) {
  RedisServer redis;
  const ModelFile model = WriteModel("h", 5, /*hybrid=*/true);
  Replica a(ReplicaFlags(model, redis.url())), b(ReplicaFlags(model, redis.url()));
  ASSERT_GT(a.port, 0) << a.log;
  ASSERT_GT(b.port, 0) << b.log;
  const std::string text = Text(a.port, 100, 6);
  // max_tokens 1: the snapshot holds the prompt alone (the sampled token never ran).
  const Reply a1 = Complete(a, text, 1);
  ASSERT_EQ(a1.status, 200);
  ASSERT_TRUE(WaitSaved(a, 1));
  const std::string longer = text + " and then they went home to sleep";
  const std::vector<int32_t> longer_ids = Tokenize(a.port, longer);
  ASSERT_GT(longer_ids.size(), static_cast<size_t>(a1.prompt_tokens));
  ASSERT_EQ(std::vector<int32_t>(longer_ids.begin(), longer_ids.begin() + a1.prompt_tokens), Tokenize(a.port, text));
  const Reply b1 = Complete(b, longer);
  EXPECT_EQ(b1.reused, a1.prompt_tokens) << b.log;
  // B's snapshot of the longer prompt and its reply re-points the index of every block of `text`.
  // Waited for before A runs the same prompt: A then finds it held and saves nothing (had A asked
  // first, the two saves would race and either could be the one counted).
  ASSERT_TRUE(WaitSaved(b, 1));
  EXPECT_EQ(b1.text, Complete(a, longer).text);
  // The same prompt again on a fresh replica: the snapshot its blocks now name ends past it (the
  // longer prompt and the reply), so it would need cutting: not restored, computed, the same reply.
  Replica c(ReplicaFlags(model, redis.url()));
  const Reply c1 = Complete(c, text, 1);
  EXPECT_EQ(c1.reused, 0) << c.log;
  EXPECT_EQ(c1.text, a1.text);
}

}  // namespace
}  // namespace kvq::test
