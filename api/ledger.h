/* ledger.h — the device ledger: what the scheduler (daemon/) decided, as the API shows it.
 *
 * The supervisor owns placement (daemon/sched.h); after each round it publishes a snapshot
 * here: every device with its budget, the planned bytes and ids of the jobs running there, the
 * driver's view of a GPU's memory, and for each queued job why it waits. The API reads it for
 * GET /v1/devices, /metrics, the `waiting_for` of a queued job, and admission (a job whose plan
 * exceeds the budget of every device it may use is refused with 422).
 *
 * Contract: one writer (the supervisor's thread), any number of readers (the API's pool
 * threads); every call takes the ledger's mutex and copies, so readers never see half a
 * snapshot and hold nothing after the call returns. Never exits; allocation failures keep the
 * previous snapshot. */
#ifndef TQ_LEDGER_H
#define TQ_LEDGER_H
#include <stdint.h>

#define TQ_LEDGER_MAX_DEVICES 17
#define TQ_LEDGER_MAX_JOBS 64      /* jobs shown per device (max_jobs is capped to this) */

typedef struct {
    int64_t id;
    long long bytes;               /* its planned peak on this device */
    int threads;                   /* CPU: the threads its worker was given; 0 on a GPU */
} tq_ledger_job;

typedef struct {
    char id[16];                   /* "cuda:0" … "cpu" */
    int gpu;                       /* 1 for cuda:N */
    long long budget;              /* bytes jobs may plan here (GPU: total − reserve) */
    long long total_bytes;         /* the device's memory (GPU: the driver's; CPU: physical) */
    long long reserve_bytes;       /* GPU: the reserve kept for contexts and other processes */
    long long driver_used, driver_free;   /* GPU: the driver's numbers now (NVML); < 0 unknown */
    long long driver_room;         /* GPU: driver_free less what our running jobs' plans may still
                                    * take (what placement may use); < 0 unknown */
    int max_jobs, cores;           /* cores: the CPU's to share; 0 on a GPU */
    long long planned;             /* sum of the running jobs' planned peaks */
    char busy[300];                /* "" not busy; else why nothing is placed here now (a worker
                                    * found it taken by another process: the pause, or the one
                                    * job trying it again) */
    int njobs;
    tq_ledger_job jobs[TQ_LEDGER_MAX_JOBS];
} tq_ledger_dev;

typedef struct {
    int64_t id;                    /* the queued job */
    char reason[16];               /* queued: memory, max_jobs, priority, user_limit,
                                    * dependency, device_busy; running: storage (its end is
                                    * recorded once the database takes writes) */
    char device[16];               /* the device it waits for ("" none) */
    long long needs, free;         /* its planned peak there and the room there now */
    int64_t behind;                /* reason priority: the job that device is held for */
    char message[300];             /* reason storage: the database's complaint; device_busy: why
                                    * the device is busy, and for how long nothing goes there */
    int nafter;                    /* reason dependency: the jobs it waits for (not succeeded yet) */
    int64_t after[16];
} tq_ledger_wait;

typedef struct tq_ledger tq_ledger;

/* A ledger holding the devices as they are at start (no jobs); NULL on out of memory. */
tq_ledger *tq_ledger_new(const tq_ledger_dev *devs, int ndev);
void tq_ledger_free(tq_ledger *);
/* Replaces the snapshot: devices (same ids as at start) and the waiting jobs. */
void tq_ledger_publish(tq_ledger *, const tq_ledger_dev *devs, int ndev, const tq_ledger_wait *w, int nw);
/* Copies the devices into out[0..max); returns the count. */
int tq_ledger_devices(tq_ledger *, tq_ledger_dev *out, int max);
/* 1 and *out when job `id` is waiting in the last snapshot, else 0. */
int tq_ledger_wait_of(tq_ledger *, int64_t id, tq_ledger_wait *out);
#endif
