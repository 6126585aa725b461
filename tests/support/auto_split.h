// micro_batch: auto's first split as rank 0 logs it, and the rule it must follow
// (train/data.h proportionalSplit), written out in closed form for the tests that check it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

namespace collie::testing {

// "micro_batch auto: rank 0 812.5 samples/s -> 5, rank 1 640.0 samples/s -> 4, ...": each
// rank's measured speed and its samples, in rank order (empty when the line is missing).
struct LoggedSplit {
  std::vector<double> speeds;  // samples/s, as logged (one decimal)
  std::vector<int> split;      // samples per micro-batch
};

inline LoggedSplit loggedAutoSplit(const std::string& output) {
  LoggedSplit out;
  const size_t at = output.find("micro_batch auto: ");
  if (at == std::string::npos) return out;
  const std::string line = output.substr(at, output.find('\n', at) - at);
  const std::regex part(R"(rank \d+ ([0-9.]+) samples/s -> (\d+))");
  for (std::sregex_iterator m(line.begin(), line.end(), part), end; m != end; ++m) {
    out.speeds.push_back(std::stod((*m)[1]));
    out.split.push_back(std::stoi((*m)[2]));
  }
  return out;
}

// The total in proportion to the speeds: rank r's exact share is total * s_r / sum(s), and
// rounding that keeps the total moves each share by less than one sample, never giving a
// faster rank fewer samples than a slower one. The logged speeds are rounded to 0.05
// samples/s, which moves a share by at most total * 0.1 / sum(s): that much more is allowed.
// (A share under one sample would be raised to one, taking from the others; the tests'
// speeds never put a rank there.)
inline void expectProportional(const LoggedSplit& logged, int total) {
  const int n = static_cast<int>(logged.speeds.size());
  ASSERT_EQ(logged.split.size(), logged.speeds.size());
  EXPECT_EQ(std::accumulate(logged.split.begin(), logged.split.end(), 0), total);
  const double sum = std::accumulate(logged.speeds.begin(), logged.speeds.end(), 0.0);
  for (int r = 0; r < n; ++r) {
    const double exact = total * logged.speeds[r] / sum;
    ASSERT_GE(exact, 1.0) << "rank " << r << "'s speed is under one sample's share";
    EXPECT_LT(std::abs(logged.split[r] - exact), 1.0 + total * 0.1 / sum)
        << "rank " << r << " got " << logged.split[r] << " samples, its speed's share is " << exact;
    for (int q = 0; q < n; ++q) {
      if (logged.speeds[r] > logged.speeds[q]) {
        EXPECT_GE(logged.split[r], logged.split[q])
            << "rank " << r << " is faster than rank " << q << " and got fewer samples";
      }
    }
  }
}

}  // namespace collie::testing
