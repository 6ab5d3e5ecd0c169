/* The fake's GPU settings: power limit, compute mode, application and locked clocks, MIG and ECC
 * mode, persistence mode, with NVML's getters and setters and what real drivers do with them.
 *
 * Keys of a `gpu` line (fakenvml.c documents the others):
 *   power_limit_mw=600000 power_default_mw=600000 power_min_mw=150000 power_max_mw=600000 (milliwatts)
 *   compute_mode=0 (NVML_COMPUTEMODE_*: 0 default, 2 prohibited, 3 exclusive process)
 *   mem_clocks=14001,405 gr_clocks=210:2430:15 (supported clocks, MHz: a list, or min:max:step;
 *       the same graphics clocks for every memory clock)
 *   app_mem= app_gr= app_default_mem= app_default_gr= (application clocks; default: the highest
 *       memory clock and 1590 MHz) clock_gr=210 (the graphics clock while not locked)
 *   locked_min=0 locked_max=0 (locked graphics clocks, 0 = none: NVML has no getter for them;
 *       nvmlDeviceGetClockInfo shows the clock clamped into the locked range)
 *   mig_pending= ecc=1 ecc_pending= (pending: what a reset (MIG) or a reboot (ECC) makes current;
 *       default: the current mode)
 *   unsupported= also takes power_limit, compute, app_clocks, supported_clocks, locked_clocks.
 *
 * What real drivers do, modelled here: drivers 590 and later answer the application-clock calls
 * with NVML_ERROR_DEPRECATED (nvidia-smi: "Requested functionality has been deprecated" on H100,
 * H200, L40S and GeForce captures); setters need root (NO_PERMISSION otherwise); a power limit
 * outside the constraints, clocks the GPU does not support and min above max are
 * INVALID_ARGUMENT; a MIG change on a GPU a process holds is IN_USE; MIG and ECC changes are
 * pending until the test "resets" the GPU or "reboots" the host (fake_nvml_reset_gpu,
 * fake_nvml_reboot, called through ctypes), which also lose what real resets and reboots lose.
 * fake_nvml_persistenced(on) is what nvidia-persistenced does to every GPU's persistence mode when
 * it starts (on, its default) and stops (off); tests/fakenvml/persistenced.py calls it.
 *
 * `hang_on=set_power` makes that call block for an hour, as a setter on a wedged driver does.
 * `broken=1`: a GPU a reset does not mend (its faults read the same after fake_nvml_reset_gpu).
 *
 * Call names (for error_on=, fail=, lose_on=, hang_on=): power_limit compute app_clocks supported_clocks
 * clock ecc_mode set_persistence set_power set_compute set_app_clocks reset_app_clocks set_locked
 * reset_locked set_mig set_ecc (mig and persistence are fakenvml_more.c's getters).
 *
 * Every setter and every reset/reboot is appended to $FAKE_NVML_CONFIG.calls as one line
 * `CALL gpu=INDEX ARGS -> RESULT`, and the settings are written to $FAKE_NVML_CONFIG.state
 * (a temporary file renamed over it) so that the next process, pynvml in the test included,
 * reads what this one set.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakenvml.h"

enum { CLOCK_GRAPHICS = 0, CLOCK_SM = 1, CLOCK_MEM = 2, CLOCK_VIDEO = 3 };

void settings_defaults(fake_gpu *g) {
    g->power_limit_mw = g->power_default_mw = g->power_max_mw = 600000;
    g->power_min_mw = 150000;
    g->mem_clocks[0] = 14001;
    g->mem_clocks[1] = 405;
    g->nmem_clocks = 2;
    g->ngr_clocks = 0;
    for (unsigned c = 210; c <= 2430 && g->ngr_clocks < MAX_GR_CLOCKS; c += 15) g->gr_clocks[g->ngr_clocks++] = c;
    g->app_default_gr = 1590;
    g->clock_gr = 210;
    g->ecc = 1;
    g->mig_pending = g->ecc_pending = -1;
}

static unsigned highest(const unsigned *l, int n) {
    unsigned m = 0;
    for (int i = 0; i < n; i++) if (l[i] > m) m = l[i];
    return m;
}

static unsigned lowest(const unsigned *l, int n) {
    unsigned m = n ? l[0] : 0;
    for (int i = 0; i < n; i++) if (l[i] < m) m = l[i];
    return m;
}

static int in_list(const unsigned *l, int n, unsigned v) {
    for (int i = 0; i < n; i++) if (l[i] == v) return 1;
    return 0;
}

int settings_key(fake_gpu *g, const char *key, const char *val) {
    unsigned n = (unsigned)strtoul(val, NULL, 0);
    if (!strcmp(key, "power_limit_mw")) g->power_limit_mw = n;
    else if (!strcmp(key, "power_default_mw")) g->power_default_mw = n;
    else if (!strcmp(key, "power_min_mw")) g->power_min_mw = n;
    else if (!strcmp(key, "power_max_mw")) g->power_max_mw = n;
    else if (!strcmp(key, "compute_mode")) g->compute_mode = n;
    else if (!strcmp(key, "app_mem")) g->app_mem = n;
    else if (!strcmp(key, "app_gr")) g->app_gr = n;
    else if (!strcmp(key, "app_default_mem")) g->app_default_mem = n;
    else if (!strcmp(key, "app_default_gr")) g->app_default_gr = n;
    else if (!strcmp(key, "clock_gr")) g->clock_gr = n;
    else if (!strcmp(key, "locked_min")) g->locked_min = n;
    else if (!strcmp(key, "locked_max")) g->locked_max = n;
    else if (!strcmp(key, "mig_pending")) g->mig_pending = (int)n;
    else if (!strcmp(key, "ecc")) g->ecc = (int)n;
    else if (!strcmp(key, "ecc_pending")) g->ecc_pending = (int)n;
    else if (!strcmp(key, "fail")) snprintf(g->fail, sizeof g->fail, "%s", val);
    else if (!strcmp(key, "lose_on")) snprintf(g->lose_on, sizeof g->lose_on, "%s", val);
    else if (!strcmp(key, "hang_on")) snprintf(g->hang_on, sizeof g->hang_on, "%s", val);
    else if (!strcmp(key, "broken")) g->broken = (int)n;
    else if (!strcmp(key, "reset_cleared")) {
        if (n && g->error == NVML_ERROR_RESET_REQUIRED) {
            g->error = NVML_SUCCESS;
            g->error_on[0] = 0;
            g->reset_cleared = 1;
        }
    } else if (!strcmp(key, "fell_off")) {
        if (n) {
            g->error = NVML_ERROR_GPU_IS_LOST;
            snprintf(g->error_on, sizeof g->error_on, "all");
        }
    } else if (!strcmp(key, "mem_clocks")) g->nmem_clocks = parse_list(val, g->mem_clocks, MAX_MEM_CLOCKS);
    else if (!strcmp(key, "gr_clocks")) {
        unsigned lo, hi, step;
        if (sscanf(val, "%u:%u:%u", &lo, &hi, &step) == 3 && step) {
            g->ngr_clocks = 0;
            for (unsigned c = lo; c <= hi && g->ngr_clocks < MAX_GR_CLOCKS; c += step) g->gr_clocks[g->ngr_clocks++] = c;
        } else {
            g->ngr_clocks = parse_list(val, g->gr_clocks, MAX_GR_CLOCKS);
        }
    } else return 0;
    return 1;
}

void settings_finish(fake_gpu *g) {
    if (!g->app_default_mem) g->app_default_mem = highest(g->mem_clocks, g->nmem_clocks);
    if (!g->app_mem) g->app_mem = g->app_default_mem;
    if (!g->app_gr) g->app_gr = g->app_default_gr;
    if (g->mig_pending < 0) g->mig_pending = g->mig;
    if (g->ecc_pending < 0) g->ecc_pending = g->ecc;
}

/* --- the state kept between processes, and the call log ------------------------------------ */

static int side_path(char *out, size_t len, const char *suffix) {
    const char *config = getenv("FAKE_NVML_CONFIG");
    if (!config) return -1;
    snprintf(out, len, "%s%s", config, suffix);
    return 0;
}

void load_state(void) {
    char path[4096], line[2048], key[64], val[512];
    if (side_path(path, sizeof path, ".state")) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        if (!next_token(&p, key, sizeof key, val, sizeof val) || strcmp(key, "state")) continue;
        if (!next_token(&p, key, sizeof key, val, sizeof val) || strcmp(key, "index")) continue;
        unsigned i = (unsigned)strtoul(val, NULL, 10);
        if (i >= ngpus) continue;
        while (next_token(&p, key, sizeof key, val, sizeof val)) gpu_key(&gpus[i], key, val);
    }
    fclose(f);
}

void save_state(void) {
    char path[4096], tmp[4200];
    if (side_path(path, sizeof path, ".state")) return;
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (unsigned i = 0; i < ngpus; i++) {
        const fake_gpu *g = &gpus[i];
        fprintf(f, "state index=%u persistence=%u power_limit_mw=%u compute_mode=%u app_mem=%u app_gr=%u "
                   "locked_min=%u locked_max=%u mig=%d mig_pending=%d ecc=%d ecc_pending=%d fell_off=%d "
                   "ecc_volatile=%llu remap_pending=%d retired_pending=%d recovery=%u reset_cleared=%d\n",
                i, g->persistence, g->power_limit_mw, g->compute_mode, g->app_mem, g->app_gr, g->locked_min,
                g->locked_max, g->mig, g->mig_pending, g->ecc, g->ecc_pending,
                g->error == NVML_ERROR_GPU_IS_LOST && has_word(g->error_on, "all") && g->lose_on[0],
                g->ecc_volatile, g->remap_pending, g->retired_pending, g->recovery, g->reset_cleared);
    }
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

void log_call(const char *call, const fake_gpu *g, const char *args, nvmlReturn_t rc) {
    char path[4096], line[512];
    if (side_path(path, sizeof path, ".calls")) return;
    int n = snprintf(line, sizeof line, "%s gpu=%d %s -> %s\n", call, g ? (int)g->index : -1, args,
                     rc ? error_name(rc) : "ok");
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) < 0) { /* the log is best effort */ }
    close(fd);
}

/* --- getters ------------------------------------------------------------------------------- */

static int app_clocks_deprecated(void) { return atoi(driver()) >= 590; }

#define GETTER(g, dev, call, feature) \
    fake_gpu *g = as_gpu(dev); \
    CHECK(g, call); \
    if (unsupported(g, feature)) return NVML_ERROR_NOT_SUPPORTED

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t dev, unsigned *limit) {
    GETTER(g, dev, "power_limit", "power_limit");
    *limit = g->power_limit_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned *limit) {
    return nvmlDeviceGetPowerManagementLimit(dev, limit);
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t dev, unsigned *limit) {
    GETTER(g, dev, "power_limit", "power_limit");
    *limit = g->power_default_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t dev, unsigned *lo, unsigned *hi) {
    GETTER(g, dev, "power_limit", "power_limit");
    *lo = g->power_min_mw;
    *hi = g->power_max_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, unsigned *mode) {
    GETTER(g, dev, "compute", "compute");
    *mode = g->compute_mode;
    return NVML_SUCCESS;
}

static nvmlReturn_t app_clock(nvmlDevice_t dev, unsigned type, unsigned *clock, int dflt) {
    GETTER(g, dev, "app_clocks", "app_clocks");
    if (app_clocks_deprecated()) return NVML_ERROR_DEPRECATED;
    if (type == CLOCK_GRAPHICS || type == CLOCK_SM) *clock = dflt ? g->app_default_gr : g->app_gr;
    else if (type == CLOCK_MEM) *clock = dflt ? g->app_default_mem : g->app_mem;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t dev, unsigned type, unsigned *clock) {
    return app_clock(dev, type, clock, 0);
}

nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t dev, unsigned type, unsigned *clock) {
    return app_clock(dev, type, clock, 1);
}

/* NVML's two-call pattern: a NULL array (or one too small) gets INSUFFICIENT_SIZE and the count. */
static nvmlReturn_t copy_clocks(const unsigned *list, int n, unsigned *count, unsigned *clocks) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!clocks || *count < (unsigned)n) {
        *count = (unsigned)n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    memcpy(clocks, list, sizeof *list * (size_t)n);
    *count = (unsigned)n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t dev, unsigned *count, unsigned *clocks) {
    GETTER(g, dev, "supported_clocks", "supported_clocks");
    return copy_clocks(g->mem_clocks, g->nmem_clocks, count, clocks);
}

nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t dev, unsigned mem, unsigned *count, unsigned *clocks) {
    GETTER(g, dev, "supported_clocks", "supported_clocks");
    if (!in_list(g->mem_clocks, g->nmem_clocks, mem)) return NVML_ERROR_NOT_FOUND;
    return copy_clocks(g->gr_clocks, g->ngr_clocks, count, clocks);
}

static unsigned current_graphics(const fake_gpu *g) {
    unsigned c = g->clock_gr;
    if (g->locked_max && c > g->locked_max) c = g->locked_max;
    if (g->locked_min && c < g->locked_min) c = g->locked_min;
    return c;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, unsigned type, unsigned *clock) {
    GETTER(g, dev, "clock", "clock");
    if (type == CLOCK_GRAPHICS || type == CLOCK_SM) *clock = current_graphics(g);
    else if (type == CLOCK_MEM) *clock = highest(g->mem_clocks, g->nmem_clocks);
    else if (type == CLOCK_VIDEO) *clock = 1000;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, unsigned type, unsigned *clock) {
    GETTER(g, dev, "clock", "clock");
    if (type == CLOCK_GRAPHICS || type == CLOCK_SM) *clock = highest(g->gr_clocks, g->ngr_clocks);
    else if (type == CLOCK_MEM) *clock = highest(g->mem_clocks, g->nmem_clocks);
    else if (type == CLOCK_VIDEO) *clock = 1000;
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, unsigned *current, unsigned *pending) {
    GETTER(g, dev, "ecc_mode", "ecc");
    *current = (unsigned)g->ecc;
    *pending = (unsigned)g->ecc_pending;
    return NVML_SUCCESS;
}

/* --- setters: root only, validated as the driver does, persisted, logged -------------------- */

static nvmlReturn_t may_set(fake_gpu *g, const char *call, const char *feature) {
    nvmlReturn_t r = check(g, call);
    if (r) return r;
    if (g->hang_on[0] && has_word(g->hang_on, call)) sleep(3600); /* a wedged driver */
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION;
    if (unsupported(g, feature)) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* The setter's result, logged, and the settings saved when it changed them. */
static nvmlReturn_t done(const char *call, fake_gpu *g, const char *args, nvmlReturn_t r) {
    if (r == NVML_SUCCESS) save_state();
    log_call(call, g, args, r);
    return r;
}

nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t dev, unsigned mode) {
    fake_gpu *g = as_gpu(dev);
    char args[32];
    snprintf(args, sizeof args, "%u", mode);
    nvmlReturn_t r = may_set(g, "set_persistence", "persistence");
    if (!r && mode > 1) r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r) g->persistence = mode;
    return done("nvmlDeviceSetPersistenceMode", g, args, r);
}

nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t dev, unsigned limit) {
    fake_gpu *g = as_gpu(dev);
    char args[32];
    snprintf(args, sizeof args, "%u", limit);
    nvmlReturn_t r = may_set(g, "set_power", "power_limit");
    if (!r && (limit < g->power_min_mw || limit > g->power_max_mw)) r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r) g->power_limit_mw = limit;
    return done("nvmlDeviceSetPowerManagementLimit", g, args, r);
}

nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t dev, unsigned mode) {
    fake_gpu *g = as_gpu(dev);
    char args[32];
    snprintf(args, sizeof args, "%u", mode);
    nvmlReturn_t r = may_set(g, "set_compute", "compute");
    if (!r && mode != 0 && mode != 2 && mode != 3) r = NVML_ERROR_INVALID_ARGUMENT; /* 1: exclusive thread, removed */
    if (!r) g->compute_mode = mode;
    return done("nvmlDeviceSetComputeMode", g, args, r);
}

nvmlReturn_t nvmlDeviceSetApplicationsClocks(nvmlDevice_t dev, unsigned mem, unsigned gr) {
    fake_gpu *g = as_gpu(dev);
    char args[48];
    snprintf(args, sizeof args, "%u,%u", mem, gr);
    nvmlReturn_t r = may_set(g, "set_app_clocks", "app_clocks");
    if (!r && app_clocks_deprecated()) r = NVML_ERROR_DEPRECATED;
    if (!r && (!in_list(g->mem_clocks, g->nmem_clocks, mem) || !in_list(g->gr_clocks, g->ngr_clocks, gr)))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r) {
        g->app_mem = mem;
        g->app_gr = gr;
    }
    return done("nvmlDeviceSetApplicationsClocks", g, args, r);
}

nvmlReturn_t nvmlDeviceResetApplicationsClocks(nvmlDevice_t dev) {
    fake_gpu *g = as_gpu(dev);
    nvmlReturn_t r = may_set(g, "reset_app_clocks", "app_clocks");
    if (!r && app_clocks_deprecated()) r = NVML_ERROR_DEPRECATED;
    if (!r) {
        g->app_mem = g->app_default_mem;
        g->app_gr = g->app_default_gr;
    }
    return done("nvmlDeviceResetApplicationsClocks", g, "", r);
}

nvmlReturn_t nvmlDeviceSetGpuLockedClocks(nvmlDevice_t dev, unsigned lo, unsigned hi) {
    fake_gpu *g = as_gpu(dev);
    char args[48];
    snprintf(args, sizeof args, "%u,%u", lo, hi);
    nvmlReturn_t r = may_set(g, "set_locked", "locked_clocks");
    if (!r && (lo > hi || lo < lowest(g->gr_clocks, g->ngr_clocks) || hi > highest(g->gr_clocks, g->ngr_clocks)))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r) {
        g->locked_min = lo;
        g->locked_max = hi;
    }
    return done("nvmlDeviceSetGpuLockedClocks", g, args, r);
}

nvmlReturn_t nvmlDeviceResetGpuLockedClocks(nvmlDevice_t dev) {
    fake_gpu *g = as_gpu(dev);
    nvmlReturn_t r = may_set(g, "reset_locked", "locked_clocks");
    if (!r) g->locked_min = g->locked_max = 0;
    return done("nvmlDeviceResetGpuLockedClocks", g, "", r);
}

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t dev, unsigned mode, nvmlReturn_t *activation) {
    fake_gpu *g = as_gpu(dev);
    char args[32];
    snprintf(args, sizeof args, "%u", mode);
    nvmlReturn_t r = may_set(g, "set_mig", "mig");
    if (!r && mode > 1) r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r && busy(g)) r = NVML_ERROR_IN_USE; /* "In use by another client" */
    if (!r) {
        g->mig_pending = (int)mode;
        if (activation) *activation = NVML_SUCCESS;
    }
    return done("nvmlDeviceSetMigMode", g, args, r);
}

nvmlReturn_t nvmlDeviceSetEccMode(nvmlDevice_t dev, unsigned mode) {
    fake_gpu *g = as_gpu(dev);
    char args[32];
    snprintf(args, sizeof args, "%u", mode);
    nvmlReturn_t r = may_set(g, "set_ecc", "ecc");
    if (!r && mode > 1) r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r) g->ecc_pending = (int)mode;
    return done("nvmlDeviceSetEccMode", g, args, r);
}

/* --- what a GPU reset and a reboot do (tests call these through ctypes) ---------------------- */

/* `nvidia-smi -r -i INDEX`, as real drivers do it:
 * - a lost GPU is not brought back (nvidia-smi: "GPU is lost. Reboot the system to recover this GPU");
 * - refused (IN_USE, nvidia-smi's "In use by another client") while a process holds the GPU, and while
 *   persistence mode is on: it counts as an attachment to the device (NVIDIA/NVSentinel#1690, gpu-operator#118);
 * - done: a pending MIG mode becomes current, clocks set on it are lost; the volatile ECC counts start
 *   again at 0, a pending row remap and pending page retirements take effect (NVIDIA GPU Memory Error
 *   Management, Dynamic Page Retirement: "at the next reset"), the driver's recovery action is none, and
 *   a RESET_REQUIRED error is gone. A row-remap failure stays (no spare rows are left).
 * - `broken=1`: hardware a reset does not mend: its faults read the same after it. */
int fake_nvml_reset_gpu(unsigned index) {
    if (load_config() != 0 || index >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    fake_gpu *g = &gpus[index];
    nvmlReturn_t r = NVML_SUCCESS;
    if (g->error == NVML_ERROR_GPU_IS_LOST) r = NVML_ERROR_GPU_IS_LOST;
    else if (busy(g) || g->persistence == 1) r = NVML_ERROR_IN_USE;
    if (!r) {
        g->mig = g->mig_pending;
        g->locked_min = g->locked_max = 0;
        g->app_mem = g->app_default_mem;
        g->app_gr = g->app_default_gr;
        if (!g->broken) {
            g->ecc_volatile = 0;
            g->remap_pending = 0;
            g->retired_pending = 0;
            g->recovery = 0;
            if (g->error == NVML_ERROR_RESET_REQUIRED) {
                g->error = NVML_SUCCESS;
                g->error_on[0] = 0;
                g->reset_cleared = 1;
            }
        }
    }
    return done("reset", g, "", r);
}

/* The index of the GPU at a PCI bus id as nvidia-smi -i takes it (00000000:41:00.0, any case, with or
 * without the domain's leading zeros); -1 when no GPU is there. For the nvidia-smi stand-in. */
int fake_nvml_index_of_bus(const char *bus) {
    unsigned dom, b, dev, fn = 0;
    if (load_config() != 0 || !bus || sscanf(bus, "%x:%x:%x.%x", &dom, &b, &dev, &fn) < 3) return -1;
    for (unsigned i = 0; i < ngpus; i++) {
        unsigned d2, b2, v2, f2 = 0;
        if (sscanf(gpus[i].bus, "%x:%x:%x.%x", &d2, &b2, &v2, &f2) >= 3 && d2 == dom && b2 == b && v2 == dev && f2 == fn)
            return (int)i;
    }
    return -1;
}

/* A reboot: pending MIG and ECC modes become current; power limit, compute mode, clocks and
 * persistence mode are lost (none of them survives a driver unload); the GPUs are reset with the node
 * (what a reset clears, a reboot clears, unless `broken`). */
int fake_nvml_reboot(void) {
    if (load_config() != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (unsigned i = 0; i < ngpus; i++) {
        fake_gpu *g = &gpus[i];
        g->mig = g->mig_pending;
        g->ecc = g->ecc_pending;
        g->power_limit_mw = g->power_default_mw;
        g->compute_mode = 0;
        g->app_mem = g->app_default_mem;
        g->app_gr = g->app_default_gr;
        g->locked_min = g->locked_max = 0;
        g->persistence = 0;
        if (!g->broken) { /* the GPU is reset with the node (a lost GPU in the config stays lost) */
            g->ecc_volatile = 0;
            g->remap_pending = 0;
            g->retired_pending = 0;
            g->recovery = 0;
        }
    }
    return done("reboot", NULL, "", NVML_SUCCESS);
}

/* What nvidia-persistenced does to the GPUs: persistence mode on for every GPU when it starts
 * (its default; --no-persistence-mode leaves it alone), off when it stops. Not an NVML call:
 * the daemon talks to the kernel module, so the call log says "persistenced". */
int fake_nvml_persistenced(int on) {
    if (load_config() != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (unsigned i = 0; i < ngpus; i++)
        if (!unsupported(&gpus[i], "persistence")) gpus[i].persistence = on ? 1 : 0;
    return done("persistenced", NULL, on ? "1" : "0", NVML_SUCCESS);
}
