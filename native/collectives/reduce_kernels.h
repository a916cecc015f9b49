// Element-wise kernels shared by every transport and algorithm: reduction of one buffer into
// another, scaling, and the widening of half-precision types to float32 for reduction.
//
// Contract: buffers do not overlap unless stated; counts are elements, not bytes. Kernels are
// pure functions of their arguments and safe to call from any thread (how CopyBytes and
// ReduceFrom store, not what, follows a StreamingStores scope open on the calling thread).
#ifndef SCALEOUT_COLLECTIVES_REDUCE_KERNELS_H_
#define SCALEOUT_COLLECTIVES_REDUCE_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace scaleout {

// inout[i] = op(inout[i], in[i]) for i < count. Average reduces as Sum (the division is a
// separate ScaleBuffer). For bool: Sum and Max are logical or, Product and Min logical and.
// float16/bfloat16 are accumulated in float32 and rounded once per element.
void ReduceInto(void* inout, const void* in, size_t count, DataType dtype, ReduceOp op);

// out[i] = op(a[i], b[i]) for i < count: ReduceInto of b into a copy of a, in one pass (out may
// not overlap a or b). The same bits as CopyBytes then ReduceInto.
void ReduceFrom(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// buf[i] *= factor, computed in double for float64 and integers and in float otherwise, then
// converted back (integers truncate toward zero, out-of-range values saturate). No-op when factor
// == 1.0. Not defined for bool.
void ScaleBuffer(void* buf, size_t count, DataType dtype, double factor);

// memcpy of non-overlapping buffers. Large copies take rep movsb on Intel cores (as fast as
// glibc's memcpy there, faster than a vector loop into shared memory) and a loop elsewhere: on
// some x86 CPUs (AMD EPYC measured here) rep movsb runs about 15x slower when dst - src is 16
// bytes past a multiple of 4096, which is just how a page-aligned staging buffer and a numpy
// array allocated by mmap (16 bytes of malloc header) line up. See Note [Copies].
void CopyBytes(void* dst, const void* src, size_t bytes);

// While one is open on a thread, that thread's large CopyBytes and its float32 ReduceFrom sums
// into 16-byte-aligned destinations use non-temporal stores, fenced before they return: see
// Note [Streaming stores] (staged_allreduce.cc).
class StreamingStores {
 public:
  explicit StreamingStores(bool on);
  ~StreamingStores();
  StreamingStores(const StreamingStores&) = delete;
  StreamingStores& operator=(const StreamingStores&) = delete;

 private:
  bool saved_;
};

// dst[i] = float(src[i]) * factor for a float16 or bfloat16 source (dtype says which).
void WidenToFloat(float* dst, const void* src, size_t count, DataType dtype, double factor);
// acc[i] = op(acc[i], float(src[i]) * factor) for a float16 or bfloat16 source: the same bits as
// WidenToFloat into a buffer and ReduceInto acc (float32), in one pass.
void AccumulateHalves(float* acc, const void* src, size_t count, DataType dtype, ReduceOp op,
                      double factor);
// out[i] = half(post * op over the sources, in order, of float(source[i]) * pre) for float16
// or bfloat16: halves reduced in float32 and rounded once (Note [Halves on the wire]). out may
// be sources[0]; `scratch` is a float32 block it reuses.
void ReduceHalvesOnce(void* out, const std::vector<const uint8_t*>& sources, size_t count,
                      DataType dtype, ReduceOp op, double pre, double post,
                      std::vector<float>* scratch);
// dst[i] = half(src[i] * factor), round to nearest even.
void NarrowFromFloat(void* dst, const float* src, size_t count, DataType dtype, double factor);

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_REDUCE_KERNELS_H_
