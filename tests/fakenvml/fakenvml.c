/*
 * A fake libnvidia-ml.so.1 for tests: the real pynvml bindings load it with
 * ctypes (CDLL("libnvidia-ml.so.1") via LD_LIBRARY_PATH), so the real structs,
 * error codes and lazy symbol lookup are exercised without a GPU. It models what
 * real hardware does that a happy-path fake would not (docs/gpus.md lists the
 * sources): minor numbers that differ from indices, memory NOT_SUPPORTED
 * (GB10/Grace unified memory), processes in both the compute and the graphics
 * list ("C+G"), per-process memory NVML_VALUE_NOT_AVAILABLE, GPU_IS_LOST /
 * RESET_REQUIRED from any call, nvmlInit failing, MIG with remapped rows not
 * supported, field values (recovery action, NVLink link count), clock-event
 * (throttle) reasons, PCIe and NVLink.
 *
 * Configuration: the file named by $FAKE_NVML_CONFIG, read at every init.
 * One item per line, space-separated key=value tokens ("..." for spaces), # comments:
 *
 *   driver version=590.48.01 cuda=13010 init_error=lib_rm_mismatch hang_init_s=0
 *   gpu name="NVIDIA RTX PRO 6000 Blackwell Server Edition" uuid=GPU-0 bus=00000000:01:00.0
 *       minor=3 total_mib=97887 reserved_mib=0 used_mib=0 temp=28 power_mw=84000
 *       ecc_volatile=0 ecc_corrected=0 retired_pending=0 remap_pending=0 remap_failure=0
 *       recovery=0 vbios=98.02.2E.00.01 persistence=1 clocks_event=0x1 clocks_supported=0x1ff
 *       pcie=1,5,5,16,16 (current gen, max gen, GPU max gen, current width, max width)
 *       nvlink=1,1,0,1 (one active flag per link; absent: no NVLink, NOT_SUPPORTED)
 *       mig=1 mig_instances=1:0:40192,2:0:40192 (gpu instance:compute instance:MiB)
 *       error=lost|reset_required|unknown|no_permission error_on=all|handle,memory,...
 *       unsupported=ecc,retired,remap,temp,power,memory,vbios,persistence,pcie,clocks,recovery,minor
 *   holder comm=vllm-serve cmdline=TOKEN mib=72289 gpus=0,1,2 graphics=0 both=0 mem_na=0 hidden=0 gi=1
 *
 * A holder's memory counts only while a live (non-zombie) process matches it:
 * comm equal to `comm` and/or the NUL-joined-with-spaces cmdline containing
 * `cmdline`. Every matching process holds `mib` on each listed GPU, so stopping
 * a unit or killing a process really frees its "GPU memory". `hidden=1` counts
 * the memory but keeps the process out of the running-process lists (as NVML
 * in a container shows PIDs of another namespace); `graphics=1` lists it as a
 * graphics instead of a compute process, `both=1` in both lists (C+G);
 * `mem_na=1` reports its usedGpuMemory as NVML_VALUE_NOT_AVAILABLE; `gi=N` puts
 * it in MIG GPU instance N. fakenvml_procs.c finds them ($FAKE_NVML_COUNT: a file
 * where each scan of /proc and each process-list call is counted).
 *
 * `error=` with `error_on=` makes the named calls (or all, including the handle
 * lookup) return that error, as a GPU that fell off the bus does; call names:
 * handle name uuid pci minor memory processes temp power ecc retired remap
 * fields clocks pcie nvlink vbios persistence mig, and the settings' calls of
 * fakenvml_settings.c. `fail=set_power:no_permission,set_ecc:not_supported`
 * fails one call with one error each; `lose_on=set_power` makes the GPU fall
 * off the bus at that call (lost from then on, in every process).
 *
 * Settings (fakenvml_settings.c documents their keys) are kept per GPU in
 * $FAKE_NVML_CONFIG.state, written atomically by every setter and read after the
 * config at every init, so what one process set the next one reads; each setter
 * call is appended to $FAKE_NVML_CONFIG.calls.
 *
 * Build with -DFAKE_OLD_DRIVER to leave out the _v3 process queries,
 * nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetTemperatureV and the ClocksEvent names (drivers < 510), or with
 * -DFAKE_NO_TEMPERATURE_V to leave out only nvmlDeviceGetTemperatureV: pynvml then raises FunctionNotFound.
 *
 * NVML's types, constants and prototypes are nvml.h's own: fakenvml.h includes it (NVIDIA's notice there),
 * tests/nvml_header.py fetches it.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakenvml.h"

fake_gpu gpus[MAX_GPUS];
unsigned ngpus;
fake_holder holders[MAX_HOLDERS];
unsigned nholders;
static char driver_version[80] = "590.48.01";
static int cuda_version = 13010;
static nvmlReturn_t init_error;
static unsigned hang_init_s; /* `driver hang_init_s=N`: nvmlInit blocks N seconds */
int initialised;

/* --- config ------------------------------------------------------------------ */

/* Next token of `*p` into key/value; returns 0 at end of line. */
int next_token(char **p, char *key, size_t klen, char *val, size_t vlen) {
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

int has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *s = list; (s = strstr(s, word)); s += n)
        if ((s == list || s[-1] == ',') && (s[n] == 0 || s[n] == ',')) return 1;
    return 0;
}

/* "a,b,c" of unsigned numbers into out[]; returns how many. */
int parse_list(const char *val, unsigned *out, int max) {
    int n = 0;
    for (char *s = (char *)val; *s && n < max;) {
        out[n++] = (unsigned)strtoul(s, &s, 0);
        if (*s == ',') s++; else break;
    }
    return n;
}

/* One config (or state-file) key of a GPU. */
void gpu_key(fake_gpu *g, const char *key, const char *val) {
    unsigned long long n = strtoull(val, NULL, 0);
    if (!strcmp(key, "name")) snprintf(g->name, sizeof g->name, "%s", val);
    else if (!strcmp(key, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", val);
    else if (!strcmp(key, "bus")) snprintf(g->bus, sizeof g->bus, "%s", val);
    else if (!strcmp(key, "vbios")) snprintf(g->vbios, sizeof g->vbios, "%s", val);
    else if (!strcmp(key, "minor")) g->minor = (unsigned)n;
    else if (!strcmp(key, "total_mib")) g->total_mib = n;
    else if (!strcmp(key, "reserved_mib")) g->reserved_mib = n;
    else if (!strcmp(key, "used_mib")) g->used_mib = n;
    else if (!strcmp(key, "temp")) g->temp = (unsigned)n;
    else if (!strcmp(key, "power_mw")) g->power_mw = (unsigned)n;
    else if (!strcmp(key, "ecc_volatile")) g->ecc_volatile = n;
    else if (!strcmp(key, "ecc_corrected")) g->ecc_corrected = n;
    else if (!strcmp(key, "retired_pending")) g->retired_pending = (int)n;
    else if (!strcmp(key, "remap_pending")) g->remap_pending = (int)n;
    else if (!strcmp(key, "remap_failure")) g->remap_failure = (int)n;
    else if (!strcmp(key, "recovery")) g->recovery = (unsigned)n;
    else if (!strcmp(key, "persistence")) g->persistence = (unsigned)n;
    else if (!strcmp(key, "clocks_event")) g->clocks_event = n;
    else if (!strcmp(key, "clocks_supported")) g->clocks_supported = n;
    else if (!strcmp(key, "pcie")) parse_list(val, g->pcie, 5);
    else if (!strcmp(key, "nvlink")) {
        unsigned flags[MAX_LINKS];
        g->nlinks = parse_list(val, flags, MAX_LINKS);
        for (int i = 0; i < g->nlinks; i++) g->links[i] = (int)flags[i];
    } else if (!strcmp(key, "mig")) g->mig = (int)n;
    else if (!strcmp(key, "mig_instances")) {
        g->nmig = 0;
        for (char *s = (char *)val; *s && g->nmig < MAX_MIG;) {
            fake_mig *m = &g->migs[g->nmig++];
            m->gi = (unsigned)strtoul(s, &s, 10);
            if (*s == ':') s++;
            m->ci = (unsigned)strtoul(s, &s, 10);
            if (*s == ':') s++;
            m->total_mib = strtoull(s, &s, 10);
            if (*s == ',') s++; else break;
        }
    } else if (!strcmp(key, "error")) g->error = error_code(val);
    else if (!strcmp(key, "error_on")) snprintf(g->error_on, sizeof g->error_on, "%s", val);
    else if (!strcmp(key, "unsupported")) snprintf(g->unsupported, sizeof g->unsupported, "%s", val);
    else settings_key(g, key, val);
}

static void parse_gpu(char *p) {
    char key[64], val[1024];
    fake_gpu *g = &gpus[ngpus];
    memset(g, 0, sizeof *g);
    g->index = g->minor = ngpus;
    snprintf(g->name, sizeof g->name, "Fake GPU");
    snprintf(g->uuid, sizeof g->uuid, "GPU-fake-%u", ngpus);
    snprintf(g->bus, sizeof g->bus, "00000000:%02X:00.0", ngpus + 1);
    snprintf(g->vbios, sizeof g->vbios, "98.02.2E.00.01");
    g->total_mib = 16384;
    g->persistence = 1;
    g->clocks_event = 0x1; /* GpuIdle */
    g->clocks_supported = 0x1ff;
    unsigned pcie[5] = {5, 5, 5, 16, 16};
    memcpy(g->pcie, pcie, sizeof pcie);
    g->nlinks = -1; /* no NVLink */
    settings_defaults(g);
    while (next_token(&p, key, sizeof key, val, sizeof val)) gpu_key(g, key, val);
    if (g->error && !g->error_on[0]) snprintf(g->error_on, sizeof g->error_on, "all");
    settings_finish(g);
    for (int i = 0; i < g->nmig; i++) {
        g->migs[i].parent = g;
        snprintf(g->migs[i].uuid, sizeof g->migs[i].uuid, "MIG-%s-%u-%u", g->uuid + (strncmp(g->uuid, "GPU-", 4) ? 0 : 4),
                 g->migs[i].gi, g->migs[i].ci);
    }
    ngpus++;
}

static void parse_holder(char *p) {
    char key[64], val[512];
    fake_holder *h = &holders[nholders];
    memset(h, 0, sizeof *h);
    h->gi = h->ci = -1;
    while (next_token(&p, key, sizeof key, val, sizeof val)) {
        if (!strcmp(key, "comm")) snprintf(h->comm, sizeof h->comm, "%s", val);
        else if (!strcmp(key, "cmdline")) snprintf(h->cmdline, sizeof h->cmdline, "%s", val);
        else if (!strcmp(key, "mib")) h->mib = strtoull(val, NULL, 10);
        else if (!strcmp(key, "graphics")) h->graphics = atoi(val);
        else if (!strcmp(key, "both")) h->both = atoi(val);
        else if (!strcmp(key, "mem_na")) h->mem_na = atoi(val);
        else if (!strcmp(key, "hidden")) h->hidden = atoi(val);
        else if (!strcmp(key, "gi")) h->gi = atoi(val);
        else if (!strcmp(key, "ci")) h->ci = atoi(val);
        else if (!strcmp(key, "gpus")) {
            unsigned list[MAX_GPUS];
            h->ngpus = parse_list(val, list, MAX_GPUS);
            for (int i = 0; i < h->ngpus; i++) h->gpus[i] = (int)list[i];
        }
    }
    if (h->comm[0] || h->cmdline[0]) nholders++;
}

int load_config(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (!path) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    ngpus = nholders = 0;
    init_error = NVML_SUCCESS;
    hang_init_s = 0;
    char line[8192], key[64], val[512];
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        if (!next_token(&p, key, sizeof key, val, sizeof val)) continue;
        if (!strcmp(key, "driver")) {
            while (next_token(&p, key, sizeof key, val, sizeof val))
                if (!strcmp(key, "version")) snprintf(driver_version, sizeof driver_version, "%s", val);
                else if (!strcmp(key, "cuda")) cuda_version = atoi(val);
                else if (!strcmp(key, "init_error")) init_error = error_code(val);
                else if (!strcmp(key, "hang_init_s")) hang_init_s = (unsigned)strtoul(val, NULL, 10);
        } else if (!strcmp(key, "gpu") && ngpus < MAX_GPUS) {
            parse_gpu(p);
        } else if (!strcmp(key, "holder") && nholders < MAX_HOLDERS) {
            parse_holder(p);
        }
    }
    fclose(f);
    load_state(); /* what setters changed, in this process or another */
    return 0;
}

const char *driver(void) { return driver_version; }

/* --- handles and injected errors ---------------------------------------------------- */

fake_gpu *as_gpu(nvmlDevice_t dev) {
    fake_gpu *g = (fake_gpu *)(void *)dev;
    return (g >= gpus && g < gpus + ngpus) ? g : NULL;
}

fake_mig *as_mig(nvmlDevice_t dev) {
    for (unsigned i = 0; i < ngpus; i++)
        if ((fake_mig *)(void *)dev >= gpus[i].migs && (fake_mig *)(void *)dev < gpus[i].migs + gpus[i].nmig)
            return (fake_mig *)(void *)dev;
    return NULL;
}

/* The error a call on this GPU returns: not initialised, a bad handle, or the injected one. */
nvmlReturn_t check(fake_gpu *g, const char *call) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->error && (has_word(g->error_on, "all") || has_word(g->error_on, call))) return g->error;
    if (g->lose_on[0] && has_word(g->lose_on, call)) {
        /* The GPU falls off the bus now: this call and every later one, in every process. */
        g->error = NVML_ERROR_GPU_IS_LOST;
        snprintf(g->error_on, sizeof g->error_on, "all");
        save_state();
        return g->error;
    }
    /* fail=call:error,... : that call alone fails so (a permission or NOT_SUPPORTED per call). */
    size_t n = strlen(call);
    for (const char *s = g->fail; (s = strstr(s, call)); s += n) {
        if ((s == g->fail || s[-1] == ',') && s[n] == ':') {
            char name[32];
            size_t k = strcspn(s + n + 1, ",");
            snprintf(name, sizeof name, "%.*s", (int)(k < sizeof name ? k : sizeof name - 1), s + n + 1);
            return error_code(name);
        }
    }
    return NVML_SUCCESS;
}

int unsupported(const fake_gpu *g, const char *what) { return has_word(g->unsupported, what); }


/* --- the NVML API (only what pynvml calls for reconcile) -------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (load_config() != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    /* A wedged driver (a GPU fallen off the bus) can block nvmlInit for minutes. */
    if (hang_init_s) sleep(hang_init_s);
    if (init_error) return init_error;
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

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!version || length <= strlen(driver_version)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, driver_version);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = cuda_version;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) { return nvmlSystemGetCudaDriverVersion_v2(version); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    CHECK(&gpus[index], "handle");
    *device = handle_of(&gpus[index]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < ngpus; i++) {
        if (strcmp(gpus[i].uuid, uuid)) continue;
        CHECK(&gpus[i], "handle");
        *device = handle_of(&gpus[i]);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t copy_str(const char *src, char *dst, unsigned int length) {
    if (!dst || length <= strlen(src)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    fake_mig *m = as_mig(dev);
    if (m) {
        char buf[160];
        CHECK(m->parent, "name");
        snprintf(buf, sizeof buf, "%s MIG %u/%u", m->parent->name, m->gi, m->ci);
        return copy_str(buf, name, length);
    }
    CHECK(as_gpu(dev), "name");
    return copy_str(as_gpu(dev)->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    fake_mig *m = as_mig(dev);
    if (m) {
        CHECK(m->parent, "uuid");
        return copy_str(m->uuid, uuid, length);
    }
    CHECK(as_gpu(dev), "uuid");
    return copy_str(as_gpu(dev)->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "minor");
    if (unsupported(g, "minor")) return NVML_ERROR_NOT_SUPPORTED;
    *minor = g->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "pci");
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", g->bus + (strlen(g->bus) > 12 ? 4 : 0));
    sscanf(g->bus, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x2bb510de;
    return NVML_SUCCESS;
}

/* Memory of a GPU or of one of its MIG instances: (total, reserved, used) bytes. */
static nvmlReturn_t memory_of(nvmlDevice_t dev, unsigned long long *total, unsigned long long *reserved,
                              unsigned long long *used) {
    fake_mig *m = as_mig(dev);
    fake_gpu *g = m ? m->parent : as_gpu(dev);
    CHECK(g, "memory");
    if (unsupported(g, "memory")) return NVML_ERROR_NOT_SUPPORTED; /* GB10 / Grace: unified memory */
    if (m) {
        *total = m->total_mib * MIB;
        *reserved = 0;
        *used = used_bytes(g, (int)m->gi);
    } else {
        *total = g->total_mib * MIB;
        *reserved = g->reserved_mib * MIB;
        *used = used_bytes(g, -1);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem) {
    unsigned long long total, reserved, used;
    nvmlReturn_t r = memory_of(dev, &total, &reserved, &used);
    if (r) return r;
    used += reserved; /* v1 counts the driver's reservation as used, as old drivers do */
    mem->total = total;
    mem->used = used;
    mem->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

#ifndef FAKE_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    unsigned long long total, reserved, used;
    if (mem && mem->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = memory_of(dev, &total, &reserved, &used);
    if (r) return r;
    mem->total = total;
    mem->reserved = reserved;
    mem->used = used;
    mem->free = used + reserved < total ? total - used - reserved : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes("nvmlDeviceGetComputeRunningProcesses_v3", dev, count, infos, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes("nvmlDeviceGetGraphicsRunningProcesses_v3", dev, count, infos, 1);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes("nvmlDeviceGetComputeRunningProcesses_v2", dev, count, infos, 0);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos) {
    return processes("nvmlDeviceGetGraphicsRunningProcesses_v2", dev, count, infos, 1);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, nvmlTemperatureSensors_t sensor, unsigned int *temp) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "temp");
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    if (unsupported(g, "temp")) return NVML_ERROR_NOT_SUPPORTED;
    *temp = g->temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "power");
    if (unsupported(g, "power")) return NVML_ERROR_NOT_SUPPORTED;
    *power = g->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *count) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "ecc");
    if (unsupported(g, "ecc")) return NVML_ERROR_NOT_SUPPORTED;
    /* volatile counts: uncorrected and corrected; aggregate reads the same */
    *count = errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? g->ecc_volatile : g->ecc_corrected;
    (void)counterType;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, nvmlEnableState_t *pending) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "retired");
    if (unsupported(g, "retired")) return NVML_ERROR_NOT_SUPPORTED;
    *pending = g->retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned *corr, unsigned *unc, unsigned *pending,
                                       unsigned *failure) {
    fake_gpu *g = as_gpu(dev);
    CHECK(g, "remap");
    /* With MIG on, NVML reports no remapped rows (nvidia-smi: "Remapped Rows: N/A"). */
    if (unsupported(g, "remap") || g->mig) return NVML_ERROR_NOT_SUPPORTED;
    *corr = 0;
    *unc = 0;
    *pending = (unsigned)g->remap_pending;
    *failure = (unsigned)g->remap_failure;
    return NVML_SUCCESS;
}
