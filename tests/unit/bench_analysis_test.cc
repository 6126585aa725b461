// What the bench concludes from its rows: which scheduler is fastest at a size only when the
// spread over repeats allows it, crossovers between such sizes, and the rules for `auto`;
// the cost model's fits from the calibration's probes; and a worker's result file read back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "bench/bench.h"
#include "collie/error.h"
#include "expect.h"
#include "measure/calibrate.h"

namespace collie::bench {
namespace {

using measure::fitLineFrom;

Row row(const std::string& scheduler, uint64_t bytes, double low, double median, double high) {
  Row r;
  r.scheduler = scheduler;
  r.plugin = scheduler;
  r.collective = "allreduce";
  r.backend = "loopback";
  r.ranks = 4;
  r.bytes = bytes;
  r.repeats = 5;
  r.time_min_us = low;
  r.time_us = median;
  r.time_max_us = high;
  r.predicted_us = median;
  return r;
}

TEST(BenchAnalysis, SeparateRangesNameTheFastest) {
  auto v = verdicts({row("ring", 4096, 90, 100, 110), row("tree", 4096, 40, 50, 60)}, false);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_TRUE(v[0].distinguishable());
  EXPECT_EQ(v[0].fastest, "tree");
}

TEST(BenchAnalysis, OverlappingRangesAreATie) {
  // tree's median is lower, but its slowest repeat is slower than ring's fastest.
  auto v = verdicts({row("ring", 4096, 58, 100, 110), row("tree", 4096, 40, 50, 60)}, false);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_FALSE(v[0].distinguishable());
  EXPECT_EQ(v[0].fastest, "tree");
  EXPECT_EQ(v[0].tied, (std::vector<std::string>{"tree", "ring"}));
  // The predictions are points: they still tell the two apart.
  EXPECT_TRUE(verdicts({row("ring", 4096, 58, 100, 110), row("tree", 4096, 40, 50, 60)}, true)[0]
                  .distinguishable());
}

TEST(BenchAnalysis, ACrossoverIsNamedOnlyBetweenDistinguishableSizes) {
  std::vector<Row> rows = {
      row("tree", 1024, 10, 11, 12),  row("ring", 1024, 20, 21, 22),   // tree
      row("tree", 2048, 20, 25, 30),  row("ring", 2048, 24, 26, 28),   // a tie
      row("tree", 4096, 50, 51, 52),  row("ring", 4096, 30, 31, 32),   // ring
      row("tree", 8192, 90, 95, 100), row("ring", 8192, 80, 85, 90)};  // a tie (they touch)
  auto found = crossovers(rows, false);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].from, "tree");
  EXPECT_EQ(found[0].to, "ring");
  EXPECT_EQ(found[0].below, 1024u);  // the tie at 2 KiB lies between
  EXPECT_EQ(found[0].above, 4096u);
  auto v = verdicts(rows, false);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_FALSE(v[1].distinguishable());
  EXPECT_FALSE(v[3].distinguishable());
}

// Rows whose measured fastest is tree up to 1 KiB, tied at 2 KiB, ring from 4 KiB; the
// predictions (points) are given per size as (tree, ring) medians.
std::vector<Row> measuredTreeThenRing(const std::vector<std::pair<double, double>>& predicted) {
  std::vector<Row> rows = {row("tree", 1024, 10, 11, 12), row("ring", 1024, 20, 21, 22),   // tree
                           row("tree", 2048, 20, 25, 30), row("ring", 2048, 24, 26, 28),   // a tie
                           row("tree", 4096, 50, 51, 52), row("ring", 4096, 30, 31, 32),   // ring
                           row("tree", 8192, 90, 95, 99), row("ring", 8192, 50, 55, 60)};  // ring
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [tree, ring] = predicted[i / 2];
    rows[i].predicted_us = i % 2 == 0 ? tree : ring;
  }
  return rows;
}

TEST(BenchAnalysis, APredictedCrossoverAgreesWhenItFallsWhereTheMeasurementPutsIt) {
  // Predicted: tree at 1 and 2 KiB, ring from 4 KiB: between 2 and 4 KiB, inside the
  // measured 1 to 4 KiB (whose middle is a tie).
  const auto inside = checkCrossovers(measuredTreeThenRing({{1, 2}, {1, 2}, {2, 1}, {2, 1}}));
  ASSERT_EQ(inside.predicted.size(), 1u);
  EXPECT_TRUE(inside.predicted[0].agrees);
  ASSERT_TRUE(inside.predicted[0].measured.has_value());
  EXPECT_EQ(inside.predicted[0].measured->below, 1024u);
  EXPECT_EQ(inside.predicted[0].measured->above, 4096u);
  EXPECT_TRUE(inside.unpredicted.empty());
  // Predicted one size too late (between 4 and 8 KiB): beside the measured one, not agreeing.
  const auto late = checkCrossovers(measuredTreeThenRing({{1, 2}, {1, 2}, {1, 2}, {2, 1}}));
  ASSERT_EQ(late.predicted.size(), 1u);
  EXPECT_FALSE(late.predicted[0].agrees);
  ASSERT_TRUE(late.predicted[0].measured.has_value());
  EXPECT_EQ(late.predicted[0].predicted.below, 4096u);
  EXPECT_EQ(late.predicted[0].predicted.above, 8192u);
  // Predicted the other way round: no measured crossover of that direction, and the measured
  // one is not predicted.
  const auto reversed = checkCrossovers(measuredTreeThenRing({{2, 1}, {2, 1}, {1, 2}, {1, 2}}));
  ASSERT_EQ(reversed.predicted.size(), 1u);
  EXPECT_FALSE(reversed.predicted[0].agrees);
  EXPECT_FALSE(reversed.predicted[0].measured.has_value());
  ASSERT_EQ(reversed.unpredicted.size(), 1u);
  EXPECT_EQ(reversed.unpredicted[0].from, "tree");
}

// A size below one element is measured as 0 bytes; a rule's max_bytes 0 means "any size",
// so that size must not end a range before the last (it would give its winner every size).
TEST(BenchAnalysis, AZeroByteSizeEndsNoRuleButTheLast) {
  const std::vector<Row> rows = {row("tree", 0, 1, 2, 3),     row("ring", 0, 10, 11, 12),
                                 row("tree", 8, 30, 31, 32),  row("ring", 8, 10, 11, 12),
                                 row("tree", 16, 30, 31, 32), row("ring", 16, 10, 11, 12)};
  const RulesFile rules = bestRules(rows, {});
  ASSERT_FALSE(rules.rules.empty());
  for (size_t i = 0; i + 1 < rules.rules.size(); ++i) EXPECT_NE(rules.rules[i].max_bytes, 0u) << i;
  EXPECT_EQ(rules.rules.back().max_bytes, 0u);
  EXPECT_EQ(rules.rules.back().choice.plugin, "ring");
}

TEST(BenchAnalysis, NoiseAloneMakesNoCrossover) {
  // The medians alternate, as noise makes them, but every range overlaps.
  std::vector<Row> rows;
  bool odd = false;
  for (uint64_t bytes : {1024, 2048, 4096, 8192}) {
    rows.push_back(row("ring", bytes, 40, odd ? 45 : 55, 70));
    rows.push_back(row("tree", bytes, 40, odd ? 55 : 45, 70));
    odd = !odd;
  }
  EXPECT_TRUE(crossovers(rows, false).empty());
  // With one repeat each (no spread) the same medians would claim crossovers.
  for (Row& r : rows) r.time_min_us = r.time_max_us = r.time_us;
  EXPECT_FALSE(crossovers(rows, false).empty());
}

TEST(BenchAnalysis, WrongResultsAutoAndRulesAreNotCandidates) {
  Row wrong = row("fast_but_wrong", 4096, 1, 1, 1);
  wrong.wrong = 3;
  Row chooser = row("auto", 4096, 2, 2, 2);
  Row rules = row("rules", 4096, 2, 2, 2);
  rules.plugin = "rules";
  auto v = verdicts({wrong, chooser, rules, row("ring", 4096, 9, 10, 11)}, false);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].fastest, "ring");
  EXPECT_TRUE(v[0].distinguishable());
}

TEST(BenchAnalysis, RunsOfAMatrixAreJudgedApart) {
  Row a = row("tree", 4096, 10, 11, 12), b = row("ring", 4096, 20, 21, 22);
  Row c = row("tree", 8192, 50, 51, 52), d = row("ring", 8192, 30, 31, 32);
  a.run = b.run = "small";
  c.run = d.run = "large";  // another matrix point: no crossover from "small" into it
  EXPECT_TRUE(crossovers({a, b, c, d}, false).empty());
  EXPECT_EQ(verdicts({a, b, c, d}, false).size(), 2u);
}

TEST(BenchAnalysis, AutoIsAsFastWithinFivePerCentOrWithinTheSpread) {
  auto chooser = [](uint64_t bytes, double low, double median, double high) {
    Row r = row("auto", bytes, low, median, high);
    r.ran = "tree";
    return r;
  };
  const std::vector<Row> rows = {
      // 4 KiB: tree is fastest; auto ran it, 8 % slower by the medians, but in its range.
      row("ring", 4096, 90, 100, 110), row("tree", 4096, 45, 50, 56), chooser(4096, 50, 54, 58),
      // 8 KiB: 8 % slower and apart: not as fast.
      row("ring", 8192, 90, 100, 110), row("tree", 8192, 49, 50, 51), chooser(8192, 53, 54, 55),
      // 16 KiB: 4 % slower and apart: within 5 %.
      row("ring", 16384, 90, 100, 110), row("tree", 16384, 49, 50, 51),
      chooser(16384, 51.5, 52, 53),
      // 32 KiB: no scheduler is fastest: not judged.
      row("ring", 32768, 40, 50, 60), row("tree", 32768, 45, 50, 55), chooser(32768, 1, 1, 1)};
  const auto v = autoVerdicts(rows);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].fastest, "tree");
  EXPECT_EQ(v[0].ran, "tree");
  EXPECT_NEAR(v[0].off_percent, 8, 1e-9);
  EXPECT_TRUE(v[0].overlaps);
  EXPECT_TRUE(v[0].asFast());
  EXPECT_FALSE(v[1].overlaps);
  EXPECT_FALSE(v[1].asFast());
  EXPECT_FALSE(v[2].overlaps);
  EXPECT_TRUE(v[2].asFast());
  EXPECT_FALSE(v[3].judged());
}

TEST(BenchAnalysis, Median) {
  EXPECT_TRUE(std::isnan(median({})));
  EXPECT_EQ(median({3}), 3);
  EXPECT_EQ(median({5, 1, 3}), 3);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
}

TEST(CostModelFit, AnExactLineIsRecovered) {
  const double alpha = 50e-6, beta = 1.0 / 1.2e9;  // 50 us, 1.2 GB/s
  std::vector<std::pair<double, double>> points;
  for (double m : {8.0, 4096.0, 65536.0, 262144.0, 1048576.0})
    points.emplace_back(m, alpha + beta * m);
  double residual = -1;
  LinkCost link = fitLine(points, &residual);
  EXPECT_NEAR(link.alpha, alpha, alpha * 1e-6);
  EXPECT_NEAR(link.beta, beta, beta * 1e-6);
  EXPECT_LT(residual, 1e-9);
}

TEST(CostModelFit, TheSlopeIsTheLargeMessagesBandwidth) {
  // A token bucket: messages up to 512 KiB pass at 10 GB/s, larger ones drain at 125 MB/s.
  // The fitted β must be the large messages' (what a large collective sees), and the
  // residual must say that a line fits this link poorly.
  auto bucket = [](double m) {
    const double burst = 512.0 * 1024;
    return 20e-6 + std::min(m, burst) / 10e9 + std::max(0.0, m - burst) / 125e6;
  };
  std::vector<std::pair<double, double>> points;
  for (double m : {8.0, 4096.0, 65536.0, 262144.0, 1048576.0, 4194304.0})
    points.emplace_back(m, bucket(m));
  double residual = 0;
  LinkCost link = fitLine(points, &residual);
  EXPECT_NEAR(1.0 / link.beta, 125e6, 125e6 * 0.25);
  EXPECT_NEAR(link.alpha, 20e-6, 1e-7);
  EXPECT_GT(residual, 0.5);
}

TEST(CostModelFit, FromAMessageSizeOnTheLinePricesThoseSizes) {
  // A link on which 8 bytes and 4 KiB waited 2.7 ms for a core, and from 64 KiB on took
  // 0.7 ms + 10 ns a byte.
  const double alpha = 0.7e-3, beta = 10e-9;
  std::vector<std::pair<double, double>> points = {{8, 2.7e-3}, {4096, 2.7e-3}};
  for (double m : {65536.0, 262144.0, 1048576.0, 4194304.0})
    points.emplace_back(m, alpha + beta * m);
  double residual = -1;
  int fitted = 0;
  // From a 250 kB message on: the line from 64 KiB up, the largest size not above it.
  LinkCost link = fitLineFrom(points, 250e3, &residual, &fitted);
  EXPECT_NEAR(link.alpha, alpha, alpha * 1e-6);
  EXPECT_NEAR(link.beta, beta, beta * 1e-6);
  EXPECT_LT(residual, 1e-9);
  EXPECT_EQ(fitted, 4);
  // The same from exactly 64 KiB; from 4 KiB on, or anchored at 8 bytes, the line misses.
  EXPECT_NEAR(fitLineFrom(points, 65536, &residual).alpha, alpha, alpha * 1e-6);
  EXPECT_GT(fitLineFrom(points, 4096, &residual).alpha, 1e-3);
  EXPECT_GT(fitLine(points, &residual).alpha, 2e-3);
  // Beyond the largest size, the three largest; below the smallest, every point.
  EXPECT_NEAR(fitLineFrom(points, 1e9, &residual, &fitted).beta, beta, beta * 1e-6);
  EXPECT_EQ(fitted, 3);
  const LinkCost all = fitLine(points, &residual);
  EXPECT_EQ(fitLineFrom(points, 1, &residual).alpha, all.alpha);
  EXPECT_EQ(fitLineFrom(points, 1, &residual).beta, all.beta);
  EXPECT_EQ(fitLineFrom({}, 1, &residual).beta, 0);
}

TEST(CostModelFit, NeverNegative) {
  // Times that fall with size (noise at one end) would give a negative β or α.
  double residual = 0;
  LinkCost link = fitLine({{8, 100e-6}, {4096, 90e-6}, {65536, 80e-6}}, &residual);
  EXPECT_GE(link.alpha, 0);
  EXPECT_GE(link.beta, 0);
  EXPECT_EQ(link.beta, 0);
}

// The bank a link between nodes keeps while idle, from the fastest round trips after a
// pause of 8 B, 256 KiB and 1 MiB (1 Gbit/s: 8 ns a byte; a banked byte passes 20x faster).
TEST(CostModelFit, TheBankIsWhatTheMiddleSizePassedBeyondThePaceOfTheTwoLarger) {
  const double beta = 8e-9, a = 400e-6;
  auto trips = [&](double bank) {
    std::vector<std::pair<double, double>> t;
    for (double m : {8.0, 262144.0, 1048576.0})
      t.emplace_back(m, a + std::min(m, bank) * beta / 20 + std::max(0.0, m - bank) * beta);
    return t;
  };
  EXPECT_EQ(measure::bankFromTrips(trips(0)), 0) << "a wire banks nothing";
  // A 128 KB bucket reads as what it saved: its bytes less the time they still took.
  EXPECT_NEAR(measure::bankFromTrips(trips(128e3)), 128e3 * 0.95, 1e3);
  // A bank past 256 KiB but short of 1 MiB reads as 256 KiB, what it at least is; one past
  // 1 MiB as nothing, every size having passed at the bank's own pace.
  EXPECT_GT(measure::bankFromTrips(trips(600e3)), 0.85 * 262144);
  EXPECT_LE(measure::bankFromTrips(trips(600e3)), 262144);
  EXPECT_EQ(measure::bankFromTrips(trips(4e6)), 0);
  // Noise: 256 KiB 5 % faster on a wire is no bank.
  auto noisy = trips(0);
  noisy[1].second *= 0.95;
  EXPECT_EQ(measure::bankFromTrips(noisy), 0);
  // Too few sizes (a rank that sat out, a level not probed), or out of order: nothing to read.
  EXPECT_EQ(measure::bankFromTrips({{8, a}, {262144, a}}), 0);
  auto shuffled = trips(128e3);
  std::swap(shuffled[1], shuffled[2]);
  EXPECT_EQ(measure::bankFromTrips(shuffled), 0);
}

// A worker's result file read back by its launcher: a value of the cost model that the
// model's reader refuses (a negative gap) is an error naming the file, the field and the
// value, as a file that is not JSON is.
TEST(BenchResultFile, AModelValueTheReaderRefusesNamesTheFileTheFieldAndTheValue) {
  Result result;
  result.calibrated = true;
  result.model.intra.gap = 1.5e-06;
  const std::string path =
      ::testing::TempDir() + "bench-result-" + std::to_string(::getpid()) + ".json";
  struct Removed {
    std::string path;
    ~Removed() { std::remove(path.c_str()); }
  } removed{path};
  saveResult(path, result);
  EXPECT_EQ(loadResult(path).model.intra.gap, 1.5e-06);
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = text.find("1.5e-06");
  ASSERT_NE(at, std::string::npos) << text;
  text.insert(at, "-");
  std::ofstream(path) << text;
  EXPECT_TRUE(testing::throwsWith<InternalError>(
      [&] { loadResult(path); }, {path, "unreadable results", "'gap'", "-1.5e-06"}));
  std::ofstream(path) << "{";
  EXPECT_TRUE(
      testing::throwsWith<InternalError>([&] { loadResult(path); }, {path, "unreadable results"}));
}

}  // namespace
}  // namespace collie::bench
