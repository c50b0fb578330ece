/* A stand-in for NVML (libnvidia-ml.so.1) for tests/test_share_view.py: the devices of
 * STUB_CUDA_GPUS="<uuid>:<total MiB>[,...]" (read by nvmlInit_v2), each with
 * used = STUB_CUDA_USED_MIB (0 when unset), reserved = 0 and free = total - used. Calls before
 * nvmlInit_v2 (or after the last nvmlShutdown) fail with NVML_ERROR_UNINITIALIZED;
 * nvmlDeviceGetMemoryInfo_v2 checks the struct's version as NVML does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct StubDevice *nvmlDevice_t;
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2U << 24U)))

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MIB (1024ULL * 1024ULL)
#define UUID_LENGTH 40

struct StubDevice {
    char uuid[UUID_LENGTH + 1];
    unsigned long long total;
};

static struct StubDevice devices[MAX_GPUS];
static unsigned int device_count;
static unsigned long long used;
static int references;

static int parse_devices(void) {
    const char *spec = getenv("STUB_CUDA_GPUS");
    const char *used_mib = getenv("STUB_CUDA_USED_MIB");
    device_count = 0;
    used = used_mib && *used_mib ? strtoull(used_mib, NULL, 10) * MIB : 0;
    if (!spec) return 0;
    const char *item = spec;
    while (*item) {
        const char *end = strchr(item, ',');
        size_t length = end ? (size_t)(end - item) : strlen(item);
        const char *colon = memchr(item, ':', length);
        if (device_count == MAX_GPUS || !colon || colon - item != UUID_LENGTH) {
            fprintf(stderr, "stub_nvml: bad STUB_CUDA_GPUS item %.*s\n", (int)length, item);
            return -1;
        }
        memcpy(devices[device_count].uuid, item, UUID_LENGTH);
        devices[device_count].uuid[UUID_LENGTH] = '\0';
        devices[device_count].total = strtoull(colon + 1, NULL, 10) * MIB;
        device_count++;
        item += length + (end ? 1 : 0);
    }
    return 0;
}

static int valid(nvmlDevice_t device) {
    return references > 0 && device >= devices && device < devices + device_count;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    if (references == 0 && parse_devices() != 0) return NVML_ERROR_UNKNOWN;
    references++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    if (references == 0) return NVML_ERROR_UNINITIALIZED;
    references--;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (references == 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (references == 0) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= device_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (references == 0) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < UUID_LENGTH + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, device->uuid, UUID_LENGTH + 1);
    return NVML_SUCCESS;
}

static unsigned long long free_of(nvmlDevice_t device) {
    return used >= device->total ? 0 : device->total - used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (references == 0) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->total;
    memory->free = free_of(device);
    memory->used = device->total - memory->free;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (references == 0) return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->total;
    memory->reserved = 0;
    memory->free = free_of(device);
    memory->used = device->total - memory->free;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}
