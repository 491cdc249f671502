/* checkpoint.h — model exports and training checkpoints as safetensors with PyTorch's names
 * and layouts (conv [out,in,kh,kw], linear [out,in] with a (C,H,W) flatten, batch-norm
 * running stats, num_batches_tracked as int64), so load_state_dict(strict=True) works.
 * A checkpoint adds the flat optimizer state and, in __metadata__, the step, the optimizer's
 * step count and the loss-scaler state. Writes are atomic (tmp, fsync, rename).
 * Errors: TQ_EIO / TQ_EDATA with a message naming the file and the problem. */
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
/* resume: the model, the optimizer state and st */
int tq_load_checkpoint(tq_engine *e, const char *path, tq_ckpt_state *st, char *err, size_t errlen);
/* host-side initialisation upload (fresh start) */
int tq_engine_init_weights(tq_engine *e, uint64_t seed);
#endif
