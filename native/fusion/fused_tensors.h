// Fused tensors (Note [Tensor fusion]): the tensors of one response laid end to end, as the
// executor moves them through the fusion buffer or a staged algorithm.
#ifndef SCALEOUT_FUSION_FUSED_TENSORS_H_
#define SCALEOUT_FUSION_FUSED_TENSORS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "coordinator/message.h"
#include "runtime/tensor_entry.h"

namespace scaleout {

// Elements of a shape from dimension `from` on.
inline size_t Elements(const std::vector<int64_t>& shape, size_t from = 0) {
  size_t n = 1;
  for (size_t i = from; i < shape.size(); ++i) n *= static_cast<size_t>(shape[i]);
  return n;
}

// A tensor's shape: this rank's own request where it submitted one (a compactly sent cached
// response carries no shape), else the agreed shape in the response (ranks that joined).
inline const std::vector<int64_t>& ShapeOf(const Response& r,
                                           const std::vector<TensorEntry*>& entries, size_t i) {
  return entries[i] != nullptr ? entries[i]->request.shape : r.tensors[i].shape;
}

// The elements of tensor i that the response moves: all of them, or its part (Note [Priority]).
inline size_t ElementsMoved(const Response& r, const std::vector<TensorEntry*>& entries, size_t i) {
  const ResponseTensor& t = r.tensors[i];
  return t.is_part() ? static_cast<size_t>(t.part_count) : Elements(ShapeOf(r, entries, i));
}

// The tensors of an allreduce response laid end to end (the fused element space), and how to
// move this rank's part of any range of it into and out of a buffer, prescaled and postscaled.
// Every dtype travels as itself. With `reducer_scales_halves` (the staged algorithms),
// float16/bfloat16 are copied unscaled and the rank reducing them applies both factors in
// float32 (Note [Halves on the wire]).
class FusedTensors {
 public:
  FusedTensors(const Response& r, const std::vector<TensorEntry*>& entries, double post,
               bool reducer_scales_halves)
      : r_(r),
        entries_(entries),
        post_(reducer_scales_halves && IsHalf(r.dtype) ? 1.0 : post),
        pre_(reducer_scales_halves && IsHalf(r.dtype) ? 1.0 : r.prescale),
        esize_(DataTypeSize(r.dtype)) {
    starts_.reserve(entries.size() + 1);
    starts_.push_back(0);
    for (size_t i = 0; i < entries.size(); ++i)
      starts_.push_back(starts_.back() + ElementsMoved(r, entries, i));
  }
  size_t total() const { return starts_.back(); }
  // Each tensor's elements, in order.
  std::vector<size_t> Counts() const {
    std::vector<size_t> counts;
    for (size_t i = 0; i + 1 < starts_.size(); ++i) counts.push_back(starts_[i + 1] - starts_[i]);
    return counts;
  }

  // Elements [first, first + count) of this rank's input (zeros where it joined), prescaled,
  // into dst.
  void Pack(size_t first, size_t count, uint8_t* dst) const {
    ForEachPiece(first, count, [&](size_t i, size_t at, size_t n, size_t into) {
      uint8_t* out = dst + into * esize_;
      const TensorEntry* e = entries_[i];
      if (e == nullptr) {
        std::memset(out, 0, n * esize_);  // a joined rank contributes zeros
      } else {
        CopyScaled(out, static_cast<const uint8_t*>(e->input) + at * esize_, n, pre_);
      }
    });
  }

  // Where elements [first, first + *run) of this rank's input lie as they would be packed, or
  // nullptr (a prescale, a joined rank's zeros, a misaligned array), where *run (at least 1 and
  // at most count) is how many of the elements from `first` on belong to one tensor: the
  // caller packs those instead.
  const uint8_t* Input(size_t first, size_t count, size_t* run) const {
    *run = count;
    if (count == 0 || first >= total()) return nullptr;
    // The tensor holding `first` (the last start at or before it: empty tensors share starts).
    const size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), first) -
                                         starts_.begin()) -
                     1;
    *run = std::min(count, starts_[i + 1] - first);
    const TensorEntry* e = entries_[i];
    if (e == nullptr || pre_ != 1.0) return nullptr;
    const size_t at = static_cast<size_t>(r_.tensors[i].part_first) + first - starts_[i];
    const uint8_t* found = static_cast<const uint8_t*>(e->input) + at * esize_;
    return reinterpret_cast<uintptr_t>(found) % esize_ == 0 ? found : nullptr;
  }

  // Where the reduced elements [first, first + count) go (one tensor's output, aligned to its
  // element size), or nullptr; *post is the factor Unpack would apply to them there.
  uint8_t* Output(size_t first, size_t count, double* post) const {
    if (count == 0) return nullptr;
    uint8_t* found = nullptr;
    int pieces = 0;
    ForEachPiece(first, count, [&](size_t i, size_t at, size_t n, size_t) {
      ++pieces;
      TensorEntry* e = entries_[i];
      if (e != nullptr && n == count) found = static_cast<uint8_t*>(e->output) + at * esize_;
    });
    if (pieces != 1 || reinterpret_cast<uintptr_t>(found) % esize_ != 0) return nullptr;
    *post = post_;
    return found;
  }

  // The reduced elements [first, first + count) from src into the outputs, postscaled.
  void Unpack(size_t first, size_t count, const uint8_t* src) const {
    ForEachPiece(first, count, [&](size_t i, size_t at, size_t n, size_t from) {
      TensorEntry* e = entries_[i];
      if (e == nullptr) return;
      CopyScaled(static_cast<uint8_t*>(e->output) + at * esize_, src + from * esize_, n, post_);
    });
  }

 private:
  // n elements from src to dst, times factor: scaled a block at a time, while the block just
  // copied is still in the cache.
  void CopyScaled(uint8_t* dst, const uint8_t* src, size_t n, double factor) const {
    if (factor == 1.0) return CopyBytes(dst, src, n * esize_);
    for (size_t done = 0; done < n; done += scale_block_) {
      const size_t k = std::min(scale_block_, n - done);
      CopyBytes(dst + done * esize_, src + done * esize_, k * esize_);
      ScaleBuffer(dst + done * esize_, k, r_.dtype, factor);
    }
  }

  // fn(tensor, its first element in the range, elements, their offset in the range) for each
  // tensor overlapping [first, first + count).
  template <typename Fn>
  void ForEachPiece(size_t first, size_t count, Fn fn) const {
    const size_t end = first + count;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), first) -
                                   starts_.begin()) -
               1;
    for (; i + 1 < starts_.size() && starts_[i] < end; ++i) {
      const size_t lo = std::max(first, starts_[i]);
      const size_t hi = std::min(end, starts_[i + 1]);
      // A part's elements start at its first in the tensor (Note [Priority]).
      const size_t part = static_cast<size_t>(r_.tensors[i].part_first);
      if (hi > lo) fn(i, part + lo - starts_[i], hi - lo, lo - first);
    }
  }

  const Response& r_;
  const std::vector<TensorEntry*>& entries_;
  const double post_, pre_;
  const size_t esize_;
  const size_t scale_block_ = (size_t(32) << 10) / esize_;  // elements copied then scaled at once
  std::vector<size_t> starts_;  // tensor i holds fused elements [starts_[i], starts_[i + 1])
};

}  // namespace scaleout

#endif  // SCALEOUT_FUSION_FUSED_TENSORS_H_
