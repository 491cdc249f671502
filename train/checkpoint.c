/* checkpoint.c — safetensors import/export with layout conversion (see checkpoint.h). */
#include "checkpoint.h"
#include "models.h"
#include "safetensors.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPT_A_NAME "trainq.optimizer.state_a"
#define OPT_B_NAME "trainq.optimizer.state_b"

/* internal [o][a][b][c] ↔ PyTorch [o][c][a][b] (conv KRSC ↔ OIHW; linear (h,w,c) ↔ (c,h,w)) */
static void permute(const tq_param *p, const float *src, float *dst, int to_torch) {
    int O, A, B, C;
    if (p->layout == TQ_L_CONV_KRSC) { O = (int)p->shape[0]; C = (int)p->shape[1]; A = (int)p->shape[2]; B = (int)p->shape[3]; }
    else { O = (int)p->shape[0]; A = p->lh; B = p->lw; C = p->lc; }
    for (int o = 0; o < O; o++)
        for (int a = 0; a < A; a++)
            for (int b = 0; b < B; b++)
                for (int c = 0; c < C; c++) {
                    size_t in_i = (((size_t)o * A + a) * B + b) * C + c;
                    size_t pt_i = (((size_t)o * C + c) * A + a) * B + b;
                    if (to_torch) dst[pt_i] = src[in_i]; else dst[in_i] = src[pt_i];
                }
}

typedef struct { float *params, *buffers, *opt_a, *opt_b; } host_state;

static void host_free(host_state *h) { free(h->params); free(h->buffers); free(h->opt_a); free(h->opt_b); }

static int host_alloc(const tq_engine *e, host_state *h, int with_opt) {
    size_t P = e->g->nparam_elems, B = e->g->nbuffer_elems;
    memset(h, 0, sizeof *h);
    h->params = calloc(P ? P : 1, 4);
    h->buffers = calloc(B ? B : 1, 4);
    if (with_opt && e->opt_a) h->opt_a = calloc(P, 4);
    if (with_opt && e->opt_b) h->opt_b = calloc(P, 4);
    if (!h->params || !h->buffers || (with_opt && e->opt_a && !h->opt_a) || (with_opt && e->opt_b && !h->opt_b)) {
        host_free(h);
        return TQ_ENOMEM;
    }
    return TQ_OK;
}

/* The copies between the device and host_state: TQ_EDEVICE where one failed (a GPU's can;
 * be->err says which), never a file written from, or weights trained on, what did not arrive. */
static int download(const tq_engine *e, host_state *h) {
    tq_backend *be = e->be;
    size_t P = e->g->nparam_elems, B = e->g->nbuffer_elems;
    unsigned nerr = be->nerr;
    be->i->to_host(be, h->params, e->params, P * 4);
    if (B) be->i->to_host(be, h->buffers, e->buffers, B * 4);
    if (h->opt_a) be->i->to_host(be, h->opt_a, e->opt_a, P * 4);
    if (h->opt_b) be->i->to_host(be, h->opt_b, e->opt_b, P * 4);
    return be->nerr != nerr ? TQ_EDEVICE : TQ_OK;
}

static int upload(tq_engine *e, const host_state *h) {
    tq_backend *be = e->be;
    size_t P = e->g->nparam_elems, B = e->g->nbuffer_elems;
    unsigned nerr = be->nerr;
    be->i->to_device(be, e->params, h->params, P * 4);
    if (B) be->i->to_device(be, e->buffers, h->buffers, B * 4);
    if (h->opt_a) be->i->to_device(be, e->opt_a, h->opt_a, P * 4);
    if (h->opt_b) be->i->to_device(be, e->opt_b, h->opt_b, P * 4);
    if (be->nerr != nerr) return TQ_EDEVICE;
    return tq_engine_refresh_wlow(e);
}

int tq_engine_init_weights(tq_engine *e, uint64_t seed) {
    host_state h;
    if (host_alloc(e, &h, 0)) return TQ_ENOMEM;
    tq_model_init(e->g, seed, h.params, h.buffers, e->counts);
    int rc = upload(e, &h);
    host_free(&h);
    return rc;
}

/* Writes the state_dict (and optionally the optimizer state and metadata). */
static int write_file(const tq_engine *e, const char *path, const tq_ckpt_state *st, char *err,
                      size_t errlen) {
    const tq_graph *g = e->g;
    host_state h;
    if (host_alloc(e, &h, st != NULL)) { snprintf(err, errlen, "out of memory writing %s", path); return TQ_ENOMEM; }
    if (download(e, &h)) {   /* the file on disk stays as it was */
        snprintf(err, errlen, "copying the weights from the device for %s failed: %s", path, e->be->err);
        host_free(&h);
        return TQ_EDEVICE;
    }
    int n = 0, cap = g->nparams + 2;
    tq_st_tensor *ts = calloc(cap, sizeof *ts);
    float *perm = calloc(g->nparam_elems ? g->nparam_elems : 1, 4);  /* permuted copies */
    int rc = TQ_ENOMEM;
    cJSON *meta = NULL;
    if (!ts || !perm) { snprintf(err, errlen, "out of memory writing %s", path); goto fail; }
    for (int i = 0; i < g->nparams; i++) {
        const tq_param *p = &g->params[i];
        tq_st_tensor *t = &ts[n++];
        snprintf(t->name, sizeof t->name, "%s", p->name);
        t->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) t->shape[d] = p->shape[d];
        if (p->where == TQ_PB_COUNT) {
            strcpy(t->dtype, "I64");
            t->data = &e->counts[p->offset];
            t->bytes = 8;
            continue;
        }
        strcpy(t->dtype, "F32");
        const float *src = (p->where == TQ_PB_PARAM ? h.params : h.buffers) + p->offset;
        if (p->layout != TQ_L_PLAIN) {
            permute(p, src, perm + p->offset, 1);
            src = perm + p->offset;
        }
        t->data = src;
        t->bytes = p->numel * 4;
    }
    if (st) {
        if (h.opt_a) ts[n++] = (tq_st_tensor){OPT_A_NAME, "F32", 1, {(int64_t)g->nparam_elems}, h.opt_a, g->nparam_elems * 4};
        if (h.opt_b) ts[n++] = (tq_st_tensor){OPT_B_NAME, "F32", 1, {(int64_t)g->nparam_elems}, h.opt_b, g->nparam_elems * 4};
        meta = cJSON_CreateObject();
        char buf[64];
        snprintf(buf, sizeof buf, "%" PRId64, st->step); cJSON_AddStringToObject(meta, "step", buf);
        snprintf(buf, sizeof buf, "%" PRId64, st->opt_t); cJSON_AddStringToObject(meta, "opt_t", buf);
        snprintf(buf, sizeof buf, "%.17g", st->loss_scale); cJSON_AddStringToObject(meta, "loss_scale", buf);
        snprintf(buf, sizeof buf, "%" PRId64, st->growth_tracker); cJSON_AddStringToObject(meta, "growth_tracker", buf);
        snprintf(buf, sizeof buf, "%" PRId64, st->skipped_steps); cJSON_AddStringToObject(meta, "skipped_steps", buf);
        cJSON_AddStringToObject(meta, "format", "trainq-checkpoint-1");
    }
    rc = tq_st_write(path, ts, n, meta, err, errlen);
fail:
    cJSON_Delete(meta);
    free(ts); free(perm);
    host_free(&h);
    return rc;
}

int tq_export_model(const tq_engine *e, const char *path, char *err, size_t errlen) {
    return write_file(e, path, NULL, err, errlen);
}
int tq_save_checkpoint(const tq_engine *e, const char *path, const tq_ckpt_state *st, char *err, size_t errlen) {
    return write_file(e, path, st, err, errlen);
}

static int shape_eq(const tq_st_tensor *t, const tq_param *p) {
    if (t->ndim != p->ndim) return 0;
    for (int d = 0; d < p->ndim; d++) if (t->shape[d] != p->shape[d]) return 0;
    return 1;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    int len = snprintf(buf, n, "[");
    for (int d = 0; d < ndim && len < (int)n; d++)
        len += snprintf(buf + len, n - len, "%s%" PRId64, d ? "," : "", shape[d]);
    if (len < (int)n) snprintf(buf + len, n - len, "]");
}

/* A metadata value for a message: at most 32 bytes, non-printable and non-ASCII bytes as '?',
 * quoted. */
static void value_str(char *buf, size_t n, const char *v) {
    size_t len = strlen(v), k = 0;
    if (n < 8) { if (n) buf[0] = 0; return; }
    buf[k++] = '"';
    for (size_t i = 0; i < len && i < 32 && k + 5 < n; i++)
        buf[k++] = (v[i] >= 0x20 && v[i] < 0x7f && v[i] != '"' && v[i] != '\\') ? v[i] : '?';
    if (len > 32 && k + 5 < n) { buf[k++] = '.'; buf[k++] = '.'; buf[k++] = '.'; }
    buf[k++] = '"';
    buf[k] = 0;
}

/* Strict integer: an optional '-', then 1…19 decimal digits, nothing else (no whitespace, no
 * '+', no trailing bytes), within int64. */
static int parse_i64(const char *v, int64_t *out) {
    const char *p = v;
    if (*p == '-') p++;
    if (*p < '0' || *p > '9') return 0;
    for (const char *q = p; *q; q++) if (*q < '0' || *q > '9') return 0;
    errno = 0;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (errno || !end || *end) return 0;
    *out = (int64_t)x;
    return 1;
}

/* Strict decimal number as written by %.17g: digits, '.', 'e'/'E' and signs only (no "nan",
 * "inf", hex or whitespace), the whole string consumed, finite. */
static int parse_f64(const char *v, double *out) {
    if (!*v) return 0;
    for (const char *q = v; *q; q++)
        if (!strchr("0123456789.eE+-", *q)) return 0;
    if (*v == '+') return 0;
    errno = 0;
    char *end = NULL;
    double x = strtod(v, &end);
    if (errno == ERANGE && isfinite(x) && x != 0) errno = 0;   /* subnormal underflow: a value */
    if (errno || !end || *end || !isfinite(x)) return 0;
    *out = x;
    return 1;
}

#define META_KEYS 5
static const char *const meta_keys[META_KEYS] = {"step", "opt_t", "loss_scale", "growth_tracker", "skipped_steps"};

__attribute__((format(printf, 5, 6)))
static int meta_fail(char *err, size_t errlen, const char *path, const char *key, const char *fmt, ...) {
    char tail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s: checkpoint metadata \"%s\" %s", path, key, tail);
    return TQ_EDATA;
}

/* Parses and checks the checkpoint's metadata (see tq_load_checkpoint in checkpoint.h). */
static int read_meta(const tq_st_file *f, const char *path, const tq_ckpt_limits *lim, tq_ckpt_state *st,
                     char *err, size_t errlen) {
    const char *fmt = tq_st_meta(f, "format");
    char q[64];
    if (!fmt) {
        snprintf(err, errlen, "%s: not a trainq checkpoint (checkpoint metadata \"format\" is missing)", path);
        return TQ_EDATA;
    }
    if (strcmp(fmt, "trainq-checkpoint-1")) {
        value_str(q, sizeof q, fmt);
        return meta_fail(err, errlen, path, "format", "is %s: must be \"trainq-checkpoint-1\"", q);
    }
    int64_t iv[META_KEYS] = {0};
    double scale = 0;
    for (int k = 0; k < META_KEYS; k++) {
        const char *v = tq_st_meta(f, meta_keys[k]);
        if (!v) return meta_fail(err, errlen, path, meta_keys[k], "is missing");
        int ok = k == 2 ? parse_f64(v, &scale) : parse_i64(v, &iv[k]);
        if (!ok) {
            value_str(q, sizeof q, v);
            return meta_fail(err, errlen, path, meta_keys[k], "is %s: not %s", q,
                             k == 2 ? "a finite decimal number" : "a decimal integer in the int64 range");
        }
    }
    int64_t step = iv[0], opt_t = iv[1], tracker = iv[3], skipped = iv[4];
    int64_t max_step = lim && lim->total_steps >= 0 ? lim->total_steps : INT64_MAX / 2;
    if (step < 0 || step > max_step)
        return meta_fail(err, errlen, path, "step", "is %" PRId64 ": must be 0..%" PRId64, step, max_step);
    if (opt_t < 0 || opt_t > step)
        return meta_fail(err, errlen, path, "opt_t", "is %" PRId64 ": must be 0..%" PRId64 " (step)", opt_t, step);
    if (skipped < 0 || skipped > step)
        return meta_fail(err, errlen, path, "skipped_steps", "is %" PRId64 ": must be 0..%" PRId64 " (step)",
                         skipped, step);
    if (opt_t + skipped != step)   /* every step is either applied or skipped */
        return meta_fail(err, errlen, path, "opt_t", "is %" PRId64 ": with skipped_steps %" PRId64
                         " it must add up to step %" PRId64, opt_t, skipped, step);
    int64_t max_tracker = step < INT_MAX ? step : INT_MAX;
    if (lim && lim->growth_interval > 0 && max_tracker > lim->growth_interval - 1)
        max_tracker = lim->growth_interval - 1;
    if (tracker < 0 || tracker > max_tracker)
        return meta_fail(err, errlen, path, "growth_tracker", "is %" PRId64 ": must be 0..%" PRId64
                         " (at most step, below growth_interval)", tracker, max_tracker);
    float fs = (float)scale;
    if (!(scale > 0) || !isfinite(fs) || !(fs > 0)) {
        value_str(q, sizeof q, tq_st_meta(f, "loss_scale"));   /* as written: it is a decimal number */
        q[strlen(q) - 1] = 0;
        return meta_fail(err, errlen, path, "loss_scale", "is %s: must be a finite number > 0 (as a float)", q + 1);
    }
    st->step = step; st->opt_t = opt_t; st->loss_scale = scale;
    st->growth_tracker = tracker; st->skipped_steps = skipped;
    return TQ_OK;
}

#define MAX_BN_COUNT (INT64_C(1) << 62)

static int read_file(tq_engine *e, const char *path, const tq_ckpt_limits *lim, tq_ckpt_state *st,
                     char *err, size_t errlen) {
    const tq_graph *g = e->g;
    host_state h;
    tq_ckpt_state meta;
    if (host_alloc(e, &h, st != NULL)) { snprintf(err, errlen, "out of memory reading %s", path); return TQ_ENOMEM; }
    int rc = TQ_EDATA;
    int64_t *counts = calloc(g->nbn ? g->nbn : 1, sizeof(int64_t));
    tq_st_file *f = NULL;
    if (!counts) { snprintf(err, errlen, "out of memory reading %s", path); rc = TQ_ENOMEM; goto fail; }
    if (!(f = tq_st_open(path, err, errlen))) goto fail;
    /* the metadata first: nothing is copied from a checkpoint whose numbers are wrong */
    if (st && (rc = read_meta(f, path, lim, &meta, err, errlen))) goto fail;
    rc = TQ_EDATA;
    int matched = 0;
    for (int i = 0; i < g->nparams; i++) {
        const tq_param *p = &g->params[i];
        const tq_st_tensor *t = tq_st_find(f, p->name);
        char a[64], b[64];
        if (!t) { snprintf(err, errlen, "%s: missing tensor \"%s\"", path, p->name); goto fail; }
        if (!shape_eq(t, p)) {
            shape_str(a, sizeof a, t->ndim, t->shape); shape_str(b, sizeof b, p->ndim, p->shape);
            snprintf(err, errlen, "%s: tensor \"%s\" has shape %s, the model needs %s", path, p->name, a, b);
            goto fail;
        }
        matched++;
        if (p->where == TQ_PB_COUNT) {
            if (strcmp(t->dtype, "I64") || t->bytes != 8) {
                snprintf(err, errlen, "%s: tensor \"%s\" must be I64, got %s", path, p->name, t->dtype);
                goto fail;
            }
            int64_t c;
            memcpy(&c, t->data, 8);
            if (c < 0 || c > MAX_BN_COUNT) {
                snprintf(err, errlen, "%s: tensor \"%s\" is %" PRId64 ": must be 0..%" PRId64, path, p->name, c,
                         MAX_BN_COUNT);
                goto fail;
            }
            counts[p->offset] = c;
            continue;
        }
        if (strcmp(t->dtype, "F32") || t->bytes != p->numel * 4) {
            snprintf(err, errlen, "%s: tensor \"%s\" must be F32, got %s", path, p->name, t->dtype);
            goto fail;
        }
        float *dst = (p->where == TQ_PB_PARAM ? h.params : h.buffers) + p->offset;
        const float *src = t->data;
        for (size_t k = 0; k < p->numel; k++) {
            float x;
            memcpy(&x, src + k, 4);   /* data may be unaligned (safetensors.h) */
            if (!tq_isfinite(x)) { snprintf(err, errlen, "%s: tensor \"%s\" holds a non-finite value", path, p->name); goto fail; }
        }
        if (p->layout != TQ_L_PLAIN) {
            float *tmp = malloc(p->numel ? p->numel * 4 : 1);
            if (!tmp) { snprintf(err, errlen, "out of memory reading %s", path); rc = TQ_ENOMEM; goto fail; }
            memcpy(tmp, src, p->numel * 4);
            permute(p, tmp, dst, 0);
            free(tmp);
        } else memcpy(dst, src, p->numel * 4);
    }
    int extra = tq_st_count(f) - matched;
    if (st) {
        const char *names[2] = {OPT_A_NAME, OPT_B_NAME};
        float *bufs[2] = {h.opt_a, h.opt_b};
        for (int k = 0; k < 2; k++) {
            if (!bufs[k]) continue;
            const tq_st_tensor *t = tq_st_find(f, names[k]);
            if (!t || strcmp(t->dtype, "F32") || t->ndim != 1 || t->shape[0] != (int64_t)g->nparam_elems ||
                t->bytes != g->nparam_elems * 4) {
                char a[64] = "none";
                if (t) shape_str(a, sizeof a, t->ndim, t->shape);
                snprintf(err, errlen, "%s: optimizer state \"%s\" missing or of the wrong dtype/shape (%s %s, the "
                         "model needs F32 [%zu]: a checkpoint of another optimizer or model?)", path, names[k],
                         t ? t->dtype : "", a, g->nparam_elems);
                goto fail;
            }
            memcpy(bufs[k], t->data, t->bytes);
            for (size_t j = 0; j < g->nparam_elems; j++)
                if (!tq_isfinite(bufs[k][j])) {
                    snprintf(err, errlen, "%s: optimizer state \"%s\" holds a non-finite value", path, names[k]);
                    goto fail;
                }
            extra--;
        }
    }
    if (extra > 0) {
        for (int i = 0; i < tq_st_count(f); i++) {
            const char *nm = tq_st_at(f, i)->name;
            int is_opt = !strcmp(nm, OPT_A_NAME) || !strcmp(nm, OPT_B_NAME), known = is_opt;
            for (int k = 0; k < g->nparams && !known; k++) known = !strcmp(g->params[k].name, nm);
            if (!known) { snprintf(err, errlen, "%s: unexpected tensor \"%s\" (not a parameter or buffer of this model)", path, nm); goto fail; }
            /* resuming: optimizer state this job has no buffer for is another optimizer's (a model
             * loaded from a checkpoint, init_from, ignores the optimizer state) */
            if (is_opt && st && !(!strcmp(nm, OPT_A_NAME) ? h.opt_a : h.opt_b)) {
                snprintf(err, errlen, "%s: optimizer state \"%s\" is not used by this job's optimizer (a checkpoint of "
                         "another optimizer?)", path, nm);
                goto fail;
            }
        }
    }
    if (st) *st = meta;
    memcpy(e->counts, counts, sizeof(int64_t) * g->nbn);
    if ((rc = upload(e, &h)) == TQ_EDEVICE)
        snprintf(err, errlen, "copying %s's weights to the device failed: %s", path, e->be->err);
fail:
    if (f) tq_st_close(f);
    free(counts);
    host_free(&h);
    return rc;
}

int tq_load_model(tq_engine *e, const char *path, char *err, size_t errlen) {
    return read_file(e, path, NULL, NULL, err, errlen);
}
int tq_load_checkpoint(tq_engine *e, const char *path, const tq_ckpt_limits *lim, tq_ckpt_state *st, char *err,
                       size_t errlen) {
    return read_file(e, path, lim, st, err, errlen);
}
