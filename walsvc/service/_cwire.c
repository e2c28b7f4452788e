/* walsvc.service._cwire: the node's per-message work, compiled: a batch of
 * ImmutableMessages laid out as the msgpack bytes of one Delivered(stream, [...]), the
 * results of appends as the bytes of their Appended answers, and the WireMessages of an
 * append turned into walsvc.Messages.
 *
 * Why: a node that serves a stream converts every message it delivers into a
 * WireDelivered (ids marshalled to text, a producer key dropped) and msgspec encodes it:
 * about 0.75 us of CPU per message in Python, as much as the node's scan of ten records
 * a 1-of-16 filter rejects. This walk writes the same bytes in about a tenth of that.
 * An append pays the same kind of toll twice: building each Message from its
 * WireMessage (msgspec's call plus Message.__post_init__ in Python, 0.40 us) and
 * answering with its result as a WireResult (ids to text) encoded by msgspec (0.52 us
 * in an Appended of 100, 0.85 us alone), a fifth of the node's CPU per message of an
 * append_many. Here (timeit, 100 messages of 100 B): 0.066 us a Message, freeing it
 * included, and 0.033 us a result; node CPU per message of append_many x100 on
 * memory://, 4.6-4.9 -> 3.7-3.9 us, and of 64 producers' single appends, 8.7 -> 7.4-7.7.
 *
 * bind(message_cls, txn_cls, sequence_id_cls, producer_prefix, result_cls, append_cls,
 *      wire_cls, type_cls, max_vchannel_bytes) -> bool
 *
 * finds the field slots of walsvc.ImmutableMessage (message_cls), walsvc.TxnContext
 * (txn_cls), walsvc.core._ids.SequenceMessageId (sequence_id_cls), walsvc.AppendResult
 * (result_cls), walsvc.Message (append_cls) and the wire's WireMessage (wire_cls), all
 * msgspec Structs whose fields are slots; False (nothing bound) if a field is not a
 * plain object slot, or if walsvc.Message holds anything but its six fields (no
 * __dict__, weakref or cached hash: an instance is built here slot by slot).
 * `producer_prefix` begins the producer keys a delivered message does not carry
 * (PRODUCER_KEY_PREFIX); `type_cls` is walsvc.MessageType and `max_vchannel_bytes` the
 * longest vchannel a Message takes (_MAX_VCHANNEL_BYTES, in UTF-8 bytes).
 *
 * encode_delivered(stream, messages, schemes) -> bytes | None
 *
 * the bytes msgspec.msgpack encodes for Delivered(stream, [wire_delivered(m) for m in
 * messages]) (walsvc.service._wire), byte for byte: the same formats msgspec picks for
 * each int, str, bytes, map and array. `schemes` maps each SequenceMessageId subclass
 * met so far to its marshalled prefix ("file:"); the caller fills it. Returns None,
 * encoding nothing, for a batch it does not take (the caller then runs the Python path,
 * which encodes it or raises what msgspec raises): a message of another class, an id
 * that is not a SequenceMessageId of a class in `schemes`, properties that are not a
 * dict (or a mappingproxy of one) of str, an int outside msgpack's 64 bits, a str that
 * is not valid UTF-8, or before bind succeeded. A message's body (a committed
 * transaction's messages) is walked the same way.
 *
 * encode_appended(request, results, schemes) -> bytes | None
 *
 * the bytes of Appended(request, [wire_result(r) for r in results]), as msgspec encodes
 * them, from a list of AppendResults; None as encode_delivered declines: a result that is
 * not an AppendResult itself, an id (or last-confirmed id) that is not a
 * SequenceMessageId of a class in `schemes` or whose number is outside 64 bits, an int
 * outside msgpack's 64 bits.
 *
 * encode_appended_each(requests, outcomes, schemes) -> list[bytes | None] | None
 *
 * for the outcomes of a group of single appends (an AppendResult or the exception of
 * each of `requests`, two lists of one length), the answer of each that succeeded: the
 * bytes of Appended(request, [wire_result(outcome)]), and None for an outcome that is
 * not an AppendResult (the caller sends its Failed). None for the whole group if one
 * result is declined as encode_appended declines it.
 *
 * messages_of(wires, types) -> list[walsvc.Message] | None
 *
 * [message_of(w) for w in wires]: each WireMessage as the walsvc.Message a client sent,
 * built here without running Message.__post_init__, and only when every check of it
 * holds: the payload is bytes; the vchannel a str of valid UTF-8 (no lone surrogate) of
 * at most max_vchannel_bytes UTF-8 bytes; the type an int that `types` (int -> member
 * of walsvc.MessageType) maps to a member; the properties a dict of str to str of valid
 * UTF-8; the idempotency key None or a str of valid UTF-8 (exact types throughout).
 * Anything else, or any WireMessage of another class, declines the whole list (None):
 * the caller's Python path builds them, raising the InvalidMessage Message raises. A
 * Message is allocated as msgspec allocates a Struct (GC allocation, slots zeroed, its
 * fields set, tracked by the collector only if a field may be, as msgspec does);
 * Message caches no hash, so nothing else is set. Its properties are the WireMessage's
 * dict itself and its txn None, as with message_of.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <structmember.h>

#include "../_cmsgpack.h"

/* ImmutableMessage's fields, in WireDelivered's order where they map one to one. */
enum {
    M_ID,
    M_TIMETICK,
    M_VCHANNEL,
    M_TYPE,
    M_PAYLOAD,
    M_PROPERTIES,
    M_LC,
    M_TXN,
    M_KEY,
    M_TERM,
    M_PERSISTED,
    M_DURABLE_TICK,
    M_BODY,
    M_COUNT
};
static const char *const message_fields[M_COUNT] = {
    "message_id", "timetick", "vchannel", "type", "payload", "properties", "last_confirmed_id",
    "txn", "idempotency_key", "term", "persisted", "durable_tick", "body",
};
static Py_ssize_t message_offsets[M_COUNT];
static Py_ssize_t txn_offsets[2]; /* txn_id, keepalive_ms */
static Py_ssize_t seq_offset;     /* SequenceMessageId.seq */
static PyTypeObject *message_type; /* strong references once bound */
static PyTypeObject *txn_type;
static PyObject *producer_prefix;

/* AppendResult's fields, in WireResult's order. */
enum { R_ID, R_TIMETICK, R_LC, R_COUNT };
static const char *const result_fields[R_COUNT] = {
    "message_id", "timetick", "last_confirmed_id",
};
/* walsvc.Message's fields, in its slot order; WireMessage has all but the txn. */
enum { A_PAYLOAD, A_VCHANNEL, A_TYPE, A_PROPERTIES, A_KEY, A_TXN, A_COUNT };
static const char *const append_fields[A_COUNT] = {
    "payload", "vchannel", "type", "properties", "idempotency_key", "txn",
};
#define W_COUNT A_TXN
static Py_ssize_t result_offsets[R_COUNT];
static Py_ssize_t append_offsets[A_COUNT];
static Py_ssize_t wire_offsets[W_COUNT];
static PyTypeObject *result_type; /* strong references once bound */
static PyTypeObject *append_type;
static PyTypeObject *wire_type;
static PyTypeObject *type_type;
static Py_ssize_t max_vchannel_bytes;

/* The tags of Delivered and Appended and the lengths of WireDelivered and WireResult, as
 * msgspec encodes them. */
#define DELIVERED_TAG 26
#define WIRE_FIELDS 13
#define APPENDED_TAG 23
#define RESULT_FIELDS 3

/* True if `cls` is a Struct whose instances hold exactly its `count` field slots:
 * nothing that messages_of would leave unset (a __dict__, a weakref list, a cached hash,
 * a field it does not know). */
static int
only_fields(PyObject *cls, Py_ssize_t count)
{
    PyTypeObject *type = (PyTypeObject *)cls;
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_itemsize != 0 ||
        type->tp_dictoffset != 0 || type->tp_weaklistoffset != 0 ||
        type->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + count * sizeof(PyObject *))) {
        return 0;
    }
    PyObject *fields = PyObject_GetAttrString(cls, "__struct_fields__");
    if (fields == NULL) {
        PyErr_Clear();
        return 0;
    }
    int only = PyTuple_CheckExact(fields) && PyTuple_GET_SIZE(fields) == count;
    Py_DECREF(fields);
    return only;
}

static PyObject *
bind(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *message_cls, *txn_cls, *seq_cls, *prefix, *result_cls, *append_cls, *wire_cls,
        *type_cls;
    Py_ssize_t max_vchannel;
    if (!PyArg_ParseTuple(args, "O!O!O!UO!O!O!O!n", &PyType_Type, &message_cls, &PyType_Type,
                          &txn_cls, &PyType_Type, &seq_cls, &prefix, &PyType_Type, &result_cls,
                          &PyType_Type, &append_cls, &PyType_Type, &wire_cls, &PyType_Type,
                          &type_cls, &max_vchannel)) {
        return NULL;
    }
    Py_ssize_t offsets[M_COUNT], txn[2], seq, results[R_COUNT], appends[A_COUNT],
        wires[W_COUNT];
    for (int f = 0; f < M_COUNT; f++) {
        offsets[f] = offset_of(message_cls, message_fields[f]);
    }
    txn[0] = offset_of(txn_cls, "txn_id");
    txn[1] = offset_of(txn_cls, "keepalive_ms");
    seq = offset_of(seq_cls, "seq");
    for (int f = 0; f < R_COUNT; f++) {
        results[f] = offset_of(result_cls, result_fields[f]);
    }
    for (int f = 0; f < A_COUNT; f++) {
        appends[f] = offset_of(append_cls, append_fields[f]);
    }
    for (int f = 0; f < W_COUNT; f++) {
        wires[f] = offset_of(wire_cls, append_fields[f]);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    int usable = txn[0] >= 0 && txn[1] >= 0 && seq >= 0 && max_vchannel >= 0 &&
                 only_fields(append_cls, A_COUNT);
    for (int f = 0; f < M_COUNT; f++) {
        usable = usable && offsets[f] >= 0;
    }
    for (int f = 0; f < R_COUNT; f++) {
        usable = usable && results[f] >= 0;
    }
    for (int f = 0; f < A_COUNT; f++) {
        usable = usable && appends[f] >= 0;
    }
    for (int f = 0; f < W_COUNT; f++) {
        usable = usable && wires[f] >= 0;
    }
    if (!usable) {
        Py_RETURN_FALSE;
    }
    memcpy(message_offsets, offsets, sizeof offsets);
    memcpy(txn_offsets, txn, sizeof txn);
    seq_offset = seq;
    memcpy(result_offsets, results, sizeof results);
    memcpy(append_offsets, appends, sizeof appends);
    memcpy(wire_offsets, wires, sizeof wires);
    max_vchannel_bytes = max_vchannel;
    Py_XSETREF(txn_type, (PyTypeObject *)Py_NewRef(txn_cls));
    Py_XSETREF(producer_prefix, Py_NewRef(prefix));
    Py_XSETREF(result_type, (PyTypeObject *)Py_NewRef(result_cls));
    Py_XSETREF(append_type, (PyTypeObject *)Py_NewRef(append_cls));
    Py_XSETREF(wire_type, (PyTypeObject *)Py_NewRef(wire_cls));
    Py_XSETREF(type_type, (PyTypeObject *)Py_NewRef(type_cls));
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(message_cls)); /* last: "bound" */
    Py_RETURN_TRUE;
}

/* "00" to "99": the decimal digits of a number are written two at a time. */
static const char digit_pairs[] = "00010203040506070809101112131415161718192021222324"
                                  "25262728293031323334353637383940414243444546474849"
                                  "50515253545556575859606162636465666768697071727374"
                                  "75767778798081828384858687888990919293949596979899";

static const unsigned long long powers_of_ten[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
    100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
    10000000000000ULL, 100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
    100000000000000000ULL, 1000000000000000000ULL, 10000000000000000000ULL,
};

/* How many decimal digits `u` has: from the bit length of u | 1 (as many digits as u,
 * and one bit for 0) times log10(2) (~ 1233 / 4096), plus one if it reaches the next
 * power of ten. */
static int
decimal_width(unsigned long long u)
{
    u |= 1;
    int width = ((64 - __builtin_clzll(u)) * 1233) >> 12;
    return width + (width < 20 && u >= powers_of_ten[width]);
}

/* The decimal digits of `u` ending at `end`, written backwards. */
static void
put_decimal(char *end, unsigned long long u)
{
    while (u >= 100) {
        unsigned pair = (unsigned)(u % 100) * 2;
        u /= 100;
        *--end = digit_pairs[pair + 1];
        *--end = digit_pairs[pair];
    }
    if (u >= 10) {
        *--end = digit_pairs[u * 2 + 1];
        *--end = digit_pairs[u * 2];
    }
    else {
        *--end = (char)('0' + u);
    }
}

/* The id classes of one call: `schemes`, the class last looked up in it with its prefix
 * (a batch's ids are of one class), and the last last-confirmed id written with its
 * bytes (consecutive messages and results mostly share it; the caller's list holds it,
 * so its address names it for the whole call). */
typedef struct {
    PyObject *schemes;
    PyTypeObject *type;
    PyObject *prefix;
    PyObject *lc;
    Py_ssize_t lc_size;
    char lc_bytes[96];
} Ids;

/* A SequenceMessageId of a class in `schemes` as its marshalled text ("file:12"). */
static int
put_id(Buffer *b, PyObject *id, Ids *ids)
{
    PyObject *prefix = ids->prefix;
    if (Py_TYPE(id) != ids->type) {
        prefix = PyDict_GetItemWithError(ids->schemes, (PyObject *)Py_TYPE(id));
        if (prefix == NULL) {
            return PyErr_Occurred() ? -1 : 1;
        }
        if (!PyBytes_CheckExact(prefix) || PyBytes_GET_SIZE(prefix) > 64) {
            return 1;
        }
        ids->type = Py_TYPE(id);
        ids->prefix = prefix;
    }
    PyObject *seq = slot(id, seq_offset);
    if (seq == NULL || !PyLong_CheckExact(seq)) {
        return 1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(seq, &overflow);
    if (overflow != 0) {
        return 1;
    }
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    int width = decimal_width(u);
    Py_ssize_t p = PyBytes_GET_SIZE(prefix);
    Py_ssize_t n = p + (v < 0) + width; /* at most 85: a fixstr or a str 8 */
    if (reserve(b, 2 + n) < 0) {
        return -1;
    }
    char *out = b->data + b->size;
    if (n < 32) {
        *out++ = (char)(0xa0 | n);
    }
    else {
        *out++ = (char)0xd9;
        *out++ = (char)n;
    }
    memcpy(out, PyBytes_AS_STRING(prefix), (size_t)p);
    out += p;
    if (v < 0) {
        *out++ = '-';
    }
    put_decimal(out + width, u);
    b->size = out + width - b->data;
    return 0;
}

/* A last-confirmed id: nil for None, else as put_id, remembering the last one. */
static int
put_lc(Buffer *b, PyObject *lc, Ids *ids)
{
    if (lc == Py_None) {
        return put_byte(b, 0xc0);
    }
    if (lc == ids->lc) {
        return put_bytes(b, ids->lc_bytes, ids->lc_size);
    }
    Py_ssize_t start = b->size;
    int s = put_id(b, lc, ids);
    if (s == 0 && b->size - start <= (Py_ssize_t)sizeof ids->lc_bytes) {
        ids->lc = lc;
        ids->lc_size = b->size - start;
        memcpy(ids->lc_bytes, b->data + start, (size_t)ids->lc_size);
    }
    return s;
}

/* A map of str to str: a dict, or the read-only view of one (mappingproxy) that the
 * decoders give, in insertion order as dict(view) has it. */
static int
put_properties(Buffer *b, PyObject *properties)
{
    if (!PyDict_CheckExact(properties)) {
        if (!Py_IS_TYPE(properties, &PyDictProxy_Type)) {
            return 1;
        }
        Py_ssize_t n = PyObject_Length(properties);
        if (n < 0) {
            return -1;
        }
        if (n == 0) {
            return put_byte(b, 0x80);
        }
        PyObject *items = PyMapping_Items(properties);
        if (items == NULL) {
            return -1;
        }
        Py_ssize_t count = PyList_GET_SIZE(items);
        int status = put_header(b, count, 0x80, 16, 0, 0xde, 0xdf);
        for (Py_ssize_t i = 0; status == 0 && i < count; i++) {
            PyObject *item = PyList_GET_ITEM(items, i);
            status = put_str(b, PyTuple_GET_ITEM(item, 0));
            if (status == 0) {
                status = put_str(b, PyTuple_GET_ITEM(item, 1));
            }
        }
        Py_DECREF(items);
        return status;
    }
    int status = put_header(b, PyDict_GET_SIZE(properties), 0x80, 16, 0, 0xde, 0xdf);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (status == 0 && PyDict_Next(properties, &pos, &key, &value)) {
        status = put_str(b, key);
        if (status == 0) {
            status = put_str(b, value);
        }
    }
    return status;
}

static int put_message(Buffer *b, PyObject *m, Ids *ids);

/* WireDelivered's fields after the payload: properties, lc, txn, key, term, persisted,
 * durable tick, body. */
static int
put_tail(Buffer *b, PyObject *m, Ids *ids)
{
    int s = put_properties(b, slot(m, message_offsets[M_PROPERTIES]));
    PyObject *lc = slot(m, message_offsets[M_LC]);
    if (s == 0) {
        s = put_lc(b, lc, ids);
    }
    PyObject *txn = slot(m, message_offsets[M_TXN]);
    if (s == 0 && txn == Py_None) {
        s = put_byte(b, 0xc0);
    }
    else if (s == 0) {
        if (!Py_IS_TYPE(txn, txn_type)) {
            return 1;
        }
        s = put_array(b, 2);
        if (s == 0) {
            s = put_int(b, slot(txn, txn_offsets[0]));
        }
        if (s == 0) {
            s = put_int(b, slot(txn, txn_offsets[1]));
        }
    }
    PyObject *key = slot(m, message_offsets[M_KEY]);
    if (s == 0) {
        int producers = key != Py_None && PyUnicode_CheckExact(key) &&
                        PyUnicode_Tailmatch(key, producer_prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
        s = key == Py_None || producers ? put_byte(b, 0xc0) : put_str(b, key);
    }
    if (s == 0) {
        s = put_int(b, slot(m, message_offsets[M_TERM]));
    }
    PyObject *persisted = slot(m, message_offsets[M_PERSISTED]);
    if (s == 0) {
        if (!PyBool_Check(persisted)) {
            return 1;
        }
        s = put_byte(b, persisted == Py_True ? 0xc3 : 0xc2);
    }
    if (s == 0) {
        s = put_int(b, slot(m, message_offsets[M_DURABLE_TICK]));
    }
    PyObject *body = slot(m, message_offsets[M_BODY]);
    if (s == 0) {
        if (!PyTuple_CheckExact(body)) {
            return 1;
        }
        s = put_array(b, PyTuple_GET_SIZE(body));
        for (Py_ssize_t i = 0; s == 0 && i < PyTuple_GET_SIZE(body); i++) {
            s = put_message(b, PyTuple_GET_ITEM(body, i), ids);
        }
    }
    return s;
}

/* One WireDelivered: 0 written, 1 not taken, -1 error. */
static int
put_message(Buffer *b, PyObject *m, Ids *ids)
{
    if (!Py_IS_TYPE(m, message_type)) {
        return 1;
    }
    int s = put_array(b, WIRE_FIELDS);
    if (s == 0) {
        s = put_id(b, slot(m, message_offsets[M_ID]), ids);
    }
    if (s == 0) {
        s = put_int(b, slot(m, message_offsets[M_TIMETICK]));
    }
    if (s == 0) {
        s = put_str(b, slot(m, message_offsets[M_VCHANNEL]));
    }
    if (s == 0) {
        s = put_int(b, slot(m, message_offsets[M_TYPE]));
    }
    if (s == 0) {
        s = put_bin(b, slot(m, message_offsets[M_PAYLOAD]));
    }
    return s != 0 ? s : put_tail(b, m, ids);
}

static PyObject *
encode_delivered(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *stream, *messages, *schemes;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyLong_Type, &stream, &PyList_Type, &messages,
                          &PyDict_Type, &schemes)) {
        return NULL;
    }
    if (message_type == NULL) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(messages);
    Buffer b = EMPTY_BUFFER;
    int s = reserve(&b, 64 + n * 256);
    if (s == 0) {
        s = put_array(&b, 3);
    }
    if (s == 0) {
        s = put_byte(&b, DELIVERED_TAG);
    }
    if (s == 0) {
        s = put_int(&b, stream);
    }
    if (s == 0) {
        s = put_array(&b, n);
    }
    Ids ids = {schemes, NULL, NULL, NULL, 0, {0}};
    for (Py_ssize_t i = 0; s == 0 && i < n; i++) {
        s = put_message(&b, PyList_GET_ITEM(messages, i), &ids);
    }
    PyObject *result = NULL;
    if (s == 0) {
        result = copy_out(&b);
    }
    else if (s > 0) {
        result = Py_NewRef(Py_None);
    }
    discard(&b);
    return result;
}

/* -- Appended ------------------------------------------------------------------------- */

/* One WireResult from an AppendResult: 0 written, 1 not taken, -1 error. */
static int
put_result(Buffer *b, PyObject *r, Ids *ids)
{
    if (!Py_IS_TYPE(r, result_type)) {
        return 1;
    }
    PyObject *id = slot(r, result_offsets[R_ID]);
    PyObject *timetick = slot(r, result_offsets[R_TIMETICK]);
    PyObject *lc = slot(r, result_offsets[R_LC]);
    if (id == NULL || timetick == NULL || lc == NULL) {
        return 1;
    }
    int s = put_array(b, RESULT_FIELDS);
    if (s == 0) {
        s = put_id(b, id, ids);
    }
    if (s == 0) {
        s = put_int(b, timetick);
    }
    if (s == 0) {
        s = put_lc(b, lc, ids);
    }
    return s;
}

/* The head of Appended(request, [...n results]). */
static int
put_appended_head(Buffer *b, PyObject *request, Py_ssize_t n)
{
    int s = put_array(b, 3);
    if (s == 0) {
        s = put_byte(b, APPENDED_TAG);
    }
    if (s == 0) {
        s = put_int(b, request);
    }
    return s != 0 ? s : put_array(b, n);
}

static PyObject *
encode_appended(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *request, *results, *schemes;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyLong_Type, &request, &PyList_Type, &results,
                          &PyDict_Type, &schemes)) {
        return NULL;
    }
    if (message_type == NULL) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(results);
    Buffer b = EMPTY_BUFFER;
    int s = reserve(&b, 16 + n * 48);
    if (s == 0) {
        s = put_appended_head(&b, request, n);
    }
    Ids ids = {schemes, NULL, NULL, NULL, 0, {0}};
    for (Py_ssize_t i = 0; s == 0 && i < n; i++) {
        s = put_result(&b, PyList_GET_ITEM(results, i), &ids);
    }
    PyObject *encoded = NULL;
    if (s == 0) {
        encoded = copy_out(&b);
    }
    else if (s > 0) {
        encoded = Py_NewRef(Py_None);
    }
    discard(&b);
    return encoded;
}

static PyObject *
encode_appended_each(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *requests, *outcomes, *schemes;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &requests, &PyList_Type, &outcomes,
                          &PyDict_Type, &schemes)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(requests);
    if (PyList_GET_SIZE(outcomes) != n) {
        PyErr_SetString(PyExc_ValueError, "requests and outcomes differ in length");
        return NULL;
    }
    if (message_type == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *answers = PyList_New(n);
    if (answers == NULL) {
        return NULL;
    }
    Buffer b = EMPTY_BUFFER;
    int s = reserve(&b, 256);
    Ids ids = {schemes, NULL, NULL, NULL, 0, {0}};
    for (Py_ssize_t i = 0; s == 0 && i < n; i++) {
        PyObject *outcome = PyList_GET_ITEM(outcomes, i);
        if (!Py_IS_TYPE(outcome, result_type)) {
            PyList_SET_ITEM(answers, i, Py_NewRef(Py_None)); /* a Failed, the caller's */
            continue;
        }
        b.size = 0;
        s = put_appended_head(&b, PyList_GET_ITEM(requests, i), 1);
        if (s == 0) {
            s = put_result(&b, outcome, &ids);
        }
        if (s == 0) {
            PyObject *answer = copy_out(&b);
            if (answer == NULL) {
                s = -1;
            }
            else {
                PyList_SET_ITEM(answers, i, answer);
            }
        }
    }
    discard(&b);
    if (s != 0) {
        Py_DECREF(answers);
        return s > 0 ? Py_NewRef(Py_None) : NULL;
    }
    return answers;
}

/* -- walsvc.Message from WireMessage ---------------------------------------------------- */

/* The UTF-8 length of the str `text`, or -1 if UTF-8 cannot encode it (a lone
 * surrogate, which Message refuses) or it is a legacy str not ready to read. Reads the
 * code points and allocates nothing (PyUnicode_AsUTF8AndSize would keep a UTF-8 copy on
 * the str for as long as it lives). */
static Py_ssize_t
utf8_length(PyObject *text)
{
    if (!PyUnicode_IS_READY(text)) {
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (PyUnicode_IS_ASCII(text)) {
        return n;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t bytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            bytes += 1;
        }
        else if (c < 0x800) {
            bytes += 2;
        }
        else if (c < 0x10000) {
            if (c >= 0xd800 && c <= 0xdfff) {
                return -1;
            }
            bytes += 3;
        }
        else {
            bytes += 4;
        }
    }
    return bytes;
}

/* True for a str (exactly) that is valid UTF-8 text, as Message's _is_utf8 has it. */
static int
is_text(PyObject *value)
{
    return PyUnicode_CheckExact(value) &&
           (PyUnicode_IS_ASCII(value) || utf8_length(value) >= 0);
}

/* Whether msgspec would count `value` as a reason to track the Struct holding it: of a
 * GC type, and, if a tuple, tracked (msgspec's MS_MAYBE_TRACKED). */
static int
maybe_tracked(PyObject *value)
{
    return PyType_IS_GC(Py_TYPE(value)) &&
           (!PyTuple_CheckExact(value) || PyObject_GC_IsTracked(value));
}

/* The types of one call: `types`, and the last type number looked up in it (the very
 * object: a batch's messages mostly share one, and small ints are singletons) with its
 * member. */
typedef struct {
    PyObject *types;
    PyObject *number;
    PyObject *member;
} Types;

/* The Message for WireMessage `wire`: a new reference, NULL with an exception set, or
 * Py_None (borrowed) if it does not hold every check of Message.__post_init__. */
static PyObject *
message_of(PyObject *wire, Types *types)
{
    if (!Py_IS_TYPE(wire, wire_type)) {
        return Py_None;
    }
    PyObject *fields[A_COUNT];
    for (int f = 0; f < W_COUNT; f++) {
        fields[f] = slot(wire, wire_offsets[f]);
        if (fields[f] == NULL) {
            return Py_None;
        }
    }
    fields[A_TXN] = Py_None;
    PyObject *vchannel = fields[A_VCHANNEL];
    if (!PyBytes_CheckExact(fields[A_PAYLOAD]) || !PyUnicode_CheckExact(vchannel)) {
        return Py_None;
    }
    Py_ssize_t vchannel_bytes = PyUnicode_IS_ASCII(vchannel) ? PyUnicode_GET_LENGTH(vchannel)
                                                             : utf8_length(vchannel);
    if (vchannel_bytes < 0 || vchannel_bytes > max_vchannel_bytes) {
        return Py_None;
    }
    if (fields[A_TYPE] != types->number) {
        if (!PyLong_CheckExact(fields[A_TYPE])) {
            return Py_None;
        }
        PyObject *member = PyDict_GetItemWithError(types->types, fields[A_TYPE]);
        if (member == NULL) {
            return PyErr_Occurred() ? NULL : Py_None;
        }
        if (!Py_IS_TYPE(member, type_type)) {
            return Py_None;
        }
        types->number = fields[A_TYPE];
        types->member = member;
    }
    fields[A_TYPE] = types->member;
    PyObject *properties = fields[A_PROPERTIES];
    if (!PyDict_CheckExact(properties)) {
        return Py_None;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(properties, &pos, &key, &value)) {
        if (!is_text(key) || !is_text(value)) {
            return Py_None;
        }
    }
    PyObject *ikey = fields[A_KEY];
    if (ikey != Py_None && !is_text(ikey)) {
        return Py_None;
    }
    /* As msgspec's Struct_alloc: untracked, its slots zeroed; then its fields, and
     * tracked if one of them may be (Struct_vectorcall's rule). */
    PyTypeObject *cls = append_type;
    int gc = PyType_IS_GC(cls);
    PyObject *m = gc ? PyObject_GC_New(PyObject, cls) : PyObject_New(PyObject, cls);
    if (m == NULL) {
        return NULL;
    }
    memset((char *)m + sizeof(PyObject), 0, (size_t)cls->tp_basicsize - sizeof(PyObject));
    int track = 0;
    for (int f = 0; f < A_COUNT; f++) {
        *(PyObject **)((char *)m + append_offsets[f]) = Py_NewRef(fields[f]);
        track = track || maybe_tracked(fields[f]);
    }
    if (gc && track) {
        PyObject_GC_Track(m);
    }
    return m;
}

static PyObject *
messages_of(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *wires, *types;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &wires, &PyDict_Type, &types)) {
        return NULL;
    }
    if (message_type == NULL) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(wires);
    PyObject *messages = PyList_New(n);
    if (messages == NULL) {
        return NULL;
    }
    Types known = {types, NULL, NULL};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = message_of(PyList_GET_ITEM(wires, i), &known);
        if (m == NULL || m == Py_None) {
            Py_DECREF(messages); /* and the messages built: a list drops its NULL items */
            return m == NULL ? NULL : Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(messages, i, m);
    }
    return messages;
}

/* charge_of: 64 per WireMessage of `wires` plus its payload's bytes; -1 if one is not a
 * WireMessage with bytes (exactly) for its payload, or before bind. */
static PyObject *
charge_of(PyObject *Py_UNUSED(module), PyObject *wires)
{
    if (!PyList_Check(wires)) {
        PyErr_SetString(PyExc_TypeError, "charge_of takes a list of WireMessage");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(wires), charge = 64 * n;
    for (Py_ssize_t i = 0; i < n && message_type != NULL; i++) {
        PyObject *wire = PyList_GET_ITEM(wires, i);
        PyObject *payload = Py_IS_TYPE(wire, wire_type) ? slot(wire, wire_offsets[A_PAYLOAD])
                                                        : NULL;
        if (payload == NULL || !PyBytes_CheckExact(payload)) {
            return PyLong_FromLong(-1);
        }
        charge += PyBytes_GET_SIZE(payload);
    }
    return message_type == NULL ? PyLong_FromLong(-1) : PyLong_FromSsize_t(charge);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Find the fields' slots, see the module comment."},
    {"encode_delivered", encode_delivered, METH_VARARGS,
     "The msgpack bytes of one Delivered, see the module comment."},
    {"encode_appended", encode_appended, METH_VARARGS,
     "The msgpack bytes of one Appended, see the module comment."},
    {"encode_appended_each", encode_appended_each, METH_VARARGS,
     "The Appended answers of a group of appends, see the module comment."},
    {"charge_of", charge_of, METH_O,
     "charge_of(wires): 64 a message plus its payload's bytes, or -1 (the Python path)."},
    {"messages_of", messages_of, METH_VARARGS,
     "The walsvc.Messages of WireMessages, see the module comment."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "walsvc.service._cwire",
    .m_doc = "The node's Delivered and Appended encodings and its Messages from the wire,"
             " compiled (optional: the node runs without it).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__cwire(void)
{
    return PyModule_Create(&module);
}
