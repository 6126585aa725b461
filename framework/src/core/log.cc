// spdlog behind collie/log.h: one stderr logger whose lines carry the calling rank.
#include "collie/log.h"

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>

namespace collie {
namespace {

thread_local int t_rank = -1;
std::atomic<int> g_process_rank{-1};  // the rank of this worker process, for every thread

// %R in the pattern: "r3 " for rank 3, nothing outside a rank.
class RankFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    int rank = t_rank >= 0 ? t_rank : g_process_rank.load(std::memory_order_relaxed);
    if (rank < 0) return;
    std::string text = fmt::format("r{} ", rank);
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RankFlag>();
  }
};

spdlog::level::level_enum toSpd(LogLevel level) {
  // In LogLevel's order: spdlog's, less its `critical`.
  static constexpr spdlog::level::level_enum kLevels[] = {
      spdlog::level::trace, spdlog::level::debug, spdlog::level::info,
      spdlog::level::warn,  spdlog::level::err,   spdlog::level::off};
  static_assert(std::size(kLevels) == static_cast<size_t>(LogLevel::kOff) + 1);
  const auto i = static_cast<size_t>(level);
  return i < std::size(kLevels) ? kLevels[i] : spdlog::level::info;
}

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto log = std::make_shared<spdlog::logger>("collie", sink);
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<RankFlag>('R').set_pattern("[%H:%M:%S.%e] [%R%^%l%$] %v");
    log->set_formatter(std::move(formatter));
    LogLevel level = LogLevel::kInfo;
    if (const char* env = std::getenv("COLLIE_LOG_LEVEL")) parseLogLevel(env, &level);
    log->set_level(toSpd(level));
    return log;
  }();
  return *instance;
}

}  // namespace

void logMessage(LogLevel level, const std::string& message) { logger().log(toSpd(level), message); }

void setLogRank(int rank) { t_rank = rank; }

void setProcessLogRank(int rank) { g_process_rank.store(rank, std::memory_order_relaxed); }

bool parseLogLevel(const std::string& name, LogLevel* out) {
  static const std::pair<const char*, LogLevel> kLevels[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"off", LogLevel::kOff}};
  for (const auto& [text, level] : kLevels) {
    if (name == text) {
      *out = level;
      return true;
    }
  }
  return false;
}

void setLogLevel(LogLevel level) { logger().set_level(toSpd(level)); }

}  // namespace collie
