/* scaleout._binding: decoding arguments: integers and reals, buffers and their dtypes, and
 * tensors described by their attributes (the tensor protocol). */
#include "python/binding.h"

#include <limits.h>

/* The core's dtype code for a buffer's struct format, or -1 (numpy's native formats). */
int format_dtype(const Py_buffer* b) {
  const char* f = b->format;
  if (f == NULL) return SO_UINT8;
  if (*f == '@' || *f == '=' || *f == '<') ++f;
  if (f[0] == '\0' || f[1] != '\0') return -1;
  switch (f[0]) {
    case 'B':
      return SO_UINT8;
    case 'b':
      return SO_INT8;
    case 'h':
      return b->itemsize == 2 ? SO_INT16 : -1;
    case 'H':
      return b->itemsize == 2 ? SO_UINT16 : -1;
    case 'i':
    case 'l':
    case 'q':
      return b->itemsize == 4 ? SO_INT32 : b->itemsize == 8 ? SO_INT64 : -1;
    case 'e':
      return SO_FLOAT16;
    case 'f':
      return b->itemsize == 4 ? SO_FLOAT32 : -1;
    case 'd':
      return b->itemsize == 8 ? SO_FLOAT64 : -1;
    case '?':
      return b->itemsize == 1 ? SO_BOOL : -1;
    default:
      return -1;
  }
}

/* PyObject_GetBuffer whose every failure is a BufferError (numpy raises ValueError for a
 * read-only array asked to be writable): callers catch BufferError alone to take their general
 * path, which explains the problem. */
int get_buffer(PyObject* obj, Py_buffer* view, int flags) {
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
int as_int(PyObject* o, const char* what, int* out) {
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
int as_double(PyObject* o, const char* what, double* out) {
  if (!PyNumber_Check(o)) { /* floats and ints are numbers too */
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
  if (!PyArg_ParseTuple(args, "O!O!O", &PyType_Type, &cls, &PyDict_Type, &dtypes, &strided))
    return NULL;
  Py_INCREF(cls);
  Py_XSETREF(tensor_type, (PyTypeObject*)cls);
  Py_INCREF(dtypes);
  Py_XSETREF(tensor_dtypes, dtypes);
  Py_INCREF(strided);
  Py_XSETREF(tensor_strided, strided);
  Py_RETURN_NONE;
}

int is_tensor(PyObject* obj) { return tensor_type != NULL && PyObject_TypeCheck(obj, tensor_type); }

/* True, False, or -1 with an exception: obj.attr, or obj.attr() when call. */
static int attr_is(PyObject* obj, PyObject* attr, int call, PyObject* expected) {
  PyObject* v = call ? PyObject_CallMethodNoArgs(obj, attr) : PyObject_GetAttr(obj, attr);
  if (v == NULL) return -1;
  int same = v == expected;
  Py_DECREF(v);
  return same;
}

void* tensor_address(PyObject* t) {
  PyObject* p = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (p == NULL) return NULL;
  void* ptr = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  return ptr;
}

/* A registered tensor's memory, as the core takes it: 0, or -1 with BufferError when it is not
 * a contiguous CPU tensor of strided layout and a core dtype (callers then take their general
 * path, which explains why), or another error from the framework. */
int describe_tensor(PyObject* t, void** ptr, int* dtype, int64_t* shape, int* ndim) {
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
    if (ok == 0)
      PyErr_SetString(PyExc_BufferError, "not a contiguous CPU tensor of strided layout");
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

int args_init(void) {
#define SO_INTERN_(var, text) \
  if ((var = PyUnicode_InternFromString(text)) == NULL) return -1
  SO_INTERN_(s_dtype, "dtype");
  SO_INTERN_(s_is_cpu, "is_cpu");
  SO_INTERN_(s_layout, "layout");
  SO_INTERN_(s_is_contiguous, "is_contiguous");
  SO_INTERN_(s_data_ptr, "data_ptr");
  SO_INTERN_(s_shape, "shape");
#undef SO_INTERN_
  return 0;
}

static PyMethodDef methods[] = {
    {"register_tensor_type", register_tensor_type, METH_VARARGS,
     "register_tensor_type(cls, {dtype: code}, strided_layout): tensors submit reads itself"},
    {NULL, NULL, 0, NULL},
};
PyMethodDef* const args_methods = methods;
