#include "common/logging.h"

#include <atomic>
#include <cstdio>

namespace scaleout {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_level{1};
const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kInfo:
      return "INFO";
    default:
      return "DEBUG";
  }
}
}  // namespace

void SetLogContext(int rank, int level) {
  g_rank = rank;
  g_level = level;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

void LogLine(LogLevel level, const std::string& message) {
  std::fprintf(stderr, "scaleout %s (rank %d): %s\n", LevelName(level), g_rank.load(),
               message.c_str());
  std::fflush(stderr);
}

void LogNotice(const std::string& message) {
  if (!LogEnabled(LogLevel::kWarning)) return;
  std::fprintf(stderr, "scaleout NOTICE (rank %d): %s\n", g_rank.load(), message.c_str());
  std::fflush(stderr);
}

}  // namespace scaleout
