// Configuration of the core, read from the environment in one place (Config::FromEnvironment).
//
// Note [Horovod variables]
// Every setting has a SCALEOUT_* variable, and those Horovod 0.28.1 also has are read from their
// HOROVOD_* name too (HOROVOD_CYCLE_TIME for SCALEOUT_CYCLE_TIME, ...), so that a job written for
// Horovod keeps its tuning. When both are set the SCALEOUT_* one wins. `sources` records which
// variable each value came from (config() shows it). A HOROVOD_* variable that scaleout does not
// implement, or does not know, is never dropped silently: `notes` holds one line per such
// variable, which rank 0 logs as a warning at init (the rank is not known here); but for those
// horovodrun sets for the program to read, which scaleoutrun sets too (kLauncherSet).
#ifndef SCALEOUT_COMMON_CONFIG_H_
#define SCALEOUT_COMMON_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/settings_table.h"
#include "common/status.h"

namespace scaleout {

// The most samples autotune may score (each refits its search: Note [Bayesian search]).
constexpr int kAutotuneMaxSamples = 100;

// Each setting below is a row of SO_SETTINGS_TABLE (Note [Settings table]).
struct Config {
  // SCALEOUT_FUSION_THRESHOLD: bytes of one fused buffer; 0 disables fusion.
  size_t fusion_threshold_bytes = size_t(64) << 20;
  // SCALEOUT_CYCLE_TIME (ms): the longest the coordinator holds ready work back while more is
  // still arriving, to fuse it. A lone request is never held (see Note [Dispatch]).
  double cycle_time_ms = 1.0;
  // SCALEOUT_PRIORITY_BYTES: when ready work carries priorities, the most bytes rank 0 sends per
  // round, highest first, larger allreduces in parts of this size (Note [Priority]); 0: no limit.
  size_t priority_bytes = size_t(1) << 20;
  // SCALEOUT_AUTOTUNE and the five after it: rank 0 tunes the two settings above while the job
  // runs (Note [Autotune]), with Horovod's variables and meanings.
  bool autotune = false;
  std::string autotune_log;
  int autotune_warmup_samples = 3;
  int autotune_steps_per_sample = 10;
  int autotune_max_samples = 16;  // at most kAutotuneMaxSamples
  double autotune_noise = 0.8;
  // SCALEOUT_CACHE_CAPACITY: response-cache entries; 0 disables the cache.
  int cache_capacity = 1024;
  // SCALEOUT_FAST_LANE: 0 turns the fast lane off (Note [Fast lane]).
  bool fast_lane = true;
  // SCALEOUT_STALL_CHECK_TIME_SECONDS: warn about collectives waiting this long; 0 disables.
  double stall_check_seconds = 60.0;
  // SCALEOUT_STALL_CHECK_DISABLE: 1 turns the stall check (warnings and shutdown) off.
  bool stall_check_disable = false;
  // SCALEOUT_STALL_SHUTDOWN_TIME_SECONDS: after this long, a stalled collective shuts scaleout
  // down on every rank (Note [Stall shutdown]); 0 (the default, as Horovod's): never.
  double stall_shutdown_seconds = 0.0;
  // SCALEOUT_DEADLOCK_CHECK_SECONDS: how long every rank must have been blocked on collectives
  // that cannot complete before they fail with a deadlock error (Note [Deadlock]); 0 disables.
  double deadlock_check_seconds = 1.0;
  // SCALEOUT_DYNAMIC_PROCESS_SETS: 1 lets process sets be added and removed after init (Note
  // [Process sets]); the Python layer enforces it.
  bool dynamic_process_sets = false;
  // SCALEOUT_HEARTBEAT_TIMEOUT_SECONDS: a peer not heard from for this long counts as dead
  // (Note [Liveness]); 0: only deaths the operating system reports (a process that ended).
  double heartbeat_timeout_seconds = 30.0;
  // SCALEOUT_NETWORK_INTERFACE: the interface rank 0 listens on for the other ranks' liveness
  // connections (scaleoutrun's --network-interface sets it); empty: every interface.
  std::string network_interface;
  // Whether waits in MPI sleep between polls, as the MPI was told to do (scaleoutrun's
  // --mpi-yield sets MPIR_CVAR_ENABLE_HEAVY_YIELD or OMPI_MCA_mpi_yield_when_idle to 1).
  bool mpi_wait_sleeps = false;
  // SCALEOUT_LOG_LEVEL: 0 errors only, 1 warnings (default), 2 info, 3 debug; or Horovod's names
  // trace, debug, info, warning, error, fatal.
  int log_level = 1;
  // SCALEOUT_EP_SERVERS: endpoint-server threads (Note [Endpoint servers]); 0 counts as 1.
  int ep_servers = 1;
  // SCALEOUT_TIMELINE: Chrome-trace file written by rank 0 (Note [Timeline]); empty: off;
  // DYNAMIC (Horovod's word): no file until start_timeline().
  std::string timeline_path;
  // SCALEOUT_TIMELINE_MARK_CYCLES: 1 marks every dispatch of rank 0 in the timeline.
  bool timeline_mark_cycles = false;
  // SCALEOUT_SHM: 1 (default): when every rank is on one machine, allreduces go through shared
  // memory (Note [Staged allreduce]); 0: through MPI. After init it says which is in use.
  bool shm = true;
  // SCALEOUT_SHM_AREA: bytes each rank stages per round of a shared-memory allreduce.
  size_t shm_area_bytes = size_t(1) << 20;
  // SCALEOUT_HIERARCHICAL_ALLREDUCE: across machines, reduce through shared memory inside each
  // machine and over MPI between them (Note [Hierarchical allreduce]): -1 auto (whenever the
  // layout allows it), 1 on (a warning says why when the layout does not allow it), 0 off.
  int hierarchical_allreduce = -1;
  // SCALEOUT_HIERARCHICAL_ALLGATHER: across machines, gather inside each machine and send each
  // machine's part once to each other machine (Note [Hierarchical allgather]); as above.
  int hierarchical_allgather = -1;
  // After init: each collective's algorithm in use, in words (config()'s
  // <collective>_algorithm entries).
  std::vector<std::pair<std::string, std::string>> algorithms;
  // After init: this machine runs more of the job's ranks than it has CPUs online, so a wait
  // yields its core at once instead of spinning first (Note [Waiting]).
  bool oversubscribed = false;
  // SCALEOUT_EP_CORES: comma-separated CPUs to pin endpoint server i to (empty: no pinning).
  std::vector<int> ep_cores;
  // SCALEOUT_THREAD_AFFINITY: comma-separated CPUs, one per local rank: local rank i pins its
  // coordinator thread to entry i (as HOROVOD_THREAD_AFFINITY pins Horovod's background thread).
  std::vector<int> thread_affinity;

  // Setting (its SCALEOUT_* name) -> the variable its value was read from, or "default".
  std::map<std::string, std::string> sources;
  // Lines about HOROVOD_* variables that have no effect here (Note [Horovod variables]).
  std::vector<std::string> notes;

  // Parses the environment; a malformed value is an InvalidArgument naming the variable.
  static Status FromEnvironment(Config* out);
  // The same over any lookup (unit tests): `getenv` returns a variable's value or nullptr, and
  // `horovod_names` lists every HOROVOD_* variable that is set.
  static Status Parse(const std::function<const char*(const char*)>& getenv,
                      const std::vector<std::string>& horovod_names, Config* out);
  // KEY=VALUE lines, one per setting, each followed by KEY.source=<variable or default>.
  std::string ToString() const;

  // Whether a stalled collective shuts the job down (Horovod's rule: only with the stall check
  // on, and not before it would first warn).
  bool stall_shutdown_active() const {
    return !stall_check_disable && stall_check_seconds > 0 && stall_shutdown_seconds > 0 &&
           stall_shutdown_seconds >= stall_check_seconds;
  }
  // The CPU this local rank's coordinator thread is pinned to, or -1 (with *why set when the
  // list is set but unusable).
  int CoordinatorCore(int local_rank, int local_size, std::string* why) const;
};

// "warning" -> 1, "3" -> 3; false if `text` is neither a level number >= 0 nor a Horovod name.
bool ParseLogLevel(const std::string& text, int* level);

}  // namespace scaleout

#endif  // SCALEOUT_COMMON_CONFIG_H_
