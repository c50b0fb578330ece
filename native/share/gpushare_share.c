/* libgpushare-share.so: the GPU memory share view of a shared container (docs/share-view.md).
 *
 * Loaded into every process of a container by LD_PRELOAD. For each GPU listed in
 * GPUSHARE_SHARE_MIB (by UUID) the CUDA driver API and NVML report the container's share
 * instead of the whole card: cuDeviceTotalMem and the total of cuMemGetInfo and
 * nvmlDeviceGetMemoryInfo are the share, free is what is left of it. Allocations are counted
 * per GPU in a file the container's processes share (GPUSHARE_SHARE_STATE), and with
 * GPUSHARE_SHARE_ENFORCE=1 an allocation that would take the container past its share fails
 * with CUDA_ERROR_OUT_OF_MEMORY (advisory: a process can bypass it, see the doc).
 *
 * Rules this file keeps: never abort, never crash a workload, at most one line on stderr per
 * process; without GPUSHARE_SHARE_MIB (or with a malformed value) every call goes straight to
 * the driver. No NVIDIA header is used: the few types and constants below are declared from
 * NVIDIA's public API documentation, the CUDA Driver API reference
 * (https://docs.nvidia.com/cuda/cuda-driver-api/) and the NVML API reference
 * (https://docs.nvidia.com/deploy/nvml-api/).
 *
 * Build: scripts/build-native.sh (cc -O2 -fPIC -shared -fvisibility=hidden ...); the exported
 * symbols are exactly the interposed functions, marked EXPORT_AS below, and dlsym.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Bind libdl's and libpthread's functions to their first symbol version rather than the
 * GLIBC_2.34 one that a glibc >= 2.34 links by default (they moved into libc then, keeping the
 * old versions): the library then loads under an older glibc too (Ubuntu 20.04 has 2.31), where
 * an unmet version need would stop every process of the container at start. The build links
 * libdl.so.2 and libpthread.so.0 (where they live before 2.34) and checks that nothing needs a
 * version past GLIBC_2.17 (scripts/build-native.sh). */
#if defined(__GLIBC__) && defined(__x86_64__)
#define GLIBC_FIRST "GLIBC_2.2.5"
#elif defined(__GLIBC__) && defined(__aarch64__)
#define GLIBC_FIRST "GLIBC_2.17"
#endif
#ifdef GLIBC_FIRST
__asm__(".symver dlopen,dlopen@" GLIBC_FIRST);
__asm__(".symver dlclose,dlclose@" GLIBC_FIRST);
__asm__(".symver dlerror,dlerror@" GLIBC_FIRST);
__asm__(".symver dladdr,dladdr@" GLIBC_FIRST);
__asm__(".symver dlvsym,dlvsym@" GLIBC_FIRST);
__asm__(".symver pthread_once,pthread_once@" GLIBC_FIRST);
#endif

/* ---- CUDA driver and NVML types (from the public API references named above) ------------- */

typedef int CUresult;                                 /* enum cudaError_enum */
typedef int CUdevice;                                 /* device ordinal */
typedef unsigned long long CUdeviceptr;               /* CUdeviceptr_v2 */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef struct {
    char bytes[16];
} CUuuid;
typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;
typedef struct { /* only the leading members are read */
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
} CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2 /* CUdriverProcAddress_flags */
#define CU_GET_PROC_ADDRESS_SUCCESS 0                   /* CUdriverProcAddressQueryResult */
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
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

#define NVML_SUCCESS 0
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_UUID_BUFFER 96 /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */

/* The driver's entry points, as the API reference types them. The unsuffixed cuMemGetInfo and
 * cuDeviceTotalMem are the CUDA 2.x ABI (unsigned int sizes) that libcuda still exports; cuda.h
 * maps the names programs write to the _v2 ones. */
typedef CUresult (*pfn_total_v2)(size_t *, CUdevice);
typedef CUresult (*pfn_total_v1)(unsigned int *, CUdevice);
typedef CUresult (*pfn_info_v2)(size_t *, size_t *);
typedef CUresult (*pfn_info_v1)(unsigned int *, unsigned int *);
typedef CUresult (*pfn_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*pfn_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*pfn_managed)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*pfn_async)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*pfn_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*pfn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
typedef CUresult (*pfn_free)(CUdeviceptr);
typedef CUresult (*pfn_free_async)(CUdeviceptr, CUstream);
typedef CUresult (*pfn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*pfn_gpa_v1)(const char *, void **, int, cuuint64_t);
typedef CUresult (*pfn_gpa_v2)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*pfn_ctx_device)(CUdevice *);
typedef CUresult (*pfn_uuid)(CUuuid *, CUdevice);
typedef nvmlReturn_t (*pfn_nvml_mem)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*pfn_nvml_mem_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef nvmlReturn_t (*pfn_nvml_uuid)(nvmlDevice_t, char *, unsigned int);
typedef void *(*pfn_dlsym)(void *, const char *);

/* ---- limits ------------------------------------------------------------------------------ */

#define MAX_GPUS 32            /* GPUs in GPUSHARE_SHARE_MIB, and in the usage file */
#define MAX_VALUE 4096         /* characters of GPUSHARE_SHARE_MIB */
#define MAX_MIB (1ULL << 31)   /* a share in MiB */
#define MAX_DEVICES 64         /* CUDA ordinals whose UUID is cached */
#define MAX_SLOTS 256          /* processes counted at once in the usage file */
#define TABLE_MIN 256          /* allocation table: entries, a power of two */
#define TABLE_MAX (1U << 20)   /* past this many live allocations, new ones go uncounted */
#define LOCK_WAIT_MS 2000      /* the longest wait for the usage file's lock */
#define LIVENESS_CACHE_MS 1000 /* how long a process found running is trusted to run */
#define DEFAULT_STATE "/tmp/.gpushare-share-usage"

#define EXPORT_AS(name, impl) \
    extern __typeof__(impl) name __attribute__((alias(#impl), visibility("default")));

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free (shared memory)");

/* ---- one line on stderr at most ---------------------------------------------------------- */

static atomic_int said;

/* Write "gpushare-share: " + text + "\n" once per process, with write(2): no stdio, no malloc
 * (this can run inside dlsym, before the program's constructors). */
static void say_once(const char *text) {
    if (atomic_exchange(&said, 1)) return;
    char line[1024];
    size_t n = 0;
    const char *prefix = "gpushare-share: ";
    for (const char *p = prefix; *p && n < sizeof line - 2; p++) line[n++] = *p;
    for (const char *p = text; *p && n < sizeof line - 2; p++) line[n++] = *p;
    line[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t w = write(2, line + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
}

/* Append at most max characters of s to buf (size cap, at *len), printable ASCII only, with
 * "..." when cut: values from the environment end up in the one stderr line. */
static void append_value(char *buf, size_t cap, size_t *len, const char *s, size_t max) {
    size_t i = 0;
    for (; s[i] && i < max && *len + 1 < cap; i++)
        buf[(*len)++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (s[i] && i == max)
        for (int k = 0; k < 3 && *len + 1 < cap; k++) buf[(*len)++] = '.';
    buf[*len] = '\0';
}

static void append_text(char *buf, size_t cap, size_t *len, const char *s) {
    while (*s && *len + 1 < cap) buf[(*len)++] = *s++;
    buf[*len] = '\0';
}

/* ---- configuration: GPUSHARE_SHARE_MIB, GPUSHARE_SHARE_ENFORCE, GPUSHARE_SHARE_STATE --------- */

struct share {
    unsigned char uuid[16];
    uint64_t bytes;
};

static struct {
    bool active; /* a valid, non-empty GPUSHARE_SHARE_MIB */
    bool enforce;
    int count;
    struct share gpu[MAX_GPUS];
    char state_path[PATH_MAX];
    bool state_path_too_long;
} cfg;

static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (n characters at s, hex of either case) to the
 * 16 bytes it names; false when s is not of that form. */
static bool parse_uuid(const char *s, size_t n, unsigned char out[16]) {
    if (n != 40 || memcmp(s, "GPU-", 4) != 0) return false;
    size_t k = 0;
    for (size_t i = 4; i < 40;) {
        if (i == 12 || i == 17 || i == 22 || i == 27) {
            if (s[i] != '-') return false;
            i++;
            continue;
        }
        int hi = hex_value(s[i]), lo = hex_value(s[i + 1]);
        if (hi < 0 || lo < 0 || i + 1 == 12 || i + 1 == 17 || i + 1 == 22 || i + 1 == 27)
            return false;
        out[k++] = (unsigned char)(hi << 4 | lo);
        i += 2;
    }
    return k == 16;
}

/* Parse GPUSHARE_SHARE_MIB into cfg.gpu; NULL when valid, else what is wrong. */
static const char *parse_shares(const char *v) {
    if (strnlen(v, MAX_VALUE + 1) > MAX_VALUE) return "longer than 4096 characters";
    const char *p = v;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0) return "an empty entry";
        const char *eq = memchr(p, '=', len);
        if (!eq) return "an entry without '='";
        if (cfg.count == MAX_GPUS) return "more than 32 GPUs";
        struct share *s = &cfg.gpu[cfg.count];
        if (!parse_uuid(p, (size_t)(eq - p), s->uuid)) return "a UUID not of NVML's form";
        const char *d = eq + 1, *end = p + len;
        if (d == end) return "a size missing";
        uint64_t mib = 0;
        for (; d < end; d++) {
            if (*d < '0' || *d > '9') return "a size that is not a whole number";
            mib = mib * 10 + (uint64_t)(*d - '0');
            if (mib > MAX_MIB) return "a size over 2147483648";
        }
        if (mib == 0) return "a size of 0";
        for (int i = 0; i < cfg.count; i++)
            if (memcmp(cfg.gpu[i].uuid, s->uuid, 16) == 0) return "a GPU listed twice";
        s->bytes = mib << 20;
        cfg.count++;
        if (!comma) return NULL;
        p = comma + 1;
    }
}

static void register_atfork(void);

static void cfg_load(void) {
    const char *mib = getenv("GPUSHARE_SHARE_MIB");
    if (!mib || !*mib) return; /* not a shared container: do nothing at all */
    char line[768];
    size_t n = 0;
    const char *why = parse_shares(mib);
    if (why) {
        cfg.count = 0;
        append_text(line, sizeof line, &n, "GPUSHARE_SHARE_MIB=\"");
        append_value(line, sizeof line, &n, mib, 120);
        append_text(line, sizeof line, &n, "\" is malformed (");
        append_text(line, sizeof line, &n, why);
        append_text(line, sizeof line, &n,
                    "); accepted: <uuid>=<MiB>[,<uuid>=<MiB>...], <uuid> as NVML prints it "
                    "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), <MiB> a whole number "
                    "1..2147483648, each GPU once, at most 32; the share view is off in this "
                    "process");
        say_once(line);
        return;
    }
    const char *enforce = getenv("GPUSHARE_SHARE_ENFORCE");
    if (enforce && strcmp(enforce, "0") != 0 && strcmp(enforce, "1") != 0) {
        cfg.count = 0;
        append_text(line, sizeof line, &n, "GPUSHARE_SHARE_ENFORCE=\"");
        append_value(line, sizeof line, &n, enforce, 40);
        append_text(line, sizeof line, &n,
                    "\" is malformed; accepted: 1 (refuse allocations past the share), 0 or "
                    "unset (report the share only); the share view is off in this process");
        say_once(line);
        return;
    }
    cfg.enforce = enforce && strcmp(enforce, "1") == 0;
    const char *state = getenv("GPUSHARE_SHARE_STATE");
    if (!state || !*state) state = DEFAULT_STATE;
    if (strlen(state) >= sizeof cfg.state_path) {
        cfg.state_path_too_long = true;
    } else {
        memcpy(cfg.state_path, state, strlen(state) + 1);
    }
    register_atfork();
    cfg.active = true;
}

static bool active(void) {
    pthread_once(&cfg_once, cfg_load);
    return cfg.active;
}

static int find_gpu(const unsigned char uuid[16]) {
    for (int i = 0; i < cfg.count; i++)
        if (memcmp(cfg.gpu[i].uuid, uuid, 16) == 0) return i;
    return -1;
}

/* ---- the real functions ------------------------------------------------------------------ */

enum lib { LIB_CUDA, LIB_NVML, N_LIBS };
static const char *const lib_soname[N_LIBS] = {"libcuda.so.1", "libnvidia-ml.so.1"};
static const char *const lib_prefix[N_LIBS] = {"libcuda.so", "libnvidia-ml.so"};

/* Every interposed symbol: its name, its library. X(name, lib). */
#define HOOKED(X)                                \
    X(cuDeviceTotalMem_v2, LIB_CUDA)             \
    X(cuDeviceTotalMem, LIB_CUDA)                \
    X(cuMemGetInfo_v2, LIB_CUDA)                 \
    X(cuMemGetInfo, LIB_CUDA)                    \
    X(cuMemAlloc_v2, LIB_CUDA)                   \
    X(cuMemAllocPitch_v2, LIB_CUDA)              \
    X(cuMemAllocManaged, LIB_CUDA)               \
    X(cuMemAllocAsync, LIB_CUDA)                 \
    X(cuMemAllocAsync_ptsz, LIB_CUDA)            \
    X(cuMemAllocFromPoolAsync, LIB_CUDA)         \
    X(cuMemAllocFromPoolAsync_ptsz, LIB_CUDA)    \
    X(cuMemCreate, LIB_CUDA)                     \
    X(cuMemFree_v2, LIB_CUDA)                    \
    X(cuMemFreeAsync, LIB_CUDA)                  \
    X(cuMemFreeAsync_ptsz, LIB_CUDA)             \
    X(cuMemRelease, LIB_CUDA)                    \
    X(cuGetProcAddress, LIB_CUDA)                \
    X(cuGetProcAddress_v2, LIB_CUDA)             \
    X(nvmlDeviceGetMemoryInfo, LIB_NVML)         \
    X(nvmlDeviceGetMemoryInfo_v2, LIB_NVML)
/* ... and the driver functions this file calls without interposing them. */
#define HELPERS(X)                    \
    X(cuCtxGetDevice, LIB_CUDA)       \
    X(cuDeviceGetUuid, LIB_CUDA)      \
    X(cuDeviceGetUuid_v2, LIB_CUDA)   \
    X(nvmlDeviceGetUUID, LIB_NVML)

#define AS_ID(name, lib) F_##name,
#define AS_NAME(name, lib) #name,
#define AS_LIB(name, lib) lib,
enum { HOOKED(AS_ID) N_HOOKED };
enum { F_LAST_HOOKED = N_HOOKED - 1, HELPERS(AS_ID) N_FUNCTIONS };
static const char *const fn_name[N_FUNCTIONS] = {HOOKED(AS_NAME) HELPERS(AS_NAME)};
static const enum lib fn_lib[N_FUNCTIONS] = {HOOKED(AS_LIB) HELPERS(AS_LIB)};

static _Atomic(void *) real_ptr[N_FUNCTIONS];
static _Atomic(void *) lib_handle[N_LIBS];
static _Atomic(pfn_dlsym) real_dlsym_ptr;

static bool is_ours(const void *p); /* one of this file's interposed functions */

/* glibc's dlsym, found with dlvsym so that it is not this file's. Every glibc has it under the
 * architecture's first symbol version (libdl's before 2.34, a compatibility alias of the same
 * function in libc since), so that is asked first: a failed dlvsym may allocate (its error
 * text), and this can run inside a malloc wrapper's first dlsym. Then GLIBC_2.34. */
static pfn_dlsym real_dlsym(void) {
    pfn_dlsym f = atomic_load(&real_dlsym_ptr);
    if (f) return f;
    static const char *const versions[] = {
#if defined(__aarch64__)
        "GLIBC_2.17",
#elif defined(__x86_64__)
        "GLIBC_2.2.5",
#else
        "GLIBC_2.17", "GLIBC_2.2.5", "GLIBC_2.0",
#endif
        "GLIBC_2.34",
    };
    size_t i = 0;
    for (; i < sizeof versions / sizeof versions[0] && !f; i++)
        f = (pfn_dlsym)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (i > 1) (void)dlerror(); /* our failed attempts are not the program's errors */
    if (f) atomic_store(&real_dlsym_ptr, f);
    return f;
}

static bool named_like(const char *path, enum lib lib) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strncmp(base, lib_prefix[lib], strlen(lib_prefix[lib])) == 0;
}

/* Keep a handle of our own on the library that defines p (the program's may be dlclose'd). */
static void note_library(const void *p, enum lib lib) {
    if (atomic_load(&lib_handle[lib])) return;
    Dl_info info;
    if (!dladdr(p, &info) || !info.dli_fname) return;
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return;
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&lib_handle[lib], &none, h)) dlclose(h);
}

/* The driver's function for id: from the driver library this process already holds a handle
 * of (note_library), else the next definition after this library, else from the library loaded
 * under its soname (a program's dlopen(..., RTLD_LOCAL) keeps it out of the global scope, and
 * out of RTLD_NEXT's reach). Never this file's own: that would call itself. Nothing is loaded
 * that the process has not loaded. */
static void *lookup_real(int id) {
    pfn_dlsym d = real_dlsym();
    if (!d) return NULL;
    enum lib lib = fn_lib[id];
    void *h = atomic_load(&lib_handle[lib]), *p = NULL;
    if (h && (p = d(h, fn_name[id])) && !is_ours(p)) return p;
    if ((p = d(RTLD_NEXT, fn_name[id])) && !is_ours(p)) goto found;
    if (!h && (h = dlopen(lib_soname[lib], RTLD_LAZY | RTLD_NOLOAD))) {
        void *none = NULL;
        if (!atomic_compare_exchange_strong(&lib_handle[lib], &none, h)) {
            dlclose(h);
            h = none;
        }
        if ((p = d(h, fn_name[id])) && !is_ours(p)) goto found;
    }
    (void)dlerror(); /* not found: the program did not ask, so no error of its own */
    return NULL;
found:
    (void)dlerror(); /* an attempt before may have failed: not the program's error */
    return p;
}

static void *real_fn(int id) {
    void *p = atomic_load(&real_ptr[id]);
    if (p) return p;
    p = lookup_real(id);
    if (!p) return NULL;
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&real_ptr[id], &none, p)) p = none;
    return p;
}

/* Record p as the real function for id when none is known (from dlsym or cuGetProcAddress). */
static void set_real(int id, void *p) {
    if (!p || is_ours(p)) return;
    void *none = NULL;
    atomic_compare_exchange_strong(&real_ptr[id], &none, p);
}

#define REAL(id, type) ((type)real_fn(F_##id))

/* ---- which listed GPU a CUDA device or an NVML handle is --------------------------------- */

/* CUDA ordinal -> 0 unknown, -1 not listed, k + 1 listed at k. Ordinals do not change in a
 * process (CUDA_VISIBLE_DEVICES is read once by the driver). */
static atomic_int device_gpu[MAX_DEVICES];

static int gpu_of_device(CUdevice dev) {
    if (dev >= 0 && dev < MAX_DEVICES) {
        int v = atomic_load(&device_gpu[dev]);
        if (v != 0) return v > 0 ? v - 1 : -1;
    }
    CUuuid u;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    pfn_uuid get = REAL(cuDeviceGetUuid_v2, pfn_uuid);
    if (get) r = get(&u, dev);
    if (r != CUDA_SUCCESS && (get = REAL(cuDeviceGetUuid, pfn_uuid))) r = get(&u, dev);
    if (r != CUDA_SUCCESS) return -1; /* not cached: may work once the driver is initialized */
    int g = find_gpu((const unsigned char *)u.bytes);
    if (dev >= 0 && dev < MAX_DEVICES) atomic_store(&device_gpu[dev], g >= 0 ? g + 1 : -1);
    return g;
}

/* The listed GPU of the calling thread's current context, or -1. */
static int gpu_current(void) {
    pfn_ctx_device get = REAL(cuCtxGetDevice, pfn_ctx_device);
    CUdevice dev;
    if (!get || get(&dev) != CUDA_SUCCESS) return -1;
    return gpu_of_device(dev);
}

static int gpu_of_nvml(nvmlDevice_t dev) {
    pfn_nvml_uuid get = REAL(nvmlDeviceGetUUID, pfn_nvml_uuid);
    char text[NVML_UUID_BUFFER];
    unsigned char uuid[16];
    if (!get || get(dev, text, sizeof text) != NVML_SUCCESS) return -1;
    text[sizeof text - 1] = '\0';
    if (!parse_uuid(text, strlen(text), uuid)) return -1;
    return find_gpu(uuid);
}

/* ---- the usage file: what the container's processes hold, per GPU ------------------------ */

/* One file per container, mapped by each process that reads or counts. The header lists the
 * GPUs (16-byte UUIDs) in the order they were first seen; slot i is one process: its owner word
 * (pid | low 32 bits of its start time << 32, 0 when free) and what it holds on each GPU of the
 * header, in bytes. A process writes only its own slot, with atomics; slots are claimed and the
 * GPU list is appended under flock(2). Slots of dead processes (kill(pid, 0) says ESRCH, or the
 * pid's start time differs) are ignored by readers and reclaimed by the next claim. */
#define STATE_MAGIC "GPUSHR1"
#define STATE_VERSION 1U

struct state_header {
    char magic[8];
    uint32_t version;
    uint32_t slots;
    uint32_t max_gpus;
    uint32_t gpus;         /* entries of uuid[] in use */
    _Atomic uint32_t high; /* slots ever claimed: readers look at slot[0, high) only */
    uint32_t reserved;
    unsigned char uuid[MAX_GPUS][16];
};

struct state_slot {
    _Atomic uint64_t owner;
    _Atomic int64_t used[MAX_GPUS];
};

struct state_file {
    struct state_header h;
    struct state_slot slot[MAX_SLOTS];
};

/* Guards what follows and the allocation table; never held across a driver call. */
static pthread_mutex_t acct_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int acct_attached;       /* 0 not tried yet, 1 tried (sf final: set or not) */
static struct state_file *_Atomic sf;  /* the mapping, NULL: this process counts alone */
static int sf_fd = -1;
static int file_gpu[MAX_GPUS];         /* cfg index -> header index */
static _Atomic int my_slot = -1;
static atomic_int no_slot;             /* a claim failed: count in local_used from then on */
static _Atomic uint64_t my_owner;
static _Atomic int64_t local_used[MAX_GPUS]; /* this process's, when it has no slot */
static _Atomic uint64_t alive_owner[MAX_SLOTS];
static _Atomic int64_t alive_at[MAX_SLOTS];

/* Fields 3 and 22 of /proc/<pid>/stat: the state letter ('Z': a zombie, dead but not yet
 * reaped) and the start time in clock ticks after boot; 0 when unreadable. */
static unsigned long long proc_start_time(pid_t pid, char *state) {
    *state = '?';
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ' || !p[2]) return 0;
    p++;
    *state = p[1];
    for (int field = 2; field < 21; field++) { /* skip fields 3..21 */
        p = strchr(p + 1, ' ');
        if (!p) return 0;
    }
    return strtoull(p + 1, NULL, 10);
}

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t owner_word(pid_t pid) {
    char state;
    return (uint64_t)(uint32_t)pid | (uint64_t)(uint32_t)proc_start_time(pid, &state) << 32;
}

/* Whether the process that owns a slot (owner word o) still runs. */
static bool owner_alive(uint64_t o, int slot_for_cache) {
    pid_t pid = (pid_t)(uint32_t)o;
    if (pid <= 0) return false;
    uint64_t mine = atomic_load(&my_owner);
    if (o == mine) return true;
    /* this pid is ours, under another start time: a slot an earlier process left */
    if ((uint32_t)pid == (uint32_t)mine) return false;
    /* the cache first: no system call per slot per intercepted call (a dead owner is seen
       at most LIVENESS_CACHE_MS late) */
    int64_t now = monotonic_ms();
    if (slot_for_cache >= 0 && atomic_load(&alive_owner[slot_for_cache]) == o &&
        now - atomic_load(&alive_at[slot_for_cache]) < LIVENESS_CACHE_MS)
        return true;
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char state;
    unsigned long long start = proc_start_time(pid, &state);
    if (state == 'Z' || state == 'X') return false;
    uint32_t tag = (uint32_t)(o >> 32);
    if (tag != 0 && start != 0 && (uint32_t)start != tag) return false; /* the pid was reused */
    if (slot_for_cache >= 0) {
        atomic_store(&alive_owner[slot_for_cache], o);
        atomic_store(&alive_at[slot_for_cache], now);
    }
    return true;
}

static bool lock_file(int fd) {
    for (int waited = 0; waited < LOCK_WAIT_MS; waited += 10) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
        if (errno != EWOULDBLOCK && errno != EINTR) return false;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return false;
}

static void state_failed(const char *what, int err) {
    char line[768];
    size_t n = 0;
    append_text(line, sizeof line, &n, "cannot use the usage file GPUSHARE_SHARE_STATE=\"");
    append_value(line, sizeof line, &n,
                 cfg.state_path_too_long ? "(longer than PATH_MAX)" : cfg.state_path, 200);
    append_text(line, sizeof line, &n, "\" (");
    append_text(line, sizeof line, &n, what);
    if (err) {
        append_text(line, sizeof line, &n, ": ");
        append_text(line, sizeof line, &n, strerror(err));
    }
    append_text(line, sizeof line, &n,
                "); counting this process's allocations only, not the container's");
    say_once(line);
}

/* Open and map the usage file, registering this process's GPUs (acct_mu held). */
static void attach_locked(void) {
    if (cfg.state_path_too_long) {
        state_failed("path too long", 0);
        return;
    }
    const char *path = cfg.state_path;
    int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW;
    int fd = open(path, flags);
    if (fd < 0 && errno == ENOENT) {
        /* 0666 whatever the umask: the container's processes may run as different users. Made
         * without O_CREAT on an existing file: fs.protected_regular refuses O_CREAT on another
         * user's file in /tmp. */
        fd = open(path, flags | O_CREAT | O_EXCL, 0666);
        if (fd >= 0) (void)fchmod(fd, 0666);
        else if (errno == EEXIST) fd = open(path, flags);
    }
    if (fd < 0) {
        state_failed("open", errno);
        return;
    }
    /* The size from lseek, not fstat: fstat is a GLIBC_2.33 symbol (see GLIBC_FIRST). A FIFO
     * fails there (ESPIPE), a directory at open, a device at ftruncate or the size check. */
    off_t size = -1;
    struct state_file *f = MAP_FAILED;
    const char *what = NULL;
    int err = 0;
    bool locked = false;
    if (!(locked = lock_file(fd))) {
        what = "flock", err = errno == EWOULDBLOCK ? 0 : errno;
        if (!err) what = "locked by another process for over 2 s";
    } else if ((size = lseek(fd, 0, SEEK_END)) < 0) {
        what = "not a regular file", err = errno;
    } else if (size == 0 && ftruncate(fd, (off_t)sizeof(struct state_file)) != 0) {
        what = "ftruncate", err = errno;
    } else if (size != 0 && (size_t)size < sizeof(struct state_file)) {
        what = "not a usage file of this version (too small)";
    } else if ((f = mmap(NULL, sizeof(struct state_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                         0)) == MAP_FAILED) {
        what = "mmap", err = errno;
    } else {
        struct state_header *h = &f->h;
        static const struct state_header zero;
        /* new: made (size 0) or sized by a process that died before writing the header */
        if ((size == 0 || (size_t)size == sizeof(struct state_file)) &&
            memcmp(h, &zero, sizeof zero) == 0) {
            memcpy(h->magic, STATE_MAGIC, sizeof h->magic);
            h->version = STATE_VERSION;
            h->slots = MAX_SLOTS;
            h->max_gpus = MAX_GPUS;
        }
        if (memcmp(h->magic, STATE_MAGIC, sizeof h->magic) != 0 || h->version != STATE_VERSION ||
            h->slots != MAX_SLOTS || h->max_gpus != MAX_GPUS || h->gpus > MAX_GPUS ||
            atomic_load(&h->high) > MAX_SLOTS) {
            what = "not a usage file of this version";
        } else {
            for (int g = 0; g < cfg.count && !what; g++) {
                uint32_t k = 0;
                while (k < h->gpus && memcmp(h->uuid[k], cfg.gpu[g].uuid, 16) != 0) k++;
                if (k == h->gpus) {
                    if (h->gpus == MAX_GPUS) {
                        what = "it lists 32 GPUs already";
                        break;
                    }
                    memcpy(h->uuid[k], cfg.gpu[g].uuid, 16);
                    h->gpus = k + 1;
                }
                file_gpu[g] = (int)k;
            }
        }
    }
    if (locked) flock(fd, LOCK_UN);
    if (what) {
        if (f != MAP_FAILED) munmap(f, sizeof(struct state_file));
        close(fd);
        state_failed(what, err);
        return;
    }
    sf_fd = fd;
    atomic_store(&sf, f);
}

/* Marked attached only once sf is final: a thread that sees it set never counts in
 * local_used what another thread will take back from the file, or the reverse. */
static void attach(void) {
    if (atomic_load(&acct_attached)) return;
    pthread_mutex_lock(&acct_mu);
    if (!atomic_load(&acct_attached)) {
        attach_locked();
        atomic_store(&acct_attached, 1);
    }
    pthread_mutex_unlock(&acct_mu);
}

/* Claim a slot for this process (acct_mu held): NULL, else why not (then it counts in
 * local_used, which readers in other processes do not see). */
static const char *claim_locked(struct state_file *f) {
    if (atomic_load(&my_slot) >= 0) return NULL;
    if (!lock_file(sf_fd)) return "its lock was not given within 2 s";
    if (!atomic_load(&my_owner)) atomic_store(&my_owner, owner_word(getpid()));
    uint64_t me = atomic_load(&my_owner);
    int pick = -1;
    for (int i = 0; i < MAX_SLOTS; i++) {
        uint64_t o = atomic_load(&f->slot[i].owner);
        if (o == me) {
            pick = i;
            break;
        }
        if (o != 0 && owner_alive(o, -1)) continue;
        if (o != 0) { /* a dead process's: reclaim */
            for (int g = 0; g < MAX_GPUS; g++) atomic_store(&f->slot[i].used[g], 0);
            atomic_store(&f->slot[i].owner, 0);
        }
        if (pick < 0) pick = i;
    }
    if (pick >= 0) {
        for (int g = 0; g < MAX_GPUS; g++) atomic_store(&f->slot[pick].used[g], 0);
        if (atomic_load(&f->h.high) < (uint32_t)pick + 1)
            atomic_store(&f->h.high, (uint32_t)pick + 1);
        atomic_store(&f->slot[pick].owner, me);
        atomic_store(&my_slot, pick);
    }
    flock(sf_fd, LOCK_UN);
    return pick >= 0 ? NULL : "no free process slot: 256 processes count in it already";
}

/* Where this process counts its bytes on listed GPU g. */
static _Atomic int64_t *own_counter(int g) {
    attach();
    struct state_file *f = atomic_load(&sf);
    if (!f || atomic_load(&no_slot)) return &local_used[g];
    int s = atomic_load(&my_slot);
    if (s < 0) {
        pthread_mutex_lock(&acct_mu);
        const char *why = atomic_load(&no_slot) ? NULL : claim_locked(f);
        if (why) {
            /* where this process counts must not move later: what it counted here is taken
             * back here */
            atomic_store(&no_slot, 1);
            state_failed(why, 0);
        }
        pthread_mutex_unlock(&acct_mu);
        s = atomic_load(&my_slot);
        if (atomic_load(&no_slot) || s < 0) return &local_used[g];
    }
    return &f->slot[s].used[file_gpu[g]];
}

/* What the container's processes hold on listed GPU g, in bytes. */
static uint64_t used_total(int g) {
    attach();
    int64_t v = atomic_load(&local_used[g]);
    uint64_t sum = v > 0 ? (uint64_t)v : 0;
    struct state_file *f = atomic_load(&sf);
    if (!f) return sum;
    int mine = atomic_load(&my_slot), k = file_gpu[g];
    uint32_t high = atomic_load(&f->h.high);
    for (int i = 0; i < MAX_SLOTS && (uint32_t)i < high; i++) {
        uint64_t o = atomic_load(&f->slot[i].owner);
        if (o == 0 || (i != mine && !owner_alive(o, i))) continue;
        v = atomic_load(&f->slot[i].used[k]);
        if (v > 0) sum += (uint64_t)v;
    }
    return sum;
}

static uint64_t left_of_share(int g) {
    uint64_t used = used_total(g), share = cfg.gpu[g].bytes;
    return used < share ? share - used : 0;
}

/* Count bytes on g before the allocation; false (and nothing counted) when enforcing and the
 * container would go past its share. Counting first makes two racing allocations both see
 * each other. */
static bool reserve(int g, uint64_t bytes) {
    _Atomic int64_t *c = own_counter(g);
    atomic_fetch_add(c, (int64_t)bytes);
    if (cfg.enforce && used_total(g) > cfg.gpu[g].bytes) {
        atomic_fetch_sub(c, (int64_t)bytes);
        return false;
    }
    return true;
}

static void unreserve(int g, uint64_t bytes) {
    atomic_fetch_sub(own_counter(g), (int64_t)bytes);
}

/* ---- the allocation table: device pointer or handle -> bytes and GPU --------------------- */

enum { KIND_NONE, KIND_POINTER, KIND_HANDLE };
struct entry {
    uint64_t key;
    uint64_t bytes;
    int32_t gpu;
    int32_t kind;
};
static struct entry *table; /* open addressing, linear probing; acct_mu */
static size_t table_cap, table_len;

static size_t slot_of(uint64_t key, int kind, size_t cap) {
    uint64_t x = key ^ ((uint64_t)kind * 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return (size_t)(x ^ (x >> 31)) & (cap - 1);
}

static bool table_grow(void) {
    size_t cap = table_cap ? table_cap * 2 : TABLE_MIN;
    if (cap > TABLE_MAX) return false;
    struct entry *t = calloc(cap, sizeof *t);
    if (!t) return false;
    for (size_t i = 0; i < table_cap; i++) {
        if (table[i].kind == KIND_NONE) continue;
        size_t j = slot_of(table[i].key, table[i].kind, cap);
        while (t[j].kind != KIND_NONE) j = (j + 1) & (cap - 1);
        t[j] = table[i];
    }
    free(table);
    table = t;
    table_cap = cap;
    return true;
}

static long table_find(uint64_t key, int kind) {
    if (!table_cap) return -1;
    for (size_t i = slot_of(key, kind, table_cap);; i = (i + 1) & (table_cap - 1)) {
        if (table[i].kind == KIND_NONE) return -1;
        if (table[i].key == key && table[i].kind == kind) return (long)i;
    }
}

/* Remove (key, kind) into *out; false when absent. Backward-shift deletion: no tombstones. */
static bool table_take(uint64_t key, int kind, struct entry *out) {
    long found = table_find(key, kind);
    if (found < 0) return false;
    size_t i = (size_t)found, mask = table_cap - 1;
    *out = table[i];
    for (size_t j = (i + 1) & mask; table[j].kind != KIND_NONE; j = (j + 1) & mask) {
        size_t home = slot_of(table[j].key, table[j].kind, table_cap);
        /* table[j] may move to i when its home is not cyclically within (i, j] */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            table[i] = table[j];
            i = j;
        }
    }
    table[i].kind = KIND_NONE;
    table_len--;
    return true;
}

/* Record an allocation; false when the table is full (the allocation then goes uncounted).
 * An entry already there under the key (a free this library did not see, e.g. a destroyed
 * context) is replaced; its bytes are returned through *stale. */
static bool table_put(struct entry e, struct entry *stale) {
    stale->kind = KIND_NONE;
    table_take(e.key, e.kind, stale);
    if ((table_len + 1) * 4 > table_cap * 3 && !table_grow()) return false;
    size_t i = slot_of(e.key, e.kind, table_cap);
    while (table[i].kind != KIND_NONE) i = (i + 1) & (table_cap - 1);
    table[i] = e;
    table_len++;
    return true;
}

/* Before an allocation of bytes on listed GPU g (or -1): 1 counted, 0 not counted (not a
 * listed GPU), -1 refused. */
static int alloc_begin(int g, uint64_t bytes) {
    if (g < 0 || bytes == 0) return 0;
    if (bytes > (uint64_t)INT64_MAX / 4) return cfg.enforce ? -1 : 0; /* no GPU has that much */
    return reserve(g, bytes) ? 1 : -1;
}

/* After it: keep the count when it succeeded and is recorded, else take it back. */
static void alloc_end(int begun, CUresult r, int kind, uint64_t key, int g, uint64_t bytes) {
    if (begun != 1) return;
    if (r != CUDA_SUCCESS) {
        unreserve(g, bytes);
        return;
    }
    struct entry stale;
    pthread_mutex_lock(&acct_mu);
    bool ok = table_put((struct entry){key, bytes, g, kind}, &stale);
    pthread_mutex_unlock(&acct_mu);
    if (!ok) unreserve(g, bytes);
    if (stale.kind != KIND_NONE) unreserve(stale.gpu, stale.bytes);
}

/* Before a free: take the entry out (so that a racing allocation reusing the address after
 * the free cannot be mistaken for it). */
static bool free_begin(int kind, uint64_t key, struct entry *e) {
    pthread_mutex_lock(&acct_mu);
    bool had = table_take(key, kind, e);
    pthread_mutex_unlock(&acct_mu);
    return had;
}

/* After it: release the bytes when it succeeded, else put the entry back. */
static void free_end(bool had, CUresult r, struct entry *e) {
    if (!had) return;
    if (r == CUDA_SUCCESS) {
        unreserve(e->gpu, e->bytes);
        return;
    }
    struct entry stale;
    pthread_mutex_lock(&acct_mu);
    bool ok = table_put(*e, &stale);
    pthread_mutex_unlock(&acct_mu);
    if (!ok) unreserve(e->gpu, e->bytes);
    if (stale.kind != KIND_NONE) unreserve(stale.gpu, stale.bytes);
}

/* ---- fork: the child has none of the parent's allocations, and needs its own slot -------- */

static void atfork_prepare(void) { pthread_mutex_lock(&acct_mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&acct_mu); }
static void atfork_child(void) {
    if (table) memset(table, 0, table_cap * sizeof *table);
    table_len = 0;
    for (int g = 0; g < MAX_GPUS; g++) atomic_store(&local_used[g], 0);
    struct state_file *f = atomic_load(&sf);
    if (f) munmap(f, sizeof(struct state_file));
    if (sf_fd >= 0) close(sf_fd); /* its flock is shared with the parent's descriptor */
    sf_fd = -1;
    atomic_store(&sf, NULL);
    atomic_store(&my_slot, -1);
    atomic_store(&no_slot, 0);
    atomic_store(&my_owner, 0);
    atomic_store(&acct_attached, 0);
    for (int i = 0; i < MAX_SLOTS; i++) atomic_store(&alive_owner[i], 0);
    pthread_mutex_unlock(&acct_mu);
}

static void register_atfork(void) {
    (void)pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

__attribute__((constructor)) static void share_init(void) {
    (void)real_dlsym();
    (void)active();
}

/* At exit the driver frees everything: give the slot back at once. Threads still allocating
 * after this count in local_used (the mapping stays: they may hold its address). A child made
 * without the fork handlers (clone) has the parent's slot: the pid check leaves it alone. */
__attribute__((destructor)) static void share_fini(void) {
    struct state_file *f = atomic_load(&sf);
    int s = atomic_load(&my_slot);
    uint64_t me = atomic_load(&my_owner);
    if (!f || s < 0 || (pid_t)(uint32_t)me != getpid()) return;
    atomic_store(&my_slot, -1);
    atomic_store(&sf, NULL);
    if (atomic_load(&f->slot[s].owner) != me) return;
    for (int g = 0; g < MAX_GPUS; g++) atomic_store(&f->slot[s].used[g], 0);
    atomic_store(&f->slot[s].owner, 0);
}

/* ---- the view: total and free memory ----------------------------------------------------- */

static CUresult h_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    pfn_total_v2 real = REAL(cuDeviceTotalMem_v2, pfn_total_v2);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = real(bytes, dev);
    if (r != CUDA_SUCCESS || !bytes || !active()) return r;
    int g = gpu_of_device(dev);
    if (g >= 0) *bytes = (size_t)cfg.gpu[g].bytes;
    return r;
}

static CUresult h_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    pfn_total_v1 real = REAL(cuDeviceTotalMem, pfn_total_v1);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = real(bytes, dev);
    if (r != CUDA_SUCCESS || !bytes || !active()) return r;
    int g = gpu_of_device(dev);
    if (g >= 0) *bytes = cfg.gpu[g].bytes > UINT_MAX ? UINT_MAX : (unsigned int)cfg.gpu[g].bytes;
    return r;
}

static CUresult h_cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    pfn_info_v2 real = REAL(cuMemGetInfo_v2, pfn_info_v2);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = real(free_bytes, total);
    if (r != CUDA_SUCCESS || !free_bytes || !total || !active()) return r;
    int g = gpu_current();
    if (g < 0) return r;
    uint64_t left = left_of_share(g);
    if ((uint64_t)*free_bytes > left) *free_bytes = (size_t)left;
    *total = (size_t)cfg.gpu[g].bytes;
    return r;
}

static CUresult h_cuMemGetInfo(unsigned int *free_bytes, unsigned int *total) {
    pfn_info_v1 real = REAL(cuMemGetInfo, pfn_info_v1);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = real(free_bytes, total);
    if (r != CUDA_SUCCESS || !free_bytes || !total || !active()) return r;
    int g = gpu_current();
    if (g < 0) return r;
    uint64_t left = left_of_share(g), share = cfg.gpu[g].bytes;
    if (*free_bytes > left) *free_bytes = (unsigned int)left;
    *total = share > UINT_MAX ? UINT_MAX : (unsigned int)share;
    return r;
}

/* ---- allocations ------------------------------------------------------------------------- */

static CUresult h_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    pfn_alloc real = REAL(cuMemAlloc_v2, pfn_alloc);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(dptr, bytes);
    int g = gpu_current(), begun = alloc_begin(g, bytes);
    if (begun < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, bytes);
    alloc_end(begun, r, KIND_POINTER, r == CUDA_SUCCESS ? *dptr : 0, g, bytes);
    return r;
}

static CUresult h_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                     size_t height, unsigned int element) {
    pfn_pitch real = REAL(cuMemAllocPitch_v2, pfn_pitch);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(dptr, pitch, width, height, element);
    size_t asked = 0;
    int g = gpu_current(), begun = 0;
    if (!__builtin_mul_overflow(width, height, &asked)) begun = alloc_begin(g, asked);
    if (begun < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, pitch, width, height, element);
    if (begun == 1 && r == CUDA_SUCCESS) {
        /* the driver's pitch decides the size: count the difference (not refused afterwards) */
        size_t got;
        if (!__builtin_mul_overflow(*pitch, height, &got) && got > asked) {
            atomic_fetch_add(own_counter(g), (int64_t)(got - asked));
            asked = got;
        }
    }
    alloc_end(begun, r, KIND_POINTER, r == CUDA_SUCCESS ? *dptr : 0, g, asked);
    return r;
}

static CUresult h_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    pfn_managed real = REAL(cuMemAllocManaged, pfn_managed);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(dptr, bytes, flags);
    int g = gpu_current(), begun = alloc_begin(g, bytes);
    if (begun < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, bytes, flags);
    alloc_end(begun, r, KIND_POINTER, r == CUDA_SUCCESS ? *dptr : 0, g, bytes);
    return r;
}

static CUresult alloc_async(pfn_async real, CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(dptr, bytes, stream);
    int g = gpu_current(), begun = alloc_begin(g, bytes);
    if (begun < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, bytes, stream);
    alloc_end(begun, r, KIND_POINTER, r == CUDA_SUCCESS ? *dptr : 0, g, bytes);
    return r;
}

static CUresult h_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    return alloc_async(REAL(cuMemAllocAsync, pfn_async), dptr, bytes, stream);
}

static CUresult h_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    return alloc_async(REAL(cuMemAllocAsync_ptsz, pfn_async), dptr, bytes, stream);
}

/* Counted on the current context's GPU (a pool of another GPU is counted there too). */
static CUresult alloc_pool(pfn_pool real, CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                           CUstream stream) {
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(dptr, bytes, pool, stream);
    int g = gpu_current(), begun = alloc_begin(g, bytes);
    if (begun < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, bytes, pool, stream);
    alloc_end(begun, r, KIND_POINTER, r == CUDA_SUCCESS ? *dptr : 0, g, bytes);
    return r;
}

static CUresult h_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                          CUstream stream) {
    return alloc_pool(REAL(cuMemAllocFromPoolAsync, pfn_pool), dptr, bytes, pool, stream);
}

static CUresult h_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                               CUmemoryPool pool, CUstream stream) {
    return alloc_pool(REAL(cuMemAllocFromPoolAsync_ptsz, pfn_pool), dptr, bytes, pool, stream);
}

static CUresult h_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                              const CUmemAllocationProp *prop, unsigned long long flags) {
    pfn_create real = REAL(cuMemCreate, pfn_create);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(handle, bytes, prop, flags);
    int g = -1;
    if (prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        g = gpu_of_device(prop->location.id);
    int begun = alloc_begin(g, bytes);
    if (begun < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(handle, bytes, prop, flags);
    alloc_end(begun, r, KIND_HANDLE, r == CUDA_SUCCESS ? *handle : 0, g, bytes);
    return r;
}

/* ---- frees ------------------------------------------------------------------------------- */

static CUresult h_cuMemFree_v2(CUdeviceptr dptr) {
    pfn_free real = REAL(cuMemFree_v2, pfn_free);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(dptr);
    struct entry e;
    bool had = free_begin(KIND_POINTER, dptr, &e);
    CUresult r = real(dptr);
    free_end(had, r, &e);
    return r;
}

static CUresult free_async(pfn_free_async real, CUdeviceptr dptr, CUstream stream) {
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(dptr, stream);
    struct entry e;
    bool had = free_begin(KIND_POINTER, dptr, &e);
    CUresult r = real(dptr, stream);
    free_end(had, r, &e);
    return r;
}

static CUresult h_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    return free_async(REAL(cuMemFreeAsync, pfn_free_async), dptr, stream);
}

static CUresult h_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    return free_async(REAL(cuMemFreeAsync_ptsz, pfn_free_async), dptr, stream);
}

static CUresult h_cuMemRelease(CUmemGenericAllocationHandle handle) {
    pfn_release real = REAL(cuMemRelease, pfn_release);
    if (!real) return CUDA_ERROR_NOT_SUPPORTED;
    if (!active()) return real(handle);
    struct entry e;
    bool had = free_begin(KIND_HANDLE, handle, &e);
    CUresult r = real(handle);
    free_end(had, r, &e);
    return r;
}

/* ---- NVML (what nvidia-smi reads) -------------------------------------------------------- */

/* The view of NVML device dev: false when it is not a listed GPU (or the view is off), else
 * its share and what the container's processes hold, in bytes. */
static bool nvml_share(nvmlDevice_t dev, uint64_t *share, uint64_t *used) {
    if (!active()) return false;
    int g = gpu_of_nvml(dev);
    if (g < 0) return false;
    *share = cfg.gpu[g].bytes;
    *used = used_total(g);
    return true;
}

static nvmlReturn_t h_nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    pfn_nvml_mem real = REAL(nvmlDeviceGetMemoryInfo, pfn_nvml_mem);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(dev, mem);
    uint64_t share, used;
    if (r != NVML_SUCCESS || !mem || !nvml_share(dev, &share, &used)) return r;
    mem->total = share;
    mem->used = used;
    mem->free = used < share ? share - used : 0;
    return r;
}

static nvmlReturn_t h_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    pfn_nvml_mem_v2 real = REAL(nvmlDeviceGetMemoryInfo_v2, pfn_nvml_mem_v2);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(dev, mem);
    uint64_t share, used;
    if (r != NVML_SUCCESS || !mem || !nvml_share(dev, &share, &used)) return r;
    mem->total = share;
    /* the driver's reservation is the card's, not the share's: total = used + free */
    mem->reserved = 0;
    mem->used = used;
    mem->free = used < share ? share - used : 0;
    return r;
}

/* ---- cuGetProcAddress: how CUDA 11.3+ runtimes find every driver entry point -------------- */

/* A base name the runtime asks for, and which of our functions answers it: at versions >=
 * split the newer variant (or, for the stream-ordered ones, the per-thread-default-stream
 * variant when that is what the driver answered), else the older (-1: not interposed). */
static const struct family {
    const char *base;
    int split;
    int newer, older;
    bool per_thread;
} families[] = {
    {"cuDeviceTotalMem", 3020, F_cuDeviceTotalMem_v2, F_cuDeviceTotalMem, false},
    {"cuMemGetInfo", 3020, F_cuMemGetInfo_v2, F_cuMemGetInfo, false},
    {"cuMemAlloc", 3020, F_cuMemAlloc_v2, -1, false},
    {"cuMemAllocPitch", 3020, F_cuMemAllocPitch_v2, -1, false},
    {"cuMemFree", 3020, F_cuMemFree_v2, -1, false},
    {"cuMemAllocManaged", 0, F_cuMemAllocManaged, -1, false},
    {"cuMemCreate", 0, F_cuMemCreate, -1, false},
    {"cuMemRelease", 0, F_cuMemRelease, -1, false},
    {"cuMemAllocAsync", 0, F_cuMemAllocAsync_ptsz, F_cuMemAllocAsync, true},
    {"cuMemAllocFromPoolAsync", 0, F_cuMemAllocFromPoolAsync_ptsz, F_cuMemAllocFromPoolAsync,
     true},
    {"cuMemFreeAsync", 0, F_cuMemFreeAsync_ptsz, F_cuMemFreeAsync, true},
    {"cuGetProcAddress", 12000, F_cuGetProcAddress_v2, F_cuGetProcAddress, false},
};

static void *const hook_impl[N_HOOKED];

static bool is_ours(const void *p) {
    for (int i = 0; i < N_HOOKED; i++)
        if (hook_impl[i] == p) return true;
    return false;
}

static int hooked_id(const char *name) {
    for (int i = 0; i < N_HOOKED; i++)
        if (strcmp(fn_name[i], name) == 0) return i;
    return -1;
}

/* The driver answered found for symbol: our function in its place when we interpose it. */
static void *proc_substitute(const char *symbol, int version, cuuint64_t flags, void *found) {
    if (is_ours(found)) return found;
    int id = -1;
    const struct family *f = NULL;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i].base, symbol) == 0) f = &families[i];
    if (f && f->per_thread) {
        if (found == real_fn(f->newer)) id = f->newer;
        else if (found == real_fn(f->older)) id = f->older;
        else id = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? f->newer : f->older;
    } else if (f) {
        id = version >= f->split ? f->newer : f->older;
    } else {
        id = hooked_id(symbol); /* a full name such as "cuMemGetInfo_v2" */
        if (id >= 0 && fn_lib[id] != LIB_CUDA) id = -1;
    }
    if (id < 0) return found;
    set_real(id, found);
    return hook_impl[id];
}

static CUresult h_cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags, int *status);

static CUresult h_cuGetProcAddress(const char *symbol, void **pfn, int version,
                                   cuuint64_t flags) {
    pfn_gpa_v1 real = REAL(cuGetProcAddress, pfn_gpa_v1);
    if (!real) {
        pfn_gpa_v2 newer = REAL(cuGetProcAddress_v2, pfn_gpa_v2);
        if (newer) return h_cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
        if (pfn) *pfn = NULL;
        return CUDA_ERROR_NOT_FOUND;
    }
    CUresult r = real(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn && active())
        *pfn = proc_substitute(symbol, version, flags, *pfn);
    return r;
}

static CUresult h_cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags, int *status) {
    pfn_gpa_v2 real = REAL(cuGetProcAddress_v2, pfn_gpa_v2);
    CUresult r;
    if (real) {
        r = real(symbol, pfn, version, flags, status);
    } else { /* a driver older than CUDA 12: the same question without the status */
        pfn_gpa_v1 older = REAL(cuGetProcAddress, pfn_gpa_v1);
        if (!older) {
            if (pfn) *pfn = NULL;
            if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            return CUDA_ERROR_NOT_FOUND;
        }
        r = older(symbol, pfn, version, flags);
        if (status)
            *status = r == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS
                                        : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn && active())
        *pfn = proc_substitute(symbol, version, flags, *pfn);
    return r;
}

#define AS_IMPL(name, lib) (void *)h_##name,
static void *const hook_impl[N_HOOKED] = {HOOKED(AS_IMPL)};

/* ---- dlsym: programs that dlopen libcuda / libnvidia-ml and look the names up ------------ */

/* For a lookup in a library handle (not RTLD_DEFAULT / RTLD_NEXT, which the dynamic linker
 * already answers with this library's symbols or the next ones): our function when symbol is
 * one we interpose and the handle's answer is the driver's own; NULL to let dlsym answer. */
static void *dlsym_substitute(void *handle, const char *symbol, pfn_dlsym real) {
    int id = hooked_id(symbol);
    if (id < 0 || !active()) return NULL;
    void *p = real(handle, symbol);
    if (!p || is_ours(p)) return p;
    Dl_info info;
    if (!dladdr(p, &info) || !info.dli_fname || !named_like(info.dli_fname, fn_lib[id]))
        return NULL; /* another interposer's: leave its chain alone */
    note_library(p, fn_lib[id]);
    set_real(id, p);
    return hook_impl[id];
}

/* The lookups that return straight to dlsym are tail calls (a jump at -O2): glibc reads its
 * caller's address to resolve RTLD_NEXT and RTLD_DEFAULT, and must see the program's. */
__attribute__((visibility("default"))) void *dlsym(void *handle, const char *symbol) {
    pfn_dlsym real = real_dlsym();
    if (!real) return NULL;
    const char *s = symbol;
    __asm__("" : "+r"(s)); /* dlfcn.h declares symbol nonnull; a caller may still pass NULL */
    if (handle != RTLD_DEFAULT && handle != RTLD_NEXT && s &&
        ((s[0] == 'c' && s[1] == 'u') || (s[0] == 'n' && s[1] == 'v'))) {
        void *mine = dlsym_substitute(handle, s, real);
        if (mine) return mine;
    }
    return real(handle, symbol);
}

/* ---- the exported names ------------------------------------------------------------------ */

EXPORT_AS(cuDeviceTotalMem_v2, h_cuDeviceTotalMem_v2)
EXPORT_AS(cuDeviceTotalMem, h_cuDeviceTotalMem)
EXPORT_AS(cuMemGetInfo_v2, h_cuMemGetInfo_v2)
EXPORT_AS(cuMemGetInfo, h_cuMemGetInfo)
EXPORT_AS(cuMemAlloc_v2, h_cuMemAlloc_v2)
EXPORT_AS(cuMemAllocPitch_v2, h_cuMemAllocPitch_v2)
EXPORT_AS(cuMemAllocManaged, h_cuMemAllocManaged)
EXPORT_AS(cuMemAllocAsync, h_cuMemAllocAsync)
EXPORT_AS(cuMemAllocAsync_ptsz, h_cuMemAllocAsync_ptsz)
EXPORT_AS(cuMemAllocFromPoolAsync, h_cuMemAllocFromPoolAsync)
EXPORT_AS(cuMemAllocFromPoolAsync_ptsz, h_cuMemAllocFromPoolAsync_ptsz)
EXPORT_AS(cuMemCreate, h_cuMemCreate)
EXPORT_AS(cuMemFree_v2, h_cuMemFree_v2)
EXPORT_AS(cuMemFreeAsync, h_cuMemFreeAsync)
EXPORT_AS(cuMemFreeAsync_ptsz, h_cuMemFreeAsync_ptsz)
EXPORT_AS(cuMemRelease, h_cuMemRelease)
EXPORT_AS(cuGetProcAddress, h_cuGetProcAddress)
EXPORT_AS(cuGetProcAddress_v2, h_cuGetProcAddress_v2)
EXPORT_AS(nvmlDeviceGetMemoryInfo, h_nvmlDeviceGetMemoryInfo)
EXPORT_AS(nvmlDeviceGetMemoryInfo_v2, h_nvmlDeviceGetMemoryInfo_v2)
