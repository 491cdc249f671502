/* manage.c — `trainq cancel ID…` and `trainq rm ID…`: POST /v1/jobs/{id}/cancel and DELETE
 * /v1/jobs/{id} for each id, the server's message for each one that fails (exit 1 if any did).
 * See client.h. */
#include "client.h"

#include <stdlib.h>
#include <string.h>

static const tq_opt no_opts[] = { { NULL, NULL, NULL, NULL, 0 } };
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

static void cancel_usage(FILE *f) { tq_opts_help(f, &tq_doc_cancel); }
static void rm_usage(FILE *f) { tq_opts_help(f, &tq_doc_rm); }

/* the ids of argv (every one checked before anything is sent); NULL and an exit code in *rc */
static long long *parse_ids(const char *prog, int argc, char **argv, void (*usage)(FILE *), int *n, int *rc) {
    *rc = 0;
    *n = 0;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return NULL; }
    long long *ids = calloc((size_t)argc + 1, sizeof *ids);
    if (!ids) { *rc = TQ_CLI_FAILED; return NULL; }
    for (int i = 0; i < argc; i++) {
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

static int each(const char *prog, int argc, char **argv, int cancel) {
    int n, rc;
    rc = tq_opts_check(cancel ? &tq_doc_cancel : &tq_doc_rm, argc, argv);
    if (rc >= 0) return rc;
    long long *ids = parse_ids(prog, argc, argv, cancel ? cancel_usage : rm_usage, &n, &rc);
    if (!ids) return rc;
    int failed = 0;
    for (int i = 0; i < n; i++) {
        char path[96];
        tq_http_resp r;
        if (cancel) snprintf(path, sizeof path, "/v1/jobs/%lld/cancel", ids[i]);
        else snprintf(path, sizeof path, "/v1/jobs/%lld", ids[i]);
        rc = tq_http_request(cancel ? "POST" : "DELETE", path, NULL, &r);
        if (rc) { free(ids); return rc; }
        if ((cancel && r.status == 200) || (!cancel && (r.status == 204 || r.status == 200))) {
            if (!cancel) {
                printf("job %lld removed\n", ids[i]);
            } else {
                cJSON *j = cJSON_Parse(r.body);
                const char *st = tq_js_str(j, "state", "?");
                if (!strcmp(st, "cancelled")) printf("job %lld cancelled\n", ids[i]);
                else printf("job %lld cancel requested: it stops at its next step boundary (state %s)\n", ids[i], st);
                cJSON_Delete(j);
            }
        } else {
            tq_http_job_error(prog, ids[i], &r);
            failed = 1;
        }
        tq_http_resp_free(&r);
    }
    fflush(stdout);
    free(ids);
    return failed ? TQ_CLI_FAILED : 0;
}

int tq_cli_cancel(int argc, char **argv) { return each("trainq cancel", argc, argv, 1); }
int tq_cli_rm(int argc, char **argv) { return each("trainq rm", argc, argv, 0); }
