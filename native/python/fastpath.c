/*
 * scaleout._fastpath: the per-collective hot path (enqueue, wait, the Handle object and
 * synchronize) as a CPython extension.
 *
 * ctypes costs several microseconds per call in argument conversion, and reading an array's
 * address through __array_interface__ costs as much again; a training step submits hundreds of
 * collectives, so those microseconds add up to milliseconds. For the same reason the Handle
 * type and synchronize() live here: as Python they cost about 2 us per collective (object set
 * up, a __del__ call per handle, attribute traffic), as C a tenth of that. This module is only
 * a thinner binding of the same C ABI (native/c_api/scaleout.h): it does not link against the
 * core; Python hands it the C ABI's function addresses from the ctypes-loaded library (bind()),
 * and the Python functions that raise scaleout's exceptions (set_errors()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "c_api/scaleout.h"

typedef int (*enqueue_fn)(const char*, int, int, int, const int64_t*, const void*, void*, int, int,
                          double, double, const int64_t*, int, int64_t*);
typedef int (*wait_fn)(int64_t, double);
typedef int (*release_fn)(int64_t);

static enqueue_fn so_enqueue_p = NULL;
static wait_fn so_wait_p = NULL;
static release_fn so_release_p = NULL;
/* check(status): raises the scaleout exception for a failed status. */
static PyObject* check_fn = NULL;
/* shut_down(name): raises ShutDownError for a handle of an earlier runtime. */
static PyObject* shut_down_fn = NULL;
/* Handles dropped while pending, as (id, keep, generation); swept by Python. */
static PyObject* orphans = NULL;
/* Counts shutdowns (set by Python): a handle of an older generation belongs to a dead runtime. */
static long long generation = 0;

static PyObject* bind(PyObject* self, PyObject* args) {
  unsigned long long enq, wait, rel;
  if (!PyArg_ParseTuple(args, "KKK", &enq, &wait, &rel)) return NULL;
  so_enqueue_p = (enqueue_fn)(uintptr_t)enq;
  so_wait_p = (wait_fn)(uintptr_t)wait;
  so_release_p = (release_fn)(uintptr_t)rel;
  Py_RETURN_NONE;
}

/* set_errors(check, shut_down): the Python functions that raise scaleout's exceptions (set when
 * scaleout is imported, before any handle exists). */
static PyObject* set_errors(PyObject* self, PyObject* args) {
  PyObject *check, *shut_down;
  if (!PyArg_ParseTuple(args, "OO", &check, &shut_down)) return NULL;
  Py_INCREF(check);
  Py_XSETREF(check_fn, check);
  Py_INCREF(shut_down);
  Py_XSETREF(shut_down_fn, shut_down);
  Py_RETURN_NONE;
}

static int errors_set(void) {
  if (check_fn == NULL || shut_down_fn == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "scaleout._fastpath used before set_errors()");
    return 0;
  }
  return 1;
}

static PyObject* set_generation(PyObject* self, PyObject* arg) {
  long long g = PyLong_AsLongLong(arg);
  if (g == -1 && PyErr_Occurred()) return NULL;
  generation = g;
  Py_RETURN_NONE;
}

/* ---- Handle ---- */

typedef struct {
  PyObject_HEAD
  long long id;        /* the core's handle id; 0 for a group of handles */
  PyObject* name;
  PyObject* finish;    /* finish(handle) -> result, or None: the result is already `result` */
  PyObject* keep;      /* buffers the core reads or writes until completion */
  PyObject* result;
  long long generation;
  char done;
  char reads_result;   /* 0: the result is in the caller's buffers at completion, so the core's
                          handle is released inside the wait */
} HandleObject;

static PyTypeObject HandleType;

static int Handle_init(HandleObject* self, PyObject* args, PyObject* kwds) {
  static char* kwlist[] = {"handle_id", "name", "finish", "keep", "reads_result", NULL};
  long long id;
  PyObject *name, *finish, *keep;
  int reads_result = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "LOOO|p", kwlist, &id, &name, &finish, &keep,
                                   &reads_result)) {
    return -1;
  }
  self->id = id;
  Py_INCREF(name);
  Py_XSETREF(self->name, name);
  Py_INCREF(finish);
  Py_XSETREF(self->finish, finish);
  Py_INCREF(keep);
  Py_XSETREF(self->keep, keep);
  Py_CLEAR(self->result);
  self->generation = generation;
  self->done = 0;
  self->reads_result = (char)reads_result;
  return 0;
}

/* A handle dropped before completion: the collective still runs on every rank and uses the
 * buffers, so they stay alive (and the core's handle unreleased) until it completes. Handles
 * hold no reference cycles (finish functions reference buffers, never handles), so the type
 * does without the cyclic collector, whose passes a training step would otherwise trigger. */
static void Handle_dealloc(HandleObject* self) {
  if (!self->done && self->id != 0 && self->generation == generation && orphans != NULL) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* entry = Py_BuildValue("(LOL)", self->id, self->keep ? self->keep : Py_None,
                                    self->generation);
    if (entry == NULL || PyList_Append(orphans, entry) != 0) PyErr_Clear();
    Py_XDECREF(entry);
    PyErr_Restore(type, value, traceback);
  }
  Py_XDECREF(self->name);
  Py_XDECREF(self->finish);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->result);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* Handle_repr(HandleObject* self) {
  return PyUnicode_FromFormat("<scaleout.Handle %R %s>", self->name ? self->name : Py_None,
                              self->done ? "done" : "pending");
}

static PyMemberDef Handle_members[] = {
    {"_id", T_LONGLONG, offsetof(HandleObject, id), 0, NULL},
    {"name", T_OBJECT, offsetof(HandleObject, name), 0, "the collective's name"},
    {"_finish", T_OBJECT, offsetof(HandleObject, finish), 0, NULL},
    {"_keep", T_OBJECT, offsetof(HandleObject, keep), 0, NULL},
    {"_result", T_OBJECT, offsetof(HandleObject, result), 0, NULL},
    {"_generation", T_LONGLONG, offsetof(HandleObject, generation), 0, NULL},
    {"_done", T_BOOL, offsetof(HandleObject, done), 0, NULL},
    {"_reads_result", T_BOOL, offsetof(HandleObject, reads_result), 0, NULL},
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
    .tp_init = (initproc)Handle_init,
    .tp_new = PyType_GenericNew,
};

static HandleObject* new_handle(long long id, PyObject* name, PyObject* keep, PyObject* result) {
  HandleObject* h = PyObject_New(HandleObject, &HandleType);
  if (h == NULL) return NULL;
  h->id = id;
  Py_INCREF(name);
  h->name = name;
  Py_INCREF(Py_None);
  h->finish = Py_None;
  Py_INCREF(keep);
  h->keep = keep;
  Py_INCREF(result);
  h->result = result;
  h->generation = generation;
  h->done = 0;
  h->reads_result = 0;
  return h;
}

static int bound(void) {
  if (so_enqueue_p == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "scaleout._fastpath used before bind()");
    return 0;
  }
  return 1;
}

/* Returns the handle id (> 0), or -status when the core refused the request. */
static PyObject* finish_enqueue(const char* name, int collective, int dtype, int ndim,
                                const int64_t* shape, const void* in, void* out, int op, int root,
                                double pre, double post) {
  int64_t handle = 0;
  int rc = so_enqueue_p(name, collective, dtype, ndim, shape, in, out, op, root, pre, post, NULL, 0,
                        &handle);
  return PyLong_FromLongLong(rc == 0 ? handle : -(long long)rc);
}

/* enqueue(name, collective, dtype, shape: tuple, in_ptr, out_ptr, op, root, pre, post) */
static PyObject* enqueue(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError, "enqueue takes 10 arguments");
    return NULL;
  }
  const char* name = PyUnicode_AsUTF8(args[0]);
  if (name == NULL) return NULL;
  PyObject* shape_obj = args[3];
  if (!PyTuple_Check(shape_obj)) {
    PyErr_SetString(PyExc_TypeError, "shape must be a tuple");
    return NULL;
  }
  Py_ssize_t ndim = PyTuple_GET_SIZE(shape_obj);
  if (ndim > SO_MAX_NDIM) {
    PyErr_SetString(PyExc_ValueError, "too many dimensions");
    return NULL;
  }
  int64_t shape[SO_MAX_NDIM];
  for (Py_ssize_t i = 0; i < ndim; ++i) shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape_obj, i));
  int collective = (int)PyLong_AsLong(args[1]);
  int dtype = (int)PyLong_AsLong(args[2]);
  void* in = PyLong_AsVoidPtr(args[4]);
  void* out = PyLong_AsVoidPtr(args[5]);
  int op = (int)PyLong_AsLong(args[6]);
  int root = (int)PyLong_AsLong(args[7]);
  double pre = PyFloat_AsDouble(args[8]);
  double post = PyFloat_AsDouble(args[9]);
  if (PyErr_Occurred()) return NULL;
  return finish_enqueue(name, collective, dtype, (int)ndim, shape, in, out, op, root, pre, post);
}

/* enqueue_arrays(name, collective, dtype, src, dst or None, op, root, pre, post): src and dst
 * are C-contiguous buffer-protocol objects (numpy arrays); shape comes from src. The caller
 * keeps both alive until the handle completes. */
static PyObject* enqueue_arrays(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "enqueue_arrays takes 9 arguments");
    return NULL;
  }
  const char* name = PyUnicode_AsUTF8(args[0]);
  if (name == NULL) return NULL;
  int collective = (int)PyLong_AsLong(args[1]);
  int dtype = (int)PyLong_AsLong(args[2]);
  int op = (int)PyLong_AsLong(args[5]);
  int root = (int)PyLong_AsLong(args[6]);
  double pre = PyFloat_AsDouble(args[7]);
  double post = PyFloat_AsDouble(args[8]);
  if (PyErr_Occurred()) return NULL;
  Py_buffer src, dst;
  if (PyObject_GetBuffer(args[3], &src, PyBUF_C_CONTIGUOUS) != 0) return NULL;
  void* out = NULL;
  int have_dst = args[4] != Py_None;
  if (have_dst) {
    if (PyObject_GetBuffer(args[4], &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
      PyBuffer_Release(&src);
      return NULL;
    }
    out = dst.buf;
  }
  int64_t shape[SO_MAX_NDIM];
  int ndim = src.ndim;
  PyObject* result = NULL;
  if (ndim > SO_MAX_NDIM) {
    PyErr_SetString(PyExc_ValueError, "too many dimensions");
  } else {
    for (int i = 0; i < ndim; ++i) shape[i] = src.shape[i];
    result = finish_enqueue(name, collective, dtype, ndim, shape, src.buf, out, op, root, pre, post);
  }
  if (have_dst) PyBuffer_Release(&dst);
  PyBuffer_Release(&src);
  return result;
}

/* Blocks without the GIL until the core's handle completes; releases it when asked and the wait
 * succeeded (a failed handle is released by the caller after reading its error). The wait is
 * cut into slices so that Ctrl-C (or any signal handler raising) interrupts it: then -1 with
 * the exception set. */
static int wait_handle(long long handle, int release) {
  int rc;
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    rc = so_wait_p(handle, 0.25);
    if (rc == 0 && release) so_release_p(handle);
    Py_END_ALLOW_THREADS
    if (rc != SO_ERR_TIMEOUT) return rc;
    if (PyErr_CheckSignals() != 0) return -1;
  }
}

/* wait(handle, release) -> status */
static PyObject* wait(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "wait takes 2 arguments");
    return NULL;
  }
  long long handle = PyLong_AsLongLong(args[0]);
  int release = PyObject_IsTrue(args[1]);
  if (PyErr_Occurred()) return NULL;
  int rc = wait_handle(handle, release);
  return rc < 0 ? NULL : PyLong_FromLong(rc);
}

/* synchronize(handle) -> result: waits for the collective, raises its error (on every rank),
 * runs the handle's finish function once, and frees the core's handle. An interrupted wait
 * leaves the handle pending. */
static PyObject* synchronize(PyObject* self, PyObject* arg) {
  if (!PyObject_TypeCheck(arg, &HandleType)) {
    PyErr_Format(PyExc_TypeError, "synchronize() takes a scaleout Handle, not %s",
                 Py_TYPE(arg)->tp_name);
    return NULL;
  }
  HandleObject* h = (HandleObject*)arg;
  if (h->done) {
    PyObject* result = h->result ? h->result : Py_None;
    Py_INCREF(result);
    return result;
  }
  if (!errors_set()) return NULL;
  if (h->generation != generation) {
    h->done = 1;
    Py_CLEAR(h->keep);
    Py_CLEAR(h->result);  /* a failed handle has no result */
    return PyObject_CallOneArg(shut_down_fn, h->name ? h->name : Py_None);
  }
  int rc = 0, released = 0;
  if (h->id != 0) {
    if (!bound()) return NULL;
    rc = wait_handle(h->id, !h->reads_result);
    if (rc < 0) return NULL;
    released = rc == 0 && !h->reads_result;
  }
  PyObject* result = NULL;
  if (rc != 0) {
    PyObject* code = PyLong_FromLong(rc);
    if (code != NULL) {
      PyObject* none = PyObject_CallOneArg(check_fn, code);  /* raises */
      Py_DECREF(code);
      if (none != NULL) {
        Py_DECREF(none);
        PyErr_Format(PyExc_RuntimeError, "scaleout: status %d raised nothing", rc);
      }
    }
  } else if (h->finish != NULL && h->finish != Py_None) {
    result = PyObject_CallOneArg(h->finish, arg);
  } else {
    result = h->result ? h->result : Py_None;
    Py_INCREF(result);
  }
  h->done = 1;
  Py_CLEAR(h->keep);
  if (h->id != 0 && !released) so_release_p(h->id);
  if (result != NULL) {
    Py_INCREF(result);
    Py_XSETREF(h->result, result);
  } else {
    Py_CLEAR(h->result);  /* a failed handle has no result */
  }
  return result;
}

/* The core's dtype code for a buffer's struct format, or -1 (numpy's native formats). */
static int dtype_code(const Py_buffer* b) {
  const char* f = b->format;
  if (f == NULL) return -1;
  if (*f == '@' || *f == '=' || *f == '<') ++f;
  if (f[0] == '\0' || f[1] != '\0') return -1;
  switch (f[0]) {
    case 'B': return SO_UINT8;
    case 'b': return SO_INT8;
    case 'h': return b->itemsize == 2 ? SO_INT16 : -1;
    case 'i': case 'l': case 'q':
      return b->itemsize == 4 ? SO_INT32 : b->itemsize == 8 ? SO_INT64 : -1;
    case 'e': return SO_FLOAT16;
    case 'f': return b->itemsize == 4 ? SO_FLOAT32 : -1;
    case 'd': return b->itemsize == 8 ? SO_FLOAT64 : -1;
    case '?': return b->itemsize == 1 ? SO_BOOL : -1;
    default: return -1;
  }
}

/* allreduce_array(name, src, dst, op, pre, post) -> Handle, or -status when the core refused it,
 * or None when this fast path does not apply (not bound, an unnamed or odd name, a buffer that
 * is not C-contiguous, a read-only dst, a dtype it cannot read from the buffer format): the
 * caller then takes the general path, which explains any error. dst may be src (in place). The
 * handle's result is dst. */
static PyObject* allreduce_array(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "allreduce_array takes 6 arguments");
    return NULL;
  }
  PyObject *name = args[0], *src_obj = args[1], *dst_obj = args[2];
  if (so_enqueue_p == NULL || !PyUnicode_Check(name) || PyUnicode_GET_LENGTH(name) == 0) Py_RETURN_NONE;
  int op = (int)PyLong_AsLong(args[3]);
  double pre = PyFloat_AsDouble(args[4]);
  double post = PyFloat_AsDouble(args[5]);
  if (PyErr_Occurred()) return NULL;
  const char* name_utf8 = PyUnicode_AsUTF8(name);
  if (name_utf8 == NULL) return NULL;
  const int inplace = src_obj == dst_obj;
  Py_buffer src, dst;
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (inplace ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(src_obj, &src, flags) != 0) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  if (!inplace && PyObject_GetBuffer(dst_obj, &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
    PyErr_Clear();
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
  }
  PyObject* result = NULL;
  const int code = dtype_code(&src);
  if (code < 0 || src.ndim > SO_MAX_NDIM || (!inplace && dst.len != src.len)) {
    Py_INCREF(Py_None);
    result = Py_None;
  } else {
    int64_t shape[SO_MAX_NDIM];
    for (int i = 0; i < src.ndim; ++i) shape[i] = src.shape[i];
    int64_t id = 0;
    int rc = so_enqueue_p(name_utf8, SO_ALLREDUCE, code, src.ndim, shape, src.buf,
                          inplace ? src.buf : dst.buf, op, 0, pre, post, NULL, 0, &id);
    if (rc != 0) {
      result = PyLong_FromLong(-rc);
    } else {
      PyObject* keep = inplace ? src_obj : PyTuple_Pack(2, src_obj, dst_obj);
      if (keep != NULL) {
        result = (PyObject*)new_handle(id, name, keep, dst_obj);
        if (!inplace) Py_DECREF(keep);
      }
    }
  }
  if (!inplace) PyBuffer_Release(&dst);
  PyBuffer_Release(&src);
  return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(enqueue, wait, release): the C ABI's function addresses"},
    {"enqueue", (PyCFunction)(void (*)(void))enqueue, METH_FASTCALL,
     "enqueue(name, collective, dtype, shape, in_ptr, out_ptr, op, root, pre, post) -> id or -status"},
    {"enqueue_arrays", (PyCFunction)(void (*)(void))enqueue_arrays, METH_FASTCALL,
     "enqueue_arrays(name, collective, dtype, src, dst, op, root, pre, post) -> id or -status"},
    {"wait", (PyCFunction)(void (*)(void))wait, METH_FASTCALL, "wait(handle, release) -> status"},
    {"synchronize", synchronize, METH_O, "synchronize(handle) -> result"},
    {"allreduce_array", (PyCFunction)(void (*)(void))allreduce_array, METH_FASTCALL,
     "allreduce_array(name, src, dst, op, pre, post) -> Handle, -status, or None"},
    {"set_generation", set_generation, METH_O, "set_generation(n): the runtime's generation"},
    {"set_errors", set_errors, METH_VARARGS,
     "set_errors(check, shut_down): the functions that raise scaleout's errors"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath",
                                    "Hot-path binding of scaleout's C ABI.", -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) {
  if (PyType_Ready(&HandleType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  orphans = PyList_New(0);
  if (orphans == NULL || PyModule_AddObjectRef(m, "orphans", orphans) < 0 ||
      PyModule_AddObjectRef(m, "Handle", (PyObject*)&HandleType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
