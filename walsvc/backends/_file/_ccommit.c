/* walsvc.backends._file._ccommit: the file WAL's group-commit step on a thread of its own
 * that never takes the GIL.
 *
 * Why: a batch handed to a Python worker thread crosses the GIL twice per round trip. The
 * worker cannot start until the event loop's thread goes idle and lets go of the GIL, and
 * the loop, woken by the worker, waits again until the worker has finished its Python
 * bookkeeping. Each crossing is a thread wake-up on this VM (tens of microseconds), paid
 * in every group commit while every producer waits. This thread waits on a condition
 * variable, does its system calls and signals an eventfd the event loop watches; no
 * Python runs on it, so nothing waits for the GIL.
 *
 * Committer(head_fd, term, notify_fd)
 *
 * starts the thread. `head_fd` is the pchannel's head file (the writers' lock), `term` the
 * writer's term, `notify_fd` an eventfd the thread adds 1 to when a batch is done.
 *
 * commit(data_fd, data, offset, sync, durable_end, last_timetick, segment)
 *
 * hands one batch to the thread (ValueError while another is in flight or its outcome
 * not collected). Under flock(head_fd, LOCK_EX) the thread reads the head file and checks
 * its length, magic, version and CRC-32C; if its term is not the writer's it writes
 * nothing (fenced); else it pwrites `data` at `offset` of `data_fd`, fdatasyncs that file
 * if `sync`, and overwrites the head with (term, durable_end, the head's first record,
 * last_timetick, segment, offset + len(data)), not synced: what GroupCommitWriter._write
 * does in Python. `segment` is the first record of the segment `data_fd` is.
 *
 * outcome() -> (status, value)
 *
 * once the eventfd fired: (OK, 0) written; (FENCED, term) a writer with `term` took over;
 * (BAD_HEAD, 0) the head file fails its checks; (OS_ERROR, errno) a system call failed
 * (the batch may be partly written). Drops the reference to `data`.
 *
 * close()
 *
 * waits for the batch in flight, then stops and joins the thread. In a child forked
 * after the thread started there is no thread: commit raises RuntimeError there, and
 * close only marks the committer closed.
 *
 * syncs: the fdatasync calls the thread made.
 *
 * The head file is 60 bytes, little-endian: "<4sHHQQQQQQ" (magic "WALH", version 2,
 * reserved, term, durable end, first seq, last timetick, the segment and the byte offset
 * where the durable records end) and the CRC-32C of those 56 (see _head.py).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* pthread_setname_np */
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <sys/file.h>
#include <unistd.h>

#define HEAD_BODY 56
#define HEAD_SIZE (HEAD_BODY + 4)
#define HEAD_VERSION 2

enum { OK = 0, FENCED = 1, BAD_HEAD = 2, OS_ERROR = 3 };

static uint32_t crc_table[256];

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_table[i] = c;
    }
}

/* CRC-32C (Castagnoli), as the crc32c package computes it. */
static uint32_t
crc32c(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    while (n--) {
        c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    }
    return c ^ 0xFFFFFFFFu;
}

static uint64_t
get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static void
put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static uint32_t
get32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static void
put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

typedef struct {
    int data_fd;
    const char *data;
    Py_ssize_t size;
    int64_t offset;
    int sync;
    uint64_t durable_end, last_timetick, segment;
} Job;

typedef struct {
    PyObject_HEAD
    pid_t pid; /* the process that started the thread: a forked child has no thread */
    int head_fd, notify_fd;
    uint64_t term;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, stopping;
    int pending;   /* a job is waiting for the thread or being done */
    int done;      /* its outcome is ready and not collected */
    Job job;
    PyObject *data; /* keeps job.data alive until the outcome is collected */
    int status;
    uint64_t value;
    unsigned long long syncs; /* fdatasync calls made (read once a batch is collected) */
} Committer;

/* The thread's work for one job: returns the status, sets *value. */
static int
commit_one(Committer *c, const Job *job, uint64_t *value)
{
    int status = OK;
    *value = 0;
    while (flock(c->head_fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            *value = (uint64_t)errno;
            return OS_ERROR;
        }
    }
    unsigned char head[HEAD_SIZE];
    ssize_t got;
    do {
        got = pread(c->head_fd, head, HEAD_SIZE, 0);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        status = OS_ERROR;
        *value = (uint64_t)errno;
        goto unlock;
    }
    if (got != HEAD_SIZE || memcmp(head, "WALH", 4) != 0 ||
        (head[4] | (head[5] << 8)) != HEAD_VERSION ||
        get32(head + HEAD_BODY) != crc32c(head, HEAD_BODY)) {
        status = BAD_HEAD;
        goto unlock;
    }
    uint64_t term = get64(head + 8);
    if (term != c->term) {
        status = FENCED;
        *value = term;
        goto unlock;
    }
    const char *p = job->data;
    Py_ssize_t left = job->size;
    int64_t at = job->offset;
    while (left > 0) {
        ssize_t n = pwrite(job->data_fd, p, (size_t)left, at);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            status = OS_ERROR;
            *value = (uint64_t)errno;
            goto unlock;
        }
        p += n;
        left -= n;
        at += n;
    }
    if (job->sync) {
        c->syncs++;
        int synced;
        do {
            synced = fdatasync(job->data_fd);
        } while (synced != 0 && errno == EINTR);
        if (synced != 0) {
            status = OS_ERROR;
            *value = (uint64_t)errno;
            goto unlock;
        }
    }
    put64(head + 16, job->durable_end); /* term and first seq stay as read */
    put64(head + 32, job->last_timetick);
    put64(head + 40, job->segment);
    put64(head + 48, (uint64_t)(job->offset + job->size));
    put32(head + HEAD_BODY, crc32c(head, HEAD_BODY));
    ssize_t put = pwrite(c->head_fd, head, HEAD_SIZE, 0);
    if (put != HEAD_SIZE) {
        status = OS_ERROR;
        *value = put < 0 ? (uint64_t)errno : (uint64_t)EIO;
    }
unlock:
    flock(c->head_fd, LOCK_UN);
    return status;
}

static void *
run(void *arg)
{
    Committer *c = arg;
    /* Signals go to the other threads (Python handles them on the main thread). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_setname_np(pthread_self(), "walsvc-commit"); /* in ps, top and /proc */
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->pending && !c->stopping) {
            pthread_cond_wait(&c->cv, &c->mu);
        }
        if (!c->pending) {
            break; /* stopping, nothing left to do */
        }
        Job job = c->job;
        pthread_mutex_unlock(&c->mu);
        uint64_t value;
        int status = commit_one(c, &job, &value);
        pthread_mutex_lock(&c->mu);
        c->status = status;
        c->value = value;
        c->pending = 0;
        c->done = 1;
        uint64_t one = 1;
        while (write(c->notify_fd, &one, sizeof one) < 0 && errno == EINTR) {
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int
Committer_init(Committer *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"head_fd", "term", "notify_fd", NULL};
    unsigned long long term;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Committer is already running");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iKi", names, &self->head_fd, &term,
                                     &self->notify_fd)) {
        return -1;
    }
    self->term = term;
    self->pid = getpid();
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    int err = pthread_create(&self->thread, NULL, run, self);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->started = 1;
    return 0;
}

/* 0 if the committer takes calls here; -1 with an exception set if it is closed, or if
 * this process is a child forked after the thread started (the thread is not here). */
static int
check_usable(Committer *self)
{
    if (!self->started || self->stopping) {
        PyErr_SetString(PyExc_ValueError, "the committer is closed");
        return -1;
    }
    if (getpid() != self->pid) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the committer's thread runs in the process that forked this one");
        return -1;
    }
    return 0;
}

static PyObject *
Committer_commit(Committer *self, PyObject *args)
{
    int data_fd, sync;
    PyObject *data;
    long long offset;
    unsigned long long durable_end, last_timetick, segment;
    if (!PyArg_ParseTuple(args, "iSLpKKK", &data_fd, &data, &offset, &sync, &durable_end,
                          &last_timetick, &segment)) {
        return NULL;
    }
    if (check_usable(self) < 0) {
        return NULL;
    }
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "offset must be >= 0");
        return NULL;
    }
    pthread_mutex_lock(&self->mu);
    if (self->pending || self->done) {
        pthread_mutex_unlock(&self->mu);
        PyErr_SetString(PyExc_ValueError, "a batch is in flight or its outcome not collected");
        return NULL;
    }
    self->job = (Job){
        .data_fd = data_fd,
        .data = PyBytes_AS_STRING(data),
        .size = PyBytes_GET_SIZE(data),
        .offset = offset,
        .sync = sync,
        .durable_end = durable_end,
        .last_timetick = last_timetick,
        .segment = segment,
    };
    self->data = Py_NewRef(data);
    self->pending = 1;
    pthread_cond_signal(&self->cv);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
}

static PyObject *
Committer_outcome(Committer *self, PyObject *Py_UNUSED(ignored))
{
    if (check_usable(self) < 0) {
        return NULL;
    }
    pthread_mutex_lock(&self->mu);
    if (!self->done) {
        pthread_mutex_unlock(&self->mu);
        PyErr_SetString(PyExc_ValueError, "no outcome: no batch has finished");
        return NULL;
    }
    int status = self->status;
    uint64_t value = self->value;
    self->done = 0;
    PyObject *data = self->data;
    self->data = NULL;
    pthread_mutex_unlock(&self->mu);
    Py_XDECREF(data);
    return Py_BuildValue("iK", status, (unsigned long long)value);
}

/* Stop the thread after the job in flight and join it (releases the GIL meanwhile). */
static void
stop(Committer *self)
{
    if (!self->started) {
        return;
    }
    if (getpid() != self->pid) { /* a forked child: no thread to stop, locks as forked */
        self->started = 0;
        Py_CLEAR(self->data);
        return;
    }
    pthread_mutex_lock(&self->mu);
    self->stopping = 1;
    pthread_cond_signal(&self->cv);
    pthread_mutex_unlock(&self->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->started = 0;
    pthread_mutex_destroy(&self->mu);
    pthread_cond_destroy(&self->cv);
    Py_CLEAR(self->data);
}

static PyObject *
Committer_close(Committer *self, PyObject *Py_UNUSED(ignored))
{
    stop(self);
    self->stopping = 1;
    Py_RETURN_NONE;
}

static void
Committer_dealloc(Committer *self)
{
    stop(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Committer_methods[] = {
    {"commit", (PyCFunction)Committer_commit, METH_VARARGS,
     "Hand one batch to the thread, see the module comment."},
    {"outcome", (PyCFunction)Committer_outcome, METH_NOARGS,
     "(status, value) of the finished batch, see the module comment."},
    {"close", (PyCFunction)Committer_close, METH_NOARGS,
     "Wait for the batch in flight, then stop the thread."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Committer_members[] = {
    {"syncs", T_ULONGLONG, offsetof(Committer, syncs), READONLY,
     "fdatasync calls the thread made (up to date once a batch's outcome is collected)."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CommitterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "walsvc.backends._file._ccommit.Committer",
    .tp_basicsize = sizeof(Committer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The group-commit step on a thread that never takes the GIL.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Committer_init,
    .tp_dealloc = (destructor)Committer_dealloc,
    .tp_methods = Committer_methods,
    .tp_members = Committer_members,
};

static PyObject *
crc32c_py(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t crc = crc32c(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"crc32c", crc32c_py, METH_O, "The CRC-32C the thread checks the head file with."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "walsvc.backends._file._ccommit",
    .m_doc = "The file WAL's group-commit step on a thread that never takes the GIL.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__ccommit(void)
{
    crc_init();
    if (PyType_Ready(&CommitterType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Committer", (PyObject *)&CommitterType) < 0 ||
        PyModule_AddIntConstant(m, "OK", OK) < 0 ||
        PyModule_AddIntConstant(m, "FENCED", FENCED) < 0 ||
        PyModule_AddIntConstant(m, "BAD_HEAD", BAD_HEAD) < 0 ||
        PyModule_AddIntConstant(m, "OS_ERROR", OS_ERROR) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
