// Checks that an error message or a log says what it must, and not what it must not: the
// failure names the part and shows the text.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace collie::testing {

// Success when `text` contains every one of `parts`; else a failure naming the first part
// that is missing and showing the text. Use as EXPECT_TRUE(contains(m, {"a", "b"})).
inline ::testing::AssertionResult contains(const std::string& text,
                                           const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    if (text.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
    }
  }
  return ::testing::AssertionSuccess();
}

// Success when `text` contains none of `parts`; else a failure naming the first one found.
inline ::testing::AssertionResult lacks(const std::string& text,
                                        const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    if (text.find(part) != std::string::npos) {
      return ::testing::AssertionFailure() << "'" << part << "' is in:\n" << text;
    }
  }
  return ::testing::AssertionSuccess();
}

// Success when `body` throws an E whose message contains every one of `parts`; a failure
// when it returns (another exception type propagates, and the test fails on it).
template <typename E, typename Body>
::testing::AssertionResult throwsWith(Body&& body, const std::vector<std::string>& parts) {
  try {
    body();
  } catch (const E& e) {
    return contains(e.what(), parts);
  }
  return ::testing::AssertionFailure() << "returned without throwing";
}

}  // namespace collie::testing
