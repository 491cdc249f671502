/* cuda_conv.c — convolutions through cuDNN's graph (backend) API: forward, backward-data,
 * backward-filter, f32/f16/bf16 data with f32 compute. No legacy cudnnConvolution* call (all
 * deprecated in cuDNN 9).
 *
 * Contract (see cuda_internal.h and backend.h for the op semantics)
 * - Layout: x/y NHWC, w KRSC, expressed as cuDNN DIMENSIONS (N,C,H,W order) + STRIDES
 *   (tqc_conv_geom_of, cuda_desc.h). Every data pointer must be 16-byte aligned (the tensors'
 *   BYTE_ALIGNMENT); the ops check it and return TQ_EINVAL otherwise.
 * - Plans. For each (op kind, beta, dtype, shape, stride, pad) one execution plan is chosen and
 *   cached in ctx->convs (a malloc'd hash table, freed by tqc_conv_destroy): op graph →
 *   heuristics CUDNN_HEUR_MODE_A, and CUDNN_HEUR_MODE_FALLBACK only when no MODE_A config
 *   gives a plan → engine configs tried in heuristic order until an execution plan finalizes.
 *   Configs are filtered by their notes, in two passes:
 *     strict:  no DOWN_CONVERT_INPUTS, no REDUCED_PRECISION_REDUCTION, no RUNTIME_COMPILATION
 *              (NVRTC at plan time: slow and needs libnvrtc), and for f32 no TENSOR_CORE
 *              unless TF32 is allowed;
 *     relaxed (only when strict finds nothing): no DOWN_CONVERT_INPUTS, and for f32 no
 *              TENSOR_CORE unless TF32 is allowed.
 *   With ctx->deterministic (spec `deterministic`, the default) both passes also refuse
 *   NONDETERMINISTIC engines (atomics): two identical runs then give the same bits, and a
 *   resumed GPU run repeats the uninterrupted one. When no deterministic engine takes a shape
 *   the op fails with a message that says so (none seen: on an H200 every shape of the models
 *   and of gpu_ops has one). tqc_conv_cfg_allowed is this rule, unit-tested without a GPU.
 *   TQ_CUDNN_LOG=1 in the environment prints every plan chosen (op, shape, dtype, engine,
 *   its notes, workspace, benchmark time) to stderr.
 *   TF32 policy: in the graph API an f32 convolution runs in TF32 exactly when its engine
 *   carries CUDNN_NUMERICAL_NOTE_TENSOR_CORE (there is no math-mode knob; the convolution's
 *   COMP_TYPE stays FLOAT either way). With TF32 off (ctx->tf32 without TQ_TF32_CONV_OK: spec
 *   tf32 false, and gpu_ops) f32 never takes such an engine (nor, ever, one that down-converts
 *   its inputs): f32 results then match the CPU backend within its 1e-4 check (FFT/Winograd
 *   engines, which stay allowed, are well inside it). With TQ_TF32_CONV_OK (spec tf32 "conv",
 *   the default, or true) tensor-core engines are allowed for f32 too. This is PyTorch's rule
 *   (aten/src/ATen/native/cudnn/Conv_v8.cpp filters TENSOR_CORE engines for float exactly when
 *   torch.backends.cudnn.allow_tf32 is off, whose default is on, and DOWN_CONVERT_INPUTS
 *   always). The choice is fixed per backend, so the plan cache needs no key for it.
 * - Workspace cap: candidates needing more than min(256 MiB, free device memory / 4 at
 *   tqc_conv_init) are skipped. tqc_conv_ws plans fwd, bwd_data (beta 0 and 1) and bwd_filter
 *   and returns the largest need, including bwd_filter's 16-bit dw temporary; when planning
 *   fails it returns 0 with the reason in be->err (the op then fails with the same message).
 *   An op whose shape was not planned through conv_ws plans on first use, limited to the
 *   ws_bytes it was given.
 * - Benchmark mode (ctx->benchmark, cudnn_benchmark): at planning time inside tqc_conv_ws —
 *   which the memory planner calls before any training step and before the arena exists — up
 *   to 8 plans that finalize are each run 1 + 3 times on temporary cudaMalloc'd x/w/y/workspace
 *   buffers (zeroed, freed before returning, not counted in be->bytes_live), timed with CUDA
 *   events on ctx->stream, and the fastest is kept. Lazy planning inside an op never benchmarks
 *   (ops never allocate). If the temporaries cannot be allocated the heuristic's first is kept.
 * - Bias (fwd): not fused; tqc_bias_add (cuda_*.cu) adds it after the convolution, in dt.
 * - Backward-filter: dw/db are f32 and accumulated. f32: the op writes dw with beta 1. f16/bf16:
 *   dw is computed in dt into the workspace (beta 0; the grad of PyTorch AMP's fp16 weight copy
 *   is fp16 too, so an overflow shows up as inf for the loss scaler) and tqc_add_to_f32 adds it
 *   to dw. db through tqc_bias_grad. Backward-data: beta 0 or 1 is the op's BETA attribute.
 *   Should no engine take beta 1 for a shape (bwd_data beta 1, f32 bwd_filter), that op runs
 *   staged instead: beta 0 into a workspace temporary, then tqc_accumulate adds it; conv_ws then
 *   includes the temporary. A planning that failed is cached with its message (not retried).
 * - The handle: ctx->cudnn, created by cuda_backend.c and bound to ctx->stream. It is given to
 *   the operation graph and the plans through the (cuDNN 9.x deprecated but supported)
 *   OPERATIONGRAPH_HANDLE / EXECUTION_PLAN_HANDLE attributes.
 * - Errors: a failed cuDNN call sets be->err to the op, dtype, shapes, status name, the call's
 *   text, file:line and cuDNN's detail, and the op returns TQ_EDEVICE (TQ_EINVAL for bad
 *   arguments, TQ_ENOMEM for host allocations). Never exit(). One thread per backend.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cudnn.h>

#include "cuda/cuda_internal.h"
#include "cuda/cuda_desc.h"

#define WS_CAP ((size_t)256 << 20)   /* workspace cap per plan */
#define BENCH_MAX 8                  /* plans timed per shape in benchmark mode */
#define BENCH_REPS 3
#define MAX_CFGS 64                  /* heuristic results looked at per mode */
#define NBUCKET 64

static size_t up256(size_t v) { return (v + 255) & ~(size_t)255; }

/* ---- messages ---- */

void tqc_dnn_msg(char *buf, size_t n, int status, const char *call, const char *file, int line,
                 const char *what) {
    if (!buf || !n) return;
    char detail[160] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    const char *base = strrchr(file, '/');
    int k = snprintf(buf, n, "%s: %s from %s at %s:%d", what ? what : "cudnn",
                     cudnnGetErrorString((cudnnStatus_t)status), call, base ? base + 1 : file, line);
    if (detail[0] && k > 0 && (size_t)k + 4 < n) snprintf(buf + k, n - (size_t)k, " [%s]", detail);
}

#define DNN_TRY(call)                                                                          \
    do {                                                                                       \
        cudnnStatus_t st_ = (call);                                                            \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                     \
            tqc_dnn_msg(err, errlen, st_, #call, __FILE__, __LINE__, what);                    \
            rc = (int)st_;                                                                     \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

static const char *dt_name(tq_dtype dt) {
    return dt == TQ_F32 ? "f32" : dt == TQ_F16 ? "f16" : dt == TQ_BF16 ? "bf16" : "?";
}

const char *tqc_conv_kind_name(int kind) {
    return kind == TQC_CONV_FWD ? "conv_fwd" : kind == TQC_CONV_BWD_DATA ? "conv_bwd_data"
         : kind == TQC_CONV_BWD_FILTER ? "conv_bwd_filter" : "conv_?";
}

/* "conv_fwd f16 x=[n,h,w,c] w=[k,r,s,c] y=[n,p,q,k] stride 1 pad 1" (NHWC / KRSC order;
 * dx/dy, dw/dy for the backward kinds) */
static void describe(char *buf, size_t n, int kind, const tqc_conv_geom *g, tq_dtype dt) {
    const char *dx = kind == TQC_CONV_BWD_DATA ? "d" : "", *dw = kind == TQC_CONV_BWD_FILTER ? "d" : "";
    const char *dy = kind == TQC_CONV_FWD ? "" : "d";
    snprintf(buf, n,
             "%s %s %sx=[%lld,%lld,%lld,%lld] %sw=[%lld,%lld,%lld,%lld] %sy=[%lld,%lld,%lld,%lld] "
             "stride %lld pad %lld",
             tqc_conv_kind_name(kind), dt_name(dt), dx, (long long)g->xdim[0], (long long)g->xdim[2],
             (long long)g->xdim[3], (long long)g->xdim[1], dw, (long long)g->wdim[0],
             (long long)g->wdim[2], (long long)g->wdim[3], (long long)g->wdim[1], dy,
             (long long)g->ydim[0], (long long)g->ydim[2], (long long)g->ydim[3],
             (long long)g->ydim[1], (long long)g->stride[0], (long long)g->pad[0]);
}

/* ---- descriptors (no GPU needed) ---- */

#define NUM(x) (1u << (x))

int tqc_conv_cfg_allowed(unsigned num, unsigned beh, tq_dtype dt, int strict, int deterministic,
                         int tf32) {
    unsigned num_bad = NUM(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
    if (dt == TQ_F32 && !tf32) num_bad |= NUM(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
    if (strict) num_bad |= NUM(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION);
    if (deterministic) num_bad |= NUM(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
    const unsigned beh_bad = strict ? NUM(CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) : 0;
    return !(num & num_bad) && !(beh & beh_bad);
}

cudnnDataType_t tqc_dnn_dtype(tq_dtype dt) {
    return dt == TQ_F16 ? CUDNN_DATA_HALF : dt == TQ_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

int tqc_conv_geom_of(const tq_conv_desc *d, tqc_conv_geom *g) {
    if (!d || !g) return -1;
    const int64_t n = d->x.n, h = d->x.h, w = d->x.w, c = d->x.c, k = d->k, r = d->r, s = d->s;
    const int64_t st = d->stride, pad = d->pad;
    if (n <= 0 || h <= 0 || w <= 0 || c <= 0 || k <= 0 || r <= 0 || s <= 0 || st <= 0 || pad < 0 ||
        h + 2 * pad < r || w + 2 * pad < s)
        return -1;
    const int64_t p = (h + 2 * pad - r) / st + 1, q = (w + 2 * pad - s) / st + 1;
    memset(g, 0, sizeof *g);
    int64_t xd[4] = { n, c, h, w }, xs[4] = { h * w * c, 1, w * c, c };
    int64_t wd[4] = { k, c, r, s }, ws[4] = { r * s * c, 1, s * c, c };
    int64_t yd[4] = { n, k, p, q }, ys[4] = { p * q * k, 1, q * k, k };
    memcpy(g->xdim, xd, sizeof xd); memcpy(g->xstr, xs, sizeof xs);
    memcpy(g->wdim, wd, sizeof wd); memcpy(g->wstr, ws, sizeof ws);
    memcpy(g->ydim, yd, sizeof yd); memcpy(g->ystr, ys, sizeof ys);
    g->pad[0] = g->pad[1] = pad;
    g->stride[0] = g->stride[1] = st;
    g->dil[0] = g->dil[1] = 1;
    return 0;
}

static cudnnStatus_t set_attr(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                              cudnnBackendAttributeType_t t, int64_t n, const void *v) {
    return cudnnBackendSetAttribute(d, a, t, n, v);
}

static int make_tensor(cudnnBackendDescriptor_t *out, int64_t uid, cudnnDataType_t type,
                       const int64_t dim[4], const int64_t str[4], char *err, size_t errlen,
                       const char *what) {
    int rc = 0;
    cudnnBackendDescriptor_t t = NULL;
    const int64_t align = TQC_CONV_ALIGN;
    DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
    DNN_TRY(set_attr(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    DNN_TRY(set_attr(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim));
    DNN_TRY(set_attr(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str));
    DNN_TRY(set_attr(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    DNN_TRY(set_attr(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    DNN_TRY(cudnnBackendFinalize(t));
    *out = t;
    return 0;
fail:
    if (t) cudnnBackendDestroyDescriptor(t);
    return rc;
}

/* attribute names of the three operation kinds */
static const struct {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t t[3];   /* by uid − 1: x/dx, w/dw, y/dy */
    cudnnBackendAttributeName_t conv, alpha, beta;
} OPS[3] = {
    { CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
      { CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
        CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y },
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA },
    { CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      { CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY },
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA },
    { CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      { CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
        CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY },
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA },
};

void tqc_conv_descs_free(tqc_conv_descs *o) {
    if (!o) return;
    if (o->graph) cudnnBackendDestroyDescriptor(o->graph);
    if (o->op) cudnnBackendDestroyDescriptor(o->op);
    if (o->conv) cudnnBackendDestroyDescriptor(o->conv);
    for (int i = 0; i < 3; i++)
        if (o->t[i]) cudnnBackendDestroyDescriptor(o->t[i]);
    memset(o, 0, sizeof *o);
}

int tqc_conv_build_op(int kind, const tqc_conv_geom *g, tq_dtype dt, float alpha, float beta,
                      tqc_conv_descs *o, char *err, size_t errlen) {
    char what[200];
    int rc = 0;
    memset(o, 0, sizeof *o);
    if (kind < 0 || kind > 2 || !g || (dt != TQ_F32 && dt != TQ_F16 && dt != TQ_BF16)) {
        if (err && errlen) snprintf(err, errlen, "%s: bad kind %d or dtype %d", tqc_conv_kind_name(kind), kind, (int)dt);
        return (int)CUDNN_STATUS_BAD_PARAM;
    }
    describe(what, sizeof what, kind, g, dt);
    const cudnnDataType_t type = tqc_dnn_dtype(dt), comp = CUDNN_DATA_FLOAT;
    const int64_t spatial = 2;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    if ((rc = make_tensor(&o->t[0], TQC_UID_X, type, g->xdim, g->xstr, err, errlen, what))) goto fail;
    if ((rc = make_tensor(&o->t[1], TQC_UID_W, type, g->wdim, g->wstr, err, errlen, what))) goto fail;
    if ((rc = make_tensor(&o->t[2], TQC_UID_Y, type, g->ydim, g->ystr, err, errlen, what))) goto fail;

    DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &o->conv));
    DNN_TRY(set_attr(o->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial));
    DNN_TRY(set_attr(o->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    DNN_TRY(set_attr(o->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    DNN_TRY(set_attr(o->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, g->pad));
    DNN_TRY(set_attr(o->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, g->pad));
    DNN_TRY(set_attr(o->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, g->dil));
    DNN_TRY(set_attr(o->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, g->stride));
    DNN_TRY(cudnnBackendFinalize(o->conv));

    DNN_TRY(cudnnBackendCreateDescriptor(OPS[kind].type, &o->op));
    for (int i = 0; i < 3; i++)
        DNN_TRY(set_attr(o->op, OPS[kind].t[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o->t[i]));
    DNN_TRY(set_attr(o->op, OPS[kind].conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o->conv));
    DNN_TRY(set_attr(o->op, OPS[kind].alpha, CUDNN_TYPE_FLOAT, 1, &alpha));
    DNN_TRY(set_attr(o->op, OPS[kind].beta, CUDNN_TYPE_FLOAT, 1, &beta));
    DNN_TRY(cudnnBackendFinalize(o->op));
    return 0;
fail:
    tqc_conv_descs_free(o);
    return rc;
}

int tqc_conv_build_graph(tqc_conv_descs *o, cudnnHandle_t handle, int kind,
                         const tqc_conv_geom *g, tq_dtype dt, char *err, size_t errlen) {
    char what[200];
    int rc = 0;
    describe(what, sizeof what, kind, g, dt);
    if (o->graph) { cudnnBackendDestroyDescriptor(o->graph); o->graph = NULL; }
    DNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &o->graph));
    if (handle)
        DNN_TRY(set_attr(o->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    DNN_TRY(set_attr(o->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o->op));
    DNN_TRY(cudnnBackendFinalize(o->graph));
    return 0;
fail:
    if (o->graph) { cudnnBackendDestroyDescriptor(o->graph); o->graph = NULL; }
    return rc;
}

/* ---- the plan cache ---- */

typedef struct pent {
    struct pent *next;
    int kind, beta1;          /* key: op kind, beta (0/1), dtype, conv desc */
    tq_dtype dt;
    tq_conv_desc d;
    tqc_conv_descs ds;        /* kept alive with the plan */
    cudnnBackendDescriptor_t cfg, plan;
    size_t ws;                /* the plan's workspace */
    int64_t engine;           /* global engine index (diagnostics) */
    float ms;                 /* benchmark time per run, −1 when not timed */
    char *why;                /* a failed planning (plan NULL): its message, so it is not retried */
} pent;

struct tqc_conv_cache {
    pent *bucket[NBUCKET];
    size_t cap;               /* workspace cap per plan */
    size_t nplans;
};

static int same_desc(const tq_conv_desc *a, const tq_conv_desc *b) {
    return a->x.n == b->x.n && a->x.h == b->x.h && a->x.w == b->x.w && a->x.c == b->x.c &&
           a->k == b->k && a->r == b->r && a->s == b->s && a->stride == b->stride && a->pad == b->pad;
}

static unsigned key_hash(int kind, int beta1, tq_dtype dt, const tq_conv_desc *d) {
    const int v[12] = { kind, beta1, (int)dt, d->x.n, d->x.h, d->x.w, d->x.c, d->k, d->r, d->s,
                        d->stride, d->pad };
    uint32_t h = 2166136261u;
    for (int i = 0; i < 12; i++) { h ^= (uint32_t)v[i]; h *= 16777619u; h ^= h >> 15; }
    return h % NBUCKET;
}

static void pent_free(pent *p) {
    if (!p) return;
    if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
    if (p->cfg) cudnnBackendDestroyDescriptor(p->cfg);
    tqc_conv_descs_free(&p->ds);
    free(p->why);
    free(p);
}

int tqc_conv_init(tq_backend *be) {
    tqc_ctx *c = tqc(be);
    if (c->convs) return TQ_OK;
    c->convs = calloc(1, sizeof *c->convs);
    if (!c->convs) {
        tq_backend_seterr(be, "conv: out of host memory for the plan cache");
        return TQ_ENOMEM;
    }
    size_t fr = 0, tot = 0;
    c->convs->cap = WS_CAP;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        if (fr / 4 < c->convs->cap) c->convs->cap = fr / 4;
    } else {
        cudaGetLastError();
    }
    return TQ_OK;
}

void tqc_conv_destroy(tq_backend *be) {
    tqc_ctx *c = be ? tqc(be) : NULL;
    if (!c || !c->convs) return;
    for (int b = 0; b < NBUCKET; b++) {
        pent *p = c->convs->bucket[b];
        while (p) { pent *nx = p->next; pent_free(p); p = nx; }
    }
    free(c->convs);
    c->convs = NULL;
}

/* ---- engine configs and plans (need the device) ---- */

typedef struct {
    cudnnBackendDescriptor_t cfg, plan;
    size_t ws;
    int64_t engine;
    float ms;
    unsigned num;             /* numerical notes (diagnostics) */
} cand;

/* numerical and behavior notes of an engine config as bit masks; engine's global index */
static void cfg_notes(cudnnBackendDescriptor_t cfg, unsigned *num, unsigned *beh, int64_t *index) {
    *num = *beh = 0;
    *index = -1;
    cudnnBackendDescriptor_t e = NULL;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e) != CUDNN_STATUS_SUCCESS) return;
    int64_t cnt = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &cnt, &e) == CUDNN_STATUS_SUCCESS && cnt == 1) {
        cudnnBackendNumericalNote_t nn[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        cudnnBackendBehaviorNote_t bn[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
        int64_t k = 0;
        if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &k, nn) == CUDNN_STATUS_SUCCESS)
            for (int64_t i = 0; i < k && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) *num |= 1u << nn[i];
        k = 0;
        if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                     CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &k, bn) == CUDNN_STATUS_SUCCESS)
            for (int64_t i = 0; i < k && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++) *beh |= 1u << bn[i];
        cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, index);
    }
    cudnnBackendDestroyDescriptor(e);
}

/* TQ_CUDNN_LOG=1: one stderr line per plan chosen, to see which engines a model runs on. */
static void log_plan(const char *what, int beta1, const cand *k, int ncand) {
    const char *e = getenv("TQ_CUDNN_LOG");
    if (!e || !*e || !strcmp(e, "0")) return;
    static const char *const names[CUDNN_NUMERICAL_NOTE_TYPE_COUNT] = {
        [CUDNN_NUMERICAL_NOTE_TENSOR_CORE] = "tensor_core",
        [CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS] = "down_convert",
        [CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION] = "reduced_precision_reduction",
        [CUDNN_NUMERICAL_NOTE_FFT] = "fft", [CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC] = "nondeterministic",
        [CUDNN_NUMERICAL_NOTE_WINOGRAD] = "winograd", [CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4] = "winograd_4x4",
        [CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6] = "winograd_6x6",
        [CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13] = "winograd_13x13",
        [CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP] = "strict_nan_prop" };
    char notes[160] = "";
    size_t used = 0;
    for (unsigned i = 0; i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT && used < sizeof notes; i++)
        if ((k->num & NUM(i)) && names[i])
            used += (size_t)snprintf(notes + used, sizeof notes - used, "%s%s", used ? "," : "", names[i]);
    char how[64];
    if (k->ms < 0) snprintf(how, sizeof how, "the heuristic's first");
    else snprintf(how, sizeof how, "fastest of %d timed, %.3f ms", ncand, (double)k->ms);
    fprintf(stderr, "cudnn plan: %s beta %d: engine %lld [%s], workspace %zu B, %s\n", what, beta1,
            (long long)k->engine, notes, k->ws, how);
}

/* The engine configs the heuristic of `mode` suggests, best first; *n = 0 when it has none. */
static cudnnStatus_t heur_cfgs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                               cudnnBackendDescriptor_t *cfgs, int max, int *n) {
    *n = 0;
    cudnnBackendDescriptor_t h = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &h);
    if (st) return st;
    int64_t count = 0, got = 0;
    if ((st = set_attr(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph)) ||
        (st = set_attr(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)) ||
        (st = cudnnBackendFinalize(h)) ||
        (st = cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       0, &count, NULL)))
        goto done;
    if (count > max) count = max;
    for (int64_t i = 0; i < count; i++)
        if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]))) {
            for (int64_t j = 0; j < i; j++) { cudnnBackendDestroyDescriptor(cfgs[j]); cfgs[j] = NULL; }
            goto done;
        }
    st = count ? cudnnBackendGetAttribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs)
               : CUDNN_STATUS_SUCCESS;
    if (st) got = 0;
    for (int64_t j = got; j < count; j++) { cudnnBackendDestroyDescriptor(cfgs[j]); cfgs[j] = NULL; }
    *n = (int)got;
done:
    cudnnBackendDestroyDescriptor(h);
    return st;
}

static cudnnStatus_t make_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg,
                               cudnnBackendDescriptor_t *plan, size_t *ws) {
    cudnnBackendDescriptor_t p = NULL;
    int64_t w = 0, cnt = 0;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
    if (st) return st;
    if ((st = set_attr(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)) ||
        (st = set_attr(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg)) ||
        (st = cudnnBackendFinalize(p)) ||
        (st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                       &cnt, &w))) {
        cudnnBackendDestroyDescriptor(p);
        return st;
    }
    *plan = p;
    *ws = w > 0 ? (size_t)w : 0;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t make_vpack(void *const ptrs[3], void *ws, cudnnBackendDescriptor_t *vp) {
    static const int64_t uids[3] = { TQC_UID_X, TQC_UID_W, TQC_UID_Y };
    cudnnBackendDescriptor_t v = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &v);
    if (st) return st;
    if ((st = set_attr(v, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs)) ||
        (st = set_attr(v, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids)) ||
        (st = set_attr(v, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) ||
        (st = cudnnBackendFinalize(v))) {
        cudnnBackendDestroyDescriptor(v);
        return st;
    }
    *vp = v;
    return CUDNN_STATUS_SUCCESS;
}

/* Times each candidate (BENCH_REPS runs after one warm-up) on temporary buffers; ms = INFINITY
 * for a candidate that fails to run. Returns 0 when it timed, -1 when it could not allocate. */
static int bench(tq_backend *be, const tqc_conv_geom *g, tq_dtype dt, cand *c, int nc) {
    tqc_ctx *ctx = tqc(be);
    cudnnHandle_t h = (cudnnHandle_t)ctx->cudnn;
    const size_t es = tq_dtype_size(dt);
    size_t bytes[4] = {
        (size_t)(g->xdim[0] * g->xdim[1] * g->xdim[2] * g->xdim[3]) * es,
        (size_t)(g->wdim[0] * g->wdim[1] * g->wdim[2] * g->wdim[3]) * es,
        (size_t)(g->ydim[0] * g->ydim[1] * g->ydim[2] * g->ydim[3]) * es, 0 };
    for (int i = 0; i < nc; i++)
        if (c[i].ws > bytes[3]) bytes[3] = c[i].ws;
    void *buf[4] = { NULL, NULL, NULL, NULL };
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudnnBackendDescriptor_t vp = NULL;
    int rc = -1;
    for (int i = 0; i < 4; i++) {
        if (cudaMalloc(&buf[i], bytes[i] ? bytes[i] : 256) != cudaSuccess) goto done;
        if (cudaMemsetAsync(buf[i], 0, bytes[i] ? bytes[i] : 256, ctx->stream) != cudaSuccess) goto done;
    }
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto done;
    if (make_vpack(buf, buf[3], &vp) != CUDNN_STATUS_SUCCESS) goto done;
    for (int i = 0; i < nc; i++) {
        c[i].ms = INFINITY;
        if (cudnnBackendExecute(h, c[i].plan, vp) != CUDNN_STATUS_SUCCESS) continue;   /* warm-up */
        cudaEventRecord(e0, ctx->stream);
        cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
        for (int r = 0; r < BENCH_REPS && !st; r++) st = cudnnBackendExecute(h, c[i].plan, vp);
        cudaEventRecord(e1, ctx->stream);
        float ms = 0;
        if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            continue;
        if (!st) c[i].ms = ms / BENCH_REPS;
    }
    rc = 0;
done:
    cudaStreamSynchronize(ctx->stream);
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (int i = 0; i < 4; i++)
        if (buf[i]) cudaFree(buf[i]);
    cudaGetLastError();   /* an allocation failure here is not an error of the op */
    return rc;
}

/* Keeps a failed planning in the cache (descriptors freed, message kept): the heuristics are
 * not rerun on every call, and a beta-1 op that has no plan runs staged (see accum_plan). */
static int remember_failure(tq_backend *be, tqc_ctx *ctx, pent *p, unsigned hb) {
    tqc_conv_descs_free(&p->ds);
    p->why = strdup(be->err);
    p->next = ctx->convs->bucket[hb];
    ctx->convs->bucket[hb] = p;
    return TQ_EDEVICE;
}

/* Chooses, caches and returns the plan of (kind, beta1, d, dt): configs up to `limit` bytes of
 * workspace; benchmark when allowed and ctx->benchmark. */
static int get_plan(tq_backend *be, int kind, int beta1, const tq_conv_desc *d, tq_dtype dt,
                    size_t limit, int allow_bench, pent **out) {
    tqc_ctx *ctx = tqc(be);
    const char *nm = tqc_conv_kind_name(kind);
    if (!ctx->convs) {
        tq_backend_seterr(be, "%s: tqc_conv_init was not called", nm);
        return TQ_EINVAL;
    }
    if (dt != TQ_F32 && dt != TQ_F16 && dt != TQ_BF16) {
        tq_backend_seterr(be, "%s: bad dtype %d", nm, (int)dt);
        return TQ_EINVAL;
    }
    tqc_conv_geom g;
    if (!d || tqc_conv_geom_of(d, &g)) {
        if (d)
            tq_backend_seterr(be, "%s: bad conv x=(%d,%d,%d,%d) k=%d r=%d s=%d stride=%d pad=%d", nm,
                              d->x.n, d->x.h, d->x.w, d->x.c, d->k, d->r, d->s, d->stride, d->pad);
        else
            tq_backend_seterr(be, "%s: no descriptor", nm);
        return TQ_EINVAL;
    }
    unsigned hb = key_hash(kind, beta1, dt, d);
    for (pent *p = ctx->convs->bucket[hb]; p; p = p->next)
        if (p->kind == kind && p->beta1 == beta1 && p->dt == dt && same_desc(&p->d, d)) {
            if (!p->plan) {
                tq_backend_seterr(be, "%s", p->why ? p->why : "conv: no cuDNN plan");
                return TQ_EDEVICE;
            }
            *out = p;
            return TQ_OK;
        }
    if (tqc_miss_while_capturing(be, nm)) return TQ_EDEVICE;

    char what[200], err[sizeof be->err];
    describe(what, sizeof what, kind, &g, dt);
    pent *p = calloc(1, sizeof *p);
    if (!p) { tq_backend_seterr(be, "%s: out of host memory", nm); return TQ_ENOMEM; }
    p->kind = kind; p->beta1 = beta1; p->dt = dt; p->d = *d; p->ms = -1;
    cudnnHandle_t h = (cudnnHandle_t)ctx->cudnn;
    if (tqc_conv_build_op(kind, &g, dt, 1.0f, beta1 ? 1.0f : 0.0f, &p->ds, err, sizeof err) ||
        tqc_conv_build_graph(&p->ds, h, kind, &g, dt, err, sizeof err)) {
        tq_backend_seterr(be, "%s", err);
        return remember_failure(be, ctx, p, hb);
    }

    const int want = allow_bench && ctx->benchmark ? BENCH_MAX : 1;
    cand c[BENCH_MAX];
    int nc = 0, seen = 0, filtered = 0, over = 0, unsup = 0;
    cudnnStatus_t last = CUDNN_STATUS_SUCCESS;
    for (int pass = 0; pass < 2 && nc == 0; pass++) {
        seen = filtered = over = unsup = 0;   /* the message reports the last pass */
        const cudnnBackendHeurMode_t modes[2] = { CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK };
        for (int m = 0; m < 2 && nc == 0; m++) {
            cudnnBackendDescriptor_t cfgs[MAX_CFGS];
            int ncfg = 0;
            cudnnStatus_t st = heur_cfgs(p->ds.graph, modes[m], cfgs, MAX_CFGS, &ncfg);
            if (st) last = st;
            for (int i = 0; i < ncfg; i++) {
                if (nc >= want) break;
                seen++;
                unsigned num, beh;
                int64_t index, cws = 0, cnt = 0;
                cfg_notes(cfgs[i], &num, &beh, &index);
                if (!tqc_conv_cfg_allowed(num, beh, dt, pass == 0, ctx->deterministic,
                                          (ctx->tf32 & TQ_TF32_CONV_OK) != 0)) { filtered++; continue; }
                if (cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                             1, &cnt, &cws) == CUDNN_STATUS_SUCCESS &&
                    cnt == 1 && cws > 0 && (size_t)cws > limit) {
                    over++;
                    continue;
                }
                cand k = { cfgs[i], NULL, 0, index, -1, num };
                if ((st = make_plan(h, cfgs[i], &k.plan, &k.ws))) { last = st; unsup++; continue; }
                if (k.ws > limit) { cudnnBackendDestroyDescriptor(k.plan); over++; continue; }
                c[nc++] = k;
                cfgs[i] = NULL;   /* owned by the candidate now */
            }
            for (int i = 0; i < ncfg; i++)
                if (cfgs[i]) cudnnBackendDestroyDescriptor(cfgs[i]);
        }
    }
    if (nc == 0) {
        tq_backend_seterr(be, "%s: no cuDNN plan (%d configs: %d refused by their notes (TF32, low "
                          "precision%s), %d over the %zu MiB workspace limit, %d not supported; last %s)%s",
                          what, seen, filtered, ctx->deterministic ? ", nondeterministic" : "", over,
                          limit >> 20, unsup, cudnnGetErrorString(last),
                          ctx->deterministic ? "; spec deterministic: false would allow nondeterministic engines" : "");
        return remember_failure(be, ctx, p, hb);
    }
    int best = 0;
    if (nc > 1 && bench(be, &g, dt, c, nc) == 0) {
        for (int i = 1; i < nc; i++)
            if (c[i].ms < c[best].ms) best = i;
        if (!isfinite(c[best].ms)) best = 0;
    }
    for (int i = 0; i < nc; i++)
        if (i != best) {
            cudnnBackendDestroyDescriptor(c[i].plan);
            cudnnBackendDestroyDescriptor(c[i].cfg);
        }
    p->cfg = c[best].cfg; p->plan = c[best].plan; p->ws = c[best].ws;
    p->engine = c[best].engine; p->ms = c[best].ms;
    log_plan(what, beta1, &c[best], nc);
    p->next = ctx->convs->bucket[hb];
    ctx->convs->bucket[hb] = p;
    ctx->convs->nplans++;
    *out = p;
    return TQ_OK;
}

/* ---- the ops ---- */

static int aligned(const void *p) { return ((uintptr_t)p % TQC_CONV_ALIGN) == 0; }

static int exec_plan(tq_backend *be, const pent *p, void *p1, void *p2, void *p3, void *ws,
                     size_t ws_bytes) {
    const char *nm = tqc_conv_kind_name(p->kind);
    if (p->ws > ws_bytes) {
        tq_backend_seterr(be, "%s: workspace of %zu bytes, the plan needs %zu (size it with conv_ws)",
                          nm, ws_bytes, p->ws);
        return TQ_EINVAL;
    }
    if (!p1 || !p2 || !p3 || !aligned(p1) || !aligned(p2) || !aligned(p3) || (p->ws && !aligned(ws))) {
        tq_backend_seterr(be, "%s: NULL or not %d-byte aligned pointer (%p %p %p ws %p)", nm,
                          TQC_CONV_ALIGN, p1, p2, p3, ws);
        return TQ_EINVAL;
    }
    void *ptrs[3] = { p1, p2, p3 };
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = make_vpack(ptrs, ws, &vp);
    if (!st) {
        st = cudnnBackendExecute((cudnnHandle_t)tqc(be)->cudnn, p->plan, vp);
        cudnnBackendDestroyDescriptor(vp);
        if (st) {
            char what[200], msg[sizeof be->err];
            tqc_conv_geom g;
            tqc_conv_geom_of(&p->d, &g);
            describe(what, sizeof what, p->kind, &g, p->dt);
            tqc_dnn_msg(msg, sizeof msg, st, "cudnnBackendExecute", __FILE__, __LINE__, what);
            tq_backend_seterr(be, "%s", msg);
            return TQ_EDEVICE;
        }
        return TQ_OK;
    }
    char msg[sizeof be->err];
    tqc_dnn_msg(msg, sizeof msg, st, "variant pack", __FILE__, __LINE__, nm);
    tq_backend_seterr(be, "%s", msg);
    return TQ_EDEVICE;
}

/* Workspace temporaries of the staged (beta 0 into the workspace, then added) variants. */
static size_t dw_tmp_bytes(const tq_conv_desc *d, tq_dtype dt) {
    return up256((size_t)d->k * d->r * d->s * d->x.c * tq_dtype_size(dt));
}
static size_t dx_tmp_bytes(const tq_conv_desc *d, tq_dtype dt) {
    return up256(tq_shape_numel(d->x) * tq_dtype_size(dt));
}

static size_t cap_of(tq_backend *be) { return tqc(be)->convs ? tqc(be)->convs->cap : WS_CAP; }
static size_t lim(tq_backend *be, size_t avail) { return avail < cap_of(be) ? avail : cap_of(be); }

/* The plan of an accumulating op (bwd_data with beta 1, bwd_filter): direct — the op's beta 1
 * on the output itself — or staged: beta 0 into a workspace temporary of `tmp` bytes that the
 * caller then adds (tqc_accumulate / tqc_add_to_f32). 16-bit bwd_filter is always staged (dw
 * is f32, the op's output is dt); the others are staged only when no engine takes beta 1.
 * lim_direct / lim_staged: the cuDNN workspace allowed to each (-1: staged does not fit). */
static int accum_plan(tq_backend *be, int kind, const tq_conv_desc *d, tq_dtype dt,
                      size_t lim_direct, size_t lim_staged, int staged_fits, int allow_bench,
                      pent **p, int *staged) {
    *staged = 0;
    if (!(kind == TQC_CONV_BWD_FILTER && dt != TQ_F32)) {
        int rc = get_plan(be, kind, 1, d, dt, lim_direct, allow_bench, p);
        if (rc != TQ_EDEVICE) return rc;
    }
    *staged = 1;
    if (!staged_fits) {
        tq_backend_seterr(be, "%s: workspace too small for the %s temporary (size it with conv_ws)",
                          tqc_conv_kind_name(kind), dt_name(dt));
        return TQ_EINVAL;
    }
    return get_plan(be, kind, 0, d, dt, lim_staged, allow_bench, p);
}

size_t tqc_conv_ws(tq_backend *be, const tq_conv_desc *d, tq_dtype dt) {
    pent *p;
    int staged;
    size_t need = 0;
    if (get_plan(be, TQC_CONV_FWD, 0, d, dt, cap_of(be), 1, &p)) return 0;   /* be->err set */
    need = p->ws;
    if (get_plan(be, TQC_CONV_BWD_DATA, 0, d, dt, cap_of(be), 1, &p)) return 0;
    if (p->ws > need) need = p->ws;
    if (accum_plan(be, TQC_CONV_BWD_DATA, d, dt, cap_of(be), cap_of(be), 1, 1, &p, &staged)) return 0;
    size_t n = p->ws + (staged ? dx_tmp_bytes(d, dt) : 0);
    if (n > need) need = n;
    if (accum_plan(be, TQC_CONV_BWD_FILTER, d, dt, cap_of(be), cap_of(be), 1, 1, &p, &staged)) return 0;
    n = p->ws + (staged ? dw_tmp_bytes(d, dt) : 0);
    if (n > need) need = n;
    return need;
}

int tqc_conv_fwd(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x,
                 const void *w, const float *bias, void *ws, size_t ws_bytes) {
    pent *p;
    int rc = get_plan(be, TQC_CONV_FWD, 0, d, dt, lim(be, ws_bytes), 0, &p);
    if (rc) return rc;
    if ((rc = exec_plan(be, p, (void *)x, (void *)w, y, ws, ws_bytes))) return rc;
    if (bias) {
        tq_shape ys = tq_conv_yshape(d);
        return tqc_bias_add(be, (size_t)ys.n * ys.h * ys.w, d->k, dt, y, bias);
    }
    return TQ_OK;
}

int tqc_conv_bwd_data(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, void *dx, float beta,
                      const void *dy, const void *w, void *ws, size_t ws_bytes) {
    pent *p;
    int rc, staged;
    if (beta != 0.0f && beta != 1.0f) {
        tq_backend_seterr(be, "conv_bwd_data: beta must be 0 or 1 (got %g)", (double)beta);
        return TQ_EINVAL;
    }
    if (beta == 0.0f) {
        if ((rc = get_plan(be, TQC_CONV_BWD_DATA, 0, d, dt, lim(be, ws_bytes), 0, &p))) return rc;
        return exec_plan(be, p, dx, (void *)w, (void *)dy, ws, ws_bytes);
    }
    const size_t tmp = d ? dx_tmp_bytes(d, dt) : 0;
    const int fits = tmp <= ws_bytes;
    if ((rc = accum_plan(be, TQC_CONV_BWD_DATA, d, dt, lim(be, ws_bytes), fits ? lim(be, ws_bytes - tmp) : 0,
                         fits, 0, &p, &staged)))
        return rc;
    if (!staged) return exec_plan(be, p, dx, (void *)w, (void *)dy, ws, ws_bytes);
    if ((rc = exec_plan(be, p, ws, (void *)w, (void *)dy, (char *)ws + tmp, ws_bytes - tmp))) return rc;
    return tqc_accumulate(be, tq_shape_numel(d->x), dt, dx, 1.0f, ws);
}

int tqc_conv_bwd_filter(tq_backend *be, const tq_conv_desc *d, tq_dtype dt, float *dw, float *db,
                        const void *x, const void *dy, void *ws, size_t ws_bytes) {
    int rc;
    if (dw) {
        pent *p;
        int staged;
        const size_t tmp = d ? dw_tmp_bytes(d, dt) : 0;
        const int fits = tmp <= ws_bytes;
        if ((rc = accum_plan(be, TQC_CONV_BWD_FILTER, d, dt, lim(be, ws_bytes),
                             fits ? lim(be, ws_bytes - tmp) : 0, fits, 0, &p, &staged)))
            return rc;
        if (!staged) {
            if ((rc = exec_plan(be, p, (void *)x, dw, (void *)dy, ws, ws_bytes))) return rc;
        } else {
            /* [dw in dt | cuDNN workspace] */
            const size_t nw = (size_t)d->k * d->r * d->s * d->x.c;
            if ((rc = exec_plan(be, p, (void *)x, ws, (void *)dy, (char *)ws + tmp, ws_bytes - tmp)))
                return rc;
            rc = dt == TQ_F32 ? tqc_accumulate(be, nw, TQ_F32, dw, 1.0f, ws)
                              : tqc_add_to_f32(be, nw, dw, dt, ws);
            if (rc) return rc;
        }
    }
    if (db) {
        tqc_conv_geom g;
        if (!d || tqc_conv_geom_of(d, &g)) {
            tq_backend_seterr(be, "conv_bwd_filter: bad conv descriptor");
            return TQ_EINVAL;
        }
        tq_shape ys = tq_conv_yshape(d);
        return tqc_bias_grad(be, (size_t)ys.n * ys.h * ys.w, d->k, dt, db, dy);
    }
    return TQ_OK;
}
