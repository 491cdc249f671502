/* profile.h — where a training step's time goes, op by op (`trainq run --profile FILE`).
 *
 * tq_prof_attach puts a timing table in front of a backend's op table (be->i): every op that
 * the engine and the trainer issue passes through it. While the profile is on (tq_prof_set),
 * each compute, data and memory op is timed on the host's monotonic clock with the backend
 * synchronized before and after it, so that an op of an asynchronous device is charged its
 * own time, its launch included. The ops themselves run unchanged: a profiled run gives the
 * same bits as an unprofiled one, only slower (a sync per op, and no CUDA graph).
 *
 * Per (op, dtype, shape) it keeps calls and time, and what the op must do: the FLOPs of
 * convolutions and linear layers (2 per multiply-add), and for every op the least memory
 * traffic it needs (each input read once, each output written once, an accumulated output
 * read too), from which the report gives GFLOP/s and GB/s. floor_ms, what the cheapest op costs
 * between syncs on this backend (a 4-byte memset0 of the caller's scratch: its launch, the
 * sync, the clock reads), measured at attach, is taken off each call's time for the rates.
 * The trainer counts steps (tq_prof_step) so that the report is per step.
 *
 * Not thread-safe: one backend, one thread, as the backends themselves. Never exits. */
#ifndef TQ_PROFILE_H
#define TQ_PROFILE_H
#include <stdio.h>
#include "backend.h"

typedef struct tq_prof tq_prof;

typedef struct {
    char op[24], dtype[12], shape[80];
    const char *kind;        /* conv, linear, batchnorm, elementwise, pooling, loss, optimizer, data, memory */
    long long calls;
    double ms;               /* host time of all calls, syncs included */
    double flops, bytes;     /* per call */
} tq_prof_entry;

/* NULL when out of memory (the backend is left as it was). scratch4: 4 bytes of the backend's
 * memory the calibration may zero (NULL: calibrate with syncs alone). */
tq_prof *tq_prof_attach(tq_backend *be, void *scratch4);
/* Time the ops from now on (1) or pass them through untimed (0, the state after attach). */
void tq_prof_set(tq_prof *p, int on);
/* One profiled step ended; step_ms is its time as the trainer measured it. */
void tq_prof_step(tq_prof *p, double step_ms);
/* Gives the backend its own op table back; the data stay for the report. */
void tq_prof_detach(tq_prof *p);
void tq_prof_free(tq_prof *p);

/* The entries, most time first (valid until the next op or tq_prof_free). */
const tq_prof_entry *tq_prof_entries(tq_prof *p, int *n);
long long tq_prof_steps(const tq_prof *p);

/* What the report says of the run besides the ops. */
typedef struct {
    const char *device, *model, *amp;
    int batch_size, accum_steps, threads, warmup_steps;
} tq_prof_meta;

/* The report as JSON into path (written to path.tmp, then renamed); 0, or -1 with err set. */
int tq_prof_write(tq_prof *p, const tq_prof_meta *m, const char *path, char *err, size_t errlen);
/* The report as a table: the totals, the time by kind, then the `top` costliest entries. */
void tq_prof_print(tq_prof *p, const tq_prof_meta *m, FILE *f, int top);
#endif
