/* client.h — the `trainq submit/ls/show/logs/steps/cancel/rm/compare` commands: a client of the
 * daemon's HTTP API (docs/api.md) through libcurl, like any user's script. Nothing here links the
 * store or the engine (DESIGN.md, "The client is a client"): only libcurl, cJSON and libc.
 *
 * The server: `--server URL` (anywhere on the command line), else $TRAINQ_SERVER, else the unix
 * socket $TRAINQ_SOCKET when that exists, else ./var/trainq.sock (make run's) when that exists,
 * else /run/trainq/trainq.sock (the systemd unit's) when that exists, else http://127.0.0.1:8470. `unix:/path/to.sock` in either of the first two talks HTTP over that
 * socket (CURLOPT_UNIX_SOCKET_PATH).
 *
 * Exit codes (TQ_CLI_*): 0 ok, 1 the operation or the job failed, 2 bad usage, 3 the daemon
 * cannot be reached. Errors go to stderr as "trainq CMD: what went wrong"; results to stdout.
 *
 * Single-threaded; one process runs one command. Memory: every tq_http_resp is freed with
 * tq_http_resp_free; strings returned by tq_fmt_* live in the caller's buffer. */
#ifndef TQ_CLIENT_H
#define TQ_CLIENT_H

#include "opts.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>

enum { TQ_CLI_OK = 0, TQ_CLI_FAILED = 1, TQ_CLI_USAGE = 2, TQ_CLI_UNREACHABLE = 3 };

/* ---- dispatch (client/dispatch.c) ---- */

/* 1 when argv0 names a client command (or is the global option --server) */
int tq_client_is_command(const char *cmd);
/* Runs a client command: argv[0] is the command (or --server URL then the command). */
int tq_client_main(int argc, char **argv);
/* The usage lines of the client commands (for `trainq --help`). */
void tq_client_usage(FILE *f);

/* ---- the HTTP helper (client/http.c) ---- */

typedef struct {
    long status;          /* HTTP status; 0 when no answer came */
    char *body;           /* NUL-terminated (malloc'd; may hold NULs inside for binary bodies) */
    size_t len;
    char ctype[128];      /* Content-Type, "" when none */
} tq_http_resp;

/* Picks the server from --server (NULL: none given), the environment and the socket files.
 * Returns 0, or TQ_CLI_USAGE with a message on stderr for an unusable value. */
int tq_http_init(const char *prog, const char *server_flag);
/* The server as a user reads it ("http://127.0.0.1:8470", "unix:/run/trainq.sock"). */
const char *tq_http_server(void);

/* One request. method "GET", "POST", "DELETE"; path starts with '/' (already %-encoded);
 * json_body NULL for none (a POST without a body sends an empty one). 0 when an answer came
 * (whatever its status: check r->status), else TQ_CLI_UNREACHABLE after printing
 * "PROG: cannot reach the daemon at …" on stderr. */
int tq_http_request(const char *method, const char *path, const char *json_body, tq_http_resp *r);
void tq_http_resp_free(tq_http_resp *r);
/* 1: unreachable servers return TQ_CLI_UNREACHABLE without the message (retry loops) */
void tq_http_set_quiet(int quiet);

/* A streamed GET (server-sent events, a followed log). on_data gets the body of a 2xx answer
 * as it arrives and returns 0 to go on, nonzero to stop (then this returns 0). Any other status:
 * the body is kept in err_resp (status set) instead, and 0 is returned. A dropped connection
 * after a 2xx answer returns 0 with *dropped set (when dropped != NULL, without a message);
 * no answer at all: TQ_CLI_UNREACHABLE with the message. idle_s > 0: give up (dropped) after
 * that many seconds without a byte. */
typedef int (*tq_http_data_fn)(void *ctx, const char *data, size_t n);
int tq_http_stream(const char *path, tq_http_data_fn on_data, void *ctx, long idle_s,
                   tq_http_resp *err_resp, int *dropped);

/* Server-sent events on top of tq_http_stream: on_event(ctx, type, id, data) for each event
 * ("message" when it names none); return nonzero to stop. */
typedef int (*tq_sse_fn)(void *ctx, const char *type, const char *id, const char *data);
int tq_sse_stream(const char *path, tq_sse_fn on_event, void *ctx, tq_http_resp *err_resp, int *dropped);

/* The message of an error answer: "MESSAGE (field F)" from {"error":{…}}, else the status and
 * the start of the body. Writes buf and returns it. */
const char *tq_http_errmsg(const tq_http_resp *r, char *buf, size_t n);
/* The error's code ("not_found", …) or "" */
const char *tq_http_errcode(const tq_http_resp *r, char *buf, size_t n);
/* The error's field or "" */
const char *tq_http_errfield(const tq_http_resp *r, char *buf, size_t n);
/* Prints "PROG: job ID: MESSAGE" to stderr for an error answer about one job (without the
 * "job ID:" when the message names the job already): cancel, rm, requeue. */
void tq_http_job_error(const char *prog, long long id, const tq_http_resp *r);

/* ---- shared helpers (client/util.c) ---- */

/* Parses a positive job id; 0 on success. */
int tq_cli_parse_id(const char *s, long long *id);
/* GET path and parse the JSON answer into *out (cJSON_Delete it). 0 ok, TQ_CLI_FAILED with a
 * message "PROG: WHAT: server message" for an error status or a body that is not JSON,
 * TQ_CLI_UNREACHABLE. */
/* The same; what NULL: messages are "PROG: MESSAGE"; raw: print the body as it came (--json)
 * and return 0 with *out NULL. */
int tq_cli_get_json_raw(const char *prog, const char *what, const char *path, int raw, cJSON **out);
int tq_cli_get_json(const char *prog, const char *what, const char *path, cJSON **out);

/* Numbers as people read them; each returns buf. */
const char *tq_fmt_bytes(double bytes, char *buf, size_t n);          /* "12.3 MiB", "-" for < 0 */
const char *tq_fmt_age(double seconds, char *buf, size_t n);          /* "45s", "3m", "2h5m", "4d" */
const char *tq_fmt_rate(double per_s, char *buf, size_t n);           /* "1234", "12.5k"… */
/* RFC 3339 UTC ("2024-05-01T21:01:17.841Z") to unix seconds; < 0 when it does not parse. */
double tq_parse_time(const char *s);
double tq_now_s(void);

/* cJSON accessors: a missing or wrong-typed item gives the default. Dotted paths ("a.b"). */
const cJSON *tq_js_get(const cJSON *o, const char *path);
double tq_js_num(const cJSON *o, const char *path, double dflt);   /* NAN for null with dflt NAN */
const char *tq_js_str(const cJSON *o, const char *path, const char *dflt);

/* A plain-text table: rows of cells, columns padded to their widest cell (right-aligned
 * where right[col]). */
typedef struct {
    int ncols, nrows, cap;
    const char *const *head;
    const int *right;
    char **cells;          /* nrows * ncols, malloc'd */
} tq_table;
void tq_table_init(tq_table *t, int ncols, const char *const *head, const int *right);
void tq_table_add(tq_table *t, const char *const *cells);
void tq_table_print(tq_table *t, FILE *f);
void tq_table_free(tq_table *t);

/* ---- the commands (one file per group) ---- */
/* Each command's options (opts.h), beside its parser: its --help and its line of `trainq --help`. */
extern const tq_cmd_doc tq_doc_submit, tq_doc_ls, tq_doc_show, tq_doc_logs, tq_doc_steps, tq_doc_cancel,
                        tq_doc_rm, tq_doc_compare;
int tq_cli_submit(int argc, char **argv);    /* submit.c */
int tq_cli_ls(int argc, char **argv);        /* jobs.c */
int tq_cli_show(int argc, char **argv);      /* jobs.c */
int tq_cli_logs(int argc, char **argv);      /* follow.c */
int tq_cli_steps(int argc, char **argv);     /* follow.c */
int tq_cli_cancel(int argc, char **argv);    /* manage.c */
int tq_cli_rm(int argc, char **argv);        /* manage.c */
extern const tq_cmd_doc tq_doc_requeue;
int tq_cli_requeue(int argc, char **argv);   /* manage.c */
int tq_cli_compare(int argc, char **argv);   /* compare.c */

/* Follows job id's events until it ends, showing progress on stderr (a bar on a terminal),
 * then prints its outcome. Returns 0 succeeded, 1 failed/cancelled/deleted, 3 unreachable.
 * (submit.c; used by submit --wait) */
int tq_cli_wait_job(const char *prog, long long id);

#endif
