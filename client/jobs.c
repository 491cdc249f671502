/* jobs.c — `trainq ls` (the queue as a table, like squeue) and `trainq show ID` (one job for
 * people, or --json). See client.h. */
#include "client.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- trainq ls ------------------------------------------------------------------------------ */

static const tq_opt ls_opts[] = {
    { "--all", "-a", NULL, "also the finished jobs: the 100 most recent jobs of any state", 0 },
    { "--state", NULL, "S", "only jobs in state S (queued, running, succeeded, failed, cancelled)", 0 },
    { "--owner", NULL, "me|NAME", "only the jobs of NAME (me: yours, as the daemon sees the connection)", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_ls = {
    "ls", NULL,
    "  The daemon's jobs as a table (GET /v1/jobs): ID, OWNER, NAME, STATE, DEVICE, PROGRESS\n"
    "  (step/total and %), SAMPLES/S (the latest step's, or the summary's once finished), MEM (the\n"
    "  latest step's peak, or the summary's), AGE (since submission). A queued job's DEVICE is\n"
    "  (REASON) it waits for, as in squeue: (memory), (max_jobs), (priority:ID) (the device is held\n"
    "  for job ID), (dependency:IDS) (its after), (user_limit), (storage).\n"
    "  By default the running jobs, then the queued ones in the order they will run.\n",
    ls_opts,
    "exit: 0 ok, 1 the daemon refused, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_EQ | TQ_OPTS_CLIENT
};

static void ls_usage(FILE *f) { tq_opts_help(f, &tq_doc_ls); }

static int by_id(const void *a, const void *b) {
    double x = tq_js_num(*(const cJSON *const *)a, "id", 0), y = tq_js_num(*(const cJSON *const *)b, "id", 0);
    return x < y ? -1 : x > y;
}

static int by_queue(const void *a, const void *b) {
    const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
    double px = tq_js_num(x, "queue_position", 1e18), py = tq_js_num(y, "queue_position", 1e18);
    if (px != py) return px < py ? -1 : 1;
    return by_id(a, b);
}

/* %-encodes s into out */
static void urlenc(const char *s, char *out, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    size_t k = 0;
    for (; *s && k + 4 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("-._~", c)) out[k++] = (char)c;
        else { out[k++] = '%'; out[k++] = hex[c >> 4]; out[k++] = hex[c & 15]; }
    }
    out[k] = 0;
}

/* GET /v1/jobs?QUERY into *out ({"jobs":[…]}); an --owner the daemon does not know is named */
static int list(const char *query, const char *owner, cJSON **out) {
    char path[512];
    snprintf(path, sizeof path, "/v1/jobs?%s", query);
    tq_http_resp r;
    int rc = tq_http_request("GET", path, NULL, &r);
    if (rc) return rc;
    if (r.status != 200) {
        char msg[1024], field[64];
        tq_http_errfield(&r, field, sizeof field);
        /* an old daemon refuses the parameter itself ("unknown"); a new one may refuse its value */
        if (owner && r.status == 400 && strstr(tq_http_errmsg(&r, msg, sizeof msg), "unknown") &&
            (!strcmp(field, "owner") || strstr(msg, "owner")))
            fprintf(stderr, "trainq ls: this daemon does not filter by owner (--owner): it answered: %s\n"
                            "  (a newer trainq serve does; without --owner, ls shows everyone's jobs)\n",
                    tq_http_errmsg(&r, msg, sizeof msg));
        else
            fprintf(stderr, "trainq ls: %s\n", tq_http_errmsg(&r, msg, sizeof msg));
        tq_http_resp_free(&r);
        return TQ_CLI_FAILED;
    }
    *out = cJSON_Parse(r.body);
    tq_http_resp_free(&r);
    if (!cJSON_IsArray(tq_js_get(*out, "jobs"))) {
        fprintf(stderr, "trainq ls: the daemon's answer has no job list\n");
        cJSON_Delete(*out);
        *out = NULL;
        return TQ_CLI_FAILED;
    }
    return 0;
}

static void row(tq_table *t, const cJSON *j, double now) {
    char id[24], prog[64], rate[32], mem[32], age[32], name[64];
    snprintf(id, sizeof id, "%.0f", tq_js_num(j, "id", 0));
    const cJSON *own = tq_js_get(j, "owner");
    const char *owner = cJSON_IsString(own) && own->valuestring[0] ? own->valuestring : "-";
    const char *nm = tq_js_str(j, "name", "");
    if (strlen(nm) > 28) snprintf(name, sizeof name, "%.27s~", nm);
    else snprintf(name, sizeof name, "%s", nm[0] ? nm : "-");
    const char *state = tq_js_str(j, "state", "?");
    const char *device = tq_js_str(j, "device", "-");
    char why[48];
    const cJSON *wf = tq_js_get(j, "waiting_for");
    if (!strcmp(state, "queued") && cJSON_IsObject(wf)) {   /* as squeue's NODELIST(REASON) */
        const char *reason = tq_js_str(wf, "reason", "?");
        size_t k = (size_t)snprintf(why, sizeof why, "(%s", reason);
        if (!strcmp(reason, "dependency")) {   /* the jobs of its after not succeeded yet */
            const cJSON *x;
            int first = 1;
            cJSON_ArrayForEach(x, tq_js_get(wf, "after"))
                if (k < sizeof why - 1) {
                    k += (size_t)snprintf(why + k, sizeof why - k, "%s%.0f", first ? ":" : ",", x->valuedouble);
                    first = 0;
                }
        } else if (!strcmp(reason, "priority") && isfinite(tq_js_num(wf, "behind", NAN))) {
            k += (size_t)snprintf(why + k, sizeof why - k, ":%.0f", tq_js_num(wf, "behind", 0));
        }
        if (k >= sizeof why - 1) { k = sizeof why - 3; why[k++] = '~'; }
        snprintf(why + k, sizeof why - k, ")");
        device = why;
    }
    double step = tq_js_num(j, "progress.step", 0), total = tq_js_num(j, "progress.total_steps", NAN);
    if (isfinite(total) && total > 0) snprintf(prog, sizeof prog, "%.0f/%.0f %3.0f%%", step, total, 100 * step / total);
    else snprintf(prog, sizeof prog, "%.0f/?", step);
    const cJSON *sum = tq_js_get(j, "summary");
    double sps = tq_js_num(j, "latest.samples_per_s", NAN), peak = tq_js_num(j, "latest.mem_peak_bytes", -1);
    if (cJSON_IsObject(sum)) {
        sps = tq_js_num(sum, "samples_per_s", sps);
        peak = tq_js_num(sum, "peak_memory_bytes", peak);
    }
    double created = tq_parse_time(tq_js_str(j, "created_at", NULL));
    tq_fmt_rate(sps, rate, sizeof rate);
    tq_fmt_bytes(peak, mem, sizeof mem);
    if (created >= 0) tq_fmt_age(now - created, age, sizeof age); else snprintf(age, sizeof age, "-");
    const char *cells[] = { id, owner, name, state, device, prog, rate, mem, age };
    tq_table_add(t, cells);
}

int tq_cli_ls(int argc, char **argv) {
    int all = 0;
    const char *state = NULL, *owner = NULL;
    int rc0 = tq_opts_check(&tq_doc_ls, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { ls_usage(stdout); return 0; }
        if (!strcmp(a, "--all") || !strcmp(a, "-a")) all = 1;
        else if (!strcmp(a, "--state") || !strcmp(a, "--owner")) {
            if (i + 1 >= argc) { fprintf(stderr, "trainq ls: %s needs a value\n", a); return TQ_CLI_USAGE; }
            if (a[2] == 's') state = argv[++i]; else owner = argv[++i];
        } else if (!strncmp(a, "--state=", 8)) state = a + 8;
        else if (!strncmp(a, "--owner=", 8)) owner = a + 8;
        else { fprintf(stderr, "trainq ls: unexpected argument %s\n", a); ls_usage(stderr); return TQ_CLI_USAGE; }
    }
    if (state && !state[0]) { fprintf(stderr, "trainq ls: --state needs a value\n"); return TQ_CLI_USAGE; }
    if (owner && !owner[0]) { fprintf(stderr, "trainq ls: --owner needs a value (me or a user name)\n"); return TQ_CLI_USAGE; }
    char ownq[256] = "";
    if (owner) {   /* "me" is the daemon's to resolve: it knows who is on the connection */
        char enc[200];
        urlenc(owner, enc, sizeof enc);
        snprintf(ownq, sizeof ownq, "&owner=%s", enc);
    }

    /* the requests: running then queued (default), one state, or the recent 100 */
    const char *states[2];
    int nq = 0;
    if (state) states[nq++] = state;
    else if (!all) { states[nq++] = "running"; states[nq++] = "queued"; }
    else states[nq++] = NULL;
    cJSON *ans[2] = { NULL, NULL };
    for (int q = 0; q < nq; q++) {
        char query[400], enc[64];
        if (states[q]) {
            urlenc(states[q], enc, sizeof enc);
            snprintf(query, sizeof query, "state=%s&limit=%d%s", enc, state || all ? 100 : 1000, ownq);
        } else {
            snprintf(query, sizeof query, "limit=100%s", ownq);
        }
        int rc = list(query, owner, &ans[q]);
        if (rc) { cJSON_Delete(ans[0]); return rc; }
    }

    static const char *const head[] = { "ID", "OWNER", "NAME", "STATE", "DEVICE", "PROGRESS", "SAMPLES/S", "MEM", "AGE" };
    static const int right[] = { 1, 0, 0, 0, 0, 1, 1, 1, 1 };
    tq_table t;
    tq_table_init(&t, 9, head, right);
    double now = tq_now_s();
    for (int q = 0; q < nq; q++) {
        const cJSON *jobs = tq_js_get(ans[q], "jobs");
        int n = cJSON_GetArraySize(jobs), k = 0;
        const cJSON **v = calloc((size_t)n + 1, sizeof *v);
        if (!v) break;
        const cJSON *j;
        cJSON_ArrayForEach(j, jobs) v[k++] = j;
        /* oldest first; the queue in the order it runs */
        int queued = states[q] && !strcmp(states[q], "queued");
        qsort(v, (size_t)k, sizeof *v, queued ? by_queue : by_id);
        for (int i = 0; i < k; i++) row(&t, v[i], now);
        free(v);
    }
    tq_table_print(&t, stdout);
    tq_table_free(&t);
    cJSON_Delete(ans[0]);
    cJSON_Delete(ans[1]);
    return 0;
}

/* ---- trainq show ---------------------------------------------------------------------------- */

static const tq_opt show_opts[] = {
    { "--json", NULL, NULL, "the job object as the daemon sends it (GET /v1/jobs/ID)", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_show = {
    "show", "ID",
    "  One job for people: state, device, batch, progress, memory (planned, peak, reserved),\n"
    "  samples/s, the summary's loss and accuracy, the error, why a queued job waits.\n",
    show_opts,
    "exit: 0 ok, 1 no such job, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_CLIENT
};

static void show_usage(FILE *f) { tq_opts_help(f, &tq_doc_show); }

static void kv(const char *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kv(const char *k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  %-12s ", k);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
}

static const char *num_or(double v, const char *fmt, char *buf, size_t n) {
    if (isfinite(v)) snprintf(buf, n, fmt, v);
    else snprintf(buf, n, "-");
    return buf;
}

int tq_cli_show(int argc, char **argv) {
    int json = 0;
    const char *ids = NULL;
    int rc0 = tq_opts_check(&tq_doc_show, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { show_usage(stdout); return 0; }
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (argv[i][0] == '-' && argv[i][1]) { fprintf(stderr, "trainq show: unknown option %s\n", argv[i]); return TQ_CLI_USAGE; }
        else if (!ids) ids = argv[i];
        else { fprintf(stderr, "trainq show: one job at a time (got %s and %s)\n", ids, argv[i]); return TQ_CLI_USAGE; }
    }
    long long id;
    if (!ids) { fprintf(stderr, "trainq show: which job? (an id)\n"); show_usage(stderr); return TQ_CLI_USAGE; }
    if (tq_cli_parse_id(ids, &id)) { fprintf(stderr, "trainq show: \"%s\" is not a job id\n", ids); return TQ_CLI_USAGE; }
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld", id);
    cJSON *j;
    int rc = tq_cli_get_json_raw("trainq show", NULL, path, json, &j);
    if (rc || json) return rc;

    char a[64], b[64], c[64], d[64];
    double now = tq_now_s();
    const char *state = tq_js_str(j, "state", "?");
    const char *name = tq_js_str(j, "name", "");
    printf("job %lld%s%s\n", id, name[0] ? "  " : "", name);
    kv("state", "%s%s", state, tq_js_get(j, "cancel_requested") && cJSON_IsTrue(tq_js_get(j, "cancel_requested"))
                                   ? " (cancel requested: it stops at the next step)" : "");
    const cJSON *own = tq_js_get(j, "owner");
    if (cJSON_IsString(own) && own->valuestring[0]) kv("owner", "%s", own->valuestring);
    const cJSON *spec = tq_js_get(j, "spec");
    if (cJSON_IsObject(spec)) {
        const char *amp = tq_js_str(spec, "amp", "off");
        kv("spec", "%s on %s, amp %s, %s", tq_js_str(spec, "model", "?"), tq_js_str(spec, "dataset", "?"),
           amp, tq_js_str(spec, "device", "auto"));
    }
    const char *dev = tq_js_str(j, "device", NULL);
    double threads = tq_js_num(j, "threads", NAN);
    if (dev) {
        if (isfinite(threads)) kv("device", "%s (%.0f threads)", dev, threads);
        else kv("device", "%s", dev);
    }
    const cJSON *bt = tq_js_get(j, "batch");
    if (cJSON_IsObject(bt))
        kv("batch", "%.0f x %.0f accumulation = %.0f%s", tq_js_num(bt, "batch_size", 0), tq_js_num(bt, "accum_steps", 1),
           tq_js_num(bt, "effective_batch", 0), cJSON_IsTrue(tq_js_get(bt, "auto")) ? " (batch_size auto)" : "");
    double step = tq_js_num(j, "progress.step", 0), total = tq_js_num(j, "progress.total_steps", NAN);
    if (isfinite(total) && total > 0)
        kv("progress", "step %.0f of %.0f (%.1f%%), epoch %.0f", step, total, 100 * step / total, tq_js_num(j, "progress.epoch", 0));
    else
        kv("progress", "step %.0f, epoch %.0f", step, tq_js_num(j, "progress.epoch", 0));
    double qp = tq_js_num(j, "queue_position", NAN);
    if (isfinite(qp)) kv("queue", "position %.0f (1 runs next)", qp);
    const cJSON *wf = tq_js_get(j, "waiting_for");
    if (cJSON_IsObject(wf)) {
        const char *why = tq_js_str(wf, "reason", "?");
        if (!strcmp(why, "memory"))
            kv("waiting for", "memory on %s: needs %s, %s free", tq_js_str(wf, "device", "any device"),
               tq_fmt_bytes(tq_js_num(wf, "needs_bytes", -1), a, sizeof a), tq_fmt_bytes(tq_js_num(wf, "free_bytes", -1), b, sizeof b));
        else if (!strcmp(why, "priority"))
            kv("waiting for", "job %.0f (its device is held for it)", tq_js_num(wf, "behind", 0));
        else if (!strcmp(why, "storage"))
            kv("waiting for", "storage: %s", tq_js_str(wf, "message", ""));
        else if (!strcmp(why, "device_busy"))
            kv("waiting for", "%s, busy: %s", tq_js_str(wf, "device", "its device"), tq_js_str(wf, "message", ""));
        else if (!strcmp(why, "max_jobs"))
            kv("waiting for", "a free slot on %s (it runs its maximum of jobs)", tq_js_str(wf, "device", "the device"));
        else if (!strcmp(why, "dependency")) {   /* the jobs of its after not succeeded yet */
            char deps[200] = "";
            size_t k = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, tq_js_get(wf, "after"))
                if (k < sizeof deps) k += (size_t)snprintf(deps + k, sizeof deps - k, "%s%.0f", k ? ", " : "", x->valuedouble);
            kv("waiting for", "job%s %s to succeed (after)", strchr(deps, ',') ? "s" : "", deps[0] ? deps : "?");
        }
        else
            kv("waiting for", "%s", why);
    }
    const cJSON *lat = tq_js_get(j, "latest");
    const cJSON *sum = tq_js_get(j, "summary");
    double peak = tq_js_num(lat, "mem_peak_bytes", -1), resv = tq_js_num(lat, "mem_reserved_bytes", -1);
    if (cJSON_IsObject(sum)) peak = tq_js_num(sum, "peak_memory_bytes", peak);
    kv("memory", "planned %s, peak %s, reserved %s", tq_fmt_bytes(tq_js_num(j, "planned_peak_bytes", -1), a, sizeof a),
       tq_fmt_bytes(peak, b, sizeof b), tq_fmt_bytes(resv, c, sizeof c));
    if (cJSON_IsObject(lat))
        kv("latest", "step %.0f: loss %.4f, %s samples/s, %.1f ms/step", tq_js_num(lat, "step", 0),
           tq_js_num(lat, "loss", NAN), tq_fmt_rate(tq_js_num(lat, "samples_per_s", NAN), a, sizeof a), tq_js_num(lat, "step_ms", NAN));
    if (cJSON_IsObject(sum)) {
        kv("summary", "%.0f steps in %s s, %s samples/s", tq_js_num(sum, "steps", 0),
           num_or(tq_js_num(sum, "wall_s", NAN), "%.1f", a, sizeof a), tq_fmt_rate(tq_js_num(sum, "samples_per_s", NAN), b, sizeof b));
        double va = tq_js_num(sum, "val_accuracy", NAN);
        kv("loss", "final %s, validation %s", num_or(tq_js_num(sum, "final_loss", NAN), "%.4f", a, sizeof a),
           num_or(tq_js_num(sum, "val_loss", NAN), "%.4f", b, sizeof b));
        kv("accuracy", "%s", isfinite(va) ? (snprintf(d, sizeof d, "%.2f%%", 100 * va), d) : "-");
    }
    const cJSON *err = tq_js_get(j, "error");
    if (cJSON_IsObject(err)) kv("error", "%s: %s", tq_js_str(err, "code", "?"), tq_js_str(err, "message", ""));
    double cr = tq_parse_time(tq_js_str(j, "created_at", NULL));
    double st = tq_parse_time(tq_js_str(j, "started_at", NULL));
    double fi = tq_parse_time(tq_js_str(j, "finished_at", NULL));
    if (cr >= 0) kv("submitted", "%s (%s ago)", tq_js_str(j, "created_at", ""), tq_fmt_age(now - cr, a, sizeof a));
    if (st >= 0) kv("started", "%s", tq_js_str(j, "started_at", ""));
    if (fi >= 0) kv("finished", "%s (ran %s)", tq_js_str(j, "finished_at", ""), st >= 0 ? tq_fmt_age(fi - st, b, sizeof b) : "-");
    double att = tq_js_num(j, "attempts", NAN), intr = tq_js_num(j, "interruptions", 0);
    if (isfinite(att))
        kv("attempts", "%.0f of %.0f%s", att, tq_js_num(j, "max_attempts", 0),
           intr > 0 ? (snprintf(d, sizeof d, ", interrupted %.0f times", intr), d) : "");
    if (tq_js_get(j, "log")) kv("log", "trainq logs %lld", id);
    cJSON_Delete(j);
    return 0;
}
