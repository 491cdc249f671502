/* test_limit.c — a job's planned share of a device is a hard limit: the backend's allocator
 * refuses to hand out more than be->bytes_limit in all (so a job that outgrows its plan fails
 * alone, with out_of_memory, instead of taking memory promised to a neighbour), and the
 * trainer refuses a plan larger than the share before any step. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "trainer.h"

static void test_allocator_limit(void **state) {
    (void)state;
    tq_backend *be = tq_cpu_backend_new(1);
    assert_non_null(be);
    be->bytes_limit = 1000;
    void *a = be->i->alloc(be, 600);
    assert_non_null(a);
    assert_null(be->i->alloc(be, 500));                    /* 1100 > 1000 */
    assert_non_null(strstr(be->err, "over the 1000 bytes planned for this job"));
    assert_int_equal(be->bytes_live, 600);                 /* the refusal took nothing */
    void *b = be->i->alloc(be, 400);                       /* exactly the limit */
    assert_non_null(b);
    assert_null(be->i->alloc(be, 1));
    be->i->free(be, a);
    void *c = be->i->alloc(be, 600);                       /* freed bytes are room again */
    assert_non_null(c);
    be->i->free(be, b);
    be->i->free(be, c);
    be->bytes_limit = 0;                                   /* 0: no limit */
    void *big = be->i->alloc(be, 1 << 20);
    assert_non_null(big);
    be->i->free(be, big);
    tq_backend_free(be);
}

static void test_trainer_refuses_a_plan_over_its_share(void **state) {
    (void)state;
    tq_spec sp;
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&sp, "{\"model\":\"cnn\",\"dataset\":\"synthetic\",\"synthetic\":{\"train\":64,"
                                        "\"test\":16,\"height\":16,\"width\":16,\"channels\":1},\"threads\":1,"
                                        "\"device\":\"cpu\",\"steps\":2,\"batch_size\":8}", &e), TQ_SPEC_OK);
    tq_plan_report rep;
    char code[32], err[256];
    assert_int_equal(tq_plan_spec(&sp, &rep, code, sizeof code, err, sizeof err), 0);
    long long need = (long long)(rep.plan.total + rep.plan.data);

    tq_run_opts o;
    memset(&o, 0, sizeof o);
    tq_summary sum;
    o.mem_limit = need - 1;                                /* one byte short */
    tq_train(&sp, &o, &sum);
    assert_string_equal(sum.state, "failed");
    assert_string_equal(sum.error_code, "out_of_memory");
    assert_non_null(strstr(sum.error_message, "placed for it"));
    assert_int_equal(sum.steps, 0);

    o.mem_limit = need;                                    /* exactly its plan: it trains */
    tq_train(&sp, &o, &sum);
    assert_string_equal(sum.state, "succeeded");
    assert_int_equal(sum.steps, 2);
    assert_true(sum.peak_memory_bytes <= need);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocator_limit),
        cmocka_unit_test(test_trainer_refuses_a_plan_over_its_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
