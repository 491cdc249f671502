/* follow.c — what a job writes as it runs: `trainq logs [-f] ID` (its worker's output, GET
 * /v1/jobs/{id}/log) and `trainq steps ID [--csv] [-f]` (its step records; -f follows the event
 * stream). See client.h. */
#include "client.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- trainq logs ---------------------------------------------------------------------------- */

static const tq_opt logs_opts[] = {
    { "--follow", "-f", NULL, "keep printing what it writes until the job ends", 0 },
    { "--previous", NULL, NULL, "the part before the log's last rotation (it is kept under 1 MiB)", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_logs = {
    "logs", "ID",
    "  The job's own log (GET /v1/jobs/ID/log): what its worker wrote (progress, warnings, the\n"
    "  error it ended with).\n",
    logs_opts,
    "exit: 0 ok, 1 no such job or no log yet, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_CLIENT
};

static void logs_usage(FILE *f) { tq_opts_help(f, &tq_doc_logs); }

static int to_stdout(void *ctx, const char *d, size_t n) {
    (void)ctx;
    if (fwrite(d, 1, n, stdout) != n) return 1;   /* a closed pipe (| head): stop */
    fflush(stdout);
    return 0;
}

/* one id argument plus flags; returns 0 and sets *id, else an exit code */
static int one_id(const char *prog, const char *arg, const char **seen, long long *id) {
    if (*seen) { fprintf(stderr, "%s: one job at a time (got %s and %s)\n", prog, *seen, arg); return TQ_CLI_USAGE; }
    *seen = arg;
    if (tq_cli_parse_id(arg, id)) { fprintf(stderr, "%s: \"%s\" is not a job id\n", prog, arg); return TQ_CLI_USAGE; }
    return 0;
}

int tq_cli_logs(int argc, char **argv) {
    int follow = 0, previous = 0;
    const char *seen = NULL;
    long long id = 0;
    int rc0 = tq_opts_check(&tq_doc_logs, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { logs_usage(stdout); return 0; }
        if (!strcmp(a, "-f") || !strcmp(a, "--follow")) follow = 1;
        else if (!strcmp(a, "--previous")) previous = 1;
        else if (a[0] == '-' && a[1]) { fprintf(stderr, "trainq logs: unknown option %s\n", a); logs_usage(stderr); return TQ_CLI_USAGE; }
        else { int rc = one_id("trainq logs", a, &seen, &id); if (rc) return rc; }
    }
    if (!seen) { fprintf(stderr, "trainq logs: which job? (an id)\n"); logs_usage(stderr); return TQ_CLI_USAGE; }
    if (follow && previous) { fprintf(stderr, "trainq logs: --previous is finished text: it cannot be followed\n"); return TQ_CLI_USAGE; }
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%lld/log%s", id, follow ? "?follow=1" : previous ? "?previous=1" : "");
    tq_http_resp err;
    int dropped = 0;
    int rc = tq_http_stream(path, to_stdout, NULL, 0, &err, &dropped);
    if (rc) return rc;
    if (err.status) {
        char msg[1024];
        tq_http_errmsg(&err, msg, sizeof msg);
        if (err.status == 404 && strstr(msg, "no endpoint"))
            fprintf(stderr, "trainq logs: this daemon keeps no job logs (it answered: %s); a newer trainq serve does\n", msg);
        else
            fprintf(stderr, "trainq logs: %s\n", msg);
        tq_http_resp_free(&err);
        return TQ_CLI_FAILED;
    }
    if (dropped) {
        fprintf(stderr, "trainq logs: the connection to %s broke off\n", tq_http_server());
        return TQ_CLI_FAILED;
    }
    return 0;
}

/* ---- trainq steps --------------------------------------------------------------------------- */

static const tq_opt steps_opts[] = {
    { "--csv", NULL, NULL, "CSV with the API's column names and numbers (GET /v1/jobs/ID/steps?format=csv)", 0 },
    { "--follow", "-f", NULL, "keep printing new steps until the job ends (the event stream)", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_steps = {
    "steps", "ID",
    "  The job's step records as a table (GET /v1/jobs/ID/steps): step, epoch, loss, learning\n"
    "  rate, fp16 loss scale, skipped (an fp16 overflow), step time, samples/s, peak and reserved\n"
    "  memory, and on a GPU the device's used memory.\n",
    steps_opts,
    "exit: 0 ok, 1 no such job, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_CLIENT
};

static void steps_usage(FILE *f) { tq_opts_help(f, &tq_doc_steps); }

static const char *const CSV_COLS[] = { "step", "epoch", "loss", "lr", "loss_scale", "skipped", "step_ms",
                                         "samples_per_s", "mem_allocated_bytes", "mem_peak_bytes",
                                         "mem_reserved_bytes", "device_used_bytes", "time" };
#define NCSV (int)(sizeof CSV_COLS / sizeof CSV_COLS[0])

static void csv_header(void) {
    for (int i = 0; i < NCSV; i++) printf("%s%s", i ? "," : "", CSV_COLS[i]);
    putchar('\n');
}

/* a step record as the API's CSV row: null empty, skipped 0/1, numbers as JSON prints them */
static void csv_row(const cJSON *s) {
    for (int i = 0; i < NCSV; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, CSV_COLS[i]);
        if (i) putchar(',');
        if (cJSON_IsBool(v)) putchar(cJSON_IsTrue(v) ? '1' : '0');
        else if (cJSON_IsNumber(v)) {
            char *t = cJSON_PrintUnformatted(v);
            if (t) fputs(t, stdout);
            cJSON_free(t);
        }
    }
    putchar('\n');
}

#define TABLE_FMT "%8s %6s %10s %10s %9s %4s %9s %10s %10s %10s %10s\n"

static void table_header(void) {
    printf(TABLE_FMT, "STEP", "EPOCH", "LOSS", "LR", "SCALE", "SKIP", "STEP_MS", "SAMPLES/S", "MEM_PEAK",
           "RESERVED", "DEV_USED");
}

static void table_row(const cJSON *s) {
    char st[24], ep[16], loss[32], lr[32], scale[32], ms[32], sps[32], pk[32], rs[32], du[32];
    snprintf(st, sizeof st, "%.0f", tq_js_num(s, "step", 0));
    snprintf(ep, sizeof ep, "%.0f", tq_js_num(s, "epoch", 0));
    double l = tq_js_num(s, "loss", NAN), sc = tq_js_num(s, "loss_scale", NAN), m = tq_js_num(s, "step_ms", NAN);
    if (isfinite(l)) snprintf(loss, sizeof loss, "%.4f", l); else snprintf(loss, sizeof loss, "%s", isnan(l) ? "-" : "inf");
    snprintf(lr, sizeof lr, "%.4g", tq_js_num(s, "lr", NAN));
    if (isfinite(sc)) snprintf(scale, sizeof scale, "%.0f", sc); else snprintf(scale, sizeof scale, "-");
    if (isfinite(m)) snprintf(ms, sizeof ms, "%.2f", m); else snprintf(ms, sizeof ms, "-");
    tq_fmt_rate(tq_js_num(s, "samples_per_s", NAN), sps, sizeof sps);
    tq_fmt_bytes(tq_js_num(s, "mem_peak_bytes", -1), pk, sizeof pk);
    tq_fmt_bytes(tq_js_num(s, "mem_reserved_bytes", -1), rs, sizeof rs);
    tq_fmt_bytes(tq_js_num(s, "device_used_bytes", -1), du, sizeof du);
    printf(TABLE_FMT, st, ep, loss, lr, scale, cJSON_IsTrue(tq_js_get(s, "skipped")) ? "yes" : "-", ms, sps, pk, rs, du);
}

/* CSV without -f: the API's own text, a page (100000 rows) at a time, the header once */
static int steps_csv(long long id) {
    long long after = 0;
    for (int page = 0;; page++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%lld/steps?format=csv&limit=100000&after=%lld", id, after);
        tq_http_resp r;
        int rc = tq_http_request("GET", path, NULL, &r);
        if (rc) return rc;
        if (r.status != 200) {
            char msg[1024];
            fprintf(stderr, "trainq steps: %s\n", tq_http_errmsg(&r, msg, sizeof msg));
            tq_http_resp_free(&r);
            return TQ_CLI_FAILED;
        }
        const char *body = r.body;
        if (page > 0) {   /* the header again: skip it */
            const char *nl = memchr(body, '\n', r.len);
            body = nl ? nl + 1 : body + r.len;
        }
        size_t len = r.len - (size_t)(body - r.body);
        fwrite(body, 1, len, stdout);
        long rows = 0;
        const char *last = NULL;
        for (const char *p = r.body; p < r.body + r.len; p++)
            if (*p == '\n') { rows++; if (p + 1 < r.body + r.len) last = p + 1; }
        long long last_step = last ? atoll(last) : 0;
        tq_http_resp_free(&r);
        if (rows - 1 < 100000 || last_step <= after) break;
        after = last_step;
    }
    fflush(stdout);
    return 0;
}

static int steps_table(long long id) {
    long long after = 0;
    table_header();
    for (;;) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%lld/steps?limit=10000&after=%lld", id, after);
        cJSON *o;
        int rc = tq_cli_get_json("trainq steps", "steps", path, &o);
        if (rc) return rc;
        const cJSON *steps = tq_js_get(o, "steps"), *s;
        int n = 0;
        cJSON_ArrayForEach(s, steps) {
            table_row(s);
            after = (long long)tq_js_num(s, "step", (double)after);
            n++;
        }
        cJSON_Delete(o);
        if (n < 10000) break;
    }
    fflush(stdout);
    return 0;
}

typedef struct {
    int csv;
    long long last_step;
    int ended;            /* the "job" event came: the job has finished */
    int deleted;
    char state[32];
} follow_ctx;

static int on_follow(void *ctx, const char *type, const char *id, const char *data) {
    (void)id;
    follow_ctx *f = ctx;
    if (!strcmp(type, "step")) {
        cJSON *s = cJSON_Parse(data);
        long long step = (long long)tq_js_num(s, "step", 0);
        if (step > f->last_step) {
            f->last_step = step;
            if (f->csv) csv_row(s); else table_row(s);
            fflush(stdout);
        }
        cJSON_Delete(s);
    } else if (!strcmp(type, "state")) {
        cJSON *s = cJSON_Parse(data);
        if (!strcmp(tq_js_str(s, "state", ""), "deleted")) f->deleted = 1;
        cJSON_Delete(s);
        if (f->deleted) return 1;
    } else if (!strcmp(type, "job")) {
        cJSON *j = cJSON_Parse(data);
        snprintf(f->state, sizeof f->state, "%s", tq_js_str(j, "state", "?"));
        cJSON_Delete(j);
        f->ended = 1;
        return 1;
    }
    return 0;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int steps_follow(long long id, int csv) {
    follow_ctx f = { .csv = csv };
    if (csv) csv_header(); else table_header();
    fflush(stdout);
    double lost = -1;
    for (;;) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%lld/events?after=%lld", id, f.last_step);
        tq_http_resp err;
        int dropped = 0;
        if (lost >= 0) tq_http_set_quiet(mono_s() - lost < 120);
        int rc = tq_sse_stream(path, on_follow, &f, &err, &dropped);
        if (rc == TQ_CLI_UNREACHABLE && lost >= 0 && mono_s() - lost < 120) { sleep(1); continue; }
        tq_http_set_quiet(0);
        if (rc) return rc;
        if (err.status) {
            char msg[1024];
            fprintf(stderr, "trainq steps: %s\n", tq_http_errmsg(&err, msg, sizeof msg));
            tq_http_resp_free(&err);
            return TQ_CLI_FAILED;
        }
        if (f.deleted) { fprintf(stderr, "trainq steps: job %lld was deleted\n", id); return TQ_CLI_FAILED; }
        if (f.ended) { fprintf(stderr, "job %lld %s\n", id, f.state); return 0; }
        /* the stream ended before the job: the daemon stops or the connection broke */
        if (lost < 0) { fprintf(stderr, "trainq steps: lost the daemon's event stream; reconnecting\n"); lost = mono_s(); }
        sleep(1);
    }
}

int tq_cli_steps(int argc, char **argv) {
    int csv = 0, follow = 0;
    const char *seen = NULL;
    long long id = 0;
    int rc0 = tq_opts_check(&tq_doc_steps, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { steps_usage(stdout); return 0; }
        if (!strcmp(a, "--csv")) csv = 1;
        else if (!strcmp(a, "-f") || !strcmp(a, "--follow")) follow = 1;
        else if (a[0] == '-' && a[1]) { fprintf(stderr, "trainq steps: unknown option %s\n", a); steps_usage(stderr); return TQ_CLI_USAGE; }
        else { int rc = one_id("trainq steps", a, &seen, &id); if (rc) return rc; }
    }
    if (!seen) { fprintf(stderr, "trainq steps: which job? (an id)\n"); steps_usage(stderr); return TQ_CLI_USAGE; }
    if (follow) return steps_follow(id, csv);
    return csv ? steps_csv(id) : steps_table(id);
}
