// The core-owned staging memory for fused collectives: grows to the largest fused response seen
// (bounded by the fusion threshold) and is reused, 64-byte aligned.
//
// Threading: coordinator thread only.
#ifndef SCALEOUT_FUSION_FUSION_BUFFER_H_
#define SCALEOUT_FUSION_FUSION_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace scaleout {

class FusionBuffer {
 public:
  // A buffer of at least `bytes`; `index` selects one of two independent buffers (send, receive).
  uint8_t* Get(size_t bytes, int index = 0);

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_[2];
  size_t capacity_[2] = {0, 0};
};

}  // namespace scaleout

#endif  // SCALEOUT_FUSION_FUSION_BUFFER_H_
