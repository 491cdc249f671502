/* trainer.h — runs one job: data, model, plan, the training loop with AMP, accumulation,
 * schedules, evaluations, checkpoints, and the summary. Used by `trainq run` and by the
 * daemon's worker.
 *
 * Contract: tq_train never exits; expected failures (missing or corrupt data, a corrupt
 * init_from or checkpoint, a plan over max_memory_mb, an out-of-memory, a backend error) end
 * with summary.state "failed", summary.error_code/message set, and a non-zero return.
 * Records go through opts->cb on the caller's thread. Files (model.safetensors,
 * checkpoint.safetensors) go to opts->out_dir when it is set. */
#ifndef TQ_TRAINER_H
#define TQ_TRAINER_H
#include "engine.h"
#include "records.h"
#include "spec.h"

typedef struct {
    const char *out_dir;     /* NULL: write no files */
    int resume;              /* continue from out_dir/checkpoint.safetensors when it exists */
    tq_callbacks cb;
    long long mem_limit;     /* > 0: the bytes this job may hold on its device (its planned share
                              * of a device other jobs use too): a plan over it fails before any
                              * step, an allocation past it fails the job (out_of_memory) */
    const char *profile;     /* NULL, or where to write the run's per-op profile (profile.h): the
                              * step is issued from the host (no CUDA graph), the first steps
                              * (up to 3, at most half) are left out, a table goes to stderr */
    int placed;              /* 1: the daemon placed the job on spec->device (trainq worker): a
                              * device that cannot be opened is reported as the placement's, with
                              * the requeue that retries it, not as the spec's choice, and one
                              * found busy sets the summary's device_busy; 2: placed, and the
                              * placement saw the driver's free memory hold the plan, so a device
                              * with less free than the plan now is busy too (not the job's fault) */
    void (*on_ready)(void *ctx);   /* NULL, or called once when the device holds the job's engine
                                    * and data (it works: the daemon ends a busy device's pause) */
    void *ready_ctx;
} tq_run_opts;

int tq_train(const tq_spec *spec, const tq_run_opts *opts, tq_summary *sum);

/* The plan of a spec without training (`trainq plan`): builds the model on the dataset's
 * shape (read from the dataset's headers: the data is loaded). */
typedef struct {
    tq_plan plan;
    char model[16], amp[8];
    int batch_size, h, w, c;
} tq_plan_report;
int tq_plan_spec(const tq_spec *spec, tq_plan_report *rep, char *code, size_t codelen,
                 char *err, size_t errlen);

/* The CUDA context, cuDNN/cuBLAS handles and module images a GPU job holds beyond its
 * allocations, as placement counts it (measured on an H200, driver 580, CUDA 13: device use
 * 556-565 MiB above the allocator's bytes, docs/gpu-check.md), and the bound on the cuDNN
 * workspace a GPU plan may take beyond the CPU plan's (kernels/cuda/cuda_conv.c's WS_CAP). */
#define TQ_GPU_CONTEXT_BYTES (640LL << 20)
#define TQ_GPU_WORKSPACE_BOUND (256LL << 20)

/* The CUDA backend's TF32 flags (backend.h TQ_TF32_*_OK) for a spec's tf32: off none, conv
 * (the default, PyTorch's: cudnn.allow_tf32 on, cuda.matmul.allow_tf32 off) convolutions
 * only, all convolutions and GEMMs. f32 data only; the CPU backend ignores it. */
unsigned tq_tf32_backend_flags(tq_tf32 t);

/* learning rate of (0-based) step s of `total` */
double tq_lr_at(const tq_spec *spec, int64_t s, int64_t total);
#endif
