// Sizes, durations and the Params getters that plugins read their config through.
#include <gtest/gtest.h>

#include "collie/error.h"
#include "collie/params.h"
#include "core/strings.h"
#include "expect.h"

namespace collie {
namespace {

TEST(ParseBytes, AcceptsBinaryAndDecimalUnits) {
  uint64_t v = 0;
  ASSERT_TRUE(parseBytes("4KiB", &v));
  EXPECT_EQ(v, 4096u);
  ASSERT_TRUE(parseBytes("64MiB", &v));
  EXPECT_EQ(v, 64u << 20);
  ASSERT_TRUE(parseBytes("25MB", &v));
  EXPECT_EQ(v, 25000000u);
  ASSERT_TRUE(parseBytes("1024", &v));
  EXPECT_EQ(v, 1024u);
  ASSERT_TRUE(parseBytes("1.5 KiB", &v));
  EXPECT_EQ(v, 1536u);
  ASSERT_TRUE(parseBytes("0", &v));
  EXPECT_EQ(v, 0u);
}

TEST(ParseBytes, RejectsGarbageNegativeFractionalAndOverflow) {
  uint64_t v = 0;
  for (const char* bad : {"", "abc", "-1", "4 KiBs", "0.5", "1e30", "12 parsecs", "nan", "inf"}) {
    EXPECT_FALSE(parseBytes(bad, &v)) << bad;
  }
}

TEST(ParseDuration, UnitsAndBareSeconds) {
  std::chrono::milliseconds d{};
  ASSERT_TRUE(parseDuration("30s", &d));
  EXPECT_EQ(d.count(), 30000);
  ASSERT_TRUE(parseDuration("500ms", &d));
  EXPECT_EQ(d.count(), 500);
  ASSERT_TRUE(parseDuration("2m", &d));
  EXPECT_EQ(d.count(), 120000);
  ASSERT_TRUE(parseDuration("1.5", &d));
  EXPECT_EQ(d.count(), 1500);
  EXPECT_FALSE(parseDuration("soon", &d));
  EXPECT_FALSE(parseDuration("-3s", &d));
}

TEST(FormatBytes, UsesTheLargestExactUnit) {
  EXPECT_EQ(formatBytes(4096), "4 KiB");
  EXPECT_EQ(formatBytes(16 << 20), "16 MiB");
  EXPECT_EQ(formatBytes(1000), "1000 B");
}

TEST(Params, TypedGettersFallBackAndRecordReads) {
  Params p("scheduler 'ring'");
  p.set("chunk_bytes", "64KiB", "x.yaml:3:5");
  EXPECT_EQ(p.getBytes("chunk_bytes", 1, 1, 1 << 30), 65536u);
  EXPECT_EQ(p.getInt("depth", 7, 0, 10), 7);
  EXPECT_TRUE(p.unreadKeys().empty());
  EXPECT_EQ(p.readKeys().size(), 2u);
}

TEST(Params, BadValueNamesLocationKeyExpectedAndFound) {
  Params p("scheduler 'ring'");
  p.set("chunk_bytes", "lots", "x.yaml:3:5");
  EXPECT_TRUE(testing::throwsWith<ConfigError>(
      [&] { p.getBytes("chunk_bytes", 1, 1, 1 << 30); },
      {"x.yaml:3:5", "params.chunk_bytes", "expected a size", "found 'lots'"}))
      << "no error";
  p.set("n", "11");
  EXPECT_THROW(p.getInt("n", 0, 0, 10), ConfigError);
  p.set("flag", "maybe");
  EXPECT_THROW(p.getBool("flag", false), ConfigError);
}

TEST(Params, UnreadKeysAreReported) {
  Params p;
  p.set("chunk_byte", "1");
  p.getBytes("chunk_bytes", 1, 1, 10);
  ASSERT_EQ(p.unreadKeys().size(), 1u);
  EXPECT_EQ(p.unreadKeys()[0], "chunk_byte");
}

TEST(Strings, DidYouMeanFindsCloseKeysOnly) {
  EXPECT_EQ(detail::closestMatch("schedulrs", {"schedulers", "dtype"}), "schedulers");
  EXPECT_EQ(detail::closestMatch("zzz", {"schedulers", "dtype"}), "");
}

}  // namespace
}  // namespace collie
