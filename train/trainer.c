/* trainer.c — the training loop (see trainer.h). */
#include "trainer.h"
#include "codes.h"
#include "checkpoint.h"
#include "dataset.h"
#include "device.h"
#include "models.h"
#include "profile.h"
#include "util.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define AUG_PAD 4

double tq_lr_at(const tq_spec *sp, int64_t s, int64_t total) {
    double base = sp->optimizer.lr;
    int64_t W = sp->lr_schedule.warmup_steps;
    if (s < W) return base * (double)(s + 1) / (double)W;
    double t = (double)(s - W), T = (double)(total - W);
    if (T < 1) T = 1;
    switch (sp->lr_schedule.type) {
    case TQ_SCHED_CONSTANT: return base;
    case TQ_SCHED_COSINE: return base * 0.5 * (1.0 + cos(M_PI * t / T));
    case TQ_SCHED_STEP:
        return base * pow(sp->lr_schedule.gamma, floor(t / (double)sp->lr_schedule.step_size));
    case TQ_SCHED_ONECYCLE: {   /* torch OneCycleLR defaults: pct_start .3, div 25, final_div 1e4, cos */
        double lo = base / 25.0, fin = lo / 1e4, up = 0.3 * T;
        if (t < up) return lo + (base - lo) * 0.5 * (1.0 - cos(M_PI * t / up));
        return fin + (base - fin) * 0.5 * (1.0 + cos(M_PI * (t - up) / (T - up)));
    }
    }
    return base;
}

/* a code that came back from a helper by name (load_data, open_backend: tq_error_name's) */
static void fail_as(tq_summary *sum, const char *code, const char *msg) {
    tq_error_code c;
    snprintf(sum->state, sizeof sum->state, "%s", tq_state_name(TQ_STATE_FAILED));
    snprintf(sum->error_code, sizeof sum->error_code, "%s", tq_error_parse(code, &c) == 0 ? tq_error_name(c) : code);
    snprintf(sum->error_message, sizeof sum->error_message, "%s", msg);
}
static void fail(tq_summary *sum, tq_error_code code, const char *msg) {
    snprintf(sum->state, sizeof sum->state, "%s", tq_state_name(TQ_STATE_FAILED));
    snprintf(sum->error_code, sizeof sum->error_code, "%s", tq_error_name(code));
    snprintf(sum->error_message, sizeof sum->error_message, "%s", msg);
}

/* a failed write of the job's files: its filesystem full, or another storage error */
static tq_error_code storage_code(int rc) {
    return rc == TQ_ENOSPC ? TQ_ERR_STORAGE_FULL : rc == TQ_EDEVICE ? TQ_ERR_BACKEND_ERROR : TQ_ERR_STORAGE_ERROR;
}
static const char *data_code(int rc) {
    return tq_error_name(rc == TQ_EIO ? TQ_ERR_DATA_NOT_FOUND : rc == TQ_ENOMEM ? TQ_ERR_OUT_OF_MEMORY
                         : rc == TQ_EINVAL ? TQ_ERR_INVALID_SPEC : TQ_ERR_INVALID_DATA);
}

static int load_data(const tq_spec *sp, tq_dataset *ds, char *code, size_t cl, char *err, size_t el) {
    tq_synth_opts so = {sp->synthetic.train, sp->synthetic.test, sp->synthetic.h, sp->synthetic.w, sp->synthetic.c};
    int rc = tq_dataset_load(ds, tq_dataset_name(sp->dataset), sp->data_dir, &so, sp->train_subset,
                             sp->eval_subset, sp->seed, err, el);
    if (rc) snprintf(code, cl, "%s", data_code(rc));
    return rc;
}

static tq_graph *build(const tq_spec *sp, const tq_dataset *ds, tq_backend *be, char *err, size_t el) {
    tq_graph *g = tq_model_build(sp->model, sp->batch_size, ds->train.h, ds->train.w, ds->train.c,
                                 ds->classes, tq_amp_dtype(sp->amp), err, el);
    if (g) {
        g->no_recompute = !tq_spec_recompute(sp);
        /* TQ_FUSE=0: BN, add and ReLU as separate passes (to check the fusion changes nothing) */
        const char *fuse = getenv("TQ_FUSE");
        g->no_fuse = fuse && !strcmp(fuse, "0");
        tq_graph_plan(g, be);
    }
    return g;
}

static int momentum_buf(const tq_spec *sp) { return sp->optimizer.type == TQ_OPT_SGD && sp->optimizer.momentum != 0; }
static size_t data_bytes(const tq_dataset *ds) {
    size_t px = (size_t)ds->train.h * ds->train.w * ds->train.c;
    return (size_t)(ds->train.n + ds->test.n) * (px + 1);
}

int tq_plan_spec(const tq_spec *sp, tq_plan_report *rep, char *code, size_t cl, char *err, size_t el) {
    tq_dataset ds;
    memset(rep, 0, sizeof *rep);
    if (load_data(sp, &ds, code, cl, err, el)) return TQ_EDATA;
    tq_backend *be = tq_cpu_backend_new(sp->threads);
    tq_graph *g = build(sp, &ds, be, err, el);
    int rc = TQ_OK;
    if (!g) { snprintf(code, cl, "%s", tq_error_name(TQ_ERR_INVALID_SPEC)); rc = TQ_EINVAL; }
    else {
        tq_engine_plan(g, sp->optimizer.type, momentum_buf(sp), data_bytes(&ds), &rep->plan);
        snprintf(rep->model, sizeof rep->model, "%s", tq_model_name(sp->model));
        snprintf(rep->amp, sizeof rep->amp, "%s", tq_amp_name(sp->amp));
        rep->batch_size = sp->batch_size;
        rep->h = ds.train.h; rep->w = ds.train.w; rep->c = ds.train.c;
    }
    tq_graph_free(g);
    tq_backend_free(be);
    tq_dataset_free(&ds);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, size_t n) {
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    tq_engine e;
    tq_backend *be;
    const tq_spec *sp;
    const tq_dataset *ds;
    uint8_t *train_img, *train_lab, *test_img, *test_lab;   /* device */
    float mean[3], inv_std[3];
    int32_t *idx_host;
    tq_aug *aug_host;
    int32_t *perm; int64_t perm_epoch;
    tq_prof *prof;          /* --profile: timing the ops of steps prof_from.. */
    int64_t prof_from;
} run_ctx;

/* memset0, to_device and to_host return nothing: their failure (a GPU's) shows as be->err set again,
 * nerr moved past what it was before them. Work that reads what they wrote is not issued
 * after one: a CUDA graph, for one, would replay the last step's indices or learning rate. */
static int transfers_failed(const tq_backend *be, unsigned nerr) { return be->nerr != nerr; }

static int upload_split(run_ctx *r, const tq_split *s, uint8_t **img, uint8_t **lab) {
    size_t px = (size_t)s->h * s->w * s->c;
    *img = r->be->i->alloc(r->be, s->n * px > 0 ? s->n * px : 1);
    *lab = r->be->i->alloc(r->be, s->n ? s->n : 1);
    if (!*img || !*lab) return TQ_ENOMEM;
    unsigned nerr = r->be->nerr;
    r->be->i->to_device(r->be, *img, s->images, s->n * px);
    r->be->i->to_device(r->be, *lab, s->labels, s->n);
    return transfers_failed(r->be, nerr) ? TQ_EDEVICE : TQ_OK;
}

/* The loader op alone: n samples whose indices (and augmentation draws, when aug) are already
 * in the engine's idx/aug buffers, into the input and labels tensors. */
static int load_ops(run_ctx *r, int n, const uint8_t *img, const uint8_t *lab, int aug) {
    tq_backend *be = r->be;
    const tq_graph *g = r->e.g;
    const tq_shape s = g->tensors[g->input].shape;
    return be->i->load_batch(be, n, s.h, s.w, s.c, r->e.dt, tq_tdata(&r->e, g->input),
                             tq_tdata(&r->e, g->labels), img, lab, r->e.idx, aug ? r->e.aug : NULL,
                             AUG_PAD, r->mean, r->inv_std);
}

/* Copies idx_host[0..n) (and n augmentation draws, when aug) into the engine's idx/aug buffers. */
static int put_indices(run_ctx *r, int n, const tq_aug *aug) {
    tq_backend *be = r->be;
    unsigned nerr = be->nerr;
    be->i->to_device(be, r->e.idx, r->idx_host, sizeof(int32_t) * n);
    if (aug) be->i->to_device(be, r->e.aug, aug, sizeof(tq_aug) * n);
    return transfers_failed(be, nerr) ? TQ_EDEVICE : TQ_OK;
}

/* Loads n samples idx_host[0..n) of a split into the input and labels tensors. */
static int load(run_ctx *r, int n, const uint8_t *img, const uint8_t *lab, const tq_aug *aug) {
    int rc = put_indices(r, n, aug);
    return rc ? rc : load_ops(r, n, img, lab, aug != NULL);
}

static int evaluate(run_ctx *r, int64_t step, int epoch, tq_eval_kind kind, tq_eval_rec *out) {
    tq_backend *be = r->be;
    const tq_split *t = &r->ds->test;
    int b = r->e.g->batch;
    unsigned nerr = be->nerr;
    be->i->memset0(be, r->e.scalars, 2 * sizeof(float));
    if (transfers_failed(be, nerr)) return TQ_EDEVICE;
    for (int64_t i = 0; i < t->n; i += b) {
        int n = (int)(t->n - i < b ? t->n - i : b);
        for (int k = 0; k < n; k++) r->idx_host[k] = (int32_t)(i + k);
        int rc = load(r, n, r->test_img, r->test_lab, NULL);
        if (!rc) rc = tq_engine_eval_batch(&r->e, n);
        if (rc) return rc;
    }
    float sc[2];
    nerr = be->nerr;
    be->i->to_host(be, sc, r->e.scalars, sizeof sc);
    if (transfers_failed(be, nerr)) return TQ_EDEVICE;
    memset(out, 0, sizeof *out);
    out->step = step; out->epoch = epoch; out->kind = kind;
    out->samples = t->n;
    out->loss = t->n ? sc[0] / (double)t->n : NAN;
    out->accuracy = t->n ? sc[1] / (double)t->n : NAN;
    out->time_ms = tq_unix_ms();
    return TQ_OK;
}

static int cmp_abs(const void *a, const void *b) {
    float x = fabsf(*(const float *)a), y = fabsf(*(const float *)b);
    return x < y ? -1 : x > y;
}

/* After training: evaluate the model with post-training transformations applied to a copy of
 * the weights (the trained weights are restored afterwards, so model.safetensors and the
 * checkpoint keep them):
 *  - prune: per conv/linear weight tensor, L1-unstructured as torch.nn.utils.prune
 *    .l1_unstructured: the round(amount·n) smallest |w| become 0 (ties: lowest index first).
 *  - int8: every linear weight quantised per tensor, symmetric, as torch's default dynamic
 *    qconfig's weight observer (scale = max|w| / 127.5, q = clamp(round(w/scale), −128, 127)),
 *    then dequantised. Activations stay in floating point: this measures the weight
 *    quantisation, not int8 arithmetic. */
static int posttrain(run_ctx *r, int64_t step, int epoch, tq_eval_kind kind, tq_eval_rec *ev) {
    tq_engine *e = &r->e;
    const tq_graph *g = e->g;
    size_t P = g->nparam_elems;
    float *orig = malloc(P * 4), *w = malloc(P * 4), *tmp = NULL;
    if (!orig || !w) { free(orig); free(w); return TQ_ENOMEM; }
    unsigned nerr = r->be->nerr;
    r->be->i->to_host(r->be, orig, e->params, P * 4);
    if (transfers_failed(r->be, nerr)) { free(orig); free(w); return TQ_EDEVICE; }
    memcpy(w, orig, P * 4);
    int rc = TQ_OK;
    for (int i = 0; i < g->nnodes && !rc; i++) {
        const tq_node *nd = &g->nodes[i];
        if (nd->op != TQ_OP_CONV && nd->op != TQ_OP_LINEAR) continue;
        if (kind == TQ_EVAL_INT8 && nd->op != TQ_OP_LINEAR) continue;
        size_t n = nd->op == TQ_OP_CONV ? (size_t)nd->cd.k * nd->cd.r * nd->cd.s * nd->cd.x.c
                                        : (size_t)nd->lin_in * nd->lin_out;
        float *p = w + nd->w_off;
        if (kind == TQ_EVAL_PRUNED) {
            size_t k = (size_t)llround(r->sp->prune_amount * (double)n);
            if (k == 0) continue;
            free(tmp);
            if (!(tmp = malloc(n * 4))) { rc = TQ_ENOMEM; break; }
            memcpy(tmp, p, n * 4);
            qsort(tmp, n, 4, cmp_abs);
            float thr = fabsf(tmp[k - 1]);
            size_t below = 0;
            for (size_t j = 0; j < n; j++) if (fabsf(p[j]) < thr) below++;
            size_t ties = k - below;       /* zero the k smallest: all below thr, then ties */
            for (size_t j = 0; j < n; j++) {
                float a = fabsf(p[j]);
                if (a < thr) p[j] = 0;
                else if (a == thr && ties) { p[j] = 0; ties--; }
            }
        } else {
            float amax = 0;
            for (size_t j = 0; j < n; j++) if (fabsf(p[j]) > amax) amax = fabsf(p[j]);
            if (amax == 0) continue;
            float scale = amax / 127.5f;
            for (size_t j = 0; j < n; j++) {
                float q = nearbyintf(p[j] / scale);
                if (q > 127) q = 127;
                if (q < -128) q = -128;
                p[j] = q * scale;
            }
        }
    }
    free(tmp);
    if (!rc) {
        nerr = r->be->nerr;
        r->be->i->to_device(r->be, e->params, w, P * 4);
        rc = transfers_failed(r->be, nerr) ? TQ_EDEVICE : tq_engine_refresh_wlow(e);
        if (!rc) rc = evaluate(r, step, epoch, kind, ev);
        nerr = r->be->nerr;   /* the trained weights back, whatever happened */
        r->be->i->to_device(r->be, e->params, orig, P * 4);
        int rc2 = transfers_failed(r->be, nerr) ? TQ_EDEVICE : tq_engine_refresh_wlow(e);
        if (!rc) rc = rc2;
    }
    free(orig); free(w);
    return rc;
}

static int mkdir_p(const char *dir) {
    char buf[TQ_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') { *p = 0; if (mkdir(buf, 0755) && errno != EEXIST) return -1; *p = '/'; }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

/* t: the step count AdamW's bias correction uses; skip: the backend's overflow flag or NULL.
 * Under AMP the same pass writes the 16-bit weight copy the next forward reads (e->wlow). */
static int optimizer_step(run_ctx *r, double lr, int64_t t, const float *skip) {
    const tq_spec *sp = r->sp;
    tq_engine *e = &r->e;
    size_t P = e->g->nparam_elems;
    if (sp->optimizer.type == TQ_OPT_SGD)
        return r->be->i->sgd_step(r->be, P, e->params, e->grads, e->opt_a, (float)lr,
                                  (float)sp->optimizer.momentum, (float)sp->optimizer.weight_decay,
                                  sp->optimizer.nesterov, skip, e->wlow, e->dt);
    double b1 = sp->optimizer.beta1, b2 = sp->optimizer.beta2;
    return r->be->i->adamw_step(r->be, P, e->params, e->grads, e->opt_a, e->opt_b, (float)lr,
                                (float)b1, (float)b2, (float)sp->optimizer.eps,
                                (float)sp->optimizer.weight_decay, (float)(1.0 - pow(b1, (double)t)),
                                (float)(1.0 - pow(b2, (double)t)), skip, e->wlow, e->dt);
}

unsigned tq_tf32_backend_flags(tq_tf32 t) {
    switch (t) {
    case TQ_TF32_OFF: return 0;
    case TQ_TF32_CONV: return TQ_TF32_CONV_OK;
    case TQ_TF32_ALL: return TQ_TF32_CONV_OK | TQ_TF32_MATMUL_OK;
    }
    return 0;
}

/* TQ_TEST_DEVICE_BUSY=<path> (the tests' way to make a placed device busy on any machine):
 * while that file exists, a job the daemon placed fails to open its device as a busy GPU does */
static int test_busy(const tq_spec *sp, char *err, size_t el) {
    const char *f = getenv("TQ_TEST_DEVICE_BUSY");
    if (!f || !f[0] || access(f, F_OK)) return 0;
    snprintf(err, el, "placed on %s, but the device is busy (TQ_TEST_DEVICE_BUSY: %.200s exists)", sp->device, f);
    return 1;
}

/* The backend a spec asks for (device.h). "auto": the first GPU when one works, else the CPU
 * (the reason goes to stderr); "cuda" / "cuda:N": that GPU or a device_unavailable failure with
 * the reason; "cpu": the CPU. dev receives "cpu" or "cuda:N": the device the job really runs on. */
static int open_backend(const tq_spec *sp, int placed, tq_backend **out, char *dev, size_t dl, char *code,
                        size_t cl, char *err, size_t el) {
    char why[256] = "";
    *out = NULL;
    tq_devsel want;
    if (tq_devsel_parse(sp->device, &want)) {
        snprintf(code, cl, "%s", tq_error_name(TQ_ERR_INVALID_SPEC));
        snprintf(err, el, "device \"%.32s\" is not auto, cpu, cuda or cuda:N", sp->device);
        return TQ_EINVAL;
    }
    if (want.kind != TQ_DEV_CPU) {
        int ord = want.kind == TQ_DEV_CUDA ? want.ordinal : 0;
        tq_cuda_opts co = {ord, sp->cudnn_benchmark, sp->deterministic, tq_tf32_backend_flags(sp->tf32)};
        tq_backend *be = tq_cuda_backend_open(&co, why, sizeof why);
        if (be) {
            snprintf(dev, dl, "cuda:%d", ord);
            *out = be;
            return 0;
        }
        if (want.kind != TQ_DEV_AUTO) {
            snprintf(code, cl, "%s", tq_error_name(TQ_ERR_DEVICE_UNAVAILABLE));
            if (placed && tq_cuda_open_busy())   /* free at the placement: taken since (the daemon requeues it) */
                snprintf(err, el, "placed on %s, but %s: another process took the GPU since the placement",
                         sp->device, why);
            else if (placed)   /* the scheduler's choice, but not usable now */
                snprintf(err, el, "placed on %s, but %s (POST /v1/jobs/{id}/requeue runs the job again)",
                         sp->device, why);
            else
                snprintf(err, el, "device \"%s\" requested, but %s; use \"device\": \"auto\" or \"cpu\"", sp->device, why);
            return TQ_EDEVICE;
        }
        if (tq_cuda_built()) fprintf(stderr, "trainq: device auto: training on the CPU: %s\n", why);
    }
    *out = tq_cpu_backend_new(sp->threads);
    if (!*out) { snprintf(code, cl, "%s", tq_error_name(TQ_ERR_OUT_OF_MEMORY)); snprintf(err, el, "cannot create the CPU backend"); return TQ_ENOMEM; }
    snprintf(dev, dl, "cpu");
    return 0;
}

/* ---- the step on the device (spec cuda_graphs; docs/engine.md, "CUDA graphs") ----
 *
 * With cuda_graphs on a CUDA device the step is issued so that it can be captured once and
 * replayed: the loss is softmax_ce_dyn and the tail unscale_check_dyn, sgd_step_dyn /
 * adamw_step_dyn and step_end, which read the loss scale, the rate and AdamW's corrections
 * from the device (a tq_dstep_in the host writes before each step; a tq_dstep_state the device
 * owns and step_end moves: the loss scaler runs on the device), and each micro-batch's sample
 * indices and crop draws are copied into the engine's fixed idx/aug buffers before it runs.
 * The first step of a process runs uncaptured (it loads every kernel and warms cuDNN and
 * cuBLASLt); before the second, one micro-batch (loader, forward, loss, backward) and the tail
 * (unscale and inf check, optimizer with its 16-bit weight copy, scaler update) are captured as two
 * graphs, and from then on a step is: zero the gradients and the loss sums, copy the step's
 * values, per micro-batch copy its indices and replay the first graph, replay the second.
 * The step's results (loss, hits, found_inf, the state) are fetched into pinned memory and
 * read one step late: the host issues step s + 1 before it waits for step s, so the device
 * does not idle while the host records a step. Before an evaluation, a checkpoint or the last
 * step nothing may be in flight, so the host waits there; a stop or a timeout noticed while a
 * step is in flight takes effect after that step (one step later than without graphs).
 * TQ_DEVICE_STEP=1 in the environment runs this loop without capturing, on any backend: how
 * the unit tests check it on the CPU (tests/unit/test_devstep.c), and how gpu-check tells a
 * capture problem from a problem of this loop. TQ_DEVICE_STEP=capture attempts the capture on
 * any backend: on the CPU it fails, and the tests check that the job trains on uncaptured. The
 * other path (host_train) is the one every job without cuda_graphs runs; both record a
 * finished step through record_step. */

#define DS_FETCH (TQ_SCALARS_DSTATE + sizeof(tq_dstep_state))   /* scalars[0..2] .. the state */

typedef struct {
    int64_t s;
    double lr;
    size_t extent;         /* the arena's high-water mark over its micro-batches */
    int marked;            /* its start is the mark in fetch slot 2 + s % 2 (nothing was in flight) */
} step_ref;

typedef struct {
    run_ctx *r;
    const tq_spec *sp;
    const tq_run_opts *o;
    tq_summary *sum;
    tq_ckpt_state *st;
    const char *ckpt_path;
    int64_t total, spe, N;
    size_t data_b;
    int on_device, fp16, capture;
    double t_start;
    /* the run's state across steps (both loops) */
    double scale, loss;
    int tracker;
    int64_t peak, nsteps;
    double *step_ms, *sps;
    int stop, timed_out;
    /* graphs and the pipeline */
    void *g_mb, *g_tail;
    size_t mb_extent;
    int captured, capture_failed;
    double t_prev;
    int defer_stop, defer_timeout;
    char err[512];
} step_loop;

/* The start of step s in either loop: the epoch's sample order, the gradients and the loss
 * sums (loss, hits, overflow) zeroed. */
static void step_begin(step_loop *L, int64_t s) {
    run_ctx *r = L->r;
    tq_backend *be = r->be;
    int64_t epoch = s / L->spe;
    if (epoch != r->perm_epoch) { tq_epoch_order(r->perm, L->N, L->sp->seed, epoch, L->sp->shuffle); r->perm_epoch = epoch; }
    be->i->memset0(be, r->e.grads, r->e.g->nparam_elems * 4);
    be->i->memset0(be, r->e.scalars, 3 * sizeof(float));
}

/* Micro-batch j of step s in either loop: its sample indices, and its augmentation draws, on
 * the device (put_indices); the draws, or NULL without augmentation. */
static int microbatch_indices(step_loop *L, int64_t s, int j, const tq_aug **aug) {
    run_ctx *r = L->r;
    const tq_spec *sp = L->sp;
    const int b = sp->batch_size, accum = sp->accum_steps;
    int64_t k = (s % L->spe) * accum + j;
    for (int q = 0; q < b; q++) r->idx_host[q] = r->perm[k * b + q];
    if (sp->augment) tq_aug_draw(r->aug_host, b, sp->seed, (uint64_t)(s * accum + j), AUG_PAD);
    *aug = sp->augment ? r->aug_host : NULL;
    return put_indices(r, b, *aug);
}

/* unscale and inf check, optimizer (writing the 16-bit weight copy in the same pass), the scaler
 * update */
static int ds_tail_ops(step_loop *L) {
    tq_backend *be = L->r->be;
    const tq_backend_i *I = be->i;
    const tq_spec *sp = L->sp;
    tq_engine *e = &L->r->e;
    size_t P = e->g->nparam_elems;
    tq_dstep_state *dst = tq_engine_dstate(e);
    const tq_dstep_in *din = tq_engine_din(e);
    float *found = L->fp16 ? e->scalars + 2 : NULL;
    int rc = TQ_OK;
    if (L->fp16) rc = I->unscale_check_dyn(be, P, e->grads, dst, e->scalars + 2);
    if (!rc) {
        if (sp->optimizer.type == TQ_OPT_SGD)
            rc = I->sgd_step_dyn(be, P, e->params, e->grads, e->opt_a, din, (float)sp->optimizer.momentum,
                                 (float)sp->optimizer.weight_decay, sp->optimizer.nesterov, found,
                                 e->wlow, e->dt);
        else
            rc = I->adamw_step_dyn(be, P, e->params, e->grads, e->opt_a, e->opt_b, din, dst,
                                   (float)sp->optimizer.beta1, (float)sp->optimizer.beta2,
                                   (float)sp->optimizer.eps, (float)sp->optimizer.weight_decay, found,
                                   e->wlow, e->dt);
    }
    if (!rc) rc = I->step_end(be, dst, found, L->fp16, (float)sp->loss_scale.growth_factor,
                              (float)sp->loss_scale.backoff_factor, sp->loss_scale.growth_interval);
    return rc;
}

/* Captures one micro-batch and the tail. A failed capture is not the job's: it says why on
 * stderr and the job trains on, uncaptured (the same ops, the same numbers). A fault of the step
 * in flight, which the wait before the capture is the first to see, is the job's: that returns
 * nonzero with be->err, not a capture failure. */
static int ds_capture(step_loop *L) {
    run_ctx *r = L->r;
    tq_backend *be = r->be;
    const tq_backend_i *I = be->i;
    tq_engine *e = &r->e;
    const tq_graph *g = e->g;
    int64_t *counts = malloc(sizeof(int64_t) * (g->nbn ? g->nbn : 1));
    const char *what = "the micro-batch";
    int rc = TQ_ENOMEM;
    if (!counts) { tq_backend_seterr(be, "out of host memory"); goto out; }
    memcpy(counts, e->counts, sizeof(int64_t) * g->nbn);   /* a capture runs nothing */
    unsigned nerr = be->nerr;
    I->sync(be);
    if (transfers_failed(be, nerr)) { free(counts); return TQ_EDEVICE; }
    if (!(rc = I->graph_begin(be))) {
        int orc = load_ops(r, g->batch, r->train_img, r->train_lab, L->sp->augment);
        if (!orc) orc = tq_engine_train_microbatch(e, 0.0f);   /* grad_scale: the device's */
        L->mb_extent = e->extent_peak;
        rc = I->graph_end(be, orc == TQ_OK, &L->g_mb);
        if (orc) rc = orc;
    }
    if (!rc) {
        what = "the optimizer tail";
        if (!(rc = I->graph_begin(be))) {
            int orc = ds_tail_ops(L);
            rc = I->graph_end(be, orc == TQ_OK, &L->g_tail);
            if (orc) rc = orc;
        }
    }
    memcpy(e->counts, counts, sizeof(int64_t) * g->nbn);
out:
    free(counts);
    if (rc) {
        fprintf(stderr, "trainq: cuda_graphs: capturing %s failed, training on without graphs (the same "
                "numbers): %s\n", what, be->err[0] ? be->err : "no message");
        I->graph_free(be, L->g_mb);
        I->graph_free(be, L->g_tail);
        L->g_mb = L->g_tail = NULL;
        L->capture_failed = 1;
        be->err[0] = 0;
        return TQ_OK;
    }
    L->captured = 1;
    return TQ_OK;
}

/* Issues step s: nothing waits for the device here. */
static int ds_launch(step_loop *L, int64_t s, int marked, step_ref *out) {
    run_ctx *r = L->r;
    tq_backend *be = r->be;
    const tq_backend_i *I = be->i;
    const tq_spec *sp = L->sp;
    tq_engine *e = &r->e;
    const int b = sp->batch_size, accum = sp->accum_steps;
    int rc = TQ_OK;
    if (marked && (rc = I->fetch_begin(be, 2 + (int)(s % 2), NULL, 0))) return rc;
    unsigned nerr = be->nerr;   /* transfers_failed */
    step_begin(L, s);
    double lr = tq_lr_at(sp, s, L->total);
    tq_dstep_in in;
    memset(&in, 0, sizeof in);
    in.lr = (float)lr;
    /* the device has taken opt_t steps, or one more when the step in flight is not skipped */
    int64_t t = L->st->opt_t + 1;
    in.t_a = (int32_t)t;
    if (sp->optimizer.type == TQ_OPT_ADAMW) {   /* optimizer_step's arithmetic for t, t + 1 */
        double b1 = sp->optimizer.beta1, b2 = sp->optimizer.beta2;
        in.bc1_a = (float)(1.0 - pow(b1, (double)t));
        in.bc2_a = (float)(1.0 - pow(b2, (double)t));
        in.bc1_b = (float)(1.0 - pow(b1, (double)(t + 1)));
        in.bc2_b = (float)(1.0 - pow(b2, (double)(t + 1)));
    }
    I->to_device(be, tq_engine_din(e), &in, sizeof in);
    if (transfers_failed(be, nerr)) rc = TQ_EDEVICE;
    size_t extent = 0;
    for (int j = 0; j < accum && !rc; j++) {
        const tq_aug *aug;
        if ((rc = microbatch_indices(L, s, j, &aug))) break;
        if (L->g_mb) {
            rc = I->graph_launch(be, L->g_mb);
            tq_engine_count_microbatch(e);
            if (L->mb_extent > extent) extent = L->mb_extent;
        } else {
            rc = load_ops(r, b, r->train_img, r->train_lab, aug != NULL);
            if (!rc) rc = tq_engine_train_microbatch(e, 0.0f);
            if (e->extent_peak > extent) extent = e->extent_peak;
        }
    }
    if (!rc) rc = L->g_tail ? I->graph_launch(be, L->g_tail) : ds_tail_ops(L);
    if (!rc) rc = I->fetch_begin(be, (int)(s % 2), e->scalars, DS_FETCH);
    out->s = s; out->lr = lr; out->extent = extent; out->marked = marked;
    return rc;
}

/* Whether the host must wait for step s before it issues the next: an evaluation, a
 * checkpoint or the end comes after it. */
static int ds_boundary(const step_loop *L, int64_t s) {
    const tq_spec *sp = L->sp;
    int last = s + 1 == L->total;
    int epoch_end = (s + 1) % L->spe == 0;
    int due_eval = sp->eval_every ? ((s + 1) % sp->eval_every == 0 || last) : (epoch_end || last);
    return last || (due_eval && L->r->ds->test.n > 0) ||
           (L->ckpt_path[0] && (s + 1) % sp->checkpoint_every == 0);
}

static int record_step(step_loop *L, const step_ref *p, const float sc[3], double ms,
                       const tq_dstep_state *dev, int deferred);

/* Waits for step p and records it (record_step); deferred: the next step is in flight (then p
 * is no boundary, and a stop or timeout waits for that step). */
static int ds_finish(step_loop *L, const step_ref *p, int deferred) {
    tq_backend *be = L->r->be;
    const tq_backend_i *I = be->i;
    const int64_t s = p->s;
    unsigned char buf[DS_FETCH];
    double t0 = L->t_prev, t1 = 0;
    int rc;
    if ((p->marked && (rc = I->fetch_end(be, 2 + (int)(s % 2), NULL, 0, &t0))) ||
        (rc = I->fetch_end(be, (int)(s % 2), buf, sizeof buf, &t1))) {
        fail(L->sum, TQ_ERR_BACKEND_ERROR, be->err);
        return rc;
    }
    L->t_prev = t1;
    float sc[3];
    tq_dstep_state ds;
    memcpy(sc, buf, sizeof sc);
    memcpy(&ds, buf + TQ_SCALARS_DSTATE, sizeof ds);
    /* device time from the previous step's end (or this one's start) */
    return record_step(L, p, sc, t1 - t0, &ds, deferred);
}

/* The host's side of a finished step p, for both loops: its results sc (loss sum, hits,
 * found_inf), the loss scaler (checked against the device's, dev, when the step ran there),
 * the step record, the evaluation, the checkpoint, a stop or a timeout. */
static int record_step(step_loop *L, const step_ref *p, const float sc[3], double ms,
                       const tq_dstep_state *dev, int deferred) {
    run_ctx *r = L->r;
    tq_backend *be = r->be;
    const tq_backend_i *I = be->i;
    const tq_spec *sp = L->sp;
    const tq_run_opts *o = L->o;
    tq_summary *sum = L->sum;
    tq_ckpt_state *st = L->st;
    const tq_graph *g = r->e.g;
    const int b = sp->batch_size, accum = sp->accum_steps;
    const int64_t s = p->s, epoch = s / L->spe;
    int rc;
    int found_inf = L->fp16 && sc[2] != 0.0f;
    if (!found_inf) st->opt_t++;
    else st->skipped_steps++;
    /* the device's scaler against the host loop's arithmetic: they must agree bit for bit */
    double used_scale = L->scale, scale = L->scale;
    int tracker = L->tracker;
    if (L->fp16) {
        float fs = (float)scale;
        tq_scaler_update(&fs, &tracker, found_inf, (float)sp->loss_scale.growth_factor,
                         (float)sp->loss_scale.backoff_factor, sp->loss_scale.growth_interval);
        scale = fs;
    }
    if (dev && (dev->used_scale != used_scale || dev->scale != scale || dev->tracker != tracker ||
                dev->opt_t != st->opt_t)) {
        snprintf(L->err, sizeof L->err, "after step %lld the device's step state (loss scale %.9g -> %.9g, "
                 "growth tracker %d, optimizer steps %d) is not the host's (%.9g -> %.9g, %d, %lld)",
                 (long long)(s + 1), dev->used_scale, dev->scale, (int)dev->tracker, (int)dev->opt_t, used_scale,
                 scale, tracker, (long long)st->opt_t);
        fail(sum, TQ_ERR_BACKEND_ERROR, L->err);
        return TQ_EDEVICE;
    }
    L->scale = scale;
    L->tracker = tracker;
    L->loss = sc[0] / ((double)b * accum);
    tq_step_rec rec = {0};
    rec.step = s + 1;
    rec.epoch = (int)epoch + 1;
    rec.loss = L->loss;
    rec.lr = p->lr;
    rec.loss_scale = L->fp16 ? used_scale : -1;
    rec.skipped = found_inf;
    rec.step_ms = ms;
    rec.samples_per_s = (double)b * accum / (ms / 1000.0);
    size_t held = be->bytes_live - L->data_b, dev_free = 0, dev_total = 0;
    rec.mem_allocated_bytes = (int64_t)r->e.persistent_bytes;
    rec.mem_peak_bytes = (int64_t)(held - g->arena_bytes + p->extent);
    rec.mem_reserved_bytes = (int64_t)be->bytes_live;
    rec.device_used_bytes = -1;
    if (L->on_device && I->mem_info(be, &dev_free, &dev_total) == 0) {
        rec.device_used_bytes = (int64_t)(dev_total - dev_free);
        if (rec.device_used_bytes > sum->device_peak_used_bytes) sum->device_peak_used_bytes = rec.device_used_bytes;
    }
    rec.time_ms = tq_unix_ms();
    rec.total_steps = L->total;
    if (rec.mem_peak_bytes > L->peak) L->peak = rec.mem_peak_bytes;
    L->step_ms[L->nsteps] = ms; L->sps[L->nsteps] = rec.samples_per_s; L->nsteps++;
    st->step = s + 1;
    st->loss_scale = L->scale; st->growth_tracker = L->tracker;
    if (o->cb.on_step && (rc = o->cb.on_step(o->cb.ctx, &rec))) { fail(sum, TQ_ERR_IO_ERROR, "recording the step failed"); return rc; }

    int epoch_end = (s + 1) % L->spe == 0;
    int last = s + 1 == L->total;
    int due_eval = sp->eval_every ? ((s + 1) % sp->eval_every == 0 || last) : (epoch_end || last);
    if (due_eval && r->ds->test.n > 0) {
        TQ_ASSERT(!deferred);   /* ds_boundary: nothing is in flight at an evaluation */
        tq_eval_rec ev;
        if ((rc = evaluate(r, s + 1, (int)epoch + 1, TQ_EVAL_EVAL, &ev))) { fail(sum, TQ_ERR_BACKEND_ERROR, be->err); return rc; }
        sum->val_loss = ev.loss; sum->val_accuracy = ev.accuracy;
        if (o->cb.on_eval && (rc = o->cb.on_eval(o->cb.ctx, &ev))) { fail(sum, TQ_ERR_IO_ERROR, "recording the evaluation failed"); return rc; }
    }
    double elapsed_s = (tq_mono_ms() - L->t_start) / 1000.0;
    int over = sp->timeout_s > 0 && elapsed_s > (double)sp->timeout_s;
    if (deferred) {
        if (!L->defer_stop && o->cb.should_stop) L->defer_stop = o->cb.should_stop(o->cb.ctx);
        if (over) L->defer_timeout = 1;
        return TQ_OK;
    }
    int want_stop = 0;
    if (!last) want_stop = L->defer_stop ? L->defer_stop : o->cb.should_stop ? o->cb.should_stop(o->cb.ctx) : 0;
    int timed_out = !last && (L->defer_timeout || over);
    if (L->ckpt_path[0] && (last || want_stop || timed_out || (s + 1) % sp->checkpoint_every == 0)) {
        if ((rc = tq_save_checkpoint(&r->e, L->ckpt_path, st, L->err, sizeof L->err))) { fail(sum, storage_code(rc), L->err); return rc; }
        if (o->cb.on_checkpoint) o->cb.on_checkpoint(o->cb.ctx, st->step, L->ckpt_path);
    }
    if (timed_out) {
        snprintf(L->err, sizeof L->err, "the job ran past timeout_s %lld after %lld of %lld steps",
                 (long long)sp->timeout_s, (long long)(s + 1), (long long)L->total);
        fail(sum, TQ_ERR_TIMEOUT, L->err);
        L->stop = L->timed_out = 1;
        return TQ_ECANCEL;
    }
    if (want_stop) {
        snprintf(sum->state, sizeof sum->state, want_stop == 2 ? "interrupted" : "cancelled");
        L->stop = 1;
    }
    return TQ_OK;
}

static int ds_train(step_loop *L, int64_t start) {
    run_ctx *r = L->r;
    tq_backend *be = r->be;
    tq_engine *e = &r->e;
    tq_dstep_state ds0;
    memset(&ds0, 0, sizeof ds0);
    ds0.scale = ds0.used_scale = L->scale;
    ds0.tracker = L->tracker;
    ds0.opt_t = (int32_t)L->st->opt_t;
    unsigned nerr = be->nerr;
    be->i->to_device(be, tq_engine_dstate(e), &ds0, sizeof ds0);
    if (transfers_failed(be, nerr)) { fail(L->sum, TQ_ERR_BACKEND_ERROR, be->err); return TQ_EDEVICE; }
    e->dstate = tq_engine_dstate(e);
    e->dstep_accum = L->sp->accum_steps;
    step_ref cur, prev;
    memset(&prev, 0, sizeof prev);
    int have = 0, rc = TQ_OK;
    for (int64_t s = start; s < L->total && !L->stop; s++) {
        int marked = !have;
        if (L->capture && s == start + 1) {
            if ((rc = ds_capture(L))) { fail(L->sum, TQ_ERR_BACKEND_ERROR, be->err); break; }
            marked = 1;
        }
        if ((rc = ds_launch(L, s, marked, &cur))) { fail(L->sum, TQ_ERR_BACKEND_ERROR, be->err); break; }
        if (have && (rc = ds_finish(L, &prev, 1))) break;
        prev = cur;
        have = 1;
        if (ds_boundary(L, s) || L->defer_stop || L->defer_timeout) {
            have = 0;
            if ((rc = ds_finish(L, &prev, 0))) break;
        }
    }
    e->dstate = NULL;
    return rc;
}

/* The step as the host issues it (every job without cuda_graphs): per micro-batch the loader,
 * forward, loss and backward, then unscale and inf check, the optimizer and the 16-bit weight
 * copy, then one read of the step's results (the one sync of the step) and record_step. */
static int host_train(step_loop *L, int64_t start) {
    run_ctx *r = L->r;
    tq_backend *be = r->be;
    const tq_backend_i *I = be->i;
    const tq_spec *sp = L->sp;
    const tq_graph *g = r->e.g;
    const int b = sp->batch_size, accum = sp->accum_steps;
    int rc = TQ_OK;
    for (int64_t s = start; s < L->total && !L->stop; s++) {
        tq_prof_set(r->prof, s >= r->prof_from);   /* evals and checkpoints stay out of the profile */
        double t0 = I->now_ms(be);   /* the stream is idle here: the last step ended with a sync */
        unsigned nerr0 = be->nerr;
        step_begin(L, s);
        if (transfers_failed(be, nerr0)) { fail(L->sum, TQ_ERR_BACKEND_ERROR, be->err); return TQ_EDEVICE; }
        size_t extent = 0;
        for (int j = 0; j < accum && !rc; j++) {
            const tq_aug *aug;
            rc = microbatch_indices(L, s, j, &aug);
            if (!rc) rc = load_ops(r, b, r->train_img, r->train_lab, aug != NULL);
            if (!rc) rc = tq_engine_train_microbatch(&r->e, (float)(L->scale / accum));
            if (r->e.extent_peak > extent) extent = r->e.extent_peak;
        }
        if (!rc && L->fp16) rc = I->unscale_check(be, g->nparam_elems, r->e.grads, (float)(1.0 / L->scale), r->e.scalars + 2);
        /* the optimizer reads the overflow flag where it lives and skips itself (the low-precision
         * weight copy, written in the same pass, then keeps the unchanged weights): nothing waits
         * for the host */
        double lr = tq_lr_at(sp, s, L->total);
        if (!rc) rc = optimizer_step(r, lr, L->st->opt_t + 1, L->fp16 ? r->e.scalars + 2 : NULL);
        if (rc) { fail(L->sum, TQ_ERR_BACKEND_ERROR, be->err); return rc; }
        float sc[3];
        unsigned nerr = be->nerr;
        I->to_host(be, sc, r->e.scalars, sizeof sc);     /* the one sync of the step: loss, hits, overflow */
        I->sync(be);
        if (transfers_failed(be, nerr)) { fail(L->sum, TQ_ERR_BACKEND_ERROR, be->err); return TQ_EDEVICE; }
        double ms = I->now_ms(be) - t0;   /* CUDA events on the GPU, the monotonic clock on the CPU */
        if (r->prof && s >= r->prof_from) { tq_prof_set(r->prof, 0); tq_prof_step(r->prof, ms); }
        step_ref p = { .s = s, .lr = lr, .extent = extent, .marked = 0 };
        if ((rc = record_step(L, &p, sc, ms, NULL, 0))) return rc;
    }
    return rc;
}

int tq_train(const tq_spec *sp, const tq_run_opts *o, tq_summary *sum) {
    char err[512] = "", code[32] = "";
    tq_dataset ds;
    run_ctx r;
    memset(&r, 0, sizeof r);
    memset(sum, 0, sizeof *sum);
    sum->final_loss = sum->val_loss = sum->val_accuracy = NAN;
    sum->peak_memory_bytes = sum->predicted_peak_bytes = sum->device_peak_used_bytes = -1;
    sum->final_loss_scale = -1;
    sum->effective_batch = (int64_t)sp->batch_size * sp->accum_steps;
    snprintf(sum->amp, sizeof sum->amp, "%s", tq_amp_name(sp->amp));
    snprintf(sum->device, sizeof sum->device, "cpu");
    double t_start = tq_mono_ms();
    double *step_ms = NULL, *sps = NULL;
    tq_graph *g = NULL;
    int rc = 0;

    if (tq_spec_batch_unresolved(sp)) {   /* autobatch.h resolves it first: never train batch 0 */
        fail(sum, TQ_ERR_INVALID_SPEC, "batch_size \"auto\" was not resolved to a micro-batch before training");
        return TQ_EINVAL;
    }
    /* the device first: a placed one found busy (taken since the placement) turns the job back
     * before its data is read — the summary says so, and the worker hands the job back to the
     * queue, which pauses that device (daemon/serve.c; tq_busy_pause_ms) */
    if (o->placed && test_busy(sp, err, sizeof err)) {
        fail(sum, TQ_ERR_DEVICE_UNAVAILABLE, err);
        sum->device_busy = 1;
        return TQ_EDEVICE;
    }
    if (open_backend(sp, o->placed, &r.be, sum->device, sizeof sum->device, code, sizeof code, err, sizeof err)) {
        fail_as(sum, code, err);
        sum->device_busy = o->placed && tq_cuda_open_busy();
        return TQ_EDEVICE;
    }
    if (load_data(sp, &ds, code, sizeof code, err, sizeof err)) {
        fail_as(sum, code, err);
        tq_backend_free(r.be);
        return TQ_EDATA;
    }
    r.sp = sp; r.ds = &ds;
    /* TF32 and graphs as this job runs them: tf32 is the CUDA backend's (the CPU's f32 is
     * exact); the step on the device runs for cuda_graphs on a CUDA device (captured) or with
     * TQ_DEVICE_STEP=1 (uncaptured, any backend: the tests' way to check that loop), or
     * captured on any backend with TQ_DEVICE_STEP=capture (the tests' way to take the
     * fallback of a failed capture: the CPU has no graphs) */
    int cuda = tq_cuda_backend_name(r.be) != NULL;
    const char *dse = getenv("TQ_DEVICE_STEP");
    int dsm = dse && !strcmp(dse, "1") ? 1 : dse && !strcmp(dse, "capture") ? 2 : sp->cuda_graphs && cuda ? 2 : 0;
    if (o->profile && dsm) {   /* a graph replays without the host: its ops cannot be timed one by one */
        fprintf(stderr, "trainq: profile: every op is timed on its own, so this run issues the step from the host, "
                "without %s\n", dsm == 2 ? "a CUDA graph (cuda_graphs is off for it)" : "the step on the device");
        dsm = 0;
    }
    if (cuda) snprintf(sum->tf32, sizeof sum->tf32, "%s", tq_tf32_name(sp->tf32));
    snprintf(sum->cuda_graphs, sizeof sum->cuda_graphs, "%s",
             dsm == 2 ? "captured" : dsm == 1 ? "uncaptured" : sp->cuda_graphs ? "not_cuda" : "off");
    if (sp->cuda_graphs && !cuda && dsm == 0)
        fprintf(stderr, "trainq: cuda_graphs: this job runs on %s and CUDA graphs apply to CUDA devices only: "
                "training without them\n", sum->device);
    int b = sp->batch_size, accum = sp->accum_steps;
    int64_t N = ds.train.n;
    int64_t mb_per_epoch = N / b, spe = mb_per_epoch / accum;
    if (spe < 1) {
        snprintf(err, sizeof err, "the training set has %lld samples, fewer than one optimizer step needs (batch_size %d x accum_steps %d)",
                 (long long)N, b, accum);
        fail(sum, TQ_ERR_INVALID_SPEC, err); rc = TQ_EINVAL; goto done;
    }
    int64_t total = sp->steps ? sp->steps : (int64_t)llround(sp->epochs * (double)spe);
    if (total < 1) total = 1;
    if (dsm && total >= INT32_MAX) {   /* the device counts optimizer steps in 32 bits */
        fprintf(stderr, "trainq: cuda_graphs: %lld steps are too many for the step on the device: training without it\n",
                (long long)total);
        dsm = 0;
        snprintf(sum->cuda_graphs, sizeof sum->cuda_graphs, "off");
    }

    g = build(sp, &ds, r.be, err, sizeof err);
    if (!g) { fail(sum, TQ_ERR_INVALID_SPEC, err); rc = TQ_EINVAL; goto done; }
    tq_plan plan;
    tq_engine_plan(g, sp->optimizer.type, momentum_buf(sp), data_bytes(&ds), &plan);
    sum->predicted_peak_bytes = (int64_t)plan.total;
    if (sp->max_memory_mb > 0 && plan.total + plan.data > (size_t)sp->max_memory_mb << 20) {
        snprintf(err, sizeof err, "the job needs %zu bytes (%.1f MiB: %zu for training + %zu for the dataset), over max_memory_mb %lld",
                 plan.total + plan.data, (plan.total + plan.data) / 1048576.0, plan.total, plan.data, (long long)sp->max_memory_mb);
        fail(sum, TQ_ERR_MEMORY_LIMIT, err); rc = TQ_ENOMEM; goto done;
    }
    if (o->mem_limit > 0) {
        if (plan.total + plan.data > (size_t)o->mem_limit) {
            snprintf(err, sizeof err, "the job's plan on %s is %zu bytes (%.1f MiB with this device's workspaces), over "
                     "the %lld bytes (%.1f MiB) placed for it", sum->device, plan.total + plan.data,
                     (plan.total + plan.data) / 1048576.0, o->mem_limit, o->mem_limit / 1048576.0);
            fail(sum, TQ_ERR_OUT_OF_MEMORY, err); rc = TQ_ENOMEM; goto done;
        }
        r.be->bytes_limit = (size_t)o->mem_limit;
    }
    size_t dev_free = 0, dev_total = 0;
    int on_device = r.be->i->mem_info(r.be, &dev_free, &dev_total) == 0;
    if (on_device && plan.total + plan.data > dev_free) {
        snprintf(err, sizeof err, "the job needs %zu bytes (%.1f MiB: %zu for training + %zu for the dataset) but %s has %zu bytes (%.1f MiB) free of %zu",
                 plan.total + plan.data, (plan.total + plan.data) / 1048576.0, plan.total, plan.data, sum->device,
                 dev_free, dev_free / 1048576.0, dev_total);
        fail(sum, TQ_ERR_OUT_OF_MEMORY, err); rc = TQ_ENOMEM;
        /* placed there by the daemon, which saw the driver's free memory hold the plan: another
         * process took the memory since — the device is busy, and the job goes back to the queue
         * (not its failure). Placed by the budget alone (no driver numbers), it is the job's. */
        if (o->placed == 2) {
            size_t l = strlen(sum->error_message);
            snprintf(sum->error_message + l, sizeof sum->error_message - l,
                     ": another process took memory since the placement");
            sum->device_busy = 1;
        }
        goto done;
    }
    if ((rc = tq_engine_new(&r.e, r.be, g, sp->optimizer.type, momentum_buf(sp), err, sizeof err))) {
        fail(sum, rc == TQ_EDEVICE ? TQ_ERR_BACKEND_ERROR : TQ_ERR_OUT_OF_MEMORY, err); goto done;
    }
    if ((rc = upload_split(&r, &ds.train, &r.train_img, &r.train_lab)) ||
        (rc = upload_split(&r, &ds.test, &r.test_img, &r.test_lab))) {
        if (rc == TQ_ENOMEM) fail(sum, TQ_ERR_OUT_OF_MEMORY, "out of memory uploading the dataset");
        else fail(sum, TQ_ERR_BACKEND_ERROR, r.be->err);
        goto done;
    }
    if (o->on_ready) o->on_ready(o->ready_ctx);   /* the device holds the engine and the data */
    for (int c = 0; c < 3; c++) { r.mean[c] = ds.mean[c]; r.inv_std[c] = 1.0f / ds.std[c]; }
    r.idx_host = malloc(sizeof(int32_t) * b);
    r.aug_host = malloc(sizeof(tq_aug) * b);
    r.perm = malloc(sizeof(int32_t) * (N ? N : 1));
    r.perm_epoch = -1;
    step_ms = malloc(sizeof(double) * total);
    sps = malloc(sizeof(double) * total);
    if (!r.idx_host || !r.aug_host || !r.perm || !step_ms || !sps) { fail(sum, TQ_ERR_OUT_OF_MEMORY, "out of host memory"); rc = TQ_ENOMEM; goto done; }

    /* weights: checkpoint (resume) > init_from > fresh */
    tq_ckpt_state st = {0, 0, sp->amp == TQ_AMP_FP16 ? sp->loss_scale.init : -1, 0, 0};
    char ckpt_path[TQ_PATH_MAX + 32] = "", model_path[TQ_PATH_MAX + 32] = "";
    if (o->out_dir) {
        if (mkdir_p(o->out_dir)) {
            int e = errno;
            snprintf(err, sizeof err, "cannot create output directory %s: %s", o->out_dir, strerror(e));
            rc = e == ENOSPC || e == EDQUOT ? TQ_ENOSPC : TQ_EIO;
            fail(sum, storage_code(rc), err); goto done;
        }
        snprintf(ckpt_path, sizeof ckpt_path, "%s/checkpoint.safetensors", o->out_dir);
        snprintf(model_path, sizeof model_path, "%s/model.safetensors", o->out_dir);
    }
    struct stat sb;
    if (o->resume && ckpt_path[0] && stat(ckpt_path, &sb) == 0) {
        /* the checkpoint is input: its step must lie within this job (a negative or huge step
         * would index the epoch order and the step arrays out of bounds), its scaler state must
         * be one this job's scaler can reach (checkpoint.h) */
        tq_ckpt_limits lim = {total, sp->amp == TQ_AMP_FP16 ? sp->loss_scale.growth_interval : 0};
        if ((rc = tq_load_checkpoint(&r.e, ckpt_path, &lim, &st, err, sizeof err))) {
            fail(sum, rc == TQ_ENOMEM ? TQ_ERR_OUT_OF_MEMORY : rc == TQ_EDEVICE ? TQ_ERR_BACKEND_ERROR
                      : TQ_ERR_INVALID_CHECKPOINT, err);
            goto done;
        }
    } else if (sp->init_from[0]) {
        if ((rc = tq_load_model(&r.e, sp->init_from, err, sizeof err))) {
            fail(sum, rc == TQ_EDEVICE ? TQ_ERR_BACKEND_ERROR : TQ_ERR_INVALID_INIT_FROM, err); goto done;
        }
    } else if ((rc = tq_engine_init_weights(&r.e, sp->seed))) {
        if (rc == TQ_ENOMEM) fail(sum, TQ_ERR_OUT_OF_MEMORY, "out of memory initialising weights");
        else fail(sum, TQ_ERR_BACKEND_ERROR, r.be->err);
        goto done;
    }

    tq_backend *be = r.be;
    const tq_backend_i *I = be->i;
    int fp16 = sp->amp == TQ_AMP_FP16;
    double scale = fp16 ? st.loss_scale : 1.0;
    int tracker = (int)st.growth_tracker;
    int64_t start = st.step, nsteps_here = 0, peak = 0;
    size_t data_b = plan.data;
    double loss = NAN;
    step_loop L;
    memset(&L, 0, sizeof L);
    L.r = &r; L.sp = sp; L.o = o; L.sum = sum; L.st = &st; L.ckpt_path = ckpt_path;
    L.total = total; L.spe = spe; L.N = N; L.data_b = data_b; L.on_device = on_device;
    L.fp16 = fp16; L.capture = dsm == 2; L.t_start = t_start;
    L.scale = scale; L.tracker = tracker; L.loss = loss;
    L.step_ms = step_ms; L.sps = sps;
    if (o->profile) {
        /* the first steps plan, benchmark and warm up: left out when there are steps to spare */
        int64_t here = total - start, warm = here / 2 < 3 ? here / 2 : 3;
        r.prof_from = start + warm;
        /* scalars: zeroed again at every step's start, so the calibration may use them */
        if (!(r.prof = tq_prof_attach(be, r.e.scalars))) { fail(sum, TQ_ERR_OUT_OF_MEMORY, "out of host memory for the profile"); rc = TQ_ENOMEM; goto done; }
    }
    rc = dsm ? ds_train(&L, start) : host_train(&L, start);   /* the step on the device: cuda_graphs */
    if (r.prof) {
        tq_prof_detach(r.prof);
        tq_prof_meta pm = { sum->device, tq_model_name(sp->model), sum->amp, sp->batch_size, sp->accum_steps,
                            be->threads, (int)(r.prof_from - start) };
        tq_prof_print(r.prof, &pm, stderr, 25);
        char perr[512];
        if (tq_prof_write(r.prof, &pm, o->profile, perr, sizeof perr)) fprintf(stderr, "trainq: profile: %s\n", perr);
    }
    scale = L.scale; tracker = L.tracker; loss = L.loss; peak = L.peak; nsteps_here = L.nsteps;
    if (dsm) {
        I->graph_free(be, L.g_mb);
        I->graph_free(be, L.g_tail);
        if (dsm == 2 && !L.captured)
            snprintf(sum->cuda_graphs, sizeof sum->cuda_graphs, "%s", L.capture_failed ? "capture_failed" : "uncaptured");
    }
    if (rc && !L.timed_out) goto done;
    if (!sum->state[0]) snprintf(sum->state, sizeof sum->state, "succeeded");
    if (model_path[0] && !strcmp(sum->state, "succeeded")) {
        if ((rc = tq_export_model(&r.e, model_path, err, sizeof err))) { fail(sum, storage_code(rc), err); goto done; }
    }
    if (!strcmp(sum->state, "succeeded") && ds.test.n > 0) {
        tq_eval_kind kinds[2] = {TQ_EVAL_PRUNED, TQ_EVAL_INT8};
        int want[2] = {sp->prune_amount >= 0, sp->quantize_int8};
        for (int k = 0; k < 2; k++) {
            if (!want[k]) continue;
            tq_eval_rec ev;
            if ((rc = posttrain(&r, st.step, (int)((st.step - 1) / spe) + 1, kinds[k], &ev))) {
                fail(sum, rc == TQ_ENOMEM ? TQ_ERR_OUT_OF_MEMORY : TQ_ERR_BACKEND_ERROR, rc == TQ_ENOMEM ? "out of host memory" : be->err);
                goto done;
            }
            if (o->cb.on_eval && (rc = o->cb.on_eval(o->cb.ctx, &ev))) { fail(sum, TQ_ERR_IO_ERROR, "recording the evaluation failed"); goto done; }
        }
    }
    sum->steps = st.step;
    sum->samples = st.step * sum->effective_batch;
    sum->epochs = (double)st.step / (double)spe;
    sum->final_loss = loss;
    sum->peak_memory_bytes = peak;
    sum->skipped_steps = st.skipped_steps;
    sum->final_loss_scale = fp16 ? scale : -1;
    if (nsteps_here > 0) {
        size_t skip = nsteps_here > 5 ? 5 : 0;
        sum->samples_per_s = median(sps + skip, nsteps_here - skip);
        sum->step_ms_median = median(step_ms + skip, nsteps_here - skip);
    }
done:
    sum->wall_s = (tq_mono_ms() - t_start) / 1000.0;
    tq_prof_free(r.prof);   /* detached: the backend has its own table back */
    if (r.be) {
        void *bufs[4] = {r.train_img, r.train_lab, r.test_img, r.test_lab};
        for (int i = 0; i < 4; i++) if (bufs[i]) r.be->i->free(r.be, bufs[i]);
        if (r.e.g) tq_engine_free(&r.e);
        tq_backend_free(r.be);
    }
    tq_graph_free(g);
    free(r.idx_host); free(r.aug_host); free(r.perm); free(step_ms); free(sps);
    tq_dataset_free(&ds);
    if (!strcmp(sum->state, "failed") && rc == 0) rc = TQ_EINVAL;
    return strcmp(sum->state, "failed") ? 0 : rc;
}
