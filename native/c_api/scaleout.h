/*
 * scaleout C ABI: the only contract between the native core and Python.
 *
 * Plain C types, opaque integer handles, integer status codes. No C++ exception crosses this
 * boundary: every entry point returns a status code (SO_OK == 0) and, on failure, sets a
 * thread-local message read by so_last_error().
 *
 * Threading: every function may be called from any thread. so_wait() blocks; callers that hold
 * a language lock (the Python GIL) must release it first (ctypes.CDLL does so for every call).
 */
#ifndef SCALEOUT_C_API_H_
#define SCALEOUT_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SCALEOUT_ABI_VERSION 1

/* Status codes. Names are available at run time through so_status_name(). */
enum {
  SO_OK = 0,
  SO_ERR_INVALID_ARGUMENT = 1,  /* bad input on this rank (dtype, shape, op, root, ...) */
  SO_ERR_NOT_INITIALIZED = 2,   /* called before so_init or after so_shutdown */
  SO_ERR_SHUT_DOWN = 3,         /* this rank or another rank shut down; the work was abandoned */
  SO_ERR_MISMATCH = 4,          /* ranks disagree about a collective with the same name */
  SO_ERR_DUPLICATE_NAME = 5,    /* the name is already in flight on this rank */
  SO_ERR_TRANSPORT = 6,         /* the MPI (or another transport) failed */
  SO_ERR_TIMEOUT = 7,           /* a bounded wait ran out */
  SO_ERR_INTERNAL = 8,          /* a broken invariant inside the core (a bug) */
  SO_ERR_UNKNOWN_HANDLE = 9,    /* the handle was never issued or was already released */
  SO_STATUS_COUNT = 10
};

/* Element types. */
enum {
  SO_UINT8 = 0, SO_INT8 = 1, SO_INT16 = 2, SO_INT32 = 3, SO_INT64 = 4,
  SO_FLOAT16 = 5, SO_BFLOAT16 = 6, SO_FLOAT32 = 7, SO_FLOAT64 = 8, SO_BOOL = 9,
  SO_DTYPE_COUNT = 10
};

/* Reduction operations. */
enum { SO_AVERAGE = 0, SO_SUM = 1, SO_MIN = 2, SO_MAX = 3, SO_PRODUCT = 4, SO_REDUCE_OP_COUNT = 5 };

/* Collective kinds. */
enum {
  SO_ALLREDUCE = 0, SO_ALLGATHER = 1, SO_BROADCAST = 2, SO_ALLTOALL = 3,
  SO_REDUCESCATTER = 4, SO_BARRIER = 5, SO_JOIN = 6, SO_COLLECTIVE_COUNT = 7
};

#define SO_MAX_NDIM 32

/* ---- identity and diagnostics ---- */
int so_abi_version(void);
const char* so_version(void);          /* "0.1.0" */
const char* so_build_info(void);       /* compiler, MPI library it was built against */
const char* so_status_name(int code);  /* "MISMATCH", ...; "UNKNOWN" for other codes */
const char* so_dtype_name(int dtype);  /* "float32", ... */
const char* so_last_error(void);       /* message of this thread's last failing call */

/* ---- lifecycle ---- */
/* Starts the runtime on the communicator whose Fortran handle is given (MPI_Comm_c2f / mpi4py's
 * Comm.py2f()) when has_comm != 0, else on MPI_COMM_WORLD. MPI must already be initialised with
 * MPI_THREAD_MULTIPLE, or not at all (the core then initialises it and finalises it at exit).
 * Calling so_init while initialised is a no-op returning SO_OK. */
int so_init(int has_comm, int64_t comm_fortran_handle);
/* Stops the coordinator; pending handles fail with SO_ERR_SHUT_DOWN. Idempotent. */
int so_shutdown(void);
int so_is_initialized(void);
/* out[6] = rank, size, local_rank, local_size, cross_rank, cross_size */
int so_topology(int32_t* out);
/* The effective configuration as "KEY=VALUE\n" lines (read from the environment at init). */
const char* so_config_string(void);

/* ---- collectives ---- */
/*
 * Enqueues a named collective and returns a handle at once (*handle_out > 0).
 *
 * input:  the local contribution (ignored by SO_BARRIER and SO_JOIN; broadcast's non-root ranks
 *         may pass NULL when output is given).
 * output: where the result is written, for SO_ALLREDUCE and SO_BROADCAST (may equal input for
 *         in-place forms). Must be NULL for SO_ALLGATHER, SO_ALLTOALL and SO_REDUCESCATTER: their
 *         result shape is known only after negotiation, so the core owns the result buffer and
 *         so_result_shape / so_result_copy hand it over.
 * shape:  ndim dimensions of input (ndim may be 0 for a scalar).
 * splits: SO_ALLTOALL only: nsplits == size entries, rows of input sent to each rank; NULL for
 *         equal splits.
 * The caller keeps input and output alive and unmodified until the handle completes.
 */
int so_enqueue(const char* name, int collective, int dtype, int ndim, const int64_t* shape,
               const void* input, void* output, int reduce_op, int root_rank,
               double prescale_factor, double postscale_factor,
               const int64_t* splits, int nsplits, int64_t* handle_out);

/* *done_out = 1 when the handle has completed (successfully or not). */
int so_poll(int64_t handle, int* done_out);
/* Blocks until the handle completes, then returns its status (so_last_error() has its message).
 * timeout_seconds < 0 waits forever; on expiry returns SO_ERR_TIMEOUT and the handle stays valid. */
int so_wait(int64_t handle, double timeout_seconds);
/* Result of a completed SO_ALLGATHER / SO_ALLTOALL / SO_REDUCESCATTER handle. */
int so_result_shape(int64_t handle, int* ndim_out, int64_t* shape_out /* SO_MAX_NDIM */);
int so_result_copy(int64_t handle, void* dst, int64_t nbytes);
/* SO_ALLTOALL: rows received from each rank (size entries). */
int so_result_splits(int64_t handle, int64_t* splits_out, int nsplits);
/* SO_JOIN: the rank that joined last. */
int so_result_join_rank(int64_t handle, int32_t* rank_out);
/* Frees a completed handle (or abandons the result of a pending one). */
int so_release(int64_t handle);

#ifdef __cplusplus
}
#endif
#endif /* SCALEOUT_C_API_H_ */
