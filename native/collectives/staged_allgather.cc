#include "collectives/staged_allgather.h"

#include <algorithm>

#include "collectives/reduce_kernels.h"
#include "common/traffic.h"

namespace scaleout {

// Note [Staged allgather]
// A round moves up to one staging area of every rank's block:
//   1. every rank copies the round's part of its block into its own area;             Sync
//   2. every rank copies each other rank's part out of that rank's area into the result.
// Every rank knows every block's size (the negotiation agreed them), so all agree on the number
// of rounds (the largest block over the area, at least one) without a header. Rounds alternate
// between the two areas (PeerMemory::NextParity), so one Sync per round suffices, as in Note
// [Staged alltoall]; a rank's own block goes from input to result directly. Per byte: one copy
// into the sender's area and one out of it per reader, against MPI's copies through its own
// shared memory (or a kernel-assisted copy) and a handshake per message.

Status StagedAllgather::Run(const void* in, size_t in_bytes, void* out,
                            const std::vector<size_t>& recv_bytes) {
  const int size = memory_->size();
  const int self = memory_->rank();
  const size_t area = memory_->area_bytes();
  std::vector<size_t> at(size + 1, 0);
  size_t largest = 0;
  for (int k = 0; k < size; ++k) {
    at[k + 1] = at[k] + recv_bytes[k];
    largest = std::max(largest, recv_bytes[k]);
  }
  uint8_t* result = static_cast<uint8_t*>(out);
  const uint8_t* mine = static_cast<const uint8_t*>(in);
  if (in_bytes > 0) CopyBytes(result + at[self], mine, in_bytes);
  const size_t rounds = std::max<size_t>(1, (largest + area - 1) / area);
  for (size_t round = 0; round < rounds; ++round) {
    const int parity = memory_->NextParity();
    const size_t from = round * area;
    if (from < in_bytes) {
      const size_t n = std::min(area, in_bytes - from);
      CopyBytes(memory_->Area(self, parity), mine + from, n);
      traffic::Add(traffic::kSHM_BYTES, static_cast<int64_t>(n));
    }
    Status s = memory_->Sync();
    if (!s.ok()) return s;
    for (int k = 0; k < size; ++k) {
      if (k == self || from >= recv_bytes[k]) continue;
      CopyBytes(result + at[k] + from, memory_->Area(k, parity),
                std::min(area, recv_bytes[k] - from));
    }
  }
  return Status::OK();
}

}  // namespace scaleout
