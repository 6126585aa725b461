// Calibrates the α-β-γ cost model on the actual backend before a sweep, one link level at a
// time: inside a node, every node's ranks shift a message around the node's ring at once
// (as a step of an intra-node collective does, contention included), and then two of them
// send one back and forth alone, each from a buffer of its own (what a step with fewer flows
// meets); between nodes, rank 0 and the first rank of another node exchange messages, then
// rank 0 streams large ones to it alone (β one way), and last sends it single messages after
// a pause (what the link banks while idle: bankFromTrips). Each level is probed,
// synchronised, over several sizes and fitted (fitLine); γ times a local reduction on every
// rank at once. The bench, the trainer
// and plugin-check share it (and the buffers of a measurement, and a median) from here.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "collie/backend.h"
#include "collie/cost_model.h"
#include "collie/topology.h"
#include "runtime/control.h"

namespace collie::measure {

// How well one level's line t = α + β·m fits its probes.
struct LinkFit {
  bool probed = false;  // false: the level has no pair of ranks (it copies the other level)
  int sizes = 0;        // probe sizes fitted
  double residual = 0;  // RMS of (fit - measured) / measured over them (0: no line fitted)
  // The probes: (bytes, seconds of one exchange: the median over batches of the slowest
  // probing rank's mean), by size. The bank's (Calibration::inter_bank): the fastest round
  // trip of each size.
  std::vector<std::pair<double, double>> points;
};

struct Calibration {
  CostModel model;
  LinkFit intra, inter;
  LinkFit inter_one_way;  // the stream between nodes behind inter.beta_one_way
  LinkFit inter_bank;     // round trips after a pause, between nodes, behind inter.bank
  LinkFit intra_alone;    // a pair alone inside a node, behind intra.alpha_alone, beta_alone
};

// What the buffers of a measurement on `backend` are like: host memory of `dtype`; device
// memory on `device` where the backend moves no host memory (nccl, loopback's memory:
// device); or size-only where the backend carries no payload (a simulator pricing sizes:
// thousands of ranks cannot each hold a message, nor 32 MiB of probes).
Buffer measurementLike(const Backend& backend, DType dtype, int device);

// The median of `values` (NaN when empty).
double median(std::vector<double> values);

// What a link between nodes banks while idle (LinkCost::bank), in bytes, from the fastest
// round trips after a pause of 8 B, m and M bytes (`trips`, smallest first; m < M): the
// slope from m to M is the pace of a message after a pause, and the bank what m passed
// beyond it, m - 8 - (t(m) - t(8)) / pace, at most m. 0 where the bank is under a tenth of
// m, the probes' noise (a wire, a simulated link), or where `trips` is not three sizes in
// increasing order. A bank between m and M reads as less than m, the less the nearer it is
// to M (part of M then passed at the bank's pace); one that holds M too reads as nothing
// (every size passed at the bank's own pace): telling it from a fast link took the stream's
// β, which between emulated nodes on one host is noise (it read 2x the exchange's pace
// there, and a bank of 1 MiB where there is none).
double bankFromTrips(const std::vector<std::pair<double, double>>& trips);

// The largest probe between nodes: 4 MiB, past a lab link's token bucket (128 KB at 1
// Gbit/s), where the wire decides; a larger one costs a slow link seconds of start-up
// (4 MiB is 0.34 s at 100 Mbit/s).
constexpr uint64_t kLargestInterProbe = 4 << 20;

// The level between nodes of a job on one node, which has none: the level inside it without
// what its shared cores add (no flows, no pair alone), so that a schedule priced by levels
// prices the one there is. calibrate() and the trainer's busy model give it alike.
LinkCost interOnOneNode(const LinkCost& intra);

// Collective over the group: every rank calls it and gets rank 0's calibration.
Calibration calibrate(Backend& backend, Control& control, const Topology& topology, DType dtype);

// The slowest level (between nodes where there are several, else inside one) probed again
// while every rank keeps one core busy, as a training rank's backward does while its
// buckets' all-reduces run: on ranks that outnumber the cores the collective's messages
// then wait for a core. Sizes up to `largest`, the line fitted from the largest size up to
// `message` on, the messages to be priced (with at least three sizes): a busy core delays
// the smallest exchanges by anything from the idle latency to a scheduler's time slice
// (8 bytes between two lab hosts took 70 us in some runs and 2.7 ms in others), which a
// line anchored there would carry to every size.
// Collective over the group (rank 0's fit on every rank). `fit`: the probes, as
// calibrate()'s, with the line's residual and the count of sizes it went through.
LinkCost calibrateUnderLoad(Backend& backend, Control& control, const Topology& topology,
                            uint64_t message, uint64_t largest, LinkFit* fit);

// α and β of (bytes, seconds) points sorted by size, smallest first: the line passes through
// the smallest, with the least-squares slope (which the largest sizes decide); `residual` is
// the RMS relative error over all points, which says how far a line describes the link.
// Neither α nor β is ever negative.
LinkCost fitLine(const std::vector<std::pair<double, double>>& points, double* residual);

// fitLine over the points from the largest size up to `message` on, the sizes to be priced,
// but at least the three largest (all where `message` is below the smallest); `fitted`,
// when given: how many points it went through.
LinkCost fitLineFrom(const std::vector<std::pair<double, double>>& points, double message,
                     double* residual, int* fitted = nullptr);

}  // namespace collie::measure
