// A small deterministic mutator for the loaders' fuzz test: bit flips, interesting bytes and
// integers, inserted tokens, deleted, duplicated and spliced ranges, truncation. The same
// seed gives the same inputs, so a failure names the iteration that reproduces it.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace collie::fuzz {

class Mutator {
 public:
  Mutator(uint64_t seed, std::vector<std::string> tokens)
      : rng_(seed), tokens_(std::move(tokens)) {}

  // One mutant of `input`: 1 to 8 mutations; `others` may be spliced in.
  std::string mutate(std::string input, const std::vector<std::string>& others) {
    const int n = 1 + static_cast<int>(below(8));
    for (int k = 0; k < n; ++k) mutateOnce(input, others);
    return input;
  }

  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

 private:
  void mutateOnce(std::string& s, const std::vector<std::string>& others) {
    static const char kBytes[] = {'\0', '\n', '\r',   '\t',   ' ',    ':', '-', '{', '}', '[',
                                  ']',  ',',  '\'',   '"',    '&',    '*', '!', '%', '#', '|',
                                  '>',  '\\', '\x7f', '\x80', '\xff', '0', '9', '.', 'e'};
    static const uint64_t kIntegers[] = {0,
                                         1,
                                         0x7f,
                                         0x80,
                                         0xff,
                                         0xffff,
                                         0x7fffffff,
                                         0x80000000,
                                         0xffffffff,
                                         0x100000000ull,
                                         0x7fffffffffffffffull,
                                         0x8000000000000000ull,
                                         0xffffffffffffffffull,
                                         64ull << 20,
                                         1ull << 40};
    const size_t at = s.empty() ? 0 : below(s.size() + 1);
    switch (below(9)) {
      case 0:  // flip a bit
        if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1 << below(8));
        break;
      case 1:  // an interesting byte
        if (!s.empty()) s[below(s.size())] = kBytes[below(sizeof(kBytes))];
        break;
      case 2:  // an interesting integer, little endian, over 1 to 8 bytes
        if (s.size() >= 8) {
          const uint64_t v = kIntegers[below(sizeof(kIntegers) / sizeof(kIntegers[0]))];
          const size_t width = 1 + below(8), pos = below(s.size() - width + 1);
          std::memcpy(&s[pos], &v, width);
        }
        break;
      case 3:  // insert a token
        if (!tokens_.empty()) s.insert(at, tokens_[below(tokens_.size())]);
        break;
      case 4:  // delete a range
        if (!s.empty()) s.erase(below(s.size()), 1 + below(16));
        break;
      case 5:  // duplicate a range somewhere
        if (!s.empty()) {
          const size_t from = below(s.size());
          const std::string piece = s.substr(from, 1 + below(64));
          s.insert(below(s.size() + 1), piece);
        }
        break;
      case 6:  // truncate
        s.resize(below(s.size() + 1));
        break;
      case 7:  // splice a range of another input
        if (!others.empty()) {
          const std::string& o = others[below(others.size())];
          if (!o.empty()) {
            const size_t from = below(o.size());
            s.insert(at, o.substr(from, 1 + below(256)));
          }
        }
        break;
      default:  // repeat a short range many times (deep nesting, long lines)
        if (!s.empty()) {
          const std::string piece = s.substr(below(s.size()), 1 + below(4));
          std::string many;
          for (uint64_t r = 0, times = 16 + below(2000); r < times; ++r) many += piece;
          s.insert(at, many);
        }
        break;
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::string> tokens_;
};

}  // namespace collie::fuzz
