// Rank-prefixed logging for the core and plugins (spdlog inside, no spdlog in this header).
#pragma once

#include <string>

namespace collie {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

void logMessage(LogLevel level, const std::string& message);
inline void logDebug(const std::string& m) { logMessage(LogLevel::kDebug, m); }
inline void logInfo(const std::string& m) { logMessage(LogLevel::kInfo, m); }
inline void logWarn(const std::string& m) { logMessage(LogLevel::kWarn, m); }
inline void logError(const std::string& m) { logMessage(LogLevel::kError, m); }

// The rank shown in front of every message logged from the calling thread (-1: none).
void setLogRank(int rank);
// The rank shown for every thread that did not call setLogRank (a worker process's rank).
void setProcessLogRank(int rank);
// Parses trace|debug|info|warn|error|off; false when the name is unknown.
bool parseLogLevel(const std::string& name, LogLevel* out);
void setLogLevel(LogLevel level);

}  // namespace collie
