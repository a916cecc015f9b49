// What a communicator's collectives move bytes through, decided once when it starts, from the
// ranks' layout over machines: the executor picks the algorithm per collective from this and
// never looks at the topology itself.
#ifndef SCALEOUT_COLLECTIVES_DATA_PLANE_H_
#define SCALEOUT_COLLECTIVES_DATA_PLANE_H_

#include <string>
#include <utility>
#include <vector>

#include "transport/data_transport.h"
#include "transport/peer_memory.h"

namespace scaleout {

struct DataPlane {
  // Over every rank: one per endpoint server (Note [Endpoint servers]); transports[0] carries
  // every collective that is not split.
  std::vector<DataTransport*> transports;
  // The ranks of this machine, or null. On one machine they are every rank. Alltoalls and
  // broadcasts go through them (Note [Staged alltoall], Note [Staged broadcast]), allgathers
  // on one machine (Note [Staged allgather]), and allreduces on one machine or when
  // hierarchical (Note [Staged allreduce]).
  PeerMemory* peers = nullptr;
  // With `peers`, across machines: allreduces reduce inside each machine first (Note
  // [Hierarchical allreduce]).
  bool hierarchical_allreduce = false;
  // With hierarchical_allreduce on machines with the same number of ranks each: over the ranks
  // with this local rank on every machine, one per endpoint server. Empty: none.
  std::vector<DataTransport*> cross;
  // Machines of different sizes: each machine's first rank alone crosses (and only it has
  // `cross`, over the first ranks); set on every rank.
  bool leader_based = false;
  // SCALEOUT_HIERARCHICAL_ALLREDUCE=1 was asked for (not auto): Adasum is then hierarchical
  // too (Note [Hierarchical Adasum]).
  bool hierarchical_asked = false;
  int machines = 1;  // that the communicator spans
  // On each machine's first rank: a transport over the machines' first ranks (null elsewhere
  // and on one machine). Per rank of the communicator: its machine (its first rank's rank on
  // `leaders`) and its local rank (Note [Staged broadcast]).
  DataTransport* leaders = nullptr;
  std::vector<int> machine_of, local_rank_of;
  // Allgathers across machines gather inside each machine over `local` (this machine's ranks)
  // and cross through `leaders` (Note [Hierarchical allgather]).
  DataTransport* local = nullptr;
  bool hierarchical_allgather = false;

  // Each collective's algorithm, in words: (collective, algorithm), as config() shows them
  // (<collective>_algorithm).
  std::vector<std::pair<std::string, std::string>> Algorithms() const {
    const bool staged = peers != nullptr;
    std::string broadcast = !staged ? "mpi"
                            : machines == 1
                                ? "shared memory"
                                : "hierarchical: shared memory inside each of " +
                                      std::to_string(machines) +
                                      " machines, one copy to each machine's first rank over mpi";
    return {{"allreduce", AllreduceAlgorithm()},
            {"broadcast", broadcast},
            {"alltoall", !staged ? "mpi"
                         : machines == 1
                             ? "shared memory"
                             : "shared memory between the ranks of each of " +
                                   std::to_string(machines) + " machines, mpi between machines"},
            {"allgather",
             hierarchical_allgather
                 ? "hierarchical: gathered inside each of " + std::to_string(machines) +
                       " machines, each machine's part sent once to each other machine's "
                       "first rank over mpi"
             : staged && machines == 1 ? "shared memory"
                                       : "mpi"},
            {"reducescatter", "mpi"},
            {"adasum", HierarchicalAdasum()
                           ? "hierarchical: summed inside each of " + std::to_string(machines) +
                                 " machines, Adasum between their first ranks over mpi"
                           : "mpi: Adasum tree over the ranks"}};
  }

  // Note [Hierarchical Adasum]: asked for, where allreduces are hierarchical over a power of
  // two of machines.
  bool HierarchicalAdasum() const {
    return hierarchical_asked && peers != nullptr && hierarchical_allreduce && machines > 1 &&
           (machines & (machines - 1)) == 0;
  }

  std::string AllreduceAlgorithm() const {
    if (peers == nullptr) return "mpi";
    if (machines == 1) return "shared memory";
    if (!hierarchical_allreduce) return "mpi";
    if (leader_based) {
      return "hierarchical, leader-based: shared memory inside each of " +
             std::to_string(machines) + " machines (of different sizes), mpi between their "
             "first ranks";
    }
    return "hierarchical: shared memory inside each of " + std::to_string(machines) +
           " machines (" + std::to_string(peers->size()) + " ranks each), mpi between them";
  }
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_DATA_PLANE_H_
