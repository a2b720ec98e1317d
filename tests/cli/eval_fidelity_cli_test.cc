// `kvq eval fidelity` end to end: JSON with the documented keys, a Markdown table, bad flags and
// files refused with exit 2 and a message naming them, a long text cut to the context with a note
// on stderr, and --plot writing a real PNG or SVG through gnuplot.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::Slurp;

namespace fs = std::filesystem;

// A path unique to this process (CTest runs the tests in parallel processes).
std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/kvq_fidelity_cli_" + std::to_string(getpid()) + "_" + name;
}

KvqRun Kvq(const std::string& args) { return kvq_test::RunKvq(args); }

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

TEST(EvalFidelityCli, JsonHasTheDocumentedKeys) {
  const KvqRun r = Kvq("eval fidelity --format f32,int4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"model", "text", "positions", "reference_ppl", "formats"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_NE(j["model"].get<std::string>().find("stories260K.bin"), std::string::npos);
  EXPECT_NE(j["text"].get<std::string>().find("tinystories-eval.txt"), std::string::npos);
  const int64_t n = j["positions"].get<int64_t>();
  EXPECT_GE(n, 2);
  EXPECT_LE(n, 512);
  ASSERT_EQ(j["formats"].size(), 2u);
  for (const auto& f : j["formats"]) {
    for (const char* key : {"format", "bits_per_number", "memory_vs_f16", "logit_drift", "kl", "top1_agree",
                            "positions", "ppl"}) {
      EXPECT_TRUE(f.contains(key)) << key;
    }
    EXPECT_EQ(f["positions"].get<int64_t>(), n);
    EXPECT_GE(f["top1_agree"].get<double>(), 0.0);  // a fraction, not a count
    EXPECT_LE(f["top1_agree"].get<double>(), 1.0);
  }
  EXPECT_EQ(j["formats"][0]["format"], "f32");
  EXPECT_EQ(j["formats"][0]["top1_agree"].get<double>(), 1.0);
  EXPECT_EQ(j["formats"][0]["kl"].get<double>(), 0.0);
  EXPECT_EQ(j["formats"][0]["ppl"].get<double>(), j["reference_ppl"].get<double>());
  EXPECT_EQ(j["formats"][1]["format"], "int4");
  EXPECT_EQ(j["formats"][1]["bits_per_number"].get<double>(), 6.0);  // 4 + 16/8 at head_dim 8
  EXPECT_GT(j["formats"][1]["kl"].get<double>(), 0.0);
  // Progress on stderr, one line per arm.
  EXPECT_NE(r.err.find("reference"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("int4"), std::string::npos) << r.err;
}

TEST(EvalFidelityCli, MarkdownTableHasAHeaderLineAndOneRowPerFormat) {
  const KvqRun r = Kvq("eval fidelity --format int8,fp4-e2m1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("stories260K.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tinystories-eval.txt"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("positions"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| format | bits/number | memory vs f16 | logit drift |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| int8 | 10 | 62."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| fp4-e2m1 | 4.5 | 28."), std::string::npos) << r.out;
}

TEST(EvalFidelityCli, UnknownFormatIsBadInputNamingTheFlag) {
  const KvqRun r = Kvq("eval fidelity --format int4,int3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--format"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("int3"), std::string::npos) << r.err;
}

TEST(EvalFidelityCli, MissingTextFileIsBadInputNamingThePath) {
  const std::string path = TempPath("no-such-text.txt");
  const KvqRun r = Kvq("eval fidelity --format int8 -f " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(EvalFidelityCli, EmptyTextFileIsBadInput) {
  const std::string path = TempPath("empty.txt");
  std::ofstream(path).close();
  const KvqRun r = Kvq("eval fidelity --format int8 -f " + path);
  fs::remove(path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
}

TEST(EvalFidelityCli, TextLongerThanTheContextIsCutWithANote) {
  const std::string bundled = Slurp(std::string(KVQ_SOURCE_DIR) + "/data/eval/tinystories-eval.txt");
  ASSERT_FALSE(bundled.empty());
  const std::string path = TempPath("long.txt");
  std::ofstream(path) << bundled << "\n" << bundled << "\n" << bundled;
  const KvqRun r = Kvq("eval fidelity --format f32 --json -f " + path);
  fs::remove(path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["positions"].get<int64_t>(), 512);  // stories260K's context
  EXPECT_NE(r.err.find("using the first 512"), std::string::npos) << r.err;
}

TEST(EvalFidelityCli, PlotWithAnotherExtensionIsBadInput) {
  const KvqRun r = Kvq("eval fidelity --format int8 --plot " + TempPath("plot.pdf"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--plot"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(".png or .svg"), std::string::npos) << r.err;
}

TEST(EvalFidelityCli, PlotWithoutGnuplotFailsBeforeTheRunSayingSo) {
  const std::string path = TempPath("plot-no-gnuplot.png");
  const std::string cmd = "PATH=/nonexistent " + std::string(KVQ_BINARY) + " eval fidelity --format int8 --plot " +
                          path + " >/dev/null 2>" + TempPath("gp.err");
  const int status = std::system(cmd.c_str());
  const std::string err = Slurp(TempPath("gp.err"));
  std::remove(TempPath("gp.err").c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(err.find("gnuplot"), std::string::npos) << err;
  EXPECT_EQ(err.find("reference"), std::string::npos) << "refused before measuring: " << err;
  EXPECT_FALSE(fs::exists(path));
}

TEST(EvalFidelityCli, PlotWritesAPngAndAnSvg) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)";
  for (const char* ext : {"png", "svg"}) {
    const std::string path = TempPath(std::string("plot.") + ext);
    const KvqRun r = Kvq("eval fidelity --format f32,int8,int4 --plot " + path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(fs::exists(path)) << path;
    const std::string bytes = Slurp(path);
    fs::remove(path);
    ASSERT_GT(bytes.size(), 0u) << ext;
    if (std::string(ext) == "png") {
      EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
    } else {
      EXPECT_NE(bytes.find("<svg"), std::string::npos);
      EXPECT_NE(bytes.find("int4"), std::string::npos);  // the point labels are drawn
    }
  }
}

}  // namespace
