/* api.h — trainq's HTTP/JSON API (CONTRACT.md "HTTP API") on libmicrohttpd.
 *
 * Contract
 * - tq_api_start listens on cfg->host:cfg->port with an internal polling thread pool and
 *   returns at once; tq_api_stop stops accepting, ends the event streams and joins the
 *   threads. Both are called from one thread (the daemon's main thread).
 * - Handlers read and write the queue through schema/queue.h, each pool thread with its own
 *   store (SQLite connection, synchronous=FULL so that a 201 is durable). The API never
 *   touches a device; it plans a submitted spec (trainer.h's tq_plan_spec, which reads the
 *   dataset's files) to refuse a job that cannot fit (422), caching plans per shape.
 * - Errors are answered as {"error":{"code","message","field"?}} with the contract's status;
 *   nothing here exits; a bad request never harms the daemon or the queue.
 * - Memory: the tq_api owns everything it allocates; cfg's strings are copied. */
#ifndef TQ_API_H
#define TQ_API_H
#include <stddef.h>
#include "ledger.h"

/* A GPU as the daemon's probe saw it (a `trainq devices` child at start: the daemon itself
 * never creates a CUDA context, so it holds no device memory and forks its workers cleanly). */
typedef struct {
    int ordinal;
    char name[96];
    char arch[16];               /* "sm_90" */
    long long total_bytes, free_bytes;   /* free: at the probe, before any job of ours ran */
    char pci_bus_id[32];         /* NVML's name for it ("" unknown): the supervisor's memory reads */
    int compute_mode;            /* TQ_CM_* (train/device.h), -1 unknown */
} tq_api_gpu;

typedef struct {
    const char *host;            /* listen address: "127.0.0.1", "::1", "0.0.0.0", "localhost" */
    unsigned short port;
    const char *db_path;
    const char *jobs_dir;        /* <state dir>/jobs: a job's files are jobs_dir/<id>/ */
    const char *devices;         /* the daemon's --devices as given (auto, or a list) */
    const tq_api_gpu *gpus;      /* the GPUs jobs may use (copied); NULL/0: none */
    int ngpus;
    const char *cuda;            /* "available", or why no GPU is used (one line) */
    const char *allowed_hosts;   /* extra Host names, comma-separated; NULL none */
    unsigned threads;            /* pool size, 0: 4 */
    size_t max_body;             /* bytes, 0: 64 KiB */
    tq_ledger *ledger;           /* the devices and placement (not owned; outlives the API) */
    const char *admin_group;     /* members may cancel/delete anyone's job; NULL: "trainq-admin" */
    int private_jobs;            /* 1: only owners and admins read a job */
    int allow_remote_writes;     /* 1: connections from other hosts (no identity) may write */
    const char *socket_path;     /* the unix socket to listen on too (mode 0666); NULL none */
    double fair_share_window_s;  /* GET /v1/users' window (the scheduler's fair share) */
    double header_timeout_s;     /* a connection's request (headers and body) must arrive within
                                  * this many seconds of its opening or of the previous answer;
                                  * 0: 10 (serve's --header-timeout) */
} tq_api_config;

typedef struct tq_api tq_api;

tq_api *tq_api_start(const tq_api_config *cfg, char *err, size_t errlen);
void tq_api_stop(tq_api *);
#endif
