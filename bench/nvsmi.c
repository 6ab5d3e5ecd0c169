/*
 * A minimal stand-in for `nvidia-smi --query-gpu=index,memory.used
 * --format=csv,noheader,nounits` for the benchmark: the machine has no
 * nvidia-smi, and the peers' GPU check must be a fast native command, as
 * nvidia-smi is, not a Python start-up. It loads whatever libnvidia-ml.so.1
 * the dynamic loader finds (the fake one via LD_LIBRARY_PATH).
 *
 *   gcc -O2 -o nvsmi nvsmi.c -ldl
 */
#include <dlfcn.h>
#include <stdio.h>

typedef struct { unsigned long long total, free, used; } mem_t;

int main(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "nvsmi: %s\n", dlerror()); return 9; }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2");
    int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*meminfo)(void *, mem_t *) = (int (*)(void *, mem_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    if (!init || !count || !handle || !meminfo || init()) { fprintf(stderr, "nvsmi: NVML init failed\n"); return 9; }
    unsigned n = 0;
    if (count(&n)) return 9;
    for (unsigned i = 0; i < n; i++) {
        void *h; mem_t m;
        if (handle(i, &h) || meminfo(h, &m)) { fprintf(stderr, "nvsmi: GPU %u unreadable\n", i); return 9; }
        printf("%u, %llu\n", i, m.used / (1024ULL * 1024ULL));
    }
    return 0;
}
