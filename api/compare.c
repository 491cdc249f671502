/* compare.c — GET /v1/compare?ids=ID,ID,…[&baseline=ID]: jobs side by side (throughput,
 * memory, loss, accuracy) with ratios to a baseline job. Everything is computed from the
 * job's step and eval rows, read in one snapshot, so a running job can be compared too;
 * only wall_s comes from the summary (null until the job has finished). docs/api.md has the
 * reference. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TQ_COMPARE_MAX 64          /* ids per request */
#define TQ_COMPARE_PAGE 100000     /* steps read per query */
#define TQ_COMPARE_WARMUP 5        /* steps left out of the medians (when there are more) */

typedef struct {
    tq_job job;                    /* owns its strings: tq_job_free */
    int have_job;
    int64_t nsteps, skipped;
    double sps_median, ms_median;  /* NaN: null */
    int64_t peak, reserved;        /* < 0: null (no steps) */
    int64_t device_peak;           /* < 0: null (no step reported it) */
    double final_loss;             /* NaN: null */
    double val_loss, val_accuracy; /* the last eval of kind "eval"; NaN: null */
} cmp_stats;

typedef struct {
    const int64_t *ids;
    int n;
    cmp_stats *st;
    int64_t missing;               /* the unknown id, when the snapshot stopped on one */
} cmp_ctx;

/* ---- numbers -------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median of the finite values of v (reordered); NaN when there are none */
static double median_finite(double *v, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) if (isfinite(v[i])) v[k++] = v[i];
    if (k == 0) return NAN;
    qsort(v, k, sizeof *v, cmp_double);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

static void add_num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}
static void add_int_or_null(cJSON *o, const char *k, int64_t v) {
    if (v >= 0) cJSON_AddNumberToObject(o, k, (double)v);
    else cJSON_AddNullToObject(o, k);
}
static double ratio(double a, double b) {
    return isfinite(a) && isfinite(b) && b != 0 ? a / b : NAN;
}

/* ---- the snapshot: one job's rows → its stats ------------------------------------------- */

static int grow(double **v, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    double *nv = realloc(*v, nc * sizeof *nv);
    if (!nv) return -1;
    *v = nv; *cap = nc;
    return 0;
}

static int job_stats(tq_store *s, int64_t id, cmp_stats *o) {
    o->sps_median = o->ms_median = o->final_loss = o->val_loss = o->val_accuracy = NAN;
    o->peak = o->reserved = o->device_peak = -1;
    double *sps = NULL, *ms = NULL;
    size_t cap_sps = 0, cap_ms = 0;
    int64_t after = 0;
    for (;;) {
        tq_step_rec *v;
        int n;
        int rc = tq_queue_steps(s, id, after, TQ_COMPARE_PAGE, &v, &n);
        if (rc) { free(sps); free(ms); return rc; }
        size_t have = (size_t)o->nsteps;
        if (grow(&sps, &cap_sps, have + (size_t)n) || grow(&ms, &cap_ms, have + (size_t)n)) {
            free(v); free(sps); free(ms);
            return TQ_STORE_ERR;
        }
        for (int i = 0; i < n; i++) {
            const tq_step_rec *r = &v[i];
            sps[have + (size_t)i] = r->samples_per_s;
            ms[have + (size_t)i] = r->step_ms;
            if (r->skipped) o->skipped++;
            if (r->mem_peak_bytes > o->peak) o->peak = r->mem_peak_bytes;
            if (r->mem_reserved_bytes > o->reserved) o->reserved = r->mem_reserved_bytes;
            if (r->device_used_bytes > o->device_peak) o->device_peak = r->device_used_bytes;
            o->final_loss = r->loss;
        }
        o->nsteps += n;
        if (n > 0) after = v[n - 1].step;
        free(v);
        if (n < TQ_COMPARE_PAGE) break;
    }
    if (o->nsteps > 0) {
        size_t skip = o->nsteps > TQ_COMPARE_WARMUP ? TQ_COMPARE_WARMUP : 0;
        size_t k = (size_t)o->nsteps - skip;
        o->sps_median = median_finite(sps + skip, k);
        o->ms_median = median_finite(ms + skip, k);
        if (o->peak < 0) o->peak = 0;
        if (o->reserved < 0) o->reserved = 0;
    }
    free(sps); free(ms);

    tq_eval_rec *ev;
    int ne;
    int rc = tq_queue_evals(s, id, 0, &ev, &ne);
    if (rc) return rc;
    for (int i = ne - 1; i >= 0; i--)
        if (ev[i].kind == TQ_EVAL_EVAL) { o->val_loss = ev[i].loss; o->val_accuracy = ev[i].accuracy; break; }
    free(ev);
    return TQ_STORE_OK;
}

static int snapshot_fn(tq_store *s, void *p) {
    cmp_ctx *x = p;
    for (int i = 0; i < x->n; i++) {
        cmp_stats *o = &x->st[i];
        int rc = tq_queue_get(s, x->ids[i], &o->job);
        if (rc < 0) return rc;
        if (rc == 0) { x->missing = x->ids[i]; return TQ_STORE_ENOJOB; }
        o->have_job = 1;
        rc = job_stats(s, x->ids[i], o);
        if (rc == TQ_STORE_ENOJOB) { x->missing = x->ids[i]; return rc; }
        if (rc) return rc;
    }
    return TQ_STORE_OK;
}

/* ---- rendering -------------------------------------------------------------------------- */

static void copy_spec_str(cJSON *o, const cJSON *spec, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(spec, k);
    if (cJSON_IsString(v)) cJSON_AddStringToObject(o, k, v->valuestring);
    else cJSON_AddNullToObject(o, k);
}
static double spec_num(const cJSON *spec, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(spec, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int finished(const char *state) {
    return !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");
}

static cJSON *job_row(const cmp_stats *o, const cmp_stats *base) {
    const tq_job *j = &o->job;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "id", (double)j->id);
    cJSON_AddStringToObject(r, "name", j->name);
    cJSON_AddStringToObject(r, "state", j->state);
    cJSON *spec = j->spec ? cJSON_Parse(j->spec) : NULL;
    copy_spec_str(r, spec, "model");
    copy_spec_str(r, spec, "dataset");
    if (j->device[0]) cJSON_AddStringToObject(r, "device", j->device);
    else cJSON_AddNullToObject(r, "device");
    copy_spec_str(r, spec, "amp");
    double bs = spec_num(spec, "batch_size"), acc = spec_num(spec, "accum_steps");
    add_num(r, "batch_size", bs);
    add_num(r, "accum_steps", acc);
    add_num(r, "effective_batch", bs * acc);
    cJSON_Delete(spec);

    cJSON_AddNumberToObject(r, "steps", (double)o->nsteps);
    cJSON_AddNumberToObject(r, "skipped_steps", (double)o->skipped);
    add_num(r, "samples_per_s", o->sps_median);
    add_num(r, "step_ms_median", o->ms_median);
    add_int_or_null(r, "peak_memory_bytes", o->peak);
    add_int_or_null(r, "reserved_bytes", o->reserved);
    add_int_or_null(r, "device_peak_used_bytes", o->device_peak);
    add_num(r, "final_loss", o->final_loss);
    add_num(r, "val_loss", o->val_loss);
    add_num(r, "val_accuracy", o->val_accuracy);

    double wall = NAN;
    if (finished(j->state) && j->summary) {
        cJSON *sum = cJSON_Parse(j->summary);
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(sum, "wall_s");
        if (cJSON_IsNumber(w)) wall = w->valuedouble;
        cJSON_Delete(sum);
    }
    add_num(r, "wall_s", wall);

    cJSON *vs = cJSON_AddObjectToObject(r, "vs_baseline");
    add_num(vs, "samples_per_s", ratio(o->sps_median, base->sps_median));
    add_num(vs, "peak_memory_bytes", ratio(o->peak < 0 ? NAN : (double)o->peak,
                                           base->peak < 0 ? NAN : (double)base->peak));
    double pts = NAN;
    if (isfinite(o->val_accuracy) && isfinite(base->val_accuracy))
        pts = 100.0 * (o->val_accuracy - base->val_accuracy);
    add_num(vs, "val_accuracy_points", pts);
    return r;
}

/* ---- parameters ----------------------------------------------------------------------- */

/* a job id: 1…18 decimal digits, > 0 */
static int parse_id(const char *p, size_t n, int64_t *out) {
    if (n == 0 || n > 18) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    if (v < 1) return -1;
    *out = v;
    return 0;
}

#define BAD(field, ...) tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", (field), __VA_ARGS__)

enum MHD_Result tq_h_compare(tq_ctx *c) {
    static const char *const allowed[] = { "ids", "baseline", NULL };
    enum MHD_Result ans;
    if (!tq_query_check(c, allowed, &ans)) return ans;

    const char *ids_s = tq_query(c, "ids");
    if (!ids_s)
        return BAD("ids", "ids is required: a comma-separated list of job ids (ids=12,13)");
    int64_t ids[TQ_COMPARE_MAX];
    int n = 0;
    for (const char *p = ids_s;;) {
        size_t len = strcspn(p, ",");
        if (n == TQ_COMPARE_MAX)
            return BAD("ids", "at most %d ids can be compared at once", TQ_COMPARE_MAX);
        if (!ids_s[0]) return BAD("ids", "ids is empty: give job ids separated by commas (ids=12,13)");
        if (len == 0)
            return BAD("ids", "ids has an empty item (\"%.64s\"): give job ids separated by commas", ids_s);
        if (parse_id(p, len, &ids[n]))
            return BAD("ids", "a job id is a positive integer, got \"%.*s\" in ids",
                       (int)(len > 64 ? 64 : len), p);
        for (int k = 0; k < n; k++)
            if (ids[k] == ids[n]) return BAD("ids", "job %lld is given twice in ids", (long long)ids[n]);
        n++;
        if (!p[len]) break;
        p += len + 1;
    }

    int64_t baseline = ids[0];
    const char *base_s = tq_query(c, "baseline");
    if (base_s) {
        if (parse_id(base_s, strlen(base_s), &baseline))
            return BAD("baseline", "baseline must be a job id (a positive integer), got \"%.64s\"", base_s);
        int found = 0;
        for (int k = 0; k < n; k++) if (ids[k] == baseline) found = 1;
        if (!found)
            return BAD("baseline", "baseline %lld is not one of ids", (long long)baseline);
    }

    tq_store *s = tq_api_store(c);
    if (!s)
        return tq_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "database_unavailable", NULL,
                             "the database cannot be opened");
    cmp_stats *st = calloc((size_t)n, sizeof *st);
    if (!st) return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL, "out of memory");
    cmp_ctx x = { .ids = ids, .n = n, .st = st };
    int rc = tq_queue_snapshot(s, snapshot_fn, &x);
    enum MHD_Result ret;
    if (rc == TQ_STORE_ENOJOB && x.missing > 0) {
        ret = tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", "ids", "no job %lld", (long long)x.missing);
    } else if (rc) {
        ret = tq_send_store_error(c, s, rc == TQ_STORE_ENOJOB ? TQ_STORE_ERR : rc);
    } else {
        ret = MHD_YES;
        int readable = 1;
        for (int i = 0; i < n && readable; i++)   /* private_jobs: every job must be the caller's */
            if (st[i].have_job) readable = tq_may_read_job(c, &st[i].job, &ret);
        if (!readable) goto out;
        const cmp_stats *base = &st[0];
        for (int i = 0; i < n; i++) if (ids[i] == baseline) base = &st[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "baseline", (double)baseline);
        cJSON *arr = cJSON_AddArrayToObject(o, "jobs");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, job_row(&st[i], base));
        ret = tq_send_json(c, MHD_HTTP_OK, o);
    }
out:
    for (int i = 0; i < n; i++) if (st[i].have_job) tq_job_free(&st[i].job);
    free(st);
    return ret;
}
