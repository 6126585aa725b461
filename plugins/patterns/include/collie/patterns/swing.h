// Swing (De Sensi et al., NSDI 2024) on p = 2^L core ranks: at step s, core index v exchanges
// with v + ρ(s) when v is even and v − ρ(s) when odd (mod p), with ρ(s) = (1 − (−2)^(s+1))/3
// = 1, −1, 3, −5, 11, ... Like recursive doubling it takes log2 p steps, but its peers stay
// close on a ring or torus.
#pragma once

#include <cstdint>
#include <vector>

#include "collie/patterns/halving_doubling.h"

namespace collie::patterns {

inline int64_t swingDistance(int s) {
  int64_t power = 1;  // (−2)^(s+1)
  for (int i = 0; i <= s; ++i) power *= -2;
  return (1 - power) / 3;
}

inline int swingPeer(int v, int s, int p) {
  const int64_t d = swingDistance(s) % p;
  const int64_t peer = v % 2 == 0 ? v + d : v - d;
  return static_cast<int>(((peer % p) + p) % p);
}

// The bandwidth-optimal variant's block layout. Its reduce-scatter takes steps 0 .. L−1 and
// halves what each rank holds at every step: at step t core index v keeps the blocks of the
// ranks it can still reach through steps t+1 .. L−1 and gives its peer the peer's. Those sets
// nest, so numbering the blocks in the order of the nesting ("slots") makes every kept and
// given set one contiguous span, sent as one message; v ends with the block in slot(v).
class SwingLayout {
 public:
  explicit SwingLayout(int p) : p_(p), steps_(log2Exact(p)), slot_(p, -1) {
    std::vector<int> all(p);
    for (int v = 0; v < p; ++v) all[v] = v;
    int next = 0;
    number(all, 0, &next);
    // Spans bottom-up: at the last step v keeps its own slot; at step t, what it keeps at
    // t+1 and what its step-(t+1) peer keeps there.
    kept_.assign(steps_, std::vector<BlockSpan>(p));
    for (int t = steps_ - 1; t >= 0; --t) {
      for (int v = 0; v < p; ++v) {
        if (t == steps_ - 1) {
          kept_[t][v] = {slot_[v], slot_[v] + 1};
        } else {
          const BlockSpan a = kept_[t + 1][v], b = kept_[t + 1][swingPeer(v, t + 1, p)];
          kept_[t][v] = {std::min(a.begin, b.begin), std::max(a.end, b.end)};
        }
      }
    }
  }

  int size() const { return p_; }
  int steps() const { return steps_; }
  int slot(int v) const { return slot_[v]; }
  // The slots core index v holds after reduce-scatter step t (0 .. steps()-1); at step t it
  // gives swingPeer(v, t) the span kept(peer, t).
  BlockSpan kept(int v, int t) const { return kept_[t][v]; }

 private:
  // The ranks reachable from v through steps `from` .. L−1, v included.
  std::vector<int> reach(int v, int from) const {
    std::vector<int> set{v};
    for (int s = from; s < steps_; ++s) {
      const size_t size = set.size();
      for (size_t i = 0; i < size; ++i) set.push_back(swingPeer(set[i], s, p_));
    }
    return set;
  }

  // Numbers `set` (the ranks holding the same blocks before step t) in nesting order.
  void number(const std::vector<int>& set, int t, int* next) {
    if (t == steps_) {
      slot_[set.front()] = (*next)++;
      return;
    }
    std::vector<int> mine = reach(set.front(), t + 1), rest;
    std::vector<bool> in_mine(p_, false);
    for (int v : mine) in_mine[v] = true;
    for (int v : set) {
      if (!in_mine[v]) rest.push_back(v);
    }
    number(mine, t + 1, next);
    number(rest, t + 1, next);
  }

  int p_;
  int steps_;
  std::vector<int> slot_;
  std::vector<std::vector<BlockSpan>> kept_;
};

}  // namespace collie::patterns
