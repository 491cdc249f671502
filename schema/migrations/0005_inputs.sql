-- 0005_inputs.sql - the files a job reads on its submitter's behalf (issue 15): data_dir and
-- init_from as submission checked them, resolved (symlinks followed), with their device and
-- inode, as JSON [{"field","path","dev","ino"}]. The worker opens the resolved paths and refuses
-- one whose inode changed since the check. NULL: nothing was checked (older jobs).

ALTER TABLE jobs ADD COLUMN inputs TEXT CHECK (inputs IS NULL OR json_valid(inputs));
