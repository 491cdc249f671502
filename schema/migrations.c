/* migrations.c — the schema migrations as C strings (see migrations.h).
 *
 * Each string is a byte-identical copy of a file in schema/migrations/, the source of truth.
 * After editing or adding a .sql file, regenerate its string here with
 *     sed 's/\\/\\\\/g; s/"/\\"/g; s/^/    "/; s/$/\\n"/' schema/migrations/NNNN_name.sql
 * (a new migration is a new entry at the end; never edit one that has shipped).
 * tests/unit/test_store.c compares every entry with its file and fails on any difference. */
#include "migrations.h"

static const char m0001_init[] =
    "-- 0001_init.sql - trainq's first schema: the job queue, per-step and per-eval records, events.\n"
    "-- Applied by schema/store.c inside one BEGIN IMMEDIATE transaction, which then sets\n"
    "-- PRAGMA user_version = 1. Embedded in the binary by schema/migrations.c (byte-identical copy,\n"
    "-- checked by tests/unit/test_store.c). Times are unix milliseconds; JSON columns hold text.\n"
    "\n"
    "CREATE TABLE jobs (\n"
    "    id                 INTEGER PRIMARY KEY,\n"
    "    name               TEXT    NOT NULL DEFAULT '',\n"
    "    state              TEXT    NOT NULL DEFAULT 'queued'\n"
    "                       CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),\n"
    "    spec               TEXT    NOT NULL CHECK (json_valid(spec)),\n"
    "    priority           INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),\n"
    "    submission_id      TEXT    UNIQUE,\n"
    "    created_at         INTEGER NOT NULL,\n"
    "    started_at         INTEGER,\n"
    "    finished_at        INTEGER,\n"
    "    attempts           INTEGER NOT NULL DEFAULT 0,\n"
    "    max_attempts       INTEGER NOT NULL DEFAULT 3,\n"
    "    device             TEXT,\n"
    "    total_steps        INTEGER,\n"
    "    summary            TEXT    CHECK (summary IS NULL OR json_valid(summary)),\n"
    "    error_code         TEXT,\n"
    "    error_message      TEXT,\n"
    "    planned_peak_bytes INTEGER,\n"
    "    checkpoint_path    TEXT,\n"
    "    cancel_requested   INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1))\n"
    ");\n"
    "\n"
    "-- the queue: the next job to claim is the first row of this index\n"
    "CREATE INDEX jobs_queue ON jobs (priority DESC, id) WHERE state = 'queued';\n"
    "-- GET /v1/jobs?state=...&before=...\n"
    "CREATE INDEX jobs_state ON jobs (state, id);\n"
    "\n"
    "CREATE TABLE steps (\n"
    "    job_id              INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,\n"
    "    step                INTEGER NOT NULL,\n"
    "    epoch               INTEGER NOT NULL,\n"
    "    loss                REAL,\n"
    "    lr                  REAL,\n"
    "    loss_scale          REAL,\n"
    "    skipped             INTEGER NOT NULL DEFAULT 0 CHECK (skipped IN (0, 1)),\n"
    "    step_ms             REAL,\n"
    "    samples_per_s       REAL,\n"
    "    mem_allocated_bytes INTEGER,\n"
    "    mem_peak_bytes      INTEGER,\n"
    "    mem_reserved_bytes  INTEGER,\n"
    "    device_used_bytes   INTEGER,\n"
    "    time                INTEGER NOT NULL,\n"
    "    PRIMARY KEY (job_id, step)\n"
    ") WITHOUT ROWID;\n"
    "\n"
    "CREATE TABLE evals (\n"
    "    job_id   INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,\n"
    "    step     INTEGER NOT NULL,\n"
    "    epoch    INTEGER NOT NULL,\n"
    "    loss     REAL,\n"
    "    accuracy REAL,\n"
    "    samples  INTEGER NOT NULL,\n"
    "    kind     TEXT    NOT NULL DEFAULT 'eval' CHECK (kind IN ('eval', 'pruned', 'int8')),\n"
    "    time     INTEGER NOT NULL,\n"
    "    PRIMARY KEY (job_id, step, kind)\n"
    ") WITHOUT ROWID;\n"
    "\n"
    "CREATE TABLE events (\n"
    "    id     INTEGER PRIMARY KEY,\n"
    "    job_id INTEGER REFERENCES jobs (id) ON DELETE CASCADE,\n"
    "    time   INTEGER NOT NULL,\n"
    "    type   TEXT    NOT NULL,\n"
    "    data   TEXT    CHECK (data IS NULL OR json_valid(data))\n"
    ");\n"
    "\n"
    "CREATE INDEX events_job ON events (job_id, id);\n";

static const char m0002_placement[] =
    "-- 0002_placement.sql - several jobs at once on every device (the scheduler, daemon/sched.c).\n"
    "-- A job's planned peak as placement reads it, on the CPU and on a GPU (the GPU's adds the CUDA\n"
    "-- context and the cuDNN workspace bound), computed once at submission; NULL for jobs submitted\n"
    "-- before this migration (placed only on an idle device). threads: the CPU threads its worker\n"
    "-- was given (the cores split among the CPU jobs running together); NULL on a GPU.\n"
    "\n"
    "ALTER TABLE jobs ADD COLUMN planned_cpu_bytes INTEGER;\n"
    "ALTER TABLE jobs ADD COLUMN planned_gpu_bytes INTEGER;\n"
    "ALTER TABLE jobs ADD COLUMN threads INTEGER;\n";

static const char m0003_interruptions[] =
    "-- 0003_interruptions.sql - a restart is not a failure (issue 20). interruptions counts the times a\n"
    "-- job went back to the queue because the daemon stopped or died; start_step is the last recorded\n"
    "-- step when the job was last started, so that a requeue can tell whether that start made\n"
    "-- progress (then it does not count against max_attempts).\n"
    "\n"
    "ALTER TABLE jobs ADD COLUMN interruptions INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE jobs ADD COLUMN start_step INTEGER NOT NULL DEFAULT 0;\n";

static const char m0004_owners[] =
    "-- 0004_owners.sql - every job belongs to the person who submitted it (issue 15), known from the\n"
    "-- kernel (SO_PEERCRED on the unix socket, sock_diag on loopback TCP): owner is the user name and\n"
    "-- owner_uid the uid at submission. NULL for jobs submitted before this migration or from a\n"
    "-- connection without identity (shown as \"unknown\"; only admins may cancel or delete them).\n"
    "\n"
    "ALTER TABLE jobs ADD COLUMN owner TEXT;\n"
    "ALTER TABLE jobs ADD COLUMN owner_uid INTEGER;\n"
    "CREATE INDEX jobs_owner ON jobs (owner, state);\n";

static const char m0005_inputs[] =
    "-- 0005_inputs.sql - the files a job reads on its submitter's behalf (issue 15): data_dir and\n"
    "-- init_from as submission checked them, resolved (symlinks followed), with their device and\n"
    "-- inode, as JSON [{\"field\",\"path\",\"dev\",\"ino\"}]. The worker opens the resolved paths and refuses\n"
    "-- one whose inode changed since the check. NULL: nothing was checked (older jobs).\n"
    "\n"
    "ALTER TABLE jobs ADD COLUMN inputs TEXT CHECK (inputs IS NULL OR json_valid(inputs));\n";

static const char m0006_requeue[] =
    "-- 0006_requeue.sql - a finished job can run again (issue 17): POST /v1/jobs/{id}/requeue sends a\n"
    "-- failed or cancelled job back to the queue, to resume from its checkpoint. requeues counts those\n"
    "-- requeues (each also leaves a state event with the outcome it replaced); requeued_at is when the\n"
    "-- last one happened (NULL: never), from which the backfill window counts its wait.\n"
    "\n"
    "ALTER TABLE jobs ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE jobs ADD COLUMN requeued_at INTEGER;\n";

static const tq_migration migrations[] = {
    { 1, "0001_init.sql", m0001_init },
    { 2, "0002_placement.sql", m0002_placement },
    { 3, "0003_interruptions.sql", m0003_interruptions },
    { 4, "0004_owners.sql", m0004_owners },
    { 5, "0005_inputs.sql", m0005_inputs },
    { 6, "0006_requeue.sql", m0006_requeue },
};

const tq_migration *tq_migrations(int *count) {
    if (count) *count = (int)(sizeof migrations / sizeof migrations[0]);
    return migrations;
}
