/* serve.c — `trainq serve`: the supervisor (main thread) and the HTTP API (api/).
 *
 *   trainq serve [--db PATH] [--listen HOST:PORT] [--devices auto|cpu|cuda:N] [--config FILE]
 *
 * At start: takes an exclusive lock (<db>.lock: one daemon per database), requeues the jobs a
 * crash left 'running' (queue.h: attempts, max_attempts → failed 'worker_crashed'), starts
 * the API, sends READY=1. Then, one job at a time on the one device: claim the next job,
 * fork+exec `/proc/self/exe worker --db DB --job N` (the child dies with the daemon:
 * PR_SET_PDEATHSIG), poll it with waitpid(WNOHANG) so that SIGTERM and new jobs are
 * noticed, and finalise it: a worker that dies by a signal or exits without finishing its
 * job → the job fails with 'worker_crashed' and the signal or status in the message; exit
 * TQ_WORKER_REQUEUE → the job goes back to 'queued'. The supervisor never initialises a
 * device.
 * SIGTERM/SIGINT: STOPPING=1, stop the API, SIGTERM to the worker, wait for it to checkpoint
 * and exit, requeue its job (attempts unchanged: the interrupted start counts), exit 0.
 * systemd: READY=1, STATUS=<queue summary> on changes, WATCHDOG=1 every WATCHDOG_USEC/2,
 * STOPPING=1 (daemon/sd_notify.c).
 *
 * Config file (--config): lines `key = value`, '#' comments; keys db, listen, devices,
 * allowed_hosts (extra Host names, comma-separated), threads (API pool size). The command
 * line wins over the file. */
#include "daemon.h"
#include "report.h"
#include "backend.h"
#include "../api/api.h"
#include "../schema/queue.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_stop(int sig) { g_stop = sig; }

typedef struct {
    char db[1024], listen[300], devices[64], allowed_hosts[512], config[1024];
    unsigned threads;
} serve_cfg;

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
static void sleep_ms(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);   /* a signal cuts it short: fine */
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
    if (n >= 2 && ((s[0] == '"' && s[n - 1] == '"') || (s[0] == '\'' && s[n - 1] == '\''))) {
        s[n - 1] = 0;
        s++;
    }
    return s;
}

/* 0 ok; set[k] marks keys the command line gave (they win) */
static int read_config(serve_cfg *c, const int set[4]) {
    FILE *f = fopen(c->config, "r");
    if (!f) { fprintf(stderr, "trainq serve: cannot open config %s: %s\n", c->config, strerror(errno)); return -1; }
    char line[2048];
    int ln = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        char *p = trim(line);
        if (!*p || *p == '#' || *p == ';' || *p == '[') continue;
        char *eq = strchr(p, '=');
        if (!eq) { fprintf(stderr, "trainq serve: %s:%d: expected key = value\n", c->config, ln); rc = -1; break; }
        *eq = 0;
        char *k = trim(p), *v = trim(eq + 1);
        if (!strcmp(k, "db")) { if (!set[0]) snprintf(c->db, sizeof c->db, "%s", v); }
        else if (!strcmp(k, "listen")) { if (!set[1]) snprintf(c->listen, sizeof c->listen, "%s", v); }
        else if (!strcmp(k, "devices")) { if (!set[2]) snprintf(c->devices, sizeof c->devices, "%s", v); }
        else if (!strcmp(k, "allowed_hosts")) snprintf(c->allowed_hosts, sizeof c->allowed_hosts, "%s", v);
        else if (!strcmp(k, "threads")) c->threads = (unsigned)atoi(v);
        else { fprintf(stderr, "trainq serve: %s:%d: unknown key \"%s\"\n", c->config, ln, k); rc = -1; break; }
    }
    fclose(f);
    return rc;
}

/* HOST:PORT, [V6]:PORT, or :PORT / PORT */
static int parse_listen(const char *s, char *host, size_t hn, unsigned short *port) {
    const char *colon;
    if (s[0] == '[') {
        const char *e = strchr(s, ']');
        if (!e || e[1] != ':') return -1;
        snprintf(host, hn, "%.*s", (int)(e - s - 1), s + 1);
        colon = e + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) { snprintf(host, hn, "127.0.0.1"); colon = s - 1; }
        else if (colon == s) snprintf(host, hn, "127.0.0.1");
        else snprintf(host, hn, "%.*s", (int)(colon - s), s);
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || end == colon + 1) return -1;
    *port = (unsigned short)p;
    return 0;
}

static int mkdir_p(const char *dir) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

static void dir_of(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

/* --devices: auto (each job's own "device" decides), cpu, or one cuda:N. Jobs run one at a
 * time, so a list of several GPUs is refused with the reason rather than half-honoured. */
static int check_devices(const char *d) {
    if (!strcmp(d, "auto") || !strcmp(d, "cpu")) return 0;
    if (strchr(d, ',')) {
        fprintf(stderr, "trainq serve: --devices %s: this trainq runs one job at a time on one device; name one (auto, cpu or cuda:N)\n", d);
        return 2;
    }
    char *end;
    long n = !strncmp(d, "cuda:", 5) ? strtol(d + 5, &end, 10) : -1;
    if (n < 0 || n > 255 || end == d + 5 || *end) {
        fprintf(stderr, "trainq serve: --devices %s: want auto, cpu or cuda:N\n", d);
        return 2;
    }
    if (!tq_cuda_built()) {
        fprintf(stderr, "trainq serve: --devices %s: this build has no CUDA backend; use auto or cpu\n", d);
        return 2;
    }
    return 0;
}

/* ---- the GPUs ------------------------------------------------------------------------- */

/* The GPUs jobs may use, from a `trainq devices` child (its JSON on stdout): the daemon never
 * creates a CUDA context of its own, which would hold device memory for nothing and make the
 * workers' fork unsafe. Returns the count; 0 with why[] saying why there is none. Called
 * before any thread exists. */
static int probe_gpus(const char *devices, tq_api_gpu *out, int max, char *why, size_t n) {
    if (!strcmp(devices, "cpu")) { snprintf(why, n, "not used: trainq serve --devices cpu"); return 0; }
    if (!tq_cuda_built()) { tq_cuda_devices(NULL, 0, why, n); return 0; }
    int fd[2];
    if (pipe2(fd, O_CLOEXEC)) { snprintf(why, n, "probing the GPUs: pipe: %s", strerror(errno)); return 0; }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, n, "probing the GPUs: fork: %s", strerror(errno));
        close(fd[0]); close(fd[1]);
        return 0;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) dup2(dn, 2);
        execl("/proc/self/exe", "trainq", "devices", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[16384];
    size_t len = 0;
    double deadline = mono_ms() + 60000;   /* a first CUDA start can take seconds */
    int timed_out = 0;
    for (;;) {
        struct pollfd p = { fd[0], POLLIN, 0 };
        double left = deadline - mono_ms();
        if (left <= 0) { timed_out = 1; break; }
        int k = poll(&p, 1, (int)left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { timed_out = 1; break; }
        ssize_t r = read(fd[0], buf + len, sizeof buf - 1 - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (len == sizeof buf - 1) break;
    }
    close(fd[0]);
    if (timed_out) kill(pid, SIGKILL);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {}
    buf[len] = 0;
    if (timed_out) { snprintf(why, n, "probing the GPUs: `trainq devices` did not answer within 60 s"); return 0; }
    cJSON *o = cJSON_Parse(buf);
    if (!o) {
        snprintf(why, n, "probing the GPUs: `trainq devices` %s", WIFSIGNALED(ws) ? "was killed by a signal" : "printed no JSON");
        return 0;
    }
    int count = 0;
    cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(o, "devices")) {
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(d, "id"));
        if (!id || strncmp(id, "cuda:", 5) || count >= max) continue;
        tq_api_gpu *g = &out[count++];
        memset(g, 0, sizeof *g);
        g->ordinal = atoi(id + 5);
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(d, "name"));
        const char *arch = cJSON_GetStringValue(cJSON_GetObjectItem(d, "arch"));
        snprintf(g->name, sizeof g->name, "%s", name ? name : "?");
        snprintf(g->arch, sizeof g->arch, "%s", arch ? arch : "?");
        g->total_bytes = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "memory_total_bytes"));
        g->free_bytes = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "memory_free_bytes"));
    }
    const char *cu = cJSON_GetStringValue(cJSON_GetObjectItem(o, "cuda"));
    snprintf(why, n, "%s", count ? "available" : cu ? cu : "no CUDA device found");
    cJSON_Delete(o);
    return count;
}

/* ---- the worker ----------------------------------------------------------------------- */

static pid_t spawn_worker(const char *db, int64_t id, const char *devices) {
    char idbuf[32];
    snprintf(idbuf, sizeof idbuf, "%lld", (long long)id);
    char *args[] = { "trainq", "worker", "--db", (char *)db, "--job", idbuf, "--device", (char *)devices, NULL };
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) return pid;   /* the daemon (or -1) */
    /* the child: async-signal-safe calls only until exec */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a kill -9 of the daemon takes its worker along */
    if (getppid() != parent) _exit(127);
    closefrom(3);
    execv("/proc/self/exe", args);
    _exit(127);
}

static void status_text(tq_store *st, int64_t running, char *out, size_t n) {
    int64_t c[5];
    if (tq_queue_counts(st, c)) { snprintf(out, n, "database error: %s", tq_store_errmsg(st)); return; }
    if (running) snprintf(out, n, "running job %lld, %lld queued", (long long)running, (long long)c[0]);
    else snprintf(out, n, "idle, %lld queued", (long long)c[0]);
}

/* After the worker of `id` ended with wait status ws. */
static void finalise(tq_store *st, int64_t id, int ws, int stopping) {
    tq_job j;
    int rc = tq_queue_get(st, id, &j);
    if (rc != 1) {
        if (rc < 0) fprintf(stderr, "trainq serve: job %lld: %s\n", (long long)id, tq_store_errmsg(st));
        return;   /* deleted meanwhile, or the database is gone */
    }
    int running = !strcmp(j.state, "running");
    tq_job_free(&j);
    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    if (!running) {
        fprintf(stderr, "trainq serve: job %lld: worker exited %d\n", (long long)id, code);
        return;
    }
    if (code == TQ_WORKER_REQUEUE || stopping) {
        if (tq_queue_requeue(st, id))
            fprintf(stderr, "trainq serve: job %lld: requeue: %s\n", (long long)id, tq_store_errmsg(st));
        else
            fprintf(stderr, "trainq serve: job %lld: back in the queue\n", (long long)id);
        return;
    }
    char msg[256];
    if (WIFSIGNALED(ws))
        snprintf(msg, sizeof msg, "the worker was killed by signal %d (%s)%s", WTERMSIG(ws),
                 strsignal(WTERMSIG(ws)), WCOREDUMP(ws) ? ", core dumped" : "");
    else
        snprintf(msg, sizeof msg, "the worker exited with status %d without finishing the job", code);
    cJSON *sum = cJSON_CreateObject();
    cJSON_AddStringToObject(sum, "state", "failed");
    cJSON *e = cJSON_AddObjectToObject(sum, "error");
    cJSON_AddStringToObject(e, "code", "worker_crashed");
    cJSON_AddStringToObject(e, "message", msg);
    char *s = cJSON_PrintUnformatted(sum);
    cJSON_Delete(sum);
    if (tq_queue_finish(st, id, "failed", s, "worker_crashed", msg))
        fprintf(stderr, "trainq serve: job %lld: %s\n", (long long)id, tq_store_errmsg(st));
    else
        fprintf(stderr, "trainq serve: job %lld failed: worker_crashed: %s\n", (long long)id, msg);
    cJSON_free(s);
}

/* ---- serve ---------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: trainq serve [--db PATH] [--listen HOST:PORT] [--devices auto|cpu|cuda:N] [--config FILE]\n");
}

int tq_cmd_serve(int argc, char **argv) {
    serve_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.db, sizeof cfg.db, "var/trainq.db");
    snprintf(cfg.listen, sizeof cfg.listen, "127.0.0.1:8470");
    snprintf(cfg.devices, sizeof cfg.devices, "auto");
    int set[4] = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--db") && v) { snprintf(cfg.db, sizeof cfg.db, "%s", v); set[0] = 1; i++; }
        else if (!strcmp(a, "--listen") && v) { snprintf(cfg.listen, sizeof cfg.listen, "%s", v); set[1] = 1; i++; }
        else if (!strcmp(a, "--devices") && v) { snprintf(cfg.devices, sizeof cfg.devices, "%s", v); set[2] = 1; i++; }
        else if (!strcmp(a, "--config") && v) { snprintf(cfg.config, sizeof cfg.config, "%s", v); i++; }
        else { fprintf(stderr, "trainq serve: unknown or incomplete option %s\n", a); usage(); return 2; }
    }
    if (cfg.config[0] && read_config(&cfg, set)) return 2;
    char host[256];
    unsigned short port;
    if (parse_listen(cfg.listen, host, sizeof host, &port)) {
        fprintf(stderr, "trainq serve: --listen wants HOST:PORT, got \"%s\"\n", cfg.listen);
        return 2;
    }
    if (check_devices(cfg.devices)) return 2;

    /* the state directory, the lock, the database */
    char dir[1024], jobs_dir[1100], lock_path[1100];
    dir_of(cfg.db, dir, sizeof dir);
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", dir);
    if (mkdir_p(dir) || mkdir_p(jobs_dir)) {
        fprintf(stderr, "trainq serve: cannot create %s: %s\n", jobs_dir, strerror(errno));
        return 1;
    }
    snprintf(lock_path, sizeof lock_path, "%s.lock", cfg.db);
    int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB)) {
        fprintf(stderr, "trainq serve: %s: %s\n", lock_path,
                lock_fd < 0 ? strerror(errno) : "another trainq serve is using this database");
        if (lock_fd >= 0) close(lock_fd);
        return 1;
    }
    char err[512];
    tq_store *st = tq_store_open(cfg.db, err, sizeof err);
    if (!st) { fprintf(stderr, "trainq serve: %s\n", err); close(lock_fd); return 1; }
    int requeued = 0, failed = 0;
    if (tq_queue_recover(st, &requeued, &failed)) {
        fprintf(stderr, "trainq serve: recovering jobs: %s\n", tq_store_errmsg(st));
        tq_store_close(st); close(lock_fd);
        return 1;
    }
    if (requeued || failed)
        fprintf(stderr, "trainq serve: found jobs left running: %d requeued, %d failed (max_attempts)\n", requeued, failed);

    /* the GPUs, before any thread exists (the probe forks) */
    tq_api_gpu gpus[16];
    char cuda_why[300];
    int ngpus = probe_gpus(cfg.devices, gpus, 16, cuda_why, sizeof cuda_why);
    for (int i = 0; i < ngpus; i++)
        fprintf(stderr, "trainq serve: cuda:%d: %s (%s), %.1f of %.1f GiB free\n", gpus[i].ordinal, gpus[i].name,
                gpus[i].arch, gpus[i].free_bytes / 1073741824.0, gpus[i].total_bytes / 1073741824.0);
    if (!ngpus) fprintf(stderr, "trainq serve: no GPU: %s; jobs run on the CPU\n", cuda_why);
    if (strncmp(cfg.devices, "cuda:", 5) == 0) {
        int want = atoi(cfg.devices + 5), found = 0;
        for (int i = 0; i < ngpus; i++) found |= gpus[i].ordinal == want;
        if (!found) fprintf(stderr, "trainq serve: --devices %s: no such GPU now (%s); jobs for it will be refused\n",
                            cfg.devices, ngpus ? "see the list above" : cuda_why);
    }

    /* signals before any thread exists: the API's threads inherit the mask/handlers */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;   /* no SA_RESTART: sleeps return early */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    tq_api_config ac = { host, port, cfg.db, jobs_dir, cfg.devices, gpus, ngpus, cuda_why,
                         cfg.allowed_hosts[0] ? cfg.allowed_hosts : NULL, cfg.threads, 0 };
    tq_api *api = tq_api_start(&ac, err, sizeof err);
    if (!api) {
        fprintf(stderr, "trainq serve: %s\n", err);
        tq_store_close(st); close(lock_fd);
        return 1;
    }
    fprintf(stderr, "trainq serve: listening on http://%s%s%s:%u (database %s)\n", strchr(host, ':') ? "[" : "",
            host, strchr(host, ':') ? "]" : "", port, cfg.db);
    tq_sd_notify("READY=1");

    long long wd_usec = tq_sd_watchdog_usec();
    double wd_every = wd_usec > 0 ? wd_usec / 2000.0 : 0, wd_last = mono_ms(), status_last = 0;
    char status[256] = "", status_new[256];
    pid_t child = 0;
    int64_t job = 0;
    while (!g_stop) {
        double now = mono_ms();
        if (wd_every > 0 && now - wd_last >= wd_every) { tq_sd_notify("WATCHDOG=1"); wd_last = now; }
        if (now - status_last >= 1000) {
            status_last = now;
            status_text(st, child ? job : 0, status_new, sizeof status_new);
            if (strcmp(status, status_new)) {
                snprintf(status, sizeof status, "%s", status_new);
                char msg[300];
                snprintf(msg, sizeof msg, "STATUS=%s", status);
                tq_sd_notify(msg);
            }
        }
        if (!child) {
            int64_t id = 0;
            int rc = tq_queue_claim(st, "cpu", &id, NULL);
            if (rc < 0) { fprintf(stderr, "trainq serve: claim: %s\n", tq_store_errmsg(st)); sleep_ms(1000); continue; }
            if (rc == 0) { sleep_ms(200); continue; }
            pid_t pid = spawn_worker(cfg.db, id, cfg.devices);
            if (pid < 0) {
                char msg[160];
                snprintf(msg, sizeof msg, "cannot start the worker: %s", strerror(errno));
                fprintf(stderr, "trainq serve: job %lld: %s\n", (long long)id, msg);
                tq_queue_finish(st, id, "failed", NULL, "worker_crashed", msg);
                sleep_ms(1000);
                continue;
            }
            child = pid; job = id;
            status_last = 0;
            fprintf(stderr, "trainq serve: job %lld: started worker %d\n", (long long)id, (int)pid);
            continue;
        }
        int ws = 0;
        pid_t r = waitpid(child, &ws, WNOHANG);
        if (r == child) {
            finalise(st, job, ws, 0);
            child = 0; job = 0;
            status_last = 0;
            continue;
        }
        if (r < 0 && errno != EINTR) {   /* cannot happen for our own child; do not spin */
            fprintf(stderr, "trainq serve: waitpid: %s\n", strerror(errno));
            finalise(st, job, 0x7f00, 0);
            child = 0; job = 0;
        }
        sleep_ms(50);
    }

    fprintf(stderr, "trainq serve: %s: stopping\n", g_stop == SIGINT ? "SIGINT" : "SIGTERM");
    tq_sd_notify("STOPPING=1");
    tq_api_stop(api);
    if (child) {
        tq_sd_notify("STATUS=stopping: the running job checkpoints and goes back to the queue");
        kill(child, SIGTERM);
        int ws = 0;
        pid_t r;
        while ((r = waitpid(child, &ws, 0)) < 0 && errno == EINTR) {}
        if (r == child) finalise(st, job, ws, 1);
    }
    tq_store_close(st);
    close(lock_fd);
    fprintf(stderr, "trainq serve: stopped\n");
    return 0;
}
