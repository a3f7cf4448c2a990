/* A stand-in for libcuda.so.1 (the CUDA driver API), built by the tests from this source
 * with the system compiler and loaded under the real soname from a private directory.
 * It implements the calls numabind makes to register host memory, records their order and
 * arguments, and checks what the real driver needs or what numabind promises:
 *   - a context is current on the calling thread at registration (else
 *     CUDA_ERROR_INVALID_CONTEXT), and the caller's context stack is balanced afterwards;
 *   - the flags include CU_MEMHOSTREGISTER_PORTABLE;
 *   - every page of each chunk is present (mincore) when it is registered;
 *   - unregister precedes unmap (the range is still mapped when unregistered);
 *   - a range is never registered twice.
 * Behaviour for failure paths, from the environment: STANDIN_INIT_ERROR=<code> (cuInit
 * returns it), STANDIN_FAIL_AT=<n> (the n-th cuMemHostRegister_v2 returns
 * CUDA_ERROR_OUT_OF_MEMORY).  standin_log() returns the record, one call per line. */
#include "standin.h"
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;

#define MAX_REG 4096
static uintptr_t reg_base[MAX_REG];
static size_t reg_size[MAX_REG];
static int reg_count;
static int register_calls;
static int retained[64];
static __thread int ctx_depth;
static int initialized;

int standin_registered(void) { return reg_count; }
int standin_ctx_depth(void) { return ctx_depth; }
int standin_retained(int dev) { return dev >= 0 && dev < 64 ? retained[dev] : -1; }

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
    *dev = 5;
    return 0;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    note("cuDevicePrimaryCtxRetain %d", dev);
    if (dev < 0 || dev >= 64) return 1;
    retained[dev]++;
    *ctx = (CUcontext)(uintptr_t)(0x1000 + dev);
    return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    note("cuDevicePrimaryCtxRelease_v2 %d", dev);
    if (dev < 0 || dev >= 64 || retained[dev] <= 0) return 201;
    retained[dev]--;
    return 0;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    note("cuCtxPushCurrent_v2 %p", ctx);
    ctx_depth++;
    return 0;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    note("cuCtxPopCurrent_v2");
    if (ctx_depth <= 0) return 201;
    ctx_depth--;
    if (ctx) *ctx = 0;
    return 0;
}

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
    uintptr_t a = (uintptr_t)p;
    register_calls++;
    note("cuMemHostRegister_v2 %#lx %zu %u", (unsigned long)a, size, flags);
    if (ctx_depth <= 0) { note("ERROR no current context"); return 201; }
    if (!(flags & 1)) { note("ERROR flags without PORTABLE"); return 1; }
    int present = all_present(a, size);
    if (present != 1) { note("ERROR pages not present at registration"); return 1; }
    const char *fail = getenv("STANDIN_FAIL_AT");
    if (fail && atoi(fail) == register_calls) { note("FAIL as asked"); return 2; }
    for (int i = 0; i < reg_count; i++)
        if (a < reg_base[i] + reg_size[i] && reg_base[i] < a + size) return 712;
    if (reg_count >= MAX_REG) return 2;
    reg_base[reg_count] = a;
    reg_size[reg_count] = size;
    reg_count++;
    return 0;
}

CUresult cuMemHostUnregister(void *p) {
    uintptr_t a = (uintptr_t)p;
    note("cuMemHostUnregister %#lx", (unsigned long)a);
    for (int i = 0; i < reg_count; i++) {
        if (reg_base[i] == a) {
            if (all_present(a, reg_size[i]) < 0) note("ERROR unmapped before unregister");
            reg_base[i] = reg_base[reg_count - 1];
            reg_size[i] = reg_size[reg_count - 1];
            reg_count--;
            return 0;
        }
    }
    return 713;
}
