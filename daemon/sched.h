/* sched.h — placement as a pure function: which queued jobs start now, on which device, and why
 * each other one waits.
 *
 * Contract: no processes, no SQL, no clock of its own; the supervisor (serve.c) feeds it the
 * devices as they stand (budget, the planned bytes and count of the jobs running there, the
 * driver's free bytes for a GPU) and the queue in order (priority DESC, then submission), and
 * carries out the answer. Unit-tested with tables of cases (tests/unit/test_sched.c).
 *
 * Rules (README "Sharing the devices"):
 * - A job may go to the devices its `device` allows (device.h; auto prefers a GPU).
 * - It is placed on a device when its planned peak there fits the room — budget minus the
 *   planned peaks of the jobs running there, and no more than the driver's free bytes when
 *   those are known — and the device runs fewer than max_jobs jobs. Among the devices where it
 *   fits, the one with the fewest running jobs, then the most room (GPUs before the CPU for
 *   auto): jobs spread over the GPUs rather than pile up on one.
 * - Backfill: a job that does not fit does not stop later jobs from being placed, unless it has
 *   waited longer than the backfill window: then the device it would fit best (the largest
 *   budget among those whose budget can hold it, then the most room) is held for it, and
 *   nothing later in the queue is placed there until it starts.
 * - A job whose planned peak exceeds the budget of every device it may use can never start:
 *   TQ_WAIT_NEVER (the supervisor fails it with cannot_fit).
 * - max_running_per_user: a job whose owner already runs that many jobs waits (TQ_WAIT_USER)
 *   and holds nothing; the queue's order among equal priorities is the fair-share order the
 *   caller gives (the owner with the least recent device time first).
 * - Dependencies: a job whose "after" lists a job that has not succeeded yet waits
 *   (TQ_WAIT_DEPENDENCY) and holds nothing — later jobs are placed as if it were not there —
 *   unless it could never fit anywhere (TQ_WAIT_NEVER, as for any job). Its backfill clock starts
 *   when it becomes eligible (the caller's waited_s).
 * - A device marked busy (the supervisor's pause after a worker found it taken by another
 *   process) takes nothing: a job that would fit there and fits nowhere else waits
 *   (TQ_WAIT_BUSY); past the backfill window it holds the device it suits best only if that one
 *   is not busy. A device on probe takes one job, then counts as busy.
 * - CPU jobs split the cores: a CPU job without its own `threads` gets the cores, less one for
 *   each GPU job running or placed before it (its worker's host thread issues the GPU's work),
 *   divided by the number of CPU jobs running once it starts (at least 1). */
#ifndef TQ_SCHED_H
#define TQ_SCHED_H
#include <stdint.h>
#include "device.h"

#define TQ_SCHED_MAX_DEVICES 17

typedef struct {
    char id[TQ_DEV_ID_MAX];     /* "cuda:0" … then "cpu" (tq_devices_resolve's order) */
    long long budget;           /* bytes jobs may plan here */
    long long planned;          /* sum of the planned peaks of the jobs running here */
    long long driver_free;      /* GPU: free bytes as the driver reports them now; < 0 unknown */
    int njobs, max_jobs;
    int cores;                  /* CPU: cores to share; 0 for a GPU */
    int busy;                   /* 1: found busy (a worker could not open it: another process
                                 * holds it): nothing is placed here now */
    int probe;                  /* 1: busy before, its pause over: one job may try it, then it is
                                 * busy again until that job shows the device works */
    int held_by;                /* out: index into the queue of the job this device is held for, -1 */
} tq_sched_dev;

typedef struct {
    int64_t id;
    tq_devsel want;
    long long need_cpu, need_gpu;   /* planned peak on the CPU / on a GPU (context + workspace bound) */
    double waited_s;                /* time in the queue */
    int threads;                    /* the spec's threads, 0: share the cores */
    int user;                       /* index into the policy's user_running[], -1: no owner */
    int deps_pending;               /* jobs of its "after" not succeeded yet: > 0 waits */
} tq_sched_job;

typedef enum {
    TQ_WAIT_NONE = 0,       /* placed */
    TQ_WAIT_MEMORY,         /* no device it may use has room for its plan now */
    TQ_WAIT_SLOTS,          /* it would fit, but the device runs max_jobs jobs */
    TQ_WAIT_PRIORITY,       /* the device it fits is held for a job ahead that waited too long */
    TQ_WAIT_NEVER,          /* the plan exceeds the budget of every device it may use */
    TQ_WAIT_NO_DEVICE,      /* this daemon serves no device the job may use */
    TQ_WAIT_USER,           /* its owner runs max_running_per_user jobs already */
    TQ_WAIT_DEPENDENCY,     /* a job of its "after" has not succeeded yet */
    TQ_WAIT_BUSY,           /* it would fit, but the device is busy (tq_sched_dev.busy) */
} tq_wait;

typedef struct {
    int dev;                /* placed: index into devs; waiting: the device it waits for (-1 none) */
    tq_wait wait;
    long long needs, free;  /* its planned peak on dev and the room there now */
    int threads;            /* placed on the CPU: threads to give the worker (0 on a GPU) */
    int64_t behind;         /* TQ_WAIT_PRIORITY: the job the device is held for */
} tq_sched_out;

typedef struct {
    double backfill_window_s;       /* < 0: no hold ever (pure backfill) */
    int max_per_user;               /* > 0: at most this many running jobs per owner */
    int *user_running;              /* running jobs per user index (updated as jobs are placed);
                                     * NULL when max_per_user is 0 */
} tq_sched_policy;

/* Places jobs q[0..nq) (in queue order) on devs[0..ndev), updating devs[] (planned, njobs,
 * driver_free, held_by) as if the placements had started. out[i] answers q[i]. Returns the
 * number placed. */
int tq_sched_place(tq_sched_dev *devs, int ndev, const tq_sched_job *q, int nq,
                   const tq_sched_policy *pol, tq_sched_out *out);

/* "memory", "max_jobs", "priority", "never", "no_device", "user_limit", "dependency",
 * "device_busy", or "" for
 * TQ_WAIT_NONE */
const char *tq_wait_name(tq_wait w);
#endif
