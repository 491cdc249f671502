/* engine.c — execution of a planned graph on a backend (see engine.h). */
#include "engine.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MISC_BYTES 256
_Static_assert(TQ_SCALARS_DSTATE >= 3 * sizeof(float) && TQ_SCALARS_DSTATE % 8 == 0 &&
               TQ_SCALARS_DSTATE + sizeof(tq_dstep_state) <= TQ_SCALARS_DIN &&
               TQ_SCALARS_DIN + sizeof(tq_dstep_in) <= MISC_BYTES,
               "the device-step structs must fit the scalars region");

static size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

static size_t staging_bytes(const tq_graph *g) {
    return align256(MISC_BYTES) + align256((size_t)g->batch * sizeof(int32_t)) +
           align256((size_t)g->batch * sizeof(tq_aug));
}

void tq_engine_plan(const tq_graph *g, tq_opt_kind opt, int momentum_buf, size_t data_bytes,
                    tq_plan *p) {
    TQ_ASSERT(g->planned);
    size_t P = g->nparam_elems, B = g->nbuffer_elems;
    memset(p, 0, sizeof *p);
    p->params = align256(P * 4) + align256(B * 4) +
                (g->dt != TQ_F32 ? align256(P * tq_dtype_size(g->dt)) : 0);
    p->grads = align256(P * 4);
    p->optimizer = opt == TQ_OPT_ADAMW ? 2 * align256(P * 4) : momentum_buf ? align256(P * 4) : 0;
    p->activations = g->arena_bytes;
    p->workspace = g->workspace_bytes + staging_bytes(g);
    p->total = p->params + p->grads + p->optimizer + p->activations + p->workspace;
    p->data = data_bytes;
    p->nparameters = g->nparameters;
}

static void *region(tq_engine *e, size_t bytes, int *ok) {
    if (bytes == 0) return NULL;
    void *p = e->be->i->alloc(e->be, align256(bytes));
    if (!p) *ok = 0;
    return p;
}

/* per-time lists of tensors to acquire / release */
static void build_schedule(tq_engine *e) {
    const tq_graph *g = e->g;
    int T = 2 * (g->nnodes - 1) + 1, nt = g->ntensors;
    e->acq_first = calloc(T + 1, sizeof(int));
    e->rel_first = calloc(T + 1, sizeof(int));
    e->acq_list = malloc(sizeof(int) * nt);
    e->rel_list = malloc(sizeof(int) * nt);
    e->live = calloc(nt, 1);
    TQ_ASSERT(e->acq_first && e->rel_first && e->acq_list && e->rel_list && e->live);
    for (int t = 0; t < nt; t++) {
        if (g->tensors[t].t_begin < 0) continue;   /* never used (fusion) */
        e->acq_first[g->tensors[t].t_begin + 1]++;
        e->rel_first[g->tensors[t].t_end + 1]++;
    }
    for (int i = 0; i < T; i++) { e->acq_first[i + 1] += e->acq_first[i]; e->rel_first[i + 1] += e->rel_first[i]; }
    int *ai = calloc(T, sizeof(int)), *ri = calloc(T, sizeof(int));
    TQ_ASSERT(ai && ri);
    for (int t = 0; t < nt; t++) {
        int b = g->tensors[t].t_begin, en = g->tensors[t].t_end;
        if (b < 0) continue;
        e->acq_list[e->acq_first[b] + ai[b]++] = t;
        e->rel_list[e->rel_first[en] + ri[en]++] = t;
    }
    free(ai); free(ri);
}

int tq_engine_new(tq_engine *e, tq_backend *be, tq_graph *g, tq_opt_kind opt, int momentum_buf,
                  char *err, size_t errlen) {
    memset(e, 0, sizeof *e);
    e->be = be; e->g = g; e->dt = g->dt; e->opt = opt; e->momentum_buf = momentum_buf;
    tq_engine_plan(g, opt, momentum_buf, 0, &e->plan);
    size_t P = g->nparam_elems, B = g->nbuffer_elems;
    int ok = 1;
    e->params = region(e, P * 4, &ok);
    e->buffers = region(e, B * 4, &ok);
    if (g->dt != TQ_F32) e->wlow = region(e, P * tq_dtype_size(g->dt), &ok);
    e->grads = region(e, P * 4, &ok);
    if (opt == TQ_OPT_ADAMW) { e->opt_a = region(e, P * 4, &ok); e->opt_b = region(e, P * 4, &ok); }
    else if (momentum_buf) e->opt_a = region(e, P * 4, &ok);
    e->arena = region(e, g->arena_bytes, &ok);
    e->ws_bytes = g->workspace_bytes;
    e->ws = region(e, g->workspace_bytes, &ok);
    e->scalars = region(e, MISC_BYTES, &ok);
    e->idx = region(e, (size_t)g->batch * sizeof(int32_t), &ok);
    e->aug = region(e, (size_t)g->batch * sizeof(tq_aug), &ok);
    e->counts = calloc(g->nbn ? g->nbn : 1, sizeof(int64_t));
    if (!ok || !e->counts) {
        snprintf(err, errlen, "out of memory allocating %zu bytes for the model (%s backend)",
                 e->plan.total, be->i->name);
        tq_engine_free(e);
        return TQ_ENOMEM;
    }
    e->persistent_bytes = e->plan.params + e->plan.grads + e->plan.optimizer;
    unsigned nerr = be->nerr;   /* memset0 returns nothing: a GPU's failure moves nerr */
    if (e->opt_a) be->i->memset0(be, e->opt_a, P * 4);
    if (e->opt_b) be->i->memset0(be, e->opt_b, P * 4);
    be->i->memset0(be, e->grads, P * 4);
    be->i->memset0(be, e->scalars, MISC_BYTES);
    if (be->nerr != nerr) {
        snprintf(err, errlen, "zeroing the optimizer state on the device failed: %s", be->err);
        tq_engine_free(e);
        return TQ_EDEVICE;
    }
    build_schedule(e);
    return TQ_OK;
}

void tq_engine_free(tq_engine *e) {
    tq_backend *be = e->be;
    void *regions[] = {e->params, e->buffers, e->wlow, e->grads, e->opt_a, e->opt_b, e->arena,
                       e->ws, e->scalars, e->idx, e->aug};
    for (size_t i = 0; i < sizeof regions / sizeof regions[0]; i++)
        if (regions[i]) be->i->free(be, regions[i]);
    free(e->counts); free(e->live);
    free(e->acq_first); free(e->acq_list); free(e->rel_first); free(e->rel_list);
    memset(e, 0, sizeof *e);
}

int tq_engine_refresh_wlow(tq_engine *e) {
    if (!e->wlow) return TQ_OK;
    return e->be->i->cast(e->be, e->g->nparam_elems, e->dt, e->wlow, TQ_F32, e->params);
}

/* ---- memory tracking over the schedule ---- */
static void acquire(tq_engine *e, int time) {
    const tq_graph *g = e->g;
    for (int k = e->acq_first[time]; k < e->acq_first[time + 1]; k++) {
        int t = e->acq_list[k];
        const tq_tensor *a = &g->tensors[t];
        for (int u = 0; u < g->ntensors; u++) {
            if (!e->live[u]) continue;
            const tq_tensor *b = &g->tensors[u];
            TQ_ASSERT(a->offset + a->bytes <= b->offset || b->offset + b->bytes <= a->offset);
        }
        e->live[t] = 1;
        e->live_bytes += a->bytes;
        if (e->live_bytes > e->live_peak) e->live_peak = e->live_bytes;
        if (a->offset + a->bytes > e->extent_peak) e->extent_peak = a->offset + a->bytes;
    }
}
static void release(tq_engine *e, int time) {
    for (int k = e->rel_first[time]; k < e->rel_first[time + 1]; k++) {
        int t = e->rel_list[k];
        TQ_ASSERT(e->live[t]);
        e->live[t] = 0;
        e->live_bytes -= e->g->tensors[t].bytes;
    }
}

#define CHK(call) do { int rc_ = (call); if (rc_) return rc_; } while (0)

static int forward_node(tq_engine *e, const tq_node *nd, int n, int train, float grad_scale) {
    tq_backend *be = e->be;
    const tq_backend_i *I = be->i;
    const tq_graph *g = e->g;
    tq_dtype dt = e->dt;
    void *y = nd->out >= 0 ? tq_tdata(e, nd->out) : NULL;
    const void *x = nd->nin ? tq_tdata(e, nd->in[0]) : NULL;
    tq_shape xs = nd->nin ? g->tensors[nd->in[0]].shape : (tq_shape){0, 0, 0, 0};
    xs.n = n;
    if (nd->fused) return TQ_OK;   /* a ReLU or add whose output a BN's epilogue wrote */
    void *bny = nd->fuse_out >= 0 ? tq_tdata(e, nd->fuse_out) : y;
    const void *bnres = nd->fuse_res >= 0 ? tq_tdata(e, nd->fuse_res) : NULL;
    switch (nd->op) {
    case TQ_OP_INPUT: return TQ_OK;
    case TQ_OP_CONV: {
        tq_conv_desc cd = nd->cd; cd.x.n = n;
        return I->conv_fwd(be, &cd, dt, y, x, tq_wdata(e, nd->w_off),
                           nd->b_off == TQ_NONE ? NULL : e->params + nd->b_off, e->ws, e->ws_bytes);
    }
    case TQ_OP_BN:
        if (train) {
            e->counts[nd->bn_index]++;
            return I->bn_fwd_train(be, xs, dt, bny, x, e->params + nd->g_off, e->params + nd->bt_off,
                                   tq_tdata(e, nd->stat[0]), tq_tdata(e, nd->stat[1]),
                                   e->buffers + nd->rm_off, e->buffers + nd->rv_off, 0.1f, 1e-5f,
                                   bnres, nd->fuse_out >= 0);
        }
        return I->bn_fwd_infer(be, xs, dt, bny, x, e->params + nd->g_off, e->params + nd->bt_off,
                               e->buffers + nd->rm_off, e->buffers + nd->rv_off, 1e-5f, bnres,
                               nd->fuse_out >= 0);
    case TQ_OP_RELU: return I->relu_fwd(be, tq_shape_numel(xs), dt, y, x);
    case TQ_OP_ADD: return I->add_fwd(be, tq_shape_numel(xs), dt, y, x, tq_tdata(e, nd->in[1]));
    case TQ_OP_MAXPOOL: return I->maxpool_fwd(be, xs, dt, y, x, nd->pool_relu);
    case TQ_OP_AVGPOOL: return I->avgpool_fwd(be, xs, dt, y, x);
    case TQ_OP_LINEAR:
        return I->linear_fwd(be, n, nd->lin_in, nd->lin_out, dt, y, x, tq_wdata(e, nd->w_off),
                             e->params + nd->b_off, e->ws, e->ws_bytes);
    case TQ_OP_LOSS: {
        const int32_t *lab = tq_tdata(e, nd->in[1]);
        if (train && e->dstate)
            return I->softmax_ce_dyn(be, n, g->classes, dt, tq_tdata(e, g->tensors[nd->in[0]].grad), x,
                                     lab, e->dstate, e->dstep_accum, e->scalars);
        if (train)
            return I->softmax_ce(be, n, g->classes, dt, tq_tdata(e, g->tensors[nd->in[0]].grad), x,
                                 lab, grad_scale, e->scalars);
        return I->softmax_ce_eval(be, n, g->classes, dt, x, lab, e->scalars);
    }
    }
    return TQ_EINVAL;
}

static int backward_node(tq_engine *e, const tq_node *nd) {
    tq_backend *be = e->be;
    const tq_backend_i *I = be->i;
    const tq_graph *g = e->g;
    tq_dtype dt = e->dt;
    int n = g->batch;
    if (nd->bwd_by >= 0) return TQ_OK;   /* a ReLU or add whose backward a BN's does */
    int gy = g->tensors[nd->bwd_relu >= 0 ? g->nodes[nd->bwd_relu].out : nd->out].grad;
    const void *dy = tq_tdata(e, gy);
    const void *x = tq_tdata(e, nd->in[0]);
    void *dx = nd->need_din[0] ? tq_tdata(e, g->tensors[nd->in[0]].grad) : NULL;
    tq_shape xs = g->tensors[nd->in[0]].shape;
    switch (nd->op) {
    case TQ_OP_CONV:
        x = tq_tdata(e, nd->bwd_x);
        if (nd->remat >= 0) {   /* regenerate x = relu(bn(·) [+ res]) from the BN's saved input */
            const tq_remat *rm = &g->remats[nd->remat];
            const tq_node *bn = &g->nodes[rm->bn];
            CHK(I->bn_norm(be, g->tensors[bn->in[0]].shape, dt, tq_tdata(e, rm->dst),
                           tq_tdata(e, bn->in[0]), rm->res >= 0 ? tq_tdata(e, rm->res) : NULL,
                           e->params + bn->g_off, e->params + bn->bt_off,
                           tq_tdata(e, bn->stat[0]), tq_tdata(e, bn->stat[1]), 1));
        }
        if (dx) CHK(I->conv_bwd_data(be, &nd->cd, dt, dx, nd->din_beta[0], dy, tq_wdata(e, nd->w_off),
                                     e->ws, e->ws_bytes));
        return I->conv_bwd_filter(be, &nd->cd, dt, e->grads + nd->w_off,
                                  nd->b_off == TQ_NONE ? NULL : e->grads + nd->b_off, x, dy, e->ws,
                                  e->ws_bytes);
    case TQ_OP_LINEAR:
        if (dx) CHK(I->linear_bwd_data(be, n, nd->lin_in, nd->lin_out, dt, dx, nd->din_beta[0], dy,
                                       tq_wdata(e, nd->w_off), e->ws, e->ws_bytes));
        return I->linear_bwd_filter(be, n, nd->lin_in, nd->lin_out, dt, e->grads + nd->w_off,
                                    e->grads + nd->b_off, x, dy, e->ws, e->ws_bytes);
    case TQ_OP_BN:
        TQ_ASSERT(dx);
        return I->bn_bwd(be, xs, dt, dx, nd->din_beta[0], e->grads + nd->g_off, e->grads + nd->bt_off,
                         dy, x, e->params + nd->g_off, tq_tdata(e, nd->stat[0]), tq_tdata(e, nd->stat[1]),
                         nd->bwd_relu >= 0 ? tq_tdata(e, g->nodes[nd->bwd_relu].bwd_y) : NULL,
                         nd->bwd_res >= 0 ? tq_tdata(e, g->tensors[nd->bwd_res].grad) : NULL,
                         nd->dres_beta);
    case TQ_OP_RELU:
        TQ_ASSERT(dx);
        return I->relu_bwd(be, tq_shape_numel(xs), dt, dx, nd->din_beta[0], dy, tq_tdata(e, nd->bwd_y));
    case TQ_OP_ADD:
        if (dx) CHK(I->accumulate(be, tq_shape_numel(xs), dt, dx, nd->din_beta[0], dy));
        if (nd->need_din[1])
            CHK(I->accumulate(be, tq_shape_numel(xs), dt, tq_tdata(e, g->tensors[nd->in[1]].grad),
                              nd->din_beta[1], dy));
        return TQ_OK;
    case TQ_OP_MAXPOOL:
        TQ_ASSERT(dx);
        return I->maxpool_bwd(be, xs, dt, dx, nd->din_beta[0], dy, x, nd->pool_relu);
    case TQ_OP_AVGPOOL:
        TQ_ASSERT(dx);
        return I->avgpool_bwd(be, xs, dt, dx, nd->din_beta[0], dy);
    default:
        return TQ_OK;
    }
}

int tq_engine_train_microbatch(tq_engine *e, float grad_scale) {
    const tq_graph *g = e->g;
    int L = g->nnodes - 1;
    e->live_bytes = e->live_peak = e->extent_peak = 0;
    memset(e->live, 0, g->ntensors);
    for (int i = 0; i <= L; i++) {
        acquire(e, i);
        CHK(forward_node(e, &g->nodes[i], g->batch, 1, grad_scale));
        release(e, i);
    }
    for (int i = L - 1; i >= 1; i--) {
        int t = tq_bwd_time(g, i);
        acquire(e, t);
        CHK(backward_node(e, &g->nodes[i]));
        release(e, t);
    }
    release(e, tq_bwd_time(g, 0));
    TQ_ASSERT(e->live_bytes == 0);
    return TQ_OK;
}

void tq_engine_count_microbatch(tq_engine *e) {
    const tq_graph *g = e->g;
    for (int i = 0; i < g->nnodes; i++)   /* forward_node's count: every BN (none is ever fused) */
        if (g->nodes[i].op == TQ_OP_BN && !g->nodes[i].fused) e->counts[g->nodes[i].bn_index]++;
}

int tq_engine_eval_batch(tq_engine *e, int n) {
    const tq_graph *g = e->g;
    TQ_ASSERT(n >= 1 && n <= g->batch);
    for (int i = 0; i < g->nnodes; i++) CHK(forward_node(e, &g->nodes[i], n, 0, 1.0f));
    return TQ_OK;
}
