// Which GGUF a repository reference picks (llama.cpp's -hf rule) and how names are checked.
#include "hub/repo_ref.h"

#include <gtest/gtest.h>

namespace kvq::hub {
namespace {

const std::vector<std::string> kBartowskiLike = {".gitattributes",
                                                 "README.md",
                                                 "Llama-3.2-1B-Instruct-IQ3_M.gguf",
                                                 "Llama-3.2-1B-Instruct-Q4_0.gguf",
                                                 "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
                                                 "Llama-3.2-1B-Instruct-Q8_0.gguf",
                                                 "Llama-3.2-1B-Instruct-f16.gguf",
                                                 "Llama-3.2-1B-Instruct-Q2_K-00001-of-00002.gguf",
                                                 "Llama-3.2-1B-Instruct-Q2_K-00002-of-00002.gguf",
                                                 "mmproj-Llama-3.2-1B-Instruct-Q8_0.gguf"};

std::string Pick(const std::string& ref, const std::vector<std::string>& paths) {
  const Result<RepoRef> r = ParseRepoRef(ref);
  EXPECT_TRUE(r.ok()) << r.status().message();
  const Result<std::string> p = PickGguf(*r, paths);
  return p.ok() ? *p : "error: " + p.status().message();
}

TEST(RepoRef, QuantTagIsTheLastPartOfTheStem) {
  EXPECT_EQ(QuantTag("Llama-3.2-1B-Instruct-Q4_K_M.gguf"), "Q4_K_M");
  EXPECT_EQ(QuantTag("llama-2-7b.Q8_0.gguf"), "Q8_0");
  EXPECT_EQ(QuantTag("sub/dir/Qwen3-0.6B-UD-Q4_K_XL.GGUF"), "Q4_K_XL");
  EXPECT_EQ(QuantTag("model.gguf"), "model");
}

TEST(RepoRef, DefaultIsQ4KMThenAnyQ4ThenTheFirstGguf) {
  EXPECT_EQ(Pick("bartowski/Llama-3.2-1B-Instruct-GGUF", kBartowskiLike),
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf");
  std::vector<std::string> no_q4km = kBartowskiLike;
  std::erase(no_q4km, "Llama-3.2-1B-Instruct-Q4_K_M.gguf");
  EXPECT_EQ(Pick("a/b", no_q4km), "Llama-3.2-1B-Instruct-Q4_0.gguf");
  EXPECT_EQ(Pick("a/b", {"m-Q8_0.gguf", "m-F16.gguf", "m-Q6_K.gguf"}),
            "m-F16.gguf");  // sorted: F16 first
}

TEST(RepoRef, AQuantMatchesItsTagIgnoringCase) {
  EXPECT_EQ(Pick("a/b:q8_0", kBartowskiLike), "Llama-3.2-1B-Instruct-Q8_0.gguf");
  EXPECT_EQ(Pick("a/b:F16", kBartowskiLike), "Llama-3.2-1B-Instruct-f16.gguf");
  EXPECT_EQ(Pick("a/b:iq3_m", kBartowskiLike), "Llama-3.2-1B-Instruct-IQ3_M.gguf");
}

TEST(RepoRef, SplitFilesAndProjectorsAreNeverPicked) {
  EXPECT_FALSE(IsPickableGguf("Llama-3.2-1B-Instruct-Q2_K-00001-of-00002.gguf"));
  EXPECT_FALSE(IsPickableGguf("mmproj-Llama-3.2-1B-Instruct-Q8_0.gguf"));
  EXPECT_FALSE(IsPickableGguf("README.md"));
  EXPECT_TRUE(IsPickableGguf("Llama-3.2-1B-Instruct-Q8_0.gguf"));
  const std::string missing = Pick("a/b:Q2_K", kBartowskiLike);
  EXPECT_EQ(missing,
            "error: a/b has no GGUF with quant 'Q2_K' (available: IQ3_M, Q4_0, Q4_K_M, Q8_0, f16)");
  EXPECT_NE(Pick("a/b", {"x-Q2_K-00001-of-00002.gguf", "mmproj-x.gguf"})
                .find("only split files or mmproj"),
            std::string::npos);
}

TEST(RepoRef, BadNamesAreRefusedSayingWhatIsExpected) {
  for (const char* bad :
       {"noslash", "a/b/c", "a/b:", "us er/x", "a/--b", "-a/b", "a/b..c", "a/b:Q4 K"}) {
    const Result<RepoRef> r = ParseRepoRef(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("user/name"), std::string::npos) << r.status().message();
  }
  const Result<RepoRef> ok = ParseRepoRef("Qwen/Qwen3-0.6B-GGUF:Q8_0");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->repo, "Qwen/Qwen3-0.6B-GGUF");
  EXPECT_EQ(ok->quant, "Q8_0");
}

}  // namespace
}  // namespace kvq::hub
