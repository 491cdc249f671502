/* graph.c — builders, lifetimes and the arena planner (see graph.h). */
#include "graph.h"
#include "util.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN_BYTES 256
#define PARAM_ALIGN 64   /* elements */

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static void *grow(void *p, int *cap, int need, size_t elem) {
    if (need <= *cap) return p;
    int nc = *cap ? *cap * 2 : 32;
    while (nc < need) nc *= 2;
    void *q = realloc(p, (size_t)nc * elem);
    TQ_ASSERT(q != NULL);
    memset((char *)q + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *cap = nc;
    return q;
}

static int new_tensor(tq_graph *g, tq_shape s, tq_dtype dt, tq_tensor_kind kind) {
    g->tensors = grow(g->tensors, &g->cap_tensors, g->ntensors + 1, sizeof(tq_tensor));
    tq_tensor *t = &g->tensors[g->ntensors];
    t->shape = s; t->dt = dt; t->kind = kind;
    size_t esz = kind == TQ_T_STAT || kind == TQ_T_LABELS ? 4 : tq_dtype_size(dt);
    t->bytes = align_up(tq_shape_numel(s) * esz, ALIGN_BYTES);
    t->t_begin = t->t_end = -1;
    t->grad = -1;
    return g->ntensors++;
}

static tq_node *new_node(tq_graph *g, tq_op op) {
    TQ_ASSERT(!g->planned);
    g->nodes = grow(g->nodes, &g->cap_nodes, g->nnodes + 1, sizeof(tq_node));
    tq_node *n = &g->nodes[g->nnodes++];
    n->op = op;
    n->in[0] = n->in[1] = n->out = n->stat[0] = n->stat[1] = -1;
    n->w_off = n->b_off = n->g_off = n->bt_off = n->rm_off = n->rv_off = TQ_NONE;
    n->bn_index = -1;
    n->bwd_x = n->bwd_y = n->remat = n->fuse_out = n->fuse_res = -1;
    n->bwd_by = n->bwd_relu = n->bwd_res = -1;
    return n;
}

tq_graph *tq_graph_new(int batch, int h, int w, int c, tq_dtype dt) {
    tq_graph *g = calloc(1, sizeof *g);
    TQ_ASSERT(g != NULL);
    g->dt = dt;
    g->batch = batch;
    tq_node *n = new_node(g, TQ_OP_INPUT);
    g->input = n->out = new_tensor(g, (tq_shape){batch, h, w, c}, dt, TQ_T_ACT);
    g->labels = new_tensor(g, (tq_shape){batch, 1, 1, 1}, TQ_F32, TQ_T_LABELS);
    return g;
}

void tq_graph_free(tq_graph *g) {
    if (!g) return;
    free(g->nodes); free(g->tensors); free(g->params); free(g->remats); free(g);
}

void tq_graph_push_scope(tq_graph *g, const char *fmt, ...) {
    TQ_ASSERT(g->nscope < 8);
    va_list ap; va_start(ap, fmt);
    vsnprintf(g->scope[g->nscope++], sizeof g->scope[0], fmt, ap);
    va_end(ap);
}
void tq_graph_pop_scope(tq_graph *g) { TQ_ASSERT(g->nscope > 0); g->nscope--; }

/* Registers a parameter (or buffer) named scope.name.suffix; returns its element offset. */
static size_t add_param(tq_graph *g, const char *name, const char *suffix, tq_pbuf where,
                        size_t numel, int ndim, const int64_t *shape, tq_layout layout, int init,
                        int fan_in, int fan_out) {
    g->params = grow(g->params, &g->cap_params, g->nparams + 1, sizeof(tq_param));
    tq_param *p = &g->params[g->nparams++];
    int len = 0;
    for (int i = 0; i < g->nscope; i++)
        len += snprintf(p->name + len, sizeof p->name - len, "%s.", g->scope[i]);
    snprintf(p->name + len, sizeof p->name - len, "%s.%s", name, suffix);
    p->where = where; p->numel = numel; p->ndim = ndim;
    for (int i = 0; i < ndim; i++) p->shape[i] = shape[i];
    p->layout = layout; p->init_kind = (float)init; p->fan_in = fan_in; p->fan_out = fan_out;
    if (where == TQ_PB_PARAM) {
        p->offset = g->nparam_elems;
        g->nparam_elems = align_up(g->nparam_elems + numel, PARAM_ALIGN);
        g->nparameters += numel;
    } else if (where == TQ_PB_BUFFER) {
        p->offset = g->nbuffer_elems;
        g->nbuffer_elems = align_up(g->nbuffer_elems + numel, PARAM_ALIGN);
    } else {
        p->offset = (size_t)g->nbn;
    }
    return p->offset;
}

int tq_conv(tq_graph *g, int x, int k, int r, int stride, int pad, int bias, const char *name) {
    tq_shape xs = g->tensors[x].shape;
    tq_node *n = new_node(g, TQ_OP_CONV);
    n->in[0] = x; n->nin = 1;
    n->cd = (tq_conv_desc){xs, k, r, r, stride, pad};
    n->out = new_tensor(g, tq_conv_yshape(&n->cd), g->dt, TQ_T_ACT);
    int fan_in = xs.c * r * r, fan_out = k * r * r;
    int64_t ws[4] = {k, xs.c, r, r};
    n->w_off = add_param(g, name, "weight", TQ_PB_PARAM, (size_t)k * r * r * xs.c, 4, ws,
                         TQ_L_CONV_KRSC, TQ_INIT_CONV, fan_in, fan_out);
    if (bias) {
        int64_t bs[1] = {k};
        n->b_off = add_param(g, name, "bias", TQ_PB_PARAM, k, 1, bs, TQ_L_PLAIN, TQ_INIT_BIAS,
                             fan_in, fan_out);
    }
    return n->out;
}

int tq_bn(tq_graph *g, int x, const char *name) {
    tq_shape xs = g->tensors[x].shape;
    int c = xs.c;
    tq_node *n = new_node(g, TQ_OP_BN);
    n->in[0] = x; n->nin = 1;
    n->out = new_tensor(g, xs, g->dt, TQ_T_ACT);
    n->stat[0] = new_tensor(g, (tq_shape){1, 1, 1, c}, TQ_F32, TQ_T_STAT);
    n->stat[1] = new_tensor(g, (tq_shape){1, 1, 1, c}, TQ_F32, TQ_T_STAT);
    int64_t cs[1] = {c};
    n->g_off = add_param(g, name, "weight", TQ_PB_PARAM, c, 1, cs, TQ_L_PLAIN, TQ_INIT_ONES, c, c);
    n->bt_off = add_param(g, name, "bias", TQ_PB_PARAM, c, 1, cs, TQ_L_PLAIN, TQ_INIT_ZEROS, c, c);
    n->rm_off = add_param(g, name, "running_mean", TQ_PB_BUFFER, c, 1, cs, TQ_L_PLAIN, TQ_INIT_ZEROS, c, c);
    n->rv_off = add_param(g, name, "running_var", TQ_PB_BUFFER, c, 1, cs, TQ_L_PLAIN, TQ_INIT_ONES, c, c);
    n->bn_index = g->nbn;
    add_param(g, name, "num_batches_tracked", TQ_PB_COUNT, 1, 0, cs, TQ_L_PLAIN, TQ_INIT_ZEROS, 0, 0);
    g->nbn++;
    return n->out;
}

static int unary(tq_graph *g, tq_op op, int x, tq_shape ys) {
    tq_node *n = new_node(g, op);
    n->in[0] = x; n->nin = 1;
    n->out = new_tensor(g, ys, g->dt, TQ_T_ACT);
    return n->out;
}

int tq_relu(tq_graph *g, int x) { return unary(g, TQ_OP_RELU, x, g->tensors[x].shape); }

int tq_maxpool2(tq_graph *g, int x) {
    tq_shape s = g->tensors[x].shape;
    s.h /= 2; s.w /= 2;
    return unary(g, TQ_OP_MAXPOOL, x, s);
}

int tq_avgpool(tq_graph *g, int x) {
    tq_shape s = g->tensors[x].shape;
    s.h = s.w = 1;
    return unary(g, TQ_OP_AVGPOOL, x, s);
}

int tq_add(tq_graph *g, int a, int b) {
    tq_shape sa = g->tensors[a].shape, sb = g->tensors[b].shape;
    TQ_ASSERT(sa.n == sb.n && sa.h == sb.h && sa.w == sb.w && sa.c == sb.c);
    tq_node *n = new_node(g, TQ_OP_ADD);
    n->in[0] = a; n->in[1] = b; n->nin = 2;
    n->out = new_tensor(g, sa, g->dt, TQ_T_ACT);
    return n->out;
}

int tq_linear(tq_graph *g, int x, int out, const char *name) {
    tq_shape xs = g->tensors[x].shape;
    int in = xs.h * xs.w * xs.c;
    tq_node *n = new_node(g, TQ_OP_LINEAR);
    n->in[0] = x; n->nin = 1;
    n->lin_in = in; n->lin_out = out;
    n->out = new_tensor(g, (tq_shape){xs.n, 1, 1, out}, g->dt, TQ_T_ACT);
    int64_t ws[2] = {out, in}, bs[1] = {out};
    /* a flatten of a spatial NHWC tensor is (h,w,c)-ordered inside, (c,h,w) in PyTorch */
    int spatial = xs.h * xs.w > 1 && xs.c > 1;
    n->w_off = add_param(g, name, "weight", TQ_PB_PARAM, (size_t)out * in, 2, ws,
                         spatial ? TQ_L_LINEAR_HWC : TQ_L_PLAIN, TQ_INIT_LINEAR, in, out);
    if (spatial) {
        tq_param *p = &g->params[g->nparams - 1];
        p->lh = xs.h; p->lw = xs.w; p->lc = xs.c;
    }
    n->b_off = add_param(g, name, "bias", TQ_PB_PARAM, out, 1, bs, TQ_L_PLAIN, TQ_INIT_BIAS, in, out);
    return n->out;
}

void tq_graph_loss(tq_graph *g, int logits, int classes) {
    tq_node *n = new_node(g, TQ_OP_LOSS);
    n->in[0] = logits; n->in[1] = g->labels; n->nin = 2;
    g->classes = classes;
}

static void extend(tq_tensor *t, int time) {
    if (t->t_begin < 0 || time < t->t_begin) t->t_begin = time;
    if (time > t->t_end) t->t_end = time;
}

/* Who reads and who writes each tensor, for the planning passes below. */
typedef struct { int nt; int *uses, *producer; } gindex;

static void gindex_init(const tq_graph *g, gindex *x) {
    x->nt = g->ntensors;
    x->uses = calloc((size_t)x->nt, sizeof(int));
    x->producer = malloc(sizeof(int) * x->nt);
    TQ_ASSERT(x->uses && x->producer);
    for (int t = 0; t < x->nt; t++) x->producer[t] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const tq_node *n = &g->nodes[i];
        for (int j = 0; j < n->nin; j++) x->uses[n->in[j]]++;
        if (n->out >= 0) x->producer[n->out] = i;
    }
}
static void gindex_free(gindex *x) { free(x->uses); free(x->producer); }
/* tensor t (one of the indexed ones) is the output of an `op` node */
static int made_by(const tq_graph *g, const gindex *x, int t, tq_op op) {
    return t >= 0 && t < x->nt && x->producer[t] >= 0 && g->nodes[x->producer[t]].op == op;
}

/* Which ReLU outputs the backward regenerates rather than keeps (graph.h). */
static void plan_recompute(tq_graph *g, const gindex *ix) {
    const int *uses = ix->uses, *producer = ix->producer;
    char *redone = calloc((size_t)ix->nt, 1);
    TQ_ASSERT(redone);
    for (int i = 0; i < g->nnodes; i++) {
        tq_node *n = &g->nodes[i];
        if (n->op == TQ_OP_CONV) n->bwd_x = n->in[0];
        if (n->op == TQ_OP_RELU) n->bwd_y = n->out;
    }
    for (int r = 0; r < g->nnodes && !g->no_recompute; r++) {
        if (g->nodes[r].op != TQ_OP_RELU) continue;
        int y = g->nodes[r].out, a = g->nodes[r].in[0], bn = -1, res = -1;
        if (uses[a] != 1) continue;
        if (made_by(g, ix, a, TQ_OP_BN)) {
            bn = producer[a];
        } else if (made_by(g, ix, a, TQ_OP_ADD)) {   /* relu(bn(x) + r): r a kept ReLU output */
            const tq_node *ad = &g->nodes[producer[a]];
            for (int j = 0; j < 2 && bn < 0; j++) {
                int p = ad->in[j], q = ad->in[1 - j];
                if (made_by(g, ix, p, TQ_OP_BN) && uses[p] == 1 && made_by(g, ix, q, TQ_OP_RELU) &&
                    !redone[q]) { bn = producer[p]; res = q; }
            }
        }
        if (bn < 0) continue;
        int ok = 1, first = -1;            /* readers: convolutions (read in backward), adds (not) */
        for (int i = r + 1; i < g->nnodes && ok; i++) {
            const tq_node *n = &g->nodes[i];
            for (int j = 0; j < n->nin; j++) {
                if (n->in[j] != y) continue;
                if (n->op == TQ_OP_CONV && j == 0) first = i;
                else if (n->op != TQ_OP_ADD) ok = 0;
            }
        }
        if (!ok || first < 0) continue;
        int dst = new_tensor(g, g->tensors[y].shape, g->tensors[y].dt, TQ_T_ACT);
        for (int i = r + 1; i < g->nnodes; i++)
            if (g->nodes[i].op == TQ_OP_CONV && g->nodes[i].in[0] == y) g->nodes[i].bwd_x = dst;
        g->nodes[r].bwd_y = dst;
        g->remats = grow(g->remats, &g->cap_remats, g->nremats + 1, sizeof(tq_remat));
        g->remats[g->nremats] = (tq_remat){dst, bn, res};
        g->nodes[first].remat = g->nremats++;   /* the latest reader runs its backward first */
        redone[y] = 1;
    }
    free(redone);
}

/* Which BNs write a following ReLU's output themselves (graph.h). */
static void plan_fusion(tq_graph *g, const gindex *ix) {
    const int *uses = ix->uses, *producer = ix->producer;
    for (int r = 0; r < g->nnodes && !g->no_fuse; r++) {
        tq_node *rn = &g->nodes[r];
        if (rn->op != TQ_OP_RELU || uses[rn->in[0]] != 1) continue;
        int a = rn->in[0];
        if (made_by(g, ix, a, TQ_OP_BN)) {
            tq_node *b = &g->nodes[producer[a]];
            b->fuse_out = rn->out;
            b->bwd_relu = r;
            rn->fused = 1;
            rn->bwd_by = producer[a];
        } else if (made_by(g, ix, a, TQ_OP_ADD)) {
            int ai = producer[a];
            tq_node *ad = &g->nodes[ai];
            for (int j = 0; j < 2; j++) {
                int p = ad->in[j], q = ad->in[1 - j];
                if (!made_by(g, ix, p, TQ_OP_BN) || uses[p] != 1 || producer[q] >= producer[p]) continue;
                int bi = producer[p], between = 0;   /* a reader of q between the BN and the add */
                for (int k = bi + 1; k < ai && !between; k++)
                    for (int jj = 0; jj < g->nodes[k].nin; jj++) between |= g->nodes[k].in[jj] == q;
                tq_node *b = &g->nodes[bi];
                b->fuse_out = rn->out;
                b->fuse_res = q;
                ad->fused = rn->fused = 1;
                if (!between) {
                    b->bwd_relu = r;
                    b->bwd_res = q;
                    ad->bwd_by = rn->bwd_by = bi;
                }
                break;
            }
        }
    }
}

/* A max-pool that is a ReLU output's only reader reads the ReLU's input and applies the ReLU
 * itself (graph.h); the ReLU node leaves the graph. */
static void plan_pool_relu(tq_graph *g) {
    if (g->no_fuse) return;
    gindex ix;
    gindex_init(g, &ix);
    char *gone = calloc((size_t)g->nnodes, 1);
    TQ_ASSERT(gone);
    for (int i = 0; i < g->nnodes; i++) {
        tq_node *m = &g->nodes[i];
        int r = m->op == TQ_OP_MAXPOOL ? m->in[0] : -1;
        if (!made_by(g, &ix, r, TQ_OP_RELU) || ix.uses[r] != 1) continue;
        int ri = ix.producer[r];
        m->in[0] = g->nodes[ri].in[0];
        m->pool_relu = 1;
        gone[ri] = 1;
    }
    int k = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (!gone[i]) g->nodes[k++] = g->nodes[i];
    g->nnodes = k;
    free(gone);
    gindex_free(&ix);
}

/* Lifetimes of activations (forward uses + what backward keeps) and their gradients. */
static void lifetimes(tq_graph *g) {
    plan_pool_relu(g);
    int L = g->nnodes - 1;
    TQ_ASSERT(g->nodes[L].op == TQ_OP_LOSS);
    gindex ix;   /* of the graph as built: the recomputation's new tensors are nobody's input */
    gindex_init(g, &ix);
    plan_fusion(g, &ix);
    plan_recompute(g, &ix);
    gindex_free(&ix);
    extend(&g->tensors[g->labels], 0);
    for (int i = 0; i < g->nnodes; i++) {
        tq_node *n = &g->nodes[i];
        int bt = tq_bwd_time(g, i);
        if (n->fused) {
            /* forward done by a BN's epilogue: nothing here; the backward reads no input */
        } else if (n->fuse_out >= 0) {   /* a fused BN: reads x (and res), writes the ReLU's out */
            extend(&g->tensors[n->in[0]], i);
            extend(&g->tensors[n->fuse_out], i);
            if (n->fuse_res >= 0) extend(&g->tensors[n->fuse_res], i);
        } else {
            if (n->out >= 0) extend(&g->tensors[n->out], i);
            for (int j = 0; j < n->nin; j++) extend(&g->tensors[n->in[j]], i);
        }
        switch (n->op) {
        case TQ_OP_CONV:   /* a recomputed x lives from this backward to its ReLU's */
            extend(&g->tensors[n->bwd_x], bt);
            if (n->remat >= 0) {   /* what regenerates it must still be there */
                const tq_remat *rm = &g->remats[n->remat];
                const tq_node *b = &g->nodes[rm->bn];
                extend(&g->tensors[b->in[0]], bt);
                extend(&g->tensors[b->stat[0]], bt);
                extend(&g->tensors[b->stat[1]], bt);
                if (rm->res >= 0) extend(&g->tensors[rm->res], bt);
            }
            break;
        case TQ_OP_LINEAR: case TQ_OP_BN: case TQ_OP_MAXPOOL:
            extend(&g->tensors[n->in[0]], bt);
            break;
        case TQ_OP_RELU:   /* read by its own backward, or by the BN's that does it */
            extend(&g->tensors[n->bwd_y], n->bwd_by >= 0 ? tq_bwd_time(g, n->bwd_by) : bt);
            break;
        default: break;
        }
        for (int j = 0; j < 2; j++)
            if (n->stat[j] >= 0) { extend(&g->tensors[n->stat[j]], i); extend(&g->tensors[n->stat[j]], bt); }
    }
    /* gradients: written first by the last consumer (in forward order), read by the producer */
    for (int i = g->nnodes - 1; i >= 1; i--) {
        tq_node *n = &g->nodes[i];
        tq_node *by = n->bwd_by >= 0 ? &g->nodes[n->bwd_by] : NULL;
        for (int j = 0; j < n->nin; j++) {
            int x = n->in[j];
            /* a ReLU's or an add's backward done by a BN's: only the add's other input, whose
             * gradient that BN writes (bwd_res) */
            if (by && x != by->bwd_res) { n->need_din[j] = 0; continue; }
            if (x == g->labels || x == g->input) {
                n->need_din[j] = 0;
                if (by) by->bwd_res = -1;
                continue;
            }
            n->need_din[j] = !by;
            tq_tensor *t = &g->tensors[x];
            if (t->grad < 0) {
                tq_shape s = t->shape;
                tq_dtype dt = t->dt;
                int gid = new_tensor(g, s, dt, TQ_T_GRAD);
                t = &g->tensors[x];   /* new_tensor may move the array */
                t->grad = gid;
                n->din_beta[j] = 0.0f;
            } else {
                n->din_beta[j] = 1.0f;
            }
            if (by) by->dres_beta = n->din_beta[j];
            extend(&g->tensors[t->grad], tq_bwd_time(g, by ? n->bwd_by : i));
        }
    }
    for (int i = 1; i < g->nnodes - 1; i++) {
        tq_node *n = &g->nodes[i];
        if (n->op == TQ_OP_ADD && n->bwd_by >= 0) continue;   /* its output has no gradient */
        int gr = g->tensors[n->bwd_relu >= 0 ? g->nodes[n->bwd_relu].out : n->out].grad;
        TQ_ASSERT(gr >= 0);                       /* every output is used */
        extend(&g->tensors[gr], tq_bwd_time(g, i));
    }
}

typedef struct { size_t off, end; } span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}
int tq_graph_plan(tq_graph *g, tq_backend *be) {
    TQ_ASSERT(!g->planned);
    lifetimes(g);
    int nt = g->ntensors;
    int *order = malloc(sizeof(int) * nt);
    int *placed = malloc(sizeof(int) * nt);
    span *sp = malloc(sizeof(span) * nt);
    TQ_ASSERT(order && placed && sp);
    for (int i = 0; i < nt; i++) order[i] = i;
    /* greedy by size (largest first; ties: earlier start, then id) */
    for (int i = 1; i < nt; i++) {
        int v = order[i], j = i - 1;
        while (j >= 0) {
            const tq_tensor *a = &g->tensors[order[j]], *b = &g->tensors[v];
            int before = a->bytes > b->bytes ||
                         (a->bytes == b->bytes && (a->t_begin < b->t_begin ||
                          (a->t_begin == b->t_begin && order[j] < v)));
            if (before) break;
            order[j + 1] = order[j]; j--;
        }
        order[j + 1] = v;
    }
    int np = 0;
    size_t arena = 0;
    for (int oi = 0; oi < nt; oi++) {
        tq_tensor *t = &g->tensors[order[oi]];
        if (t->t_begin < 0) {   /* never used: an output a fusion wrote past (graph.h) */
            TQ_ASSERT(t->kind == TQ_T_ACT);
            t->offset = 0;
            continue;
        }
        int ns = 0;
        for (int k = 0; k < np; k++) {
            const tq_tensor *u = &g->tensors[placed[k]];
            if (u->t_begin <= t->t_end && t->t_begin <= u->t_end)
                sp[ns++] = (span){u->offset, u->offset + u->bytes};
        }
        qsort(sp, ns, sizeof(span), cmp_span);
        size_t off = 0;
        for (int k = 0; k < ns; k++) {
            if (sp[k].off >= off + t->bytes) break;
            if (sp[k].end > off) off = sp[k].end;
        }
        t->offset = off;
        if (off + t->bytes > arena) arena = off + t->bytes;
        placed[np++] = order[oi];
    }
    free(order); free(placed); free(sp);
    g->arena_bytes = arena;

    size_t ws = 0;
    for (int i = 0; i < g->nnodes; i++) {
        tq_node *n = &g->nodes[i];
        size_t w = 0;
        if (n->op == TQ_OP_CONV) w = be->i->conv_ws(be, &n->cd, g->dt);
        else if (n->op == TQ_OP_LINEAR) w = be->i->linear_ws(be, g->batch, n->lin_in, n->lin_out, g->dt);
        if (w > ws) ws = w;
    }
    g->workspace_bytes = align_up(ws, ALIGN_BYTES);
    g->planned = 1;
    return TQ_OK;
}
