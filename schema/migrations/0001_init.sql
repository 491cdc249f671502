-- 0001_init.sql - trainq's first schema: the job queue, per-step and per-eval records, events.
-- Applied by schema/store.c inside one BEGIN IMMEDIATE transaction, which then sets
-- PRAGMA user_version = 1. Embedded in the binary by schema/migrations.c (byte-identical copy,
-- checked by tests/unit/test_store.c). Times are unix milliseconds; JSON columns hold text.

CREATE TABLE jobs (
    id                 INTEGER PRIMARY KEY,
    name               TEXT    NOT NULL DEFAULT '',
    state              TEXT    NOT NULL DEFAULT 'queued'
                       CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    spec               TEXT    NOT NULL CHECK (json_valid(spec)),
    priority           INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    submission_id      TEXT    UNIQUE,
    created_at         INTEGER NOT NULL,
    started_at         INTEGER,
    finished_at        INTEGER,
    attempts           INTEGER NOT NULL DEFAULT 0,
    max_attempts       INTEGER NOT NULL DEFAULT 3,
    device             TEXT,
    total_steps        INTEGER,
    summary            TEXT    CHECK (summary IS NULL OR json_valid(summary)),
    error_code         TEXT,
    error_message      TEXT,
    planned_peak_bytes INTEGER,
    checkpoint_path    TEXT,
    cancel_requested   INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1))
);

-- the queue: the next job to claim is the first row of this index
CREATE INDEX jobs_queue ON jobs (priority DESC, id) WHERE state = 'queued';
-- GET /v1/jobs?state=...&before=...
CREATE INDEX jobs_state ON jobs (state, id);

CREATE TABLE steps (
    job_id              INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step                INTEGER NOT NULL,
    epoch               INTEGER NOT NULL,
    loss                REAL,
    lr                  REAL,
    loss_scale          REAL,
    skipped             INTEGER NOT NULL DEFAULT 0 CHECK (skipped IN (0, 1)),
    step_ms             REAL,
    samples_per_s       REAL,
    mem_allocated_bytes INTEGER,
    mem_peak_bytes      INTEGER,
    mem_reserved_bytes  INTEGER,
    device_used_bytes   INTEGER,
    time                INTEGER NOT NULL,
    PRIMARY KEY (job_id, step)
) WITHOUT ROWID;

CREATE TABLE evals (
    job_id   INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step     INTEGER NOT NULL,
    epoch    INTEGER NOT NULL,
    loss     REAL,
    accuracy REAL,
    samples  INTEGER NOT NULL,
    kind     TEXT    NOT NULL DEFAULT 'eval' CHECK (kind IN ('eval', 'pruned', 'int8')),
    time     INTEGER NOT NULL,
    PRIMARY KEY (job_id, step, kind)
) WITHOUT ROWID;

CREATE TABLE events (
    id     INTEGER PRIMARY KEY,
    job_id INTEGER REFERENCES jobs (id) ON DELETE CASCADE,
    time   INTEGER NOT NULL,
    type   TEXT    NOT NULL,
    data   TEXT    CHECK (data IS NULL OR json_valid(data))
);

CREATE INDEX events_job ON events (job_id, id);
