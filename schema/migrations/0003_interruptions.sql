-- 0003_interruptions.sql - a restart is not a failure (issue 20). interruptions counts the times a
-- job went back to the queue because the daemon stopped or died; start_step is the last recorded
-- step when the job was last started, so that a requeue can tell whether that start made
-- progress (then it does not count against max_attempts).

ALTER TABLE jobs ADD COLUMN interruptions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN start_step INTEGER NOT NULL DEFAULT 0;
