/* interceptors._cshards: ShardedDict, a dict split in shards by key hash.
 *
 * The dedup window (interceptors/_dedup_window.py) is a mapping of up to max_keys keys
 * with constant churn: every append claims a new key and evicts the oldest. A CPython
 * dict never reuses the entry of a deleted key, so a dict of n keys under churn rebuilds
 * itself every n to 2n inserts, in one step that holds the event loop: 5.9 ms at the
 * default 100k keys, 53 ms at a million (measured: Dedup on memory://, keyed
 * append_many x100, a 1 ms monitor timer). ShardedDict spreads the keys over SHARDS
 * dicts, so a rebuild is of one shard: 1/SHARDS of that.
 *
 * It answers the mapping operations the window uses, as a dict would (same results,
 * same KeyError): len, [], []=, del, in, get, setdefault, pop, update (pairs). It is not
 * ordered across shards and does not iterate (the window keeps its own order). Keys must
 * be hashable; a key's shard comes from its hash, mixed (Fibonacci hashing) so that
 * the shard uses other bits than the shard dict's own probing does.
 *
 * KeyQueue: the window's keys in the order they leave it, a ring buffer that the cycle
 * collector does not track. A deque of a million keys is tracked, and a collection of
 * its generation reads every key (23.5 ms for the first young collection after filling a
 * million-key window on file://): the queue holds keys (str, or tuples of str), which
 * cannot refer back to it, and the window's runs, which refer back only through their
 * entry's owner while it runs (it is dropped once done), so the collector can ignore it. It is made with the window's size as its capacity, so that a full window
 * never grows it: growing copies the ring into a new one whose pages fault in during the
 * copy (13-14 ms at a million keys on asyncio, bench_dedup_stall).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SHARD_BITS 6
#define SHARDS (1 << SHARD_BITS)

/* A key of every shard that no caller can name: a shard with a key that is not a str is
 * a "general" dict, whose entries hold each key's hash. A dict of only str keys keeps
 * no hash in its entries and reads it from each key it probes, one more cache miss a
 * probe: under the window's churn its index is two thirds full (deleted keys stay as
 * dummies until a rebuild), so a lookup of a new key probes several slots, and on a
 * node taking keyed append_many that lookup was 14% of its CPU (perf). Measured, 100k keys under churn: a new
 * key's lookup 314-361 ns as str-only, 172-208 ns general. */
static PyObject *general_key;

typedef struct {
    PyObject_HEAD
    PyObject *shards[SHARDS]; /* dicts, each with general_key as well (not counted) */
    Py_ssize_t len;           /* the keys of all shards, kept as they change */
} ShardedDict;

/* KeyError(key), as a dict raises it (a tuple key stays one argument). */
static void
key_error(PyObject *key)
{
    PyObject *args = PyTuple_Pack(1, key);
    if (args != NULL) {
        PyErr_SetObject(PyExc_KeyError, args);
        Py_DECREF(args);
    }
}

/* The shard dict of `key`, borrowed; NULL with an error set if key is unhashable. */
static PyObject *
shard_of(ShardedDict *self, PyObject *key)
{
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1) {
        return NULL;
    }
    unsigned long long mixed = (unsigned long long)hash * 0x9E3779B97F4A7C15ULL;
    PyObject *shard = self->shards[mixed >> (64 - SHARD_BITS)];
    if (shard == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a ShardedDict cleared by the cycle collector");
    }
    return shard;
}

static int
sharded_traverse(ShardedDict *self, visitproc visit, void *arg)
{
    for (int i = 0; i < SHARDS; i++) {
        Py_VISIT(self->shards[i]);
    }
    return 0;
}

static int
sharded_clear(ShardedDict *self)
{
    for (int i = 0; i < SHARDS; i++) {
        Py_CLEAR(self->shards[i]);
    }
    self->len = 0;
    return 0;
}

static void
sharded_dealloc(ShardedDict *self)
{
    PyObject_GC_UnTrack(self);
    sharded_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
sharded_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "ShardedDict() takes no arguments");
        return NULL;
    }
    ShardedDict *self = (ShardedDict *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    for (int i = 0; i < SHARDS; i++) {
        if ((self->shards[i] = PyDict_New()) == NULL ||
            PyDict_SetItem(self->shards[i], general_key, Py_None) < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

static Py_ssize_t
sharded_length(ShardedDict *self)
{
    return self->len;
}

static PyObject *
sharded_subscript(ShardedDict *self, PyObject *key)
{
    PyObject *shard = shard_of(self, key);
    if (shard == NULL) {
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(shard, key);
    if (value == NULL) {
        if (!PyErr_Occurred()) {
            key_error(key);
        }
        return NULL;
    }
    return Py_NewRef(value);
}

static int
sharded_ass_subscript(ShardedDict *self, PyObject *key, PyObject *value)
{
    PyObject *shard = shard_of(self, key);
    if (shard == NULL) {
        return -1;
    }
    Py_ssize_t before = PyDict_GET_SIZE(shard);
    int done = value == NULL ? PyDict_DelItem(shard, key) : PyDict_SetItem(shard, key, value);
    self->len += PyDict_GET_SIZE(shard) - before;
    return done;
}

static int
sharded_contains(ShardedDict *self, PyObject *key)
{
    PyObject *shard = shard_of(self, key);
    return shard == NULL ? -1 : PyDict_Contains(shard, key);
}

/* The shard of a method's key (args[0]) for a call of 1 or 2 arguments, borrowed; NULL
 * with an error set (TypeError naming `signature`, or an unhashable key). */
static PyObject *
shard_of_call(ShardedDict *self, PyObject *const *args, Py_ssize_t nargs,
              const char *signature)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, signature);
        return NULL;
    }
    return shard_of(self, args[0]);
}

static PyObject *
sharded_get(ShardedDict *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *shard = shard_of_call(self, args, nargs, "get(key, default=None)");
    if (shard == NULL) {
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(shard, args[0]);
    if (value == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        value = nargs == 2 ? args[1] : Py_None;
    }
    return Py_NewRef(value);
}

static PyObject *
sharded_setdefault(ShardedDict *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *shard = shard_of_call(self, args, nargs, "setdefault(key, default=None)");
    if (shard == NULL) {
        return NULL;
    }
    Py_ssize_t before = PyDict_GET_SIZE(shard);
    PyObject *value = PyDict_SetDefault(shard, args[0], nargs == 2 ? args[1] : Py_None);
    self->len += PyDict_GET_SIZE(shard) - before;
    return Py_XNewRef(value);
}

static PyObject *
sharded_pop(ShardedDict *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *shard = shard_of_call(self, args, nargs, "pop(key[, default])");
    if (shard == NULL) {
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(shard, args[0]);
    if (value == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        if (nargs == 2) {
            return Py_NewRef(args[1]);
        }
        key_error(args[0]);
        return NULL;
    }
    Py_INCREF(value);
    if (PyDict_DelItem(shard, args[0]) < 0) {
        Py_DECREF(value);
        return NULL;
    }
    self->len -= 1;
    return value;
}

static PyObject *
sharded_update(ShardedDict *self, PyObject *pairs)
{
    PyObject *iterator = PyObject_GetIter(pairs);
    if (iterator == NULL) {
        return NULL;
    }
    PyObject *pair;
    while ((pair = PyIter_Next(iterator)) != NULL) {
        PyObject *key, *value;
        int ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2;
        if (!ok) {
            PyErr_SetString(PyExc_TypeError, "update takes an iterable of (key, value) pairs");
        }
        else {
            key = PyTuple_GET_ITEM(pair, 0);
            value = PyTuple_GET_ITEM(pair, 1);
            ok = sharded_ass_subscript(self, key, value) == 0;
        }
        Py_DECREF(pair);
        if (!ok) {
            Py_DECREF(iterator);
            return NULL;
        }
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
sharded_largest_shard(ShardedDict *self, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t largest = 0;
    for (int i = 0; i < SHARDS && self->shards[i] != NULL; i++) {
        if (PyDict_GET_SIZE(self->shards[i]) > largest) {
            largest = PyDict_GET_SIZE(self->shards[i]);
        }
    }
    return PyLong_FromSsize_t(largest > 0 ? largest - 1 : 0); /* not general_key */
}

static PyMethodDef sharded_methods[] = {
    {"get", (PyCFunction)(void (*)(void))sharded_get, METH_FASTCALL,
     "The value of key, or default (None)."},
    {"setdefault", (PyCFunction)(void (*)(void))sharded_setdefault, METH_FASTCALL,
     "The value of key, first set to default (None) if key is not there."},
    {"pop", (PyCFunction)(void (*)(void))sharded_pop, METH_FASTCALL,
     "Remove key and return its value; default, or KeyError, if it is not there."},
    {"update", (PyCFunction)sharded_update, METH_O,
     "Set each (key, value) pair of an iterable, in order."},
    {"largest_shard", (PyCFunction)sharded_largest_shard, METH_NOARGS,
     "The number of keys in the fullest shard."},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods sharded_as_mapping = {
    .mp_length = (lenfunc)sharded_length,
    .mp_subscript = (binaryfunc)sharded_subscript,
    .mp_ass_subscript = (objobjargproc)sharded_ass_subscript,
};

static PySequenceMethods sharded_as_sequence = {
    .sq_contains = (objobjproc)sharded_contains,
};

static PyTypeObject ShardedDictType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "interceptors._cshards.ShardedDict",
    .tp_doc = "A dict split in shards by key hash: no rebuild holds the loop for the "
              "whole mapping (interceptors._shards).",
    .tp_basicsize = sizeof(ShardedDict),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = sharded_new,
    .tp_dealloc = (destructor)sharded_dealloc,
    .tp_traverse = (traverseproc)sharded_traverse,
    .tp_clear = (inquiry)sharded_clear,
    .tp_methods = sharded_methods,
    .tp_as_mapping = &sharded_as_mapping,
    .tp_as_sequence = &sharded_as_sequence,
    .tp_hash = PyObject_HashNotImplemented,
};

/* ---- KeyQueue ---------------------------------------------------------------------- */

#define QUEUE_MIN 16

typedef struct {
    PyObject_HEAD
    PyObject **items; /* a ring of cap slots, owned references */
    Py_ssize_t cap;   /* a power of two, >= QUEUE_MIN */
    Py_ssize_t head;  /* the slot of the first key */
    Py_ssize_t len;
    Py_ssize_t min_cap; /* the capacity asked for: the ring never shrinks below it */
} KeyQueue;

static PyObject *
queue_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"capacity", NULL};
    Py_ssize_t capacity = QUEUE_MIN;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:KeyQueue", kwlist, &capacity)) {
        return NULL;
    }
    if (capacity < 0 || capacity > ((Py_ssize_t)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "KeyQueue capacity must be 0 to 2**40");
        return NULL;
    }
    Py_ssize_t cap = QUEUE_MIN;
    while (cap < capacity) {
        cap *= 2;
    }
    KeyQueue *self = (KeyQueue *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    /* Not touched until used: the allocator maps a large ring, and its pages fault in
     * one at a time as keys arrive, not in one step as a copy into a larger ring does. */
    self->items = PyMem_New(PyObject *, cap);
    if (self->items == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->cap = cap;
    self->min_cap = cap;
    return (PyObject *)self;
}

static void
queue_dealloc(KeyQueue *self)
{
    if (self->items != NULL) {
        for (Py_ssize_t i = 0; i < self->len; i++) {
            Py_DECREF(self->items[(self->head + i) & (self->cap - 1)]);
        }
        PyMem_Free(self->items);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Move the keys into a ring of new_cap slots (>= len), the first at slot 0. */
static int
queue_resize(KeyQueue *self, Py_ssize_t new_cap)
{
    PyObject **items = PyMem_New(PyObject *, new_cap);
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->len; i++) {
        items[i] = self->items[(self->head + i) & (self->cap - 1)];
    }
    PyMem_Free(self->items);
    self->items = items;
    self->cap = new_cap;
    self->head = 0;
    return 0;
}

static int
queue_push(KeyQueue *self, PyObject *key)
{
    if (self->len == self->cap && queue_resize(self, self->cap * 2) < 0) {
        return -1;
    }
    self->items[(self->head + self->len) & (self->cap - 1)] = Py_NewRef(key);
    self->len++;
    return 0;
}

static PyObject *
queue_append(KeyQueue *self, PyObject *key)
{
    if (queue_push(self, key) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
queue_extend(KeyQueue *self, PyObject *keys)
{
    PyObject *it = PyObject_GetIter(keys);
    if (it == NULL) {
        return NULL;
    }
    PyObject *key;
    while ((key = PyIter_Next(it)) != NULL) {
        int failed = queue_push(self, key);
        Py_DECREF(key);
        if (failed) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
queue_popleft(KeyQueue *self, PyObject *Py_UNUSED(ignored))
{
    if (self->len == 0) {
        PyErr_SetString(PyExc_IndexError, "pop from an empty KeyQueue");
        return NULL;
    }
    PyObject *key = self->items[self->head];
    self->head = (self->head + 1) & (self->cap - 1);
    self->len--;
    /* Give memory back once the queue is a quarter full (it outgrew its capacity). */
    if (self->cap > self->min_cap && self->len < self->cap / 4 &&
        queue_resize(self, self->cap / 2) < 0) {
        PyErr_Clear(); /* keeping the larger ring is no error */
    }
    return key;
}

static Py_ssize_t
queue_length(KeyQueue *self)
{
    return self->len;
}

static PyObject *
queue_item(KeyQueue *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->len) {
        PyErr_SetString(PyExc_IndexError, "KeyQueue index out of range");
        return NULL;
    }
    return Py_NewRef(self->items[(self->head + i) & (self->cap - 1)]);
}

/* Iterates a snapshot: the keys as they were when the iteration began. */
static PyObject *
queue_iter(KeyQueue *self)
{
    PyObject *snapshot = PyList_New(self->len);
    if (snapshot == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < self->len; i++) {
        PyList_SET_ITEM(snapshot, i, Py_NewRef(self->items[(self->head + i) & (self->cap - 1)]));
    }
    PyObject *it = PyObject_GetIter(snapshot);
    Py_DECREF(snapshot);
    return it;
}

static PyMethodDef queue_methods[] = {
    {"append", (PyCFunction)queue_append, METH_O, "Put key at the end."},
    {"extend", (PyCFunction)queue_extend, METH_O, "Put each key of an iterable at the end, in order."},
    {"popleft", (PyCFunction)queue_popleft, METH_NOARGS,
     "Remove and return the first key; IndexError if there is none."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods queue_as_sequence = {
    .sq_length = (lenfunc)queue_length,
    .sq_item = (ssizeargfunc)queue_item,
};

static PyTypeObject KeyQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "interceptors._cshards.KeyQueue",
    .tp_doc = "A first-in first-out queue of keys that the cycle collector does not track "
              "(interceptors._shards).",
    .tp_basicsize = sizeof(KeyQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = queue_new,
    .tp_dealloc = (destructor)queue_dealloc,
    .tp_methods = queue_methods,
    .tp_as_sequence = &queue_as_sequence,
    .tp_iter = (getiterfunc)queue_iter,
    .tp_hash = PyObject_HashNotImplemented,
};

/* ---- the window's batch loops ------------------------------------------------------ */

static PyObject *str_vchannel, *str_idempotency_key, *str_timetick, *str_txn;

/* Whether the PySequence_Fast `seq` no longer has `n` items (RuntimeError set): a list
 * changed by Python code run while the loop was reading it. */
static int
changed_size(PyObject *seq, Py_ssize_t n)
{
    if (PySequence_Fast_GET_SIZE(seq) == n) {
        return 0;
    }
    PyErr_SetString(PyExc_RuntimeError, "the messages changed while they were read");
    return 1;
}

/* The window key of one message (key_of in interceptors/_dedup_window.py: the vchannel,
 * NUL, the key), new; Py_None (borrowed) if the message takes the Python path: no key,
 * a key or vchannel not an exact str, or a vchannel with a NUL (key_of's tuple form). */
static PyObject *
window_key(PyObject *message)
{
    PyObject *vchannel = NULL, *key = NULL, *joined = Py_None;
    if ((key = PyObject_GetAttr(message, str_idempotency_key)) == NULL ||
        (vchannel = PyObject_GetAttr(message, str_vchannel)) == NULL) {
        joined = NULL;
        goto done;
    }
    if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(vchannel)) {
        goto done;
    }
    Py_ssize_t nv = PyUnicode_GET_LENGTH(vchannel), nk = PyUnicode_GET_LENGTH(key);
    if (PyUnicode_IS_COMPACT_ASCII(vchannel) && PyUnicode_IS_COMPACT_ASCII(key)) {
        const char *v = (const char *)PyUnicode_DATA(vchannel);
        if (memchr(v, 0, (size_t)nv) != NULL) {
            goto done;
        }
        joined = PyUnicode_New(nv + 1 + nk, 127);
        if (joined != NULL) {
            char *out = (char *)PyUnicode_DATA(joined);
            memcpy(out, v, (size_t)nv);
            out[nv] = 0;
            memcpy(out + nv + 1, PyUnicode_DATA(key), (size_t)nk);
        }
        goto done;
    }
    Py_ssize_t nul = PyUnicode_FindChar(vchannel, 0, 0, nv, 1);
    if (nul == -2) {
        joined = NULL;
    }
    else if (nul == -1) {
        PyObject *sep = PyUnicode_FromOrdinal(0), *head = NULL;
        if (sep != NULL && (head = PyUnicode_Concat(vchannel, sep)) != NULL) {
            joined = PyUnicode_Concat(head, key);
        }
        else {
            joined = NULL;
        }
        Py_XDECREF(sep);
        Py_XDECREF(head);
    }
done:
    Py_XDECREF(vchannel);
    Py_XDECREF(key);
    return joined;
}

static PyObject *
window_keys(PyObject *Py_UNUSED(module), PyObject *messages)
{
    PyObject *seq = PySequence_Fast(messages, "window_keys takes a sequence of messages");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *keys = PyList_New(n);
    for (Py_ssize_t i = 0; keys != NULL && i < n; i++) {
        if (changed_size(seq, n)) {
            Py_CLEAR(keys);
            break;
        }
        PyObject *message = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        PyObject *key = window_key(message); /* attribute reads: maybe Python code */
        Py_DECREF(message);
        if (key == NULL || key == Py_None) {
            Py_SETREF(keys, key == NULL ? NULL : Py_NewRef(Py_None));
            break;
        }
        PyList_SET_ITEM(keys, i, key);
    }
    Py_DECREF(seq);
    return keys;
}

/* After evict_one deleted `key`'s slot: pop `key` from the queue and raise *newest to
 * `tick`. 1, or 0 if the deletion ran code that changed the queue. */
static int
pop_evicted(KeyQueue *order, PyObject *key, long long tick, long long *newest)
{
    if (order->len == 0 || order->items[order->head] != key) {
        return 0; /* the deletion ran code that changed the queue */
    }
    Py_DECREF(queue_popleft(order, NULL)); /* key: the window's reference to it */
    if (tick > *newest) {
        *newest = tick;
    }
    return 1;
}

/* One step of evict_settled: drop `key` (the queue's oldest) and its slot if the slot is
 * a `settled` older than `horizon` or the table is over `max_keys`, raising *newest to its
 * timetick. 1 if dropped, 0 to stop here (the Python loop goes on from this key), -1 on an
 * error. Stops, too, if the queue's oldest is no longer `key` by the time it would pop. */
static int
evict_one(KeyQueue *order, ShardedDict *slots, PyObject *key, Py_ssize_t max_keys,
          long long horizon, PyObject *settled, long long *newest)
{
    PyObject *shard = shard_of(slots, key);
    if (shard == NULL) {
        return -1;
    }
    Py_INCREF(shard);
    int outcome = 0;
    PyObject *slot = PyDict_GetItemWithError(shard, key); /* borrowed */
    if (slot == NULL) {
        outcome = PyErr_Occurred() ? -1 : 0; /* not the window's: the Python loop knows why */
        goto done;
    }
    if (Py_TYPE(slot) != (PyTypeObject *)settled) {
        goto done; /* an Entry: in flight, blocked or a transaction's */
    }
    Py_INCREF(slot);
    PyObject *tick_object = PyObject_GetAttr(slot, str_timetick);
    Py_DECREF(slot);
    if (tick_object == NULL) {
        outcome = -1;
        goto done;
    }
    long long tick = PyLong_AsLongLong(tick_object);
    Py_DECREF(tick_object);
    if (tick == -1 && PyErr_Occurred()) {
        outcome = -1;
        goto done;
    }
    if (slots->len <= max_keys && tick >= horizon) {
        goto done; /* young enough, and the window is within its bound */
    }
    if (order->len == 0 || order->items[order->head] != key) {
        goto done; /* the queue changed meanwhile: the Python loop takes over */
    }
    if (PyDict_DelItem(shard, key) < 0) {
        outcome = -1;
        goto done;
    }
    slots->len -= 1;
    outcome = pop_evicted(order, key, tick, newest);
done:
    Py_DECREF(shard);
    return outcome;
}

static PyObject *
evict_settled(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyObject_TypeCheck(args[0], &KeyQueueType) ||
        !PyObject_TypeCheck(args[1], &ShardedDictType) || !PyType_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "evict_settled(order: KeyQueue, slots: ShardedDict,"
                                         " max_keys: int, horizon: int, settled: type)");
        return NULL;
    }
    KeyQueue *order = (KeyQueue *)args[0];
    ShardedDict *slots = (ShardedDict *)args[1];
    Py_ssize_t max_keys = PyLong_AsSsize_t(args[2]);
    long long horizon = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    long long newest = -1;
    while (order->len > 0) {
        /* Held, with its slot: the key's hash and equality and the slot's timetick may
         * be Python code, which may change the queue and the table. */
        PyObject *key = Py_NewRef(order->items[order->head]);
        int go_on = evict_one(order, slots, key, max_keys, horizon, args[4], &newest);
        Py_DECREF(key);
        if (go_on < 0) {
            return NULL;
        }
        if (go_on == 0) {
            break;
        }
    }
    return PyLong_FromLongLong(newest);
}

/* The number whose canonical counter (no leading zero; lowercase hex of at most 15
 * digits if base is 16, decimal of at most 18 if 10) is key[from:], or -1 if key[from:]
 * is not one (counted_key in interceptors/_shards.py). */
static long long
counter_of(PyObject *key, Py_ssize_t from, int base)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(key) - from;
    if (n < 1 || n > (base == 16 ? 15 : 18)) {
        return -1;
    }
    int kind = PyUnicode_KIND(key);
    const void *data = PyUnicode_DATA(key);
    long long value = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = kind == PyUnicode_1BYTE_KIND ? ((const Py_UCS1 *)data)[from + i]
                                                 : PyUnicode_READ(kind, data, from + i);
        int digit;
        if (c >= '0' && c <= '9') {
            digit = (int)(c - '0');
        }
        else if (base == 16 && c >= 'a' && c <= 'f') {
            digit = (int)(c - 'a') + 10;
        }
        else {
            return -1;
        }
        if (i == 0 && digit == 0 && n > 1) {
            return -1;
        }
        value = value * base + digit;
    }
    return value;
}

/* counted_run(messages) (interceptors/_shards.py): (stem, first, vchannels) if the
 * messages are a run of counted keys, else None. */
static PyObject *
counted_run(PyObject *Py_UNUSED(module), PyObject *messages)
{
    PyObject *seq = PySequence_Fast(messages, "counted_run takes a sequence of messages");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *stem = NULL, *vchannels = NULL, *key = NULL, *attr = NULL;
    PyObject *message = NULL; /* held while its attributes are read */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), dot = -1;
    long long first = -1;
    if (n < 2) {
        goto none;
    }
    if ((key = PyObject_GetAttr(PySequence_Fast_GET_ITEM(seq, 0), str_idempotency_key)) == NULL) {
        goto done;
    }
    if (!PyUnicode_CheckExact(key)) {
        goto none;
    }
    Py_ssize_t length = PyUnicode_GET_LENGTH(key);
    Py_ssize_t hash_at = PyUnicode_FindChar(key, '#', 0, length, -1);
    dot = PyUnicode_FindChar(key, '.', 0, length, -1);
    if (dot == -2 || hash_at == -2) {
        goto done;
    }
    int base = 16;
    long long bound = 1LL << 60; /* 16**15 */
    if (hash_at > dot) {
        dot = hash_at, base = 10, bound = 1000000000000000000LL; /* 10**18 */
    }
    if (dot == -1 || (first = counter_of(key, dot + 1, base)) < 0 || first + n > bound) {
        goto none;
    }
    if ((stem = PyUnicode_Substring(key, 0, dot + 1)) == NULL ||
        (vchannels = PyTuple_New(n)) == NULL) {
        goto done;
    }
    Py_CLEAR(key);
    int ascii = PyUnicode_IS_COMPACT_ASCII(stem);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (changed_size(seq, n)) {
            goto done;
        }
        Py_XSETREF(message, Py_NewRef(PySequence_Fast_GET_ITEM(seq, i)));
        if ((attr = PyObject_GetAttr(message, str_txn)) == NULL) {
            goto done;
        }
        int in_txn = attr != Py_None;
        Py_CLEAR(attr);
        if (in_txn) {
            goto none;
        }
        if ((key = PyObject_GetAttr(message, str_idempotency_key)) == NULL) {
            goto done;
        }
        if (!PyUnicode_CheckExact(key)) {
            goto none;
        }
        Py_ssize_t matched;
        if (ascii && PyUnicode_IS_COMPACT_ASCII(key)) { /* the usual case: one memcmp */
            matched = PyUnicode_GET_LENGTH(key) > dot + 1 &&
                      memcmp(PyUnicode_DATA(key), PyUnicode_DATA(stem), (size_t)(dot + 1)) == 0;
        }
        else if ((matched = PyUnicode_Tailmatch(key, stem, 0, dot + 1, -1)) < 0) {
            goto done;
        }
        if (!matched || counter_of(key, dot + 1, base) != first + i) {
            goto none;
        }
        Py_CLEAR(key);
        if ((attr = PyObject_GetAttr(message, str_vchannel)) == NULL) {
            goto done;
        }
        if (!PyUnicode_CheckExact(attr)) {
            goto none;
        }
        PyTuple_SET_ITEM(vchannels, i, attr); /* steals it */
        attr = NULL;
    }
    result = Py_BuildValue("(OLO)", stem, first, vchannels);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(message);
    Py_XDECREF(attr);
    Py_XDECREF(key);
    Py_XDECREF(stem);
    Py_XDECREF(vchannels);
    Py_DECREF(seq);
    return result;
}

/* The stem (new) and number of counted key `text` (counted_key in
 * interceptors/_shards.py): 0 and *stem NULL if it is not one, -1 on an error. */
static int
parse_counted(PyObject *text, PyObject **stem, long long *number)
{
    *stem = NULL;
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    Py_ssize_t dot = PyUnicode_FindChar(text, '.', 0, length, -1);
    Py_ssize_t hash_at = PyUnicode_FindChar(text, '#', 0, length, -1);
    if (dot == -2 || hash_at == -2) {
        return -1;
    }
    int base = 16;
    if (hash_at > dot) {
        dot = hash_at, base = 10;
    }
    if (dot == -1 || (*number = counter_of(text, dot + 1, base)) < 0) {
        return 0;
    }
    *stem = PyUnicode_Substring(text, 0, dot + 1);
    return *stem == NULL ? -1 : 0;
}

/* spans_hold(keys, spans) (interceptors/_shards.py): True if the counted key of one of
 * the window keys has a number within its stem's span [low, end) of spans. */
static PyObject *
spans_hold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "spans_hold(keys, spans: dict)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "spans_hold takes a sequence of keys");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *found = Py_False;
    for (Py_ssize_t i = 0, n = PySequence_Fast_GET_SIZE(seq); i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i), *text = NULL;
        if (PyUnicode_CheckExact(key)) {
            Py_ssize_t nul = PyUnicode_FindChar(key, 0, 0, PyUnicode_GET_LENGTH(key), 1);
            if (nul == -2) {
                found = NULL;
                break;
            }
            if (nul == -1) {
                continue; /* not a window key */
            }
            if ((text = PyUnicode_Substring(key, nul + 1, PyUnicode_GET_LENGTH(key))) == NULL) {
                found = NULL;
                break;
            }
        }
        else if (PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) == 2 &&
                 PyUnicode_CheckExact(PyTuple_GET_ITEM(key, 1))) {
            text = Py_NewRef(PyTuple_GET_ITEM(key, 1));
        }
        else {
            continue;
        }
        PyObject *stem;
        long long number;
        int parsed = parse_counted(text, &stem, &number);
        Py_DECREF(text);
        if (parsed < 0) {
            found = NULL;
            break;
        }
        if (stem == NULL) {
            continue;
        }
        PyObject *span = PyDict_GetItemWithError(args[1], stem); /* borrowed */
        Py_DECREF(stem);
        if (span == NULL) {
            if (PyErr_Occurred()) {
                found = NULL;
                break;
            }
            continue;
        }
        if (!PyTuple_CheckExact(span) || PyTuple_GET_SIZE(span) != 2) {
            PyErr_SetString(PyExc_TypeError, "a span is a tuple (low, end)");
            found = NULL;
            break;
        }
        Py_INCREF(span); /* __index__ of its items may change the dict */
        long long low = PyLong_AsLongLong(PyTuple_GET_ITEM(span, 0));
        long long end = PyLong_AsLongLong(PyTuple_GET_ITEM(span, 1));
        Py_DECREF(span);
        if (PyErr_Occurred()) {
            found = NULL;
            break;
        }
        if (low <= number && number < end) {
            found = Py_True;
            break;
        }
    }
    Py_DECREF(seq);
    return Py_XNewRef(found);
}

static PyMethodDef module_methods[] = {
    {"spans_hold", (PyCFunction)(void (*)(void))spans_hold, METH_FASTCALL,
     "spans_hold(keys, spans): True if a window key's counted key is numbered within its "
     "stem's span (interceptors._shards)."},
    {"counted_run", (PyCFunction)counted_run, METH_O,
     "counted_run(messages): (stem, first, vchannels) if the messages are a run of counted "
     "keys (interceptors._shards), else None."},
    {"window_keys", (PyCFunction)window_keys, METH_O,
     "window_keys(messages): each message's window key, or None if one takes the Python "
     "path (no key, not str, a vchannel with NUL)."},
    {"evict_settled", (PyCFunction)(void (*)(void))evict_settled, METH_FASTCALL,
     "evict_settled(order, slots, max_keys, horizon, settled): drop the oldest keys whose "
     "slot is of type settled while the window is over max_keys or their timetick is below "
     "horizon; return the newest timetick dropped, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "interceptors._cshards",
    .m_doc = "ShardedDict and KeyQueue, compiled (optional: the dedup window then is one "
             "dict and a deque).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__cshards(void)
{
    if (PyType_Ready(&ShardedDictType) < 0 || PyType_Ready(&KeyQueueType) < 0) {
        return NULL;
    }
    if ((general_key = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) == NULL ||
        (str_vchannel = PyUnicode_InternFromString("vchannel")) == NULL ||
        (str_idempotency_key = PyUnicode_InternFromString("idempotency_key")) == NULL ||
        (str_timetick = PyUnicode_InternFromString("timetick")) == NULL ||
        (str_txn = PyUnicode_InternFromString("txn")) == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "ShardedDict", (PyObject *)&ShardedDictType) < 0 ||
        PyModule_AddObjectRef(m, "KeyQueue", (PyObject *)&KeyQueueType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
