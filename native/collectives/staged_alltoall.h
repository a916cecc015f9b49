// Alltoall through PeerMemory (ranks that share a machine): each rank writes, into its own
// staging area, how many rows it sends to every rank and the first part of each rank's rows;
// after one Sync every rank copies what is addressed to it straight out of the senders' areas.
// See Note [Staged alltoall].
//
// Threading: coordinator thread only (it drives PeerMemory::Sync).
#ifndef SCALEOUT_COLLECTIVES_STAGED_ALLTOALL_H_
#define SCALEOUT_COLLECTIVES_STAGED_ALLTOALL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "transport/peer_memory.h"

namespace scaleout {

class StagedAlltoall {
 public:
  explicit StagedAlltoall(PeerMemory* memory) : memory_(memory) {}

  // Gives the result's memory once the rows received from every rank are known (received[k]
  // rows from rank k, in rank order); it must hold their sum times row_bytes.
  using AllocateFn = std::function<uint8_t*(const std::vector<int64_t>& received)>;

  // Sends rows [sum(send_rows[:k]), sum(send_rows[:k + 1])) of `input` (rows of row_bytes
  // each) to rank k and receives every rank's rows for this one, in rank order. Every rank
  // calls it with the same row_bytes; send_rows may differ (what rank j sends to k is what k
  // receives from j). Fills *received.
  Status Run(const uint8_t* input, const std::vector<int64_t>& send_rows, size_t row_bytes,
             const AllocateFn& allocate, std::vector<int64_t>* received);

  // Bytes of each destination's slot in an area of `area_bytes` shared by `size` ranks, after
  // the header of send counts: whole 64-byte lines (exposed for tests).
  static size_t SlotBytes(size_t area_bytes, int size);

 private:
  PeerMemory* memory_;
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_STAGED_ALLTOALL_H_
