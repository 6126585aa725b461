// Process introspection through /proc.
#include "util/system.h"

#include <filesystem>
#include <fstream>

namespace collie::detail {

std::string blasInUse() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    std::string file = std::filesystem::path(path).filename().string();
    if (file.rfind("libblas.so", 0) == 0 || file.rfind("libopenblas", 0) == 0 ||
        file.rfind("libmkl_rt", 0) == 0) {
      std::error_code ec;
      auto real = std::filesystem::canonical(path, ec);
      return ec ? path : real.string();
    }
  }
  return "none loaded";
}

}  // namespace collie::detail
