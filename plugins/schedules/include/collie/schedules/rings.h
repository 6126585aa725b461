// Ring reduce-scatter and all-gather with their communication, for the schedulers that run
// one ring or several at once (ring, bidirectional_ring). Each block of a step is cut into
// chunks, all posted at once, so reducing one chunk overlaps receiving the next.
#pragma once

#include <algorithm>
#include <memory>

#include "collie/patterns/ring.h"
#include "collie/plugin.h"
#include "collie/schedules/small.h"

namespace collie::schedules {

// One ring's part of a collective: `data` split into n blocks by ring position (block b
// ends on the rank at position b), sent in chunks of at most `chunk` elements.
struct RingPart {
  Buffer data;
  bool forward = true;
  size_t chunk = 1;
  uint32_t reduce_scatter_phase = 1;
  uint32_t all_gather_phase = 2;
};

// A part over `data` in chunks of at most `chunk_bytes` (at least one element).
inline RingPart ringPart(const Buffer& data, bool forward, uint64_t chunk_bytes,
                         uint32_t reduce_scatter_phase, uint32_t all_gather_phase) {
  RingPart part;
  part.data = data;
  part.forward = forward;
  part.chunk = std::max<size_t>(1, chunk_bytes / dtypeSize(data.dtype));
  part.reduce_scatter_phase = reduce_scatter_phase;
  part.all_gather_phase = all_gather_phase;
  return part;
}

// This rank's block of `part`: the one it holds reduced after ringReduceScatter.
inline patterns::Range ownBlock(const RingPart& part, const Backend& backend) {
  const int n = backend.size();
  return patterns::block(part.data.count, n,
                         patterns::ringPosition(backend.rank(), n, part.forward));
}

// After it, the rank at position b of every part holds block b reduced over every rank.
// The parts (a container of RingPart: one ring or two) move in lockstep, one step of each at
// a time.
template <typename Parts>
void ringReduceScatter(const Parts& parts, ReduceOp op, uint64_t seq, Backend& backend) {
  const int n = backend.size(), rank = backend.rank();
  const auto timeout = backend.timeout();
  Small<ScratchBuffer, 2> incoming;  // the largest block of each part
  for (const RingPart& p : parts) {
    incoming.emplace_back(p.data, patterns::block(p.data.count, n, 0).count);
  }
  Small<Requests, 2> recvs(parts.size());
  Small<patterns::Pieces, 2> recv_chunks(parts.size());
  Small<patterns::Range, 2> recv_blocks(parts.size());
  Requests sends;
  for (int step = 0; step < n - 1; ++step) {
    for (size_t t = 0; t < parts.size(); ++t) {
      const RingPart& p = parts[t];
      const int position = patterns::ringPosition(rank, n, p.forward);
      const int next = patterns::ringRankAt(patterns::ringNext(position, n), n, p.forward);
      const int prev = patterns::ringRankAt(patterns::ringPrev(position, n), n, p.forward);
      const auto s = patterns::ringReduceScatterStep(position, n, step);
      const Tag tag = makeTag(seq, p.reduce_scatter_phase, step);
      recv_blocks[t] = patterns::block(p.data.count, n, s.recv_block);
      recv_chunks[t] = patterns::pieces(recv_blocks[t], p.chunk);
      for (const patterns::Range& c : recv_chunks[t]) {
        Buffer into = incoming[t].view().slice(c.offset - recv_blocks[t].offset, c.count);
        recvs[t].push_back(backend.irecv(prev, into, tag));
      }
      for (const patterns::Range& c :
           patterns::pieces(patterns::block(p.data.count, n, s.send_block), p.chunk)) {
        sends.push_back(backend.isend(next, p.data.slice(c.offset, c.count), tag));
      }
    }
    for (size_t t = 0; t < parts.size(); ++t) {
      for (size_t i = 0; i < recv_chunks[t].size(); ++i) {
        recvs[t][i]->wait(timeout);
        const patterns::Range c = recv_chunks[t][i];
        reduceInto(parts[t].data.slice(c.offset, c.count),
                   incoming[t].view().slice(c.offset - recv_blocks[t].offset, c.count), op);
      }
      recvs[t].clear();
    }
    waitAll(sends, timeout);  // the next step sends what this one reduced
  }
}

// Starting with block b complete on the rank at position b of every part, leaves every
// block complete on every rank.
template <typename Parts>
void ringAllGather(const Parts& parts, uint64_t seq, Backend& backend) {
  const int n = backend.size(), rank = backend.rank();
  Requests requests;
  for (int step = 0; step < n - 1; ++step) {
    for (const RingPart& p : parts) {
      const int position = patterns::ringPosition(rank, n, p.forward);
      const int next = patterns::ringRankAt(patterns::ringNext(position, n), n, p.forward);
      const int prev = patterns::ringRankAt(patterns::ringPrev(position, n), n, p.forward);
      const auto s = patterns::ringAllGatherStep(position, n, step);
      const Tag tag = makeTag(seq, p.all_gather_phase, step);
      for (const patterns::Range& c :
           patterns::pieces(patterns::block(p.data.count, n, s.recv_block), p.chunk)) {
        requests.push_back(backend.irecv(prev, p.data.slice(c.offset, c.count), tag));
      }
      for (const patterns::Range& c :
           patterns::pieces(patterns::block(p.data.count, n, s.send_block), p.chunk)) {
        requests.push_back(backend.isend(next, p.data.slice(c.offset, c.count), tag));
      }
    }
    waitAll(requests, backend.timeout());  // the next step forwards what this one received
  }
}

}  // namespace collie::schedules
