/* fuzz_spec.c — the job-spec parser (train/spec.c) on arbitrary bytes.
 * Properties: tq_spec_parse never crashes; a rejected spec names a field and a message (both
 * NUL-terminated, the message non-empty); an accepted spec renders (tq_spec_to_json), the
 * rendering parses again, and renders to the same text (spec.h: "parsing it again gives the
 * same spec"). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "spec.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    FUZZ_CHECK(text);
    memcpy(text, data, size);
    text[size] = 0;   /* an embedded NUL ends the text early: that is what a C caller passes */
    tq_spec s;
    tq_spec_err e;
    memset(&e, 0x5a, sizeof e);   /* whatever the parser leaves must be terminated */
    int rc = tq_spec_parse(&s, text, &e);
    if (rc != TQ_SPEC_OK) {
        FUZZ_CHECK(rc == TQ_SPEC_BAD);
        FUZZ_CHECK(memchr(e.field, 0, sizeof e.field) != NULL);
        FUZZ_CHECK(memchr(e.message, 0, sizeof e.message) != NULL);
        FUZZ_CHECK(e.message[0] != 0);
    } else {
        char *j1 = tq_spec_to_json(&s);
        FUZZ_CHECK(j1);
        tq_spec s2;
        int rc2 = tq_spec_parse(&s2, j1, &e);
        if (rc2) fprintf(stderr, "fuzz_spec: the rendering does not parse: %s: %s\n%s\n", e.field, e.message, j1);
        FUZZ_CHECK(rc2 == TQ_SPEC_OK);
        char *j2 = tq_spec_to_json(&s2);
        FUZZ_CHECK(j2);
        if (strcmp(j1, j2)) fprintf(stderr, "fuzz_spec: rendering is not stable:\n%s\n%s\n", j1, j2);
        FUZZ_CHECK(!strcmp(j1, j2));
        free(j1);
        free(j2);
    }
    free(text);
    return 0;
}
