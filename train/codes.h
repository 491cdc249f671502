/* codes.h — a job's states and its error codes, each one X-macro list: the enums the code
 * uses, the names the API, the database and the summaries show (string form only at those
 * edges), whether a state is final, and a one-line meaning that docs/api.md must list (a unit
 * test checks it does).
 *
 * Contract: pure tables and lookups; thread-safe; nothing allocates or prints. */
#ifndef TQ_CODES_H
#define TQ_CODES_H

/* X(ENUM, name, final) */
#define TQ_JOB_STATES(X)                                                                      \
    X(QUEUED, queued, 0)                                                                      \
    X(RUNNING, running, 0)                                                                    \
    X(SUCCEEDED, succeeded, 1)                                                                \
    X(FAILED, failed, 1)                                                                      \
    X(CANCELLED, cancelled, 1)

typedef enum {
#define TQ_X(e, name, final) TQ_STATE_##e,
    TQ_JOB_STATES(TQ_X)
#undef TQ_X
    TQ_STATE_COUNT
} tq_job_state;

/* X(ENUM, name, meaning) — the error.code of a failed job */
#define TQ_ERROR_CODES(X)                                                                     \
    X(INVALID_SPEC, invalid_spec, "the stored spec is invalid, or a batch_size auto was never resolved") \
    X(DATA_NOT_FOUND, data_not_found, "the dataset's files cannot be read")                   \
    X(INVALID_DATA, invalid_data, "the dataset's files are not what the dataset says")        \
    X(INVALID_INIT_FROM, invalid_init_from, "init_from is not a safetensors file of this model") \
    X(INVALID_CHECKPOINT, invalid_checkpoint, "resume found a damaged checkpoint (the message names the field)") \
    X(MEMORY_LIMIT, memory_limit, "the plan is over the spec's max_memory_mb")                 \
    X(OUT_OF_MEMORY, out_of_memory, "the device or host ran out of memory, or the job outgrew its planned share") \
    X(CANNOT_FIT, cannot_fit, "the plan is over the budget of every device the job may use")  \
    X(DEVICE_UNAVAILABLE, device_unavailable, "the device the job needs cannot be used")       \
    X(BACKEND_ERROR, backend_error, "a kernel, a cuDNN or cuBLAS call, or a copy between host and device failed")                   \
    X(IO_ERROR, io_error, "a record could not be written for another reason")                  \
    X(STORAGE_FULL, storage_full, "its steps or files could not be written: the filesystem is full") \
    X(STORAGE_ERROR, storage_error, "its steps or files could not be written (read-only, I/O error, a vanished directory)") \
    X(INPUT_CHANGED, input_changed, "data_dir or init_from is no longer the file submission checked for its owner") \
    X(TIMEOUT, timeout, "it ran past timeout_s")                                               \
    X(WORKER_CRASHED, worker_crashed, "the worker died (signal or exit status in the message), or restarts without progress used up max_attempts") \
    X(DEPENDENCY_FAILED, dependency_failed, "a job listed in its after failed, was cancelled or was deleted: it can never run (the message names that job and its outcome)")

typedef enum {
    TQ_ERR_NONE = 0,
#define TQ_X(e, name, meaning) TQ_ERR_##e,
    TQ_ERROR_CODES(TQ_X)
#undef TQ_X
    TQ_ERR_COUNT
} tq_error_code;

const char *tq_state_name(tq_job_state);             /* "queued" …; "?" out of range */
int tq_state_parse(const char *name, tq_job_state *out);   /* 0 ok, -1 unknown */
int tq_state_is_final(tq_job_state);                 /* succeeded, failed, cancelled */
int tq_state_name_final(const char *name);           /* the same for a name; 0 when unknown */
const char *tq_error_name(tq_error_code);            /* "" for TQ_ERR_NONE */
const char *tq_error_meaning(tq_error_code);
int tq_error_parse(const char *name, tq_error_code *out);  /* 0 ok, -1 unknown */
#endif
