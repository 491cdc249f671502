/* submit.c — `trainq submit SPEC.json [--wait] [--name N] [--priority P] [key=value…]`: POST
 * /v1/jobs with the spec (and its overrides), print the id; --wait follows the job's event
 * stream and exits with its outcome (tq_cli_wait_job). See client.h. */
#include "client.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const tq_opt submit_opts[] = {
    { "--wait", NULL, NULL, "follow the job to its end (progress on stderr); exit 0 if it succeeded, else 1", 0 },
    { "--name", NULL, "N", "the job's name (the spec's \"name\")", 0 },
    { "--priority", NULL, "P", "-100..100, higher runs first (the spec's \"priority\")", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_submit = {
    "submit", "SPEC.json [key=value...]",
    "  Submits the job spec SPEC.json (- reads stdin) to the daemon and prints the new job's id\n"
    "  (POST /v1/jobs).\n"
    "  key=value   overrides a spec field; dotted keys reach nested ones (optimizer.lr=0.1,\n"
    "              synthetic.train=512); the value is JSON when it parses as JSON (5, true,\n"
    "              [0.9,0.999], null), else a string (amp=bf16). After \"--\" no argument is an option.\n",
    submit_opts,
    "exit: 0 ok, 1 refused or the job failed, 2 bad usage or an invalid spec, 3 no daemon\n",
    TQ_OPTS_EQ | TQ_OPTS_CLIENT | TQ_OPTS_DASHDASH
};

static void usage(FILE *f) { tq_opts_help(f, &tq_doc_submit); }

static char *read_all(const char *path) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap >= (1u << 24)) { free(buf); buf = NULL; errno = EFBIG; break; }
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; errno = ENOMEM; break; }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (got == 0) break;
        n += got;
    }
    if (buf) buf[n] = 0;
    if (f != stdin) fclose(f);
    return buf;
}

/* sets root.<dotted key> = value (parsed as JSON when it parses); 0 ok */
static int set_override(cJSON *root, const char *kv) {
    const char *eq = strchr(kv, '=');
    size_t klen = (size_t)(eq - kv);
    char key[256];
    if (klen == 0 || klen >= sizeof key) return -1;
    memcpy(key, kv, klen);
    key[klen] = 0;
    const char *val = eq + 1;
    const char *end = NULL;
    cJSON *v = val[0] ? cJSON_ParseWithOpts(val, &end, 1) : NULL;
    if (!v) v = cJSON_CreateString(val);
    if (!v) return -1;
    cJSON *o = root;
    char *seg = key;
    for (;;) {
        char *dot = strchr(seg, '.');
        if (dot) *dot = 0;
        if (!seg[0]) { cJSON_Delete(v); return -1; }
        if (!dot) {
            if (cJSON_GetObjectItemCaseSensitive(o, seg)) cJSON_ReplaceItemInObjectCaseSensitive(o, seg, v);
            else cJSON_AddItemToObject(o, seg, v);
            return 0;
        }
        cJSON *next = cJSON_GetObjectItemCaseSensitive(o, seg);
        if (!cJSON_IsObject(next)) {
            next = cJSON_CreateObject();
            if (cJSON_GetObjectItemCaseSensitive(o, seg)) cJSON_ReplaceItemInObjectCaseSensitive(o, seg, next);
            else cJSON_AddItemToObject(o, seg, next);
        }
        o = next;
        seg = dot + 1;
    }
}

int tq_cli_submit(int argc, char **argv) {
    const char *prog = "trainq submit", *spec_path = NULL, *name = NULL, *prio = NULL;
    int wait = 0;
    const char **over = calloc((size_t)argc + 1, sizeof *over);
    int nover = 0, dashdash = 0;
    if (!over) return TQ_CLI_FAILED;
    int rc0 = tq_opts_check(&tq_doc_submit, argc, argv);
    if (rc0 >= 0) { free(over); return rc0; }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!dashdash && (!strcmp(a, "--help") || !strcmp(a, "-h"))) { usage(stdout); free(over); return 0; }
        if (!dashdash && !strcmp(a, "--")) { dashdash = 1; continue; }
        if (!dashdash && !strcmp(a, "--wait")) wait = 1;
        else if (!dashdash && (!strcmp(a, "--name") || !strcmp(a, "--priority"))) {
            if (i + 1 >= argc) { fprintf(stderr, "%s: %s needs a value\n", prog, a); free(over); return TQ_CLI_USAGE; }
            if (a[2] == 'n') name = argv[++i]; else prio = argv[++i];
        } else if (!dashdash && !strncmp(a, "--name=", 7)) name = a + 7;
        else if (!dashdash && !strncmp(a, "--priority=", 11)) prio = a + 11;
        else if (!dashdash && a[0] == '-' && a[1]) {
            fprintf(stderr, "%s: unknown option %s\n", prog, a);
            usage(stderr);
            free(over);
            return TQ_CLI_USAGE;
        } else if (!spec_path && (!strchr(a, '=') || access(a, F_OK) == 0)) spec_path = a;
        else if (strchr(a, '=')) over[nover++] = a;
        else { fprintf(stderr, "%s: unexpected argument %s (overrides are key=value)\n", prog, a); free(over); return TQ_CLI_USAGE; }
    }
    if (!spec_path) { fprintf(stderr, "%s: which spec? (a JSON file, or - for stdin)\n", prog); usage(stderr); free(over); return TQ_CLI_USAGE; }

    char *text = read_all(spec_path);
    if (!text) {
        fprintf(stderr, "%s: cannot read the spec %s: %s\n", prog, spec_path, strerror(errno));
        free(over);
        return TQ_CLI_USAGE;
    }
    const char *end = NULL;
    cJSON *spec = cJSON_ParseWithOpts(text, &end, 1);
    if (!cJSON_IsObject(spec)) {
        size_t at = spec ? 0 : (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0);
        if (spec) fprintf(stderr, "%s: the spec %s is not a JSON object\n", prog, spec_path);
        else fprintf(stderr, "%s: the spec %s is not valid JSON (near byte %zu)\n", prog, spec_path, at);
        cJSON_Delete(spec);
        free(text);
        free(over);
        return TQ_CLI_USAGE;
    }
    free(text);
    for (int i = 0; i < nover; i++) {
        if (set_override(spec, over[i])) {
            fprintf(stderr, "%s: bad override \"%s\": use key=value or a.b=value\n", prog, over[i]);
            cJSON_Delete(spec);
            free(over);
            return TQ_CLI_USAGE;
        }
    }
    free(over);
    if (name) {
        cJSON_DeleteItemFromObjectCaseSensitive(spec, "name");
        cJSON_AddStringToObject(spec, "name", name);
    }
    if (prio) {
        char *pe = NULL;
        errno = 0;
        long p = strtol(prio, &pe, 10);
        if (!prio[0] || errno || *pe) {
            fprintf(stderr, "%s: --priority must be an integer (-100..100), got \"%s\"\n", prog, prio);
            cJSON_Delete(spec);
            return TQ_CLI_USAGE;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(spec, "priority");
        cJSON_AddNumberToObject(spec, "priority", (double)p);
    }
    char *body = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    if (!body) return TQ_CLI_FAILED;

    tq_http_resp r;
    int rc = tq_http_request("POST", "/v1/jobs", body, &r);
    cJSON_free(body);
    if (rc) return rc;
    if (r.status != 200 && r.status != 201) {
        char msg[1024], code[64];
        tq_http_errcode(&r, code, sizeof code);
        int bad_spec = r.status == 400 && (!strcmp(code, "invalid_spec") || !strcmp(code, "invalid_json"));
        fprintf(stderr, "%s: the daemon refused the job: %s%s%s\n", prog, code[0] ? code : "",
                code[0] ? ": " : "", tq_http_errmsg(&r, msg, sizeof msg));
        tq_http_resp_free(&r);
        return bad_spec ? TQ_CLI_USAGE : TQ_CLI_FAILED;
    }
    cJSON *job = cJSON_Parse(r.body);
    long status = r.status;
    tq_http_resp_free(&r);
    double idd = tq_js_num(job, "id", -1);
    if (idd <= 0) {
        fprintf(stderr, "%s: the daemon's answer has no job id\n", prog);
        cJSON_Delete(job);
        return TQ_CLI_FAILED;
    }
    long long id = (long long)idd;
    if (status == 200)   /* a repeated submission_id: the job it made first */
        fprintf(stderr, "%s: submission_id \"%s\" was submitted before: job %lld (%s)\n", prog,
                tq_js_str(job, "submission_id", ""), id, tq_js_str(job, "state", "?"));
    cJSON_Delete(job);
    printf("%lld\n", id);
    fflush(stdout);
    return wait ? tq_cli_wait_job(prog, id) : 0;
}

/* ---- --wait: follow the event stream -------------------------------------------------------- */

typedef struct {
    const char *prog;
    long long id;
    int tty;
    double total;                /* progress.total_steps, NAN unknown */
    double t0, last_print;       /* monotonic ms */
    long long last_step;
    int evals_seen, evals_skip;  /* a reconnect replays evals and state events: skip those seen */
    int states_seen, states_skip;
    int bar;                     /* a bar is on the terminal's last line */
    char eval[96];               /* the last evaluation, shown with the progress */
    cJSON *final;                /* the "job" event: the job as it ended */
    int deleted;
} wait_ctx;

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void clear_bar(wait_ctx *w) {
    if (w->bar) { fputs("\r\033[K", stderr); w->bar = 0; }
}

static void on_step(wait_ctx *w, const cJSON *s) {
    long long step = (long long)tq_js_num(s, "step", 0);
    if (step <= w->last_step) return;
    w->last_step = step;
    double now = mono_ms();
    int last = isfinite(w->total) && step >= (long long)w->total;
    if (!last && now - w->last_print < (w->tty ? 100 : 5000)) return;
    w->last_print = now;
    double loss = tq_js_num(s, "loss", NAN), sps = tq_js_num(s, "samples_per_s", NAN);
    char tot[32] = "?", rate[32];
    if (isfinite(w->total)) snprintf(tot, sizeof tot, "%.0f", w->total);
    tq_fmt_rate(sps, rate, sizeof rate);
    if (w->tty) {
        double frac = isfinite(w->total) && w->total > 0 ? step / w->total : 0;
        if (frac > 1) frac = 1;
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        double el = (now - w->t0) / 1000.0;
        char eta[32] = "";
        if (frac > 0 && frac < 1) { char a[16]; snprintf(eta, sizeof eta, "  ETA %s", tq_fmt_age(el * (1 - frac) / frac, a, sizeof a)); }
        fprintf(stderr, "\r\033[Kjob %lld [%s] %lld/%s %3.0f%%  loss %.4f  %s samples/s%s%s%s", w->id, bar, step, tot,
                100 * frac, loss, rate, w->eval[0] ? "  " : "", w->eval, eta);
        w->bar = 1;
    } else {
        fprintf(stderr, "job %lld: step %lld/%s epoch %.0f loss %.4f %s samples/s%s%s\n", w->id, step, tot,
                tq_js_num(s, "epoch", 0), loss, rate, w->eval[0] ? ", " : "", w->eval);
    }
    fflush(stderr);
}

static int on_event(void *ctx, const char *type, const char *id, const char *data) {
    (void)id;
    wait_ctx *w = ctx;
    cJSON *d = cJSON_Parse(data);
    int stop = 0;
    if (!strcmp(type, "step")) {
        on_step(w, d);
    } else if (!strcmp(type, "eval")) {
        /* the periodic evaluations ride along with the progress; the post-training ones
         * (pruned, int8) get a line of their own */
        const char *kind = tq_js_str(d, "kind", "eval");
        if (!strcmp(kind, "eval"))
            snprintf(w->eval, sizeof w->eval, "val acc %.2f%% at step %.0f", 100 * tq_js_num(d, "accuracy", NAN),
                     tq_js_num(d, "step", 0));
        else if (++w->evals_seen > w->evals_skip) {
            clear_bar(w);
            fprintf(stderr, "job %lld: %s model: loss %.4f, accuracy %.2f%% (%.0f samples)\n", w->id, kind,
                    tq_js_num(d, "loss", NAN), 100 * tq_js_num(d, "accuracy", NAN), tq_js_num(d, "samples", 0));
        }
    } else if (!strcmp(type, "state")) {
        const char *st = tq_js_str(d, "state", "?");
        if (!strcmp(st, "deleted")) w->deleted = 1;
        if (++w->states_seen > w->states_skip) {
            /* one poll sends its steps before its state events: "running" after steps is old news */
            if (!strcmp(st, "queued") && w->last_step > 0) {
                clear_bar(w);
                fprintf(stderr, "job %lld: back in the queue (it resumes from its last checkpoint)\n", w->id);
            } else if ((!strcmp(st, "queued") || !strcmp(st, "running")) && w->last_step == 0) {
                clear_bar(w);
                fprintf(stderr, "job %lld: %s\n", w->id, st);
            }
        }
        if (w->deleted) stop = 1;
    } else if (!strcmp(type, "job")) {   /* the last event: the job as it ended */
        cJSON_Delete(w->final);
        w->final = d;
        d = NULL;
        stop = 1;
    }
    cJSON_Delete(d);
    fflush(stderr);
    return stop;
}

static int is_final(const char *s) {
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
}

/* the outcome, from the job object as it ended */
static int outcome(wait_ctx *w, const cJSON *job) {
    clear_bar(w);
    const char *st = tq_js_str(job, "state", "?");
    if (!strcmp(st, "succeeded")) {
        const cJSON *s = tq_js_get(job, "summary");
        char rate[32], mem[32], acc[48] = "";
        double va = tq_js_num(s, "val_accuracy", NAN);
        if (isfinite(va)) snprintf(acc, sizeof acc, ", val accuracy %.2f%%", 100 * va);
        fprintf(stderr, "job %lld succeeded: %.0f steps in %.1f s, %s samples/s, final loss %.4f%s, peak memory %s\n",
                w->id, tq_js_num(s, "steps", tq_js_num(job, "progress.step", 0)), tq_js_num(s, "wall_s", NAN),
                tq_fmt_rate(tq_js_num(s, "samples_per_s", NAN), rate, sizeof rate), tq_js_num(s, "final_loss", NAN),
                acc, tq_fmt_bytes(tq_js_num(s, "peak_memory_bytes", -1), mem, sizeof mem));
        return 0;
    }
    if (!strcmp(st, "failed")) {
        fprintf(stderr, "%s: job %lld failed: %s: %s (its log: trainq logs %lld)\n", w->prog, w->id,
                tq_js_str(job, "error.code", "unknown"), tq_js_str(job, "error.message", ""), w->id);
        return TQ_CLI_FAILED;
    }
    if (!strcmp(st, "cancelled")) {
        fprintf(stderr, "%s: job %lld was cancelled\n", w->prog, w->id);
        return TQ_CLI_FAILED;
    }
    fprintf(stderr, "%s: job %lld ended as %s\n", w->prog, w->id, st);
    return TQ_CLI_FAILED;
}

int tq_cli_wait_job(const char *prog, long long id) {
    wait_ctx w = { .prog = prog, .id = id, .tty = isatty(2), .total = NAN, .t0 = mono_ms() };
    double lost_since = -1;
    for (;;) {
        /* the job as it is now: its total steps, or its end when it has ended */
        cJSON *job = NULL;
        char path[96];
        snprintf(path, sizeof path, "/v1/jobs/%lld", id);
        tq_http_resp r;
        if (lost_since >= 0 && mono_ms() - lost_since >= 120000) tq_http_set_quiet(0);
        int rc = tq_http_request("GET", path, NULL, &r);
        if (rc == TQ_CLI_UNREACHABLE && lost_since >= 0 && mono_ms() - lost_since < 120000) {
            sleep(1);   /* the daemon restarts: its jobs come back from the queue */
            continue;
        }
        tq_http_set_quiet(0);
        if (rc) { clear_bar(&w); return rc; }
        if (r.status == 404) {
            clear_bar(&w);
            fprintf(stderr, "%s: job %lld no longer exists (deleted)\n", prog, id);
            tq_http_resp_free(&r);
            return TQ_CLI_FAILED;
        }
        if (r.status != 200) {
            char msg[1024];
            clear_bar(&w);
            fprintf(stderr, "%s: job %lld: %s\n", prog, id, tq_http_errmsg(&r, msg, sizeof msg));
            tq_http_resp_free(&r);
            return TQ_CLI_FAILED;
        }
        job = cJSON_Parse(r.body);
        tq_http_resp_free(&r);
        if (lost_since >= 0) { clear_bar(&w); fprintf(stderr, "job %lld: the daemon is back\n", id); lost_since = -1; }
        w.total = tq_js_num(job, "progress.total_steps", NAN);
        if (is_final(tq_js_str(job, "state", ""))) {
            /* show what the stream would have: from the last step seen */
            cJSON_Delete(w.final);
            w.final = job;
            break;
        }
        cJSON_Delete(job);

        snprintf(path, sizeof path, "/v1/jobs/%lld/events?after=%lld", id, w.last_step);
        w.evals_skip = w.evals_seen; w.evals_seen = 0;
        w.states_skip = w.states_seen; w.states_seen = 0;
        int dropped = 0;
        rc = tq_sse_stream(path, on_event, &w, &r, &dropped);
        if (rc == TQ_CLI_UNREACHABLE) { clear_bar(&w); return rc; }
        if (rc) { clear_bar(&w); return rc; }
        if (w.evals_seen < w.evals_skip) w.evals_seen = w.evals_skip;
        if (w.states_seen < w.states_skip) w.states_seen = w.states_skip;
        if (r.status) {
            char msg[1024];
            clear_bar(&w);
            if (r.status == 404) fprintf(stderr, "%s: job %lld no longer exists (deleted)\n", prog, id);
            else fprintf(stderr, "%s: job %lld: events: %s\n", prog, id, tq_http_errmsg(&r, msg, sizeof msg));
            tq_http_resp_free(&r);
            return TQ_CLI_FAILED;
        }
        if (w.deleted) {
            clear_bar(&w);
            fprintf(stderr, "%s: job %lld was deleted\n", prog, id);
            return TQ_CLI_FAILED;
        }
        if (w.final) break;
        /* the stream ended before the job did: the daemon stopped, or the connection broke */
        clear_bar(&w);
        fprintf(stderr, "job %lld: lost the daemon's event stream%s; reconnecting\n", id, dropped ? "" : " (the daemon stops?)");
        lost_since = mono_ms();
        tq_http_set_quiet(1);   /* until it answers again or the 2 minutes are up */
        sleep(1);
    }
    int ret = outcome(&w, w.final);
    cJSON_Delete(w.final);
    return ret;
}
