/*
 * A fake libnvidia-ml.so.1 for tests: the real pynvml bindings load it with
 * ctypes (CDLL("libnvidia-ml.so.1") via LD_LIBRARY_PATH), so the real structs,
 * error codes and lazy symbol lookup are exercised without a GPU.
 *
 * Configuration: the file named by $FAKE_NVML_CONFIG, read at every init.
 * One item per line, space-separated key=value tokens ("..." for spaces), # comments:
 *
 *   driver version=590.48.01
 *   gpu name="NVIDIA RTX PRO 6000 Blackwell Server Edition" uuid=GPU-0 bus=00000000:01:00.0
 *       total_mib=97887 reserved_mib=0 used_mib=0 temp=28 power_mw=84000
 *       ecc_volatile=0 retired_pending=0 remap_pending=0 remap_failure=0
 *       unsupported=ecc,retired,remap,temp,power
 *   holder comm=vllm-serve cmdline=TOKEN mib=72289 gpus=0,1,2 graphics=0 hidden=0
 *
 * A holder's memory counts only while a live (non-zombie) process matches it:
 * comm equal to `comm` and/or the NUL-joined-with-spaces cmdline containing
 * `cmdline`. Every matching process holds `mib` on each listed GPU, so stopping
 * a unit or killing a process really frees its "GPU memory". `hidden=1` counts
 * the memory but keeps the process out of the running-process lists (as NVML
 * in a container shows PIDs of another namespace); `graphics=1` lists it as a
 * graphics instead of a compute process.
 *
 * Build with -DFAKE_OLD_DRIVER to leave out the _v3 process queries and
 * nvmlDeviceGetMemoryInfo_v2 (drivers < 510): pynvml then raises FunctionNotFound.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_HOLDERS 64
#define MAX_PROCS 4096
#define MIB (1024ULL * 1024ULL)
#define NVML_MEMORY_V2 0x02000028u

typedef struct {
    char name[96], uuid[96], bus[32];
    unsigned long long total_mib, reserved_mib, used_mib;
    unsigned temp, power_mw;
    unsigned long long ecc_volatile;
    int retired_pending, remap_pending, remap_failure;
    int unsup_ecc, unsup_retired, unsup_remap, unsup_temp, unsup_power;
    unsigned index;
} fake_gpu;

typedef struct {
    char comm[64], cmdline[256];
    unsigned long long mib;
    int gpus[MAX_GPUS], ngpus;
    int graphics, hidden;
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

typedef fake_gpu *nvmlDevice_t;

static fake_gpu gpus[MAX_GPUS];
static unsigned ngpus;
static fake_holder holders[MAX_HOLDERS];
static unsigned nholders;
static char driver_version[80] = "590.48.01";
static int initialised;

/* --- config ------------------------------------------------------------------ */

/* Next token of `*p` into key/value; returns 0 at end of line. */
static int next_token(char **p, char *key, size_t klen, char *val, size_t vlen) {
    char *s = *p;
    while (*s && isspace((unsigned char)*s)) s++;
    if (!*s || *s == '#') return 0;
    size_t k = 0;
    while (*s && *s != '=' && !isspace((unsigned char)*s)) { if (k + 1 < klen) key[k++] = *s; s++; }
    key[k] = 0;
    size_t v = 0;
    if (*s == '=') {
        s++;
        if (*s == '"') {
            s++;
            while (*s && *s != '"') { if (v + 1 < vlen) val[v++] = *s; s++; }
            if (*s == '"') s++;
        } else {
            while (*s && !isspace((unsigned char)*s)) { if (v + 1 < vlen) val[v++] = *s; s++; }
        }
    }
    val[v] = 0;
    *p = s;
    return 1;
}

static int has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *s = list; (s = strstr(s, word)); s += n)
        if ((s == list || s[-1] == ',') && (s[n] == 0 || s[n] == ',')) return 1;
    return 0;
}

static unsigned hang_init_s; /* `driver hang_init_s=N`: nvmlInit blocks N seconds */

static int load_config(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (!path) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    ngpus = nholders = 0;
    char line[2048], key[64], val[512];
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        if (!next_token(&p, key, sizeof key, val, sizeof val)) continue;
        if (!strcmp(key, "driver")) {
            while (next_token(&p, key, sizeof key, val, sizeof val))
                if (!strcmp(key, "version")) snprintf(driver_version, sizeof driver_version, "%s", val);
                else if (!strcmp(key, "hang_init_s")) hang_init_s = (unsigned)strtoul(val, NULL, 10);
        } else if (!strcmp(key, "gpu") && ngpus < MAX_GPUS) {
            fake_gpu *g = &gpus[ngpus];
            memset(g, 0, sizeof *g);
            g->index = ngpus;
            snprintf(g->name, sizeof g->name, "Fake GPU");
            snprintf(g->uuid, sizeof g->uuid, "GPU-fake-%u", ngpus);
            snprintf(g->bus, sizeof g->bus, "00000000:%02X:00.0", ngpus + 1);
            g->total_mib = 16384;
            while (next_token(&p, key, sizeof key, val, sizeof val)) {
                unsigned long long n = strtoull(val, NULL, 10);
                if (!strcmp(key, "name")) snprintf(g->name, sizeof g->name, "%s", val);
                else if (!strcmp(key, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", val);
                else if (!strcmp(key, "bus")) snprintf(g->bus, sizeof g->bus, "%s", val);
                else if (!strcmp(key, "total_mib")) g->total_mib = n;
                else if (!strcmp(key, "reserved_mib")) g->reserved_mib = n;
                else if (!strcmp(key, "used_mib")) g->used_mib = n;
                else if (!strcmp(key, "temp")) g->temp = (unsigned)n;
                else if (!strcmp(key, "power_mw")) g->power_mw = (unsigned)n;
                else if (!strcmp(key, "ecc_volatile")) g->ecc_volatile = n;
                else if (!strcmp(key, "retired_pending")) g->retired_pending = (int)n;
                else if (!strcmp(key, "remap_pending")) g->remap_pending = (int)n;
                else if (!strcmp(key, "remap_failure")) g->remap_failure = (int)n;
                else if (!strcmp(key, "unsupported")) {
                    g->unsup_ecc = has_word(val, "ecc");
                    g->unsup_retired = has_word(val, "retired");
                    g->unsup_remap = has_word(val, "remap");
                    g->unsup_temp = has_word(val, "temp");
                    g->unsup_power = has_word(val, "power");
                }
            }
            ngpus++;
        } else if (!strcmp(key, "holder") && nholders < MAX_HOLDERS) {
            fake_holder *h = &holders[nholders];
            memset(h, 0, sizeof *h);
            while (next_token(&p, key, sizeof key, val, sizeof val)) {
                if (!strcmp(key, "comm")) snprintf(h->comm, sizeof h->comm, "%s", val);
                else if (!strcmp(key, "cmdline")) snprintf(h->cmdline, sizeof h->cmdline, "%s", val);
                else if (!strcmp(key, "mib")) h->mib = strtoull(val, NULL, 10);
                else if (!strcmp(key, "graphics")) h->graphics = atoi(val);
                else if (!strcmp(key, "hidden")) h->hidden = atoi(val);
                else if (!strcmp(key, "gpus")) {
                    for (char *s = val; *s && h->ngpus < MAX_GPUS;) {
                        h->gpus[h->ngpus++] = (int)strtol(s, &s, 10);
                        if (*s == ',') s++; else break;
                    }
                }
            }
            if (h->comm[0] || h->cmdline[0]) nholders++;
        }
    }
    fclose(f);
    return 0;
}

/* --- live processes ------------------------------------------------------------ */

typedef struct { unsigned pid; int holder; } match_t;

static int read_file(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = 0;
    return (int)n;
}

/* Every (live process, holder) pair that matches, scanning /proc now. */
static int scan(match_t *out, int max) {
    int n = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    char path[64], stat[1024], comm[64], cmd[4096];
    while ((e = readdir(d)) && n < max) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        if (read_file(path, stat, sizeof stat) <= 0) continue;
        char *rp = strrchr(stat, ')');
        if (!rp || rp[1] != ' ' || rp[2] == 'Z' || rp[2] == 'X') continue; /* a zombie holds nothing */
        snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
        if (read_file(path, comm, sizeof comm) < 0) continue;
        comm[strcspn(comm, "\n")] = 0;
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        int len = read_file(path, cmd, sizeof cmd);
        if (len < 0) continue;
        for (int i = 0; i < len; i++) if (!cmd[i]) cmd[i] = ' ';
        for (unsigned h = 0; h < nholders && n < max; h++) {
            if (holders[h].comm[0] && strcmp(holders[h].comm, comm)) continue;
            if (holders[h].cmdline[0] && !strstr(cmd, holders[h].cmdline)) continue;
            out[n].pid = (unsigned)strtoul(e->d_name, NULL, 10);
            out[n].holder = (int)h;
            n++;
        }
    }
    closedir(d);
    return n;
}

static int holds(const fake_holder *h, unsigned gpu) {
    for (int i = 0; i < h->ngpus; i++) if (h->gpus[i] == (int)gpu) return 1;
    return 0;
}

static unsigned long long used_bytes(const fake_gpu *g) {
    static match_t m[MAX_PROCS];
    int n = scan(m, MAX_PROCS);
    unsigned long long used = g->used_mib * MIB;
    for (int i = 0; i < n; i++)
        if (holds(&holders[m[i].holder], g->index)) used += holders[m[i].holder].mib * MIB;
    return used;
}

static nvmlReturn_t processes(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos, int graphics) {
    static match_t m[MAX_PROCS];
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!dev || !count) return NVML_ERROR_INVALID_ARGUMENT;
    int n = scan(m, MAX_PROCS);
    unsigned found = 0;
    for (int i = 0; i < n; i++) {
        const fake_holder *h = &holders[m[i].holder];
        if (h->hidden || h->graphics != graphics || !holds(h, dev->index)) continue;
        if (infos && found < *count) {
            infos[found].pid = m[i].pid;
            infos[found].usedGpuMemory = h->mib * MIB;
            infos[found].gpuInstanceId = 0xFFFFFFFFu;
            infos[found].computeInstanceId = 0xFFFFFFFFu;
        }
        found++;
    }
    if (!infos || found > *count) {
        *count = found;
        return found ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    *count = found;
    return NVML_SUCCESS;
}

/* --- the NVML API (only what pynvml calls for reconcile) -------------------------- */

#define CHECK_DEV(dev) do { if (!initialised) return NVML_ERROR_UNINITIALIZED; \
    if (!(dev)) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (load_config() != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    /* A wedged driver (a GPU fallen off the bus) can block nvmlInit for minutes. */
    if (hang_init_s) sleep(hang_init_s);
    initialised++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!version || length <= strlen(driver_version)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, driver_version);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_str(const char *src, char *dst, unsigned int length) {
    if (!dst || length <= strlen(src)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    CHECK_DEV(dev);
    return copy_str(dev->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    CHECK_DEV(dev);
    return copy_str(dev->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    CHECK_DEV(dev);
    *minor = dev->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    CHECK_DEV(dev);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", dev->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", dev->bus + (strlen(dev->bus) > 12 ? 4 : 0));
    sscanf(dev->bus, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x2bb510de;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    CHECK_DEV(dev);
    /* v1 counts the driver's reservation as used, as old drivers do */
    unsigned long long used = used_bytes(dev) + dev->reserved_mib * MIB, total = dev->total_mib * MIB;
    mem->total = total;
    mem->used = used;
    mem->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    CHECK_DEV(dev);
    if (mem->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = used_bytes(dev), total = dev->total_mib * MIB, reserved = dev->reserved_mib * MIB;
    mem->total = total;
    mem->reserved = reserved;
    mem->used = used;
    mem->free = used + reserved < total ? total - used - reserved : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes(dev, count, infos, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes(dev, count, infos, 1);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes(dev, count, infos, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes(dev, count, infos, 1);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp) {
    CHECK_DEV(dev);
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (dev->unsup_temp) return NVML_ERROR_NOT_SUPPORTED;
    *temp = dev->temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power) {
    CHECK_DEV(dev);
    if (dev->unsup_power) return NVML_ERROR_NOT_SUPPORTED;
    *power = dev->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int errorType, int counterType,
                                         unsigned long long *count) {
    CHECK_DEV(dev);
    if (dev->unsup_ecc) return NVML_ERROR_NOT_SUPPORTED;
    /* only volatile (0) uncorrected (1) counts are configured; everything else reads 0 */
    *count = (errorType == 1 && counterType == 0) ? dev->ecc_volatile : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, int *pending) {
    CHECK_DEV(dev);
    if (dev->unsup_retired) return NVML_ERROR_NOT_SUPPORTED;
    *pending = dev->retired_pending ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned *corr, unsigned *unc, unsigned *pending,
                                       unsigned *failure) {
    CHECK_DEV(dev);
    if (dev->unsup_remap) return NVML_ERROR_NOT_SUPPORTED;
    *corr = 0;
    *unc = 0;
    *pending = (unsigned)dev->remap_pending;
    *failure = (unsigned)dev->remap_failure;
    return NVML_SUCCESS;
}
