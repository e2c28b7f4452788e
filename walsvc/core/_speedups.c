/* walsvc.core._speedups: compiled forms of walsvc's hot per-record loops (the column-wise
 * header walk of walsvc.core._columns, a batch encoder, two Arrow column builders).
 *
 * decode_columns_into(data, start, end, types, vchannels, timeticks, terms, exts,
 *                     payload_starts, ends, known_types, names, unpack_header, corrupt)
 *
 * does exactly what the loop of walsvc.core._columns.walk_columns does, record by record,
 * appending to the seven lists it is given; it exists because that loop costs about
 * 1.6 us of CPU per record in Python and this one about 0.15 us (the Spark reader's
 * budget: issue 6). Everything that needs judgement stays in Python: a record whose
 * header fails a check, or whose type is not in known_types, is handed to
 * unpack_header(data, offset, end) (walsvc.core._codec._unpack_header), which raises the
 * CorruptRecord naming the fault (or accepts an application-defined type); a vchannel
 * name not in `names` (the caller's cache: vchannel hash -> (UTF-8 name, name), kept
 * across runs) is validated and decoded by the same call, then added to it.
 * `corrupt` is walsvc.CorruptRecord, for the one error raised here.
 *
 * gather_payloads(data, payload_starts, ends) -> (offsets, values)
 *
 * copies data[payload_starts[i]:ends[i]] for every i into one bytes object `values` and
 * returns with it the int32 offsets of an Arrow binary column (n + 1 of them, native
 * byte order, as bytes): the payload column of a run, without a Python object per row.
 *
 * encode_plain_batch(messages, first_tick, term, ext, limit, names, resolve) -> list | None
 *
 * lays out message i of `messages` (walsvc.Message objects without properties, key or
 * txn) as walsvc.core._encode.encode_plain does with timetick first_tick + i, `term` and the
 * shared ext section `ext`: the envelopes of a batch appended by the WAL. `names` is
 * encode_plain's cache (vchannel -> (UTF-8 name, hash)); a name missing from it is
 * looked up with resolve(vchannel), which fills it. Returns None, encoding nothing, if
 * an envelope would pass `limit` bytes: the caller then encodes one by one and raises
 * the MessageTooLarge that names the message.
 *
 * encode_plain_one(message, tick, term, ext, limit, names, resolve) -> bytes | None
 *
 * the same for one message with timetick `tick` (the WAL's single appends); a fast call
 * (no argument tuple), since it runs once per append.
 *
 * encode_keyed_batch(messages, first_tick, term, ext, keyed_ext, limit, names, resolve)
 *     -> list | None
 *
 * encode_plain_batch for messages that may carry an idempotency key (walsvc.Message
 * objects without properties or txn): a message without one gets the ext section `ext`,
 * one with key k gets `keyed_ext` followed by k as a msgpack str (the shortest form, as
 * msgspec writes it). `keyed_ext` is the msgpack of the ext Struct with that key left out
 * of its end (walsvc.core._encode.keyed_ext_prefix), so each envelope is byte for byte
 * what walsvc.core._encode.encode lays out: the keyed appends the WAL coalesces.
 *
 * bind_message(cls) -> bool
 *
 * finds the slot of each field of walsvc.Message (`cls`; msgspec stores a Struct's fields
 * in member slots) so that the encoders and are_plain read a Message's fields straight
 * from its slots instead of looking them up by name. False, and nothing changes, if a
 * field is not a plain object slot: the encoders then go on reading by name.
 *
 * are_plain(messages, max_payload) -> bool
 *
 * True if every item of the list `messages` is a walsvc.Message itself (not a subclass)
 * with no properties, key or txn and a payload of at most `max_payload` bytes: a batch
 * encode_plain_batch can take. False for any other batch, and always before
 * bind_message succeeded.
 *
 * are_keyed(messages, max_payload) -> bool
 *
 * the same, but a message may carry an idempotency key (a str): a batch
 * encode_keyed_batch can take.
 *
 * numbered_strings(prefix, first, count) -> (offsets, values)
 *
 * the strings prefix + str(first + i) for i in range(count) as the two buffers of an
 * Arrow string column (int32 offsets, native byte order; `prefix` is UTF-8 bytes): the
 * message-id column of a run of sequence-numbered records ("file:123").
 *
 * match_hashes(data, start, end, hashes, units, extra) -> (matches, offset, examined, units)
 *
 * the header walk of walsvc.core._runs.decode_chunk for a vchannel-only filter: steps over
 * envelopes from `start` while `units` last (each envelope examined costs 1, each one
 * whose vchannel hash is in the int collection `hashes` `extra` more) and returns the
 * flat list [offset, length, index, ...] of the matching envelopes (index: count of
 * envelopes before it from `start`), the offset it stopped at, how many envelopes it
 * examined and the units left. It stops early, without raising, at a header that fails
 * a check: the caller's Python loop goes on from there and raises the CorruptRecord
 * naming the fault. About 5 ns an envelope instead of about 0.5 us.
 *
 * decode_known(data, start, end, seq, stop, make_id, message_cls, vchannels, types, exts,
 *              last_confirmed_ids, no_properties) -> (messages, offset, seq)
 *
 * the loop of walsvc.core._runs.decode_chunk for a filter that admits everything: the
 * envelopes from `start` (the first numbered `seq`) until `end` or sequence number
 * `stop`, each made into ImmutableMessage(make_id(seq), ...) as _codec._decode_at makes
 * it, with the offset and sequence number after the last one made. It makes only what
 * needs no judgement, from the caller's caches (vchannels: _codec._vchannel_str, UTF-8
 * name -> (name, hash); types: number -> MessageType; exts: _codec._ext_cache, ext
 * section -> (last-confirmed id, txn); last_confirmed_ids: text -> id), and the ext
 * section of a keyed message ([{}, str, nil, str] in msgpack) besides: it stops, raising
 * nothing, at the first envelope with a header that fails a check, a name, type, ext or
 * last-confirmed text not in the caches, or a last-confirmed id of another class than
 * make_id's, and makes nothing if a sequence number passes 2**63 - 1. The caller's
 * Python loop decodes that one (filling the caches, or raising the CorruptRecord that
 * names the fault) and calls again. About 0.6 us a message instead of 2.4 (keyed:
 * 0.7 and 2.9): a catch-up read of a file log, embedded, went from about 220k to 700k
 * messages/s.
 *
 * The envelope header is 36 bytes, little-endian ("<BBHIIHHQQI"): version, flags, type,
 * total length, vchannel hash, vchannel length, reserved, timetick, term, ext length.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 36
#define VERSION 1

static uint16_t
read16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t
read32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t
read64(const unsigned char *p)
{
    return (uint64_t)read32(p) | ((uint64_t)read32(p + 4) << 32);
}

/* Append `item` (a new reference) to `list`; consumes the reference. 0 on success. */
static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL) {
        return -1;
    }
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

static PyObject *
decode_columns_into(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *data, *types, *vchannels, *timeticks, *terms, *exts, *payload_starts, *ends;
    PyObject *known_types, *names, *unpack_header, *corrupt;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "OnnO!O!O!O!O!O!O!O!O!OO", &data, &start, &end, &PyList_Type,
                          &types, &PyList_Type, &vchannels, &PyList_Type, &timeticks,
                          &PyList_Type, &terms, &PyList_Type, &exts, &PyList_Type,
                          &payload_starts, &PyList_Type, &ends, &PyDict_Type, &known_types,
                          &PyDict_Type, &names, &unpack_header, &corrupt)) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *empty = NULL;
    PyObject *last_ext = NULL;
    PyObject *result = NULL;
    if (start < 0 || end > view.len || start > end) {
        PyErr_Format(PyExc_ValueError, "run [%zd, %zd) is outside the %zd bytes given", start,
                     end, view.len);
        goto done;
    }
    empty = PyBytes_FromStringAndSize(NULL, 0);
    if (empty == NULL) {
        goto done;
    }
    last_ext = Py_NewRef(empty);
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t offset = start;
    while (offset < end) {
        if (end - offset < HEADER_SIZE) {
            PyErr_Format(corrupt, "run ends inside a record header at byte %zd", offset);
            goto done;
        }
        const unsigned char *p = buf + offset;
        unsigned version = p[0], flags = p[1];
        uint16_t type_no = read16(p + 2), vc_len = read16(p + 12), reserved = read16(p + 14);
        uint32_t total = read32(p + 4), vc_hash = read32(p + 8), ext_len = read32(p + 32);
        Py_ssize_t record_end = offset + (Py_ssize_t)total;
        Py_ssize_t ext_start = offset + HEADER_SIZE + vc_len;
        Py_ssize_t payload_start = ext_start + (Py_ssize_t)ext_len;
        PyObject *type_obj = PyLong_FromLong(type_no);
        if (type_obj == NULL) {
            goto done;
        }
        int known = PyDict_Contains(known_types, type_obj);
        if (known < 0) {
            Py_DECREF(type_obj);
            goto done;
        }
        int structural = version != VERSION || flags || reserved || total < HEADER_SIZE ||
                         record_end > end || payload_start > record_end;
        if (structural || !known) {
            /* Raises the CorruptRecord naming the fault, or accepts the type. */
            PyObject *checked = PyObject_CallFunction(unpack_header, "Onn", data, offset, end);
            if (checked == NULL) {
                Py_DECREF(type_obj);
                goto done;
            }
            Py_DECREF(checked);
            if (structural) { /* unpack_header disagrees with this walk: never go on */
                Py_DECREF(type_obj);
                PyErr_Format(corrupt, "record at byte %zd has an invalid header", offset);
                goto done;
            }
        }
        if (append_new(types, type_obj) < 0) {
            goto done;
        }

        /* The vchannel: each distinct name is checked in full once (names remembers). */
        PyObject *hash_key = PyLong_FromUnsignedLong(vc_hash);
        if (hash_key == NULL) {
            goto done;
        }
        PyObject *seen = PyDict_GetItemWithError(names, hash_key); /* borrowed */
        if (seen == NULL && PyErr_Occurred()) {
            Py_DECREF(hash_key);
            goto done;
        }
        if (seen != NULL) {
            PyObject *utf8 = PyTuple_GET_ITEM(seen, 0);
            if (PyBytes_GET_SIZE(utf8) != vc_len ||
                memcmp(PyBytes_AS_STRING(utf8), p + HEADER_SIZE, vc_len) != 0) {
                seen = NULL;
            }
        }
        if (seen == NULL) {
            PyObject *header = PyObject_CallFunction(unpack_header, "Onn", data, offset, end);
            if (header == NULL) {
                Py_DECREF(hash_key);
                goto done;
            }
            PyObject *name = PySequence_GetItem(header, 1);
            Py_DECREF(header);
            PyObject *utf8 = PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE, vc_len);
            PyObject *pair = (name && utf8) ? PyTuple_Pack(2, utf8, name) : NULL;
            Py_XDECREF(name);
            Py_XDECREF(utf8);
            if (pair == NULL || PyDict_SetItem(names, hash_key, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(hash_key);
                goto done;
            }
            Py_DECREF(pair); /* names holds it */
            seen = pair;
        }
        Py_DECREF(hash_key);
        if (PyList_Append(vchannels, PyTuple_GET_ITEM(seen, 1)) < 0) {
            goto done;
        }

        if (append_new(timeticks, PyLong_FromUnsignedLongLong(read64(p + 16))) < 0 ||
            append_new(terms, PyLong_FromUnsignedLongLong(read64(p + 24))) < 0) {
            goto done;
        }

        /* Runs share one ext section (the last-confirmed id): one bytes object each. */
        if (ext_len) {
            if ((Py_ssize_t)ext_len != PyBytes_GET_SIZE(last_ext) ||
                memcmp(PyBytes_AS_STRING(last_ext), buf + ext_start, ext_len) != 0) {
                PyObject *ext = PyBytes_FromStringAndSize((const char *)buf + ext_start,
                                                          (Py_ssize_t)ext_len);
                if (ext == NULL) {
                    goto done;
                }
                Py_SETREF(last_ext, ext);
            }
            if (PyList_Append(exts, last_ext) < 0) {
                goto done;
            }
        }
        else if (PyList_Append(exts, empty) < 0) {
            goto done;
        }

        if (append_new(payload_starts, PyLong_FromSsize_t(payload_start)) < 0 ||
            append_new(ends, PyLong_FromSsize_t(record_end)) < 0) {
            goto done;
        }
        offset = record_end;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(last_ext);
    Py_XDECREF(empty);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
gather_payloads(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *data, *starts, *stops;
    if (!PyArg_ParseTuple(args, "OO!O!", &data, &PyList_Type, &starts, &PyList_Type, &stops)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(starts);
    if (PyList_GET_SIZE(stops) != n) {
        PyErr_SetString(PyExc_ValueError, "payload_starts and ends differ in length");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *offsets = NULL, *values = NULL, *result = NULL;
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    if (offsets == NULL) {
        goto done;
    }
    int32_t *out = (int32_t *)PyBytes_AS_STRING(offsets);
    int64_t total = 0;
    out[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t a = PyLong_AsSsize_t(PyList_GET_ITEM(starts, i));
        Py_ssize_t b = PyLong_AsSsize_t(PyList_GET_ITEM(stops, i));
        if ((a == -1 || b == -1) && PyErr_Occurred()) {
            goto done;
        }
        if (a < 0 || b < a || b > view.len) {
            PyErr_Format(PyExc_ValueError, "payload [%zd, %zd) is outside the %zd bytes given",
                         a, b, view.len);
            goto done;
        }
        total += b - a;
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "payloads exceed 32-bit Arrow offsets");
            goto done;
        }
        out[i + 1] = (int32_t)total;
    }
    values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (values == NULL) {
        goto done;
    }
    char *to = PyBytes_AS_STRING(values);
    const char *from = (const char *)view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t a = PyLong_AsSsize_t(PyList_GET_ITEM(starts, i));
        Py_ssize_t length = out[i + 1] - out[i];
        memcpy(to + out[i], from + a, (size_t)length);
    }
    result = PyTuple_Pack(2, offsets, values);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(values);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *attr_type, *attr_vchannel, *attr_payload;

/* walsvc.Message's field slots, once bind_message found them. */
enum { F_PAYLOAD, F_VCHANNEL, F_TYPE, F_PROPERTIES, F_KEY, F_TXN, F_COUNT };
static const char *const field_names[F_COUNT] = {
    "payload", "vchannel", "type", "properties", "idempotency_key", "txn",
};
static PyTypeObject *bound_type; /* walsvc.Message (a strong reference), or NULL */
static Py_ssize_t field_offsets[F_COUNT];

/* Field `f` of `message`, an instance of exactly bound_type: a borrowed reference, never
 * NULL (a frozen Struct sets every field when it is built). */
static PyObject *
slot_of(PyObject *message, int f)
{
    return *(PyObject **)((char *)message + field_offsets[f]);
}

static PyObject *
bind_message(PyObject *Py_UNUSED(module), PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind_message takes the walsvc.Message class");
        return NULL;
    }
    Py_ssize_t offsets[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        PyObject *descr = PyObject_GetAttrString(cls, field_names[f]);
        if (descr == NULL) {
            return NULL;
        }
        int usable = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                     ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (usable) {
            offsets[f] = ((PyMemberDescrObject *)descr)->d_member->offset;
        }
        Py_DECREF(descr);
        if (!usable) {
            Py_RETURN_FALSE;
        }
    }
    memcpy(field_offsets, offsets, sizeof offsets);
    Py_XSETREF(bound_type, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_TRUE;
}

/* are_plain (keyed 0) and are_keyed (keyed 1). */
static PyObject *
check_batch(PyObject *args, int keyed)
{
    PyObject *messages;
    Py_ssize_t max_payload;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &messages, &max_payload)) {
        return NULL;
    }
    if (bound_type == NULL) {
        Py_RETURN_FALSE;
    }
    Py_ssize_t n = PyList_GET_SIZE(messages);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *message = PyList_GET_ITEM(messages, i);
        if (Py_TYPE(message) != bound_type) {
            Py_RETURN_FALSE;
        }
        PyObject *payload = slot_of(message, F_PAYLOAD);
        PyObject *properties = slot_of(message, F_PROPERTIES);
        PyObject *key = slot_of(message, F_KEY);
        if (!PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) > max_payload ||
            !PyDict_CheckExact(properties) || PyDict_GET_SIZE(properties) != 0 ||
            !(key == Py_None || (keyed && PyUnicode_CheckExact(key))) ||
            slot_of(message, F_TXN) != Py_None) {
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

static PyObject *
are_plain(PyObject *Py_UNUSED(module), PyObject *args)
{
    return check_batch(args, 0);
}

static PyObject *
are_keyed(PyObject *Py_UNUSED(module), PyObject *args)
{
    return check_batch(args, 1);
}

/* user_batch_kind: -1 unless every message is exactly the bound Message, without txn, of
 * a type not in system_types; else 0 if none carries a key, 1 if all do, 2 if some do. */
static PyObject *
user_batch_kind(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *messages, *system_types;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &messages, &PyFrozenSet_Type,
                          &system_types)) {
        return NULL;
    }
    if (bound_type == NULL) {
        return PyLong_FromLong(-1);
    }
    Py_ssize_t n = PyList_GET_SIZE(messages), keyed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *message = PyList_GET_ITEM(messages, i);
        if (Py_TYPE(message) != bound_type || slot_of(message, F_TXN) != Py_None) {
            return PyLong_FromLong(-1);
        }
        int system = PySet_Contains(system_types, slot_of(message, F_TYPE));
        if (system != 0) {
            return system < 0 ? NULL : PyLong_FromLong(-1);
        }
        keyed += slot_of(message, F_KEY) != Py_None;
    }
    return PyLong_FromLong(keyed == 0 ? 0 : keyed == n ? 1 : 2);
}

static void
write16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void
write32(unsigned char *p, uint32_t v)
{
    write16(p, (uint16_t)v);
    write16(p + 2, (uint16_t)(v >> 16));
}

static void
write64(unsigned char *p, uint64_t v)
{
    write32(p, (uint32_t)v);
    write32(p + 4, (uint32_t)(v >> 32));
}

/* The envelope of one message, or NULL with an exception set, or Py_None (a new
 * reference) if it would pass `limit`. With `keyed_ext` (not NULL) a message whose key is
 * a str gets keyed_ext + the key as a msgpack str for its ext section, instead of `ext`. */
static PyObject *
encode_one(PyObject *message, uint64_t tick, uint64_t term, PyObject *ext, PyObject *keyed_ext,
           Py_ssize_t limit, PyObject *names, PyObject *resolve)
{
    PyObject *type_obj = NULL, *vchannel = NULL, *payload = NULL, *entry = NULL;
    PyObject *record = NULL;
    if (Py_TYPE(message) == bound_type) {
        type_obj = Py_NewRef(slot_of(message, F_TYPE));
        vchannel = Py_NewRef(slot_of(message, F_VCHANNEL));
        payload = Py_NewRef(slot_of(message, F_PAYLOAD));
    }
    else {
        type_obj = PyObject_GetAttr(message, attr_type);
        vchannel = type_obj ? PyObject_GetAttr(message, attr_vchannel) : NULL;
        payload = vchannel ? PyObject_GetAttr(message, attr_payload) : NULL;
        if (payload == NULL) {
            goto done;
        }
    }
    long type_no = PyLong_AsLong(type_obj);
    if (type_no == -1 && PyErr_Occurred()) {
        goto done;
    }
    if (!PyBytes_Check(payload) || type_no < 0 || type_no > 0xFFFF) {
        PyErr_SetString(PyExc_TypeError, "not a plain walsvc.Message");
        goto done;
    }
    entry = PyDict_GetItemWithError(names, vchannel);
    if (entry != NULL) {
        Py_INCREF(entry);
    }
    else if (PyErr_Occurred() ||
             (entry = PyObject_CallOneArg(resolve, vchannel)) == NULL) {
        goto done;
    }
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
        !PyBytes_Check(PyTuple_GET_ITEM(entry, 0))) {
        PyErr_SetString(PyExc_TypeError, "resolve must return (bytes, int)");
        goto done;
    }
    PyObject *utf8 = PyTuple_GET_ITEM(entry, 0);
    unsigned long vc_hash = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(entry, 1));
    if (vc_hash == (unsigned long)-1 && PyErr_Occurred()) {
        goto done;
    }
    /* The key, as a msgpack str after keyed_ext: its header (at most 5 bytes) and UTF-8. */
    const char *key_utf8 = NULL;
    Py_ssize_t key_len = 0;
    unsigned char key_header[5];
    Py_ssize_t key_header_len = 0;
    if (keyed_ext != NULL) {
        PyObject *key = Py_TYPE(message) == bound_type ? slot_of(message, F_KEY) : NULL;
        if (key == NULL) {
            PyErr_SetString(PyExc_TypeError, "encode_keyed_batch takes walsvc.Message objects");
            goto done;
        }
        if (key != Py_None) {
            if (!PyUnicode_Check(key)) {
                PyErr_SetString(PyExc_TypeError, "an idempotency key must be a str");
                goto done;
            }
            key_utf8 = PyUnicode_AsUTF8AndSize(key, &key_len);
            if (key_utf8 == NULL) {
                goto done;
            }
            if (key_len < 32) {
                key_header[0] = (unsigned char)(0xa0 | key_len);
                key_header_len = 1;
            }
            else if (key_len < 0x100) {
                key_header[0] = 0xd9;
                key_header[1] = (unsigned char)key_len;
                key_header_len = 2;
            }
            else if (key_len < 0x10000) {
                key_header[0] = 0xda;
                key_header[1] = (unsigned char)(key_len >> 8);
                key_header[2] = (unsigned char)key_len;
                key_header_len = 3;
            }
            else if (key_len <= (Py_ssize_t)UINT32_MAX) {
                key_header[0] = 0xdb;
                key_header[1] = (unsigned char)(key_len >> 24);
                key_header[2] = (unsigned char)(key_len >> 16);
                key_header[3] = (unsigned char)(key_len >> 8);
                key_header[4] = (unsigned char)key_len;
                key_header_len = 5;
            }
            else {
                record = Py_NewRef(Py_None); /* too large for any envelope */
                goto done;
            }
            ext = keyed_ext;
        }
    }
    Py_ssize_t vc_len = PyBytes_GET_SIZE(utf8), ext_len = PyBytes_GET_SIZE(ext);
    Py_ssize_t prefix_len = ext_len;
    if (key_utf8 != NULL) {
        ext_len += key_header_len + key_len;
    }
    Py_ssize_t payload_len = PyBytes_GET_SIZE(payload);
    Py_ssize_t total = HEADER_SIZE + vc_len + ext_len + payload_len;
    if (total > limit || total > (Py_ssize_t)UINT32_MAX || vc_len > 0xFFFF) {
        record = Py_NewRef(Py_None);
        goto done;
    }
    record = PyBytes_FromStringAndSize(NULL, total);
    if (record == NULL) {
        goto done;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(record);
    p[0] = VERSION;
    p[1] = 0;
    write16(p + 2, (uint16_t)type_no);
    write32(p + 4, (uint32_t)total);
    write32(p + 8, (uint32_t)vc_hash);
    write16(p + 12, (uint16_t)vc_len);
    write16(p + 14, 0);
    write64(p + 16, tick);
    write64(p + 24, term);
    write32(p + 32, (uint32_t)ext_len);
    p += HEADER_SIZE;
    memcpy(p, PyBytes_AS_STRING(utf8), (size_t)vc_len);
    memcpy(p + vc_len, PyBytes_AS_STRING(ext), (size_t)prefix_len);
    if (key_utf8 != NULL) {
        memcpy(p + vc_len + prefix_len, key_header, (size_t)key_header_len);
        memcpy(p + vc_len + prefix_len + key_header_len, key_utf8, (size_t)key_len);
    }
    memcpy(p + vc_len + ext_len, PyBytes_AS_STRING(payload), (size_t)payload_len);
done:
    Py_XDECREF(entry);
    Py_XDECREF(payload);
    Py_XDECREF(vchannel);
    Py_XDECREF(type_obj);
    return record;
}

/* The records of the list `messages` (encode_one of each, ticks from first_tick on): a
 * new list; None if one is too large; NULL with the error. `resolve` is Python code, so
 * each message is held while it is encoded, and a list that changes length meanwhile
 * raises RuntimeError instead of being read past its end. */
static PyObject *
encode_batch(PyObject *messages, uint64_t first_tick, uint64_t term, PyObject *ext,
             PyObject *keyed_ext, Py_ssize_t limit, PyObject *names, PyObject *resolve)
{
    Py_ssize_t n = PyList_GET_SIZE(messages);
    PyObject *records = PyList_New(n);
    if (records == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_SIZE(messages) != n) {
            Py_DECREF(records);
            PyErr_SetString(PyExc_RuntimeError, "the batch changed while it was encoded");
            return NULL;
        }
        PyObject *message = Py_NewRef(PyList_GET_ITEM(messages, i));
        PyObject *record = encode_one(message, first_tick + (uint64_t)i, term, ext, keyed_ext,
                                      limit, names, resolve);
        Py_DECREF(message);
        if (record == NULL || record == Py_None) {
            Py_DECREF(records);
            return record; /* NULL: the error; None: too large */
        }
        PyList_SET_ITEM(records, i, record);
    }
    return records;
}

static PyObject *
encode_plain_batch(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *messages, *ext, *names, *resolve;
    unsigned long long first_tick, term;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!KKO!nO!O", &PyList_Type, &messages, &first_tick, &term,
                          &PyBytes_Type, &ext, &limit, &PyDict_Type, &names, &resolve)) {
        return NULL;
    }
    return encode_batch(messages, first_tick, term, ext, NULL, limit, names, resolve);
}

static PyObject *
encode_keyed_batch(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *messages, *ext, *keyed_ext, *names, *resolve;
    unsigned long long first_tick, term;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!KKO!O!nO!O", &PyList_Type, &messages, &first_tick, &term,
                          &PyBytes_Type, &ext, &PyBytes_Type, &keyed_ext, &limit, &PyDict_Type,
                          &names, &resolve)) {
        return NULL;
    }
    if (bound_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "encode_keyed_batch needs bind_message first");
        return NULL;
    }
    return encode_batch(messages, first_tick, term, ext, keyed_ext, limit, names, resolve);
}

static PyObject *
encode_plain_one(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "encode_plain_one takes 7 arguments");
        return NULL;
    }
    unsigned long long tick = PyLong_AsUnsignedLongLong(args[1]);
    if (tick == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    unsigned long long term = PyLong_AsUnsignedLongLong(args[2]);
    if (term == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyBytes_Check(args[3]) || !PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "encode_plain_one needs ext bytes and a names dict");
        return NULL;
    }
    return encode_one(args[0], tick, term, args[3], NULL, limit, args[5], args[6]);
}

static PyObject *
numbered_strings(PyObject *Py_UNUSED(module), PyObject *args)
{
    const char *prefix;
    Py_ssize_t prefix_len, count;
    long long first;
    if (!PyArg_ParseTuple(args, "y#Ln", &prefix, &prefix_len, &first, &count)) {
        return NULL;
    }
    if (count < 0 || first < 0 || first > LLONG_MAX - count) {
        PyErr_SetString(PyExc_ValueError, "need count >= 0 and 0 <= first <= first + count");
        return NULL;
    }
    /* Every number has at most 19 digits. */
    Py_ssize_t most = count * (prefix_len + 19);
    if (count && (most / count != prefix_len + 19 || most > INT32_MAX)) {
        PyErr_SetString(PyExc_OverflowError, "the column would exceed 32-bit Arrow offsets");
        return NULL;
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *values = PyBytes_FromStringAndSize(NULL, most);
    if (offsets == NULL || values == NULL) {
        Py_XDECREF(offsets);
        Py_XDECREF(values);
        return NULL;
    }
    int32_t *out = (int32_t *)PyBytes_AS_STRING(offsets);
    char *to = PyBytes_AS_STRING(values);
    Py_ssize_t used = 0;
    out[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(to + used, prefix, (size_t)prefix_len);
        used += prefix_len;
        char digits[20];
        int n = 0;
        unsigned long long v = (unsigned long long)(first + i);
        do {
            digits[n++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (n) {
            to[used++] = digits[--n];
        }
        out[i + 1] = (int32_t)used;
    }
    if (_PyBytes_Resize(&values, used) < 0) {
        Py_DECREF(offsets);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, offsets, values);
    Py_DECREF(offsets);
    Py_DECREF(values);
    return result;
}

static int
compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static PyObject *
match_hashes(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *data, *hashes;
    Py_ssize_t start, end, units, extra;
    if (!PyArg_ParseTuple(args, "OnnOnn", &data, &start, &end, &hashes, &units, &extra)) {
        return NULL;
    }
    if (extra < 0) {
        PyErr_SetString(PyExc_ValueError, "extra must be >= 0");
        return NULL;
    }
    PyObject *items = PySequence_Fast(hashes, "hashes must be a collection of ints");
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    uint32_t *wanted = PyMem_Malloc((size_t)(count > 0 ? count : 1) * sizeof(uint32_t));
    if (wanted == NULL) {
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned long value = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(items, i));
        if (PyErr_Occurred() || value > UINT32_MAX) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_OverflowError, "a vchannel hash is above 2**32 - 1");
            }
            PyMem_Free(wanted);
            Py_DECREF(items);
            return NULL;
        }
        wanted[i] = (uint32_t)value;
    }
    Py_DECREF(items);
    qsort(wanted, (size_t)count, sizeof(uint32_t), compare_u32);
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyMem_Free(wanted);
        return NULL;
    }
    PyObject *matches = NULL, *result = NULL;
    if (start < 0 || end > view.len || start > end) {
        PyErr_Format(PyExc_ValueError, "run [%zd, %zd) is outside the %zd bytes given", start,
                     end, view.len);
        goto done;
    }
    matches = PyList_New(0);
    if (matches == NULL) {
        goto done;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t offset = start, examined = 0;
    while (offset < end && examined < units) {
        if (end - offset < HEADER_SIZE) {
            break;
        }
        const unsigned char *p = buf + offset;
        uint32_t total = read32(p + 4);
        if (p[0] != VERSION || total < HEADER_SIZE || (Py_ssize_t)total > end - offset) {
            break;
        }
        uint32_t hash = read32(p + 8);
        int found = 0;
        if (count <= 8) {
            for (Py_ssize_t i = 0; i < count; i++) {
                if (wanted[i] == hash) {
                    found = 1;
                    break;
                }
            }
        } else {
            found = bsearch(&hash, wanted, (size_t)count, sizeof(uint32_t), compare_u32) != NULL;
        }
        if (found) {
            if (append_new(matches, PyLong_FromSsize_t(offset)) < 0 ||
                append_new(matches, PyLong_FromSsize_t((Py_ssize_t)total)) < 0 ||
                append_new(matches, PyLong_FromSsize_t(examined)) < 0) {
                goto done;
            }
            units -= extra;
        }
        offset += (Py_ssize_t)total;
        examined += 1;
    }
    result = Py_BuildValue("(Onnn)", matches, offset, examined, units);
done:
    Py_XDECREF(matches);
    PyBuffer_Release(&view);
    PyMem_Free(wanted);
    return result;
}

/* -- decode_known: the messages of a run of envelopes decoding needs no judgement for -- */

/* The str of the msgpack str (fixstr or str8) at p, before `limit`, its end in *next;
 * NULL, no error set, if the bytes are not one of those forms or not UTF-8. */
static PyObject *
msgpack_str(const unsigned char *p, const unsigned char *limit, const unsigned char **next)
{
    Py_ssize_t len;
    const unsigned char *s;
    if (p >= limit) {
        return NULL;
    }
    if ((p[0] & 0xe0) == 0xa0) {
        len = p[0] & 0x1f;
        s = p + 1;
    }
    else if (p[0] == 0xd9 && limit - p >= 2) {
        len = p[1];
        s = p + 2;
    }
    else {
        return NULL;
    }
    if (len > limit - s) {
        return NULL;
    }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)s, len, NULL);
    if (text == NULL) {
        PyErr_Clear(); /* the Python path decodes it and says what is wrong */
        return NULL;
    }
    *next = s + len;
    return text;
}

/* The last-confirmed text and key of an ext section that is exactly [{}, str, nil, str]
 * (a keyed message's: no properties, no txn): 1 and two new references, else 0. */
static int
keyed_ext(const unsigned char *p, Py_ssize_t len, PyObject **lc, PyObject **key)
{
    const unsigned char *limit = p + len, *next = NULL;
    *lc = *key = NULL;
    if (len < 5 || p[0] != 0x94 || p[1] != 0x80) {
        return 0;
    }
    *lc = msgpack_str(p + 2, limit, &next);
    if (*lc == NULL || next >= limit || *next != 0xc0) {
        Py_CLEAR(*lc);
        return 0;
    }
    *key = msgpack_str(next + 1, limit, &next);
    if (*key == NULL || next != limit) {
        Py_CLEAR(*lc);
        Py_CLEAR(*key);
        return 0;
    }
    return 1;
}

/* What decode_known reads its records with (see the module comment). */
typedef struct {
    PyObject *make_id, *message_cls, *vchannels, *types, *exts, *lc_ids, *no_properties;
} Known;

/* The message of the envelope at p (`total` bytes, its header checked) with sequence
 * number `seq`: 1 and *out, 0 if it needs the Python path (declined), -1 on an error. */
static int
decode_one(const Known *k, const unsigned char *p, uint32_t total, long long seq,
           PyObject **out)
{
    uint16_t vc_len = read16(p + 12);
    uint32_t ext_len = read32(p + 32);
    Py_ssize_t ext_start = HEADER_SIZE + (Py_ssize_t)vc_len;
    Py_ssize_t payload_start = ext_start + (Py_ssize_t)ext_len;
    if (payload_start > (Py_ssize_t)total) {
        return 0;
    }
    PyObject *vchannel = NULL, *type = NULL, *id = NULL, *lc = NULL, *txn = NULL,
             *key = NULL, *payload = NULL, *timetick = NULL, *term = NULL;
    int status = -1;
    PyObject *found, *name = PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE, vc_len);
    if (name == NULL) {
        return -1;
    }
    found = PyDict_GetItemWithError(k->vchannels, name); /* (str, hash) */
    Py_DECREF(name);
    if (found == NULL || !PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 2) {
        return PyErr_Occurred() ? -1 : 0;
    }
    unsigned long hash = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(found, 1));
    if (hash == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (hash != read32(p + 8)) {
        return 0;
    }
    vchannel = Py_NewRef(PyTuple_GET_ITEM(found, 0));
    PyObject *number = PyLong_FromLong(read16(p + 2));
    if (number == NULL) {
        goto done;
    }
    found = PyDict_GetItemWithError(k->types, number);
    Py_DECREF(number);
    if (found == NULL) {
        status = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    type = Py_NewRef(found);
    if (ext_len == 0) {
        lc = Py_NewRef(Py_None);
        txn = Py_NewRef(Py_None);
        key = Py_NewRef(Py_None);
    }
    else {
        PyObject *ext = PyBytes_FromStringAndSize((const char *)p + ext_start, ext_len);
        if (ext == NULL) {
            goto done;
        }
        found = PyDict_GetItemWithError(k->exts, ext); /* (last-confirmed id, txn) */
        Py_DECREF(ext);
        if (found != NULL) {
            if (!PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 2) {
                status = 0;
                goto done;
            }
            lc = Py_NewRef(PyTuple_GET_ITEM(found, 0));
            txn = Py_NewRef(PyTuple_GET_ITEM(found, 1));
            key = Py_NewRef(Py_None);
        }
        else if (PyErr_Occurred()) {
            goto done;
        }
        else {
            PyObject *text;
            if (!keyed_ext(p + ext_start, ext_len, &text, &key)) {
                status = 0;
                goto done;
            }
            found = PyDict_GetItemWithError(k->lc_ids, text);
            Py_DECREF(text);
            if (found == NULL) {
                status = PyErr_Occurred() ? -1 : 0;
                goto done;
            }
            lc = Py_NewRef(found);
            txn = Py_NewRef(Py_None);
        }
    }
    /* the id last: a record declined above costs no id */
    number = PyLong_FromLongLong(seq);
    if (number == NULL) {
        goto done;
    }
    id = PyObject_CallOneArg(k->make_id, number);
    Py_DECREF(number);
    if (id == NULL) {
        goto done;
    }
    if (lc != Py_None && Py_TYPE(lc) != Py_TYPE(id)) {
        status = 0; /* an id of another log: the Python path says so */
        goto done;
    }
    payload = PyBytes_FromStringAndSize((const char *)p + payload_start,
                                        (Py_ssize_t)total - payload_start);
    timetick = PyLong_FromUnsignedLongLong(read64(p + 16));
    term = PyLong_FromUnsignedLongLong(read64(p + 24));
    if (payload == NULL || timetick == NULL || term == NULL) {
        goto done;
    }
    PyObject *fields[10] = {id, timetick, vchannel, type, payload, k->no_properties, lc, txn,
                            key, term};
    *out = PyObject_Vectorcall(k->message_cls, fields, 10, NULL);
    status = *out == NULL ? -1 : 1;
done:
    Py_XDECREF(vchannel);
    Py_XDECREF(type);
    Py_XDECREF(id);
    Py_XDECREF(lc);
    Py_XDECREF(txn);
    Py_XDECREF(key);
    Py_XDECREF(payload);
    Py_XDECREF(timetick);
    Py_XDECREF(term);
    return status;
}

static PyObject *
decode_known(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "decode_known takes 12 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    int seq_over = 0, stop_over = 0;
    long long seq = PyLong_AsLongLongAndOverflow(args[3], &seq_over);
    long long stop = PyLong_AsLongLongAndOverflow(args[4], &stop_over);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (seq_over || stop_over) { /* numbers past 2**63 - 1: left to the Python path */
        return Py_BuildValue("(NnO)", PyList_New(0), start, args[3]);
    }
    Known k = {args[5], args[6], args[7], args[8], args[9], args[10], args[11]};
    if (!PyDict_CheckExact(k.vchannels) || !PyDict_CheckExact(k.types) ||
        !PyDict_CheckExact(k.exts) || !PyDict_CheckExact(k.lc_ids)) {
        PyErr_SetString(PyExc_TypeError, "decode_known's caches must be dicts");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *messages = NULL, *result = NULL;
    if (start < 0 || end > view.len || start > end) {
        PyErr_Format(PyExc_ValueError, "run [%zd, %zd) is outside the %zd bytes given", start,
                     end, view.len);
        goto done;
    }
    messages = PyList_New(0);
    if (messages == NULL) {
        goto done;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t offset = start;
    while (offset < end && seq < stop && end - offset >= HEADER_SIZE) {
        const unsigned char *p = buf + offset;
        uint32_t total = read32(p + 4);
        if (p[0] != VERSION || p[1] != 0 || read16(p + 14) != 0 || total < HEADER_SIZE ||
            (Py_ssize_t)total > end - offset) {
            break; /* the Python path raises the CorruptRecord that names it */
        }
        PyObject *message = NULL;
        int status = decode_one(&k, p, total, seq, &message);
        if (status < 0) {
            goto done;
        }
        if (status == 0) {
            break;
        }
        if (append_new(messages, message) < 0) {
            goto done;
        }
        offset += (Py_ssize_t)total;
        seq += 1;
    }
    result = Py_BuildValue("(OnL)", messages, offset, seq);
done:
    Py_XDECREF(messages);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_columns_into", decode_columns_into, METH_VARARGS,
     "The loop of walsvc.core._codec.decode_columns, compiled (see the module comment)."},
    {"encode_plain_batch", encode_plain_batch, METH_VARARGS,
     "The envelopes of a batch of plain messages, see the module comment."},
    {"encode_plain_one", (PyCFunction)(void (*)(void))encode_plain_one, METH_FASTCALL,
     "The envelope of one plain message, see the module comment."},
    {"bind_message", bind_message, METH_O,
     "Read walsvc.Message's fields from their slots, see the module comment."},
    {"encode_keyed_batch", encode_keyed_batch, METH_VARARGS,
     "The envelopes of a batch of messages with or without keys, see the module comment."},
    {"are_plain", are_plain, METH_VARARGS,
     "Whether encode_plain_batch can take a batch, see the module comment."},
    {"user_batch_kind", user_batch_kind, METH_VARARGS,
     "user_batch_kind(messages, system_types): -1 unless all are user messages; else 0 if "
     "none is keyed, 1 if all are, 2 if some are."},
    {"are_keyed", are_keyed, METH_VARARGS,
     "Whether encode_keyed_batch can take a batch, see the module comment."},
    {"numbered_strings", numbered_strings, METH_VARARGS,
     "prefix + str(first + i) as an Arrow string column's buffers, see the module comment."},
    {"match_hashes", match_hashes, METH_VARARGS,
     "The header walk of a vchannel-only filter, see the module comment."},
    {"decode_known", (PyCFunction)(void (*)(void))decode_known, METH_FASTCALL,
     "The messages of a run of envelopes, up to one needing judgement; see the module "
     "comment."},
    {"gather_payloads", gather_payloads, METH_VARARGS,
     "The payload column of a run: (int32 offsets, values), see the module comment."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "walsvc.core._speedups",
    .m_doc = "Compiled hot loops of walsvc.core._codec and _runs (optional: walsvc runs without them).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    attr_type = PyUnicode_InternFromString("type");
    attr_vchannel = PyUnicode_InternFromString("vchannel");
    attr_payload = PyUnicode_InternFromString("payload");
    if (attr_type == NULL || attr_vchannel == NULL || attr_payload == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
