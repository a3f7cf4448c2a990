/* What both stand-in driver libraries share: the call record, the page checks, the table
 * of registered ranges, device memory, streams and the copy checks.  Thread-safe: numabind
 * bench copies to every device at once from one thread per device.
 *
 * STANDIN_EXIT=<path>: at exit, one line with what is still held (registrations, device
 * allocations, streams, retained contexts), the copies made and the errors seen, so a test
 * can check a whole command (numabind bench) left nothing behind.  STANDIN_COPY_US=<us>:
 * each copy takes at least that long, so that copies issued together are seen overlapping
 * (the exit line's max_in_flight). */
#ifndef STANDIN_H
#define STANDIN_H
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_len;
static int errors;
static long copies, copied_bytes;
static int in_flight, max_in_flight; /* copies under way at once (numabind bench's threads) */

static void vnote(const char *fmt, va_list ap) {
    pthread_mutex_lock(&mu);
    if (log_len < sizeof(log_buf) - 256) {
        log_len += (size_t)vsnprintf(log_buf + log_len, sizeof(log_buf) - log_len - 2, fmt, ap);
        log_buf[log_len++] = '\n';
        log_buf[log_len] = 0;
    }
    if (strncmp(fmt, "ERROR", 5) == 0) errors++;
    pthread_mutex_unlock(&mu);
}

static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vnote(fmt, ap);
    va_end(ap);
}

const char *standin_log(void) { return log_buf; }
int standin_errors(void) { return errors; }
long standin_copies(void) { return copies; }

/* 1: every page of the range is present; 0: some are not; -1: part is not mapped */
static int all_present(uintptr_t p, size_t size) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t first = p / (uintptr_t)page * (uintptr_t)page;
    size_t pages = (p + size - first + (size_t)page - 1) / (size_t)page;
    unsigned char vec[4096];
    for (size_t done = 0; done < pages; done += sizeof(vec)) {
        size_t n = pages - done < sizeof(vec) ? pages - done : sizeof(vec);
        if (mincore((void *)(first + done * (size_t)page), n * (size_t)page, vec) != 0) return -1;
        for (size_t i = 0; i < n; i++)
            if (!(vec[i] & 1)) return 0;
    }
    return 1;
}

/* --- registered host ranges */
#define MAX_REG 4096
static uintptr_t reg_base[MAX_REG];
static size_t reg_size[MAX_REG];
static int reg_count;

int standin_registered(void) { return reg_count; }

/* 0, ALREADY (the range overlaps a registered one) or FULL */
static int reg_add(uintptr_t a, size_t size, int already, int full) {
    int rc = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < reg_count && !rc; i++)
        if (a < reg_base[i] + reg_size[i] && reg_base[i] < a + size) rc = already;
    if (!rc && reg_count >= MAX_REG) rc = full;
    if (!rc) {
        reg_base[reg_count] = a;
        reg_size[reg_count] = size;
        reg_count++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* 0, or -1 when no registration starts at a; notes an unmap before the unregister */
static int reg_remove(uintptr_t a) {
    int rc = -1;
    size_t size = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < reg_count; i++) {
        if (reg_base[i] == a) {
            size = reg_size[i];
            reg_base[i] = reg_base[reg_count - 1];
            reg_size[i] = reg_size[reg_count - 1];
            reg_count--;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    if (rc == 0 && all_present(a, size) < 0) note("ERROR unmapped before unregister");
    return rc;
}

/* whether [a, a + n) lies in registered ranges (chunks registered back to back count) */
static int reg_covers(uintptr_t a, size_t n) {
    pthread_mutex_lock(&mu);
    uintptr_t at = a, end = a + n;
    int progress = 1;
    while (at < end && progress) {
        progress = 0;
        for (int i = 0; i < reg_count; i++) {
            if (reg_base[i] <= at && at < reg_base[i] + reg_size[i]) {
                at = reg_base[i] + reg_size[i];
                progress = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&mu);
    return at >= end;
}

/* --- device memory (host memory standing in) and streams, each owned by a device */
#define MAX_DEV 256
static char *dev_ptr[MAX_DEV];
static size_t dev_size[MAX_DEV];
static int dev_owner[MAX_DEV];
static int dev_count;
static int stream_owner[MAX_DEV]; /* -1: free slot; a stream is (void *)(slot + 1) */
static int streams_live;

int standin_allocations(void) { return dev_count; }
int standin_streams(void) { return streams_live; }

static int dev_alloc(uint64_t *out, size_t size, int device) {
    char *p = size ? malloc(size) : NULL;
    if (!p) return 2;
    pthread_mutex_lock(&mu);
    int full = dev_count >= MAX_DEV;
    if (!full) {
        dev_ptr[dev_count] = p;
        dev_size[dev_count] = size;
        dev_owner[dev_count] = device;
        dev_count++;
    }
    pthread_mutex_unlock(&mu);
    if (full) { free(p); return 2; }
    *out = (uint64_t)(uintptr_t)p;
    return 0;
}

static int dev_free(uint64_t d, int device) {
    char *p = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < dev_count; i++) {
        if ((uint64_t)(uintptr_t)dev_ptr[i] == d) {
            if (dev_owner[i] != device) note("ERROR freed with device %d current, not %d", device, dev_owner[i]);
            p = dev_ptr[i];
            dev_ptr[i] = dev_ptr[dev_count - 1];
            dev_size[i] = dev_size[dev_count - 1];
            dev_owner[i] = dev_owner[dev_count - 1];
            dev_count--;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    if (!p) return 1;
    free(p);
    return 0;
}

static void *stream_new(int device) {
    static int ready;
    void *s = NULL;
    pthread_mutex_lock(&mu);
    if (!ready) {
        for (int i = 0; i < MAX_DEV; i++) stream_owner[i] = -1;
        ready = 1;
    }
    for (int i = 0; i < MAX_DEV && !s; i++) {
        if (stream_owner[i] < 0) {
            stream_owner[i] = device;
            streams_live++;
            s = (void *)(uintptr_t)(i + 1);
        }
    }
    pthread_mutex_unlock(&mu);
    return s;
}

/* the stream's device, or -1 when it is not a live stream */
static int stream_device(void *s) {
    uintptr_t i = (uintptr_t)s;
    if (i < 1 || i > MAX_DEV) return -1;
    pthread_mutex_lock(&mu);
    int owner = stream_owner[i - 1];
    pthread_mutex_unlock(&mu);
    return owner;
}

static int stream_destroy(void *s) {
    if (stream_device(s) < 0) return 1;
    pthread_mutex_lock(&mu);
    stream_owner[(uintptr_t)s - 1] = -1;
    streams_live--;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* One copy between registered host memory and device memory on a stream, with the device
 * that is current on the calling thread: every check is a line in the record. */
static int copy(const char *what, uint64_t d, uintptr_t host, size_t n, void *s, int current) {
    int owner = stream_device(s);
    if (owner < 0) { note("ERROR %s on a stream that is not live", what); return 1; }
    if (owner != current) note("ERROR %s with device %d current on device %d's stream", what, current, owner);
    char *dp = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < dev_count; i++) {
        uint64_t b = (uint64_t)(uintptr_t)dev_ptr[i];
        if (b <= d && d + n <= b + dev_size[i] && dev_owner[i] == owner) dp = (char *)(uintptr_t)d;
    }
    pthread_mutex_unlock(&mu);
    if (!dp) { note("ERROR %s outside device memory of device %d", what, owner); return 1; }
    if (!reg_covers(host, n)) { note("ERROR %s with host memory that is not registered", what); return 1; }
    pthread_mutex_lock(&mu);
    if (++in_flight > max_in_flight) max_in_flight = in_flight;
    pthread_mutex_unlock(&mu);
    if (what[0] == 'h') memcpy(dp, (void *)host, n);
    else memcpy((void *)host, dp, n);
    const char *us = getenv("STANDIN_COPY_US");
    if (us) usleep((useconds_t)atoi(us));
    pthread_mutex_lock(&mu);
    in_flight--;
    copies++;
    copied_bytes += (long)n;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* --- devices named by PCI address: numbered in the order first asked */
static char bus_seen[64][32];
static int buses;

static int device_of_bus(const char *bus) {
    int found = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < buses && found < 0; i++)
        if (strncmp(bus_seen[i], bus, sizeof(bus_seen[i]) - 1) == 0) found = i;
    if (found < 0 && buses < 64) {
        strncpy(bus_seen[buses], bus, sizeof(bus_seen[buses]) - 1);
        found = buses++;
    }
    pthread_mutex_unlock(&mu);
    return found;
}

static int standin_retained_total(void);

__attribute__((destructor)) static void exit_report(void) {
    const char *path = getenv("STANDIN_EXIT");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return;
    fprintf(f,
            "registered=%d allocations=%d streams=%d retained=%d copies=%ld bytes=%ld "
            "max_in_flight=%d errors=%d\n",
            reg_count, dev_count, streams_live, standin_retained_total(), copies, copied_bytes,
            max_in_flight, errors);
    fputs(log_buf, f);
    fclose(f);
}
#endif
