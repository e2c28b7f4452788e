/* walsvc.core._cmetrics: the metrics' recording of walsvc.core._metrics, compiled.
 *
 * Histogram(bounds) counts observations in fixed buckets exactly as PyHistogram of
 * walsvc.core._metrics does (the same methods and attributes; tests/test_metrics.py
 * checks that the two agree): counts[i] holds the observations at or below bounds[i]
 * and above bounds[i - 1] (bisect_left), the last count those above every bound.
 *
 * AppendRecorder is PyAppendRecorder of walsvc.core._metrics, compiled: the histograms
 * and counters of the append path and the three calls that fill them once per batch
 * (batch_started/batch_ended around a coalesced batch, serialized at the serialization
 * point, committed at the file backend), each one C call that reads the clock itself.
 *
 * Both exist for the cost of metrics on the append path (issue 24: metrics on >= 0.97x
 * off). Measured inside a 64-producer file append, the Python per-batch record of the
 * serialization point took about 1.2 us a call (0.2 us in a tight loop: cold caches
 * between batches), and the three sites together about 3-4% of the loop's CPU.
 *
 * Not thread-safe beyond the GIL: recording runs on the WAL's loop, and a scrape on
 * another thread reads counts, count and sum, each a consistent value on its own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* One allocation per Histogram (its counts inline) and one array of limits shared by all
 * Histograms of equal bounds: recording touches few cache lines, and inside a busy
 * append loop each cold one costs (about 85 ns a histogram, measured). */
typedef struct {
    PyObject_VAR_HEAD     /* ob_size: nbounds + 1, the counts */
    PyObject *bounds;     /* the tuple of float upper bounds, as given */
    Py_ssize_t nbounds;
    const double *limits; /* the bounds as doubles, ascending (shared or owned_limits) */
    double *owned_limits; /* NULL while limits are shared */
    long long count;
    double sum;
    long long counts[1];  /* nbounds + 1 of them */
} Histogram;

/* The limits of the first few distinct bounds seen, kept for the process's life and
 * shared (walsvc uses two: latency and batch sizes). */
#define SHARED_LIMITS 8
static struct {
    Py_ssize_t n;
    double *limits;
} shared_limits[SHARED_LIMITS];
static int nshared_limits;

/* `limits` (n of them, PyMem_Malloc'ed) as shared limits, or NULL: the caller keeps it.
 * Frees `limits` when an equal array is shared already. */
static const double *
share_limits(double *limits, Py_ssize_t n)
{
    for (int i = 0; i < nshared_limits; i++) {
        if (shared_limits[i].n == n
            && memcmp(shared_limits[i].limits, limits, sizeof(double) * n) == 0) {
            PyMem_Free(limits);
            return shared_limits[i].limits;
        }
    }
    if (nshared_limits < SHARED_LIMITS) {
        shared_limits[nshared_limits].n = n;
        shared_limits[nshared_limits].limits = limits;
        nshared_limits++;
        return limits;
    }
    return NULL;
}

static void
histogram_dealloc(Histogram *self)
{
    Py_XDECREF(self->bounds);
    PyMem_Free(self->owned_limits);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
histogram_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"bounds", NULL};
    PyObject *bounds;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", keywords, &PyTuple_Type, &bounds)) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(bounds);
    double *limits = PyMem_Calloc(n ? n : 1, sizeof(double));
    if (limits == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        limits[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i));
        if (limits[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(limits);
            return NULL;
        }
        if (i > 0 && !(limits[i] > limits[i - 1])) {
            PyMem_Free(limits);
            PyErr_SetString(PyExc_ValueError, "a histogram's bounds must ascend");
            return NULL;
        }
    }
    Histogram *self = (Histogram *)type->tp_alloc(type, n + 1);  /* zeroed */
    if (self == NULL) {
        PyMem_Free(limits);
        return NULL;
    }
    const double *shared = share_limits(limits, n);
    self->limits = shared != NULL ? shared : limits;
    self->owned_limits = shared != NULL ? NULL : limits;
    self->bounds = Py_NewRef(bounds);
    self->nbounds = n;
    return (PyObject *)self;
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

static PyObject *
histogram_observe(Histogram *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "observe(value, n=1)");
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
    if (theirs->nbounds != self->nbounds
        || (theirs->limits != self->limits
            && memcmp(theirs->limits, self->limits, sizeof(double) * self->nbounds) != 0)) {
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
    .tp_name = "walsvc.core._cmetrics.Histogram",
    .tp_doc = "Observations in fixed buckets (walsvc.core._metrics.Histogram, compiled).",
    .tp_basicsize = offsetof(Histogram, counts),
    .tp_itemsize = sizeof(long long),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = histogram_new,
    .tp_dealloc = (destructor)histogram_dealloc,
    .tp_methods = histogram_methods,
    .tp_getset = histogram_getset,
};

/* ---- AppendRecorder ---------------------------------------------------------------- */

/* The clock of the record: time.perf_counter's (CLOCK_MONOTONIC on Linux, where it is
 * read here directly; elsewhere through time.perf_counter itself). Callers pass times
 * they read with time.perf_counter, so the two must be one clock: tests check it. */
#if !defined(__linux__)
static PyObject *perf_counter;  /* time.perf_counter */
#endif

static int
read_clock(double *now)
{
#if defined(__linux__)
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    *now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    return 0;
#else
    PyObject *value = PyObject_CallNoArgs(perf_counter);
    if (value == NULL) {
        return -1;
    }
    *now = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return (*now == -1.0 && PyErr_Occurred()) ? -1 : 0;
#endif
}

static void
observe(Histogram *h, double value, long long n)
{
    h->counts[bucket_of(h, value)] += n;
    h->count += n;
    h->sum += value * (double)n;
}

/* A coalesced batch being appended: its start and what the serialization point
 * measured of it. `first` is the id of the batch's first message (0: the slot is free);
 * `matched` is cleared when a later batch with the same first message starts (the
 * serialization point's record then goes to the later one). */
typedef struct {
    Py_uintptr_t first;
    int matched;
    long long count;
    long long serializations;
    double started, encode, commit, acked_at;
} Flight;

typedef struct {
    PyObject_HEAD
    Histogram *append_batches;
    Histogram *append_seconds;
    Histogram *encode_seconds;
    Histogram *stage_commit_seconds;
    Histogram *chain_seconds;
    Histogram *ack_seconds;
    Histogram *commit_seconds;
    Histogram *commit_records;
    long long append_messages;
    long long written_bytes;
    long long segment_rollovers;
    Flight *flights;
    Py_ssize_t nflights;
} AppendRecorder;

static void
recorder_dealloc(AppendRecorder *self)
{
    Py_XDECREF(self->append_batches);
    Py_XDECREF(self->append_seconds);
    Py_XDECREF(self->encode_seconds);
    Py_XDECREF(self->stage_commit_seconds);
    Py_XDECREF(self->chain_seconds);
    Py_XDECREF(self->ack_seconds);
    Py_XDECREF(self->commit_seconds);
    Py_XDECREF(self->commit_records);
    PyMem_Free(self->flights);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Histogram *
new_histogram(PyObject *bounds)
{
    return (Histogram *)PyObject_CallOneArg((PyObject *)&HistogramType, bounds);
}

static int
recorder_init(AppendRecorder *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"latency_bounds", "batch_bounds", NULL};
    PyObject *latency, *batch;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!", keywords, &PyTuple_Type, &latency,
                                     &PyTuple_Type, &batch)) {
        return -1;
    }
    if (self->append_batches != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "an AppendRecorder is initialised once");
        return -1;
    }
    if ((self->append_batches = new_histogram(batch)) == NULL
        || (self->append_seconds = new_histogram(latency)) == NULL
        || (self->encode_seconds = new_histogram(latency)) == NULL
        || (self->stage_commit_seconds = new_histogram(latency)) == NULL
        || (self->chain_seconds = new_histogram(latency)) == NULL
        || (self->ack_seconds = new_histogram(latency)) == NULL
        || (self->commit_seconds = new_histogram(latency)) == NULL
        || (self->commit_records = new_histogram(batch)) == NULL) {
        return -1;
    }
    return 0;
}

static int
recorder_ready(const AppendRecorder *self)
{
    if (self->commit_records == NULL) {
        PyErr_SetString(PyExc_ValueError, "an AppendRecorder not initialised");
        return 0;
    }
    return 1;
}

/* The number of arguments, checked, as a C error message for `signature`. */
static int
arity(Py_ssize_t nargs, Py_ssize_t expected, const char *signature)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", signature, expected);
        return 0;
    }
    return 1;
}

static PyObject *
recorder_batch_started(AppendRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!arity(nargs, 2, "batch_started(first, count)") || !recorder_ready(self)) {
        return NULL;
    }
    Py_uintptr_t first = (Py_uintptr_t)PyLong_AsVoidPtr(args[0]);
    if (first == 0 && PyErr_Occurred()) {
        return NULL;
    }
    if (first == 0) {
        PyErr_SetString(PyExc_ValueError, "batch_started: first is the id of a message");
        return NULL;
    }
    long long count = PyLong_AsLongLong(args[1]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    double now;
    if (read_clock(&now) < 0) {
        return NULL;
    }
    Py_ssize_t free_slot = -1;
    for (Py_ssize_t i = 0; i < self->nflights; i++) {
        Flight *f = &self->flights[i];
        if (f->first == 0) {
            if (free_slot < 0) {
                free_slot = i;
            }
        }
        else if (f->first == first) {
            f->matched = 0;  /* the same message in two batches: the later one's */
        }
    }
    if (free_slot < 0) {
        Py_ssize_t grown = self->nflights ? self->nflights * 2 : 8;
        Flight *flights = PyMem_Realloc(self->flights, sizeof(Flight) * grown);
        if (flights == NULL) {
            return PyErr_NoMemory();
        }
        memset(flights + self->nflights, 0, sizeof(Flight) * (grown - self->nflights));
        free_slot = self->nflights;
        self->flights = flights;
        self->nflights = grown;
    }
    Flight *f = &self->flights[free_slot];
    *f = (Flight){.first = first, .matched = 1, .count = count, .started = now};
    return PyLong_FromSsize_t(free_slot);
}

static PyObject *
recorder_batch_ended(AppendRecorder *self, PyObject *token)
{
    if (!recorder_ready(self)) {
        return NULL;
    }
    Py_ssize_t slot = PyLong_AsSsize_t(token);
    if (slot == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (slot < 0 || slot >= self->nflights || self->flights[slot].first == 0) {
        PyErr_SetString(PyExc_ValueError, "batch_ended: not a batch in flight");
        return NULL;
    }
    double now;
    if (read_clock(&now) < 0) {
        return NULL;
    }
    Flight *f = &self->flights[slot];
    double total = now - f->started;
    observe(self->append_seconds, total, f->count);
    if (f->matched && f->serializations == 1) {
        double ack = now - f->acked_at;
        double chain = total - f->encode - f->commit - ack;
        observe(self->ack_seconds, ack, 1);
        observe(self->chain_seconds, chain > 0.0 ? chain : 0.0, 1);
    }
    f->first = 0;
    Py_RETURN_NONE;
}

static PyObject *
recorder_serialized(AppendRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!arity(nargs, 4, "serialized(started, encoded, count, first)")
        || !recorder_ready(self)) {
        return NULL;
    }
    double started, encoded, acked;
    long long count;
    Py_uintptr_t first;
    if (((started = PyFloat_AsDouble(args[0])) == -1.0 && PyErr_Occurred())
        || ((encoded = PyFloat_AsDouble(args[1])) == -1.0 && PyErr_Occurred())
        || ((count = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred())
        || ((first = (Py_uintptr_t)PyLong_AsVoidPtr(args[3])) == 0 && PyErr_Occurred())
        || read_clock(&acked) < 0) {
        return NULL;
    }
    self->append_messages += count;
    observe(self->append_batches, (double)count, 1);
    observe(self->encode_seconds, encoded - started, 1);
    observe(self->stage_commit_seconds, acked - encoded, 1);
    for (Py_ssize_t i = 0; i < self->nflights; i++) {
        Flight *f = &self->flights[i];
        if (f->first == first && first != 0 && f->matched) {
            f->encode += encoded - started;
            f->commit += acked - encoded;
            f->acked_at = acked;
            f->serializations += 1;
            break;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
recorder_committed(AppendRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!arity(nargs, 4, "committed(started, records, size, rolled_over)")
        || !recorder_ready(self)) {
        return NULL;
    }
    double started, now;
    long long records, size;
    int rolled_over;
    if (((started = PyFloat_AsDouble(args[0])) == -1.0 && PyErr_Occurred())
        || ((records = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred())
        || ((size = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred())
        || (rolled_over = PyObject_IsTrue(args[3])) < 0
        || read_clock(&now) < 0) {
        return NULL;
    }
    observe(self->commit_seconds, now - started, 1);
    observe(self->commit_records, (double)records, 1);
    self->written_bytes += size;
    self->segment_rollovers += rolled_over;
    Py_RETURN_NONE;
}

static PyObject *
recorder_now(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(ignored))
{
    double now;
    if (read_clock(&now) < 0) {
        return NULL;
    }
    return PyFloat_FromDouble(now);
}

static PyObject *
recorder_batches_in_flight(AppendRecorder *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < self->nflights; i++) {
        n += self->flights[i].first != 0;
    }
    return PyLong_FromSsize_t(n);
}

static PyMethodDef recorder_methods[] = {
    {"batch_started", (PyCFunction)(void (*)(void))recorder_batch_started, METH_FASTCALL,
     "A coalesced batch of count messages, the first of id first, starts now; returns "
     "the token for batch_ended."},
    {"batch_ended", (PyCFunction)recorder_batch_ended, METH_O,
     "The batch of this token (batch_started's) is answered now."},
    {"serialized", (PyCFunction)(void (*)(void))recorder_serialized, METH_FASTCALL,
     "count messages, the first of id first, encoded from started to encoded, are "
     "acknowledged by the backend now."},
    {"committed", (PyCFunction)(void (*)(void))recorder_committed, METH_FASTCALL,
     "A file group commit of records records and size bytes, handed off at started, is "
     "done now (rolled_over: it started a segment)."},
    {"batches_in_flight", (PyCFunction)recorder_batches_in_flight, METH_NOARGS,
     "Coalesced batches started and not yet ended."},
    {"now", (PyCFunction)recorder_now, METH_NOARGS | METH_STATIC,
     "The recorder's clock: time.perf_counter's."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef recorder_members[] = {
    {"append_batches", T_OBJECT, offsetof(AppendRecorder, append_batches), READONLY, NULL},
    {"append_seconds", T_OBJECT, offsetof(AppendRecorder, append_seconds), READONLY, NULL},
    {"encode_seconds", T_OBJECT, offsetof(AppendRecorder, encode_seconds), READONLY, NULL},
    {"stage_commit_seconds", T_OBJECT, offsetof(AppendRecorder, stage_commit_seconds),
     READONLY, NULL},
    {"chain_seconds", T_OBJECT, offsetof(AppendRecorder, chain_seconds), READONLY, NULL},
    {"ack_seconds", T_OBJECT, offsetof(AppendRecorder, ack_seconds), READONLY, NULL},
    {"commit_seconds", T_OBJECT, offsetof(AppendRecorder, commit_seconds), READONLY, NULL},
    {"commit_records", T_OBJECT, offsetof(AppendRecorder, commit_records), READONLY, NULL},
    {"append_messages", T_LONGLONG, offsetof(AppendRecorder, append_messages), 0, NULL},
    {"written_bytes", T_LONGLONG, offsetof(AppendRecorder, written_bytes), 0, NULL},
    {"segment_rollovers", T_LONGLONG, offsetof(AppendRecorder, segment_rollovers), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AppendRecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "walsvc.core._cmetrics.AppendRecorder",
    .tp_doc = "The append path's histograms and counters, filled once per batch "
              "(walsvc.core._metrics.AppendRecorder, compiled).",
    .tp_basicsize = sizeof(AppendRecorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
    .tp_members = recorder_members,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "walsvc.core._cmetrics",
    .m_doc = "walsvc.core._metrics's Histogram and AppendRecorder, compiled (optional).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__cmetrics(void)
{
    if (PyType_Ready(&HistogramType) < 0 || PyType_Ready(&AppendRecorderType) < 0) {
        return NULL;
    }
#if !defined(__linux__)
    PyObject *time = PyImport_ImportModule("time");
    perf_counter = time == NULL ? NULL : PyObject_GetAttrString(time, "perf_counter");
    Py_XDECREF(time);
    if (perf_counter == NULL) {
        return NULL;
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Histogram", (PyObject *)&HistogramType) < 0
        || PyModule_AddObjectRef(m, "AppendRecorder", (PyObject *)&AppendRecorderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
