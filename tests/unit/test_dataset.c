/* test_dataset.c — train/dataset.c: the real Fashion-MNIST, small IDX and CIFAR-10 files
 * written here (good and corrupt), synthetic determinism, epoch order, augmentation draws. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dataset.h"

#define FMNIST "/usr/share/datasets/fashion-mnist"

static char errbuf[1024];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(p);
}
static void rm_rf(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char *make_tmpdir(void) {
    char tmpl[] = "/tmp/tq_test_dataset_XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_gz(const char *dir, const char *name, const void *data, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, data, (unsigned)len), (int)len);
    assert_int_equal(gzclose(g), Z_OK);
}

static int64_t file_size(const char *dir, const char *name) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static void truncate_file(const char *dir, const char *name, int64_t drop) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(truncate(path, file_size(dir, name) - drop), 0);
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

static uint8_t mini_pixel(int split, int i, int j) { return (uint8_t)(split * 101 + i * 13 + j * 7); }
static uint8_t mini_label(int split, int i) { return (uint8_t)((split * 3 + i) % 10); }

typedef struct {
    int gz;              /* write .gz names */
    uint32_t img_magic;  /* 0: 2051 */
    int bad_label_at;    /* -1: none; else train label index set to 10 */
    int label_count_delta;
    int trailing;        /* extra bytes appended to the train images */
} mini_opts;

/* An IDX set: train 5, test 3 samples of 4×4. */
static void write_mini_idx(const char *dir, mini_opts o) {
    const char *pre[2] = { "train", "t10k" };
    int ns[2] = { 5, 3 }, rows = 4, cols = 4;
    for (int s = 0; s < 2; s++) {
        int n = ns[s];
        size_t ilen = 16 + (size_t)n * rows * cols + (s == 0 ? (size_t)o.trailing : 0);
        uint8_t *im = calloc(1, ilen), lb[8 + 16];
        put_be32(im, o.img_magic ? o.img_magic : 2051);
        put_be32(im + 4, (uint32_t)n); put_be32(im + 8, (uint32_t)rows); put_be32(im + 12, (uint32_t)cols);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < rows * cols; j++) im[16 + i * rows * cols + j] = mini_pixel(s, i, j);
        int nl = n + (s == 0 ? o.label_count_delta : 0);
        put_be32(lb, 2049); put_be32(lb + 4, (uint32_t)nl);
        for (int i = 0; i < nl; i++) lb[8 + i] = mini_label(s, i);
        if (s == 0 && o.bad_label_at >= 0) lb[8 + o.bad_label_at] = 10;
        char iname[64], lname[64];
        snprintf(iname, sizeof iname, "%s-images-idx3-ubyte%s", pre[s], o.gz ? ".gz" : "");
        snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte%s", pre[s], o.gz ? ".gz" : "");
        if (o.gz) { write_gz(dir, iname, im, ilen); write_gz(dir, lname, lb, 8 + (size_t)nl); }
        else { write_file(dir, iname, im, ilen); write_file(dir, lname, lb, 8 + (size_t)nl); }
        free(im);
    }
}

static const mini_opts MINI_OK = { 1, 0, -1, 0, 0 };

static int load(tq_dataset *ds, const char *kind, const char *dir, int64_t ts, int64_t es) {
    errbuf[0] = 0;
    return tq_dataset_load(ds, kind, dir, NULL, ts, es, 0, errbuf, sizeof errbuf);
}

static void assert_err(int rc, int want, const char *needle1, const char *needle2) {
    if (rc != want || (needle1 && !strstr(errbuf, needle1)) || (needle2 && !strstr(errbuf, needle2)))
        fail_msg("rc %d (want %d), message \"%s\" (want \"%s\", \"%s\")", rc, want, errbuf,
                 needle1 ? needle1 : "", needle2 ? needle2 : "");
}

static void assert_zeroed(const tq_dataset *ds) {
    static const tq_dataset zero;
    assert_memory_equal(ds, &zero, sizeof zero);
}

/* ---------------------------------------------------------------- real Fashion-MNIST */

/* Expected values computed independently with python3 (gzip + struct) from the Debian
 * package's files: first labels, label sums, pixel sums, FNV-1a-64 of all image bytes. */
static void test_fmnist_full(void **state) {
    (void)state;
    struct stat st;
    if (stat(FMNIST "/train-images-idx3-ubyte.gz", &st) != 0) skip();
    tq_dataset ds;
    int rc = load(&ds, "fashion-mnist", NULL, 0, 0);
    if (rc) fail_msg("load: %s", errbuf);
    assert_string_equal(ds.name, "fashion-mnist");
    assert_int_equal(ds.classes, 10);
    assert_int_equal(ds.train.n, 60000);
    assert_int_equal(ds.test.n, 10000);
    assert_int_equal(ds.train.h, 28); assert_int_equal(ds.train.w, 28); assert_int_equal(ds.train.c, 1);
    assert_int_equal(ds.test.h, 28); assert_int_equal(ds.test.w, 28); assert_int_equal(ds.test.c, 1);
    assert_true(ds.mean[0] == 0.2860f && ds.std[0] == 0.3530f);
    static const uint8_t first_train[5] = { 9, 0, 0, 3, 0 }, first_test[5] = { 9, 2, 1, 1, 6 };
    assert_memory_equal(ds.train.labels, first_train, 5);
    assert_memory_equal(ds.test.labels, first_test, 5);
    uint64_t ls = 0, ps = 0, h = 0xcbf29ce484222325ull, fs = 0;
    for (int64_t i = 0; i < ds.train.n; i++) ls += ds.train.labels[i];
    for (size_t i = 0; i < (size_t)ds.train.n * 784; i++) {
        ps += ds.train.images[i];
        h = (h ^ ds.train.images[i]) * 0x100000001b3ull;
    }
    for (int i = 0; i < 784; i++) fs += ds.train.images[i];
    assert_int_equal(ls, 270000);
    assert_int_equal(ps, 3431114169ull);
    assert_int_equal(h, 0x51ac53b882edba04ull);
    assert_int_equal(fs, 76247);
    assert_int_equal(ds.train.images[14 * 28 + 14], 217);
    uint64_t tps = 0, tls = 0, th = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < ds.test.n; i++) tls += ds.test.labels[i];
    for (size_t i = 0; i < (size_t)ds.test.n * 784; i++) {
        tps += ds.test.images[i];
        th = (th ^ ds.test.images[i]) * 0x100000001b3ull;
    }
    assert_int_equal(tls, 45000);
    assert_int_equal(tps, 573469082ull);
    assert_int_equal(th, 0x1b11fc03671b2f71ull);
    assert_int_equal(ds.test.images[14 * 28 + 14], 110);
    tq_dataset_free(&ds);
    assert_zeroed(&ds);
    tq_dataset_free(&ds);   /* twice is harmless */
}

static void test_fmnist_subset(void **state) {
    (void)state;
    struct stat st;
    if (stat(FMNIST "/train-images-idx3-ubyte.gz", &st) != 0) skip();
    tq_dataset ds;
    int rc = load(&ds, "fashion-mnist", FMNIST "/", 100, 50);   /* trailing slash */
    if (rc) fail_msg("load: %s", errbuf);
    assert_int_equal(ds.train.n, 100);
    assert_int_equal(ds.test.n, 50);
    static const uint8_t first_train[5] = { 9, 0, 0, 3, 0 }, first_test[5] = { 9, 2, 1, 1, 6 };
    assert_memory_equal(ds.train.labels, first_train, 5);
    assert_memory_equal(ds.test.labels, first_test, 5);
    uint64_t fs = 0;
    for (int i = 0; i < 784; i++) fs += ds.train.images[i];
    assert_int_equal(fs, 76247);
    tq_dataset_free(&ds);

    assert_err(load(&ds, "fashion-mnist", NULL, 60001, 0), TQ_EINVAL, "train_subset", "60000");
    assert_zeroed(&ds);
    assert_err(load(&ds, "fashion-mnist", NULL, 0, 10001), TQ_EINVAL, "eval_subset", "10000");
    assert_zeroed(&ds);
    assert_err(load(&ds, "fashion-mnist", NULL, -1, 0), TQ_EINVAL, "train_subset", NULL);
    /* exactly all is fine */
    rc = load(&ds, "fashion-mnist", NULL, 60000, 10000);
    if (rc) fail_msg("load: %s", errbuf);
    assert_int_equal(ds.train.n, 60000);
    tq_dataset_free(&ds);
}

static void test_bad_kind_and_missing_dir(void **state) {
    (void)state;
    tq_dataset ds;
    assert_err(load(&ds, "mnist", NULL, 0, 0), TQ_EINVAL, "mnist", NULL);
    assert_zeroed(&ds);
    assert_err(load(&ds, NULL, NULL, 0, 0), TQ_EINVAL, NULL, NULL);
    assert_err(load(&ds, "fashion-mnist", "/nonexistent/tq_fmnist", 0, 0), TQ_EIO,
               "/nonexistent/tq_fmnist", NULL);
    assert_zeroed(&ds);
    assert_err(load(&ds, "cifar10", "/nonexistent/tq_cifar", 0, 0), TQ_EIO, "/nonexistent/tq_cifar", NULL);
    assert_err(load(&ds, "cifar10", NULL, 0, 0), TQ_EINVAL, "data_dir", NULL);
    assert_err(load(&ds, "cifar10", "", 0, 0), TQ_EINVAL, "data_dir", NULL);
    /* an empty directory: the message names the missing file */
    char *d = make_tmpdir();
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EIO, d, "train-images-idx3-ubyte");
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EIO, d, "data_batch_1.bin");
    rm_rf(d);
    free(d);
}

/* ---------------------------------------------------------------- small IDX files */

static void check_mini(const tq_dataset *ds, int64_t ntrain, int64_t ntest) {
    assert_int_equal(ds->train.n, ntrain);
    assert_int_equal(ds->test.n, ntest);
    assert_int_equal(ds->train.h, 4); assert_int_equal(ds->train.w, 4); assert_int_equal(ds->train.c, 1);
    const tq_split *sp[2] = { &ds->train, &ds->test };
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < sp[s]->n; i++) {
            assert_int_equal(sp[s]->labels[i], mini_label(s, i));
            for (int j = 0; j < 16; j++) assert_int_equal(sp[s]->images[i * 16 + j], mini_pixel(s, i, j));
        }
}

static void test_idx_good(void **state) {
    (void)state;
    tq_dataset ds;
    char *d = make_tmpdir();
    write_mini_idx(d, MINI_OK);
    int rc = load(&ds, "fashion-mnist", d, 0, 0);
    if (rc) fail_msg("load: %s", errbuf);
    check_mini(&ds, 5, 3);
    tq_dataset_free(&ds);
    rc = load(&ds, "fashion-mnist", d, 2, 1);
    if (rc) fail_msg("load: %s", errbuf);
    check_mini(&ds, 2, 1);
    tq_dataset_free(&ds);
    assert_err(load(&ds, "fashion-mnist", d, 6, 0), TQ_EINVAL, "train_subset", NULL);
    rm_rf(d);
    free(d);

    /* uncompressed names */
    d = make_tmpdir();
    mini_opts plain = MINI_OK;
    plain.gz = 0;
    write_mini_idx(d, plain);
    rc = load(&ds, "fashion-mnist", d, 0, 0);
    if (rc) fail_msg("load plain: %s", errbuf);
    check_mini(&ds, 5, 3);
    tq_dataset_free(&ds);
    rm_rf(d);
    free(d);
}

static void test_idx_missing_file(void **state) {
    (void)state;
    tq_dataset ds;
    char *d = make_tmpdir();
    write_mini_idx(d, MINI_OK);
    char p[4096];
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte.gz", d);
    assert_int_equal(unlink(p), 0);
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EIO, p, NULL);
    assert_zeroed(&ds);
    rm_rf(d);
    free(d);
}

static void test_idx_truncated(void **state) {
    (void)state;
    tq_dataset ds;
    /* plain file missing its last 10 bytes: also when only a subset is used */
    char *d = make_tmpdir();
    mini_opts plain = MINI_OK;
    plain.gz = 0;
    write_mini_idx(d, plain);
    truncate_file(d, "train-images-idx3-ubyte", 10);
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EDATA, "train-images-idx3-ubyte", "truncated");
    assert_zeroed(&ds);
    assert_err(load(&ds, "fashion-mnist", d, 1, 1), TQ_EDATA, "train-images-idx3-ubyte", "truncated");
    /* a header cut short */
    truncate_file(d, "train-images-idx3-ubyte", file_size(d, "train-images-idx3-ubyte") - 7);
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EDATA, "train-images-idx3-ubyte", "header");
    rm_rf(d);
    free(d);

    /* a gzip stream cut short */
    d = make_tmpdir();
    write_mini_idx(d, MINI_OK);
    truncate_file(d, "t10k-images-idx3-ubyte.gz", 12);
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EDATA, "t10k-images-idx3-ubyte.gz", "truncated");
    rm_rf(d);
    free(d);

    /* gzip'd but the data inside is short (valid stream) */
    d = make_tmpdir();
    write_mini_idx(d, MINI_OK);
    uint8_t im[16 + 3 * 16 - 5];
    memset(im, 1, sizeof im);
    put_be32(im, 2051); put_be32(im + 4, 3); put_be32(im + 8, 4); put_be32(im + 12, 4);
    write_gz(d, "t10k-images-idx3-ubyte.gz", im, sizeof im);
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EDATA, "t10k-images-idx3-ubyte.gz", "truncated");
    rm_rf(d);
    free(d);
}

static void test_idx_corrupt(void **state) {
    (void)state;
    tq_dataset ds;
    struct { mini_opts o; const char *file, *what; } cases[] = {
        { { 1, 2049, -1, 0, 0 }, "train-images-idx3-ubyte.gz", "magic" },
        { { 1, 0, 3, 0, 0 }, "train-labels-idx1-ubyte.gz", "label 10" },
        { { 0, 0, 4, 0, 0 }, "train-labels-idx1-ubyte", "label 10" },
        { { 1, 0, -1, 1, 0 }, "train-labels-idx1-ubyte.gz", "labels" },
        { { 1, 0, -1, 0, 3 }, "train-images-idx3-ubyte.gz", "trailing" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *d = make_tmpdir();
        write_mini_idx(d, cases[k].o);
        assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EDATA, cases[k].file, cases[k].what);
        assert_zeroed(&ds);
        /* a subset does not hide it */
        assert_err(load(&ds, "fashion-mnist", d, 1, 1), TQ_EDATA, cases[k].file, cases[k].what);
        rm_rf(d);
        free(d);
    }
    /* garbage that is not gzip and not IDX */
    char *d = make_tmpdir();
    write_mini_idx(d, MINI_OK);
    write_file(d, "train-labels-idx1-ubyte.gz", "\x1f\x8b\x08\x00garbage-garbage-garbage", 27);
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EDATA, "train-labels-idx1-ubyte.gz", NULL);
    rm_rf(d);
    free(d);
}

/* ---------------------------------------------------------------- CIFAR-10 */

static uint8_t cifar_px(int rec, int ch, int p) { return (uint8_t)(rec * 7 + ch * 50 + p * 3); }

/* records [first, first+n) with global ids; label = id % 10 unless bad_at == local index */
static void write_cifar(const char *dir, const char *name, int first, int n, int bad_at) {
    size_t len = (size_t)n * 3073;
    uint8_t *b = malloc(len);
    for (int r = 0; r < n; r++) {
        uint8_t *rec = b + (size_t)r * 3073;
        rec[0] = (uint8_t)(r == bad_at ? 10 : (first + r) % 10);
        for (int ch = 0; ch < 3; ch++)
            for (int p = 0; p < 1024; p++) rec[1 + ch * 1024 + p] = cifar_px(first + r, ch, p);
    }
    write_file(dir, name, b, len);
    free(b);
}

static void check_cifar_split(const tq_split *s, int64_t n, int first_id) {
    assert_int_equal(s->n, n);
    assert_int_equal(s->h, 32); assert_int_equal(s->w, 32); assert_int_equal(s->c, 3);
    for (int64_t i = 0; i < n; i++) {
        int id = first_id + (int)i;
        assert_int_equal(s->labels[i], id % 10);
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++)
                for (int ch = 0; ch < 3; ch++)
                    assert_int_equal(s->images[((size_t)i * 1024 + y * 32 + x) * 3 + ch],
                                     cifar_px(id, ch, y * 32 + x));
    }
}

static void test_cifar(void **state) {
    (void)state;
    tq_dataset ds;
    char *d = make_tmpdir();
    write_cifar(d, "data_batch_1.bin", 0, 3, -1);
    write_cifar(d, "data_batch_3.bin", 3, 2, -1);   /* 2, 4, 5 absent: skipped */
    write_cifar(d, "test_batch.bin", 100, 2, -1);
    int rc = load(&ds, "cifar10", d, 0, 0);
    if (rc) fail_msg("load: %s", errbuf);
    assert_string_equal(ds.name, "cifar10");
    assert_int_equal(ds.classes, 10);
    check_cifar_split(&ds.train, 5, 0);
    check_cifar_split(&ds.test, 2, 100);
    /* a known pixel by hand: record 1, y 2, x 5, green = 1*7 + 50 + (2*32+5)*3 = 264 → 8 */
    assert_int_equal(ds.train.images[(1024 + 2 * 32 + 5) * 3 + 1], 8);
    assert_int_equal(ds.train.images[(1024 + 2 * 32 + 5) * 3 + 0], (uint8_t)(7 + 69 * 3));
    assert_true(ds.mean[0] == 0.4914f && ds.mean[1] == 0.4822f && ds.mean[2] == 0.4465f);
    assert_true(ds.std[0] == 0.2470f && ds.std[1] == 0.2435f && ds.std[2] == 0.2616f);
    tq_dataset_free(&ds);

    /* subsets cross file boundaries in order */
    rc = load(&ds, "cifar10", d, 4, 1);
    if (rc) fail_msg("load: %s", errbuf);
    check_cifar_split(&ds.train, 4, 0);
    check_cifar_split(&ds.test, 1, 100);
    tq_dataset_free(&ds);
    assert_err(load(&ds, "cifar10", d, 6, 0), TQ_EINVAL, "train_subset", "5");
    assert_err(load(&ds, "cifar10", d, 0, 3), TQ_EINVAL, "eval_subset", "2");

    /* the parent of cifar-10-batches-bin/ */
    char sub[512];
    char *p2 = make_tmpdir();
    snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin", p2);
    assert_int_equal(mkdir(sub, 0700), 0);
    write_cifar(sub, "data_batch_1.bin", 0, 2, -1);
    write_cifar(sub, "test_batch.bin", 100, 1, -1);
    rc = load(&ds, "cifar10", p2, 0, 0);
    if (rc) fail_msg("load parent: %s", errbuf);
    check_cifar_split(&ds.train, 2, 0);
    tq_dataset_free(&ds);
    rm_rf(p2);
    free(p2);

    /* missing test_batch */
    char path[512];
    snprintf(path, sizeof path, "%s/test_batch.bin", d);
    assert_int_equal(unlink(path), 0);
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EIO, path, NULL);
    assert_zeroed(&ds);
    write_cifar(d, "test_batch.bin", 100, 2, -1);

    /* size not a multiple of 3073 */
    truncate_file(d, "data_batch_3.bin", 1);
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EDATA, "data_batch_3.bin", "3073");
    assert_zeroed(&ds);
    write_file(d, "data_batch_3.bin", "", 0);   /* empty */
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EDATA, "data_batch_3.bin", "3073");
    write_cifar(d, "data_batch_3.bin", 3, 2, -1);

    /* label out of range */
    write_cifar(d, "test_batch.bin", 100, 2, 1);
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EDATA, "test_batch.bin", "label 10");
    assert_zeroed(&ds);

    /* data_batch_1 is required */
    snprintf(path, sizeof path, "%s/data_batch_1.bin", d);
    assert_int_equal(unlink(path), 0);
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EIO, path, NULL);
    rm_rf(d);
    free(d);
}

/* A missing dataset says what data_dir must hold and where the docs explain it: the path
 * first, then the files expected, then docs/spec.md's Datasets section. */
static void test_missing_data_hints(void **state) {
    (void)state;
    tq_dataset ds;
    char *d = make_tmpdir(), path[512];
    /* cifar10: no such directory, an empty one, a file instead of a directory */
    assert_err(load(&ds, "cifar10", "/nonexistent/tq_cifar", 0, 0), TQ_EIO, "/nonexistent/tq_cifar",
               "docs/spec.md, \"Datasets\"");
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EIO, "docs/spec.md, \"Datasets\"", "test_batch.bin");
    snprintf(path, sizeof path, "%s/data_batch_1.bin: No such file or directory; cifar10 reads the CIFAR-10 "
             "binary version (cifar-10-binary.tar.gz): data_dir must hold data_batch_1.bin", d);
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EIO, path, "cifar-10-batches-bin/");
    assert_zeroed(&ds);
    write_file(d, "plain", "x", 1);
    snprintf(path, sizeof path, "%s/plain", d);
    assert_err(load(&ds, "cifar10", path, 0, 0), TQ_EIO, "not a directory", "docs/spec.md");
    /* the training files there but not the test file: that one is named */
    write_cifar(d, "data_batch_1.bin", 0, 2, -1);
    snprintf(path, sizeof path, "%s/test_batch.bin: No such file or directory; cifar10 reads", d);
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EIO, path, "docs/spec.md");
    /* fashion-mnist: the four files and the Debian package */
    assert_err(load(&ds, "fashion-mnist", d, 0, 0), TQ_EIO, "t10k-labels-idx1-ubyte", "dataset-fashion-mnist");
    assert_err(load(&ds, "fashion-mnist", "/nonexistent/tq_fmnist", 0, 0), TQ_EIO, "/nonexistent/tq_fmnist",
               "docs/spec.md");
    /* a file that is there but broken gets no hint: its problem is not where to find it */
    write_file(d, "test_batch.bin", "x", 1);
    assert_err(load(&ds, "cifar10", d, 0, 0), TQ_EDATA, "test_batch.bin", "3073");
    assert_null(strstr(errbuf, "docs/spec.md"));
    /* a short buffer keeps the path and cuts the hint */
    char small[48];
    snprintf(path, sizeof path, "%s/test_batch.bin", d);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(tq_dataset_load(&ds, "cifar10", d, NULL, 0, 0, 0, small, sizeof small), TQ_EIO);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_int_equal(strncmp(small, path, strlen(path) < sizeof small - 1 ? strlen(path) : sizeof small - 1), 0);
    rm_rf(d);
    free(d);
}

/* ---------------------------------------------------------------- synthetic */

static void test_synthetic(void **state) {
    (void)state;
    tq_dataset a, b, c;
    int rc = tq_dataset_load(&a, "synthetic", NULL, NULL, 0, 0, 7, errbuf, sizeof errbuf);
    if (rc) fail_msg("load: %s", errbuf);
    assert_string_equal(a.name, "synthetic");
    assert_int_equal(a.classes, 10);
    assert_int_equal(a.train.n, 10000); assert_int_equal(a.test.n, 2000);
    assert_int_equal(a.train.h, 32); assert_int_equal(a.train.w, 32); assert_int_equal(a.train.c, 3);
    for (int ch = 0; ch < 3; ch++) assert_true(a.mean[ch] == 0.5f && a.std[ch] == 0.25f);
    rc = tq_dataset_load(&b, "synthetic", NULL, NULL, 0, 0, 7, errbuf, sizeof errbuf);
    if (rc) fail_msg("load: %s", errbuf);
    size_t tb = (size_t)a.train.n * 3072, eb = (size_t)a.test.n * 3072;
    assert_memory_equal(a.train.images, b.train.images, tb);
    assert_memory_equal(a.train.labels, b.train.labels, (size_t)a.train.n);
    assert_memory_equal(a.test.images, b.test.images, eb);
    assert_memory_equal(a.test.labels, b.test.labels, (size_t)a.test.n);
    tq_dataset_free(&b);
    /* another seed: other bytes */
    rc = tq_dataset_load(&b, "synthetic", NULL, NULL, 0, 0, 8, errbuf, sizeof errbuf);
    if (rc) fail_msg("load: %s", errbuf);
    assert_true(memcmp(a.train.images, b.train.images, tb) != 0);
    tq_dataset_free(&b);
    /* a subset is the prefix of the full set */
    rc = tq_dataset_load(&c, "synthetic", NULL, NULL, 300, 20, 7, errbuf, sizeof errbuf);
    if (rc) fail_msg("load: %s", errbuf);
    assert_int_equal(c.train.n, 300); assert_int_equal(c.test.n, 20);
    assert_memory_equal(c.train.images, a.train.images, 300 * 3072);
    assert_memory_equal(c.train.labels, a.train.labels, 300);
    assert_memory_equal(c.test.images, a.test.images, 20 * 3072);
    tq_dataset_free(&c);

    /* balanced-ish labels, overall mean near 0.5 */
    int64_t counts[10] = { 0 };
    double sum = 0;
    for (int64_t i = 0; i < a.train.n; i++) { assert_true(a.train.labels[i] < 10); counts[a.train.labels[i]]++; }
    for (int k = 0; k < 10; k++) assert_true(counts[k] > 800 && counts[k] < 1200);
    for (size_t i = 0; i < tb; i++) sum += a.train.images[i];
    double m = sum / (double)tb / 255.0;
    assert_true(m > 0.35 && m < 0.65);

    /* learnable: nearest class mean (from train) classifies test well */
    double *cm = calloc(10 * 3072, sizeof *cm);
    for (int64_t i = 0; i < a.train.n; i++)
        for (int j = 0; j < 3072; j++) cm[a.train.labels[i] * 3072 + j] += a.train.images[i * 3072 + j];
    for (int k = 0; k < 10; k++)
        for (int j = 0; j < 3072; j++) cm[k * 3072 + j] /= (double)counts[k];
    int hits = 0;
    for (int64_t i = 0; i < a.test.n; i++) {
        int best = -1;
        double bd = 1e300;
        for (int k = 0; k < 10; k++) {
            double dd = 0;
            for (int j = 0; j < 3072; j++) {
                double t = a.test.images[i * 3072 + j] - cm[k * 3072 + j];
                dd += t * t;
            }
            if (dd < bd) { bd = dd; best = k; }
        }
        hits += best == a.test.labels[i];
    }
    free(cm);
    assert_true(hits > a.test.n * 9 / 10);
    tq_dataset_free(&a);

    /* custom shape */
    tq_synth_opts o = { 50, 10, 8, 6, 1 };
    rc = tq_dataset_load(&a, "synthetic", NULL, &o, 0, 0, 1, errbuf, sizeof errbuf);
    if (rc) fail_msg("load: %s", errbuf);
    assert_int_equal(a.train.n, 50); assert_int_equal(a.test.n, 10);
    assert_int_equal(a.train.h, 8); assert_int_equal(a.train.w, 6); assert_int_equal(a.train.c, 1);
    assert_int_equal(a.test.h, 8); assert_int_equal(a.test.w, 6); assert_int_equal(a.test.c, 1);
    tq_dataset_free(&a);
    tq_synth_opts bad = { 50, 10, 8, 8, 4 };
    assert_int_equal(tq_dataset_load(&a, "synthetic", NULL, &bad, 0, 0, 1, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_zeroed(&a);
    tq_synth_opts neg = { -5, 10, 8, 8, 1 };
    assert_int_equal(tq_dataset_load(&a, "synthetic", NULL, &neg, 0, 0, 1, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_int_equal(tq_dataset_load(&a, "synthetic", NULL, &o, 51, 0, 1, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_non_null(strstr(errbuf, "train_subset"));
    /* err may be NULL */
    assert_int_equal(tq_dataset_load(&a, "synthetic", NULL, &o, 0, 11, 1, NULL, 0), TQ_EINVAL);
}

/* ---------------------------------------------------------------- epoch order, augmentation */

static void test_epoch_order(void **state) {
    (void)state;
    enum { N = 1000 };
    int32_t *p = malloc(N * sizeof *p), *q = malloc(N * sizeof *q);
    uint8_t seen[N];

    tq_epoch_order(p, N, 42, 0, 0);
    for (int i = 0; i < N; i++) assert_int_equal(p[i], i);

    tq_epoch_order(p, N, 42, 0, 1);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) { assert_true(p[i] >= 0 && p[i] < N); assert_false(seen[p[i]]); seen[p[i]] = 1; }
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += p[i] == i;
    assert_true(fixed < 20);   /* expected ~1 */

    tq_epoch_order(q, N, 42, 0, 1);
    assert_memory_equal(p, q, N * sizeof *p);          /* stateless, deterministic */
    tq_epoch_order(q, N, 42, 1, 1);
    assert_true(memcmp(p, q, N * sizeof *p) != 0);     /* another epoch */
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) { assert_false(seen[q[i]]); seen[q[i]] = 1; }
    tq_epoch_order(q, N, 43, 0, 1);
    assert_true(memcmp(p, q, N * sizeof *p) != 0);     /* another seed */

    tq_epoch_order(p, 1, 42, 3, 1);
    assert_int_equal(p[0], 0);
    tq_epoch_order(p, 0, 42, 3, 1);                     /* nothing to do, no crash */
    free(p);
    free(q);
}

/* field by field: tq_aug has a padding byte */
static int aug_equal(const tq_aug *a, const tq_aug *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i].dy != b[i].dy || a[i].dx != b[i].dx || a[i].flip != b[i].flip) return 0;
    return 1;
}

static void test_aug_draw(void **state) {
    (void)state;
    enum { N = 20000 };
    tq_aug *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    int hist_y[9] = { 0 }, hist_x[9] = { 0 }, flips = 0;
    tq_aug_draw(a, N, 5, 17, 4);
    for (int i = 0; i < N; i++) {
        assert_true(a[i].dy >= 0 && a[i].dy <= 8);
        assert_true(a[i].dx >= 0 && a[i].dx <= 8);
        assert_true(a[i].flip <= 1);
        hist_y[a[i].dy]++; hist_x[a[i].dx]++; flips += a[i].flip;
    }
    for (int k = 0; k < 9; k++) {   /* ~2222 each */
        assert_true(hist_y[k] > 1900 && hist_y[k] < 2550);
        assert_true(hist_x[k] > 1900 && hist_x[k] < 2550);
    }
    assert_true(flips > N * 45 / 100 && flips < N * 55 / 100);
    tq_aug_draw(b, N, 5, 17, 4);
    assert_true(aug_equal(a, b, N));
    tq_aug_draw(b, N, 5, 18, 4);
    assert_false(aug_equal(a, b, N));
    tq_aug_draw(b, N, 6, 17, 4);
    assert_false(aug_equal(a, b, N));
    /* the first k draws do not depend on n */
    tq_aug_draw(b, 10, 5, 17, 4);
    assert_true(aug_equal(a, b, 10));
    tq_aug_draw(b, N, 5, 17, 0);
    for (int i = 0; i < N; i++) { assert_int_equal(b[i].dy, 0); assert_int_equal(b[i].dx, 0); }
    free(a);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fmnist_full),
        cmocka_unit_test(test_fmnist_subset),
        cmocka_unit_test(test_bad_kind_and_missing_dir),
        cmocka_unit_test(test_idx_good),
        cmocka_unit_test(test_idx_missing_file),
        cmocka_unit_test(test_idx_truncated),
        cmocka_unit_test(test_idx_corrupt),
        cmocka_unit_test(test_cifar),
        cmocka_unit_test(test_missing_data_hints),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_epoch_order),
        cmocka_unit_test(test_aug_draw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
