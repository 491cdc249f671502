/* checkpoint.c — safetensors import/export with layout conversion (see checkpoint.h). */
#include "checkpoint.h"
#include "models.h"
#include "safetensors.h"
#include "util.h"
#include <cjson/cJSON.h>
#include <inttypes.h>
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

static void download(const tq_engine *e, host_state *h) {
    tq_backend *be = e->be;
    size_t P = e->g->nparam_elems, B = e->g->nbuffer_elems;
    be->i->to_host(be, h->params, e->params, P * 4);
    if (B) be->i->to_host(be, h->buffers, e->buffers, B * 4);
    if (h->opt_a) be->i->to_host(be, h->opt_a, e->opt_a, P * 4);
    if (h->opt_b) be->i->to_host(be, h->opt_b, e->opt_b, P * 4);
}

static int upload(tq_engine *e, const host_state *h) {
    tq_backend *be = e->be;
    size_t P = e->g->nparam_elems, B = e->g->nbuffer_elems;
    be->i->to_device(be, e->params, h->params, P * 4);
    if (B) be->i->to_device(be, e->buffers, h->buffers, B * 4);
    if (h->opt_a) be->i->to_device(be, e->opt_a, h->opt_a, P * 4);
    if (h->opt_b) be->i->to_device(be, e->opt_b, h->opt_b, P * 4);
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
    download(e, &h);
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

static int read_file(tq_engine *e, const char *path, tq_ckpt_state *st, char *err, size_t errlen) {
    const tq_graph *g = e->g;
    host_state h;
    if (host_alloc(e, &h, st != NULL)) { snprintf(err, errlen, "out of memory reading %s", path); return TQ_ENOMEM; }
    int rc = TQ_EDATA;
    int64_t *counts = calloc(g->nbn ? g->nbn : 1, sizeof(int64_t));
    tq_st_file *f = tq_st_open(path, err, errlen);
    if (!f || !counts) { if (f == NULL && counts) rc = TQ_EDATA; goto fail; }
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
            if (strcmp(t->dtype, "I64")) { snprintf(err, errlen, "%s: tensor \"%s\" must be I64, got %s", path, p->name, t->dtype); goto fail; }
            memcpy(&counts[p->offset], t->data, 8);
            continue;
        }
        if (strcmp(t->dtype, "F32")) { snprintf(err, errlen, "%s: tensor \"%s\" must be F32, got %s", path, p->name, t->dtype); goto fail; }
        float *dst = (p->where == TQ_PB_PARAM ? h.params : h.buffers) + p->offset;
        const float *src = t->data;
        for (size_t k = 0; k < p->numel; k++)
            if (!tq_isfinite(src[k])) { snprintf(err, errlen, "%s: tensor \"%s\" holds a non-finite value", path, p->name); goto fail; }
        if (p->layout != TQ_L_PLAIN) permute(p, src, dst, 0);
        else memcpy(dst, src, p->numel * 4);
    }
    int extra = tq_st_count(f) - matched;
    if (st) {
        const char *names[2] = {OPT_A_NAME, OPT_B_NAME};
        float *bufs[2] = {h.opt_a, h.opt_b};
        for (int k = 0; k < 2; k++) {
            if (!bufs[k]) continue;
            const tq_st_tensor *t = tq_st_find(f, names[k]);
            if (!t || strcmp(t->dtype, "F32") || t->bytes != g->nparam_elems * 4) {
                snprintf(err, errlen, "%s: optimizer state \"%s\" missing or of the wrong size (a checkpoint of another optimizer or model?)", path, names[k]);
                goto fail;
            }
            memcpy(bufs[k], t->data, t->bytes);
            extra--;
        }
        const char *fmt = tq_st_meta(f, "format");
        const char *keys[5] = {"step", "opt_t", "loss_scale", "growth_tracker", "skipped_steps"};
        const char *v[5];
        for (int k = 0; k < 5; k++) v[k] = tq_st_meta(f, keys[k]);
        if (!fmt || strcmp(fmt, "trainq-checkpoint-1") || !v[0] || !v[1] || !v[2] || !v[3] || !v[4]) {
            snprintf(err, errlen, "%s: not a trainq checkpoint (metadata missing)", path);
            goto fail;
        }
        st->step = strtoll(v[0], NULL, 10); st->opt_t = strtoll(v[1], NULL, 10);
        st->loss_scale = strtod(v[2], NULL); st->growth_tracker = strtoll(v[3], NULL, 10);
        st->skipped_steps = strtoll(v[4], NULL, 10);
    }
    if (extra > 0) {
        for (int i = 0; i < tq_st_count(f); i++) {
            const char *nm = tq_st_at(f, i)->name;
            int known = !strcmp(nm, OPT_A_NAME) || !strcmp(nm, OPT_B_NAME);
            for (int k = 0; k < g->nparams && !known; k++) known = !strcmp(g->params[k].name, nm);
            if (!known) { snprintf(err, errlen, "%s: unexpected tensor \"%s\" (not a parameter or buffer of this model)", path, nm); goto fail; }
        }
    }
    memcpy(e->counts, counts, sizeof(int64_t) * g->nbn);
    rc = upload(e, &h);
fail:
    if (f) tq_st_close(f);
    free(counts);
    host_free(&h);
    return rc;
}

int tq_load_model(tq_engine *e, const char *path, char *err, size_t errlen) { return read_file(e, path, NULL, err, errlen); }
int tq_load_checkpoint(tq_engine *e, const char *path, tq_ckpt_state *st, char *err, size_t errlen) {
    return read_file(e, path, st, err, errlen);
}
