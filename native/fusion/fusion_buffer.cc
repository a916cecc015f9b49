#include "fusion/fusion_buffer.h"

#include <cstdlib>
#include <new>

namespace scaleout {

void FusionBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

uint8_t* FusionBuffer::Get(size_t bytes, int index) {
  if (bytes > capacity_[index] || !data_[index]) {
    const size_t rounded = ((bytes > 0 ? bytes : 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw std::bad_alloc();
    data_[index].reset(static_cast<uint8_t*>(p));
    capacity_[index] = rounded;
  }
  return data_[index].get();
}

}  // namespace scaleout
