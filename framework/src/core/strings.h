// Small string helpers for messages: edit distance and "did you mean".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace collie::detail {

size_t editDistance(const std::string& a, const std::string& b);
// The candidate closest to `word`, or "" when none is close enough to be a likely typo.
std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" or "".
std::string didYouMean(const std::string& word, const std::vector<std::string>& candidates);
std::string trim(const std::string& text);
std::string join(const std::vector<std::string>& items, const std::string& separator);
// "a.b.c" split on '.' -> {"a", "b", "c"} (empty parts kept: "a..b" -> {"a", "", "b"}).
std::vector<std::string> split(const std::string& text, char separator);
// "1,234,567": an integer with thousands separators.
std::string withCommas(int64_t value);

}  // namespace collie::detail
