#include "collectives/adasum.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "collectives/reduce_kernels.h"

namespace scaleout {

// Note [Adasum]
// Horovod's Adasum, on the CPU: the ranks' vectors are combined in a binary tree over the
// ranks, the lower group's vector as a and the upper's as b: ranks (0, 1), (2, 3), ... first,
// then (0-1, 2-3), and so on, so the number of ranks must be a power of two. A pair combines
// per tensor: with dot = a.b, na = |a|^2, nb = |b|^2 summed in float64,
//   result = (1 - dot / (2 na)) a + (1 - dot / (2 nb)) b,
// a coefficient staying 1 where its norm is below sqrt(DBL_MIN) (a zero vector adds nothing:
// a rank that joined contributes zeros and drops out). Parallel equal vectors give their
// average, orthogonal ones their sum. Each element is computed in float64 and rounded to the
// dtype once per level (halves through float32, as Horovod's).
// Communication: recursive doubling with whole vectors. At level d every rank exchanges its
// current vector with rank ^ d; both partners then hold the same a and b and compute the same
// bits, so after log2(size) levels every rank holds the root's result. Each rank sends log2(size)
// times the vector (Horovod halves the vector at each level and sends about twice it in all:
// the same at 2 ranks, more from 4).

namespace {

// The pairwise rule over one tensor of n elements of T (float or double); out may be a or b.
template <typename T>
void CombineTyped(const T* a, const T* b, T* out, size_t n) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  const double tiny = std::sqrt(DBL_MIN);
  const double ca = na >= tiny ? 1.0 - dot / (2.0 * na) : 1.0;
  const double cb = nb >= tiny ? 1.0 - dot / (2.0 * nb) : 1.0;
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(ca * a[i] + cb * b[i]);
}

}  // namespace

void Adasum::Combine(const uint8_t* a, const uint8_t* b, uint8_t* out,
                     const std::vector<size_t>& counts, DataType dtype) {
  const size_t esize = DataTypeSize(dtype);
  std::vector<float> wa, wb;
  size_t first = 0;
  for (size_t n : counts) {
    const size_t at = first * esize;
    if (dtype == DataType::kFloat64) {
      CombineTyped(reinterpret_cast<const double*>(a + at), reinterpret_cast<const double*>(b + at),
                   reinterpret_cast<double*>(out + at), n);
    } else if (dtype == DataType::kFloat32) {
      CombineTyped(reinterpret_cast<const float*>(a + at), reinterpret_cast<const float*>(b + at),
                   reinterpret_cast<float*>(out + at), n);
    } else {  // halves: in float32, rounded to the half type at the end
      wa.resize(n);
      wb.resize(n);
      WidenToFloat(wa.data(), a + at, n, dtype, 1.0);
      WidenToFloat(wb.data(), b + at, n, dtype, 1.0);
      CombineTyped(wa.data(), wb.data(), wa.data(), n);
      NarrowFromFloat(out + at, wa.data(), n, dtype, 1.0);
    }
    first += n;
  }
}

Status Adasum::Run(uint8_t* buf, const std::vector<size_t>& counts, DataType dtype) {
  const int size = all_->size();
  const int rank = all_->rank();
  if (!IsFloatingPoint(dtype)) {
    return Status::InvalidArgument(std::string("Adasum reduces floating-point tensors only, not ") +
                                   DataTypeName(dtype));
  }
  if (size & (size - 1)) {
    return Status::InvalidArgument("Adasum needs a power-of-two number of ranks, not " +
                                   std::to_string(size));
  }
  size_t total = 0;
  for (size_t c : counts) total += c;
  const size_t bytes = total * DataTypeSize(dtype);
  theirs_.resize(bytes);
  for (int level = 1; level < size; level <<= 1) {
    Status s = all_->Sendrecv(buf, bytes, rank ^ level, theirs_.data());
    if (!s.ok()) return s;
    const bool lower = (rank & level) == 0;
    Combine(lower ? buf : theirs_.data(), lower ? theirs_.data() : buf, buf, counts, dtype);
  }
  return Status::OK();
}

}  // namespace scaleout
