// The fuzz targets (fuzz/<name>_fuzzer.cc, compiled here as plain functions: KVQ_FUZZ_NO_MAIN) run
// on every input saved in fuzz/regressions/<target>/ (each one crashed, hung, leaked or
// over-allocated before its fix: docs/reliability.md names the commit) and on the generated seed
// corpus (fuzz/corpus.h). A target reports a broken property by aborting, so a regression fails the
// test that ran it, and under the sanitizer build so does any memory error or leak. As in the
// fuzz build, no single allocation may exceed fuzz::AllocationLimit(input size) (fuzz_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fuzz/corpus.h"
#include "fuzz/fuzz_util.h"
#include "test_util/largest_allocation.h"
#include "test_util/random_rows.h"

namespace kvq::fuzz {
int FuzzGguf(const uint8_t* data, size_t size);
int FuzzLlama2c(const uint8_t* data, size_t size);
int FuzzSnapshot(const uint8_t* data, size_t size);
int FuzzTokenizerSpm(const uint8_t* data, size_t size);
int FuzzTokenizerBpe(const uint8_t* data, size_t size);
int FuzzParsers(const uint8_t* data, size_t size);
int FuzzChatTemplate(const uint8_t* data, size_t size);
int FuzzOpenAiRequest(const uint8_t* data, size_t size);
}  // namespace kvq::fuzz

namespace kvq {
namespace {

namespace fs = std::filesystem;
using FuzzFn = int (*)(const uint8_t*, size_t);

const std::map<std::string, FuzzFn>& Targets() {
  static const std::map<std::string, FuzzFn> targets = {
      {"gguf", fuzz::FuzzGguf},
      {"llama2c", fuzz::FuzzLlama2c},
      {"snapshot", fuzz::FuzzSnapshot},
      {"tokenizer_spm", fuzz::FuzzTokenizerSpm},
      {"tokenizer_bpe", fuzz::FuzzTokenizerBpe},
      {"parsers", fuzz::FuzzParsers},
      {"chat_template", fuzz::FuzzChatTemplate},
      {"openai_request", fuzz::FuzzOpenAiRequest},
  };
  return targets;
}

std::vector<uint8_t> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs every file under `dir` through `fn`; returns how many. The name goes to stderr first, so
// an abort's report says which input it was.
int RunAll(const fs::path& dir, FuzzFn fn) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  fn(nullptr, 0);  // one-time setup (a vocabulary loaded into a static), not counted below
  for (const fs::path& f : files) {
    std::fprintf(stderr, "input %s\n", f.string().c_str());
    const std::vector<uint8_t> bytes = ReadFile(f);
    kvq_test::g_largest_allocation = 0;
    kvq_test::g_track_allocations = true;
    const int rc = fn(bytes.data(), bytes.size());
    kvq_test::g_track_allocations = false;
    EXPECT_EQ(rc, 0) << f;
    EXPECT_LE(kvq_test::g_largest_allocation.load(), fuzz::AllocationLimit(bytes.size())) << f;
  }
  return static_cast<int>(files.size());
}

const fs::path kRegressions = fs::path(KVQ_SOURCE_DIR) / "fuzz" / "regressions";

TEST(FuzzRegression, TargetsMatchTheCorpusList) {
  std::set<std::string> listed(std::begin(fuzz::kFuzzTargets), std::end(fuzz::kFuzzTargets));
  std::set<std::string> here;
  for (const auto& [name, fn] : Targets()) here.insert(name);
  EXPECT_EQ(listed, here);
  // Every regression folder is a target's (a misspelt folder would never run).
  if (!fs::exists(kRegressions)) return;  // no finding saved yet
  for (const fs::directory_entry& e : fs::directory_iterator(kRegressions)) {
    EXPECT_TRUE(Targets().count(e.path().filename().string())) << e.path();
  }
}

// Every saved finding, through its target (a target with no finding has no folder: nothing to run).
TEST(FuzzRegression, SavedInputsPass) {
  ASSERT_TRUE(fs::exists(kRegressions)) << kRegressions;
  int inputs = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(kRegressions)) {
    const auto target = Targets().find(e.path().filename().string());
    ASSERT_NE(target, Targets().end()) << e.path();
    SCOPED_TRACE(e.path().string());
    inputs += RunAll(e.path(), target->second);
  }
  EXPECT_GT(inputs, 0);
}

class FuzzTarget : public testing::TestWithParam<std::string> {};

TEST_P(FuzzTarget, GeneratedSeedCorpus) {
  const kvq_test::TempDir scratch;
  const Status s = fuzz::WriteSeedCorpus(scratch.path.string(), GetParam());
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GT(RunAll(scratch.path / GetParam(), Targets().at(GetParam())), 0);
}

INSTANTIATE_TEST_SUITE_P(All, FuzzTarget,
                         testing::Values("gguf", "llama2c", "snapshot", "tokenizer_spm", "tokenizer_bpe", "parsers",
                                         "chat_template", "openai_request"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace kvq
