/* cuda_linear.c — the linear layer through cuBLASLt: y[n][out] = x[n][in] · w[out][in]^T + bias,
 * its backward-data dx = dy · w and backward-filter dw += dy^T · x, db += Σ_n dy.
 *
 * Contract (op semantics: backend.h / cuda_internal.h)
 * - Row-major data, column-major cuBLASLt: a row-major M[r][c] is read as the column-major
 *   M^T (c × r, ld c), so every product is computed transposed (the table is in cuda_desc.h);
 *   all layouts are plain CUBLASLT_ORDER_COL (no ORDER_ROW: fewer algorithms support it).
 * - Compute type CUBLAS_COMPUTE_32F with f32 scale type for every dtype: f32 runs true fp32,
 *   so it matches the CPU backend to ~1e-6; f16/bf16 inputs accumulate in f32 on tensor cores.
 *   With TQ_TF32_MATMUL_OK in ctx->tf32 (spec tf32 true; PyTorch's matmul.allow_tf32, default
 *   off) f32 GEMMs use CUBLAS_COMPUTE_32F_FAST_TF32 instead (tqc_lin_compute_type); the
 *   choice is fixed per backend, so the cache needs no key for it.
 * - Bias (fwd): through CUBLASLT_EPILOGUE_BIAS. cuBLASLt wants the bias in D's type, so for
 *   f16/bf16 the f32 bias is first cast to dt into the workspace (tqc_cast) — PyTorch autocast
 *   also adds an fp16 copy of the bias inside the GEMM epilogue, rounding the output once. If
 *   the heuristic offers no algorithm with the epilogue, the GEMM runs without it and
 *   tqc_bias_add adds the bias afterwards.
 * - Backward-filter: dw (f32) accumulates. f32: D = dw with beta 1. f16/bf16: D is a dt
 *   temporary in the workspace (beta 0), then tqc_add_to_f32 — the grad of PyTorch AMP's fp16
 *   weight copy is fp16, so an overflow shows up as inf for the loss scaler. db: tqc_bias_grad.
 *   Backward-data: beta 0 or 1 is cublasLtMatmul's beta (C = D = dx).
 * - Cache: per (kind, n, in, out, dtype, bias) one matmul descriptor, its layouts and the
 *   heuristic's first algorithm, in ctx->lins (malloc'd list, freed by tqc_linear_destroy).
 *   tqc_linear_ws plans all four variants and returns the largest need: the algorithm's own
 *   workspace (at most 32 MiB, the heuristic's limit) plus the dt temporaries, each rounded up
 *   to 256 bytes and placed first: [temporary | cuBLASLt workspace]. A shape not planned
 *   through linear_ws is planned on first use within the ws_bytes it was given.
 * - Pointers must be 16-byte aligned (the heuristic is asked for algorithms that need no more);
 *   checked, TQ_EINVAL otherwise. Errors: be->err names op, dtype, shape, status, the call,
 *   file:line; TQ_EDEVICE. Never exit(). One thread per backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>

#include "cuda/cuda_internal.h"
#include "cuda/cuda_desc.h"

#define LT_WS_CAP ((size_t)32 << 20)
#define LT_ALIGN 16u
#define LT_NRES 8

static size_t up256(size_t v) { return (v + 255) & ~(size_t)255; }

static const char *dt_name(tq_dtype dt) {
    return dt == TQ_F32 ? "f32" : dt == TQ_F16 ? "f16" : dt == TQ_BF16 ? "bf16" : "?";
}

const char *tqc_lin_kind_name(int kind) {
    return kind == TQC_LIN_FWD ? "linear_fwd" : kind == TQC_LIN_BWD_DATA ? "linear_bwd_data"
         : kind == TQC_LIN_BWD_FILTER ? "linear_bwd_filter" : "linear_?";
}

cudaDataType_t tqc_lt_dtype(tq_dtype dt) {
    return dt == TQ_F16 ? CUDA_R_16F : dt == TQ_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

cublasComputeType_t tqc_lin_compute_type(tq_dtype dt, int tf32) {
    return dt == TQ_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

static void lt_msg(char *buf, size_t n, cublasStatus_t st, const char *call, const char *file,
                   int line, const char *what) {
    if (!buf || !n) return;
    const char *base = strrchr(file, '/');
    snprintf(buf, n, "%s: %s (%s) from %s at %s:%d", what, cublasLtGetStatusName(st),
             cublasLtGetStatusString(st), call, base ? base + 1 : file, line);
}

#define LT_TRY(call)                                                                           \
    do {                                                                                       \
        cublasStatus_t st_ = (call);                                                           \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            lt_msg(err, errlen, st_, #call, __FILE__, __LINE__, what);                         \
            rc = (int)st_;                                                                     \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

void tqc_lin_descs_free(tqc_lin_descs *o) {
    if (!o) return;
    if (o->c) cublasLtMatrixLayoutDestroy(o->c);
    if (o->b) cublasLtMatrixLayoutDestroy(o->b);
    if (o->a) cublasLtMatrixLayoutDestroy(o->a);
    if (o->op) cublasLtMatmulDescDestroy(o->op);
    memset(o, 0, sizeof *o);
}

int tqc_lin_build_desc(int kind, int n, int in, int out, tq_dtype dt, int epi_bias, int tf32,
                       tqc_lin_descs *o, char *err, size_t errlen) {
    char what[128];
    int rc = 0;
    memset(o, 0, sizeof *o);
    snprintf(what, sizeof what, "%s %s n=%d in=%d out=%d%s", tqc_lin_kind_name(kind), dt_name(dt),
             n, in, out, epi_bias ? " +bias" : "");
    if (kind < 0 || kind > 2 || n <= 0 || in <= 0 || out <= 0 ||
        (dt != TQ_F32 && dt != TQ_F16 && dt != TQ_BF16) || (epi_bias && kind != TQC_LIN_FWD)) {
        if (err && errlen) snprintf(err, errlen, "%s: bad arguments", what);
        return (int)CUBLAS_STATUS_INVALID_VALUE;
    }
    const cudaDataType_t t = tqc_lt_dtype(dt);
    uint64_t ar, ac, br, bc, cr, cc;
    int64_t lda, ldb, ldc;
    o->ab_type = o->cd_type = t;
    switch (kind) {
    case TQC_LIN_FWD:           /* y^T[out×n] = op_T(w as in×out) · x^T[in×n] */
        o->m = out; o->n = n; o->k = in; o->transa = CUBLAS_OP_T; o->transb = CUBLAS_OP_N;
        ar = in; ac = out; lda = in; br = in; bc = n; ldb = in; cr = out; cc = n; ldc = out;
        break;
    case TQC_LIN_BWD_DATA:      /* dx^T[in×n] = (w as in×out) · dy^T[out×n] */
        o->m = in; o->n = n; o->k = out; o->transa = CUBLAS_OP_N; o->transb = CUBLAS_OP_N;
        ar = in; ac = out; lda = in; br = out; bc = n; ldb = out; cr = in; cc = n; ldc = in;
        break;
    default:                    /* dw^T[in×out] = x^T[in×n] · op_T(dy^T as out×n) */
        o->m = in; o->n = out; o->k = n; o->transa = CUBLAS_OP_N; o->transb = CUBLAS_OP_T;
        ar = in; ac = n; lda = in; br = out; bc = n; ldb = out; cr = in; cc = out; ldc = in;
        if (dt == TQ_F32) o->cd_type = CUDA_R_32F;
        break;
    }
    const int32_t ta = o->transa, tb = o->transb;
    o->compute = tqc_lin_compute_type(dt, tf32);
    LT_TRY(cublasLtMatmulDescCreate(&o->op, o->compute, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (epi_bias) {
        const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        const int32_t bt = (int32_t)t;
        LT_TRY(cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        LT_TRY(cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        o->epi_bias = 1;
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&o->a, t, ar, ac, lda));
    LT_TRY(cublasLtMatrixLayoutCreate(&o->b, t, br, bc, ldb));
    LT_TRY(cublasLtMatrixLayoutCreate(&o->c, o->cd_type, cr, cc, ldc));
    return 0;
fail:
    tqc_lin_descs_free(o);
    return rc;
}

/* ---- the cache ---- */

typedef struct lent {
    struct lent *next;
    int kind, n, in, out, bias;    /* key (with dt) */
    tq_dtype dt;
    tqc_lin_descs ds;
    cublasLtMatmulAlgo_t algo;
    size_t ws;                     /* the algorithm's workspace */
} lent;

struct tqc_lin_cache {
    lent *head;
    size_t count;
};

int tqc_linear_init(tq_backend *be) {
    tqc_ctx *c = tqc(be);
    if (c->lins) return TQ_OK;
    c->lins = calloc(1, sizeof *c->lins);
    if (!c->lins) {
        tq_backend_seterr(be, "linear: out of host memory for the GEMM cache");
        return TQ_ENOMEM;
    }
    return TQ_OK;
}

void tqc_linear_destroy(tq_backend *be) {
    tqc_ctx *c = be ? tqc(be) : NULL;
    if (!c || !c->lins) return;
    lent *p = c->lins->head;
    while (p) {
        lent *nx = p->next;
        tqc_lin_descs_free(&p->ds);
        free(p);
        p = nx;
    }
    free(c->lins);
    c->lins = NULL;
}

/* The heuristic's first algorithm for o within `limit` bytes of workspace. */
static cublasStatus_t pick_algo(cublasLtHandle_t lt, const tqc_lin_descs *o, size_t limit,
                                cublasLtMatmulAlgo_t *algo, size_t *ws, int *nres_out) {
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t st = cublasLtMatmulPreferenceCreate(&pref);
    *nres_out = 0;
    if (st) return st;
    const uint64_t maxws = limit;
    const uint32_t al = LT_ALIGN;
    if ((st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &maxws, sizeof maxws)) ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al)) ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al)) ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al)) ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al)))
        goto done;
    cublasLtMatmulHeuristicResult_t res[LT_NRES];
    int nres = 0;
    memset(res, 0, sizeof res);
    st = cublasLtMatmulAlgoGetHeuristic(lt, o->op, o->a, o->b, o->c, o->c, pref, LT_NRES, res, &nres);
    if (st) goto done;
    *nres_out = nres;
    st = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < nres; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= limit) {
            *algo = res[i].algo;
            *ws = res[i].workspaceSize;
            st = CUBLAS_STATUS_SUCCESS;
            break;
        }
done:
    cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

static size_t tmp_bytes(int kind, int bias, int in, int out, tq_dtype dt) {
    if (dt == TQ_F32) return 0;
    if (kind == TQC_LIN_FWD && bias) return up256((size_t)out * tq_dtype_size(dt));
    if (kind == TQC_LIN_BWD_FILTER) return up256((size_t)out * in * tq_dtype_size(dt));
    return 0;
}

static int get_lplan(tq_backend *be, int kind, int n, int in, int out, tq_dtype dt, int bias,
                     size_t limit, lent **res) {
    tqc_ctx *ctx = tqc(be);
    const char *nm = tqc_lin_kind_name(kind);
    if (!ctx->lins) {
        tq_backend_seterr(be, "%s: tqc_linear_init was not called", nm);
        return TQ_EINVAL;
    }
    if (n <= 0 || in <= 0 || out <= 0 || (dt != TQ_F32 && dt != TQ_F16 && dt != TQ_BF16)) {
        tq_backend_seterr(be, "%s: bad shape n=%d in=%d out=%d or dtype %d", nm, n, in, out, (int)dt);
        return TQ_EINVAL;
    }
    for (lent *p = ctx->lins->head; p; p = p->next)
        if (p->kind == kind && p->n == n && p->in == in && p->out == out && p->dt == dt &&
            p->bias == bias) {
            *res = p;
            return TQ_OK;
        }
    if (tqc_miss_while_capturing(be, nm)) return TQ_EDEVICE;
    lent *p = calloc(1, sizeof *p);
    if (!p) { tq_backend_seterr(be, "%s: out of host memory", nm); return TQ_ENOMEM; }
    p->kind = kind; p->n = n; p->in = in; p->out = out; p->dt = dt; p->bias = bias;
    char err[sizeof be->err];
    cublasLtHandle_t lt = (cublasLtHandle_t)ctx->lt;
    int nres = 0;
    for (int epi = kind == TQC_LIN_FWD && bias; epi >= 0; epi--) {
        int rc = tqc_lin_build_desc(kind, n, in, out, dt, epi, (ctx->tf32 & TQ_TF32_MATMUL_OK) != 0,
                                    &p->ds, err, sizeof err);
        if (rc) {
            tq_backend_seterr(be, "%s", err);
            free(p);
            return TQ_EDEVICE;
        }
        cublasStatus_t st = pick_algo(lt, &p->ds, limit, &p->algo, &p->ws, &nres);
        if (st == CUBLAS_STATUS_SUCCESS) {
            p->next = ctx->lins->head;
            ctx->lins->head = p;
            ctx->lins->count++;
            *res = p;
            return TQ_OK;
        }
        tqc_lin_descs_free(&p->ds);
        if (epi == 0) {
            char what[128];
            snprintf(what, sizeof what, "%s %s n=%d in=%d out=%d", nm, dt_name(dt), n, in, out);
            lt_msg(err, sizeof err, st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__, what);
            tq_backend_seterr(be, "%s (%d results within %zu bytes)", err, nres, limit);
            free(p);
            return TQ_EDEVICE;
        }
    }
    free(p);   /* not reached */
    return TQ_EDEVICE;
}

static int al16(const void *p) { return ((uintptr_t)p % LT_ALIGN) == 0; }

/* D = C = alpha·op(A)·op(B) + beta·C on ctx->stream */
static int lt_run(tq_backend *be, const lent *p, const void *A, const void *B, float beta, void *C,
                  void *ws, size_t ws_bytes) {
    const char *nm = tqc_lin_kind_name(p->kind);
    if (p->ws > ws_bytes) {
        tq_backend_seterr(be, "%s: workspace of %zu bytes, the GEMM needs %zu (size it with linear_ws)",
                          nm, ws_bytes, p->ws);
        return TQ_EINVAL;
    }
    if (!A || !B || !C || !al16(A) || !al16(B) || !al16(C) || (p->ws && !al16(ws))) {
        tq_backend_seterr(be, "%s: NULL or not %u-byte aligned pointer (%p %p %p ws %p)", nm, LT_ALIGN,
                          A, B, C, ws);
        return TQ_EINVAL;
    }
    const float alpha = 1.0f;
    cublasStatus_t st = cublasLtMatmul((cublasLtHandle_t)tqc(be)->lt, p->ds.op, &alpha, A, p->ds.a, B,
                                       p->ds.b, &beta, C, p->ds.c, C, p->ds.c, &p->algo,
                                       p->ws ? ws : NULL, p->ws, tqc(be)->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char what[128], msg[sizeof be->err];
        snprintf(what, sizeof what, "%s %s n=%d in=%d out=%d", nm, dt_name(p->dt), p->n, p->in, p->out);
        lt_msg(msg, sizeof msg, st, "cublasLtMatmul", __FILE__, __LINE__, what);
        tq_backend_seterr(be, "%s", msg);
        return TQ_EDEVICE;
    }
    return TQ_OK;
}

static size_t lim(size_t avail) { return avail < LT_WS_CAP ? avail : LT_WS_CAP; }

size_t tqc_linear_ws(tq_backend *be, int n, int in, int out, tq_dtype dt) {
    const struct { int kind, bias; } v[4] = {
        { TQC_LIN_FWD, 0 }, { TQC_LIN_FWD, 1 }, { TQC_LIN_BWD_DATA, 0 }, { TQC_LIN_BWD_FILTER, 0 } };
    size_t need = 0;
    for (int i = 0; i < 4; i++) {
        lent *p;
        if (get_lplan(be, v[i].kind, n, in, out, dt, v[i].bias, LT_WS_CAP, &p)) return 0;   /* be->err set */
        size_t w = tmp_bytes(v[i].kind, v[i].bias, in, out, dt) + p->ws;
        if (w > need) need = w;
    }
    return need;
}

int tqc_linear_fwd(tq_backend *be, int n, int in, int out, tq_dtype dt, void *y, const void *x,
                   const void *w, const float *bias, void *ws, size_t ws_bytes) {
    const int hb = bias != NULL;
    const size_t tmp = tmp_bytes(TQC_LIN_FWD, hb, in, out, dt);
    if (tmp > ws_bytes) {
        tq_backend_seterr(be, "linear_fwd: workspace of %zu bytes, the %s bias copy needs %zu", ws_bytes,
                          dt_name(dt), tmp);
        return TQ_EINVAL;
    }
    lent *p;
    int rc = get_lplan(be, TQC_LIN_FWD, n, in, out, dt, hb, lim(ws_bytes - tmp), &p);
    if (rc) return rc;
    if (hb && p->ds.epi_bias) {
        const void *bp = bias;
        if (dt != TQ_F32) {
            if ((rc = tqc_cast(be, (size_t)out, dt, ws, TQ_F32, bias))) return rc;
            bp = ws;
        }
        if (!al16(bp)) {
            tq_backend_seterr(be, "linear_fwd: bias %p is not %u-byte aligned", bp, LT_ALIGN);
            return TQ_EINVAL;
        }
        cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &bp, sizeof bp);
        if (st != CUBLAS_STATUS_SUCCESS) {
            char msg[sizeof be->err];
            lt_msg(msg, sizeof msg, st, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", __FILE__,
                   __LINE__, "linear_fwd");
            tq_backend_seterr(be, "%s", msg);
            return TQ_EDEVICE;
        }
    }
    if ((rc = lt_run(be, p, w, x, 0.0f, y, (char *)ws + tmp, ws_bytes - tmp))) return rc;
    if (hb && !p->ds.epi_bias) return tqc_bias_add(be, (size_t)n, out, dt, y, bias);
    return TQ_OK;
}

int tqc_linear_bwd_data(tq_backend *be, int n, int in, int out, tq_dtype dt, void *dx, float beta,
                        const void *dy, const void *w, void *ws, size_t ws_bytes) {
    if (beta != 0.0f && beta != 1.0f) {
        tq_backend_seterr(be, "linear_bwd_data: beta must be 0 or 1 (got %g)", (double)beta);
        return TQ_EINVAL;
    }
    lent *p;
    int rc = get_lplan(be, TQC_LIN_BWD_DATA, n, in, out, dt, 0, lim(ws_bytes), &p);
    if (rc) return rc;
    return lt_run(be, p, w, dy, beta, dx, ws, ws_bytes);
}

int tqc_linear_bwd_filter(tq_backend *be, int n, int in, int out, tq_dtype dt, float *dw,
                          float *db, const void *x, const void *dy, void *ws, size_t ws_bytes) {
    int rc;
    if (dw) {
        const size_t tmp = tmp_bytes(TQC_LIN_BWD_FILTER, 0, in, out, dt);
        if (tmp > ws_bytes) {
            tq_backend_seterr(be, "linear_bwd_filter: workspace of %zu bytes, the %s dw temporary "
                              "needs %zu (size it with linear_ws)", ws_bytes, dt_name(dt), tmp);
            return TQ_EINVAL;
        }
        lent *p;
        if ((rc = get_lplan(be, TQC_LIN_BWD_FILTER, n, in, out, dt, 0, lim(ws_bytes - tmp), &p)))
            return rc;
        if (dt == TQ_F32) {
            if ((rc = lt_run(be, p, x, dy, 1.0f, dw, ws, ws_bytes))) return rc;
        } else {
            if ((rc = lt_run(be, p, x, dy, 0.0f, ws, (char *)ws + tmp, ws_bytes - tmp))) return rc;
            if ((rc = tqc_add_to_f32(be, (size_t)out * in, dw, dt, ws))) return rc;
        }
    }
    if (db) {
        if (n <= 0 || out <= 0) {
            tq_backend_seterr(be, "linear_bwd_filter: bad shape n=%d out=%d", n, out);
            return TQ_EINVAL;
        }
        return tqc_bias_grad(be, (size_t)n, out, dt, db, dy);
    }
    return TQ_OK;
}
