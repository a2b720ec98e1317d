// Byte sizes as users type them: decimal and binary units, and clear refusals.
#include "kvq/units.h"

#include <gtest/gtest.h>

#include <limits>

namespace kvq {
namespace {

TEST(ParseByteSize, AcceptsBytesAndUnits) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("4096B"), 4096);
  EXPECT_EQ(*ParseByteSize("718MB"), 718'000'000);
  EXPECT_EQ(*ParseByteSize("566mb"), 566'000'000);
  EXPECT_EQ(*ParseByteSize("512KiB"), 512 * 1024);
  EXPECT_EQ(*ParseByteSize("2GiB"), 2LL << 30);
  EXPECT_EQ(*ParseByteSize("1.25GiB"), 1342177280);
  EXPECT_EQ(*ParseByteSize("1 TiB"), 1LL << 40);
}

TEST(ParseByteSize, RefusesNonsenseWithTheInputInTheMessage) {
  for (const char* bad : {"", "-5", "0", "0MiB", "12XB", "MiB", "1.5", "1.2.3GiB",
                          "99999999999999999999", "9000000000TiB"}) {
    const Result<int64_t> r = ParseByteSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos);
    }
  }
}

TEST(Format, CountsAndBytes) {
  EXPECT_EQ(FormatCount(319635456), "319,635,456");
  EXPECT_EQ(FormatCount(12), "12");
  EXPECT_EQ(FormatCount(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");  // no -n overflow
  EXPECT_EQ(FormatBytesIec(512), "512 B");
  EXPECT_EQ(FormatBytesIec(160LL << 20), "160.00 MiB");
}

TEST(CheckedMath, DetectsOverflow) {
  int64_t out = 0;
  EXPECT_TRUE(CheckedMul(1LL << 31, 1LL << 31, &out));
  EXPECT_FALSE(CheckedMul(1LL << 32, 1LL << 31, &out));
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1, &out));
}

}  // namespace
}  // namespace kvq
