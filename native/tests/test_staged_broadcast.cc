// StagedBroadcast (Note [Staged broadcast]) over in-process machines whose ranks are threads
// (tests/shared_areas.h): every root, one machine and several of equal or different sizes,
// one round and many, back to back.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/staged_broadcast.h"
#include "tests/shared_areas.h"
#include "tests/test_framework.h"

namespace scaleout {
namespace {

using test::CrossGroup;
using test::SharedAreas;

// Ranks numbered machine by machine; each rank broadcasts `repeats` times from every root and
// records whether every result was the root's bytes.
std::vector<std::string> RunMachines(const std::vector<int>& sizes, size_t area, size_t bytes,
                                     int repeats) {
  const int machines = static_cast<int>(sizes.size());
  std::vector<std::unique_ptr<SharedAreas>> shared;
  std::vector<int> machine_of, local_rank_of;
  for (int m = 0; m < machines; ++m) {
    shared.push_back(std::make_unique<SharedAreas>(sizes[m], area));
    for (int r = 0; r < sizes[m]; ++r) {
      machine_of.push_back(m);
      local_rank_of.push_back(r);
    }
  }
  const int ranks = static_cast<int>(machine_of.size());
  CrossGroup leaders(machines);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int g = 0; g < ranks; ++g) {
    threads.emplace_back([&, g] {
      SharedAreas::View view(shared[machine_of[g]].get(), local_rank_of[g]);
      CrossGroup::Member member(&leaders, machine_of[g]);
      const bool leader = local_rank_of[g] == 0 && machines > 1;
      StagedBroadcast bcast(&view, leader ? &member : nullptr, g, machine_of, local_rank_of);
      // A wrong byte is recorded and the rank goes on (its peers wait for it otherwise).
      for (int rep = 0; rep < repeats; ++rep) {
        for (int root = 0; root < ranks; ++root) {
          std::vector<uint8_t> buf(bytes);
          for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<uint8_t>(g * 31 + i * 7 + rep);
          Status s = bcast.Run(buf.data(), bytes, root);
          if (!s.ok()) {
            errors[g] = s.message();
            return;
          }
          for (size_t i = 0; i < bytes && errors[g].empty(); ++i) {
            if (buf[i] != static_cast<uint8_t>(root * 31 + i * 7 + rep)) {
              errors[g] = "root " + std::to_string(root) + " byte " + std::to_string(i);
            }
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

SO_TEST(StagedBroadcastReachesEveryRankFromEveryRoot) {
  for (const std::vector<int>& sizes :
       {std::vector<int>{1}, std::vector<int>{3}, std::vector<int>{2, 2}, std::vector<int>{3, 3},
        std::vector<int>{2, 1}, std::vector<int>{1, 3, 2}}) {
    for (size_t bytes : {size_t(0), size_t(1), size_t(500), size_t(5000)}) {
      std::vector<std::string> errors = RunMachines(sizes, 512, bytes, 3);
      for (size_t g = 0; g < errors.size(); ++g) {
        if (!EXPECT_TRUE(errors[g].empty())) {
          ADD_FAILURE(std::to_string(sizes.size()) + " machines, " + std::to_string(bytes) +
                      " bytes, rank " + std::to_string(g) + ": " + errors[g]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace scaleout
