/* tmpdir.h — temporary directories for the unit tests, removed when the test program exits.
 *
 * Removal at exit, not per test: a failing cmocka check jumps out of the test, past any cleanup
 * of its own. TQ_KEEP_TMP=1 keeps them (their names are printed then), to look at a failure. */
#ifndef TQ_TEST_TMPDIR_H
#define TQ_TEST_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char **tq_tmp_made;
static int tq_tmp_n;

static int tq_tmp_rm1(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb; (void)flag; (void)f;
    return remove(p);
}

static void tq_tmp_cleanup(void) {
    int keep = getenv("TQ_KEEP_TMP") != NULL;
    for (int i = 0; i < tq_tmp_n; i++) {
        if (keep) fprintf(stderr, "kept %s\n", tq_tmp_made[i]);
        else nftw(tq_tmp_made[i], tq_tmp_rm1, 16, FTW_DEPTH | FTW_PHYS);
        free(tq_tmp_made[i]);
    }
    free(tq_tmp_made);
    tq_tmp_made = NULL;
    tq_tmp_n = 0;
}

/* a new directory $TMPDIR/<prefix>_XXXXXX (/tmp without TMPDIR), malloc'd; the caller may free
 * the name, the directory goes at exit. NULL when it cannot be made. */
static char *tq_tmpdir(const char *prefix) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    size_t n = strlen(base) + strlen(prefix) + 16;
    char *t = malloc(n), **grown = realloc(tq_tmp_made, (size_t)(tq_tmp_n + 1) * sizeof *grown);
    if (grown) tq_tmp_made = grown;
    if (!t || !grown) { free(t); return NULL; }
    snprintf(t, n, "%s/%s_XXXXXX", base, prefix);
    char *copy = mkdtemp(t) ? strdup(t) : NULL;
    if (!copy) { free(t); return NULL; }
    if (tq_tmp_n == 0) atexit(tq_tmp_cleanup);
    tq_tmp_made[tq_tmp_n++] = copy;
    return t;
}

#endif
