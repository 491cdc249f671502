/* test_utf8.c — train/utf8.c: the strict validator (overlongs, surrogates, > U+10FFFF,
 * truncations, controls), the U+FFFD sanitizer (one per maximal subpart, as Unicode §3.9 and
 * Python's "replace" do), the bounded copy, and the cJSON tree mender. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define FFFD "\xef\xbf\xbd"

static int check(const char *s, unsigned flags) { return tq_utf8_check(s, strlen(s), flags, NULL, NULL); }

static void test_valid(void **state) {
    (void)state;
    static const char *const ok[] = {
        "", "plain ascii ~", "caf\xc3\xa9", "\xc2\xa0", "\xdf\xbf",                /* U+07FF */
        "\xe0\xa0\x80", "\xe6\x97\xa5\xe6\x9c\xac", "\xed\x9f\xbf",                /* U+D7FF */
        "\xee\x80\x80", "\xef\xbf\xbd", "\xef\xbf\xbf",                             /* U+E000, FFFD, FFFF */
        "\xf0\x90\x80\x80", "\xf0\x9f\x8e\x89", "\xf4\x8f\xbf\xbf",                 /* U+10000, 🎉, U+10FFFF */
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (check(ok[i], 0) != TQ_UTF8_OK) print_error("refused: case %zu\n", i);
        assert_int_equal(check(ok[i], 0), TQ_UTF8_OK);
        assert_true(tq_utf8_valid(ok[i]));
    }
    assert_true(tq_utf8_valid(NULL));
    uint32_t cp = 0;
    assert_int_equal(tq_utf8_decode((const unsigned char *)"\xf0\x9f\x8e\x89", 4, &cp), 4);
    assert_int_equal(cp, 0x1F389);
    assert_int_equal(tq_utf8_decode((const unsigned char *)"\xc3\xa9", 2, &cp), 2);
    assert_int_equal(cp, 0xE9);
    assert_int_equal(tq_utf8_decode((const unsigned char *)"", 0, &cp), 0);
}

static void test_invalid(void **state) {
    (void)state;
    static const struct { const char *s; size_t at; } bad[] = {
        { "\x80", 0 }, { "\xbf", 0 }, { "a\xff", 1 }, { "\xfe", 0 }, { "\xf5\x80\x80\x80", 0 },
        { "\xc0\xaf", 0 }, { "\xc1\xbf", 0 },                 /* overlong 2-byte */
        { "\xe0\x80\xaf", 0 }, { "\xe0\x9f\xbf", 0 },         /* overlong 3-byte */
        { "\xf0\x80\x80\xaf", 0 }, { "\xf0\x8f\xbf\xbf", 0 }, /* overlong 4-byte */
        { "\xed\xa0\x80", 0 }, { "\xed\xbf\xbf", 0 },         /* surrogates D800, DFFF */
        { "\xed\xa0\xbd\xed\xb2\xa9", 0 },                    /* CESU-8 surrogate pair */
        { "\xf4\x90\x80\x80", 0 }, { "\xf7\xbf\xbf\xbf", 0 }, /* > U+10FFFF */
        { "ab\xc3", 2 }, { "\xe2\x82", 0 }, { "\xf0\x9f\x8e", 0 },   /* truncated */
        { "\xc3\x28", 0 }, { "\xe2\x28\xa1", 0 },             /* a bad continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t at = 99;
        int rc = tq_utf8_check(bad[i].s, strlen(bad[i].s), 0, &at, NULL);
        if (rc != TQ_UTF8_INVALID || at != bad[i].at) print_error("case %zu: rc %d at %zu\n", i, rc, at);
        assert_int_equal(rc, TQ_UTF8_INVALID);
        assert_int_equal(at, bad[i].at);
        /* allowing controls changes nothing about the encoding */
        assert_int_equal(check(bad[i].s, TQ_UTF8_ALLOW_CONTROL), TQ_UTF8_INVALID);
        assert_false(tq_utf8_valid(bad[i].s));
    }
    /* an embedded NUL is a control, seen because the length is explicit */
    size_t at = 0;
    uint32_t cp = 7;
    assert_int_equal(tq_utf8_check("ab\0cd", 5, 0, &at, &cp), TQ_UTF8_CONTROL);
    assert_int_equal(at, 2);
    assert_int_equal(cp, 0);
    assert_int_equal(tq_utf8_check("ab\0cd", 5, TQ_UTF8_ALLOW_CONTROL, NULL, NULL), TQ_UTF8_OK);
}

static void test_controls(void **state) {
    (void)state;
    static const char *const ctl[] = { "\x01", "a\tb", "\n", "\r", "\x1b[0m", "\x1f", "\x7f",
                                       "\xc2\x80", "\xc2\x85", "\xc2\x9f" };
    for (size_t i = 0; i < sizeof ctl / sizeof ctl[0]; i++) {
        assert_int_equal(check(ctl[i], 0), TQ_UTF8_CONTROL);
        assert_int_equal(check(ctl[i], TQ_UTF8_ALLOW_CONTROL), TQ_UTF8_OK);
    }
    assert_int_equal(check("\xc2\xa0 \x20~", 0), TQ_UTF8_OK);   /* NBSP, space, tilde are not */
    char why[128];
    assert_int_equal(tq_utf8_explain("ab\x01", 3, 0, why, sizeof why), TQ_UTF8_CONTROL);
    assert_string_equal(why, "contains a control character (U+0001 at offset 2)");
    assert_int_equal(tq_utf8_explain("x\xff", 2, 0, why, sizeof why), TQ_UTF8_INVALID);
    assert_string_equal(why, "is not valid UTF-8 (byte 0xFF at offset 1)");
    assert_int_equal(tq_utf8_explain("fine", 4, 0, why, sizeof why), TQ_UTF8_OK);
    assert_string_equal(why, "");
}

static void test_sanitize(void **state) {
    (void)state;
    static const struct { const char *in, *out; } cases[] = {
        { "", "" }, { "ok \xc3\xa9", "ok \xc3\xa9" }, { "\xff\xfe", FFFD FFFD },
        { "a\x80z", "a" FFFD "z" },
        { "\xe2\x82", FFFD },                     /* one maximal subpart: one U+FFFD */
        { "\xe2\x82z", FFFD "z" },                /* the ASCII after it is kept */
        { "\xf0\x9f\x8e\"", FFFD "\"" },          /* a quote is never swallowed */
        { "\xc0\xaf", FFFD FFFD },                /* C0 is never a lead: two subparts */
        { "\xed\xa0\x80", FFFD FFFD FFFD },       /* ED A0: A0 is outside ED's range */
        { "\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD },
        { "x\x01y", "x\x01y" },                   /* controls are valid UTF-8: kept */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *o = tq_utf8_sanitize(cases[i].in);
        assert_non_null(o);
        if (strcmp(o, cases[i].out)) print_error("case %zu\n", i);
        assert_string_equal(o, cases[i].out);
        assert_true(tq_utf8_valid(o));
        free(o);
    }
    assert_null(tq_utf8_sanitize(NULL));
}

static void test_sanitize_to(void **state) {
    (void)state;
    char b[16];
    assert_int_equal(tq_utf8_sanitize_to(b, sizeof b, "abc", 3, 0), 3);
    assert_string_equal(b, "abc");
    /* never splits a character: 5 bytes of room, "é" would need the 6th */
    assert_int_equal(tq_utf8_sanitize_to(b, 6, "abcd\xc3\xa9", 6, 0), 4);
    assert_string_equal(b, "abcd");
    /* a cut source sequence becomes U+FFFD */
    tq_utf8_sanitize_to(b, sizeof b, "ab\xc3", 3, 0);
    assert_string_equal(b, "ab" FFFD);
    /* controls spelled out, NUL included; without escaping a NUL becomes U+FFFD */
    tq_utf8_sanitize_to(b, sizeof b, "a\0b\n", 4, 1);
    assert_string_equal(b, "a\\x00b\\x0A");
    tq_utf8_sanitize_to(b, sizeof b, "a\0b", 3, 0);
    assert_string_equal(b, "a" FFFD "b");
    assert_int_equal(tq_utf8_sanitize_to(b, 1, "abc", 3, 0), 0);
    assert_string_equal(b, "");
    assert_int_equal(tq_utf8_sanitize_to(b, sizeof b, NULL, 5, 0), 0);
}

static void test_sanitize_json(void **state) {
    (void)state;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", "bad \xff");
    cJSON *arr = cJSON_AddArrayToObject(o, "list");
    cJSON_AddItemToArray(arr, cJSON_CreateString("\xe2\x82"));
    cJSON_AddItemToArray(arr, cJSON_CreateString("good \xc3\xa9"));
    cJSON_AddStringToObject(o, "k\xfe", "v");   /* a bad member name */
    assert_int_equal(tq_utf8_sanitize_json(o), 0);
    char *text = cJSON_PrintUnformatted(o);
    assert_non_null(text);
    assert_true(tq_utf8_valid(text));
    assert_string_equal(text, "{\"name\":\"bad " FFFD "\",\"list\":[\"" FFFD "\",\"good \xc3\xa9\"],\"k" FFFD "\":\"v\"}");
    free(text);
    cJSON_Delete(o);
    assert_int_equal(tq_utf8_sanitize_json(NULL), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_controls),
        cmocka_unit_test(test_sanitize),
        cmocka_unit_test(test_sanitize_to),
        cmocka_unit_test(test_sanitize_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
