/* test_queue.c — schema/queue.c: claim order (priority, then id), atomic claims from two
 * connections, idempotent submission, queue positions, cancel and delete rules, requeue and
 * recovery at startup with attempts and max_attempts, list paging, steps/evals reads, events,
 * ids never reused after a delete; requeue of a failed or cancelled job, dependencies ("after"):
 * waiting, failing down a chain, requeue refused behind a failed dependency. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "schema/queue.h"
#include "schema/store.h"
#include "schema/migrations.h"

typedef struct { char dir[64], path[128]; tq_store *s; } fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/tq-queue-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/trainq.db", f->dir);
    char err[256];
    f->s = tq_store_open(f->path, err, sizeof err);
    if (!f->s) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    tq_store_close(f->s);
    char p[160];
    static const char *const suffix[] = { "", "-wal", "-shm", "-journal" };
    for (int i = 0; i < 4; i++) { snprintf(p, sizeof p, "%s%s", f->path, suffix[i]); unlink(p); }
    rmdir(f->dir);
    free(f);
    return 0;
}

static const char *const SPEC = "{\"model\":\"cnn\",\"steps\":10}";

static int64_t submit(tq_store *s, int prio, const char *sub) {
    int64_t id = 0;
    int existed = -1;
    tq_job_plan plan = { 1234, 2000, 3000 };
    assert_int_equal(tq_queue_submit(s, "j", SPEC, prio, sub, &plan, &id, &existed), TQ_STORE_OK);
    assert_int_equal(existed, 0);
    assert_true(id > 0);
    return id;
}

/* what the daemon does: the first job in queue order (its scheduler's pick when nothing else
 * decides), claimed by id; a job another connection claimed first is passed over. 1 and *id,
 * 0 when the queue is empty, < 0 on a store error. No cmocka checks: threads call it too. */
static int claim_next(tq_store *s, int64_t *id) {
    for (;;) {
        tq_queued *q = NULL;
        int n = 0;
        if (tq_queue_queued(s, 1, &q, &n) != TQ_STORE_OK) return -1;
        int64_t first = n > 0 ? q[0].id : 0;
        free(q);
        if (!first) return 0;
        int rc = tq_queue_claim_job(s, first, "cpu", 0);
        if (rc == 1) { *id = first; return 1; }
        if (rc != 0) return -1;
    }
}

static int64_t claim(tq_store *s) {
    int64_t id = 0;
    int rc = claim_next(s, &id);
    assert_true(rc == 0 || rc == 1);
    return rc == 1 ? id : 0;
}

static void state_is(tq_store *s, int64_t id, const char *state) {
    tq_job j;
    assert_int_equal(tq_queue_get(s, id, &j), 1);
    assert_string_equal(j.state, state);
    tq_job_free(&j);
}

static void test_claim_order(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, NULL), b = submit(f->s, 5, NULL), c = submit(f->s, 0, NULL),
            d = submit(f->s, -3, NULL), e = submit(f->s, 5, NULL);
    /* positions: b, e (5), a, c (0), d (-3) */
    assert_int_equal(tq_queue_position(f->s, b), 1);
    assert_int_equal(tq_queue_position(f->s, e), 2);
    assert_int_equal(tq_queue_position(f->s, a), 3);
    assert_int_equal(tq_queue_position(f->s, c), 4);
    assert_int_equal(tq_queue_position(f->s, d), 5);
    int64_t want[] = { b, e, a, c, d };
    for (int i = 0; i < 5; i++) {
        tq_job j;
        int64_t id = claim(f->s);
        assert_int_equal(id, want[i]);
        assert_int_equal(tq_queue_get(f->s, id, &j), 1);
        assert_int_equal(j.id, want[i]);
        assert_string_equal(j.state, "running");
        assert_string_equal(j.device, "cpu");
        assert_int_equal(j.attempts, 1);
        assert_true(j.started_at > 0);
        assert_int_equal(j.queue_position, 0);
        tq_job_free(&j);
        assert_int_equal(tq_queue_position(f->s, want[i]), 0);
    }
    assert_int_equal(claim(f->s), 0);   /* empty */
}

/* two connections claiming concurrently never get the same job */
typedef struct { const char *path; int64_t got[64]; int n; } claimer;
static void *claim_all(void *arg) {
    claimer *c = arg;
    char err[256];
    tq_store *s = tq_store_open(c->path, err, sizeof err);
    if (!s) return NULL;
    for (;;) {
        int64_t id = 0;
        if (claim_next(s, &id) != 1) break;
        c->got[c->n++] = id;
    }
    tq_store_close(s);
    return NULL;
}

static void test_atomic_claim(void **state) {
    fx *f = *state;
    for (int i = 0; i < 60; i++) submit(f->s, i % 3, NULL);
    claimer c1 = { f->path, {0}, 0 }, c2 = { f->path, {0}, 0 };
    pthread_t t1, t2;
    pthread_create(&t1, NULL, claim_all, &c1);
    pthread_create(&t2, NULL, claim_all, &c2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(c1.n + c2.n, 60);
    char seen[64] = {0};
    for (int i = 0; i < c1.n; i++) { assert_false(seen[c1.got[i]]); seen[c1.got[i]] = 1; }
    for (int i = 0; i < c2.n; i++) { assert_false(seen[c2.got[i]]); seen[c2.got[i]] = 1; }
    int64_t counts[5];
    assert_int_equal(tq_queue_counts(f->s, counts), TQ_STORE_OK);
    assert_int_equal(counts[0], 0);
    assert_int_equal(counts[1], 60);
}

static void test_idempotent_submit(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, "key-1");
    int64_t id = 0;
    int existed = 0;
    assert_int_equal(tq_queue_submit(f->s, "other", SPEC, 9, "key-1", NULL, &id, &existed), TQ_STORE_OK);
    assert_int_equal(existed, 1);
    assert_int_equal(id, a);
    assert_int_equal(tq_queue_find_submission(f->s, "key-1"), a);
    assert_int_equal(tq_queue_find_submission(f->s, "nope"), 0);
    int64_t b = submit(f->s, 0, "key-2");
    assert_true(b != a);
    submit(f->s, 0, NULL);   /* no key: never a duplicate */
    submit(f->s, 0, "");
    int64_t counts[5];
    tq_queue_counts(f->s, counts);
    assert_int_equal(counts[0], 4);
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_string_equal(j.name, "j");   /* the first submission's row, untouched */
    assert_string_equal(j.submission_id, "key-1");
    assert_int_equal(j.planned_peak_bytes, 1234);
    assert_int_equal(j.planned_cpu_bytes, 2000);
    assert_int_equal(j.planned_gpu_bytes, 3000);
    assert_string_equal(j.spec, SPEC);
    tq_job_free(&j);
}

static void test_cancel_rules(void **state) {
    fx *f = *state;
    int64_t q = submit(f->s, 0, NULL), r = submit(f->s, 10, NULL);
    assert_int_equal(claim(f->s), r);
    char was[16];
    /* queued: cancelled at once */
    assert_int_equal(tq_queue_cancel(f->s, q, was), TQ_STORE_OK);
    assert_string_equal(was, "queued");
    state_is(f->s, q, "cancelled");
    tq_job j;
    tq_queue_get(f->s, q, &j);
    assert_true(j.finished_at > 0);
    tq_job_free(&j);
    /* running: a request the worker polls */
    assert_int_equal(tq_queue_cancel_requested(f->s, r), 0);
    assert_int_equal(tq_queue_cancel(f->s, r, was), TQ_STORE_OK);
    assert_string_equal(was, "running");
    state_is(f->s, r, "running");
    assert_int_equal(tq_queue_cancel_requested(f->s, r), 1);
    assert_int_equal(tq_queue_finish(f->s, r, "cancelled", "{\"state\":\"cancelled\"}", NULL, NULL), TQ_STORE_OK);
    /* finished: conflict */
    assert_int_equal(tq_queue_cancel(f->s, r, was), TQ_STORE_ECONFLICT);
    assert_string_equal(was, "cancelled");
    assert_int_equal(tq_queue_cancel(f->s, q, was), TQ_STORE_ECONFLICT);
    assert_int_equal(tq_queue_cancel(f->s, 999, was), TQ_STORE_ENOJOB);
    assert_int_equal(tq_queue_cancel_requested(f->s, 999), TQ_STORE_ENOJOB);
    /* finishing twice, or a job not running */
    assert_int_equal(tq_queue_finish(f->s, r, "failed", NULL, "x", "y"), TQ_STORE_ECONFLICT);
    assert_int_equal(tq_queue_finish(f->s, 999, "failed", NULL, "x", "y"), TQ_STORE_ENOJOB);
    assert_int_equal(tq_queue_finish(f->s, r, "running", NULL, NULL, NULL), TQ_STORE_ERR);
}

static void test_delete_rules(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, NULL), b = submit(f->s, 0, NULL);
    assert_int_equal(tq_queue_delete(f->s, a), TQ_STORE_ECONFLICT);   /* queued */
    assert_int_equal(claim(f->s), a);
    assert_int_equal(tq_queue_delete(f->s, a), TQ_STORE_ECONFLICT);   /* running */
    tq_step_rec r = { .step = 1, .epoch = 1, .loss = 2, .lr = 0.1, .loss_scale = -1, .step_ms = 1,
                      .samples_per_s = 1, .device_used_bytes = -1, .time_ms = 1, .total_steps = 2 };
    assert_int_equal(tq_store_add_step(f->s, a, &r), TQ_STORE_OK);
    tq_eval_rec e = { .step = 1, .epoch = 1, .loss = 1, .accuracy = 0.5, .samples = 10, .time_ms = 1 };
    assert_int_equal(tq_store_add_eval(f->s, a, &e), TQ_STORE_OK);
    assert_int_equal(tq_queue_finish(f->s, a, "succeeded", "{}", NULL, NULL), TQ_STORE_OK);
    assert_int_equal(tq_queue_delete(f->s, a), TQ_STORE_OK);
    assert_int_equal(tq_queue_delete(f->s, a), TQ_STORE_ENOJOB);
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, a, &j), 0);
    tq_step_rec *v;
    int n;
    assert_int_equal(tq_queue_steps(f->s, a, 0, 10, &v, &n), TQ_STORE_ENOJOB);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    sqlite3_prepare_v2(db, "SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM evals) + "
                           "(SELECT count(*) FROM events WHERE job_id IS NOT NULL AND job_id = ?1)", -1, &st, NULL);
    sqlite3_bind_int64(st, 1, a);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(st, 0), 0);   /* steps, evals, events cascade */
    sqlite3_finalize(st);
    sqlite3_close(db);
    /* b is the highest id now; deleting it must not hand its id to the next job */
    assert_int_equal(tq_queue_cancel(f->s, b, NULL), TQ_STORE_OK);
    assert_int_equal(tq_queue_delete(f->s, b), TQ_STORE_OK);
    int64_t c = submit(f->s, 0, NULL);
    assert_true(c > b);
    char err[256];
    int64_t d = tq_store_insert_job(f->s, "run", SPEC, 0, NULL, "running", err, sizeof err);
    assert_true(d > c);
}

static void add_steps(tq_store *s, int64_t id, int from, int to) {
    for (int k = from; k <= to; k++) {
        tq_step_rec r = { .step = k, .epoch = 1, .loss = 2, .lr = 0.1, .loss_scale = -1, .step_ms = 1,
                          .samples_per_s = 1, .device_used_bytes = -1, .time_ms = 1, .total_steps = 100 };
        assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    }
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);
}

static void attempts_are(tq_store *s, int64_t id, const char *state, int attempts, int interruptions) {
    tq_job j;
    assert_int_equal(tq_queue_get(s, id, &j), 1);
    assert_string_equal(j.state, state);
    assert_int_equal(j.attempts, attempts);
    assert_int_equal(j.interruptions, interruptions);
    tq_job_free(&j);
}

/* Restarts are not failures: an interrupted start that recorded steps gives its attempt back,
 * by SIGTERM (requeue) or by a crash (recover); one without progress counts, and fails the
 * job at max_attempts; a pending cancel survives either and ends the job cancelled. */
static void test_interruptions(void **state) {
    fx *f = *state;
    int requeued, failed;
    int64_t a = submit(f->s, 0, NULL);
    for (int round = 0; round < 5; round++) {        /* far more than max_attempts (3) */
        assert_int_equal(claim(f->s), a);
        attempts_are(f->s, a, "running", 1, round);
        add_steps(f->s, a, 10 * round + 1, 10 * round + 10);
        if (round % 2) assert_int_equal(tq_queue_recover(f->s, &requeued, &failed), TQ_STORE_OK);
        else assert_int_equal(tq_queue_requeue(f->s, a), TQ_STORE_OK);
        attempts_are(f->s, a, "queued", 0, round + 1);
    }
    /* resumed from a checkpoint before its last recorded step: steps 41..50 are re-done (INSERT
     * OR IGNORE), the max does not grow, so no progress: these starts count */
    for (int k = 1; k <= 3; k++) {
        assert_int_equal(claim(f->s), a);
        add_steps(f->s, a, 41, 50);
        assert_int_equal(tq_queue_recover(f->s, &requeued, &failed), TQ_STORE_OK);
        if (k < 3) attempts_are(f->s, a, "queued", k, 5 + k);
    }
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_string_equal(j.state, "failed");
    assert_string_equal(j.error_code, "worker_crashed");
    assert_non_null(strstr(j.error_message, "without recording a step"));
    tq_job_free(&j);

    /* a cancel asked for while running, then a restart: cancelled, not requeued */
    int64_t b = submit(f->s, 0, NULL), c = submit(f->s, 0, NULL);
    assert_int_equal(claim(f->s), b);
    add_steps(f->s, b, 1, 3);
    assert_int_equal(tq_queue_cancel(f->s, b, NULL), TQ_STORE_OK);
    assert_int_equal(tq_queue_requeue(f->s, b), TQ_STORE_OK);
    assert_int_equal(tq_queue_get(f->s, b, &j), 1);
    assert_string_equal(j.state, "cancelled");
    assert_true(j.finished_at > 0);
    assert_non_null(strstr(j.summary, "\"cancelled\""));
    tq_job_free(&j);
    assert_int_equal(claim(f->s), c);
    assert_int_equal(tq_queue_cancel(f->s, c, NULL), TQ_STORE_OK);
    assert_int_equal(tq_queue_recover(f->s, &requeued, &failed), TQ_STORE_OK);
    state_is(f->s, c, "cancelled");
    assert_int_equal(claim(f->s), 0);                /* neither went back to the queue */
}

/* A start its device turned away (busy: another process took it since the placement) is no
 * start: any number of them leave attempts and interruptions as they were and the job queued;
 * one that never trained has no started_at either; the state event says which device and why;
 * a cancel asked for meanwhile ends it cancelled; only a running job can be turned away. */
static void test_requeue_busy(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, NULL);
    for (int k = 0; k < 5; k++) {                    /* more than max_attempts (3) */
        assert_int_equal(claim(f->s), a);
        attempts_are(f->s, a, "running", 1, 0);
        assert_int_equal(tq_queue_requeue_busy(f->s, a, "cuda:0", "placed on cuda:0, but out of memory"), TQ_STORE_OK);
        attempts_are(f->s, a, "queued", 0, 0);
    }
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_int_equal(j.started_at, 0);               /* it never ran */
    tq_job_free(&j);
    tq_event *ev;
    int n;
    assert_int_equal(tq_queue_events(f->s, a, 0, 100, &ev, &n), TQ_STORE_OK);
    assert_int_equal(n, 11);                         /* queued, then 5 × (running, queued) */
    assert_non_null(strstr(ev[n - 1].data, "\"state\":\"queued\""));
    assert_non_null(strstr(ev[n - 1].data, "\"device_busy\":{\"device\":\"cuda:0\",\"message\":\"placed on cuda:0, but out of memory\"}"));
    assert_null(strstr(ev[n - 2].data, "device_busy"));
    tq_events_free(ev, n);
    /* one that trained before (interrupted, then turned away): keeps its first start and counts */
    assert_int_equal(claim(f->s), a);
    add_steps(f->s, a, 1, 5);
    assert_int_equal(tq_queue_requeue(f->s, a), TQ_STORE_OK);
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    int64_t first = j.started_at;
    tq_job_free(&j);
    assert_true(first > 0);
    assert_int_equal(claim(f->s), a);
    assert_int_equal(tq_queue_requeue_busy(f->s, a, "cuda:1", "busy"), TQ_STORE_OK);
    attempts_are(f->s, a, "queued", 0, 1);
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_int_equal(j.started_at, first);
    tq_job_free(&j);
    /* not running: a conflict, nothing changed */
    assert_int_equal(tq_queue_requeue_busy(f->s, a, "cuda:0", "busy"), TQ_STORE_ECONFLICT);
    assert_int_equal(tq_queue_requeue_busy(f->s, 999, "cuda:0", "busy"), TQ_STORE_ENOJOB);
    /* a cancel pending: cancelled, not queued */
    assert_int_equal(claim(f->s), a);
    assert_int_equal(tq_queue_cancel(f->s, a, NULL), TQ_STORE_OK);
    assert_int_equal(tq_queue_requeue_busy(f->s, a, "cuda:0", "busy"), TQ_STORE_OK);
    state_is(f->s, a, "cancelled");
    assert_int_equal(claim(f->s), 0);
}

static void test_recover(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, NULL), b = submit(f->s, 0, NULL), c = submit(f->s, 0, NULL);
    assert_int_equal(claim(f->s), a);   /* attempts 1: crashes → requeued */
    int requeued, failed;
    assert_int_equal(tq_queue_recover(f->s, &requeued, &failed), TQ_STORE_OK);
    assert_int_equal(requeued, 1);
    assert_int_equal(failed, 0);
    state_is(f->s, a, "queued");
    /* a is first again (same priority, lowest id); attempts counts the starts */
    assert_int_equal(claim(f->s), a);
    assert_int_equal(tq_queue_recover(f->s, &requeued, &failed), TQ_STORE_OK);
    assert_int_equal(claim(f->s), a);   /* attempts 3 = max_attempts */
    tq_job j;
    tq_queue_get(f->s, a, &j);
    assert_int_equal(j.attempts, 3);
    assert_int_equal(j.max_attempts, 3);
    tq_job_free(&j);
    assert_int_equal(tq_queue_recover(f->s, &requeued, &failed), TQ_STORE_OK);
    assert_int_equal(requeued, 0);
    assert_int_equal(failed, 1);
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_string_equal(j.state, "failed");
    assert_string_equal(j.error_code, "worker_crashed");
    assert_non_null(strstr(j.error_message, "attempt 3"));
    assert_non_null(j.summary);
    assert_true(j.finished_at > 0);
    tq_job_free(&j);
    /* a graceful requeue keeps attempts */
    assert_int_equal(claim(f->s), b);
    assert_int_equal(tq_queue_requeue(f->s, b), TQ_STORE_OK);
    assert_int_equal(tq_queue_get(f->s, b, &j), 1);
    assert_string_equal(j.state, "queued");
    assert_int_equal(j.attempts, 1);
    tq_job_free(&j);
    assert_int_equal(tq_queue_requeue(f->s, b), TQ_STORE_ECONFLICT);   /* not running */
    assert_int_equal(tq_queue_recover(f->s, &requeued, &failed), TQ_STORE_OK);
    assert_int_equal(requeued + failed, 0);
    state_is(f->s, c, "queued");
    /* state events in order for b: queued, running, queued */
    tq_event *ev;
    int n;
    assert_int_equal(tq_queue_events(f->s, b, 0, 100, &ev, &n), TQ_STORE_OK);
    assert_int_equal(n, 3);
    assert_non_null(strstr(ev[0].data, "\"queued\""));
    assert_non_null(strstr(ev[1].data, "\"running\""));
    assert_non_null(strstr(ev[2].data, "\"queued\""));
    int64_t after = ev[1].id;
    tq_events_free(ev, n);
    assert_int_equal(tq_queue_events(f->s, b, after, 100, &ev, &n), TQ_STORE_OK);
    assert_int_equal(n, 1);   /* only what came after */
    tq_events_free(ev, n);
}

static void test_paging(void **state) {
    fx *f = *state;
    int64_t ids[25];
    for (int i = 0; i < 25; i++) ids[i] = submit(f->s, 0, NULL);
    for (int i = 0; i < 5; i++) claim(f->s);   /* ids[0..4] running */
    tq_job *jobs;
    int n;
    int64_t next;
    /* newest first, 10 per page */
    assert_int_equal(tq_queue_list(f->s, NULL, 0, 10, &jobs, &n, &next), TQ_STORE_OK);
    assert_int_equal(n, 10);
    assert_int_equal(jobs[0].id, ids[24]);
    assert_int_equal(jobs[9].id, ids[15]);
    assert_int_equal(next, ids[15]);
    tq_jobs_free(jobs, n);
    assert_int_equal(tq_queue_list(f->s, NULL, next, 10, &jobs, &n, &next), TQ_STORE_OK);
    assert_int_equal(n, 10);
    assert_int_equal(jobs[0].id, ids[14]);
    tq_jobs_free(jobs, n);
    assert_int_equal(tq_queue_list(f->s, NULL, next, 10, &jobs, &n, &next), TQ_STORE_OK);
    assert_int_equal(n, 5);
    assert_int_equal(next, 0);   /* last page */
    tq_jobs_free(jobs, n);
    /* a state filter */
    assert_int_equal(tq_queue_list(f->s, "running", 0, 100, &jobs, &n, &next), TQ_STORE_OK);
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++) assert_string_equal(jobs[i].state, "running");
    assert_int_equal(next, 0);
    tq_jobs_free(jobs, n);
    assert_int_equal(tq_queue_list(f->s, "queued", 0, 100, &jobs, &n, &next), TQ_STORE_OK);
    assert_int_equal(n, 20);
    assert_int_equal(jobs[0].queue_position, 20);   /* newest is last in line */
    assert_int_equal(jobs[19].queue_position, 1);
    tq_jobs_free(jobs, n);
    /* exactly a page: no next */
    assert_int_equal(tq_queue_list(f->s, "running", 0, 5, &jobs, &n, &next), TQ_STORE_OK);
    assert_int_equal(n, 5);
    assert_int_equal(next, 0);
    tq_jobs_free(jobs, n);
    assert_int_equal(tq_queue_list(f->s, NULL, 0, 0, &jobs, &n, &next), TQ_STORE_ERR);
    assert_int_equal(tq_queue_list(f->s, NULL, 0, 1001, &jobs, &n, &next), TQ_STORE_ERR);
}

static void test_steps_read(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, NULL);
    claim(f->s);
    assert_int_equal(tq_queue_set_progress(f->s, a, 50, "cpu"), TQ_STORE_OK);
    for (int i = 1; i <= 50; i++) {
        tq_step_rec r = { .step = i, .epoch = 1 + i / 20, .loss = 1.0 / i, .lr = 0.1,
                          .loss_scale = i % 2 ? -1 : 1024, .skipped = i == 7, .step_ms = 2,
                          .samples_per_s = 100, .mem_allocated_bytes = 10, .mem_peak_bytes = 20,
                          .mem_reserved_bytes = 30, .device_used_bytes = -1, .time_ms = 1000 + i,
                          .total_steps = 50 };
        assert_int_equal(tq_store_add_step(f->s, a, &r), TQ_STORE_OK);
    }
    assert_int_equal(tq_store_flush(f->s), TQ_STORE_OK);
    tq_step_rec *v;
    int n;
    assert_int_equal(tq_queue_steps(f->s, a, 0, 1000, &v, &n), TQ_STORE_OK);
    assert_int_equal(n, 50);
    for (int i = 0; i < n; i++) assert_int_equal(v[i].step, i + 1);
    assert_true(v[0].loss_scale < 0);
    assert_true(v[1].loss_scale == 1024);
    assert_int_equal(v[6].skipped, 1);
    assert_true(v[0].device_used_bytes < 0);
    free(v);
    assert_int_equal(tq_queue_steps(f->s, a, 45, 3, &v, &n), TQ_STORE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(v[0].step, 46);
    free(v);
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_int_equal(j.has_latest, 1);
    assert_int_equal(j.latest.step, 50);
    assert_int_equal(j.total_steps, 50);
    tq_job_free(&j);
    tq_eval_rec e1 = { .step = 50, .epoch = 3, .loss = 0.5, .accuracy = 0.9, .samples = 100, .kind = TQ_EVAL_INT8, .time_ms = 5 };
    tq_eval_rec e0 = e1;
    e0.kind = TQ_EVAL_EVAL;
    tq_store_add_eval(f->s, a, &e1);
    tq_store_add_eval(f->s, a, &e0);
    tq_store_flush(f->s);
    tq_eval_rec *ev;
    assert_int_equal(tq_queue_evals(f->s, a, 0, &ev, &n), TQ_STORE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ev[0].kind, TQ_EVAL_EVAL);
    assert_int_equal(ev[1].kind, TQ_EVAL_INT8);
    free(ev);
    assert_int_equal(tq_queue_evals(f->s, a, 1, &ev, &n), TQ_STORE_OK);
    assert_int_equal(n, 1);
    free(ev);
}

/* The scheduler's reads and writes: the queue in order with what placement needs, a claim of
 * one chosen job (device and threads recorded; refused once it is no longer queued), and a
 * queued job failed because it can never start. */
static void test_placement_reads_and_claims(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, NULL), b = submit(f->s, 5, NULL), c = submit(f->s, 0, NULL);
    tq_queued *q;
    int n;
    assert_int_equal(tq_queue_queued(f->s, 10, &q, &n), TQ_STORE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(q[0].id, b);
    assert_int_equal(q[1].id, a);
    assert_int_equal(q[2].id, c);
    assert_string_equal(q[0].device, "auto");   /* the SPEC gives none */
    assert_int_equal(q[0].cpu_bytes, 2000);
    assert_int_equal(q[0].gpu_bytes, 3000);
    free(q);
    assert_int_equal(tq_queue_queued(f->s, 1, &q, &n), TQ_STORE_OK);
    assert_int_equal(n, 1);
    free(q);

    assert_int_equal(tq_queue_claim_job(f->s, c, "cpu", 2), 1);   /* out of order: placement chose it */
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, c, &j), 1);
    assert_string_equal(j.state, "running");
    assert_string_equal(j.device, "cpu");
    assert_int_equal(j.threads, 2);
    assert_int_equal(j.attempts, 1);
    tq_job_free(&j);
    assert_int_equal(tq_queue_claim_job(f->s, c, "cpu", 2), 0);   /* already running */
    char was[16];
    assert_int_equal(tq_queue_cancel(f->s, a, was), TQ_STORE_OK);
    assert_int_equal(tq_queue_claim_job(f->s, a, "cuda:1", 0), 0);

    assert_int_equal(tq_queue_fail_queued(f->s, b, "cannot_fit", "too big"), 1);
    assert_int_equal(tq_queue_get(f->s, b, &j), 1);
    assert_string_equal(j.state, "failed");
    assert_string_equal(j.error_code, "cannot_fit");
    assert_non_null(strstr(j.summary, "too big"));
    tq_job_free(&j);
    assert_int_equal(tq_queue_fail_queued(f->s, b, "cannot_fit", "again"), 0);
    assert_int_equal(tq_queue_queued(f->s, 10, &q, &n), TQ_STORE_OK);
    assert_int_equal(n, 0);
    free(q);
}

/* ---- requeue of a finished job, dependencies (issue 17) ---------------------------------- */

static int64_t submit_after(tq_store *s, const char *after, int *rc_out) {
    char spec[256];
    snprintf(spec, sizeof spec, "{\"model\":\"cnn\",\"steps\":10,\"after\":%s}", after);
    int64_t id = 0;
    int existed = 0;
    tq_job_plan plan = { 1234, 2000, 3000 };
    int rc = tq_queue_submit(s, "dep", spec, 0, NULL, &plan, &id, &existed);
    if (rc_out) *rc_out = rc;
    else assert_int_equal(rc, TQ_STORE_OK);
    return id;
}

static void job_is(tq_store *s, int64_t id, const char *state, const char *code) {
    tq_job j;
    assert_int_equal(tq_queue_get(s, id, &j), 1);
    if (strcmp(j.state, state) || strcmp(j.error_code, code))
        fail_msg("job %lld: %s/%s, wanted %s/%s (%s)", (long long)id, j.state, j.error_code, state, code,
                 j.error_message ? j.error_message : "");
    tq_job_free(&j);
}

static void pending_deps(tq_store *s, int64_t id, int want) {
    tq_queued *q;
    int n, found = 0;
    assert_int_equal(tq_queue_queued(s, 100, &q, &n), TQ_STORE_OK);
    for (int i = 0; i < n; i++)
        if (q[i].id == id) { found = 1; assert_int_equal(q[i].ndeps, want); assert_true(q[i].eligible_at > 0); }
    free(q);
    assert_true(found);
}

static void test_requeue_finished(void **state) {
    fx *f = *state;
    int64_t a = submit(f->s, 0, NULL), b = submit(f->s, 0, NULL), c = submit(f->s, 0, NULL);
    char was[16];
    /* queued, running, succeeded: conflicts; unknown: no job */
    assert_int_equal(tq_queue_requeue_finished(f->s, a, was), TQ_STORE_ECONFLICT);
    assert_string_equal(was, "queued");
    assert_int_equal(tq_queue_claim_job(f->s, a, "cpu", 1), 1);
    assert_int_equal(tq_queue_requeue_finished(f->s, a, was), TQ_STORE_ECONFLICT);
    assert_string_equal(was, "running");
    tq_step_rec r = { .step = 1, .epoch = 1, .loss = 2.0, .time_ms = 1 };
    for (int k = 1; k <= 4; k++) { r.step = k; assert_int_equal(tq_store_add_step(f->s, a, &r), 0); }
    assert_int_equal(tq_queue_finish(f->s, a, "cancelled", "{\"state\":\"cancelled\",\"steps\":4}", NULL, NULL), 0);
    assert_int_equal(tq_queue_requeue_finished(f->s, 999, was), TQ_STORE_ENOJOB);
    assert_int_equal(tq_queue_claim_job(f->s, b, "cpu", 1), 1);
    assert_int_equal(tq_queue_finish(f->s, b, "succeeded", "{\"state\":\"succeeded\"}", NULL, NULL), 0);
    assert_int_equal(tq_queue_requeue_finished(f->s, b, was), TQ_STORE_ECONFLICT);
    assert_string_equal(was, "succeeded");

    /* cancelled mid-run: back to queued, the outcome cleared, the history in the event */
    assert_int_equal(tq_queue_requeue_finished(f->s, a, was), TQ_STORE_OK);
    assert_string_equal(was, "cancelled");
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_string_equal(j.state, "queued");
    assert_int_equal(j.attempts, 0);
    assert_int_equal(j.requeues, 1);
    assert_true(j.requeued_at > 0);
    assert_int_equal(j.started_at, 0);
    assert_int_equal(j.finished_at, 0);
    assert_null(j.summary);
    assert_string_equal(j.error_code, "");
    assert_true(j.has_latest && j.latest.step == 4);   /* its steps stay */
    tq_job_free(&j);
    tq_event *ev;
    int n;
    assert_int_equal(tq_queue_events(f->s, a, 0, 100, &ev, &n), TQ_STORE_OK);
    assert_true(n >= 4);
    assert_string_equal(ev[n - 1].type, "state");
    assert_non_null(strstr(ev[n - 1].data, "\"state\":\"queued\""));
    assert_non_null(strstr(ev[n - 1].data, "\"requeued\":{\"from\":\"cancelled\",\"step\":4"));
    tq_events_free(ev, n);
    /* it claims and runs again */
    assert_int_equal(tq_queue_claim_job(f->s, a, "cpu", 1), 1);
    assert_int_equal(tq_queue_get(f->s, a, &j), 1);
    assert_int_equal(j.attempts, 1);
    assert_true(j.started_at > 0);
    tq_job_free(&j);

    /* a failed job: error cleared; cancelled while queued: too */
    assert_int_equal(tq_queue_fail_queued(f->s, c, "cannot_fit", "too big"), 1);
    assert_int_equal(tq_queue_requeue_finished(f->s, c, was), TQ_STORE_OK);
    job_is(f->s, c, "queued", "");
    assert_int_equal(tq_queue_cancel(f->s, c, was), TQ_STORE_OK);
    assert_int_equal(tq_queue_requeue_finished(f->s, c, was), TQ_STORE_OK);
    assert_int_equal(tq_queue_get(f->s, c, &j), 1);
    assert_int_equal(j.requeues, 2);
    tq_job_free(&j);
}

static void test_dependencies(void **state) {
    fx *f = *state;
    int rc;
    int64_t a = submit(f->s, 0, NULL);
    /* unknown ids are refused; a job can only name older ones */
    submit_after(f->s, "[999]", &rc);
    assert_int_equal(rc, TQ_STORE_EDEPENDENCY);
    assert_non_null(strstr(tq_store_errmsg(f->s), "after[0]"));
    assert_non_null(strstr(tq_store_errmsg(f->s), "999"));
    char after[64];
    snprintf(after, sizeof after, "[%lld,%lld]", (long long)a, (long long)a + 1);   /* the next id: itself */
    submit_after(f->s, after, &rc);
    assert_int_equal(rc, TQ_STORE_EDEPENDENCY);
    assert_non_null(strstr(tq_store_errmsg(f->s), "after[1]"));

    /* b after a, c after b (a chain), d after a and x, e independent */
    snprintf(after, sizeof after, "[%lld]", (long long)a);
    int64_t b = submit_after(f->s, after, NULL);
    snprintf(after, sizeof after, "[%lld]", (long long)b);
    int64_t c = submit_after(f->s, after, NULL);
    int64_t x = submit(f->s, 0, NULL);
    snprintf(after, sizeof after, "[%lld,%lld]", (long long)a, (long long)x);
    int64_t d = submit_after(f->s, after, NULL);
    int64_t e = submit(f->s, 0, NULL);
    pending_deps(f->s, b, 1);
    pending_deps(f->s, c, 1);
    pending_deps(f->s, d, 2);
    pending_deps(f->s, e, 0);
    int nf = -1;
    assert_int_equal(tq_queue_fail_blocked(f->s, &nf), TQ_STORE_OK);
    assert_int_equal(nf, 0);

    /* a succeeds: b may run, d still waits for x */
    assert_int_equal(tq_queue_claim_job(f->s, a, "cpu", 1), 1);
    assert_int_equal(tq_queue_finish(f->s, a, "succeeded", NULL, NULL, NULL), 0);
    pending_deps(f->s, b, 0);
    pending_deps(f->s, d, 1);
    /* deleting a job that succeeded does not fail the jobs after it */
    assert_int_equal(tq_queue_delete(f->s, a), TQ_STORE_OK);
    pending_deps(f->s, b, 0);
    job_is(f->s, d, "queued", "");

    /* b fails: c fails with it (cascade), naming b and its outcome */
    assert_int_equal(tq_queue_claim_job(f->s, b, "cpu", 1), 1);
    assert_int_equal(tq_queue_finish(f->s, b, "failed", NULL, "out_of_memory", "boom"), 0);
    job_is(f->s, c, "failed", "dependency_failed");
    tq_job j;
    assert_int_equal(tq_queue_get(f->s, c, &j), 1);
    char want[64];
    snprintf(want, sizeof want, "job %lld", (long long)b);
    assert_non_null(strstr(j.error_message, want));
    assert_non_null(strstr(j.error_message, "out_of_memory"));
    assert_non_null(strstr(j.summary, "dependency_failed"));
    assert_true(j.finished_at > 0);
    tq_job_free(&j);

    /* requeue of c is refused while b is failed; after b's requeue, c's is accepted and waits */
    char was[16];
    assert_int_equal(tq_queue_requeue_finished(f->s, c, was), TQ_STORE_EDEPENDENCY);
    assert_non_null(strstr(tq_store_errmsg(f->s), want));
    job_is(f->s, c, "failed", "dependency_failed");
    assert_int_equal(tq_queue_requeue_finished(f->s, b, was), TQ_STORE_OK);
    assert_int_equal(tq_queue_requeue_finished(f->s, c, was), TQ_STORE_OK);
    pending_deps(f->s, c, 1);

    /* cancelling a queued dependency fails its dependents at once, down the chain */
    assert_int_equal(tq_queue_cancel(f->s, b, was), TQ_STORE_OK);
    job_is(f->s, c, "failed", "dependency_failed");
    assert_int_equal(tq_queue_get(f->s, c, &j), 1);
    assert_non_null(strstr(j.error_message, "cancelled"));
    tq_job_free(&j);

    /* a new job after a failed one is accepted and fails at once */
    snprintf(after, sizeof after, "[%lld]", (long long)c);
    int64_t g = submit_after(f->s, after, NULL);
    job_is(f->s, g, "failed", "dependency_failed");

    /* x is cancelled by a pending cancel at an interruption: d fails too */
    assert_int_equal(tq_queue_claim_job(f->s, x, "cpu", 1), 1);
    assert_int_equal(tq_queue_cancel(f->s, x, was), TQ_STORE_OK);
    assert_int_equal(tq_queue_requeue(f->s, x), TQ_STORE_OK);
    job_is(f->s, x, "cancelled", "");
    job_is(f->s, d, "failed", "dependency_failed");
    job_is(f->s, e, "queued", "");   /* untouched */

    /* the sweep on its own: a dependency failed behind the queue's back (a hand edit) */
    snprintf(after, sizeof after, "[%lld]", (long long)e);
    int64_t h = submit_after(f->s, after, NULL);
    assert_int_equal(tq_queue_claim_job(f->s, e, "cpu", 1), 1);
    assert_int_equal(tq_store_finish_job(f->s, e, "failed", NULL, "timeout", "slow"), 0);   /* no sweep here */
    job_is(f->s, h, "queued", "");
    assert_int_equal(tq_queue_fail_blocked(f->s, &nf), TQ_STORE_OK);
    assert_int_equal(nf, 1);
    job_is(f->s, h, "failed", "dependency_failed");
}

/* A database at schema version 1 (before placement's columns) upgrades in place when opened:
 * its jobs still read, with the new columns unknown, and still claim. */
static void test_upgrade_from_version_1(void **state) {
    (void)state;
    char dir[64] = "/tmp/tq-upgrade-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/old.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    const tq_migration *m = tq_migrations(NULL);
    assert_int_equal(sqlite3_exec(db, m[0].sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "PRAGMA user_version = 1; INSERT INTO jobs (name, spec, created_at, "
                                      "planned_peak_bytes) VALUES ('old', '{\"model\":\"cnn\"}', 1, 77)",
                                  NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    char err[256];
    tq_store *s = tq_store_open(path, err, sizeof err);
    assert_non_null(s);
    tq_job j;
    assert_int_equal(tq_queue_get(s, 1, &j), 1);
    assert_string_equal(j.name, "old");
    assert_int_equal(j.planned_peak_bytes, 77);
    assert_int_equal(j.planned_cpu_bytes, -1);
    assert_int_equal(j.planned_gpu_bytes, -1);
    tq_job_free(&j);
    tq_queued *q;
    int n;
    assert_int_equal(tq_queue_queued(s, 10, &q, &n), TQ_STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(q[0].cpu_bytes, -1);
    free(q);
    assert_int_equal(tq_queue_claim_job(s, 1, "cpu", 1), 1);
    tq_store_close(s);
    char p2[160];
    static const char *const suffix[] = { "", "-wal", "-shm" };
    for (int i = 0; i < 3; i++) { snprintf(p2, sizeof p2, "%s%s", path, suffix[i]); unlink(p2); }
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upgrade_from_version_1),
        cmocka_unit_test_setup_teardown(test_placement_reads_and_claims, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interruptions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_requeue_busy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_atomic_claim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotent_submit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_paging, setup, teardown),
        cmocka_unit_test_setup_teardown(test_steps_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_requeue_finished, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dependencies, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
