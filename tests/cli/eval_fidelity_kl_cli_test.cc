// `kvq eval fidelity --kl-divergence-base(-out)` end to end on the bundled model and text: kvq
// writes a llama.cpp logits file and reads it back (JSON with the documented keys, every top token
// agreeing), prints llama.cpp's statistics, and refuses bad files and flag mixes with exit 2 and a
// message naming the file or flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;
using kvq_test::Slurp;

const kvq_test::TempFilesRemovedAtExit kRemoved{testing::TempDir() + "/kvq_kl_cli_" + std::to_string(getpid())};

std::string TempPath(const std::string& name) { return kRemoved.stem + "_" + name; }

// A base file from the bundled model: 3 chunks of 128 tokens of the bundled text.
std::string WriteBase(const std::string& name, const std::string& kv = "f32") {
  const std::string path = TempPath(name);
  const KvqRun r = RunKvq("eval fidelity -c 128 --kv " + kv + " --kl-divergence-base-out " + path);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("wrote " + path + " (3 chunks of 128 tokens, 189 records)"), std::string::npos) << r.err;
  return path;
}

TEST(EvalFidelityKlCli, KvqReadsItsOwnFileBackWithEveryTopTokenAgreeing) {
  const std::string base = WriteBase("self.bin");
  const KvqRun r = RunKvq("eval fidelity --kv f32 --json --kl-divergence-base " + base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"model", "text", "kv", "n_ctx", "n_chunk", "positions", "ppl", "kl_divergence_base",
                          "kl_divergence_base_out", "comparison"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["n_ctx"], 128);
  EXPECT_EQ(j["n_chunk"], 3);
  EXPECT_EQ(j["positions"], 189);
  EXPECT_TRUE(j["kl_divergence_base_out"].is_null());
  const nlohmann::json& c = j["comparison"];
  EXPECT_EQ(c["count"], 189);
  EXPECT_EQ(c["same_top"]["fraction"].get<double>(), 1.0);
  EXPECT_EQ(c["same_top"]["count"], 189);
  // The bound of the uint16 encoding, derived in tests/measure/kl_divergence_test.cc.
  EXPECT_LE(c["kl"]["quantiles"]["max"].get<double>(), 1.3e-4);
  EXPECT_GE(c["kl"]["quantiles"]["min"].get<double>(), -1.3e-4);
  for (const char* q : {"max", "99.9%", "99.0%", "95.0%", "90.0%", "median", "10.0%", "5.0%", "1.0%", "0.1%",
                        "min"}) {
    EXPECT_TRUE(c["kl"]["quantiles"].contains(q)) << q;
    EXPECT_TRUE(c["p_diff"]["quantiles"].contains(q)) << q;
  }
  for (const char* key : {"ppl", "ppl_base", "ln_ppl_ratio", "ppl_ratio", "ppl_diff"}) {
    EXPECT_TRUE(c[key].contains("value") && c[key].contains("error")) << key;
  }
  EXPECT_TRUE(c["p_diff"].contains("rms"));
}

TEST(EvalFidelityKlCli, TheTextShowsLlamaCppsStatisticsAndAnotherKvSpecsDamage) {
  const std::string base = WriteBase("text.bin");
  const KvqRun r = RunKvq("eval fidelity --kv int4 --kl-divergence-base " + base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"====== KL divergence statistics ======", "Mean    KLD:", "Maximum KLD:", "99.9%   KLD:",
                           "Median  KLD:", "Minimum KLD:", "Mean    Δp:", "RMS Δp    :", "Same top p:",
                           "Mean PPL(Q)/PPL(base)", "KV int4", "3 chunks of 128 tokens"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  const KvqRun j = RunKvq("eval fidelity --kv int4 --json --kl-divergence-base " + base);
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_GT(nlohmann::json::parse(j.out)["comparison"]["kl"]["mean"].get<double>(), 1e-3);
}

TEST(EvalFidelityKlCli, BadFilesAndFlagMixesAreRefused) {
  const std::string base = WriteBase("bad.bin");
  auto refused = [](const std::string& args, const std::string& what) {
    const KvqRun r = RunKvq(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << args << "\n" << r.err;
  };
  const std::string bytes = Slurp(base);
  const std::string cut = TempPath("cut.bin");
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  refused("eval fidelity --kl-divergence-base " + cut,
          cut + ": truncated: " + std::to_string(bytes.size() - 100) + " bytes, expected " +
              std::to_string(bytes.size()));
  const std::string magic = TempPath("magic.bin");
  std::ofstream(magic, std::ios::binary) << "_logitz_" << bytes.substr(8);
  refused("eval fidelity --kl-divergence-base " + magic, magic + ": not a llama.cpp logits file");
  // Another text: the ids differ from the file's.
  const std::string text = TempPath("other.txt");
  std::string other;
  for (int i = 0; i < 60; ++i) other += "The dog ran to the park and saw a big red ball. ";
  std::ofstream(text) << other;
  refused("eval fidelity -f " + text + " --kl-divergence-base " + base,
          "but kvq's tokenization of the text gives");
  refused("eval fidelity -c 64 --kl-divergence-base " + base, "-c 64: " + base + " was written with n_ctx 128");
  refused("eval fidelity -c 1024 --kl-divergence-base-out " + TempPath("big.bin"),
          "-c 1024: more than the model's context of 512 positions");
  refused("eval fidelity --kv int4", "--kv, --kv-k, --kv-v and -c apply with --kl-divergence-base");
  refused("eval fidelity --format int4 --kl-divergence-base " + base, "--format and --plot compare KV formats");
  refused("eval fidelity --kl-divergence-base " + base + " --kl-divergence-base-out " + base, "the same file");
  refused("eval fidelity --kl-divergence-base-out " + TempPath("short.bin"),
          "fewer than one chunk of -c 512");  // the bundled text is about 450 tokens
}

}  // namespace
