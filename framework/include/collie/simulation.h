// What only a simulator implements (ABI 10.0): a backend whose ranks live in simulated time
// on a simulated platform. Every other backend leaves Backend::simulation() null and never
// sees this header; the framework asks through the free functions below, which give the
// host's answers for such a backend.
#pragma once

#include <string>
#include <vector>

namespace collie {

class Backend;

class Simulation {
 public:
  virtual ~Simulation() = default;

  // Seconds of simulated time, as the calling rank lives it.
  virtual double clockSeconds() const = 0;
  // Lets `seconds` of simulated time pass for the calling rank (no wall time need pass).
  virtual void sleepSeconds(double seconds) const = 0;
  // The node of every rank of this group, from the simulated platform.
  virtual std::vector<std::string> nodeLabels() const = 0;
  // False while the simulator moves sizes, not bytes (a payload-free mode): the bench then
  // hands schedulers size-only buffers (MemoryKind::kNone) and does not check results; the
  // backend still moves the bytes of host buffers (the control plane's).
  virtual bool payload() const = 0;
};

// The group's time in seconds: the simulator's clock, or std::chrono::steady_clock's. The
// bench, the calibration, the Communicator and the contract check time with it.
double clockSeconds(const Backend& backend);
// Lets `seconds` pass for the calling rank: simulated time, or a sleep of the calling thread.
void sleepSeconds(const Backend& backend, double seconds);
// True when clockSeconds() is not the host's time (reports say "simulated").
bool simulatedTime(const Backend& backend);
// The node of every rank of the group where the backend knows it (a simulator); empty
// otherwise, and the runtime finds the nodes itself.
std::vector<std::string> nodeLabels(const Backend& backend);
// False for a simulator without payload (see Simulation::payload).
bool movesPayload(const Backend& backend);
// Whether a rank's group and its sub-groups may be used from several threads at once, one
// thread per group (docs/writing-a-backend.md): not on a simulator, whose ranks are its
// actors, each one thread of control, nor on a backend whose capabilities say so (nccl).
// Schedulers then keep to the calling thread (hierarchical runs its levels unpipelined).
bool concurrentGroups(const Backend& backend);

}  // namespace collie
