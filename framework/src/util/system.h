// Facts about the running process that users need in bug reports.
#pragma once

#include <string>
#include <vector>

namespace collie::detail {

// The file of the loaded library (or executable) that holds `address` (a function or object
// of it), as the dynamic loader names it; "" when none does.
std::string libraryOf(const void* address);

// The BLAS library this process has loaded (resolved through the alternatives symlinks),
// e.g. ".../openblas-pthread/libblas.so.3", or "none loaded".
std::string blasInUse();
// The library whose malloc this process calls (collie links tcmalloc), resolved like blasInUse.
std::string mallocInUse();

// This host's name ("localhost" when it has none).
std::string hostName();

// The state letter of process `pid` in /proc/PID/stat ('R' running, 'S' sleeping, 'D' in
// the kernel, 'T' stopped by a signal, 't' by a debugger, 'Z' not reaped), or 0 when there
// is no such process.
char processState(int pid);

// The host's online CPUs.
int onlineCpus();
// The first "model name" of /proc/cpuinfo ("" when it has none).
std::string cpuModel();
// The 1-minute load average (NaN when unknown).
double loadAverage();
// The link speed the kernel reports for network interface `name` in Mbit/s, or -1 when it
// reports none (loopback, many virtual links, a missing interface).
int linkSpeedMbps(const std::string& name);

// Runs `argv` (looked up on PATH, no shell) and waits for it; its stdout and stderr together
// go to `output`. Returns its exit code: 127 when it cannot be run (`output` then says why),
// 128 + signal when one killed it.
int runProgram(const std::vector<std::string>& argv, std::string* output);

}  // namespace collie::detail
