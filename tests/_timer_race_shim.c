/* Fault injection for pulsar-client's cross-thread timer race (LD_PRELOAD), used by
 * tests/test_pulsar_timer_race.py.
 *
 * asio's timers are not safe to arm on one thread and cancel on another: async_wait sets
 * might_have_pending_waits, then queues the wait under the reactor's lock; a cancel
 * between the two finds nothing queued and clears the flag, so the wait is queued while
 * the timer believes it has none, and the timer's destruction leaves it in the reactor,
 * which crashes when it comes due. pulsar-client arms a new reader's creation timer on
 * the thread that asked for the reader whenever the topic's metadata was answered before
 * it looked (HandlerBase::start), and cancels it on its I/O thread once connected.
 *
 * The shim makes that interleaving certain instead of rare. Offsets into libpulsar come
 * from the environment (the test finds them in the binary):
 *   SHIM_READER_NEW_RETURN   the return address of the operator new that
 *                            ClientImpl::createReaderAsync calls between its metadata
 *                            lookup and the addListener on it;
 *   SHIM_SCHEDULE_TIMER      epoll_reactor::schedule_timer's start and size.
 * A thread that reaches that operator new waits SHIM_LOOKUP_MS (the lookup is answered
 * meanwhile, so the listener, and HandlerBase::start with it, runs on that thread); for
 * the next SHIM_MARK_MS it then waits SHIM_WINDOW_MS in every schedule_timer, after the
 * flag is set and before the reactor's lock is taken, while the I/O thread connects the
 * reader and cancels its creation timer. walsvc_shim_set_base(libpulsar's load address)
 * arms it; walsvc_shim_marks() and walsvc_shim_delays() count what it did.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static uintptr_t base, reader_new_return, schedule_start, schedule_end;
static long lookup_ms = 30, window_ms = 150, mark_ms = 2000;
static long marks, delays;
static __thread double marked_until;
static int (*real_lock)(pthread_mutex_t *);
static void *(*real_new)(size_t);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static long from_env(const char *name, long otherwise) {
    const char *value = getenv(name);
    return value ? strtol(value, NULL, 0) : otherwise;
}

__attribute__((constructor)) static void init(void) {
    real_lock = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_lock");
    reader_new_return = (uintptr_t)from_env("SHIM_READER_NEW_RETURN", 0);
    schedule_start = (uintptr_t)from_env("SHIM_SCHEDULE_TIMER_START", 0);
    schedule_end = schedule_start + (uintptr_t)from_env("SHIM_SCHEDULE_TIMER_SIZE", 0);
    lookup_ms = from_env("SHIM_LOOKUP_MS", lookup_ms);
    window_ms = from_env("SHIM_WINDOW_MS", window_ms);
    mark_ms = from_env("SHIM_MARK_MS", mark_ms);
}

void walsvc_shim_set_base(uintptr_t address) { base = address; }
long walsvc_shim_marks(void) { return __atomic_load_n(&marks, __ATOMIC_RELAXED); }
long walsvc_shim_delays(void) { return __atomic_load_n(&delays, __ATOMIC_RELAXED); }

int pthread_mutex_lock(pthread_mutex_t *mutex) {
    if (base && marked_until > 0) {
        uintptr_t from = (uintptr_t)__builtin_return_address(0) - base;
        if (from >= schedule_start && from < schedule_end && marked_until > now()) {
            __atomic_add_fetch(&delays, 1, __ATOMIC_RELAXED);
            sleep_ms(window_ms);
        }
    }
    if (!real_lock)
        real_lock = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_lock");
    return real_lock(mutex);
}

void *_Znwm(size_t size) {
    if (base && (uintptr_t)__builtin_return_address(0) - base == reader_new_return) {
        __atomic_add_fetch(&marks, 1, __ATOMIC_RELAXED);
        sleep_ms(lookup_ms);
        marked_until = now() + (double)mark_ms / 1000.0;
    }
    if (!real_new) /* libstdc++ is loaded with the extension, out of RTLD_NEXT's reach */
        real_new = (void *(*)(size_t))dlsym(
            dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD), "_Znwm");
    return real_new(size);
}
