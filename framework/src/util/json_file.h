// Reading back the JSON file a rank wrote for its launcher (writeFileAtomically), with the
// errors every such file gives.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "collie/error.h"

namespace collie::detail {

// Parses the file rank 0 left at `path` and hands the document to `from` (JSON → the
// kind's record). Throws InternalError naming `what` ("results", "report") and the file when
// it is missing, not JSON, or lacks what `from` reads.
template <typename From>
auto readRankFile(const std::string& path, const std::string& what, From&& from) {
  std::ifstream in(path);
  if (!in) throw InternalError("rank 0 left no " + what + " in " + path);
  try {
    return from(nlohmann::json::parse(in));
  } catch (const nlohmann::json::exception& e) {
    throw InternalError(path + ": unreadable " + what + " from rank 0: " + e.what());
  } catch (const std::invalid_argument& e) {  // a value `from` refuses
    throw InternalError(path + ": unreadable " + what + " from rank 0: " + e.what());
  }
}

}  // namespace collie::detail
