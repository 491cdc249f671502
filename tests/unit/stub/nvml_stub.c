/* nvml_stub.c — a stand-in libnvidia-ml.so.1 for test_gpumem: the seven entry points gpumem.c
 * looks up, with NVML's C ABI (nvml.h 12.9: nvmlMemory_t {total, free, used} as three unsigned
 * long long; nvmlProcessInfo_v2_t {pid, usedGpuMemory, gpuInstanceId, computeInstanceId}, 24
 * bytes, usedGpuMemory at offset 8; statuses as ints, 0 success). One GPU, at bus id
 * 00000000:3B:00.0 (NVML takes either case); its numbers and the failures a test wants come
 * from the environment: STUB_NVML_INIT (nvmlInit_v2's status), STUB_NVML_NA_PID (a process whose
 * memory NVML "cannot report", NVML_VALUE_NOT_AVAILABLE), STUB_NVML_MIG (nvmlDeviceGetMigMode's
 * current mode, 1 enabled; unset: NVML_ERROR_NOT_SUPPORTED, as on a GPU without MIG). */
#include <stdlib.h>
#include <strings.h>

typedef struct { unsigned long long total, free, used; } stub_memory;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } stub_process;
typedef struct stub_dev *stub_handle;
static struct stub_dev { int dummy; } the_gpu;

int nvmlInit_v2(void) {
    const char *e = getenv("STUB_NVML_INIT");
    return e ? atoi(e) : 0;
}
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int rc) {
    return rc == 9 ? "Driver Not Loaded" : rc == 4 ? "Insufficient Permissions" : "Unknown Error";
}
int nvmlDeviceGetHandleByPciBusId_v2(const char *id, stub_handle *d) {
    if (!id || strcasecmp(id, "00000000:3b:00.0")) return 6;   /* NVML_ERROR_NOT_FOUND */
    *d = &the_gpu;
    return 0;
}
int nvmlDeviceGetMemoryInfo(stub_handle d, stub_memory *m) {
    if (d != &the_gpu) return 2;
    m->total = 80ULL << 30;
    m->used = 30ULL << 30;
    m->free = 50ULL << 30;
    return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v2(stub_handle d, unsigned int *count, stub_process *p) {
    static const unsigned int pids[3] = { 111, 222, 333 };
    static const unsigned long long used[3] = { 1ULL << 30, 2ULL << 30, 4ULL << 30 };
    if (d != &the_gpu) return 2;
    if (*count < 3) { *count = 3; return 7; }   /* NVML_ERROR_INSUFFICIENT_SIZE */
    const char *na = getenv("STUB_NVML_NA_PID");
    for (int i = 0; i < 3; i++) {
        p[i].pid = pids[i];
        p[i].used = na && (unsigned)atoi(na) == pids[i] ? ~0ULL : used[i];
        p[i].gi = p[i].ci = 0xFFFFFFFFu;
    }
    *count = 3;
    return 0;
}
int nvmlDeviceGetMigMode(stub_handle d, unsigned int *current, unsigned int *pending) {
    if (d != &the_gpu) return 2;
    const char *m = getenv("STUB_NVML_MIG");
    if (!m) return 3;   /* NVML_ERROR_NOT_SUPPORTED */
    *current = *pending = (unsigned)atoi(m);
    return 0;
}
