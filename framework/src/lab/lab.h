// The lab: an emulated cluster on one machine (docs/lab.md). Each host is a
// network namespace with its own interface, address and host name (a UTS namespace); every
// host's interface is one end of a veth pair whose other end is a port of a bridge in a
// switch namespace, and both directions of each link are capped with tbf. Addresses come
// from 198.18.0.0/24 (the benchmarking range, RFC 2544) and exist only inside the lab's
// namespaces; the machine's own namespace gets nothing but the namespace files.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/spawn.h"

namespace collie::lab {

struct Host {
  std::string name;       // its host name and the suffix of its namespace, "collie-h0"
  std::string interface;  // "eth0" on host 0, "eth1" on host 1: names differ, as on real machines
  std::string address;    // 198.18.0.(index + 1)
  std::vector<int> cpus;  // the CPUs its processes run on (empty: any)
};

struct Lab {
  std::vector<Host> hosts;
  std::string rate;  // the tbf rate of every link, as given ("1gbit")
  uint64_t rate_bits = 0;
};

struct UpRequest {
  int hosts = 2;
  std::string rate = "1gbit";
  // Per host, the CPUs it may use ("0,1;2,3" or "0-1;2-3": host 0 gets 0 and 1, host 1 gets
  // 2 and 3); "" leaves every host every CPU.
  std::string cpus;
};

// Refuses with one clear line (ConfigError) when this process cannot make network
// namespaces, veth pairs and qdiscs (not root, or without CAP_SYS_ADMIN and CAP_NET_ADMIN),
// or when `ip` is missing.
void requirePrivileges();

// Sets the lab up as asked. Idempotent: a lab that is already up as asked is left as it is;
// one that differs (host count, rate or CPUs) is taken down and made again. Returns it;
// `made` (when given) says whether this call made it.
Lab up(const UpRequest& request, bool* made = nullptr);

// Removes everything a lab made: every namespace named collie-*, the host-name namespaces
// and the state folder, whether or not the lab's state file survived a crash. Returns what
// it removed, one line each (empty: nothing was there).
std::vector<std::string> down();

// The lab as its state file records it, when it is up (every namespace it names exists).
std::optional<Lab> current();

// The state of the lab in a few lines, for `collie lab status`: hosts, addresses,
// interfaces, CPUs, the links' rate and their qdiscs; or "no lab is up".
std::string describe();

// How to start `argv` (looked up on PATH) inside `host`: its network and UTS namespaces, its
// /sys, its CPUs, with `env` (NAME=VALUE) added.
detail::SpawnOptions inside(const Host& host, const std::vector<std::string>& argv,
                            const std::vector<std::string>& env = {});

// Runs `argv` inside `host` and waits: the command's exit code, 128 + signal when one
// killed it, 127 when it cannot be started (a missing namespace, a command not on PATH:
// the reason, naming the host, on stderr).
int exec(const Host& host, const std::vector<std::string>& argv);

// The host named `name` of `lab`, or ConfigError listing the lab's hosts.
const Host& hostNamed(const Lab& lab, const std::string& name);

}  // namespace collie::lab
