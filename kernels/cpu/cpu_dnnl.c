/* cpu_dnnl.c — f32 and bf16 convolutions and linear layers through oneDNN (libdnnl 2.x, C API,
 * OpenMP runtime); f16 ones, and bf16 ones where its bf16 kernels are missing or slow, through
 * its f32 primitives.
 *
 * Layouts: activations NHWC (oneDNN tag nhwc), weights KRSC (tag ohwi). Primitives pick their
 * own weights layout (format_tag_any); the weights are reordered into it on every call (they
 * are small) and dW comes back through a reorder with a sum post-op, which is what makes
 * "weight gradients are added" hold.
 *
 *   fwd:        [reorder W → Wf]  conv_fwd(x, Wf, bias) → y. The primitive always has a bias;
 *               bias NULL passes K cached zeros. bf16 with AMX on small maps and many channels
 *               (gemm_route): y = im2col(x) · Wᵀ + bias, matmuls over chunks of images (run_gm).
 *   bwd_data:   beta 0: [reorder W → Wb]  conv_bwd_data(dy, Wb) → dx (overwrites).
 *               beta != 0, stride 1, pad <= R−1, S−1: the forward convolution of dy with the
 *               flipped, channel-transposed kernel Wt[c][r][s][k] = W[k][R−1−r][S−1−s][c]
 *               (padding R−1−pad, S−1−pad) with a sum post-op: dx += conv(dy, Wt), fused
 *               (conv_bwd_data has no post-ops in oneDNN 2.x; dx is scaled first if beta
 *               is not 1).
 *               otherwise: conv_bwd_data into a workspace copy T (N·H·W·C floats), then
 *               dx = beta·dx + T.
 *   bwd_filter: conv_bwd_weights(x, dy) → dWt, dbt (workspace), then dw += dWt (reorder with
 *               sum), db[k] += dbt[k]; where the caller has no bias (db NULL), a primitive
 *               without the bias gradient, conv_bwd_weights(x, dy) → dWt.
 *               bf16 with AMX on small maps and many channels (gemm_route): dw += dyᵀ · im2col(x),
 *               oneDNN matmuls over chunks of images (run_gm), db from the backend's sums.
 *
 * Caching: one entry per descriptor (all of tq_conv_desc, N included), each kind (fwd,
 * bwd_data, bwd_filter) created on its first use (conv_ws creates all three) with its memory
 * objects; an op only sets the data handles and executes. A kind whose primitives cannot be
 * created stays on the im2col path for that descriptor (cpu_conv.c), so conv_ws and the ops
 * always agree on the workspace. Entries live until the backend is destroyed.
 *
 * Workspace: scratchpad_mode user; each kind's oneDNN scratchpad (and the reorders') comes
 * from the caller's workspace, together with the reordered weights, the flipped kernel, T, dWt
 * and dbt. Every section is rounded up to 64 bytes and the base is aligned up to 64 bytes (the
 * 64 bytes of slack are part of the requirement, so it does not depend on the pointer). The
 * requirement of bwd_data covers both beta variants (it does not depend on beta).
 *
 * Threads: oneDNN's OpenMP runtime uses omp_get_max_threads() of the calling thread, both when
 * a primitive is created (its scratchpad depends on it) and when it runs, so every entry point
 * sets the calling thread's OpenMP thread count to be->threads first. Results are
 * reproducible for a thread count (oneDNN's f32 convolutions reduce in a fixed order).
 *
 * Types: x, y, w, dx, dy in the op's dtype (f32 or bf16; oneDNN accumulates bf16 in f32 and
 * rounds the outputs to nearest even, as the im2col path does); bias, dw, db always f32. f16
 * (and bf16 where oneDNN has no bf16 kernels, CPUs without AVX-512, or where they are slower than
 * its f32 ones, Intel CPUs without AMX: bf16_via_f32) runs the f32 primitives on
 * f32 copies of a few images at a time (the end of this file): oneDNN 2.6 has no f16
 * convolutions on CPUs without AVX512-FP16, and where it has them their accumulation is not
 * ours to check. Linear layers run inner products through the same machinery
 * (the end of this file), f16 ones (and bf16 ones that take the f32 route) in f32 chunks too.
 *
 * TQ_CPU_DNNL=0 in the environment (read when the backend first needs oneDNN) turns this off:
 * every convolution runs the im2col path.
 */
#include <cpuid.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>

#include "cpu/cpu_internal.h"

#define MAXARG 6

/* one primitive with its argument memory objects (data handles set per call) */
typedef struct {
    dnnl_primitive_t p;
    int n;
    int arg[MAXARG];
    dnnl_memory_t mem[MAXARG];
    size_t sp;                    /* scratchpad bytes (its memory is the last argument) */
} dstep;

enum { K_FWD, K_BWDD, K_BWDW, NKIND };

/* a kind as GEMMs over chunks of images (cpu_dnnl.c, make_gm): matmuls over nb images (full)
 * and over the nlast of a shorter last chunk (last; p NULL when there is none); a chunk's cols
 * take `cols` bytes */
typedef struct { int on, nb, nlast; dstep full, last; size_t cols; } gplan;

typedef struct dconv {
    tq_conv_desc d;
    tq_dtype dt;                  /* f32 or bf16 */
    int ip;                       /* an inner product (a linear layer: d is its 1×1 geometry) */
    int state[NKIND];             /* 0: not tried, 1: oneDNN, -1: im2col */
    dnnl_primitive_desc_t fpd;    /* the forward pd (hint for the backward ones) */
    /* fwd */
    dstep f, f_wr;                /* f_wr.p NULL: the primitive takes KRSC as it is */
    size_t f_wb;
    float *zero;                  /* K zeros: the bias when the caller has none */
    /* bwd_data, beta 0 (and the base of the T path) */
    dstep b, b_wr;
    size_t b_wb;
    /* bwd_data, beta 1 through the flipped kernel (tr = 1) */
    int tr;
    dstep t, t_wr;
    size_t t_wb;
    /* bwd_filter: [1] with the bias gradient, [0] without (for callers without a bias: a
     * convolution before a batch-norm; NULL where oneDNN has none, or for inner products) */
    dstep w[2], w_wr[2];
    size_t w_wb[2];
    /* fwd, bwd_data and bwd_filter as GEMMs instead (gf, gd, gw: on; see run_gm) */
    gplan gf, gd, gw;
    struct dconv *next;
} dconv;

struct tq_dnnl {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dconv *list;
    int bf16_f32;                 /* bf16 through the f32 primitives: 0 not decided yet, 1 yes, 2 no */
};

static size_t up64(size_t b) { return (b + 63) / 64 * 64; }
static size_t mx(size_t a, size_t b) { return a > b ? a : b; }

static void set_threads(tq_backend *be) {
    int nt = tq_cpu_nt(be);
    if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
}

/* ---- the context ---- */

static tq_dnnl *get_ctx(tq_backend *be) {
    tq_cpu_ctx *cx = be->ctx;
    if (!cx || cx->dnnl_off) return NULL;
    if (cx->dnnl) return cx->dnnl;
    const char *env = getenv("TQ_CPU_DNNL");
    if (env && env[0] == '0' && env[1] == 0) {
        cx->dnnl_off = 1;
        return NULL;
    }
    tq_dnnl *D = calloc(1, sizeof *D);
    if (!D || dnnl_engine_create(&D->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&D->st, D->eng, dnnl_stream_default_flags) != dnnl_success) {
        if (D && D->eng) dnnl_engine_destroy(D->eng);
        free(D);
        cx->dnnl_off = 1;
        return NULL;
    }
    cx->dnnl = D;
    return D;
}

int tq_dnnl_below_avx512(tq_backend *be) {
    if (!get_ctx(be)) return 0;
    /* dnnl_cpu_isa_t is a bit set: 0x8 marks the avx512_mic family, 0x20 avx512_core's */
    return (dnnl_get_effective_cpu_isa() & 0x28) == 0;
}

int tq_dnnl_has_amx(tq_backend *be) {
    if (!get_ctx(be)) return 0;
    return (dnnl_get_effective_cpu_isa() & 0x3e7) == 0x3e7;   /* dnnl_cpu_isa_avx512_core_amx */
}

static void step_free(dstep *s) {
    for (int i = 0; i < s->n; i++)
        if (s->mem[i]) dnnl_memory_destroy(s->mem[i]);
    if (s->p) dnnl_primitive_destroy(s->p);
    memset(s, 0, sizeof *s);
}

static void conv_free(dconv *c) {
    dstep *all[] = { &c->f, &c->f_wr, &c->b, &c->b_wr, &c->t, &c->t_wr, &c->w[0], &c->w_wr[0], &c->w[1],
                     &c->w_wr[1], &c->gf.full, &c->gf.last, &c->gd.full, &c->gd.last,
                     &c->gw.full, &c->gw.last };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) step_free(all[i]);
    if (c->fpd) dnnl_primitive_desc_destroy(c->fpd);
    free(c->zero);
    free(c);
}

void tq_dnnl_free(tq_dnnl *D) {
    if (!D) return;
    for (dconv *c = D->list, *nx; c; c = nx) {
        nx = c->next;
        conv_free(c);
    }
    if (D->st) dnnl_stream_destroy(D->st);
    if (D->eng) dnnl_engine_destroy(D->eng);
    free(D);
}

/* ---- primitives ---- */

/* the primitive of pd with memory objects for args (and the scratchpad, if any) */
static int step_make(tq_dnnl *D, dstep *s, const_dnnl_primitive_desc_t pd, const int *args,
                     int nargs) {
    if (dnnl_primitive_create(&s->p, pd) != dnnl_success) {
        s->p = NULL;
        return -1;
    }
    for (int i = 0; i < nargs; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md,
                                                                     args[i]);
        if (!md || dnnl_memory_create(&s->mem[s->n], md, D->eng, DNNL_MEMORY_NONE) != dnnl_success)
            return -1;
        s->arg[s->n++] = args[i];
    }
    const dnnl_memory_desc_t *sm = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    s->sp = sm ? dnnl_memory_desc_get_size(sm) : 0;
    if (s->sp) {
        if (dnnl_memory_create(&s->mem[s->n], sm, D->eng, DNNL_MEMORY_NONE) != dnnl_success)
            return -1;
        s->arg[s->n++] = DNNL_ARG_SCRATCHPAD;
    }
    return 0;
}

/* run s with ptr[i] for args[i] and sp for the scratchpad */
static int step_run(tq_backend *be, tq_dnnl *D, dstep *s, const char *op, void *const *ptr,
                    void *sp) {
    dnnl_exec_arg_t a[MAXARG];
    for (int i = 0; i < s->n; i++) {
        void *p = s->arg[i] == DNNL_ARG_SCRATCHPAD ? sp : ptr[i];
        if (dnnl_memory_set_data_handle(s->mem[i], p) != dnnl_success) {
            tq_backend_seterr(be, "%s: oneDNN: setting a data handle failed", op);
            return TQ_EDEVICE;
        }
        a[i].arg = s->arg[i];
        a[i].memory = s->mem[i];
    }
    dnnl_status_t st = dnnl_primitive_execute(s->p, D->st, s->n, a);
    if (st == dnnl_success) st = dnnl_stream_wait(D->st);
    if (st != dnnl_success) {
        tq_backend_seterr(be, "%s: oneDNN execution failed (status %d)", op, (int)st);
        return TQ_EDEVICE;
    }
    return TQ_OK;
}

static dnnl_primitive_attr_t make_attr(float sum) {
    dnnl_primitive_attr_t at = NULL;
    if (dnnl_primitive_attr_create(&at) != dnnl_success) return NULL;
    int ok = dnnl_primitive_attr_set_scratchpad_mode(at, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && sum != 0.0f) {
        dnnl_post_ops_t po = NULL;
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, sum) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(at, po) == dnnl_success;
        if (po) dnnl_post_ops_destroy(po);
    }
    if (!ok) {
        dnnl_primitive_attr_destroy(at);
        return NULL;
    }
    return at;
}

/* the primitive descriptor of operation descriptor od with a user scratchpad, a sum post-op when
 * sum is not 0, and hint (the forward's, or NULL); NULL where oneDNN has none */
static dnnl_primitive_desc_t pd_make(tq_dnnl *D, const_dnnl_op_desc_t od, float sum,
                                     const_dnnl_primitive_desc_t hint) {
    dnnl_primitive_attr_t at = make_attr(sum);
    if (!at) return NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, od, at, D->eng, hint);
    dnnl_primitive_attr_destroy(at);
    return st == dnnl_success ? pd : NULL;
}

/* a reorder from `from` to `to` (sum: to = from + to), or none (s->p NULL, *bytes 0) when the
 * layouts are equal and no sum is asked for. *bytes: the bytes of `to` when a reorder is made. */
static int reorder_make(tq_dnnl *D, dstep *s, const dnnl_memory_desc_t *from,
                        const dnnl_memory_desc_t *to, int sum, size_t *bytes) {
    *bytes = 0;
    if (!sum && dnnl_memory_desc_equal(from, to)) return 0;
    dnnl_primitive_attr_t at = make_attr(sum ? 1.0f : 0.0f);
    if (!at) return -1;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, from, D->eng, to, D->eng, at);
    dnnl_primitive_attr_destroy(at);
    if (st != dnnl_success) return -1;
    static const int args[] = { DNNL_ARG_FROM, DNNL_ARG_TO };
    int rc = step_make(D, s, pd, args, 2);
    dnnl_primitive_desc_destroy(pd);
    *bytes = dnnl_memory_desc_get_size(to);
    return rc;
}

/* geometry in oneDNN's terms: x, y, wany, wplain in the op's type; the f32 weight descriptors
 * are the weight gradient's */
typedef struct {
    int p, q;
    dnnl_memory_desc_t x, y, wany, wplain, wany32, wplain32, b;
    dnnl_dims_t st, pl, pr;
} dgeom;

static dnnl_data_type_t dnnl_dt(tq_dtype dt) { return dt == TQ_BF16 ? dnnl_bf16 : dnnl_f32; }
static size_t esize(tq_dtype dt) { return dt == TQ_F32 ? 4 : 2; }

/* x, y (tag xy), the weights any / plain (tag wt) in t and in f32, the bias: nd-dimensional */
static int init_mds(dgeom *g, int nd, const dnnl_dims_t xd, const dnnl_dims_t yd,
                    const dnnl_dims_t wd, int K, dnnl_data_type_t t, dnnl_format_tag_t xy,
                    dnnl_format_tag_t wt) {
    dnnl_dims_t bd = { K };
    return dnnl_memory_desc_init_by_tag(&g->x, nd, xd, t, xy) != dnnl_success ||
           dnnl_memory_desc_init_by_tag(&g->y, nd, yd, t, xy) != dnnl_success ||
           dnnl_memory_desc_init_by_tag(&g->wany, nd, wd, t, dnnl_format_tag_any) != dnnl_success ||
           dnnl_memory_desc_init_by_tag(&g->wplain, nd, wd, t, wt) != dnnl_success ||
           dnnl_memory_desc_init_by_tag(&g->wany32, nd, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
           dnnl_memory_desc_init_by_tag(&g->wplain32, nd, wd, dnnl_f32, wt) != dnnl_success ||
           dnnl_memory_desc_init_by_tag(&g->b, 1, bd, dnnl_f32, dnnl_x) != dnnl_success
               ? -1 : 0;
}

static int dgeom_init(const tq_conv_desc *d, tq_dtype dt, int ip, dgeom *g) {
    const dnnl_data_type_t t = dnnl_dt(dt);
    const int N = d->x.n, H = d->x.h, W = d->x.w, C = d->x.c, K = d->k, R = d->r, S = d->s;
    if (ip) {   /* x [N][in], y [N][out], w [out][in] */
        dnnl_dims_t xd = { N, C }, yd = { N, K }, wd = { K, C };
        g->p = g->q = 1;
        return init_mds(g, 2, xd, yd, wd, K, t, dnnl_nc, dnnl_oi);
    }
    g->p = tq_conv_out(H, R, d->stride, d->pad);
    g->q = tq_conv_out(W, S, d->stride, d->pad);
    dnnl_dims_t xd = { N, C, H, W }, yd = { N, K, g->p, g->q }, wd = { K, C, R, S };
    g->st[0] = g->st[1] = d->stride;
    g->pl[0] = g->pl[1] = d->pad;
    /* the right padding that gives exactly P×Q (floor division may leave input unused) */
    g->pr[0] = (dnnl_dim_t)(g->p - 1) * d->stride + R - H - d->pad;
    g->pr[1] = (dnnl_dim_t)(g->q - 1) * d->stride + S - W - d->pad;
    return init_mds(g, 4, xd, yd, wd, K, t, dnnl_nhwc, dnnl_ohwi);
}

static const dnnl_memory_desc_t *pd_md(const_dnnl_primitive_desc_t pd, int arg) {
    return dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
}

/* the operation descriptor of a kind: a convolution's, or an inner product's (c->ip) */
typedef union { dnnl_convolution_desc_t conv; dnnl_inner_product_desc_t ip; } opdesc;

static int op_desc(const dconv *c, const dgeom *g, int kind, int bias, opdesc *od) {
    dnnl_status_t st;
    if (c->ip)
        st = kind == K_FWD ? dnnl_inner_product_forward_desc_init(&od->ip, dnnl_forward_training, &g->x,
                                                                  &g->wany, &g->b, &g->y)
           : kind == K_BWDD ? dnnl_inner_product_backward_data_desc_init(&od->ip, &g->x, &g->wany, &g->y)
                            : dnnl_inner_product_backward_weights_desc_init(&od->ip, &g->x, &g->wany32,
                                                                            &g->b, &g->y);
    else
        st = kind == K_FWD
                 ? dnnl_convolution_forward_desc_init(&od->conv, dnnl_forward_training,
                                                      dnnl_convolution_direct, &g->x, &g->wany, &g->b,
                                                      &g->y, g->st, g->pl, g->pr)
             : kind == K_BWDD
                 ? dnnl_convolution_backward_data_desc_init(&od->conv, dnnl_convolution_direct, &g->x,
                                                            &g->wany, &g->y, g->st, g->pl, g->pr)
                 : dnnl_convolution_backward_weights_desc_init(&od->conv, dnnl_convolution_direct,
                                                               &g->x, &g->wany32, bias ? &g->b : NULL,
                                                               &g->y, g->st, g->pl, g->pr);
    return st == dnnl_success ? 0 : -1;
}

static int make_fpd(tq_dnnl *D, dconv *c, const dgeom *g) {
    if (c->fpd) return 0;
    opdesc cd;
    if (op_desc(c, g, K_FWD, 1, &cd)) return -1;
    c->fpd = pd_make(D, &cd, 0.0f, NULL);
    return c->fpd ? 0 : -1;
}

/* ---- workspace layouts (byte offsets from the 64-byte aligned base) ---- */

/* w: weights in the primitive's layout; flip: Wt; tmp: T; dw, db: dWt, dbt; sp: scratchpad */
typedef struct { size_t w, flip, tmp, dw, db, sp, end; } wlay;

static size_t put(wlay *L, size_t bytes) {
    size_t o = L->end;
    L->end += up64(bytes);
    return o;
}
static size_t nx_of(const dconv *c) { return tq_shape_numel(c->d.x); }
static size_t nw_of(const dconv *c) { return (size_t)c->d.k * c->d.r * c->d.s * c->d.x.c; }

static void lay_fwd(const dconv *c, wlay *L) {
    memset(L, 0, sizeof *L);
    if (c->gf.on) {
        L->tmp = put(L, c->gf.cols);
        L->sp = put(L, mx(c->gf.full.sp, c->gf.last.sp));
        return;
    }
    L->w = put(L, c->f_wb);
    L->sp = put(L, mx(c->f.sp, c->f_wr.sp));
}
/* bwd_data through conv_bwd_data: beta 0, or (without tr) any beta through T */
static void lay_bwdd0(const dconv *c, wlay *L) {
    memset(L, 0, sizeof *L);
    L->w = put(L, c->b_wb);
    L->sp = put(L, mx(c->b.sp, c->b_wr.sp));
    if (!c->tr) L->tmp = put(L, nx_of(c) * esize(c->dt));
}
/* bwd_data through its GEMMs: the flipped kernel, a chunk's cols, the matmul's scratchpad */
static void lay_bwdd_gm(const dconv *c, wlay *L) {
    memset(L, 0, sizeof *L);
    L->flip = put(L, nw_of(c) * esize(c->dt));
    L->tmp = put(L, c->gd.cols);
    L->sp = put(L, mx(c->gd.full.sp, c->gd.last.sp));
}
static void lay_bwdd_tr(const dconv *c, wlay *L) {
    memset(L, 0, sizeof *L);
    L->flip = put(L, nw_of(c) * esize(c->dt));
    L->w = put(L, c->t_wb);
    L->sp = put(L, mx(c->t.sp, c->t_wr.sp));
}
static void lay_bwdw(const dconv *c, wlay *L) {   /* both variants, or the GEMMs' */
    memset(L, 0, sizeof *L);
    if (c->gw.on) {
        L->tmp = put(L, c->gw.cols);
        L->sp = put(L, mx(c->gw.full.sp, c->gw.last.sp));
        return;
    }
    L->dw = put(L, mx(c->w_wb[0], c->w_wb[1]));
    L->db = put(L, (size_t)c->d.k * 4);
    L->sp = put(L, mx(mx(c->w[0].sp, c->w_wr[0].sp), mx(c->w[1].sp, c->w_wr[1].sp)));
}

/* the workspace bytes of a ready kind (both beta variants for bwd_data) */
static size_t need_of(const dconv *c, int kind) {
    wlay L;
    size_t end;
    if (kind == K_FWD) {
        lay_fwd(c, &L);
        end = L.end;
    } else if (kind == K_BWDD && c->gd.on) {
        lay_bwdd_gm(c, &L);
        end = L.end;
    } else if (kind == K_BWDD) {
        lay_bwdd0(c, &L);
        end = L.end;
        if (c->tr) {
            lay_bwdd_tr(c, &L);
            end = mx(end, L.end);
        }
    } else {
        lay_bwdw(c, &L);
        end = L.end;
    }
    return 64 + end;
}

/* ---- convolutions as GEMMs ----
 *
 * oneDNN 2.6's AMX convolution kernels slow down where a convolution's output maps are small and
 * its channels many: 3×3, batch 128, 2 Xeon cores, 512 channels on 4×4 maps, the weight gradient
 * (jit:avx512_core_amx_bf16) took 35 ms a call (280 GFLOP/s), the forward (brgconv) 13.7 ms.
 * There each op is one GEMM over im2col rows (cols[N·P·Q][R·S·C], bf16 copies: exact), which
 * oneDNN's matmul (AMX brgemm for bf16) runs well, a chunk of images at a time (GM_IMAGES, at
 * most GM_COLS_BYTES of cols):
 *   forward:         y[N·P·Q][K]  = cols(x) · Wᵀ + bias    (W is KRSC: [K][R·S·C])
 *   backward-data:   dx[N·H·W][C] += cols(dy) · Wtᵀ         (stride 1: the forward convolution of
 *                    dy with the flipped kernel Wt[C][R·S·K], padding R−1−pad; dx zeroed or scaled
 *                    first for beta 0 or other than 1, then a sum post-op)
 *   weight gradient: dW[K][R·S·C] += dyᵀ · cols(x)         (a sum post-op; dW is KRSC too)
 * Nothing is reordered; f32 accumulation, in another order than the kernels'.
 * Per call, conv kernel → GEMMs, ms (bf16, batch 128, 3×3, same machine; stride 1 unless s2):
 *   weight gradient: 4×4 512→512 35.5 → 9.3, 2×2 25.3 → 2.2, 7×7 44.3 → 27.3, 8×8 256→256
 *   11.1 → 8.4, 4×4 256→256 6.3 → 2.1, s2 8×8 256→512 26.5 → 4.0, s2 16×16 128→256 13.1 → 5.4;
 *   but 8×8 64→64 1.3 → 1.7, 16×16 128→128 8.4 → 15.0, 14×14 256→256 25.2 → 31.4;
 *   forward: 4×4 512→512 13.7 → 6.1, 2×2 10.9 → 1.8, s2 8×8 256→512 5.6 → 2.8; but 8×8
 *   256→256 3.9 → 6.1, 16×16 128→128 3.5 → 7.8, s2 16×16 128→256 3.4 → 3.2;
 *   f32 (jit:avx512_core) gained nowhere but the s2 256→512 weight gradient (1.3×).
 * So, bf16 where oneDNN has AMX and the GEMM's output channels number 256 or more: the weight
 * gradient on output maps of at most 64 positions, the forward (and backward-data, a forward)
 * on at most 16 (every such shape measured won, 1.26-11×); and the weight gradient of a 1×1
 * with C·K >= 65536 on at most 32×32 positions (per call, batch 128, kernel → GEMMs: 16×16
 * 512→128 12.4 → 7.5, 128→512 9.5 → 6.3, 8×8 1024→256 18.1 → 5.3, 4×4 512→2048 31.1 → 4.4,
 * s2 32×32 256→512 28.2 → 9.9, 28×28 512→128 31.0 → 23.7, through a copy of x that a 1×1
 * stride-1 one no longer makes; 32×32 64→256 10.4 → 11.0 lost). TQ_CPU_CONV_GEMM=0 never takes
 * them, =1 takes them for every f32 and bf16 convolution they fit (how the tests run them on
 * any CPU). */
#define GM_IMAGES 32
#define GM_COLS_BYTES ((size_t)16 << 20)

static int gm_mode = -1;   /* -1: TQ_CPU_CONV_GEMM decides; 0 never; 1 by the rule; 2 always */

void tq_cpu_conv_gemm_set(int mode) { gm_mode = mode; }

/* the convolution a kind's GEMM is the forward form of: the op's own, or for backward-data the
 * convolution of dy ([N][P][Q][K]) with the flipped kernel into dx (stride 1) */
static tq_conv_desc gm_desc(const dconv *c, int kind) {
    const tq_conv_desc *d = &c->d;
    if (kind != K_BWDD) return *d;
    tq_conv_desc t = *d;
    t.x.h = tq_conv_out(d->x.h, d->r, 1, d->pad);
    t.x.w = tq_conv_out(d->x.w, d->s, 1, d->pad);
    t.x.c = d->k;
    t.k = d->x.c;
    t.pad = d->r - 1 - d->pad;
    return t;
}

/* output positions an image of f (P·Q) */
static size_t gm_pq(const tq_conv_desc *f) {
    tq_shape y = tq_conv_yshape(f);
    return (size_t)y.h * y.w;
}

static int gemm_route(const dconv *c, int kind) {
    int mode = gm_mode;
    if (mode < 0) {
        const char *e = getenv("TQ_CPU_CONV_GEMM");
        mode = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 2 : 1;
    }
    const tq_conv_desc *d = &c->d;
    if (c->ip || mode == 0) return 0;
    if (kind == K_BWDD && (d->stride != 1 || d->r != d->s || d->pad > d->r - 1)) return 0;
    if (mode == 2) return 1;
    tq_conv_desc f = gm_desc(c, kind);
    size_t pq = gm_pq(&f);
    if (c->dt != TQ_BF16 || (dnnl_get_effective_cpu_isa() & 0x3e7) != 0x3e7) return 0;
    if (kind == K_BWDW && f.r * f.s == 1 && (size_t)f.x.c * f.k >= 65536 && pq <= 1024) return 1;
    return f.k >= 256 && pq <= (kind == K_BWDW ? 64u : 16u);
}

/* a 1×1 stride-1 unpadded convolution's cols are its input rows as they are */
static int gm_direct(const tq_conv_desc *f) { return f->r == 1 && f->s == 1 && f->stride == 1 && f->pad == 0; }

/* the matmul of a chunk of nb images of f = gm_desc(c, kind), rows = nb·P·Q, RSC = R·S·f.x.c:
 *   fwd:  y[rows][K] = cols[rows][RSC] · W[K][RSC]ᵀ + bias[K]     (bias f32, y in dt)
 *   bwdd: the same, no bias, a sum post-op
 *   bwdw: dW[K][RSC] += dy[rows][K]ᵀ · cols[rows][RSC]             (dW f32) */
static int make_gm_step(tq_dnnl *D, dconv *c, int kind, int nb, dstep *s) {
    const tq_conv_desc f = gm_desc(c, kind);
    const dnnl_dim_t K = f.k, rsc = (dnnl_dim_t)f.r * f.s * f.x.c;
    const dnnl_dim_t rows = (dnnl_dim_t)(nb * gm_pq(&f));
    const dnnl_data_type_t t = dnnl_dt(c->dt);
    const int w = kind == K_BWDW, fwd = kind == K_FWD;
    dnnl_dims_t ad = { w ? K : rows, w ? rows : rsc }, as = { w ? 1 : rsc, w ? K : 1 };
    dnnl_dims_t bd = { w ? rows : rsc, w ? rsc : K }, bs = { w ? rsc : 1, w ? 1 : rsc };
    dnnl_dims_t od = { w ? K : rows, w ? rsc : K }, os = { w ? rsc : K, 1 };
    dnnl_dims_t biasd = { 1, K };
    dnnl_memory_desc_t a, b, o, bias;
    dnnl_matmul_desc_t md;
    if (dnnl_memory_desc_init_by_strides(&a, 2, ad, t, as) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&b, 2, bd, t, bs) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&o, 2, od, w ? dnnl_f32 : t, os) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&bias, 2, biasd, dnnl_f32, dnnl_ab) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &a, &b, fwd ? &bias : NULL, &o) != dnnl_success)
        return -1;
    dnnl_primitive_desc_t pd = pd_make(D, &md, fwd ? 0.0f : 1.0f, NULL);
    if (!pd) return -1;
    static const int args3[] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST };
    static const int args4[] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST };
    int rc = step_make(D, s, pd, fwd ? args4 : args3, fwd ? 4 : 3);
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

static int make_gm(tq_dnnl *D, dconv *c, int kind, gplan *gp) {
    const tq_conv_desc f = gm_desc(c, kind);
    size_t img = gm_pq(&f) * f.r * f.s * f.x.c * esize(c->dt);   /* one image's cols */
    size_t nb = GM_COLS_BYTES / img;
    if (nb > GM_IMAGES) nb = GM_IMAGES;
    if (nb < 1) nb = 1;
    if (nb > (size_t)f.x.n) nb = (size_t)f.x.n;
    gp->nb = (int)nb;
    gp->nlast = f.x.n % gp->nb;
    gp->cols = gm_direct(&f) ? 0 : nb * img;
    if (make_gm_step(D, c, kind, gp->nb, &gp->full) ||
        (gp->nlast && make_gm_step(D, c, kind, gp->nlast, &gp->last))) {
        step_free(&gp->full);
        step_free(&gp->last);
        return -1;
    }
    gp->on = 1;
    return 0;
}

/* cols[(i·P + p)·Q + q][(r·S + s)·C + ch] = x[n0 + i][p·stride − pad + r][q·stride − pad + s][ch]
 * (zero outside x), for nb images of f: elements of es bytes copied as they are */
static void gm_im2col(tq_backend *be, const tq_conv_desc *f, size_t es, const void *x, int n0, int nb,
                      unsigned char *cols) {
    const int H = f->x.h, W = f->x.w, C = f->x.c, R = f->r, S = f->s;
    const tq_shape y = tq_conv_yshape(f);
    const int P = y.h, Q = y.w;
    const size_t run = (size_t)C * es, rsc = (size_t)R * S * run, rows = (size_t)nb * P * Q;
    const unsigned char *xb = x;
    int nt = rows * rsc >= (size_t)TQ_PAR_MIN ? tq_cpu_nt(be) : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t t = 0; t < rows; t++) {
        int q = (int)(t % Q), p = (int)(t / Q % P), i = (int)(t / ((size_t)P * Q));
        unsigned char *dst = cols + t * rsc;
        int ih0 = p * f->stride - f->pad, iw0 = q * f->stride - f->pad;
        int s_lo = iw0 < 0 ? -iw0 : 0, s_hi = W - iw0 < S ? W - iw0 : S;
        for (int r = 0; r < R; r++, dst += (size_t)S * run) {
            int ih = ih0 + r;
            if (ih < 0 || ih >= H || s_hi <= s_lo) {
                memset(dst, 0, (size_t)S * run);
                continue;
            }
            if (s_lo > 0) memset(dst, 0, (size_t)s_lo * run);
            memcpy(dst + (size_t)s_lo * run,
                   xb + ((((size_t)n0 + i) * H + ih) * W + iw0 + s_lo) * run, (size_t)(s_hi - s_lo) * run);
            if (s_hi < S) memset(dst + (size_t)s_hi * run, 0, (size_t)(S - s_hi) * run);
        }
    }
}

/* a kind through its GEMMs, a chunk of images at a time. src: what cols are made of (x, or dy for
 * bwdd); w: the weights (KRSC, or bwdd's flipped ones; bwdw: unused); bias: fwd's (or K zeros);
 * out: y, dx or dW; dy: bwdw's */
static int run_gm(tq_backend *be, tq_dnnl *D, const dconv *c, const gplan *gp, int kind, const char *op,
                  const void *src, const void *w, const void *bias, void *out, const void *dy,
                  unsigned char *cols, void *sp) {
    const tq_conv_desc f = gm_desc(c, kind);
    const size_t es = esize(c->dt);
    const size_t opi = gm_pq(&f) * f.k * es;   /* y, dx or dy bytes an image */
    for (int n0 = 0; n0 < f.x.n; n0 += gp->nb) {
        int nb = f.x.n - n0 < gp->nb ? f.x.n - n0 : gp->nb;
        if (gm_direct(&f)) cols = (unsigned char *)src + (size_t)n0 * f.x.h * f.x.w * f.x.c * es;
        else gm_im2col(be, &f, es, src, n0, nb, cols);
        dstep *s = (dstep *)(nb == gp->nb ? &gp->full : &gp->last);
        int rc;
        if (kind == K_FWD) {
            void *p[] = { cols, (void *)w, (void *)bias, (unsigned char *)out + (size_t)n0 * opi };
            rc = step_run(be, D, s, op, p, sp);
        } else if (kind == K_BWDD) {
            void *p[] = { cols, (void *)w, (unsigned char *)out + (size_t)n0 * opi };
            rc = step_run(be, D, s, op, p, sp);
        } else {
            void *p[] = { (unsigned char *)dy + (size_t)n0 * opi, cols, out };
            rc = step_run(be, D, s, op, p, sp);
        }
        if (rc) return rc;
    }
    return TQ_OK;
}

/* ---- the kinds ---- */

static int make_fwd(tq_dnnl *D, dconv *c, const dgeom *g) {
    if (!(gemm_route(c, K_FWD) && make_gm(D, c, K_FWD, &c->gf) == 0)) {
        static const int args[] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST };
        if (make_fpd(D, c, g) || step_make(D, &c->f, c->fpd, args, 4) ||
            reorder_make(D, &c->f_wr, &g->wplain, pd_md(c->fpd, DNNL_ARG_WEIGHTS), 0, &c->f_wb))
            return -1;
    }
    c->zero = calloc((size_t)c->d.k, sizeof(float));
    return c->zero ? 0 : -1;
}

/* beta 1 through the flipped kernel: 0 when made, -1 when not possible here */
static int make_tr(tq_dnnl *D, dconv *c) {
    const tq_conv_desc *d = &c->d;
    if (d->stride != 1 || d->pad > d->r - 1 || d->pad > d->s - 1) return -1;
    const int N = d->x.n, H = d->x.h, W = d->x.w, C = d->x.c, K = d->k, R = d->r, S = d->s;
    const int P = tq_conv_out(H, R, 1, d->pad), Q = tq_conv_out(W, S, 1, d->pad);
    dnnl_dims_t sd = { N, K, P, Q }, dd = { N, C, H, W }, wd = { C, K, R, S }, st = { 1, 1 };
    dnnl_dims_t pl = { R - 1 - d->pad, S - 1 - d->pad };
    dnnl_dims_t pr = { H - 1 + R - P - pl[0], W - 1 + S - Q - pl[1] };
    const dnnl_data_type_t t = dnnl_dt(c->dt);
    dnnl_memory_desc_t src, dst, wany, wplain;
    if (dnnl_memory_desc_init_by_tag(&src, 4, sd, t, dnnl_nhwc) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&dst, 4, dd, t, dnnl_nhwc) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&wany, 4, wd, t, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&wplain, 4, wd, t, dnnl_ohwi) != dnnl_success)
        return -1;
    dnnl_convolution_desc_t cd;
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                           &src, &wany, NULL, &dst, st, pl, pr) != dnnl_success)
        return -1;
    dnnl_primitive_desc_t pd = pd_make(D, &cd, 1.0f, NULL);
    if (!pd) return -1;
    static const int args[] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST };
    int rc = step_make(D, &c->t, pd, args, 3) ||
             reorder_make(D, &c->t_wr, &wplain, pd_md(pd, DNNL_ARG_WEIGHTS), 0, &c->t_wb);
    dnnl_primitive_desc_destroy(pd);
    if (rc) {
        step_free(&c->t);
        step_free(&c->t_wr);
        c->t_wb = 0;
        return -1;
    }
    return 0;
}

static int make_bwdd(tq_dnnl *D, dconv *c, const dgeom *g) {
    if (gemm_route(c, K_BWDD) && make_gm(D, c, K_BWDD, &c->gd) == 0) return 0;
    if (make_fpd(D, c, g)) return -1;
    opdesc cd;
    if (op_desc(c, g, K_BWDD, 1, &cd)) return -1;
    dnnl_primitive_desc_t pd = pd_make(D, &cd, 0.0f, c->fpd);
    if (!pd) return -1;
    static const int args[] = { DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC };
    int rc = step_make(D, &c->b, pd, args, 3) ||
             reorder_make(D, &c->b_wr, &g->wplain, pd_md(pd, DNNL_ARG_WEIGHTS), 0, &c->b_wb);
    dnnl_primitive_desc_destroy(pd);
    if (rc) return -1;
    c->tr = !c->ip && make_tr(D, c) == 0;
    return 0;
}

/* the weight-gradient primitive with the bias gradient (bias 1) or without (0) */
static int make_bwdw_variant(tq_dnnl *D, dconv *c, const dgeom *g, int bias) {
    opdesc cd;
    if (op_desc(c, g, K_BWDW, bias, &cd)) return -1;
    dnnl_primitive_desc_t pd = pd_make(D, &cd, 0.0f, c->fpd);
    if (!pd) return -1;
    static const int args[] = { DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS,
                                DNNL_ARG_DIFF_BIAS };
    int rc = step_make(D, &c->w[bias], pd, args, bias ? 4 : 3) ||
             reorder_make(D, &c->w_wr[bias], pd_md(pd, DNNL_ARG_DIFF_WEIGHTS), &g->wplain32, 1,
                          &c->w_wb[bias]);
    if (!rc) c->w_wb[bias] = dnnl_memory_desc_get_size(pd_md(pd, DNNL_ARG_DIFF_WEIGHTS));
    dnnl_primitive_desc_destroy(pd);
    return rc ? -1 : 0;
}

/* Both variants for a convolution: without the bias gradient its kernels skip a reduction
 * over N·P·Q per output channel (resnet20's bf16 AMX kernels on 2 Xeon cores: 15% faster at
 * 16 channels, 5% at 64). The one without is optional: where it cannot be made, callers
 * without a bias take the other and drop the sums. */
static int make_bwdw(tq_dnnl *D, dconv *c, const dgeom *g) {
    if (gemm_route(c, K_BWDW) && make_gm(D, c, K_BWDW, &c->gw) == 0) return 0;
    if (make_fpd(D, c, g) || make_bwdw_variant(D, c, g, 1)) return -1;
    if (!c->ip && make_bwdw_variant(D, c, g, 0)) {
        step_free(&c->w[0]);
        step_free(&c->w_wr[0]);
        c->w_wb[0] = 0;
    }
    return 0;
}

static int same_desc(const tq_conv_desc *a, const tq_conv_desc *b) {
    return a->x.n == b->x.n && a->x.h == b->x.h && a->x.w == b->x.w && a->x.c == b->x.c &&
           a->k == b->k && a->r == b->r && a->s == b->s && a->stride == b->stride &&
           a->pad == b->pad;
}

/* the entry for (d, dt) with `kind` ready, or NULL: the im2col path runs it */
static dconv *lookup(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, int kind,
                     tq_dnnl **Dp) {
    if (dt != TQ_F32 && dt != TQ_BF16) return NULL;
    tq_dnnl *D = get_ctx(be);
    if (!D) return NULL;
    dconv *c = D->list;
    while (c && !(c->dt == dt && c->ip == ip && same_desc(&c->d, d))) c = c->next;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return NULL;
        c->d = *d;
        c->dt = dt;
        c->ip = ip;
        c->next = D->list;
        D->list = c;
    }
    if (c->state[kind] == 0) {
        set_threads(be);
        dgeom g;
        int rc = dgeom_init(d, dt, ip, &g);
        if (!rc) rc = kind == K_FWD ? make_fwd(D, c, &g) : kind == K_BWDD ? make_bwdd(D, c, &g)
                                                                           : make_bwdw(D, c, &g);
        c->state[kind] = rc ? -1 : 1;
        /* a failed kind never runs; its half-made objects are freed with the entry */
    }
    if (c->state[kind] != 1) return NULL;
    *Dp = D;
    return c;
}

static int need_direct(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, int kind,
                       size_t *bytes) {
    tq_dnnl *D;
    dconv *c = lookup(be, d, dt, ip, kind, &D);
    if (!c) return 0;
    *bytes = need_of(c, kind);
    return 1;
}

int tq_dnnl_conv_is_gemm(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int kind) {
    tq_dnnl *D;
    const dconv *c = lookup(be, d, dt, 0, kind, &D);
    return c && (kind == K_FWD ? c->gf.on : kind == K_BWDD ? c->gd.on : c->gw.on);
}

/* the aligned base of ws, after checking that ws holds `need` bytes */
static unsigned char *ws_base(tq_backend *be, const char *op, void *ws, size_t ws_bytes,
                              size_t need) {
    if (ws_bytes < need || !ws) {
        tq_backend_seterr(be, "%s: workspace too small (%zu < %zu bytes)", op, ws_bytes, need);
        return NULL;
    }
    uintptr_t p = (uintptr_t)ws;
    return (unsigned char *)((p + 63) / 64 * 64);
}

/* ---- the ops ---- */

static const char *op_name(int ip, int kind) {
    static const char *const name[2][NKIND] = {
        { "conv_fwd", "conv_bwd_data", "conv_bwd_filter" },
        { "linear_fwd", "linear_bwd_data", "linear_bwd_filter" },
    };
    return name[ip][kind];
}


static int fwd_direct(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, void *y,
                      const void *x, const void *w, const float *bias, void *ws, size_t ws_bytes) {
    const char *op = op_name(ip, K_FWD);
    tq_dnnl *D;
    dconv *c = lookup(be, d, dt, ip, K_FWD, &D);
    if (!c) return TQ_DNNL_NA;
    unsigned char *base = ws_base(be, op, ws, ws_bytes, need_of(c, K_FWD));
    if (!base) return TQ_EINVAL;
    set_threads(be);
    wlay L;
    lay_fwd(c, &L);
    if (c->gf.on)
        return run_gm(be, D, c, &c->gf, K_FWD, op, x, w, bias ? (const void *)bias : c->zero, y, NULL,
                      base + L.tmp, base + L.sp);
    void *wf = (void *)w;
    int rc;
    if (c->f_wr.p) {
        void *p[] = { wf, base + L.w };
        if ((rc = step_run(be, D, &c->f_wr, op, p, base + L.sp))) return rc;
        wf = base + L.w;
    }
    void *p[] = { (void *)x, wf, bias ? (void *)bias : c->zero, y };
    return step_run(be, D, &c->f, op, p, base + L.sp);
}

/* Wt[c][r][s][k] = W[k][R−1−r][S−1−s][c], elements of es bytes (a pure permutation): per tap, a
 * transpose of W's [K][C] slice, in tiles of FLIP_TB × FLIP_TB so that a tile's destination
 * lines stay in L1 (one element per line at a time, over all of C, missed on every store: 4.8%
 * of a CIFAR resnet18 bf16 run, whose 512-channel flips ran at a few ns an element) */
#define FLIP_TB 32
#define FLIP_W(T)                                                                             \
    for (int blk = 0; blk < nblk; blk++) {                                                    \
        const int tap = blk / nkb, r = tap / S, s = tap % S, k0 = blk % nkb * FLIP_TB;        \
        const int k1 = K - k0 < FLIP_TB ? K : k0 + FLIP_TB;                                   \
        const T *src = (const T *)w + ((size_t)r * S + s) * C;                                \
        T *dst = (T *)Wt + ((size_t)(R - 1 - r) * S + (S - 1 - s)) * K;                       \
        for (int c0 = 0; c0 < C; c0 += FLIP_TB) {                                             \
            const int c1 = C - c0 < FLIP_TB ? C : c0 + FLIP_TB;                               \
            for (int k = k0; k < k1; k++)                                                     \
                for (int ch = c0; ch < c1; ch++) dst[(size_t)ch * rsk + k] = src[(size_t)k * rsc + ch]; \
        }                                                                                     \
    }
static void flip_w(tq_backend *be, const tq_conv_desc *d, size_t es, void *Wt, const void *w) {
    const int K = d->k, R = d->r, S = d->s, C = d->x.c;
    const size_t rsk = (size_t)R * S * K, rsc = (size_t)R * S * C;
    const int nkb = (K + FLIP_TB - 1) / FLIP_TB, nblk = R * S * nkb;
    const int nt = K * R * S * C >= TQ_PAR_MIN ? tq_cpu_nt(be) : 1;
    if (es == 4) {
#pragma omp parallel for num_threads(nt) schedule(static)
        FLIP_W(uint32_t)
    } else {
#pragma omp parallel for num_threads(nt) schedule(static)
        FLIP_W(uint16_t)
    }
}
#undef FLIP_W

/* dx = beta·dx over n elements of dt (f32 or bf16); dx = beta·dx + t is the backend's own
 * accumulate (tq_cpu_accumulate) */
static void scale(tq_backend *be, tq_dtype dt, void *dx, size_t n, float beta) {
    int nt = n >= TQ_PAR_MIN ? tq_cpu_nt(be) : 1;
    if (dt == TQ_F32) {
        float *a = dx;
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (size_t i = 0; i < n; i++) a[i] *= beta;
        return;
    }
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) tq_st(dx, dt, i, beta * tq_ld(dx, dt, i));
}

static int bwdd_direct(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, void *dx,
                       float beta, const void *dy, const void *w, void *ws, size_t ws_bytes) {
    const char *op = op_name(ip, K_BWDD);
    tq_dnnl *D;
    dconv *c = lookup(be, d, dt, ip, K_BWDD, &D);
    if (!c) return TQ_DNNL_NA;
    unsigned char *base = ws_base(be, op, ws, ws_bytes, need_of(c, K_BWDD));
    if (!base) return TQ_EINVAL;
    set_threads(be);
    wlay L;
    int rc;
    if (c->gd.on) {   /* dx = beta·dx + conv(dy, Wt) through the GEMMs' sum post-op */
        if (beta == 0.0f) tq_cpu_zero(be, dx, nx_of(c) * esize(dt));
        else if (beta != 1.0f) scale(be, dt, dx, nx_of(c), beta);
        lay_bwdd_gm(c, &L);
        flip_w(be, d, esize(dt), base + L.flip, w);
        return run_gm(be, D, c, &c->gd, K_BWDD, op, dy, base + L.flip, NULL, dx, NULL, base + L.tmp,
                      base + L.sp);
    }
    if (beta != 0.0f && c->tr) {
        /* dx = beta·dx + conv(dy, Wt): the sum post-op adds to what dx holds */
        if (beta != 1.0f) scale(be, dt, dx, nx_of(c), beta);
        lay_bwdd_tr(c, &L);
        void *wt = base + L.flip;
        flip_w(be, d, esize(dt), wt, w);
        void *wb = wt;
        if (c->t_wr.p) {
            wb = base + L.w;
            void *p[] = { wt, wb };
            if ((rc = step_run(be, D, &c->t_wr, op, p, base + L.sp))) return rc;
        }
        void *p[] = { (void *)dy, wb, dx };
        return step_run(be, D, &c->t, op, p, base + L.sp);
    }
    lay_bwdd0(c, &L);
    void *wb = (void *)w;
    if (c->b_wr.p) {
        void *p[] = { wb, base + L.w };
        if ((rc = step_run(be, D, &c->b_wr, op, p, base + L.sp))) return rc;
        wb = base + L.w;
    }
    if (beta == 0.0f) {
        void *p[] = { (void *)dy, wb, dx };
        return step_run(be, D, &c->b, op, p, base + L.sp);
    }
    /* no flipped-kernel primitive: into T, then dx = beta·dx + T */
    void *t = base + L.tmp;
    void *p[] = { (void *)dy, wb, t };
    if ((rc = step_run(be, D, &c->b, op, p, base + L.sp))) return rc;
    return tq_cpu_accumulate(be, nx_of(c), dt, dx, beta, t);
}

static int bwdw_direct(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, float *dw,
                       float *db, const void *x, const void *dy, void *ws, size_t ws_bytes) {
    const char *op = op_name(ip, K_BWDW);
    tq_dnnl *D;
    dconv *c = lookup(be, d, dt, ip, K_BWDW, &D);
    if (!c) return TQ_DNNL_NA;
    unsigned char *base = ws_base(be, op, ws, ws_bytes, need_of(c, K_BWDW));
    if (!base) return TQ_EINVAL;
    if (!dw && !db) return TQ_OK;
    set_threads(be);
    wlay L;
    lay_bwdw(c, &L);
    if (c->gw.on) {
        if (db) tq_cpu_bias_grad(be, tq_shape_numel(tq_conv_yshape(d)) / (size_t)d->k, d->k, dt, dy, db);
        return dw ? run_gm(be, D, c, &c->gw, K_BWDW, op, x, NULL, NULL, dw, dy, base + L.tmp, base + L.sp) : TQ_OK;
    }
    float *dbt = (float *)(base + L.db);
    int v = db || !c->w[0].p;   /* the variant: with the bias gradient where asked or needed */
    void *p[] = { (void *)x, (void *)dy, base + L.dw, dbt };
    int rc = step_run(be, D, &c->w[v], op, p, base + L.sp);
    if (rc) return rc;
    if (dw) {
        void *q[] = { base + L.dw, dw };
        if ((rc = step_run(be, D, &c->w_wr[v], op, q, base + L.sp))) return rc;
    }
    if (db)
        for (int k = 0; k < d->k; k++) db[k] += dbt[k];
    return TQ_OK;
}

/* ---- 16-bit types oneDNN does not run natively: the f32 primitives, a chunk at a time ----
 *
 * oneDNN 2.6 has no f16 convolutions here, and no bf16 ones on a CPU without AVX-512 (an
 * AVX2-only machine), so such an op converts C32_CHUNK_BYTES' worth of images of its operands
 * to f32 (x and y, or dy and dx), runs the f32 primitive of the chunk's descriptor (N = the
 * chunk's images; a shorter last chunk has its own) and rounds the result back once: the
 * arithmetic of the f32 convolution (products of 16-bit values are exact in f32, sums in f32,
 * one rounding at the end: what oneDNN's native bf16 kernels do too), in 16-bit storage, for a
 * workspace of one chunk's copies instead of whole-batch ones. dW and db accumulate over the
 * chunks in f32. Before this, bf16 on an AVX2 machine took the im2col path: slower than f32. */

#define C32_CHUNK_BYTES ((size_t)1 << 20)

/* dt: the 16-bit storage type; ip: an inner product (a linear layer) */
typedef struct { tq_dtype dt; int ip, nb, nlast; tq_conv_desc full, last; size_t nx1, ny1, nw; } c32plan;

static void c32_plan(const tq_conv_desc *d, tq_dtype dt, int ip, c32plan *p) {
    p->dt = dt;
    p->ip = ip;
    tq_shape ys = tq_conv_yshape(d);
    p->nx1 = (size_t)d->x.h * d->x.w * d->x.c;
    p->ny1 = (size_t)ys.h * ys.w * ys.c;
    p->nw = (size_t)d->k * d->r * d->s * d->x.c;
    size_t nb = C32_CHUNK_BYTES / ((p->nx1 + p->ny1) * 4);
    if (nb < 1) nb = 1;
    if (nb > (size_t)d->x.n) nb = (size_t)d->x.n;
    p->nb = (int)nb;
    p->nlast = d->x.n % p->nb;
    p->full = *d;
    p->full.x.n = p->nb;
    p->last = *d;
    p->last.x.n = p->nlast;
}

/* workspace: [W f32 | X chunk f32 | Y chunk f32 | the chunk primitives' own] from the aligned
 * base; 0 when oneDNN does not run both chunk descriptors */
/* the sections of [W f32 | X chunk f32 | Y chunk f32]: bwd_filter reads no weights */
static void c32_sections(const c32plan *p, int kind, size_t *wb, size_t *xb, size_t *yb) {
    *wb = kind == K_BWDW ? 0 : up64(p->nw * 4);
    *xb = up64((size_t)p->nb * p->nx1 * 4);
    *yb = up64((size_t)p->nb * p->ny1 * 4);
}

static int c32_need(tq_backend *be, const c32plan *p, int kind, size_t *own, size_t *bytes) {
    size_t a = 0, b = 0, wb, xb, yb;
    if (!need_direct(be, &p->full, TQ_F32, p->ip, kind, &a)) return 0;
    if (p->nlast && !need_direct(be, &p->last, TQ_F32, p->ip, kind, &b)) return 0;
    c32_sections(p, kind, &wb, &xb, &yb);
    *own = wb + xb + yb;
    *bytes = 64 + *own + mx(a, b);
    return 1;
}

typedef struct { float *w, *x, *y; unsigned char *inner; size_t inner_bytes; } c32ws;

static int c32_ws(tq_backend *be, const char *op, const c32plan *p, int kind, void *ws,
                  size_t ws_bytes, c32ws *W) {
    size_t own, need, wb, xb, yb;
    if (!c32_need(be, p, kind, &own, &need)) return TQ_DNNL_NA;
    unsigned char *base = ws_base(be, op, ws, ws_bytes, need);
    if (!base) return TQ_EINVAL;
    c32_sections(p, kind, &wb, &xb, &yb);
    W->w = wb ? (float *)base : NULL;
    W->x = (float *)(base + wb);
    W->y = (float *)(base + wb + xb);
    W->inner = base + own;
    W->inner_bytes = need - 64 - own;
    return TQ_OK;
}

/* the chunk at image n0: its descriptor and (*nbc) its images */
static const tq_conv_desc *chunk_at(const c32plan *p, int n, int n0, int *nbc) {
    *nbc = n - n0 < p->nb ? n - n0 : p->nb;
    return *nbc == p->nb ? &p->full : &p->last;
}

/* plan, workspace and (w not NULL) the f32 weights of a chunked op */
static int c32_begin(tq_backend *be, const char *op, const tq_conv_desc *d, tq_dtype dt, int ip,
                     int kind, const void *w, void *ws, size_t ws_bytes, c32plan *p, c32ws *W) {
    c32_plan(d, dt, ip, p);
    int rc = c32_ws(be, op, p, kind, ws, ws_bytes, W);
    if (!rc && w) rc = tq_cpu_cast(be, p->nw, TQ_F32, W->w, p->dt, w);
    return rc;
}

/* images [n0, n0 + nb) of a 16-bit tensor (dt) of `per` elements an image, to f32 and back */
static int chunk_in(tq_backend *be, tq_dtype dt, float *dst, const void *src, int n0, int nb,
                    size_t per) {
    return tq_cpu_cast(be, (size_t)nb * per, TQ_F32, dst, dt, (const uint16_t *)src + (size_t)n0 * per);
}
static int chunk_out(tq_backend *be, tq_dtype dt, void *dst, const float *src, int n0, int nb,
                     size_t per) {
    return tq_cpu_cast(be, (size_t)nb * per, dt, (uint16_t *)dst + (size_t)n0 * per, TQ_F32, src);
}

/* a chunked op's operands: fwd y = conv(x, w) + bias; bwd_data dx = beta·dx + conv_bwd(dy, w);
 * bwd_filter dw, db += from (x, dy) */
typedef struct {
    void *y, *dx;
    const void *x, *dy, *w;
    const float *bias;
    float beta;
    float *dw, *db;
} c32args;

static int c32_op(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, int kind,
                  const c32args *a, void *ws, size_t ws_bytes) {
    c32plan p;
    c32ws W;
    int rc = c32_begin(be, op_name(ip, kind), d, dt, ip, kind, kind == K_BWDW ? NULL : a->w, ws,
                       ws_bytes, &p, &W);
    for (int n0 = 0, nb; !rc && n0 < d->x.n; n0 += nb) {
        const tq_conv_desc *dc = chunk_at(&p, d->x.n, n0, &nb);
        if (kind == K_FWD) {   /* x → W.x, conv into W.y, W.y → y */
            if (!(rc = chunk_in(be, dt, W.x, a->x, n0, nb, p.nx1)) &&
                !(rc = fwd_direct(be, dc, TQ_F32, ip, W.y, W.x, W.w, a->bias, W.inner, W.inner_bytes)))
                rc = chunk_out(be, dt, a->y, W.y, n0, nb, p.ny1);
        } else if (kind == K_BWDD) {   /* dy → W.y, (dx → W.x,) conv_bwd into W.x, W.x → dx */
            if (!(rc = chunk_in(be, dt, W.y, a->dy, n0, nb, p.ny1)) &&
                !(rc = a->beta != 0.0f ? chunk_in(be, dt, W.x, a->dx, n0, nb, p.nx1) : TQ_OK) &&
                !(rc = bwdd_direct(be, dc, TQ_F32, ip, W.x, a->beta, W.y, W.w, W.inner, W.inner_bytes)))
                rc = chunk_out(be, dt, a->dx, W.x, n0, nb, p.nx1);
        } else {               /* x → W.x, dy → W.y, dw and db accumulate */
            if (!(rc = chunk_in(be, dt, W.x, a->x, n0, nb, p.nx1)) &&
                !(rc = chunk_in(be, dt, W.y, a->dy, n0, nb, p.ny1)))
                rc = bwdw_direct(be, dc, TQ_F32, ip, a->dw, a->db, W.x, W.y, W.inner, W.inner_bytes);
        }
    }
    return rc;
}

/* bf16 through the f32 primitives even where oneDNN has bf16 kernels: on Intel CPUs where its
 * best ISA is AVX-512 without AMX. There (2 Emerald Rapids cores, resnet20 batch 128, `trainq
 * run --profile`) its bf16 kernels ran the 3×3 convolutions of 16-64 channels at 97-192
 * GFLOP/s, the same convolutions in f32 chunks at 123-306, and whole bf16 steps took 171 ms
 * against 120; `bench/ab TQ_CPU_BF16_F32=0,TQ_CPU_WINOGRAD=1 - --amps bf16 --rounds 7` (the rule
 * before, Winograd for the 3×3 ones) gave resnet20 1.14-1.15x, cnn 0.97-1.00x. A zmm VDPBF16PS
 * issues at half the rate of a zmm FMA there (0.27 against 0.135 ns an instruction), 118
 * multiply-adds a ns either way, so bf16 dot products do no more arithmetic than f32 FMAs and
 * oneDNN's bf16 kernels use them less well; on Intel CPUs with AVX-512 but no BF16 instructions
 * (Skylake to Ice Lake) oneDNN 2.6 emulates bf16. AMX keeps oneDNN's tile kernels (2-3x its f32
 * ones), AMD's Zen 4 its bf16 kernels (resnet20 bf16 1.5x its fp32 there: docs/benchmarks.md),
 * and below AVX-512 oneDNN 2.6 has no bf16 kernels at all. TQ_CPU_BF16_F32=1 forces the f32
 * route wherever oneDNN runs, =0 keeps oneDNN's bf16 kernels wherever it has them. Decided
 * once per backend. */
int tq_cpu_is_intel(void) {
    unsigned a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;   /* GenuineIntel */
}

static int bf16_via_f32(tq_backend *be) {
    tq_dnnl *D = get_ctx(be);
    if (!D) return 0;
    if (!D->bf16_f32) {
        const char *env = getenv("TQ_CPU_BF16_F32");
        int on;
        if (env && (env[0] == '0' || env[0] == '1') && env[1] == 0) on = env[0] == '1';
        else on = !tq_dnnl_below_avx512(be) && !tq_dnnl_has_amx(be) && tq_cpu_is_intel();
        D->bf16_f32 = on ? 1 : 2;
    }
    return D->bf16_f32 == 1;
}

/* ---- the entry points: f32 and bf16 directly, f16 (and bf16 without native kernels) in f32
 * chunks; convolutions, and linear layers as inner products ---- */

/* the type's ops run in f32 chunks: f16 always, bf16 where bf16_via_f32 says so or oneDNN has no
 * bf16 primitive for the descriptor and kind on this CPU (decided once per descriptor: lookup
 * caches the outcome) */
static int via_f32(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, int kind) {
    tq_dnnl *D;
    return dt == TQ_F16 || (dt == TQ_BF16 && (bf16_via_f32(be) || !lookup(be, d, dt, ip, kind, &D)));
}

static int need_any(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, int kind,
                    size_t *bytes) {
    if (!via_f32(be, d, dt, ip, kind)) return need_direct(be, d, dt, ip, kind, bytes);
    c32plan p;
    size_t own;
    c32_plan(d, dt, ip, &p);
    return c32_need(be, &p, kind, &own, bytes);
}

static int op_any(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int ip, int kind,
                  const c32args *a, void *ws, size_t ws_bytes) {
    if (via_f32(be, d, dt, ip, kind)) return c32_op(be, d, dt, ip, kind, a, ws, ws_bytes);
    if (kind == K_FWD) return fwd_direct(be, d, dt, ip, a->y, a->x, a->w, a->bias, ws, ws_bytes);
    if (kind == K_BWDD) return bwdd_direct(be, d, dt, ip, a->dx, a->beta, a->dy, a->w, ws, ws_bytes);
    return bwdw_direct(be, d, dt, ip, a->dw, a->db, a->x, a->dy, ws, ws_bytes);
}

int tq_dnnl_conv_need(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int kind,
                      size_t *bytes) {
    return need_any(be, d, dt, 0, kind, bytes);
}

int tq_dnnl_conv_fwd(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x,
                     const void *w, const float *bias, void *ws, size_t ws_bytes) {
    c32args a = { .y = y, .x = x, .w = w, .bias = bias };
    return op_any(be, d, dt, 0, K_FWD, &a, ws, ws_bytes);
}

int tq_dnnl_conv_bwd_data(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *dx,
                          float beta, const void *dy, const void *w, void *ws, size_t ws_bytes) {
    c32args a = { .dx = dx, .dy = dy, .w = w, .beta = beta };
    return op_any(be, d, dt, 0, K_BWDD, &a, ws, ws_bytes);
}

int tq_dnnl_conv_bwd_filter(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, float *dw,
                            float *db, const void *x, const void *dy, void *ws,
                            size_t ws_bytes) {
    c32args a = { .x = x, .dy = dy, .dw = dw, .db = db };
    return op_any(be, d, dt, 0, K_BWDW, &a, ws, ws_bytes);
}

/* Linear layers: inner products (x [n][in], w [out][in], y [n][out]) through the same cache,
 * workspace layouts and ops; d is the layer's 1×1 geometry, d.x = (n, 1, 1, in). The GEMMs run
 * on oneDNN's kernels for this CPU (AMX for bf16 where the CPU has it) instead of OpenBLAS's,
 * which on a CPU model it does not know fall back to SSE (OpenBLAS 0.3.21 calls Sapphire and
 * Emerald Rapids "Prescott"): cnn fp32, whose fc1 is 10% of its FLOPs, spent 25% of its time
 * in sgemm_kernel_PRESCOTT. */

int tq_dnnl_linear_need(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, int kind,
                        size_t *bytes) {
    return need_any(be, d, dt, 1, kind, bytes);
}

int tq_dnnl_linear_fwd(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *y,
                       const void *x, const void *w, const float *bias, void *ws, size_t ws_bytes) {
    c32args a = { .y = y, .x = x, .w = w, .bias = bias };
    return op_any(be, d, dt, 1, K_FWD, &a, ws, ws_bytes);
}

int tq_dnnl_linear_bwd_data(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *dx,
                            float beta, const void *dy, const void *w, void *ws, size_t ws_bytes) {
    c32args a = { .dx = dx, .dy = dy, .w = w, .beta = beta };
    return op_any(be, d, dt, 1, K_BWDD, &a, ws, ws_bytes);
}

int tq_dnnl_linear_bwd_filter(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, float *dw,
                              float *db, const void *x, const void *dy, void *ws,
                              size_t ws_bytes) {
    c32args a = { .x = x, .dy = dy, .dw = dw, .db = db };
    return op_any(be, d, dt, 1, K_BWDW, &a, ws, ws_bytes);
}
