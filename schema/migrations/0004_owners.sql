-- 0004_owners.sql - every job belongs to the person who submitted it (issue 15), known from the
-- kernel (SO_PEERCRED on the unix socket, sock_diag on loopback TCP): owner is the user name and
-- owner_uid the uid at submission. NULL for jobs submitted before this migration or from a
-- connection without identity (shown as "unknown"; only admins may cancel or delete them).

ALTER TABLE jobs ADD COLUMN owner TEXT;
ALTER TABLE jobs ADD COLUMN owner_uid INTEGER;
CREATE INDEX jobs_owner ON jobs (owner, state);
