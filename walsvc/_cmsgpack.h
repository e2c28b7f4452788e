/* walsvc/_cmsgpack.h: what the compiled wire modules share (walsvc/service/_cwire.c, the
 * node's; walsvc/remote/_cclient.c, the client's): a Struct's field read from its slot,
 * and a msgpack writer into a bytes object that writes each value in the smallest form
 * msgspec writes it in, so that a compiled encoder's bytes are msgspec's, byte for byte.
 *
 * Each writer returns 0 (written), -1 (an exception set) or, where a value may not be
 * taken (an int beyond 64 bits, a str that is not UTF-8, a length msgpack cannot hold),
 * 1: the caller then gives the work back to its Python path. Everything is static: each
 * module gets its own copy.
 */
#ifndef WALSVC_CMSGPACK_H
#define WALSVC_CMSGPACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

static inline PyObject *
slot(PyObject *object, Py_ssize_t offset)
{
    return *(PyObject **)((char *)object + offset);
}

/* The offset of `cls`'s field `name`, or -1 (no exception) if it is not an object slot,
 * or -2 with an exception set. */
static inline Py_ssize_t
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

/* -- the output: a bytes object written in place, resized as it grows ---------------- */

typedef struct {
    PyObject *bytes; /* NULL until the first reserve */
    char *data;
    Py_ssize_t size, capacity;
} Buffer;

#define EMPTY_BUFFER {NULL, NULL, 0, 0}

/* Room for `more` bytes; 0, or -1 with MemoryError set. */
static inline int
reserve(Buffer *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity) {
        return 0;
    }
    Py_ssize_t capacity = b->capacity * 2;
    if (capacity < b->size + more) {
        capacity = b->size + more;
    }
    if (b->bytes == NULL) {
        b->bytes = PyBytes_FromStringAndSize(NULL, capacity);
        if (b->bytes == NULL) {
            return -1;
        }
    }
    else if (_PyBytes_Resize(&b->bytes, capacity) < 0) {
        return -1; /* b->bytes is NULL now */
    }
    b->data = PyBytes_AS_STRING(b->bytes);
    b->capacity = capacity;
    return 0;
}

/* The bytes written (b"" if none), or NULL with an exception set; the buffer is spent
 * either way. */
static inline PyObject *
finish(Buffer *b)
{
    PyObject *bytes = b->bytes;
    b->bytes = NULL;
    if (bytes == NULL) {
        return PyBytes_FromStringAndSize(NULL, 0);
    }
    if (_PyBytes_Resize(&bytes, b->size) < 0) {
        return NULL;
    }
    return bytes;
}

/* A copy of the bytes written; the buffer stays (to be written again from `size` 0). */
static inline PyObject *
copy_out(Buffer *b)
{
    return PyBytes_FromStringAndSize(b->data, b->size);
}

/* Drop what the buffer holds. */
static inline void
discard(Buffer *b)
{
    Py_CLEAR(b->bytes);
}

static inline int
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
static inline int
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

static inline int
put_byte(Buffer *b, unsigned char byte)
{
    if (reserve(b, 1) < 0) {
        return -1;
    }
    b->data[b->size++] = (char)byte;
    return 0;
}

/* A header as msgpack's smallest form: `fix` ORed with n below `fix_limit`, else the 8-,
 * 16- or 32-bit marker (m8 0 when the format has no 8-bit length). */
static inline int
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

static inline int
put_array(Buffer *b, Py_ssize_t n)
{
    return put_header(b, n, 0x90, 16, 0, 0xdc, 0xdd);
}

/* 0 written, 1 not taken (not an exact int, or outside 64 bits), -1 error. */
static inline int
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

static inline int
put_str_utf8(Buffer *b, const char *text, Py_ssize_t n)
{
    int status = put_header(b, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
    return status != 0 ? status : put_bytes(b, text, n);
}

/* 0 written, 1 not taken (not an exact str, or not UTF-8 encodable), -1 error. */
static inline int
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

static inline int
put_bin(Buffer *b, PyObject *value)
{
    if (!PyBytes_CheckExact(value)) {
        return 1;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    int status = put_header(b, n, 0, 0, 0xc4, 0xc5, 0xc6);
    return status != 0 ? status : put_bytes(b, PyBytes_AS_STRING(value), n);
}

#endif /* WALSVC_CMSGPACK_H */
