#include "fusion/fusion_hold.h"

#include "fusion/fusion_planner.h"

namespace scaleout {

bool FusionHold::Hold(double now, bool half_submitted, const std::vector<Response>& ready) {
  if (first_ready_time_ < 0) first_ready_time_ = now;
  if (cycle_seconds_ <= 0 || !half_submitted || now - first_ready_time_ >= cycle_seconds_)
    return false;
  // Count only what became ready since the last call: this runs on every poll while holding.
  for (; held_count_ < ready.size(); ++held_count_) {
    const Response& r = ready[held_count_];
    if (!r.tensors.empty()) held_bytes_ += FusedBytes(r, r.tensors[0]);
  }
  return held_bytes_ < threshold_bytes_;
}

void FusionHold::Sent() {
  first_ready_time_ = -1;
  held_count_ = 0;
  held_bytes_ = 0;
}

}  // namespace scaleout
