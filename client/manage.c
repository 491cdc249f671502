/* manage.c — `trainq cancel ID…`, `trainq rm ID…` and `trainq requeue ID… [--wait]`: POST
 * /v1/jobs/{id}/cancel, DELETE /v1/jobs/{id} and POST /v1/jobs/{id}/requeue for each id, the
 * server's message for each one that fails (exit 1 if any did); requeue --wait then follows
 * each requeued job to its end as submit --wait does (tq_cli_wait_job). See client.h. */
#include "client.h"

#include <stdlib.h>
#include <string.h>

static const tq_opt no_opts[] = { { NULL, NULL, NULL, NULL, 0 } };
static const tq_opt requeue_opts[] = {
    { "--wait", NULL, NULL,
      "then follow each requeued job to its end, one after another (progress on stderr)", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_cancel = {
    "cancel", "ID...",
    "  Cancels each job (POST /v1/jobs/ID/cancel): a queued one at once, a running one at its next\n"
    "  step boundary (after a checkpoint). A finished job cannot be cancelled (the daemon says so).\n",
    no_opts,
    "exit: 0 every job cancelled, 1 any failed, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_CLIENT
};
const tq_cmd_doc tq_doc_rm = {
    "rm", "ID...",
    "  Deletes each finished job (DELETE /v1/jobs/ID) with its steps, evals, log, model and\n"
    "  checkpoint. A queued or running job must be cancelled first (trainq cancel ID).\n",
    no_opts,
    "exit: 0 every job removed, 1 any failed, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_CLIENT
};

const tq_cmd_doc tq_doc_requeue = {
    "requeue", "ID...",
    "  Sends each failed or cancelled job back to the queue (POST /v1/jobs/ID/requeue). When it runs\n"
    "  again it resumes from its checkpoint, so every step is recorded once across the attempts; a\n"
    "  job cancelled before it started begins at step 0. Refused (the daemon says why): a queued,\n"
    "  running or succeeded job, a failure a requeue would repeat (invalid_spec, memory_limit,\n"
    "  input_changed), a job whose dependency (after) failed: requeue that one first.\n",
    requeue_opts,
    "exit: 0 every job requeued (with --wait: and every one then succeeded), 1 any refused (or\n"
    "      failed or was cancelled), 2 bad usage, 3 no daemon\n",
    TQ_OPTS_CLIENT
};

static void cancel_usage(FILE *f) { tq_opts_help(f, &tq_doc_cancel); }
static void rm_usage(FILE *f) { tq_opts_help(f, &tq_doc_rm); }
static void requeue_usage(FILE *f) { tq_opts_help(f, &tq_doc_requeue); }

/* what each command prints for a job the daemon accepted */
static void cancelled(long long id, const cJSON *j) {
    const char *st = tq_js_str(j, "state", "?");
    if (!strcmp(st, "cancelled")) printf("job %lld cancelled\n", id);
    else printf("job %lld cancel requested: it stops at its next step boundary (state %s)\n", id, st);
}
static void removed(long long id, const cJSON *j) { (void)j; printf("job %lld removed\n", id); }
static void requeued(long long id, const cJSON *j) {
    double step = tq_js_num(j, "progress.step", 0), total = tq_js_num(j, "progress.total_steps", 0);
    if (step > 0 && total > 0) printf("job %lld requeued: it resumes after step %.0f of %.0f\n", id, step, total);
    else if (step > 0) printf("job %lld requeued: it resumes after step %.0f\n", id, step);
    else printf("job %lld requeued: it starts at step 0\n", id);
}

typedef struct {
    const char *prog;
    const tq_cmd_doc *doc;
    void (*usage)(FILE *);
    const char *method, *path;   /* path: a format with the id's %lld */
    long ok, ok2;                /* the statuses that mean done (ok2 0: only ok) */
    void (*done)(long long id, const cJSON *job);   /* job: the answer's body parsed (NULL if none) */
    int waits;                   /* takes --wait: follow each job it acted on to its end */
} job_action;

static const job_action CANCEL = { "trainq cancel", &tq_doc_cancel, cancel_usage, "POST", "/v1/jobs/%lld/cancel",
                                   200, 0, cancelled, 0 };
static const job_action RM = { "trainq rm", &tq_doc_rm, rm_usage, "DELETE", "/v1/jobs/%lld", 204, 200, removed, 0 };
static const job_action REQUEUE = { "trainq requeue", &tq_doc_requeue, requeue_usage, "POST",
                                    "/v1/jobs/%lld/requeue", 200, 0, requeued, 1 };

/* the ids of argv (every one checked before anything is sent), --wait in *wait where the command
 * takes it (wait not NULL); NULL and an exit code in *rc */
static long long *parse_ids(const char *prog, int argc, char **argv, void (*usage)(FILE *), int *n,
                            int *wait, int *rc) {
    *rc = 0;
    *n = 0;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return NULL; }
    long long *ids = calloc((size_t)argc + 1, sizeof *ids);
    if (!ids) { *rc = TQ_CLI_FAILED; return NULL; }
    for (int i = 0; i < argc; i++) {
        if (wait && !strcmp(argv[i], "--wait")) { *wait = 1; continue; }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "%s: unknown option %s\n", prog, argv[i]);
            usage(stderr);
            free(ids);
            *rc = TQ_CLI_USAGE;
            return NULL;
        }
        if (tq_cli_parse_id(argv[i], &ids[*n])) {
            fprintf(stderr, "%s: \"%s\" is not a job id (nothing was done)\n", prog, argv[i]);
            free(ids);
            *rc = TQ_CLI_USAGE;
            return NULL;
        }
        (*n)++;
    }
    if (*n == 0) {
        fprintf(stderr, "%s: which jobs? (one or more ids)\n", prog);
        usage(stderr);
        free(ids);
        *rc = TQ_CLI_USAGE;
        return NULL;
    }
    return ids;
}

static int each(const job_action *a, int argc, char **argv) {
    int n, rc;
    rc = tq_opts_check(a->doc, argc, argv);
    if (rc >= 0) return rc;
    int wait = 0;
    long long *ids = parse_ids(a->prog, argc, argv, a->usage, &n, a->waits ? &wait : NULL, &rc);
    if (!ids) return rc;
    int failed = 0, nacted = 0;
    for (int i = 0; i < n; i++) {
        char path[96];
        tq_http_resp r;
        snprintf(path, sizeof path, a->path, ids[i]);
        rc = tq_http_request(a->method, path, NULL, &r);
        if (rc) { free(ids); return rc; }
        if (r.status == a->ok || (a->ok2 && r.status == a->ok2)) {
            cJSON *j = r.len ? cJSON_Parse(r.body) : NULL;
            a->done(ids[i], j);
            cJSON_Delete(j);
            ids[nacted++] = ids[i];   /* the ones to follow with --wait (i >= nacted) */
        } else {
            tq_http_job_error(a->prog, ids[i], &r);
            failed = 1;
        }
        tq_http_resp_free(&r);
    }
    fflush(stdout);
    for (int i = 0; wait && i < nacted; i++) {
        rc = tq_cli_wait_job(a->prog, ids[i]);
        if (rc == TQ_CLI_UNREACHABLE) { free(ids); return rc; }
        if (rc) failed = 1;
    }
    free(ids);
    return failed ? TQ_CLI_FAILED : TQ_CLI_OK;
}

int tq_cli_cancel(int argc, char **argv) { return each(&CANCEL, argc, argv); }
int tq_cli_rm(int argc, char **argv) { return each(&RM, argc, argv); }
int tq_cli_requeue(int argc, char **argv) { return each(&REQUEUE, argc, argv); }
