/* serve.c — `trainq serve`: the supervisor (main thread) and the HTTP API (api/).
 *
 *   trainq serve [--db PATH] [--listen HOST:PORT] [--devices auto|LIST] [--config FILE]
 *                [--max-jobs-per-device N] [--gpu-reserve-mb MB] [--cpu-memory-mb MB]
 *                [--backfill-window DURATION]
 *
 * At start: takes an exclusive lock (<db>.lock: one daemon per database), requeues the jobs a
 * crash left 'running' (queue.h: attempts, max_attempts → failed 'worker_crashed'), probes
 * the GPUs (a `trainq devices` child), resolves --devices (device.h), sizes each device's
 * memory budget (a GPU: its total minus --gpu-reserve-mb; the CPU: --cpu-memory-mb, default
 * half of MemAvailable), starts the API, sends READY=1.
 * Then, every round (a fraction of a second, or at once when a worker ends): reads the
 * queue, lets daemon/sched.c place what fits (several jobs per device, by their planned
 * peaks), claims each placed job for its device and fork+execs `/proc/self/exe worker --db
 * DB --job N --device D [--threads T] --mem-limit B` (the child dies with the daemon:
 * PR_SET_PDEATHSIG), publishes the devices and the reasons jobs wait to the API's ledger
 * (api/ledger.h), and reaps the workers that ended: one that dies by a signal or exits
 * without finishing its job → the job fails with 'worker_crashed' and the signal or status
 * in the message; exit TQ_WORKER_REQUEUE → the job goes back to 'queued'. The supervisor never
 * initialises a device: a GPU's free memory is re-read through NVML (gpumem.h).
 * SIGTERM/SIGINT: STOPPING=1, stop the API, SIGTERM to every worker, wait for them to
 * checkpoint and exit, requeue their jobs, exit 0.
 * systemd: READY=1, STATUS=<jobs per device, queue length> on changes, WATCHDOG=1 every
 * WATCHDOG_USEC/2, STOPPING=1 (daemon/sd_notify.c).
 *
 * Config file (--config): lines `key = value`, '#' comments; keys db, listen, devices,
 * allowed_hosts (extra Host names, comma-separated), threads (API pool size),
 * max_jobs_per_device, gpu_reserve_mb, cpu_memory_mb, backfill_window. The command line wins
 * over the file. */
#include "daemon.h"
#include "report.h"
#include "backend.h"
#include "../api/api.h"
#include "../schema/queue.h"
#include "device.h"
#include "gpumem.h"
#include "sched.h"
#include "trainer.h"
#include "codes.h"

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
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_stop(int sig) { g_stop = sig; }

typedef struct {
    char db[1024], listen[300], devices[256], allowed_hosts[512], config[1024];
    unsigned threads;
    /* placement (sched.h); the text as given, checked by check_placement */
    char max_jobs[32], gpu_reserve_mb[32], cpu_memory_mb[32], backfill_window[32];
    /* owners (issue 15) */
    char socket[1024], fair_window[32], max_per_user[32], admin_group[64], private_jobs[16], remote_writes[16];
    char header_timeout[32];
} serve_cfg;

/* the flags and config keys that take a value, in one table: set[] marks the ones the command
 * line gave (they win over the config file) */
enum { K_DB, K_LISTEN, K_DEVICES, K_MAX_JOBS, K_RESERVE, K_CPU_MEM, K_BACKFILL, K_SOCKET, K_FAIR,
       K_MAXUSER, K_ADMIN, K_PRIVATE, K_REMOTE, K_HEADER, K_COUNT };
static const char *const keys[K_COUNT] = {   /* each one's config-file key */
    [K_DB] = "db", [K_LISTEN] = "listen", [K_DEVICES] = "devices", [K_MAX_JOBS] = "max_jobs_per_device",
    [K_RESERVE] = "gpu_reserve_mb", [K_CPU_MEM] = "cpu_memory_mb", [K_BACKFILL] = "backfill_window",
    [K_SOCKET] = "socket", [K_FAIR] = "fair_share_window", [K_MAXUSER] = "max_running_per_user",
    [K_ADMIN] = "admin_group", [K_PRIVATE] = "private_jobs", [K_REMOTE] = "allow_remote_writes",
    [K_HEADER] = "header_timeout",
};
/* ...and its flag, the value's name and its line of `trainq serve --help` (client/opts.h), in
 * the same order; then the flags that are no config key */
static const tq_opt serve_opts[] = {
    [K_DB] = { "--db", NULL, "PATH", "the SQLite database, jobs/ID/ beside it (var/trainq.db)", 0 },
    [K_LISTEN] = { "--listen", NULL, "HOST:PORT", "the HTTP API's address (127.0.0.1:8470; keep it on loopback)", 0 },
    [K_DEVICES] = { "--devices", NULL, "auto|cpu,cuda:N,...", "the devices that run jobs (auto: every GPU and the CPU)", 0 },
    [K_MAX_JOBS] = { "--max-jobs-per-device", NULL, "N", "jobs at once on a device (4 on a GPU, 1 on the CPU; sets both)", 0 },
    [K_RESERVE] = { "--gpu-reserve-mb", NULL, "MB", "each GPU's memory kept out of its budget (1024)", 0 },
    [K_CPU_MEM] = { "--cpu-memory-mb", NULL, "MB", "the CPU's budget (half of MemAvailable at start)", 0 },
    [K_BACKFILL] = { "--backfill-window", NULL, "DURATION", "a job that does not fit lets smaller ones pass this long (10m)", 0 },
    [K_SOCKET] = { "--socket", NULL, "PATH|none", "the unix socket for local users (trainq.sock beside the database)", 0 },
    [K_FAIR] = { "--fair-share-window", NULL, "DURATION", "equal priorities: least device time over it first (24h; 0 off)", 0 },
    [K_MAXUSER] = { "--max-running-per-user", NULL, "N", "running jobs per user at most (0: no limit)", 0 },
    [K_ADMIN] = { "--admin-group", NULL, "GROUP", "its members may cancel and delete any job (trainq-admin)", 0 },
    [K_PRIVATE] = { "--private-jobs", NULL, "true|false", "only a job's owner and admins may read it (false)", 0 },
    [K_REMOTE] = { "--allow-remote-writes", NULL, "true|false", "other hosts may submit and cancel (false: read-only)", 0 },
    [K_HEADER] = { "--header-timeout", NULL, "DURATION", "a request's headers and body must arrive within it (10s)", 0 },
    [K_COUNT] = { "--config", NULL, "FILE", "KEY=VALUE lines, one key per option above (max_jobs_per_device=2)", 0 },
    { NULL, NULL, NULL, NULL, 0 }
};
const tq_cmd_doc tq_doc_serve = {
    "serve", NULL,
    "  The daemon: runs the jobs of the SQLite queue on its devices, each in its own worker\n"
    "  process, packed by their memory plans, and answers the HTTP/JSON API and the dashboard.\n"
    "  Defaults in parentheses; the command line wins over --config. README.md and docs/api.md\n"
    "  say what each option does.\n",
    serve_opts,
    "exit: 0 stopped by SIGTERM/SIGINT (running jobs checkpointed and requeued), 1 cannot start\n"
    "(the database, the address), 2 bad usage or configuration\n",
    0
};

static char *cfg_field(serve_cfg *c, int k, size_t *n) {
    switch (k) {
    case K_DB: *n = sizeof c->db; return c->db;
    case K_LISTEN: *n = sizeof c->listen; return c->listen;
    case K_DEVICES: *n = sizeof c->devices; return c->devices;
    case K_MAX_JOBS: *n = sizeof c->max_jobs; return c->max_jobs;
    case K_RESERVE: *n = sizeof c->gpu_reserve_mb; return c->gpu_reserve_mb;
    case K_CPU_MEM: *n = sizeof c->cpu_memory_mb; return c->cpu_memory_mb;
    case K_SOCKET: *n = sizeof c->socket; return c->socket;
    case K_FAIR: *n = sizeof c->fair_window; return c->fair_window;
    case K_MAXUSER: *n = sizeof c->max_per_user; return c->max_per_user;
    case K_ADMIN: *n = sizeof c->admin_group; return c->admin_group;
    case K_PRIVATE: *n = sizeof c->private_jobs; return c->private_jobs;
    case K_REMOTE: *n = sizeof c->remote_writes; return c->remote_writes;
    case K_HEADER: *n = sizeof c->header_timeout; return c->header_timeout;
    default: *n = sizeof c->backfill_window; return c->backfill_window;
    }
}

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
static int read_config(serve_cfg *c, const int set[K_COUNT]) {
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
        int key = -1;
        for (int i = 0; i < K_COUNT; i++) if (!strcmp(k, keys[i])) key = i;
        if (key >= 0) {
            size_t len;
            char *field = cfg_field(c, key, &len);
            if (!set[key]) snprintf(field, len, "%s", v);
        }
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

static int is_loopback_host(const char *h) {
    return !strcmp(h, "localhost") || !strncmp(h, "127.", 4) || !strcmp(h, "::1");
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

/* ---- placement settings ---------------------------------------------------------------- */

typedef struct {
    int max_jobs_gpu, max_jobs_cpu;
    long long reserve_bytes, cpu_bytes;     /* cpu_bytes 0: half of MemAvailable */
    double backfill_s;
    double fair_window_s;                   /* fair share's look-back (default 24 h; 0 off) */
    int max_per_user;                       /* 0: unlimited */
    int private_jobs, remote_writes;        /* booleans */
    double header_timeout_s;                /* a request's deadline (0: the API's 10 s) */
} placement_cfg;

/* true/false/yes/no/1/0/on/off */
static int parse_bool(const char *s, int *out) {
    static const char *const t[] = { "true", "yes", "1", "on" }, *const f[] = { "false", "no", "0", "off" };
    for (int i = 0; i < 4; i++) {
        if (!strcmp(s, t[i])) { *out = 1; return 0; }
        if (!strcmp(s, f[i])) { *out = 0; return 0; }
    }
    return -1;
}

/* a whole decimal integer in [lo, hi] */
static int parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s[0] || s[0] == ' ' || s[0] == '+') return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* "600", "600s", "10m", "1h": seconds */
static int parse_duration(const char *s, double *out) {
    char num[32];
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof num) return -1;
    double mul = 1;
    memcpy(num, s, n + 1);
    if (num[n - 1] == 's' || num[n - 1] == 'm' || num[n - 1] == 'h') {
        mul = num[n - 1] == 'h' ? 3600 : num[n - 1] == 'm' ? 60 : 1;
        num[n - 1] = 0;
    }
    long long v;
    if (parse_int(num, 0, 10LL * 365 * 24 * 3600, &v)) return -1;
    *out = (double)v * mul;
    return 0;
}


/* 0 ok; else a message naming the flag, exit status 2 */
static int check_placement(const serve_cfg *c, placement_cfg *p) {
    long long v;
    p->max_jobs_gpu = 4;
    p->max_jobs_cpu = 1;
    if (c->max_jobs[0]) {
        if (parse_int(c->max_jobs, 1, TQ_LEDGER_MAX_JOBS, &v)) {
            fprintf(stderr, "trainq serve: --max-jobs-per-device \"%s\": want a whole number of jobs, 1..%d\n",
                    c->max_jobs, TQ_LEDGER_MAX_JOBS);
            return 2;
        }
        p->max_jobs_gpu = p->max_jobs_cpu = (int)v;
    }
    p->reserve_bytes = 1024LL << 20;
    if (c->gpu_reserve_mb[0]) {
        if (parse_int(c->gpu_reserve_mb, 0, 1LL << 30, &v)) {
            fprintf(stderr, "trainq serve: --gpu-reserve-mb \"%s\": want a whole number of MiB, 0 or more\n",
                    c->gpu_reserve_mb);
            return 2;
        }
        p->reserve_bytes = v << 20;
    }
    p->cpu_bytes = 0;
    if (c->cpu_memory_mb[0]) {
        if (parse_int(c->cpu_memory_mb, 1, 1LL << 30, &v)) {
            fprintf(stderr, "trainq serve: --cpu-memory-mb \"%s\": want a whole number of MiB, 1 or more "
                    "(the memory CPU jobs may plan together)\n", c->cpu_memory_mb);
            return 2;
        }
        p->cpu_bytes = v << 20;
    }
    p->backfill_s = 600;
    if (c->backfill_window[0] && parse_duration(c->backfill_window, &p->backfill_s)) {
        fprintf(stderr, "trainq serve: --backfill-window \"%s\": want a duration such as 600, 90s, 10m or 1h\n",
                c->backfill_window);
        return 2;
    }
    p->fair_window_s = 24 * 3600;
    if (c->fair_window[0] && parse_duration(c->fair_window, &p->fair_window_s)) {
        fprintf(stderr, "trainq serve: --fair-share-window \"%s\": want a duration such as 24h, 90m or 0 (off)\n",
                c->fair_window);
        return 2;
    }
    p->max_per_user = 0;
    if (c->max_per_user[0]) {
        if (parse_int(c->max_per_user, 0, 1000000, &v)) {
            fprintf(stderr, "trainq serve: --max-running-per-user \"%s\": want a whole number of jobs (0: unlimited)\n",
                    c->max_per_user);
            return 2;
        }
        p->max_per_user = (int)v;
    }
    p->private_jobs = p->remote_writes = 0;
    if (c->private_jobs[0] && parse_bool(c->private_jobs, &p->private_jobs)) {
        fprintf(stderr, "trainq serve: --private-jobs \"%s\": want true or false\n", c->private_jobs);
        return 2;
    }
    p->header_timeout_s = 0;
    if (c->header_timeout[0]) {
        if (parse_duration(c->header_timeout, &p->header_timeout_s) || p->header_timeout_s < 1 ||
            p->header_timeout_s > 3600) {
            fprintf(stderr, "trainq serve: --header-timeout \"%s\": want a duration of 1 s to 1 h (e.g. 10, 30s)\n",
                    c->header_timeout);
            return 2;
        }
    }
    if (c->remote_writes[0] && parse_bool(c->remote_writes, &p->remote_writes)) {
        fprintf(stderr, "trainq serve: --allow-remote-writes \"%s\": want true or false\n", c->remote_writes);
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
    if (strcmp(devices, "auto") && !strstr(devices, "cuda")) {
        snprintf(why, n, "not used: trainq serve --devices %s", devices);
        return 0;
    }
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
        const char *pci = cJSON_GetStringValue(cJSON_GetObjectItem(d, "pci_bus_id"));
        snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "%s", pci ? pci : "");
        g->total_bytes = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "memory_total_bytes"));
        g->free_bytes = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "memory_free_bytes"));
        g->compute_mode = tq_compute_mode_parse(cJSON_GetStringValue(cJSON_GetObjectItem(d, "compute_mode")));
        if (tq_compute_mode_max_jobs(g->compute_mode, 1) == 0) {   /* prohibited: no process may use it */
            fprintf(stderr, "trainq serve: cuda:%d (%s) is in compute mode %s (nvidia-smi -c): no job can use "
                    "it, left out\n", g->ordinal, g->name, tq_compute_mode_name(g->compute_mode));
            count--;
        }
    }
    const char *cu = cJSON_GetStringValue(cJSON_GetObjectItem(o, "cuda"));
    snprintf(why, n, "%s", count ? "available" : cu ? cu : "no CUDA device found");
    cJSON_Delete(o);
    return count;
}

/* ---- the worker ----------------------------------------------------------------------- */

extern char **environ;

/* The worker's environment: the daemon's, plus OMP_WAIT_POLICY=PASSIVE for a CPU job (unless
 * the daemon's environment sets a policy). OpenMP's threads otherwise spin while they wait, and
 * on a shared workstation the cores are rarely the job's alone: two resnet20 jobs of 2 threads
 * each on 2 cores took 113 s together with the default policy and 7.7 s with PASSIVE, and
 * bench/pack's queue of 8 jobs one at a time took 209 s spinning and 46 s passive while other
 * processes used the machine (docs/benchmarks.md). Built before fork (setenv is not safe in
 * the child of a threaded process). NULL: use environ as it is. malloc'd array of borrowed
 * strings. */
static char **worker_env(int cpu) {
    if (!cpu || getenv("OMP_WAIT_POLICY")) return NULL;
    size_t n = 0;
    while (environ[n]) n++;
    char **env = malloc((n + 2) * sizeof *env);
    if (!env) return NULL;
    memcpy(env, environ, n * sizeof *env);
    env[n] = "OMP_WAIT_POLICY=PASSIVE";
    env[n + 1] = NULL;
    return env;
}

/* Starts the worker with its stdout/stderr on logfd (-1: the daemon's); *report receives the
 * read end of its report pipe (or -1). room_known: the placement saw the driver's free memory
 * hold the plan (--room-known). */
static pid_t spawn_worker(const char *db, int64_t id, const char *device, int threads, long long mem_limit,
                          int cpu, int room_known, int logfd, int *report) {
    char idbuf[32], thbuf[32], membuf[32];
    char **env = worker_env(cpu);
    int pfd[2] = { -1, -1 };
    *report = -1;
    if (pipe2(pfd, O_CLOEXEC)) pfd[0] = pfd[1] = -1;
    snprintf(idbuf, sizeof idbuf, "%lld", (long long)id);
    snprintf(thbuf, sizeof thbuf, "%d", threads);
    snprintf(membuf, sizeof membuf, "%lld", mem_limit > 0 ? mem_limit : 0);
    char *args[16] = { "trainq", "worker", "--db", (char *)db, "--job", idbuf, "--device", (char *)device,
                       "--threads", thbuf, "--mem-limit", membuf };
    int na = 12;
    if (room_known) args[na++] = "--room-known";
    if (pfd[1] >= 0) { args[na++] = "--report-fd"; args[na++] = "3"; }
    args[na] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) {   /* the daemon (or -1) */
        free(env);
        if (pfd[1] >= 0) close(pfd[1]);
        if (pid > 0) *report = pfd[0];
        else if (pfd[0] >= 0) close(pfd[0]);
        return pid;
    }
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
    prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a kill -9 of the daemon takes its workers along */
    if (getppid() != parent) _exit(127);
    if (logfd >= 0) { dup2(logfd, 1); dup2(logfd, 2); }
    if (pfd[1] >= 0) {   /* the report pipe becomes fd 3 (dup2 clears close-on-exec) */
        if (pfd[1] == 3) fcntl(3, F_SETFD, 0);
        else if (dup2(pfd[1], 3) != 3) _exit(127);
        closefrom(4);
    } else {
        closefrom(3);
    }
    execve("/proc/self/exe", args, env ? env : environ);
    _exit(TQ_WORKER_EXEC_FAILED);
}

/* ---- the supervisor -------------------------------------------------------------------- */

#define MAX_WORKERS (TQ_LEDGER_MAX_DEVICES * TQ_LEDGER_MAX_JOBS)

typedef struct {
    pid_t pid;
    int64_t job;
    int dev;                 /* index into sup.devs */
    long long bytes;         /* its planned peak there */
    int threads;
    int report;              /* read end of its report pipe, -1 none: {"state":"ready"} once its
                              * device holds the job, its outcome when the database took no
                              * writes (TQ_WORKER_UNRECORDED) or why its device was busy */
    char *rb;                /* what has been read from it so far (malloc'd; NULL none) */
    size_t rbn;
    int ready;               /* it said "ready" */
    char log[1200];          /* jobs/<id>/log: its stdout and stderr */
    char owner[64];          /* its owner ("" unknown): max_running_per_user counts these */
} worker_t;

/* What a worker's end means for its job row, kept until the database takes the write: a full
 * or read-only disk must not turn a finished job into a ghost (running, no worker). */
typedef struct {
    int64_t job;
    int requeue;             /* 1: back to the queue (an interruption); 2: back to the queue, its
                              * device found busy (msg says why); 0: finish */
    char state[16], code[32];
    char device[16];         /* requeue 2: the busy device */
    char *summary, *msg;     /* malloc'd; NULL none */
    double next_ms, delay_ms;
    char why[400];           /* the storage problem, for waiting_for */
} outcome_t;

/* A device a worker found busy: it could not open it (another process took it since the
 * placement). Nothing is placed there during a pause (sched.h, TQ_WAIT_BUSY); after it, one job
 * (the probe) tries it, and nothing else goes there until that job's worker says the device
 * holds it ("ready": the device works, the streak is over) or ends (busy again: a longer
 * pause). */
typedef struct {
    double until_ms;         /* paused until then (tq_busy_pause_ms after the streak-th report) */
    double last_ms;          /* the last busy report; a streak older than BUSY_FORGET_MS is over */
    int streak;              /* busy reports in a row, 0: not busy */
    char why[240];           /* the last worker's words */
    int64_t probe;           /* the job trying it after the pause (0 none) */
} busy_t;
#define BUSY_FORGET_MS (10 * 60 * 1000.0)

/* a streak with no busy report for BUSY_FORGET_MS is over */
static void busy_forget(busy_t *b, double now) {
    if (now - b->last_ms > BUSY_FORGET_MS) b->streak = 0;
}

/* a job busy devices turned away, in a row (TQ_BUSY_MAX_TRIES fails it); forgotten on any
 * other end of its worker, and once it is neither queued nor running (turned_prune) */
typedef struct {
    int64_t job;
    int tries;
    double first_ms;
} turned_t;
#define MAX_TURNED 64

typedef struct {
    tq_store *st;
    const char *db;
    const char *jobs_dir;    /* <state dir>/jobs */
    placement_cfg pc;
    tq_ledger_dev devs[TQ_LEDGER_MAX_DEVICES];   /* static part: id, budget, max_jobs, cores… */
    char pci[TQ_LEDGER_MAX_DEVICES][32];
    int ndev;
    worker_t w[MAX_WORKERS];
    int nw;
    tq_ledger *ledger;
    int nvml;                /* GPU memory can be re-read */
    outcome_t *pend;         /* outcomes waiting for the database */
    int npend, cappend;
    busy_t busy[TQ_LEDGER_MAX_DEVICES];
    turned_t turned[MAX_TURNED];     /* jobs a busy device turned away, in a row */
    int nturned;
    double reconciled_ms, logs_ms;
} supervisor;

/* ---- each job's log ------------------------------------------------------------------------
 * A worker's stdout and stderr go to jobs/<id>/log (opened O_APPEND by the supervisor, so every
 * attempt adds to it, each starting with a header line). The supervisor keeps it under
 * LOG_CAP: past it, the file is copied to log.1 (replacing the previous one) and truncated
 * (logrotate's copytruncate: the worker keeps writing to the same file; a line written between
 * the copy and the truncation is lost). */
#define LOG_CAP (1 << 20)
#define LOG_CHECK_MS 1000

static int open_log(const supervisor *s, int64_t id, char *path, size_t n) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/%lld", s->jobs_dir, (long long)id);
    if (mkdir(dir, 0755) && errno != EEXIST) return -1;
    snprintf(path, n, "%s/log", dir);
    return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static void rotate_log(const char *path) {
    struct stat sb;
    if (stat(path, &sb) || sb.st_size <= LOG_CAP) return;
    char old[1210];
    snprintf(old, sizeof old, "%s.1", path);
    int in = open(path, O_RDONLY | O_CLOEXEC), out = open(old, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (in >= 0 && out >= 0) {
        char buf[65536];
        ssize_t k;
        while ((k = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, (size_t)k) != k) break;
        if (truncate(path, 0)) {}
    }
    if (in >= 0) close(in);
    if (out >= 0) close(out);
}

static void outcome_free(outcome_t *o) { free(o->summary); free(o->msg); }

static int storage_fault(tq_store *st) {
    tq_store_fault_kind f = tq_store_fault(st);
    return f == TQ_STORE_FAULT_BUSY || f == TQ_STORE_FAULT_FULL || f == TQ_STORE_FAULT_READONLY ||
           f == TQ_STORE_FAULT_IO;
}

/* Writes o; 0 done (or moot: the job is no longer running), -1 the database cannot take it
 * now (o->why says why; retry). */
static int outcome_apply(supervisor *s, outcome_t *o) {
    int rc = o->requeue == 2 ? tq_queue_requeue_busy(s->st, o->job, o->device, o->msg)
             : o->requeue ? tq_queue_requeue(s->st, o->job)
             : tq_queue_finish(s->st, o->job, o->state, o->summary, o->code[0] ? o->code : NULL, o->msg);
    if (rc == 0) {
        if (o->requeue) {   /* back in the queue, or cancelled when a cancel was pending */
            tq_job j;
            int cancelled = 0;
            if (tq_queue_get(s->st, o->job, &j) == 1) {
                cancelled = !strcmp(j.state, "cancelled");
                tq_job_free(&j);
            }
            fprintf(stderr, "trainq serve: job %lld: %s%s%s\n", (long long)o->job,
                    cancelled ? "cancelled (asked for while it ran)" : "back in the queue",
                    o->requeue == 2 ? ", its device busy: " : "", o->requeue == 2 && o->msg ? o->msg : "");
        }
        else fprintf(stderr, "trainq serve: job %lld %s%s%s\n", (long long)o->job, o->state,
                     o->code[0] ? ": " : "", o->code[0] ? o->msg ? o->msg : o->code : "");
        return 0;
    }
    if (rc == TQ_STORE_ECONFLICT || rc == TQ_STORE_ENOJOB) return 0;   /* cancelled, deleted meanwhile */
    if (!storage_fault(s->st)) {
        fprintf(stderr, "trainq serve: job %lld: recording its end: %s\n", (long long)o->job, tq_store_errmsg(s->st));
        return 0;
    }
    snprintf(o->why, sizeof o->why, "the database %.120s cannot take the job's end: %.160s", tq_store_path(s->st),
             tq_store_errmsg(s->st));
    return -1;
}

/* Applies o now, or keeps it for later (the device is free either way). */
static void outcome_settle(supervisor *s, outcome_t *o) {
    if (outcome_apply(s, o) == 0) { outcome_free(o); return; }
    fprintf(stderr, "trainq serve: job %lld: its end cannot be recorded yet (%s); retrying until the database "
                    "takes writes\n", (long long)o->job, o->why);
    if (s->npend == s->cappend) {
        int nc = s->cappend ? s->cappend * 2 : 8;
        outcome_t *np = realloc(s->pend, (size_t)nc * sizeof *np);
        if (!np) { outcome_free(o); return; }   /* the restart's recovery requeues it */
        s->pend = np; s->cappend = nc;
    }
    o->delay_ms = 250;
    o->next_ms = mono_ms() + o->delay_ms;
    s->pend[s->npend++] = *o;
}

/* Retries the pending outcomes whose time has come (back-off 250 ms doubling to 5 s); returns
 * how many were recorded. */
static int outcomes_retry(supervisor *s) {
    int done = 0;
    double now = mono_ms();
    for (int i = 0; i < s->npend;) {
        outcome_t *o = &s->pend[i];
        if (o->next_ms > now) { i++; continue; }
        if (outcome_apply(s, o) == 0) {
            outcome_free(o);
            s->pend[i] = s->pend[--s->npend];
            done++;
            continue;
        }
        o->delay_ms = o->delay_ms * 2 > 5000 ? 5000 : o->delay_ms * 2;
        o->next_ms = now + o->delay_ms;
        i++;
    }
    return done;
}

static int pending_for(const supervisor *s, int64_t job) {
    for (int i = 0; i < s->npend; i++) if (s->pend[i].job == job) return 1;
    return 0;
}

/* Reads what the worker's report pipe holds now into w->rb (all of it, to its end, when `all`:
 * the worker has exited), and notes its "ready" line. */
#define REPORT_CAP (1 << 17)
static void pull_report(worker_t *w, int all) {
    while (w->report >= 0 && w->rbn < REPORT_CAP) {
        struct pollfd p = { w->report, POLLIN, 0 };
        if (!all && poll(&p, 1, 0) <= 0) break;
        char buf[4096];
        ssize_t k = read(w->report, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        char *nb = realloc(w->rb, w->rbn + (size_t)k + 1);
        if (!nb) break;
        memcpy(nb + w->rbn, buf, (size_t)k);
        w->rb = nb;
        w->rbn += (size_t)k;
        w->rb[w->rbn] = 0;
    }
    if (!w->ready && w->rb && strstr(w->rb, "{\"state\":\"ready\"}\n")) w->ready = 1;
}

/* The worker's last report line, when it sent one (TQ_WORKER_UNRECORDED, TQ_WORKER_DEVICE_BUSY):
 * its outcome, or why its device was busy. 1 read. */
static int read_report(worker_t *w, outcome_t *o) {
    pull_report(w, 1);
    if (!w->rb) return 0;
    while (w->rbn && (w->rb[w->rbn - 1] == '\n' || w->rb[w->rbn - 1] == 0)) w->rb[--w->rbn] = 0;
    char *last = strrchr(w->rb, '\n');
    cJSON *r = cJSON_Parse(last ? last + 1 : w->rb);
    if (!r) return 0;
    const char *state = cJSON_GetStringValue(cJSON_GetObjectItem(r, "state"));
    const char *sum = cJSON_GetStringValue(cJSON_GetObjectItem(r, "summary"));
    const char *code = cJSON_GetStringValue(cJSON_GetObjectItem(r, "error_code"));
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(r, "error_message"));
    int ok = state && (!strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled") ||
                       !strcmp(state, "device_busy"));   /* not an end: why a busy device turned it away */
    if (ok) {
        snprintf(o->state, sizeof o->state, "%s", state);
        snprintf(o->code, sizeof o->code, "%s", code ? code : "");
        o->summary = sum && sum[0] ? strdup(sum) : NULL;
        o->msg = msg && msg[0] ? strdup(msg) : NULL;
    }
    cJSON_Delete(r);
    return ok;
}

/* o: the job failed with code and msg (its summary says so too) */
static void outcome_failed(outcome_t *o, tq_error_code code, const char *msg) {
    cJSON *sum = cJSON_CreateObject();
    cJSON_AddStringToObject(sum, "state", "failed");
    cJSON *e = cJSON_AddObjectToObject(sum, "error");
    cJSON_AddStringToObject(e, "code", tq_error_name(code));
    cJSON_AddStringToObject(e, "message", msg);
    o->summary = cJSON_PrintUnformatted(sum);
    cJSON_Delete(sum);
    snprintf(o->state, sizeof o->state, "failed");
    snprintf(o->code, sizeof o->code, "%s", tq_error_name(code));
    o->msg = strdup(msg);
}

static turned_t *turned_of(supervisor *s, int64_t job) {
    for (int i = 0; i < s->nturned; i++) if (s->turned[i].job == job) return &s->turned[i];
    if (s->nturned == MAX_TURNED) {   /* full: the oldest streak goes */
        int old = 0;
        for (int i = 1; i < s->nturned; i++) if (s->turned[i].first_ms < s->turned[old].first_ms) old = i;
        s->turned[old] = s->turned[--s->nturned];
    }
    turned_t *t = &s->turned[s->nturned++];
    *t = (turned_t){ job, 0, mono_ms() };
    return t;
}

static void turned_forget(supervisor *s, int64_t job) {
    for (int i = 0; i < s->nturned; i++)
        if (s->turned[i].job == job) { s->turned[i] = s->turned[--s->nturned]; return; }
}

/* tq_busy_pause_ms, or TQ_TEST_BUSY_PAUSE_MS for every pause (the tests' way to reach the
 * give-up in seconds) */
static int busy_pause_ms(int streak) {
    const char *e = getenv("TQ_TEST_BUSY_PAUSE_MS");
    return e && e[0] ? atoi(e) : tq_busy_pause_ms(streak);
}

/* The worker of job `id` found device `dev` busy (TQ_WORKER_DEVICE_BUSY; its words on the
 * report pipe): the device pauses (tq_busy_pause_ms, longer with each report in a row) and
 * the job goes back to the queue without the start counting — or fails as device_unavailable
 * once busy devices have turned it away TQ_BUSY_MAX_TRIES times in a row. */
static void device_busy(supervisor *s, worker_t *w, int stopping) {
    const int64_t id = w->job;
    const int dev = w->dev;
    outcome_t o, r;
    memset(&o, 0, sizeof o);
    memset(&r, 0, sizeof r);
    o.job = id;
    const char *devid = dev >= 0 && dev < s->ndev ? s->devs[dev].id : "its device";
    char why[300];
    if (read_report(w, &r) && !strcmp(r.state, "device_busy") && r.msg)
        snprintf(why, sizeof why, "%s", r.msg);
    else
        snprintf(why, sizeof why, "the worker found %s busy", devid);
    outcome_free(&r);
    double now = mono_ms();
    if (dev >= 0 && dev < s->ndev && !stopping) {
        busy_t *b = &s->busy[dev];
        busy_forget(b, now);
        b->streak++;
        b->last_ms = now;
        b->until_ms = now + busy_pause_ms(b->streak);
        snprintf(b->why, sizeof b->why, "job %lld found it busy: %.200s", (long long)id, why);
        fprintf(stderr, "trainq serve: %s: busy (job %lld: %s): nothing is placed there for %.3g s\n", devid,
                (long long)id, why, (b->until_ms - now) / 1000.0);
    }
    turned_t *t = turned_of(s, id);
    /* a cancel asked for meanwhile: the requeue ends it cancelled; a stopping daemon: a start
     * cut short, not counted */
    if (stopping) t->tries--;
    if (++t->tries >= TQ_BUSY_MAX_TRIES && tq_queue_cancel_requested(s->st, id) != 1) {
        char msg[600];
        snprintf(msg, sizeof msg, "a busy device turned the job away %d times in a row, over %.0f s (another process "
                 "holds it; POST /v1/jobs/%lld/requeue runs the job again); the last time: %.300s", t->tries,
                 (now - t->first_ms) / 1000.0, (long long)id, why);
        turned_forget(s, id);
        outcome_failed(&o, TQ_ERR_DEVICE_UNAVAILABLE, msg);
        outcome_settle(s, &o);
        return;
    }
    o.requeue = 2;
    o.msg = strdup(why);
    snprintf(o.device, sizeof o.device, "%s", devid);
    outcome_settle(s, &o);
}

/* After worker w ended with wait status ws. */
static void finalise(supervisor *s, worker_t *w, int ws, int stopping) {
    const int64_t id = w->job;
    const int dev = w->dev;
    outcome_t o;
    memset(&o, 0, sizeof o);
    o.job = id;
    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    if (code != TQ_WORKER_DEVICE_BUSY) turned_forget(s, id);   /* it got past opening its device, or never will */
    if (dev >= 0 && dev < s->ndev && s->busy[dev].probe == id) {   /* the device's probe ended */
        s->busy[dev].probe = 0;
        pull_report(w, 1);
        if (w->ready) s->busy[dev].streak = 0;   /* it held the job there: not busy now */
    }
    if (code == TQ_WORKER_UNRECORDED && read_report(w, &o)) {
        outcome_settle(s, &o);
        return;
    }
    tq_job j;
    int rc = tq_queue_get(s->st, id, &j);
    if (rc != 1) {
        if (rc < 0) fprintf(stderr, "trainq serve: job %lld: %s\n", (long long)id, tq_store_errmsg(s->st));
        return;   /* deleted meanwhile, or the database is gone (the reconciliation requeues it) */
    }
    int running = !strcmp(j.state, "running");
    tq_job_free(&j);
    if (!running) {
        fprintf(stderr, "trainq serve: job %lld: worker exited %d\n", (long long)id, code);
        return;
    }
    if (code == TQ_WORKER_DEVICE_BUSY) {
        device_busy(s, w, stopping);
        return;
    }
    if (code == TQ_WORKER_REQUEUE || stopping) {
        o.requeue = 1;
        outcome_settle(s, &o);
        return;
    }
    char msg[600];
    tq_worker_end_words(ws, msg, sizeof msg);   /* the status or signal in words (daemon.h) */
    size_t ml = strlen(msg);
    if (!WIFSIGNALED(ws)) ml += (size_t)snprintf(msg + ml, sizeof msg - ml, ", without finishing the job");
    if (ml >= sizeof msg) ml = sizeof msg - 1;
    snprintf(msg + ml, sizeof msg - ml, "; its output is in the job's log (GET /v1/jobs/%lld/log)", (long long)id);
    outcome_failed(&o, TQ_ERR_WORKER_CRASHED, msg);
    outcome_settle(s, &o);
}

/* A job the database shows running with no worker of ours and no outcome pending (its requeue
 * or end could not be written, or the write was lost): an interruption, requeued now rather
 * than at the next restart. Every RECONCILE_MS. */
#define RECONCILE_MS 3000
static void reconcile(supervisor *s) {
    tq_job *jobs;
    int n;
    int64_t next;
    if (tq_queue_list(s->st, "running", 0, 1000, &jobs, &n, &next)) return;
    for (int i = 0; i < n; i++) {
        int64_t id = jobs[i].id;
        int ours = pending_for(s, id);
        for (int k = 0; k < s->nw && !ours; k++) ours = s->w[k].job == id;
        if (ours) continue;
        fprintf(stderr, "trainq serve: job %lld: running without a worker: requeued\n", (long long)id);
        outcome_t o;
        memset(&o, 0, sizeof o);
        o.job = id;
        o.requeue = 1;
        outcome_settle(s, &o);
    }
    tq_jobs_free(jobs, n);
}

/* Each busy device's probe (the one job trying it after its pause): once its worker says the
 * device holds the job's engine and data ("ready" on its report pipe), the device works and its
 * streak is over. */
static void busy_probes(supervisor *s) {
    for (int d = 0; d < s->ndev; d++) {
        busy_t *b = &s->busy[d];
        if (!b->probe) continue;
        for (int i = 0; i < s->nw; i++) {
            if (s->w[i].job != b->probe) continue;   /* none: its end has cleared it already */
            pull_report(&s->w[i], 0);
            if (!s->w[i].ready) break;
            fprintf(stderr, "trainq serve: %s: job %lld runs there: no longer busy\n", s->devs[d].id,
                    (long long)b->probe);
            b->probe = 0;
            b->streak = 0;
            break;
        }
    }
}

/* devs[d].busy: why nothing is placed on d now ("" when something may be) */
static void busy_words(supervisor *s, int d) {
    const busy_t *b = &s->busy[d];
    char out[sizeof s->devs[d].busy] = "";
    if (!b->streak) {}
    else if (b->probe) snprintf(out, sizeof out, "%.220s; job %lld is trying it again", b->why, (long long)b->probe);
    else if (mono_ms() < b->until_ms)
        snprintf(out, sizeof out, "%.220s; nothing is placed there for %.0f s more", b->why,
                 (b->until_ms - mono_ms()) / 1000.0 + 0.5);
    /* else its pause is over: the next job placed there tries it */
    memcpy(s->devs[d].busy, out, sizeof out);
}

/* Forgets the busy streaks of jobs that are neither queued (q) nor running here: cancelled,
 * deleted, failed, or given up on. */
static void turned_prune(supervisor *s, const tq_queued *q, int nq) {
    for (int i = 0; i < s->nturned;) {
        int64_t id = s->turned[i].job;
        int live = pending_for(s, id);
        for (int k = 0; k < nq && !live; k++) live = q[k].id == id;
        for (int k = 0; k < s->nw && !live; k++) live = s->w[k].job == id;
        if (live) i++;
        else s->turned[i] = s->turned[--s->nturned];
    }
}

static void refresh_gpus(supervisor *s) {
    for (int d = 0; d < s->ndev; d++) {
        tq_ledger_dev *v = &s->devs[d];
        v->driver_used = v->driver_free = v->driver_room = -1;
        if (!v->gpu || !s->nvml) continue;
        pid_t pids[MAX_WORKERS];
        int np = 0;
        for (int i = 0; i < s->nw; i++) if (s->w[i].dev == d) pids[np++] = s->w[i].pid;
        long long total, used, fr, ours;
        if (tq_gpumem_read(s->pci[d], &total, &used, &fr, pids, np, &ours)) continue;
        v->driver_used = used;
        v->driver_free = fr;   /* as nvidia-smi says it (GET /v1/devices) */
        /* placement's room: less what our running jobs may still take, their plans less what
         * they hold now (all of their plans when NVML cannot say per process) */
        long long planned = 0;
        for (int i = 0; i < s->nw; i++) if (s->w[i].dev == d) planned += s->w[i].bytes;
        long long pending = ours >= 0 ? planned - ours : planned;
        v->driver_room = pending > 0 ? (fr > pending ? fr - pending : 0) : fr;
    }
}

/* the ledger's view: the static devices with the running workers filled in */
static void ledger_view(const supervisor *s, tq_ledger_dev *out) {
    for (int d = 0; d < s->ndev; d++) {
        out[d] = s->devs[d];
        out[d].planned = 0;
        out[d].njobs = 0;
    }
    for (int i = 0; i < s->nw; i++) {
        tq_ledger_dev *v = &out[s->w[i].dev];
        if (v->njobs < TQ_LEDGER_MAX_JOBS)
            v->jobs[v->njobs] = (tq_ledger_job){ s->w[i].job, s->w[i].bytes, s->w[i].threads };
        v->njobs++;
        v->planned += s->w[i].bytes;
    }
}

/* "running 3 jobs (cpu: 4,5; cuda:0: 7), 2 queued" or "idle, 0 queued" */
static void status_text(const supervisor *s, char *out, size_t n) {
    int64_t c[TQ_STATE_COUNT];
    if (tq_queue_counts(s->st, c)) { snprintf(out, n, "database error: %s", tq_store_errmsg(s->st)); return; }
    char buf[1024];
    size_t k = 0;
    if (!s->nw) k = (size_t)snprintf(buf, sizeof buf, "idle");
    else {
        k = (size_t)snprintf(buf, sizeof buf, "running %d job%s (", s->nw, s->nw == 1 ? "" : "s");
        const char *sep = "";
        for (int d = 0; d < s->ndev && k < sizeof buf; d++) {
            const char *dsep = ": ";
            for (int i = 0; i < s->nw && k < sizeof buf; i++) {
                if (s->w[i].dev != d) continue;
                if (*dsep == ':') k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", sep, s->devs[d].id);
                k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%lld", dsep, (long long)s->w[i].job);
                dsep = ",";
                sep = "; ";
            }
        }
        if (k < sizeof buf) k += (size_t)snprintf(buf + k, sizeof buf - k, ")");
    }
    snprintf(out, n, "%.400s, %lld queued", buf, (long long)c[TQ_STATE_QUEUED]);
}

/* One placement round: read the queue, place what fits, start those workers, fail the jobs
 * that can never start here, publish the ledger. Returns the number of workers started. */
static int place_round(supervisor *s) {
    tq_queued *q = NULL;
    int nq = 0;
    /* jobs that run after one that failed, was cancelled or deleted: the queue fails them as
     * that happens; this catches what it could not (a database edited by hand, an older daemon) */
    int blocked = 0;
    if (tq_queue_fail_blocked(s->st, &blocked))
        fprintf(stderr, "trainq serve: failing jobs whose dependency failed: %s\n", tq_store_errmsg(s->st));
    else if (blocked)
        fprintf(stderr, "trainq serve: %d job%s failed: a job they run after failed\n", blocked, blocked == 1 ? "" : "s");
    if (tq_queue_queued_fair(s->st, 1000, (int64_t)(s->pc.fair_window_s * 1000), &q, &nq)) {
        fprintf(stderr, "trainq serve: reading the queue: %s\n", tq_store_errmsg(s->st));
        return -1;
    }
    refresh_gpus(s);
    busy_probes(s);
    turned_prune(s, q, nq);
    tq_sched_dev sd[TQ_LEDGER_MAX_DEVICES];
    tq_ledger_dev view[TQ_LEDGER_MAX_DEVICES];
    ledger_view(s, view);
    for (int d = 0; d < s->ndev; d++) {
        memset(&sd[d], 0, sizeof sd[d]);
        memcpy(sd[d].id, view[d].id, sizeof sd[d].id);
        sd[d].budget = view[d].budget;
        sd[d].planned = view[d].planned;
        sd[d].driver_free = view[d].gpu ? view[d].driver_room : -1;
        sd[d].njobs = view[d].njobs;
        sd[d].max_jobs = view[d].max_jobs;
        sd[d].cores = view[d].cores;
        busy_t *b = &s->busy[d];
        if (!b->probe) busy_forget(b, mono_ms());   /* a probe out: its end decides */
        sd[d].busy = b->streak > 0 && (mono_ms() < b->until_ms || b->probe);
        sd[d].probe = b->streak > 0 && !sd[d].busy;   /* one job may try it */
        busy_words(s, d);
    }
    tq_sched_job *jobs = nq ? calloc((size_t)nq, sizeof *jobs) : NULL;
    tq_sched_out *out = nq ? calloc((size_t)nq, sizeof *out) : NULL;
    tq_ledger_wait *waits = nq ? calloc((size_t)nq, sizeof *waits) : NULL;
    int started = 0, nwait = 0;
    if (nq && (!jobs || !out || !waits)) { nq = 0; fprintf(stderr, "trainq serve: placement: out of memory\n"); }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double now_s = now.tv_sec + now.tv_nsec / 1e9;
    long long cpu_budget = 0, gpu_budget = 0;
    for (int d = 0; d < s->ndev; d++) {
        if (!view[d].gpu) cpu_budget = view[d].budget;
        else if (view[d].budget > gpu_budget) gpu_budget = view[d].budget;
    }
    for (int i = 0; i < nq; i++) {
        jobs[i].id = q[i].id;
        if (tq_devsel_parse(q[i].device, &jobs[i].want)) jobs[i].want.kind = TQ_DEV_AUTO;
        /* a job from before placement's columns: its plan is unknown, so it takes a whole
         * device (its budget: placed only where nothing runs) */
        jobs[i].need_cpu = q[i].cpu_bytes >= 0 ? q[i].cpu_bytes : cpu_budget;
        jobs[i].need_gpu = q[i].gpu_bytes >= 0 ? q[i].gpu_bytes : gpu_budget;
        jobs[i].waited_s = now_s - q[i].eligible_at / 1000.0;   /* since it may run */
        jobs[i].threads = q[i].threads;
        jobs[i].deps_pending = q[i].ndeps;
    }
    /* owners: an index per distinct owner of a queued job, with their running jobs */
    int *running = nq > 0 ? calloc((size_t)nq, sizeof *running) : NULL;
    const char **owners = nq > 0 ? calloc((size_t)nq, sizeof *owners) : NULL;
    int nown = 0;
    for (int i = 0; i < nq && running && owners; i++) {
        jobs[i].user = -1;
        if (!q[i].owner[0]) continue;
        int u = -1;
        for (int k = 0; k < nown; k++) if (!strcmp(owners[k], q[i].owner)) u = k;
        if (u < 0) {
            u = nown++;
            owners[u] = q[i].owner;
            for (int k = 0; k < s->nw; k++) running[u] += !strcmp(s->w[k].owner, q[i].owner);
        }
        jobs[i].user = u;
    }
    tq_sched_policy pol = { .backfill_window_s = s->pc.backfill_s, .max_per_user = running ? s->pc.max_per_user : 0,
                            .user_running = running };
    if (nq) tq_sched_place(sd, s->ndev, jobs, nq, &pol, out);
    free(running);
    free(owners);
    for (int i = 0; i < nq; i++) {
        tq_sched_out *o = &out[i];
        int64_t id = q[i].id;
        if (o->wait == TQ_WAIT_NONE) {
            const char *dev = s->devs[o->dev].id;
            int gpu = s->devs[o->dev].gpu;
            int rc = tq_queue_claim_job(s->st, id, dev, gpu ? 0 : o->threads);
            if (rc < 0) { fprintf(stderr, "trainq serve: job %lld: claim: %s\n", (long long)id, tq_store_errmsg(s->st)); continue; }
            if (rc == 0) continue;   /* cancelled or deleted meanwhile */
            long long known = gpu ? q[i].gpu_bytes : q[i].cpu_bytes;
            /* the allocator's limit: its plan on that device, less the CUDA context (not an
             * allocation) on a GPU; none for a job whose plan is unknown */
            long long limit = known < 0 ? 0 : gpu ? known - TQ_GPU_CONTEXT_BYTES : known;
            int report = -1;
            char logpath[1200] = "";
            int logfd = open_log(s, id, logpath, sizeof logpath);
            if (logfd < 0) fprintf(stderr, "trainq serve: job %lld: cannot open its log %s: %s\n", (long long)id, logpath, strerror(errno));
            else {
                char head[256], when[32];
                time_t t = time(NULL);
                struct tm tm;
                strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
                int hn = snprintf(head, sizeof head, "---- trainq serve: job %lld starts on %s at %s\n", (long long)id, dev, when);
                if (write(logfd, head, (size_t)hn) != hn) {}
            }
            pid_t pid = spawn_worker(s->db, id, dev, gpu ? 0 : o->threads, limit, !gpu,
                                     gpu && view[o->dev].driver_room >= 0, logfd, &report);
            if (logfd >= 0) close(logfd);
            if (pid < 0) {
                char msg[160];
                snprintf(msg, sizeof msg, "cannot start the worker: %s", strerror(errno));
                fprintf(stderr, "trainq serve: job %lld: %s\n", (long long)id, msg);
                tq_queue_finish(s->st, id, "failed", NULL, tq_error_name(TQ_ERR_WORKER_CRASHED), msg);
                continue;
            }
            s->w[s->nw] = (worker_t){ .pid = pid, .job = id, .dev = o->dev, .bytes = o->needs,
                                      .threads = gpu ? 0 : o->threads, .report = report };
            snprintf(s->w[s->nw].owner, sizeof s->w[s->nw].owner, "%s", q[i].owner);
            snprintf(s->w[s->nw].log, sizeof s->w[s->nw].log, "%s", logpath);
            s->nw++;
            started++;
            if (s->busy[o->dev].streak > 0 && !s->busy[o->dev].probe) {
                s->busy[o->dev].probe = id;   /* the one job trying the device after its pause */
                busy_words(s, o->dev);        /* the jobs behind it wait for it */
            }
            fprintf(stderr, "trainq serve: job %lld: started worker %d on %s (plans %.1f MiB of %.1f MiB room%s)\n",
                    (long long)id, (int)pid, dev, o->needs / 1048576.0, o->free / 1048576.0,
                    gpu ? "" : (o->threads == 1 ? ", 1 thread" : ", threads shared"));
            if (s->nw >= MAX_WORKERS) break;
            continue;
        }
        if (o->wait == TQ_WAIT_NEVER || o->wait == TQ_WAIT_NO_DEVICE) {
            char msg[400];
            const char *code = tq_error_name(o->wait == TQ_WAIT_NEVER ? TQ_ERR_CANNOT_FIT : TQ_ERR_DEVICE_UNAVAILABLE);
            if (o->wait == TQ_WAIT_NEVER)
                snprintf(msg, sizeof msg, "its planned peak, %lld bytes (%.1f MiB), is more than the memory budget "
                         "of %s, %lld bytes (%.1f MiB), the largest of the devices it may use", o->needs,
                         o->needs / 1048576.0, s->devs[o->dev].id, o->free, o->free / 1048576.0);
            else
                snprintf(msg, sizeof msg, "it asks for device \"%s\", which this daemon does not serve (--devices)",
                         q[i].device);
            if (tq_queue_fail_queued(s->st, id, code, msg) == 1)
                fprintf(stderr, "trainq serve: job %lld failed: %s: %s\n", (long long)id, code, msg);
            continue;
        }
        tq_ledger_wait *w = &waits[nwait++];
        w->id = id;
        snprintf(w->reason, sizeof w->reason, "%s", tq_wait_name(o->wait));
        if (o->dev >= 0) snprintf(w->device, sizeof w->device, "%s", s->devs[o->dev].id);
        w->needs = o->needs;
        w->free = o->free;
        w->behind = o->behind;
        if (o->wait == TQ_WAIT_BUSY)   /* why, and for how long when it is a pause */
            snprintf(w->message, sizeof w->message, "%s", s->devs[o->dev].busy);
        if (o->wait == TQ_WAIT_DEPENDENCY) {
            w->nafter = q[i].ndeps < 16 ? q[i].ndeps : 16;
            memcpy(w->after, q[i].deps, (size_t)w->nafter * sizeof w->after[0]);
        }
    }
    /* jobs whose end waits for the database: "running", finishing, and why */
    if (s->npend > 0) {
        tq_ledger_wait *more = realloc(waits, (size_t)(nwait + s->npend) * sizeof *more);
        if (more) {
            waits = more;
            for (int i = 0; i < s->npend; i++) {
                tq_ledger_wait *w = &waits[nwait++];
                memset(w, 0, sizeof *w);
                w->id = s->pend[i].job;
                snprintf(w->reason, sizeof w->reason, "storage");
                snprintf(w->message, sizeof w->message, "%.299s", s->pend[i].why);
            }
        }
    }
    ledger_view(s, view);
    tq_ledger_publish(s->ledger, view, s->ndev, waits, nwait);
    free(q); free(jobs); free(out); free(waits);
    return started;
}

/* Reaps every worker that has ended; returns how many. */
static int reap(supervisor *s, int stopping) {
    int n = 0;
    for (;;) {
        int ws = 0;
        pid_t r = waitpid(-1, &ws, WNOHANG);
        if (r <= 0) break;
        for (int i = 0; i < s->nw; i++) {
            if (s->w[i].pid != r) continue;
            finalise(s, &s->w[i], ws, stopping);
            if (s->w[i].report >= 0) close(s->w[i].report);
            free(s->w[i].rb);
            s->w[i] = s->w[--s->nw];
            n++;
            break;
        }
    }
    return n;
}

int tq_cmd_serve(int argc, char **argv) {
    serve_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.db, sizeof cfg.db, "var/trainq.db");
    snprintf(cfg.listen, sizeof cfg.listen, "127.0.0.1:8470");
    snprintf(cfg.devices, sizeof cfg.devices, "auto");
    int set[K_COUNT] = {0};
    int rc0 = tq_opts_check(&tq_doc_serve, argc, argv);
    if (rc0 >= 0) return rc0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int key = -1;
        for (int k = 0; k < K_COUNT; k++) if (!strcmp(a, serve_opts[k].flag)) key = k;
        if (key >= 0 && v) {
            size_t n;
            char *f = cfg_field(&cfg, key, &n);
            if (strlen(v) >= n) { fprintf(stderr, "trainq serve: %s: value too long\n", a); return 2; }
            snprintf(f, n, "%s", v);
            set[key] = 1;
            i++;
        }
        else if (!strcmp(a, "--config") && v) { snprintf(cfg.config, sizeof cfg.config, "%s", v); i++; }
        else { fprintf(stderr, "trainq serve: unknown or incomplete option %s (trainq serve --help)\n", a); return 2; }
    }
    if (cfg.config[0] && read_config(&cfg, set)) return 2;
    char host[256];
    unsigned short port;
    if (parse_listen(cfg.listen, host, sizeof host, &port)) {
        fprintf(stderr, "trainq serve: --listen wants HOST:PORT, got \"%s\"\n", cfg.listen);
        return 2;
    }
    placement_cfg pc;
    if (check_placement(&cfg, &pc)) return 2;
    {   /* the list's syntax before anything starts (which GPUs exist is known after the probe) */
        char ids[TQ_LEDGER_MAX_DEVICES][TQ_DEV_ID_MAX], e[200];
        const char *any[16] = { "cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:4", "cuda:5", "cuda:6", "cuda:7",
                                "cuda:8", "cuda:9", "cuda:10", "cuda:11", "cuda:12", "cuda:13", "cuda:14", "cuda:15" };
        if (tq_devices_resolve(cfg.devices, any, 16, ids, TQ_LEDGER_MAX_DEVICES, e, sizeof e) < 0) {
            fprintf(stderr, "trainq serve: %s\n", e);
            return 2;
        }
    }
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
    if (!ngpus) fprintf(stderr, "trainq serve: no GPU: %s\n", cuda_why);

    /* the devices this daemon serves, and their budgets */
    supervisor sup;
    memset(&sup, 0, sizeof sup);
    sup.st = st;
    sup.db = cfg.db;
    sup.jobs_dir = jobs_dir;
    sup.pc = pc;
    {
        char gid[16][TQ_DEV_ID_MAX];
        const char *gp[16];
        for (int i = 0; i < ngpus; i++) { snprintf(gid[i], TQ_DEV_ID_MAX, "cuda:%d", gpus[i].ordinal); gp[i] = gid[i]; }
        char ids[TQ_LEDGER_MAX_DEVICES][TQ_DEV_ID_MAX];
        int n = tq_devices_resolve(cfg.devices, gp, ngpus, ids, TQ_LEDGER_MAX_DEVICES, err, sizeof err);
        if (n < 0) {
            fprintf(stderr, "trainq serve: %s%s%s\n", err, ngpus ? "" : "; no GPU: ", ngpus ? "" : cuda_why);
            tq_store_close(st); close(lock_fd);
            return 2;
        }
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        for (int d = 0; d < n; d++) {
            tq_ledger_dev *v = &sup.devs[d];
            snprintf(v->id, sizeof v->id, "%s", ids[d]);
            v->gpu = tq_dev_is_gpu(ids[d]);
            v->driver_used = v->driver_free = v->driver_room = -1;
            if (v->gpu) {
                const tq_api_gpu *g = NULL;
                for (int i = 0; i < ngpus; i++) if (!strcmp(gid[i], ids[d])) g = &gpus[i];
                v->total_bytes = g ? g->total_bytes : 0;
                v->reserve_bytes = pc.reserve_bytes;
                v->budget = v->total_bytes - pc.reserve_bytes;
                /* each job is a worker process: a GPU in an exclusive compute mode takes one */
                v->max_jobs = tq_compute_mode_max_jobs(g ? g->compute_mode : -1, pc.max_jobs_gpu);
                if (g && v->max_jobs < pc.max_jobs_gpu)
                    fprintf(stderr, "trainq serve: %s is in compute mode %s (nvidia-smi -c): one job at a time on it\n",
                            v->id, tq_compute_mode_name(g->compute_mode));
                if (g) snprintf(sup.pci[d], sizeof sup.pci[d], "%s", g->pci_bus_id);
                if (v->budget <= 0) {
                    fprintf(stderr, "trainq serve: --gpu-reserve-mb %lld leaves no memory for jobs on %s (%.1f GiB in all)\n",
                            pc.reserve_bytes >> 20, v->id, v->total_bytes / 1073741824.0);
                    tq_store_close(st); close(lock_fd);
                    return 2;
                }
            } else {
                v->total_bytes = (long long)pages * psz;
                long long avail = tq_host_mem_available();
                v->budget = pc.cpu_bytes > 0 ? pc.cpu_bytes : avail > 0 ? avail / 2 : v->total_bytes / 2;
                v->max_jobs = pc.max_jobs_cpu;
                v->cores = cores > 0 ? (int)cores : 1;
            }
            fprintf(stderr, "trainq serve: %s: a budget of %.1f MiB for jobs, up to %d at once%s\n", v->id,
                    v->budget / 1048576.0, v->max_jobs, v->gpu ? "" : " (they share the cores)");
        }
        sup.ndev = n;
    }
    if (ngpus) {
        char why[200];
        sup.nvml = tq_gpumem_init(why, sizeof why) == 0;
        if (!sup.nvml) fprintf(stderr, "trainq serve: %s: placement counts the budgets only, not other processes' use of the GPUs\n", why);
    }
    sup.ledger = tq_ledger_new(sup.devs, sup.ndev);
    if (!sup.ledger) { fprintf(stderr, "trainq serve: out of memory\n"); tq_store_close(st); close(lock_fd); return 1; }

    /* signals before any thread exists: the API's threads inherit the mask/handlers */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;   /* no SA_RESTART: sleeps return early */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* the unix socket: --socket, else trainq.sock beside the database ("none": no socket) */
    char sock[1100];
    if (cfg.socket[0]) snprintf(sock, sizeof sock, "%s", cfg.socket);
    else snprintf(sock, sizeof sock, "%s/trainq.sock", dir);
    int no_sock = !strcmp(sock, "none");
    if (!cfg.socket[0] && strlen(sock) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        fprintf(stderr, "trainq serve: no unix socket: the default path %s is longer than a socket path may be "
                        "(give --socket PATH)\n", sock);
        no_sock = 1;
    }
    if (!is_loopback_host(host))
        fprintf(stderr, "trainq serve: warning: listening on %s, beyond loopback: connections from other hosts "
                        "have no identity and are %s\n", host,
                pc.remote_writes ? "allowed to write (allow_remote_writes = true)" : "read-only");
    tq_api_config ac = { host, port, cfg.db, jobs_dir, cfg.devices, gpus, ngpus, cuda_why,
                         cfg.allowed_hosts[0] ? cfg.allowed_hosts : NULL, cfg.threads, 0, sup.ledger,
                         cfg.admin_group[0] ? cfg.admin_group : NULL, pc.private_jobs, pc.remote_writes,
                         no_sock ? NULL : sock, pc.fair_window_s, pc.header_timeout_s };
    tq_api *api = tq_api_start(&ac, err, sizeof err);
    if (!api) {
        fprintf(stderr, "trainq serve: %s\n", err);
        tq_ledger_free(sup.ledger);
        tq_store_close(st); close(lock_fd);
        return 1;
    }
    fprintf(stderr, "trainq serve: listening on http://%s%s%s:%u%s%s (database %s)\n", strchr(host, ':') ? "[" : "",
            host, strchr(host, ':') ? "]" : "", port, no_sock ? "" : " and on the unix socket ", no_sock ? "" : sock,
            cfg.db);
    tq_sd_notify("READY=1");

    long long wd_usec = tq_sd_watchdog_usec();
    double wd_every = wd_usec > 0 ? wd_usec / 2000.0 : 0, wd_last = mono_ms(), status_last = 0, placed_last = 0;
    char status[512] = "", status_new[512];
    int dirty = 1;
    while (!g_stop) {
        double now = mono_ms();
        if (wd_every > 0 && now - wd_last >= wd_every) { tq_sd_notify("WATCHDOG=1"); wd_last = now; }
        if (reap(&sup, 0)) dirty = 1;
        if (sup.npend && outcomes_retry(&sup)) dirty = 1;
        if (now - sup.logs_ms >= LOG_CHECK_MS) {
            for (int i = 0; i < sup.nw; i++) if (sup.w[i].log[0]) rotate_log(sup.w[i].log);
            sup.logs_ms = now;
        }
        if (now - sup.reconciled_ms >= RECONCILE_MS) {
            reconcile(&sup);
            sup.reconciled_ms = mono_ms();
        }
        /* a round when something changed, else every 200 ms (new submissions, cancels) */
        if (dirty || now - placed_last >= 200) {
            int r = place_round(&sup);
            placed_last = mono_ms();
            if (r != 0) status_last = 0;
            dirty = 0;
            if (r < 0) { sleep_ms(1000); continue; }
        }
        if (now - status_last >= 1000) {
            status_last = now;
            status_text(&sup, status_new, sizeof status_new);
            if (strcmp(status, status_new)) {
                snprintf(status, sizeof status, "%s", status_new);
                char msg[600];
                snprintf(msg, sizeof msg, "STATUS=%s", status);
                tq_sd_notify(msg);
            }
        }
        sleep_ms(50);
    }

    fprintf(stderr, "trainq serve: %s: stopping\n", g_stop == SIGINT ? "SIGINT" : "SIGTERM");
    tq_sd_notify("STOPPING=1");
    tq_api_stop(api);
    if (sup.nw) {
        char msg[120];
        snprintf(msg, sizeof msg, "STATUS=stopping: %d running job%s checkpoint and go back to the queue", sup.nw,
                 sup.nw == 1 ? "" : "s");
        tq_sd_notify(msg);
        for (int i = 0; i < sup.nw; i++) kill(sup.w[i].pid, SIGTERM);
        while (sup.nw > 0) {
            int ws = 0;
            pid_t r = waitpid(-1, &ws, 0);
            if (r < 0) {
                if (errno == EINTR) continue;
                break;   /* ECHILD: none left */
            }
            for (int i = 0; i < sup.nw; i++)
                if (sup.w[i].pid == r) {
                    finalise(&sup, &sup.w[i], ws, 1);
                    if (sup.w[i].report >= 0) close(sup.w[i].report);
                    free(sup.w[i].rb);
                    sup.w[i] = sup.w[--sup.nw];
                    break;
                }
        }
    }
    /* ends that could not be recorded yet: a last few tries (the restart's recovery requeues
     * what is still left 'running', and a job that had finished resumes at its last step) */
    for (double until = mono_ms() + 10000; sup.npend > 0 && mono_ms() < until; sleep_ms(250)) outcomes_retry(&sup);
    for (int i = 0; i < sup.npend; i++) {
        fprintf(stderr, "trainq serve: job %lld: its end is still not recorded (%s): the next start requeues it\n",
                (long long)sup.pend[i].job, sup.pend[i].why);
        outcome_free(&sup.pend[i]);
    }
    free(sup.pend);
    tq_gpumem_shutdown();
    tq_ledger_free(sup.ledger);
    tq_store_close(st);
    close(lock_fd);
    fprintf(stderr, "trainq serve: stopped\n");
    return 0;
}
