/* handlers.c — the endpoints of CONTRACT.md's HTTP API (except the event stream: sse.c). */
#include "internal.h"
#include "report.h"
#include "spec.h"
#include "trainer.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NO_STORE(c) tq_send_error((c), MHD_HTTP_SERVICE_UNAVAILABLE, "database_unavailable", NULL, \
                                  "the database cannot be opened")

static const char *const no_params[] = { NULL };

#define CHECK_QUERY(c, allowed) do { enum MHD_Result ans_; \
    if (!tq_query_check((c), (allowed), &ans_)) return ans_; } while (0)

/* answers the job `id` with `status` (200/201), or 404 */
static enum MHD_Result send_job(tq_ctx *c, tq_store *s, int64_t id, unsigned status) {
    tq_job j;
    int rc = tq_queue_get(s, id, &j);
    if (rc < 0) return tq_send_store_error(c, s, rc);
    if (rc == 0) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)id);
    cJSON *o = tq_job_json(&j);
    tq_job_free(&j);
    return tq_send_json(c, status, o);
}

/* ---- POST /v1/jobs -------------------------------------------------------------------- */

static long long mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Where a job asking for device `dev` runs under this daemon (worker.c's bind_device, then
 * the trainer's auto rule): *gpu is the GPU, or NULL for the CPU. 0, or -1 with why[] when the
 * job names a device this daemon cannot give it. */
static int job_target(const tq_api *a, const char *dev, const tq_api_gpu **gpu, char *why, size_t n) {
    *gpu = NULL;
    int job_gpu = !strncmp(dev, "cuda", 4);
    if (!strcmp(a->devices, "cpu")) {
        if (!job_gpu) return 0;
        snprintf(why, n, "the job asks for device \"%s\", but this daemon runs jobs on the CPU only (--devices cpu)", dev);
        return -1;
    }
    if (!strcmp(dev, "cpu")) return 0;
    int want = !strncmp(dev, "cuda:", 5) ? atoi(dev + 5) : -1;   /* -1: the first GPU */
    if (strcmp(a->devices, "auto")) {                               /* --devices cuda:N */
        int dn = atoi(a->devices + 5);
        if (want >= 0 && want != dn) {
            snprintf(why, n, "the job asks for device \"%s\", but this daemon runs jobs on %s (--devices)", dev, a->devices);
            return -1;
        }
        want = dn;
        job_gpu = 1;
    }
    for (int i = 0; i < a->ngpus; i++)
        if (want < 0 || a->gpus[i].ordinal == want) { *gpu = &a->gpus[i]; return 0; }
    if (!job_gpu) return 0;                                         /* auto without a GPU: the CPU */
    if (a->ngpus == 0)
        snprintf(why, n, "the job asks for device \"%s\", but this daemon has no GPU: %s", dev, a->cuda);
    else
        snprintf(why, n, "the job asks for device \"%s\", but cuda:%d does not exist (this daemon has %d GPU%s, cuda:0..cuda:%d)",
                 dev, want, a->ngpus, a->ngpus == 1 ? "" : "s", a->ngpus - 1);
    return -1;
}

/* What the plan depends on; specs with the same key have the same plan. */
static void plan_key(const tq_spec *sp, char *k, size_t n) {
    snprintf(k, n, "%d|%d|%.1024s|%d|%d|%d|%d|%lld|%lld|%lld|%lld|%d|%d|%d", (int)sp->model,
             (int)sp->dataset, sp->data_dir, sp->batch_size, (int)sp->amp, (int)sp->optimizer.type,
             sp->optimizer.momentum != 0, (long long)sp->train_subset, (long long)sp->eval_subset,
             (long long)sp->synthetic.train, (long long)sp->synthetic.test, sp->synthetic.h,
             sp->synthetic.w, sp->synthetic.c);
}

/* 0 and the plan's bytes; else code/err filled */
static int plan_cached(tq_api *a, const tq_spec *sp, long long *total, long long *data, char *code,
                       size_t cl, char *err, size_t el) {
    char key[sizeof a->plans[0].key];
    plan_key(sp, key, sizeof key);
    pthread_mutex_lock(&a->plan_mu);
    for (size_t i = 0; i < sizeof a->plans / sizeof a->plans[0]; i++)
        if (a->plans[i].used && !strcmp(a->plans[i].key, key)) {
            *total = a->plans[i].total; *data = a->plans[i].data;
            a->plans[i].stamp = ++a->plan_clock;
            pthread_mutex_unlock(&a->plan_mu);
            return 0;
        }
    pthread_mutex_unlock(&a->plan_mu);
    tq_plan_report rep;
    if (tq_plan_spec(sp, &rep, code, cl, err, el)) return -1;
    *total = (long long)rep.plan.total;
    *data = (long long)rep.plan.data;
    pthread_mutex_lock(&a->plan_mu);
    size_t victim = 0;
    for (size_t i = 0; i < sizeof a->plans / sizeof a->plans[0]; i++) {
        if (!a->plans[i].used) { victim = i; break; }
        if (a->plans[i].stamp < a->plans[victim].stamp) victim = i;
    }
    snprintf(a->plans[victim].key, sizeof a->plans[victim].key, "%s", key);
    a->plans[victim].total = *total;
    a->plans[victim].data = *data;
    a->plans[victim].used = 1;
    a->plans[victim].stamp = ++a->plan_clock;
    pthread_mutex_unlock(&a->plan_mu);
    return 0;
}

enum MHD_Result tq_h_submit(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    const char *body = c->req->body ? c->req->body : "";
    if (c->req->len != strlen(body))
        return tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_json", NULL, "the body contains a NUL byte");
    tq_spec sp;
    tq_spec_err se;
    if (tq_spec_parse(&sp, body, &se))
        return tq_send_error(c, MHD_HTTP_BAD_REQUEST, se.field[0] ? "invalid_spec" : "invalid_json",
                             se.field, "%s", se.message);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    if (sp.submission_id[0]) {   /* idempotency before the (costly) plan */
        int64_t old = tq_queue_find_submission(s, sp.submission_id);
        if (old < 0) return tq_send_store_error(c, s, (int)old);
        if (old > 0) return send_job(c, s, old, MHD_HTTP_OK);
    }
    const tq_api_gpu *gpu = NULL;
    char why[512];
    if (job_target(c->api, sp.device, &gpu, why, sizeof why))
        return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "device_unavailable", "device", "%s", why);
    long long total = 0, data = 0;
    char code[32] = "", err[512] = "";
    if (plan_cached(c->api, &sp, &total, &data, code, sizeof code, err, sizeof err)) {
        const char *field = strstr(code, "data") ? "data_dir" : NULL;
        return tq_send_error(c, MHD_HTTP_BAD_REQUEST, code[0] ? code : "invalid_spec", field, "%s", err);
    }
    long long need = total + data;
    if (sp.max_memory_mb > 0 && need > (long long)sp.max_memory_mb * 1048576LL)
        return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "cannot_fit", "max_memory_mb",
                             "the planned peak is %lld bytes (%.1f MiB: %lld for training + %lld for "
                             "the dataset), over max_memory_mb %lld (%lld bytes)", need,
                             need / 1048576.0, total, data, (long long)sp.max_memory_mb,
                             (long long)sp.max_memory_mb * 1048576LL);
    /* the device's free memory: the host's for the CPU; for a GPU, what the probe saw before
     * any job of ours ran (jobs run one at a time). The plan uses the CPU backend's workspace
     * sizes; cuDNN's are known only on the device, and the worker checks again with those. */
    long long avail = gpu ? gpu->free_bytes : mem_available();
    char where[160];
    if (gpu) snprintf(where, sizeof where, "cuda:%d's (%s)", gpu->ordinal, gpu->name);
    else snprintf(where, sizeof where, "the host's");
    if (avail > 0 && need > avail)
        return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "cannot_fit", NULL,
                             "the planned peak is %lld bytes (%.1f MiB), more than %s free "
                             "memory, %lld bytes (%.1f MiB)", need, need / 1048576.0, where, avail,
                             avail / 1048576.0);
    char *spec_json = tq_spec_to_json(&sp);
    if (!spec_json) return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL, "out of memory");
    int64_t id = 0;
    int existed = 0;
    int rc = tq_queue_submit(s, sp.name, spec_json, sp.priority, sp.submission_id, total, &id, &existed);
    free(spec_json);
    if (rc) return tq_send_store_error(c, s, rc);
    return send_job(c, s, id, existed ? MHD_HTTP_OK : MHD_HTTP_CREATED);
}

/* ---- GET /v1/jobs, /v1/jobs/{id} ------------------------------------------------------ */

enum MHD_Result tq_h_list(tq_ctx *c) {
    static const char *const allowed[] = { "state", "limit", "before", NULL };
    CHECK_QUERY(c, allowed);
    enum MHD_Result ans;
    const char *state = tq_query(c, "state");
    if (state) {
        int ok = 0;
        for (int i = 0; i < 5; i++) if (!strcmp(state, tq_queue_states[i])) ok = 1;
        if (!ok)
            return tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", "state",
                                 "state must be queued, running, succeeded, failed or cancelled, got \"%.64s\"", state);
    }
    long long limit = 100, before = 0;
    if (tq_query(c, "limit") && tq_query_int(c, "limit", 1, 1000, &limit, &ans)) return ans;
    if (tq_query(c, "before") && tq_query_int(c, "before", 1, INT64_MAX, &before, &ans)) return ans;
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    tq_job *jobs;
    int n;
    int64_t next;
    int rc = tq_queue_list(s, state, before, (int)limit, &jobs, &n, &next);
    if (rc) return tq_send_store_error(c, s, rc);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "jobs");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, tq_job_json(&jobs[i]));
    tq_jobs_free(jobs, n);
    if (next > 0) cJSON_AddNumberToObject(o, "next", (double)next);
    else cJSON_AddNullToObject(o, "next");
    return tq_send_json(c, MHD_HTTP_OK, o);
}

enum MHD_Result tq_h_get(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    return send_job(c, s, c->id, MHD_HTTP_OK);
}

/* ---- steps, evals --------------------------------------------------------------------- */

enum MHD_Result tq_h_steps(tq_ctx *c) {
    static const char *const allowed[] = { "after", "limit", "format", NULL };
    CHECK_QUERY(c, allowed);
    enum MHD_Result ans;
    long long after = 0, limit = 100000;
    if (tq_query(c, "after") && tq_query_int(c, "after", 0, INT64_MAX, &after, &ans)) return ans;
    if (tq_query(c, "limit") && tq_query_int(c, "limit", 1, 100000, &limit, &ans)) return ans;
    const char *fmt = tq_query(c, "format");
    if (fmt && strcmp(fmt, "json") && strcmp(fmt, "csv"))
        return tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", "format",
                             "format must be json or csv, got \"%.64s\"", fmt);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    tq_step_rec *v;
    int n;
    int rc = tq_queue_steps(s, c->id, after, (int)limit, &v, &n);
    if (rc) return tq_send_store_error(c, s, rc);
    if (fmt && !strcmp(fmt, "csv")) {
        size_t len = 0;
        char *csv = tq_steps_csv(v, n, &len);
        free(v);
        if (!csv) return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL, "out of memory");
        return tq_send_text(c, MHD_HTTP_OK, "text/csv; charset=utf-8", csv, len);
    }
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "steps");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, tq_step_json(&v[i]));
    free(v);
    return tq_send_json(c, MHD_HTTP_OK, o);
}

enum MHD_Result tq_h_evals(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    tq_eval_rec *v;
    int n;
    int rc = tq_queue_evals(s, c->id, 0, &v, &n);
    if (rc) return tq_send_store_error(c, s, rc);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "evals");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, tq_eval_json(&v[i]));
    free(v);
    return tq_send_json(c, MHD_HTTP_OK, o);
}

/* ---- cancel, delete, model ------------------------------------------------------------ */

enum MHD_Result tq_h_cancel(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    char was[16];
    int rc = tq_queue_cancel(s, c->id, was);
    if (rc == TQ_STORE_ECONFLICT)
        return tq_send_error(c, MHD_HTTP_CONFLICT, "conflict", NULL,
                             "job %lld is already %s: only queued or running jobs can be cancelled",
                             (long long)c->id, was);
    if (rc) return tq_send_store_error(c, s, rc);
    return send_job(c, s, c->id, MHD_HTTP_OK);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    if (remove(path) && errno != ENOENT) fprintf(stderr, "trainq api: removing %s: %s\n", path, strerror(errno));
    return 0;
}

enum MHD_Result tq_h_delete(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    int rc = tq_queue_delete(s, c->id);
    if (rc == TQ_STORE_ECONFLICT)
        return tq_send_error(c, MHD_HTTP_CONFLICT, "conflict", NULL, "%s", tq_store_errmsg(s));
    if (rc) return tq_send_store_error(c, s, rc);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%lld", c->api->jobs_dir, (long long)c->id);
    struct stat st;
    if (c->api->jobs_dir[0] && lstat(dir, &st) == 0) nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    enum MHD_Result ret = MHD_queue_response(c->conn, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result tq_h_model(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    tq_job j;
    int rc = tq_queue_get(s, c->id, &j);
    if (rc < 0) return tq_send_store_error(c, s, rc);
    if (rc == 0) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)c->id);
    tq_job_free(&j);
    char path[1200];
    snprintf(path, sizeof path, "%s/%lld/model.safetensors", c->api->jobs_dir, (long long)c->id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL,
                             "job %lld has no model yet (it is written when the job succeeds)", (long long)c->id);
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) { close(fd); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    char disp[96];
    snprintf(disp, sizeof disp, "attachment; filename=\"job-%lld.safetensors\"", (long long)c->id);
    MHD_add_response_header(r, "Content-Disposition", disp);
    enum MHD_Result ret = MHD_queue_response(c->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- devices, health, metrics --------------------------------------------------------- */

/* the running job (0 none) and its latest step */
static int running_job(tq_store *s, tq_job *out) {
    tq_job *jobs;
    int n;
    int64_t next;
    if (tq_queue_list(s, "running", 0, 1, &jobs, &n, &next)) return -1;
    if (n == 0) { free(jobs); return 0; }
    *out = jobs[0];
    free(jobs);   /* the strings now belong to *out */
    return 1;
}

static void add_job_of(cJSON *d, const char *id, int have, const tq_job *j) {
    if (have && !strcmp(j->device, id)) {
        cJSON_AddNumberToObject(d, "job", (double)j->id);
        if (j->has_latest) cJSON_AddNumberToObject(d, "job_mem_reserved_bytes", (double)j->latest.mem_reserved_bytes);
    } else {
        cJSON_AddNullToObject(d, "job");
    }
}

enum MHD_Result tq_h_devices(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    tq_job j;
    int r = running_job(s, &j);
    if (r < 0) return tq_send_store_error(c, s, TQ_STORE_ERR);
    const tq_api *a = c->api;
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "devices");
    for (int i = 0; i < a->ngpus; i++) {
        const tq_api_gpu *g = &a->gpus[i];
        char id[24];
        snprintf(id, sizeof id, "cuda:%d", g->ordinal);
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "id", id);
        cJSON_AddStringToObject(d, "backend", "cuda");
        cJSON_AddStringToObject(d, "name", g->name);
        cJSON_AddStringToObject(d, "arch", g->arch);
        cJSON_AddNumberToObject(d, "memory_total_bytes", (double)g->total_bytes);
        cJSON_AddNumberToObject(d, "memory_free_bytes", (double)g->free_bytes);
        add_job_of(d, id, r == 1, &j);
        cJSON_AddItemToArray(arr, d);
    }
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "id", "cpu");
    cJSON_AddStringToObject(d, "backend", "cpu");
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    cJSON_AddNumberToObject(d, "memory_total_bytes", (double)pages * psz);
    long long avail = mem_available();
    if (avail >= 0) cJSON_AddNumberToObject(d, "memory_free_bytes", (double)avail);
    else cJSON_AddNullToObject(d, "memory_free_bytes");
    cJSON_AddNumberToObject(d, "threads", (double)sysconf(_SC_NPROCESSORS_ONLN));
    add_job_of(d, "cpu", r == 1, &j);
    cJSON_AddItemToArray(arr, d);
    if (r == 1) tq_job_free(&j);
    cJSON_AddStringToObject(o, "cuda", a->cuda);
    cJSON_AddStringToObject(o, "devices_flag", a->devices);
    return tq_send_json(c, MHD_HTTP_OK, o);
}

enum MHD_Result tq_h_health(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    return tq_send_json(c, MHD_HTTP_OK, o);
}

typedef struct { char *p; size_t n, cap; } mbuf;
__attribute__((format(printf, 2, 3)))
static void mput(mbuf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        size_t room = b->cap - b->n;
        va_start(ap, fmt);
        int k = b->p ? vsnprintf(b->p + b->n, room, fmt, ap) : -1;
        va_end(ap);
        if (k >= 0 && (size_t)k < room) { b->n += (size_t)k; return; }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        char *np = realloc(b->p, nc);
        if (!np) return;
        b->p = np; b->cap = nc;
    }
}

enum MHD_Result tq_h_metrics(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    int64_t counts[5];
    if (tq_queue_counts(s, counts)) return tq_send_store_error(c, s, TQ_STORE_ERR);
    tq_job j;
    int r = running_job(s, &j);
    if (r < 0) return tq_send_store_error(c, s, TQ_STORE_ERR);
    mbuf b = {0};
    mput(&b, "# HELP trainq_jobs Jobs in the database by state.\n# TYPE trainq_jobs gauge\n");
    for (int i = 0; i < 5; i++) mput(&b, "trainq_jobs{state=\"%s\"} %lld\n", tq_queue_states[i], (long long)counts[i]);
    mput(&b, "# HELP trainq_queue_length Jobs waiting to run.\n# TYPE trainq_queue_length gauge\n"
             "trainq_queue_length %lld\n", (long long)counts[0]);
    mput(&b, "# HELP trainq_jobs_finished Finished jobs in the database by outcome (deleting a job "
             "removes it).\n# TYPE trainq_jobs_finished gauge\n");
    for (int i = 2; i < 5; i++)
        mput(&b, "trainq_jobs_finished{outcome=\"%s\"} %lld\n", tq_queue_states[i], (long long)counts[i]);
    mput(&b, "# HELP trainq_running_job The running job's id (0 when none).\n# TYPE trainq_running_job gauge\n"
             "trainq_running_job %lld\n", r == 1 ? (long long)j.id : 0LL);
    if (r == 1 && j.has_latest) {
        const tq_step_rec *l = &j.latest;
        long long id = (long long)j.id;
        mput(&b, "# HELP trainq_running_samples_per_second Throughput of the running job's last step.\n"
                 "# TYPE trainq_running_samples_per_second gauge\n"
                 "trainq_running_samples_per_second{job=\"%lld\"} %.6g\n", id, l->samples_per_s);
        mput(&b, "# HELP trainq_running_step The running job's last recorded step.\n"
                 "# TYPE trainq_running_step gauge\ntrainq_running_step{job=\"%lld\"} %lld\n", id, (long long)l->step);
        mput(&b, "# HELP trainq_running_memory_bytes The running job's memory at its last step.\n"
                 "# TYPE trainq_running_memory_bytes gauge\n"
                 "trainq_running_memory_bytes{job=\"%lld\",kind=\"allocated\"} %lld\n"
                 "trainq_running_memory_bytes{job=\"%lld\",kind=\"peak\"} %lld\n"
                 "trainq_running_memory_bytes{job=\"%lld\",kind=\"reserved\"} %lld\n",
             id, (long long)l->mem_allocated_bytes, id, (long long)l->mem_peak_bytes, id,
             (long long)l->mem_reserved_bytes);
        if (l->device_used_bytes >= 0)
            mput(&b, "trainq_running_memory_bytes{job=\"%lld\",kind=\"device_used\"} %lld\n", id,
                 (long long)l->device_used_bytes);
    }
    if (r == 1) tq_job_free(&j);
    if (!b.p) return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL, "out of memory");
    return tq_send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", b.p, b.n);
}
