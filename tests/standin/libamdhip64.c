/* A stand-in for libamdhip64.so (the HIP runtime), built by the tests like libcuda.c: it
 * records the calls, checks PORTABLE, that every page is present at registration, that
 * unregister precedes unmap, that the caller's current device is set back, and that a
 * copy is between registered host memory and the current device's memory on its stream.
 * STANDIN_INIT_ERROR=<code>: hipInit returns it. */
#include "standin.h"

static __thread int current_device;

static int standin_retained_total(void) { return 0; } /* HIP has no contexts to retain */

int hipInit(unsigned flags) {
    const char *e = getenv("STANDIN_INIT_ERROR");
    note("hipInit %u", flags);
    return e ? atoi(e) : 0;
}
const char *hipGetErrorName(int code) {
    switch (code) {
    case 0: return "hipSuccess";
    case 1: return "hipErrorInvalidValue";
    case 2: return "hipErrorOutOfMemory";
    case 100: return "hipErrorNoDevice";
    default: return "hipErrorUnknown";
    }
}
int hipGetDevice(int *dev) { *dev = current_device; note("hipGetDevice -> %d", current_device); return 0; }
int hipSetDevice(int dev) { note("hipSetDevice %d", dev); current_device = dev; return 0; }
int hipDeviceGetByPCIBusId(int *dev, const char *bus) {
    note("hipDeviceGetByPCIBusId %s", bus);
    *dev = device_of_bus(bus);
    return *dev < 0 ? 1 : 0;
}
int hipHostRegister(void *p, size_t size, unsigned flags) {
    uintptr_t a = (uintptr_t)p;
    note("hipHostRegister %#lx %zu %u on device %d", (unsigned long)a, size, flags, current_device);
    if (!(flags & 1)) { note("ERROR flags without PORTABLE"); return 1; }
    if (all_present(a, size) != 1) { note("ERROR pages not present at registration"); return 1; }
    return reg_add(a, size, 1, 2);
}
int hipHostUnregister(void *p) {
    note("hipHostUnregister %#lx", (unsigned long)(uintptr_t)p);
    return reg_remove((uintptr_t)p) == 0 ? 0 : 1;
}
int hipMalloc(uint64_t *d, size_t size) {
    note("hipMalloc %zu on device %d", size, current_device);
    return dev_alloc(d, size, current_device);
}
int hipFree(uint64_t d) { note("hipFree"); return dev_free(d, current_device) == 0 ? 0 : 1; }
int hipStreamCreateWithFlags(void **s, unsigned flags) {
    note("hipStreamCreateWithFlags %u on device %d", flags, current_device);
    *s = stream_new(current_device);
    return *s ? 0 : 2;
}
int hipStreamDestroy(void *s) { note("hipStreamDestroy"); return stream_destroy(s) == 0 ? 0 : 1; }
int hipMemcpyHtoDAsync(uint64_t d, void *host, size_t n, void *s) {
    return copy("h2d", d, (uintptr_t)host, n, s, current_device) ? 1 : 0;
}
int hipMemcpyDtoHAsync(void *host, uint64_t d, size_t n, void *s) {
    return copy("d2h", d, (uintptr_t)host, n, s, current_device) ? 1 : 0;
}
int hipStreamSynchronize(void *s) { return stream_device(s) < 0 ? 1 : 0; }
