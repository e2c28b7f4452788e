/* walsvc.core._chistogram: walsvc.core._metrics.Histogram, compiled.
 *
 * Histogram(bounds) counts observations in fixed buckets exactly as the Python class
 * of walsvc.core._metrics does (the same methods and attributes; tests/test_metrics.py
 * checks that the two agree): counts[i] holds the observations at or below bounds[i]
 * and above bounds[i - 1] (bisect_left), the last count those above every bound.
 *
 * It exists for the cost of metrics on the append path: a WAL with metrics on makes
 * about eight observations per batch, and the Python observe (a method call, a bisect
 * and three attribute updates) cost about 1.5-2% of a 64-producer file append, half the
 * budget of issue 24 (metrics on >= 0.97x off); this one is a fast call on C fields.
 *
 * Not thread-safe beyond the GIL: observe and add run on the WAL's loop, and a scrape
 * on another thread reads counts, count and sum, each a consistent value on its own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *bounds;     /* the tuple of float upper bounds, as given */
    Py_ssize_t nbounds;
    double *limits;       /* the bounds as doubles, ascending */
    long long *counts;    /* nbounds + 1 of them */
    long long count;
    double sum;
} Histogram;

static void
histogram_dealloc(Histogram *self)
{
    Py_XDECREF(self->bounds);
    PyMem_Free(self->limits);
    PyMem_Free(self->counts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
histogram_init(Histogram *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"bounds", NULL};
    PyObject *bounds;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", keywords, &PyTuple_Type, &bounds)) {
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(bounds);
    double *limits = PyMem_Calloc(n ? n : 1, sizeof(double));
    long long *counts = PyMem_Calloc(n + 1, sizeof(long long));
    if (limits == NULL || counts == NULL) {
        PyMem_Free(limits);
        PyMem_Free(counts);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        limits[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i));
        if (limits[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(limits);
            PyMem_Free(counts);
            return -1;
        }
        if (i > 0 && !(limits[i] > limits[i - 1])) {
            PyMem_Free(limits);
            PyMem_Free(counts);
            PyErr_SetString(PyExc_ValueError, "a histogram's bounds must ascend");
            return -1;
        }
    }
    Py_XSETREF(self->bounds, Py_NewRef(bounds));
    PyMem_Free(self->limits);
    PyMem_Free(self->counts);
    self->limits = limits;
    self->counts = counts;
    self->nbounds = n;
    self->count = 0;
    self->sum = 0.0;
    return 0;
}

/* The bucket of `value`: the first bound at or above it (bisect_left), or nbounds. */
static Py_ssize_t
bucket_of(const Histogram *self, double value)
{
    Py_ssize_t lo = 0, hi = self->nbounds;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (self->limits[mid] < value) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo;
}

/* False, with an error set, for a Histogram whose __init__ has not run. */
static int
ready(const Histogram *self)
{
    if (self->counts == NULL) {
        PyErr_SetString(PyExc_ValueError, "a Histogram not initialised");
        return 0;
    }
    return 1;
}

static PyObject *
histogram_observe(Histogram *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "observe(value, n=1)");
        return NULL;
    }
    if (!ready(self)) {
        return NULL;
    }
    double value = PyFloat_AsDouble(args[0]);
    if (value == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    long long n = 1;
    if (nargs == 2) {
        n = PyLong_AsLongLong(args[1]);
        if (n == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    self->counts[bucket_of(self, value)] += n;
    self->count += n;
    self->sum += value * (double)n;
    Py_RETURN_NONE;
}

static PyObject *
histogram_add(Histogram *self, PyObject *other)
{
    if (!PyObject_TypeCheck(other, Py_TYPE(self))) {
        PyErr_SetString(PyExc_TypeError, "add takes another Histogram");
        return NULL;
    }
    Histogram *theirs = (Histogram *)other;
    if (!ready(self) || !ready(theirs)) {
        return NULL;
    }
    if (theirs->nbounds != self->nbounds
        || memcmp(theirs->limits, self->limits, sizeof(double) * self->nbounds) != 0) {
        PyErr_SetString(PyExc_ValueError, "add takes a Histogram with the same bounds");
        return NULL;
    }
    for (Py_ssize_t i = 0; i <= self->nbounds; i++) {
        self->counts[i] += theirs->counts[i];
    }
    self->count += theirs->count;
    self->sum += theirs->sum;
    Py_RETURN_NONE;
}

static PyObject *
histogram_cumulative(Histogram *self, PyObject *Py_UNUSED(ignored))
{
    if (!ready(self)) {
        return NULL;
    }
    PyObject *buckets = PyList_New(self->nbounds + 1);
    if (buckets == NULL) {
        return NULL;
    }
    long long total = 0;
    for (Py_ssize_t i = 0; i <= self->nbounds; i++) {
        total += self->counts[i];
        PyObject *bound = i < self->nbounds
            ? PyObject_Repr(PyTuple_GET_ITEM(self->bounds, i))
            : PyUnicode_FromString("+Inf");
        PyObject *pair = bound == NULL ? NULL : Py_BuildValue("(NL)", bound, total);
        if (pair == NULL) {
            Py_DECREF(buckets);
            return NULL;
        }
        PyList_SET_ITEM(buckets, i, pair);
    }
    return buckets;
}

static PyObject *
histogram_get_counts(Histogram *self, void *Py_UNUSED(closure))
{
    if (!ready(self)) {
        return NULL;
    }
    PyObject *counts = PyList_New(self->nbounds + 1);
    if (counts == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i <= self->nbounds; i++) {
        PyObject *count = PyLong_FromLongLong(self->counts[i]);
        if (count == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyList_SET_ITEM(counts, i, count);
    }
    return counts;
}

static PyObject *
histogram_get_bounds(Histogram *self, void *Py_UNUSED(closure))
{
    if (!ready(self)) {
        return NULL;
    }
    return Py_NewRef(self->bounds);
}

static PyObject *
histogram_get_count(Histogram *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->count);
}

static PyObject *
histogram_get_sum(Histogram *self, void *Py_UNUSED(closure))
{
    return PyFloat_FromDouble(self->sum);
}

static PyMethodDef histogram_methods[] = {
    {"observe", (PyCFunction)(void (*)(void))histogram_observe, METH_FASTCALL,
     "Count value n times (n defaults to 1)."},
    {"add", (PyCFunction)histogram_add, METH_O,
     "Add another Histogram's observations (same bounds) to these."},
    {"cumulative", (PyCFunction)histogram_cumulative, METH_NOARGS,
     "Prometheus's buckets: (upper bound, observations at or below it), the last +Inf."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef histogram_getset[] = {
    {"bounds", (getter)histogram_get_bounds, NULL, "The upper bounds, ascending.", NULL},
    {"counts", (getter)histogram_get_counts, NULL, "Observations per bucket (a new list).", NULL},
    {"count", (getter)histogram_get_count, NULL, "Observations in all.", NULL},
    {"sum", (getter)histogram_get_sum, NULL, "The sum of the observed values.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HistogramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "walsvc.core._chistogram.Histogram",
    .tp_doc = "Observations in fixed buckets (walsvc.core._metrics.Histogram, compiled).",
    .tp_basicsize = sizeof(Histogram),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)histogram_init,
    .tp_dealloc = (destructor)histogram_dealloc,
    .tp_methods = histogram_methods,
    .tp_getset = histogram_getset,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "walsvc.core._chistogram",
    .m_doc = "walsvc.core._metrics.Histogram, compiled (optional: walsvc runs without it).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__chistogram(void)
{
    if (PyType_Ready(&HistogramType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Histogram", (PyObject *)&HistogramType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
