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

// A rank's neighbours in one part's ring.
struct RingNeighbours {
  int position = 0, next = 0, prev = 0;
};
inline RingNeighbours ringNeighbours(const RingPart& part, const Backend& backend) {
  const int n = backend.size();
  RingNeighbours r;
  r.position = patterns::ringPosition(backend.rank(), n, part.forward);
  r.next = patterns::ringRankAt(patterns::ringNext(r.position, n), n, part.forward);
  r.prev = patterns::ringRankAt(patterns::ringPrev(r.position, n), n, part.forward);
  return r;
}

// After it, the rank at position b of every part holds block b reduced over every rank.
// The parts (a container of RingPart: one ring or two) move in lockstep, one step of each at
// a time. Pipelined by chunk: what a step receives is what the next step sends (its block
// reduced), so each chunk is sent on as soon as it is reduced, and the link to the next rank
// never waits for a whole block; each step's receives are posted a step ahead, into one of
// two scratch blocks per part. Except over a backend with batch completion (nccl: a wait
// completes every request posted before it): a receive posted a step ahead would wait there
// for the send its neighbour posts only after its own wait, all round the ring, so a step's
// receives are posted once the last step's have arrived (into one scratch block).
template <typename Parts>
void ringReduceScatter(const Parts& parts, ReduceOp op, uint64_t seq, Backend& backend) {
  const int n = backend.size();
  const auto timeout = backend.timeout();
  const bool ahead = n > 2 && !backend.capabilities().batch_completion;
  // [part * slots + step parity]: the largest block (one per part when one step is all)
  const size_t slots = ahead ? 2 : 1;
  Small<ScratchBuffer, 4> incoming;
  Small<Requests, 4> recvs(slots * parts.size());
  for (const RingPart& p : parts) {
    for (size_t parity = 0; parity < slots; ++parity)
      incoming.emplace_back(p.data, patterns::block(p.data.count, n, 0).count);
  }
  auto received = [&](size_t t, int step) {  // the block step `step` of part t receives
    const RingPart& p = parts[t];
    const int position = ringNeighbours(p, backend).position;
    return patterns::block(p.data.count, n,
                           patterns::ringReduceScatterStep(position, n, step).recv_block);
  };
  auto slotOf = [&](size_t t, int step) { return slots * t + static_cast<size_t>(step) % slots; };
  auto post = [&](size_t t, int step) {
    const RingPart& p = parts[t];
    const patterns::Range block = received(t, step);
    const size_t slot = slotOf(t, step);
    const Tag tag = makeTag(seq, p.reduce_scatter_phase, step);
    for (const patterns::Range& c : patterns::pieces(block, p.chunk)) {
      Buffer into = incoming[slot].view().slice(c.offset - block.offset, c.count);
      recvs[slot].push_back(backend.irecv(ringNeighbours(p, backend).prev, into, tag));
    }
  };
  Requests sends;
  for (size_t t = 0; t < parts.size(); ++t) {
    const RingPart& p = parts[t];
    const RingNeighbours ring = ringNeighbours(p, backend);
    post(t, 0);
    if (ahead) post(t, 1);
    const auto first = patterns::ringReduceScatterStep(ring.position, n, 0);
    const Tag tag = makeTag(seq, p.reduce_scatter_phase, 0);
    for (const patterns::Range& c :
         patterns::pieces(patterns::block(p.data.count, n, first.send_block), p.chunk)) {
      sends.push_back(backend.isend(ring.next, p.data.slice(c.offset, c.count), tag));
    }
  }
  for (int step = 0; step < n - 1; ++step) {
    for (size_t t = 0; t < parts.size(); ++t) {
      const RingPart& p = parts[t];
      const patterns::Range block = received(t, step);
      const size_t slot = slotOf(t, step);
      const Tag onward = makeTag(seq, p.reduce_scatter_phase, step + 1);
      const int next = ringNeighbours(p, backend).next;
      size_t i = 0;
      for (const patterns::Range& c : patterns::pieces(block, p.chunk)) {
        recvs[slot][i++]->wait(timeout);
        const Buffer chunk = p.data.slice(c.offset, c.count);
        reduceInto(chunk, incoming[slot].view().slice(c.offset - block.offset, c.count), op);
        if (step + 1 < n - 1) sends.push_back(backend.isend(next, chunk, onward));
      }
      recvs[slot].clear();
      const int next_post = ahead ? step + 2 : step + 1;  // into the scratch done with
      if (next_post < n - 1) post(t, next_post);
    }
  }
  waitAll(sends, timeout);
}

// Starting with block b complete on the rank at position b of every part, leaves every
// block complete on every rank. Pipelined as the reduce-scatter: every receive lands in its
// own block, so all are posted at once, and each chunk is sent on as it arrives. Over a
// backend with batch completion each step's receives are posted once the last step's have
// arrived, for the reason the reduce-scatter gives.
template <typename Parts>
void ringAllGather(const Parts& parts, uint64_t seq, Backend& backend) {
  const int n = backend.size();
  const auto timeout = backend.timeout();
  const bool ahead = !backend.capabilities().batch_completion;
  Requests recvs, sends;  // receives in order: step, part, chunk
  auto post = [&](int step) {
    for (const RingPart& p : parts) {
      const RingNeighbours ring = ringNeighbours(p, backend);
      const auto s = patterns::ringAllGatherStep(ring.position, n, step);
      const Tag tag = makeTag(seq, p.all_gather_phase, step);
      for (const patterns::Range& c :
           patterns::pieces(patterns::block(p.data.count, n, s.recv_block), p.chunk)) {
        recvs.push_back(backend.irecv(ring.prev, p.data.slice(c.offset, c.count), tag));
      }
    }
  };
  for (int step = 0; step < (ahead ? n - 1 : 1); ++step) post(step);
  for (const RingPart& p : parts) {
    const RingNeighbours ring = ringNeighbours(p, backend);
    const auto first = patterns::ringAllGatherStep(ring.position, n, 0);
    const Tag tag = makeTag(seq, p.all_gather_phase, 0);
    for (const patterns::Range& c :
         patterns::pieces(patterns::block(p.data.count, n, first.send_block), p.chunk)) {
      sends.push_back(backend.isend(ring.next, p.data.slice(c.offset, c.count), tag));
    }
  }
  size_t i = 0;
  for (int step = 0; step < n - 1; ++step) {
    for (const RingPart& p : parts) {
      const RingNeighbours ring = ringNeighbours(p, backend);
      const auto s = patterns::ringAllGatherStep(ring.position, n, step);
      const Tag onward = makeTag(seq, p.all_gather_phase, step + 1);
      for (const patterns::Range& c :
           patterns::pieces(patterns::block(p.data.count, n, s.recv_block), p.chunk)) {
        recvs[i++]->wait(timeout);
        if (step + 1 < n - 1)
          sends.push_back(backend.isend(ring.next, p.data.slice(c.offset, c.count), onward));
      }
    }
    if (!ahead && step + 1 < n - 1) post(step + 1);
  }
  recvs.clear();
  waitAll(sends, timeout);
}

}  // namespace collie::schedules
