/* What a program in a container sees of its GPUs' memory, read the ways CUDA programs and
 * NVML tools read it; one JSON object on stdout (gpushare.testing.native parses it).
 *
 * libcuda.so.1 and libnvidia-ml.so.1 are dlopen'ed (RTLD_NOW | RTLD_LOCAL, as the CUDA runtime
 * and pynvml open them) and every entry point is resolved before cuInit, then per device:
 *   dlsym            dlsym(libcuda, "cuDeviceTotalMem_v2") and "cuMemGetInfo_v2"
 *   proc_address     cuGetProcAddress("cuDeviceTotalMem"/"cuMemGetInfo", 12000)
 *   proc_address_v2  cuGetProcAddress_v2, the same names
 *   proc_address_self cuGetProcAddress_v2 obtained from cuGetProcAddress("cuGetProcAddress",
 *                    12000), as CUDA 12+ runtimes chain it
 *   nvml, nvml_v2    nvmlDeviceGetMemoryInfo and nvmlDeviceGetMemoryInfo_v2 (by UUID)
 * All sizes in bytes.
 *
 * Options:
 *   --alloc-mib N   allocate N MiB at a time on --device (0) until refused or --max (1024)
 *                   allocations, --rounds (1) times, freeing everything between rounds;
 *   --alloc-kind K  alloc | pitch | managed | async | pool | create (cuMemAlloc_v2,
 *                   cuMemAllocPitch_v2, cuMemAllocManaged, cuMemAllocAsync,
 *                   cuMemAllocFromPoolAsync, cuMemCreate; freed by cuMemFree_v2, cuMemFreeAsync
 *                   or cuMemRelease);
 *   --via V         dlsym (the default), proc (cuGetProcAddress_v2 at version 12000) or
 *                   proc-ptsz (the same with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, as
 *                   programs built with --default-stream per-thread ask);
 *   --hold          print the JSON with the last round's allocations held, keep them until
 *                   stdin closes, then free them (exit 3 if a free fails);
 *   --go            wait for a line on stdin before allocating (to start several at once);
 *   --bench N       time N calls each of cuMemGetInfo_v2, a 1 MiB cuMemAlloc_v2 + cuMemFree_v2
 *                   pair (dlsym'd pointers, device 0) and nvmlDeviceGetMemoryInfo; ns per call.
 * Exit 2 with a line on stderr when a library or a call the reader needs fails.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef struct {
    int type;
    int requestedHandleTypes;
    struct { int type; int id; } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef CUresult (*GetProcAddress)(const char *, void **, int, uint64_t);
typedef CUresult (*GetProcAddressV2)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*TotalMem)(size_t *, CUdevice);
typedef CUresult (*MemGetInfo)(size_t *, size_t *);
typedef CUresult (*Alloc)(CUdeviceptr *, size_t);
typedef CUresult (*AllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*AllocManaged)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*AllocAsync)(CUdeviceptr *, size_t, void *);
typedef CUresult (*AllocFromPool)(CUdeviceptr *, size_t, void *, void *);
typedef CUresult (*Create)(unsigned long long *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
typedef CUresult (*Free)(CUdeviceptr);
typedef CUresult (*FreeAsync)(CUdeviceptr, void *);
typedef int (*NvmlCall)(void);
typedef int (*NvmlCount)(unsigned int *);
typedef int (*NvmlHandle)(unsigned int, void **);
typedef int (*NvmlUuid)(void *, char *, unsigned int);
typedef int (*NvmlMemory)(void *, nvmlMemory_t *);
typedef int (*NvmlMemoryV2)(void *, nvmlMemory_v2_t *);

#define VERSION 12000
#define MIB (1024ULL * 1024ULL)
#define PATHS 4

static const char *path_names[PATHS] = {"dlsym", "proc_address", "proc_address_v2",
                                        "proc_address_self"};
static TotalMem total_mem[PATHS];
static MemGetInfo mem_get_info[PATHS];
static void *cuda, *nvml;

static void fail(const char *what, long code) {
    fprintf(stderr, "read_share: %s failed (%ld)\n", what, code);
    exit(2);
}

static void *need(void *handle, const char *name) {
    void *symbol = dlsym(handle, name);
    if (!symbol) fail(name, -1);
    return symbol;
}

#define CHECK(call)                                  \
    do {                                             \
        long result_ = (long)(call);                 \
        if (result_ != 0) fail(#call, result_);      \
    } while (0)

static void *by_proc_flags(GetProcAddress v1, GetProcAddressV2 v2, const char *name,
                           uint64_t flags) {
    void *function = NULL;
    int status = -1;
    if (v1) CHECK(v1(name, &function, VERSION, flags));
    else CHECK(v2(name, &function, VERSION, flags, &status) || status);
    if (!function) fail(name, -1);
    return function;
}

static void *by_proc(GetProcAddress v1, GetProcAddressV2 v2, const char *name) {
    return by_proc_flags(v1, v2, name, 0);
}

static void resolve_views(void) {
    GetProcAddress proc = need(cuda, "cuGetProcAddress");
    GetProcAddressV2 proc_v2 = need(cuda, "cuGetProcAddress_v2");
    GetProcAddressV2 proc_self = by_proc(proc, NULL, "cuGetProcAddress");
    total_mem[0] = need(cuda, "cuDeviceTotalMem_v2");
    mem_get_info[0] = need(cuda, "cuMemGetInfo_v2");
    total_mem[1] = by_proc(proc, NULL, "cuDeviceTotalMem");
    mem_get_info[1] = by_proc(proc, NULL, "cuMemGetInfo");
    total_mem[2] = by_proc(NULL, proc_v2, "cuDeviceTotalMem");
    mem_get_info[2] = by_proc(NULL, proc_v2, "cuMemGetInfo");
    total_mem[3] = by_proc(NULL, proc_self, "cuDeviceTotalMem");
    mem_get_info[3] = by_proc(NULL, proc_self, "cuMemGetInfo");
}

static void use_device(CUdevice device) {
    CUresult (*retain)(CUcontext *, CUdevice) = need(cuda, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = need(cuda, "cuCtxSetCurrent");
    CUcontext context;
    CHECK(retain(&context, device));
    CHECK(set_current(context));
}

static void *nvml_device(const char *uuid) {
    unsigned int count;
    CHECK(((NvmlCount)need(nvml, "nvmlDeviceGetCount_v2"))(&count));
    for (unsigned int i = 0; i < count; i++) {
        void *device;
        char text[96];
        CHECK(((NvmlHandle)need(nvml, "nvmlDeviceGetHandleByIndex_v2"))(i, &device));
        CHECK(((NvmlUuid)need(nvml, "nvmlDeviceGetUUID"))(device, text, sizeof text));
        if (strcmp(text, uuid) == 0) return device;
    }
    return NULL;
}

/* One device's view as a JSON object (no trailing newline). */
static void print_view(CUdevice device) {
    char name[128], uuid[48];
    CUuuid raw;
    const unsigned char *b = raw.bytes;
    use_device(device);
    CHECK(((CUresult(*)(char *, int, CUdevice))need(cuda, "cuDeviceGetName"))(name, 128, device));
    CHECK(((CUresult(*)(CUuuid *, CUdevice))need(cuda, "cuDeviceGetUuid_v2"))(&raw, device));
    snprintf(uuid, sizeof uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    printf("{\"index\": %d, \"uuid\": \"%s\", \"name\": \"%s\"", device, uuid, name);
    for (int p = 0; p < PATHS; p++) {
        size_t device_total, total, free;
        CHECK(total_mem[p](&device_total, device));
        CHECK(mem_get_info[p](&free, &total));
        printf(", \"%s\": {\"device_total\": %zu, \"total\": %zu, \"free\": %zu}", path_names[p],
               device_total, total, free);
    }
    void *handle = nvml_device(uuid);
    if (!handle) {
        printf(", \"nvml\": null, \"nvml_v2\": null}");
        return;
    }
    nvmlMemory_t v1;
    nvmlMemory_v2_t v2 = {.version = (unsigned int)(sizeof v2 | (2U << 24U))};
    CHECK(((NvmlMemory)need(nvml, "nvmlDeviceGetMemoryInfo"))(handle, &v1));
    CHECK(((NvmlMemoryV2)need(nvml, "nvmlDeviceGetMemoryInfo_v2"))(handle, &v2));
    printf(", \"nvml\": {\"total\": %llu, \"free\": %llu, \"used\": %llu}", v1.total, v1.free,
           v1.used);
    printf(", \"nvml_v2\": {\"total\": %llu, \"reserved\": %llu, \"free\": %llu, \"used\": %llu}}",
           v2.total, v2.reserved, v2.free, v2.used);
}

/* The allocation family, resolved the chosen way. */
struct Allocator {
    const char *kind;
    void *allocate, *release;
};

/* via: 0 dlsym, 1 cuGetProcAddress_v2, 2 the same per-thread-default-stream. */
static void *entry(int via, GetProcAddressV2 proc, const char *symbol, const char *base) {
    return via ? by_proc_flags(NULL, proc, base, via == 2 ? 2 : 0) : need(cuda, symbol);
}

static struct Allocator allocator(const char *kind, int via) {
    static const char *table[][5] = {
        /* kind, allocate symbol, base name, release symbol, base name */
        {"alloc", "cuMemAlloc_v2", "cuMemAlloc", "cuMemFree_v2", "cuMemFree"},
        {"pitch", "cuMemAllocPitch_v2", "cuMemAllocPitch", "cuMemFree_v2", "cuMemFree"},
        {"managed", "cuMemAllocManaged", "cuMemAllocManaged", "cuMemFree_v2", "cuMemFree"},
        {"async", "cuMemAllocAsync", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemFreeAsync"},
        {"pool", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
         "cuMemFreeAsync"},
        {"create", "cuMemCreate", "cuMemCreate", "cuMemRelease", "cuMemRelease"},
    };
    GetProcAddressV2 proc = need(cuda, "cuGetProcAddress_v2");
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i][0], kind) != 0) continue;
        return (struct Allocator){table[i][0], entry(via, proc, table[i][1], table[i][2]),
                                  entry(via, proc, table[i][3], table[i][4])};
    }
    fail("--alloc-kind", -1);
    return (struct Allocator){0};
}

static CUresult allocate(const struct Allocator *a, CUdevice device, size_t bytes,
                         CUdeviceptr *out) {
    const char *k = a->kind;
    if (strcmp(k, "alloc") == 0) return ((Alloc)a->allocate)(out, bytes);
    if (strcmp(k, "pitch") == 0) {
        size_t pitch;
        return ((AllocPitch)a->allocate)(out, &pitch, MIB, bytes / MIB, 4);
    }
    if (strcmp(k, "managed") == 0) return ((AllocManaged)a->allocate)(out, bytes, 1);
    if (strcmp(k, "async") == 0) return ((AllocAsync)a->allocate)(out, bytes, NULL);
    if (strcmp(k, "pool") == 0) return ((AllocFromPool)a->allocate)(out, bytes, NULL, NULL);
    CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = device}};
    return ((Create)a->allocate)(out, bytes, &prop, 0);
}

static CUresult release(const struct Allocator *a, CUdeviceptr pointer) {
    if (strcmp(a->kind, "async") == 0 || strcmp(a->kind, "pool") == 0)
        return ((FreeAsync)a->release)(pointer, NULL);
    return ((Free)a->release)(pointer);
}

/* Newest first, as allocators usually free. */
static int release_all(const struct Allocator *a, CUdeviceptr *held, int count) {
    int freed = 0;
    for (int i = count - 1; i >= 0; i--) freed += release(a, held[i]) == 0;
    return freed;
}

static double ns_per_call(struct timespec start, long calls) {
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (double)(end.tv_sec - start.tv_sec) * 1e9 + (double)(end.tv_nsec - start.tv_nsec);
    return ns / (double)calls;
}

static void bench(long calls) {
    MemGetInfo info = need(cuda, "cuMemGetInfo_v2");
    Alloc alloc = need(cuda, "cuMemAlloc_v2");
    Free release_one = need(cuda, "cuMemFree_v2");
    NvmlMemory nvml_info = need(nvml, "nvmlDeviceGetMemoryInfo");
    void *device;
    size_t free, total;
    CUdeviceptr pointer;
    nvmlMemory_t memory;
    struct timespec start;
    use_device(0);
    CHECK(((NvmlHandle)need(nvml, "nvmlDeviceGetHandleByIndex_v2"))(0, &device));
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < calls; i++) CHECK(info(&free, &total));
    double info_ns = ns_per_call(start, calls);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < calls; i++) {
        CHECK(alloc(&pointer, MIB));
        CHECK(release_one(pointer));
    }
    double alloc_ns = ns_per_call(start, calls);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < calls; i++) CHECK(nvml_info(device, &memory));
    double nvml_ns = ns_per_call(start, calls);
    printf(", \"bench\": {\"calls\": %ld, \"mem_get_info_ns\": %.1f, \"alloc_free_ns\": %.1f, "
           "\"nvml_memory_info_ns\": %.1f}",
           calls, info_ns, alloc_ns, nvml_ns);
}

int main(int argc, char **argv) {
    const char *kind = "alloc", *via = "dlsym";
    long alloc_mib = 0, max = 1024, rounds = 1, bench_calls = 0;
    int device = 0, hold = 0, go = 0;
    for (int i = 1; i < argc; i++) {
        const char *option = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(option, "--hold") == 0) { hold = 1; continue; }
        if (strcmp(option, "--go") == 0) { go = 1; continue; }
        if (!value) fail(option, -1);
        i++;
        if (strcmp(option, "--alloc-mib") == 0) alloc_mib = atol(value);
        else if (strcmp(option, "--alloc-kind") == 0) kind = value;
        else if (strcmp(option, "--via") == 0) via = value;
        else if (strcmp(option, "--device") == 0) device = atoi(value);
        else if (strcmp(option, "--max") == 0) max = atol(value);
        else if (strcmp(option, "--rounds") == 0) rounds = atol(value);
        else if (strcmp(option, "--bench") == 0) bench_calls = atol(value);
        else fail(option, -1);
    }
    int via_code = strcmp(via, "dlsym") == 0 ? 0 : strcmp(via, "proc") == 0 ? 1
                   : strcmp(via, "proc-ptsz") == 0 ? 2 : -1;
    if (max < 1 || rounds < 1 || via_code < 0) fail("options", -1);
    cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) fail(dlerror(), -1);
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml) fail(dlerror(), -1);
    resolve_views();
    struct Allocator chosen = {0};
    if (alloc_mib > 0) chosen = allocator(kind, via_code);
    int count;
    CHECK(((CUresult(*)(unsigned int))need(cuda, "cuInit"))(0));
    CHECK(((CUresult(*)(int *))need(cuda, "cuDeviceGetCount"))(&count));
    CHECK(((NvmlCall)need(nvml, "nvmlInit_v2"))());

    printf("{\"devices\": [");
    for (int d = 0; d < count; d++) {
        if (d) fputs(", ", stdout);
        print_view(d);
    }
    printf("]");
    if (bench_calls > 0) bench(bench_calls);
    CUdeviceptr *held = calloc((size_t)max, sizeof *held);
    int allocated = 0;
    if (go) {
        int c;
        while ((c = getchar()) != EOF && c != '\n') {
        }
    }
    if (alloc_mib > 0) {
        if (!held) fail("calloc", -1);
        printf(", \"alloc\": {\"kind\": \"%s\", \"via\": \"%s\", \"device\": %d, \"mib\": %ld, "
               "\"rounds\": [",
               kind, via, device, alloc_mib);
        for (long r = 0; r < rounds; r++) {
            CUresult stopped_by = 0;
            use_device(device);
            for (allocated = 0; allocated < max; allocated++) {
                stopped_by = allocate(&chosen, device, (size_t)alloc_mib * MIB, &held[allocated]);
                if (stopped_by != 0) break;
            }
            printf("%s{\"count\": %d, \"stopped_by\": %d, \"view\": ", r ? ", " : "", allocated,
                   stopped_by);
            print_view(device);
            if (hold && r == rounds - 1) printf(", \"freed\": null}");
            else printf(", \"freed\": %d}", release_all(&chosen, held, allocated));
        }
        printf("]}");
    }
    printf("}\n");
    fflush(stdout);
    if (hold) {
        while (getchar() != EOF) {
        }
        if (release_all(&chosen, held, allocated) != allocated) return 3;
    }
    free(held);
    CHECK(((NvmlCall)need(nvml, "nvmlShutdown"))());
    return 0;
}
