/* device.h — the one device resolver: what a job's `device` (auto, cpu, cuda, cuda:N) and the
 * daemon's `--devices` (auto, or a list such as cpu,cuda:0,cuda:1) mean, used alike by API
 * admission, the scheduler, the worker and the trainer.
 *
 * Contract: pure functions over strings and small arrays; no device is touched, nothing is
 * allocated, nothing prints. Thread-safe. Errors fill `err` with a message that names the
 * offending text. */
#ifndef TQ_DEVICE_H
#define TQ_DEVICE_H
#include <stddef.h>

typedef enum { TQ_DEV_AUTO, TQ_DEV_CPU, TQ_DEV_CUDA_ANY, TQ_DEV_CUDA } tq_dev_kind;

typedef struct {
    tq_dev_kind kind;
    int ordinal;      /* TQ_DEV_CUDA only */
} tq_devsel;

#define TQ_DEV_ID_MAX 16   /* "cuda:255" fits with room */

/* "auto" | "cpu" | "cuda" | "cuda:N" (0 ≤ N ≤ 255, decimal, no sign or spaces). 0 ok, -1 bad. */
int tq_devsel_parse(const char *s, tq_devsel *out);
/* the canonical text of a selector ("auto", "cpu", "cuda", "cuda:3") */
void tq_devsel_str(const tq_devsel *d, char out[TQ_DEV_ID_MAX]);
/* 1 when a job asking for `want` may run on the concrete device `id` ("cpu" or "cuda:N") */
int tq_devsel_allows(const tq_devsel *want, const char *id);
/* 1 when `id` names a GPU ("cuda:N") */
int tq_dev_is_gpu(const char *id);

/* The daemon's device set from --devices: "auto" → every GPU found plus the CPU; otherwise a
 * comma-separated list of cpu, cuda (every GPU found) and cuda:N, each at most once. gpus[] are
 * the GPUs the probe found ("cuda:0", …). Fills out[] (GPUs first, in ordinal order, then
 * "cpu" when present) and returns the count, or -1 with err naming the item (unknown text, a
 * GPU that does not exist, a repeat, an empty list). */
int tq_devices_resolve(const char *flag, const char *const *gpus, int ngpus,
                       char out[][TQ_DEV_ID_MAX], int max, char *err, size_t errlen);

/* Indices into devs[] (concrete ids, GPUs before the CPU as tq_devices_resolve orders them)
 * where a job asking for `want` may run, in the order the job prefers them: auto prefers the
 * GPUs, then the CPU. Returns the count (0: none). */
int tq_devsel_candidates(const tq_devsel *want, char devs[][TQ_DEV_ID_MAX], int ndev, int *idx);
/* A GPU's compute mode (CUDA's cudaComputeMode values; the driver's, set with nvidia-smi -c):
 * default lets any number of processes use it; exclusive_process one process at a time, and
 * cudaSetDevice fails in any other (the old exclusive_thread likewise); prohibited none. */
enum { TQ_CM_DEFAULT = 0, TQ_CM_EXCLUSIVE_THREAD = 1, TQ_CM_PROHIBITED = 2, TQ_CM_EXCLUSIVE_PROCESS = 3 };
/* "default", "exclusive_thread", "prohibited", "exclusive_process"; "unknown" otherwise */
const char *tq_compute_mode_name(int mode);
/* the mode a name gives (as tq_compute_mode_name writes it); -1 for anything else */
int tq_compute_mode_parse(const char *name);
/* How many jobs of the daemon a GPU in `mode` takes at once, given the configured max_jobs:
 * max_jobs in default mode (and an unknown one), 1 in the exclusive modes (each job is a worker
 * process: a second one's cudaSetDevice would fail), 0 when prohibited (the GPU is not used). */
int tq_compute_mode_max_jobs(int mode, int max_jobs);

/* A GPU the daemon placed a job on and the worker found busy when it opened it
 * (tq_cuda_open_busy: another process took the memory, or holds the GPU in an exclusive mode,
 * since the placement): the job goes back to the queue and the daemon places nothing more on
 * that device for a pause, longer each time in a row it is found busy — 3 s, 10 s, 30 s, then
 * 60 s — in ms for the `streak`-th busy report (≥ 1). A job turned away TQ_BUSY_MAX_TRIES times
 * in a row fails as device_unavailable (about 5 minutes of pauses). */
#define TQ_BUSY_MAX_TRIES 8
int tq_busy_pause_ms(int streak);

/* The host's MemAvailable (/proc/meminfo) in bytes, -1 unknown: what the CPU budget defaults
 * from and GET /v1/devices shows. Reads a file; thread-safe. */
long long tq_host_mem_available(void);
#endif
