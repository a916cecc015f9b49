/*
 * scaleout._binding: the one Python binding of the C ABI (native/c_api/scaleout.h).
 *
 * Every call from Python into the core goes through this module: loading the core, init and
 * shutdown, the tables of codes, submitting a collective, the Handle type, waiting, results and
 * errors. Nothing else binds the ABI (no ctypes declarations, no second table of signatures).
 * It is several C files compiled into one extension (python/binding.h lists them); this one
 * loads the core, makes errors, and makes the module.
 *
 * Why a CPython extension: ctypes costs several microseconds per call in argument conversion, and
 * a training step submits hundreds of collectives.
 *
 * Loading: importing this module loads neither the core nor MPI (importing scaleout must not
 * start MPI). scaleout._native imports mpi4py first (so the core binds to the MPI library mpi4py
 * loaded), then calls load(path), which dlopens the core and resolves its entry points.
 *
 * Errors: a failed call raises the exception scaleout._errors.from_core makes of its status name,
 * message and details (register_errors(), once at import of scaleout). No status integer
 * reaches Python code.
 */
#include <dlfcn.h>
#include <string.h>

#include "python/binding.h"

#include "common/settings_table.h"
#include "mpi/so_mpi.h"

struct so_api api;
int api_loaded = 0;

/* scaleout._errors.from_core(status name, message, culprit ranks, process set id) -> the
 * exception to raise: every error this module raises is made by it (register_errors). */
static PyObject* error_factory = NULL;
static const char* const status_names[SO_STATUS_COUNT] = {[SO_OK] = "OK",
#define SO_STATUS_NAME_(NAME, code) [code] = #NAME,
                                                          SO_ERROR_TABLE(SO_STATUS_NAME_)
#undef SO_STATUS_NAME_
};

/* Sets the exception from_core makes of a status (culprits: `nculprits` ranks; process_set
 * -1 for none). Returns NULL for `return raise_error(...);`. */
static PyObject* raise_error(int code, PyObject* message, const int32_t* culprits, int nculprits,
                             int32_t process_set) {
  const char* name = code > 0 && code < SO_STATUS_COUNT ? status_names[code] : "UNKNOWN";
  if (error_factory == NULL) { /* only before scaleout's import registered it */
    PyErr_SetObject(code == SO_ERR_INVALID_ARGUMENT ? PyExc_ValueError : PyExc_RuntimeError,
                    message);
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
  PyObject* exc = set_id == NULL
                      ? NULL
                      : PyObject_CallFunction(error_factory, "sOOO", name, message, ranks, set_id);
  Py_DECREF(ranks);
  Py_XDECREF(set_id);
  if (exc == NULL) return NULL; /* from_core's own failure is raised instead */
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
int require_loaded(void) {
  if (!api_loaded) {
    raise_code(SO_ERR_NOT_INITIALIZED, "scaleout is not initialized: call init() first");
    return 0;
  }
  return 1;
}

/* Raises the error of this thread's last failing call into the core (status rc), with its
 * message and details. Returns NULL for `return raise_status(rc);`. */
PyObject* raise_status(int rc) {
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

PyObject* raise_invalid(const char* format, ...) {
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
#define SO_RESOLVE_(fn)                      \
  api.fn = (__typeof__(&fn))dlsym(lib, #fn); \
  if (api.fn == NULL) return PyErr_Format(PyExc_OSError, "%s has no %s", path, #fn);
  SO_FUNCTIONS(SO_RESOLVE_)
#undef SO_RESOLVE_
  int abi = api.so_abi_version();
  if (abi != SCALEOUT_ABI_VERSION) {
    return PyErr_Format(PyExc_OSError,
                        "native core ABI %d does not match the binding's %d; "
                        "reinstall scaleout",
                        abi, SCALEOUT_ABI_VERSION);
  }
  api_loaded = 1;
  Py_RETURN_NONE;
}

/* load_mpi(path) -> (abi, built_with): opens an MPI shim (after load) and gives its table to the
 * core (Note [One core, a shim per MPI ABI]); OSError when it cannot be opened, the core's error
 * when the core refuses it. */
static PyObject* load_mpi(PyObject* self, PyObject* arg) {
  if (!require_loaded()) return NULL;
  const char* path = PyUnicode_AsUTF8(arg);
  if (path == NULL) return NULL;
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return PyErr_Format(PyExc_OSError, "%s", dlerror());
  const struct so_mpi_api* (*get)(void) =
      (const struct so_mpi_api* (*)(void))dlsym(lib, "so_mpi_api_get");
  if (get == NULL) return PyErr_Format(PyExc_OSError, "%s has no so_mpi_api_get", path);
  const so_mpi_api* table = get();
  int rc = api.so_use_mpi(table);
  if (rc != 0) return raise_status(rc);
  return Py_BuildValue("(ss)", table->abi, table->built_with);
}

/* register_errors(from_core): the factory that makes every exception this module raises. */
static PyObject* register_errors(PyObject* self, PyObject* factory) {
  if (!PyCallable_Check(factory))
    return PyErr_Format(PyExc_TypeError, "register_errors takes a callable");
  Py_XSETREF(error_factory, Py_NewRef(factory));
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"load", load, METH_O, "load(path): opens the native core and resolves its C ABI"},
    {"load_mpi", load_mpi, METH_O,
     "load_mpi(path) -> (abi, built_with): opens an MPI shim and hands it to the core"},
    {"register_errors", register_errors, METH_O,
     "register_errors(from_core): from_core(status name, message, culprit ranks, process set id "
     "or None) makes every exception raised here"},
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

#define SO_CODE_ROWS_(TABLE) Py_BuildValue("(" TABLE(SO_FMT2_) ")" TABLE(SO_ARGS2_))
#define SO_FMT2_(ENUM, name, code) "(si)"
#define SO_ARGS2_(ENUM, name, code) , #name, code

static PyObject* status_rows(void) {
#define SO_SFMT_(NAME, code) "(si)"
#define SO_SARGS_(NAME, code) , #NAME, code
  return Py_BuildValue("((si)" SO_ERROR_TABLE(SO_SFMT_) ")", "OK", SO_OK SO_ERROR_TABLE(SO_SARGS_));
#undef SO_SFMT_
#undef SO_SARGS_
}

/* Note [Settings table]: (SCALEOUT name, HOROVOD twin or None, default as text, description). */
static PyObject* settings_rows(void) {
#define SO_SETTING_FMT_(SUFFIX, twin, default_text, description) "(szss)"
#define SO_SETTING_ARGS_(SUFFIX, twin, default_text, description) \
  , "SCALEOUT_" #SUFFIX, twin ? "HOROVOD_" #SUFFIX : NULL, default_text, description
  return Py_BuildValue(
      "(" SO_SETTINGS_TABLE(SO_SETTING_FMT_) ")" SO_SETTINGS_TABLE(SO_SETTING_ARGS_));
#undef SO_SETTING_FMT_
#undef SO_SETTING_ARGS_
}

PyMODINIT_FUNC PyInit__binding(void) {
  if (PyType_Ready(&HandleType) < 0 || PyType_Ready(&ResultBufferType) < 0) return NULL;
  if (args_init() != 0 || submit_init() != 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  PyMethodDef* const parts[] = {runtime_methods, names_methods,  handle_methods,
                                args_methods,    submit_methods, completion_methods};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; ++i) {
    if (PyModule_AddFunctions(m, parts[i]) < 0) {
      Py_DECREF(m);
      return NULL;
    }
  }
  orphans = PyList_New(0);
  if (orphans == NULL || PyModule_AddObjectRef(m, "orphans", orphans) < 0 ||
      PyModule_AddObjectRef(m, "Handle", (PyObject*)&HandleType) < 0 ||
      add(m, "DTYPES", dtype_rows()) < 0 ||
      add(m, "REDUCE_OPS", SO_CODE_ROWS_(SO_REDUCE_OP_TABLE)) < 0 ||
      add(m, "COLLECTIVES", SO_CODE_ROWS_(SO_COLLECTIVE_TABLE)) < 0 ||
      add(m, "STATUSES", status_rows()) < 0 ||
      add(m, "TRAFFIC", SO_CODE_ROWS_(SO_TRAFFIC_TABLE)) < 0 ||
      add(m, "SETTINGS", settings_rows()) < 0 ||
      PyModule_AddIntConstant(m, "MAX_NDIM", SO_MAX_NDIM) < 0 ||
      PyModule_AddIntConstant(m, "ABI_VERSION", SCALEOUT_ABI_VERSION) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
