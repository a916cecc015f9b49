/* scaleout._binding: completing handles: waiting without the GIL, results handed over without
 * a copy, errors raised on every rank. */
#include "python/binding.h"

/* Blocks without the GIL until the core's handle completes; releases it when asked and the wait
 * succeeded. The wait is cut into slices so that Ctrl-C (or any signal handler raising)
 * interrupts it: then -1 with the exception set and the handle still pending. */
static int wait_handle(long long handle, int release) {
  int rc;
  for (;;) {
    Py_BEGIN_ALLOW_THREADS rc = api.so_wait(handle, 0.25);
    if (rc == 0 && release) api.so_release(handle);
    Py_END_ALLOW_THREADS if (rc != SO_ERR_TIMEOUT) return rc;
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
  PyObject* obj =
      rc != 0 ? raise_status(rc) : PyObject_CallFunctionObjArgs(h->output, shape_obj, buffer, NULL);
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
  if (h->done) { /* a failed handle has no result: None */
    PyObject* done = h->result ? h->result : Py_None;
    Py_INCREF(done);
    return done;
  }
  PyObject* result = NULL;
  if (h->id == 0) { /* a group */
    result = wait_all_tuple(h->output);
    if (result == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) return NULL; /* interrupted */
  } else {
    if (!require_loaded()) return NULL;
    const int owned = owns_result(h->collective);
    int rc = wait_handle(h->id, !owned);
    if (rc < 0) return NULL; /* interrupted: still pending */
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
  if (result != NULL && h->finish != Py_None)
    Py_SETREF(result, PyObject_CallOneArg(h->finish, result));
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
      if (!PyErr_ExceptionMatches(PyExc_Exception)) { /* interrupted: the rest stay pending */
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

PyObject* synchronize_handle(PyObject* handle) { return synchronize(NULL, handle); }

static PyMethodDef methods[] = {
    {"synchronize", synchronize, METH_O, "synchronize(handle) -> result"},
    {"wait_all", wait_all, METH_O, "wait_all(handles) -> results; raises the first error"},
    {"poll", poll, METH_O, "poll(handle) -> bool"},
    {NULL, NULL, 0, NULL},
};
PyMethodDef* const completion_methods = methods;
