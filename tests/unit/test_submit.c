/* test_submit.c — POST /v1/jobs on a daemon that serves a GPU and the CPU, without either
 * running anything: the API started in-process (api/api.h) over a fresh database and a ledger
 * that lists "cuda:0" and "cpu" (no GPU is touched: the API only plans), jobs submitted over
 * HTTP with libcurl, and what the queue stored read back. It checks how `recompute: "auto"`
 * is settled, and the plans placement reads on each kind of device:
 * - device "auto" (may run on either): "auto" is kept, the GPU's plan recomputes and the CPU's
 *   keeps every activation (the worker settles it by the device it is placed on);
 * - the CPU's plan without recomputation over the CPU budget, or over max_memory_mb: settled
 *   true, both plans recompute;
 * - device "cpu": false; device "cuda": true; true and false as given are kept. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/api.h"
#include "api/ledger.h"
#include "schema/queue.h"
#include "schema/store.h"
#include "train/spec.h"
#include "train/trainer.h"
#include "tmpdir.h"

#define MIB (1LL << 20)

typedef struct {
    char dir[512], db[600];
    tq_ledger *ledger;
    tq_api *api;
    unsigned short port;
} fixture;

static unsigned short free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static tq_ledger_dev device(const char *id, long long budget) {
    tq_ledger_dev d;
    memset(&d, 0, sizeof d);
    snprintf(d.id, sizeof d.id, "%s", id);
    d.gpu = !strncmp(id, "cuda", 4);
    d.budget = budget;
    d.total_bytes = budget * 2;
    d.driver_used = d.driver_free = -1;
    d.max_jobs = 2;
    d.cores = d.gpu ? 0 : 2;
    return d;
}

/* the ledger's budgets for the next submissions */
static void budgets(fixture *f, long long gpu, long long cpu) {
    tq_ledger_dev d[2] = { device("cuda:0", gpu), device("cpu", cpu) };
    tq_ledger_publish(f->ledger, d, 2, NULL, 0);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    char *dir = tq_tmpdir("tq-submit");
    assert_non_null(dir);
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    free(dir);
    snprintf(f->db, sizeof f->db, "%s/trainq.db", f->dir);
    char jobs[700], err[256];
    snprintf(jobs, sizeof jobs, "%s/jobs", f->dir);
    tq_store *st = tq_store_open(f->db, err, sizeof err);   /* creates the schema */
    assert_non_null(st);
    tq_store_close(st);
    tq_ledger_dev d[2] = { device("cuda:0", 8192 * MIB), device("cpu", 8192 * MIB) };
    f->ledger = tq_ledger_new(d, 2);
    assert_non_null(f->ledger);
    static const tq_api_gpu gpu = { 0, "a GPU the ledger lists (none is used)", "sm_90", 16384 * MIB, 16384 * MIB, "", 0 };
    for (int attempt = 0; attempt < 8 && !f->api; attempt++) {
        f->port = free_port();
        tq_api_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.host = "127.0.0.1";
        cfg.port = f->port;
        cfg.db_path = f->db;
        cfg.jobs_dir = jobs;
        cfg.devices = "cuda:0,cpu";
        cfg.gpus = &gpu;
        cfg.ngpus = 1;
        cfg.cuda = "available";
        cfg.threads = 2;
        cfg.ledger = f->ledger;
        cfg.fair_share_window_s = 86400;
        f->api = tq_api_start(&cfg, err, sizeof err);
    }
    assert_non_null(f->api);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tq_api_stop(f->api);
    tq_ledger_free(f->ledger);
    free(f);
    return 0;
}

typedef struct { char *buf; size_t len; } body;

static size_t collect(char *p, size_t size, size_t n, void *ud) {
    body *b = ud;
    char *nb = realloc(b->buf, b->len + size * n + 1);
    if (!nb) return 0;
    memcpy(nb + b->len, p, size * n);
    b->buf = nb;
    b->len += size * n;
    b->buf[b->len] = 0;
    return size * n;
}

/* POSTs spec; returns the HTTP status and, on 201, the job as the queue stored it */
static long submit(fixture *f, const char *spec, tq_job *job) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/jobs", f->port);
    CURL *c = curl_easy_init();
    assert_non_null(c);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    body b = { NULL, 0 };
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, spec);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (status != 201) {
        print_message("POST /v1/jobs answered %ld: %s\n", status, b.buf ? b.buf : "");
        free(b.buf);
        return status;
    }
    cJSON *j = cJSON_Parse(b.buf);
    assert_non_null(j);
    int64_t id = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "id"));
    cJSON_Delete(j);
    free(b.buf);
    char err[256];
    tq_store *st = tq_store_open(f->db, err, sizeof err);
    assert_non_null(st);
    assert_int_equal(tq_queue_get(st, id, job), 1);
    tq_store_close(st);
    return status;
}

/* the stored spec's recompute: "auto", "true" or "false" */
static const char *stored_recompute(const tq_job *j) {
    cJSON *s = cJSON_Parse(j->spec);
    assert_non_null(s);
    const cJSON *r = cJSON_GetObjectItem(s, "recompute");
    const char *v = cJSON_IsString(r) && !strcmp(r->valuestring, "auto") ? "auto"
                  : cJSON_IsTrue(r) ? "true" : cJSON_IsFalse(r) ? "false" : "?";
    cJSON_Delete(s);
    return v;
}

/* the planner's training bytes plus the dataset's for spec with recompute set */
static long long planned(const char *spec, int recompute) {
    tq_spec sp;
    tq_spec_err se;
    assert_int_equal(tq_spec_parse(&sp, spec, &se), 0);
    sp.recompute = recompute;
    tq_plan_report rep;
    char code[32], err[256];
    assert_int_equal(tq_plan_spec(&sp, &rep, code, sizeof code, err, sizeof err), 0);
    return (long long)rep.plan.total + (long long)rep.plan.data;
}

#define SPEC(extra) "{\"model\":\"resnet20\",\"dataset\":\"synthetic\",\"batch_size\":16,\"steps\":2," \
                    "\"synthetic\":{\"train\":64,\"test\":16}" extra "}"
#define GPU_EXTRA (TQ_GPU_CONTEXT_BYTES + TQ_GPU_WORKSPACE_BOUND)

/* submits spec (201) and checks what the queue stored: recompute as `want`, the CPU's plan,
 * the GPU's (with its context and workspace) */
static void expect(fixture *f, const char *spec, const char *want, long long cpu, long long gpu) {
    tq_job j;
    assert_int_equal(submit(f, spec, &j), 201);
    assert_string_equal(stored_recompute(&j), want);
    assert_int_equal(j.planned_cpu_bytes, cpu);
    assert_int_equal(j.planned_gpu_bytes, gpu + GPU_EXTRA);
    tq_job_free(&j);
}

static void test_auto_on_both_kinds_keeps_two_plans(void **state) {
    fixture *f = *state;
    const char *spec = SPEC("");
    long long on = planned(spec, 1), off = planned(spec, 0);
    assert_true(on < off);   /* resnet20 recomputes the first ReLU of each block */
    expect(f, spec, "auto", off, on);
}

static void test_cpu_plan_over_the_cpu_budget_recomputes_everywhere(void **state) {
    fixture *f = *state;
    const char *spec = SPEC(",\"device\":\"auto\"");
    long long on = planned(spec, 1), off = planned(spec, 0);
    budgets(f, 8192 * MIB, (on + off) / 2);   /* the CPU holds the recomputing plan only */
    expect(f, spec, "true", on, on);
    budgets(f, 8192 * MIB, off);              /* exactly the plan that keeps everything */
    expect(f, spec, "auto", off, on);
}

static void test_cpu_plan_over_max_memory_recomputes_everywhere(void **state) {
    fixture *f = *state;
    const char *bare = SPEC("");
    long long cap_mb = (planned(bare, 0) - 1) / MIB;   /* under the plan that keeps everything … */
    char spec[400];
    snprintf(spec, sizeof spec, SPEC(",\"max_memory_mb\":%lld"), cap_mb);
    long long on = planned(spec, 1);
    if (cap_mb * MIB < on) skip();                     /* … and over the other: not at these sizes */
    expect(f, spec, "true", on, on);
}

static void test_one_kind_settles_at_submission(void **state) {
    fixture *f = *state;
    static const struct { const char *spec, *want; } c[] = {
        { SPEC(",\"device\":\"cpu\""), "false" },
        { SPEC(",\"device\":\"cuda\""), "true" },
        { SPEC(",\"device\":\"cuda:0\""), "true" },
        { SPEC(",\"device\":\"cpu\",\"recompute\":true"), "true" },
        { SPEC(",\"recompute\":false"), "false" },
        { SPEC(",\"recompute\":true"), "true" },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        long long p = planned(c[i].spec, !strcmp(c[i].want, "true"));
        expect(f, c[i].spec, c[i].want, p, p);
    }
}

/* the worker's rule for a job that kept "auto": the device it is placed on */
static void test_auto_follows_the_device_it_runs_on(void **state) {
    (void)state;
    tq_spec sp;
    tq_spec_err se;
    assert_int_equal(tq_spec_parse(&sp, SPEC(""), &se), 0);
    assert_int_equal(sp.recompute, TQ_RECOMPUTE_AUTO);
    strcpy(sp.device, "cpu");
    assert_int_equal(tq_spec_recompute(&sp), 0);
    strcpy(sp.device, "cuda:0");
    assert_int_equal(tq_spec_recompute(&sp), 1);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_auto_on_both_kinds_keeps_two_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cpu_plan_over_the_cpu_budget_recomputes_everywhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cpu_plan_over_max_memory_recomputes_everywhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_kind_settles_at_submission, setup, teardown),
        cmocka_unit_test(test_auto_follows_the_device_it_runs_on),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
