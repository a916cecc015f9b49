#include "collectives/staged_allreduce.h"

#include <algorithm>

#include "collectives/reduce_kernels.h"

namespace scaleout {

// Note [Staged allreduce]
// A round handles as many elements as one staging area holds:
//   1. every rank packs its elements into its own area (the only copy of its input);  Sync
//   2. rank k reduces slice k of the round: its own area's slice, in place, with the same
//      slice of every other rank's area;                                              Sync
//   3. every rank unpacks each slice from the area of the rank that reduced it.
// Each element is reduced by one rank only, so all ranks get the same bits whatever the op or
// dtype. The rounds alternate between each rank's two areas: a rank can pack round n + 1 while
// the others still unpack round n from its other area, and it only comes back to that area
// after the first Sync of round n + 1, by which time every rank has finished round n. So two
// Syncs per round suffice.
// Per rank and byte of input: pack reads 1 and writes 1, the reduction reads 2 and writes 1 of
// its 1/size share, unpack reads 1 and writes 1: less memory traffic than packing into a
// private buffer, having MPI copy it across processes and back, and unpacking.

void StagedAllreduce::Slice(size_t count, size_t esize, int rank, int size, size_t* lo,
                            size_t* hi) {
  const size_t per_line = esize >= 64 ? 1 : 64 / esize;
  const size_t lines = (count + per_line - 1) / per_line;
  const size_t base = lines / static_cast<size_t>(size);
  const size_t extra = lines % static_cast<size_t>(size);
  const size_t k = static_cast<size_t>(rank);
  const size_t first_line = k * base + std::min(k, extra);
  const size_t my_lines = base + (k < extra ? 1 : 0);
  *lo = std::min(count, first_line * per_line);
  *hi = std::min(count, (first_line + my_lines) * per_line);
}

Status StagedAllreduce::Run(size_t total, DataType dtype, ReduceOp op, const PackFn& pack,
                            const UnpackFn& unpack) {
  const size_t esize = DataTypeSize(dtype);
  const size_t per_round = memory_->area_bytes() / esize;
  const int self = memory_->rank();
  const int size = memory_->size();
  for (size_t first = 0; first < total; first += per_round) {
    const size_t count = std::min(per_round, total - first);
    const int parity = static_cast<int>(rounds_++ & 1);
    uint8_t* mine = memory_->Area(self, parity);
    pack(first, count, mine);
    Status s = memory_->Sync();
    if (!s.ok()) return s;
    size_t lo, hi;
    Slice(count, esize, self, size, &lo, &hi);
    for (int k = 0; k < size && hi > lo; ++k) {
      if (k == self) continue;
      ReduceInto(mine + lo * esize, memory_->Area(k, parity) + lo * esize, hi - lo, dtype, op);
    }
    s = memory_->Sync();
    if (!s.ok()) return s;
    for (int k = 0; k < size; ++k) {
      Slice(count, esize, k, size, &lo, &hi);
      if (hi > lo) unpack(first + lo, hi - lo, memory_->Area(k, parity) + lo * esize);
    }
  }
  return Status::OK();
}

}  // namespace scaleout
