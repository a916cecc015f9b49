/*
 * Note [Settings table]
 * ~~~~~~~~~~~~~~~~~~~~~
 * Every setting of the core's Config (common/config.h), once, in config()'s order:
 * X(SUFFIX, horovod_twin, default, description): read from SCALEOUT_<SUFFIX>, and when
 * horovod_twin is 1 from HOROVOD_<SUFFIX> too (Note [Horovod variables]); `default` is the value
 * config() shows when neither is set, as text; `description` one line for people. The parser
 * reads no variable that has no row here, and test_config.cc checks that config()'s defaults and
 * settings are the table's, so what is built from it (scaleout._binding.SETTINGS, the
 * documentation's configuration page) cannot drift from the parser. Plain C: the binding
 * includes it too.
 */
#ifndef SCALEOUT_COMMON_SETTINGS_TABLE_H_
#define SCALEOUT_COMMON_SETTINGS_TABLE_H_

/* clang-format off */
#define SO_SETTINGS_TABLE(X)                                                                     \
  X(FUSION_THRESHOLD, 1, "67108864", "bytes of one fused buffer; 0 disables fusion")            \
  X(CYCLE_TIME, 1, "1",                                                                          \
    "(ms) the longest rank 0 holds ready work back while more is still arriving, to fuse it; "  \
    "a lone request is never held")                                                              \
  X(PRIORITY_BYTES, 0, "1048576",                                                               \
    "when ready work carries priorities, the most bytes rank 0 sends per round, highest first "  \
    "(larger allreduces go in parts of this size); 0: no limit")                                 \
  X(AUTOTUNE, 1, "0",                                                                            \
    "1: rank 0 tunes the fusion threshold and cycle time during the first steps, then keeps "    \
    "the best")                                                                                  \
  X(AUTOTUNE_LOG, 1, "",                                                                         \
    "CSV file rank 0 writes while autotuning (Horovod's columns): a row per sample, the best "  \
    "last; empty: none")                                                                         \
  X(AUTOTUNE_WARMUP_SAMPLES, 1, "3", "samples autotune lets pass before it scores one")         \
  X(AUTOTUNE_STEPS_PER_SAMPLE, 1, "10", "training steps in one autotune sample")                \
  X(AUTOTUNE_BAYES_OPT_MAX_SAMPLES, 1, "16",                                                     \
    "samples autotune scores before it settles on the best (Horovod's default is 20)")          \
  X(AUTOTUNE_GAUSSIAN_PROCESS_NOISE, 1, "0.8",                                                   \
    "the noise autotune's search assumes in a score, relative to the scores' spread")           \
  X(CACHE_CAPACITY, 1, "1024", "response-cache entries; 0 disables the cache")                  \
  X(FAST_LANE, 0, "1",                                                                           \
    "0: small allreduces every rank has negotiated before are negotiated every time (no fast "   \
    "lane)")                                                                                     \
  X(STALL_CHECK_TIME_SECONDS, 1, "60", "warn about collectives waiting this long; 0 disables")  \
  X(STALL_CHECK_DISABLE, 1, "0", "1 turns the stall check (warnings and shutdown) off")         \
  X(STALL_SHUTDOWN_TIME_SECONDS, 1, "0",                                                         \
    "after this long, a stalled collective shuts scaleout down on every rank; 0: never")        \
  X(DEADLOCK_CHECK_SECONDS, 0, "1",                                                              \
    "how long every rank must have been blocked on collectives that cannot complete before "    \
    "they fail with a deadlock error; 0 disables")                                               \
  X(HEARTBEAT_TIMEOUT_SECONDS, 0, "30",                                                          \
    "a peer not heard from for this long counts as dead; 0: only deaths the operating system "  \
    "reports")                                                                                   \
  X(DYNAMIC_PROCESS_SETS, 1, "0", "1 lets process sets be added and removed after init")        \
  X(NETWORK_INTERFACE, 0, "",                                                                    \
    "the interface rank 0 listens on for the other ranks' liveness connections; empty: every "  \
    "interface")                                                                                 \
  X(LOG_LEVEL, 1, "1",                                                                           \
    "0 errors only, 1 warnings, 2 info, 3 debug; or Horovod's names trace, debug, info, "       \
    "warning, error, fatal")                                                                     \
  X(TIMELINE, 1, "",                                                                             \
    "Chrome-trace file written by rank 0; empty: off; DYNAMIC: no file until start_timeline()") \
  X(TIMELINE_MARK_CYCLES, 1, "0", "1 marks every dispatch of rank 0 in the timeline")           \
  X(SHM, 0, "1",                                                                                 \
    "1: ranks on one machine exchange through shared memory; 0: through MPI (after init: which " \
    "is in use)")                                                                                \
  X(SHM_AREA, 0, "1048576", "bytes each rank stages per round of a shared-memory collective")   \
  X(HIERARCHICAL_ALLREDUCE, 1, "auto",                                                           \
    "across machines, reduce through shared memory inside each machine and over MPI between "   \
    "them: auto (whenever the layout allows it), 1 or 0")                                        \
  X(HIERARCHICAL_ALLGATHER, 1, "auto",                                                           \
    "across machines, gather inside each machine and send each machine's part once to each "    \
    "other machine: auto, 1 or 0")                                                               \
  X(EP_SERVERS, 0, "1", "endpoint-server threads; 0 counts as 1")                               \
  X(EP_CORES, 0, "", "comma-separated CPUs to pin endpoint server i to; empty: no pinning")     \
  X(THREAD_AFFINITY, 1, "",                                                                      \
    "comma-separated CPUs, one per local rank: local rank i pins its coordinator thread to "     \
    "entry i")
/* clang-format on */

#endif /* SCALEOUT_COMMON_SETTINGS_TABLE_H_ */
