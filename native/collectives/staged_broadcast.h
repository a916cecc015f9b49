// Broadcast through PeerMemory, and across machines through their first ranks: the root's
// bytes reach its machine through its staging area, one copy crosses to each other machine's
// first rank, which shares it through its area. See Note [Staged broadcast].
//
// Threading: coordinator thread only (it drives PeerMemory::Sync).
#ifndef SCALEOUT_COLLECTIVES_STAGED_BROADCAST_H_
#define SCALEOUT_COLLECTIVES_STAGED_BROADCAST_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transport/data_transport.h"
#include "transport/peer_memory.h"

namespace scaleout {

class StagedBroadcast {
 public:
  // `memory`: this machine's ranks. Per rank of the communicator, machine_of (0 .. machines-1,
  // the machines' ranks on `leaders`) and local_rank_of (its rank in its machine's memory).
  // `leaders`: on each machine's first rank, the transport over the machines' first ranks
  // (null elsewhere, and with one machine).
  StagedBroadcast(PeerMemory* memory, DataTransport* leaders, int rank, std::vector<int> machine_of,
                  std::vector<int> local_rank_of)
      : memory_(memory),
        leaders_(leaders),
        rank_(rank),
        machine_of_(std::move(machine_of)),
        local_rank_of_(std::move(local_rank_of)),
        one_machine_(
            std::all_of(machine_of_.begin(), machine_of_.end(), [](int m) { return m == 0; })) {}

  // Every rank of the communicator calls it with the same bytes and root; buf holds the root's
  // data on the root and receives it everywhere else.
  Status Run(void* buf, size_t bytes, int root);

 private:
  PeerMemory* memory_;
  DataTransport* leaders_;
  int rank_;
  std::vector<int> machine_of_, local_rank_of_;
  bool one_machine_;
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_STAGED_BROADCAST_H_
