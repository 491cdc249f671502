/* queue.c — the job queue (see queue.h). */
#include "queue.h"
#include "store_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* statement slots of tq__stmt */
enum {
    Q_FIND_SUB, Q_INSERT, Q_GET, Q_LIST_ALL, Q_LIST_STATE, Q_POS, Q_COUNTS, Q_STEPS,
    Q_EVALS, Q_STATE, Q_CANCEL_QUEUED, Q_CANCEL_RUNNING, Q_CANCEL_FLAG, Q_DELETE, Q_PROGRESS,
    Q_CKPT, Q_FINISH, Q_REQUEUE, Q_RECOVER_FAIL, Q_RECOVER_QUEUE, Q_EVENT, Q_EVENT_STATE,
    Q_EVENTS, Q_RECOVER_LIST, Q_BEGIN_READ, Q_END_READ, Q_EXISTS, Q_TOMBSTONE, Q_QUEUED,
    Q_CLAIM_JOB, Q_FAIL_QUEUED, Q_LIST_OWNED, Q_QUEUED_FAIR, Q_USERS, Q_BLOCKED, Q_FAIL_DEP,
    Q_DEP_EXISTS, Q_BAD_DEP, Q_REQUEUE_EVENT, Q_REQUEUE_JOB, Q_BUSY_JOB, Q_BUSY_EVENT,
};

/* The job columns, then its queue position, then the latest step's columns. */
#define JOB_COLS                                                                              \
    "j.id, j.name, j.state, j.spec, j.priority, j.submission_id, j.created_at, j.started_at, " \
    "j.finished_at, j.attempts, j.max_attempts, j.device, j.total_steps, j.summary, "          \
    "j.error_code, j.error_message, j.planned_peak_bytes, j.cancel_requested, "                \
    "CASE WHEN j.state = 'queued' THEN (SELECT count(*) FROM jobs q WHERE q.state = 'queued' " \
    "AND (q.priority > j.priority OR (q.priority = j.priority AND q.id <= j.id))) ELSE 0 END, " \
    "s.step, s.epoch, s.loss, s.lr, s.loss_scale, s.skipped, s.step_ms, s.samples_per_s, "      \
    "s.mem_allocated_bytes, s.mem_peak_bytes, s.mem_reserved_bytes, s.device_used_bytes, s.time, " \
    "j.planned_cpu_bytes, j.planned_gpu_bytes, j.threads, j.interruptions, j.owner, j.owner_uid, j.inputs, " \
    "j.requeues, j.requeued_at "
#define JOB_FROM                                                                              \
    "FROM jobs j LEFT JOIN steps s ON s.job_id = j.id AND s.step = "                          \
    "(SELECT max(step) FROM steps WHERE job_id = j.id) "
/* a claim: running on the device ?D (first start kept), one more attempt, the step it starts
 * from; ?T the time */
#define CLAIM_SET(T, D) "state = 'running', started_at = coalesce(started_at, " T "), attempts = attempts + 1, " \
    "cancel_requested = 0, device = " D ", finished_at = NULL, start_step = " LAST_STEP
/* the job's last recorded step (0 none), inside an UPDATE of jobs */
#define LAST_STEP "coalesce((SELECT max(step) FROM steps WHERE job_id = jobs.id), 0)"
/* BACK_TO_QUEUE_SET: a running job back to the queue — or to 'cancelled' when a cancel was
 * pending, which a restart or a requeue must not forget. An interruption (the daemon stopped or
 * died under a running job, INTERRUPT_SET) is that, counted in interruptions; the start counts against max_attempts only when it made no progress (no step
 * recorded beyond the one it started from). ?2: now (ms). */
#define BACK_TO_QUEUE_SET                                                                      \
    "state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "                  \
    "finished_at = CASE WHEN cancel_requested THEN ?2 ELSE NULL END, "                          \
    "summary = CASE WHEN cancel_requested THEN json_object('state', 'cancelled', 'steps', "     \
    LAST_STEP ") ELSE summary END, "
#define INTERRUPT_SET                                                                          \
    BACK_TO_QUEUE_SET                                                                          \
    "interruptions = interruptions + 1, "                                                      \
    "attempts = CASE WHEN " LAST_STEP " > start_step AND attempts > 0 THEN attempts - 1 "      \
    "ELSE attempts END "
#define STEP_COLS                                                                             \
    "step, epoch, loss, lr, loss_scale, skipped, step_ms, samples_per_s, mem_allocated_bytes, " \
    "mem_peak_bytes, mem_reserved_bytes, device_used_bytes, time"

/* Dependencies ("after" in the stored spec, a JSON array of job ids). The state of the job
 * whose id is the SQL expression V, as a dependency sees it: its row's state, or 'succeeded'
 * for a job deleted after it succeeded (its tombstone keeps the state), else 'deleted'. */
#define DEP_STATE(V)                                                                          \
    "coalesce((SELECT d.state FROM jobs d WHERE d.id = " V "), (SELECT 'succeeded' FROM events e " \
    "WHERE e.job_id IS NULL AND e.type = 'deleted' AND json_extract(e.data, '$.job') = " V " AND " \
    "json_extract(e.data, '$.state') = 'succeeded' LIMIT 1), 'deleted')"
#define DEP_BAD(V) DEP_STATE(V) " IN ('failed', 'cancelled', 'deleted')"
/* Why the job J (a table alias) can never run: its first dependency that failed, was cancelled
 * or was deleted, and that one's outcome; NULL when there is none. */
#define DEP_WHY(J)                                                                            \
    "(SELECT printf('job %d, which it runs after (after), %s, so this job can never run%s', a.value, " \
    "CASE (" DEP_STATE("a.value") ") WHEN 'cancelled' THEN 'was cancelled' WHEN 'deleted' THEN " \
    "'was deleted before it succeeded' ELSE 'failed with ' || coalesce((SELECT d.error_code FROM " \
    "jobs d WHERE d.id = a.value), 'an unknown error') END, CASE (" DEP_STATE("a.value") ") WHEN " \
    "'deleted' THEN '' ELSE printf(': requeue job %d, then this one', a.value) END) "          \
    "FROM json_each(" J ".spec, '$.after') a WHERE " DEP_BAD("a.value") " ORDER BY a.key LIMIT 1)"

/* The queued jobs that can never run (a dependency failed, was cancelled or deleted), 64 at a
 * time, each with DEP_WHY. */
#define BLOCKED_SQL                                                                           \
    "SELECT j.id, " DEP_WHY("j") " FROM jobs j WHERE j.state = 'queued' AND "                  \
    "json_array_length(j.spec, '$.after') > 0 AND EXISTS (SELECT 1 FROM json_each(j.spec, "    \
    "'$.after') a WHERE " DEP_BAD("a.value") ") ORDER BY j.id LIMIT 64"

/* ---- helpers -------------------------------------------------------------------------- */

static char *dup_col(sqlite3_stmt *st, int i) {
    const unsigned char *t = sqlite3_column_text(st, i);
    if (!t) return NULL;
    size_t n = (size_t)sqlite3_column_bytes(st, i);
    char *p = malloc(n + 1);
    if (p) { memcpy(p, t, n); p[n] = 0; }
    return p;
}
static void copy_col(sqlite3_stmt *st, int i, char *dst, size_t n) {
    const unsigned char *t = sqlite3_column_text(st, i);
    snprintf(dst, n, "%s", t ? (const char *)t : "");
}
static double dbl_col(sqlite3_stmt *st, int i, double null_value) {
    return sqlite3_column_type(st, i) == SQLITE_NULL ? null_value : sqlite3_column_double(st, i);
}
static int64_t int_col(sqlite3_stmt *st, int i, int64_t null_value) {
    return sqlite3_column_type(st, i) == SQLITE_NULL ? null_value : sqlite3_column_int64(st, i);
}

/* the 13 step columns from column `c` on */
static void read_step(sqlite3_stmt *st, int c, tq_step_rec *r) {
    memset(r, 0, sizeof *r);
    r->step = sqlite3_column_int64(st, c + 0);
    r->epoch = sqlite3_column_int(st, c + 1);
    r->loss = dbl_col(st, c + 2, NAN);
    r->lr = dbl_col(st, c + 3, NAN);
    r->loss_scale = dbl_col(st, c + 4, -1);
    r->skipped = sqlite3_column_int(st, c + 5);
    r->step_ms = dbl_col(st, c + 6, NAN);
    r->samples_per_s = dbl_col(st, c + 7, NAN);
    r->mem_allocated_bytes = int_col(st, c + 8, 0);
    r->mem_peak_bytes = int_col(st, c + 9, 0);
    r->mem_reserved_bytes = int_col(st, c + 10, 0);
    r->device_used_bytes = int_col(st, c + 11, -1);
    r->time_ms = int_col(st, c + 12, 0);
}

static int read_job(sqlite3_stmt *st, tq_job *j) {
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    copy_col(st, 1, j->name, sizeof j->name);
    copy_col(st, 2, j->state, sizeof j->state);
    j->spec = dup_col(st, 3);
    j->priority = sqlite3_column_int(st, 4);
    copy_col(st, 5, j->submission_id, sizeof j->submission_id);
    j->created_at = int_col(st, 6, 0);
    j->started_at = int_col(st, 7, 0);
    j->finished_at = int_col(st, 8, 0);
    j->attempts = sqlite3_column_int(st, 9);
    j->max_attempts = sqlite3_column_int(st, 10);
    copy_col(st, 11, j->device, sizeof j->device);
    j->total_steps = int_col(st, 12, 0);
    j->summary = dup_col(st, 13);
    copy_col(st, 14, j->error_code, sizeof j->error_code);
    j->error_message = dup_col(st, 15);
    j->planned_peak_bytes = int_col(st, 16, -1);
    j->cancel_requested = sqlite3_column_int(st, 17);
    j->queue_position = sqlite3_column_int64(st, 18);
    if (sqlite3_column_type(st, 19) != SQLITE_NULL) {
        j->has_latest = 1;
        read_step(st, 19, &j->latest);
    }
    j->planned_cpu_bytes = int_col(st, 32, -1);
    j->planned_gpu_bytes = int_col(st, 33, -1);
    j->threads = (int)int_col(st, 34, 0);
    j->interruptions = (int)int_col(st, 35, 0);
    copy_col(st, 36, j->owner, sizeof j->owner);
    j->owner_uid = int_col(st, 37, -1);
    j->inputs = dup_col(st, 38);
    j->requeues = (int)int_col(st, 39, 0);
    j->requeued_at = int_col(st, 40, 0);
    if (!j->spec) return TQ_STORE_ERR;   /* NOT NULL column: only OOM gets here */
    return TQ_STORE_OK;
}

void tq_job_free(tq_job *j) {
    if (!j) return;
    free(j->spec);
    free(j->summary);
    free(j->error_message);
    free(j->inputs);
    j->spec = j->summary = j->error_message = j->inputs = NULL;
}
void tq_jobs_free(tq_job *j, int n) {
    for (int i = 0; j && i < n; i++) tq_job_free(&j[i]);
    free(j);
}

/* step a statement expecting SQLITE_DONE; keeps the statement for reuse */
static int done(tq_store *s, sqlite3_stmt *st, const char *what) {
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return tq__sql_err(s, what);
    return TQ_STORE_OK;
}

/* appends a "state" event reflecting the job's row (inside the caller's transaction) */
static int state_event(tq_store *s, int64_t id) {
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_EVENT_STATE,
                 "INSERT INTO events (job_id, time, type, data) SELECT id, ?2, 'state', "
                 "json_object('state', state, 'attempts', attempts, 'error', CASE WHEN error_code "
                 "IS NULL THEN NULL ELSE json_object('code', error_code, 'message', "
                 "coalesce(error_message, '')) END) FROM jobs WHERE id = ?1", &st))
        return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    return done(s, st, "appending a state event");
}

/* 1 exists, 0 not, <0 error */
static int job_exists(tq_store *s, int64_t id, char state[16]) {
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_EXISTS, "SELECT state FROM jobs WHERE id = ?1", &st)) return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (state) copy_col(st, 0, state, 16);
        sqlite3_reset(st);
        return 1;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return tq__sql_err(s, "reading a job's state");
    return 0;
}

/* Inside the caller's write transaction: fails (dependency_failed) every queued job with a
 * dependency that failed, was cancelled or was deleted, round after round until none is left
 * (a round fails the dependents of the jobs the round before failed: chains cascade). Each
 * gets its state event. *count (may be NULL) is increased by how many. */
static int fail_blocked(tq_store *s, int *count) {
    for (;;) {
        sqlite3_stmt *st;
        if (tq__stmt(s, Q_BLOCKED, BLOCKED_SQL, &st))
            return TQ_STORE_ERR;
        int64_t ids[64];
        char *why[64];
        int n = 0, rc;
        while (n < 64 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            ids[n] = sqlite3_column_int64(st, 0);
            why[n++] = dup_col(st, 1);
        }
        sqlite3_reset(st);
        if (n == 0 && rc != SQLITE_DONE) return tq__sql_err(s, "finding jobs whose dependency failed");
        if (n == 0) return TQ_STORE_OK;
        int err = 0;
        for (int i = 0; i < n; i++) {
            const char *msg = why[i] ? why[i] : "a job it runs after (after) did not succeed";
            if (!err && tq__stmt(s, Q_FAIL_DEP,
                                 "UPDATE jobs SET state = 'failed', finished_at = ?2, error_code = ?3, "
                                 "error_message = ?4, summary = json_object('state', 'failed', 'error', "
                                 "json_object('code', ?3, 'message', ?4)) WHERE id = ?1 AND state = 'queued'", &st))
                err = 1;
            if (!err) {
                sqlite3_bind_int64(st, 1, ids[i]);
                sqlite3_bind_int64(st, 2, tq__now_ms());
                sqlite3_bind_text(st, 3, tq_error_name(TQ_ERR_DEPENDENCY_FAILED), -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 4, msg, -1, SQLITE_TRANSIENT);
                if (done(s, st, "failing a job whose dependency failed") || state_event(s, ids[i])) err = 1;
                else if (count) (*count)++;
            }
            free(why[i]);
        }
        if (err) return TQ_STORE_ERR;
    }
}

int tq_queue_fail_blocked(tq_store *s, int *failed) {
    s->err[0] = 0;
    if (failed) *failed = 0;
    /* the common case, nothing to do, is a read: no write lock every placement round */
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_BLOCKED, BLOCKED_SQL, &st))
        return TQ_STORE_ERR;
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_DONE) return TQ_STORE_OK;
    if (rc != SQLITE_ROW) return tq__sql_err(s, "finding jobs whose dependency failed");
    if (tq__begin(s)) return TQ_STORE_ERR;
    if (fail_blocked(s, failed)) { tq__rollback(s); return TQ_STORE_ERR; }
    return tq__commit(s);
}

/* ---- submit and claim ----------------------------------------------------------------- */

static int64_t find_sub(tq_store *s, const char *sub) {
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_FIND_SUB, "SELECT id FROM jobs WHERE submission_id = ?1", &st)) return TQ_STORE_ERR;
    sqlite3_bind_text(st, 1, sub, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return tq__sql_err(s, "looking up a submission_id");
    return id;
}

int64_t tq_queue_find_submission(tq_store *s, const char *sub) {
    s->err[0] = 0;
    if (!sub || !sub[0]) return 0;
    return find_sub(s, sub);
}

int tq_queue_submit(tq_store *s, const char *name, const char *spec_json, int priority,
                    const char *sub, const tq_job_plan *plan, int64_t *id, int *existed) {
    return tq_queue_submit_as(s, name, spec_json, priority, sub, plan, NULL, -1, NULL, id, existed);
}

int tq_queue_submit_as(tq_store *s, const char *name, const char *spec_json, int priority,
                       const char *sub, const tq_job_plan *plan, const char *owner, int64_t owner_uid,
                       const char *inputs, int64_t *id, int *existed) {
    int64_t planned = plan ? plan->peak_bytes : -1;
    s->err[0] = 0;
    if (existed) *existed = 0;
    if (!spec_json || !id) return tq__set_err(s, "submit: no spec");
    if (tq__begin(s)) return TQ_STORE_ERR;
    if (sub && sub[0]) {
        int64_t old = find_sub(s, sub);
        if (old < 0) goto fail;
        if (old > 0) {
            tq__rollback(s);
            *id = old;
            if (existed) *existed = 1;
            return TQ_STORE_OK;
        }
    }
    sqlite3_stmt *st;
    /* every job it runs after exists (so each is older than this one: no cycles) */
    if (tq__stmt(s, Q_DEP_EXISTS, "SELECT a.key, a.value FROM json_each(?1, '$.after') a WHERE NOT EXISTS "
                 "(SELECT 1 FROM jobs WHERE id = a.value) ORDER BY a.key LIMIT 1", &st))
        goto fail;
    sqlite3_bind_text(st, 1, spec_json, -1, SQLITE_TRANSIENT);
    int drc = sqlite3_step(st);
    if (drc == SQLITE_ROW) {
        int k = sqlite3_column_int(st, 0);
        long long missing = sqlite3_column_int64(st, 1);
        sqlite3_reset(st);
        tq__rollback(s);
        tq__set_err(s, "after[%d]: there is no job %lld to run after", k, missing);
        return TQ_STORE_EDEPENDENCY;
    }
    sqlite3_reset(st);
    if (drc != SQLITE_DONE) { tq__sql_err(s, "checking the jobs of after"); goto fail; }
    if (tq__stmt(s, Q_INSERT,
                 "INSERT INTO jobs (id, name, state, spec, priority, submission_id, created_at, "
                 "planned_peak_bytes, planned_cpu_bytes, planned_gpu_bytes, owner, owner_uid, inputs) VALUES ("
                 TQ_NEXT_JOB_ID ", ?1, 'queued', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                 &st))
        goto fail;
    sqlite3_bind_text(st, 1, name ? name : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, spec_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 3, priority);
    if (sub && sub[0]) sqlite3_bind_text(st, 4, sub, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 4);
    sqlite3_bind_int64(st, 5, tq__now_ms());
    if (planned >= 0) sqlite3_bind_int64(st, 6, planned);
    else sqlite3_bind_null(st, 6);
    if (plan && plan->cpu_bytes >= 0) sqlite3_bind_int64(st, 7, plan->cpu_bytes);
    else sqlite3_bind_null(st, 7);
    if (plan && plan->gpu_bytes >= 0) sqlite3_bind_int64(st, 8, plan->gpu_bytes);
    else sqlite3_bind_null(st, 8);
    if (owner && owner[0]) sqlite3_bind_text(st, 9, owner, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 9);
    if (owner && owner[0] && owner_uid >= 0) sqlite3_bind_int64(st, 10, owner_uid);
    else sqlite3_bind_null(st, 10);
    if (inputs && inputs[0]) sqlite3_bind_text(st, 11, inputs, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 11);
    if (done(s, st, "submit")) goto fail;
    int64_t rowid = sqlite3_last_insert_rowid(s->db);
    if (state_event(s, rowid)) goto fail;
    if (fail_blocked(s, NULL)) goto fail;   /* it runs after a job that failed already */
    if (tq__commit(s)) return TQ_STORE_ERR;
    *id = rowid;
    return TQ_STORE_OK;
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_claim_job(tq_store *s, int64_t id, const char *device, int threads) {
    s->err[0] = 0;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_CLAIM_JOB,
                 "UPDATE jobs SET " CLAIM_SET("?2", "?3") ", threads = ?4 WHERE id = ?1 AND state = 'queued'", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    sqlite3_bind_text(st, 3, device, -1, SQLITE_TRANSIENT);
    if (threads > 0) sqlite3_bind_int(st, 4, threads);
    else sqlite3_bind_null(st, 4);
    if (done(s, st, "claim")) goto fail;
    if (sqlite3_changes(s->db) != 1) { tq__rollback(s); return 0; }   /* cancelled or deleted meanwhile */
    if (state_event(s, id)) goto fail;
    if (tq__commit(s)) return TQ_STORE_ERR;
    return 1;
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

/* device milliseconds of job j overlapping [?W, ?N]: from its first start to its end (or now) */
#define USE_MS(lo) "max(0, min(coalesce(finished_at, ?2), ?2) - max(started_at, " lo "))"

int tq_queue_queued(tq_store *s, int max, tq_queued **out, int *n) {
    return tq_queue_queued_fair(s, max, 0, out, n);
}

int tq_queue_queued_fair(tq_store *s, int max, int64_t window_ms, tq_queued **out, int *n) {
    s->err[0] = 0;
    *out = NULL; *n = 0;
    if (max < 1) return tq__set_err(s, "queued: max must be ≥ 1");
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_QUEUED,
                 "WITH usage AS (SELECT coalesce(owner, '') AS who, sum(" USE_MS("?2 - ?3") ") AS ms "
                 "FROM jobs WHERE started_at IS NOT NULL GROUP BY who) "
                 "SELECT id, priority, created_at, coalesce(json_extract(spec, '$.device'), 'auto'), "
                 "coalesce(json_extract(spec, '$.threads'), 0), planned_cpu_bytes, planned_gpu_bytes, "
                 "coalesce(owner, ''), max(coalesce(requeued_at, created_at), coalesce((SELECT max(d.finished_at) "
                 "FROM json_each(jobs.spec, '$.after') a JOIN jobs d ON d.id = a.value), 0)), "
                 "(SELECT group_concat(a.value) FROM json_each(jobs.spec, '$.after') a WHERE "
                 DEP_STATE("a.value") " != 'succeeded') "
                 "FROM jobs LEFT JOIN usage ON usage.who = coalesce(jobs.owner, '') "
                 "WHERE state = 'queued' ORDER BY priority DESC, CASE WHEN ?3 > 0 THEN coalesce(usage.ms, 0) "
                 "ELSE 0 END, id LIMIT ?1", &st))
        return TQ_STORE_ERR;
    sqlite3_bind_int(st, 1, max);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    sqlite3_bind_int64(st, 3, window_ms > 0 ? window_ms : 0);
    tq_queued *v = calloc((size_t)max, sizeof *v);
    int k = 0, rc = SQLITE_NOMEM;
    while (v && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        tq_queued *q = &v[k++];
        q->id = sqlite3_column_int64(st, 0);
        q->priority = sqlite3_column_int(st, 1);
        q->created_at = sqlite3_column_int64(st, 2);
        copy_col(st, 3, q->device, sizeof q->device);
        q->threads = sqlite3_column_int(st, 4);
        q->cpu_bytes = int_col(st, 5, -1);
        q->gpu_bytes = int_col(st, 6, -1);
        copy_col(st, 7, q->owner, sizeof q->owner);
        q->eligible_at = int_col(st, 8, q->created_at);
        const unsigned char *deps = sqlite3_column_text(st, 9);   /* "3,4": ids not yet succeeded */
        for (const char *p = (const char *)deps; p && *p && q->ndeps < TQ_QUEUE_MAX_AFTER;) {
            char *end;
            long long dep = strtoll(p, &end, 10);
            if (end == p) break;
            q->deps[q->ndeps++] = dep;
            p = *end == ',' ? end + 1 : end;
        }
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        free(v);
        return rc == SQLITE_NOMEM ? tq__set_err(s, "queued: out of memory") : tq__sql_err(s, "queued");
    }
    *out = v; *n = k;
    return TQ_STORE_OK;
}

int tq_queue_users(tq_store *s, int64_t window_ms, tq_user_usage **out, int *n) {
    s->err[0] = 0;
    *out = NULL; *n = 0;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_USERS,
                 "SELECT coalesce(owner, ''), max(owner_uid), sum(state = 'queued'), sum(state = 'running'), "
                 "sum(CASE WHEN started_at IS NULL THEN 0 ELSE " USE_MS("?2 - ?1") " END), "
                 "sum(CASE WHEN started_at IS NULL THEN 0 ELSE " USE_MS("started_at") " END) "
                 "FROM jobs GROUP BY coalesce(owner, '') ORDER BY 1", &st))
        return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, window_ms > 0 ? window_ms : 0);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    int cap = 16, k = 0, rc;
    tq_user_usage *v = malloc((size_t)cap * sizeof *v);
    while (v && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            tq_user_usage *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) { free(v); v = NULL; break; }
            v = nv;
        }
        tq_user_usage *u = &v[k++];
        copy_col(st, 0, u->owner, sizeof u->owner);
        u->owner_uid = int_col(st, 1, -1);
        u->queued = sqlite3_column_int(st, 2);
        u->running = sqlite3_column_int(st, 3);
        u->window_s = sqlite3_column_double(st, 4) / 1000.0;
        u->total_s = sqlite3_column_double(st, 5) / 1000.0;
    }
    sqlite3_reset(st);
    if (!v) return tq__set_err(s, "users: out of memory");
    if (rc != SQLITE_DONE) { free(v); return tq__sql_err(s, "users"); }
    *out = v; *n = k;
    return TQ_STORE_OK;
}

int tq_queue_fail_queued(tq_store *s, int64_t id, const char *code, const char *msg) {
    s->err[0] = 0;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_FAIL_QUEUED,
                 "UPDATE jobs SET state = 'failed', finished_at = ?2, error_code = ?3, "
                 "error_message = ?4, summary = json_object('state', 'failed', 'error', "
                 "json_object('code', ?3, 'message', ?4)) WHERE id = ?1 AND state = 'queued'", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    sqlite3_bind_text(st, 3, code, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, msg, -1, SQLITE_TRANSIENT);
    if (done(s, st, "fail a queued job")) goto fail;
    if (sqlite3_changes(s->db) != 1) { tq__rollback(s); return 0; }
    if (state_event(s, id) || fail_blocked(s, NULL)) goto fail;
    if (tq__commit(s)) return TQ_STORE_ERR;
    return 1;
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

/* ---- reads ---------------------------------------------------------------------------- */

int tq_queue_get(tq_store *s, int64_t id, tq_job *job) {
    s->err[0] = 0;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_GET, "SELECT " JOB_COLS JOB_FROM "WHERE j.id = ?1", &st)) return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        int r = read_job(st, job);
        sqlite3_reset(st);
        if (r) { tq_job_free(job); return tq__set_err(s, "get job: out of memory"); }
        return 1;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return tq__sql_err(s, "get job");
    return 0;
}

int tq_queue_list(tq_store *s, const char *state, int64_t before, int limit, tq_job **jobs,
                  int *n, int64_t *next) {
    return tq_queue_list_owned(s, state, NULL, before, limit, jobs, n, next);
}

int tq_queue_list_owned(tq_store *s, const char *state, const char *owner, int64_t before, int limit,
                        tq_job **jobs, int *n, int64_t *next) {
    s->err[0] = 0;
    *jobs = NULL; *n = 0; *next = 0;
    if (limit < 1 || limit > 1000) return tq__set_err(s, "list: limit must be 1…1000");
    sqlite3_stmt *st;
    if (owner) {
        if (tq__stmt(s, Q_LIST_OWNED, "SELECT " JOB_COLS JOB_FROM "WHERE (?1 IS NULL OR j.state = ?1) AND "
                     "CASE WHEN ?4 = '' THEN j.owner IS NULL ELSE j.owner = ?4 END AND j.id < ?2 "
                     "ORDER BY j.id DESC LIMIT ?3", &st)) return TQ_STORE_ERR;
        if (state) sqlite3_bind_text(st, 1, state, -1, SQLITE_TRANSIENT);
        else sqlite3_bind_null(st, 1);
        sqlite3_bind_text(st, 4, owner, -1, SQLITE_TRANSIENT);
    } else if (state) {
        if (tq__stmt(s, Q_LIST_STATE, "SELECT " JOB_COLS JOB_FROM "WHERE j.state = ?1 AND j.id < ?2 "
                     "ORDER BY j.id DESC LIMIT ?3", &st)) return TQ_STORE_ERR;
        sqlite3_bind_text(st, 1, state, -1, SQLITE_TRANSIENT);
    } else if (tq__stmt(s, Q_LIST_ALL, "SELECT " JOB_COLS JOB_FROM "WHERE j.id < ?2 "
                        "ORDER BY j.id DESC LIMIT ?3", &st)) {
        return TQ_STORE_ERR;
    }
    sqlite3_bind_int64(st, 2, before > 0 ? before : INT64_MAX);
    sqlite3_bind_int(st, 3, limit + 1);   /* one more: is there a next page? */
    tq_job *out = calloc((size_t)limit + 1, sizeof *out);
    if (!out) { sqlite3_reset(st); return tq__set_err(s, "list: out of memory"); }
    int k = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == limit) { *next = out[k - 1].id; break; }
        if (read_job(st, &out[k])) { tq_job_free(&out[k]); rc = SQLITE_NOMEM; break; }
        k++;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        tq_jobs_free(out, k);
        *next = 0;
        return rc == SQLITE_NOMEM ? tq__set_err(s, "list: out of memory") : tq__sql_err(s, "list");
    }
    *jobs = out; *n = k;
    return TQ_STORE_OK;
}

int64_t tq_queue_position(tq_store *s, int64_t id) {
    s->err[0] = 0;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_POS,
                 "SELECT (SELECT count(*) FROM jobs q WHERE q.state = 'queued' AND (q.priority > "
                 "j.priority OR (q.priority = j.priority AND q.id <= j.id))) FROM jobs j "
                 "WHERE j.id = ?1 AND j.state = 'queued'", &st))
        return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    int64_t pos = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return tq__sql_err(s, "queue position");
    return pos;
}

int tq_queue_counts(tq_store *s, int64_t counts[TQ_STATE_COUNT]) {
    s->err[0] = 0;
    memset(counts, 0, TQ_STATE_COUNT * sizeof counts[0]);
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_COUNTS, "SELECT state, count(*) FROM jobs GROUP BY state", &st)) return TQ_STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *state = (const char *)sqlite3_column_text(st, 0);
        tq_job_state k;
        if (tq_state_parse(state, &k) == 0) counts[k] = sqlite3_column_int64(st, 1);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return tq__sql_err(s, "counting jobs");
    return TQ_STORE_OK;
}

int tq_queue_steps(tq_store *s, int64_t id, int64_t after, int limit, tq_step_rec **out, int *n) {
    s->err[0] = 0;
    *out = NULL; *n = 0;
    if (limit < 1) return tq__set_err(s, "steps: limit must be ≥ 1");
    int e = job_exists(s, id, NULL);
    if (e < 0) return e;
    if (!e) { tq__set_err(s, "no job %lld", (long long)id); return TQ_STORE_ENOJOB; }
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_STEPS, "SELECT " STEP_COLS " FROM steps WHERE job_id = ?1 AND step > ?2 "
                 "ORDER BY step LIMIT ?3", &st)) return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, after);
    sqlite3_bind_int(st, 3, limit);
    size_t cap = 64;
    tq_step_rec *v = malloc(cap * sizeof *v);
    int k = 0, rc = SQLITE_NOMEM;
    while (v && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((size_t)k == cap) {
            tq_step_rec *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) { rc = SQLITE_NOMEM; break; }
            v = nv;
        }
        read_step(st, 0, &v[k++]);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        free(v);
        return rc == SQLITE_NOMEM ? tq__set_err(s, "steps: out of memory") : tq__sql_err(s, "steps");
    }
    *out = v; *n = k;
    return TQ_STORE_OK;
}

int tq_queue_evals(tq_store *s, int64_t id, int offset, tq_eval_rec **out, int *n) {
    s->err[0] = 0;
    *out = NULL; *n = 0;
    int e = job_exists(s, id, NULL);
    if (e < 0) return e;
    if (!e) { tq__set_err(s, "no job %lld", (long long)id); return TQ_STORE_ENOJOB; }
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_EVALS, "SELECT step, epoch, loss, accuracy, samples, kind, time FROM evals "
                 "WHERE job_id = ?1 ORDER BY step, CASE kind WHEN 'eval' THEN 0 WHEN 'pruned' "
                 "THEN 1 ELSE 2 END LIMIT -1 OFFSET ?2", &st)) return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 2, offset > 0 ? offset : 0);
    size_t cap = 16;
    tq_eval_rec *v = malloc(cap * sizeof *v);
    int k = 0, rc = SQLITE_NOMEM;
    while (v && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((size_t)k == cap) {
            tq_eval_rec *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) { rc = SQLITE_NOMEM; break; }
            v = nv;
        }
        tq_eval_rec *r = &v[k++];
        memset(r, 0, sizeof *r);
        r->step = sqlite3_column_int64(st, 0);
        r->epoch = sqlite3_column_int(st, 1);
        r->loss = dbl_col(st, 2, NAN);
        r->accuracy = dbl_col(st, 3, NAN);
        r->samples = sqlite3_column_int64(st, 4);
        const char *kind = (const char *)sqlite3_column_text(st, 5);
        r->kind = kind && !strcmp(kind, "pruned") ? TQ_EVAL_PRUNED
                : kind && !strcmp(kind, "int8") ? TQ_EVAL_INT8 : TQ_EVAL_EVAL;
        r->time_ms = sqlite3_column_int64(st, 6);
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        free(v);
        return rc == SQLITE_NOMEM ? tq__set_err(s, "evals: out of memory") : tq__sql_err(s, "evals");
    }
    *out = v; *n = k;
    return TQ_STORE_OK;
}

/* ---- cancel, delete ------------------------------------------------------------------- */

int tq_queue_cancel(tq_store *s, int64_t id, char state[16]) {
    s->err[0] = 0;
    char cur[16] = "";
    if (tq__begin(s)) return TQ_STORE_ERR;
    int e = job_exists(s, id, cur);
    if (state) snprintf(state, 16, "%s", cur);
    if (e < 0) goto fail;
    if (!e) { tq__rollback(s); tq__set_err(s, "no job %lld", (long long)id); return TQ_STORE_ENOJOB; }
    sqlite3_stmt *st;
    if (!strcmp(cur, "queued")) {
        if (tq__stmt(s, Q_CANCEL_QUEUED, "UPDATE jobs SET state = 'cancelled', finished_at = ?2 "
                     "WHERE id = ?1", &st)) goto fail;
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int64(st, 2, tq__now_ms());
        if (done(s, st, "cancel") || state_event(s, id) || fail_blocked(s, NULL)) goto fail;
    } else if (!strcmp(cur, "running")) {
        if (tq__stmt(s, Q_CANCEL_RUNNING, "UPDATE jobs SET cancel_requested = 1 WHERE id = ?1", &st))
            goto fail;
        sqlite3_bind_int64(st, 1, id);
        if (done(s, st, "cancel")) goto fail;
    } else {
        tq__rollback(s);
        tq__set_err(s, "job %lld is %s: only queued or running jobs can be cancelled", (long long)id, cur);
        return TQ_STORE_ECONFLICT;
    }
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_cancel_requested(tq_store *s, int64_t id) {
    s->err[0] = 0;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_CANCEL_FLAG, "SELECT cancel_requested FROM jobs WHERE id = ?1", &st)) return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    int v = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) != 0 : 0;
    sqlite3_reset(st);
    if (rc == SQLITE_DONE) { tq__set_err(s, "no job %lld", (long long)id); return TQ_STORE_ENOJOB; }
    if (rc != SQLITE_ROW) return tq__sql_err(s, "reading cancel_requested");
    return v;
}

int tq_queue_delete(tq_store *s, int64_t id) {
    s->err[0] = 0;
    char cur[16] = "";
    if (tq__begin(s)) return TQ_STORE_ERR;
    int e = job_exists(s, id, cur);
    if (e < 0) goto fail;
    if (!e) { tq__rollback(s); tq__set_err(s, "no job %lld", (long long)id); return TQ_STORE_ENOJOB; }
    if (!strcmp(cur, "queued") || !strcmp(cur, "running")) {
        tq__rollback(s);
        tq__set_err(s, "job %lld is %s: only finished jobs can be deleted (cancel it first)",
                    (long long)id, cur);
        return TQ_STORE_ECONFLICT;
    }
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_DELETE, "DELETE FROM jobs WHERE id = ?1", &st)) goto fail;
    sqlite3_bind_int64(st, 1, id);
    if (done(s, st, "delete")) goto fail;
    /* a tombstone that outlives the cascade: ids are never reused (TQ_NEXT_JOB_ID) */
    /* its state too: a job that runs after one deleted once it had succeeded may still run */
    if (tq__stmt(s, Q_TOMBSTONE, "INSERT INTO events (job_id, time, type, data) VALUES "
                 "(NULL, ?2, 'deleted', json_object('job', ?1, 'state', ?3))", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    sqlite3_bind_text(st, 3, cur, -1, SQLITE_TRANSIENT);
    if (done(s, st, "delete") || fail_blocked(s, NULL)) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

/* ---- worker and supervisor ------------------------------------------------------------ */

int tq_queue_set_progress(tq_store *s, int64_t id, int64_t total_steps, const char *device) {
    s->err[0] = 0;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_PROGRESS, "UPDATE jobs SET total_steps = ?2, device = coalesce(?3, device) "
                 "WHERE id = ?1", &st)) goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, total_steps);
    if (device && device[0]) sqlite3_bind_text(st, 3, device, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 3);
    if (done(s, st, "set progress")) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_set_checkpoint(tq_store *s, int64_t id, const char *path) {
    s->err[0] = 0;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_CKPT, "UPDATE jobs SET checkpoint_path = ?2 WHERE id = ?1", &st)) goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, path ? path : "", -1, SQLITE_TRANSIENT);
    if (done(s, st, "set checkpoint")) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

/* after an UPDATE … WHERE id AND state = 'running' that changed nothing */
static int not_running(tq_store *s, int64_t id, const char *what) {
    char cur[16] = "";
    int e = job_exists(s, id, cur);
    tq__rollback(s);
    if (e < 0) return e;
    if (!e) { tq__set_err(s, "%s: no job %lld", what, (long long)id); return TQ_STORE_ENOJOB; }
    tq__set_err(s, "%s: job %lld is %s, not running", what, (long long)id, cur);
    return TQ_STORE_ECONFLICT;
}

int tq_queue_finish(tq_store *s, int64_t id, const char *state, const char *summary_json,
                    const char *error_code, const char *error_message) {
    s->err[0] = 0;
    if (!state || (strcmp(state, "succeeded") && strcmp(state, "failed") && strcmp(state, "cancelled")))
        return tq__set_err(s, "finish: \"%s\" is not a final state", state ? state : "(null)");
    if (tq_store_flush(s)) return TQ_STORE_ERR;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_FINISH, "UPDATE jobs SET state = ?2, finished_at = ?3, summary = ?4, "
                 "error_code = ?5, error_message = ?6 WHERE id = ?1 AND state = 'running'", &st))
        goto fail;
    tq__bind_finish(st, id, state, summary_json, error_code, error_message);
    if (done(s, st, "finish")) goto fail;
    if (sqlite3_changes(s->db) != 1) return not_running(s, id, "finish");
    if (state_event(s, id) || (strcmp(state, "succeeded") && fail_blocked(s, NULL))) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_requeue(tq_store *s, int64_t id) {
    s->err[0] = 0;
    if (tq_store_flush(s)) return TQ_STORE_ERR;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_REQUEUE, "UPDATE jobs SET " INTERRUPT_SET "WHERE id = ?1 AND state = 'running'", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    if (done(s, st, "requeue")) goto fail;
    if (sqlite3_changes(s->db) != 1) return not_running(s, id, "requeue");
    if (state_event(s, id) || fail_blocked(s, NULL)) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_requeue_busy(tq_store *s, int64_t id, const char *device, const char *message) {
    s->err[0] = 0;
    if (tq_store_flush(s)) return TQ_STORE_ERR;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    /* the start is given back; a job that never trained (no step, never interrupted) has not
     * started either: its started_at goes, or the owner's fair share would count the wait */
    if (tq__stmt(s, Q_BUSY_JOB,
                 "UPDATE jobs SET " BACK_TO_QUEUE_SET "attempts = max(attempts - 1, 0), "
                 "started_at = CASE WHEN interruptions = 0 AND " LAST_STEP " = 0 THEN NULL ELSE started_at END "
                 "WHERE id = ?1 AND state = 'running'", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    if (done(s, st, "requeue")) goto fail;
    if (sqlite3_changes(s->db) != 1) return not_running(s, id, "requeue");
    if (tq__stmt(s, Q_BUSY_EVENT,
                 "INSERT INTO events (job_id, time, type, data) SELECT id, ?2, 'state', json_object('state', "
                 "state, 'attempts', attempts, 'error', NULL, 'device_busy', json_object('device', ?3, "
                 "'message', ?4)) FROM jobs WHERE id = ?1", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    sqlite3_bind_text(st, 3, device ? device : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, message ? message : "", -1, SQLITE_TRANSIENT);
    if (done(s, st, "requeue")) goto fail;
    if (fail_blocked(s, NULL)) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_requeue_finished(tq_store *s, int64_t id, char state[16]) {
    s->err[0] = 0;
    char cur[16] = "";
    if (state) state[0] = 0;
    if (tq__begin(s)) return TQ_STORE_ERR;
    int e = job_exists(s, id, cur);
    if (state) snprintf(state, 16, "%s", cur);
    if (e < 0) goto fail;
    if (!e) { tq__rollback(s); tq__set_err(s, "no job %lld", (long long)id); return TQ_STORE_ENOJOB; }
    if (strcmp(cur, "failed") && strcmp(cur, "cancelled")) {
        tq__rollback(s);
        tq__set_err(s, "job %lld is %s: only a failed or cancelled job can be requeued", (long long)id, cur);
        return TQ_STORE_ECONFLICT;
    }
    /* a job it runs after that failed (or was cancelled, or deleted) would fail it again at once */
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_BAD_DEP, "SELECT " DEP_WHY("j") " FROM jobs j WHERE j.id = ?1", &st)) goto fail;
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
        tq__set_err(s, "job %lld cannot run: %s", (long long)id, (const char *)sqlite3_column_text(st, 0));
        sqlite3_reset(st);
        tq__rollback(s);
        return TQ_STORE_EDEPENDENCY;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) { tq__sql_err(s, "checking the jobs of after"); goto fail; }
    /* the state event keeps what the requeue replaces: the outcome, its step, its times */
    if (tq__stmt(s, Q_REQUEUE_EVENT,
                 "INSERT INTO events (job_id, time, type, data) SELECT id, ?2, 'state', json_object('state', "
                 "'queued', 'attempts', 0, 'error', NULL, 'requeued', json_object('from', state, 'step', "
                 LAST_STEP ", 'started_at', started_at, 'finished_at', finished_at, 'error', CASE WHEN "
                 "error_code IS NULL THEN NULL ELSE json_object('code', error_code, 'message', "
                 "coalesce(error_message, '')) END, 'requeues', requeues + 1)) FROM jobs WHERE id = ?1", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    if (done(s, st, "requeue")) goto fail;
    if (tq__stmt(s, Q_REQUEUE_JOB,
                 "UPDATE jobs SET state = 'queued', started_at = NULL, finished_at = NULL, summary = NULL, "
                 "error_code = NULL, error_message = NULL, cancel_requested = 0, attempts = 0, "
                 "requeues = requeues + 1, requeued_at = ?2 WHERE id = ?1 AND state IN ('failed', 'cancelled')", &st))
        goto fail;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    if (done(s, st, "requeue")) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_recover(tq_store *s, int *requeued, int *failed) {
    s->err[0] = 0;
    if (requeued) *requeued = 0;
    if (failed) *failed = 0;
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    /* the ids first: each change gets its event */
    if (tq__stmt(s, Q_RECOVER_LIST, "SELECT id, NOT cancel_requested AND attempts >= max_attempts AND "
                 "coalesce((SELECT max(step) FROM steps WHERE job_id = jobs.id), 0) <= start_step "
                 "FROM jobs WHERE state = 'running' ORDER BY id", &st)) goto fail;
    int64_t ids[256];
    int fails[256], n = 0, rc;
    while (n < 256 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        ids[n] = sqlite3_column_int64(st, 0);
        fails[n++] = sqlite3_column_int(st, 1);
    }
    sqlite3_reset(st);
    for (int i = 0; i < n; i++) {
        if (fails[i]) {
            if (tq__stmt(s, Q_RECOVER_FAIL,
                         "UPDATE jobs SET state = 'failed', finished_at = ?2, error_code = "
                         "'worker_crashed', error_message = printf('the job was interrupted (the "
                         "daemon or its worker died) on attempt %d of max_attempts %d, without "
                         "recording a step since that attempt started', attempts, max_attempts), summary = json_object('state', 'failed', 'error', "
                         "json_object('code', 'worker_crashed', 'message', printf('interrupted on "
                         "attempt %d of max_attempts %d', attempts, max_attempts))) WHERE id = ?1",
                         &st)) goto fail;
            sqlite3_bind_int64(st, 2, tq__now_ms());
        } else if (tq__stmt(s, Q_RECOVER_QUEUE, "UPDATE jobs SET " INTERRUPT_SET "WHERE id = ?1", &st)) {
            goto fail;
        } else {
            sqlite3_bind_int64(st, 2, tq__now_ms());
        }
        sqlite3_bind_int64(st, 1, ids[i]);
        if (done(s, st, "recover") || state_event(s, ids[i])) goto fail;
        if (fails[i] && failed) (*failed)++;
        if (!fails[i] && requeued) (*requeued)++;
    }
    if (fail_blocked(s, NULL)) goto fail;
    if (tq__commit(s)) return TQ_STORE_ERR;
    /* more than 256 jobs left running (impossible with one worker per device): go again */
    if (n == 256) {
        int r2 = 0, f2 = 0;
        if (tq_queue_recover(s, &r2, &f2)) return TQ_STORE_ERR;
        if (requeued) *requeued += r2;
        if (failed) *failed += f2;
    }
    return TQ_STORE_OK;
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

/* ---- events --------------------------------------------------------------------------- */

int tq_queue_event(tq_store *s, int64_t job_id, const char *type, const char *data_json) {
    s->err[0] = 0;
    if (!type || !type[0] || strlen(type) > 15) return tq__set_err(s, "event: bad type");
    if (tq__begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_EVENT, "INSERT INTO events (job_id, time, type, data) VALUES (?1, ?2, ?3, ?4)",
                 &st)) goto fail;
    if (job_id > 0) sqlite3_bind_int64(st, 1, job_id);
    else sqlite3_bind_null(st, 1);
    sqlite3_bind_int64(st, 2, tq__now_ms());
    sqlite3_bind_text(st, 3, type, -1, SQLITE_TRANSIENT);
    if (data_json) sqlite3_bind_text(st, 4, data_json, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 4);
    if (done(s, st, "event")) goto fail;
    return tq__commit(s);
fail:
    tq__rollback(s);
    return TQ_STORE_ERR;
}

int tq_queue_events(tq_store *s, int64_t job_id, int64_t after, int limit, tq_event **out, int *n) {
    s->err[0] = 0;
    *out = NULL; *n = 0;
    if (limit < 1) return tq__set_err(s, "events: limit must be ≥ 1");
    sqlite3_stmt *st;
    if (tq__stmt(s, Q_EVENTS, "SELECT id, time, type, data FROM events WHERE job_id = ?1 AND id > ?2 "
                 "ORDER BY id LIMIT ?3", &st)) return TQ_STORE_ERR;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, after);
    sqlite3_bind_int(st, 3, limit);
    tq_event *v = calloc((size_t)limit, sizeof *v);
    int k = 0, rc = SQLITE_NOMEM;
    while (v && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        v[k].id = sqlite3_column_int64(st, 0);
        v[k].time = sqlite3_column_int64(st, 1);
        copy_col(st, 2, v[k].type, sizeof v[k].type);
        v[k].data = dup_col(st, 3);
        k++;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        tq_events_free(v, k);
        return rc == SQLITE_NOMEM ? tq__set_err(s, "events: out of memory") : tq__sql_err(s, "events");
    }
    *out = v; *n = k;
    return TQ_STORE_OK;
}

void tq_events_free(tq_event *v, int n) {
    for (int i = 0; v && i < n; i++) free(v[i].data);
    free(v);
}

int tq_queue_snapshot(tq_store *s, int (*fn)(tq_store *, void *), void *ctx) {
    s->err[0] = 0;
    sqlite3_stmt *b, *e;
    if (tq__stmt(s, Q_BEGIN_READ, "BEGIN DEFERRED", &b) || done(s, b, "BEGIN")) return TQ_STORE_ERR;
    int rc = fn(s, ctx);
    if (tq__stmt(s, Q_END_READ, "COMMIT", &e) || done(s, e, "COMMIT")) {
        tq__rollback(s);
        return rc ? rc : TQ_STORE_ERR;
    }
    return rc;
}
