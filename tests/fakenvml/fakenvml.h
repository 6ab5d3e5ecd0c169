/* Shared by fakenvml.c (config, processes, the core queries), fakenvml_more.c (field values,
 * clock events, PCIe, NVLink, VBIOS, persistence, MIG) and fakenvml_settings.c (the settings'
 * getters and setters, the state kept between processes, the call log): see fakenvml.c for the
 * configuration. */
#ifndef FAKENVML_H
#define FAKENVML_H
#include <stddef.h>
#include <stdint.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_HOLDERS 64
#define MAX_PROCS 4096
#define MAX_LINKS 36
#define MAX_MIG 8
#define MAX_MEM_CLOCKS 8
#define MAX_GR_CLOCKS 256
#define MIB (1024ULL * 1024ULL)
#define NVML_MEMORY_V2 0x02000028u
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define NO_INSTANCE 0xFFFFFFFFu

typedef struct fake_gpu fake_gpu;

typedef struct {
    fake_gpu *parent;
    unsigned gi, ci;
    unsigned long long total_mib;
    char uuid[112];
} fake_mig;

struct fake_gpu {
    char name[96], uuid[96], bus[32], vbios[32];
    unsigned long long total_mib, reserved_mib, used_mib;
    unsigned temp, power_mw, minor, recovery, persistence;
    unsigned long long ecc_volatile, ecc_corrected, clocks_event, clocks_supported;
    int retired_pending, remap_pending, remap_failure;
    unsigned pcie[5];
    int nlinks, links[MAX_LINKS];
    int mig, nmig;
    fake_mig migs[MAX_MIG];
    nvmlReturn_t error;
    char error_on[256], unsupported[256];
    unsigned index;
    /* Settings (fakenvml_settings.c): power in milliwatts, clocks in MHz; locked 0,0 = none. */
    unsigned power_limit_mw, power_default_mw, power_min_mw, power_max_mw, compute_mode;
    unsigned app_mem, app_gr, app_default_mem, app_default_gr, locked_min, locked_max;
    unsigned mem_clocks[MAX_MEM_CLOCKS], gr_clocks[MAX_GR_CLOCKS];
    int nmem_clocks, ngr_clocks;
    unsigned clock_gr; /* the graphics clock the GPU runs at when nothing holds it (locked clocks clamp it) */
    int mig_pending, ecc, ecc_pending;
    char fail[256];    /* call:error,... : that call alone returns that error */
    char lose_on[64];  /* the GPU falls off the bus at this call: lost from then on, in every process */
    char hang_on[64];  /* this call blocks (a wedged driver) */
};

typedef struct {
    char comm[64], cmdline[256];
    unsigned long long mib;
    int gpus[MAX_GPUS], ngpus;
    int graphics, both, mem_na, hidden, gi, ci;
} fake_holder;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef union { double dVal; unsigned uiVal; unsigned long ulVal; unsigned long long ullVal;
                long long sllVal; int siVal; unsigned short usVal; } nvmlValue_t;
typedef struct {
    uint32_t fieldId, scopeId;
    int64_t timestamp, latencyUsec;
    unsigned valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef void *nvmlDevice_t;

extern fake_gpu gpus[MAX_GPUS];
extern unsigned ngpus;
extern fake_holder holders[MAX_HOLDERS];
extern unsigned nholders;
extern int initialised;

int has_word(const char *list, const char *word);
int next_token(char **p, char *key, size_t klen, char *val, size_t vlen);
nvmlReturn_t error_code(const char *name);
const char *error_name(nvmlReturn_t code);
int parse_list(const char *val, unsigned *out, int max);
const char *driver(void);
/* Holders alive on GPU g now (a MIG change or a reset is refused while any is). */
int busy(const fake_gpu *g);
/* fakenvml_settings.c: defaults, config keys, the state file written by setters and read at init. */
void settings_defaults(fake_gpu *g);
int settings_key(fake_gpu *g, const char *key, const char *val);
void settings_finish(fake_gpu *g);
int load_config(void);
void load_state(void);
void save_state(void);
void log_call(const char *call, const fake_gpu *g, const char *args, nvmlReturn_t rc);
void gpu_key(fake_gpu *g, const char *key, const char *val);
fake_gpu *as_gpu(nvmlDevice_t dev);
fake_mig *as_mig(nvmlDevice_t dev);
/* The error a call on this GPU returns: not initialised, a bad handle, or the injected one. */
nvmlReturn_t check(fake_gpu *g, const char *call);
int unsupported(const fake_gpu *g, const char *what);
nvmlReturn_t copy_str(const char *src, char *dst, unsigned int length);

#define CHECK(g, call) do { nvmlReturn_t r_ = check((g), (call)); if (r_) return r_; } while (0)
#endif
