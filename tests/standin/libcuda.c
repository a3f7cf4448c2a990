/* A stand-in for libcuda.so.1 (the CUDA driver API), built by the tests from this source
 * with the system compiler and loaded under the real soname from a private directory.
 * It implements the calls numabind makes to register host memory and to time copies,
 * records their order and arguments, and checks what the real driver needs or what
 * numabind promises:
 *   - a context is current on the calling thread at registration, allocation and copy
 *     (else CUDA_ERROR_INVALID_CONTEXT), and the caller's context stack is balanced after;
 *   - the flags include CU_MEMHOSTREGISTER_PORTABLE;
 *   - every page of each chunk is present (mincore) when it is registered;
 *   - unregister precedes unmap (the range is still mapped when unregistered);
 *   - a range is never registered twice;
 *   - a copy is between registered host memory and memory of the current context's
 *     device, on a live stream of that device (the bench times DMA from the buffer it
 *     placed, not a staged copy).
 * Device memory is host memory here and a copy is a memcpy; devices found by PCI address
 * are numbered in the order asked.  Behaviour for failure paths, from the environment:
 * STANDIN_INIT_ERROR=<code> (cuInit returns it), STANDIN_FAIL_AT=<n> (the n-th
 * cuMemHostRegister_v2 returns CUDA_ERROR_OUT_OF_MEMORY), STANDIN_ALLOC_ERROR=<code>
 * (cuMemAlloc_v2 returns it).  standin_log() returns the record, one call per line. */
#include "standin.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef uint64_t CUdeviceptr;
typedef void *CUstream;

#define CTX_BASE 0x1000
static int register_calls;
static int retained[64];
static __thread uintptr_t ctx_stack[32];
static __thread int ctx_depth;
static int initialized;

int standin_ctx_depth(void) { return ctx_depth; }
int standin_retained(int dev) { return dev >= 0 && dev < 64 ? retained[dev] : -1; }
static int standin_retained_total(void) {
    int n = 0;
    for (int i = 0; i < 64; i++) n += retained[i];
    return n;
}

/* the device of the calling thread's current context; -1 for none, -2 for a context that
 * is not a device's primary context (the caller's own) */
static int current_device(void) {
    if (ctx_depth <= 0) return -1;
    uintptr_t c = ctx_stack[ctx_depth - 1];
    return c >= CTX_BASE && c < CTX_BASE + 64 ? (int)(c - CTX_BASE) : -2;
}

CUresult cuInit(unsigned flags) {
    const char *e = getenv("STANDIN_INIT_ERROR");
    note("cuInit %u", flags);
    if (e) return atoi(e);
    initialized = 1;
    return 0;
}

CUresult cuGetErrorName(CUresult code, const char **out) {
    switch (code) {
    case 0: *out = "CUDA_SUCCESS"; return 0;
    case 1: *out = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *out = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 3: *out = "CUDA_ERROR_NOT_INITIALIZED"; return 0;
    case 100: *out = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 201: *out = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 400: *out = "CUDA_ERROR_INVALID_HANDLE"; return 0;
    case 712: *out = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; return 0;
    case 713: *out = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"; return 0;
    default: *out = 0; return 1;
    }
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    note("cuDeviceGet %d", ordinal);
    if (!initialized) return 3;
    *dev = ordinal;
    return 0;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus) {
    note("cuDeviceGetByPCIBusId %s", bus);
    if (!initialized) return 3;
    *dev = device_of_bus(bus);
    return *dev < 0 ? 1 : 0;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    note("cuDevicePrimaryCtxRetain %d", dev);
    if (dev < 0 || dev >= 64) return 1;
    pthread_mutex_lock(&mu);
    retained[dev]++;
    pthread_mutex_unlock(&mu);
    *ctx = (CUcontext)(uintptr_t)(CTX_BASE + dev);
    return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    note("cuDevicePrimaryCtxRelease_v2 %d", dev);
    int rc = 0;
    pthread_mutex_lock(&mu);
    if (dev < 0 || dev >= 64 || retained[dev] <= 0) rc = 201;
    else retained[dev]--;
    pthread_mutex_unlock(&mu);
    return rc;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    note("cuCtxPushCurrent_v2 %p", ctx);
    if (ctx_depth >= 32) return 1;
    ctx_stack[ctx_depth++] = (uintptr_t)ctx;
    return 0;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    note("cuCtxPopCurrent_v2");
    if (ctx_depth <= 0) return 201;
    ctx_depth--;
    if (ctx) *ctx = (CUcontext)ctx_stack[ctx_depth];
    return 0;
}

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&mu);
    int call = ++register_calls;
    pthread_mutex_unlock(&mu);
    note("cuMemHostRegister_v2 %#lx %zu %u", (unsigned long)a, size, flags);
    if (ctx_depth <= 0) { note("ERROR no current context"); return 201; }
    if (!(flags & 1)) { note("ERROR flags without PORTABLE"); return 1; }
    int present = all_present(a, size);
    if (present != 1) { note("ERROR pages not present at registration"); return 1; }
    const char *fail = getenv("STANDIN_FAIL_AT");
    if (fail && atoi(fail) == call) { note("FAIL as asked"); return 2; }
    return reg_add(a, size, 712, 2);
}

CUresult cuMemHostUnregister(void *p) {
    note("cuMemHostUnregister %#lx", (unsigned long)(uintptr_t)p);
    return reg_remove((uintptr_t)p) == 0 ? 0 : 713;
}

CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t size) {
    int dev = current_device();
    note("cuMemAlloc_v2 %zu on device %d", size, dev);
    if (dev < 0) { note("ERROR cuMemAlloc_v2 without a device's context current"); return 201; }
    const char *e = getenv("STANDIN_ALLOC_ERROR");
    if (e) return atoi(e);
    return dev_alloc(d, size, dev);
}

CUresult cuMemFree_v2(CUdeviceptr d) {
    note("cuMemFree_v2");
    return dev_free(d, current_device()) == 0 ? 0 : 1;
}

CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    int dev = current_device();
    note("cuStreamCreate %u on device %d", flags, dev);
    if (dev < 0) { note("ERROR cuStreamCreate without a device's context current"); return 201; }
    *s = stream_new(dev);
    return *s ? 0 : 2;
}

CUresult cuStreamDestroy_v2(CUstream s) {
    note("cuStreamDestroy_v2");
    return stream_destroy(s) == 0 ? 0 : 400;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *host, size_t n, CUstream s) {
    return copy("h2d", d, (uintptr_t)host, n, s, current_device()) ? 1 : 0;
}

CUresult cuMemcpyDtoHAsync_v2(void *host, CUdeviceptr d, size_t n, CUstream s) {
    return copy("d2h", d, (uintptr_t)host, n, s, current_device()) ? 1 : 0;
}

CUresult cuStreamSynchronize(CUstream s) { return stream_device(s) < 0 ? 400 : 0; }
