/* test_codes.c — the job states and error codes (train/codes.h): names and enums round-trip,
 * only succeeded/failed/cancelled are final, and docs/api.md lists every error code (run from
 * the repository root, as make unit does). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codes.h"

static void test_states(void **state) {
    (void)state;
    for (int i = 0; i < TQ_STATE_COUNT; i++) {
        tq_job_state k;
        assert_int_equal(tq_state_parse(tq_state_name((tq_job_state)i), &k), 0);
        assert_int_equal(k, i);
    }
    tq_job_state k;
    assert_int_equal(tq_state_parse("finished", &k), -1);
    assert_int_equal(tq_state_parse(NULL, &k), -1);
    assert_false(tq_state_is_final(TQ_STATE_QUEUED));
    assert_false(tq_state_is_final(TQ_STATE_RUNNING));
    assert_true(tq_state_is_final(TQ_STATE_SUCCEEDED));
    assert_true(tq_state_is_final(TQ_STATE_FAILED));
    assert_true(tq_state_is_final(TQ_STATE_CANCELLED));
    assert_string_equal(tq_state_name(TQ_STATE_COUNT), "?");
}

static void test_errors_round_trip_and_are_documented(void **state) {
    (void)state;
    FILE *f = fopen("docs/api.md", "r");
    assert_non_null(f);
    static char doc[1 << 20];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = 0;
    assert_string_equal(tq_error_name(TQ_ERR_NONE), "");
    for (int i = 1; i < TQ_ERR_COUNT; i++) {
        const char *name = tq_error_name((tq_error_code)i);
        tq_error_code c;
        assert_int_equal(tq_error_parse(name, &c), 0);
        assert_int_equal(c, i);
        assert_true(strlen(tq_error_meaning((tq_error_code)i)) > 10);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "`%s`", name);
        if (!strstr(doc, quoted)) fail_msg("docs/api.md does not list the error code %s", quoted);
    }
    tq_error_code c;
    assert_int_equal(tq_error_parse("", &c), -1);
    assert_int_equal(tq_error_parse("kaboom", &c), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_states),
        cmocka_unit_test(test_errors_round_trip_and_are_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
