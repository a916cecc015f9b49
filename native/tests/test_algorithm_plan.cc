// Note [Algorithm plan]: the plan of each layout and setting, in codes and in the words config()
// shows (which Python and users read: they must not change).
#include <map>
#include <string>
#include <vector>

#include "collectives/algorithm_plan.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

std::map<std::string, std::string> Words(const AlgorithmPlan& plan) {
  std::map<std::string, std::string> out;
  for (const auto& [entry, words] : plan.Describe()) out[entry] = words;
  return out;
}

PlanInputs Machines(int machines, int local_size, bool uniform = true) {
  PlanInputs in;
  in.machines = machines;
  in.local_size = local_size;
  in.max_local_size = uniform ? local_size : local_size + 1;
  in.size = machines * local_size + (uniform ? 0 : 1);
  in.uniform = uniform;
  return in;
}

SO_TEST(AlgorithmPlanOneMachineIsSharedMemoryWhereItIsUp) {
  std::vector<std::string> warnings;
  const AlgorithmPlan plan = AlgorithmPlan::Decide(Machines(1, 4), &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_TRUE(plan.tries_shared_memory());
  EXPECT_EQ(plan.allreduce(), SO_ALGORITHM_SHARED_MEMORY);
  auto words = Words(plan);
  EXPECT_EQ(words["allreduce"], "shared memory");
  EXPECT_EQ(words["broadcast"], "shared memory");
  EXPECT_EQ(words["alltoall"], "shared memory");
  EXPECT_EQ(words["allgather"], "shared memory");
  EXPECT_EQ(words["reducescatter"], "mpi");
  EXPECT_EQ(words["adasum"], "mpi: Adasum tree over the ranks");
  const AlgorithmPlan flat = plan.WithoutSharedMemory();
  for (int entry = 0; entry < SO_PLAN_COUNT; ++entry) EXPECT_EQ(flat.of(entry), SO_ALGORITHM_MPI);
  EXPECT_EQ(Words(flat)["allgather"], "mpi");
}

SO_TEST(AlgorithmPlanOneRankIsMpi) {
  std::vector<std::string> warnings;
  const AlgorithmPlan plan = AlgorithmPlan::Decide(Machines(1, 1), &warnings);
  EXPECT_FALSE(plan.tries_shared_memory());
  for (int entry = 0; entry < SO_PLAN_COUNT; ++entry) EXPECT_EQ(plan.of(entry), SO_ALGORITHM_MPI);
}

SO_TEST(AlgorithmPlanMachinesOfOneSizeAreHierarchical) {
  std::vector<std::string> warnings;
  PlanInputs in = Machines(2, 3);
  in.hierarchical_allreduce = 1;
  const AlgorithmPlan plan = AlgorithmPlan::Decide(in, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_TRUE(plan.spans_machines());
  EXPECT_EQ(plan.machines(), 2);
  EXPECT_EQ(plan.allreduce(), SO_ALGORITHM_HIERARCHICAL);
  auto words = Words(plan);
  EXPECT_EQ(
      words["allreduce"],
      "hierarchical: shared memory inside each of 2 machines (3 ranks each), mpi between them");
  EXPECT_EQ(words["broadcast"],
            "hierarchical: shared memory inside each of 2 machines, one copy to each machine's "
            "first rank over mpi");
  EXPECT_EQ(words["alltoall"],
            "shared memory between the ranks of each of 2 machines, mpi between machines");
  EXPECT_EQ(words["allgather"],
            "hierarchical: gathered inside each of 2 machines, each machine's part sent once to "
            "each other machine's first rank over mpi");
  EXPECT_EQ(
      words["adasum"],
      "hierarchical: summed inside each of 2 machines, Adasum between their first ranks over mpi");
  // Without shared memory only the allgather stays hierarchical (it needs none).
  const AlgorithmPlan flat = plan.WithoutSharedMemory();
  EXPECT_EQ(flat.allreduce(), SO_ALGORITHM_MPI);
  EXPECT_EQ(flat.allgather(), SO_ALGORITHM_HIERARCHICAL);
  EXPECT_EQ(flat.adasum(), SO_ALGORITHM_MPI);
  EXPECT_EQ(Words(flat)["broadcast"], "mpi");
  // Auto: hierarchical allreduces, flat Adasum (Note [Hierarchical Adasum]); three machines are
  // not a power of two.
  in.hierarchical_allreduce = -1;
  EXPECT_EQ(AlgorithmPlan::Decide(in, &warnings).adasum(), SO_ALGORITHM_MPI);
  in = Machines(3, 2);
  in.hierarchical_allreduce = 1;
  EXPECT_EQ(AlgorithmPlan::Decide(in, &warnings).adasum(), SO_ALGORITHM_MPI);
}

SO_TEST(AlgorithmPlanMachinesOfDifferentSizesAreLeaderBased) {
  std::vector<std::string> warnings;
  const AlgorithmPlan plan = AlgorithmPlan::Decide(Machines(2, 2, false), &warnings);
  EXPECT_EQ(plan.allreduce(), SO_ALGORITHM_HIERARCHICAL_LEADER_BASED);
  EXPECT_TRUE(plan.hierarchical_allreduce());
  EXPECT_EQ(Words(plan)["allreduce"],
            "hierarchical, leader-based: shared memory inside each of 2 machines (of different "
            "sizes), mpi between their first ranks");
}

SO_TEST(AlgorithmPlanSettingsThatCannotBeFollowedSayWhy) {
  std::vector<std::string> warnings;
  PlanInputs in = Machines(1, 4);
  in.hierarchical_allreduce = 1;
  in.hierarchical_allgather = 1;
  AlgorithmPlan::Decide(in, &warnings);
  ASSERT_EQ(warnings.size(), 2);
  EXPECT_EQ(warnings[0],
            "SCALEOUT_HIERARCHICAL_ALLREDUCE=1, but every rank is on one machine: allreduces are "
            "not hierarchical");
  EXPECT_EQ(warnings[1],
            "SCALEOUT_HIERARCHICAL_ALLGATHER=1, but every rank is on one machine: allgathers are "
            "not hierarchical");
  warnings.clear();
  in = Machines(2, 2);
  in.shm = false;
  in.hierarchical_allreduce = 1;
  const AlgorithmPlan plan = AlgorithmPlan::Decide(in, &warnings);
  ASSERT_EQ(warnings.size(), 1);
  EXPECT_EQ(
      warnings[0],
      "SCALEOUT_HIERARCHICAL_ALLREDUCE=1, but SCALEOUT_SHM=0: allreduces are not hierarchical");
  EXPECT_EQ(plan.allreduce(), SO_ALGORITHM_MPI);
  EXPECT_EQ(plan.allgather(), SO_ALGORITHM_HIERARCHICAL);
  EXPECT_EQ(plan.machines(), 2);
  warnings.clear();
  in = Machines(3, 1);
  in.hierarchical_allgather = 1;
  AlgorithmPlan::Decide(in, &warnings);
  ASSERT_EQ(warnings.size(), 1);
  EXPECT_EQ(warnings[0],
            "SCALEOUT_HIERARCHICAL_ALLGATHER=1, but one rank per machine: allgathers are not "
            "hierarchical");
}

}  // namespace
}  // namespace scaleout
