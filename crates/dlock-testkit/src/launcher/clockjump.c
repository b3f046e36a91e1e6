/*
 * clockjump: an LD_PRELOAD shim that moves a process's wall clock.
 *
 * Debian's libfaketime hangs redis-server at start-up (it clashes with
 * jemalloc, libfaketime issue #130), so the launcher builds this instead.
 * The offset, in nanoseconds, is a little-endian int64 at the start of the
 * file named by DLOCK_CLOCK_FILE, mapped shared: writing the file moves the
 * clock at once. Only the wall clock (CLOCK_REALTIME, gettimeofday, time)
 * moves; monotonic clocks do not, as on a host whose clock is stepped.
 * No allocation and no dlsym: the real clock is read by system call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns;
static int state; /* 0: not mapped yet, 1: mapped, 2: no file */

static int64_t offset(void) {
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        const char *path = getenv("DLOCK_CLOCK_FILE");
        int fd = path ? (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC) : -1;
        void *p = MAP_FAILED;
        if (fd >= 0) {
            p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
            syscall(SYS_close, fd);
        }
        if (p != MAP_FAILED) {
            offset_ns = (volatile int64_t *)p;
            s = 1;
        } else {
            s = 2;
        }
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1 ? *offset_ns : 0;
}

static int real_clock_gettime(clockid_t id, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, id, ts);
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = real_clock_gettime(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = real_clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0) {
        shift(&ts);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    real_clock_gettime(CLOCK_REALTIME, &ts);
    shift(&ts);
    if (t) {
        *t = ts.tv_sec;
    }
    return ts.tv_sec;
}
