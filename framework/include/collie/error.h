// Error types shared by the core and every plugin, and the COLLIE_CHECK macro.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace collie {

// What went wrong decides the process exit code: bad input → 2, a failed run → 1.
enum class ErrorKind { kConfig, kPlugin, kComm, kCheckpoint, kInternal, kTraining };

// Base of every exception collie throws. The message is complete and user-facing:
// what failed, expected vs found, where, and a "HINT:" when there is one.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  // Defined in libcollie_core so that the vtable and type_info of every collie exception live
  // there: an exception thrown by a plugin stays valid after the plugin is unloaded, and
  // catch-by-type works across plugins loaded with RTLD_LOCAL.
  ~Error() override;
  ErrorKind kind() const noexcept { return kind_; }
  // 2 for bad input (config, CLI, plugin), 1 for a run that failed.
  int exitCode() const noexcept {
    return kind_ == ErrorKind::kConfig || kind_ == ErrorKind::kPlugin ? 2 : 1;
  }

 private:
  ErrorKind kind_;
};

class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(ErrorKind::kConfig, what) {}
  ~ConfigError() override;
};
class PluginError : public Error {
 public:
  explicit PluginError(const std::string& what) : Error(ErrorKind::kPlugin, what) {}
  ~PluginError() override;
};
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(ErrorKind::kComm, what) {}
  ~CommError() override;
};
class CheckpointError : public Error {
 public:
  explicit CheckpointError(const std::string& what) : Error(ErrorKind::kCheckpoint, what) {}
  ~CheckpointError() override;
};
// Training itself went wrong (a non-finite loss): not a transport, config or plugin fault.
class TrainingError : public Error {
 public:
  explicit TrainingError(const std::string& what) : Error(ErrorKind::kTraining, what) {}
  ~TrainingError() override;
};
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& what) : Error(ErrorKind::kInternal, what) {}
  ~InternalError() override;
};

namespace detail {
// Streams every argument into one string: concat("rank ", 3, " failed").
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace collie

// Throws ErrorType with the message, the failed condition and file:line.
#define COLLIE_CHECK_AS(ErrorType, cond, ...)                                                   \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      throw ErrorType(::collie::detail::concat(__VA_ARGS__, " [check '", #cond, "' failed at ", \
                                               __FILE__, ":", __LINE__, "]"));                  \
    }                                                                                           \
  } while (0)

// An internal invariant: failing it is a collie bug, reported as a failed run (exit 1).
#define COLLIE_CHECK(cond, ...) COLLIE_CHECK_AS(::collie::InternalError, cond, __VA_ARGS__)
