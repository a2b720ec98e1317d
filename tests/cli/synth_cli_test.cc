// `kvq synth` end to end: a tiny custom shape is written, reported (shape, parameters, size),
// loadable and runnable by `kvq run`; a preset with overrides keeps the preset's conventions; bad
// input (an unknown preset, a shape that does not divide, an unknown type or flag, a missing -o,
// an existing output without --force, a missing folder, a bad --layer-output-scale) exits 2 naming
// the flag or file.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kvq/units.h"
#include "gguf/gguf_reader.h"

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::Slurp;

namespace fs = std::filesystem;

class SynthCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / fmt::format("kvq_synth_cli_{}", ::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  KvqRun Kvq(const std::string& args) const { return kvq_test::RunKvq(args); }

  fs::path dir_;
};

constexpr const char* kTiny = "synth --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --context 128";

TEST_F(SynthCli, TinyShapeIsWrittenReportedAndRuns) {
  const std::string out = Path("tiny.gguf");
  const KvqRun r = Kvq(fmt::format("{} --type q8_0 --seed 3 -t 2 -o {}", kTiny, out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Parameters: embeddings 512·64 twice (separate output) + 2 layers of (2·64 norms + 2·64·64 q, o
  // + 2·64·32 k, v + 3·64·128 ffn) + 64 = 65,536 + 73,984 + 64.
  EXPECT_NE(r.out.find("139,584 parameters"), std::string::npos) << r.out;
  // The size printed before writing is the file's size.
  const std::string size = kvq::FormatCount(static_cast<int64_t>(fs::file_size(out)));
  EXPECT_NE(r.out.find(fmt::format("({} bytes)", size)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dim 64, 2 layers, 4 heads / 2 KV heads (head_dim 16), ffn 128"), std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("layer 1/2 written"), std::string::npos) << r.err;  // progress per layer
  auto f = kvq::GgufFile::Open(out);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_down.weight").value()->type, kvq::GgmlType::kQ8_0);
  const KvqRun run = Kvq(fmt::format("run -m {} -p \"Once upon a time\" -n 8 --temp 0", out));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("Once upon a time"), std::string::npos) << run.out;
  // Random weights emit byte tokens that are not UTF-8: --json still prints one document.
  for (int seed = 1; seed <= 3; ++seed) {
    const KvqRun js = Kvq(fmt::format("run -m {} -n 30 --json --seed {}", out, seed));
    EXPECT_EQ(js.exit_code, 0) << js.err;
    const nlohmann::json doc = nlohmann::json::parse(js.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(doc.is_discarded()) << js.out;
    EXPECT_TRUE(doc.contains("completion")) << js.out;
  }

  // Again without --force: refused, the file untouched; with --force: written again, the same bytes.
  const std::string before = Slurp(out);
  const KvqRun again = Kvq(fmt::format("{} --type q8_0 --seed 3 -o {}", kTiny, out));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find("--force"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find(out), std::string::npos) << again.err;
  const KvqRun forced = Kvq(fmt::format("{} --type q8_0 --seed 3 -t 1 -o {} --force", kTiny, out));
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_TRUE(Slurp(out) == before);  // one thread instead of two: the same bytes
}

// The hybrids end to end: a tiny preset of each is written and run by `kvq run`, whose KV cache
// holds only the two attention layers (f16: positions · 2 layers · K and V · 2 heads · 32 · 2
// bytes); a prompt cache carries the recurrent state: the second run reuses the saved prefix and
// prints the first run's text (greedy), and another model's cache is refused, naming it.
TEST_F(SynthCli, TinyHybridsAreWrittenAndRun) {
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe", "tiny-qwen3next"}) {
    SCOPED_TRACE(preset);
    const std::string out = Path(std::string(preset) + ".gguf");
    const KvqRun r = Kvq(fmt::format("synth --preset {} -o {}", preset, out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const KvqRun run = Kvq(fmt::format("run -m {} -p \"Once upon a time\" -n 8 --temp 0", out));
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_NE(run.out.find("Once upon a time"), std::string::npos) << run.out;
    const std::string positions = run.err.substr(0, run.err.find(" tokens at"));
    const auto n_prompt = std::stoll(positions.substr(positions.rfind(' ') + 1));
    const int64_t kv = (n_prompt + 7) * 2 * 2 * 2 * 32 * 2;  // the last token sampled is not run
    EXPECT_NE(run.err.find(fmt::format("KV cache {} bytes", kvq::FormatCount(kv))),
              std::string::npos)
        << run.err;
    const std::string cache = Path(std::string(preset) + ".kvqs");
    const std::string cached_run =
        fmt::format("run -m {} -p \"Once upon a time\" -n 8 --temp 0 --prompt-cache {}", out, cache);
    const KvqRun saving = Kvq(cached_run);
    EXPECT_EQ(saving.exit_code, 0) << saving.err;
    const KvqRun reusing = Kvq(cached_run);
    EXPECT_EQ(reusing.exit_code, 0) << reusing.err;
    EXPECT_NE(reusing.err.find("reused"), std::string::npos) << reusing.err;
    EXPECT_EQ(reusing.out, run.out);  // the restored state continues exactly
    EXPECT_EQ(saving.out, run.out);
  }
  // A prompt cache of one hybrid is not another's.
  const KvqRun other = Kvq(fmt::format("run -m {} -p \"Once upon a time\" -n 2 --prompt-cache {}",
                                       Path("tiny-qwen35moe.gguf"), Path("tiny-qwen35.kvqs")));
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_NE(other.err.find("was saved for another model"), std::string::npos) << other.err;
}

TEST_F(SynthCli, PresetWithOverridesKeepsItsConventions) {
  const std::string out = Path("q.gguf");
  const KvqRun r = Kvq(fmt::format("synth --preset qwen2.5-0.5b --dim 64 --layers 2 --heads 4 "
                                   "--kv-heads 2 --ffn 128 --vocab-size 640 --type f16 -o {}", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto f = kvq::GgufFile::Open(out);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "qwen2");
  EXPECT_EQ(*(*f)->GetString("general.name"), "qwen2.5-0.5b-custom");
  EXPECT_EQ(*(*f)->GetF32("qwen2.rope.freq_base"), 1000000.0f);
  EXPECT_TRUE((*f)->FindTensor("blk.0.attn_q.bias").ok());
  EXPECT_FALSE((*f)->FindTensor("output.weight").ok());  // tied, as the preset
  EXPECT_EQ((*f)->FindTensor("token_embd.weight").value()->dims, (std::vector<int64_t>{64, 640}));
  EXPECT_NE(r.out.find("128 control tokens"), std::string::npos) << r.out;
}

// A preset's own weight type survives without --type (bonsai: Q1_0, GGUF type id 41), and --type
// overrides it. Until Q1_0 is in the registry the preset is refused naming the type.
TEST_F(SynthCli, BonsaiPresetKeepsItsTypeAndTypeOverridesIt) {
  const std::string out = Path("bonsai.gguf");
  const std::string shape = "synth --preset bonsai-1.7b --layers 1 --vocab-size 512 ";
  const KvqRun own = Kvq(shape + "-o " + out);
  if (own.exit_code == 0) {
    auto f = kvq::GgufFile::Open(out);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(static_cast<uint32_t>((*f)->FindTensor("blk.0.attn_q.weight").value()->type), 41u);
    fs::remove(out);
  } else {
    EXPECT_EQ(own.exit_code, 2) << own.err;
    EXPECT_NE(own.err.find("weight type q1_0 is not registered"), std::string::npos) << own.err;
  }
  const KvqRun q8 = Kvq(shape + "--type q8_0 -o " + out);
  ASSERT_EQ(q8.exit_code, 0) << q8.err;
  auto f = kvq::GgufFile::Open(out);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "qwen3");
  EXPECT_EQ(*(*f)->GetU32("qwen3.attention.key_length"), 128u);
  EXPECT_EQ((*f)->FindTensor("blk.0.attn_q.weight").value()->type, kvq::GgmlType::kQ8_0);
  EXPECT_EQ((*f)->FindTensor("blk.0.attn_q.weight").value()->dims, (std::vector<int64_t>{2048, 2048}));
  EXPECT_TRUE((*f)->FindTensor("blk.0.attn_k_norm.weight").ok());
}

// --layer-output-scale through the CLI: the target says what it scales, its --layers 1 cut of the
// same seed runs its tokens and, as `kvq run`'s draft model, has every drafted token kept (the
// unscaled target, what ignoring the flag writes, rejects some).
TEST_F(SynthCli, LayerOutputScaleMakesTheCutADraftThatAlwaysAgrees) {
  constexpr const char* kShape = "synth --dim 64 --heads 4 --kv-heads 2 --ffn 128 --context 256 --type q4_0 --seed 3";
  const std::string target = Path("target.gguf"), unscaled = Path("unscaled.gguf"), cut = Path("cut.gguf");
  const KvqRun r = Kvq(fmt::format("{} --layers 3 --layer-output-scale 1:0 -o {}", kShape, target));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("output projections of layers 1.. scaled by 0"), std::string::npos) << r.out;
  ASSERT_EQ(Kvq(fmt::format("{} --layers 3 -o {}", kShape, unscaled)).exit_code, 0);
  ASSERT_EQ(Kvq(fmt::format("{} --layers 1 -o {}", kShape, cut)).exit_code, 0);
  const std::string run = "run -p \"Once upon a time\" -n 32 --temp 0 --json -m ";
  const auto tokens = [](const KvqRun& k) {
    const nlohmann::json doc = nlohmann::json::parse(k.out, nullptr, /*allow_exceptions=*/false);
    return doc.is_discarded() ? nlohmann::json() : doc;
  };
  const nlohmann::json alone = tokens(Kvq(run + target));
  ASSERT_TRUE(alone.contains("tokens")) << alone;
  EXPECT_EQ(tokens(Kvq(run + cut))["tokens"], alone["tokens"]);
  const std::string drafting = fmt::format(" --spec-ungated --draft-max 4 --draft-p-min 1e-6 --draft-model {}", cut);
  const nlohmann::json drafted = tokens(Kvq(run + target + drafting));
  EXPECT_EQ(drafted["tokens"], alone["tokens"]);
  // All 32 tokens (seed 3's do not end early): an end token inside a draft would leave the drafted
  // tokens after it unkept, though the draft agreed.
  EXPECT_EQ(drafted["finish_reason"], "length");
  EXPECT_GE(drafted["drafted_tokens"].get<int64_t>(), 16);
  EXPECT_EQ(drafted["accepted_tokens"], drafted["drafted_tokens"]);
  const nlohmann::json rejected = tokens(Kvq(run + unscaled + drafting));
  EXPECT_LT(rejected["accepted_tokens"].get<int64_t>(), rejected["drafted_tokens"].get<int64_t>());
}

TEST_F(SynthCli, BadInputExits2NamingTheFlag) {
  const std::string out = Path("bad.gguf");
  const struct {
    std::string args;
    std::string must_mention;
  } cases[] = {
      {"synth --preset llama-9b -o " + out, "llama-9b"},
      {"synth --preset llama-9b -o " + out, "llama-3.2-1b"},  // the list of presets
      {std::string(kTiny) + " --heads 5 -o " + out, "--heads"},
      {std::string(kTiny) + " --kv-heads 3 -o " + out, "--kv-heads"},
      {std::string(kTiny) + " --ffn 100 --type q4_0 -o " + out, "--ffn"},
      {std::string(kTiny) + " --type iq2_xxs -o " + out, "--type"},
      {std::string(kTiny) + " --arch gemma -o " + out, "--arch"},
      {std::string(kTiny) + " --vocab-size 100 -o " + out, "--vocab-size"},
      {std::string(kTiny) + " --vocab " + Path("none.gguf") + " -o " + out, Path("none.gguf")},
      {std::string(kTiny) + " --embeddings shared -o " + out, "--embeddings"},
      {std::string(kTiny) + " --threads -3 -o " + out, "--threads"},
      {std::string(kTiny), "-o"},
      {std::string(kTiny) + " -o " + Path("bad.bin"), "must end in .gguf"},
      {"synth --dim 64 --layers 2 --ffn 128 -o " + out, "--heads"},
      {std::string(kTiny) + " --bogus 1 -o " + out, "--bogus"},
      {std::string(kTiny) + " -o " + Path("no/such/dir/x.gguf"), Path("no/such/dir")},
      {std::string(kTiny) + " --layer-output-scale 1 -o " + out, "--layer-output-scale 1: expected FROM:SCALE"},
      {std::string(kTiny) + " --layer-output-scale 1:-0.5 -o " + out, "--layer-output-scale 1:-0.5"},
      {std::string(kTiny) + " --layer-output-scale 1:inf -o " + out, "finite"},
      {std::string(kTiny) + " --layer-output-scale 2:0 -o " + out, "--layers 2"},
  };
  for (const auto& c : cases) {
    const KvqRun r = Kvq(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.must_mention), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
}

}  // namespace
