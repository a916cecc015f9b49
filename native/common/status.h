// Status: the error value carried by every asynchronous path in the core.
#ifndef SCALEOUT_COMMON_STATUS_H_
#define SCALEOUT_COMMON_STATUS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "c_api/scaleout.h"

namespace scaleout {

// Note [Error details]
// ~~~~~~~~~~~~~~~~~~~~
// What a program needs to know about an error travels as data beside the message, so that no
// caller parses English (the launcher naming the rank that caused a failure, top-k finding the
// process set it already added): the culprit ranks, the job's ranks whose death or shutdown
// made the collective fail (empty when no rank is to blame), and for "process set N has these
// ranks already" the existing set's id. Set where the error is made (negotiation, liveness, a
// departed rank 0, adding a set), carried in responses to every rank, and read through the C
// ABI by so_last_error_details.

// A status code from the C ABI (SO_OK, SO_ERR_...), a message for people and the details of
// Note [Error details].
class Status {
 public:
  Status() = default;
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {SO_ERR_INVALID_ARGUMENT, std::move(m)}; }
  static Status NotInitialized(std::string m) { return {SO_ERR_NOT_INITIALIZED, std::move(m)}; }
  static Status ShutDown(std::string m) { return {SO_ERR_SHUT_DOWN, std::move(m)}; }
  static Status Mismatch(std::string m) { return {SO_ERR_MISMATCH, std::move(m)}; }
  static Status DuplicateName(std::string m) { return {SO_ERR_DUPLICATE_NAME, std::move(m)}; }
  static Status Transport(std::string m) { return {SO_ERR_TRANSPORT, std::move(m)}; }
  static Status Timeout(std::string m) { return {SO_ERR_TIMEOUT, std::move(m)}; }
  static Status Internal(std::string m) { return {SO_ERR_INTERNAL, std::move(m)}; }
  static Status NotSupported(std::string m) { return {SO_ERR_NOT_SUPPORTED, std::move(m)}; }

  bool ok() const { return code_ == SO_OK; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::vector<int32_t>& culprit_ranks() const { return culprit_ranks_; }
  int32_t process_set_id() const { return process_set_id_; }  // -1: none

  // The same error (code and details) in other words, for a caller adding context.
  Status Reworded(std::string message) const {
    Status s = *this;
    s.message_ = std::move(message);
    return s;
  }
  Status WithCulprits(std::vector<int32_t> ranks) && {
    culprit_ranks_ = std::move(ranks);
    return std::move(*this);
  }
  Status WithProcessSet(int32_t id) && {
    process_set_id_ = id;
    return std::move(*this);
  }

 private:
  int code_ = SO_OK;
  std::string message_;
  std::vector<int32_t> culprit_ranks_;
  int32_t process_set_id_ = -1;
};

// Name of a status code ("MISMATCH", ...), as exported by so_status_name.
const char* StatusName(int code);

// "what: <strerror(err)>", for a failed system call's errno.
std::string SystemError(const std::string& what, int err);

// Thrown only inside the core by SO_CHECK; every C ABI entry point catches it.
struct InternalError {
  std::string message;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace scaleout

// Invariant check that reports file:line; never used for user input.
#define SO_CHECK(cond, msg)                                                 \
  do {                                                                      \
    if (!(cond)) ::scaleout::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#endif  // SCALEOUT_COMMON_STATUS_H_
