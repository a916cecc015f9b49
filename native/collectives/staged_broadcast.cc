#include "collectives/staged_broadcast.h"

#include <algorithm>
#include <cstring>

#include "common/traffic.h"

namespace scaleout {

// Note [Staged broadcast]
// A round moves one staging area's worth of the root's bytes:
//   1. the root copies them into its own area;                                          Sync
//   2. across machines: the first rank of the root's machine sends them, from the root's
//      area, to the other machines' first ranks, which receive them into their own areas
//      (one copy per machine crosses the link);                                         Sync
//   3. every rank other than the root copies them out: from the root's area on the root's
//      machine, from its first rank's area elsewhere.
// On one machine, step 2 and its Sync are left out.
// Every machine runs the same Syncs, so the rounds stay in step. Areas alternate by round
// (PeerMemory::NextParity): a rank writes an area again only two rounds later, after a Sync
// that every rank of its machine reaches once it has read that area.

Status StagedBroadcast::Run(void* buf, size_t bytes, int root) {
  if (bytes == 0) return Status::OK();  // every rank knows it: nothing to move
  const size_t area = memory_->area_bytes();
  const int root_machine = machine_of_[root];
  const int root_local = local_rank_of_[root];
  const bool on_root_machine = machine_of_[rank_] == root_machine;
  const int self = memory_->rank();
  uint8_t* data = static_cast<uint8_t*>(buf);
  for (size_t first = 0; first < bytes; first += area) {
    const size_t n = std::min(area, bytes - first);
    const int parity = memory_->NextParity();
    if (rank_ == root) {
      std::memcpy(memory_->Area(self, parity), data + first, n);
      traffic::Add(traffic::kSHM_BYTES, static_cast<int64_t>(n));
    }
    Status s = memory_->Sync();
    if (!s.ok()) return s;
    if (leaders_ != nullptr) {
      // The root machine's first rank sends from the root's area (the transport only reads
      // it there); the others receive into their own.
      uint8_t* at = memory_->Area(on_root_machine ? root_local : 0, parity);
      s = leaders_->Broadcast(at, n, root_machine);
      if (!s.ok()) return s;
    }
    if (!one_machine_) {
      s = memory_->Sync();
      if (!s.ok()) return s;
    }
    if (rank_ != root) {
      std::memcpy(data + first, memory_->Area(on_root_machine ? root_local : 0, parity), n);
    }
  }
  return Status::OK();
}

}  // namespace scaleout
