/* records.h — what the trainer reports: one record per optimizer step, one per evaluation,
 * and the summary at the end; delivered through callbacks that `trainq run` and the daemon's
 * worker implement (progress bar, SQLite writer, SSE...). Field names are CONTRACT.md's.
 * Callbacks run on the trainer's thread; a non-zero return from on_step/on_eval fails the job
 * with that status (e.g. the database is gone). */
#ifndef TQ_RECORDS_H
#define TQ_RECORDS_H
#include <stdint.h>

typedef struct {
    int64_t step;            /* 1-based optimizer step */
    int epoch;               /* 0-based epoch the step belongs to */
    double loss;             /* mean over its micro-batches, unscaled */
    double lr;
    double loss_scale;       /* < 0: null (not fp16) */
    int skipped;             /* fp16 overflow skipped the update */
    double step_ms, samples_per_s;
    int64_t mem_allocated_bytes, mem_peak_bytes, mem_reserved_bytes;
    int64_t device_used_bytes;   /* < 0: null (CPU) */
    int64_t time_ms;         /* unix milliseconds */
    int64_t total_steps;     /* for progress display, not stored */
} tq_step_rec;

typedef enum { TQ_EVAL_EVAL = 0, TQ_EVAL_PRUNED = 1, TQ_EVAL_INT8 = 2 } tq_eval_kind;

typedef struct {
    int64_t step;
    int epoch;
    double loss, accuracy;
    int64_t samples;
    tq_eval_kind kind;
    int64_t time_ms;
} tq_eval_rec;

typedef struct {
    char state[16];          /* succeeded | failed | cancelled */
    int64_t steps, samples;
    double epochs, wall_s, samples_per_s, step_ms_median;
    double final_loss, val_loss, val_accuracy;   /* NaN: null */
    int64_t peak_memory_bytes, predicted_peak_bytes, device_peak_used_bytes; /* <0: null */
    int64_t skipped_steps;
    double final_loss_scale;  /* < 0: null */
    int64_t effective_batch;
    char amp[8];             /* off | fp16 | bf16 */
    char device[32];
    char tf32[8];            /* on a CUDA device: off | conv | all (spec tf32); "" (null) on the CPU */
    char cuda_graphs[16];    /* off | captured | uncaptured | capture_failed | not_cuda (asked for on the CPU) */
    char error_code[32];     /* "" when none */
    char error_message[512];
    int device_busy;         /* 1: failed because the device the daemon placed it on was busy
                              * (tq_run_opts.placed): the worker puts it back in the queue */
} tq_summary;

typedef struct {
    void *ctx;
    int (*on_step)(void *ctx, const tq_step_rec *);
    int (*on_eval)(void *ctx, const tq_eval_rec *);
    /* polled at every step boundary: non-zero asks the trainer to checkpoint and stop
     * (1 = cancel, 2 = requeue) */
    int (*should_stop)(void *ctx);
    /* after a checkpoint file was written durably at `step` */
    void (*on_checkpoint)(void *ctx, int64_t step, const char *path);
} tq_callbacks;

#endif
