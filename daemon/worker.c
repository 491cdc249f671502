/* worker.c — `trainq worker --db PATH --job ID`: runs one claimed job in its own process.
 *
 * Reads the job's spec from the database, trains with out_dir = <db's directory>/jobs/<ID>
 * and resume on (a requeued job continues from its checkpoint with the same data order;
 * steps already recorded are kept: INSERT OR IGNORE), writes steps/evals in batches, makes
 * the records up to a checkpoint durable before the checkpoint is taken, polls the job's
 * cancel_requested flag at most every CANCEL_POLL_MS, and on SIGTERM checkpoints and exits
 * TQ_WORKER_REQUEUE for the supervisor to requeue the job. SIGINT is ignored (a Ctrl-C on
 * the daemon's terminal reaches the whole process group; the supervisor decides). On the
 * end it finalises the job row (state, summary, error) and exits with daemon.h's status. */
#include "daemon.h"
#include "report.h"
#include "spec.h"
#include "trainer.h"
#include "codes.h"
#include "device.h"
#include "util.h"
#include "../schema/queue.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define CANCEL_POLL_MS 200

static volatile sig_atomic_t g_term;
static void on_term(int sig) { (void)sig; g_term = 1; }

typedef struct {
    tq_store *db;
    int64_t job;
    int64_t checkpoint_every;
    int progress_set;
    double last_poll;
    int cancel;
    tq_store_fault_kind fault;   /* why recording a step or an evaluation failed */
    char fault_msg[400];
} wctx;

/* remembers why the database refused a record, for the job's error (storage_full naming the
 * database's path rather than a bare "recording the step failed") */
static void note_fault(wctx *w, const char *what) {
    if (w->fault) return;
    w->fault = tq_store_fault(w->db);
    if (!w->fault) w->fault = TQ_STORE_FAULT_OTHER;
    snprintf(w->fault_msg, sizeof w->fault_msg, "%s in the database %s failed: %s", what,
             tq_store_path(w->db), tq_store_errmsg(w->db));
}

static int w_step(void *ctx, const tq_step_rec *r) {
    wctx *w = ctx;
    if (!w->progress_set) {
        w->progress_set = 1;
        if (tq_queue_set_progress(w->db, w->job, r->total_steps, NULL))   /* the claim named the device */
            fprintf(stderr, "trainq worker: job %lld: %s\n", (long long)w->job, tq_store_errmsg(w->db));
    }
    if (tq_store_add_step(w->db, w->job, r)) goto fail;
    /* the trainer checkpoints after this step: its records must be durable first */
    if ((w->checkpoint_every > 0 && r->step % w->checkpoint_every == 0) || r->step == r->total_steps)
        if (tq_store_flush(w->db)) goto fail;
    return 0;
fail:
    fprintf(stderr, "trainq worker: job %lld: database: %s\n", (long long)w->job, tq_store_errmsg(w->db));
    {
        char what[64];
        snprintf(what, sizeof what, "recording step %lld", (long long)r->step);
        note_fault(w, what);
    }
    return -1;
}

static int w_eval(void *ctx, const tq_eval_rec *r) {
    wctx *w = ctx;
    if (tq_store_add_eval(w->db, w->job, r) || tq_store_flush(w->db)) {
        fprintf(stderr, "trainq worker: job %lld: database: %s\n", (long long)w->job, tq_store_errmsg(w->db));
        note_fault(w, "recording an evaluation");
        return -1;
    }
    return 0;
}

static int w_stop(void *ctx) {
    wctx *w = ctx;
    int stop = 0;
    if (g_term) stop = 2;
    else if (w->cancel) stop = 1;
    else {
        double now = tq_mono_ms();
        if (now - w->last_poll >= CANCEL_POLL_MS) {
            w->last_poll = now;
            int c = tq_queue_cancel_requested(w->db, w->job);
            if (c == 1) { w->cancel = 1; stop = 1; }
        }
    }
    /* a stop is followed by a checkpoint: make the records durable before it */
    if (stop && tq_store_flush(w->db))
        fprintf(stderr, "trainq worker: job %lld: database: %s\n", (long long)w->job, tq_store_errmsg(w->db));
    return stop;
}

static void w_checkpoint(void *ctx, int64_t step, const char *path) {
    wctx *w = ctx;
    (void)step;
    tq_store_flush(w->db);
    if (tq_queue_set_checkpoint(w->db, w->job, path))
        fprintf(stderr, "trainq worker: job %lld: %s\n", (long long)w->job, tq_store_errmsg(w->db));
}

/* <directory of db>/jobs/<id> */
static void job_dir(const char *db, int64_t id, char *out, size_t n) {
    const char *slash = strrchr(db, '/');
    if (!slash) snprintf(out, n, "jobs/%lld", (long long)id);
    else if (slash == db) snprintf(out, n, "/jobs/%lld", (long long)id);
    else snprintf(out, n, "%.*s/jobs/%lld", (int)(slash - db), db, (long long)id);
}

static int finish(tq_store *db, int64_t id, const char *state, const char *summary, const char *code,
                  const char *msg) {
    int rc = tq_queue_finish(db, id, state, summary, code, msg);
    if (rc) fprintf(stderr, "trainq worker: job %lld: finishing: %s\n", (long long)id, tq_store_errmsg(db));
    return rc;
}

/* one line on the report pipe, written whole (a line under PIPE_BUF is atomic); 0 sent */
static int send_line(int fd, const char *t) {
    size_t n = strlen(t), off = 0;
    while (off < n) {
        ssize_t k = write(fd, t + off, n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        off += (size_t)k;
    }
    return write(fd, "\n", 1) == 1 ? 0 : -1;
}

/* the device holds the job's engine and data: {"state":"ready"} on the report pipe (the daemon
 * ends a busy device's pause on it) */
static void w_ready(void *ctx) {
    if (send_line(*(int *)ctx, "{\"state\":\"ready\"}"))
        fprintf(stderr, "trainq worker: cannot tell the daemon the device is ready: %s\n", strerror(errno));
}

/* {"state","summary","error_code","error_message","why"} as one line on fd; 0 sent */
static int report_outcome(int fd, const tq_summary *sum, const char *summary_json, const char *why) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", sum->state);
    cJSON_AddStringToObject(o, "summary", summary_json ? summary_json : "");
    cJSON_AddStringToObject(o, "error_code", sum->error_code);
    cJSON_AddStringToObject(o, "error_message", sum->error_message);
    cJSON_AddStringToObject(o, "why", why ? why : "");
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!t) return -1;
    int rc = send_line(fd, t);
    cJSON_free(t);
    return rc;
}

/* The files submission checked for the job's owner (jobs.inputs): each must still be the same
 * inode, and the spec is pointed at the resolved paths, so that a symlink swapped since cannot
 * make the daemon read another file on the owner's behalf. 0 ok, else msg[] says which. */
static int verify_inputs(const char *inputs, tq_spec *sp, char *msg, size_t n) {
    if (!inputs) return 0;
    cJSON *arr = cJSON_Parse(inputs), *e;
    int rc = 0;
    cJSON_ArrayForEach(e, arr) {
        const char *field = cJSON_GetStringValue(cJSON_GetObjectItem(e, "field"));
        const char *path = cJSON_GetStringValue(cJSON_GetObjectItem(e, "path"));
        double dev = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "dev")), ino = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "ino"));
        if (!field || !path) continue;
        struct stat st;
        if (stat(path, &st) || (double)st.st_dev != dev || (double)st.st_ino != ino) {
            snprintf(msg, n, "%s %s is not the file submission checked for the job's owner (it was replaced or "
                     "removed since): refused", field, path);
            rc = -1;
            break;
        }
        if (!strcmp(field, "data_dir")) snprintf(sp->data_dir, sizeof sp->data_dir, "%s", path);
        else if (!strcmp(field, "init_from")) snprintf(sp->init_from, sizeof sp->init_from, "%s", path);
    }
    cJSON_Delete(arr);
    return rc;
}

static const tq_opt worker_opts[] = {
    { "--db", NULL, "PATH", "the daemon's database", 1 },
    { "--job", NULL, "ID", "the job, claimed (state running) by the daemon", 1 },
    { "--device", NULL, "cpu|cuda:N", "where the daemon placed it (default the job's device, else cpu)", 0 },
    { "--threads", NULL, "N", "CPU threads when the job's spec sets none (its share of the cores)", 0 },
    { "--mem-limit", NULL, "BYTES", "the most the allocator hands out (the job's planned share)", 0 },
    { "--report-fd", NULL, "FD", "where to say that the device holds the job (a line once it does), "
      "and to send the outcome when the database takes no writes, or why its device was busy", 0 },
    { "--room-known", NULL, NULL, "the placement saw the driver's free memory hold the plan: a device "
      "with less free now is busy (another process took it), not the job's failure", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_worker = {
    "worker", NULL,
    "  Internal: trainq serve starts one per job, after placing it. Trains the job, writing its\n"
    "  steps, evals and outcome to the database and its files to jobs/ID/ beside it.\n",
    worker_opts,
    "exit: 0 succeeded, 1 failed, 2 bad usage or the job is not running, 3 cancelled, 4 outcome\n"
    "not recorded (sent to --report-fd), 5 its device was busy (to requeue, the device paused;\n"
    "why on --report-fd), 75 stopped by SIGTERM after a checkpoint (to requeue)\n",
    0
};

int tq_cmd_worker(int argc, char **argv) {
    const char *db_path = NULL, *device = NULL;
    long long id = 0, threads = 0, mem_limit = 0, report_fd = -1;
    int room_known = 0;
    int rc0 = tq_opts_check(&tq_doc_worker, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--db") && i + 1 < argc) db_path = argv[++i];
        else if (!strcmp(argv[i], "--job") && i + 1 < argc) id = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--mem-limit") && i + 1 < argc) mem_limit = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--report-fd") && i + 1 < argc) report_fd = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--room-known")) room_known = 1;
        else { fprintf(stderr, "trainq worker: unexpected argument %s\n", argv[i]); return TQ_WORKER_USAGE; }
    }
    tq_devsel dsel;
    if (!db_path || id <= 0 || (device && (tq_devsel_parse(device, &dsel) || dsel.kind == TQ_DEV_AUTO ||
                                           dsel.kind == TQ_DEV_CUDA_ANY)) || threads < 0 || mem_limit < 0) {
        fprintf(stderr, "trainq worker: needs --db PATH and --job ID (and --device cpu or cuda:N when given); "
                        "trainq serve starts it (trainq worker --help)\n");
        return TQ_WORKER_USAGE;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGINT, SIG_IGN);

    char err[512];
    tq_store *db = tq_store_open(db_path, err, sizeof err);
    if (!db) { fprintf(stderr, "trainq worker: %s\n", err); return TQ_WORKER_FAILED; }
    tq_store_set_durable(db, 1);   /* records before a checkpoint survive a power cut */
    tq_job job;
    int rc = tq_queue_get(db, id, &job);
    if (rc != 1) {
        fprintf(stderr, "trainq worker: job %lld: %s\n", id, rc ? tq_store_errmsg(db) : "no such job");
        tq_store_close(db);
        return TQ_WORKER_USAGE;
    }
    if (strcmp(job.state, "running")) {
        fprintf(stderr, "trainq worker: job %lld is %s, not running (claimed)\n", id, job.state);
        tq_job_free(&job);
        tq_store_close(db);
        return TQ_WORKER_USAGE;
    }
    tq_spec sp;
    tq_spec_err se;
    if (tq_spec_parse(&sp, job.spec, &se)) {
        char msg[400];
        snprintf(msg, sizeof msg, "the stored spec is invalid: %s: %s", se.field, se.message);
        tq_job_free(&job);
        finish(db, id, "failed", NULL, tq_error_name(TQ_ERR_INVALID_SPEC), msg);
        tq_store_close(db);
        return TQ_WORKER_FAILED;
    }
    {
        char msg[TQ_PATH_MAX + 200];
        if (verify_inputs(job.inputs, &sp, msg, sizeof msg)) {
            tq_job_free(&job);
            finish(db, id, "failed", NULL, tq_error_name(TQ_ERR_INPUT_CHANGED), msg);
            tq_store_close(db);
            return TQ_WORKER_FAILED;
        }
    }
    /* the scheduler's placement: the device it chose (the job's "device" allowed it) and, on
     * the CPU, the cores it shares with the CPU jobs running beside it */
    if (!device) device = job.device[0] ? job.device : "cpu";
    snprintf(sp.device, sizeof sp.device, "%.15s", device);
    /* recompute "auto": a job that may run on a GPU or the CPU (the daemon settles every other
     * at submission) follows the device given, as its two plans did: on for a GPU, off for the
     * CPU (api/handlers.c) */
    if (sp.recompute == TQ_RECOMPUTE_AUTO) sp.recompute = tq_spec_recompute(&sp);
    if (!tq_dev_is_gpu(sp.device) && sp.threads == 0 && threads > 0) sp.threads = (int)threads;
    tq_job_free(&job);

    char out[TQ_PATH_MAX + 64];
    job_dir(db_path, id, out, sizeof out);
    wctx w = { db, id, sp.checkpoint_every, 0, 0, 0, TQ_STORE_FAULT_NONE, "" };
    int rfd = (int)report_fd;
    tq_run_opts o = { out, 1, { &w, w_step, w_eval, w_stop, w_checkpoint }, mem_limit, NULL, room_known ? 2 : 1,
                      report_fd >= 0 ? w_ready : NULL, &rfd };
    fprintf(stderr, "trainq worker: job %lld: training (%s, files in %s)\n", id, tq_model_name(sp.model), out);
    tq_summary sum;
    tq_train(&sp, &o, &sum);

    if (sum.device_busy) {   /* not the job's failure: the supervisor requeues it (serve.c) */
        fprintf(stderr, "trainq worker: job %lld: %s: back to the queue\n", id, sum.error_message);
        strcpy(sum.state, "device_busy");
        if (report_fd >= 0 && report_outcome((int)report_fd, &sum, NULL, NULL))
            fprintf(stderr, "trainq worker: job %lld: cannot tell the daemon why: %s\n", id, strerror(errno));
        tq_store_close(db);
        return TQ_WORKER_DEVICE_BUSY;
    }
    if (!strcmp(sum.state, "interrupted")) {
        int f = tq_store_flush(db);
        fprintf(stderr, "trainq worker: job %lld: stopped at step %lld after a checkpoint: to be requeued\n",
                id, (long long)sum.steps);
        tq_store_close(db);
        return f ? TQ_WORKER_FAILED : TQ_WORKER_REQUEUE;
    }
    /* a record the database refused: the job's error says so, with the database's path */
    if (!strcmp(sum.state, "failed") && !strcmp(sum.error_code, tq_error_name(TQ_ERR_IO_ERROR)) && w.fault) {
        snprintf(sum.error_code, sizeof sum.error_code, "%s",
                 tq_error_name(w.fault == TQ_STORE_FAULT_FULL ? TQ_ERR_STORAGE_FULL : TQ_ERR_STORAGE_ERROR));
        snprintf(sum.error_message, sizeof sum.error_message, "%s", w.fault_msg);
    }
    cJSON *js = tq_summary_json(&sum);
    char *s = cJSON_PrintUnformatted(js);
    cJSON_Delete(js);
    int frc = finish(db, id, sum.state, s, sum.error_code[0] ? sum.error_code : NULL,
                     sum.error_message[0] ? sum.error_message : NULL);
    fprintf(stderr, "trainq worker: job %lld: %s%s%s%s%s\n", id, sum.state, sum.error_code[0] ? ": " : "",
            sum.error_code, sum.error_code[0] ? ": " : "", sum.error_message);
    if (frc) {
        /* not finalised: hand the outcome to the supervisor, which records it once the
         * database takes writes again (one JSON line on the report pipe) */
        int sent = report_fd >= 0 && report_outcome((int)report_fd, &sum, s, tq_store_errmsg(db)) == 0;
        cJSON_free(s);
        tq_store_close(db);
        return sent ? TQ_WORKER_UNRECORDED : TQ_WORKER_FAILED;
    }
    cJSON_free(s);
    tq_store_close(db);
    if (!strcmp(sum.state, "succeeded")) return TQ_WORKER_SUCCEEDED;
    if (!strcmp(sum.state, "cancelled")) return TQ_WORKER_CANCELLED;
    return TQ_WORKER_FAILED;
}

/* ---- the worker's end in words (daemon.h) ---------------------------------------------- */

const char *tq_worker_exit_words(int status) {
    switch (status) {
#define TQ_X(e, code, words) case code: return words;
    TQ_WORKER_EXITS(TQ_X)
#undef TQ_X
    }
    return NULL;
}

/* what a signal that ended a worker most likely means */
static const char *signal_hint(int sig) {
    switch (sig) {
    case SIGKILL: return " — likely the kernel's OOM killer: the host ran out of memory (journalctl -k | grep -i "
                         "oom says), unless someone sent a kill -9";
    case SIGSEGV: return " — a crash: a bug in trainq or a library it uses";
    case SIGBUS: return " — a bus error: a file it had mapped shrank, or a hardware fault";
    case SIGABRT: return " — an abort: a failed assertion, or a library that gave up";
    case SIGILL: return " — an instruction this CPU does not have (a build for another machine?)";
    case SIGFPE: return " — an arithmetic fault: a bug";
    case SIGXCPU: return " — past its CPU time limit (RLIMIT_CPU)";
    case SIGXFSZ: return " — past the file size limit (RLIMIT_FSIZE)";
    case SIGTERM: case SIGINT: case SIGHUP: case SIGQUIT: return " — a stop signal from outside the daemon";
    }
    return "";
}

const char *tq_worker_end_words(int ws, char *buf, size_t n) {
    if (WIFSIGNALED(ws)) {
        int sig = WTERMSIG(ws);
        snprintf(buf, n, "the worker was killed by signal %d (%s)%s%s", sig, strsignal(sig), signal_hint(sig),
                 WCOREDUMP(ws) ? "; core dumped" : "");
    } else if (WIFEXITED(ws)) {
        const char *w = tq_worker_exit_words(WEXITSTATUS(ws));
        snprintf(buf, n, "the worker exited with status %d (%s)", WEXITSTATUS(ws),
                 w ? w : "a status the worker does not use: a library called exit()?");
    } else {
        snprintf(buf, n, "the worker ended with wait status 0x%x", (unsigned)ws);
    }
    return buf;
}
