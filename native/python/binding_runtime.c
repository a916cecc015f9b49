/* scaleout._binding: the runtime's lifecycle and what can be asked of it (init, shutdown,
 * topology, counters, the algorithm plan, process sets, the timeline, configuration). */
#include "python/binding.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Note [Liveness]: after a peer rank died, MPI_Finalize (mpi4py's, at exit) would wait for it
 * forever. Registered after mpi4py's own exit function, so it runs first, after the interpreter
 * has finished (exit handlers run, shutdown() done, output flushed): the process leaves with
 * status 1 without finalizing MPI. */
static void leave_without_finalize(void) {
  if (!api_loaded || !api.so_peer_died()) return;
  fputs(
      "scaleout: a peer rank died, so MPI cannot be finalized (MPI_Finalize would wait for "
      "it forever): leaving without it, exit status 1\n",
      stderr);
  fflush(NULL);
  _exit(1);
}

/* peer_died() -> bool: this process has seen a peer rank die (Note [Liveness]). */
static PyObject* peer_died(PyObject* self, PyObject* unused) {
  return PyBool_FromLong(api_loaded && api.so_peer_died());
}

static PyObject* init(PyObject* self, PyObject* arg) {
  static int exit_hook = 0;
  if (!require_loaded()) return NULL;
  if (!exit_hook && Py_AtExit(leave_without_finalize) == 0) exit_hook = 1;
  int has_comm = arg != Py_None;
  long long comm = has_comm ? PyLong_AsLongLong(arg) : 0;
  if (comm == -1 && PyErr_Occurred()) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = api.so_init(has_comm, comm);
  Py_END_ALLOW_THREADS if (rc != 0) return raise_status(rc);
  Py_RETURN_NONE;
}

static PyObject* shutdown(PyObject* self, PyObject* unused) {
  if (!api_loaded) Py_RETURN_NONE;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = api.so_shutdown();
  Py_END_ALLOW_THREADS if (rc != 0) return raise_status(rc);
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

/* Adds the set of `arg`'s ranks by `add` (so_add_process_set or so_add_member_process_set),
 * without the GIL: it blocks until the other ranks call it. */
static PyObject* add_set(PyObject* arg, int (*add)(const int32_t*, int, int32_t*)) {
  if (!require_loaded()) return NULL;
  PyObject* seq = PySequence_Fast(arg, "a process set takes a sequence of ranks");
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
  Py_BEGIN_ALLOW_THREADS rc = add(ranks, (int)n, &id);
  Py_END_ALLOW_THREADS PyMem_Free(ranks);
  if (rc != 0) return raise_status(rc);
  return PyLong_FromLong(id);
}

/* add_process_set(ranks: sequence of int) -> id; collective over every rank (blocks). */
static PyObject* add_process_set(PyObject* self, PyObject* arg) {
  return add_set(arg, api.so_add_process_set);
}

/* add_member_process_set(ranks) -> id; collective over those ranks only (blocks). */
static PyObject* add_member_process_set(PyObject* self, PyObject* arg) {
  return add_set(arg, api.so_add_member_process_set);
}

/* remove_process_set(id); collective over every rank (blocks). */
static PyObject* remove_process_set(PyObject* self, PyObject* arg) {
  if (!require_loaded()) return NULL;
  int id;
  if (!as_int(arg, "process_set_id", &id)) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = api.so_remove_process_set(id);
  Py_END_ALLOW_THREADS if (rc != 0) return raise_status(rc);
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
  for (int32_t i = 0; list != NULL && i < size; ++i)
    PyList_SET_ITEM(list, i, PyLong_FromLong(ranks[i]));
  PyMem_Free(ranks);
  if (rc != 0) return raise_status(rc);
  if (list == NULL) return NULL;
  return Py_BuildValue("(iN)", rank, list);
}

/* timeline(path or None, mark_cycles): starts or stops the timeline; blocks until done. */
static PyObject* timeline(PyObject* self, PyObject* args) {
  const char* path = NULL;
  int mark_cycles = 0;
  if (!PyArg_ParseTuple(args, "zp", &path, &mark_cycles)) return NULL;
  if (!require_loaded()) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = api.so_timeline(path, mark_cycles);
  Py_END_ALLOW_THREADS if (rc != 0) return raise_status(rc);
  Py_RETURN_NONE;
}

static PyObject* config_string(PyObject* self, PyObject* unused) {
  return text_of(api.so_config_string);
}
static PyObject* version(PyObject* self, PyObject* unused) { return text_of(api.so_version); }
static PyObject* build_info(PyObject* self, PyObject* unused) { return text_of(api.so_build_info); }

static PyMethodDef methods[] = {
    {"init", init, METH_O, "init(comm C handle or None)"},
    {"shutdown", shutdown, METH_NOARGS, "shutdown()"},
    {"is_initialized", is_initialized, METH_NOARGS, "is_initialized() -> bool"},
    {"peer_died", peer_died, METH_NOARGS, "peer_died() -> bool: a peer rank died"},
    {"topology", topology, METH_NOARGS,
     "topology() -> (rank, size, local_rank, local_size, cross_rank, cross_size)"},
    {"stats", stats, METH_NOARGS, "stats() -> (handles registered, names in flight)"},
    {"traffic", traffic, METH_NOARGS, "traffic() -> per collective kind, its counters"},
    {"algorithms", algorithms, METH_NOARGS,
     "algorithms() -> {collective: algorithm}: the job's algorithm plan"},
    {"add_process_set", add_process_set, METH_O, "add_process_set(ranks) -> id (collective)"},
    {"add_member_process_set", add_member_process_set, METH_O,
     "add_member_process_set(ranks) -> id (collective over those ranks)"},
    {"remove_process_set", remove_process_set, METH_O, "remove_process_set(id) (collective)"},
    {"process_set", process_set, METH_O, "process_set(id) -> (rank or -1, ranks)"},
    {"timeline", timeline, METH_VARARGS, "timeline(path or None, mark_cycles): start or stop it"},
    {"config_string", config_string, METH_NOARGS, "the core's configuration, KEY=VALUE lines"},
    {"version", version, METH_NOARGS, "the core's version"},
    {"build_info", build_info, METH_NOARGS, "compiler and MPI the core was built with"},
    {NULL, NULL, 0, NULL},
};
PyMethodDef* const runtime_methods = methods;
