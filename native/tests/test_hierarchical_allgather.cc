// HierarchicalAllgather (Note [Hierarchical allgather]) over in-process machines whose ranks
// are threads (tests/shared_areas.h's CrossGroup as the machine's and the first ranks'
// transports): machines of equal and different sizes, ranks of a machine not consecutive,
// empty blocks, against every rank's blocks in rank order.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/hierarchical_allgather.h"
#include "tests/shared_areas.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::CrossGroup;

// Bytes rank q contributes in repetition rep (some none).
std::vector<uint8_t> Block(int q, int rep) {
  std::vector<uint8_t> b((q * 5 + rep) % 4 * 37);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(q * 13 + i + rep);
  return b;
}

// machine_of[q]: rank q's machine; ranks get local ranks in order of appearance.
std::vector<std::string> Run(const std::vector<int>& machine_of, int repeats) {
  const int ranks = static_cast<int>(machine_of.size());
  int machines = 0;
  for (int m : machine_of) machines = std::max(machines, m + 1);
  std::vector<int> local_rank_of(ranks), local_size(machines, 0);
  for (int q = 0; q < ranks; ++q) local_rank_of[q] = local_size[machine_of[q]]++;
  std::vector<std::unique_ptr<CrossGroup>> locals;
  for (int m = 0; m < machines; ++m) locals.push_back(std::make_unique<CrossGroup>(local_size[m]));
  CrossGroup leaders(machines);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int q = 0; q < ranks; ++q) {
    threads.emplace_back([&, q] {
      CrossGroup::Member local(locals[machine_of[q]].get(), local_rank_of[q]);
      CrossGroup::Member leader(&leaders, machine_of[q]);
      HierarchicalAllgather gather(&local, local_rank_of[q] == 0 ? &leader : nullptr, q, machine_of,
                                   local_rank_of);
      for (int rep = 0; rep < repeats; ++rep) {
        std::vector<size_t> recv_bytes;
        std::vector<uint8_t> want;
        for (int k = 0; k < ranks; ++k) {
          std::vector<uint8_t> b = Block(k, rep);
          recv_bytes.push_back(b.size());
          want.insert(want.end(), b.begin(), b.end());
        }
        std::vector<uint8_t> mine = Block(q, rep), got(want.size(), 0xee);
        Status s = gather.Run(mine.data(), mine.size(), got.data(), recv_bytes);
        if (!s.ok()) {
          errors[q] = s.message();
          return;
        }
        if (got != want && errors[q].empty())
          errors[q] = "wrong bytes at repetition " + std::to_string(rep);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

SO_TEST(HierarchicalAllgatherGathersEveryBlockInRankOrder) {
  for (const std::vector<int>& machine_of :
       {std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1}, std::vector<int>{0, 0, 1},
        std::vector<int>{0, 1, 1, 1}, std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2},
        std::vector<int>{2, 0, 1, 0, 2, 1}, std::vector<int>{0, 0, 0}}) {
    std::vector<std::string> errors = Run(machine_of, 6);
    for (size_t q = 0; q < errors.size(); ++q) {
      if (!EXPECT_TRUE(errors[q].empty())) {
        ADD_FAILURE("layout of " + std::to_string(machine_of.size()) + " ranks, rank " +
                    std::to_string(q) + ": " + errors[q]);
      }
    }
  }
}

}  // namespace
}  // namespace scaleout
