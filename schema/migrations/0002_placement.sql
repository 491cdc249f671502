-- 0002_placement.sql - several jobs at once on every device (the scheduler, daemon/sched.c).
-- A job's planned peak as placement reads it, on the CPU and on a GPU (the GPU's adds the CUDA
-- context and the cuDNN workspace bound), computed once at submission; NULL for jobs submitted
-- before this migration (placed only on an idle device). threads: the CPU threads its worker
-- was given (the cores split among the CPU jobs running together); NULL on a GPU.

ALTER TABLE jobs ADD COLUMN planned_cpu_bytes INTEGER;
ALTER TABLE jobs ADD COLUMN planned_gpu_bytes INTEGER;
ALTER TABLE jobs ADD COLUMN threads INTEGER;
