/* test_autobatch.c — the micro-batch picker (train/autobatch.c) on synthetic data: it takes
 * the largest candidate whose plan fits, agrees with planning every candidate one by one,
 * fails with cannot_fit naming both numbers, checks resolved and explicit specs as they are,
 * and passes planning errors through. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autobatch.h"

#define SYN "\"dataset\":\"synthetic\",\"synthetic\":{\"train\":64,\"test\":16,\"height\":16,\"width\":16," \
            "\"channels\":3},\"threads\":1,\"device\":\"cpu\",\"model\":\"resnet20\""

static tq_spec parse(const char *json) {
    tq_spec s;
    tq_spec_err e;
    int rc = tq_spec_parse(&s, json, &e);
    if (rc) print_error("%s: [%s] %s\n", json, e.field, e.message);
    assert_int_equal(rc, TQ_SPEC_OK);
    return s;
}

/* total + data of sp at micro-batch b, planned directly */
static long long need_at(const tq_spec *sp, int b) {
    tq_spec t = *sp;
    tq_spec_set_batch(&t, b);
    tq_plan_report rep;
    char code[32], err[256];
    assert_int_equal(tq_plan_spec(&t, &rep, code, sizeof code, err, sizeof err), 0);
    return (long long)(rep.plan.total + rep.plan.data);
}

typedef struct { int rc; tq_spec out; tq_plan_report rep; long long need; char code[32], err[512]; } result;

static result pick(const tq_spec *sp, long long cap, long long extra, const char *name) {
    result r;
    memset(&r, 0, sizeof r);
    r.rc = tq_autobatch_pick(sp, cap, extra, name, &r.out, &r.rep, &r.need, r.code, sizeof r.code,
                             r.err, sizeof r.err);
    return r;
}

static void test_largest_that_fits(void **state) {
    (void)state;
    tq_spec sp = parse("{" SYN ",\"batch_size\":\"auto\",\"effective_batch\":48}");
    int c[16];
    int n = tq_spec_batch_candidates(48, c, 16);
    assert_int_equal(n, 10);   /* 1 2 3 4 6 8 12 16 24 48 */
    long long need[16];
    for (int i = 0; i < n; i++) {
        need[i] = need_at(&sp, c[i]);
        if (i) assert_true(need[i] >= need[i - 1]);   /* what the binary search relies on */
    }
    /* every cap between two candidates' needs picks the smaller of them; extra counts */
    for (int i = 0; i < n; i++) {
        for (int extra = 0; extra <= 1; extra++) {
            long long x = extra ? 123456 : 0;
            result r = pick(&sp, need[i] + x, x, "a test cap");
            assert_int_equal(r.rc, 0);
            int want = i;
            while (want + 1 < n && need[want + 1] == need[i]) want++;
            assert_int_equal(r.out.batch_size, c[want]);
            assert_int_equal(r.out.accum_steps, 48 / c[want]);
            assert_int_equal(r.out.batch_auto, 1);
            assert_int_equal(r.out.effective_batch, 48);
            assert_int_equal(r.rep.batch_size, c[want]);
            assert_int_equal(r.need, need[want] + x);
            if (i + 1 < n && need[i + 1] > need[i]) {   /* one byte short of the next */
                r = pick(&sp, need[i + 1] - 1 + x, x, "a test cap");
                assert_int_equal(r.out.batch_size, c[want]);
            }
        }
    }
    /* no cap: the largest candidate */
    result r = pick(&sp, 0, 0, NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.out.batch_size, 48);
    assert_int_equal(r.out.accum_steps, 1);
    assert_int_equal(r.need, need[n - 1]);
    /* out may be the input */
    tq_spec same = sp;
    assert_int_equal(tq_autobatch_pick(&same, need[3], 0, "x", &same, &r.rep, &r.need, r.code,
                                       sizeof r.code, r.err, sizeof r.err), 0);
    assert_int_equal(same.batch_size, 4);
}

static void test_cannot_fit(void **state) {
    (void)state;
    tq_spec sp = parse("{" SYN ",\"batch_size\":\"auto\",\"effective_batch\":48}");
    long long one = need_at(&sp, 1);
    tq_spec before = sp;
    result r = pick(&sp, one - 1, 0, "max_memory_mb 1");
    assert_int_not_equal(r.rc, 0);
    assert_string_equal(r.code, "cannot_fit");
    char num[64];
    snprintf(num, sizeof num, "%lld bytes", one);
    assert_non_null(strstr(r.err, num));
    snprintf(num, sizeof num, "%lld bytes", one - 1);
    assert_non_null(strstr(r.err, num));
    assert_non_null(strstr(r.err, "micro-batch of 1"));
    assert_non_null(strstr(r.err, "max_memory_mb 1"));
    assert_memory_equal(&sp, &before, sizeof sp);
    /* with a device overhead, the overhead tips it over */
    r = pick(&sp, one, 1, "the budget of cpu");
    assert_string_equal(r.code, "cannot_fit");
    assert_non_null(strstr(r.err, "the budget of cpu"));
    /* an effective batch above 1024 starts at N/1024 */
    tq_spec big = parse("{" SYN ",\"batch_size\":\"auto\",\"effective_batch\":2048}");
    r = pick(&big, 1, 0, "tiny");
    assert_string_equal(r.code, "cannot_fit");
    assert_non_null(strstr(r.err, "micro-batch of 2 "));
}

static void test_resolved_and_explicit(void **state) {
    (void)state;
    tq_spec sp = parse("{" SYN ",\"batch_size\":\"auto\",\"effective_batch\":48,\"accum_steps\":6}");
    long long need = need_at(&sp, 8);
    result r = pick(&sp, need, 0, "cap");
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.out.batch_size, 8);   /* not re-picked, even though larger ones may fit */
    assert_int_equal(r.out.accum_steps, 6);
    r = pick(&sp, 1LL << 40, 0, "cap");
    assert_int_equal(r.out.batch_size, 8);
    r = pick(&sp, need - 1, 0, "cap");
    assert_string_equal(r.code, "cannot_fit");
    assert_non_null(strstr(r.err, "batch_size 8 x accum_steps 6"));
    tq_spec ex = parse("{" SYN ",\"batch_size\":16,\"accum_steps\":2}");
    r = pick(&ex, 0, 0, NULL);
    assert_int_equal(r.rc, 0);
    assert_memory_equal(&r.out, &ex, sizeof ex);
    assert_int_equal(r.rep.batch_size, 16);
}

static void test_plan_errors_pass_through(void **state) {
    (void)state;
    tq_spec sp = parse("{\"model\":\"cnn\",\"data_dir\":\"/nonexistent/trainq-test\","
                       "\"batch_size\":\"auto\",\"effective_batch\":64}");
    result r = pick(&sp, 1LL << 30, 0, "cap");
    assert_int_not_equal(r.rc, 0);
    assert_string_equal(r.code, "data_not_found");
    assert_non_null(strstr(r.err, "/nonexistent/trainq-test"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_largest_that_fits),
        cmocka_unit_test(test_cannot_fit),
        cmocka_unit_test(test_resolved_and_explicit),
        cmocka_unit_test(test_plan_errors_pass_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
