/* scaleout._binding: the Handle type (a pending collective, or a group of them), the buffer
 * that lends a core-owned result to Python, and handles dropped while pending. */
#include "python/binding.h"

#include <structmember.h>

PyObject* orphans = NULL; /* list of (id, keep, output): handles dropped while pending */

int owns_result(int collective) {
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

PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "scaleout.Handle",
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

PyTypeObject ResultBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "scaleout.ResultBuffer",
    .tp_basicsize = sizeof(ResultBufferObject),
    .tp_dealloc = (destructor)ResultBuffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The bytes of a collective's result, owned by the core until this is freed.",
    .tp_as_buffer = &ResultBuffer_as_buffer,
};

HandleObject* new_handle(long long id, int collective, int dtype, PyObject* name, PyObject* keep,
                         PyObject* output, PyObject* finish) {
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

void sweep_orphans(void) {
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

static PyMethodDef methods[] = {
    {"group", (PyCFunction)(void (*)(void))group, METH_FASTCALL, "group(handles, name) -> Handle"},
    {NULL, NULL, 0, NULL},
};
PyMethodDef* const handle_methods = methods;
