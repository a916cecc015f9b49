// FNV-1a over a list of integers: what ranks compare to check that they were given the same
// list (a process set's ranks, a tensor's shape on the fast lane).
#ifndef SCALEOUT_COMMON_HASH_H_
#define SCALEOUT_COMMON_HASH_H_

#include <cstdint>
#include <vector>

namespace scaleout {

template <typename Int>
uint64_t Fnv1a(const std::vector<Int>& values) {
  uint64_t hash = 1469598103934665603ULL;
  for (Int v : values) hash = (hash ^ static_cast<uint64_t>(v)) * 1099511628211ULL;
  return hash;
}

}  // namespace scaleout

#endif  // SCALEOUT_COMMON_HASH_H_
