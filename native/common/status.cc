#include "common/status.h"

#include <cstring>

namespace scaleout {

const char* StatusName(int code) {
  switch (code) {
    case SO_OK:
      return "OK";
#define SO_STATUS_CASE_(NAME, value) \
  case SO_ERR_##NAME:                \
    return #NAME;
      SO_ERROR_TABLE(SO_STATUS_CASE_)
#undef SO_STATUS_CASE_
    default:
      return "UNKNOWN";
  }
}

void CheckFailed(const char* file, int line, const char* expr, const std::string& msg) {
  throw InternalError{std::string(file) + ":" + std::to_string(line) + ": check failed: " + expr +
                      ": " + msg};
}

std::string SystemError(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

}  // namespace scaleout
