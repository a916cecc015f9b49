/* scaleout._binding: collective names, as given or generated the same way on every rank. */
#include "python/binding.h"

#include <string.h>

static long long name_counters[SO_COLLECTIVE_COUNT];
static PyObject* set_name_counters; /* {(process set, collective): next n} for sets other than 0 */

static const char* const collective_names[SO_COLLECTIVE_COUNT] = {
#define SO_NAME_(ENUM, name, code) [code] = #name,
    SO_COLLECTIVE_TABLE(SO_NAME_)
#undef SO_NAME_
};

/* The name given (checked), or the next generated "<kind>.noname.<n>": ranks that call unnamed
 * collectives of one kind in the same order agree on their names. Counted per process set (names
 * are scoped per set), so that a rank's collectives on other sets do not shift the count. */
PyObject* name_or_auto(int collective, PyObject* name, int process_set) {
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
      return raise_invalid(
          "name %R contains a NUL character; names are compared up to the "
          "first NUL, so it is refused",
          name);
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
  if (nargs != 2 && nargs != 3)
    return PyErr_Format(PyExc_TypeError, "auto_name takes 2 or 3 arguments");
  int collective = (int)PyLong_AsLong(args[0]);
  if (collective == -1 && PyErr_Occurred()) return NULL;
  int process_set = 0;
  if (nargs == 3 && !as_int(args[2], "process_set", &process_set)) return NULL;
  return name_or_auto(collective, args[1], process_set);
}

static PyMethodDef methods[] = {
    {"auto_name", (PyCFunction)(void (*)(void))auto_name, METH_FASTCALL,
     "auto_name(collective, name or None) -> name"},
    {NULL, NULL, 0, NULL},
};
PyMethodDef* const names_methods = methods;
