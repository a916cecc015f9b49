/*
 * scaleout._binding: the one Python binding of the C ABI (native/c_api/scaleout.h).
 *
 * Every call from Python into the core goes through this module: loading the core, init and
 * shutdown, the tables of codes, submitting a collective, the Handle type, waiting, results and
 * errors. Nothing else binds the ABI (no ctypes declarations, no second table of signatures): the
 * function pointers below are typed from the header's own prototypes (__typeof__), so a change
 * of a signature that is not made here too fails to compile.
 *
 * Why a CPython extension: ctypes costs several microseconds per call in argument conversion, and
 * a training step submits hundreds of collectives.
 *
 * Loading: importing this module loads neither the core nor MPI (importing scaleout must not
 * start MPI). scaleout._core imports mpi4py first (so the core binds to the MPI library mpi4py
 * loaded), then calls load(path), which dlopens the core and resolves its entry points.
 *
 * Errors: a failed call raises the ScaleoutError subclass registered for its status
 * (register_errors(), once at import of scaleout), with the core's message. No status integer
 * reaches Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <structmember.h>
#include <unistd.h>

#include "c_api/scaleout.h"

/* ---- the C ABI, resolved by load() ---- */

#define SO_FUNCTIONS(X)                                                                         \
  X(so_abi_version) X(so_version) X(so_build_info) X(so_last_error) X(so_last_error_details) X(so_init) X(so_shutdown)   \
  X(so_is_initialized) X(so_topology) X(so_config_string) X(so_enqueue) X(so_poll) X(so_wait)   \
  X(so_result_shape) X(so_result_take) X(so_buffer_free) X(so_result_splits)                   \
  X(so_result_join_rank) X(so_release) X(so_timeline) X(so_stats) X(so_traffic) X(so_algorithms) X(so_peer_died) X(so_add_process_set) X(so_remove_process_set)   \
  X(so_process_set) X(so_process_set_ids)

#define SO_POINTER_(fn) __typeof__(&fn) fn;
static struct { SO_FUNCTIONS(SO_POINTER_) } api;
#undef SO_POINTER_
static int api_loaded = 0;

/* scaleout._errors.from_core(status name, message, culprit ranks, process set id) -> the
 * exception to raise: every error this module raises is made by it (register_errors). */
static PyObject* error_factory = NULL;
static const char* const status_names[SO_STATUS_COUNT] = {
    [SO_OK] = "OK",
#define SO_STATUS_NAME_(NAME, code) [code] = #NAME,
    SO_ERROR_TABLE(SO_STATUS_NAME_)
#undef SO_STATUS_NAME_
};
static PyObject* orphans = NULL;  /* list of (id, keep, output): handles dropped while pending */
static int as_int(PyObject* o, const char* what, int* out);
static long long name_counters[SO_COLLECTIVE_COUNT];
static PyObject* set_name_counters; /* {(process set, collective): next n} for sets other than 0 */

static const char* const collective_names[SO_COLLECTIVE_COUNT] = {
#define SO_NAME_(ENUM, name, code) [code] = #name,
    SO_COLLECTIVE_TABLE(SO_NAME_)
#undef SO_NAME_
};

/* Sets the exception from_core makes of a status (culprits: `nculprits` ranks; process_set
 * -1 for none). Returns NULL for `return raise_error(...);`. */
static PyObject* raise_error(int code, PyObject* message, const int32_t* culprits, int nculprits,
                             int32_t process_set) {
  const char* name = code > 0 && code < SO_STATUS_COUNT ? status_names[code] : "UNKNOWN";
  if (error_factory == NULL) {  /* only before scaleout's import registered it */
    PyErr_SetObject(code == SO_ERR_INVALID_ARGUMENT ? PyExc_ValueError : PyExc_RuntimeError, message);
    return NULL;
  }
  PyObject* ranks = PyTuple_New(nculprits);
  if (ranks == NULL) return NULL;
  for (int i = 0; i < nculprits; ++i) {
    PyObject* r = PyLong_FromLong(culprits[i]);
    if (r == NULL) {
      Py_DECREF(ranks);
      return NULL;
    }
    PyTuple_SET_ITEM(ranks, i, r);
  }
  PyObject* set_id = process_set >= 0 ? PyLong_FromLong(process_set) : Py_NewRef(Py_None);
  PyObject* exc = set_id == NULL ? NULL
                                 : PyObject_CallFunction(error_factory, "sOOO", name, message, ranks, set_id);
  Py_DECREF(ranks);
  Py_XDECREF(set_id);
  if (exc == NULL) return NULL;  /* from_core's own failure is raised instead */
  PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

/* An error of the binding's own (no details), with a printf-style message. */
static PyObject* raise_code(int code, const char* format, ...) {
  va_list va;
  va_start(va, format);
  PyObject* text = PyUnicode_FromFormatV(format, va);
  va_end(va);
  if (text == NULL) return NULL;
  raise_error(code, text, NULL, 0, -1);
  Py_DECREF(text);
  return NULL;
}

/* Before the core is loaded nothing can have been initialized: NotInitializedError. */
static int require_loaded(void) {
  if (!api_loaded) {
    raise_code(SO_ERR_NOT_INITIALIZED, "scaleout is not initialized: call init() first");
    return 0;
  }
  return 1;
}

/* Raises the error of this thread's last failing call into the core (status rc), with its
 * message and details. Returns NULL for `return raise_status(rc);`. */
static PyObject* raise_status(int rc) {
  const char* msg = api_loaded ? api.so_last_error() : "";
  PyObject* text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
  if (text == NULL) return NULL;
  int32_t few[64], count = 0, process_set = -1;
  int32_t* culprits = few;
  if (api_loaded) {
    api.so_last_error_details(few, 64, &count, &process_set);
    if (count > 64 && (culprits = PyMem_Malloc(sizeof(int32_t) * (size_t)count)) != NULL) {
      api.so_last_error_details(culprits, count, &count, &process_set);
    }
  }
  if (culprits == NULL) {
    Py_DECREF(text);
    return PyErr_NoMemory();
  }
  raise_error(rc, text, culprits, count, process_set);
  if (culprits != few) PyMem_Free(culprits);
  Py_DECREF(text);
  return NULL;
}

static PyObject* raise_invalid(const char* format, ...) {
  va_list va;
  va_start(va, format);
  PyObject* text = PyUnicode_FromFormatV(format, va);
  va_end(va);
  if (text == NULL) return NULL;
  raise_error(SO_ERR_INVALID_ARGUMENT, text, NULL, 0, -1);
  Py_DECREF(text);
  return NULL;
}

/* load(path) -> None: opens the core and resolves the ABI (OSError naming what failed). */
static PyObject* load(PyObject* self, PyObject* arg) {
  if (api_loaded) Py_RETURN_NONE;
  const char* path = PyUnicode_AsUTF8(arg);
  if (path == NULL) return NULL;
  void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) return PyErr_Format(PyExc_OSError, "%s", dlerror());
#define SO_RESOLVE_(fn)                                                                 \
  api.fn = (__typeof__(&fn))dlsym(lib, #fn);                                           \
  if (api.fn == NULL) return PyErr_Format(PyExc_OSError, "%s has no %s", path, #fn);
  SO_FUNCTIONS(SO_RESOLVE_)
#undef SO_RESOLVE_
  int abi = api.so_abi_version();
  if (abi != SCALEOUT_ABI_VERSION) {
    return PyErr_Format(PyExc_OSError, "native core ABI %d does not match the binding's %d; "
                        "reinstall scaleout", abi, SCALEOUT_ABI_VERSION);
  }
  api_loaded = 1;
  Py_RETURN_NONE;
}

/* register_errors(from_core): the factory that makes every exception this module raises. */
static PyObject* register_errors(PyObject* self, PyObject* factory) {
  if (!PyCallable_Check(factory)) return PyErr_Format(PyExc_TypeError, "register_errors takes a callable");
  Py_XSETREF(error_factory, Py_NewRef(factory));
  Py_RETURN_NONE;
}

/* ---- lifecycle and introspection ---- */

/* Note [Liveness]: after a peer rank died, MPI_Finalize (mpi4py's, at exit) would wait for it
 * forever. Registered after mpi4py's own exit function, so it runs first, after the interpreter
 * has finished (exit handlers run, shutdown() done, output flushed): the process leaves with
 * status 1 without finalizing MPI. */
static void leave_without_finalize(void) {
  if (!api_loaded || !api.so_peer_died()) return;
  fputs("scaleout: a peer rank died, so MPI cannot be finalized (MPI_Finalize would wait for "
        "it forever): leaving without it, exit status 1\n", stderr);
  fflush(NULL);
  _exit(1);
}

static PyObject* init(PyObject* self, PyObject* arg) {
  static int exit_hook = 0;
  if (!require_loaded()) return NULL;
  if (!exit_hook && Py_AtExit(leave_without_finalize) == 0) exit_hook = 1;
  int has_comm = arg != Py_None;
  long long comm = has_comm ? PyLong_AsLongLong(arg) : 0;
  if (comm == -1 && PyErr_Occurred()) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = api.so_init(has_comm, comm);
  Py_END_ALLOW_THREADS
  if (rc != 0) return raise_status(rc);
  Py_RETURN_NONE;
}

static PyObject* shutdown(PyObject* self, PyObject* unused) {
  if (!api_loaded) Py_RETURN_NONE;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = api.so_shutdown();
  Py_END_ALLOW_THREADS
  if (rc != 0) return raise_status(rc);
  Py_RETURN_NONE;
}

static PyObject* is_initialized(PyObject* self, PyObject* unused) {
  return PyBool_FromLong(api_loaded && api.so_is_initialized());
}

static PyObject* topology(PyObject* self, PyObject* unused) {
  if (!require_loaded()) return NULL;
  int32_t t[6];
  int rc = api.so_topology(t);
  if (rc != 0) return raise_status(rc);
  return Py_BuildValue("(iiiiii)", t[0], t[1], t[2], t[3], t[4], t[5]);
}

static PyObject* text_of(const char* (*fn)(void)) {
  if (!require_loaded()) return NULL;
  const char* s = fn();
  return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}
/* stats() -> (handles registered, names in flight) */
static PyObject* stats(PyObject* self, PyObject* unused) {
  if (!require_loaded()) return NULL;
  int64_t out[2] = {0, 0};
  int rc = api.so_stats(out);
  if (rc != 0) return raise_status(rc);
  return Py_BuildValue("(LL)", (long long)out[0], (long long)out[1]);
}

/* traffic() -> one tuple of SO_TRAFFIC_COUNT counters per collective kind, in code order
 * (Note [Traffic]). */
static PyObject* traffic(PyObject* self, PyObject* unused) {
  if (!require_loaded()) return NULL;
  int64_t out[SO_COLLECTIVE_COUNT * SO_TRAFFIC_COUNT];
  int rc = api.so_traffic(out);
  if (rc != 0) return raise_status(rc);
  PyObject* kinds = PyTuple_New(SO_COLLECTIVE_COUNT);
  if (kinds == NULL) return NULL;
  for (int c = 0; c < SO_COLLECTIVE_COUNT; ++c) {
    PyObject* row = PyTuple_New(SO_TRAFFIC_COUNT);
    if (row == NULL) {
      Py_DECREF(kinds);
      return NULL;
    }
    for (int f = 0; f < SO_TRAFFIC_COUNT; ++f) {
      PyObject* v = PyLong_FromLongLong((long long)out[c * SO_TRAFFIC_COUNT + f]);
      if (v == NULL) {
        Py_DECREF(row);
        Py_DECREF(kinds);
        return NULL;
      }
      PyTuple_SET_ITEM(row, f, v);
    }
    PyTuple_SET_ITEM(kinds, c, row);
  }
  return kinds;
}

/* algorithms() -> {plan entry: algorithm}, names from the header's tables (Note [Algorithm
 * plan]): {"allreduce": "hierarchical", ...}. */
static PyObject* algorithms(PyObject* self, PyObject* unused) {
  static const char* const entries[SO_PLAN_COUNT] = {
#define SO_PLAN_NAME_(ENUM, name, code) [code] = #name,
      SO_PLAN_TABLE(SO_PLAN_NAME_)
#undef SO_PLAN_NAME_
  };
  static const char* const names[SO_ALGORITHM_COUNT] = {
#define SO_ALGORITHM_NAME_(ENUM, name, code) [code] = #name,
      SO_ALGORITHM_TABLE(SO_ALGORITHM_NAME_)
#undef SO_ALGORITHM_NAME_
  };
  if (!require_loaded()) return NULL;
  int32_t plan[SO_PLAN_COUNT];
  int rc = api.so_algorithms(plan);
  if (rc != 0) return raise_status(rc);
  PyObject* out = PyDict_New();
  for (int i = 0; out != NULL && i < SO_PLAN_COUNT; ++i) {
    const char* name = plan[i] >= 0 && plan[i] < SO_ALGORITHM_COUNT ? names[plan[i]] : "unknown";
    PyObject* v = PyUnicode_FromString(name);
    if (v == NULL || PyDict_SetItemString(out, entries[i], v) != 0) Py_CLEAR(out);
    Py_XDECREF(v);
  }
  return out;
}

/* add_process_set(ranks: sequence of int) -> id; collective over every rank (blocks). */
static PyObject* add_process_set(PyObject* self, PyObject* arg) {
  if (!require_loaded()) return NULL;
  PyObject* seq = PySequence_Fast(arg, "add_process_set takes a sequence of ranks");
  if (seq == NULL) return NULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int32_t* ranks = PyMem_Malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (ranks == NULL) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    int r;
    if (!as_int(PySequence_Fast_GET_ITEM(seq, i), "rank", &r)) {
      PyMem_Free(ranks);
      Py_DECREF(seq);
      return NULL;
    }
    ranks[i] = r;
  }
  Py_DECREF(seq);
  int32_t id = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = api.so_add_process_set(ranks, (int)n, &id);
  Py_END_ALLOW_THREADS
  PyMem_Free(ranks);
  if (rc != 0) return raise_status(rc);
  return PyLong_FromLong(id);
}

/* remove_process_set(id); collective over every rank (blocks). */
static PyObject* remove_process_set(PyObject* self, PyObject* arg) {
  if (!require_loaded()) return NULL;
  int id;
  if (!as_int(arg, "process_set_id", &id)) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = api.so_remove_process_set(id);
  Py_END_ALLOW_THREADS
  if (rc != 0) return raise_status(rc);
  Py_RETURN_NONE;
}

/* process_set(id) -> (this rank's place or -1, [the job's ranks]) */
static PyObject* process_set(PyObject* self, PyObject* arg) {
  if (!require_loaded()) return NULL;
  int id;
  if (!as_int(arg, "process_set_id", &id)) return NULL;
  int32_t rank = -1, size = 0;
  int rc = api.so_process_set(id, &rank, &size, NULL, 0);
  if (rc != 0) return raise_status(rc);
  int32_t* ranks = PyMem_Malloc(sizeof(int32_t) * (size_t)(size > 0 ? size : 1));
  if (ranks == NULL) return PyErr_NoMemory();
  rc = api.so_process_set(id, &rank, &size, ranks, size);
  PyObject* list = rc == 0 ? PyList_New(size) : NULL;
  for (int32_t i = 0; list != NULL && i < size; ++i) PyList_SET_ITEM(list, i, PyLong_FromLong(ranks[i]));
  PyMem_Free(ranks);
  if (rc != 0) return raise_status(rc);
  if (list == NULL) return NULL;
  return Py_BuildValue("(iN)", rank, list);
}

/* process_set_ids() -> [ids], 0 first */
static PyObject* process_set_ids(PyObject* self, PyObject* unused) {
  if (!require_loaded()) return NULL;
  int32_t ids[1024], count = 0;
  int rc = api.so_process_set_ids(ids, 1024, &count);
  if (rc != 0) return raise_status(rc);
  PyObject* list = PyList_New(0);
  for (int32_t i = 0; list != NULL && i < count && i < 1024; ++i) {
    PyObject* v = PyLong_FromLong(ids[i]);
    if (v == NULL || PyList_Append(list, v) != 0) Py_CLEAR(list);
    Py_XDECREF(v);
  }
  return list;
}

static PyObject* peer_died(PyObject* self, PyObject* unused) {
  return PyBool_FromLong(api_loaded && api.so_peer_died());
}

/* timeline(path or None, mark_cycles): starts or stops the timeline; blocks until done. */
static PyObject* timeline(PyObject* self, PyObject* args) {
  const char* path = NULL;
  int mark_cycles = 0;
  if (!PyArg_ParseTuple(args, "zp", &path, &mark_cycles)) return NULL;
  if (!require_loaded()) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = api.so_timeline(path, mark_cycles);
  Py_END_ALLOW_THREADS
  if (rc != 0) return raise_status(rc);
  Py_RETURN_NONE;
}

static PyObject* config_string(PyObject* self, PyObject* unused) { return text_of(api.so_config_string); }
static PyObject* version(PyObject* self, PyObject* unused) { return text_of(api.so_version); }
static PyObject* build_info(PyObject* self, PyObject* unused) { return text_of(api.so_build_info); }

/* ---- names ---- */

/* The name given (checked), or the next generated "<kind>.noname.<n>": ranks that call unnamed
 * collectives of one kind in the same order agree on their names. Counted per process set (names
 * are scoped per set), so that a rank's collectives on other sets do not shift the count. */
static PyObject* name_or_auto(int collective, PyObject* name, int process_set) {
  if (name != Py_None) {
    if (!PyUnicode_Check(name) || PyUnicode_GET_LENGTH(name) == 0) {
      return raise_invalid("name must be a non-empty string, not %R", name);
    }
    /* The core compares names as NUL-terminated UTF-8: a name it would cut short, or could not
     * encode, would meet another rank's different name as the same one. */
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(name, &size);
    if (utf8 == NULL) {
      PyErr_Clear();
      return raise_invalid("name %R cannot be encoded as UTF-8 (a lone surrogate?)", name);
    }
    if ((Py_ssize_t)strlen(utf8) != size) {
      return raise_invalid("name %R contains a NUL character; names are compared up to the "
                           "first NUL, so it is refused", name);
    }
    Py_INCREF(name);
    return name;
  }
  if (collective < 0 || collective >= SO_COLLECTIVE_COUNT) {
    return raise_invalid("unknown collective %d", collective);
  }
  long long n;
  if (process_set == 0) {
    n = name_counters[collective]++;
  } else {
    if (set_name_counters == NULL && (set_name_counters = PyDict_New()) == NULL) return NULL;
    PyObject* key = Py_BuildValue("(ii)", process_set, collective);
    if (key == NULL) return NULL;
    PyObject* seen = PyDict_GetItemWithError(set_name_counters, key);
    n = seen != NULL ? PyLong_AsLongLong(seen) : 0;
    PyObject* next = PyLong_FromLongLong(n + 1);
    const int failed = (seen == NULL && PyErr_Occurred()) || next == NULL ||
                       PyDict_SetItem(set_name_counters, key, next) != 0;
    Py_DECREF(key);
    Py_XDECREF(next);
    if (failed) return NULL;
  }
  return PyUnicode_FromFormat("%s.noname.%lld", collective_names[collective], n);
}

/* auto_name(collective, name or None[, process_set]) -> name */
static PyObject* auto_name(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 && nargs != 3) return PyErr_Format(PyExc_TypeError, "auto_name takes 2 or 3 arguments");
  int collective = (int)PyLong_AsLong(args[0]);
  if (collective == -1 && PyErr_Occurred()) return NULL;
  int process_set = 0;
  if (nargs == 3 && !as_int(args[2], "process_set", &process_set)) return NULL;
  return name_or_auto(collective, args[1], process_set);
}

/* ---- Handle ---- */

typedef struct {
  PyObject_HEAD
  long long id;       /* the core's handle; 0 for a group */
  int collective;
  int dtype;
  PyObject* name;
  PyObject* keep;     /* what the core reads or writes until completion (a tuple) */
  PyObject* output;   /* allreduce/broadcast: the result object; allgather/alltoall/reducescatter:
                         alloc(shape) -> (object, address or None); a group: its member handles */
  PyObject* finish;   /* None, or finish(result) -> what synchronize returns */
  PyObject* result;
  char done;
} HandleObject;

static PyTypeObject HandleType;

static int owns_result(int collective) {
  return collective == SO_ALLGATHER || collective == SO_ALLTOALL ||
         collective == SO_REDUCESCATTER || collective == SO_JOIN;
}

/* A handle dropped before completion: the collective still runs on every rank and uses the
 * buffers, so they stay alive (and the core's handle unreleased) until it completes; the next
 * submit sweeps them. Handles hold no reference cycles (finish functions reference buffers,
 * never handles), so the type does without the cyclic collector. */
static void Handle_dealloc(HandleObject* self) {
  if (!self->done && self->id != 0 && orphans != NULL) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    /* the input (keep) and where the core writes (output) */
    PyObject* entry = Py_BuildValue("(LOO)", self->id, self->keep ? self->keep : Py_None,
                                    self->output ? self->output : Py_None);
    if (entry == NULL || PyList_Append(orphans, entry) != 0) PyErr_Clear();
    Py_XDECREF(entry);
    PyErr_Restore(type, value, traceback);
  }
  Py_XDECREF(self->name);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->output);
  Py_XDECREF(self->finish);
  Py_XDECREF(self->result);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* Handle_repr(HandleObject* self) {
  return PyUnicode_FromFormat("<scaleout.Handle %R %s>", self->name ? self->name : Py_None,
                              self->done ? "done" : "pending");
}

static PyMemberDef Handle_members[] = {
    {"name", T_OBJECT, offsetof(HandleObject, name), READONLY, "the collective's name"},
    {"_id", T_LONGLONG, offsetof(HandleObject, id), READONLY, NULL},
    {"_done", T_BOOL, offsetof(HandleObject, done), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scaleout.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_repr = (reprfunc)Handle_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pending collective. Pass it to poll() or synchronize().",
    .tp_members = Handle_members,
};

/* A core-owned result's bytes (so_result_take), lent through the buffer protocol to the object
 * the handle's allocator makes (a numpy array or a torch tensor viewing them), which keeps this
 * alive: the result reaches the caller without a copy. Freed by the core when released. */
typedef struct {
  PyObject_HEAD
  void* data;
  Py_ssize_t nbytes;
  void* owner; /* so_buffer_free's argument */
} ResultBufferObject;

static int ResultBuffer_getbuffer(ResultBufferObject* self, Py_buffer* view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject*)self, self->data, self->nbytes, 0, flags);
}

static void ResultBuffer_dealloc(ResultBufferObject* self) {
  if (self->owner != NULL && api_loaded) api.so_buffer_free(self->owner);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyBufferProcs ResultBuffer_as_buffer = {
    .bf_getbuffer = (getbufferproc)ResultBuffer_getbuffer,
};

static PyTypeObject ResultBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "scaleout.ResultBuffer",
    .tp_basicsize = sizeof(ResultBufferObject),
    .tp_dealloc = (destructor)ResultBuffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The bytes of a collective's result, owned by the core until this is freed.",
    .tp_as_buffer = &ResultBuffer_as_buffer,
};

static HandleObject* new_handle(long long id, int collective, int dtype, PyObject* name,
                                PyObject* keep, PyObject* output, PyObject* finish) {
  HandleObject* h = PyObject_New(HandleObject, &HandleType);
  if (h == NULL) return NULL;
  h->id = id;
  h->collective = collective;
  h->dtype = dtype;
  Py_INCREF(name);
  h->name = name;
  Py_XINCREF(keep);
  h->keep = keep;
  Py_INCREF(output);
  h->output = output;
  Py_INCREF(finish);
  h->finish = finish;
  h->result = NULL;
  h->done = 0;
  return h;
}

static void sweep_orphans(void) {
  /* Handles dropped by other threads meanwhile are appended at the end: take only the entries
   * there now. Done, failed or stale ones are released and dropped. */
  Py_ssize_t n = PyList_GET_SIZE(orphans);
  PyObject* still = PyList_New(0);
  if (still == NULL) {
    PyErr_Clear();
    return;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* entry = PyList_GET_ITEM(orphans, i);
    long long id = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 0));
    int done = 0;
    if (api.so_poll(id, &done) != 0 || done) {
      api.so_release(id);
    } else {
      PyList_Append(still, entry);
    }
  }
  PyList_SetSlice(orphans, 0, n, still);
  Py_DECREF(still);
  PyErr_Clear();
}

/* ---- submit ---- */

/* The core's dtype code for a buffer's struct format, or -1 (numpy's native formats). */
static int format_dtype(const Py_buffer* b) {
  const char* f = b->format;
  if (f == NULL) return SO_UINT8;
  if (*f == '@' || *f == '=' || *f == '<') ++f;
  if (f[0] == '\0' || f[1] != '\0') return -1;
  switch (f[0]) {
    case 'B': return SO_UINT8;
    case 'b': return SO_INT8;
    case 'h': return b->itemsize == 2 ? SO_INT16 : -1;
    case 'H': return b->itemsize == 2 ? SO_UINT16 : -1;
    case 'i': case 'l': case 'q':
      return b->itemsize == 4 ? SO_INT32 : b->itemsize == 8 ? SO_INT64 : -1;
    case 'e': return SO_FLOAT16;
    case 'f': return b->itemsize == 4 ? SO_FLOAT32 : -1;
    case 'd': return b->itemsize == 8 ? SO_FLOAT64 : -1;
    case '?': return b->itemsize == 1 ? SO_BOOL : -1;
    default: return -1;
  }
}

/* PyObject_GetBuffer whose every failure is a BufferError (numpy raises ValueError for a
 * read-only array asked to be writable): callers catch BufferError alone to take their general
 * path, which explains the problem. */
static int get_buffer(PyObject* obj, Py_buffer* view, int flags) {
  if (PyObject_GetBuffer(obj, view, flags) == 0) return 0;
  if (!PyErr_ExceptionMatches(PyExc_BufferError)) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_Format(PyExc_BufferError, "%S", value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
  return -1;
}

/* An integer argument (int, numpy integer: anything with __index__) that fits a C int; anything
 * else, floats and strings included, is an InvalidArgumentError naming the argument. */
static int as_int(PyObject* o, const char* what, int* out) {
  PyObject* index = PyNumber_Index(o);
  if (index == NULL) {
    PyErr_Clear();
    raise_invalid("%s must be an integer, not %R", what, o);
    return 0;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (v == -1 && PyErr_Occurred()) return 0;
  if (overflow != 0 || v < INT_MIN || v > INT_MAX) {
    raise_invalid("%s %R is out of range", what, o);
    return 0;
  }
  *out = (int)v;
  return 1;
}

/* A real-number argument (int, float, numpy scalar), else an InvalidArgumentError naming it. */
static int as_double(PyObject* o, const char* what, double* out) {
  if (!PyNumber_Check(o)) {  /* floats and ints are numbers too */
    raise_invalid("%s must be a real number, not %R", what, o);
    return 0;
  }
  double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_invalid("%s must be a real number, not %R", what, o);
    return 0;
  }
  *out = v;
  return 1;
}

/* ---- tensors described by their attributes (torch.Tensor) ----
 *
 * A framework whose tensors have no buffer protocol registers its tensor class here, with its
 * dtype objects' codes and its strided-layout object (scaleout.torch does, at import). submit
 * then reads such a tensor's dtype, device, layout, contiguity, address and shape itself: the
 * same attribute reads the shim would make, without a Python frame around each (a training step
 * submits one collective per parameter). No framework header is involved. */
static PyTypeObject* tensor_type = NULL;
static PyObject* tensor_dtypes = NULL; /* {dtype object: core code} */
static PyObject* tensor_strided = NULL;
static PyObject *s_dtype, *s_is_cpu, *s_layout, *s_is_contiguous, *s_data_ptr, *s_shape;

/* register_tensor_type(cls, {dtype: code}, strided_layout) */
static PyObject* register_tensor_type(PyObject* self, PyObject* args) {
  PyObject *cls, *dtypes, *strided;
  if (!PyArg_ParseTuple(args, "O!O!O", &PyType_Type, &cls, &PyDict_Type, &dtypes, &strided)) return NULL;
  Py_INCREF(cls);
  Py_XSETREF(tensor_type, (PyTypeObject*)cls);
  Py_INCREF(dtypes);
  Py_XSETREF(tensor_dtypes, dtypes);
  Py_INCREF(strided);
  Py_XSETREF(tensor_strided, strided);
  Py_RETURN_NONE;
}

static int is_tensor(PyObject* obj) {
  return tensor_type != NULL && PyObject_TypeCheck(obj, tensor_type);
}

/* True, False, or -1 with an exception: obj.attr, or obj.attr() when call. */
static int attr_is(PyObject* obj, PyObject* attr, int call, PyObject* expected) {
  PyObject* v = call ? PyObject_CallMethodNoArgs(obj, attr) : PyObject_GetAttr(obj, attr);
  if (v == NULL) return -1;
  int same = v == expected;
  Py_DECREF(v);
  return same;
}

static void* tensor_address(PyObject* t) {
  PyObject* p = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (p == NULL) return NULL;
  void* ptr = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  return ptr;
}

/* A registered tensor's memory, as the core takes it: 0, or -1 with BufferError when it is not
 * a contiguous CPU tensor of strided layout and a core dtype (callers then take their general
 * path, which explains why), or another error from the framework. */
static int describe_tensor(PyObject* t, void** ptr, int* dtype, int64_t* shape, int* ndim) {
  PyObject* dt = PyObject_GetAttr(t, s_dtype);
  if (dt == NULL) return -1;
  PyObject* code = PyDict_GetItemWithError(tensor_dtypes, dt); /* borrowed */
  Py_DECREF(dt);
  if (code == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_BufferError, "tensor dtype has no scaleout code");
    return -1;
  }
  *dtype = (int)PyLong_AsLong(code);
  int ok = attr_is(t, s_is_cpu, 0, Py_True);
  if (ok == 1) ok = attr_is(t, s_layout, 0, tensor_strided);
  if (ok == 1) ok = attr_is(t, s_is_contiguous, 1, Py_True);
  if (ok != 1) {
    if (ok == 0) PyErr_SetString(PyExc_BufferError, "not a contiguous CPU tensor of strided layout");
    return -1;
  }
  *ptr = tensor_address(t);
  if (*ptr == NULL && PyErr_Occurred()) return -1;
  PyObject* s = PyObject_GetAttr(t, s_shape);
  if (s == NULL) return -1;
  int rc = -1;
  if (!PyTuple_Check(s)) {
    PyErr_SetString(PyExc_TypeError, "a tensor's shape must be a tuple");
  } else if (PyTuple_GET_SIZE(s) > SO_MAX_NDIM) {
    raise_invalid("tensors have at most %d dimensions, not %zd", SO_MAX_NDIM, PyTuple_GET_SIZE(s));
  } else {
    *ndim = (int)PyTuple_GET_SIZE(s);
    for (int i = 0; i < *ndim; ++i) shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(s, i));
    rc = PyErr_Occurred() ? -1 : 0;
  }
  Py_DECREF(s);
  return rc;
}

/*
 * submit(collective, name, data, address, dtype, shape, output, out_address, op, root,
 *        prescale, postscale, splits, finish, process_set) -> Handle
 *
 * Every argument may be given by keyword (Note [Request record]); those not given take the
 * defaults listed at SUBMIT_ARGS.
 * data: the input's owner, kept alive until completion. When address is None, data is read
 *   as a registered tensor (register_tensor_type) or through the buffer protocol (C-contiguous),
 *   and dtype and shape (when None) come from it; a tensor or buffer that the core cannot take
 *   as it is raises BufferError (the caller then passes the address, dtype and shape itself, or
 *   explains). Otherwise address is the input's first byte and dtype (a code) and shape (a
 *   tuple) describe it.
 * output: for allreduce and broadcast, the result object (may be data itself: in place), at
 *   out_address, or when out_address is None at a registered tensor's data_ptr() or through the
 *   buffer protocol. For allgather,
 *   alltoall and reducescatter, whose result shape is known only at completion, an allocator
 *   alloc(shape, buffer) -> object, called at completion with the result's bytes (a writable
 *   buffer of the core's, not copied): the object views them and keeps the buffer alive (or
 *   copies them). None for barrier and join.
 * splits: alltoall's rows per destination rank, a C-contiguous int64 buffer, or None.
 * finish: None or a callable applied to the result at completion (alltoall's result is
 *   (received, received_splits as a list); join's the last rank to join; barrier's None).
 * name None generates one (auto_name).
 */
/* submit's arguments in positional order; only collective has no default (Note [Request
 * record]): name, data, address, dtype, shape, output, out_address, splits and finish None, op
 * Average, root 0, prescale and postscale 1.0, process_set 0. */
#define SUBMIT_ARGS(X)                                                                          \
  X(collective) X(name) X(data) X(address) X(dtype) X(shape) X(output) X(out_address) X(op)      \
  X(root) X(prescale) X(postscale) X(splits) X(finish) X(process_set)
enum {
#define SO_ARG_INDEX_(n) ARG_##n,
  SUBMIT_ARGS(SO_ARG_INDEX_)
#undef SO_ARG_INDEX_
  SUBMIT_NARGS
};
static PyObject* submit_keywords[SUBMIT_NARGS]; /* interned names, made at module init */

/* Puts submit's positional and keyword arguments in order into a[] (NULL: not given), without
 * allocating: keywords are matched by identity first (callers' names are interned), then by
 * value. */
static int submit_parse(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** a) {
  if (nargs > SUBMIT_NARGS) {
    PyErr_Format(PyExc_TypeError, "submit takes at most %d arguments, got %zd", SUBMIT_NARGS, nargs);
    return -1;
  }
  for (int i = 0; i < SUBMIT_NARGS; ++i) a[i] = i < nargs ? args[i] : NULL;
  const Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int found = -1;
    for (int i = 0; i < SUBMIT_NARGS && found < 0; ++i) {
      if (key == submit_keywords[i]) found = i;
    }
    for (int i = 0; i < SUBMIT_NARGS && found < 0; ++i) {
      if (PyUnicode_Compare(key, submit_keywords[i]) == 0) found = i;
    }
    if (found < 0) {
      PyErr_Format(PyExc_TypeError, "submit() got an unexpected keyword argument %R", key);
      return -1;
    }
    if (a[found] != NULL) {
      PyErr_Format(PyExc_TypeError, "submit() got multiple values for argument %R", key);
      return -1;
    }
    a[found] = args[nargs + k];
  }
  if (a[ARG_collective] == NULL) {
    PyErr_SetString(PyExc_TypeError, "submit() missing required argument 'collective'");
    return -1;
  }
  return 0;
}

static PyObject* submit(PyObject* self, PyObject* const* argv, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* args[SUBMIT_NARGS];
  if (submit_parse(argv, nargs, kwnames, args) != 0) return NULL;
  if (!require_loaded()) return NULL;
  /* Numbers not given take their defaults; given, they must be numbers (None too is refused). */
  int collective, dtype = -1, op = SO_AVERAGE, root = 0, process_set = 0;
  double pre = 1.0, post = 1.0;
  if (!as_int(args[ARG_collective], "collective", &collective) ||
      (args[ARG_op] && !as_int(args[ARG_op], "op", &op)) ||
      (args[ARG_root] && !as_int(args[ARG_root], "root_rank", &root)) ||
      (args[ARG_prescale] && !as_double(args[ARG_prescale], "prescale_factor", &pre)) ||
      (args[ARG_postscale] && !as_double(args[ARG_postscale], "postscale_factor", &post)) ||
      (args[ARG_process_set] && !as_int(args[ARG_process_set], "process_set", &process_set))) {
    return NULL;
  }
  for (int i = 0; i < SUBMIT_NARGS; ++i) {
    if (args[i] == NULL) args[i] = Py_None;
  }
  PyObject *data = args[ARG_data], *address = args[ARG_address], *output = args[ARG_output];
  PyObject *out_address = args[ARG_out_address], *splits_obj = args[ARG_splits];
  PyObject *finish = args[ARG_finish];
  if (PyList_GET_SIZE(orphans) != 0) sweep_orphans();

  Py_buffer in = {0}, out = {0}, sp = {0};
  int have_in = 0, have_out = 0, have_sp = 0, described = 0;
  PyObject* result = NULL;
  PyObject* name = NULL;
  int64_t shape[SO_MAX_NDIM];
  int ndim = 0;
  const void* in_ptr = NULL;
  void* out_ptr = NULL;

  if (address == Py_None && is_tensor(data)) {
    void* p = NULL;
    if (describe_tensor(data, &p, &dtype, shape, &ndim) != 0) goto done;
    in_ptr = p;
    described = 1;
  } else if (address == Py_None) {
    const int writable = output == data && (collective == SO_ALLREDUCE || collective == SO_BROADCAST);
    if (get_buffer(data, &in, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) != 0) {
      goto done;
    }
    have_in = 1;
    in_ptr = in.buf;
    dtype = format_dtype(&in);
    if (dtype < 0) {
      PyErr_Format(PyExc_BufferError, "buffer format '%s' has no scaleout dtype", in.format);
      goto done;
    }
    if (in.ndim > SO_MAX_NDIM) {
      raise_invalid("tensors have at most %d dimensions, not %d", SO_MAX_NDIM, in.ndim);
      goto done;
    }
    ndim = in.ndim;
    for (int i = 0; i < ndim; ++i) shape[i] = in.shape[i];
  } else {
    in_ptr = PyLong_AsVoidPtr(address);
    if (in_ptr == NULL && PyErr_Occurred()) goto done;
  }
  if (args[ARG_dtype] != Py_None && !as_int(args[ARG_dtype], "dtype", &dtype)) goto done;
  if (args[ARG_shape] != Py_None) {
    PyObject* shape_obj = args[ARG_shape];
    if (!PyTuple_Check(shape_obj)) {
      PyErr_SetString(PyExc_TypeError, "shape must be a tuple");
      goto done;
    }
    ndim = (int)PyTuple_GET_SIZE(shape_obj);
    if (ndim > SO_MAX_NDIM) {
      raise_invalid("tensors have at most %d dimensions, not %d", SO_MAX_NDIM, ndim);
      goto done;
    }
    for (int i = 0; i < ndim; ++i) shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape_obj, i));
    if (PyErr_Occurred()) goto done;
  }
  if (collective == SO_ALLREDUCE || collective == SO_BROADCAST) {
    if (out_address != Py_None) {
      out_ptr = PyLong_AsVoidPtr(out_address);
      if (out_ptr == NULL && PyErr_Occurred()) goto done;
    } else if (output == data && (have_in || described)) {
      /* in place (a buffer was taken writable, or a tensor described) */
      out_ptr = (void*)in_ptr;
    } else if (output != Py_None && is_tensor(output)) {
      out_ptr = tensor_address(output);
      if (out_ptr == NULL && PyErr_Occurred()) goto done;
    } else if (output != Py_None) {
      if (get_buffer(output, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) goto done;
      have_out = 1;
      out_ptr = out.buf;
      if (have_in && out.len != in.len) {
        raise_invalid("the output has %zd bytes, the input %zd", out.len, in.len);
        goto done;
      }
    }
  }
  const int64_t* splits = NULL;
  int nsplits = 0;
  if (splits_obj != Py_None) {
    if (get_buffer(splits_obj, &sp, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) goto done;
    have_sp = 1;
    if (sp.itemsize != 8 || format_dtype(&sp) != SO_INT64) {
      raise_invalid("splits must be int64");
      goto done;
    }
    splits = (const int64_t*)sp.buf;
    nsplits = (int)(sp.len / 8);
  }
  name = name_or_auto(collective, args[ARG_name], process_set);
  if (name == NULL) goto done;
  const char* name_utf8 = PyUnicode_AsUTF8(name);
  if (name_utf8 == NULL) goto done;
  int64_t id = 0;
  const so_request request = {
      .struct_size = sizeof(so_request), .collective = collective, .name = name_utf8,
      .dtype = dtype, .ndim = ndim, .shape = shape, .input = in_ptr, .output = out_ptr,
      .reduce_op = op, .root_rank = root, .prescale_factor = pre, .postscale_factor = post,
      .splits = splits, .nsplits = nsplits, .process_set = process_set};
  int rc = api.so_enqueue(&request, &id);
  if (rc != 0) {
    raise_status(rc);
    goto done;
  }
  PyObject* keep = PyTuple_Pack(2, data, splits_obj);
  if (keep == NULL) goto done;
  result = (PyObject*)new_handle(id, collective, dtype, name, keep, output, finish);
  Py_DECREF(keep);

done:
  Py_XDECREF(name);
  if (have_in) PyBuffer_Release(&in);
  if (have_out) PyBuffer_Release(&out);
  if (have_sp) PyBuffer_Release(&sp);
  return result;
}

/* group(handles, name) -> Handle: completes when every member has; its result is the list of
 * the members' results (wait_all). */
static PyObject* group(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "group takes 2 arguments");
  PyObject* members = PySequence_Tuple(args[0]);
  if (members == NULL) return NULL;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(members); ++i) {
    if (!PyObject_TypeCheck(PyTuple_GET_ITEM(members, i), &HandleType)) {
      Py_DECREF(members);
      return PyErr_Format(PyExc_TypeError, "group() takes scaleout Handles");
    }
  }
  PyObject* h = (PyObject*)new_handle(0, -1, -1, args[1], NULL, members, Py_None);
  Py_DECREF(members);
  return h;
}

/* ---- completion ---- */

/* Blocks without the GIL until the core's handle completes; releases it when asked and the wait
 * succeeded. The wait is cut into slices so that Ctrl-C (or any signal handler raising)
 * interrupts it: then -1 with the exception set and the handle still pending. */
static int wait_handle(long long handle, int release) {
  int rc;
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    rc = api.so_wait(handle, 0.25);
    if (rc == 0 && release) api.so_release(handle);
    Py_END_ALLOW_THREADS
    if (rc != SO_ERR_TIMEOUT) return rc;
    if (PyErr_CheckSignals() != 0) return -1;
  }
}

/* The result of a completed core-owned collective: the core's bytes, given to the handle's
 * allocator without a copy. */
static PyObject* take_result(HandleObject* h) {
  if (h->collective == SO_JOIN) {
    int32_t last = -1;
    int rc = api.so_result_join_rank(h->id, &last);
    return rc != 0 ? raise_status(rc) : PyLong_FromLong(last);
  }
  int ndim = 0;
  int64_t shape[SO_MAX_NDIM];
  int rc = api.so_result_shape(h->id, &ndim, shape);
  if (rc != 0) return raise_status(rc);
  PyObject* shape_obj = PyTuple_New(ndim);
  if (shape_obj == NULL) return NULL;
  for (int i = 0; i < ndim; ++i) PyTuple_SET_ITEM(shape_obj, i, PyLong_FromLongLong(shape[i]));
  ResultBufferObject* buffer = PyObject_New(ResultBufferObject, &ResultBufferType);
  if (buffer == NULL) {
    Py_DECREF(shape_obj);
    return NULL;
  }
  int64_t nbytes = 0;
  buffer->data = NULL;
  buffer->owner = NULL;
  rc = api.so_result_take(h->id, &buffer->data, &nbytes, &buffer->owner);
  buffer->nbytes = (Py_ssize_t)nbytes;
  PyObject* obj = rc != 0 ? raise_status(rc)
                          : PyObject_CallFunctionObjArgs(h->output, shape_obj, buffer, NULL);
  Py_DECREF(shape_obj);
  Py_DECREF(buffer);
  if (obj == NULL) return NULL;
  if (h->collective != SO_ALLTOALL) return obj;
  /* alltoall: (received, rows received from each rank of its process set) */
  int64_t splits[4096];
  int32_t count = 0;
  rc = api.so_result_splits(h->id, splits, (int)(sizeof splits / sizeof splits[0]), &count);
  if (rc != 0) {
    Py_DECREF(obj);
    return raise_status(rc);
  }
  PyObject* list = PyList_New(count);
  if (list == NULL) {
    Py_DECREF(obj);
    return NULL;
  }
  for (int i = 0; i < count; ++i) PyList_SET_ITEM(list, i, PyLong_FromLongLong(splits[i]));
  PyObject* pair = PyTuple_Pack(2, obj, list);
  Py_DECREF(obj);
  Py_DECREF(list);
  return pair;
}

static PyObject* wait_all_tuple(PyObject* handles);

/* synchronize(handle) -> result: waits for the collective, raises its error (on every rank),
 * makes the result once, and frees the core's handle. An interrupted wait leaves the handle
 * pending; a second synchronize returns the same result (None for a failed one). */
static PyObject* synchronize(PyObject* self, PyObject* arg) {
  if (!PyObject_TypeCheck(arg, &HandleType)) {
    return raise_invalid("synchronize() takes a scaleout Handle, not %s", Py_TYPE(arg)->tp_name);
  }
  HandleObject* h = (HandleObject*)arg;
  if (h->done) {  /* a failed handle has no result: None */
    PyObject* done = h->result ? h->result : Py_None;
    Py_INCREF(done);
    return done;
  }
  PyObject* result = NULL;
  if (h->id == 0) {  /* a group */
    result = wait_all_tuple(h->output);
    if (result == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) return NULL;  /* interrupted */
  } else {
    if (!require_loaded()) return NULL;
    const int owned = owns_result(h->collective);
    int rc = wait_handle(h->id, !owned);
    if (rc < 0) return NULL;  /* interrupted: still pending */
    if (rc != 0) {
      raise_status(rc);
    } else if (owned) {
      result = take_result(h);
    } else {
      result = h->output;
      Py_INCREF(result);
    }
    if (rc != 0 || owned) api.so_release(h->id);
  }
  if (result != NULL && h->finish != Py_None) Py_SETREF(result, PyObject_CallOneArg(h->finish, result));
  h->done = 1;
  Py_CLEAR(h->keep);
  Py_CLEAR(h->output);
  Py_CLEAR(h->finish);
  Py_XINCREF(result);
  Py_XSETREF(h->result, result);
  return result;
}

/* Waits for every handle (so that no buffer is left in use by the core) and raises the first
 * error after all are done; else returns the list of results. */
static PyObject* wait_all_tuple(PyObject* handles) {
  Py_ssize_t n = PyTuple_GET_SIZE(handles);
  PyObject* results = PyList_New(n);
  if (results == NULL) return NULL;
  PyObject *etype = NULL, *evalue = NULL, *etb = NULL;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* r = synchronize(NULL, PyTuple_GET_ITEM(handles, i));
    if (r == NULL) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) {  /* interrupted: the rest stay pending */
        Py_XDECREF(etype);
        Py_XDECREF(evalue);
        Py_XDECREF(etb);
        Py_DECREF(results);
        return NULL;
      }
      if (etype == NULL) {
        PyErr_Fetch(&etype, &evalue, &etb);
      } else {
        PyErr_Clear();
      }
      Py_INCREF(Py_None);
      r = Py_None;
    }
    PyList_SET_ITEM(results, i, r);
  }
  if (etype != NULL) {
    Py_DECREF(results);
    PyErr_Restore(etype, evalue, etb);
    return NULL;
  }
  return results;
}

/* wait_all(handles) -> list of results */
static PyObject* wait_all(PyObject* self, PyObject* arg) {
  PyObject* handles = PySequence_Tuple(arg);
  if (handles == NULL) return NULL;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(handles); ++i) {
    if (!PyObject_TypeCheck(PyTuple_GET_ITEM(handles, i), &HandleType)) {
      Py_DECREF(handles);
      return PyErr_Format(PyExc_TypeError, "wait_all() takes scaleout Handles");
    }
  }
  PyObject* results = wait_all_tuple(handles);
  Py_DECREF(handles);
  return results;
}

/* poll(handle) -> True when the collective has completed (a group: every member). */
static PyObject* poll(PyObject* self, PyObject* arg) {
  if (!PyObject_TypeCheck(arg, &HandleType)) {
    return raise_invalid("poll() takes a scaleout Handle, not %s", Py_TYPE(arg)->tp_name);
  }
  HandleObject* h = (HandleObject*)arg;
  if (h->done) Py_RETURN_TRUE;
  if (h->id == 0) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(h->output); ++i) {
      PyObject* r = poll(NULL, PyTuple_GET_ITEM(h->output, i));
      if (r != Py_True) return r;
      Py_DECREF(r);
    }
    Py_RETURN_TRUE;
  }
  if (!require_loaded()) return NULL;
  int done = 0;
  int rc = api.so_poll(h->id, &done);
  if (rc != 0) return raise_status(rc);
  return PyBool_FromLong(done);
}

static PyMethodDef methods[] = {
    {"load", load, METH_O, "load(path): opens the native core and resolves its C ABI"},
    {"register_tensor_type", register_tensor_type, METH_VARARGS,
     "register_tensor_type(cls, {dtype: code}, strided_layout): tensors submit reads itself"},
    {"register_errors", register_errors, METH_O,
     "register_errors(from_core): from_core(status name, message, culprit ranks, process set id "
     "or None) makes every exception raised here"},
    {"init", init, METH_O, "init(comm Fortran handle or None)"},
    {"shutdown", shutdown, METH_NOARGS, "shutdown()"},
    {"is_initialized", is_initialized, METH_NOARGS, "is_initialized() -> bool"},
    {"topology", topology, METH_NOARGS,
     "topology() -> (rank, size, local_rank, local_size, cross_rank, cross_size)"},
    {"stats", stats, METH_NOARGS, "stats() -> (handles registered, names in flight)"},
    {"traffic", traffic, METH_NOARGS, "traffic() -> per collective kind, its counters"},
    {"algorithms", algorithms, METH_NOARGS,
     "algorithms() -> {collective: algorithm}: the job's algorithm plan"},
    {"peer_died", peer_died, METH_NOARGS, "whether this process has seen a peer rank die"},
    {"add_process_set", add_process_set, METH_O, "add_process_set(ranks) -> id (collective)"},
    {"remove_process_set", remove_process_set, METH_O, "remove_process_set(id) (collective)"},
    {"process_set", process_set, METH_O, "process_set(id) -> (rank or -1, ranks)"},
    {"process_set_ids", process_set_ids, METH_NOARGS, "process_set_ids() -> [ids]"},
    {"timeline", timeline, METH_VARARGS, "timeline(path or None, mark_cycles): start or stop it"},
    {"config_string", config_string, METH_NOARGS, "the core's configuration, KEY=VALUE lines"},
    {"version", version, METH_NOARGS, "the core's version"},
    {"build_info", build_info, METH_NOARGS, "compiler and MPI the core was built with"},
    {"auto_name", (PyCFunction)(void (*)(void))auto_name, METH_FASTCALL,
     "auto_name(collective, name or None) -> name"},
    {"submit", (PyCFunction)(void (*)(void))submit, METH_FASTCALL | METH_KEYWORDS,
     "submit(collective, name=None, data=None, address=None, dtype=None, shape=None, "
     "output=None, out_address=None, op=Average, root=0, prescale=1.0, postscale=1.0, "
     "splits=None, finish=None, process_set=0) -> Handle"},
    {"group", (PyCFunction)(void (*)(void))group, METH_FASTCALL, "group(handles, name) -> Handle"},
    {"synchronize", synchronize, METH_O, "synchronize(handle) -> result"},
    {"wait_all", wait_all, METH_O, "wait_all(handles) -> results; raises the first error"},
    {"poll", poll, METH_O, "poll(handle) -> bool"},
    {NULL, NULL, 0, NULL},
};

/* PyModule_AddObject that also takes NULL (a failed constructor) and always steals. */
static int add(PyObject* m, const char* name, PyObject* value) {
  if (value == NULL) return -1;
  if (PyModule_AddObject(m, name, value) < 0) {
    Py_DECREF(value);
    return -1;
  }
  return 0;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_binding",
                                    "The Python binding of scaleout's C ABI.", -1, methods};

/* A table as a tuple of rows. */
static PyObject* dtype_rows(void) {
  return Py_BuildValue("(" 
#define SO_FMT_(ENUM, name, code, bytes) "(sii)"
                       SO_DTYPE_TABLE(SO_FMT_)
#undef SO_FMT_
                       ")"
#define SO_ARGS_(ENUM, name, code, bytes) , #name, code, bytes
                       SO_DTYPE_TABLE(SO_ARGS_)
#undef SO_ARGS_
  );
}

#define SO_CODE_ROWS_(TABLE)                                  \
  Py_BuildValue("(" TABLE(SO_FMT2_) ")" TABLE(SO_ARGS2_))
#define SO_FMT2_(ENUM, name, code) "(si)"
#define SO_ARGS2_(ENUM, name, code) , #name, code

static PyObject* status_rows(void) {
#define SO_SFMT_(NAME, code) "(si)"
#define SO_SARGS_(NAME, code) , #NAME, code
  return Py_BuildValue("((si)" SO_ERROR_TABLE(SO_SFMT_) ")", "OK", SO_OK SO_ERROR_TABLE(SO_SARGS_));
#undef SO_SFMT_
#undef SO_SARGS_
}

PyMODINIT_FUNC PyInit__binding(void) {
  if (PyType_Ready(&HandleType) < 0 || PyType_Ready(&ResultBufferType) < 0) return NULL;
#define SO_INTERN_(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;
  SO_INTERN_(s_dtype, "dtype") SO_INTERN_(s_is_cpu, "is_cpu") SO_INTERN_(s_layout, "layout")
  SO_INTERN_(s_is_contiguous, "is_contiguous") SO_INTERN_(s_data_ptr, "data_ptr")
  SO_INTERN_(s_shape, "shape")
#define SO_ARG_NAME_(n) SO_INTERN_(submit_keywords[ARG_##n], #n)
  SUBMIT_ARGS(SO_ARG_NAME_)
#undef SO_ARG_NAME_
#undef SO_INTERN_
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  orphans = PyList_New(0);
  if (orphans == NULL || PyModule_AddObjectRef(m, "orphans", orphans) < 0 ||
      PyModule_AddObjectRef(m, "Handle", (PyObject*)&HandleType) < 0 ||
      add(m, "DTYPES", dtype_rows()) < 0 ||
      add(m, "REDUCE_OPS", SO_CODE_ROWS_(SO_REDUCE_OP_TABLE)) < 0 ||
      add(m, "COLLECTIVES", SO_CODE_ROWS_(SO_COLLECTIVE_TABLE)) < 0 ||
      add(m, "STATUSES", status_rows()) < 0 ||
      add(m, "TRAFFIC", SO_CODE_ROWS_(SO_TRAFFIC_TABLE)) < 0 ||
      PyModule_AddIntConstant(m, "MAX_NDIM", SO_MAX_NDIM) < 0 ||
      PyModule_AddIntConstant(m, "ABI_VERSION", SCALEOUT_ABI_VERSION) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
