/* daemon.h — the daemon's processes (daemon/): `trainq serve` (the supervisor with the HTTP
 * API), `trainq worker` (one job in its own process) and the systemd notify protocol.
 * Each cmd_* returns the process's exit status; nothing else here exits. */
#ifndef TQ_DAEMON_H
#define TQ_DAEMON_H

#include "client/opts.h"

#include <stddef.h>

int tq_cmd_serve(int argc, char **argv);
int tq_cmd_worker(int argc, char **argv);
/* their options (client/opts.h), for their --help and `trainq --help` */
extern const tq_cmd_doc tq_doc_serve, tq_doc_worker;

/* The worker's exit statuses, each with its meaning in words, in one list: the enum below, the
 * supervisor's message for a worker that ended without finishing its job (tq_worker_end_words)
 * and `trainq worker --help`. Any other status, or a signal, is a crash to the supervisor.
 * X(ENUM, status, words) */
#define TQ_WORKER_EXITS(X)                                                                    \
    X(SUCCEEDED, 0, "the job succeeded")                                                      \
    X(FAILED, 1, "the job failed: its row says why, unless the database refused that write too") \
    X(USAGE, 2, "a bad command line, or the job was not claimed (running) for this worker")   \
    X(CANCELLED, 3, "the job was cancelled")                                                  \
    X(UNRECORDED, 4, "the job ended but the database would not take its outcome: it went to the " \
                     "daemon through --report-fd, to be recorded when the database takes writes again") \
    X(DEVICE_BUSY, 5, "the device the job was placed on was busy (another process took it since the " \
                      "placement): the job goes back to the queue, and nothing is placed there for a pause") \
    X(REQUEUE, 75, "stopped by SIGTERM after a checkpoint, to go back to the queue (EX_TEMPFAIL)") \
    X(EXEC_FAILED, 127, "the worker program could not be started (exec of /proc/self/exe failed: the " \
                        "binary was removed or replaced?)")

enum {
#define TQ_X(e, status, words) TQ_WORKER_##e = status,
    TQ_WORKER_EXITS(TQ_X)
#undef TQ_X
};

/* The words of a worker's exit status (NULL for one the worker does not use). */
const char *tq_worker_exit_words(int status);
/* A worker's end as a phrase, from its wait status: "the worker exited with status 1 (the job
 * failed: …)", "the worker was killed by signal 9 (Killed) — likely the kernel's OOM killer …".
 * Writes buf and returns it. */
const char *tq_worker_end_words(int wait_status, char *buf, size_t n);

/* sd_notify.c: one datagram to $NOTIFY_SOCKET ('@' = abstract namespace); 0 sent, 1 no socket
 * set, -1 error (or dropped). Never blocks long: "STATUS=…" is dropped when the receiver's
 * queue is full, other messages wait at most 2 s. Thread-safe. */
int tq_sd_notify(const char *state);
/* WATCHDOG_USEC in µs (0 when unset or not for this pid). */
long long tq_sd_watchdog_usec(void);
#endif
