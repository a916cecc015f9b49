// Which process set a coordinator serves (Note [Process sets] in runtime/runtime.h).
#ifndef SCALEOUT_COORDINATOR_PROCESS_SET_INFO_H_
#define SCALEOUT_COORDINATOR_PROCESS_SET_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace scaleout {

// A set's id, and the job's rank of each of its ranks (the global set, id 0: 0, 1, ...; empty
// also means the same numbers). Negotiation counts the set's ranks; what users read names the
// job's.
struct ProcessSetInfo {
  int32_t id = 0;
  std::vector<int> ranks;

  // The job's rank of rank `r` of the set.
  int JobRank(int r) const { return ranks.empty() || r < 0 ? r : ranks[r]; }
  // " (in process set 2, whose ranks 0, 1 are ranks 1, 3 of the job)", or "" for the global set.
  std::string Where() const {
    if (id == 0) return std::string();
    std::string set_ranks, job_ranks;
    for (size_t i = 0; i < ranks.size(); ++i) {
      set_ranks += (i ? ", " : "") + std::to_string(i);
      job_ranks += (i ? ", " : "") + std::to_string(ranks[i]);
    }
    return " (in process set " + std::to_string(id) + ", whose ranks " + set_ranks + " are ranks " +
           job_ranks + " of the job)";
  }
};

}  // namespace scaleout

#endif  // SCALEOUT_COORDINATOR_PROCESS_SET_INFO_H_
