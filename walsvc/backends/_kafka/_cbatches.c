/* walsvc.backends._kafka._cbatches: the record walk of a Kafka fetch response.
 *
 * walk(data, pos, fetch_offset, next_offset, crc32c, corrupt, out) -> (pos, next_offset)
 *
 * reads the record batches (message format v2) laid end to end in data[pos:] and appends
 * one tuple per record whose offset is at least fetch_offset to the list `out`:
 *
 *   (offset, head, value)     a walsvc data record laid out as _records.data_headers
 *                             does (headers exactly walsvc.o then walsvc.h) whose
 *                             walsvc.o names its own offset: head is the walsvc.h value
 *                             (bytes), value the record's value (bytes, or None)
 *   (offset, headers, value)  any other record: headers is a list of (str, bytes | None)
 *                             pairs, as aiokafka gives them, for _records.classify
 *
 * Each batch's CRC-32C (over its bytes from the attributes to its end) is checked with
 * crc32c(memoryview) before any of its records is read; a mismatch, or a record that
 * does not fit its batch, raises `corrupt` (walsvc.CorruptRecord). Control batches are
 * stepped over. next_offset becomes the offset after the last batch walked.
 *
 * The walk stops, returning where it stopped, at the end of the data, at a batch the
 * data holds only part of (a fetch response may end in one), and at a batch it does not
 * read: another magic than 2 or a compressed one. The caller reads such a batch with
 * aiokafka's parser and calls walk again after it (walsvc/backends/_kafka/_batches.py).
 *
 * It exists because aiokafka's consumer builds a Python ConsumerRecord through a
 * generator for every record, about two thirds of the raw consumer's CPU per message
 * (measured with cProfile on a 100k-message scan), and walsvc needs none of it.
 *
 * Layout (big-endian; KIP-98): base offset int64 @0, batch length int32 @8 (bytes after
 * it), leader epoch int32 @12, magic int8 @16, crc uint32 @17, attributes int16 @21
 * (bits 0-2 compression, bit 5 control), last offset delta int32 @23, timestamps,
 * producer fields, record count int32 @57, records @61. A record: length, attributes
 * int8, timestamp delta, offset delta, key length, key, value length, value, header
 * count, then per header key length, key, value length, value; every number but the
 * attributes a zigzag varint, a length of -1 meaning null.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BATCH_OVERHEAD 12   /* base offset + batch length */
#define BATCH_HEADER 61     /* up to the first record */
#define MAGIC_AT 16
#define CRC_START 21        /* the CRC covers attributes .. end */
#define COMPRESSION_MASK 0x07
#define CONTROL_FLAG 0x20

static const char EXPECTED_KEY[] = "walsvc.o";
static const char ENVELOPE_KEY[] = "walsvc.h";
#define KEY_LEN 8

static int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return (int64_t)v;
}

static int32_t
be32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static int16_t
be16(const unsigned char *p)
{
    return (int16_t)(((unsigned)p[0] << 8) | (unsigned)p[1]);
}

/* A zigzag varint of at most 10 bytes at *p (before end): 0 and *p past it, or -1. */
static int
varint(const unsigned char **p, const unsigned char *end, int64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)((v >> 1) ^ (~(v & 1) + 1));
            return 0;
        }
    }
    return -1;
}

/* A length field followed by that many bytes (or null at -1) inside [*p, end). */
static int
sized(const unsigned char **p, const unsigned char *end, const unsigned char **start,
      int64_t *len)
{
    if (varint(p, end, len) < 0 || *len < -1 || (*len > 0 && *len > end - *p)) {
        return -1;
    }
    *start = *p;
    if (*len > 0) {
        *p += *len;
    }
    return 0;
}

static PyObject *
bytes_or_none(const unsigned char *start, int64_t len)
{
    if (len < 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)start, (Py_ssize_t)len);
}

/* The headers of a record that is not a plain walsvc data record, as a list. */
static PyObject *
header_list(const unsigned char *p, const unsigned char *end, int64_t count)
{
    PyObject *list = PyList_New(0);
    if (list == NULL) {
        return NULL;
    }
    for (int64_t i = 0; i < count; i++) {
        const unsigned char *key, *value;
        int64_t key_len, value_len;
        if (sized(&p, end, &key, &key_len) < 0 || key_len < 0 ||
            sized(&p, end, &value, &value_len) < 0) {
            Py_DECREF(list);
            return NULL; /* no exception set: the caller raises corrupt */
        }
        PyObject *name = PyUnicode_DecodeUTF8((const char *)key, (Py_ssize_t)key_len, NULL);
        if (name == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear(); /* the caller raises corrupt */
            }
            Py_DECREF(list);
            return NULL;
        }
        PyObject *pair = Py_BuildValue("(NN)", name, bytes_or_none(value, value_len));
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(pair);
    }
    return list;
}

static int
raise_corrupt(PyObject *corrupt, int64_t offset, const char *what)
{
    if (!PyErr_Occurred()) {
        PyErr_Format(corrupt, "Kafka record batch at offset %lld: %s", (long long)offset,
                     what);
    }
    return -1;
}

/* Append (offset, head, value) to out, taking over the reference to head (NULL: the
 * error that made it is set). 0, or -1 with an exception set. */
static int
append_record(PyObject *out, int64_t offset, PyObject *head, const unsigned char *value,
              int64_t value_len)
{
    if (head == NULL) {
        return -1;
    }
    PyObject *item =
        Py_BuildValue("(LNN)", (long long)offset, head, bytes_or_none(value, value_len));
    if (item == NULL) {
        return -1;
    }
    int appended = PyList_Append(out, item);
    Py_DECREF(item);
    return appended;
}

/* Read one record at *p (the batch ends at end); append its tuple to out if its offset
 * is at least fetch_offset. 0, or -1 with an exception set. */
static int
read_record(const unsigned char **p, const unsigned char *end, int64_t base_offset,
            int64_t fetch_offset, PyObject *corrupt, PyObject *out)
{
    int64_t length, ts_delta, offset_delta, key_len, value_len, header_count;
    const unsigned char *key, *value;
    if (varint(p, end, &length) < 0 || length < 0 || length > end - *p) {
        return raise_corrupt(corrupt, base_offset, "a record length does not fit the batch");
    }
    const unsigned char *r = *p, *r_end = *p + length;
    *p = r_end;
    if (r_end - r < 1) {
        return raise_corrupt(corrupt, base_offset, "an empty record");
    }
    r++; /* attributes */
    if (varint(&r, r_end, &ts_delta) < 0 || varint(&r, r_end, &offset_delta) < 0 ||
        sized(&r, r_end, &key, &key_len) < 0 || sized(&r, r_end, &value, &value_len) < 0 ||
        varint(&r, r_end, &header_count) < 0 || header_count < 0) {
        return raise_corrupt(corrupt, base_offset, "a record's fields do not fit it");
    }
    int64_t offset = base_offset + offset_delta;
    if (offset < fetch_offset) {
        return 0;
    }
    const unsigned char *headers = r;
    /* The plain data record: walsvc.o = its own offset, then walsvc.h. */
    if (header_count == 2) {
        const unsigned char *k0, *v0, *k1, *v1;
        int64_t k0_len, v0_len, k1_len, v1_len;
        if (sized(&r, r_end, &k0, &k0_len) == 0 && sized(&r, r_end, &v0, &v0_len) == 0 &&
            sized(&r, r_end, &k1, &k1_len) == 0 && sized(&r, r_end, &v1, &v1_len) == 0 &&
            r == r_end && k0_len == KEY_LEN && memcmp(k0, EXPECTED_KEY, KEY_LEN) == 0 &&
            k1_len == KEY_LEN && memcmp(k1, ENVELOPE_KEY, KEY_LEN) == 0 && v0_len == 8 &&
            v1_len >= 0 && be64(v0) == offset) {
            return append_record(out, offset, bytes_or_none(v1, v1_len), value, value_len);
        }
    }
    PyObject *list = header_list(headers, r_end, header_count);
    if (list == NULL) {
        return raise_corrupt(corrupt, offset, "a record's headers do not fit it");
    }
    return append_record(out, offset, list, value, value_len);
}

static int
check_crc(PyObject *crc32c, PyObject *corrupt, const unsigned char *batch,
          Py_ssize_t batch_size, int64_t base_offset)
{
    PyObject *view = PyMemoryView_FromMemory((char *)batch + CRC_START,
                                             batch_size - CRC_START, PyBUF_READ);
    if (view == NULL) {
        return -1;
    }
    PyObject *crc = PyObject_CallOneArg(crc32c, view);
    Py_DECREF(view);
    if (crc == NULL) {
        return -1;
    }
    unsigned long got = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (got == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    if (got != (uint32_t)be32(batch + 17)) {
        return raise_corrupt(corrupt, base_offset, "CRC-32C mismatch");
    }
    return 0;
}

static PyObject *
walk(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos;
    long long fetch_offset, next_offset;
    PyObject *crc32c, *corrupt, *out;
    if (!PyArg_ParseTuple(args, "y*nLLOOO!", &buf, &pos, &fetch_offset, &next_offset,
                          &crc32c, &corrupt, &PyList_Type, &out)) {
        return NULL;
    }
    const unsigned char *data = buf.buf;
    Py_ssize_t size = buf.len;
    if (pos < 0 || pos > size) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "pos is outside the data");
        return NULL;
    }
    while (size - pos >= BATCH_OVERHEAD) {
        const unsigned char *batch = data + pos;
        int64_t base_offset = be64(batch);
        int32_t length = be32(batch + 8);
        if (length < 0) {
            raise_corrupt(corrupt, base_offset, "negative batch length");
            goto error;
        }
        Py_ssize_t batch_size = BATCH_OVERHEAD + (Py_ssize_t)length;
        if (batch_size > size - pos) {
            break; /* the response holds only part of this batch */
        }
        if (batch_size <= MAGIC_AT) {
            raise_corrupt(corrupt, base_offset, "batch too short for its magic byte");
            goto error;
        }
        if (batch[MAGIC_AT] == 2 && batch_size < BATCH_HEADER) {
            raise_corrupt(corrupt, base_offset, "batch length too small");
            goto error;
        }
        if (batch[MAGIC_AT] != 2 || (be16(batch + 21) & COMPRESSION_MASK)) {
            break; /* not ours to read: the caller's parser takes it */
        }
        int16_t attributes = be16(batch + 21);
        if (check_crc(crc32c, corrupt, batch, batch_size, base_offset) < 0) {
            goto error;
        }
        int64_t after = base_offset + (int64_t)be32(batch + 23) + 1;
        if (!(attributes & CONTROL_FLAG)) {
            int32_t count = be32(batch + 57);
            const unsigned char *p = batch + BATCH_HEADER, *end = batch + batch_size;
            for (int32_t i = 0; i < count; i++) {
                if (read_record(&p, end, base_offset, fetch_offset, corrupt, out) < 0) {
                    goto error;
                }
            }
            if (count < 0 || p != end) {
                raise_corrupt(corrupt, base_offset, "record count does not match the batch");
                goto error;
            }
        }
        if (after > next_offset) {
            next_offset = after;
        }
        pos += batch_size;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("(nL)", pos, next_offset);
error:
    PyBuffer_Release(&buf);
    return NULL;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(data, pos, fetch_offset, next_offset, crc32c, corrupt, out) -> (pos, next_offset)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "walsvc.backends._kafka._cbatches",
    "The record walk of a Kafka fetch response (see walsvc/backends/_kafka/_batches.py).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__cbatches(void)
{
    return PyModule_Create(&module);
}
