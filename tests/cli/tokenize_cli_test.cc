// `kvq tokenize` end to end: --ids prints exactly the ids of llama.cpp's known answers for the
// GPT-2 vocabulary (every input, read with -f); the default output is one "id -> 'piece'" line
// per token with control characters escaped; without -m it tokenizes with the bundled model as
// the library does; a missing file or bad flags exit 2 with the file or flag named.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "text/tokenizer.h"

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::Slurp;

const std::string kVocabDir = std::string(KVQ_SOURCE_DIR) + "/tests/testdata/vocab/";
const std::string kGpt2 = kVocabDir + "ggml-vocab-gpt-2.gguf";

std::string Stem() { return testing::TempDir() + "/kvq_tokenize_cli_" + std::to_string(getpid()); }

KvqRun Kvq(const std::string& args) { return kvq_test::RunKvq(args); }

// Writes `text` to a file for -f (no shell quoting of arbitrary bytes).
std::string TextFile(const std::string& text) {
  const std::string path = Stem() + ".txt";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Removes the text file the tests write for -f.
class TokenizeCli : public testing::Test {
 protected:
  void TearDown() override { std::remove((Stem() + ".txt").c_str()); }
};

TEST_F(TokenizeCli, IdsMatchTheGpt2KnownAnswers) {
  // The .inp/.out pairs of llama.cpp's test-tokenizer-0 (see tokenizer_spm_test.cc for the format).
  const std::string all = Slurp(kGpt2 + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t at = 0, hit; (hit = all.find(sep, at)) != std::string::npos; at = hit + sep.size()) {
    inputs.push_back(all.substr(at, hit - at));
  }
  std::istringstream out_file(Slurp(kGpt2 + ".out"));
  std::vector<std::string> want;  // the ids, one space between, as --ids prints them
  for (std::string line; std::getline(out_file, line);) {
    std::istringstream ids(line);
    std::string joined;
    for (int id; ids >> id;) {
      if (!joined.empty()) joined += ' ';
      joined += std::to_string(id);
    }
    want.push_back(joined + "\n");
  }
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(want.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const KvqRun r = Kvq("tokenize -m " + kGpt2 + " -f " + TextFile(inputs[i]) + " --ids");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want[i]) << "input " << i;
  }
  // -p gives the same: " Hello World!" is 18435 2159 0 in the .out file.
  const KvqRun r = Kvq("tokenize -m " + kGpt2 + " -p ' Hello World!' --ids");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "18435 2159 0\n");
}

TEST_F(TokenizeCli, OneLinePerTokenWithEscapes) {
  // GPT-2: 'a' is id 64 ('!' is 0 and printable ASCII follows in order), "\n" is 198 (.out file).
  const KvqRun r = Kvq("tokenize -m " + kGpt2 + " -f " + TextFile("a\nb\\"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "    64 -> 'a'\n   198 -> '\\n'\n    65 -> 'b'\n    59 -> '\\\\'\n");
  // A token holding part of a UTF-8 character prints its bytes escaped; the control token its text.
  const KvqRun llama = Kvq("tokenize -m " + kGpt2 + " -f " + TextFile("\xF0\x9F\xA6\x99<|endoftext|>"));
  EXPECT_EQ(llama.exit_code, 0) << llama.err;
  EXPECT_NE(llama.out.find("\\xf0\\x9f"), std::string::npos) << llama.out;
  EXPECT_NE(llama.out.find(" 50256 -> '<|endoftext|>'\n"), std::string::npos) << llama.out;
}

TEST_F(TokenizeCli, BundledModelAsTheLibraryTokenizes) {
  kvq::Result<std::unique_ptr<kvq::GgufFile>> file =
      kvq::GgufFile::Open(std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(file.ok()) << file.status().message();
  kvq::Result<kvq::Tokenizer> tok = kvq::Tokenizer::LoadGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const std::string text = "Once upon a time, there was a little girl.";
  ASSERT_TRUE(tok->add_bos());

  const KvqRun ids = Kvq("tokenize -p '" + text + "' --ids");
  EXPECT_EQ(ids.exit_code, 0) << ids.err;
  std::string want_ids;
  for (const int32_t id : tok->Encode(text, false)) {
    if (!want_ids.empty()) want_ids += ' ';
    want_ids += std::to_string(id);
  }
  EXPECT_EQ(ids.out, want_ids + "\n");  // --ids: no BOS

  // The default output starts with BOS (the vocabulary asks for it); --no-bos drops it.
  const KvqRun lines = Kvq("tokenize -p '" + text + "'");
  EXPECT_EQ(lines.exit_code, 0) << lines.err;
  std::string want_lines;
  for (const int32_t id : tok->Encode(text, true)) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%6d", id);
    want_lines += std::string(buf) + " -> '" + tok->piece(id) + "'\n";
  }
  EXPECT_EQ(lines.out, want_lines);
  EXPECT_EQ(lines.out.rfind("     1 -> '<s>'\n", 0), 0u) << lines.out;
  const KvqRun no_bos = Kvq("tokenize --no-bos -p '" + text + "'");
  EXPECT_EQ(no_bos.out, want_lines.substr(want_lines.find('\n') + 1));
}

TEST_F(TokenizeCli, BadInputExitsTwoNamingTheFileOrFlag) {
  const std::string missing = Stem() + "-no-such-vocab.gguf";
  const KvqRun m = Kvq("tokenize -m " + missing + " -p hi");
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_NE(m.err.find(missing), std::string::npos) << m.err;
  EXPECT_TRUE(m.out.empty());

  const std::string missing_text = Stem() + "-no-such-text.txt";
  const KvqRun f = Kvq("tokenize -m " + kGpt2 + " -f " + missing_text);
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_NE(f.err.find("-f " + missing_text), std::string::npos) << f.err;

  const KvqRun neither = Kvq("tokenize -m " + kGpt2);
  EXPECT_EQ(neither.exit_code, 2);
  EXPECT_NE(neither.err.find("-p"), std::string::npos) << neither.err;

  const KvqRun both = Kvq("tokenize -m " + kGpt2 + " -p x -f " + TextFile("y"));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("-f"), std::string::npos) << both.err;

  // A file that is not GGUF at all (the .inp text file).
  const KvqRun not_gguf = Kvq("tokenize -m " + kGpt2 + ".inp -p hi");
  EXPECT_EQ(not_gguf.exit_code, 2);
  EXPECT_NE(not_gguf.err.find(kGpt2 + ".inp"), std::string::npos) << not_gguf.err;
}

}  // namespace
