// What a host's network interfaces counted: the kernel's bytes sent and received over every
// interface but loopback, as /proc/net/dev shows them to this process (its network
// namespace: on a lab host, the host's own interface only). Traffic between two ranks of one
// host goes over loopback and is not counted; what is counted includes every header (TCP,
// IP, Ethernet) and every other process's traffic, so it means "what this job sent" only
// where the job has the interface to itself: on the lab's hosts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace collie::measure {

struct InterfaceBytes {
  uint64_t sent = 0, received = 0;
};

// The sums over every interface of /proc/net/dev but `lo`; nullopt when the file cannot be
// read or parsed (the counts are a report, never a reason to stop a run).
std::optional<InterfaceBytes> readInterfaceBytes(const std::string& path = "/proc/net/dev");

// The variable the lab sets in every process it starts on a host: the host's name.
inline constexpr const char* kLabHostVariable = "COLLIE_LAB_HOST";

// The name of this process's lab host (kLabHostVariable), or "" off the lab.
std::string labHostName();

}  // namespace collie::measure
