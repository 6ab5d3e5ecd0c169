/*
 * The fake's live processes: which running processes match its configured holders (fakenvml.c
 * documents the `holder` keys), for the calls that depend on them: the memory in use, the compute
 * and graphics process lists, and the refusal of a reset or MIG change while a GPU is held.
 *
 * Every such call looks at /proc afresh, so a process that exits or becomes a zombie stops holding at
 * once and one that execs into a holder's command line holds from then on; nothing is kept between
 * calls (a test never depends on when the fake last looked). A real driver answers these calls from
 * its own tables; the fake's cost per call is kept near that by reading only what the holders that
 * matter to the call need: no scan at all when none of them is on the GPU, /proc/PID/stat once
 * (open/read/close, no stdio) when a holder is matched by its name, /proc/PID/cmdline only when a
 * holder is matched by its command line.
 *
 * $FAKE_NVML_COUNT (a file): each scan and each process-list call appends a line there, so that a
 * test counts what reconcile asks of the driver and what the fake read to answer.
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakenvml.h"

typedef struct { unsigned pid; int holder; } match_t;

/* A line on $FAKE_NVML_COUNT, when it is set. */
static void count_line(const char *fmt, ...) {
    const char *path = getenv("FAKE_NVML_COUNT");
    if (!path || !*path) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) < 0) { /* counting is best effort */ }
    close(fd);
}

/* Up to len-1 bytes of a /proc file, NUL-terminated, in one read(2): a /proc file's read handler gives
 * all it has up to the size asked (seq_read; proc_pid_cmdline_read loops over the pages itself); -1 when
 * it cannot be opened (the process is gone). */
static int read_proc(const char *path, char *buf, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0) n = 0;
    buf[n] = 0;
    return (int)n;
}

/* The name (comm) and state of a /proc/PID/stat line: "PID (NAME) S ...". The name is the kernel's own
 * (what /proc/PID/comm shows, unescaped), between the first "(" and the last ")": it may hold either. */
static int stat_fields(char *stat, const char **name, char *state) {
    char *lp = strchr(stat, '('), *rp = strrchr(stat, ')');
    if (!lp || !rp || rp < lp || rp[1] != ' ' || !rp[2]) return -1;
    *rp = 0;
    *name = lp + 1;
    *state = rp[2];
    return 0;
}

static int holds(const fake_holder *h, unsigned gpu) {
    for (int i = 0; i < h->ngpus; i++) if (h->gpus[i] == (int)gpu) return 1;
    return 0;
}

/* Every (live process, holder) pair that matches, scanning /proc now, for the holders with want[h] set. */
static int scan(match_t *out, int max, const int *want) {
    int need_stat = 0, any = 0;
    for (unsigned h = 0; h < nholders; h++) {
        if (!want[h]) continue;
        any = 1;
        if (holders[h].comm[0]) need_stat = 1;
    }
    if (!any) return 0; /* no holder can match: nothing to look at */
    int n = 0, procs = 0, stats = 0, cmdlines = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    char path[64], stat[512], cmd[4096];
    while ((e = readdir(d)) && n < max) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        procs++;
        const char *name = NULL;
        char state = 0;
        int have_stat = 0, have_cmd = 0;
        if (need_stat) {
            snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
            stats++;
            if (read_proc(path, stat, sizeof stat) <= 0 || stat_fields(stat, &name, &state)) continue;
            if (state == 'Z' || state == 'X') continue; /* a zombie holds nothing */
            have_stat = 1;
        }
        for (unsigned h = 0; h < nholders && n < max; h++) {
            if (!want[h]) continue;
            if (holders[h].comm[0] && strcmp(holders[h].comm, name)) continue;
            if (holders[h].cmdline[0]) {
                if (!have_cmd) {
                    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
                    cmdlines++;
                    int len = read_proc(path, cmd, sizeof cmd);
                    if (len < 0) break; /* gone */
                    for (int i = 0; i < len; i++) if (!cmd[i]) cmd[i] = ' ';
                    have_cmd = 1;
                }
                if (!strstr(cmd, holders[h].cmdline)) continue;
            }
            if (!have_stat) { /* matched by its command line alone: is it alive, not a zombie? */
                snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
                stats++;
                if (read_proc(path, stat, sizeof stat) <= 0 || stat_fields(stat, &name, &state) ||
                    state == 'Z' || state == 'X')
                    break;
                have_stat = 1;
            }
            out[n].pid = (unsigned)strtoul(e->d_name, NULL, 10);
            out[n].holder = (int)h;
            n++;
        }
    }
    closedir(d);
    count_line("scan procs=%d stat=%d cmdline=%d matches=%d\n", procs, stats, cmdlines, n);
    return n;
}

int busy(const fake_gpu *g) {
    static match_t m[MAX_PROCS];
    int want[MAX_HOLDERS];
    for (unsigned h = 0; h < nholders; h++) want[h] = holds(&holders[h], g->index);
    return scan(m, MAX_PROCS, want) > 0;
}

/* Bytes held on GPU g (in MIG instance gi, or all of it when gi < 0). */
unsigned long long used_bytes(const fake_gpu *g, int gi) {
    static match_t m[MAX_PROCS];
    int want[MAX_HOLDERS];
    for (unsigned h = 0; h < nholders; h++)
        want[h] = holds(&holders[h], g->index) && (gi < 0 || holders[h].gi == gi);
    int n = scan(m, MAX_PROCS, want);
    unsigned long long used = gi < 0 ? g->used_mib * MIB : 0;
    for (int i = 0; i < n; i++) used += holders[m[i].holder].mib * MIB;
    return used;
}

/* A compute (graphics=0) or graphics process list, as NVML's: *count is the room in infos; too little
 * (or infos NULL, the size query) returns INSUFFICIENT_SIZE with *count the number needed. */
nvmlReturn_t processes(const char *call, nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *infos, int graphics) {
    static match_t m[MAX_PROCS];
    fake_gpu *g = as_gpu(dev);
    unsigned room = count ? *count : 0;
    nvmlReturn_t r = check(g, "processes");
    if (!r && !count) r = NVML_ERROR_INVALID_ARGUMENT;
    if (r) {
        count_line("%s gpu=%d room=%u infos=%d -> %s\n", call, g ? (int)g->index : -1, room, infos != NULL,
                   error_name(r));
        return r;
    }
    int want[MAX_HOLDERS];
    for (unsigned h = 0; h < nholders; h++) {
        const fake_holder *k = &holders[h];
        want[h] = !k->hidden && holds(k, g->index) && (k->both || k->graphics == graphics);
    }
    int n = scan(m, MAX_PROCS, want);
    unsigned found = 0;
    for (int i = 0; i < n; i++) {
        const fake_holder *h = &holders[m[i].holder];
        if (infos && found < room) {
            infos[found].pid = m[i].pid;
            infos[found].usedGpuMemory = h->mem_na ? NOT_AVAILABLE : h->mib * MIB;
            infos[found].gpuInstanceId = (g->mig && h->gi >= 0) ? (unsigned)h->gi : NO_INSTANCE;
            infos[found].computeInstanceId = (g->mig && h->gi >= 0) ? (unsigned)(h->ci >= 0 ? h->ci : 0) : NO_INSTANCE;
        }
        found++;
    }
    *count = found;
    r = (!infos || found > room) && found ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    count_line("%s gpu=%u room=%u infos=%d -> %s %u\n", call, g->index, room, infos != NULL,
               r ? error_name(r) : "ok", found);
    return r;
}
