/* main.c — the trainq command line: run, plan, devices, version, serve, worker (CONTRACT.md). */
#include "trainer.h"
#include "autobatch.h"
#include "report.h"
#include "spec.h"
#include "device.h"
#include "../schema/store.h"
#include "util.h"
#include "daemon.h"
#include "client/client.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TQ_VERSION "0.1.0"

/* each command's options (client/opts.h): its --help and its line here come from the table */
static const tq_opt run_opts[] = {
    { "--db", NULL, "PATH", "record the job, its steps and evals in this SQLite database (created if missing)", 0 },
    { "--out", NULL, "DIR", "write model.safetensors and checkpoint.safetensors there", 0 },
    { "--resume", NULL, NULL, "go on from DIR's checkpoint (needs --out DIR)", 0 },
    { "--quiet", NULL, NULL, "no progress on stderr", 0 },
    { "--profile", NULL, "FILE", "time every op of the steps after the first few (a sync around each, no CUDA graph): "
                                 "a table on stderr, the whole profile as JSON in FILE", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
static const tq_cmd_doc run_doc = {
    "run", "SPEC.json",
    "  Trains SPEC.json (- reads stdin) here, in this process, without a daemon: progress on\n"
    "  stderr, the summary as one JSON line on stdout.\n",
    run_opts,
    "exit: 0 succeeded, 1 the job failed (error.code on stderr and in the summary), 2 bad usage or an\n"
    "invalid spec (naming the field)\n",
    0
};
static const tq_opt plan_opts[] = {
    { "--memory-mb", NULL, "MB", "the memory cap in MiB: \"batch_size\": \"auto\" picks against it, any other spec adds "
                                 "\"fits\"", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
static const tq_cmd_doc plan_doc = {
    "plan", "SPEC.json",
    "  Prints the memory plan of SPEC.json as JSON: bytes by category, total_bytes (training),\n"
    "  data_bytes (the dataset), planned_peak_bytes (their sum), batch_size x accum_steps =\n"
    "  effective_batch.\n"
    "  With \"batch_size\": \"auto\" the micro-batch is the largest divisor of effective_batch\n"
    "  whose planned_peak_bytes fit MB MiB (default: the spec's max_memory_mb, else half of the\n"
    "  available memory on the CPU); exit 1 (cannot_fit) when even the smallest does not.\n"
    "  For any other spec --memory-mb (or max_memory_mb) only adds \"fits\": true/false.\n",
    plan_opts, NULL, TQ_OPTS_EQ
};
static const tq_opt no_opts[] = { { NULL, NULL, NULL, NULL, 0 } };
static const tq_cmd_doc devices_doc = {
    "devices", NULL,
    "  The devices this binary can train on, as JSON on stdout (id, backend, name, memory), and\n"
    "  one line per device, or why there is no GPU, on stderr.\n",
    no_opts, NULL, 0
};
static const tq_cmd_doc version_doc = {
    "version", NULL, "  Prints \"trainq VERSION\" (also: trainq --version).\n", no_opts, NULL, 0
};

static void usage(FILE *f) {
    tq_opts_synopsis(f, &run_doc, "usage: ");
    tq_opts_synopsis(f, &plan_doc, "       ");
    tq_opts_synopsis(f, &devices_doc, "       ");
    tq_opts_synopsis(f, &version_doc, "       ");
    tq_opts_synopsis(f, &tq_doc_serve, "       ");
    tq_opts_synopsis(f, &tq_doc_worker, "       ");
    tq_client_usage(f);
    fprintf(f, "trainq COMMAND --help: what the command does and each of its options\n");
}

static char *read_file(const char *path, char *err, size_t errlen) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) { snprintf(err, errlen, "cannot open spec %s: %s", path, strerror(errno)); return NULL; }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n < cap - 1) break;
        if (cap > (1u << 24)) { free(buf); buf = NULL; snprintf(err, errlen, "spec %s is larger than 16 MiB", path); break; }
        char *nb = realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; }
        buf = nb;
    }
    if (buf) buf[n] = 0;
    if (f != stdin) fclose(f);
    return buf;
}

/* exit 2 with a message naming the field */
static int load_spec(const char *path, tq_spec *sp) {
    char err[512];
    char *text = read_file(path, err, sizeof err);
    if (!text) { fprintf(stderr, "trainq: %s\n", err); return 2; }
    tq_spec_err se;
    int rc = tq_spec_parse(sp, text, &se);
    free(text);
    if (rc) {
        if (se.field[0]) fprintf(stderr, "trainq: invalid spec %s: field \"%s\": %s\n", path, se.field, se.message);
        else fprintf(stderr, "trainq: invalid spec %s: %s\n", path, se.message);
        return 2;
    }
    /* recompute "auto", settled where this command will train: off when that is the CPU
     * (device "cpu", or "auto" on a host where no GPU answers), as trainq serve settles it at
     * submission from the devices it serves */
    if (sp->recompute == TQ_RECOMPUTE_AUTO && !strcmp(sp->device, "auto")) {
        char why[128];
        sp->recompute = tq_cuda_devices(NULL, 0, why, sizeof why) > 0;   /* -1 in a build without CUDA */
    }
    return 0;
}

/* ---- "batch_size": "auto": the memory cap a command resolves against ---- */

/* Half of MemAvailable (/proc/meminfo) in bytes; 0 when it cannot be read. */
static long long half_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb > 0 ? kb * 1024 / 2 : 0;
}

static int is_cuda_device(const tq_spec *sp) { return !strncmp(sp->device, "cuda", 4); }

/* The cap for an auto batch: --memory-mb (flag_mb > 0), else the spec's max_memory_mb, else on
 * the CPU half of the available memory. A spec on "cuda"/"cuda:N" without either gets no cap:
 * the trainer still refuses a plan over the GPU's free memory. (device "auto" counts as the
 * CPU here, as `trainq run` trains there unless a GPU works; the cap then only errs on the
 * small side.) Returns the cap in bytes (0: none) and names it in name[]. */
static long long batch_cap(const tq_spec *sp, long long flag_mb, char *name, size_t n) {
    if (flag_mb > 0) { snprintf(name, n, "--memory-mb %lld", flag_mb); return flag_mb << 20; }
    if (sp->max_memory_mb > 0) {
        snprintf(name, n, "max_memory_mb %lld", (long long)sp->max_memory_mb);
        return (long long)sp->max_memory_mb << 20;
    }
    if (!is_cuda_device(sp)) {
        long long half = half_mem_available();
        if (half > 0) { snprintf(name, n, "half of the available memory"); return half; }
    }
    snprintf(name, n, "no cap");
    return 0;
}

static void print_json(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    if (s) { fputs(s, stdout); fputc('\n', stdout); fflush(stdout); }
    cJSON_free(s);
    cJSON_Delete(o);
}

/* ---- trainq run: progress on stderr, records to SQLite ---- */
typedef struct {
    tq_store *db;
    int64_t job;
    int tty, quiet;
    double last_print;
    double t0;
    volatile sig_atomic_t *stop;
} run_cb;

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

static int cb_step(void *ctx, const tq_step_rec *r) {
    run_cb *c = ctx;
    if (c->db && tq_store_add_step(c->db, c->job, r)) {
        fprintf(stderr, "\ntrainq: database: %s\n", tq_store_errmsg(c->db));
        return -1;
    }
    if (c->quiet) return 0;
    double now = tq_mono_ms();
    int last = r->step == r->total_steps;
    if (!last && now - c->last_print < (c->tty ? 100 : 5000)) return 0;
    c->last_print = now;
    double frac = (double)r->step / (double)r->total_steps;
    double eta = frac > 0 ? (now - c->t0) / 1000.0 * (1 - frac) / frac : 0;
    if (c->tty) {
        char bar[31]; int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r[%s] %lld/%lld  loss %.4f  %.0f samples/s  ETA %.0fs ", bar,
                (long long)r->step, (long long)r->total_steps, r->loss, r->samples_per_s, eta);
        if (last) fputc('\n', stderr);
    } else {
        fprintf(stderr, "step %lld/%lld epoch %d loss %.4f lr %.4g %.0f samples/s\n", (long long)r->step,
                (long long)r->total_steps, r->epoch, r->loss, r->lr, r->samples_per_s);
    }
    return 0;
}

static int cb_eval(void *ctx, const tq_eval_rec *r) {
    run_cb *c = ctx;
    if (c->db && tq_store_add_eval(c->db, c->job, r)) {
        fprintf(stderr, "\ntrainq: database: %s\n", tq_store_errmsg(c->db));
        return -1;
    }
    if (!c->quiet)
        fprintf(stderr, "%seval at step %lld: loss %.4f accuracy %.2f%% (%lld samples)\n", c->tty ? "\n" : "",
                (long long)r->step, r->loss, 100 * r->accuracy, (long long)r->samples);
    return 0;
}

static int cb_stop(void *ctx) { (void)ctx; return g_stop ? 1 : 0; }

static int cmd_run(int argc, char **argv) {
    const char *spec_path = NULL, *db_path = NULL, *out = NULL, *profile = NULL;
    int resume = 0, quiet = 0;
    int rc0 = tq_opts_check(&run_doc, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--db") && i + 1 < argc) db_path = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--resume")) resume = 1;
        else if (!strcmp(argv[i], "--quiet")) quiet = 1;
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc) profile = argv[++i];
        else if (argv[i][0] == '-' && argv[i][1]) { fprintf(stderr, "trainq run: unknown option %s (trainq run --help)\n", argv[i]); return 2; }
        else if (!spec_path) spec_path = argv[i];
        else { fprintf(stderr, "trainq run: unexpected argument %s\n", argv[i]); return 2; }
    }
    if (!spec_path) { fprintf(stderr, "trainq run: which spec? (a JSON file, or - for stdin; trainq run --help)\n"); return 2; }
    if (resume && !out) { fprintf(stderr, "trainq run: --resume needs --out DIR (where the checkpoint is)\n"); return 2; }
    if (profile) {   /* said now, not after the training */
        int existed = access(profile, F_OK) == 0;
        FILE *pf = fopen(profile, "a");
        if (!pf) { fprintf(stderr, "trainq run: --profile %s: cannot write there: %s\n", profile, strerror(errno)); return 2; }
        fclose(pf);
        if (!existed) remove(profile);
    }
    tq_spec sp;
    int rc = load_spec(spec_path, &sp);
    if (rc) return rc;

    /* an unresolved "batch_size": "auto" is resolved here, before the job is recorded */
    char pick_code[32] = "", pick_err[512] = "";
    if (tq_spec_batch_unresolved(&sp)) {
        char cap_name[64];
        long long cap = batch_cap(&sp, 0, cap_name, sizeof cap_name), need = 0;
        tq_plan_report rep;
        tq_spec resolved;
        if (tq_autobatch_pick(&sp, cap, 0, cap_name, &resolved, &rep, &need, pick_code, sizeof pick_code,
                              pick_err, sizeof pick_err) == 0) {
            char capt[48];
            if (cap > 0) snprintf(capt, sizeof capt, "cap %.1f MiB", cap / 1048576.0);
            else snprintf(capt, sizeof capt, "no cap");
            fprintf(stderr, "trainq run: batch_size auto: micro-batch %d x accum_steps %d = %lld (plan %.1f MiB, %s)\n",
                    resolved.batch_size, resolved.accum_steps, (long long)resolved.effective_batch,
                    need / 1048576.0, capt);
            sp = resolved;
        } else if (!pick_code[0]) {
            snprintf(pick_code, sizeof pick_code, "internal");
        }
    }

    run_cb c = {0};
    c.tty = isatty(2); c.quiet = quiet; c.t0 = tq_mono_ms();
    char err[512];
    char *spec_json = tq_spec_to_json(&sp);
    if (db_path) {
        c.db = tq_store_open(db_path, err, sizeof err);
        if (!c.db) { fprintf(stderr, "trainq: %s\n", err); free(spec_json); return 1; }
        c.job = tq_store_insert_job(c.db, sp.name, spec_json, sp.priority,
                                    sp.submission_id[0] ? sp.submission_id : NULL, "running", err, sizeof err);
        if (c.job < 0) { fprintf(stderr, "trainq: %s\n", err); tq_store_close(c.db); free(spec_json); return 1; }
    }
    free(spec_json);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    /* TQ_TEST_PLACED=1: run as a job the daemon placed (gpu-check's busy GPU: a device that
     * cannot be opened is the placement's, and a busy one says so) */
    const char *tp = getenv("TQ_TEST_PLACED");
    tq_run_opts o = {out, resume, {&c, cb_step, cb_eval, cb_stop, NULL}, 0, profile, tp && !strcmp(tp, "1"),
                     NULL, NULL};
    tq_summary sum;
    if (pick_code[0]) {   /* the auto batch could not be resolved: a failed job, as tq_train's */
        memset(&sum, 0, sizeof sum);
        snprintf(sum.state, sizeof sum.state, "failed");
        sum.final_loss = sum.val_loss = sum.val_accuracy = NAN;
        sum.peak_memory_bytes = sum.predicted_peak_bytes = sum.device_peak_used_bytes = -1;
        sum.final_loss_scale = -1;
        sum.effective_batch = sp.effective_batch;
        snprintf(sum.amp, sizeof sum.amp, "%s", tq_amp_name(sp.amp));
        snprintf(sum.device, sizeof sum.device, "%s", is_cuda_device(&sp) ? sp.device : "cpu");
        snprintf(sum.error_code, sizeof sum.error_code, "%s", pick_code);
        snprintf(sum.error_message, sizeof sum.error_message, "%s", pick_err);
    } else {
        tq_train(&sp, &o, &sum);
    }
    cJSON *js = tq_summary_json(&sum);
    if (c.db) {
        char *s = cJSON_PrintUnformatted(js);
        if (tq_store_finish_job(c.db, c.job, sum.state, s, sum.error_code[0] ? sum.error_code : NULL,
                                sum.error_message[0] ? sum.error_message : NULL))
            fprintf(stderr, "trainq: database: %s\n", tq_store_errmsg(c.db));
        cJSON_free(s);
        tq_store_close(c.db);
    }
    if (sum.error_code[0]) fprintf(stderr, "trainq: job failed: %s: %s\n", sum.error_code, sum.error_message);
    print_json(js);
    return strcmp(sum.state, "failed") ? 0 : 1;
}

/* A positive integer option value (MiB) into *mb; 0 on success. */
static int parse_mb(const char *v, long long *mb) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!v[0] || errno || !end || *end || x <= 0 || x > (1LL << 30)) return -1;
    *mb = x;
    return 0;
}

static int cmd_plan(int argc, char **argv) {
    const char *spec_path = NULL;
    long long flag_mb = 0;
    int rc0 = tq_opts_check(&plan_doc, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--memory-mb") || !strncmp(argv[i], "--memory-mb=", 12)) {
            const char *v = argv[i][11] == '=' ? argv[i] + 12 : i + 1 < argc ? argv[++i] : NULL;
            if (!v) { fprintf(stderr, "trainq plan: --memory-mb needs a value (MiB)\n"); return 2; }
            if (parse_mb(v, &flag_mb)) {
                fprintf(stderr, "trainq plan: --memory-mb must be a positive integer number of MiB "
                                "(at most 1073741824), got \"%s\"\n", v);
                return 2;
            }
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "trainq plan: unknown option %s (trainq plan --help)\n", argv[i]);
            return 2;
        } else if (!spec_path) spec_path = argv[i];
        else { fprintf(stderr, "trainq plan: unexpected argument %s\n", argv[i]); return 2; }
    }
    if (!spec_path) { fprintf(stderr, "trainq plan: which spec? (a JSON file, or - for stdin; trainq plan --help)\n"); return 2; }
    tq_spec sp;
    int rc = load_spec(spec_path, &sp);
    if (rc) return rc;
    tq_plan_report rep;
    char code[32] = "", err[512] = "";
    long long cap = 0;
    int fits = -1;   /* -1: no cap to report against */
    if (sp.batch_auto) {   /* resolved or not: picked / checked against the cap */
        char cap_name[64];
        long long need = 0;
        cap = batch_cap(&sp, flag_mb, cap_name, sizeof cap_name);
        tq_spec resolved;
        if (tq_autobatch_pick(&sp, cap, 0, cap_name, &resolved, &rep, &need, code, sizeof code, err, sizeof err)) {
            fprintf(stderr, "trainq plan: %s: %s\n", code[0] ? code : "internal", err);
            return 1;
        }
        sp = resolved;
        if (cap > 0) fits = 1;
    } else {
        if (tq_plan_spec(&sp, &rep, code, sizeof code, err, sizeof err)) {
            fprintf(stderr, "trainq plan: %s: %s\n", code, err);
            return 1;
        }
        cap = flag_mb > 0 ? flag_mb << 20 : (long long)sp.max_memory_mb << 20;
        if (cap > 0) fits = (long long)(rep.plan.total + rep.plan.data) <= cap;
    }
    cJSON *o = tq_plan_batch_json(&rep.plan, rep.model, rep.amp, rep.batch_size, sp.accum_steps, sp.batch_auto);
    if (fits >= 0) {
        cJSON_AddNumberToObject(o, "memory_cap_bytes", (double)cap);
        cJSON_AddBoolToObject(o, "fits", fits);
    }
    print_json(o);
    return 0;
}

/* `trainq devices`: the backends this binary can use, as JSON on stdout, and one line per
 * device (or the one-line reason there is no GPU) on stderr. The supervisor runs it as a
 * short-lived probe so that it never initialises CUDA itself. */
static int cmd_devices(int argc, char **argv) {
    int rc0 = tq_opts_check(&devices_doc, argc, argv);
    if (rc0 >= 0) return rc0;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "devices");
    char why[256] = "";
    tq_cuda_devinfo gpus[16];
    int n = tq_cuda_devices(gpus, 16, why, sizeof why);
    for (int i = 0; i < n && i < 16; i++) {
        cJSON *d = cJSON_CreateObject();
        char id[16];
        snprintf(id, sizeof id, "cuda:%d", gpus[i].ordinal);
        cJSON_AddStringToObject(d, "id", id);
        cJSON_AddStringToObject(d, "backend", "cuda");
        cJSON_AddStringToObject(d, "name", gpus[i].name);
        char sm[16];
        snprintf(sm, sizeof sm, "sm_%d", gpus[i].sm);
        cJSON_AddStringToObject(d, "arch", sm);
        cJSON_AddNumberToObject(d, "memory_total_bytes", (double)gpus[i].total_bytes);
        cJSON_AddNumberToObject(d, "memory_free_bytes", (double)gpus[i].free_bytes);
        if (gpus[i].pci_bus_id[0]) cJSON_AddStringToObject(d, "pci_bus_id", gpus[i].pci_bus_id);
        cJSON_AddStringToObject(d, "compute_mode", tq_compute_mode_name(gpus[i].compute_mode));
        cJSON_AddItemToArray(arr, d);
        fprintf(stderr, "%s: %s (sm_%d), %.1f of %.1f GiB free%s%s\n", id, gpus[i].name, gpus[i].sm,
                gpus[i].free_bytes / 1073741824.0, gpus[i].total_bytes / 1073741824.0,
                gpus[i].compute_mode > 0 ? ", compute mode " : "",
                gpus[i].compute_mode > 0 ? tq_compute_mode_name(gpus[i].compute_mode) : "");
    }
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "id", "cpu");
    cJSON_AddStringToObject(d, "backend", "cpu");
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    cJSON_AddNumberToObject(d, "memory_total_bytes", (double)pages * psz);
    cJSON_AddNumberToObject(d, "memory_free_bytes", (double)avail * psz);
    cJSON_AddNumberToObject(d, "threads", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddItemToArray(arr, d);
    fprintf(stderr, "cpu: %ld threads\n", sysconf(_SC_NPROCESSORS_ONLN));
    if (n > 0) {
        cJSON_AddStringToObject(o, "cuda", "available");
    } else {
        cJSON_AddStringToObject(o, "cuda", why);
        fprintf(stderr, "cuda: not available: %s; jobs with device auto run on the CPU\n", why);
    }
    print_json(o);
    return 0;
}

int main(int argc, char **argv) {
    /* cuda:N numbered as nvidia-smi and NVML number the GPUs (PCI order), not CUDA's default
     * fastest first, which differs on a machine with mixed cards; the workers inherit it.
     * Before any CUDA call; a value the environment sets wins. */
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 2, argv + 2);
    if (!strcmp(cmd, "devices")) return cmd_devices(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return tq_cmd_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "worker")) return tq_cmd_worker(argc - 2, argv + 2);
    if (tq_client_is_command(cmd)) return tq_client_main(argc - 1, argv + 1);   /* client/ */
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        int rc0 = tq_opts_check(&version_doc, argc - 2, argv + 2);
        if (rc0 >= 0) return rc0;
        printf("trainq %s\n", TQ_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) { usage(stdout); return 0; }
    fprintf(stderr, "trainq: unknown command \"%s\"\n", cmd);
    usage(stderr);
    return 2;
}
