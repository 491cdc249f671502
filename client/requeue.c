/* requeue.c — `trainq requeue ID…`: POST /v1/jobs/{id}/requeue for each id. A failed or cancelled
 * job goes back to the queue and resumes from its checkpoint (docs/api.md, "POST
 * /v1/jobs/{id}/requeue"); the daemon's message for each one it refuses (exit 1 if any was).
 * See client.h. */
#include "client.h"

#include <stdlib.h>
#include <string.h>

static const tq_opt requeue_opts[] = { { NULL } };
const tq_cmd_doc tq_doc_requeue = {
    "requeue", "ID...",
    "  Sends each failed or cancelled job back to the queue (POST /v1/jobs/ID/requeue). When it runs\n"
    "  again it resumes from its checkpoint, so every step is recorded once across the attempts; a\n"
    "  job cancelled before it started begins at step 0. Refused (the daemon says why): a queued,\n"
    "  running or succeeded job, a failure a requeue would repeat (invalid_spec, memory_limit,\n"
    "  input_changed), a job whose dependency (after) failed: requeue that one first.\n",
    requeue_opts,
    "exit: 0 every job requeued, 1 any refused, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_CLIENT
};

int tq_cli_requeue(int argc, char **argv) {
    const char *prog = "trainq requeue";
    int rc = tq_opts_check(&tq_doc_requeue, argc, argv);
    if (rc >= 0) return rc;
    long long *ids = calloc((size_t)argc + 1, sizeof *ids);
    if (!ids) return TQ_CLI_FAILED;
    int n = 0;
    for (int i = 0; i < argc; i++) {   /* every id checked before anything is sent */
        if (tq_cli_parse_id(argv[i], &ids[n])) {
            fprintf(stderr, "%s: \"%s\" is not a job id (nothing was done; trainq requeue --help)\n", prog, argv[i]);
            free(ids);
            return TQ_CLI_USAGE;
        }
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "%s: which jobs? (one or more ids; trainq requeue --help)\n", prog);
        free(ids);
        return TQ_CLI_USAGE;
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        char path[96];
        tq_http_resp r;
        snprintf(path, sizeof path, "/v1/jobs/%lld/requeue", ids[i]);
        rc = tq_http_request("POST", path, NULL, &r);
        if (rc) { free(ids); return rc; }
        if (r.status == 200) {
            cJSON *j = cJSON_Parse(r.body);
            double step = tq_js_num(j, "progress.step", 0), total = tq_js_num(j, "progress.total_steps", 0);
            if (step > 0 && total > 0)
                printf("job %lld requeued: it resumes after step %.0f of %.0f\n", ids[i], step, total);
            else if (step > 0)
                printf("job %lld requeued: it resumes after step %.0f\n", ids[i], step);
            else
                printf("job %lld requeued: it starts at step 0\n", ids[i]);
            cJSON_Delete(j);
        } else {
            tq_http_job_error(prog, ids[i], &r);
            failed = 1;
        }
        tq_http_resp_free(&r);
    }
    fflush(stdout);
    free(ids);
    return failed ? TQ_CLI_FAILED : TQ_CLI_OK;
}
