// Containers for what a schedule keeps during one collective (its requests, scratch and
// parts), held inline on the stack up to a few entries: a small collective then makes no
// heap allocation (tests/backends/hot_path_test.cc), and a large one spills to the heap.
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstddef>
#include <memory>

#include "collie/backend.h"

namespace collie::schedules {

template <typename T, size_t N>
using Small = boost::container::small_vector<T, N>;

// A step's pending requests (waitAll takes them).
using Requests = Small<std::unique_ptr<Request>, 8>;

}  // namespace collie::schedules
