/* gpumem.c — NVML through dlopen (see gpumem.h). The few NVML entry points used are declared
 * here with NVML's documented C signatures (nvml.h, stable since NVML 3.x): the build needs
 * neither the header nor the library. */
#include "gpumem.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef struct nvml_device_st *nvml_dev;
typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct {
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id, compute_instance_id;   /* nvmlProcessInfo_t (v2 layout) */
} nvml_process;

static struct {
    void *lib;
    int (*init)(void);
    int (*shutdown)(void);
    int (*by_pci)(const char *, nvml_dev *);
    int (*memory)(nvml_dev, nvml_memory *);
    int (*procs)(nvml_dev, unsigned int *, nvml_process *);
    const char *(*errstr)(int);   /* nvmlErrorString: a status in words (optional) */
    int (*mig)(nvml_dev, unsigned int *, unsigned int *);   /* nvmlDeviceGetMigMode (optional) */
} nv;

int tq_gpumem_init(char *why, size_t n) {
    if (nv.lib) return 0;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { snprintf(why, n, "NVML not found (libnvidia-ml.so.1: %s)", dlerror()); return -1; }
    nv.init = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    nv.shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown");
    nv.by_pci = (int (*)(const char *, nvml_dev *))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    nv.memory = (int (*)(nvml_dev, nvml_memory *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    nv.procs = (int (*)(nvml_dev, unsigned int *, nvml_process *))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
    nv.errstr = (const char *(*)(int))dlsym(lib, "nvmlErrorString");
    nv.mig = (int (*)(nvml_dev, unsigned int *, unsigned int *))dlsym(lib, "nvmlDeviceGetMigMode");
    if (!nv.init || !nv.shutdown || !nv.by_pci || !nv.memory) {
        snprintf(why, n, "NVML lacks the entry points trainq reads");
        dlclose(lib);
        memset(&nv, 0, sizeof nv);
        return -1;
    }
    int rc = nv.init();
    if (rc != 0) {
        /* e.g. 9 "Driver Not Loaded", 4 "Insufficient Permissions", 18 a driver/library mismatch */
        const char *w = nv.errstr ? nv.errstr(rc) : NULL;
        snprintf(why, n, "nvmlInit failed (NVML status %d%s%s)", rc, w ? ": " : "", w ? w : "");
        dlclose(lib);
        memset(&nv, 0, sizeof nv);
        return -1;
    }
    nv.lib = lib;
    return 0;
}

void tq_gpumem_shutdown(void) {
    if (!nv.lib) return;
    nv.shutdown();
    dlclose(nv.lib);
    memset(&nv, 0, sizeof nv);
}

int tq_gpumem_read(const char *pci_bus_id, long long *total, long long *used, long long *free_bytes,
                   const pid_t *pids, int npids, long long *pids_used) {
    if (pids_used) *pids_used = -1;
    if (!nv.lib || !pci_bus_id || !pci_bus_id[0]) return -1;
    nvml_dev d;
    nvml_memory m;
    if (nv.by_pci(pci_bus_id, &d) != 0) return -1;
    /* MIG on: CUDA's devices are its instances, which share the card's bus id; NVML's numbers
     * by that id are the whole card's, not an instance's: unknown (the budget decides) */
    unsigned int cur = 0, pending = 0;
    if (nv.mig && nv.mig(d, &cur, &pending) == 0 && cur == 1 /* NVML_DEVICE_MIG_ENABLE */) return -1;
    if (nv.memory(d, &m) != 0) return -1;
    *total = (long long)m.total;
    *used = (long long)m.used;
    *free_bytes = (long long)m.free;
    if (pids_used && nv.procs) {
        nvml_process p[64];
        unsigned int cnt = 64;
        if (nv.procs(d, &cnt, p) == 0) {
            long long sum = 0;
            int known = 1;
            for (unsigned int i = 0; i < cnt && i < 64; i++)
                for (int k = 0; k < npids; k++) {
                    if ((pid_t)p[i].pid != pids[k]) continue;
                    if (p[i].used_gpu_memory == ~0ULL) known = 0;   /* NVML_VALUE_NOT_AVAILABLE */
                    else sum += (long long)p[i].used_gpu_memory;
                }
            if (known) *pids_used = sum;
        }
    }
    return 0;
}
