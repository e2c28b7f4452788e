/* walsvc.service._cwire: the node's per-delivered-message work, compiled: a batch of
 * ImmutableMessages laid out as the msgpack bytes of one Delivered(stream, [...]).
 *
 * Why: a node that serves a stream converts every message it delivers into a
 * WireDelivered (ids marshalled to text, a producer key dropped) and msgspec encodes it:
 * about 0.75 us of CPU per message in Python, as much as the node's scan of ten records
 * a 1-of-16 filter rejects. This walk writes the same bytes in about a tenth of that.
 *
 * bind(message_cls, txn_cls, sequence_id_cls, producer_prefix) -> bool
 *
 * finds the field slots of walsvc.ImmutableMessage (message_cls), walsvc.TxnContext
 * (txn_cls) and walsvc.core._ids.SequenceMessageId (sequence_id_cls), all frozen msgspec
 * Structs whose fields are slots; False (nothing bound) if a field is not a plain
 * object slot. `producer_prefix` begins the producer keys a delivered message does not
 * carry (PRODUCER_KEY_PREFIX).
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <structmember.h>

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

/* The tag of Delivered and the length of WireDelivered, as msgspec encodes them. */
#define DELIVERED_TAG 26
#define WIRE_FIELDS 13

static PyObject *
slot(PyObject *object, Py_ssize_t offset)
{
    return *(PyObject **)((char *)object + offset);
}

/* The offset of `cls`'s field `name`, or -1 (no exception) if it is not an object slot,
 * or -2 with an exception set. */
static Py_ssize_t
offset_of(PyObject *cls, const char *name)
{
    PyObject *descr = PyObject_GetAttrString(cls, name);
    if (descr == NULL) {
        return -2;
    }
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX) {
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    Py_DECREF(descr);
    return offset;
}

static PyObject *
bind(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *message_cls, *txn_cls, *seq_cls, *prefix;
    if (!PyArg_ParseTuple(args, "O!O!O!U", &PyType_Type, &message_cls, &PyType_Type, &txn_cls,
                          &PyType_Type, &seq_cls, &prefix)) {
        return NULL;
    }
    Py_ssize_t offsets[M_COUNT], txn[2], seq;
    for (int f = 0; f < M_COUNT; f++) {
        offsets[f] = offset_of(message_cls, message_fields[f]);
    }
    txn[0] = offset_of(txn_cls, "txn_id");
    txn[1] = offset_of(txn_cls, "keepalive_ms");
    seq = offset_of(seq_cls, "seq");
    int usable = txn[0] >= 0 && txn[1] >= 0 && seq >= 0;
    for (int f = 0; f < M_COUNT; f++) {
        usable = usable && offsets[f] >= 0;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!usable) {
        Py_RETURN_FALSE;
    }
    memcpy(message_offsets, offsets, sizeof offsets);
    memcpy(txn_offsets, txn, sizeof txn);
    seq_offset = seq;
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(message_cls));
    Py_XSETREF(txn_type, (PyTypeObject *)Py_NewRef(txn_cls));
    Py_XSETREF(producer_prefix, Py_NewRef(prefix));
    Py_RETURN_TRUE;
}

/* -- the output buffer ------------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} Buffer;

/* Room for `more` bytes; 0, or -1 with MemoryError set. */
static int
reserve(Buffer *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity) {
        return 0;
    }
    Py_ssize_t capacity = b->capacity * 2;
    if (capacity < b->size + more) {
        capacity = b->size + more;
    }
    char *data = PyMem_Realloc(b->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int
put_bytes(Buffer *b, const void *bytes, Py_ssize_t n)
{
    if (reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->size, bytes, (size_t)n);
    b->size += n;
    return 0;
}

/* A msgpack marker byte followed by `width` big-endian bytes of `value`. */
static int
put_be(Buffer *b, unsigned char marker, uint64_t value, int width)
{
    if (reserve(b, 1 + width) < 0) {
        return -1;
    }
    unsigned char *p = (unsigned char *)b->data + b->size;
    p[0] = marker;
    for (int i = 0; i < width; i++) {
        p[1 + i] = (unsigned char)(value >> (8 * (width - 1 - i)));
    }
    b->size += 1 + width;
    return 0;
}

static int
put_byte(Buffer *b, unsigned char byte)
{
    return put_bytes(b, &byte, 1);
}

/* A header as msgpack's smallest form: `fix` ORed with n below `fix_limit`, else the 8-,
 * 16- or 32-bit marker (m8 0 when the format has no 8-bit length). */
static int
put_header(Buffer *b, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_limit, unsigned char m8,
           unsigned char m16, unsigned char m32)
{
    if (n < fix_limit) {
        return put_byte(b, (unsigned char)(fix | n));
    }
    if (m8 != 0 && n < 256) {
        return put_be(b, m8, (uint64_t)n, 1);
    }
    if (n < 65536) {
        return put_be(b, m16, (uint64_t)n, 2);
    }
    if ((uint64_t)n > UINT32_MAX) {
        return 1; /* msgpack cannot hold it: not taken */
    }
    return put_be(b, m32, (uint64_t)n, 4);
}

static int
put_array(Buffer *b, Py_ssize_t n)
{
    return put_header(b, n, 0x90, 16, 0, 0xdc, 0xdd);
}

/* 0 written, 1 not taken (not an exact int, or outside 64 bits), -1 error. */
static int
put_int(Buffer *b, PyObject *value)
{
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        return 1; /* msgspec writes a bool as one, not as an int */
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(value);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 1;
        }
        return put_be(b, 0xcf, u, 8);
    }
    if (overflow < 0) {
        return 1;
    }
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v >= 0) {
        if (v < 128) {
            return put_byte(b, (unsigned char)v);
        }
        if (v < 256) {
            return put_be(b, 0xcc, (uint64_t)v, 1);
        }
        if (v < 65536) {
            return put_be(b, 0xcd, (uint64_t)v, 2);
        }
        if (v <= (long long)UINT32_MAX) {
            return put_be(b, 0xce, (uint64_t)v, 4);
        }
        return put_be(b, 0xcf, (uint64_t)v, 8);
    }
    if (v >= -32) {
        return put_byte(b, (unsigned char)(0xe0 | (v + 32)));
    }
    if (v >= INT8_MIN) {
        return put_be(b, 0xd0, (uint64_t)v, 1);
    }
    if (v >= INT16_MIN) {
        return put_be(b, 0xd1, (uint64_t)v, 2);
    }
    if (v >= INT32_MIN) {
        return put_be(b, 0xd2, (uint64_t)v, 4);
    }
    return put_be(b, 0xd3, (uint64_t)v, 8);
}

static int
put_str_utf8(Buffer *b, const char *text, Py_ssize_t n)
{
    int status = put_header(b, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
    return status != 0 ? status : put_bytes(b, text, n);
}

/* 0 written, 1 not taken (not an exact str, or not UTF-8 encodable), -1 error. */
static int
put_str(Buffer *b, PyObject *value)
{
    if (!PyUnicode_CheckExact(value)) {
        return 1;
    }
    Py_ssize_t n;
    const char *text = PyUnicode_AsUTF8AndSize(value, &n);
    if (text == NULL) {
        PyErr_Clear();
        return 1;
    }
    return put_str_utf8(b, text, n);
}

static int
put_bin(Buffer *b, PyObject *value)
{
    if (!PyBytes_CheckExact(value)) {
        return 1;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    int status = put_header(b, n, 0, 0, 0xc4, 0xc5, 0xc6);
    return status != 0 ? status : put_bytes(b, PyBytes_AS_STRING(value), n);
}

/* The decimal digits of `v` at the end of `end` (backwards); returns where they start. */
static char *
decimal(char *end, long long v)
{
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--end = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0) {
        *--end = '-';
    }
    return end;
}

/* The id classes of one call: `schemes`, and the class last looked up in it with its
 * prefix (a batch's ids are of one class). */
typedef struct {
    PyObject *schemes;
    PyTypeObject *type;
    PyObject *prefix;
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
    long long v = PyLong_AsLongLong(seq);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    char text[96];
    char *digits = decimal(text + sizeof text, v);
    Py_ssize_t p = PyBytes_GET_SIZE(prefix);
    memcpy(digits - p, PyBytes_AS_STRING(prefix), (size_t)p);
    return put_str_utf8(b, digits - p, text + sizeof text - (digits - p));
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
        s = lc == Py_None ? put_byte(b, 0xc0) : put_id(b, lc, ids);
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
    Buffer b = {NULL, 0, 0};
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
    Ids ids = {schemes, NULL, NULL};
    for (Py_ssize_t i = 0; s == 0 && i < n; i++) {
        s = put_message(&b, PyList_GET_ITEM(messages, i), &ids);
    }
    PyObject *result = NULL;
    if (s == 0) {
        result = PyBytes_FromStringAndSize(b.data, b.size);
    }
    else if (s > 0) {
        result = Py_NewRef(Py_None);
    }
    PyMem_Free(b.data);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Find the fields' slots, see the module comment."},
    {"encode_delivered", encode_delivered, METH_VARARGS,
     "The msgpack bytes of one Delivered, see the module comment."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "walsvc.service._cwire",
    .m_doc = "The node's Delivered encoding, compiled (optional: the node runs without it).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__cwire(void)
{
    return PyModule_Create(&module);
}
