/* store_internal.h — the store's insides, shared by the files of schema/ only (store.c,
 * queue.c). Nothing outside schema/ includes this. */
#ifndef TQ_STORE_INTERNAL_H
#define TQ_STORE_INTERNAL_H
#include "store.h"
#include <sqlite3.h>

typedef struct {
    int64_t job_id;
    int is_eval;
    union { tq_step_rec step; tq_eval_rec eval; } r;
} pending_rec;

struct tq_store {
    sqlite3 *db;
    sqlite3_stmt *begin, *commit, *rollback;
    sqlite3_stmt *ins_job, *ins_step, *ins_eval, *finish;
    sqlite3_stmt *qst[48];   /* queue.c's statements, prepared on first use (tq__stmt) */
    pending_rec pending[TQ_STORE_BATCH];
    int npending;
    int64_t last_flush_ms;   /* monotonic */
    int64_t commits;
    int fault;               /* tq_store_fault of the last error */
    char err[512];
};

/* The id for a new job: never one a deleted job had (tq_queue_delete leaves a 'deleted' event
 * with job_id NULL, which the cascade does not remove). */
#define TQ_NEXT_JOB_ID                                                                       \
    "(SELECT max(coalesce((SELECT max(id) FROM jobs), 0), coalesce((SELECT "                \
    "max(json_extract(data, '$.job')) FROM events WHERE job_id IS NULL AND type = 'deleted'), 0)) + 1)"

int tq__begin(tq_store *);      /* BEGIN IMMEDIATE */
int tq__commit(tq_store *);     /* rolls back when the commit fails */
void tq__rollback(tq_store *);  /* no-op outside a transaction */
int tq__sql_err(tq_store *, const char *what);   /* returns TQ_STORE_ERR */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
int tq__set_err(tq_store *, const char *fmt, ...);
int64_t tq__now_ms(void);       /* unix ms */
/* The statement of `slot` (prepared from `sql` on first use, persistent), reset and unbound. */
int tq__stmt(tq_store *, int slot, const char *sql, sqlite3_stmt **out);
/* Binds a finish statement's parameters: ?1 id, ?2 state, ?3 finished_at (now), ?4 summary,
 * ?5 error_code, ?6 error_message (NULL or "" bind NULL). Shared by tq_store_finish_job
 * and tq_queue_finish. */
void tq__bind_finish(sqlite3_stmt *st, int64_t id, const char *state, const char *summary_json,
                     const char *error_code, const char *error_message);
#endif
