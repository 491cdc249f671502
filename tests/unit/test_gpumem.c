/* test_gpumem.c — daemon/gpumem.c (NVML through dlopen) against a stand-in libnvidia-ml.so.1
 * (tests/unit/stub/nvml_stub.c, found through this binary's run path): what the supervisor reads
 * before it places jobs. No GPU and no driver needed; on a machine with the real library, the
 * run path still finds the stub first unless LD_LIBRARY_PATH names another. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include "gpumem.h"

#define GIB (1LL << 30)

/* an init the driver refuses: -1, the status in words, and nothing loaded (reads say unknown) */
static void test_init_failure_names_the_status(void **st) {
    (void)st;
    char why[200] = "";
    setenv("STUB_NVML_INIT", "9", 1);
    assert_int_equal(tq_gpumem_init(why, sizeof why), -1);
    unsetenv("STUB_NVML_INIT");
    if (!strstr(why, "status 9") || !strstr(why, "Driver Not Loaded")) fail_msg("why: %s", why);
    long long t, u, f, o;
    assert_int_equal(tq_gpumem_read("00000000:3b:00.0", &t, &u, &f, NULL, 0, &o), -1);
    assert_int_equal(o, -1);
}

static void test_read(void **st) {
    (void)st;
    char why[200] = "";
    if (tq_gpumem_init(why, sizeof why)) fail_msg("init: %s", why);
    long long t = 0, u = 0, f = 0, o = 0;
    const pid_t ours[2] = { 111, 333 };
    assert_int_equal(tq_gpumem_read("00000000:3b:00.0", &t, &u, &f, ours, 2, &o), 0);
    assert_true(t == 80 * GIB && u == 30 * GIB && f == 50 * GIB);
    assert_true(o == 5 * GIB);                     /* 1 GiB + 4 GiB: ours, not pid 222's */
    const pid_t none[1] = { 999 };
    assert_int_equal(tq_gpumem_read("00000000:3B:00.0", &t, &u, &f, none, 1, &o), 0);
    assert_true(o == 0);                           /* no process of ours holds memory there */
    setenv("STUB_NVML_NA_PID", "333", 1);          /* NVML cannot say what one of ours holds */
    assert_int_equal(tq_gpumem_read("00000000:3b:00.0", &t, &u, &f, ours, 2, &o), 0);
    unsetenv("STUB_NVML_NA_PID");
    assert_true(o == -1);
    assert_int_equal(tq_gpumem_read("00000000:3c:00.0", &t, &u, &f, ours, 2, &o), -1);   /* no such GPU */
    assert_int_equal(tq_gpumem_read("", &t, &u, &f, ours, 2, &o), -1);
    /* MIG on: the card's numbers are not an instance's: unknown; off, or not supported: read */
    setenv("STUB_NVML_MIG", "1", 1);
    assert_int_equal(tq_gpumem_read("00000000:3b:00.0", &t, &u, &f, ours, 2, &o), -1);
    setenv("STUB_NVML_MIG", "0", 1);
    assert_int_equal(tq_gpumem_read("00000000:3b:00.0", &t, &u, &f, ours, 2, &o), 0);
    unsetenv("STUB_NVML_MIG");
    tq_gpumem_shutdown();
    assert_int_equal(tq_gpumem_read("00000000:3b:00.0", &t, &u, &f, ours, 2, &o), -1);   /* unloaded */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_failure_names_the_status),
        cmocka_unit_test(test_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
