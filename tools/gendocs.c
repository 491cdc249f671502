/* gendocs.c — writes docs/spec.md and docs/trainq.1 from their templates (docs/spec.md.in,
 * docs/trainq.1.in) and the spec parser's documentation table (train/spec.c, tq_spec_doc):
 * `make docs`.
 *
 *   gendocs --markdown|--man TEMPLATE OUTPUT          write OUTPUT (only when it changes)
 *   gendocs --check --markdown|--man TEMPLATE OUTPUT  exit 1 when OUTPUT differs from what
 *                                                     would be written
 * Exit 0 ok, 1 out of date (--check) or an I/O error, 2 bad usage. */
#include "spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; }
        buf = nb;
    }
    if (buf) buf[n] = 0;
    if (ferror(f)) { free(buf); buf = NULL; }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    int check = 0, format = -1;
    const char *paths[2] = { NULL, NULL };
    int np = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--markdown")) format = TQ_DOC_MARKDOWN;
        else if (!strcmp(argv[i], "--man")) format = TQ_DOC_MAN;
        else if (argv[i][0] != '-' && np < 2) paths[np++] = argv[i];
        else { np = -1; break; }
    }
    if (format < 0 || np != 2) {
        fprintf(stderr, "usage: gendocs [--check] --markdown|--man TEMPLATE OUTPUT\n");
        return 2;
    }
    char *tmpl = slurp(paths[0]);
    if (!tmpl) { fprintf(stderr, "gendocs: %s: %s\n", paths[0], strerror(errno)); return 1; }
    char *text = tq_spec_doc_fill(tmpl, format);
    free(tmpl);
    if (!text) {
        fprintf(stderr, "gendocs: %s has no @SPEC_REFERENCE@ line (or out of memory)\n", paths[0]);
        return 1;
    }
    char *old = slurp(paths[1]);
    int same = old && !strcmp(old, text);
    free(old);
    if (check) {
        free(text);
        if (same) return 0;
        fprintf(stderr, "gendocs: %s is out of date: it differs from what %s and train/spec.c's field "
                        "table generate; run `make docs` (and commit the result)\n", paths[1], paths[0]);
        return 1;
    }
    if (!same) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", paths[1]);
        FILE *f = fopen(tmp, "wb");
        if (!f || fputs(text, f) == EOF || fclose(f) != 0 || rename(tmp, paths[1]) != 0) {
            fprintf(stderr, "gendocs: cannot write %s: %s\n", paths[1], strerror(errno));
            free(text);
            return 1;
        }
        printf("gendocs: wrote %s\n", paths[1]);
    }
    free(text);
    return 0;
}
