// Peer arithmetic shared by schedulers: how a buffer splits into blocks and segments.
// Header-only and communication-free, so it is unit-tested alone.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace collie::patterns {

// A contiguous run of elements [offset, offset + count).
struct Range {
  size_t offset = 0;
  size_t count = 0;
  bool operator==(const Range& o) const { return offset == o.offset && count == o.count; }
};

// Block `index` of `count` elements split into `parts` near-equal blocks; the first
// count % parts blocks hold one element more. Blocks tile [0, count) in order.
inline Range block(size_t count, int parts, int index) {
  size_t base = count / parts;
  size_t extra = count % parts;
  size_t i = static_cast<size_t>(index);
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// The elements two ranges share (count 0 when none), at the later of their offsets.
inline Range intersect(Range a, Range b) {
  const size_t begin = std::max(a.offset, b.offset);
  const size_t end = std::min(a.offset + a.count, b.offset + b.count);
  return {begin, end > begin ? end - begin : 0};
}

// A range cut into pieces of at most `piece` elements, computed on demand (no storage):
// pieces[i] is elements [offset + i * piece, ...). A default Pieces has none.
class Pieces {
 public:
  Pieces() = default;
  Pieces(Range range, size_t piece)
      : range_(range),
        piece_(piece),
        size_(range.count == 0 ? 1 : (range.count + piece - 1) / piece) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Range operator[](size_t i) const {
    const size_t done = i * piece_;
    return {range_.offset + done, std::min(piece_, range_.count - done)};
  }

  class iterator {
   public:
    iterator(const Pieces* pieces, size_t i) : pieces_(pieces), i_(i) {}
    Range operator*() const { return (*pieces_)[i_]; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }

   private:
    const Pieces* pieces_;
    size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size_}; }

 private:
  Range range_;
  size_t piece_ = 1;
  size_t size_ = 0;
};

// `range` cut into pieces of at most `piece` elements (piece >= 1); an empty range gives
// one empty piece, so that every step still exchanges exactly one message per piece.
inline Pieces pieces(Range range, size_t piece) { return {range, piece}; }

// Euclidean modulo: mod(-1, 4) == 3.
inline int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace collie::patterns

namespace collie::patterns {

// The elements of blocks [first, last) of the `parts`-block split of `count` elements.
inline Range blockSpan(size_t count, int parts, int first, int last) {
  if (first >= last) return {block(count, parts, first).offset, 0};
  Range a = block(count, parts, first), b = block(count, parts, last - 1);
  return {a.offset, b.offset + b.count - a.offset};
}

}  // namespace collie::patterns
