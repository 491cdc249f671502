/* compare.c — `trainq compare ID…`: GET /v1/compare as a table (docs/api.md, "GET /v1/compare"):
 * each job's throughput, memory, loss and accuracy, with ratios to the baseline job. See
 * client.h. */
#include "client.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const tq_opt compare_opts[] = {
    { "--baseline", NULL, "ID", "the job the others are measured against (one of the ids; default the first)", 0 },
    { "--json", NULL, NULL, "the daemon's answer as it is (GET /v1/compare?ids=...)", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_compare = {
    "compare", "ID...",
    "  Jobs side by side (ids as separate arguments or comma-separated): model, amp, batch x\n"
    "  accumulation, steps, median samples/s and peak memory with their ratio to the baseline\n"
    "  job, final loss, validation accuracy and its difference in percentage points, wall time.\n"
    "  A running job is compared as far as it has got.\n",
    compare_opts,
    "exit: 0 ok, 1 an unknown job or a refused request, 2 bad usage, 3 no daemon\n",
    TQ_OPTS_EQ | TQ_OPTS_CLIENT
};

static void usage(FILE *f) { tq_opts_help(f, &tq_doc_compare); }

static const char *num(double v, const char *fmt, char *buf, size_t n) {
    if (isfinite(v)) snprintf(buf, n, fmt, v); else snprintf(buf, n, "-");
    return buf;
}

int tq_cli_compare(int argc, char **argv) {
    const char *prog = "trainq compare";
    int json = 0;
    long long baseline = 0;
    char ids[1100] = "";
    size_t il = 0;
    int nids = 0;
    int rc0 = tq_opts_check(&tq_doc_compare, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--baseline") || !strncmp(a, "--baseline=", 11)) {
            const char *v = a[10] == '=' ? a + 11 : i + 1 < argc ? argv[++i] : NULL;
            if (!v || tq_cli_parse_id(v, &baseline)) {
                fprintf(stderr, "%s: --baseline needs a job id\n", prog);
                return TQ_CLI_USAGE;
            }
            continue;
        }
        if (a[0] == '-' && a[1]) { fprintf(stderr, "%s: unknown option %s\n", prog, a); usage(stderr); return TQ_CLI_USAGE; }
        char *copy = strdup(a), *save = NULL;
        if (!copy) return TQ_CLI_FAILED;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            long long id;
            if (tq_cli_parse_id(t, &id)) {
                fprintf(stderr, "%s: \"%s\" is not a job id\n", prog, t);
                free(copy);
                return TQ_CLI_USAGE;
            }
            int w = snprintf(ids + il, sizeof ids - il, "%s%lld", nids ? "," : "", id);
            if (w < 0 || (size_t)w >= sizeof ids - il) { fprintf(stderr, "%s: too many ids (at most 64)\n", prog); free(copy); return TQ_CLI_USAGE; }
            il += (size_t)w;
            nids++;
        }
        free(copy);
    }
    if (nids == 0) { fprintf(stderr, "%s: which jobs? (one or more ids)\n", prog); usage(stderr); return TQ_CLI_USAGE; }
    char path[1200];
    if (baseline) snprintf(path, sizeof path, "/v1/compare?ids=%s&baseline=%lld", ids, baseline);
    else snprintf(path, sizeof path, "/v1/compare?ids=%s", ids);
    cJSON *o;
    int rc = tq_cli_get_json_raw(prog, NULL, path, json, &o);
    if (rc || json) return rc;

    static const char *const head[] = { "ID", "NAME", "STATE", "MODEL", "AMP", "BATCH", "STEPS", "SAMPLES/S",
                                        "VS", "PEAK MEM", "VS", "FINAL LOSS", "VAL ACC", "VS", "WALL" };
    static const int right[] = { 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    tq_table t;
    tq_table_init(&t, 15, head, right);
    const cJSON *j;
    double base = tq_js_num(o, "baseline", 0);
    cJSON_ArrayForEach(j, tq_js_get(o, "jobs")) {
        char id[24], batch[64], steps[32], sps[32], vsps[32], peak[32], vpeak[32], loss[32], acc[32], vacc[32], wall[32];
        double jid = tq_js_num(j, "id", 0);
        snprintf(id, sizeof id, "%.0f%s", jid, jid == base ? "*" : "");
        double bs = tq_js_num(j, "batch_size", NAN), ac = tq_js_num(j, "accum_steps", NAN);
        if (isfinite(bs) && isfinite(ac) && ac > 1) snprintf(batch, sizeof batch, "%.0fx%.0f", bs, ac);
        else num(bs, "%.0f", batch, sizeof batch);
        double skipped = tq_js_num(j, "skipped_steps", 0);
        if (skipped > 0) snprintf(steps, sizeof steps, "%.0f (%.0f skipped)", tq_js_num(j, "steps", 0), skipped);
        else snprintf(steps, sizeof steps, "%.0f", tq_js_num(j, "steps", 0));
        tq_fmt_rate(tq_js_num(j, "samples_per_s", NAN), sps, sizeof sps);
        num(tq_js_num(j, "vs_baseline.samples_per_s", NAN), "%.2fx", vsps, sizeof vsps);
        tq_fmt_bytes(tq_js_num(j, "peak_memory_bytes", -1), peak, sizeof peak);
        num(tq_js_num(j, "vs_baseline.peak_memory_bytes", NAN), "%.2fx", vpeak, sizeof vpeak);
        num(tq_js_num(j, "final_loss", NAN), "%.4f", loss, sizeof loss);
        num(100 * tq_js_num(j, "val_accuracy", NAN), "%.2f%%", acc, sizeof acc);
        num(tq_js_num(j, "vs_baseline.val_accuracy_points", NAN), "%+.2f pt", vacc, sizeof vacc);
        num(tq_js_num(j, "wall_s", NAN), "%.1fs", wall, sizeof wall);
        const char *nm = tq_js_str(j, "name", "");
        const char *cells[] = { id, nm[0] ? nm : "-", tq_js_str(j, "state", "?"), tq_js_str(j, "model", "?"),
                                tq_js_str(j, "amp", "?"), batch, steps, sps, vsps, peak, vpeak, loss, acc, vacc, wall };
        tq_table_add(&t, cells);
    }
    tq_table_print(&t, stdout);
    printf("* baseline (job %.0f); samples/s is the median after the first 5 steps\n", base);
    tq_table_free(&t);
    cJSON_Delete(o);
    return 0;
}
