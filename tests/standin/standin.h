/* What both stand-in driver libraries share: the call record and the page checks. */
#ifndef STANDIN_H
#define STANDIN_H
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static char log_buf[1 << 16];
static size_t log_len;

static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (log_len < sizeof(log_buf) - 256) {
        log_len += (size_t)vsnprintf(log_buf + log_len, sizeof(log_buf) - log_len, fmt, ap);
        log_buf[log_len++] = '\n';
        log_buf[log_len] = 0;
    }
    va_end(ap);
}

const char *standin_log(void) { return log_buf; }

/* 1: every page of the range is present; 0: some are not; -1: part is not mapped */
static int all_present(uintptr_t p, size_t size) {
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = (size + (size_t)page - 1) / (size_t)page;
    unsigned char vec[4096];
    for (size_t done = 0; done < pages; done += sizeof(vec)) {
        size_t n = pages - done < sizeof(vec) ? pages - done : sizeof(vec);
        if (mincore((void *)(p + done * (size_t)page), n * (size_t)page, vec) != 0) return -1;
        for (size_t i = 0; i < n; i++)
            if (!(vec[i] & 1)) return 0;
    }
    return 1;
}
#endif
