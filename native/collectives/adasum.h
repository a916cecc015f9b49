// Adasum (op=Adasum): combines every rank's vectors pairwise in a binary tree over the ranks,
// each pair (a, b) into (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, per tensor. See Note
// [Adasum].
//
// Threading: coordinator thread only.
#ifndef SCALEOUT_COLLECTIVES_ADASUM_H_
#define SCALEOUT_COLLECTIVES_ADASUM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "transport/data_transport.h"

namespace scaleout {

class Adasum {
 public:
  explicit Adasum(DataTransport* all) : all_(all) {}

  // Combines buf (tensors of counts[i] elements of dtype, end to end) across every rank of
  // `all`, in place: afterwards every rank holds the same bits. dtype: float16, bfloat16,
  // float32, float64; the number of ranks a power of two.
  Status Run(uint8_t* buf, const std::vector<size_t>& counts, DataType dtype);

  // a and b (n elements each) into out: the pairwise rule over each tensor of `counts`
  // (exposed for tests). out may be a or b.
  static void Combine(const uint8_t* a, const uint8_t* b, uint8_t* out,
                      const std::vector<size_t>& counts, DataType dtype);

 private:
  DataTransport* all_;
  std::vector<uint8_t> theirs_;  // the partner's vector at each level
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_ADASUM_H_
