/* fuzz_util.h — helpers shared by the libFuzzer targets in tests/fuzz/ (see README.md there).
 *
 * The readers under test take paths, not buffers, so each input is written to a file first:
 * a memfd (fuzz_memfile: no disk, reached as /proc/self/fd/N) for the single-file readers, a
 * private directory on tmpfs (fuzz_dir) for the dataset readers that want named files in a
 * directory. FUZZ_CHECK aborts (a finding) when a property of the code under test fails; it
 * is for the harness's own invariants, never for bad input. */
#ifndef TQ_FUZZ_UTIL_H
#define TQ_FUZZ_UTIL_H
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_CHECK(e) do { if (!(e)) { fprintf(stderr, "fuzz: check failed: %s (%s:%d)\n", #e, \
                                                __FILE__, __LINE__); abort(); } } while (0)

typedef struct { int fd; char path[64]; } fuzz_file;

static inline void fuzz_memfile_open(fuzz_file *f, const char *name) {
    f->fd = memfd_create(name, 0);
    FUZZ_CHECK(f->fd >= 0);
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

/* Replaces the file's content with the given pieces (NULL-terminated list of (ptr, len)). */
static inline void fuzz_memfile_set(fuzz_file *f, const void *a, size_t na, const void *b, size_t nb) {
    FUZZ_CHECK(ftruncate(f->fd, 0) == 0);
    if (na) FUZZ_CHECK(pwrite(f->fd, a, na, 0) == (ssize_t)na);
    if (nb) FUZZ_CHECK(pwrite(f->fd, b, nb, (off_t)na) == (ssize_t)nb);
}

/* A private directory for this process, removed at exit (files listed with fuzz_dir_track). */
static char fuzz_dir_path[256];
static char fuzz_dir_files[16][64];
static int fuzz_dir_nfiles;

static inline void fuzz_dir_cleanup(void) {
    char p[512];
    for (int i = 0; i < fuzz_dir_nfiles; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir_path, fuzz_dir_files[i]);
        unlink(p);
    }
    if (fuzz_dir_path[0]) rmdir(fuzz_dir_path);
}

static inline const char *fuzz_dir(void) {
    if (fuzz_dir_path[0]) return fuzz_dir_path;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/tq-fuzz-XXXXXX", base);
    FUZZ_CHECK(mkdtemp(fuzz_dir_path) != NULL);
    atexit(fuzz_dir_cleanup);
    return fuzz_dir_path;
}

/* Writes dir/name (data NULL: removes it). */
static inline void fuzz_dir_put(const char *name, const void *data, size_t n) {
    char p[512];
    int known = 0;
    for (int i = 0; i < fuzz_dir_nfiles; i++) known |= !strcmp(fuzz_dir_files[i], name);
    if (!known) {
        FUZZ_CHECK(fuzz_dir_nfiles < 16);
        snprintf(fuzz_dir_files[fuzz_dir_nfiles++], sizeof fuzz_dir_files[0], "%s", name);
    }
    snprintf(p, sizeof p, "%s/%s", fuzz_dir(), name);
    if (!data) { unlink(p); return; }
    FILE *fp = fopen(p, "wb");
    FUZZ_CHECK(fp != NULL);
    FUZZ_CHECK(n == 0 || fwrite(data, 1, n, fp) == n);
    FUZZ_CHECK(fclose(fp) == 0);
}
#endif
