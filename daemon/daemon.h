/* daemon.h — the daemon's processes (daemon/): `trainq serve` (the supervisor with the HTTP
 * API), `trainq worker` (one job in its own process) and the systemd notify protocol.
 * Each cmd_* returns the process's exit status; nothing else here exits. */
#ifndef TQ_DAEMON_H
#define TQ_DAEMON_H

int tq_cmd_serve(int argc, char **argv);
int tq_cmd_worker(int argc, char **argv);

/* Worker exit statuses (anything else, or a signal, is a crash to the supervisor). */
enum {
    TQ_WORKER_SUCCEEDED = 0,
    TQ_WORKER_FAILED = 1,      /* the job row says why */
    TQ_WORKER_USAGE = 2,       /* bad command line, or the job is not running */
    TQ_WORKER_CANCELLED = 3,
    TQ_WORKER_UNRECORDED = 4,  /* the job ended but its row could not be written (a full or
                                * read-only disk): the outcome went to --report-fd for the
                                * supervisor to record when the database takes writes again */
    TQ_WORKER_REQUEUE = 75,    /* stopped by SIGTERM after a checkpoint: requeue it (EX_TEMPFAIL) */
};

/* sd_notify.c: one datagram to $NOTIFY_SOCKET ('@' = abstract namespace); 0 sent, 1 no socket
 * set, -1 error (or dropped). Never blocks long: "STATUS=…" is dropped when the receiver's
 * queue is full, other messages wait at most 2 s. Thread-safe. */
int tq_sd_notify(const char *state);
/* WATCHDOG_USEC in µs (0 when unset or not for this pid). */
long long tq_sd_watchdog_usec(void);
#endif
