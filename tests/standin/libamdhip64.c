/* A stand-in for libamdhip64.so (the HIP runtime), built by the tests like libcuda.c: it
 * records the calls, checks PORTABLE, that every page is present at registration, that
 * unregister precedes unmap, and that the caller's current device is set back.
 * STANDIN_INIT_ERROR=<code>: hipInit returns it. */
#include "standin.h"

static __thread int current_device;
static uintptr_t reg_base[4096];
static size_t reg_size[4096];
static int reg_count;

int standin_registered(void) { return reg_count; }

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
int hipDeviceGetByPCIBusId(int *dev, const char *bus) { note("hipDeviceGetByPCIBusId %s", bus); *dev = 3; return 0; }
int hipHostRegister(void *p, size_t size, unsigned flags) {
    uintptr_t a = (uintptr_t)p;
    note("hipHostRegister %#lx %zu %u on device %d", (unsigned long)a, size, flags, current_device);
    if (!(flags & 1)) { note("ERROR flags without PORTABLE"); return 1; }
    if (all_present(a, size) != 1) { note("ERROR pages not present at registration"); return 1; }
    if (reg_count >= 4096) return 2;
    reg_base[reg_count] = a;
    reg_size[reg_count] = size;
    reg_count++;
    return 0;
}
int hipHostUnregister(void *p) {
    uintptr_t a = (uintptr_t)p;
    note("hipHostUnregister %#lx", (unsigned long)a);
    for (int i = 0; i < reg_count; i++) {
        if (reg_base[i] == a) {
            if (all_present(a, reg_size[i]) < 0) note("ERROR unmapped before unregister");
            reg_base[i] = reg_base[reg_count - 1];
            reg_size[i] = reg_size[reg_count - 1];
            reg_count--;
            return 0;
        }
    }
    return 1;
}
