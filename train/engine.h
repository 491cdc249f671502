/* engine.h — a planned graph bound to a backend: the flat buffers, the arena, forward and
 * backward over one micro-batch, and the memory measurements.
 *
 * Contract
 * - tq_engine_plan computes the memory plan (bytes by category) without allocating anything:
 *   this is `trainq plan`. tq_engine_new allocates exactly those regions, one backend
 *   allocation each; nothing is allocated afterwards.
 * - During a training micro-batch every tensor is acquired at the start of its lifetime and
 *   released at its end; acquiring checks that no live tensor overlaps it (an invariant of the
 *   planner) and the high-water mark of the arena in use is measured, so the step records carry
 *   measured, not copied, figures.
 * - Errors from the backend are returned as TQ_E* with the message in be->err.
 */
#ifndef TQ_ENGINE_H
#define TQ_ENGINE_H
#include "graph.h"
#include "spec.h"

typedef struct {
    size_t params, grads, optimizer, activations, workspace, total;  /* total = sum of these */
    size_t data;              /* the dataset on the device (uint8), not in total */
    size_t nparameters;
} tq_plan;

typedef struct {
    tq_backend *be;
    tq_graph *g;
    tq_dtype dt;
    tq_opt_kind opt;
    int momentum_buf;         /* sgd with momentum: one state buffer */
    float *params, *grads, *opt_a, *opt_b, *buffers;  /* device, f32 */
    void *wlow;               /* device, dt: working copy of params (amp only) */
    char *arena;
    void *ws; size_t ws_bytes;
    float *scalars;           /* device: [0] loss sum, [1] hits, [2] found_inf; the device-step
                               * structs at TQ_SCALARS_DSTATE / TQ_SCALARS_DIN (bytes) */
    int32_t *idx;             /* device: batch sample indices */
    tq_aug *aug;              /* device: batch augmentation draws */
    int64_t *counts;          /* host: num_batches_tracked per bn */
    /* the step on the device (cuda_graphs, train/trainer.c): when set, the training loss reads
     * its grad_scale from this state (softmax_ce_dyn with dstep_accum) instead of the argument */
    const tq_dstep_state *dstate;
    int dstep_accum;
    tq_plan plan;
    size_t persistent_bytes;  /* params + grads + optimizer */
    /* measured during the current micro-batch */
    size_t live_bytes, extent_peak, live_peak;
    char *live;
    int *acq_first, *acq_list, *rel_first, *rel_list;   /* tensors by schedule time */
} tq_engine;

/* Builds nothing on the device. `h,w,c` is the input shape. */
void tq_engine_plan(const tq_graph *g, tq_opt_kind opt, int momentum_buf, size_t data_bytes,
                    tq_plan *out);
int tq_engine_new(tq_engine *e, tq_backend *be, tq_graph *g, tq_opt_kind opt, int momentum_buf,
                  char *err, size_t errlen);
void tq_engine_free(tq_engine *e);

static inline void *tq_tdata(const tq_engine *e, int t) { return e->arena + e->g->tensors[t].offset; }
/* the weights a conv/linear reads: the reduced copy under amp, the masters otherwise */
static inline const void *tq_wdata(const tq_engine *e, size_t off) {
    return e->wlow ? (const void *)((char *)e->wlow + off * tq_dtype_size(e->dt))
                   : (const void *)(e->params + off);
}

/* One training micro-batch on the batch already in the input/labels tensors: forward, loss
 * (adds to scalars[0..1]) with dlogits = grad_scale·(p − onehot)/n, backward into grads. */
int tq_engine_train_microbatch(tq_engine *e, float grad_scale);
/* Inference forward of n ≤ batch samples (batch-norm with running statistics); adds the loss
 * sum and hits to scalars[0..1]. */
int tq_engine_eval_batch(tq_engine *e, int n);
/* After the optimizer step under amp: refresh the reduced working copy. */
int tq_engine_refresh_wlow(tq_engine *e);

/* Where the device-step structs live in the scalars region (256 bytes): the state the device
 * owns, and the values the host writes before each step. */
#define TQ_SCALARS_DSTATE 64
#define TQ_SCALARS_DIN 128
static inline tq_dstep_state *tq_engine_dstate(const tq_engine *e) {
    return (tq_dstep_state *)(void *)((char *)e->scalars + TQ_SCALARS_DSTATE);
}
static inline tq_dstep_in *tq_engine_din(const tq_engine *e) {
    return (tq_dstep_in *)(void *)((char *)e->scalars + TQ_SCALARS_DIN);
}
/* What a training micro-batch does on the host besides its ops (each batch-norm's
 * num_batches_tracked): for a micro-batch replayed from a captured graph. */
void tq_engine_count_microbatch(tq_engine *e);
#endif
