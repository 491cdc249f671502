/* gpumem.h — a GPU's memory as the driver sees it now, read without a CUDA context.
 *
 * The supervisor re-reads each GPU's used and free bytes before it places jobs, and the bytes
 * each of its worker processes holds there, through NVML (libnvidia-ml.so.1, the library
 * nvidia-smi uses), loaded with dlopen: no CUDA context is created (the daemon holds no device
 * memory and forks cleanly), no build-time dependency, and on a machine without the NVIDIA
 * driver every call answers "unknown" (the scheduler then relies on the budget alone).
 *
 * Contract: called from the supervisor's thread only; never exits; never prints after init. */
#ifndef TQ_GPUMEM_H
#define TQ_GPUMEM_H
#include <sys/types.h>

/* Loads NVML once; 0 ok, -1 with why[] (no library, init failed). */
int tq_gpumem_init(char *why, size_t n);
void tq_gpumem_shutdown(void);

/* The GPU NVML knows by PCI bus id (tq_api_gpu.pci_bus_id): total, used and free bytes now, and
 * the bytes the processes pids[0..npids) hold on it (summed; -1 when NVML cannot say).
 * 0 ok, -1 unknown — also for a GPU in MIG mode, whose numbers by bus id are the whole card's
 * while each of CUDA's devices there is one instance. */
int tq_gpumem_read(const char *pci_bus_id, long long *total, long long *used, long long *free_bytes,
                   const pid_t *pids, int npids, long long *pids_used);
#endif
