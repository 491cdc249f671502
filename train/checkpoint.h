/* checkpoint.h — model exports and training checkpoints as safetensors with PyTorch's names
 * and layouts (conv [out,in,kh,kw], linear [out,in] with a (C,H,W) flatten, batch-norm
 * running stats, num_batches_tracked as int64), so load_state_dict(strict=True) works.
 * A checkpoint adds the flat optimizer state and, in __metadata__, the step, the optimizer's
 * step count and the loss-scaler state. Writes are atomic (tmp, fsync, rename).
 * Errors: TQ_EIO / TQ_EDATA with a message naming the file and the problem.
 *
 * Loading is validation of untrusted input (a checkpoint or init_from may be any file): nothing
 * here trusts a number it reads. Every tensor of the model must be present with the model's
 * shape and dtype (F32; num_batches_tracked I64 in 0..2^62), finite, and nothing else may be in
 * the file but the optimizer state (F32, shape [nparam_elems], finite). A checkpoint's
 * __metadata__ strings are parsed strictly (the whole string, no whitespace or '+'; integers
 * decimal int64, loss_scale a finite decimal number) and checked against each other and the
 * job (tq_ckpt_limits): 0 <= step <= total_steps; opt_t and skipped_steps in 0..step with
 * opt_t + skipped_steps == step (every step is applied or skipped); growth_tracker in
 * 0..min(step, growth_interval - 1); loss_scale > 0 and finite as a float. A failure is
 * TQ_EDATA with a message that names the field and the allowed range, e.g.
 * `PATH: checkpoint metadata "step" is -5: must be 0..40`; the engine is then unchanged
 * (nothing is uploaded before everything has been checked) and *st is not written. */
#ifndef TQ_CHECKPOINT_H
#define TQ_CHECKPOINT_H
#include "engine.h"

typedef struct {
    int64_t step;            /* optimizer steps done */
    int64_t opt_t;           /* optimizer steps applied (AdamW's t) */
    double loss_scale;
    int64_t growth_tracker;
    int64_t skipped_steps;
} tq_ckpt_state;

/* model.safetensors: the model's state_dict only */
int tq_export_model(const tq_engine *e, const char *path, char *err, size_t errlen);
/* checkpoint: state_dict + optimizer state + st */
int tq_save_checkpoint(const tq_engine *e, const char *path, const tq_ckpt_state *st, char *err, size_t errlen);
/* init_from: loads every tensor of the state_dict (all must be present with the right shapes;
 * unknown names are an error too — strict, as load_state_dict(strict=True)). */
int tq_load_model(tq_engine *e, const char *path, char *err, size_t errlen);
/* What the job being resumed allows (the trainer fills it from the spec). */
typedef struct {
    int64_t total_steps;     /* the job's optimizer steps: step must be 0..total_steps (< 0: unchecked) */
    int growth_interval;     /* fp16: the scaler's growth_interval, growth_tracker < it (0: unchecked) */
} tq_ckpt_limits;
/* resume: the model, the optimizer state and st, all checked (see above). lim may be NULL
 * (no job-relative bounds; the metadata's own consistency is still checked). */
int tq_load_checkpoint(tq_engine *e, const char *path, const tq_ckpt_limits *lim, tq_ckpt_state *st,
                       char *err, size_t errlen);
/* host-side initialisation upload (fresh start) */
int tq_engine_init_weights(tq_engine *e, uint64_t seed);
#endif
