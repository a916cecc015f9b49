/*
 * scaleout C ABI: the only contract between the native core and Python.
 *
 * Plain C types, opaque integer handles, integer status codes. No C++ exception crosses this
 * boundary: every entry point returns a status code (SO_OK == 0) and, on failure, sets a
 * thread-local message read by so_last_error().
 *
 * Threading: every function may be called from any thread. so_wait() blocks; callers that hold
 * a language lock (the Python GIL) must release it first (the Python binding does).
 */
#ifndef SCALEOUT_C_API_H_
#define SCALEOUT_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SCALEOUT_ABI_VERSION 12

/*
 * The tables: every code the ABI uses, with its name, written once here. The core takes its names
 * from these rows, and the Python binding (native/python/binding.c, compiled from this header)
 * hands the same rows to Python, which builds its enums from them at import: a code cannot mean
 * one thing in C and another in Python.
 *
 * SO_ERROR_TABLE(X): X(NAME, code) for every failure status; SO_OK is 0.
 * SO_DTYPE_TABLE(X): X(ENUM, name, code, bytes per element).
 * SO_REDUCE_OP_TABLE(X): X(ENUM, name, code).
 * SO_COLLECTIVE_TABLE(X): X(ENUM, name, code).
 * SO_TRAFFIC_TABLE(X): X(ENUM, name, code): the counters so_traffic gives per collective kind.
 * SO_PLAN_TABLE(X): X(ENUM, name, code): what the algorithm plan decides for (Note [Algorithm
 *   plan] in collectives/algorithm_plan.h): the collectives that move data, and Adasum
 *   allreduces apart; in the order config() lists them.
 * SO_ALGORITHM_TABLE(X): X(ENUM, name, code): the algorithms a plan entry can name.
 */
/* clang-format off */
#define SO_ERROR_TABLE(X)                                                                        \
  X(INVALID_ARGUMENT, 1) /* bad input on this rank (dtype, shape, op, root, ...) */             \
  X(NOT_INITIALIZED, 2)  /* called before so_init or after so_shutdown */                       \
  X(SHUT_DOWN, 3)        /* this or another rank shut down (or the handle's runtime did) */     \
  X(MISMATCH, 4)         /* ranks disagree about a collective with the same name */             \
  X(DUPLICATE_NAME, 5)   /* the name is already in flight on this rank */                      \
  X(TRANSPORT, 6)        /* the MPI (or another transport) failed */                            \
  X(TIMEOUT, 7)          /* a bounded wait ran out */                                           \
  X(INTERNAL, 8)         /* a broken invariant inside the core (a bug) */                       \
  X(UNKNOWN_HANDLE, 9)   /* the handle was never issued or was already released */        \
  X(DEADLOCK, 10)        /* every rank waits for collectives no rank can complete */           \
  X(NOT_SUPPORTED, 11)   /* a Horovod feature scaleout does not have (yet) for these arguments */
/* clang-format on */

/* clang-format off */
#define SO_DTYPE_TABLE(X)                                                                        \
  X(UINT8, uint8, 0, 1) X(INT8, int8, 1, 1) X(INT16, int16, 2, 2) X(INT32, int32, 3, 4)          \
  X(INT64, int64, 4, 8) X(FLOAT16, float16, 5, 2) X(BFLOAT16, bfloat16, 6, 2)                   \
  X(FLOAT32, float32, 7, 4) X(FLOAT64, float64, 8, 8) X(BOOL, bool, 9, 1)                     \
  X(UINT16, uint16, 10, 2)
/* clang-format on */

/* clang-format off */
#define SO_REDUCE_OP_TABLE(X) \
  X(AVERAGE, Average, 0) X(SUM, Sum, 1) X(MIN, Min, 2) X(MAX, Max, 3) X(PRODUCT, Product, 4) \
  X(ADASUM, Adasum, 5) /* allreduce of floating-point tensors only (Note [Adasum]) */
/* clang-format on */

/* clang-format off */
#define SO_COLLECTIVE_TABLE(X)                                                                   \
  X(ALLREDUCE, allreduce, 0) X(ALLGATHER, allgather, 1) X(BROADCAST, broadcast, 2)              \
  X(ALLTOALL, alltoall, 3) X(REDUCESCATTER, reducescatter, 4) X(BARRIER, barrier, 5)            \
  X(JOIN, join, 6)
/* clang-format on */

/* clang-format off */
#define SO_TRAFFIC_TABLE(X)                                                                      \
  X(CALLS, calls, 0)         /* collectives run */                                               \
  X(BYTES, bytes, 1)         /* bytes of the tensors this rank submitted */                      \
  X(SHM_BYTES, shm_bytes, 2) /* bytes this rank wrote into its staging areas for the others */    \
  X(MPI_BYTES, mpi_bytes, 3) /* bytes this rank handed MPI to send */                             \
  X(REDUCE_NS, reduce_ns, 4) /* nanoseconds in scaleout's own reduction kernels */               \
  X(WAIT_NS, wait_ns, 5)     /* nanoseconds waiting for other ranks (MPI requests, shm syncs) */ \
  X(LANE_CALLS, lane_calls, 6) /* of the calls, those agreed with no negotiation (fast lane) */
/* clang-format on */

/* clang-format off */
#define SO_PLAN_TABLE(X)                                                                         \
  X(ALLREDUCE, allreduce, 0) X(BROADCAST, broadcast, 1) X(ALLTOALL, alltoall, 2)                \
  X(ALLGATHER, allgather, 3) X(REDUCESCATTER, reducescatter, 4) X(ADASUM, adasum, 5)
/* clang-format on */

/* clang-format off */
#define SO_ALGORITHM_TABLE(X)                                                                    \
  X(MPI, mpi, 0)                     /* MPI's own collective (Adasum: its tree over MPI) */      \
  X(SHARED_MEMORY, shared_memory, 1) /* staged through shared memory, every rank on one machine */ \
  X(HIERARCHICAL, hierarchical, 2)   /* inside each machine, then between machines */            \
  X(HIERARCHICAL_LEADER_BASED, hierarchical_leader_based, 3) /* machines of different sizes */  \
  X(SHARED_MEMORY_AND_MPI, shared_memory_and_mpi, 4) /* shared memory inside, MPI between */
/* clang-format on */

/* Status codes (so_status_name() gives the name of one). */
#define SO_ENUM_ERROR_(NAME, code) SO_ERR_##NAME = code,
enum { SO_OK = 0, SO_ERROR_TABLE(SO_ENUM_ERROR_) SO_STATUS_COUNT };
#undef SO_ENUM_ERROR_

/* Element types, reduction operations, collective kinds. */
#define SO_ENUM_DTYPE_(ENUM, name, code, bytes) SO_##ENUM = code,
enum { SO_DTYPE_TABLE(SO_ENUM_DTYPE_) SO_DTYPE_COUNT };
#undef SO_ENUM_DTYPE_
#define SO_ENUM_CODE_(ENUM, name, code) SO_##ENUM = code,
enum { SO_REDUCE_OP_TABLE(SO_ENUM_CODE_) SO_REDUCE_OP_COUNT };
enum { SO_COLLECTIVE_TABLE(SO_ENUM_CODE_) SO_COLLECTIVE_COUNT };
#define SO_ENUM_TRAFFIC_(ENUM, name, code) SO_TRAFFIC_##ENUM = code,
enum { SO_TRAFFIC_TABLE(SO_ENUM_TRAFFIC_) SO_TRAFFIC_COUNT };
#undef SO_ENUM_TRAFFIC_
#define SO_ENUM_PLAN_(ENUM, name, code) SO_PLAN_##ENUM = code,
enum { SO_PLAN_TABLE(SO_ENUM_PLAN_) SO_PLAN_COUNT };
#undef SO_ENUM_PLAN_
#define SO_ENUM_ALGORITHM_(ENUM, name, code) SO_ALGORITHM_##ENUM = code,
enum { SO_ALGORITHM_TABLE(SO_ENUM_ALGORITHM_) SO_ALGORITHM_COUNT };
#undef SO_ENUM_ALGORITHM_
#undef SO_ENUM_CODE_

/* Handle ids: the runtime's epoch (counting so_init calls in this process) in the bits from
 * SO_HANDLE_EPOCH_SHIFT up, a serial number below, so a handle outlives its runtime only as a
 * recognisable id: every call on it answers SO_ERR_SHUT_DOWN. */
#define SO_HANDLE_EPOCH_SHIFT 40

#define SO_MAX_NDIM 32

/* ---- identity and diagnostics ---- */
int so_abi_version(void);
const char* so_version(void);         /* "0.1.0" */
const char* so_build_info(void);      /* the compiler the core was built with */
const char* so_status_name(int code); /* "MISMATCH", ...; "UNKNOWN" for other codes */
const char* so_last_error(void);      /* message of this thread's last failing call */
/* The details of this thread's last failing call (Note [Error details] in common/status.h):
 * *count_out culprit ranks, the job's ranks whose death or shutdown caused the error (0 when no
 * rank is to blame), the first `capacity` of them written to culprits_out (may be NULL);
 * *process_set_out: the id of the process set that already has the ranks an add_process_set
 * named, else -1. Always SO_OK. */
int so_last_error_details(int32_t* culprits_out, int capacity, int32_t* count_out,
                          int32_t* process_set_out);

/* ---- MPI (Note [One core, a shim per MPI ABI] in mpi/so_mpi.h) ---- */
struct so_mpi_api;
/* The core calls MPI through this shim's table (so_mpi_api_get() of the shim for the MPI library
 * the process uses), for the rest of the process: before the first so_init. A second, different
 * table is refused (SO_ERR_INVALID_ARGUMENT), the same one again is SO_OK. */
int so_use_mpi(const struct so_mpi_api* api);

/* ---- lifecycle ---- */
/* Starts the runtime on the communicator whose C handle is given (the bits of the MPI_Comm, as
 * mpi4py's Comm.handle gives them) when has_comm != 0, else on MPI_COMM_WORLD. MPI must already be
 * initialised with MPI_THREAD_MULTIPLE, or not at all (the core then initialises it and finalises
 * it at exit). Calling so_init while initialised is a no-op returning SO_OK. */
int so_init(int has_comm, int64_t comm_c_handle);
/* Stops the coordinator; pending handles fail with SO_ERR_SHUT_DOWN. Idempotent. */
int so_shutdown(void);
int so_is_initialized(void);
/* out[6] = rank, size, local_rank, local_size, cross_rank, cross_size */
int so_topology(int32_t* out);
/* The effective configuration as "KEY=VALUE\n" lines (read from the environment at init). */
const char* so_config_string(void);
/* Starts writing the timeline to `path` on rank 0 (closing one being written), or stops it when
 * path is NULL or empty; returns once done, so a stopped timeline's file is complete. */
int so_timeline(const char* path, int mark_cycles);
/* out[2] = handles registered (issued, not yet released), names in flight: for leak checks. */
int so_stats(int64_t* out);
/* out[SO_COLLECTIVE_COUNT * SO_TRAFFIC_COUNT]: out[collective * SO_TRAFFIC_COUNT + counter],
 * this process's counts since so_init (Note [Traffic]). */
int so_traffic(int64_t* out);
/* out[SO_PLAN_COUNT]: the algorithm (SO_ALGORITHM_...) of each SO_PLAN_... entry on every rank
 * of the job (Note [Algorithm plan]). */
int so_algorithms(int32_t* out);
/* 1 once this process has seen a peer rank die (Note [Liveness]), under any runtime, else 0: MPI
 * cannot be finalized then (MPI_Finalize waits for the dead peer forever). */
int so_peer_died(void);

/* ---- process sets (Note [Process sets] in runtime/runtime.h) ---- */
/* Collective over every rank of the job, in the same order everywhere: a set of the job's ranks
 * (sorted, distinct), whose id (1, 2, ... in order of adding) is written to *id_out. */
int so_add_process_set(const int32_t* ranks, int nranks, int32_t* id_out);
/* Collective over the set's ranks only, each of which calls it (torch.distributed's new_group):
 * the set of these ranks (sorted, distinct, this rank among them), an existing one if there is
 * one, else a new one that lives until shutdown. */
int so_add_member_process_set(const int32_t* ranks, int nranks, int32_t* id_out);
/* Collective over every rank; fails while any rank has collectives of the set in flight. */
int so_remove_process_set(int32_t id);
/* *size_out: the set's size; *rank_out: this rank's place in it (-1: not a member); ranks_out, if
 * not NULL: up to `capacity` of its ranks (the job's). */
int so_process_set(int32_t id, int32_t* rank_out, int32_t* size_out, int32_t* ranks_out,
                   int capacity);

/* ---- collectives ---- */
/*
 * One collective request (Note [Request record]).
 *
 * name:   the collective's name, the same on every rank (NUL-terminated UTF-8).
 * input:  the local contribution (ignored by SO_BARRIER and SO_JOIN; broadcast's non-root ranks
 *         may pass NULL when output is given).
 * output: where the result is written, for SO_ALLREDUCE and SO_BROADCAST (may equal input for
 *         in-place forms). Must be NULL for SO_ALLGATHER, SO_ALLTOALL and SO_REDUCESCATTER: their
 *         result shape is known only after negotiation, so the core owns the result buffer and
 *         so_result_shape / so_result_take hand it over.
 * shape:  ndim dimensions of input (ndim may be 0 for a scalar).
 * reduce_op, prescale_factor, postscale_factor: SO_ALLREDUCE and SO_REDUCESCATTER only.
 * root_rank: SO_BROADCAST only (the job's rank, also on a process set).
 * splits: SO_ALLTOALL only: nsplits == size entries, rows of input sent to each rank; NULL for
 *         equal splits.
 * process_set: the id of the process set the collective runs on (0: every rank; ranks, roots and
 *         splits are then the set's); this rank must be a member.
 * caller_waits: 1 when the caller calls so_wait on the handle at once (a synchronous call): the
 *         core may then run the collective on the caller's thread inside so_wait (Note [Caller
 *         drives] in coordinator/coordinator.h). Added in ABI 11; default 0.
 * priority: higher goes first when work of several priorities is ready at once (Note [Priority]
 *         in fusion/fusion_planner.h); rank 0's order decides. Added in ABI 12; default 0.
 */
typedef struct so_request {
  uint32_t struct_size; /* sizeof(so_request) as the caller was compiled with */
  int32_t collective;
  const char* name;
  int32_t dtype;
  int32_t ndim;
  const int64_t* shape;
  const void* input;
  void* output;
  int32_t reduce_op;
  int32_t root_rank;
  double prescale_factor;
  double postscale_factor;
  const int64_t* splits;
  int32_t nsplits;
  int32_t process_set;
  int32_t caller_waits;
  int32_t priority;
} so_request;

/*
 * Note [Request record]
 * ~~~~~~~~~~~~~~~~~~~~~
 * A request crosses every boundary as one record: Python's keyword arguments of
 * scaleout._binding.submit, this struct at the C ABI, EnqueueArgs inside the core (one
 * conversion, in c_api.cc). The struct is versioned by its first field: a field is only ever
 * added at the end (its comment giving its default), and the core reads a field only when
 * struct_size covers it, else it takes that default, so a caller built against an older header
 * keeps working. A struct_size smaller than the first version's (every field above) is refused
 * with SO_ERR_INVALID_ARGUMENT.
 */

/*
 * Enqueues a named collective and returns a handle at once (*handle_out > 0).
 * The caller keeps input and output alive and unmodified until the handle completes; the request
 * record itself is read during the call only.
 */
int so_enqueue(const so_request* request, int64_t* handle_out);

/*
 * A synchronous allreduce (caller_waits set, the global process set) run at once on the calling
 * thread, with no handle, where the fast lane can take it (Note [Fast lane]): *done_out = 1 when
 * it ran, the return value its outcome (the result is in output); *done_out = 0 when nothing
 * was done: pass the same record to so_enqueue and wait on the handle, which also reports
 * whatever is wrong with the request.
 */
int so_allreduce_now(const so_request* request, int* done_out);

/* *done_out = 1 when the handle has completed (successfully or not). */
int so_poll(int64_t handle, int* done_out);
/* Blocks until the handle completes, then returns its status (so_last_error() has its message).
 * timeout_seconds < 0 waits forever; on expiry returns SO_ERR_TIMEOUT and the handle stays valid.
 */
int so_wait(int64_t handle, double timeout_seconds);
/* Result of a completed SO_ALLGATHER / SO_ALLTOALL / SO_REDUCESCATTER handle. */
int so_result_shape(int64_t handle, int* ndim_out, int64_t* shape_out /* SO_MAX_NDIM */);
/* Hands the result's bytes over without copying: *data_out and *nbytes_out stay valid, whatever
 * becomes of the handle, until so_buffer_free(*buffer_out). Once per handle. */
int so_result_take(int64_t handle, void** data_out, int64_t* nbytes_out, void** buffer_out);
void so_buffer_free(void* buffer);
/* SO_ALLTOALL: rows received from each rank of its process set: *count_out entries (the set's
 * size), written when capacity allows. */
int so_result_splits(int64_t handle, int64_t* splits_out, int capacity, int32_t* count_out);
/* SO_JOIN: the rank that joined last. */
int so_result_join_rank(int64_t handle, int32_t* rank_out);
/* Frees a completed handle (or abandons the result of a pending one). */
int so_release(int64_t handle);

#ifdef __cplusplus
}
#endif
#endif /* SCALEOUT_C_API_H_ */
