/* scaleout._binding: submit, the fast path from a Python call to so_enqueue (Note [Request
 * record]). */
#include "python/binding.h"

/*
 * submit(collective, name, data, address, dtype, shape, output, out_address, op, root_rank,
 *        prescale_factor, postscale_factor, splits, finish, process_set, caller_waits,
 *        priority) -> Handle
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
 * caller_waits: true when the caller synchronizes the handle at once (the synchronous calls):
 *   the collective may then run on its thread (Note [Caller drives]).
 * priority: an int; higher goes first when rank 0 has work of several priorities ready (Note
 *   [Priority]).
 * name None generates one (auto_name).
 */
/* submit's arguments in positional order; only collective has no default (Note [Request
 * record]): name, data, address, dtype, shape, output, out_address, splits and finish None, op
 * Average, root_rank 0, prescale_factor and postscale_factor 1.0, process_set 0, caller_waits
 * False, priority 0. */
/* clang-format off */
#define SUBMIT_ARGS(X)                                                                          \
  X(collective) X(name) X(data) X(address) X(dtype) X(shape) X(output) X(out_address) X(op)      \
  X(root_rank) X(prescale_factor) X(postscale_factor) X(splits) X(finish) X(process_set)       \
  X(caller_waits) X(priority)
/* clang-format on */
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
    PyErr_Format(PyExc_TypeError, "submit takes at most %d arguments, got %zd", SUBMIT_NARGS,
                 nargs);
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

static PyObject *fast_array_type, *fast_global_set, *fast_ops; /* set_fast_path's */

// Note [Array dtypes]
// Asked for its buffer's format, numpy writes the format string anew at every call: 0.3 us of
// a 4 KiB allreduce_ here (perf, 2026-11-27). So an array of the type set_fast_path named has
// its dtype object (a long-lived descriptor, the same object for every float32 array) looked
// up among those seen before, and its buffer is then taken without the format; a dtype not
// seen yet takes the format path once, and is remembered if scaleout has a code for it (a
// format it cannot take - a byte order not the machine's, a structured dtype - is explained
// there every time). Strong references to at most KNOWN_DESCRS descriptors, the oldest replaced.
#define KNOWN_DESCRS 16
static PyObject* known_descr[KNOWN_DESCRS];
static int known_code[KNOWN_DESCRS];
static int known_count;
static PyObject* str_dtype;

/* The code of `array`'s dtype when seen before, else -1 (*descr: its dtype, a new reference,
 * or NULL where the lookup failed: the format path then explains). */
static int known_array_dtype(PyObject* array, PyObject** descr) {
  *descr = PyObject_GetAttr(array, str_dtype);
  if (*descr == NULL) {
    PyErr_Clear();
    return -1;
  }
  for (int i = 0; i < known_count; ++i) {
    if (known_descr[i] == *descr) return known_code[i];
  }
  return -1;
}

static int known_next; /* the slot a new dtype takes once all are used */

static void remember_array_dtype(PyObject* descr, int code) {
  if (descr == NULL) return;
  /* Unpickled arrays bring dtype objects of their own (equal, not the same): when the slots
   * are full, the oldest goes, so that the common ones come back. */
  const int slot = known_count < KNOWN_DESCRS ? known_count++ : known_next++ % KNOWN_DESCRS;
  Py_INCREF(descr);
  Py_XSETREF(known_descr[slot], descr);
  known_code[slot] = code;
}

/* submit; `now`: a synchronous allreduce is first offered to so_allreduce_now, and when that ran
 * it, the result (output, finished) comes back instead of a Handle. */
static PyObject* submit_with(PyObject* self, PyObject* const* argv, Py_ssize_t nargs,
                             PyObject* kwnames, int now) {
  PyObject* args[SUBMIT_NARGS];
  if (submit_parse(argv, nargs, kwnames, args) != 0) return NULL;
  if (!require_loaded()) return NULL;
  /* Numbers not given take their defaults; given, they must be numbers (None too is refused). */
  int collective, dtype = -1, op = SO_AVERAGE, root = 0, process_set = 0, priority = 0;
  double pre = 1.0, post = 1.0;
  if (!as_int(args[ARG_collective], "collective", &collective) ||
      (args[ARG_op] && !as_int(args[ARG_op], "op", &op)) ||
      (args[ARG_root_rank] && !as_int(args[ARG_root_rank], "root_rank", &root)) ||
      (args[ARG_prescale_factor] &&
       !as_double(args[ARG_prescale_factor], "prescale_factor", &pre)) ||
      (args[ARG_postscale_factor] &&
       !as_double(args[ARG_postscale_factor], "postscale_factor", &post)) ||
      (args[ARG_process_set] && !as_int(args[ARG_process_set], "process_set", &process_set)) ||
      (args[ARG_priority] && !as_int(args[ARG_priority], "priority", &priority))) {
    return NULL;
  }
  int caller_waits = 0;
  if (args[ARG_caller_waits] && (caller_waits = PyObject_IsTrue(args[ARG_caller_waits])) < 0)
    return NULL;
  for (int i = 0; i < SUBMIT_NARGS; ++i) {
    if (args[i] == NULL) args[i] = Py_None;
  }
  PyObject *data = args[ARG_data], *address = args[ARG_address], *output = args[ARG_output];
  PyObject *out_address = args[ARG_out_address], *splits_obj = args[ARG_splits];
  PyObject* finish = args[ARG_finish];
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
    const int writable =
        output == data && (collective == SO_ALLREDUCE || collective == SO_BROADCAST);
    PyObject* descr = NULL; /* Note [Array dtypes] */
    const int known = fast_array_type != NULL && (PyObject*)Py_TYPE(data) == fast_array_type
                          ? known_array_dtype(data, &descr)
                          : -1;
    const int flags =
        PyBUF_C_CONTIGUOUS | (known < 0 ? PyBUF_FORMAT : 0) | (writable ? PyBUF_WRITABLE : 0);
    if (get_buffer(data, &in, flags) != 0) {
      Py_XDECREF(descr);
      goto done;
    }
    have_in = 1;
    in_ptr = in.buf;
    dtype = known >= 0 ? known : format_dtype(&in);
    if (known < 0 && dtype >= 0) remember_array_dtype(descr, dtype);
    Py_XDECREF(descr);
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
  int rc;
  const so_request request = {.struct_size = sizeof(so_request),
                              .collective = collective,
                              .name = name_utf8,
                              .dtype = dtype,
                              .ndim = ndim,
                              .shape = shape,
                              .input = in_ptr,
                              .output = out_ptr,
                              .reduce_op = op,
                              .root_rank = root,
                              .prescale_factor = pre,
                              .postscale_factor = post,
                              .splits = splits,
                              .nsplits = nsplits,
                              .process_set = process_set,
                              .caller_waits = caller_waits,
                              .priority = priority};
  if (now) {
    int ran = 0;
    if ((rc = api.so_allreduce_now(&request, &ran)) != 0) {
      raise_status(rc);
      goto done;
    }
    if (ran) { /* finished as synchronize finishes a handle's result */
      result = output;
      Py_INCREF(result);
      if (finish != Py_None) Py_SETREF(result, PyObject_CallOneArg(finish, result));
      goto done;
    }
  }
  rc = api.so_enqueue(&request, &id);
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

// Note [Synchronous allreduce_]
// allreduce_(array) is a training loop's small collective (a loss, a metric), and on this
// machine each Python-level step of it costs a tenth of a microsecond or more: the checks of
// the common case, the keyword call of submit and the call of synchronize were 1 us of a 4 KiB
// allreduce_'s 8.5 (benchmarks/small_collectives.py). allreduce_now makes them in C:
// allreduce_now(tensor, average, name, op, prescale_factor, postscale_factor, process_set) is
// allreduce_'s result when tensor is an array of the type set_fast_path named (numpy's
// ndarray, exactly) or a registered tensor (torch's: the torch.distributed backend's
// synchronous all_reduce), average None, process_set the global set's object and op None or
// one of the codes set_fast_path named; the request is offered to so_allreduce_now first (the
// fast lane on this thread with no handle at all, Note [Fast lane]), else submitted (in place,
// the caller waiting) and synchronized, as the Python path would call them. Anything else, and
// an array the buffer protocol cannot give as it is (BufferError), returns NotImplemented: the
// caller takes the general path, which explains any error. Measured (2 ranks, interleaved, same
// run): 7.63 -> 7.27 us per 4 KiB allreduce_ (mpi4py's in-place Allreduce 6.34 us, submit and
// synchronize called directly from the loop 6.56 us): what remains above the latter is allreduce_'s
// own Python frame. allreduce_async_now does the same for allreduce_async_, returning the Handle:
// 200 such submissions of 16 KiB took 0.47 -> 0.43 ms (2026-11-27).
static PyObject *code_allreduce, *code_average, *code_zero;

/* set_fast_path(array type, the global process set object, a container of the op codes) */
static PyObject* set_fast_path(PyObject* self, PyObject* const* a, Py_ssize_t n) {
  if (n != 3) {
    PyErr_SetString(PyExc_TypeError, "set_fast_path takes 3 arguments");
    return NULL;
  }
  Py_INCREF(a[0]);
  Py_XSETREF(fast_array_type, a[0]);
  Py_INCREF(a[1]);
  Py_XSETREF(fast_global_set, a[1]);
  Py_INCREF(a[2]);
  Py_XSETREF(fast_ops, a[2]);
  Py_RETURN_NONE;
}

static PyObject* submit(PyObject* self, PyObject* const* argv, Py_ssize_t nargs,
                        PyObject* kwnames) {
  return submit_with(self, argv, nargs, kwnames, 0);
}

/* allreduce_now's submission; `waits`: the caller synchronizes at once, and the collective is
 * first offered to the fast lane (so_allreduce_now). A handle, the result where the lane ran it,
 * NULL with an exception set, or NotImplemented (the general path then explains). */
static PyObject* allreduce_submit(PyObject* self, PyObject* const* a, int waits) {
  PyObject *tensor = a[0], *op = a[3];
  if (fast_array_type == NULL ||
      ((PyObject*)Py_TYPE(tensor) != fast_array_type && !is_tensor(tensor)) || a[1] != Py_None ||
      a[6] != fast_global_set) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (op == Py_None) {
    op = code_average;
  } else {
    int known = PyLong_CheckExact(op) ? PySequence_Contains(fast_ops, op) : 0;
    if (known < 0) return NULL;
    if (!known) Py_RETURN_NOTIMPLEMENTED;
  }
  /* submit's positional order (SUBMIT_ARGS), up to caller_waits */
  PyObject* argv[ARG_priority] = {[ARG_collective] = code_allreduce,
                                  [ARG_name] = a[2],
                                  [ARG_data] = tensor,
                                  [ARG_address] = Py_None,
                                  [ARG_dtype] = Py_None,
                                  [ARG_shape] = Py_None,
                                  [ARG_output] = tensor,
                                  [ARG_out_address] = Py_None,
                                  [ARG_op] = op,
                                  [ARG_root_rank] = code_zero,
                                  [ARG_prescale_factor] = a[4],
                                  [ARG_postscale_factor] = a[5],
                                  [ARG_splits] = Py_None,
                                  [ARG_finish] = Py_None,
                                  [ARG_process_set] = code_zero,
                                  [ARG_caller_waits] = waits ? Py_True : Py_False};
  PyObject* handle = submit_with(self, argv, ARG_priority, NULL, waits);
  if (handle == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_BufferError)) return NULL;
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  return handle;
}

static PyObject* allreduce_now(PyObject* self, PyObject* const* a, Py_ssize_t n) {
  if (n != 7) {
    PyErr_SetString(PyExc_TypeError, "allreduce_now takes 7 arguments");
    return NULL;
  }
  PyObject* handle = allreduce_submit(self, a, 1);
  if (handle == NULL || handle == Py_NotImplemented) return handle;
  if (!PyObject_TypeCheck(handle, &HandleType)) return handle; /* the lane ran it: the result */
  PyObject* result = synchronize_handle(handle);
  Py_DECREF(handle);
  return result;
}

/* allreduce_async_'s common case, as allreduce_now's: its Handle, or NotImplemented. */
static PyObject* allreduce_async_now(PyObject* self, PyObject* const* a, Py_ssize_t n) {
  if (n != 7) {
    PyErr_SetString(PyExc_TypeError, "allreduce_async_now takes 7 arguments");
    return NULL;
  }
  return allreduce_submit(self, a, 0);
}

int submit_init(void) {
  if ((str_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
      (code_allreduce = PyLong_FromLong(SO_ALLREDUCE)) == NULL ||
      (code_average = PyLong_FromLong(SO_AVERAGE)) == NULL ||
      (code_zero = PyLong_FromLong(0)) == NULL) {
    return -1;
  }
#define SO_ARG_NAME_(n) \
  if ((submit_keywords[ARG_##n] = PyUnicode_InternFromString(#n)) == NULL) return -1;
  SUBMIT_ARGS(SO_ARG_NAME_)
#undef SO_ARG_NAME_
  return 0;
}

static PyMethodDef methods[] = {
    {"submit", (PyCFunction)(void (*)(void))submit, METH_FASTCALL | METH_KEYWORDS,
     "submit(collective, name=None, data=None, address=None, dtype=None, shape=None, "
     "output=None, out_address=None, op=Average, root_rank=0, prescale_factor=1.0, "
     "postscale_factor=1.0, splits=None, finish=None, process_set=0, caller_waits=False, "
     "priority=0) -> Handle"},
    {"allreduce_async_now", (PyCFunction)(void (*)(void))allreduce_async_now, METH_FASTCALL,
     "allreduce_async_now(tensor, average, name, op, prescale_factor, postscale_factor, "
     "process_set) -> Handle, or NotImplemented (Note [Synchronous allreduce_])"},
    {"allreduce_now", (PyCFunction)(void (*)(void))allreduce_now, METH_FASTCALL,
     "allreduce_now(tensor, average, name, op, prescale_factor, postscale_factor, process_set) "
     "-> allreduce_'s result, or NotImplemented (Note [Synchronous allreduce_])"},
    {"set_fast_path", (PyCFunction)(void (*)(void))set_fast_path, METH_FASTCALL,
     "set_fast_path(array_type, global_process_set, op_codes)"},
    {NULL, NULL, 0, NULL},
};
PyMethodDef* const submit_methods = methods;
