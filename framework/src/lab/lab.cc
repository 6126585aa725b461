// The lab's namespaces, links and caps, made with iproute2 (`ip`, `tc`) and util-linux
// (`unshare`), each run as an argv (no shell: nothing it is given is interpreted).
#include "lab/lab.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "collie/error.h"
#include "collie/log.h"
#include "config/experiment.h"
#include "util/files.h"
#include "util/spawn.h"
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie::lab {
namespace {

constexpr const char* kPrefix = "collie-";
constexpr const char* kSwitch = "collie-sw";  // the namespace of the bridge
constexpr const char* kNetnsDir = "/run/netns";
constexpr const char* kStateDir = "/run/collie-lab";
constexpr const char* kSubnet = "198.18.0";  // .1 .. .LabSpec::kMaxHosts, /24

fs::path statePath() { return fs::path(kStateDir) / "state.json"; }
fs::path utsPath(const std::string& host) { return fs::path(kStateDir) / "uts" / host; }

std::string hostName(int index) { return fmt::format("{}h{}", kPrefix, index); }

// Runs a tool; throws Error naming the command and what it printed when it fails.
std::string run(const std::vector<std::string>& argv) {
  std::string output;
  const int code = detail::runProgram(argv, &output);
  if (code != 0) {
    throw Error(ErrorKind::kComm,
                fmt::format("lab: `{}` failed ({}): {}", fmt::join(argv, " "),
                            code == 127 ? "not found" : fmt::format("exit {}", code),
                            output.empty() ? "no output" : output));
  }
  return output;
}

// "0-1;2,3" -> {{0, 1}, {2, 3}}.
std::vector<std::vector<int>> parseCpus(const std::string& text, int hosts) {
  std::vector<std::vector<int>> sets;
  if (text.empty()) return std::vector<std::vector<int>>(hosts);
  const int online = detail::onlineCpus();
  auto bad = [&](const std::string& why) {
    return ConfigError(fmt::format(
        "lab cpus '{}': {}. Expected one CPU list per host separated by ';', e.g. '0;1' or "
        "'0-1;2-3' (this machine has CPUs 0-{})",
        text, why, online - 1));
  };
  std::stringstream hosts_in(text);
  for (std::string host; std::getline(hosts_in, host, ';');) {
    std::vector<int> cpus;
    std::stringstream in(host);
    for (std::string item; std::getline(in, item, ',');) {
      int first = 0, last = 0;
      char dash = 0, rest = 0;
      std::stringstream one(item);
      if (!(one >> first)) throw bad("'" + item + "' is not a CPU number or range");
      last = first;
      if (one >> dash && (dash != '-' || !(one >> last)))
        throw bad("'" + item + "' is not a range");
      if (one >> rest) throw bad("'" + item + "' is not a CPU number or range");
      if (first < 0 || last < first || last >= online) throw bad("'" + item + "' is out of range");
      for (int c = first; c <= last; ++c) cpus.push_back(c);
    }
    if (cpus.empty()) throw bad("a host has no CPUs");
    sets.push_back(cpus);
  }
  if (static_cast<int>(sets.size()) != hosts) {
    throw bad(fmt::format("{} CPU list(s) for {} host(s)", sets.size(), hosts));
  }
  return sets;
}

// The bucket: a wire banks nothing, but a token bucket banks the time a direction stands
// idle, up to its size, and then sends that much at once (a tree's phases, which use the
// two directions in turn, ran up to twice as fast as a wire would). So it is as small as
// reaches the rate: rate / HZ (4 ms; HZ is 250 on Debian's kernels), but at most 128 KB,
// which still reached 96-98 % of 1 Gbit/s here (64 KB: 70 %), and never under 1 ms of the
// rate.
// The queue: 1.25 MB, as a switch port buffers bytes whatever its rate (10 ms at 1 Gbit/s,
// 100 ms at 100 Mbit/s), then drops: TCP backs off. With 100 ms at 1 Gbit/s TCP filled the
// queue, and each direction's acknowledgements waited behind the other's data, so gloo's
// exchange between two hosts moved 0.097-0.112 GB/s each way (three calibrations) while one
// way streamed 0.119. With 2 ms the exchange moved 0.114-0.120, but the lab dropped packets
// when four flows met, and a retransmission timeout (200 ms) made a 1 MiB all-reduce up to
// 3x slower now and then. With 10 ms at 100 Mbit/s (125 KB), in one of 14 runs of the lab's
// kill test the other host's ranks waited past the job's 10 s grace for the killed ones.
std::vector<std::string> tbfArgs(uint64_t rate_bits) {
  const uint64_t bytes_per_second = rate_bits / 8;
  const uint64_t burst = std::max({uint64_t{16 * 1024}, bytes_per_second / 1000,
                                   std::min<uint64_t>(bytes_per_second / 250, 128000)});
  return {"root",  "tbf",
          "rate",  fmt::format("{}bit", rate_bits),
          "burst", fmt::format("{}", burst),
          "limit", fmt::format("{}", 1250000 + burst)};
}

void writeState(const Lab& lab) {
  nlohmann::json hosts = nlohmann::json::array();
  for (const Host& h : lab.hosts) {
    hosts.push_back(
        {{"name", h.name}, {"interface", h.interface}, {"address", h.address}, {"cpus", h.cpus}});
  }
  nlohmann::json doc = {{"rate", lab.rate}, {"rate_bits", lab.rate_bits}, {"hosts", hosts}};
  detail::writeFileAtomically(statePath().string(), doc.dump(2) + "\n");
}

std::optional<Lab> readState() {
  std::ifstream in(statePath());
  if (!in) return std::nullopt;
  try {
    auto doc = nlohmann::json::parse(in);
    Lab lab;
    lab.rate = doc.at("rate").get<std::string>();
    lab.rate_bits = doc.at("rate_bits").get<uint64_t>();
    for (const auto& h : doc.at("hosts")) {
      lab.hosts.push_back({h.at("name").get<std::string>(), h.at("interface").get<std::string>(),
                           h.at("address").get<std::string>(),
                           h.at("cpus").get<std::vector<int>>()});
    }
    return lab;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a torn or foreign file: the lab is not (known to be) up
  }
}

bool exists(const std::string& netns) { return fs::exists(fs::path(kNetnsDir) / netns); }

// The namespaces collie made, whatever the state file says.
std::vector<std::string> labNamespaces() {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(kNetnsDir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Kills what still runs inside `netns` (a crashed job's ranks), so that deleting it frees
// the namespace at once.
void killInside(const std::string& netns) {
  std::string pids;
  if (detail::runProgram({"ip", "netns", "pids", netns}, &pids) != 0) return;
  std::stringstream in(pids);
  for (pid_t pid; in >> pid;) ::kill(pid, SIGKILL);
}

Lab make(const UpRequest& request, uint64_t rate_bits, const std::vector<std::vector<int>>& cpus) {
  Lab lab;
  lab.rate = request.rate;
  lab.rate_bits = rate_bits;
  fs::create_directories(fs::path(kStateDir) / "uts");
  run({"ip", "netns", "add", kSwitch});
  run({"ip", "-n", kSwitch, "link", "set", "lo", "up"});
  run({"ip", "-n", kSwitch, "link", "add", "br0", "type", "bridge"});
  run({"ip", "-n", kSwitch, "link", "set", "br0", "up"});
  const auto tbf = tbfArgs(rate_bits);
  for (int i = 0; i < request.hosts; ++i) {
    Host h{hostName(i), fmt::format("eth{}", i), fmt::format("{}.{}", kSubnet, i + 1), cpus[i]};
    const std::string port = fmt::format("p{}", i);
    run({"ip", "netns", "add", h.name});
    run({"ip", "link", "add", h.interface, "netns", h.name, "type", "veth", "peer", "name", port,
         "netns", kSwitch});
    run({"ip", "-n", kSwitch, "link", "set", port, "master", "br0"});
    run({"ip", "-n", kSwitch, "link", "set", port, "up"});
    run({"ip", "-n", h.name, "link", "set", "lo", "up"});
    run({"ip", "-n", h.name, "addr", "add", h.address + "/24", "dev", h.interface});
    run({"ip", "-n", h.name, "link", "set", h.interface, "up"});
    // Both directions of the link: the host's sending (its interface) and its receiving
    // (the switch port's sending towards it).
    std::vector<std::string> cap = {"tc", "-n", h.name, "qdisc", "replace", "dev", h.interface};
    cap.insert(cap.end(), tbf.begin(), tbf.end());
    run(cap);
    cap = {"tc", "-n", kSwitch, "qdisc", "replace", "dev", port};
    cap.insert(cap.end(), tbf.begin(), tbf.end());
    run(cap);
    // A host name of its own: a UTS namespace kept alive by a bind mount, as `ip netns`
    // keeps network namespaces.
    const fs::path uts = utsPath(h.name);
    std::ofstream(uts.string()).close();
    run({"unshare", "--uts=" + uts.string(), "hostname", h.name});
    lab.hosts.push_back(h);
  }
  writeState(lab);
  return lab;
}

bool same(const Lab& lab, const UpRequest& request, uint64_t rate_bits,
          const std::vector<std::vector<int>>& cpus) {
  if (static_cast<int>(lab.hosts.size()) != request.hosts || lab.rate_bits != rate_bits)
    return false;
  for (size_t i = 0; i < lab.hosts.size(); ++i) {
    if (lab.hosts[i].cpus != cpus[i]) return false;
  }
  return true;
}

}  // namespace

void requirePrivileges() {
  // CapEff: bit 12 CAP_NET_ADMIN (links, addresses, qdiscs), bit 21 CAP_SYS_ADMIN (namespaces,
  // mounts).
  std::ifstream status("/proc/self/status");
  std::string line;
  uint64_t caps = 0;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) caps = std::stoull(line.substr(7), nullptr, 16);
  }
  const bool allowed = (caps >> 12 & 1) && (caps >> 21 & 1);
  if (!allowed) {
    throw ConfigError(
        "the lab needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to make network namespaces, veth "
        "links and tc caps. HINT: run it with sudo");
  }
  std::string ignored;
  if (detail::runProgram({"ip", "-V"}, &ignored) != 0 ||
      detail::runProgram({"tc", "-V"}, &ignored) != 0) {
    throw ConfigError(
        "the lab needs `ip` and `tc` (Debian package iproute2). HINT: apt-get install iproute2");
  }
}

std::optional<Lab> current() {
  auto lab = readState();
  if (!lab || !exists(kSwitch)) return std::nullopt;
  for (const Host& h : lab->hosts) {
    if (!exists(h.name) || !fs::exists(utsPath(h.name))) return std::nullopt;
  }
  return lab;
}

Lab up(const UpRequest& request, bool* made) {
  if (made) *made = false;
  if (request.hosts < 1 || request.hosts > config::LabSpec::kMaxHosts) {
    throw ConfigError(
        fmt::format("lab hosts: {} is not in [1, {}]", request.hosts, config::LabSpec::kMaxHosts));
  }
  const uint64_t rate_bits = config::parseRate(request.rate, "lab rate");
  const auto cpus = parseCpus(request.cpus, request.hosts);
  requirePrivileges();
  if (auto lab = current(); lab && same(*lab, request, rate_bits, cpus)) return *lab;
  down();
  try {
    Lab lab = make(request, rate_bits, cpus);
    if (made) *made = true;
    return lab;
  } catch (...) {
    down();  // never leave half a lab
    throw;
  }
}

std::vector<std::string> down() {
  std::vector<std::string> removed;
  for (const auto& netns : labNamespaces()) {
    killInside(netns);
    std::string output;
    if (detail::runProgram({"ip", "netns", "delete", netns}, &output) == 0) {
      removed.push_back("network namespace " + netns);
    } else {
      logWarn(fmt::format("lab: cannot delete network namespace {}: {}", netns, output));
    }
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(kStateDir) / "uts", ec)) {
    ::umount2(entry.path().c_str(), MNT_DETACH);
    removed.push_back("host name namespace " + entry.path().filename().string());
  }
  if (fs::exists(kStateDir)) {
    fs::remove_all(kStateDir, ec);
    if (ec) logWarn(fmt::format("lab: cannot remove {}: {}", kStateDir, ec.message()));
    removed.push_back(std::string("state folder ") + kStateDir);
  }
  return removed;
}

std::string describe() {
  auto lab = current();
  if (!lab) return "no lab is up (collie lab up --hosts N makes one)\n";
  std::string out = fmt::format(
      "lab: {} host(s) on a bridge, each link capped at {} in both directions (tbf; no added "
      "delay: netem is not available)\n",
      lab->hosts.size(), lab->rate);
  for (const Host& h : lab->hosts) {
    std::string qdisc;
    detail::runProgram({"tc", "-n", h.name, "qdisc", "show", "dev", h.interface}, &qdisc);
    while (!qdisc.empty() && std::isspace(static_cast<unsigned char>(qdisc.back())))
      qdisc.pop_back();
    out += fmt::format(
        "  {:<10} {:<5} {}/24  cpus {}  [{}]\n", h.name, h.interface, h.address,
        h.cpus.empty() ? std::string("any") : fmt::format("{}", fmt::join(h.cpus, ",")), qdisc);
  }
  return out;
}

const Host& hostNamed(const Lab& lab, const std::string& name) {
  std::vector<std::string> names;
  for (const Host& h : lab.hosts) {
    if (h.name == name) return h;
    names.push_back(h.name);
  }
  throw ConfigError(fmt::format("lab: no host '{}'; the lab has {}", name, fmt::join(names, ", ")));
}

detail::SpawnOptions inside(const Host& host, const std::vector<std::string>& argv,
                            const std::vector<std::string>& env) {
  detail::SpawnOptions options;
  options.argv = argv;
  // A process in a host is a new start, not a simulation's child of this one.
  options.environment = detail::environmentWith(
      env, {"COLLIE_SIMULATION_RUN", "COLLIE_SIMULATION_DIGEST", "COLLIE_SIMULATION_RESULT"});
  options.namespaces = {{(fs::path(kNetnsDir) / host.name).string(), CLONE_NEWNET},
                        {utsPath(host.name).string(), CLONE_NEWUTS}};
  options.own_sysfs = true;
  if (!host.cpus.empty()) {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    for (int c : host.cpus) CPU_SET(c, &cpus);
    options.cpus = cpus;
  }
  return options;
}

int exec(const Host& host, const std::vector<std::string>& argv) {
  COLLIE_CHECK(!argv.empty(), "lab: empty command");
  pid_t pid = -1;
  try {
    pid = detail::spawn(inside(host, argv));
  } catch (const Error& x) {
    // As a shell reports a command it cannot run.
    std::fprintf(stderr, "collie: error: lab: on host %s: %s\n", host.name.c_str(), x.what());
    return 127;
  }
  return detail::exitCodeOf(detail::waitFor(pid));
}

}  // namespace collie::lab
