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
 * Committer(head_fd, term, notify_fd, idle_timeout=1.0)
 *
 * `head_fd` is the pchannel's head file (the writers' lock), `term` the writer's term,
 * `notify_fd` an eventfd the thread adds 1 to when a batch is done. The thread starts
 * with the first batch and exits once it has waited `idle_timeout` seconds for another
 * (an idle pchannel costs no thread); the next batch starts a new one.
 *
 * commit(data_fd, data, offset, sync, durable_end, last_timetick, segment)
 *
 * hands one batch to the thread, starting the thread if there is none (ValueError while
 * another batch is in flight or its outcome not collected; OSError, with nothing handed
 * over, if no thread can be started). Under flock(head_fd, LOCK_EX) the thread reads the
 * head file and checks
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
 * after the committer was made there is no thread: commit raises RuntimeError there,
 * and close only marks the committer closed.
 *
 * syncs: the fdatasync calls the thread made. running: True while a thread serves the
 * committer (False once it exited idle). threads_started: the threads it has started.
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
#include <time.h>
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
    pid_t pid; /* the process that made the committer: a forked child has no thread */
    int head_fd, notify_fd;
    uint64_t term;
    int64_t idle_ns; /* the thread exits after waiting this long for a job */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, stopping; /* made (and not closed); closing */
    int running;           /* a thread serves jobs (set by commit, cleared by the thread) */
    int joinable;          /* `thread` was started and not joined yet (it may have exited) */
    unsigned long long threads_started;
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

/* Wait on c->cv (c->mu held) until a job comes, the committer closes or idle_ns passed;
 * 0 on timeout (nothing came). */
static int
wait_for_job(Committer *c)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    int64_t ns = deadline.tv_nsec + c->idle_ns % 1000000000;
    deadline.tv_sec += (time_t)(c->idle_ns / 1000000000 + ns / 1000000000);
    deadline.tv_nsec = (long)(ns % 1000000000);
    while (!c->pending && !c->stopping) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &deadline) == ETIMEDOUT) {
            return c->pending || c->stopping;
        }
    }
    return 1;
}

static void *
run(void *arg)
{
    Committer *c = arg;
    pthread_setname_np(pthread_self(), "walsvc-commit"); /* in ps, top and /proc */
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (!wait_for_job(c) || !c->pending) {
            /* Idle for idle_ns, or closing with nothing left to do. Under the lock: a
             * commit that comes after this sees running == 0 and starts a new thread. */
            c->running = 0;
            break;
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
    static char *names[] = {"head_fd", "term", "notify_fd", "idle_timeout", NULL};
    unsigned long long term;
    double idle_timeout = 1.0;
    if (self->started || self->stopping) {
        PyErr_SetString(PyExc_RuntimeError, self->started ? "Committer is already running"
                                                          : "Committer is closed");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iKi|d", names, &self->head_fd, &term,
                                     &self->notify_fd, &idle_timeout)) {
        return -1;
    }
    if (!(idle_timeout > 0 && idle_timeout <= 86400)) {
        PyErr_SetString(PyExc_ValueError, "idle_timeout must be seconds > 0 (at most a day)");
        return -1;
    }
    self->term = term;
    self->idle_ns = (int64_t)(idle_timeout * 1e9);
    self->pid = getpid();
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* idle waits ignore clock steps */
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, &attr);
    pthread_condattr_destroy(&attr);
    self->started = 1;
    return 0;
}

/* Start a thread for the job just queued (the thread before it, if any, has exited or is
 * exiting: join it first). 0, or an errno. */
static int
start_thread(Committer *self)
{
    if (self->joinable) {
        pthread_join(self->thread, NULL); /* it left the lock for good: at most a moment */
        self->joinable = 0;
    }
    /* Signals go to the other threads (Python handles them on the main thread): the new
     * thread starts with all of them blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = pthread_create(&self->thread, NULL, run, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err == 0) {
        self->joinable = 1;
        self->threads_started++;
    }
    return err;
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
    if (self->running) {
        pthread_cond_signal(&self->cv);
        pthread_mutex_unlock(&self->mu);
        Py_RETURN_NONE;
    }
    self->running = 1;
    pthread_mutex_unlock(&self->mu);
    int err = start_thread(self);
    if (err != 0) {
        pthread_mutex_lock(&self->mu);
        self->running = 0;
        self->pending = 0;
        pthread_mutex_unlock(&self->mu);
        Py_CLEAR(self->data);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
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
    /* Cleared before the join lets go of the GIL: a close from another thread meanwhile
     * returns at once instead of joining the thread a second time, and commit refuses. */
    self->started = 0;
    if (getpid() != self->pid) { /* a forked child: no thread to stop, locks as forked */
        Py_CLEAR(self->data);
        return;
    }
    pthread_mutex_lock(&self->mu);
    self->stopping = 1;
    pthread_cond_signal(&self->cv);
    pthread_mutex_unlock(&self->mu);
    if (self->joinable) {
        self->joinable = 0;
        pthread_t thread = self->thread;
        Py_BEGIN_ALLOW_THREADS
        pthread_join(thread, NULL);
        Py_END_ALLOW_THREADS
    }
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
    {"threads_started", T_ULONGLONG, offsetof(Committer, threads_started), READONLY,
     "The threads the committer has started (one more after each idle exit)."},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
Committer_running(Committer *self, void *Py_UNUSED(closure))
{
    int running = 0;
    if (self->started && getpid() == self->pid) {
        pthread_mutex_lock(&self->mu);
        running = self->running;
        pthread_mutex_unlock(&self->mu);
    }
    return PyBool_FromLong(running);
}

static PyGetSetDef Committer_getset[] = {
    {"running", (getter)Committer_running, NULL,
     "True while a thread serves the committer (False once it exited idle).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
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
    .tp_getset = Committer_getset,
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
