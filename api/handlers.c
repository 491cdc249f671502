/* handlers.c — the endpoints of CONTRACT.md's HTTP API (except the event stream: sse.c). */
#include "internal.h"
#include "report.h"
#include "spec.h"
#include "trainer.h"
#include "autobatch.h"
#include "device.h"
#include "codes.h"
#include "peer.h"

#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define NO_STORE(c) tq_send_error((c), MHD_HTTP_SERVICE_UNAVAILABLE, "database_unavailable", NULL, \
                                  "the database cannot be opened")

static const char *const no_params[] = { NULL };

#define CHECK_QUERY(c, allowed) do { enum MHD_Result ans_; \
    if (!tq_query_check((c), (allowed), &ans_)) return ans_; } while (0)

/* ---- owners (peer.h) -------------------------------------------------------------------- */

static int user_exists(const char *name) {
    struct passwd pw, *res = NULL;
    char buf[4096];
    return getpwnam_r(name, &pw, buf, sizeof buf, &res) == 0 && res;
}

/* The job's owner as shown: its user name, or "unknown" (a job from before owners, or from a
 * connection without identity). */
static const char *owner_shown(const tq_job *j) { return j->owner[0] ? j->owner : "unknown"; }

/* 1 when the peer may act on job j (cancel, delete; read it under private_jobs): its owner (by
 * uid), root, or a member of admin_group. Jobs without an owner: admins only. */
static int may_act(const tq_api *a, const tq_peer *p, const tq_job *j) {
    if (!p->known) return 0;
    if (tq_peer_is_admin(p->uid, a->admin_group)) return 1;
    return j->owner[0] && j->owner_uid >= 0 && (uid_t)j->owner_uid == p->uid;
}

/* Writes need a local peer: from another host (no identity) only with allow_remote_writes.
 * 1 allowed; 0 answered. */
static int may_write(tq_ctx *c, const tq_peer *p, enum MHD_Result *ans) {
    if (!p->remote && !p->known) {   /* a local listener whose peer the kernel would not name */
        *ans = tq_send_error(c, MHD_HTTP_UNAUTHORIZED, "unknown_peer", NULL,
                             "the kernel could not say which user is on the other end of this connection "
                             "(SO_PEERCRED / sock_diag failed), so nothing may be changed through it");
        return 0;
    }
    if (!p->remote || c->api->remote_writes) return 1;
    *ans = tq_send_error(c, MHD_HTTP_FORBIDDEN, "forbidden", NULL,
                         "this connection comes from another host, which has no identity: the API is read-only "
                         "for it (allow_remote_writes = true in the config opens it)");
    return 0;
}

/* 403 naming job j's owner and who may VERB it */
static enum MHD_Result forbidden(tq_ctx *c, const tq_peer *p, const tq_job *j, const char *verb) {
    return tq_send_error(c, MHD_HTTP_FORBIDDEN, "forbidden", NULL,
                         "job %lld belongs to %s: only its owner, root or a member of the group %s may %s it%s%s",
                         (long long)j->id, owner_shown(j), c->api->admin_group, verb,
                         p->known ? "; you are " : " (this connection has no identity)", p->known ? p->user : "");
}

/* The job c->id for an action by the peer: 1 and *j (the caller frees it), or 0 answered (404,
 * 403 naming the owner). verb: "cancel", "requeue", "delete", "read". */
static int job_for(tq_ctx *c, tq_store *s, const tq_peer *p, const char *verb, tq_job *j, enum MHD_Result *ans) {
    int rc = tq_queue_get(s, c->id, j);
    if (rc < 0) { *ans = tq_send_store_error(c, s, rc); return 0; }
    if (rc == 0) {
        *ans = tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)c->id);
        return 0;
    }
    if (!strcmp(verb, "read") && !c->api->private_jobs) return 1;
    if (may_act(c->api, p, j)) return 1;
    *ans = forbidden(c, p, j, verb);
    tq_job_free(j);
    return 0;
}

/* The preamble of an action (VERB: "cancel", "requeue", "delete") on job c->id: the store, a
 * peer that may write, the job that peer may VERB. 1 with *s and *j (the caller frees it), or 0
 * answered (503, 401/403, 404). */
static int action_job(tq_ctx *c, const char *verb, tq_store **s, tq_job *j, enum MHD_Result *ans) {
    *s = tq_api_store(c);
    if (!*s) {
        *ans = NO_STORE(c);
        return 0;
    }
    tq_peer peer;
    tq_ctx_peer(c, &peer);
    return may_write(c, &peer, ans) && job_for(c, *s, &peer, verb, j, ans);
}

int tq_may_read_job(tq_ctx *c, const tq_job *j, enum MHD_Result *ans) {
    if (!c->api->private_jobs) return 1;
    tq_peer p;
    tq_ctx_peer(c, &p);
    if (may_act(c->api, &p, j)) return 1;
    *ans = forbidden(c, &p, j, "read");
    return 0;
}

/* for a read: the job is readable by this peer (always, unless private_jobs). 1 yes, 0 answered */
static int may_read(tq_ctx *c, tq_store *s, enum MHD_Result *ans) {
    if (!c->api->private_jobs) return 1;
    tq_peer p;
    tq_ctx_peer(c, &p);
    tq_job j;
    if (!job_for(c, s, &p, "read", &j, ans)) return 0;
    tq_job_free(&j);
    return 1;
}

/* A job as the API shows it: render.c's object plus what placement knows — the CPU threads its
 * worker was given, and for a queued job why it waits (the scheduler's last round). */
static cJSON *job_json(const tq_api *a, const tq_job *j) {
    cJSON *o = tq_job_json(j);
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "owner", owner_shown(j));
    if (j->owner_uid >= 0) cJSON_AddNumberToObject(o, "owner_uid", (double)j->owner_uid);
    else cJSON_AddNullToObject(o, "owner_uid");
    /* the batch as it runs: a "batch_size": "auto" spec keeps "auto" (so that it can be
     * resubmitted as it is), with the accum_steps submission chose; the micro-batch follows */
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(o, "spec");
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(spec, "batch_size");
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(spec, "accum_steps");
    const cJSON *eff = cJSON_GetObjectItemCaseSensitive(spec, "effective_batch");
    if (cJSON_IsNumber(acc) && acc->valuedouble >= 1 && (cJSON_IsNumber(bs) || cJSON_IsNumber(eff))) {
        double micro = cJSON_IsNumber(bs) ? bs->valuedouble : eff->valuedouble / acc->valuedouble;
        cJSON *b = cJSON_AddObjectToObject(o, "batch");
        cJSON_AddNumberToObject(b, "batch_size", micro);
        cJSON_AddNumberToObject(b, "accum_steps", acc->valuedouble);
        cJSON_AddNumberToObject(b, "effective_batch", micro * acc->valuedouble);
        cJSON_AddBoolToObject(b, "auto", cJSON_IsString(bs));
    }
    cJSON_AddNumberToObject(o, "interruptions", j->interruptions);
    cJSON_AddNumberToObject(o, "requeues", j->requeues);
    if (j->requeued_at > 0) {
        char t[32];
        tq_rfc3339(j->requeued_at, t);
        cJSON_AddStringToObject(o, "requeued_at", t);
    } else {
        cJSON_AddNullToObject(o, "requeued_at");
    }
    char log[48];
    snprintf(log, sizeof log, "/v1/jobs/%lld/log", (long long)j->id);
    cJSON_AddStringToObject(o, "log", log);
    if (j->threads > 0) cJSON_AddNumberToObject(o, "threads", j->threads);
    else cJSON_AddNullToObject(o, "threads");
    tq_ledger_wait w;
    int waiting = a->ledger && tq_ledger_wait_of(a->ledger, j->id, &w);
    int finishing = waiting && !strcmp(j->state, "running") && !strcmp(w.reason, "storage");
    cJSON_AddBoolToObject(o, "finishing", finishing);
    if (finishing) {   /* it ended; the database has not taken its end yet */
        cJSON *wf = cJSON_AddObjectToObject(o, "waiting_for");
        cJSON_AddStringToObject(wf, "reason", "storage");
        cJSON_AddStringToObject(wf, "message", w.message);
    } else if (!strcmp(j->state, "queued") && waiting) {
        cJSON *wf = cJSON_AddObjectToObject(o, "waiting_for");
        cJSON_AddStringToObject(wf, "reason", w.reason);
        if (w.device[0]) cJSON_AddStringToObject(wf, "device", w.device);
        else cJSON_AddNullToObject(wf, "device");
        cJSON_AddNumberToObject(wf, "needs_bytes", (double)w.needs);
        cJSON_AddNumberToObject(wf, "free_bytes", (double)w.free);
        if (w.behind > 0) cJSON_AddNumberToObject(wf, "behind", (double)w.behind);
        if (w.message[0]) cJSON_AddStringToObject(wf, "message", w.message);   /* device_busy: why */
        if (!strcmp(w.reason, "dependency")) {   /* the jobs of its after that have not succeeded yet */
            cJSON *af = cJSON_AddArrayToObject(wf, "after");
            for (int k = 0; k < w.nafter && k < 16; k++) cJSON_AddItemToArray(af, cJSON_CreateNumber((double)w.after[k]));
        }
    } else {
        cJSON_AddNullToObject(o, "waiting_for");
    }
    return o;
}

/* The same object for the event stream's last event (sse.c): a stream's "job" is what GET
 * /v1/jobs/{id} answers, not render.c's core of it. */
cJSON *tq_api_job_json(const tq_api *a, const tq_job *j) { return job_json(a, j); }

/* answers the job `id` with `status` (200/201), or 404 */
static enum MHD_Result send_job(tq_ctx *c, tq_store *s, int64_t id, unsigned status) {
    tq_job j;
    int rc = tq_queue_get(s, id, &j);
    if (rc < 0) return tq_send_store_error(c, s, rc);
    if (rc == 0) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)id);
    cJSON *o = job_json(c->api, &j);
    tq_job_free(&j);
    return tq_send_json(c, status, o);
}

/* ---- POST /v1/jobs -------------------------------------------------------------------- */


/* The plan cache's key: the spec as the planner reads it (the same struct, rendered in full),
 * less the fields that cannot change a plan (labels, scheduling, the time limit). Any other
 * difference — recompute, threads, amp, a subset, the data directory, a field added tomorrow —
 * gives another key, so a cached plan is never one of a different spec. malloc'd. */
static char *plan_key(const tq_spec *sp) {
    tq_spec k = *sp;
    memset(k.name, 0, sizeof k.name);
    memset(k.submission_id, 0, sizeof k.submission_id);
    k.priority = 0;
    k.timeout_s = 0;
    return tq_spec_to_json(&k);
}

/* 0 and the plan's bytes; else code/err filled */
static int plan_cached(tq_api *a, const tq_spec *sp, long long *total, long long *data, char *code,
                       size_t cl, char *err, size_t el) {
    enum { N = sizeof a->plans / sizeof a->plans[0] };
    char *key = plan_key(sp);
    if (!key) { snprintf(code, cl, "internal"); snprintf(err, el, "out of memory"); return -1; }
    pthread_mutex_lock(&a->plan_mu);
    for (size_t i = 0; i < N; i++)
        if (a->plans[i].key && !strcmp(a->plans[i].key, key)) {
            *total = a->plans[i].total; *data = a->plans[i].data;
            a->plans[i].stamp = ++a->plan_clock;
            pthread_mutex_unlock(&a->plan_mu);
            free(key);
            return 0;
        }
    pthread_mutex_unlock(&a->plan_mu);
    tq_plan_report rep;
    if (tq_plan_spec(sp, &rep, code, cl, err, el)) { free(key); return -1; }
    *total = (long long)rep.plan.total;
    *data = (long long)rep.plan.data;
    pthread_mutex_lock(&a->plan_mu);
    size_t victim = 0;
    for (size_t i = 0; i < N; i++) {
        if (!a->plans[i].key) { victim = i; break; }
        if (a->plans[i].stamp < a->plans[victim].stamp) victim = i;
    }
    free(a->plans[victim].key);
    a->plans[victim].key = key;
    a->plans[victim].total = *total;
    a->plans[victim].data = *data;
    a->plans[victim].stamp = ++a->plan_clock;
    pthread_mutex_unlock(&a->plan_mu);
    return 0;
}

/* The devices this daemon serves, as the ledger has them now. */
static int ledger_devices(const tq_api *a, tq_ledger_dev *devs) {
    return a->ledger ? tq_ledger_devices(a->ledger, devs, TQ_LEDGER_MAX_DEVICES) : 0;
}

static void served_list(const tq_ledger_dev *devs, int n, char *out, size_t len) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n && k < len; i++)
        k += (size_t)snprintf(out + k, len - k, "%s%s", i ? ", " : "", devs[i].id);
}

/* The bytes placement counts for a job whose training plan is total + data: on the CPU the
 * plan itself; on a GPU also the CUDA context and the bound on cuDNN's workspace (trainer.h). */
static long long need_on(const tq_ledger_dev *d, long long plan) {
    return d->gpu ? plan + TQ_GPU_CONTEXT_BYTES + TQ_GPU_WORKSPACE_BOUND : plan;
}

/* A plan that failed (the data missing or invalid, …): 400 with the planner's code, naming
 * data_dir where it is about the data. */
static enum MHD_Result plan_failed(tq_ctx *c, const char *code, const char *err) {
    const char *field = strstr(code, "data") ? "data_dir" : NULL;
    return tq_send_error(c, MHD_HTTP_BAD_REQUEST, code[0] ? code : "invalid_spec", field, "%s", err);
}

static enum MHD_Result submit_planned(tq_ctx *c, tq_spec *sp, const tq_peer *peer, const char *inputs_json);

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
    tq_peer peer;
    tq_ctx_peer(c, &peer);
    enum MHD_Result ans;
    if (!may_write(c, &peer, &ans)) return ans;
    /* files on behalf of the submitter: what it names must be readable by that user, not
     * merely by the daemon (a connection without identity counts as nobody) */
    uid_t as = peer.known ? peer.uid : (uid_t)65534;
    const struct { const char *path, *field; } files[2] = { { sp.data_dir, "data_dir" }, { sp.init_from, "init_from" } };
    cJSON *inputs = cJSON_CreateArray();
    for (int k = 0; k < 2; k++) {
        if (!files[k].path[0]) continue;
        char real[4096], why[600];
        if (tq_path_readable_by(files[k].path, as, real, sizeof real, why, sizeof why) == 0) {
            /* what the worker will open: the resolved path, and the inode the check saw */
            struct stat fst;
            if (stat(real, &fst) == 0) {
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "field", files[k].field);
                cJSON_AddStringToObject(e, "path", real);
                cJSON_AddNumberToObject(e, "dev", (double)fst.st_dev);
                cJSON_AddNumberToObject(e, "ino", (double)fst.st_ino);
                cJSON_AddItemToArray(inputs, e);
            }
            continue;
        }
        if (access(files[k].path, F_OK) != 0 && k == 0) break;   /* missing data: the planner names it (400) */
        cJSON_Delete(inputs);
        return tq_send_error(c, MHD_HTTP_FORBIDDEN, "forbidden", files[k].field, "%s %s: %s", files[k].field,
                             peer.known ? "must be readable by the submitting user" : "must be readable by anyone "
                             "(this connection has no identity)", why);
    }
    char *inputs_json = cJSON_PrintUnformatted(inputs);
    cJSON_Delete(inputs);
    enum MHD_Result r = submit_planned(c, &sp, &peer, inputs_json);
    cJSON_free(inputs_json);
    return r;
}

static const char *database_state(tq_api *a, tq_store *s, long long *free_bytes);
#define HEALTH_MIN_FREE (256 * 1024)
#define HEALTH_FULL_MS 10000

/* the rest of a submission, once the caller and its files are checked */
static enum MHD_Result submit_planned(tq_ctx *c, tq_spec *spp, const tq_peer *pp, const char *inputs_json) {
    tq_spec sp = *spp;
    const tq_peer peer = *pp;
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    if (sp.submission_id[0]) {   /* idempotency before the (costly) plan */
        int64_t old = tq_queue_find_submission(s, sp.submission_id);
        if (old < 0) return tq_send_store_error(c, s, (int)old);
        if (old > 0) return send_job(c, s, old, MHD_HTTP_OK);
    }
    /* what /healthz calls full refuses new jobs, as it says, even where SQLite could still take
     * the row in pages it has: the job's steps could not be recorded */
    long long free_bytes;
    if (!strcmp(database_state(c->api, s, &free_bytes), "full")) {
        char why[96];
        if (free_bytes >= 0 && free_bytes < HEALTH_MIN_FREE)
            snprintf(why, sizeof why, "%lld bytes free; the queue needs %d", free_bytes, HEALTH_MIN_FREE);
        else
            snprintf(why, sizeof why, "a write failed for a full disk in the last %d s", HEALTH_FULL_MS / 1000);
        return tq_send_error(c, MHD_HTTP_INSUFFICIENT_STORAGE, "storage_full", NULL,
                             "the filesystem of the database %s is full (%s): nothing was written; reads "
                             "still work, writes resume when space is freed", c->api->db_path, why);
    }

    /* "after": every job it runs after must exist (the queue checks again as it inserts) */
    for (int k = 0; k < sp.n_after; k++) {
        tq_job dep;
        int drc = tq_queue_get(s, sp.after[k], &dep);
        if (drc < 0) return tq_send_store_error(c, s, drc);
        if (drc == 0) {
            char field[24];
            snprintf(field, sizeof field, "after[%d]", k);
            return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "invalid_dependency", field,
                                 "after[%d]: there is no job %lld to run after", k, (long long)sp.after[k]);
        }
        tq_job_free(&dep);
    }

    /* where it may run: the one device resolver over the devices this daemon serves */
    tq_ledger_dev devs[TQ_LEDGER_MAX_DEVICES];
    int ndev = ledger_devices(c->api, devs);
    char ids[TQ_LEDGER_MAX_DEVICES][TQ_DEV_ID_MAX];
    for (int i = 0; i < ndev; i++) memcpy(ids[i], devs[i].id, TQ_DEV_ID_MAX);
    tq_devsel want;
    int cand[TQ_LEDGER_MAX_DEVICES], nc = 0;
    if (tq_devsel_parse(sp.device, &want) == 0) nc = tq_devsel_candidates(&want, ids, ndev, cand);
    if (nc == 0) {
        char served[200];
        served_list(devs, ndev, served, sizeof served);
        int gpu_wish = !strncmp(sp.device, "cuda", 4);
        return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "device_unavailable", "device",
                             "the job asks for device \"%s\", but this daemon serves %s (--devices %s)%s%s",
                             sp.device, served[0] ? served : "no device", c->api->devices,
                             gpu_wish && c->api->ngpus == 0 ? "; no GPU: " : "",
                             gpu_wish && c->api->ngpus == 0 ? c->api->cuda : "");
    }

    /* recompute "auto": settled now, from the devices it may use, and stored so: off when
     * they are all the CPU (device "cpu", or "auto" where this daemon serves no GPU), on when
     * they are all GPUs. A job that may run on either (device "auto" on a daemon serving both)
     * keeps "auto" and gets a plan for each kind below: on a GPU with recomputation, on the CPU
     * without (the worker settles it by the device it is placed on, tq_spec_recompute), unless
     * the CPU's plan would not fit its cap or budget: then it is settled on. The plans, the
     * placement and the run then agree. */
    int any_gpu = 0, any_cpu = 0;
    for (int k = 0; k < nc; k++) {
        any_gpu |= devs[cand[k]].gpu;
        any_cpu |= !devs[cand[k]].gpu;
    }
    if (sp.recompute == TQ_RECOMPUTE_AUTO && !(any_gpu && any_cpu)) sp.recompute = any_gpu;

    /* "batch_size": "auto": the largest micro-batch whose plan fits max_memory_mb, else the
     * budget of the device the job prefers (the first candidate: a GPU for auto) */
    char code[32] = "", err[512] = "";
    if (tq_spec_batch_unresolved(&sp)) {
        const tq_ledger_dev *pref = &devs[cand[0]];
        long long cap, extra = 0;
        char cap_name[96];
        if (sp.max_memory_mb > 0) {
            cap = (long long)sp.max_memory_mb << 20;
            snprintf(cap_name, sizeof cap_name, "max_memory_mb %lld", (long long)sp.max_memory_mb);
        } else {
            cap = pref->budget;
            extra = need_on(pref, 0);
            snprintf(cap_name, sizeof cap_name, "the memory budget of %s", pref->id);
        }
        tq_plan_report rep;
        long long need_auto = 0;
        int rc = tq_autobatch_pick(&sp, cap, extra, cap_name, &sp, &rep, &need_auto, code, sizeof code, err, sizeof err);
        if (rc && !strcmp(code, "cannot_fit"))
            return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "cannot_fit",
                                 sp.max_memory_mb > 0 ? "max_memory_mb" : "batch_size", "%s", err);
        if (rc) return plan_failed(c, code, err);
    }

    /* the plan (the one a GPU runs, where recompute is still "auto"; a batch_size "auto" was
     * picked with it too: tq_spec_recompute is on for device "auto") */
    long long total = 0, data = 0;
    if (plan_cached(c->api, &sp, &total, &data, code, sizeof code, err, sizeof err))
        return plan_failed(c, code, err);
    long long cap = sp.max_memory_mb > 0 ? (long long)sp.max_memory_mb * 1048576LL : 0;
    /* the CPU's, without recomputation, where recompute is still "auto"; kept only where it
     * fits the cap and a CPU budget, else the job recomputes everywhere */
    long long total_cpu = total;
    if (sp.recompute == TQ_RECOMPUTE_AUTO) {
        tq_spec keep = sp;
        keep.recompute = 0;
        long long t0 = 0, d0 = 0;
        if (plan_cached(c->api, &keep, &t0, &d0, code, sizeof code, err, sizeof err))
            return plan_failed(c, code, err);
        int cpu_fits = 0;
        for (int k = 0; k < nc; k++)
            cpu_fits |= !devs[cand[k]].gpu && t0 + d0 <= devs[cand[k]].budget && (!cap || t0 + d0 <= cap);
        if (cpu_fits) total_cpu = t0;
        else sp.recompute = 1;
    }
    long long need = total + data, need_cpu = total_cpu + data;
    if (cap && need > cap)
        return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "cannot_fit", "max_memory_mb",
                             "the planned peak is %lld bytes (%.1f MiB: %lld for training + %lld for "
                             "the dataset), over max_memory_mb %lld (%lld bytes)", need,
                             need / 1048576.0, total, data, (long long)sp.max_memory_mb, cap);
    /* a job larger than the budget of every device it may use could never start */
    int fits = 0, big = cand[0];
    for (int k = 0; k < nc; k++) {
        const tq_ledger_dev *d = &devs[cand[k]];
        if (need_on(d, d->gpu ? need : need_cpu) <= d->budget) fits = 1;
        if (d->budget > devs[big].budget) big = cand[k];
    }
    if (!fits) {
        long long nb = need_on(&devs[big], devs[big].gpu ? need : need_cpu);
        return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "cannot_fit", NULL,
                             "the planned peak is %lld bytes (%.1f MiB%s), more than the memory budget of %s, "
                             "%lld bytes (%.1f MiB), the largest of the devices it may use",
                             nb, nb / 1048576.0, devs[big].gpu ? " with the CUDA context and workspace" : "",
                             devs[big].id, devs[big].budget, devs[big].budget / 1048576.0);
    }
    char *spec_json = tq_spec_to_json(&sp);
    if (!spec_json) return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL, "out of memory");
    int64_t id = 0;
    int existed = 0;
    tq_job_plan plan = { total, need_cpu, need + TQ_GPU_CONTEXT_BYTES + TQ_GPU_WORKSPACE_BOUND };
    int rc = tq_queue_submit_as(s, sp.name, spec_json, sp.priority, sp.submission_id, &plan,
                                peer.known ? peer.user : NULL, peer.known ? (int64_t)peer.uid : -1,
                                inputs_json && strcmp(inputs_json, "[]") ? inputs_json : NULL, &id, &existed);
    free(spec_json);
    if (rc == TQ_STORE_EDEPENDENCY) {   /* a job of after was deleted since the check above */
        char field[24] = "";
        int k;
        if (sscanf(tq_store_errmsg(s), "after[%d]", &k) == 1) snprintf(field, sizeof field, "after[%d]", k);
        return tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "invalid_dependency", field[0] ? field : NULL,
                             "%s", tq_store_errmsg(s));
    }
    if (rc) return tq_send_store_error(c, s, rc);
    return send_job(c, s, id, existed ? MHD_HTTP_OK : MHD_HTTP_CREATED);
}

/* ---- GET /v1/jobs, /v1/jobs/{id} ------------------------------------------------------ */

enum MHD_Result tq_h_list(tq_ctx *c) {
    static const char *const allowed[] = { "state", "limit", "before", "owner", NULL };
    CHECK_QUERY(c, allowed);
    tq_peer peer;
    tq_ctx_peer(c, &peer);
    /* ?owner=me (the caller), NAME, or unknown (jobs without an owner); under private_jobs a
     * non-admin sees only their own */
    const char *owner = tq_query(c, "owner");
    char me[64];
    if (owner && !strcmp(owner, "me")) {
        if (!peer.known)
            return tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", "owner",
                                 "owner=me: this connection has no identity (use the unix socket or loopback)");
        snprintf(me, sizeof me, "%s", peer.user);
        owner = me;
    } else if (owner && !strcmp(owner, "unknown")) {
        owner = "";
    } else if (owner && (!owner[0] || strlen(owner) > 63)) {
        return tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", "owner",
                             "owner must be me, unknown or a user name of at most 63 bytes");
    } else if (owner && !user_exists(owner)) {
        tq_user_usage *u = NULL;   /* a user gone since, who still owns jobs, is fine */
        int nu = 0, found = 0;
        tq_store *st = tq_api_store(c);
        if (st && tq_queue_users(st, 0, &u, &nu) == 0)
            for (int i = 0; i < nu; i++) found |= !strcmp(u[i].owner, owner);
        free(u);
        if (!found)
            return tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", "owner",
                                 "owner \"%.63s\": no such user on this machine", owner);
    }
    if (c->api->private_jobs && !(peer.known && tq_peer_is_admin(peer.uid, c->api->admin_group))) {
        if (!peer.known) return tq_send_error(c, MHD_HTTP_FORBIDDEN, "forbidden", NULL,
                                              "jobs are private here, and this connection has no identity");
        if (owner && strcmp(owner, peer.user))
            return tq_send_error(c, MHD_HTTP_FORBIDDEN, "forbidden", "owner",
                                 "jobs are private here: you (%s) may list only your own", peer.user);
        snprintf(me, sizeof me, "%s", peer.user);
        owner = me;
    }
    enum MHD_Result ans;
    const char *state = tq_query(c, "state");
    if (state) {
        tq_job_state k;
        if (tq_state_parse(state, &k))
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
    int rc = tq_queue_list_owned(s, state, owner, before, (int)limit, &jobs, &n, &next);
    if (rc) return tq_send_store_error(c, s, rc);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "jobs");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, job_json(c->api, &jobs[i]));
    tq_jobs_free(jobs, n);
    if (next > 0) cJSON_AddNumberToObject(o, "next", (double)next);
    else cJSON_AddNullToObject(o, "next");
    return tq_send_json(c, MHD_HTTP_OK, o);
}

enum MHD_Result tq_h_get(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    enum MHD_Result ans;
    if (!may_read(c, s, &ans)) return ans;
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
    if (!may_read(c, s, &ans)) return ans;
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
    enum MHD_Result ans;
    if (!may_read(c, s, &ans)) return ans;
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
    tq_store *s;
    enum MHD_Result ans;
    tq_job j;
    if (!action_job(c, "cancel", &s, &j, &ans)) return ans;
    tq_job_free(&j);
    char was[16];
    int rc = tq_queue_cancel(s, c->id, was);
    if (rc == TQ_STORE_ECONFLICT)
        return tq_send_error(c, MHD_HTTP_CONFLICT, "conflict", NULL,
                             "job %lld is already %s: only queued or running jobs can be cancelled",
                             (long long)c->id, was);
    if (rc) return tq_send_store_error(c, s, rc);
    return send_job(c, s, c->id, MHD_HTTP_OK);
}

/* ---- POST /v1/jobs/{id}/requeue -------------------------------------------------------- */

/* Whether job j may go back to the queue: 1, or 0 answered — 409 for a state or a failure that
 * a requeue cannot help, 422 when the devices this daemon serves now cannot run it (what
 * submission checks). */
static int requeue_allowed(tq_ctx *c, const tq_job *j, enum MHD_Result *ans) {
    long long id = (long long)j->id;
    if (!strcmp(j->state, "queued") || !strcmp(j->state, "running")) {
        *ans = tq_send_error(c, MHD_HTTP_CONFLICT, "not_finished", NULL,
                             "job %lld is %s: only a failed or cancelled job can be requeued%s", id, j->state,
                             !strcmp(j->state, "running") ? " (to restart it, cancel it and requeue it: it resumes "
                             "from the checkpoint the cancel writes)" : "");
        return 0;
    }
    if (!strcmp(j->state, "succeeded")) {
        *ans = tq_send_error(c, MHD_HTTP_CONFLICT, "already_succeeded", NULL,
                             "job %lld succeeded: there is nothing to resume (its model is GET /v1/jobs/%lld/model); "
                             "submit its spec again to train it anew", id, id);
        return 0;
    }
    /* failures that would only repeat: the spec or its inputs, not the run, are at fault */
    static const struct { const char *code, *why; } permanent[] = {
        { "invalid_spec", "its stored spec cannot run; submit a corrected spec" },
        { "memory_limit", "its plan is over its max_memory_mb, which a requeue does not change; submit it "
                          "again with a larger max_memory_mb" },
        { "input_changed", "its data_dir or init_from is no longer the file submission checked for its owner; "
                           "submit it again to have the file checked" },
    };
    for (size_t k = 0; k < sizeof permanent / sizeof permanent[0]; k++)
        if (!strcmp(j->error_code, permanent[k].code)) {
            *ans = tq_send_error(c, MHD_HTTP_CONFLICT, "not_requeueable", NULL,
                                 "job %lld failed with %s, which a requeue would repeat: %s", id, j->error_code,
                                 permanent[k].why);
            return 0;
        }
    tq_spec sp;
    tq_spec_err se;
    if (!j->spec || tq_spec_parse(&sp, j->spec, &se)) {
        *ans = tq_send_error(c, MHD_HTTP_CONFLICT, "not_requeueable", NULL,
                             "job %lld cannot run again: its stored spec is invalid (%s: %s); submit a corrected spec",
                             id, j->spec ? se.field : "spec", j->spec ? se.message : "missing");
        return 0;
    }
    /* the devices served now (the daemon may have restarted with others, or smaller budgets) */
    tq_ledger_dev devs[TQ_LEDGER_MAX_DEVICES];
    int ndev = ledger_devices(c->api, devs);
    if (ndev == 0) return 1;
    char ids[TQ_LEDGER_MAX_DEVICES][TQ_DEV_ID_MAX];
    for (int i = 0; i < ndev; i++) memcpy(ids[i], devs[i].id, TQ_DEV_ID_MAX);
    tq_devsel want;
    int cand[TQ_LEDGER_MAX_DEVICES], nc = 0;
    if (tq_devsel_parse(sp.device, &want) == 0) nc = tq_devsel_candidates(&want, ids, ndev, cand);
    if (nc == 0) {
        char served[200];
        served_list(devs, ndev, served, sizeof served);
        *ans = tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "device_unavailable", "device",
                             "job %lld asks for device \"%s\", but this daemon serves %s (--devices %s)", id,
                             sp.device, served[0] ? served : "no device", c->api->devices);
        return 0;
    }
    int fits = 0, known = 0, big = cand[0];
    for (int k = 0; k < nc; k++) {
        const tq_ledger_dev *d = &devs[cand[k]];
        long long need = d->gpu ? j->planned_gpu_bytes : j->planned_cpu_bytes;
        if (need < 0) continue;   /* a job from before plans were kept: placement decides */
        known = 1;
        if (need <= d->budget) fits = 1;
        if (d->budget > devs[big].budget) big = cand[k];
    }
    if (known && !fits) {
        long long need = devs[big].gpu ? j->planned_gpu_bytes : j->planned_cpu_bytes;
        *ans = tq_send_error(c, MHD_HTTP_UNPROCESSABLE_CONTENT, "cannot_fit", NULL,
                             "job %lld plans %lld bytes (%.1f MiB), more than the memory budget of %s, %lld bytes "
                             "(%.1f MiB), the largest of the devices it may use", id, need, need / 1048576.0,
                             devs[big].id, devs[big].budget, devs[big].budget / 1048576.0);
        return 0;
    }
    return 1;
}

enum MHD_Result tq_h_requeue(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s;
    enum MHD_Result ans;
    tq_job j;
    if (!action_job(c, "requeue", &s, &j, &ans)) return ans;
    int ok = requeue_allowed(c, &j, &ans);
    int damaged = ok && !strcmp(j.error_code, "invalid_checkpoint");
    tq_job_free(&j);
    if (!ok) return ans;
    if (damaged && c->api->jobs_dir[0]) {
        /* a checkpoint resume cannot read: kept aside, and the job starts again from step 0 (its
         * recorded steps are recomputed, and each stays recorded once) */
        char from[1200], to[1300];
        snprintf(from, sizeof from, "%s/%lld/checkpoint.safetensors", c->api->jobs_dir, (long long)c->id);
        snprintf(to, sizeof to, "%s.damaged", from);
        if (rename(from, to) && errno != ENOENT)
            return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL,
                                 "job %lld: cannot move its damaged checkpoint %s aside: %s", (long long)c->id, from,
                                 strerror(errno));
    }
    char was[16];
    int rc = tq_queue_requeue_finished(s, c->id, was);
    if (rc == TQ_STORE_ECONFLICT)   /* it changed since the checks above */
        return tq_send_error(c, MHD_HTTP_CONFLICT, !strcmp(was, "succeeded") ? "already_succeeded" : "not_finished",
                             NULL, "%s", tq_store_errmsg(s));
    if (rc == TQ_STORE_EDEPENDENCY)
        return tq_send_error(c, MHD_HTTP_CONFLICT, "dependency_failed", "after", "%s", tq_store_errmsg(s));
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
    tq_store *s;
    enum MHD_Result ans;
    tq_job j;
    if (!action_job(c, "delete", &s, &j, &ans)) return ans;
    tq_job_free(&j);
    int rc = tq_queue_delete(s, c->id);
    if (rc == TQ_STORE_ECONFLICT)
        return tq_send_error(c, MHD_HTTP_CONFLICT, "conflict", NULL, "%s", tq_store_errmsg(s));
    if (rc) return tq_send_store_error(c, s, rc);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%lld", c->api->jobs_dir, (long long)c->id);
    struct stat st;
    if (c->api->jobs_dir[0] && lstat(dir, &st) == 0) nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    return tq_send_response(c, MHD_HTTP_NO_CONTENT, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT),
                            NULL);
}

enum MHD_Result tq_h_model(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    enum MHD_Result ans;
    if (!may_read(c, s, &ans)) return ans;
    tq_job j;
    int rc = tq_queue_get(s, c->id, &j);
    if (rc < 0) return tq_send_store_error(c, s, rc);
    if (rc == 0) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)c->id);
    char path[1200];
    snprintf(path, sizeof path, "%s/%lld/model.safetensors", c->api->jobs_dir, (long long)c->id);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        /* no model: not yet (404: it may come), or never in this state (409: requeue it) */
        long long id = (long long)c->id, step = j.has_latest ? (long long)j.latest.step : 0;
        enum MHD_Result r;
        if (!strcmp(j.state, "cancelled"))
            r = tq_send_error(c, MHD_HTTP_CONFLICT, "no_model", NULL,
                              "job %lld was cancelled at step %lld; it will never have a model — requeue it to "
                              "finish (POST /v1/jobs/%lld/requeue resumes it from its checkpoint)", id, step, id);
        else if (!strcmp(j.state, "failed"))
            r = tq_send_error(c, MHD_HTTP_CONFLICT, "no_model", NULL,
                              "job %lld failed at step %lld (%s: %.300s); it will never have a model — requeue it "
                              "to try again from its checkpoint (POST /v1/jobs/%lld/requeue)", id, step,
                              j.error_code[0] ? j.error_code : "no error code",
                              j.error_message ? j.error_message : "no message", id);
        else if (!strcmp(j.state, "succeeded"))
            r = tq_send_error(c, MHD_HTTP_NOT_FOUND, "no_model", NULL,
                              "job %lld succeeded, but its model file %s is gone (removed by hand?)", id, path);
        else
            r = tq_send_error(c, MHD_HTTP_NOT_FOUND, "no_model", NULL,
                              "job %lld is %s (step %lld): not yet — its model is written when it succeeds", id,
                              j.state, step);
        tq_job_free(&j);
        return r;
    }
    tq_job_free(&j);
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) { close(fd); return MHD_NO; }
    char disp[96];
    snprintf(disp, sizeof disp, "attachment; filename=\"job-%lld.safetensors\"", (long long)c->id);
    MHD_add_response_header(r, "Content-Disposition", disp);
    return tq_send_response(c, MHD_HTTP_OK, r, "application/octet-stream");
}

/* GET /v1/jobs/{id}/log: the job's worker output (jobs/<id>/log, kept under 1 MiB by the
 * supervisor; the part before the last rotation is in log.1, which ?previous=1 serves).
 * ?follow=1 keeps the answer open and sends what the worker writes until the job ends. */
enum MHD_Result tq_h_log(tq_ctx *c) {
    static const char *const allowed[] = { "follow", "previous", NULL };
    CHECK_QUERY(c, allowed);
    enum MHD_Result ans;
    long long follow = 0, previous = 0;
    if (tq_query(c, "follow") && tq_query_int(c, "follow", 0, 1, &follow, &ans)) return ans;
    if (tq_query(c, "previous") && tq_query_int(c, "previous", 0, 1, &previous, &ans)) return ans;
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    if (!may_read(c, s, &ans)) return ans;
    tq_job j;
    int rc = tq_queue_get(s, c->id, &j);
    if (rc < 0) return tq_send_store_error(c, s, rc);
    if (rc == 0) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)c->id);
    int live = !tq_state_name_final(j.state);
    tq_job_free(&j);
    char path[1200];
    snprintf(path, sizeof path, "%s/%lld/log%s", c->api->jobs_dir, (long long)c->id, previous ? ".1" : "");
    if (follow && !previous && live) return tq_log_follow(c, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "job %lld has no %slog yet (it is written "
                             "from its first start)", (long long)c->id, previous ? "rotated " : "");
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) { close(fd); return MHD_NO; }
    return tq_send_response(c, MHD_HTTP_OK, r, "text/plain; charset=utf-8");
}

/* GET /v1/users: each owner's queued and running jobs and device time (the fair share's
 * window and all time). Jobs without an owner are listed as "unknown". */
enum MHD_Result tq_h_users(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    tq_user_usage *u;
    int n;
    int64_t win = (int64_t)(c->api->fair_window_s * 1000);
    int rc = tq_queue_users(s, win, &u, &n);
    if (rc) return tq_send_store_error(c, s, rc);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "users");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "user", u[i].owner[0] ? u[i].owner : "unknown");
        if (u[i].owner_uid >= 0) cJSON_AddNumberToObject(e, "uid", (double)u[i].owner_uid);
        else cJSON_AddNullToObject(e, "uid");
        cJSON_AddNumberToObject(e, "queued", u[i].queued);
        cJSON_AddNumberToObject(e, "running", u[i].running);
        cJSON_AddNumberToObject(e, "device_hours_window", u[i].window_s / 3600.0);
        cJSON_AddNumberToObject(e, "device_hours_total", u[i].total_s / 3600.0);
        cJSON_AddItemToArray(arr, e);
    }
    free(u);
    cJSON_AddNumberToObject(o, "fair_share_window_s", c->api->fair_window_s);
    return tq_send_json(c, MHD_HTTP_OK, o);
}

/* ---- devices, health, metrics --------------------------------------------------------- */

/* The running jobs (at most max) with their latest steps; *n of them, malloc'd (tq_jobs_free). */
static int running_jobs(tq_store *s, tq_job **jobs, int *n) {
    int64_t next;
    return tq_queue_list(s, "running", 0, 1000, jobs, n, &next);
}

static const tq_job *find_job(const tq_job *jobs, int n, int64_t id) {
    for (int i = 0; i < n; i++) if (jobs[i].id == id) return &jobs[i];
    return NULL;
}

enum MHD_Result tq_h_devices(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    tq_store *s = tq_api_store(c);
    if (!s) return NO_STORE(c);
    tq_job *run;
    int nrun;
    int rc = running_jobs(s, &run, &nrun);
    if (rc) return tq_send_store_error(c, s, rc);
    const tq_api *a = c->api;
    tq_ledger_dev devs[TQ_LEDGER_MAX_DEVICES];
    int ndev = ledger_devices(a, devs);
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "devices");
    for (int i = 0; i < ndev; i++) {
        const tq_ledger_dev *v = &devs[i];
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "id", v->id);
        cJSON_AddStringToObject(d, "backend", v->gpu ? "cuda" : "cpu");
        const tq_api_gpu *g = NULL;
        for (int k = 0; v->gpu && k < a->ngpus; k++)
            if (a->gpus[k].ordinal == atoi(v->id + 5)) g = &a->gpus[k];
        if (g) {
            cJSON_AddStringToObject(d, "name", g->name);
            cJSON_AddStringToObject(d, "arch", g->arch);
            if (g->pci_bus_id[0]) cJSON_AddStringToObject(d, "pci_bus_id", g->pci_bus_id);
            cJSON_AddStringToObject(d, "compute_mode", tq_compute_mode_name(g->compute_mode));
        }
        cJSON_AddNumberToObject(d, "memory_total_bytes", (double)v->total_bytes);
        if (v->gpu) {
            long long f = v->driver_free >= 0 ? v->driver_free : g ? g->free_bytes : -1;
            if (f >= 0) cJSON_AddNumberToObject(d, "memory_free_bytes", (double)f);
            else cJSON_AddNullToObject(d, "memory_free_bytes");
            if (v->driver_used >= 0) cJSON_AddNumberToObject(d, "driver_used_bytes", (double)v->driver_used);
            else cJSON_AddNullToObject(d, "driver_used_bytes");
            cJSON_AddNumberToObject(d, "reserve_bytes", (double)v->reserve_bytes);
        } else {
            long long avail = tq_host_mem_available();
            if (avail >= 0) cJSON_AddNumberToObject(d, "memory_free_bytes", (double)avail);
            else cJSON_AddNullToObject(d, "memory_free_bytes");
            cJSON_AddNumberToObject(d, "threads", v->cores);
        }
        cJSON_AddNumberToObject(d, "budget_bytes", (double)v->budget);
        cJSON_AddNumberToObject(d, "planned_bytes", (double)v->planned);
        long long room = v->budget - v->planned;
        cJSON_AddNumberToObject(d, "free_planned_bytes", (double)(room > 0 ? room : 0));
        cJSON_AddNumberToObject(d, "max_jobs", v->max_jobs);
        cJSON_AddNumberToObject(d, "running_jobs", v->njobs);
        if (v->busy[0]) cJSON_AddStringToObject(d, "busy", v->busy);
        else cJSON_AddNullToObject(d, "busy");
        cJSON *js = cJSON_AddArrayToObject(d, "jobs");
        for (int k = 0; k < v->njobs && k < TQ_LEDGER_MAX_JOBS; k++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "id", (double)v->jobs[k].id);
            cJSON_AddNumberToObject(e, "planned_bytes", (double)v->jobs[k].bytes);
            if (v->jobs[k].threads > 0) cJSON_AddNumberToObject(e, "threads", v->jobs[k].threads);
            const tq_job *j = find_job(run, nrun, v->jobs[k].id);
            if (j && j->has_latest) {
                cJSON_AddNumberToObject(e, "mem_reserved_bytes", (double)j->latest.mem_reserved_bytes);
                cJSON_AddNumberToObject(e, "samples_per_s", j->latest.samples_per_s);
            }
            cJSON_AddItemToArray(js, e);
        }
        /* "job": the first running job (the field of the one-job-at-a-time daemon) */
        if (v->njobs > 0) cJSON_AddNumberToObject(d, "job", (double)v->jobs[0].id);
        else cJSON_AddNullToObject(d, "job");
        cJSON_AddItemToArray(arr, d);
    }
    tq_jobs_free(run, nrun);
    cJSON_AddStringToObject(o, "cuda", a->cuda);
    cJSON_AddStringToObject(o, "devices_flag", a->devices);
    return tq_send_json(c, MHD_HTTP_OK, o);
}

/* Whether the queue can take a job now: "writable", "read_only" (a read-only filesystem or a
 * file the daemon may not write), "full" (under HEALTH_MIN_FREE bytes free on its filesystem,
 * or a write failed for a full disk in the last HEALTH_FULL_MS), "unavailable" (it cannot be
 * opened). Reads work in every state but the last. */
static const char *database_state(tq_api *a, tq_store *s, long long *free_bytes) {
    *free_bytes = -1;
    if (!s) return "unavailable";
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", a->db_path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    struct statvfs vf;
    if (statvfs(dir, &vf) == 0) {
        *free_bytes = (long long)vf.f_bavail * (long long)vf.f_frsize;
        if (vf.f_flag & ST_RDONLY) return "read_only";
    }
    if (access(a->db_path, W_OK) != 0 && errno != ENOENT) return "read_only";
    if (access(dir, W_OK) != 0) return "read_only";
    long long last = __atomic_load_n(&a->storage_fault_ms, __ATOMIC_RELAXED);
    if ((*free_bytes >= 0 && *free_bytes < HEALTH_MIN_FREE) || (last > 0 && (long long)time(NULL) * 1000 - last < HEALTH_FULL_MS))
        return "full";
    return "writable";
}

enum MHD_Result tq_h_health(tq_ctx *c) {
    CHECK_QUERY(c, no_params);
    long long free_bytes;
    const char *db = database_state(c->api, tq_api_store(c), &free_bytes);
    int ok = !strcmp(db, "writable");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", ok ? "ok" : "degraded");
    cJSON_AddStringToObject(o, "database", db);
    cJSON_AddStringToObject(o, "database_path", c->api->db_path);
    if (free_bytes >= 0) cJSON_AddNumberToObject(o, "free_bytes", (double)free_bytes);
    if (!ok)
        cJSON_AddStringToObject(o, "message", !strcmp(db, "full")
                                ? "the database's filesystem is full: new jobs are refused (507) until space is freed; reads work"
                                : "the database cannot be written: new jobs are refused (503); reads work");
    return tq_send_json(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, o);
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
    int64_t counts[TQ_STATE_COUNT];
    if (tq_queue_counts(s, counts)) return tq_send_store_error(c, s, TQ_STORE_ERR);
    tq_job *run;
    int nrun;
    int rrc = running_jobs(s, &run, &nrun);
    if (rrc) return tq_send_store_error(c, s, rrc);
    mbuf b = {0};
    mput(&b, "# HELP trainq_jobs Jobs in the database by state.\n# TYPE trainq_jobs gauge\n");
    for (int i = 0; i < TQ_STATE_COUNT; i++)
        mput(&b, "trainq_jobs{state=\"%s\"} %lld\n", tq_state_name((tq_job_state)i), (long long)counts[i]);
    mput(&b, "# HELP trainq_queue_length Jobs waiting to run.\n# TYPE trainq_queue_length gauge\n"
             "trainq_queue_length %lld\n", (long long)counts[TQ_STATE_QUEUED]);
    mput(&b, "# HELP trainq_jobs_finished Finished jobs in the database by outcome (deleting a job "
             "removes it).\n# TYPE trainq_jobs_finished gauge\n");
    for (int i = 0; i < TQ_STATE_COUNT; i++)
        if (tq_state_is_final((tq_job_state)i))
            mput(&b, "trainq_jobs_finished{outcome=\"%s\"} %lld\n", tq_state_name((tq_job_state)i), (long long)counts[i]);
    mput(&b, "# HELP trainq_running_jobs Jobs running now.\n# TYPE trainq_running_jobs gauge\n"
             "trainq_running_jobs %d\n", nrun);
    mput(&b, "# HELP trainq_running_job The oldest running job's id (0 when none).\n# TYPE trainq_running_job gauge\n"
             "trainq_running_job %lld\n", nrun ? (long long)run[nrun - 1].id : 0LL);
    tq_ledger_dev devs[TQ_LEDGER_MAX_DEVICES];
    int ndev = ledger_devices(c->api, devs);
    mput(&b, "# HELP trainq_device_budget_bytes Memory jobs may plan on the device.\n"
             "# TYPE trainq_device_budget_bytes gauge\n");
    for (int i = 0; i < ndev; i++) mput(&b, "trainq_device_budget_bytes{device=\"%s\"} %lld\n", devs[i].id, devs[i].budget);
    mput(&b, "# HELP trainq_device_planned_bytes Sum of the planned peaks of the jobs running on the device.\n"
             "# TYPE trainq_device_planned_bytes gauge\n");
    for (int i = 0; i < ndev; i++) mput(&b, "trainq_device_planned_bytes{device=\"%s\"} %lld\n", devs[i].id, devs[i].planned);
    mput(&b, "# HELP trainq_device_running_jobs Jobs running on the device.\n# TYPE trainq_device_running_jobs gauge\n");
    for (int i = 0; i < ndev; i++) mput(&b, "trainq_device_running_jobs{device=\"%s\"} %d\n", devs[i].id, devs[i].njobs);
    mput(&b, "# HELP trainq_device_max_jobs Jobs the device may run at once.\n# TYPE trainq_device_max_jobs gauge\n");
    for (int i = 0; i < ndev; i++) mput(&b, "trainq_device_max_jobs{device=\"%s\"} %d\n", devs[i].id, devs[i].max_jobs);
    int any = 0;
    for (int i = 0; i < ndev; i++) any |= devs[i].gpu && devs[i].driver_used >= 0;
    if (any) {
        mput(&b, "# HELP trainq_device_driver_used_bytes GPU memory in use as the driver reports it.\n"
                 "# TYPE trainq_device_driver_used_bytes gauge\n");
        for (int i = 0; i < ndev; i++)
            if (devs[i].gpu && devs[i].driver_used >= 0)
                mput(&b, "trainq_device_driver_used_bytes{device=\"%s\"} %lld\n", devs[i].id, devs[i].driver_used);
    }
    int have_steps = 0;
    for (int i = 0; i < nrun; i++) have_steps |= run[i].has_latest;
    if (have_steps) {
        mput(&b, "# HELP trainq_running_samples_per_second Throughput of a running job's last step.\n"
                 "# TYPE trainq_running_samples_per_second gauge\n");
        for (int i = 0; i < nrun; i++)
            if (run[i].has_latest)
                mput(&b, "trainq_running_samples_per_second{job=\"%lld\",device=\"%s\"} %.6g\n", (long long)run[i].id,
                     run[i].device, run[i].latest.samples_per_s);
        mput(&b, "# HELP trainq_running_step A running job's last recorded step.\n# TYPE trainq_running_step gauge\n");
        for (int i = 0; i < nrun; i++)
            if (run[i].has_latest)
                mput(&b, "trainq_running_step{job=\"%lld\"} %lld\n", (long long)run[i].id, (long long)run[i].latest.step);
        mput(&b, "# HELP trainq_running_memory_bytes A running job's memory at its last step.\n"
                 "# TYPE trainq_running_memory_bytes gauge\n");
        for (int i = 0; i < nrun; i++) {
            if (!run[i].has_latest) continue;
            const tq_step_rec *l = &run[i].latest;
            long long id = (long long)run[i].id;
            mput(&b, "trainq_running_memory_bytes{job=\"%lld\",kind=\"allocated\"} %lld\n"
                     "trainq_running_memory_bytes{job=\"%lld\",kind=\"peak\"} %lld\n"
                     "trainq_running_memory_bytes{job=\"%lld\",kind=\"reserved\"} %lld\n",
                 id, (long long)l->mem_allocated_bytes, id, (long long)l->mem_peak_bytes, id,
                 (long long)l->mem_reserved_bytes);
            if (l->device_used_bytes >= 0)
                mput(&b, "trainq_running_memory_bytes{job=\"%lld\",kind=\"device_used\"} %lld\n", id,
                     (long long)l->device_used_bytes);
        }
    }
    tq_jobs_free(run, nrun);
    tq_user_usage *users;
    int nusers;
    if (tq_queue_users(s, 0, &users, &nusers) == 0) {
        mput(&b, "# HELP trainq_user_device_seconds_total Device time of each owner's jobs (first start to end).\n"
                 "# TYPE trainq_user_device_seconds_total counter\n");
        for (int i = 0; i < nusers; i++)
            mput(&b, "trainq_user_device_seconds_total{user=\"%s\"} %.3f\n", users[i].owner[0] ? users[i].owner : "unknown",
                 users[i].total_s);
        free(users);
    }
    if (!b.p) return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL, "out of memory");
    return tq_send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", b.p, b.n);
}
