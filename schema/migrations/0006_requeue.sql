-- 0006_requeue.sql - a finished job can run again (issue 17): POST /v1/jobs/{id}/requeue sends a
-- failed or cancelled job back to the queue, to resume from its checkpoint. requeues counts those
-- requeues (each also leaves a state event with the outcome it replaced); requeued_at is when the
-- last one happened (NULL: never), from which the backfill window counts its wait.

ALTER TABLE jobs ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN requeued_at INTEGER;
