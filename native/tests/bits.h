// Bit-level views of floats, for tests that check exact encodings.
#ifndef SCALEOUT_TESTS_BITS_H_
#define SCALEOUT_TESTS_BITS_H_

#include <cstdint>
#include <cstring>

namespace scaleout {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace scaleout

#endif  // SCALEOUT_TESTS_BITS_H_
