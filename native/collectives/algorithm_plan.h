// Note [Algorithm plan]
// ~~~~~~~~~~~~~~~~~~~~~
// Which algorithm each collective of a communicator uses is decided once, when the communicator
// starts, from its ranks' layout over machines and the configuration (and then whether shared
// memory came up on every machine): AlgorithmPlan::Decide, then WithoutSharedMemory where it did
// not. Everything else reads the plan: the data plane makes the transports it needs, the
// executor makes the algorithm objects it names, config() shows its Describe() strings
// (<collective>_algorithm), rank 0 logs them, and Python reads the codes through
// so_algorithms (scaleout._binding.algorithms()). Every rank of the communicator computes it
// from what every rank knows alike (Topology's machines, uniform, max_local_size), so all choose
// alike. The entries and algorithms are the C header's tables (SO_PLAN_TABLE,
// SO_ALGORITHM_TABLE).
#ifndef SCALEOUT_COLLECTIVES_ALGORITHM_PLAN_H_
#define SCALEOUT_COLLECTIVES_ALGORITHM_PLAN_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "c_api/scaleout.h"

namespace scaleout {

// What the plan is decided from: the communicator's layout over machines and the settings.
struct PlanInputs {
  int size = 1;                     // ranks of the communicator
  int machines = 1;                 // machines it spans
  int max_local_size = 1;           // ranks on its largest machine
  int local_size = 1;               // ranks on this machine
  bool uniform = true;              // every machine has the same number of ranks
  bool shm = true;                  // SCALEOUT_SHM
  int hierarchical_allreduce = -1;  // SCALEOUT_HIERARCHICAL_ALLREDUCE: -1 auto, 0, 1
  int hierarchical_allgather = -1;  // SCALEOUT_HIERARCHICAL_ALLGATHER: -1 auto, 0, 1
};

class AlgorithmPlan {
 public:
  // The plan where shared memory comes up wherever it is tried. `warnings`: why a setting that
  // asked for a hierarchical algorithm (=1) is not followed, for rank 0 to log.
  static AlgorithmPlan Decide(const PlanInputs& in, std::vector<std::string>* warnings);
  // The same plan where shared memory is unavailable on some machine (every rank then learns so).
  AlgorithmPlan WithoutSharedMemory() const;

  // The algorithm of a SO_PLAN_... entry (an SO_ALGORITHM_... code).
  int of(int entry) const { return algorithms_[entry]; }
  int allreduce() const { return algorithms_[SO_PLAN_ALLREDUCE]; }
  int broadcast() const { return algorithms_[SO_PLAN_BROADCAST]; }
  int alltoall() const { return algorithms_[SO_PLAN_ALLTOALL]; }
  int allgather() const { return algorithms_[SO_PLAN_ALLGATHER]; }
  int adasum() const { return algorithms_[SO_PLAN_ADASUM]; }
  bool hierarchical_allreduce() const {
    return allreduce() == SO_ALGORITHM_HIERARCHICAL ||
           allreduce() == SO_ALGORITHM_HIERARCHICAL_LEADER_BASED;
  }

  // Shared memory is set up: on one machine of several ranks, or across machines with ranks
  // sharing one (the bootstrap then goes over each machine's own ranks).
  bool tries_shared_memory() const { return tries_shared_memory_; }
  bool uses_shared_memory() const { return uses_shared_memory_; }
  // Several machines, some with several ranks: each machine's ranks get a transport of their own.
  bool spans_machines() const { return spans_machines_; }
  // The machines the staged and hierarchical algorithms span (1: they treat the ranks as one
  // machine, or none is in use).
  int machines() const { return machines_; }

  // (entry name, algorithm in words) for every SO_PLAN_TABLE entry, in its order: what config()
  // shows as <entry>_algorithm and rank 0 logs.
  std::vector<std::pair<std::string, std::string>> Describe() const;

 private:
  std::array<int, SO_PLAN_COUNT> algorithms_{};  // SO_MPI everywhere until decided
  bool tries_shared_memory_ = false;
  bool uses_shared_memory_ = false;
  bool spans_machines_ = false;
  int machines_ = 1;
  int layout_machines_ = 1;  // the communicator's machines, for WithoutSharedMemory
  int local_size_ = 1;
  bool hierarchical_ = false;  // allreduces hierarchical where shared memory is up
  bool leader_based_ = false;  // ... over machines of different sizes
  bool asked_adasum_ = false;  // SCALEOUT_HIERARCHICAL_ALLREDUCE=1 (Note [Hierarchical Adasum])
  bool allgather_hierarchical_ = false;

  void Settle();  // the entries, from the decisions above
};

}  // namespace scaleout

#endif  // SCALEOUT_COLLECTIVES_ALGORITHM_PLAN_H_
