/* test_sched.c — daemon/sched.c and train/device.c without processes: fit, no fit, several
 * devices, the GPU reserve and driver-free bytes, max jobs, backfill and its window, jobs that
 * can never fit, the CPU core split, jobs waiting for their dependencies, busy devices; and the device resolver's parsing and --devices sets. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "daemon/sched.h"
#include "train/device.h"

#define MB (1LL << 20)

static tq_sched_dev dev(const char *id, long long budget, long long planned, int njobs, int max_jobs) {
    tq_sched_dev d;
    memset(&d, 0, sizeof d);
    strcpy(d.id, id);
    d.budget = budget;
    d.planned = planned;
    d.driver_free = -1;
    d.njobs = njobs;
    d.max_jobs = max_jobs;
    d.cores = strcmp(id, "cpu") ? 0 : 8;
    return d;
}

static tq_sched_job job(int64_t id, const char *want, long long need, double waited) {
    tq_sched_job j;
    memset(&j, 0, sizeof j);
    j.id = id;
    assert_int_equal(tq_devsel_parse(want, &j.want), 0);
    j.need_cpu = need;
    j.need_gpu = need + 100 * MB;   /* a GPU adds its context and workspace bound */
    j.waited_s = waited;
    j.user = -1;
    return j;
}

static const tq_sched_policy POL = { .backfill_window_s = 600 };

static void test_fit_and_no_fit(void **st) {
    (void)st;
    tq_sched_dev d[1] = { dev("cpu", 100 * MB, 0, 0, 2) };
    tq_sched_job q[3] = { job(1, "cpu", 40 * MB, 0), job(2, "auto", 50 * MB, 0), job(3, "cpu", 10 * MB, 0) };
    tq_sched_out o[3];
    assert_int_equal(tq_sched_place(d, 1, q, 3, &POL, o), 2);
    assert_int_equal(o[0].wait, TQ_WAIT_NONE);
    assert_int_equal(o[0].dev, 0);
    assert_int_equal(o[1].wait, TQ_WAIT_NONE);
    assert_int_equal(o[2].wait, TQ_WAIT_SLOTS);         /* room for 10 MB left, but 2 jobs run */
    assert_int_equal(d[0].planned, 90 * MB);
    assert_int_equal(d[0].njobs, 2);
    /* two cores each: 8 cores split as the jobs start (4 for the first alone, then 4) */
    assert_int_equal(o[0].threads, 8);
    assert_int_equal(o[1].threads, 4);

    /* the third job when one ends: fits in the 60 MB left */
    tq_sched_dev d2[1] = { dev("cpu", 100 * MB, 40 * MB, 1, 2) };
    tq_sched_job q2[1] = { job(3, "cpu", 60 * MB, 0) };
    assert_int_equal(tq_sched_place(d2, 1, q2, 1, &POL, o), 1);
    /* 61 MB does not */
    tq_sched_dev d3[1] = { dev("cpu", 100 * MB, 40 * MB, 1, 2) };
    q2[0].need_cpu = 61 * MB;
    assert_int_equal(tq_sched_place(d3, 1, q2, 1, &POL, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_MEMORY);
    assert_int_equal(o[0].dev, 0);
    assert_int_equal(o[0].needs, 61 * MB);
    assert_int_equal(o[0].free, 60 * MB);
}

static void test_spec_threads_kept(void **st) {
    (void)st;
    tq_sched_dev d[1] = { dev("cpu", 100 * MB, 0, 1, 4) };
    tq_sched_job q[2] = { job(1, "cpu", 1 * MB, 0), job(2, "cpu", 1 * MB, 0) };
    q[1].threads = 3;
    tq_sched_out o[2];
    assert_int_equal(tq_sched_place(d, 1, q, 2, &POL, o), 2);
    assert_int_equal(o[0].threads, 4);                  /* 8 cores / 2 running */
    assert_int_equal(o[1].threads, 3);                  /* the spec says */
}

static void test_several_devices_spread_and_prefer_gpu(void **st) {
    (void)st;
    tq_sched_dev d[3] = { dev("cuda:0", 1000 * MB, 0, 0, 4), dev("cuda:1", 1000 * MB, 0, 0, 4),
                          dev("cpu", 1000 * MB, 0, 0, 1) };
    tq_sched_job q[5] = { job(1, "auto", 100 * MB, 0), job(2, "auto", 100 * MB, 0), job(3, "cuda:0", 100 * MB, 0),
                          job(4, "cpu", 100 * MB, 0), job(5, "cpu", 100 * MB, 0) };
    tq_sched_out o[5];
    assert_int_equal(tq_sched_place(d, 3, q, 5, &POL, o), 4);
    assert_int_equal(o[0].dev, 0);            /* a GPU, not the CPU */
    assert_int_equal(o[1].dev, 1);            /* spread: the other GPU */
    assert_int_equal(o[2].dev, 0);            /* it named cuda:0 */
    assert_int_equal(o[3].dev, 2);
    assert_int_equal(o[4].wait, TQ_WAIT_SLOTS);   /* the CPU runs one job by default */
    assert_int_equal(d[0].planned, 400 * MB);     /* GPU needs include the context */
    assert_int_equal(o[2].threads, 0);
    assert_int_equal(o[3].threads, 5);        /* 8 cores less one for each of the 3 GPU jobs */
    /* GPU jobs already running keep their cores too, and a CPU job always gets one */
    tq_sched_dev c[2] = { dev("cuda:0", 1000 * MB, 200 * MB, 2, 4), dev("cpu", 1000 * MB, 0, 0, 2) };
    c[1].cores = 2;
    tq_sched_job cq[1] = { job(6, "cpu", 10 * MB, 0) };
    assert_int_equal(tq_sched_place(c, 2, cq, 1, &POL, o), 1);
    assert_int_equal(o[0].threads, 1);

    /* auto goes to the CPU when no GPU has room; "cuda" waits for one */
    tq_sched_dev e[2] = { dev("cuda:0", 250 * MB, 0, 0, 4), dev("cpu", 1000 * MB, 0, 0, 1) };
    tq_sched_job r[2] = { job(1, "cuda", 100 * MB, 0), job(2, "auto", 100 * MB, 0) };
    assert_int_equal(tq_sched_place(e, 2, r, 2, &POL, o), 2);
    assert_int_equal(o[0].dev, 0);
    assert_int_equal(o[1].dev, 1);
    tq_sched_dev f[1] = { dev("cpu", 1000 * MB, 0, 0, 1) };
    tq_sched_job s[1] = { job(1, "cuda", 1 * MB, 0) };
    assert_int_equal(tq_sched_place(f, 1, s, 1, &POL, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_NO_DEVICE);
}

static void test_reserve_and_driver_free(void **st) {
    (void)st;
    /* a GPU of 8 GiB with a 1 GiB reserve: the budget is 7 GiB; another process holds 3 GiB
     * so the driver reports 4 GiB free: a 5 GiB plan waits though the budget has room */
    tq_sched_dev d[1] = { dev("cuda:0", 7 * 1024 * MB, 0, 0, 4) };
    d[0].driver_free = 4 * 1024 * MB;
    tq_sched_job q[2] = { job(1, "cuda", 5 * 1024 * MB, 0), job(2, "cuda", 3 * 1024 * MB, 0) };
    tq_sched_out o[2];
    assert_int_equal(tq_sched_place(d, 1, q, 2, &POL, o), 1);
    assert_int_equal(o[0].wait, TQ_WAIT_MEMORY);
    assert_int_equal(o[0].free, 4 * 1024 * MB);
    assert_int_equal(o[1].wait, TQ_WAIT_NONE);      /* backfill: the smaller one starts */
    assert_int_equal(d[0].driver_free, 4 * 1024 * MB - (3 * 1024 + 100) * MB);
}

static void test_backfill_window(void **st) {
    (void)st;
    /* a big job that has waited 5 s, window 10 s: smaller jobs behind it start */
    tq_sched_policy pol = { .backfill_window_s = 10 };
    tq_sched_dev d[1] = { dev("cpu", 100 * MB, 60 * MB, 1, 3) };
    tq_sched_job q[3] = { job(1, "cpu", 80 * MB, 5), job(2, "cpu", 20 * MB, 1), job(3, "cpu", 10 * MB, 0) };
    tq_sched_out o[3];
    assert_int_equal(tq_sched_place(d, 1, q, 3, &pol, o), 2);
    assert_int_equal(o[0].wait, TQ_WAIT_MEMORY);
    assert_int_equal(o[1].wait, TQ_WAIT_NONE);
    assert_int_equal(o[2].wait, TQ_WAIT_NONE);
    /* past the window: the device is held for it; nothing behind it is placed there */
    tq_sched_dev e[1] = { dev("cpu", 100 * MB, 60 * MB, 1, 3) };
    q[0].waited_s = 11;
    assert_int_equal(tq_sched_place(e, 1, q, 3, &pol, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_MEMORY);
    assert_int_equal(o[1].wait, TQ_WAIT_PRIORITY);
    assert_int_equal(o[1].behind, 1);
    assert_int_equal(o[2].wait, TQ_WAIT_PRIORITY);
    assert_int_equal(e[0].held_by, 0);
    /* and it starts once there is room, before the small ones */
    tq_sched_dev f[1] = { dev("cpu", 100 * MB, 0, 0, 3) };
    assert_int_equal(tq_sched_place(f, 1, q, 3, &pol, o), 2);
    assert_int_equal(o[0].wait, TQ_WAIT_NONE);
    assert_int_equal(o[1].wait, TQ_WAIT_NONE);      /* 80 + 20 = the budget exactly */
    assert_int_equal(o[2].wait, TQ_WAIT_MEMORY);
    /* a held device does not stop placements on another device */
    tq_sched_dev g[2] = { dev("cuda:0", 300 * MB, 250 * MB, 1, 4), dev("cpu", 100 * MB, 0, 0, 1) };
    tq_sched_job r[2] = { job(1, "cuda", 50 * MB, 100), job(2, "auto", 10 * MB, 0) };
    assert_int_equal(tq_sched_place(g, 2, r, 2, &pol, o), 1);
    assert_int_equal(g[0].held_by, 0);
    assert_int_equal(o[1].dev, 1);
    /* a negative window never holds */
    tq_sched_policy never = { .backfill_window_s = -1 };
    tq_sched_dev h[1] = { dev("cpu", 100 * MB, 60 * MB, 1, 3) };
    assert_int_equal(tq_sched_place(h, 1, q, 3, &never, o), 2);
}

static void test_never_fits(void **st) {
    (void)st;
    tq_sched_dev d[2] = { dev("cuda:0", 100 * MB, 0, 0, 4), dev("cpu", 200 * MB, 0, 0, 1) };
    tq_sched_job q[2] = { job(1, "auto", 300 * MB, 0), job(2, "cuda:0", 150 * MB, 0) };
    tq_sched_out o[2];
    assert_int_equal(tq_sched_place(d, 2, q, 2, &POL, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_NEVER);
    assert_int_equal(o[0].dev, 1);                  /* the largest budget */
    assert_int_equal(o[0].free, 200 * MB);
    assert_int_equal(o[1].wait, TQ_WAIT_NEVER);     /* 150 + 100 (GPU) > 100 */
}

/* A job waiting for its dependencies ("after") is not placed and holds nothing: the jobs behind
 * it run, even once it has waited past the backfill window; one too big for every device is
 * still refused at once. */
static void test_dependency_wait(void **st) {
    (void)st;
    tq_sched_dev d[1] = { dev("cpu", 100 * MB, 0, 0, 2) };
    tq_sched_job q[3] = { job(1, "cpu", 10 * MB, 3600), job(2, "cpu", 90 * MB, 0), job(3, "cpu", 10 * MB, 0) };
    q[0].deps_pending = 1;
    tq_sched_out o[3];
    assert_int_equal(tq_sched_place(d, 1, q, 3, &POL, o), 2);
    assert_int_equal(o[0].wait, TQ_WAIT_DEPENDENCY);
    assert_int_equal(o[0].dev, -1);
    assert_string_equal(tq_wait_name(o[0].wait), "dependency");
    assert_int_equal(o[1].wait, TQ_WAIT_NONE);
    assert_int_equal(o[2].wait, TQ_WAIT_NONE);
    assert_int_equal(d[0].held_by, -1);
    assert_int_equal(d[0].planned, 100 * MB);

    /* a big job behind it, past the window, holds the device for itself, not for the waiting one */
    tq_sched_dev d2[1] = { dev("cpu", 100 * MB, 50 * MB, 1, 4) };
    tq_sched_job q2[3] = { job(1, "cpu", 10 * MB, 3600), job(2, "cpu", 80 * MB, 3600), job(3, "cpu", 10 * MB, 0) };
    q2[0].deps_pending = 2;
    assert_int_equal(tq_sched_place(d2, 1, q2, 3, &POL, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_DEPENDENCY);
    assert_int_equal(o[1].wait, TQ_WAIT_MEMORY);
    assert_int_equal(o[2].wait, TQ_WAIT_PRIORITY);
    assert_int_equal(o[2].behind, 2);

    /* never fits: refused whatever it waits for */
    tq_sched_dev d3[1] = { dev("cpu", 100 * MB, 0, 0, 2) };
    tq_sched_job q3[1] = { job(1, "cpu", 101 * MB, 0) };
    q3[0].deps_pending = 1;
    assert_int_equal(tq_sched_place(d3, 1, q3, 1, &POL, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_NEVER);
    assert_int_equal(o[0].needs, 101 * MB);
    assert_int_equal(o[0].free, 100 * MB);
}

/* A GPU's compute mode bounds the jobs placed on it at once: each job is its own worker
 * process, and in an exclusive mode a second process's cudaSetDevice fails (a job would fail
 * as device_unavailable); in prohibited mode no process can use it. The names round-trip
 * through `trainq devices`' JSON. */
static void test_compute_mode_policy(void **st) {
    (void)st;
    assert_int_equal(tq_compute_mode_max_jobs(TQ_CM_DEFAULT, 4), 4);
    assert_int_equal(tq_compute_mode_max_jobs(-1, 4), 4);   /* unknown: as configured */
    assert_int_equal(tq_compute_mode_max_jobs(TQ_CM_EXCLUSIVE_PROCESS, 4), 1);
    assert_int_equal(tq_compute_mode_max_jobs(TQ_CM_EXCLUSIVE_THREAD, 4), 1);
    assert_int_equal(tq_compute_mode_max_jobs(TQ_CM_EXCLUSIVE_PROCESS, 1), 1);
    assert_int_equal(tq_compute_mode_max_jobs(TQ_CM_PROHIBITED, 4), 0);
    for (int m = 0; m < 4; m++) assert_int_equal(tq_compute_mode_parse(tq_compute_mode_name(m)), m);
    assert_string_equal(tq_compute_mode_name(TQ_CM_EXCLUSIVE_PROCESS), "exclusive_process");
    assert_string_equal(tq_compute_mode_name(-1), "unknown");
    assert_int_equal(tq_compute_mode_parse("unknown"), -1);
    assert_int_equal(tq_compute_mode_parse(NULL), -1);
}

/* A device found busy (a worker's open failed: another process took it since the placement; or
 * an exclusive-mode GPU another process holds) takes nothing while it is: a job that fits only
 * there waits with TQ_WAIT_BUSY, one that may go elsewhere does, and jobs behind are not held
 * up. The pauses grow with each busy report in a row, to a minute, and give up after a few
 * minutes in all. */
static void test_busy_device(void **st) {
    (void)st;
    tq_sched_dev d[3] = { dev("cuda:0", 1000 * MB, 0, 0, 4), dev("cuda:1", 1000 * MB, 0, 0, 4),
                          dev("cpu", 1000 * MB, 0, 0, 2) };
    d[0].busy = 1;
    tq_sched_job q[4] = { job(1, "cuda:0", 100 * MB, 0), job(2, "cuda", 100 * MB, 0), job(3, "auto", 100 * MB, 0),
                          job(4, "cuda:0", 100 * MB, 9999) };   /* 4: past the backfill window */
    tq_sched_out o[4];
    assert_int_equal(tq_sched_place(d, 3, q, 4, &POL, o), 2);
    assert_int_equal(o[0].wait, TQ_WAIT_BUSY);
    assert_int_equal(o[0].dev, 0);
    assert_int_equal(o[0].needs, 200 * MB);
    assert_string_equal(tq_wait_name(o[0].wait), "device_busy");
    assert_int_equal(o[1].wait, TQ_WAIT_NONE);      /* any GPU: the free one */
    assert_int_equal(o[1].dev, 1);
    assert_int_equal(o[2].wait, TQ_WAIT_NONE);      /* auto: the free GPU still beats the CPU */
    assert_int_equal(o[2].dev, 1);
    assert_int_equal(o[3].wait, TQ_WAIT_BUSY);
    assert_int_equal(d[0].held_by, -1);             /* a busy device is held for no one */
    assert_int_equal(d[0].njobs, 0);
    /* the busy device was only one of those it fits: memory wins as the reason elsewhere */
    tq_sched_dev e[1] = { dev("cuda:0", 1000 * MB, 950 * MB, 1, 4) };
    e[0].busy = 1;
    tq_sched_job q2[1] = { job(5, "cuda:0", 100 * MB, 0) };
    assert_int_equal(tq_sched_place(e, 1, q2, 1, &POL, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_MEMORY);
    /* its pause over, it is on probe: one job tries it, the others wait as for a busy device */
    d[0] = dev("cuda:0", 1000 * MB, 0, 0, 4);
    d[0].probe = 1;
    tq_sched_job q3[3] = { job(6, "cuda:0", 100 * MB, 0), job(7, "cuda:0", 100 * MB, 0), job(8, "cuda:0", 100 * MB, 0) };
    assert_int_equal(tq_sched_place(d, 1, q3, 3, &POL, o), 1);
    assert_int_equal(o[0].wait, TQ_WAIT_NONE);
    assert_int_equal(o[1].wait, TQ_WAIT_BUSY);
    assert_int_equal(o[2].wait, TQ_WAIT_BUSY);
    assert_int_equal(d[0].njobs, 1);
    /* not busy: they all go there */
    d[0] = dev("cuda:0", 1000 * MB, 0, 0, 4);
    assert_int_equal(tq_sched_place(d, 1, q3, 3, &POL, o), 3);
    /* a job waiting on a busy device past the backfill window holds the device it suits best
     * when that one is not busy: here the larger GPU, full now */
    tq_sched_dev g[2] = { dev("cuda:0", 1000 * MB, 0, 0, 4), dev("cuda:1", 2000 * MB, 1700 * MB, 1, 4) };
    g[0].busy = 1;
    tq_sched_job q4[2] = { job(9, "cuda", 300 * MB, 9999), job(10, "cuda:1", 10 * MB, 0) };
    assert_int_equal(tq_sched_place(g, 2, q4, 2, &POL, o), 0);
    assert_int_equal(o[0].wait, TQ_WAIT_BUSY);
    assert_int_equal(o[0].dev, 0);
    assert_int_equal(g[1].held_by, 0);
    assert_int_equal(o[1].wait, TQ_WAIT_PRIORITY);   /* it would fit in cuda:1's 300 MB, but that is held */
    assert_int_equal(o[1].behind, 9);

    /* the pauses: 3 s, 10 s, 30 s, then a minute; TQ_BUSY_MAX_TRIES tries take minutes, not
     * hours, and more than the old in-worker retries' 43 s */
    assert_int_equal(tq_busy_pause_ms(0), 0);
    assert_int_equal(tq_busy_pause_ms(1), 3000);
    assert_int_equal(tq_busy_pause_ms(2), 10000);
    assert_int_equal(tq_busy_pause_ms(3), 30000);
    assert_int_equal(tq_busy_pause_ms(4), 60000);
    assert_int_equal(tq_busy_pause_ms(100), 60000);
    long total = 0;
    for (int k = 1; k < TQ_BUSY_MAX_TRIES; k++) total += tq_busy_pause_ms(k);
    assert_true(total > 43000 && total <= 10 * 60000);
}

static void test_device_resolver(void **st) {
    (void)st;
    tq_devsel d;
    assert_int_equal(tq_devsel_parse("auto", &d), 0);
    assert_int_equal(d.kind, TQ_DEV_AUTO);
    assert_int_equal(tq_devsel_parse("cuda:12", &d), 0);
    assert_int_equal(d.ordinal, 12);
    const char *bad[] = { "", "gpu", "cuda:", "cuda:-1", "cuda:256", "cuda:01", "cuda:1x", "CPU", " cpu", "cuda:0,cpu" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(tq_devsel_parse(bad[i], &d), -1);
    tq_devsel_parse("cuda", &d);
    assert_true(tq_devsel_allows(&d, "cuda:3"));
    assert_false(tq_devsel_allows(&d, "cpu"));
    tq_devsel_parse("cpu", &d);
    assert_false(tq_devsel_allows(&d, "cuda:0"));
    tq_devsel_parse("cuda:1", &d);
    assert_false(tq_devsel_allows(&d, "cuda:0"));
    assert_true(tq_devsel_allows(&d, "cuda:1"));

    const char *gpus[] = { "cuda:0", "cuda:1" };
    char out[8][TQ_DEV_ID_MAX], err[200];
    assert_int_equal(tq_devices_resolve("auto", gpus, 2, out, 8, err, sizeof err), 3);
    assert_string_equal(out[0], "cuda:0");
    assert_string_equal(out[2], "cpu");
    assert_int_equal(tq_devices_resolve("auto", gpus, 0, out, 8, err, sizeof err), 1);
    assert_string_equal(out[0], "cpu");
    assert_int_equal(tq_devices_resolve("cpu,cuda:1", gpus, 2, out, 8, err, sizeof err), 2);
    assert_string_equal(out[0], "cuda:1");
    assert_string_equal(out[1], "cpu");
    assert_int_equal(tq_devices_resolve("cuda", gpus, 2, out, 8, err, sizeof err), 2);
    assert_int_equal(tq_devices_resolve("cpu,tpu", gpus, 2, out, 8, err, sizeof err), -1);
    assert_non_null(strstr(err, "\"tpu\""));
    assert_int_equal(tq_devices_resolve("cuda:2", gpus, 2, out, 8, err, sizeof err), -1);
    assert_non_null(strstr(err, "cuda:2"));
    assert_int_equal(tq_devices_resolve("cpu,cpu", gpus, 2, out, 8, err, sizeof err), -1);
    assert_non_null(strstr(err, "twice"));
    assert_int_equal(tq_devices_resolve("cuda", gpus, 0, out, 8, err, sizeof err), -1);
    assert_int_equal(tq_devices_resolve(",", gpus, 0, out, 8, err, sizeof err), -1);

    char devs[3][TQ_DEV_ID_MAX] = { "cuda:0", "cuda:1", "cpu" };
    int idx[3];
    tq_devsel_parse("auto", &d);
    assert_int_equal(tq_devsel_candidates(&d, devs, 3, idx), 3);
    assert_int_equal(idx[2], 2);
    tq_devsel_parse("cuda:1", &d);
    assert_int_equal(tq_devsel_candidates(&d, devs, 3, idx), 1);
    assert_int_equal(idx[0], 1);
}

/* max_running_per_user: an owner at the cap waits (user_limit) and holds nothing; the others'
 * jobs behind it start; placing counts against the owner within the same round */
static void test_per_user_cap(void **st) {
    (void)st;
    int running[2] = { 1, 0 };   /* user 0 runs one job already */
    tq_sched_policy pol = { .backfill_window_s = 0.001, .max_per_user = 1, .user_running = running };
    tq_sched_dev d[1] = { dev("cpu", 100 * MB, 10 * MB, 1, 4) };
    tq_sched_job q[4] = { job(1, "cpu", 10 * MB, 100), job(2, "cpu", 10 * MB, 50), job(3, "cpu", 10 * MB, 40),
                          job(4, "cpu", 10 * MB, 0) };
    q[0].user = 0; q[1].user = 1; q[2].user = 1; q[3].user = -1;
    tq_sched_out o[4];
    assert_int_equal(tq_sched_place(d, 1, q, 4, &pol, o), 2);
    assert_int_equal(o[0].wait, TQ_WAIT_USER);        /* waited long, but holds no device */
    assert_int_equal(d[0].held_by, -1);
    assert_int_equal(o[1].wait, TQ_WAIT_NONE);
    assert_int_equal(o[2].wait, TQ_WAIT_USER);        /* user 1 reached the cap in this round */
    assert_int_equal(o[3].wait, TQ_WAIT_NONE);        /* no owner: no cap */
    assert_int_equal(running[1], 1);
    assert_string_equal(tq_wait_name(TQ_WAIT_USER), "user_limit");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_user_cap),
        cmocka_unit_test(test_compute_mode_policy),
        cmocka_unit_test(test_busy_device),
        cmocka_unit_test(test_fit_and_no_fit),
        cmocka_unit_test(test_spec_threads_kept),
        cmocka_unit_test(test_several_devices_spread_and_prefer_gpu),
        cmocka_unit_test(test_reserve_and_driver_free),
        cmocka_unit_test(test_backfill_window),
        cmocka_unit_test(test_never_fits),
        cmocka_unit_test(test_dependency_wait),
        cmocka_unit_test(test_device_resolver),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
