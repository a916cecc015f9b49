// Minimal logging to stderr, prefixed with the rank; the level comes from Config.
#ifndef SCALEOUT_COMMON_LOGGING_H_
#define SCALEOUT_COMMON_LOGGING_H_

#include <sstream>
#include <string>

namespace scaleout {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// Process-wide logging settings, set by the runtime at init (rank prefix and verbosity).
void SetLogContext(int rank, int level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& message);
// A result the user asked for (autotune's settings to keep): shown from the warning level up,
// tagged NOTICE since nothing is wrong.
void LogNotice(const std::string& message);

}  // namespace scaleout

#define SO_LOG(level, ...)                                                    \
  do {                                                                        \
    if (::scaleout::LogEnabled(::scaleout::LogLevel::level)) {                \
      std::ostringstream so_log_stream_;                                      \
      so_log_stream_ << __VA_ARGS__;                                          \
      ::scaleout::LogLine(::scaleout::LogLevel::level, so_log_stream_.str()); \
    }                                                                         \
  } while (0)

#endif  // SCALEOUT_COMMON_LOGGING_H_
