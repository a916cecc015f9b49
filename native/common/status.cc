#include "common/status.h"

namespace scaleout {

const char* StatusName(int code) {
  switch (code) {
    case SO_OK: return "OK";
    case SO_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case SO_ERR_NOT_INITIALIZED: return "NOT_INITIALIZED";
    case SO_ERR_SHUT_DOWN: return "SHUT_DOWN";
    case SO_ERR_MISMATCH: return "MISMATCH";
    case SO_ERR_DUPLICATE_NAME: return "DUPLICATE_NAME";
    case SO_ERR_TRANSPORT: return "TRANSPORT";
    case SO_ERR_TIMEOUT: return "TIMEOUT";
    case SO_ERR_INTERNAL: return "INTERNAL";
    case SO_ERR_UNKNOWN_HANDLE: return "UNKNOWN_HANDLE";
    default: return "UNKNOWN";
  }
}

void CheckFailed(const char* file, int line, const char* expr, const std::string& msg) {
  throw InternalError{std::string(file) + ":" + std::to_string(line) + ": check failed: " + expr +
                      ": " + msg};
}

}  // namespace scaleout
