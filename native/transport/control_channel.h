// The small message channel the coordinators talk over. Negotiation depends only on this
// interface, so it runs over MPI (or shared memory: Note [Shared-memory control channel]) in a
// job and over an in-memory fake in unit tests.
//
// Threading: used by the coordinator thread only. Ordering: messages from one sender to one
// receiver arrive in the order they were sent (MPI's non-overtaking rule).
#ifndef SCALEOUT_TRANSPORT_CONTROL_CHANNEL_H_
#define SCALEOUT_TRANSPORT_CONTROL_CHANNEL_H_

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace scaleout {

class ControlChannel {
 public:
  virtual ~ControlChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts sending; returns at once. The channel owns the bytes until delivery.
  virtual Status Send(int dest, std::vector<uint8_t> bytes) = 0;
  // A message that has arrived, if any: true and *src / *bytes set; false when none is waiting.
  virtual Status TryReceive(bool* got, int* src, std::vector<uint8_t>* bytes) = 0;
  // The same, from `src` only.
  virtual Status TryReceiveFrom(int src, bool* got, std::vector<uint8_t>* bytes) = 0;
  // A peer died (Note [Liveness]): what is in flight may never be delivered, so the channel must
  // not wait for it when it goes.
  virtual void Abandon() {}
  // Moves sends in flight along (MPI progresses only inside its calls); *in_flight: whether any
  // are still incomplete. For a channel that wraps this one and otherwise makes no calls to it.
  virtual Status Progress(bool* in_flight) {
    *in_flight = false;
    return Status::OK();
  }
};

}  // namespace scaleout

#endif  // SCALEOUT_TRANSPORT_CONTROL_CHANNEL_H_
