/* queue.h — the job queue on top of the store (store.h): submission, the atomic claim, reads
 * for the API (jobs, steps, evals, events), cancel, delete, finish, requeue and the recovery
 * of jobs left 'running' by a crash.
 *
 * Contract
 * - Every function takes an open tq_store; the same threading rule holds (one thread at a
 *   time per store; one store per thread or process). Every write is one BEGIN IMMEDIATE
 *   transaction; reads that must agree (a job and its latest step, the events stream) run in
 *   one read transaction (a snapshot under WAL).
 * - Returns: TQ_STORE_OK (0) or a positive answer where documented; TQ_STORE_ENOJOB for an
 *   unknown id; TQ_STORE_ECONFLICT when the job's state forbids the operation;
 *   TQ_STORE_ERR with the message in tq_store_errmsg. Nothing here exits or prints.
 * - Memory: a tq_job owns its spec/summary/error strings; release with tq_job_free (arrays of
 *   jobs with tq_jobs_free). Record arrays are malloc'd; free() them.
 * - attempts counts the starts that failed or made no progress, plus the current one: a claim
 *   adds 1. An interruption — a graceful stop (SIGTERM, tq_queue_requeue) or a job found
 *   'running' at startup (the daemon died, tq_queue_recover) — adds 1 to interruptions and
 *   gives the start back (attempts − 1) when it recorded a step beyond the one it started
 *   from; a start without progress keeps counting, and at startup such a job that has reached
 *   max_attempts (default 3) fails with 'worker_crashed'. A pending cancel survives the
 *   interruption: the job ends 'cancelled' at once instead of going back to the queue.
 * - Each state change appends an event (type "state", data {"state":…,"attempts":…} plus
 *   "error" when failed) that GET /v1/jobs/{id}/events streams.
 * - Requeue of a finished job (tq_queue_requeue_finished): a failed or cancelled job goes back
 *   to 'queued' (the worker resumes it from its checkpoint); its error, summary, started_at and
 *   finished_at are cleared, attempts starts again from 0, requeues + 1, and the state event
 *   carries what it replaced ("requeued": {from, step, started_at, finished_at, error,
 *   requeues}).
 * - Dependencies (the spec's "after": job ids): a queued job runs only once every job it lists
 *   has succeeded. A listed job that failed, was cancelled, or was deleted without having
 *   succeeded fails its queued dependents with 'dependency_failed' (the message names it and
 *   its outcome), and theirs in turn, in the same transaction as the change that caused it
 *   (finish, cancel, fail_queued, requeue, recover, delete, submit) — tq_queue_fail_blocked does
 *   the same sweep on its own. A job deleted after it succeeded still counts as succeeded (its
 *   tombstone event keeps its state).
 * - Times are unix milliseconds; 0 means null. */
#ifndef TQ_QUEUE_H
#define TQ_QUEUE_H
#include <stdint.h>
#include "store.h"
#include "codes.h"

enum { TQ_STORE_ECONFLICT = -4,
       TQ_STORE_EDEPENDENCY = -5 };   /* a job named by "after" is missing, or failed (message) */

#define TQ_QUEUE_MAX_AFTER 16         /* = the spec's TQ_AFTER_MAX */

typedef struct {
    int64_t id;
    char name[129];
    char state[16];
    char *spec;              /* JSON text, defaults filled in */
    int priority;
    char submission_id[129]; /* "" none */
    int64_t created_at, started_at, finished_at;   /* 0: null */
    int attempts, max_attempts;
    char device[32];         /* "" null */
    int64_t total_steps;     /* 0: unknown */
    char *summary;           /* JSON text or NULL */
    char error_code[32];     /* "" none */
    char *error_message;     /* NULL none */
    int64_t planned_peak_bytes;  /* < 0: unknown */
    int cancel_requested;
    int64_t queue_position;  /* 1 = next to run; 0 unless queued */
    int has_latest;
    tq_step_rec latest;      /* the last step record, when has_latest */
    int64_t planned_cpu_bytes, planned_gpu_bytes;   /* placement's planned peaks; < 0 unknown */
    int threads;             /* CPU threads its worker was given; 0 unknown or a GPU */
    int interruptions;       /* times the daemon stopped or died under it (requeued) */
    char owner[64];          /* the submitter's user name; "" unknown */
    int64_t owner_uid;       /* -1 unknown */
    char *inputs;            /* JSON [{field, path, dev, ino}] as submission checked them; NULL */
    int requeues;            /* times a user requeued it after it failed or was cancelled */
    int64_t requeued_at;     /* the last of those (ms); 0 never */
} tq_job;

/* What a job plans, as submission records it: peak_bytes the training memory (the plan's
 * total), cpu_bytes/gpu_bytes the planned peak placement reads on the CPU / on a GPU (with
 * the dataset, and on a GPU the CUDA context and the workspace bound). < 0: unknown. */
typedef struct { int64_t peak_bytes, cpu_bytes, gpu_bytes; } tq_job_plan;

/* A queued job as placement reads it (tq_queue_queued). */
typedef struct {
    int64_t id, created_at;
    int priority, threads;
    char device[32];         /* the spec's device */
    int64_t cpu_bytes, gpu_bytes;   /* < 0 unknown (a job from before migration 2) */
    char owner[64];          /* "" unknown */
    int64_t eligible_at;     /* since when it may run: its submission or last requeue, or the end
                              * of the last job it runs after, whichever is latest (ms) */
    int ndeps;               /* the jobs of its "after" that have not succeeded yet */
    int64_t deps[TQ_QUEUE_MAX_AFTER];
} tq_queued;

/* A user's jobs and device time (tq_queue_users). owner "" for jobs without an owner. */
typedef struct {
    char owner[64];
    int64_t owner_uid;       /* -1 unknown */
    int queued, running;
    double window_s, total_s;   /* device seconds in the fair-share window / ever */
} tq_user_usage;

void tq_job_free(tq_job *);
void tq_jobs_free(tq_job *, int n);

/* Inserts a queued job. With a submission_id that a job already has, inserts nothing and
 * answers that job's id with *existed = 1 (the check and the insert are one transaction).
 * plan NULL: unknown. Every job of the spec's "after" must exist (else TQ_STORE_EDEPENDENCY,
 * the message naming it; so a job can only wait for older ones, and dependencies never form a
 * cycle); one that already failed or was cancelled fails the new job at once
 * (dependency_failed), in the same transaction. */
int tq_queue_submit(tq_store *, const char *name, const char *spec_json, int priority,
                    const char *submission_id, const tq_job_plan *plan, int64_t *id,
                    int *existed);
/* tq_queue_submit with the submitter: owner (a user name; NULL or "" unknown) and its uid. */
int tq_queue_submit_as(tq_store *, const char *name, const char *spec_json, int priority,
                       const char *submission_id, const tq_job_plan *plan, const char *owner,
                       int64_t owner_uid, const char *inputs_json, int64_t *id, int *existed);
/* The id of the job holding submission_id: > 0, or 0 for none. */
int64_t tq_queue_find_submission(tq_store *, const char *submission_id);

/* Claims the queued job `id` for `device` (the scheduler chose it): state 'running', device,
 * threads (≤ 0: NULL), started_at (first start kept), attempts + 1, cancel_requested 0.
 * 1 claimed, 0 when the job is no longer queued (cancelled or deleted meanwhile). */
int tq_queue_claim_job(tq_store *, int64_t id, const char *device, int threads);
/* The queued jobs in queue order (priority DESC, id), at most max. *out malloc'd; free() it. */
int tq_queue_queued(tq_store *, int max, tq_queued **out, int *n);
/* The same in fair-share order: priority DESC, then the owner's device seconds over the last
 * window_ms (least first; jobs without an owner count as one user), then id. */
int tq_queue_queued_fair(tq_store *, int max, int64_t window_ms, tq_queued **out, int *n);
/* Every owner with a job in the database: queued and running counts, device seconds in the
 * last window_ms and ever (from each job's started_at to finished_at, or now while running).
 * Sorted by owner. *out malloc'd; free() it. */
int tq_queue_users(tq_store *, int64_t window_ms, tq_user_usage **out, int *n);
/* A queued job to 'failed' with code/message (one that can never start). 1 done, 0 when it
 * is no longer queued. */
int tq_queue_fail_queued(tq_store *, int64_t id, const char *code, const char *msg);
/* Fails (dependency_failed) every queued job that runs after a job that failed, was cancelled
 * or was deleted before it succeeded, and the jobs after those, in one transaction. *failed
 * (may be NULL) receives how many. */
int tq_queue_fail_blocked(tq_store *, int *failed);

/* One job with its queue position and latest step. 1 found, 0 unknown. */
int tq_queue_get(tq_store *, int64_t id, tq_job *job);
/* Jobs newest first; state NULL for all; before > 0: only ids < before; limit 1…1000.
 * *next = the id to pass as before for the next page, 0 when this is the last page. */
int tq_queue_list(tq_store *, const char *state, int64_t before, int limit, tq_job **jobs,
                  int *n, int64_t *next);
/* The same, only the jobs of owner (NULL: anyone; "": jobs without an owner). */
int tq_queue_list_owned(tq_store *, const char *state, const char *owner, int64_t before, int limit,
                        tq_job **jobs, int *n, int64_t *next);
/* 1-based position of a queued job (0 when not queued). */
int64_t tq_queue_position(tq_store *, int64_t id);
/* Jobs by state: counts[s] for each tq_job_state s (train/codes.h). */
int tq_queue_counts(tq_store *, int64_t counts[TQ_STATE_COUNT]);

/* Step records with step > after, ascending, at most limit. TQ_STORE_ENOJOB unknown job. */
int tq_queue_steps(tq_store *, int64_t id, int64_t after, int limit, tq_step_rec **out, int *n);
/* Eval records ordered by step, kind; skipping the first `offset`. */
int tq_queue_evals(tq_store *, int64_t id, int offset, tq_eval_rec **out, int *n);

/* Cancel: a queued job becomes 'cancelled' at once; a running one gets cancel_requested = 1
 * (the worker stops at its next step boundary); a finished one: TQ_STORE_ECONFLICT.
 * *state receives the state before the call. */
int tq_queue_cancel(tq_store *, int64_t id, char state[16]);
/* 0, or 1 when a cancel was requested for the job, <0 error. */
int tq_queue_cancel_requested(tq_store *, int64_t id);
/* Deletes a finished job with its steps, evals and events (cascade); TQ_STORE_ECONFLICT when
 * queued or running. Leaves an event {type 'deleted', job_id NULL, data {"job":id}} so that
 * the id is never given to another job. */
int tq_queue_delete(tq_store *, int64_t id);

/* What the worker learns at start: total steps and the device name. */
int tq_queue_set_progress(tq_store *, int64_t id, int64_t total_steps, const char *device);
/* Records a durable checkpoint path. */
int tq_queue_set_checkpoint(tq_store *, int64_t id, const char *path);

/* Finalises a *running* job (flushes pending records first): state succeeded|failed|
 * cancelled, finished_at now, summary, error. TQ_STORE_ECONFLICT when the job is not running
 * (someone else finalised it), TQ_STORE_ENOJOB unknown. */
int tq_queue_finish(tq_store *, int64_t id, const char *state, const char *summary_json,
                    const char *error_code, const char *error_message);
/* A running job back to 'queued' (graceful stop): attempts unchanged. ECONFLICT if not running. */
int tq_queue_requeue(tq_store *, int64_t id);
/* A running job whose worker found its device busy (another process took it since the
 * placement) back to 'queued': the start is given back (attempts − 1; started_at cleared when
 * it never trained), interruptions unchanged, a pending cancel honoured ('cancelled'), and the
 * state event carries "device_busy": {device, message}. ECONFLICT if not running. */
int tq_queue_requeue_busy(tq_store *, int64_t id, const char *device, const char *message);
/* A failed or cancelled job back to 'queued' (POST /v1/jobs/{id}/requeue; see the contract).
 * *state (may be NULL) receives its state before the call. TQ_STORE_ENOJOB unknown;
 * TQ_STORE_ECONFLICT when it is queued, running or succeeded; TQ_STORE_EDEPENDENCY when a job
 * it runs after failed, was cancelled or was deleted (the message names it; requeue that one
 * first). */
int tq_queue_requeue_finished(tq_store *, int64_t id, char state[16]);
/* At startup: every 'running' job to 'queued', or 'failed' (worker_crashed) when attempts ≥
 * max_attempts. Counts in *requeued / *failed (may be NULL). */
int tq_queue_recover(tq_store *, int *requeued, int *failed);

/* Events: append one (data JSON text or NULL), read those with id > after (ascending, ≤ limit).
 * ids[i], types[i] (≤ 15 chars), datas[i] (malloc'd, may be NULL). */
int tq_queue_event(tq_store *, int64_t job_id, const char *type, const char *data_json);
typedef struct { int64_t id, time; char type[16]; char *data; } tq_event;
int tq_queue_events(tq_store *, int64_t job_id, int64_t after, int limit, tq_event **out, int *n);
void tq_events_free(tq_event *, int n);

/* Runs fn inside one read transaction (a consistent snapshot of several reads). */
int tq_queue_snapshot(tq_store *, int (*fn)(tq_store *, void *), void *ctx);

#endif
