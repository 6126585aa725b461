#include "measure/interface_bytes.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace collie::measure {

// /proc/net/dev: two header lines, then "  NAME: rx_bytes rx_packets ... (8 receive fields)
// tx_bytes ..." per interface.
std::optional<InterfaceBytes> readInterfaceBytes(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  InterfaceBytes sum;
  int interfaces = 0;
  for (int n = 0; std::getline(in, line); ++n) {
    const size_t colon = line.find(':');
    if (n < 2 || colon == std::string::npos) continue;
    std::istringstream name_in(line.substr(0, colon));
    std::string name;
    name_in >> name;
    std::istringstream fields(line.substr(colon + 1));
    std::vector<uint64_t> values;
    for (uint64_t v = 0; fields >> v;) values.push_back(v);
    if (values.size() < 9) return std::nullopt;
    ++interfaces;
    if (name == "lo") continue;
    sum.received += values[0];
    sum.sent += values[8];
  }
  if (interfaces == 0) return std::nullopt;
  return sum;
}

std::string labHostName() {
  const char* host = std::getenv(kLabHostVariable);
  return host != nullptr ? host : "";
}

}  // namespace collie::measure
