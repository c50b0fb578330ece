/* A stand-in for the CUDA driver (libcuda.so.1) for tests/test_share_view.py and
 * bench/share_view.py: no GPU needed.
 *
 * Devices come from STUB_CUDA_GPUS="<uuid>:<total MiB>[,...]" (UUIDs in NVML's form,
 * GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), read by cuInit. A device's free memory is its
 * total less what this process allocated through the stub on it and, to model other tenants,
 * less STUB_CUDA_USED_MIB (one value for every device) when set. Allocations past free fail
 * with CUDA_ERROR_OUT_OF_MEMORY, as on a full card. Calls before cuInit fail with
 * CUDA_ERROR_NOT_INITIALIZED; context-dependent calls without a current context fail with
 * CUDA_ERROR_INVALID_CONTEXT. cuGetProcAddress(_v2) resolves base names with the version rule
 * of the real driver ("cuMemGetInfo" at version >= 3020 is cuMemGetInfo_v2) and, with the flag
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, answers the per-thread-default-stream (_ptsz)
 * variants of the stream-ordered calls. No exported function calls another (the real driver's
 * do not go through the dynamic linker either: an interposer would count one call twice).
 * Pointers and handles are made-up numbers, never memory.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef struct StubContext *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct { char bytes[16]; } CUuuid;
typedef struct {
    int type;
    int id;
} CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
};
enum { CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 };
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
       CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2 };

#define MAX_GPUS 16
#define MIB (1024ULL * 1024ULL)

struct StubContext { CUdevice device; };

struct Gpu {
    unsigned char uuid[16];
    char uuid_text[48];
    unsigned long long total;
    unsigned long long allocated;
    struct StubContext context;
};

struct Allocation {
    unsigned long long address;
    int device;
    unsigned long long bytes;
};

static struct Gpu gpus[MAX_GPUS];
static int gpu_count;
static unsigned long long others_used;
static int initialised;
static __thread CUcontext current;
static struct Allocation *allocations;
static size_t allocation_count, allocation_capacity;
static unsigned long long next_address = 0x7f0000000000ULL;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "GPU-" then 32 hex digits in groups 8-4-4-4-12. */
static int parse_uuid(const char *text, size_t length, unsigned char out[16]) {
    static const int dashes[] = {8, 12, 16, 20};
    size_t digit = 0, dash = 0;
    if (length != 40 || strncmp(text, "GPU-", 4) != 0) return -1;
    for (size_t i = 4; i < length; i++) {
        if (dash < 4 && digit == (size_t)dashes[dash] && text[i] == '-') {
            dash++;
            continue;
        }
        int value = hex_value(text[i]);
        if (value < 0 || digit >= 32) return -1;
        if (digit % 2 == 0) out[digit / 2] = (unsigned char)(value << 4);
        else out[digit / 2] |= (unsigned char)value;
        digit++;
    }
    return digit == 32 && dash == 4 ? 0 : -1;
}

static int parse_gpus(void) {
    const char *spec = getenv("STUB_CUDA_GPUS");
    const char *used = getenv("STUB_CUDA_USED_MIB");
    gpu_count = 0;
    others_used = used && *used ? strtoull(used, NULL, 10) * MIB : 0;
    if (!spec || !*spec) return 0;
    const char *item = spec;
    while (*item) {
        const char *end = strchr(item, ',');
        size_t length = end ? (size_t)(end - item) : strlen(item);
        const char *colon = memchr(item, ':', length);
        struct Gpu *gpu = &gpus[gpu_count];
        if (gpu_count == MAX_GPUS || !colon ||
            parse_uuid(item, (size_t)(colon - item), gpu->uuid) != 0) {
            fprintf(stderr, "stub_cuda: bad STUB_CUDA_GPUS item %.*s\n", (int)length, item);
            return -1;
        }
        memcpy(gpu->uuid_text, item, (size_t)(colon - item));
        gpu->uuid_text[colon - item] = '\0';
        gpu->total = strtoull(colon + 1, NULL, 10) * MIB;
        gpu->allocated = 0;
        gpu->context.device = gpu_count;
        gpu_count++;
        item += length + (end ? 1 : 0);
    }
    return 0;
}

static unsigned long long free_bytes(const struct Gpu *gpu) {
    unsigned long long taken = gpu->allocated + others_used;
    return taken >= gpu->total ? 0 : gpu->total - taken;
}

static CUresult check_device(CUdevice device) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    return device >= 0 && device < gpu_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult current_device(CUdevice *device) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    *device = current->device;
    return CUDA_SUCCESS;
}

/* Take bytes from device and hand out an address; OUT_OF_MEMORY past free. */
static CUresult take(int device, unsigned long long bytes, unsigned long long *address) {
    CUresult result = CUDA_SUCCESS;
    if (!address || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (bytes > free_bytes(&gpus[device])) {
        result = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        if (allocation_count == allocation_capacity) {
            size_t capacity = allocation_capacity ? allocation_capacity * 2 : 64;
            struct Allocation *grown = realloc(allocations, capacity * sizeof *grown);
            if (!grown) {
                pthread_mutex_unlock(&lock);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            allocations = grown;
            allocation_capacity = capacity;
        }
        *address = next_address;
        next_address += (bytes + 0xfffffULL) & ~0xfffffULL;
        allocations[allocation_count++] = (struct Allocation){*address, device, bytes};
        gpus[device].allocated += bytes;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

static CUresult give_back(unsigned long long address) {
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < allocation_count; i++) {
        if (allocations[i].address == address) {
            gpus[allocations[i].device].allocated -= allocations[i].bytes;
            allocations[i] = allocations[--allocation_count];
            result = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return result;
}

static CUresult take_current(unsigned long long *address, unsigned long long bytes) {
    CUdevice device;
    CUresult result = current_device(&device);
    return result != CUDA_SUCCESS ? result : take(device, bytes, address);
}

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult result = CUDA_SUCCESS;
    if (!initialised) {
        if (parse_gpus() == 0) initialised = 1;
        else result = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = gpu_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult result = check_device(ordinal);
    if (result == CUDA_SUCCESS) *device = ordinal;
    return result;
}

EXPORT CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    CUresult result = check_device(device);
    if (result != CUDA_SUCCESS) return result;
    if (!name || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)length, "Stub GPU %d", device);
    return CUDA_SUCCESS;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice device) {
    CUresult result = check_device(device);
    if (result != CUDA_SUCCESS) return result;
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    memcpy(uuid->bytes, gpus[device].uuid, 16);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) {
    return device_uuid(uuid, device);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) {
    return device_uuid(uuid, device);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    CUresult result = check_device(device);
    if (result != CUDA_SUCCESS) return result;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = gpus[device].total;
    return CUDA_SUCCESS;
}

static CUresult primary_context(CUcontext *context, CUdevice device) {
    CUresult result = check_device(device);
    if (result != CUDA_SUCCESS) return result;
    if (!context) return CUDA_ERROR_INVALID_VALUE;
    *context = &gpus[device].context;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    return primary_context(context, device);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device) {
    (void)flags;
    CUresult result = primary_context(context, device);
    if (result == CUDA_SUCCESS) current = *context;
    return result;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    current = context;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    return current_device(device);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    CUdevice device;
    CUresult result = current_device(&device);
    if (result != CUDA_SUCCESS) return result;
    if (!free || !total) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *free = free_bytes(&gpus[device]);
    *total = gpus[device].total;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    return take_current(pointer, bytes);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *pointer, size_t *pitch, size_t width,
                                   size_t height, unsigned int element_bytes) {
    if (!pitch || (element_bytes != 4 && element_bytes != 8 && element_bytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t rounded = (width + 511) & ~(size_t)511;
    CUresult result = take_current(pointer, (unsigned long long)rounded * height);
    if (result == CUDA_SUCCESS) *pitch = rounded;
    return result;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *pointer, size_t bytes, unsigned int flags) {
    (void)flags;
    return take_current(pointer, bytes);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *pointer, size_t bytes, CUstream stream) {
    (void)stream;
    return take_current(pointer, bytes);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool,
                                        CUstream stream) {
    (void)pool;
    (void)stream;
    return take_current(pointer, bytes);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *pointer, size_t bytes, CUstream stream) {
    (void)stream;
    return take_current(pointer, bytes);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *pointer, size_t bytes,
                                             CUmemoryPool pool, CUstream stream) {
    (void)pool;
    (void)stream;
    return take_current(pointer, bytes);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    if (!prop || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult result = check_device(prop->location.id);
    return result != CUDA_SUCCESS ? result : take(prop->location.id, bytes, handle);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr pointer) { return give_back(pointer); }

EXPORT CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream) {
    (void)stream;
    return give_back(pointer);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr pointer, CUstream stream) {
    (void)stream;
    return give_back(pointer);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return give_back(handle); }

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, int *status);

/* The driver's table: a base name, the first CUDA version of this variant, the entry point
 * and its per-thread-default-stream variant (if any). A query takes the newest variant not
 * newer than the version asked. */
static const struct {
    const char *name;
    int since;
    void *function;
    void *per_thread;
} table[] = {
    {"cuInit", 2000, (void *)cuInit, NULL},
    {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion, NULL},
    {"cuDeviceGetCount", 2000, (void *)cuDeviceGetCount, NULL},
    {"cuDeviceGet", 2000, (void *)cuDeviceGet, NULL},
    {"cuDeviceGetName", 2000, (void *)cuDeviceGetName, NULL},
    {"cuDeviceGetUuid", 9020, (void *)cuDeviceGetUuid, NULL},
    {"cuDeviceGetUuid", 11040, (void *)cuDeviceGetUuid_v2, NULL},
    {"cuDeviceTotalMem", 3020, (void *)cuDeviceTotalMem_v2, NULL},
    {"cuCtxCreate", 3020, (void *)cuCtxCreate_v2, NULL},
    {"cuCtxGetDevice", 2000, (void *)cuCtxGetDevice, NULL},
    {"cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent, NULL},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)cuDevicePrimaryCtxRetain, NULL},
    {"cuMemGetInfo", 3020, (void *)cuMemGetInfo_v2, NULL},
    {"cuMemAlloc", 3020, (void *)cuMemAlloc_v2, NULL},
    {"cuMemAllocPitch", 3020, (void *)cuMemAllocPitch_v2, NULL},
    {"cuMemAllocManaged", 6000, (void *)cuMemAllocManaged, NULL},
    {"cuMemAllocAsync", 11020, (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, (void *)cuMemAllocFromPoolAsync,
     (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemCreate", 10020, (void *)cuMemCreate, NULL},
    {"cuMemFree", 3020, (void *)cuMemFree_v2, NULL},
    {"cuMemFreeAsync", 11020, (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz},
    {"cuMemRelease", 10020, (void *)cuMemRelease, NULL},
    {"cuGetProcAddress", 11030, (void *)cuGetProcAddress, NULL},
    {"cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2, NULL},
};

static CUresult get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 int *status) {
    int known = 0;
    void *found = NULL;
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, symbol) != 0) continue;
        known = 1;
        if (table[i].since > version) continue;
        found = table[i].function;
        if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && table[i].per_thread)
            found = table[i].per_thread;
    }
    if (status)
        *status = found ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!found) return CUDA_ERROR_NOT_FOUND;
    *pfn = found;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, int *status) {
    return get_proc_address(symbol, pfn, version, flags, status);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return get_proc_address(symbol, pfn, version, flags, NULL);
}
