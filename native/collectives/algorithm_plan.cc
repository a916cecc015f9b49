#include "collectives/algorithm_plan.h"

namespace scaleout {

// Note [Hierarchical allreduce]: the layout decides. Machines of different sizes make the
// hierarchical allreduce leader-based (only each machine's first rank crosses).
AlgorithmPlan AlgorithmPlan::Decide(const PlanInputs& in, std::vector<std::string>* warnings) {
  AlgorithmPlan p;
  p.spans_machines_ = in.machines > 1 && in.max_local_size > 1;
  const bool one_machine = in.size > 1 && in.machines == 1;
  const char* const unspread =
      in.machines == 1 ? "every rank is on one machine" : "one rank per machine";
  std::string flat_why;
  if (p.spans_machines_ && !in.shm) {
    flat_why = "SCALEOUT_SHM=0";
  } else if (!p.spans_machines_) {
    flat_why = unspread;
  }
  if (in.hierarchical_allreduce == 1 && !flat_why.empty()) {
    warnings->push_back("SCALEOUT_HIERARCHICAL_ALLREDUCE=1, but " + flat_why +
                        ": allreduces are not hierarchical");
  }
  if (in.hierarchical_allgather == 1 && !p.spans_machines_) {
    warnings->push_back(std::string("SCALEOUT_HIERARCHICAL_ALLGATHER=1, but ") + unspread +
                        ": allgathers are not hierarchical");
  }
  p.hierarchical_ = flat_why.empty() && in.hierarchical_allreduce != 0;
  p.leader_based_ = p.hierarchical_ && !in.uniform;
  p.allgather_hierarchical_ = p.spans_machines_ && in.hierarchical_allgather != 0;
  p.asked_adasum_ = in.hierarchical_allreduce == 1;
  p.tries_shared_memory_ = in.shm && (one_machine || p.spans_machines_);
  p.uses_shared_memory_ = p.tries_shared_memory_;
  p.layout_machines_ = in.machines;
  p.local_size_ = in.local_size;
  p.Settle();
  return p;
}

AlgorithmPlan AlgorithmPlan::WithoutSharedMemory() const {
  AlgorithmPlan p = *this;
  p.uses_shared_memory_ = false;
  p.Settle();
  return p;
}

void AlgorithmPlan::Settle() {
  const bool shm = uses_shared_memory_;
  machines_ = spans_machines_ && (shm || allgather_hierarchical_) ? layout_machines_ : 1;
  const bool one = machines_ == 1;
  int allreduce = SO_ALGORITHM_MPI;
  if (shm && one) {
    allreduce = SO_ALGORITHM_SHARED_MEMORY;
  } else if (shm && hierarchical_) {
    allreduce = leader_based_ ? SO_ALGORITHM_HIERARCHICAL_LEADER_BASED : SO_ALGORITHM_HIERARCHICAL;
  }
  algorithms_[SO_PLAN_ALLREDUCE] = allreduce;
  algorithms_[SO_PLAN_BROADCAST] = !shm  ? SO_ALGORITHM_MPI
                                   : one ? SO_ALGORITHM_SHARED_MEMORY
                                         : SO_ALGORITHM_HIERARCHICAL;
  algorithms_[SO_PLAN_ALLTOALL] = !shm  ? SO_ALGORITHM_MPI
                                  : one ? SO_ALGORITHM_SHARED_MEMORY
                                        : SO_ALGORITHM_SHARED_MEMORY_AND_MPI;
  algorithms_[SO_PLAN_ALLGATHER] = allgather_hierarchical_ ? SO_ALGORITHM_HIERARCHICAL
                                   : shm && one            ? SO_ALGORITHM_SHARED_MEMORY
                                                           : SO_ALGORITHM_MPI;
  algorithms_[SO_PLAN_REDUCESCATTER] = SO_ALGORITHM_MPI;
  // Note [Hierarchical Adasum]: asked for, where allreduces are hierarchical over a power of two
  // of machines.
  const bool adasum =
      asked_adasum_ && shm && hierarchical_ && machines_ > 1 && (machines_ & (machines_ - 1)) == 0;
  algorithms_[SO_PLAN_ADASUM] = adasum ? SO_ALGORITHM_HIERARCHICAL : SO_ALGORITHM_MPI;
}

std::vector<std::pair<std::string, std::string>> AlgorithmPlan::Describe() const {
  const std::string n = std::to_string(machines_);
  auto words = [&](int entry) -> std::string {
    const int a = algorithms_[entry];
    if (a == SO_ALGORITHM_SHARED_MEMORY) return "shared memory";
    switch (entry) {
      case SO_PLAN_ALLREDUCE:
        if (a == SO_ALGORITHM_HIERARCHICAL_LEADER_BASED) {
          return "hierarchical, leader-based: shared memory inside each of " + n +
                 " machines (of different sizes), mpi between their first ranks";
        }
        if (a == SO_ALGORITHM_HIERARCHICAL) {
          return "hierarchical: shared memory inside each of " + n + " machines (" +
                 std::to_string(local_size_) + " ranks each), mpi between them";
        }
        break;
      case SO_PLAN_BROADCAST:
        if (a == SO_ALGORITHM_HIERARCHICAL) {
          return "hierarchical: shared memory inside each of " + n +
                 " machines, one copy to each machine's first rank over mpi";
        }
        break;
      case SO_PLAN_ALLTOALL:
        if (a == SO_ALGORITHM_SHARED_MEMORY_AND_MPI) {
          return "shared memory between the ranks of each of " + n +
                 " machines, mpi between machines";
        }
        break;
      case SO_PLAN_ALLGATHER:
        if (a == SO_ALGORITHM_HIERARCHICAL) {
          return "hierarchical: gathered inside each of " + n +
                 " machines, each machine's part sent once to each other machine's first rank "
                 "over mpi";
        }
        break;
      case SO_PLAN_ADASUM:
        return a == SO_ALGORITHM_HIERARCHICAL
                   ? "hierarchical: summed inside each of " + n +
                         " machines, Adasum between their first ranks over mpi"
                   : "mpi: Adasum tree over the ranks";
    }
    return "mpi";
  };
  // The table's codes count from 0 in its order.
  static const char* const names[SO_PLAN_COUNT] = {
#define SO_PLAN_NAME_(ENUM, name, code) #name,
      SO_PLAN_TABLE(SO_PLAN_NAME_)
#undef SO_PLAN_NAME_
  };
  std::vector<std::pair<std::string, std::string>> out;
  for (int entry = 0; entry < SO_PLAN_COUNT; ++entry) out.emplace_back(names[entry], words(entry));
  return out;
}

}  // namespace scaleout
