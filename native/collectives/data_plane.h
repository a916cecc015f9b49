// What a communicator's collectives move bytes through, and its algorithm plan, decided once
// when it starts from the ranks' layout over machines: the executor makes the algorithms the
// plan names and never looks at the topology itself.
#ifndef SCALEOUT_COLLECTIVES_DATA_PLANE_H_
#define SCALEOUT_COLLECTIVES_DATA_PLANE_H_

#include <vector>

#include "collectives/algorithm_plan.h"
#include "transport/data_transport.h"
#include "transport/peer_memory.h"

namespace scaleout {

struct DataPlane {
  // Which algorithm each collective uses (Note [Algorithm plan]); the rest is what they need.
  AlgorithmPlan plan;
  // Over every rank: one per endpoint server (Note [Endpoint servers]); transports[0] carries
  // every collective that is not split.
  std::vector<DataTransport*> transports;
  // The ranks of this machine, when the plan uses shared memory, else null. On one machine they
  // are every rank (Note [Staged alltoall], Note [Staged broadcast], Note [Staged allgather],
  // Note [Staged allreduce]).
  PeerMemory* peers = nullptr;
  // With a hierarchical allreduce on machines with the same number of ranks each: over the ranks
  // with this local rank on every machine, one per endpoint server (Note [Hierarchical
  // allreduce]); leader-based (machines of different sizes): each machine's first rank alone has
  // one, over the first ranks. Empty: none.
  std::vector<DataTransport*> cross;
  // On each machine's first rank: a transport over the machines' first ranks (null elsewhere
  // and on one machine). Per rank of the communicator: its machine (its first rank's rank on
  // `leaders`) and its local rank (Note [Staged broadcast]).
  DataTransport* leaders = nullptr;
  std::vector<int> machine_of, local_rank_of;
  // This machine's ranks, across machines (Note [Hierarchical allgather]).
  DataTransport* local = nullptr;
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_DATA_PLANE_H_
