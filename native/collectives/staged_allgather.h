// Allgather through PeerMemory when every rank is on this machine: each rank writes the next
// part of its block into its own staging area; after one Sync every rank copies every other
// rank's part into its place in the result. See Note [Staged allgather].
//
// Threading: coordinator thread only (it drives PeerMemory::Sync).
#ifndef SCALEOUT_COLLECTIVES_STAGED_ALLGATHER_H_
#define SCALEOUT_COLLECTIVES_STAGED_ALLGATHER_H_

#include <cstddef>
#include <vector>

#include "common/status.h"
#include "transport/peer_memory.h"

namespace scaleout {

class StagedAllgather {
 public:
  explicit StagedAllgather(PeerMemory* memory) : memory_(memory) {}

  // As DataTransport::Allgatherv over memory's ranks: rank r's recv_bytes[r] bytes land at
  // displacement sum(recv_bytes[0..r)) of out; this rank gives in_bytes == recv_bytes[rank].
  Status Run(const void* in, size_t in_bytes, void* out, const std::vector<size_t>& recv_bytes);

 private:
  PeerMemory* memory_;
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_STAGED_ALLGATHER_H_
