// Facts about the running process that users need in bug reports.
#pragma once

#include <string>

namespace collie::detail {

// The BLAS library this process has loaded (resolved through the alternatives symlinks),
// e.g. ".../openblas-pthread/libblas.so.3", or "none loaded".
std::string blasInUse();

}  // namespace collie::detail
