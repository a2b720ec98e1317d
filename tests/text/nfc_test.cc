// NFC (text/nfc.h) against the Unicode Consortium's conformance file NormalizationTest.txt, from
// the same unicode-data package the tables are generated from (the build decompresses it next to
// the tables): every line's NFC invariants, with strict equality, and every code point not listed
// in Part 1 unchanged; plus the bytes that are not UTF-8, which NFC passes through.
#include "text/nfc.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "text/unicode.h"

namespace kvq::unicode {
namespace {

std::string Utf8(const std::vector<uint32_t>& cps) {
  std::string s;
  for (const uint32_t cp : cps) AppendUtf8(cp, s);
  return s;
}

std::vector<uint32_t> Hex(const std::string& field) {
  std::vector<uint32_t> cps;
  std::istringstream in(field);
  std::string word;
  while (in >> word) cps.push_back(static_cast<uint32_t>(std::stoul(word, nullptr, 16)));
  return cps;
}

std::string Show(const std::string& s) {
  std::string out;
  for (size_t at = 0; at < s.size();) {
    const Decoded d = DecodeUtf8(s, at);
    if (!out.empty()) out += ' ';
    out += fmt::format("{:04X}", d.code_point);
    at += d.n_bytes;
  }
  return out;
}

TEST(Nfc, NormalizationTestTxt) {
  std::ifstream in(KVQ_NORMALIZATION_TEST);
  ASSERT_TRUE(in) << "cannot open " << KVQ_NORMALIZATION_TEST;
  std::string line;
  std::string part;
  std::set<uint32_t> part1;  // the code points Part 1 lists in column 1
  int64_t lines = 0, failures = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '@') {
      part = line.substr(0, line.find(' '));
      continue;
    }
    std::vector<std::string> col;
    std::istringstream fields(line);
    for (std::string f; col.size() < 5 && std::getline(fields, f, ';');) col.push_back(f);
    ASSERT_EQ(col.size(), 5u) << line;
    const std::vector<std::string> c = {Utf8(Hex(col[0])), Utf8(Hex(col[1])), Utf8(Hex(col[2])),
                                        Utf8(Hex(col[3])), Utf8(Hex(col[4]))};
    if (part == "@Part1") part1.insert(Hex(col[0])[0]);
    ++lines;
    // The conformance invariants for NFC: c2 == NFC(c1) == NFC(c2) == NFC(c3), c4 == NFC(c4) == NFC(c5).
    for (const auto& [from, to] : {std::pair{0, 1}, std::pair{1, 1}, std::pair{2, 1}, std::pair{3, 3},
                                   std::pair{4, 3}}) {
      const std::string got = NormalizeNfc(c[from]);
      if (got != c[to]) {
        if (++failures <= 20) {
          ADD_FAILURE() << "NFC(c" << from + 1 << ") != c" << to + 1 << " in " << line << ": got " << Show(got);
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
  // The file of Unicode 15.0 has 19,000-odd test lines, ~17,000 of them in Part 1.
  EXPECT_GT(lines, 18000);
  EXPECT_GT(part1.size(), 16000u);
  // Part 1's rule for everything else: a code point it does not list is its own NFC.
  int64_t checked = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if ((cp >= 0xD800 && cp <= 0xDFFF) || part1.count(cp)) continue;
    const std::string s = Utf8({cp});
    ASSERT_EQ(NormalizeNfc(s), s) << "U+" << std::hex << cp;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

TEST(Nfc, KnownCases) {
  EXPECT_EQ(NormalizeNfc("e\xCC\x81"), "\xC3\xA9");                   // e + U+0301 -> U+00E9
  EXPECT_EQ(NormalizeNfc("caf\xC3\xA9"), "caf\xC3\xA9");             // already NFC
  EXPECT_EQ(NormalizeNfc("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"), "\xED\x95\x9C");  // jamo -> U+D55C
  // U+0958 is a composition exclusion: its decomposition stays decomposed.
  EXPECT_EQ(NormalizeNfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  // Canonical ordering: U+0323 (class 220) before U+0307 (230), then composition to U+1E0D U+0307.
  EXPECT_EQ(NormalizeNfc("d\xCC\x87\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");
  EXPECT_EQ(CombiningClass(0x0301), 230);
  EXPECT_EQ(CombiningClass('e'), 0);
  EXPECT_STRNE(NfcUnicodeVersion(), "");
}

TEST(Nfc, BytesThatAreNotUtf8PassThrough) {
  // A bad byte is kept and ends the stretch: nothing composes across it.
  EXPECT_EQ(NormalizeNfc("\xFF" "e\xCC\x81"), "\xFF\xC3\xA9");
  EXPECT_EQ(NormalizeNfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
  EXPECT_EQ(NormalizeNfc("\xC0\xAF"), "\xC0\xAF");          // overlong '/'
  EXPECT_EQ(NormalizeNfc("\xED\xA0\x80"), "\xED\xA0\x80");  // a surrogate
  EXPECT_EQ(NormalizeNfc("\xE0\xA5"), "\xE0\xA5");          // truncated
}

}  // namespace
}  // namespace kvq::unicode
