/*
 * The core's one way to MPI: a table of functions that an MPI shim fills in.
 *
 * Note [One core, a shim per MPI ABI]
 * MPI fixes its API, not its ABI: MPICH and its derivatives (Intel MPI, MVAPICH, Cray MPICH:
 * libmpi.so.12) make a communicator an int, Open MPI (libmpi.so.40) a pointer to an exported
 * object, the MPI 5 standard ABI (libmpi_abi.so) a pointer of its own kind, and constants,
 * status layouts and Fortran handles differ with them. A library compiled against one header
 * cannot run on another MPI. So the core (_scaleout_core) includes no mpi.h and links no MPI:
 * it calls MPI only through this table, in neutral types (a handle is an intptr_t, datatypes
 * and ops are the codes below, 0 is every null handle, a negative rank is "any" or "undefined").
 * A shim (native/mpi/mpi_shim.cc, a few hundred lines) is that table for one ABI, compiled once
 * per ABI against that MPI's header and linked against its library; a wheel carries one per
 * ABI and no libmpi. At import scaleout._native asks which library mpi4py loaded
 * (scaleout/_mpi_library.py), opens the shim of its ABI (whose libmpi is then the one already
 * loaded) and hands its table to the core with so_use_mpi: the core, mpi4py and the launcher
 * (which asks the same question before it starts the ranks) use one MPI.
 *
 * Every function returns MPI's error code (0 is success in every ABI), to be named by
 * error_string. Counts of bytes travel as SO_MPI_BYTE.
 */
#ifndef SCALEOUT_MPI_SO_MPI_H_
#define SCALEOUT_MPI_SO_MPI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SO_MPI_API_VERSION 2

typedef intptr_t so_mpi_handle; /* a communicator or a request; 0 is its null */

enum so_mpi_type {
  SO_MPI_BYTE,
  SO_MPI_INT, /* C int */
  SO_MPI_INT8,
  SO_MPI_UINT8,
  SO_MPI_INT16,
  SO_MPI_UINT16,
  SO_MPI_INT32,
  SO_MPI_INT64,
  SO_MPI_FLOAT,
  SO_MPI_DOUBLE,
  SO_MPI_C_BOOL
};

/* MPI's predefined ops, then the ops that combine 16-bit floats (sent as SO_MPI_UINT16) through
 * the core's combine function: SO_MPI_HALF_OPS + 4 * half kind + op (kinds below). */
enum so_mpi_op {
  SO_MPI_SUM,
  SO_MPI_MIN,
  SO_MPI_MAX,
  SO_MPI_PROD,
  SO_MPI_LAND,
  SO_MPI_LOR,
  SO_MPI_HALF_OPS
};
enum so_mpi_half { SO_MPI_FLOAT16, SO_MPI_BFLOAT16 };
#define SO_MPI_HALF_OP(half, op) (SO_MPI_HALF_OPS + 4 * (half) + (op)) /* op: SUM..PROD */

/* Combines count 16-bit floats of `in` into `inout` (half: enum so_mpi_half, op: SUM..PROD). */
typedef void (*so_mpi_combine_fn)(void* inout, const void* in, int count, int half, int op);

typedef struct so_mpi_api {
  int struct_size;        /* sizeof(so_mpi_api) of the shim's header */
  int version;            /* SO_MPI_API_VERSION of the shim's header */
  const char* abi;        /* "mpich", "openmpi" or "mpiabi" */
  const char* built_with; /* the MPI whose header the shim was compiled against */

  /* Set once before any other call: how the 16-bit float ops combine. */
  void (*set_combine)(so_mpi_combine_fn fn);

  int (*get_library_version)(char* text, int capacity); /* NUL-terminated, cut to capacity */
  int (*initialized)(int* flag);
  int (*finalized)(int* flag);
  /* Initialises MPI asking for MPI_THREAD_MULTIPLE. */
  int (*init_thread_multiple)(void);
  /* The thread level: 0 single, 1 funneled, 2 serialized, 3 multiple. */
  int (*query_thread)(int* level);
  int (*finalize)(void);
  /* MPI's text for an error code, NUL-terminated, cut to capacity. */
  void (*error_string)(int code, char* text, int capacity);

  so_mpi_handle (*comm_world)(void);
  /* The communicator whose C handle (MPI_Comm's bits, mpi4py's Comm.handle) is given; 0 for
   * MPI_COMM_NULL. Fortran handles are not used: the standard ABI has none. */
  int (*comm_from_c)(int64_t c_handle, so_mpi_handle* comm);
  /* A duplicate whose errors are returned (MPI_ERRORS_RETURN), not fatal. */
  int (*comm_dup)(so_mpi_handle comm, so_mpi_handle* out);
  int (*comm_free)(so_mpi_handle* comm);
  int (*comm_rank)(so_mpi_handle comm, int* rank);
  int (*comm_size)(so_mpi_handle comm, int* size);
  /* color < 0: MPI_UNDEFINED (out is then 0). */
  int (*comm_split)(so_mpi_handle comm, int color, int key, so_mpi_handle* out);
  /* MPI_COMM_TYPE_SHARED: the ranks that share memory with this one. */
  int (*comm_split_shared)(so_mpi_handle comm, int key, so_mpi_handle* out);
  /* The communicator of comm's ranks `ranks` (in that order), collective over those ranks only
   * (MPI_Comm_create_group; tag tells apart creations that run at once). */
  int (*comm_create_group)(so_mpi_handle comm, const int* ranks, int nranks, int tag,
                           so_mpi_handle* out);

  /* Blocking collectives (set-up and agreement only); send NULL: in place. */
  int (*allreduce)(const void* send, void* recv, int count, int type, int op, so_mpi_handle comm);
  int (*allgather)(const void* send, int count, int type, void* recv, so_mpi_handle comm);
  int (*bcast)(void* buf, int count, int type, int root, so_mpi_handle comm);

  /* Nonblocking, completed by test or wait; iallreduce's send NULL: in place. */
  int (*iallreduce)(const void* send, void* recv, int count, int type, int op, so_mpi_handle comm,
                    so_mpi_handle* request);
  int (*iallgatherv)(const void* send, int bytes, void* recv, const int* recv_bytes,
                     const int* displs, so_mpi_handle comm, so_mpi_handle* request);
  int (*ibcast)(void* buf, int bytes, int root, so_mpi_handle comm, so_mpi_handle* request);
  int (*ialltoallv)(const void* send, const int* send_bytes, const int* send_displs, void* recv,
                    const int* recv_bytes, const int* recv_displs, so_mpi_handle comm,
                    so_mpi_handle* request);
  int (*ireduce_scatter)(const void* send, void* recv, const int* counts, int type, int op,
                         so_mpi_handle comm, so_mpi_handle* request);
  int (*isend)(const void* buf, int bytes, int dest, int tag, so_mpi_handle comm,
               so_mpi_handle* request);
  int (*irecv)(void* buf, int bytes, int source, int tag, so_mpi_handle comm,
               so_mpi_handle* request);
  int (*test)(so_mpi_handle* request, int* done);
  int (*wait)(so_mpi_handle* request);
  /* source < 0: any. On a message: *flag 1, its source and its size in bytes. */
  int (*iprobe)(int source, int tag, so_mpi_handle comm, int* flag, int* source_out, int* bytes);
  int (*recv)(void* buf, int bytes, int source, int tag, so_mpi_handle comm);
} so_mpi_api;

/* What every shim exports. */
const so_mpi_api* so_mpi_api_get(void);

#ifdef __cplusplus
}
#endif

#endif /* SCALEOUT_MPI_SO_MPI_H_ */
