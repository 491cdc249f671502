/* test_store.c — schema/store.c and schema/migrations.c: migrations on a fresh database
 * (user_version, tables and columns exactly as CONTRACT.md), reopening, refusing a newer
 * schema, the embedded SQL equal to the schema/migrations files, job rows, batched step/eval
 * writes (far fewer transactions than records), duplicates ignored, NULLs, finish_job.
 * Run from the repository root (the migration-text check reads schema/migrations/). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "schema/migrations.h"
#include "schema/store.h"
#include "schema/store_internal.h"

/* ---- fixture: a fresh temporary directory per test ----------------------------------- */

typedef struct {
    char dir[64];
    char path[128];
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/tq-store-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/trainq.db", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    char p[160];
    static const char *const suffix[] = { "", "-wal", "-shm", "-journal" };
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s%s", f->path, suffix[i]);
        unlink(p);
    }
    rmdir(f->dir);
    free(f);
    return 0;
}

static tq_store *open_ok(const char *path) {
    char err[512] = "x";
    tq_store *s = tq_store_open(path, err, sizeof err);
    if (!s) print_error("tq_store_open(%s): %s\n", path, err);
    assert_non_null(s);
    assert_string_equal(err, "");
    return s;
}

/* A second, plain connection for looking at what the store wrote. */
static sqlite3 *peek_open(const char *path) {
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

static int64_t q_int(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        print_error("%s: %s\n", sql, sqlite3_errmsg(db));
    assert_non_null(st);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* The first column of the first row as text ("NULL" for NULL) into buf. */
static const char *q_text(sqlite3 *db, const char *sql, char *buf, size_t n) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        print_error("%s: %s\n", sql, sqlite3_errmsg(db));
    assert_non_null(st);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const unsigned char *t = sqlite3_column_text(st, 0);
    snprintf(buf, n, "%s", t ? (const char *)t : "NULL");
    sqlite3_finalize(st);
    return buf;
}

/* Column names of a table, comma-separated, in order (PRAGMA table_info). */
static void columns(sqlite3 *db, const char *table, char *buf, size_t n) {
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                              "pragma_table_info('%s') ORDER BY cid)", table);
    q_text(db, sql, buf, n);
}

static tq_step_rec step_rec(int64_t step) {
    tq_step_rec r;
    memset(&r, 0, sizeof r);
    r.step = step;
    r.epoch = (int)(step / 100);
    r.loss = 2.5 - (double)step * 1e-3;
    r.lr = 0.05;
    r.loss_scale = -1;
    r.skipped = 0;
    r.step_ms = 12.5;
    r.samples_per_s = 2560;
    r.mem_allocated_bytes = 1000 + step;
    r.mem_peak_bytes = 2000 + step;
    r.mem_reserved_bytes = 4096;
    r.device_used_bytes = -1;
    r.time_ms = 1700000000000LL + step;
    r.total_steps = 1000;
    return r;
}

static const char *const SPEC = "{\"model\":\"cnn\",\"batch_size\":32}";

static int64_t insert_ok(tq_store *s, const char *state, const char *subid) {
    char err[256];
    int64_t id = tq_store_insert_job(s, "job", SPEC, 0, subid, state, err, sizeof err);
    if (id <= 0) print_error("insert_job: %s\n", err);
    assert_true(id > 0);
    return id;
}

/* ---- migrations ----------------------------------------------------------------------- */

static void test_fresh_schema(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int n;
    tq_migrations(&n);
    assert_true(n >= 1);
    assert_int_equal(tq_store_commits(s), n);   /* one transaction per migration */
    sqlite3 *db = peek_open(f->path);
    char buf[1024];
    assert_int_equal(q_int(db, "PRAGMA user_version"), n);
    assert_string_equal(q_text(db, "PRAGMA journal_mode", buf, sizeof buf), "wal");
    assert_string_equal(q_text(db, "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                                   "sqlite_schema WHERE type = 'table' ORDER BY name)",
                               buf, sizeof buf),
                        "evals,events,jobs,steps");
    columns(db, "jobs", buf, sizeof buf);
    assert_string_equal(buf, "id,name,state,spec,priority,submission_id,created_at,started_at,"
                             "finished_at,attempts,max_attempts,device,total_steps,summary,"
                             "error_code,error_message,planned_peak_bytes,checkpoint_path,"
                             "cancel_requested,planned_cpu_bytes,planned_gpu_bytes,threads,interruptions,start_step,owner,owner_uid,inputs,"
                             "requeues,requeued_at");
    columns(db, "steps", buf, sizeof buf);
    assert_string_equal(buf, "job_id,step,epoch,loss,lr,loss_scale,skipped,step_ms,samples_per_s,"
                             "mem_allocated_bytes,mem_peak_bytes,mem_reserved_bytes,"
                             "device_used_bytes,time");
    columns(db, "evals", buf, sizeof buf);
    assert_string_equal(buf, "job_id,step,epoch,loss,accuracy,samples,kind,time");
    columns(db, "events", buf, sizeof buf);
    assert_string_equal(buf, "id,job_id,time,type,data");
    /* primary keys */
    assert_string_equal(q_text(db, "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                                   "pragma_table_info('steps') WHERE pk > 0 ORDER BY pk)",
                               buf, sizeof buf), "job_id,step");
    assert_string_equal(q_text(db, "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                                   "pragma_table_info('evals') WHERE pk > 0 ORDER BY pk)",
                               buf, sizeof buf), "job_id,step,kind");
    /* the queue's indexes */
    assert_int_equal(q_int(db, "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND "
                               "name IN ('jobs_queue', 'jobs_state', 'events_job')"), 3);
    /* foreign keys cascade from jobs */
    assert_int_equal(q_int(db, "SELECT count(*) FROM pragma_foreign_key_list('steps') WHERE "
                               "\"table\" = 'jobs' AND on_delete = 'CASCADE'"), 1);
    assert_int_equal(q_int(db, "SELECT count(*) FROM pragma_foreign_key_list('evals') WHERE "
                               "\"table\" = 'jobs' AND on_delete = 'CASCADE'"), 1);
    sqlite3_close(db);
    tq_store_close(s);
}

static void test_reopen_is_noop(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int64_t id = insert_ok(s, "queued", "keep-me");
    tq_store_close(s);
    s = open_ok(f->path);
    assert_int_equal(tq_store_commits(s), 0);   /* no migration ran again */
    tq_store_close(s);
    sqlite3 *db = peek_open(f->path);
    int n;
    tq_migrations(&n);
    assert_int_equal(q_int(db, "PRAGMA user_version"), n);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE id = %lld AND submission_id = 'keep-me'",
             (long long)id);
    assert_int_equal(q_int(db, sql), 1);
    sqlite3_close(db);
}

static void test_newer_schema_refused(void **state) {
    fx *f = *state;
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE future (x); PRAGMA user_version = 99", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    char err[512] = "";
    tq_store *s = tq_store_open(f->path, err, sizeof err);
    assert_null(s);
    assert_non_null(strstr(err, "newer"));
    assert_non_null(strstr(err, "99"));
    db = peek_open(f->path);
    assert_int_equal(q_int(db, "PRAGMA user_version"), 99);   /* untouched */
    assert_int_equal(q_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'jobs'"), 0);
    sqlite3_close(db);
}

static void test_open_failure(void **state) {
    fx *f = *state;
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "%s/no/such/dir/trainq.db", f->dir);
    assert_null(tq_store_open(path, err, sizeof err));
    assert_true(strlen(err) > 0);
    assert_null(tq_store_open("", err, sizeof err));
    assert_true(strlen(err) > 0);
    assert_null(tq_store_open(NULL, NULL, 0));
    tq_store_close(NULL);
}

static char *read_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) { free(buf); buf = NULL; }
    if (buf) buf[n] = 0;
    fclose(fp);
    return buf;
}

/* The embedded migrations are the .sql files, byte for byte, numbered 1, 2, … */
static void test_embedded_sql_matches_files(void **state) {
    (void)state;
    int n;
    const tq_migration *m = tq_migrations(&n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(m[i].version, i + 1);
        char prefix[16];
        snprintf(prefix, sizeof prefix, "%04d_", i + 1);
        assert_memory_equal(m[i].file, prefix, 5);
        char path[256];
        snprintf(path, sizeof path, "schema/migrations/%s", m[i].file);
        char *text = read_file(path);
        if (!text) print_error("cannot read %s: run the test from the repository root\n", path);
        assert_non_null(text);
        if (strcmp(text, m[i].sql) != 0) {
            size_t k = 0;
            while (text[k] && text[k] == m[i].sql[k]) k++;
            print_error("%s differs from its copy in schema/migrations.c at byte %zu: regenerate it "
                        "(see migrations.c)\n", path, k);
        }
        assert_string_equal(text, m[i].sql);
        free(text);
    }
    /* no .sql file is left out of the binary */
    DIR *d = opendir("schema/migrations");
    assert_non_null(d);
    int files = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len > 4 && !strcmp(de->d_name + len - 4, ".sql")) files++;
    }
    closedir(d);
    assert_int_equal(files, n);
}

/* ---- jobs ----------------------------------------------------------------------------- */

static void test_insert_job(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    char err[256];
    int64_t q = tq_store_insert_job(s, "first", SPEC, 5, "sub-1", "queued", err, sizeof err);
    assert_true(q > 0);
    assert_string_equal(err, "");
    int64_t r = tq_store_insert_job(s, NULL, SPEC, -3, NULL, "running", err, sizeof err);
    assert_true(r > q);
    /* no submission_id twice is fine (NULLs are distinct) */
    int64_t r2 = tq_store_insert_job(s, "x", SPEC, 0, "", "queued", NULL, 0);
    assert_true(r2 > r);
    /* a taken submission_id */
    assert_int_equal(tq_store_insert_job(s, "dup", SPEC, 0, "sub-1", "queued", err, sizeof err),
                     TQ_STORE_EDUP);
    assert_non_null(strstr(err, "sub-1"));
    assert_non_null(strstr(tq_store_errmsg(s), "sub-1"));
    /* bad state, bad spec, out-of-range priority */
    assert_int_equal(tq_store_insert_job(s, "bad", SPEC, 0, NULL, "paused", err, sizeof err), TQ_STORE_ERR);
    assert_true(strlen(err) > 0);
    assert_int_equal(tq_store_insert_job(s, "bad", "{not json", 0, NULL, "queued", err, sizeof err), TQ_STORE_ERR);
    assert_int_equal(tq_store_insert_job(s, "bad", NULL, 0, NULL, "queued", err, sizeof err), TQ_STORE_ERR);
    assert_int_equal(tq_store_insert_job(s, "bad", SPEC, 101, NULL, "queued", err, sizeof err), TQ_STORE_ERR);
    tq_store_close(s);

    sqlite3 *db = peek_open(f->path);
    char sql[512], buf[512];
    assert_int_equal(q_int(db, "SELECT count(*) FROM jobs"), 3);
    snprintf(sql, sizeof sql, "SELECT name || '|' || state || '|' || spec || '|' || priority || '|' || "
                              "submission_id || '|' || attempts || '|' || max_attempts || '|' || "
                              "cancel_requested || '|' || (started_at IS NULL) || '|' || "
                              "(finished_at IS NULL) || '|' || (summary IS NULL) FROM jobs WHERE id = %lld",
             (long long)q);
    assert_string_equal(q_text(db, sql, buf, sizeof buf),
                        "first|queued|{\"model\":\"cnn\",\"batch_size\":32}|5|sub-1|0|3|0|1|1|1");
    snprintf(sql, sizeof sql, "SELECT abs(created_at - %lld) < 600000 FROM jobs WHERE id = %lld",
             (long long)time(NULL) * 1000, (long long)q);
    assert_int_equal(q_int(db, sql), 1);   /* unix milliseconds, now */
    snprintf(sql, sizeof sql, "SELECT name || '|' || state || '|' || priority || '|' || attempts || '|' || "
                              "(started_at = created_at) || '|' || (submission_id IS NULL) FROM jobs "
                              "WHERE id = %lld", (long long)r);
    assert_string_equal(q_text(db, sql, buf, sizeof buf), "|running|-3|1|1|1");
    sqlite3_close(db);
}

static void test_finish_job(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int64_t a = insert_ok(s, "running", NULL), b = insert_ok(s, "running", NULL);
    for (int i = 1; i <= 5; i++) {
        tq_step_rec r = step_rec(i);
        assert_int_equal(tq_store_add_step(s, a, &r), TQ_STORE_OK);
    }
    assert_int_equal(tq_store_finish_job(s, a, "succeeded", "{\"state\":\"succeeded\",\"steps\":5}",
                                         NULL, NULL), TQ_STORE_OK);
    assert_int_equal(tq_store_pending(s), 0);   /* flushed first */
    assert_int_equal(tq_store_finish_job(s, b, "failed", "{\"state\":\"failed\"}", "out_of_memory",
                                         "needs 9 GiB, 8 GiB free"), TQ_STORE_OK);
    /* unknown job, non-final state */
    assert_int_equal(tq_store_finish_job(s, 9999, "failed", NULL, NULL, NULL), TQ_STORE_ENOJOB);
    assert_non_null(strstr(tq_store_errmsg(s), "9999"));
    assert_int_equal(tq_store_finish_job(s, a, "running", NULL, NULL, NULL), TQ_STORE_ERR);
    assert_int_equal(tq_store_finish_job(s, a, NULL, NULL, NULL, NULL), TQ_STORE_ERR);
    tq_store_close(s);

    sqlite3 *db = peek_open(f->path);
    char sql[512], buf[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE job_id = %lld", (long long)a);
    assert_int_equal(q_int(db, sql), 5);
    snprintf(sql, sizeof sql, "SELECT state || '|' || summary || '|' || (error_code IS NULL) || '|' || "
                              "(error_message IS NULL) || '|' || (finished_at >= started_at) FROM jobs "
                              "WHERE id = %lld", (long long)a);
    assert_string_equal(q_text(db, sql, buf, sizeof buf),
                        "succeeded|{\"state\":\"succeeded\",\"steps\":5}|1|1|1");
    snprintf(sql, sizeof sql, "SELECT state || '|' || error_code || '|' || error_message FROM jobs "
                              "WHERE id = %lld", (long long)b);
    assert_string_equal(q_text(db, sql, buf, sizeof buf), "failed|out_of_memory|needs 9 GiB, 8 GiB free");
    /* deleting a job removes its steps (ON DELETE CASCADE) */
    assert_int_equal(sqlite3_exec(db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL), SQLITE_OK);
    snprintf(sql, sizeof sql, "DELETE FROM jobs WHERE id = %lld", (long long)a);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(q_int(db, "SELECT count(*) FROM steps"), 0);
    sqlite3_close(db);
}

/* ---- step and eval records ------------------------------------------------------------ */

static void test_batched_steps(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int64_t id = insert_ok(s, "running", NULL);
    int64_t c0 = tq_store_commits(s);
    for (int i = 1; i <= 1000; i++) {
        tq_step_rec r = step_rec(i);
        assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
        assert_true(tq_store_pending(s) < TQ_STORE_BATCH);
    }
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);
    assert_int_equal(tq_store_pending(s), 0);
    int64_t tx = tq_store_commits(s) - c0;
    print_message("1000 steps written in %lld transactions\n", (long long)tx);
    assert_true(tx >= 1000 / TQ_STORE_BATCH);   /* at least the size-triggered flushes */
    assert_true(tx <= 1000 / TQ_STORE_BATCH + 8); /* + the final one and a few timed ones */
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);   /* nothing pending: no transaction */
    assert_int_equal(tq_store_commits(s) - c0, tx);

    sqlite3 *db = peek_open(f->path);
    char sql[512], buf[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE job_id = %lld", (long long)id);
    assert_int_equal(q_int(db, sql), 1000);
    assert_int_equal(q_int(db, "SELECT count(DISTINCT step) FROM steps WHERE step BETWEEN 1 AND 1000"), 1000);
    snprintf(sql, sizeof sql,
             "SELECT step || '|' || epoch || '|' || loss || '|' || lr || '|' || skipped || '|' || "
             "step_ms || '|' || samples_per_s || '|' || mem_allocated_bytes || '|' || "
             "mem_peak_bytes || '|' || mem_reserved_bytes || '|' || time || '|' || "
             "typeof(loss_scale) || '|' || typeof(device_used_bytes) FROM steps WHERE job_id = %lld "
             "AND step = 500", (long long)id);
    assert_string_equal(q_text(db, sql, buf, sizeof buf),
                        "500|5|2.0|0.05|0|12.5|2560.0|1500|2500|4096|1700000000500|null|null");
    sqlite3_close(db);
    tq_store_close(s);
}

static void test_timed_flush(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int64_t id = insert_ok(s, "running", NULL);
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);   /* restarts the flush clock */
    tq_step_rec r = step_rec(1);
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    assert_int_equal(tq_store_pending(s), 1);
    sqlite3 *db = peek_open(f->path);
    assert_int_equal(q_int(db, "SELECT count(*) FROM steps"), 0);   /* not yet written */
    struct timespec ts = { 0, (TQ_STORE_FLUSH_MS + 50) * 1000000L };
    nanosleep(&ts, NULL);
    r = step_rec(2);
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    assert_int_equal(tq_store_pending(s), 0);
    assert_int_equal(q_int(db, "SELECT count(*) FROM steps"), 2);   /* visible to others */
    sqlite3_close(db);
    tq_store_close(s);
}

static void test_duplicates_ignored(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int64_t id = insert_ok(s, "running", NULL);
    tq_step_rec r = step_rec(7);
    r.loss = 1.0;
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);
    r.loss = 2.0;   /* a replay after a resume: the first row stays */
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);   /* and twice in one batch */
    tq_eval_rec e = { .step = 7, .epoch = 0, .loss = 0.5, .accuracy = 0.8, .samples = 100,
                      .kind = TQ_EVAL_EVAL, .time_ms = 1700000000000LL };
    assert_int_equal(tq_store_add_eval(s, id, &e), TQ_STORE_OK);
    e.accuracy = 0.1;
    assert_int_equal(tq_store_add_eval(s, id, &e), TQ_STORE_OK);
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);
    sqlite3 *db = peek_open(f->path);
    assert_int_equal(q_int(db, "SELECT count(*) FROM steps"), 1);
    assert_int_equal(q_int(db, "SELECT loss = 1.0 FROM steps"), 1);
    assert_int_equal(q_int(db, "SELECT count(*) FROM evals"), 1);
    assert_int_equal(q_int(db, "SELECT accuracy = 0.8 FROM evals"), 1);
    sqlite3_close(db);
    tq_store_close(s);
}

static void test_nulls_and_evals(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int64_t id = insert_ok(s, "running", NULL);
    tq_step_rec r = step_rec(1);   /* loss_scale -1, device_used_bytes -1: NULL */
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    r = step_rec(2);
    r.loss_scale = 65536;
    r.device_used_bytes = 123456789;
    r.skipped = 7;   /* any non-zero is true */
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    r = step_rec(3);
    r.loss_scale = 0;   /* 0 is a value, not null */
    r.device_used_bytes = 0;
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    for (int k = 0; k < 3; k++) {
        tq_eval_rec e = { .step = 10, .epoch = 1, .loss = 0.4 + k, .accuracy = 0.9 - 0.1 * k,
                          .samples = 10000, .kind = (tq_eval_kind)k, .time_ms = 1700000000123LL };
        assert_int_equal(tq_store_add_eval(s, id, &e), TQ_STORE_OK);
    }
    tq_eval_rec bad = { .step = 11, .kind = (tq_eval_kind)3 };
    assert_int_equal(tq_store_add_eval(s, id, &bad), TQ_STORE_ERR);
    assert_true(strlen(tq_store_errmsg(s)) > 0);
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);
    sqlite3 *db = peek_open(f->path);
    char buf[256];
    assert_string_equal(q_text(db, "SELECT group_concat(x, ',') FROM (SELECT typeof(loss_scale) || ':' "
                                   "|| typeof(device_used_bytes) || ':' || skipped AS x FROM steps "
                                   "ORDER BY step)", buf, sizeof buf),
                        "null:null:0,real:integer:1,real:integer:0");
    assert_int_equal(q_int(db, "SELECT device_used_bytes FROM steps WHERE step = 2"), 123456789);
    assert_int_equal(q_int(db, "SELECT loss_scale = 65536 FROM steps WHERE step = 2"), 1);
    assert_string_equal(q_text(db, "SELECT group_concat(x, ',') FROM (SELECT kind || ':' || step || ':' "
                                   "|| epoch || ':' || samples || ':' || time AS x FROM evals ORDER BY kind)",
                               buf, sizeof buf),
                        "eval:10:1:10000:1700000000123,int8:10:1:10000:1700000000123,"
                        "pruned:10:1:10000:1700000000123");
    sqlite3_close(db);
    tq_store_close(s);
}

static void test_unknown_job_records(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    tq_step_rec r = step_rec(1);
    assert_int_equal(tq_store_add_step(s, 4242, &r), TQ_STORE_OK);   /* buffered */
    assert_int_equal(tq_store_flush(s), TQ_STORE_ERR);   /* foreign key: never writable */
    assert_non_null(strstr(tq_store_errmsg(s), "4242"));
    assert_int_equal(tq_store_pending(s), 0);            /* so the batch is dropped */
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);
    assert_int_equal(tq_store_add_step(s, 0, &r), TQ_STORE_ERR);
    assert_int_equal(tq_store_add_step(s, 1, NULL), TQ_STORE_ERR);
    assert_int_equal(tq_store_set_durable(s, 1), TQ_STORE_OK);
    assert_int_equal(tq_store_set_durable(s, 0), TQ_STORE_OK);
    tq_store_close(s);
}

/* A record added and never flushed is written by close. */
static void test_close_flushes(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    int64_t id = insert_ok(s, "running", NULL);
    assert_int_equal(tq_store_flush(s), TQ_STORE_OK);
    tq_step_rec r = step_rec(1);
    assert_int_equal(tq_store_add_step(s, id, &r), TQ_STORE_OK);
    tq_store_close(s);
    sqlite3 *db = peek_open(f->path);
    assert_int_equal(q_int(db, "SELECT count(*) FROM steps"), 1);
    sqlite3_close(db);
}

/* The kind of a failure, so that callers answer it without matching messages: a full disk
 * (simulated with max_page_count), a read-only connection (query_only), a database another
 * writer holds (busy), a bad argument. White-box: reaches the store's connection. */
static void test_fault_kinds(void **state) {
    fx *f = *state;
    tq_store *s = open_ok(f->path);
    sqlite3 *db = ((struct tq_store *)s)->db;
    assert_int_equal(tq_store_fault(s), TQ_STORE_FAULT_NONE);
    assert_string_equal(tq_store_path(s), f->path);
    char err[256];

    assert_int_equal(sqlite3_exec(db, "PRAGMA query_only = 1", NULL, NULL, NULL), SQLITE_OK);
    assert_true(tq_store_insert_job(s, "ro", "{}", 0, NULL, "queued", err, sizeof err) < 0);
    assert_int_equal(tq_store_fault(s), TQ_STORE_FAULT_READONLY);
    assert_int_equal(sqlite3_exec(db, "PRAGMA query_only = 0", NULL, NULL, NULL), SQLITE_OK);

    /* full: no page may be added; a job with a large spec needs new pages */
    int pages = 0;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA page_count", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    pages = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA max_page_count = %d", pages);
    assert_int_equal(sqlite3_exec(db, pragma, NULL, NULL, NULL), SQLITE_OK);
    static char big[64 * 1024];
    memset(big, 'x', sizeof big - 16);
    memcpy(big, "{\"pad\":\"", 8);
    strcpy(big + sizeof big - 16, "\"}");
    assert_true(tq_store_insert_job(s, "full", big, 0, NULL, "queued", err, sizeof err) < 0);
    assert_int_equal(tq_store_fault(s), TQ_STORE_FAULT_FULL);
    assert_int_equal(sqlite3_exec(db, "PRAGMA max_page_count = 1073741823", NULL, NULL, NULL), SQLITE_OK);
    assert_true(tq_store_insert_job(s, "fits", big, 0, NULL, "queued", err, sizeof err) > 0);   /* space is back */
    assert_int_equal(tq_store_fault(s), TQ_STORE_FAULT_NONE);

    /* busy: another connection holds the write lock past our (shortened) busy_timeout */
    sqlite3 *other;
    assert_int_equal(sqlite3_open(f->path, &other), SQLITE_OK);
    assert_int_equal(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 20);
    assert_true(tq_store_insert_job(s, "busy", "{}", 0, NULL, "queued", err, sizeof err) < 0);
    assert_int_equal(tq_store_fault(s), TQ_STORE_FAULT_BUSY);
    assert_int_equal(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(other);

    assert_true(tq_store_insert_job(s, "bad", "{}", 0, NULL, "exploded", err, sizeof err) < 0);
    assert_int_equal(tq_store_fault(s), TQ_STORE_FAULT_OTHER);
    tq_store_close(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fresh_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_kinds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen_is_noop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_failure, setup, teardown),
        cmocka_unit_test(test_embedded_sql_matches_files),
        cmocka_unit_test_setup_teardown(test_insert_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_finish_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batched_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timed_flush, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicates_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nulls_and_evals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_job_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_flushes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
