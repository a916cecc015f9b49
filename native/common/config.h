// Configuration of the core, read from the environment in one place (Config::FromEnvironment).
#ifndef SCALEOUT_COMMON_CONFIG_H_
#define SCALEOUT_COMMON_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace scaleout {

struct Config {
  // SCALEOUT_FUSION_THRESHOLD: bytes of one fused buffer; 0 disables fusion.
  size_t fusion_threshold_bytes = size_t(64) << 20;
  // SCALEOUT_CYCLE_TIME (ms): the longest the coordinator holds ready work back while more is
  // still arriving, to fuse it. A lone request is never held (see Note [Dispatch]).
  double cycle_time_ms = 1.0;
  // SCALEOUT_CACHE_CAPACITY: response-cache entries; 0 disables the cache.
  int cache_capacity = 1024;
  // SCALEOUT_STALL_CHECK_TIME_SECONDS: warn about collectives waiting this long; 0 disables.
  double stall_check_seconds = 60.0;
  // SCALEOUT_LOG_LEVEL: 0 errors only, 1 warnings (default), 2 info, 3 debug.
  int log_level = 1;
  // SCALEOUT_EP_SERVERS: endpoint-server threads (Note [Endpoint servers]); 0 counts as 1.
  int ep_servers = 1;
  // SCALEOUT_TIMELINE: Chrome-trace file written by rank 0 (Note [Timeline]); empty: off.
  std::string timeline_path;
  // SCALEOUT_SHM: 1 (default): when every rank is on one machine, allreduces go through shared
  // memory (Note [Staged allreduce]); 0: through MPI. After init it says which is in use.
  bool shm = true;
  // SCALEOUT_SHM_AREA: bytes each rank stages per round of a shared-memory allreduce.
  size_t shm_area_bytes = size_t(1) << 20;
  // SCALEOUT_EP_CORES: comma-separated CPUs to pin endpoint server i to (empty: no pinning).
  std::vector<int> ep_cores;

  // Parses the environment; a malformed value is an InvalidArgument naming the variable.
  static Status FromEnvironment(Config* out);
  std::string ToString() const;
};

}  // namespace scaleout

#endif  // SCALEOUT_COMMON_CONFIG_H_
