/* store.h — trainq's SQLite database: schema migrations, job rows, step and eval records.
 *
 * Contract
 * - tq_store_open opens (creating when missing) the database at `path` and brings its schema up
 *   to date: WAL journal, synchronous=NORMAL (FULL after tq_store_set_durable), busy_timeout
 *   5000 ms, foreign_keys ON, journal_size_limit 64 MiB, then every migration of migrations.h
 *   that the database lacks, in order, each in its own BEGIN IMMEDIATE transaction that also
 *   sets PRAGMA user_version. A database whose user_version is newer than this binary knows is
 *   refused (NULL and a message), never modified.
 * - Every write transaction is BEGIN IMMEDIATE (a deferred one that later writes would get
 *   SQLITE_BUSY at once, without waiting for busy_timeout). Statements are prepared once, at
 *   open, and kept in the store.
 * - Step and eval records are buffered and written in batches: one transaction per flush; a
 *   flush happens when TQ_STORE_BATCH records are pending, when an add comes at least
 *   TQ_STORE_FLUSH_MS after the last flush, on tq_store_flush, before tq_store_finish_job and
 *   in tq_store_close. INSERT OR IGNORE: a replayed (job_id, step) — or (job_id, step, kind) for
 *   evals — keeps the row written first. NaN doubles are stored as NULL (SQLite's rule).
 * - Errors: functions return 0 (TQ_STORE_OK) or a negative TQ_STORE_E*; the message is in
 *   tq_store_errmsg until the next call. A failed flush rolls back and keeps its records
 *   pending for the next flush, except after a constraint violation (a record that can never be
 *   written, e.g. for a job that no longer exists), when the batch is dropped. Nothing here
 *   exits or prints.
 * - Memory: the store owns everything it allocates; strings passed in are copied by SQLite.
 * - Threads: one thread at a time per tq_store; open one store per thread or process (SQLite's
 *   locking then arbitrates between them).
 * - Column names are CONTRACT.md's field names; times are unix milliseconds. */
#ifndef TQ_STORE_H
#define TQ_STORE_H
#include <stddef.h>
#include <stdint.h>
#include "records.h"

typedef struct tq_store tq_store;

enum {
    TQ_STORE_OK = 0,
    TQ_STORE_ERR = -1,     /* SQLite or I/O error, bad argument */
    TQ_STORE_EDUP = -2,    /* insert_job: the submission_id is already taken */
    TQ_STORE_ENOJOB = -3,  /* finish_job: no job with that id */
};

#define TQ_STORE_BATCH 64        /* records pending that trigger a flush */
#define TQ_STORE_FLUSH_MS 250    /* ms since the last flush after which an add flushes */

/* Opens/creates the database and runs migrations. NULL + message in err on failure. */
tq_store *tq_store_open(const char *path, char *err, size_t errlen);
/* Flushes pending records (best effort: call tq_store_flush first to see its status), then
 * closes. NULL is a no-op. */
void tq_store_close(tq_store *);
/* synchronous=FULL (durable != 0) or NORMAL: FULL makes every commit survive a power loss, for
 * writes that are acknowledged to someone (a 201 for a submitted job). */
int tq_store_set_durable(tq_store *, int durable);

/* Inserts a job row in `state` (e.g. "queued", or "running" for `trainq run`: then started_at
 * = created_at and attempts = 1). spec_json = tq_spec_to_json output; submission_id NULL or
 * "" for none. Returns the new id (> 0), TQ_STORE_EDUP when submission_id exists, or
 * TQ_STORE_ERR; err (may be NULL) receives the message, as does tq_store_errmsg. */
int64_t tq_store_insert_job(tq_store *, const char *name, const char *spec_json, int priority,
                            const char *submission_id, const char *state, char *err,
                            size_t errlen);

/* Buffer one record (see the contract above for when it is written). A non-zero return means
 * an automatic flush failed (the record itself is kept pending when it could be buffered). */
int tq_store_add_step(tq_store *, int64_t job_id, const tq_step_rec *);
int tq_store_add_eval(tq_store *, int64_t job_id, const tq_eval_rec *);
/* Writes every pending record in one BEGIN IMMEDIATE transaction. No-op when none pending. */
int tq_store_flush(tq_store *);
/* Records pending (not yet written). */
int tq_store_pending(const tq_store *);

/* Finalises a job: state (succeeded|failed|cancelled), finished_at = now, summary JSON (NULL
 * for none), error code/message (NULL when none). Flushes first; fails without finalising
 * when that flush fails. TQ_STORE_ENOJOB when the id is unknown. */
int tq_store_finish_job(tq_store *, int64_t job_id, const char *state, const char *summary_json,
                        const char *error_code, const char *error_message);

/* What kind of failure the last error was, so that callers answer it without matching
 * messages: a busy database (another writer held it past busy_timeout), a full filesystem
 * (SQLITE_FULL, ENOSPC, EDQUOT), a database that cannot be written (read-only file or
 * filesystem, permissions), another I/O error, or anything else (a bad argument, a
 * constraint). TQ_STORE_FAULT_NONE after a success. */
typedef enum {
    TQ_STORE_FAULT_NONE = 0,
    TQ_STORE_FAULT_BUSY,
    TQ_STORE_FAULT_FULL,
    TQ_STORE_FAULT_READONLY,
    TQ_STORE_FAULT_IO,
    TQ_STORE_FAULT_OTHER,
} tq_store_fault_kind;
tq_store_fault_kind tq_store_fault(const tq_store *);
/* The database file's path as opened (for messages that name it). */
const char *tq_store_path(const tq_store *);

/* The last error's message ("" when none). Valid until the next call on the store. */
const char *tq_store_errmsg(tq_store *);
/* Write transactions committed on this connection since open (migrations included): what the
 * batching is measured by. */
int64_t tq_store_commits(const tq_store *);

#endif
