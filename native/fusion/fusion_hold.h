// Note [Dispatch]
// Ready work is sent at once, except while other collectives are half-submitted (some ranks
// have sent them, others not yet): then more work is about to become ready and fusing it saves
// messages, so rank 0 holds the ready work back for at most SCALEOUT_CYCLE_TIME, or until it
// fills the fusion buffer. A lone collective is never held, so there is no latency floor.
#ifndef SCALEOUT_FUSION_FUSION_HOLD_H_
#define SCALEOUT_FUSION_FUSION_HOLD_H_

#include <cstddef>
#include <vector>

#include "coordinator/message.h"

namespace scaleout {

// Rank 0's decision to hold ready work back for fusion. Not thread-safe (the coordinator
// thread's).
class FusionHold {
 public:
  FusionHold(double cycle_time_ms, size_t threshold_bytes)
      : cycle_seconds_(cycle_time_ms * 1e-3), threshold_bytes_(threshold_bytes) {}

  // Whether to keep `ready` (not empty; only ever grown at its end between calls) back at
  // `now`, while `half_submitted` other collectives wait for some ranks.
  bool Hold(double now, bool half_submitted, const std::vector<Response>& ready);
  // The held work was sent: the next ready work starts a new hold.
  void Sent();
  // New settings (Note [Autotune]); a hold under way goes on under them.
  void Retune(double cycle_time_ms, size_t threshold_bytes) {
    cycle_seconds_ = cycle_time_ms * 1e-3;
    threshold_bytes_ = threshold_bytes;
  }

 private:
  double cycle_seconds_;
  size_t threshold_bytes_;
  double first_ready_time_ = -1;  // when the oldest held-back ready response became ready
  size_t held_count_ = 0;         // ready responses counted into held_bytes_
  size_t held_bytes_ = 0;         // fusion-buffer bytes of the held-back ready responses
};

}  // namespace scaleout

#endif  // SCALEOUT_FUSION_FUSION_HOLD_H_
