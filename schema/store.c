/* store.c — the SQLite store (see store.h): connection setup, migrations, job rows, batched
 * step/eval writes. */
#include "store.h"
#include "migrations.h"
#include "store_internal.h"
#include "codes.h"
#include <errno.h>

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const eval_kinds[] = { "eval", "pruned", "int8" };

/* ---- helpers -------------------------------------------------------------------------- */

static int64_t realtime_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int set_err(tq_store *s, const char *fmt, ...) {
    s->fault = TQ_STORE_FAULT_OTHER;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    (void)n;
    return TQ_STORE_ERR;
}

/* the kind of the connection's last SQLite error (store.h) */
static tq_store_fault_kind fault_of(sqlite3 *db) {
    int code = sqlite3_extended_errcode(db) & 0xff, sys = sqlite3_system_errno(db);
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED) return TQ_STORE_FAULT_BUSY;
    if (code == SQLITE_FULL || sys == ENOSPC || sys == EDQUOT) return TQ_STORE_FAULT_FULL;
    if (code == SQLITE_READONLY || code == SQLITE_PERM || code == SQLITE_CANTOPEN || sys == EROFS ||
        sys == EACCES || sys == EPERM)
        return TQ_STORE_FAULT_READONLY;
    if (code == SQLITE_IOERR || code == SQLITE_CORRUPT || code == SQLITE_NOTADB) return TQ_STORE_FAULT_IO;
    return TQ_STORE_FAULT_OTHER;
}

/* "what: sqlite's message" */
static int sql_err(tq_store *s, const char *what) {
    tq_store_fault_kind f = fault_of(s->db);
    set_err(s, "%s: %s", what, sqlite3_errmsg(s->db));
    s->fault = f;
    return TQ_STORE_ERR;
}

static int commit_hook(void *ctx) {
    ((tq_store *)ctx)->commits++;
    return 0;   /* let it commit */
}

/* Runs a prepared statement that returns no rows (or whose rows are ignored) and resets it. */
static int run_stmt(sqlite3_stmt *st) {
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int begin(tq_store *s) {
    if (run_stmt(s->begin) != SQLITE_OK) return sql_err(s, "BEGIN IMMEDIATE");
    return TQ_STORE_OK;
}
static int commit(tq_store *s) {
    if (run_stmt(s->commit) != SQLITE_OK) {
        int r = sql_err(s, "COMMIT");
        if (!sqlite3_get_autocommit(s->db)) run_stmt(s->rollback);
        return r;
    }
    return TQ_STORE_OK;
}
static void rollback(tq_store *s) {
    if (!sqlite3_get_autocommit(s->db)) run_stmt(s->rollback);
}

static int exec(tq_store *s, const char *sql, const char *what) {
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        set_err(s, "%s: %s", what, msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return TQ_STORE_ERR;
    }
    return TQ_STORE_OK;
}

/* The one-value answer of a PRAGMA: integer into *iv and/or text into tv[tn]. */
static int pragma_value(tq_store *s, const char *sql, int64_t *iv, char *tv, size_t tn) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return sql_err(s, sql);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (iv) *iv = sqlite3_column_int64(st, 0);
        if (tv) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            snprintf(tv, tn, "%s", t ? (const char *)t : "");
        }
        rc = SQLITE_DONE;
    }
    if (rc != SQLITE_DONE) {
        sql_err(s, sql);
        sqlite3_finalize(st);
        return TQ_STORE_ERR;
    }
    sqlite3_finalize(st);
    return TQ_STORE_OK;
}

/* ---- migrations ----------------------------------------------------------------------- */

static int refuse_newer(tq_store *s, int64_t have, int known) {
    return set_err(s, "the database's schema version is %lld, newer than this trainq knows (%d): "
                      "use a newer trainq, or another database",
                   (long long)have, known);
}

static int migrate(tq_store *s) {
    int n;
    const tq_migration *m = tq_migrations(&n);
    int64_t ver;
    if (pragma_value(s, "PRAGMA user_version", &ver, NULL, 0)) return TQ_STORE_ERR;
    if (ver > n) return refuse_newer(s, ver, n);
    for (int i = 0; i < n; i++) {
        if (ver >= m[i].version) continue;
        if (begin(s)) return TQ_STORE_ERR;
        /* another process may have migrated between our read and our lock: read again */
        if (pragma_value(s, "PRAGMA user_version", &ver, NULL, 0)) goto fail;
        if (ver > n) { refuse_newer(s, ver, n); goto fail; }
        if (ver >= m[i].version) { rollback(s); continue; }
        if (ver != m[i].version - 1) {
            set_err(s, "database at schema version %lld cannot take migration %s", (long long)ver,
                    m[i].file);
            goto fail;
        }
        char what[128];
        snprintf(what, sizeof what, "migration %s", m[i].file);
        if (exec(s, m[i].sql, what)) goto fail;
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", m[i].version);
        if (exec(s, pragma, what)) goto fail;
        if (commit(s)) return TQ_STORE_ERR;
        ver = m[i].version;
    }
    return TQ_STORE_OK;
fail:
    rollback(s);
    return TQ_STORE_ERR;
}

/* ---- open / close --------------------------------------------------------------------- */

static int prepare(tq_store *s, sqlite3_stmt **st, const char *sql) {
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) != SQLITE_OK)
        return sql_err(s, "preparing a statement");
    return TQ_STORE_OK;
}

static int setup(tq_store *s, const char *path) {
    int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        return set_err(s, "cannot open database %s: %s", path,
                       s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, 5000);
    char mode[32];
    if (pragma_value(s, "PRAGMA journal_mode = WAL", NULL, mode, sizeof mode)) return TQ_STORE_ERR;
    if (strcmp(mode, "wal") && strcmp(mode, "memory"))
        return set_err(s, "database %s: cannot use WAL journal mode (got \"%s\")", path, mode);
    if (exec(s, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; "
                "PRAGMA journal_size_limit = 67108864;", "configuring the connection"))
        return TQ_STORE_ERR;
    if (prepare(s, &s->begin, "BEGIN IMMEDIATE") || prepare(s, &s->commit, "COMMIT") ||
        prepare(s, &s->rollback, "ROLLBACK"))
        return TQ_STORE_ERR;
    sqlite3_commit_hook(s->db, commit_hook, s);
    if (migrate(s)) return TQ_STORE_ERR;
    if (prepare(s, &s->ins_job,
                "INSERT INTO jobs (id, name, state, spec, priority, submission_id, created_at, "
                "started_at, attempts) VALUES (" TQ_NEXT_JOB_ID ", ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)") ||
        prepare(s, &s->ins_step,
                "INSERT OR IGNORE INTO steps (job_id, step, epoch, loss, lr, loss_scale, skipped, "
                "step_ms, samples_per_s, mem_allocated_bytes, mem_peak_bytes, "
                "mem_reserved_bytes, device_used_bytes, time) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)") ||
        prepare(s, &s->ins_eval,
                "INSERT OR IGNORE INTO evals (job_id, step, epoch, loss, accuracy, samples, kind, "
                "time) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)") ||
        prepare(s, &s->finish,
                "UPDATE jobs SET state = ?2, finished_at = ?3, summary = ?4, error_code = ?5, "
                "error_message = ?6 WHERE id = ?1"))
        return TQ_STORE_ERR;
    s->last_flush_ms = monotonic_ms();
    return TQ_STORE_OK;
}

static void destroy(tq_store *s) {
    sqlite3_stmt *all[] = { s->begin, s->commit, s->rollback, s->ins_job, s->ins_step,
                            s->ins_eval, s->finish };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sqlite3_finalize(all[i]);
    for (size_t i = 0; i < sizeof s->qst / sizeof s->qst[0]; i++) sqlite3_finalize(s->qst[i]);
    sqlite3_close(s->db);   /* NULL is a no-op */
    free(s);
}

tq_store *tq_store_open(const char *path, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    tq_store *s = calloc(1, sizeof *s);
    if (!s) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!path || !path[0]) {
        set_err(s, "no database path");
        goto fail;
    }
    if (setup(s, path)) goto fail;
    return s;
fail:
    if (err && errlen) snprintf(err, errlen, "%s", s->err);
    destroy(s);
    return NULL;
}

void tq_store_close(tq_store *s) {
    if (!s) return;
    tq_store_flush(s);
    destroy(s);
}

int tq_store_set_durable(tq_store *s, int durable) {
    s->err[0] = 0;
    return exec(s, durable ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL",
                "setting synchronous");
}

const char *tq_store_errmsg(tq_store *s) { return s ? s->err : "no store"; }
tq_store_fault_kind tq_store_fault(const tq_store *s) { return s && s->err[0] ? s->fault : TQ_STORE_FAULT_NONE; }
const char *tq_store_path(const tq_store *s) {
    const char *p = s ? sqlite3_db_filename(s->db, "main") : NULL;
    return p ? p : "";
}
int64_t tq_store_commits(const tq_store *s) { return s->commits; }
int tq_store_pending(const tq_store *s) { return s->npending; }

/* ---- jobs ----------------------------------------------------------------------------- */

static int valid_state(const char *st) {
    tq_job_state k;
    return tq_state_parse(st, &k) == 0;
}

int64_t tq_store_insert_job(tq_store *s, const char *name, const char *spec_json, int priority,
                            const char *submission_id, const char *state, char *err,
                            size_t errlen) {
    int64_t id = TQ_STORE_ERR;
    s->err[0] = 0;
    if (!valid_state(state)) {
        set_err(s, "insert_job: invalid state \"%s\"", state ? state : "(null)");
        goto out;
    }
    if (!spec_json) {
        set_err(s, "insert_job: no spec");
        goto out;
    }
    if (begin(s)) goto out;
    int64_t now = realtime_ms();
    int running = !strcmp(state, "running");
    sqlite3_stmt *st = s->ins_job;
    sqlite3_bind_text(st, 1, name ? name : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, spec_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 4, priority);
    if (submission_id && submission_id[0]) sqlite3_bind_text(st, 5, submission_id, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 5);
    sqlite3_bind_int64(st, 6, now);
    if (running) sqlite3_bind_int64(st, 7, now);
    else sqlite3_bind_null(st, 7);
    sqlite3_bind_int(st, 8, running ? 1 : 0);
    int rc = run_stmt(st);
    if (rc != SQLITE_OK) {
        if (rc == SQLITE_CONSTRAINT_UNIQUE) {
            set_err(s, "insert_job: submission_id \"%s\" is already used by another job",
                    submission_id);
            id = TQ_STORE_EDUP;
        } else {
            sql_err(s, "insert_job");
        }
        rollback(s);
        goto out;
    }
    int64_t rowid = sqlite3_last_insert_rowid(s->db);
    if (commit(s)) goto out;
    id = rowid;
out:
    if (err && errlen) snprintf(err, errlen, "%s", s->err);
    return id;
}

int tq_store_finish_job(tq_store *s, int64_t job_id, const char *state, const char *summary_json,
                        const char *error_code, const char *error_message) {
    s->err[0] = 0;
    if (!state || (strcmp(state, "succeeded") && strcmp(state, "failed") && strcmp(state, "cancelled")))
        return set_err(s, "finish_job: \"%s\" is not a final state (succeeded, failed, cancelled)",
                       state ? state : "(null)");
    if (tq_store_flush(s)) return TQ_STORE_ERR;
    if (begin(s)) return TQ_STORE_ERR;
    sqlite3_stmt *st = s->finish;
    tq__bind_finish(st, job_id, state, summary_json, error_code, error_message);
    if (run_stmt(st) != SQLITE_OK) {
        sql_err(s, "finish_job");
        rollback(s);
        return TQ_STORE_ERR;
    }
    if (sqlite3_changes(s->db) != 1) {
        rollback(s);
        set_err(s, "finish_job: no job %lld", (long long)job_id);
        return TQ_STORE_ENOJOB;
    }
    return commit(s);
}

/* ---- step and eval records ------------------------------------------------------------ */

static int write_rec(tq_store *s, const pending_rec *p) {
    sqlite3_stmt *st;
    if (!p->is_eval) {
        const tq_step_rec *r = &p->r.step;
        st = s->ins_step;
        sqlite3_bind_int64(st, 1, p->job_id);
        sqlite3_bind_int64(st, 2, r->step);
        sqlite3_bind_int(st, 3, r->epoch);
        sqlite3_bind_double(st, 4, r->loss);
        sqlite3_bind_double(st, 5, r->lr);
        if (r->loss_scale >= 0) sqlite3_bind_double(st, 6, r->loss_scale);
        else sqlite3_bind_null(st, 6);   /* < 0 (and NaN, by bind_double) → NULL */
        sqlite3_bind_int(st, 7, r->skipped ? 1 : 0);
        sqlite3_bind_double(st, 8, r->step_ms);
        sqlite3_bind_double(st, 9, r->samples_per_s);
        sqlite3_bind_int64(st, 10, r->mem_allocated_bytes);
        sqlite3_bind_int64(st, 11, r->mem_peak_bytes);
        sqlite3_bind_int64(st, 12, r->mem_reserved_bytes);
        if (r->device_used_bytes >= 0) sqlite3_bind_int64(st, 13, r->device_used_bytes);
        else sqlite3_bind_null(st, 13);
        sqlite3_bind_int64(st, 14, r->time_ms);
    } else {
        const tq_eval_rec *r = &p->r.eval;
        st = s->ins_eval;
        sqlite3_bind_int64(st, 1, p->job_id);
        sqlite3_bind_int64(st, 2, r->step);
        sqlite3_bind_int(st, 3, r->epoch);
        sqlite3_bind_double(st, 4, r->loss);
        sqlite3_bind_double(st, 5, r->accuracy);
        sqlite3_bind_int64(st, 6, r->samples);
        sqlite3_bind_text(st, 7, eval_kinds[r->kind], -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 8, r->time_ms);
    }
    return run_stmt(st);
}

int tq_store_flush(tq_store *s) {
    s->last_flush_ms = monotonic_ms();
    if (s->npending == 0) return TQ_STORE_OK;
    if (begin(s)) return TQ_STORE_ERR;
    for (int i = 0; i < s->npending; i++) {
        int rc = write_rec(s, &s->pending[i]);
        if (rc != SQLITE_OK) {
            const pending_rec *p = &s->pending[i];
            set_err(s, "writing the %s record of job %lld, step %lld: %s",
                    p->is_eval ? "eval" : "step", (long long)p->job_id,
                    (long long)(p->is_eval ? p->r.eval.step : p->r.step.step), sqlite3_errmsg(s->db));
            rollback(s);
            /* a constraint violation will fail every retry: drop the batch */
            if ((rc & 0xff) == SQLITE_CONSTRAINT) s->npending = 0;
            return TQ_STORE_ERR;
        }
    }
    if (commit(s)) return TQ_STORE_ERR;
    s->npending = 0;
    return TQ_STORE_OK;
}

static pending_rec *slot(tq_store *s, int *rc) {
    *rc = TQ_STORE_OK;
    if (s->npending == TQ_STORE_BATCH && (*rc = tq_store_flush(s)) != TQ_STORE_OK) return NULL;
    return &s->pending[s->npending];
}

static int after_add(tq_store *s) {
    s->npending++;
    if (s->npending >= TQ_STORE_BATCH || monotonic_ms() - s->last_flush_ms >= TQ_STORE_FLUSH_MS)
        return tq_store_flush(s);
    return TQ_STORE_OK;
}

int tq_store_add_step(tq_store *s, int64_t job_id, const tq_step_rec *r) {
    s->err[0] = 0;
    if (!r || job_id <= 0) return set_err(s, "add_step: no record or bad job id");
    int rc;
    pending_rec *p = slot(s, &rc);
    if (!p) return rc;
    p->job_id = job_id;
    p->is_eval = 0;
    p->r.step = *r;
    return after_add(s);
}

int tq_store_add_eval(tq_store *s, int64_t job_id, const tq_eval_rec *r) {
    s->err[0] = 0;
    if (!r || job_id <= 0) return set_err(s, "add_eval: no record or bad job id");
    if ((int)r->kind < 0 || (int)r->kind >= (int)(sizeof eval_kinds / sizeof eval_kinds[0]))
        return set_err(s, "add_eval: invalid kind %d", (int)r->kind);
    int rc;
    pending_rec *p = slot(s, &rc);
    if (!p) return rc;
    p->job_id = job_id;
    p->is_eval = 1;
    p->r.eval = *r;
    return after_add(s);
}

/* ---- for the other files of schema/ (store_internal.h) -------------------------------- */

int tq__begin(tq_store *s) { return begin(s); }
int tq__commit(tq_store *s) { return commit(s); }
void tq__rollback(tq_store *s) { rollback(s); }
int tq__sql_err(tq_store *s, const char *what) { return sql_err(s, what); }
int64_t tq__now_ms(void) { return realtime_ms(); }
int tq__set_err(tq_store *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return TQ_STORE_ERR;
}
int tq__stmt(tq_store *s, int slot, const char *sql, sqlite3_stmt **out) {
    if (slot < 0 || slot >= (int)(sizeof s->qst / sizeof s->qst[0])) return set_err(s, "statement slot %d", slot);
    if (!s->qst[slot] && prepare(s, &s->qst[slot], sql)) return TQ_STORE_ERR;
    sqlite3_reset(s->qst[slot]);
    sqlite3_clear_bindings(s->qst[slot]);
    *out = s->qst[slot];
    return TQ_STORE_OK;
}

void tq__bind_finish(sqlite3_stmt *st, int64_t id, const char *state, const char *summary_json,
                     const char *error_code, const char *error_message) {
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, tq__now_ms());
    if (summary_json) sqlite3_bind_text(st, 4, summary_json, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 4);
    if (error_code && error_code[0]) sqlite3_bind_text(st, 5, error_code, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 5);
    if (error_message && error_message[0]) sqlite3_bind_text(st, 6, error_message, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 6);
}
