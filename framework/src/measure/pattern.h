// Closed-form inputs and expected results for every collective, op and dtype: what the
// bench's #wrong column and the scheduler tests check against. Values are small integers so
// that every dtype (bf16 included) holds every partial sum exactly, up to 16 ranks.
#pragma once

#include <cstdint>

#include "collie/collective.h"

namespace collie::pattern {

// Fills this rank's input (args.data) for `args.coll` and clears args.output.
void fillInput(const CollectiveArgs& args, int rank, int size);

// Counts the elements of this rank's result (args.data or args.output, by collective) that
// differ from the closed-form expectation (relative tolerance by dtype for averages).
uint64_t countWrong(const CollectiveArgs& args, int rank, int size);

// Inputs whose sums round, for all-reduce sum and avg of the float dtypes: every element a
// different value of varied magnitude, so that the result's bits depend on the order in
// which the ranks' values were added. The small-integer inputs above add up exactly in any
// order and cannot show a scheduler whose ranks add in different orders.
void fillRounding(const CollectiveArgs& args, int rank);

// Elements of this rank's all-reduce result further from the exact sum (or average) of the
// rounded inputs than n rounding errors of the dtype allow.
uint64_t countWrongRounding(const CollectiveArgs& args, int size);

}  // namespace collie::pattern
