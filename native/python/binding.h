/*
 * scaleout._binding's shared declarations. The module is several C files compiled into one
 * extension (setup.py lists them), each one part of the binding:
 *   binding.c             loading the core, errors, the tables of codes, the module itself
 *   binding_runtime.c     lifecycle and introspection: init, shutdown, topology, process sets, ...
 *   binding_names.c       collective names, given or generated
 *   binding_handle.c      the Handle and ResultBuffer types, handles dropped while pending
 *   binding_args.c        argument decoding and the tensor protocol
 *   binding_submit.c      submit (Note [Request record])
 *   binding_completion.c  waiting, results, synchronize, poll
 * Only the module's init function is exported: everything declared here is hidden.
 */
#ifndef SCALEOUT_PYTHON_BINDING_H_
#define SCALEOUT_PYTHON_BINDING_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "c_api/scaleout.h"

#pragma GCC visibility push(hidden)

/* ---- the C ABI, resolved by load() (binding.c) ----
 * The function pointers are typed from the header's own prototypes (__typeof__), so a change of
 * a signature that is not made here too fails to compile. */
/* clang-format off */
#define SO_FUNCTIONS(X)                                                                         \
  X(so_abi_version) X(so_version) X(so_build_info) X(so_last_error) X(so_last_error_details)    \
  X(so_init) X(so_shutdown) X(so_is_initialized) X(so_topology) X(so_config_string)             \
  X(so_enqueue) X(so_allreduce_now) X(so_poll) X(so_wait) X(so_result_shape) X(so_result_take)  \
  X(so_buffer_free) X(so_result_splits) X(so_result_join_rank) X(so_release) X(so_timeline) X(so_stats)           \
  X(so_traffic) X(so_algorithms) X(so_peer_died) X(so_add_process_set) X(so_add_member_process_set) X(so_remove_process_set) \
  X(so_process_set) X(so_use_mpi)
/* clang-format on */

#define SO_POINTER_(fn) __typeof__(&fn) fn;
struct so_api {
  SO_FUNCTIONS(SO_POINTER_)
};
#undef SO_POINTER_
extern struct so_api api;
extern int api_loaded;

/* ---- errors (binding.c): every exception is made by scaleout._errors.from_core ---- */
/* Before the core is loaded nothing can have been initialized: 0 with NotInitializedError. */
int require_loaded(void);
/* The error of this thread's last failing call into the core (status rc), with its message and
 * details (Note [Error details]). NULL, for `return raise_status(rc);`. */
PyObject* raise_status(int rc);
/* InvalidArgumentError with a PyUnicode_FromFormat message. NULL. */
PyObject* raise_invalid(const char* format, ...);

/* ---- arguments (binding_args.c) ---- */
/* An integer (anything with __index__) fitting a C int, else InvalidArgumentError naming `what`:
 * 1, or 0 with the error set. */
int as_int(PyObject* o, const char* what, int* out);
/* A real number, else InvalidArgumentError naming `what`: 1, or 0 with the error set. */
int as_double(PyObject* o, const char* what, double* out);
/* The core's dtype code for a buffer's struct format, or -1. */
int format_dtype(const Py_buffer* b);
/* PyObject_GetBuffer whose every failure is a BufferError. */
int get_buffer(PyObject* obj, Py_buffer* view, int flags);
/* The tensor protocol (register_tensor_type). */
int is_tensor(PyObject* obj);
void* tensor_address(PyObject* t);
int describe_tensor(PyObject* t, void** ptr, int* dtype, int64_t* shape, int* ndim);
int args_init(void); /* at module init */

/* ---- names (binding_names.c) ---- */
/* The name given (checked), or the next generated "<kind>.noname.<n>" of the process set. */
PyObject* name_or_auto(int collective, PyObject* name, int process_set);

/* ---- handles (binding_handle.c) ---- */
typedef struct {
  PyObject_HEAD
  long long id; /* the core's handle; 0 for a group */
  int collective;
  int dtype;
  PyObject* name;
  PyObject* keep;   /* what the core reads or writes until completion (a tuple) */
  PyObject* output; /* allreduce/broadcast: the result object; allgather/alltoall/reducescatter:
                       alloc(shape) -> (object, address or None); a group: its member handles */
  PyObject* finish; /* None, or finish(result) -> what synchronize returns */
  PyObject* result;
  char done;
} HandleObject;
extern PyTypeObject HandleType;

/* A core-owned result's bytes (so_result_take), lent through the buffer protocol. */
typedef struct {
  PyObject_HEAD
  void* data;
  Py_ssize_t nbytes;
  void* owner; /* so_buffer_free's argument */
} ResultBufferObject;
extern PyTypeObject ResultBufferType;

extern PyObject* orphans; /* list of (id, keep, output): handles dropped while pending */
/* Whether the core owns the collective's result (its shape is known only at completion). */
int owns_result(int collective);
HandleObject* new_handle(long long id, int collective, int dtype, PyObject* name, PyObject* keep,
                         PyObject* output, PyObject* finish);
/* Releases the orphans that have completed. */
void sweep_orphans(void);

/* ---- submit (binding_submit.c) ---- */
int submit_init(void); /* at module init */

/* ---- each file's methods, added to the module at init ---- */
extern PyMethodDef* const runtime_methods;
extern PyMethodDef* const names_methods;
extern PyMethodDef* const handle_methods;
extern PyMethodDef* const args_methods;
/* synchronize(handle) of binding_completion.c, for the binding's own calls. */
PyObject* synchronize_handle(PyObject* handle);
extern PyMethodDef* const submit_methods;
extern PyMethodDef* const completion_methods;

#pragma GCC visibility pop

#endif /* SCALEOUT_PYTHON_BINDING_H_ */
