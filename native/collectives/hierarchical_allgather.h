// Allgatherv across machines with one copy of each machine's blocks crossing to each other
// machine: gathered inside the machine, exchanged between the machines' first ranks, shared
// inside the machine again. See Note [Hierarchical allgather].
//
// Threading: coordinator thread only.
#ifndef SCALEOUT_COLLECTIVES_HIERARCHICAL_ALLGATHER_H_
#define SCALEOUT_COLLECTIVES_HIERARCHICAL_ALLGATHER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transport/data_transport.h"

namespace scaleout {

class HierarchicalAllgather {
 public:
  // `local`: this machine's ranks (in local rank order). `leaders`: on each machine's first
  // rank, the machines' first ranks in machine order (null elsewhere). `rank`: this rank in the
  // communicator; per rank of it, its machine and its local rank.
  HierarchicalAllgather(DataTransport* local, DataTransport* leaders, int rank,
                        std::vector<int> machine_of, std::vector<int> local_rank_of);

  // As DataTransport::Allgatherv over the whole communicator: rank r's recv_bytes[r] bytes land
  // at displacement sum(recv_bytes[0..r)) of out.
  Status Run(const void* in, size_t in_bytes, void* out, const std::vector<size_t>& recv_bytes);

 private:
  DataTransport* local_;
  DataTransport* leaders_;
  int rank_;
  std::vector<int> machine_of_, local_rank_of_;
  int machines_ = 1;
  std::vector<std::vector<int>> ranks_of_;  // per machine, its ranks in local rank order
  std::vector<uint8_t> part_;               // this machine's blocks (step 1)
  std::vector<uint8_t> staged_;             // every machine's blocks, machine by machine
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_HIERARCHICAL_ALLGATHER_H_
