/* Shared by fakenvml.c (config, the core queries), fakenvml_procs.c (the live processes that hold
 * memory), fakenvml_more.c (field values, clock events, PCIe, NVLink, VBIOS, persistence, MIG) and
 * fakenvml_settings.c (the settings' getters and setters, the state kept between processes, the call
 * log): see fakenvml.c for the configuration. */
#ifndef FAKENVML_H
#define FAKENVML_H
#include <stddef.h>
#include <stdint.h>

/* NVML's own types, constants and prototypes: nvml.h from NVIDIA's nvidia-nvml-dev wheel (fetched,
 * never vendored: tests/nvml_header.py). Every function the fake exports is compiled against the
 * header's prototype (a different one is a compile error, a missing one too: -Werror=missing-prototypes).
 * NVML_NO_UNVERSIONED_FUNC_DEFS: nvml.h would otherwise #define nvmlInit to nvmlInit_v2 (and so on), and
 * the fake exports both names, as the real library does; with it nvml.h declares the unversioned ones.
 *
 * nvml.h is Copyright 1993-2026 NVIDIA Corporation; its notice asks that code using it carry this:
 * NVIDIA MAKES NO REPRESENTATION ABOUT THE SUITABILITY OF THIS SOURCE
 * CODE FOR ANY PURPOSE.  IT IS PROVIDED "AS IS" WITHOUT EXPRESS OR
 * IMPLIED WARRANTY OF ANY KIND.  NVIDIA DISCLAIMS ALL WARRANTIES WITH
 * REGARD TO THIS SOURCE CODE, INCLUDING ALL IMPLIED WARRANTIES OF
 * MERCHANTABILITY, NONINFRINGEMENT, AND FITNESS FOR A PARTICULAR PURPOSE.
 * IN NO EVENT SHALL NVIDIA BE LIABLE FOR ANY SPECIAL, INDIRECT, INCIDENTAL,
 * OR CONSEQUENTIAL DAMAGES, OR ANY DAMAGES WHATSOEVER RESULTING FROM LOSS
 * OF USE, DATA OR PROFITS,  WHETHER IN AN ACTION OF CONTRACT, NEGLIGENCE
 * OR OTHER TORTIOUS ACTION,  ARISING OUT OF OR IN CONNECTION WITH THE USE
 * OR PERFORMANCE OF THIS SOURCE CODE.
 *
 * U.S. Government End Users.   This source code is a "commercial item" as
 * that term is defined at  48 C.F.R. 2.101 (OCT 1995), consisting  of
 * "commercial computer  software"  and "commercial computer software
 * documentation" as such terms are  used in 48 C.F.R. 12.212 (SEPT 1995)
 * and is provided to the U.S. Government only as a commercial end item.
 * Consistent with 48 C.F.R.12.212 and 48 C.F.R. 227.7202-1 through
 * 227.7202-4 (JUNE 1995), all U.S. Government End Users acquire the
 * source code with only those rights set forth herein.
 *
 * Any use of this source code in individual and commercial software must
 * include, in the user documentation and internal comments to the code,
 * the above Disclaimer and U.S. Government End Users Notice.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#define MAX_GPUS 64
#define MAX_HOLDERS 64
#define MAX_PROCS 4096
#define MAX_LINKS 36
#define MAX_MIG 8
#define MAX_MEM_CLOCKS 8
#define MAX_GR_CLOCKS 256
#define MIB (1024ULL * 1024ULL)
#define NOT_AVAILABLE ((unsigned long long)NVML_VALUE_NOT_AVAILABLE) /* usedGpuMemory not reported */
#define NO_INSTANCE 0xFFFFFFFFu /* gpuInstanceId outside MIG (nvml.h, nvmlProcessInfo_v2_t) */

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
    int broken;        /* a reset does not mend it: its faults read the same after one */
    int reset_cleared; /* a reset took away the RESET_REQUIRED error the config gives it */
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
/* fakenvml_procs.c: the memory processes hold on GPU g (MIG instance gi, or all of it when gi < 0), and
 * its compute (graphics=0) or graphics process list as NVML's CALL gives it. */
unsigned long long used_bytes(const fake_gpu *g, int gi);
nvmlReturn_t processes(const char *call, nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos, int graphics);
/* fakenvml_settings.c: defaults, config keys, the state file written by setters and read at init. */
void settings_defaults(fake_gpu *g);
int settings_key(fake_gpu *g, const char *key, const char *val);
void settings_finish(fake_gpu *g);
int load_config(void);
void load_state(void);
void save_state(void);
void log_call(const char *call, const fake_gpu *g, const char *args, nvmlReturn_t rc);
void gpu_key(fake_gpu *g, const char *key, const char *val);
/* NVML's handles are opaque (struct nvmlDevice_st *): the fake's are its own GPUs and MIG instances. */
#define handle_of(p) ((nvmlDevice_t)(void *)(p))
fake_gpu *as_gpu(nvmlDevice_t dev);
fake_mig *as_mig(nvmlDevice_t dev);
/* The error a call on this GPU returns: not initialised, a bad handle, or the injected one. */
nvmlReturn_t check(fake_gpu *g, const char *call);
int unsupported(const fake_gpu *g, const char *what);
nvmlReturn_t copy_str(const char *src, char *dst, unsigned int length);

/* The fake's own exports (not NVML): what a GPU reset, a reboot and nvidia-persistenced do, called by the
 * tests through ctypes (fakenvml_settings.c). */
int fake_nvml_reset_gpu(unsigned index);
int fake_nvml_index_of_bus(const char *bus);
int fake_nvml_reboot(void);
int fake_nvml_persistenced(int on);

#define CHECK(g, call) do { nvmlReturn_t r_ = check((g), (call)); if (r_) return r_; } while (0)
#endif
