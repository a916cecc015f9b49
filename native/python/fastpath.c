/*
 * scaleout._fastpath: the per-collective hot path (enqueue, wait) as a CPython extension.
 *
 * ctypes costs several microseconds per call in argument conversion, and reading an array's
 * address through __array_interface__ costs as much again; a training step submits hundreds of
 * collectives, so those microseconds add up to milliseconds. This module is only a thinner
 * binding of the same C ABI (native/c_api/scaleout.h): it does not link against the core;
 * Python hands it the C ABI's function addresses from the ctypes-loaded library (bind()).
 * It contains no logic of its own beyond argument conversion.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "c_api/scaleout.h"

typedef int (*enqueue_fn)(const char*, int, int, int, const int64_t*, const void*, void*, int, int,
                          double, double, const int64_t*, int, int64_t*);
typedef int (*wait_fn)(int64_t, double);
typedef int (*release_fn)(int64_t);

static enqueue_fn so_enqueue_p = NULL;
static wait_fn so_wait_p = NULL;
static release_fn so_release_p = NULL;

static PyObject* bind(PyObject* self, PyObject* args) {
  unsigned long long enq, wait, rel;
  if (!PyArg_ParseTuple(args, "KKK", &enq, &wait, &rel)) return NULL;
  so_enqueue_p = (enqueue_fn)(uintptr_t)enq;
  so_wait_p = (wait_fn)(uintptr_t)wait;
  so_release_p = (release_fn)(uintptr_t)rel;
  Py_RETURN_NONE;
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

/* wait(handle, release) -> status: blocks without the GIL; releases the handle when asked and
 * the wait succeeded (a failed handle is released by the caller after reading its error). The
 * wait is cut into slices so that Ctrl-C (or any signal handler raising) interrupts it. */
static PyObject* wait(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!bound()) return NULL;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "wait takes 2 arguments");
    return NULL;
  }
  long long handle = PyLong_AsLongLong(args[0]);
  int release = PyObject_IsTrue(args[1]);
  if (PyErr_Occurred()) return NULL;
  int rc;
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    rc = so_wait_p(handle, 0.25);
    if (rc == 0 && release) so_release_p(handle);
    Py_END_ALLOW_THREADS
    if (rc != SO_ERR_TIMEOUT) break;
    if (PyErr_CheckSignals() != 0) return NULL;
  }
  return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(enqueue, wait, release): the C ABI's function addresses"},
    {"enqueue", (PyCFunction)(void (*)(void))enqueue, METH_FASTCALL,
     "enqueue(name, collective, dtype, shape, in_ptr, out_ptr, op, root, pre, post) -> id or -status"},
    {"enqueue_arrays", (PyCFunction)(void (*)(void))enqueue_arrays, METH_FASTCALL,
     "enqueue_arrays(name, collective, dtype, src, dst, op, root, pre, post) -> id or -status"},
    {"wait", (PyCFunction)(void (*)(void))wait, METH_FASTCALL, "wait(handle, release) -> status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath",
                                    "Hot-path binding of scaleout's C ABI.", -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModule_Create(&module); }
