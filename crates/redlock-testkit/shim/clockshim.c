/*
 * clockshim: an LD_PRELOAD library that makes one process's wall clock jump or run at another
 * rate, controlled at run time through a small text file.
 *
 * Redlock assumes every server's clock runs at (nearly) the same rate (see the drift budget).
 * Redis 7 expires keys by the wall clock (ustime/mstime -> gettimeofday), so shifting that clock
 * is how the test harness breaks the assumption on purpose.
 *
 * Why not libfaketime: it resolves the real functions with dlsym(), which allocates; Debian's
 * redis-server is linked with jemalloc, whose initialisation reads the clock, which re-enters
 * the shim before dlsym() returns and deadlocks at start-up. This shim therefore:
 *   - reads the real clocks with raw syscall(SYS_clock_gettime, ...), never through libc's
 *     clock functions and never through dlsym();
 *   - never allocates, takes no blocking locks and uses no stdio;
 *   - shares its state between threads through __atomic builtins only.
 *
 * Overridden: gettimeofday, time, and clock_gettime for CLOCK_REALTIME and
 * CLOCK_REALTIME_COARSE. Every other clock passes through to the kernel unchanged, so
 * CLOCK_MONOTONIC (Redis' own monotonic clock, timers, jemalloc) is never faked.
 *
 * Control: the environment variable REDLOCK_CLOCK_FILE names a file holding
 *     OFFSET_NS RATE [ANCHOR_NS]
 * (integers in nanoseconds, RATE a decimal number > 0). The fake time is
 *     real + OFFSET + (real - ANCHOR) * (RATE - 1)
 * A missing ANCHOR_NS means "the real time when this content was first read". The file is
 * re-read at most every RELOAD_INTERVAL_NS of CLOCK_MONOTONIC time; while it is missing, empty
 * or unparsable the last good values stay in force. Without the variable, or before any good
 * read, the clock is the real one. Writers should replace the file atomically (rename).
 *
 * Build: cc -shared -fPIC -O2 -Wall -Wextra -Werror -o clockshim.so clockshim.c (glibc only).
 */
#define _GNU_SOURCE
/* glibc has changed gettimeofday's prototype over the years (struct timezone * vs void *);
 * hide its declaration and declare ours, so the shim compiles against any of them. */
#define gettimeofday redlock_clockshim_hidden_gettimeofday
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#undef gettimeofday

#define NS_PER_SEC 1000000000LL
/* How often the control file is re-read: cheap enough for Redis' hot path (one open/read/close
 * per 10 ms at most), quick enough that a test sees a change within a few ms. */
#define RELOAD_INTERVAL_NS 10000000LL
/* The control file is three numbers; anything longer is rejected as unparsable. */
#define CONTENT_MAX 256
#define PATH_MAX_LEN 4096

#define ENV_NAME "REDLOCK_CLOCK_FILE"

int gettimeofday(struct timeval *tv, void *tz);

/* One set of clock parameters. Two slots, so a reader never waits for a writer. */
struct params {
    int64_t offset_ns;
    uint64_t rate_bits; /* the double RATE, bit for bit */
    int64_t anchor_ns;
};

enum { INIT_NONE = 0, INIT_RUNNING = 1, INIT_ACTIVE = 2, INIT_DISABLED = 3 };

static int init_state;          /* INIT_* */
static char control_path[PATH_MAX_LEN];
static struct params slots[2];  /* slots[version & 1] is current */
static uint64_t version;        /* bumped once per publish */
static int reloading;           /* try-lock: only one thread re-reads the file */
static int64_t last_reload_ns;  /* CLOCK_MONOTONIC of the last re-read */
/* Touched only by the thread holding `reloading`. */
static char applied[CONTENT_MAX];
static long applied_len = -1;   /* -1: nothing applied yet */

static int raw_clock(clockid_t clock, struct timespec *ts)
{
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

static int64_t to_ns(const struct timespec *ts)
{
    return (int64_t)ts->tv_sec * NS_PER_SEC + (int64_t)ts->tv_nsec;
}

/* Splits ns into seconds and a non-negative nanosecond part (floor division). */
static void from_ns(int64_t ns, int64_t *sec, int64_t *nsec)
{
    int64_t s = ns / NS_PER_SEC;
    int64_t r = ns % NS_PER_SEC;
    if (r < 0) {
        r += NS_PER_SEC;
        s -= 1;
    }
    *sec = s;
    *nsec = r;
}

static double bits_to_double(uint64_t bits)
{
    double d;
    __builtin_memcpy(&d, &bits, sizeof d);
    return d;
}

static uint64_t double_to_bits(double d)
{
    uint64_t bits;
    __builtin_memcpy(&bits, &d, sizeof bits);
    return bits;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Parses an optionally signed decimal integer at *p; 0 on success. */
static int parse_i64(const char **p, const char *end, int64_t *out)
{
    const char *s = *p;
    int neg = 0;
    uint64_t v = 0;
    uint64_t limit;
    if (s < end && (*s == '+' || *s == '-')) {
        neg = *s == '-';
        s++;
    }
    if (s >= end || !is_digit(*s))
        return -1;
    limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (s < end && is_digit(*s)) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (limit - d) / 10)
            return -1;
        v = v * 10 + d;
        s++;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    *p = s;
    return 0;
}

static double pow10_of(int e)
{
    double result = 1.0, base = 10.0;
    while (e > 0) {
        if (e & 1)
            result *= base;
        base *= base;
        e >>= 1;
    }
    return result;
}

/* Parses a decimal number ("4", "0.25", "1.5e3") at *p; 0 on success. Exact enough for rates:
 * up to 19 significant digits, a scaling error of a few ulp at most. */
static int parse_double(const char **p, const char *end, double *out)
{
    const char *s = *p;
    uint64_t mant = 0;
    int digits = 0, seen = 0, exp10 = 0;
    double v;
    if (s < end && *s == '+')
        s++;
    while (s < end && is_digit(*s)) {
        seen = 1;
        if (mant == 0 && *s == '0') {
            /* leading zero: no significance */
        } else if (digits < 19) {
            mant = mant * 10 + (uint64_t)(*s - '0');
            digits++;
        } else {
            exp10++;
        }
        s++;
    }
    if (s < end && *s == '.') {
        s++;
        while (s < end && is_digit(*s)) {
            seen = 1;
            if (mant == 0 && *s == '0') {
                exp10--;
            } else if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*s - '0');
                digits++;
                exp10--;
            }
            s++;
        }
    }
    if (!seen)
        return -1;
    if (s < end && (*s == 'e' || *s == 'E')) {
        int64_t e;
        s++;
        if (parse_i64(&s, end, &e) != 0 || e > 1000 || e < -1000)
            return -1;
        exp10 += (int)e;
    }
    v = (double)mant;
    if (exp10 > 400)
        v = v == 0.0 ? 0.0 : __builtin_inf();
    else if (exp10 < -400)
        v = 0.0;
    else if (exp10 >= 0)
        v *= pow10_of(exp10);
    else
        v /= pow10_of(-exp10);
    *out = v;
    *p = s;
    return 0;
}

static void skip_space(const char **p, const char *end)
{
    while (*p < end && is_space(**p))
        (*p)++;
}

/* "OFFSET_NS RATE [ANCHOR_NS]"; 0 on success, *has_anchor set when the third number is there. */
static int parse_content(const char *buf, long len, struct params *out, int *has_anchor)
{
    const char *p = buf, *end = buf + len;
    int64_t offset, anchor = 0;
    double rate;
    skip_space(&p, end);
    if (parse_i64(&p, end, &offset) != 0 || p >= end || !is_space(*p))
        return -1;
    skip_space(&p, end);
    if (parse_double(&p, end, &rate) != 0)
        return -1;
    if (!(rate > 0.0) || rate == __builtin_inf()) /* also rejects NaN */
        return -1;
    *has_anchor = 0;
    if (p < end && !is_space(*p))
        return -1;
    skip_space(&p, end);
    if (p < end) {
        if (parse_i64(&p, end, &anchor) != 0)
            return -1;
        *has_anchor = 1;
        skip_space(&p, end);
        if (p < end)
            return -1;
    }
    out->offset_ns = offset;
    out->rate_bits = double_to_bits(rate);
    out->anchor_ns = anchor;
    return 0;
}

static void publish(const struct params *next)
{
    uint64_t v = __atomic_load_n(&version, __ATOMIC_RELAXED);
    struct params *slot = &slots[(v + 1) & 1];
    __atomic_store_n(&slot->offset_ns, next->offset_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->rate_bits, next->rate_bits, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->anchor_ns, next->anchor_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&version, v + 1, __ATOMIC_RELEASE);
}

static void load_params(struct params *out)
{
    /* A reader is consistent unless the writer reused its slot meanwhile (two publishes, i.e.
     * at least one reload interval, during one read). The retry bound only matters if the
     * writer was interrupted by a signal whose handler reads the clock: never spin forever. */
    int attempt;
    for (attempt = 0; attempt < 16; attempt++) {
        uint64_t v1 = __atomic_load_n(&version, __ATOMIC_ACQUIRE);
        const struct params *slot = &slots[v1 & 1];
        uint64_t v2;
        out->offset_ns = __atomic_load_n(&slot->offset_ns, __ATOMIC_RELAXED);
        out->rate_bits = __atomic_load_n(&slot->rate_bits, __ATOMIC_RELAXED);
        out->anchor_ns = __atomic_load_n(&slot->anchor_ns, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        v2 = __atomic_load_n(&version, __ATOMIC_RELAXED);
        if (v2 - v1 <= 1)
            return;
    }
}

/* Reads the control file into buf; the number of bytes, or -1 if missing, unreadable or too
 * long to be valid. */
static long read_control(char *buf)
{
    long fd = syscall(SYS_openat, AT_FDCWD, control_path, O_RDONLY | O_CLOEXEC);
    long total = 0;
    if (fd < 0)
        return -1;
    while (total < CONTENT_MAX) {
        long n = syscall(SYS_read, fd, buf + total, (long)CONTENT_MAX - total);
        if (n < 0) {
            total = -1;
            break;
        }
        if (n == 0)
            break;
        total += n;
    }
    syscall(SYS_close, fd);
    return total >= CONTENT_MAX ? -1 : total;
}

static int same_as_applied(const char *buf, long len)
{
    long i;
    if (len != applied_len)
        return 0;
    for (i = 0; i < len; i++)
        if (buf[i] != applied[i])
            return 0;
    return 1;
}

/* Re-reads the control file if the reload interval has passed and no other thread is at it. */
static void maybe_reload(int force)
{
    struct timespec mono;
    int64_t now, last;
    char buf[CONTENT_MAX];
    long len;
    struct params next;
    int has_anchor;

    if (raw_clock(CLOCK_MONOTONIC, &mono) != 0)
        return;
    now = to_ns(&mono);
    last = __atomic_load_n(&last_reload_ns, __ATOMIC_RELAXED);
    if (!force && now - last < RELOAD_INTERVAL_NS)
        return;
    if (__atomic_exchange_n(&reloading, 1, __ATOMIC_ACQUIRE) != 0)
        return;
    __atomic_store_n(&last_reload_ns, now, __ATOMIC_RELAXED);

    len = read_control(buf);
    if (len > 0 && !same_as_applied(buf, len) && parse_content(buf, len, &next, &has_anchor) == 0) {
        if (!has_anchor) {
            struct timespec real;
            next.anchor_ns = raw_clock(CLOCK_REALTIME, &real) == 0 ? to_ns(&real) : 0;
        }
        publish(&next);
        __builtin_memcpy(applied, buf, (size_t)len);
        applied_len = len;
    }
    __atomic_store_n(&reloading, 0, __ATOMIC_RELEASE);
}

/* Captures the control path once. The copy matters: Redis' setproctitle() moves and overwrites
 * the original environment strings early in main(). */
static void init_once(void)
{
    int expected = INIT_NONE;
    const char *path;
    size_t i;
    if (!__atomic_compare_exchange_n(&init_state, &expected, INIT_RUNNING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    path = getenv(ENV_NAME);
    for (i = 0; path != NULL && path[i] != '\0' && i < PATH_MAX_LEN - 1; i++)
        control_path[i] = path[i];
    if (path == NULL || i == 0 || path[i] != '\0') {
        __atomic_store_n(&init_state, INIT_DISABLED, __ATOMIC_RELEASE);
        return;
    }
    control_path[i] = '\0';
    {
        struct params real_time = {0, double_to_bits(1.0), 0};
        publish(&real_time);
    }
    __atomic_store_n(&init_state, INIT_ACTIVE, __ATOMIC_RELEASE);
    maybe_reload(1);
}

__attribute__((constructor)) static void clockshim_constructor(void)
{
    init_once();
}

/* Maps a real wall-clock time to the fake one. */
static int64_t fake_ns(int64_t real)
{
    struct params p;
    int64_t out, skew;
    double rate;
    int state = __atomic_load_n(&init_state, __ATOMIC_ACQUIRE);
    if (state == INIT_NONE) {
        init_once();
        state = __atomic_load_n(&init_state, __ATOMIC_ACQUIRE);
    }
    if (state != INIT_ACTIVE)
        return real; /* disabled, or another thread is initialising right now */
    maybe_reload(0);
    load_params(&p);
    rate = bits_to_double(p.rate_bits);
    skew = p.offset_ns;
    if (rate != 1.0) {
        /* Integers for the absolute times, a double only for the scaled elapsed part. */
        double scaled = (double)(real - p.anchor_ns) * (rate - 1.0);
        int64_t drift;
        if (scaled > 9.0e18)
            drift = INT64_MAX;
        else if (scaled < -9.0e18)
            drift = INT64_MIN;
        else
            /* Rounded by hand: llround() lives in libm, which the shim must not need. */
            drift = scaled >= 0.0 ? (int64_t)(scaled + 0.5) : -(int64_t)(0.5 - scaled);
        if (__builtin_add_overflow(skew, drift, &skew))
            skew = drift > 0 ? INT64_MAX : INT64_MIN;
    }
    if (__builtin_add_overflow(real, skew, &out))
        out = skew > 0 ? INT64_MAX : INT64_MIN;
    return out;
}

static int fake_clock(clockid_t clock, struct timespec *ts)
{
    struct timespec real;
    int64_t sec, nsec;
    if (raw_clock(clock, &real) != 0)
        return -1;
    from_ns(fake_ns(to_ns(&real)), &sec, &nsec);
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)nsec;
    return 0;
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    if (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)
        return fake_clock(clock, ts);
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

int gettimeofday(struct timeval *tv, void *tz)
{
    if (tz != NULL) {
        /* Obsolete; glibc reports UTC with no DST, and so do we. */
        int *fields = (int *)tz;
        fields[0] = 0;
        fields[1] = 0;
    }
    if (tv != NULL) {
        struct timespec ts;
        if (fake_clock(CLOCK_REALTIME, &ts) != 0)
            return -1;
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = (suseconds_t)(ts.tv_nsec / 1000);
    }
    return 0;
}

time_t time(time_t *tloc)
{
    struct timespec ts;
    time_t now = (time_t)-1;
    if (fake_clock(CLOCK_REALTIME, &ts) == 0)
        now = ts.tv_sec;
    if (tloc != NULL)
        *tloc = now;
    return now;
}
