/* models.h — the architectures of CONTRACT.md as graphs, and their initialisation.
 * tq_model_build returns NULL with a message for an input shape the model cannot take
 * (e.g. cnn needs H and W divisible by 4). */
#ifndef TQ_MODELS_H
#define TQ_MODELS_H
#include "graph.h"
#include "spec.h"

tq_graph *tq_model_build(tq_model_kind m, int batch, int h, int w, int c, int classes,
                         tq_dtype dt, char *err, size_t errlen);
/* PyTorch-style initialisation into host buffers (params: nparam_elems f32; buffers:
 * nbuffer_elems f32; counts: nbn int64), from tq_rng_make(seed, TQ_RNG_INIT, param index). */
void tq_model_init(const tq_graph *g, uint64_t seed, float *params, float *buffers, int64_t *counts);
#endif
