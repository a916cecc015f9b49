#include "collectives/staged_alltoall.h"

#include <algorithm>
#include <cstring>

namespace scaleout {

// Note [Staged alltoall]
// A rank's area is a header (the rows it sends to each rank, size int64s, padded to a 64-byte
// line) followed by one slot per destination rank, all of the same size. A round:
//   1. every rank writes the next slot-sized part of its bytes for rank k into slot k of its
//      own area (in round 0 also the header);                                         Sync
//   2. every rank copies the part addressed to it out of slot `rank` of each other rank's
//      area into its result.
// After the first Sync every rank has read every header, so all know every pair's byte count
// and agree on the number of rounds (the largest pair's bytes over the slot size, at least
// one). Its own rows a rank copies from input to result directly. Rounds alternate between the
// two areas of each rank (PeerMemory::NextParity, shared with the staged allreduce): a rank
// writes round n + 1 into its other area while slower ranks may still read round n, and it only
// comes back to an area after the Sync of round n + 1, which every rank reaches only once it
// has finished reading round n. So one Sync per round suffices; per byte, one copy into the
// sender's area and one out of it, against MPI's separate exchange of counts and its own two
// copies through shared memory with a handshake per message.

size_t StagedAlltoall::SlotBytes(size_t area_bytes, int size) {
  const size_t header = (static_cast<size_t>(size) * sizeof(int64_t) + 63) / 64 * 64;
  if (area_bytes <= header) return 0;
  return (area_bytes - header) / static_cast<size_t>(size) / 64 * 64;
}

Status StagedAlltoall::Run(const uint8_t* input, const std::vector<int64_t>& send_rows,
                           size_t row_bytes, const AllocateFn& allocate,
                           std::vector<int64_t>* received) {
  const int size = memory_->size();
  const int self = memory_->rank();
  const size_t header = (static_cast<size_t>(size) * sizeof(int64_t) + 63) / 64 * 64;
  const size_t slot = SlotBytes(memory_->area_bytes(), size);
  if (slot == 0) {
    return Status::InvalidArgument("the shared-memory staging area (" +
                                   std::to_string(memory_->area_bytes()) +
                                   " bytes, SCALEOUT_SHM_AREA) is too small for an alltoall "
                                   "among " + std::to_string(size) + " ranks");
  }
  std::vector<size_t> send_at(size + 1, 0);  // byte offsets of each destination's rows
  for (int k = 0; k < size; ++k) send_at[k + 1] = send_at[k] + send_rows[k] * row_bytes;

  received->assign(size, 0);
  std::vector<size_t> recv_at(size + 1, 0);
  uint8_t* result = nullptr;
  size_t rounds = 1;
  for (size_t round = 0; round < rounds; ++round) {
    const int parity = memory_->NextParity();
    uint8_t* mine = memory_->Area(self, parity);
    if (round == 0) std::memcpy(mine, send_rows.data(), size * sizeof(int64_t));
    const size_t from = round * slot;
    for (int k = 0; k < size; ++k) {
      const size_t bytes = send_at[k + 1] - send_at[k];
      if (k == self || from >= bytes) continue;
      std::memcpy(mine + header + k * slot, input + send_at[k] + from,
                  std::min(slot, bytes - from));
    }
    Status s = memory_->Sync();
    if (!s.ok()) return s;
    if (round == 0) {
      size_t largest = 0;
      for (int j = 0; j < size; ++j) {
        const int64_t* rows = reinterpret_cast<const int64_t*>(memory_->Area(j, parity));
        for (int k = 0; k < size; ++k) {
          if (j != k) largest = std::max(largest, static_cast<size_t>(rows[k]) * row_bytes);
        }
        (*received)[j] = rows[self];
        recv_at[j + 1] = recv_at[j] + static_cast<size_t>(rows[self]) * row_bytes;
      }
      rounds = std::max<size_t>(1, (largest + slot - 1) / slot);
      result = allocate(*received);
      const size_t own = send_at[self + 1] - send_at[self];
      if (own > 0) std::memcpy(result + recv_at[self], input + send_at[self], own);
    }
    for (int j = 0; j < size; ++j) {
      const size_t bytes = recv_at[j + 1] - recv_at[j];
      if (j == self || from >= bytes) continue;
      std::memcpy(result + recv_at[j] + from, memory_->Area(j, parity) + header + self * slot,
                  std::min(slot, bytes - from));
    }
  }
  return Status::OK();
}

}  // namespace scaleout
