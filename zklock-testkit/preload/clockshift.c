/*
 * clockshift: a preload library of zklock's test kit that moves a server's wall clock.
 *
 * Started with LD_PRELOAD=clockshift.so and ZKLOCK_CLOCK_FILE=<file>, a process reads the
 * wall clock (CLOCK_REALTIME and its coarse form, gettimeofday, time) offset by the signed
 * number of milliseconds the file holds; its monotonic clocks are left alone. A test steps
 * the clock by rewriting the file; the process reads it again at most every millisecond.
 *
 * Everything goes through direct system calls, never through the C library's own clock
 * functions, so it never calls itself (libfaketime recurses in redis-server's start-up,
 * where jemalloc reads the clock before the preload is initialised).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static _Atomic long long offset_ns;
static _Atomic long long read_at_ns = -1;

static long long monotonic_ns(void) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The offset, from the file named by ZKLOCK_CLOCK_FILE, read again at most every ms. */
static long long offset(void) {
    long long now = monotonic_ns();
    long long last = atomic_load(&read_at_ns);
    if (last >= 0 && now - last < 1000000LL) {
        return atomic_load(&offset_ns);
    }
    atomic_store(&read_at_ns, now);
    const char *path = getenv("ZKLOCK_CLOCK_FILE");
    if (path == NULL) {
        return 0;
    }
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return atomic_load(&offset_ns);
    }
    char buf[64];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n > 0) {
        buf[n] = '\0';
        long long ms = 0;
        int sign = 1;
        const char *p = buf;
        if (*p == '-') {
            sign = -1;
            p++;
        } else if (*p == '+') {
            p++;
        }
        while (*p >= '0' && *p <= '9') {
            ms = ms * 10 + (*p - '0');
            p++;
        }
        atomic_store(&offset_ns, sign * ms * 1000000LL);
    }
    return atomic_load(&offset_ns);
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset();
    ts->tv_sec = (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
    if (ts->tv_nsec < 0) {
        ts->tv_sec -= 1;
        ts->tv_nsec += 1000000000L;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = (int)syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (r == 0 && tv != NULL) {
        shift(&ts);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    shift(&ts);
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
