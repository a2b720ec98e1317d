// The kvq program end to end: `kvq plan` and `kvq formats` print the seeds' figures as exact
// JSON integers, and bad input gets a clear message on stderr and a non-zero exit.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvq/format.h"
#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::Slurp;

KvqRun Kvq(const std::string& args) { return kvq_test::RunKvq(args); }

nlohmann::json Json(const std::string& args) {
  const KvqRun r = Kvq(args + " --json");
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(Plan, Seed000ShapeF32) {
  const auto j = Json("plan --layers 28 --kv-heads 4 --head-dim 128 --format f32 --context 2787");
  EXPECT_EQ(j["bytes_per_layer_position"].get<int64_t>(), 4096);
  EXPECT_EQ(j["bytes_per_token"].get<int64_t>(), 114688);
  ASSERT_EQ(j["contexts"].size(), 1u);
  EXPECT_EQ(j["contexts"][0]["context"].get<int64_t>(), 2787);
  EXPECT_EQ(j["contexts"][0]["total_bytes"].get<int64_t>(), 319635456);  // over 300 MB
}

TEST(Plan, Seed000ShapeInt4) {
  const auto j = Json("plan --layers 28 --kv-heads 4 --head-dim 128 --format int4 --context 2787");
  EXPECT_EQ(j["bytes_per_layer_position"].get<int64_t>(), 528);
}

TEST(Plan, Seed002TableInMiBAndGiB) {
  const auto j =
      Json("plan --layers 10 --kv-heads 2 --head-dim 256 --format f16 --context 8192,32768,65536,262144");
  EXPECT_EQ(j["bytes_per_token"].get<int64_t>(), 20480);
  const int64_t want[] = {160LL << 20, 640LL << 20, 1280LL << 20, 5LL << 30};
  ASSERT_EQ(j["contexts"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j["contexts"][i]["total_bytes"].get<int64_t>(), want[i]);
}

TEST(Plan, Seed002CeilingFromMeasuredBytes) {
  const auto j = Json("plan --layers 10 --kv-heads 2 --head-dim 256 --format f16 "
                      "--kv-bytes 718MB --weight-bytes 566MB");
  ASSERT_EQ(j["ceiling"].size(), 1u);
  EXPECT_NEAR(j["ceiling"][0]["kv_share"].get<double>(), 718.0 / 1284.0, 1e-12);
  bool found = false;
  for (const auto& f : j["ceiling"][0]["formats"]) {
    if (f["format"] == "fp8-e4m3") {
      found = true;
      // 512 codes + 1 exponent byte per position for K and V, against f16's 1024 (seed 002's
      // 8-bit ceiling is 1.388 at exactly a half).
      const double share = 718.0 / 1284.0;
      EXPECT_EQ(f["bytes_ratio"].get<double>(), 513.0 / 1024.0);
      EXPECT_NEAR(f["ceiling"].get<double>(), 1.0 / (1.0 - share * (1.0 - 513.0 / 1024.0)), 1e-12);
    }
    if (f["format"] == "f16") {
      EXPECT_EQ(f["ceiling"].get<double>(), 1.0);
    }
  }
  EXPECT_TRUE(found);
}

// -m: the shape from a model file. The tiny hybrid preset (src/synth/synth_presets.cc): 4 layers,
// full attention at 1 and 3 (2 KV heads x head_dim 32), Gated DeltaNet at 0 and 2 with conv kernel
// 4, 2 key heads and 6 value heads of 16: per recurrent layer (4 - 1) x C + 6 x 16 x 16 floats with
// C = 2 x 2 x 16 + 6 x 16 = 160, i.e. 480 + 1,536 = 2,016 floats; both layers 16,128 bytes in f32.
TEST(Plan, ModelFileGivesTheHybridShapeAndItsFixedState) {
  const std::string model = ::testing::TempDir() + "/kvq_plan_tiny_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_EQ(Kvq("synth --preset tiny-qwen35moe -o " + model).exit_code, 0);
  const auto j = Json("plan -m " + model + " --format f16 --context 1000,4096");
  EXPECT_EQ(j["layers"].get<int64_t>(), 2);  // only the attention layers hold KV
  EXPECT_EQ(j["kv_heads"].get<int64_t>(), 2);
  EXPECT_EQ(j["head_dim"].get<int64_t>(), 32);
  EXPECT_EQ(j["bytes_per_token"].get<int64_t>(), 2 * 2 * 2 * 32 * 2);  // layers x K,V x heads x dim x 2 B
  EXPECT_EQ(j["model"]["arch"].get<std::string>(), "qwen35moe");
  EXPECT_EQ(j["model"]["layers"].get<int64_t>(), 4);
  EXPECT_EQ(j["model"]["recurrent_layers"].get<int64_t>(), 2);
  EXPECT_EQ(j["model"]["state_bytes_per_sequence"].get<int64_t>(), 16128);
  ASSERT_EQ(j["contexts"].size(), 2u);
  EXPECT_EQ(j["contexts"][0]["total_bytes"].get<int64_t>(), 512 * 1000);
  // int8 with the same (no) transforms: 1 byte per number plus its per-row scales, counted by the
  // shape-only plan of the same cache.
  const auto int8 = Json("plan --layers 2 --kv-heads 2 --head-dim 32 --format int8 --context 1000");
  EXPECT_EQ(j["contexts"][0]["int8_saves_bytes"].get<int64_t>(),
            512 * 1000 - int8["contexts"][0]["total_bytes"].get<int64_t>());
  const KvqRun table = Kvq("plan -m " + model + " --context 1000");
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("4 layers, 2 with a KV cache, 2 recurrent (Gated DeltaNet) with a fixed state"),
            std::string::npos) << table.out;
  EXPECT_NE(table.out.find("fixed state per sequence  16,128 bytes"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("int8 saves"), std::string::npos) << table.out;
  // The shape comes from the file or from the flags, not both; a missing file is named.
  const KvqRun both = Kvq("plan -m " + model + " --layers 2 --context 10");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("-m takes the shape from the model file"), std::string::npos) << both.err;
  const KvqRun missing = Kvq("plan -m /nonexistent/model.gguf --context 10");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/model.gguf"), std::string::npos) << missing.err;
  std::remove(model.c_str());
}

// plan takes a list of specs as eval and bench do (one plan each; with --json one object per line),
// and with -m and no --context it plans the model's own context.
TEST(Plan, AListOfSpecsAndTheModelsContextByDefault) {
  const KvqRun list = Kvq("plan --layers 2 --kv-heads 4 --head-dim 64 --format f16,int4,int8+rot --context 100 --json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  std::istringstream lines(list.out);
  std::vector<std::string> formats;
  for (std::string line; std::getline(lines, line);) {
    formats.push_back(nlohmann::json::parse(line)["format"].get<std::string>());
  }
  EXPECT_EQ(formats, (std::vector<std::string>{"f16", "int4", "int8+rot"}));
  const KvqRun table = Kvq("plan --layers 2 --kv-heads 4 --head-dim 64 --formats f16,int4 --context 100");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("format f16"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("format int4"), std::string::npos) << table.out;
  EXPECT_EQ(Kvq("plan --layers 2 --kv-heads 4 --head-dim 64 --format f16,nope --context 100").exit_code, 2);

  const std::string model = ::testing::TempDir() + "/kvq_plan_ctx_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_EQ(Kvq("synth --preset tiny-qwen35 --context 3000 -o " + model).exit_code, 0);
  const auto j = Json("plan -m " + model + " --json");
  ASSERT_EQ(j["contexts"].size(), 1u);
  EXPECT_EQ(j["contexts"][0]["context"].get<int64_t>(), 3000);
  std::remove(model.c_str());
}

TEST(Plan, CeilingFromAContextAndWeights) {
  const auto j = Json("plan --layers 10 --kv-heads 2 --head-dim 256 --format f16 --context 32768 "
                      "--weight-bytes 566MB");
  ASSERT_EQ(j["ceiling"].size(), 1u);
  EXPECT_EQ(j["ceiling"][0]["context"].get<int64_t>(), 32768);
  EXPECT_EQ(j["ceiling"][0]["kv_bytes"].get<int64_t>(), 640LL << 20);
}

TEST(Formats, Seed004BitsColumnAtHeadDim8) {
  const auto j = Json("formats --head-dim 8 --kv-heads 4");
  std::map<std::string, double> bits, pct;
  for (const auto& f : j["formats"]) {
    bits[f["name"]] = f["bits_per_number"].get<double>();
    pct[f["name"]] = 100.0 * f["memory_vs_f16"].get<double>();
  }
  EXPECT_EQ(bits["f16"], 16);
  EXPECT_EQ(bits["fp8-e4m3"], 8.25);  // seed 004: 8; kvq adds an exponent byte per position
  EXPECT_EQ(bits["int8"], 10);
  EXPECT_EQ(bits["fp4-e2m1"], 4.5);
  EXPECT_EQ(bits["int4"], 6);
  EXPECT_EQ(bits["int2"], 4);
  EXPECT_EQ(pct["int8"], 62.5);
  EXPECT_EQ(pct["fp4-e2m1"], 28.125);
  // The listing is the registry: every registered format, in registry order, with its id.
  ASSERT_EQ(j["formats"].size(), kvq::Formats().size());
  for (size_t i = 0; i < kvq::Formats().size(); ++i) {
    EXPECT_EQ(j["formats"][i]["name"], kvq::Formats()[i]->name);
    EXPECT_EQ(j["formats"][i]["id"], static_cast<int>(kvq::Formats()[i]->id));
  }
}

TEST(Formats, HumanTableListsEveryFormatAndTheSimdTarget) {
  const KvqRun r = Kvq("formats --head-dim 8 --kv-heads 4");
  ASSERT_EQ(r.exit_code, 0);
  ASSERT_FALSE(kvq::Formats().empty());
  for (const kvq::FormatDesc* f : kvq::Formats()) {
    EXPECT_NE(r.out.find(f->name), std::string::npos) << f->name;
  }
  EXPECT_NE(r.out.find("SIMD target here:"), std::string::npos);
}

// Each bad input: non-zero exit, nothing on stdout, and stderr names the flag and the problem.
TEST(BadInput, ClearErrorAndNonZeroExit) {
  const struct { const char* args; const char* must_mention; } cases[] = {
      {"plan --layers 28 --kv-heads 4 --head-dim 128 --format int3 --context 10", "int3"},
      {"plan --layers 0 --kv-heads 4 --head-dim 128 --context 10", "--layers"},
      {"plan --layers=-3 --kv-heads 4 --head-dim 128 --context 10", "--layers"},
      {"plan --layers 28 --kv-heads=-4 --head-dim 128 --context 10", "--kv-heads"},
      {"plan --layers 28 --kv-heads 4 --head-dim 0 --context 10", "--head-dim"},
      {"plan --layers 28 --kv-heads 4 --head-dim 128 --context 0", "context"},
      {"plan --layers 28 --kv-heads 4 --head-dim 128 --context=-7", "context"},
      {"plan --layers 28 --kv-heads 4 --head-dim 7 --format int4 --context 10", "head_dim"},
      {"plan --layers 1 --kv-heads 1 --head-dim 8 --format fp4-e2m1 --context 10", "16"},
      {"plan --layers 9000000000000000000 --kv-heads 8 --head-dim 128 --context 10", "64 bits"},
      {"plan --layers 80 --kv-heads 8 --head-dim 128 --context 9000000000000000", "64 bits"},
      {"plan --layers 28 --kv-heads 4 --head-dim 128", "--context"},
      {"plan --layers 28 --kv-heads 4 --head-dim 128 --kv-bytes 1GB", "--weight-bytes"},
      {"plan --layers 28 --kv-heads 4 --head-dim 128 --context 10 --weight-bytes 5XB", "5XB"},
      {"plan --kv-heads 4 --head-dim 128 --context 10", "--layers"},
      {"plan --layers abc --kv-heads 4 --head-dim 128 --context 10", "abc"},
      {"formats --head-dim 0", "--head-dim"},
      {"nonsense", "nonsense"},
  };
  for (const auto& c : cases) {
    const KvqRun r = Kvq(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_TRUE(r.out.empty()) << c.args << " printed: " << r.out;
    EXPECT_NE(r.err.find(c.must_mention), std::string::npos) << c.args << " said: " << r.err;
  }
}

// The shared flags (src/cli/flags.h) are declared once: every command that takes one refuses a bad
// value at parse time with the same message, exit 2, nothing on stdout. (Dropping the validator
// from AddThreadsFlag makes the --threads 0/1025/two cases fail: the commands then run or fail
// later with other messages.)
TEST(SharedFlags, EveryCommandRefusesABadValueTheSameWay) {
  const std::string threads = "--threads: must be in 1..1024 (got 0)";
  const std::string format = "--format: unknown KV format 'nope'";
  const struct { std::string args, must_mention; } cases[] = {
      {"run -t 0", "kvq run: error: " + threads},
      {"bench attention --threads 0", "kvq bench attention: error: " + threads},
      {"bench stream --threads 0", "kvq bench stream: error: " + threads},
      {"bench matvec --threads 0", "kvq bench matvec: error: " + threads},
      {"bench decode -t 0", "kvq bench decode: error: " + threads},
      {"bench batch -t 0", "kvq bench batch: error: " + threads},
      {"eval attention -t 0", "kvq eval attention: error: " + threads},
      {"eval fidelity -t 0", "kvq eval fidelity: error: " + threads},
      {"run -t 1025", "--threads: must be in 1..1024 (got 1025)"},
      {"run -t two", "--threads: expected an integer (got 'two')"},
      {"synth --threads -1 -o x.gguf", "--threads: must be in 0..1024 (got -1)"},
      {"bench attention --format f16,nope", format},
      {"bench stream --format nope", format},
      {"bench decode --format nope", format},
      {"eval attention --format nope", format},
      {"eval fidelity --format nope", format},
      {"plan --layers 1 --kv-heads 1 --head-dim 8 --format nope --context 1", format},
      {"run --kv nope", "--kv: unknown KV format 'nope'"},
      {"run --kv-k nope", "--kv-k: unknown KV format 'nope'"},
      {"formats --head-dim 1025", "--head-dim: must be in 1..1024 (got 1025)"},
      {"bench attention --head-dim 0", "--head-dim: must be in 1..1024 (got 0)"},
      {"bench attention --context 0", "--context: must be in 1..16777216 (got 0)"},
      {"bench stream --context 4194305", "--context: must be in 1..4194304 (got 4194305)"},
      {"bench decode --context=-1", "--context: must be at least 0 (got -1)"},
      {"run --kv-host-budget 12XB", "--kv-host-budget: invalid size '12XB'"},
      {"plan --layers 1 --kv-heads 1 --head-dim 8 --context 1 --kv-device-budget 0",
       "--kv-device-budget: invalid size '0'"},
      {"bench matvec --working-set 1QB", "--working-set: invalid size '1QB'"},
      {"bench decode --kv-budget 1QB", "--kv-budget: invalid size '1QB'"},
      {"bench batch --sessions 1,0", "--sessions: must be in 1..256 (got 0)"},
      {"bench batch --kv nope", "--kv: unknown KV format 'nope'"},
      {"bench batch --context 500", "--context 500: the model's context is 512 positions"},
  };
  for (const auto& c : cases) {
    const KvqRun r = Kvq(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << " said: " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << " printed: " << r.out;
    EXPECT_NE(r.err.find(c.must_mention), std::string::npos) << c.args << " said: " << r.err;
  }
}

// The structure of `kvq bench batch --json` (its numbers are not checked: a test never times).
TEST(BenchBatch, JsonRowsPerCountWithTheBitCheck) {
  const auto j =
      Json("bench batch --sessions 1,3 --context 0,20 --steps 2 --rounds 2 -t 1 --kv int4");
  EXPECT_EQ(j["kv"], "int4");
  EXPECT_EQ(j["steps"], 2);
  ASSERT_EQ(j["results"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& r = j["results"][i];
    EXPECT_EQ(r["context"], i < 2 ? 0 : 20);
    EXPECT_EQ(r["sessions"], i % 2 == 0 ? 1 : 3);
    EXPECT_TRUE(r["bit_identical"].get<bool>());
    EXPECT_GT(r["tokens_per_second"].get<double>(), 0);
    EXPECT_LE(r["tps_min"].get<double>(), r["tokens_per_second"].get<double>());
    EXPECT_GE(r["tps_max"].get<double>(), r["tokens_per_second"].get<double>());
    if (i % 2 == 0) {
      EXPECT_EQ(r["vs_first"].get<double>(), 1.0);
    }
  }
}

TEST(Run, JsonOnTheBundledModel) {
  const auto j = Json("run -p \"Once upon a time\" -n 20 --temp 0 --kv int8");
  for (const char* key : {"prompt", "completion", "tokens", "prompt_tps", "decode_tps", "kv_bytes", "kv_format"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["prompt"], "Once upon a time");
  EXPECT_EQ(j["kv_format"], "int8");
  const auto tokens = j["tokens"].get<std::vector<int>>();
  ASSERT_EQ(tokens.size(), 5u + 20u);  // BOS + 4 prompt tokens + 20 new
  EXPECT_EQ(tokens[1], 403);
  EXPECT_FALSE(j["completion"].get<std::string>().empty());
  // int8 at 5 layers x 4 KV heads x head_dim 8: 2 x 4 x (2 + 8) bytes per layer-position.
  EXPECT_EQ(j["kv_bytes"].get<int64_t>(), 24 * 5 * 80);
  EXPECT_EQ(j["finish_reason"], "length");
}

// The finish reason in the stats line and in --json: "stop" at the model's end token (greedy
// "Once" ends its story within 400 tokens), "context" when -c leaves no room.
TEST(Run, FinishReasonIsReported) {
  const KvqRun stopped = Kvq("run -p Once -n 400 --temp 0");
  EXPECT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_NE(stopped.err.find("kvq run: finish: stop ("), std::string::npos) << stopped.err;
  const auto full = Json("run -p \"Once upon a time\" -n 400 --temp 0 -c 12");
  EXPECT_EQ(full["finish_reason"], "context");
  EXPECT_EQ(full["tokens"].size(), 13u);  // 12 positions run, and the last token sampled
}

// --stop ends the text before the first occurrence of any of its strings (repeatable), as the
// core's GenerateRequest::stop does: the completion is the unstopped one cut there, finish "stop".
TEST(Run, StopStringsEndTheText) {
  const auto free_run = Json("run -p \"Once upon a time\" -n 60 --temp 0 -t 1");
  const std::string text = free_run["completion"].get<std::string>();
  ASSERT_GT(text.size(), 40u) << text;
  // Two stop strings from the unstopped text: the one that occurs first wins.
  const std::string late = text.substr(30, 4), early = text.substr(12, 3);
  const size_t cut = std::min(text.find(late), text.find(early));
  auto quote = [](const std::string& t) {  // for the shell: '...' with each ' as '\''
    std::string q = "'";
    for (char c : t) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const auto stopped =
      Json("run -p \"Once upon a time\" -n 60 --temp 0 -t 1 --stop " + quote(late) + " --stop " + quote(early));
  EXPECT_EQ(stopped["completion"].get<std::string>(), text.substr(0, cut));
  EXPECT_EQ(stopped["finish_reason"], "stop");
  const auto ids = stopped["tokens"].get<std::vector<int>>(), all = free_run["tokens"].get<std::vector<int>>();
  ASSERT_LT(ids.size(), all.size());
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), all.begin()));  // the same tokens, up to the stop
  const KvqRun empty = Kvq("run -n 2 --stop ''");
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_NE(empty.err.find("--stop"), std::string::npos) << empty.err;
}

// --spec draft with --draft-model (-md): the bundled model drafting for itself with an int8 cache
// gives the tokens of the run without speculation, and keeps drafts; a draft source without its
// model, or a model with another source, is refused naming the flag.
TEST(Run, ADraftModelGivesTheSameTokens) {
  const std::string draft = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.bin";
  const auto plain = Json("run -p \"Once upon a time\" -n 60 --temp 0");
  const auto spec = Json("run -p \"Once upon a time\" -n 60 --temp 0 --spec draft -md " + draft +
                         " --draft-kv int8 --spec-ungated");
  EXPECT_EQ(spec["tokens"], plain["tokens"]);
  EXPECT_EQ(spec["completion"], plain["completion"]);
  EXPECT_GT(spec["accepted_tokens"].get<int64_t>(), 0) << spec.dump();
  const KvqRun missing = Kvq("run -n 2 --spec draft");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("--draft-model"), std::string::npos) << missing.err;
  const KvqRun both = Kvq("run -n 2 --spec ngram -md " + draft);
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--draft-model"), std::string::npos) << both.err;
}

TEST(Run, BadInputIsRefused) {
  const struct { const char* args; const char* must_mention; int exit_code; } cases[] = {
      {"run -m /nonexistent/model.bin", "/nonexistent/model.bin", 2},
      {"run --kv int3", "int3", 2},
      {"run --kv-k f16 --kv-v nope", "--kv-v", 2},
      {"run -c 100000", "-c", 2},
      {"run --temp -1", "--temp", 2},
      {"run --kv-device-budget 1KiB", "--kv-device-budget", 2},
      {"run --kv-host-budget 2GB", "", 0},
      {"run -c 3 -p \"Once upon a time\"", "context", 1},
  };
  for (const auto& c : cases) {
    const KvqRun r = Kvq(std::string(c.args) + " -n 2 --temp 0");
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << " said: " << r.err;
    EXPECT_NE(r.err.find(c.must_mention), std::string::npos) << c.args << " said: " << r.err;
  }
}

// --prompt-cache: the second run reuses the saved prefix and gives the same tokens; a file from
// another format, or a corrupt or truncated one, stops the run with an error naming it.
TEST(Run, PromptCacheReusesAndRefusesBadFiles) {
  const std::string file = testing::TempDir() + "/kvq_prompt_cache_" + std::to_string(getpid()) + ".kvq";
  std::remove(file.c_str());
  const std::string args = "run -p \"Once upon a time there was a cat\" -n 12 --temp 0 --prompt-cache " + file;
  const auto first = Json(args);
  EXPECT_EQ(first["prompt_cache_reused_tokens"].get<int>(), 0);
  const auto second = Json(args);
  EXPECT_GT(second["prompt_cache_reused_tokens"].get<int>(), 0);
  EXPECT_EQ(second["tokens"], first["tokens"]);
  // Another KV format: refused, exit != 0, the file named.
  KvqRun r = Kvq(args + " --kv int4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("int4"), std::string::npos) << r.err;
  // Corrupt (a flipped byte in the data) and truncated files.
  const std::string good = Slurp(file);
  for (const std::string& damaged : {good.substr(0, good.size() / 2), good.substr(0, 10),
                                     [&] { std::string d = good; d[good.size() - 20] ^= 0x5A; return d; }()}) {
    { std::ofstream(file, std::ios::binary) << damaged; }
    r = Kvq(args);
    EXPECT_NE(r.exit_code, 0) << "a damaged prompt cache was used";
    EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  }
  std::remove(file.c_str());
}

TEST(Help, EverySubcommandHasHelp) {
  for (const char* sub : {"", "plan ", "formats ", "run ", "bench attention ", "bench stream "}) {
    const KvqRun r = Kvq(std::string(sub) + "--help");
    EXPECT_EQ(r.exit_code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
  }
}

}  // namespace
