/* dataset.c — Fashion-MNIST (IDX via zlib), CIFAR-10 (binary), synthetic; epoch order and
 * augmentation draws. See dataset.h for the contract. */
#include "dataset.h"
#include "rng.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define NCLASSES 10
#define CIFAR_REC 3073
#define CIFAR_PIX 1024
#define SKIP_CHUNK (1u << 20)

__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* dir + "/" + name into out; 0 when it does not fit. */
static int join(char *out, size_t cap, const char *dir, const char *name) {
    size_t dl = strlen(dir);
    int k = snprintf(out, cap, "%s%s%s", dir, (dl && dir[dl - 1] == '/') ? "" : "/", name);
    return k >= 0 && (size_t)k < cap;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Appends to a message about a missing file or directory what the dataset's data_dir must
 * hold and where the docs say more (after the path, so that a short buffer cuts the hint and
 * not the path). Returns rc. */
static int hint(int rc, const char *what, char *err, size_t errlen) {
    if (!err || !errlen) return rc;
    size_t n = strnlen(err, errlen);
    if (n + 1 >= errlen) return rc;
    if (!strcmp(what, "cifar10"))
        snprintf(err + n, errlen - n, "; cifar10 reads the CIFAR-10 binary version (cifar-10-binary.tar.gz): "
                 "data_dir must hold data_batch_1.bin … data_batch_5.bin and test_batch.bin, or the "
                 "cifar-10-batches-bin/ directory holding them (docs/spec.md, \"Datasets\")");
    else if (!strcmp(what, "fashion-mnist"))
        snprintf(err + n, errlen - n, "; fashion-mnist's data_dir must hold train-images-idx3-ubyte, "
                 "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each .gz or "
                 "plain; Debian's dataset-fashion-mnist puts them in " FMNIST_DEFAULT_DIR " (docs/spec.md, "
                 "\"Datasets\")");
    return rc;
}

static int check_dir(const char *what, const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        fail(err, errlen, TQ_EIO, "%s data_dir %s: %s", what, dir, strerror(e));
        return e == ENOENT || e == ENOTDIR ? hint(TQ_EIO, what, err, errlen) : TQ_EIO;
    }
    if (!S_ISDIR(st.st_mode))
        return hint(fail(err, errlen, TQ_EIO, "%s data_dir %s: not a directory", what, dir), what, err, errlen);
    return TQ_OK;
}

static int check_subset(int64_t subset, int64_t avail, const char *field, const char *split,
                        char *err, size_t errlen) {
    if (subset < 0)
        return fail(err, errlen, TQ_EINVAL, "%s must be >= 0 (0 = all), got %lld", field,
                    (long long)subset);
    if (subset > avail)
        return fail(err, errlen, TQ_EINVAL, "%s %lld exceeds the %lld %s samples available",
                    field, (long long)subset, (long long)avail, split);
    return TQ_OK;
}

static void split_free(tq_split *s) {
    free(s->images);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

static int split_alloc(tq_split *s, int64_t n, int h, int w, int c, char *err, size_t errlen) {
    size_t per = (size_t)h * (size_t)w * (size_t)c;
    if (n < 0 || n > INT32_MAX || (n > 0 && per > SIZE_MAX / (size_t)n))
        return fail(err, errlen, TQ_EINVAL, "dataset of %lld samples of %zu bytes is too large",
                    (long long)n, per);
    s->n = n; s->h = h; s->w = w; s->c = c;
    s->images = malloc(n ? (size_t)n * per : 1);
    s->labels = malloc(n ? (size_t)n : 1);
    if (!s->images || !s->labels) {
        split_free(s);
        return fail(err, errlen, TQ_ENOMEM, "out of memory for %lld samples of %zu bytes",
                    (long long)n, per);
    }
    return TQ_OK;
}

/* ---------------------------------------------------------------- IDX (Fashion-MNIST) */

typedef struct {
    gzFile gz;
    char path[4096];
} idx_file;

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Opens dir/base.gz, else dir/base (gzread reads plain files transparently). */
static int idx_open(idx_file *f, const char *dir, const char *base, char *err, size_t errlen) {
    char gzname[256], plain[4096];
    snprintf(gzname, sizeof gzname, "%s.gz", base);
    if (!join(f->path, sizeof f->path, dir, gzname) || !join(plain, sizeof plain, dir, base))
        return fail(err, errlen, TQ_EINVAL, "data_dir path too long: %s", dir);
    if (!is_file(f->path)) {
        if (!is_file(plain))
            return hint(fail(err, errlen, TQ_EIO, "%s: %s (nor %s)", f->path, strerror(ENOENT), plain),
                        "fashion-mnist", err, errlen);
        memcpy(f->path, plain, sizeof plain);
    }
    errno = 0;
    f->gz = gzopen(f->path, "rb");
    if (!f->gz)
        return fail(err, errlen, TQ_EIO, "%s: %s", f->path, errno ? strerror(errno) : "cannot open");
    gzbuffer(f->gz, 1u << 17);
    return TQ_OK;
}

static void idx_close(idx_file *f) {
    if (f->gz) gzclose(f->gz);
    f->gz = NULL;
}

/* The status for a gz read error (after gzread returned < 0 or came up short). 0: no error. */
static int gz_error(idx_file *f, char *err, size_t errlen) {
    int zerr = Z_OK;
    const char *msg = gzerror(f->gz, &zerr);
    if (zerr == Z_OK || zerr == Z_STREAM_END) return 0;
    if (zerr == Z_ERRNO)
        return fail(err, errlen, TQ_EIO, "%s: read error: %s", f->path, strerror(errno));
    if (zerr == Z_BUF_ERROR)
        return fail(err, errlen, TQ_EDATA, "%s: truncated (the gzip stream ends early)", f->path);
    return fail(err, errlen, TQ_EDATA, "%s: corrupt gzip data (%s)", f->path, msg ? msg : "?");
}

/* Up to len bytes; returns the count read, or -1 on a gz error. */
static int64_t gz_fill(gzFile gz, uint8_t *buf, size_t len) {
    size_t done = 0;
    while (done < len) {
        size_t chunk = len - done;
        if (chunk > (1u << 30)) chunk = 1u << 30;
        int r = gzread(gz, buf + done, (unsigned)chunk);
        if (r < 0) return -1;
        if (r == 0) break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

static int idx_header(idx_file *f, uint8_t *hdr, size_t len, uint32_t magic, char *err,
                      size_t errlen) {
    int64_t got = gz_fill(f->gz, hdr, len);
    if (got != (int64_t)len) {
        int rc = gz_error(f, err, errlen);
        if (rc) return rc;
        return fail(err, errlen, TQ_EDATA, "%s: truncated header (%lld of %zu bytes)", f->path,
                    (long long)(got < 0 ? 0 : got), len);
    }
    if (be32(hdr) != magic)
        return fail(err, errlen, TQ_EDATA, "%s: bad magic %u (expected %u)", f->path, be32(hdr),
                    magic);
    return TQ_OK;
}

/* Reads n samples of `unit` bytes: the first `keep` into buf, the rest discarded; checks labels
 * when `labels`; then checks that the stream ends there. */
static int idx_body(idx_file *f, uint8_t *buf, int64_t keep, int64_t n, size_t unit, int labels,
                    char *err, size_t errlen) {
    uint8_t *scratch = NULL;
    int rc = TQ_OK;
    int64_t done = 0;   /* samples read so far */
    while (done < n) {
        int64_t want = done < keep ? keep - done : n - done;
        uint8_t *dst;
        if (done < keep) {
            dst = buf + (size_t)done * unit;
        } else {
            if (!scratch && !(scratch = malloc(SKIP_CHUNK + unit))) {
                rc = fail(err, errlen, TQ_ENOMEM, "out of memory reading %s", f->path);
                goto out;
            }
            int64_t cap = (int64_t)(SKIP_CHUNK / unit) + 1;
            if (want > cap) want = cap;
            dst = scratch;
        }
        size_t bytes = (size_t)want * unit;
        int64_t got = gz_fill(f->gz, dst, bytes);
        if (got != (int64_t)bytes) {
            if ((rc = gz_error(f, err, errlen))) goto out;
            rc = fail(err, errlen, TQ_EDATA,
                      "%s: truncated: the header says %lld samples, the data ends after %lld",
                      f->path, (long long)n, (long long)(done + (got < 0 ? 0 : got) / (int64_t)unit));
            goto out;
        }
        if (labels) {
            for (int64_t i = 0; i < want; i++)
                if (dst[i] >= NCLASSES) {
                    rc = fail(err, errlen, TQ_EDATA,
                              "%s: label %u of sample %lld is out of range (%d classes)", f->path,
                              dst[i], (long long)(done + i), NCLASSES);
                    goto out;
                }
        }
        done += want;
    }
    {
        uint8_t extra;
        int64_t got = gz_fill(f->gz, &extra, 1);
        if (got < 0) {
            if (!(rc = gz_error(f, err, errlen)))
                rc = fail(err, errlen, TQ_EDATA, "%s: read error at the end of the data", f->path);
            goto out;
        }
        if (got > 0) {
            rc = fail(err, errlen, TQ_EDATA, "%s: trailing bytes after the %lld samples the header "
                      "announces", f->path, (long long)n);
            goto out;
        }
        if ((rc = gz_error(f, err, errlen))) goto out;
    }
out:
    free(scratch);
    return rc;
}

/* Whether the file can hold the header's promise (hdr + n × unit bytes): checked before the
 * samples are allocated, so that a 16-byte header cannot make the loader allocate gigabytes. A
 * plain file holds its size; a gzip stream at most GZ_MAX_RATIO times it (deflate's limit is
 * 1032:1), plus a little for gzip's framing. */
#define GZ_MAX_RATIO 1032u
static int idx_room(idx_file *f, uint64_t hdr, int64_t n, uint64_t unit, char *err, size_t errlen) {
    struct stat st;
    if (stat(f->path, &st) != 0 || st.st_size < 0) return TQ_OK;   /* the reads will tell */
    uint64_t size = (uint64_t)st.st_size, direct = gzdirect(f->gz) == 1;
    uint64_t room = direct ? size : size * GZ_MAX_RATIO + 1024, need = hdr + (uint64_t)n * unit;
    if (need <= room) return TQ_OK;
    return fail(err, errlen, TQ_EDATA, "%s: truncated: the header says %lld samples of %llu bytes, more "
                "than the file (%llu bytes%s) can hold", f->path, (long long)n, (unsigned long long)unit,
                (unsigned long long)size, direct ? "" : " of gzip");
}

static int idx_split(tq_split *sp, const char *dir, const char *prefix, int64_t subset,
                     const char *field, const char *splitname, char *err, size_t errlen) {
    char base[64];
    idx_file im = { 0 }, lb = { 0 };
    uint8_t ih[16], lh[8];
    int rc;

    snprintf(base, sizeof base, "%s-images-idx3-ubyte", prefix);
    if ((rc = idx_open(&im, dir, base, err, errlen))) goto out;
    snprintf(base, sizeof base, "%s-labels-idx1-ubyte", prefix);
    if ((rc = idx_open(&lb, dir, base, err, errlen))) goto out;
    if ((rc = idx_header(&im, ih, sizeof ih, 2051, err, errlen))) goto out;
    if ((rc = idx_header(&lb, lh, sizeof lh, 2049, err, errlen))) goto out;

    int64_t n = be32(ih + 4), nl = be32(lh + 4);
    uint32_t rows = be32(ih + 8), cols = be32(ih + 12);
    if (n != nl) {
        rc = fail(err, errlen, TQ_EDATA, "%s holds %lld images but %s holds %lld labels", im.path,
                  (long long)n, lb.path, (long long)nl);
        goto out;
    }
    if (rows < 1 || rows > 1024 || cols < 1 || cols > 1024) {
        rc = fail(err, errlen, TQ_EDATA, "%s: bad image size %u×%u", im.path, rows, cols);
        goto out;
    }
    if (n < 1 || n > INT32_MAX) {
        rc = fail(err, errlen, TQ_EDATA, "%s: implausible sample count %lld", im.path,
                  (long long)n);
        goto out;
    }
    if ((rc = check_subset(subset, n, field, splitname, err, errlen))) goto out;
    if ((rc = idx_room(&lb, sizeof lh, n, 1, err, errlen)) ||
        (rc = idx_room(&im, sizeof ih, n, (uint64_t)rows * cols, err, errlen))) goto out;
    int64_t keep = subset ? subset : n;
    if ((rc = split_alloc(sp, keep, (int)rows, (int)cols, 1, err, errlen))) goto out;
    if ((rc = idx_body(&lb, sp->labels, keep, n, 1, 1, err, errlen))) goto out;
    if ((rc = idx_body(&im, sp->images, keep, n, (size_t)rows * cols, 0, err, errlen))) goto out;
out:
    idx_close(&im);
    idx_close(&lb);
    if (rc) split_free(sp);
    return rc;
}

static int load_fmnist(tq_dataset *ds, const char *dir, int64_t tsub, int64_t esub, char *err,
                       size_t errlen) {
    int rc;
    if (!dir || !*dir) dir = FMNIST_DEFAULT_DIR;
    if ((rc = check_dir("fashion-mnist", dir, err, errlen))) return rc;
    if ((rc = idx_split(&ds->train, dir, "train", tsub, "train_subset", "training", err, errlen)))
        return rc;
    if ((rc = idx_split(&ds->test, dir, "t10k", esub, "eval_subset", "test", err, errlen)))
        return rc;
    if (ds->test.h != ds->train.h || ds->test.w != ds->train.w)
        return fail(err, errlen, TQ_EDATA, "fashion-mnist in %s: test images are %d×%d but "
                    "training images are %d×%d", dir, ds->test.h, ds->test.w, ds->train.h,
                    ds->train.w);
    ds->classes = NCLASSES;
    ds->mean[0] = ds->mean[1] = ds->mean[2] = 0.2860f;
    ds->std[0] = ds->std[1] = ds->std[2] = 0.3530f;
    snprintf(ds->name, sizeof ds->name, "fashion-mnist");
    return TQ_OK;
}

/* ---------------------------------------------------------------- CIFAR-10 */

typedef struct {
    char path[4096];
    int64_t records;
} cifar_file;

/* Stats dir/name; required → missing is TQ_EIO, else missing returns 1 (absent). */
static int cifar_stat(cifar_file *f, const char *dir, const char *name, int required, char *err,
                      size_t errlen) {
    struct stat st;
    if (!join(f->path, sizeof f->path, dir, name))
        return fail(err, errlen, TQ_EINVAL, "data_dir path too long: %s", dir);
    if (stat(f->path, &st) != 0) {
        int e = errno;
        if (e == ENOENT && !required) return 1;
        fail(err, errlen, TQ_EIO, "%s: %s", f->path, strerror(e));
        return e == ENOENT ? hint(TQ_EIO, "cifar10", err, errlen) : TQ_EIO;
    }
    if (!S_ISREG(st.st_mode)) return fail(err, errlen, TQ_EIO, "%s: not a regular file", f->path);
    if (st.st_size <= 0 || st.st_size % CIFAR_REC != 0)
        return fail(err, errlen, TQ_EDATA, "%s: size %lld bytes is not a positive multiple of %d "
                    "(1 label byte + 3072 pixel bytes per record)", f->path,
                    (long long)st.st_size, CIFAR_REC);
    f->records = st.st_size / CIFAR_REC;
    return TQ_OK;
}

/* Reads the first sp->n records of files[0..nf) into sp (allocated), CHW → HWC. */
static int cifar_read(tq_split *sp, const cifar_file *files, int nf, char *err, size_t errlen) {
    enum { CHUNK = 256 };
    uint8_t *buf = malloc((size_t)CHUNK * CIFAR_REC);
    int rc = TQ_OK;
    int64_t done = 0;
    if (!buf) return fail(err, errlen, TQ_ENOMEM, "out of memory reading CIFAR-10");
    for (int k = 0; k < nf && done < sp->n; k++) {
        FILE *fp = fopen(files[k].path, "rb");
        if (!fp) { rc = fail(err, errlen, TQ_EIO, "%s: %s", files[k].path, strerror(errno)); break; }
        int64_t left = files[k].records, rec = 0;
        if (left > sp->n - done) left = sp->n - done;
        while (left > 0) {
            size_t want = left < CHUNK ? (size_t)left : CHUNK;
            size_t got = fread(buf, CIFAR_REC, want, fp);
            if (got != want) {
                if (ferror(fp))
                    rc = fail(err, errlen, TQ_EIO, "%s: read error: %s", files[k].path,
                              strerror(errno));
                else
                    rc = fail(err, errlen, TQ_EDATA, "%s: truncated after %lld records",
                              files[k].path, (long long)(rec + (int64_t)got));
                break;
            }
            for (size_t r = 0; r < want; r++) {
                const uint8_t *src = buf + r * CIFAR_REC;
                if (src[0] >= NCLASSES) {
                    rc = fail(err, errlen, TQ_EDATA,
                              "%s: label %u of record %lld is out of range (%d classes)",
                              files[k].path, src[0], (long long)(rec + (int64_t)r), NCLASSES);
                    break;
                }
                sp->labels[done] = src[0];
                uint8_t *dst = sp->images + (size_t)done * 3 * CIFAR_PIX;
                for (int p = 0; p < CIFAR_PIX; p++) {
                    dst[3 * p + 0] = src[1 + p];
                    dst[3 * p + 1] = src[1 + CIFAR_PIX + p];
                    dst[3 * p + 2] = src[1 + 2 * CIFAR_PIX + p];
                }
                done++;
            }
            if (rc) break;
            rec += (int64_t)want;
            left -= (int64_t)want;
        }
        fclose(fp);
        if (rc) break;
    }
    free(buf);
    return rc;
}

static int load_cifar(tq_dataset *ds, const char *dir, int64_t tsub, int64_t esub, char *err,
                      size_t errlen) {
    cifar_file files[5], test;
    char sub[4096], name[32];
    int nf = 0, rc;
    int64_t ntrain = 0;

    if (!dir || !*dir)
        return fail(err, errlen, TQ_EINVAL, "data_dir is required for cifar10 (the directory "
                    "holding data_batch_1.bin … data_batch_5.bin and test_batch.bin)");
    if ((rc = check_dir("cifar10", dir, err, errlen))) return rc;
    /* accept the parent of the extracted archive's cifar-10-batches-bin/ too */
    if (join(sub, sizeof sub, dir, "data_batch_1.bin") && !is_file(sub) &&
        join(sub, sizeof sub, dir, "cifar-10-batches-bin/data_batch_1.bin") && is_file(sub))
        join(sub, sizeof sub, dir, "cifar-10-batches-bin");
    else
        snprintf(sub, sizeof sub, "%s", dir);

    for (int b = 1; b <= 5; b++) {
        snprintf(name, sizeof name, "data_batch_%d.bin", b);
        rc = cifar_stat(&files[nf], sub, name, b == 1, err, errlen);
        if (rc == 1) continue;
        if (rc) return rc;
        ntrain += files[nf++].records;
    }
    if ((rc = cifar_stat(&test, sub, "test_batch.bin", 1, err, errlen))) return rc;
    if ((rc = check_subset(tsub, ntrain, "train_subset", "training", err, errlen))) return rc;
    if ((rc = check_subset(esub, test.records, "eval_subset", "test", err, errlen))) return rc;

    if ((rc = split_alloc(&ds->train, tsub ? tsub : ntrain, 32, 32, 3, err, errlen))) return rc;
    if ((rc = split_alloc(&ds->test, esub ? esub : test.records, 32, 32, 3, err, errlen))) return rc;
    if ((rc = cifar_read(&ds->train, files, nf, err, errlen))) return rc;
    if ((rc = cifar_read(&ds->test, &test, 1, err, errlen))) return rc;

    static const float mean[3] = { 0.4914f, 0.4822f, 0.4465f }, sd[3] = { 0.2470f, 0.2435f, 0.2616f };
    ds->classes = NCLASSES;
    memcpy(ds->mean, mean, sizeof mean);
    memcpy(ds->std, sd, sizeof sd);
    snprintf(ds->name, sizeof ds->name, "cifar10");
    return TQ_OK;
}

/* ---------------------------------------------------------------- synthetic */

#define SYN_GRID 4

/* 10 prototypes of h*w*c bytes: per class and channel a SYN_GRID² grid of uniform levels,
 * bilinearly upsampled. */
static void synth_protos(uint8_t *proto, int h, int w, int c, uint64_t seed) {
    tq_rng r = tq_rng_make(seed, TQ_RNG_SYNTH, 0);
    for (int k = 0; k < NCLASSES; k++) {
        float grid[3][SYN_GRID][SYN_GRID];
        for (int ch = 0; ch < c; ch++)
            for (int gy = 0; gy < SYN_GRID; gy++)
                for (int gx = 0; gx < SYN_GRID; gx++) grid[ch][gy][gx] = (float)tq_rng_below(&r, 256);
        uint8_t *p = proto + (size_t)k * h * w * c;
        for (int y = 0; y < h; y++) {
            float fy = h > 1 ? (float)y * (SYN_GRID - 1) / (float)(h - 1) : 0.f;
            int y0 = (int)fy; if (y0 > SYN_GRID - 2) y0 = SYN_GRID - 2;
            float ty = fy - (float)y0;
            for (int x = 0; x < w; x++) {
                float fx = w > 1 ? (float)x * (SYN_GRID - 1) / (float)(w - 1) : 0.f;
                int x0 = (int)fx; if (x0 > SYN_GRID - 2) x0 = SYN_GRID - 2;
                float tx = fx - (float)x0;
                for (int ch = 0; ch < c; ch++) {
                    float v = (1 - ty) * ((1 - tx) * grid[ch][y0][x0] + tx * grid[ch][y0][x0 + 1]) +
                              ty * ((1 - tx) * grid[ch][y0 + 1][x0] + tx * grid[ch][y0 + 1][x0 + 1]);
                    int iv = (int)(v + 0.5f);
                    p[((size_t)y * w + x) * c + ch] = (uint8_t)(iv < 0 ? 0 : iv > 255 ? 255 : iv);
                }
            }
        }
    }
}

/* Sample i of a split: label uniform in [0,10); pixel = prototype + noise, the noise being
 * (sum of 4 uniform bytes − 510)·7/32 (sd ≈ 32, approximately Gaussian), clipped. */
static void synth_split(tq_split *sp, const uint8_t *proto, uint64_t seed, uint64_t base) {
    size_t per = (size_t)sp->h * sp->w * sp->c;
    for (int64_t i = 0; i < sp->n; i++) {
        tq_rng r = tq_rng_make(seed, TQ_RNG_SYNTH, base + (uint64_t)i);
        uint8_t lab = (uint8_t)tq_rng_below(&r, NCLASSES);
        const uint8_t *p = proto + (size_t)lab * per;
        uint8_t *dst = sp->images + (size_t)i * per;
        uint64_t bits = 0;
        for (size_t j = 0; j < per; j++) {
            if ((j & 1) == 0) bits = tq_rng_u64(&r);
            else bits >>= 32;
            int s = (int)(bits & 0xff) + (int)((bits >> 8) & 0xff) + (int)((bits >> 16) & 0xff) +
                    (int)((bits >> 24) & 0xff);
            int v = (int)p[j] + (s - 510) * 7 / 32;
            dst[j] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
        sp->labels[i] = lab;
    }
}

static int load_synth(tq_dataset *ds, const tq_synth_opts *o, int64_t tsub, int64_t esub,
                      uint64_t seed, char *err, size_t errlen) {
    tq_synth_opts s = { 10000, 2000, 32, 32, 3 };
    int rc;
    if (o) {
        if (o->train) s.train = o->train;
        if (o->test) s.test = o->test;
        if (o->h) s.h = o->h;
        if (o->w) s.w = o->w;
        if (o->c) s.c = o->c;
    }
    if (s.train < 1 || s.train > INT32_MAX || s.test < 1 || s.test > INT32_MAX)
        return fail(err, errlen, TQ_EINVAL, "synthetic: sample counts must be in 1…%d, got "
                    "%lld train / %lld test", INT32_MAX, (long long)s.train, (long long)s.test);
    if (s.h < 1 || s.h > 4096 || s.w < 1 || s.w > 4096 || s.c < 1 || s.c > 3)
        return fail(err, errlen, TQ_EINVAL, "synthetic: bad shape %d×%d×%d (h, w in 1…4096, "
                    "c in 1…3)", s.h, s.w, s.c);
    if ((rc = check_subset(tsub, s.train, "train_subset", "training", err, errlen))) return rc;
    if ((rc = check_subset(esub, s.test, "eval_subset", "test", err, errlen))) return rc;
    if ((rc = split_alloc(&ds->train, tsub ? tsub : s.train, s.h, s.w, s.c, err, errlen))) return rc;
    if ((rc = split_alloc(&ds->test, esub ? esub : s.test, s.h, s.w, s.c, err, errlen))) return rc;
    uint8_t *proto = malloc((size_t)NCLASSES * s.h * s.w * s.c);
    if (!proto) return fail(err, errlen, TQ_ENOMEM, "out of memory for synthetic prototypes");
    synth_protos(proto, s.h, s.w, s.c, seed);
    synth_split(&ds->train, proto, seed, 1ull << 62);
    synth_split(&ds->test, proto, seed, 2ull << 62);
    free(proto);
    ds->classes = NCLASSES;
    for (int ch = 0; ch < 3; ch++) { ds->mean[ch] = 0.5f; ds->std[ch] = 0.25f; }
    snprintf(ds->name, sizeof ds->name, "synthetic");
    return TQ_OK;
}

/* ---------------------------------------------------------------- public */

int tq_dataset_load(tq_dataset *ds, const char *kind, const char *data_dir,
                    const tq_synth_opts *synth, int64_t train_subset, int64_t eval_subset,
                    uint64_t seed, char *err, size_t errlen) {
    int rc;
    if (err && errlen) err[0] = 0;
    if (!ds) return fail(err, errlen, TQ_EINVAL, "tq_dataset_load: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!kind)
        rc = fail(err, errlen, TQ_EINVAL, "dataset: no kind given");
    else if (!strcmp(kind, "fashion-mnist"))
        rc = load_fmnist(ds, data_dir, train_subset, eval_subset, err, errlen);
    else if (!strcmp(kind, "cifar10"))
        rc = load_cifar(ds, data_dir, train_subset, eval_subset, err, errlen);
    else if (!strcmp(kind, "synthetic"))
        rc = load_synth(ds, synth, train_subset, eval_subset, seed, err, errlen);
    else
        rc = fail(err, errlen, TQ_EINVAL, "dataset: unknown kind \"%s\" (fashion-mnist, cifar10 "
                  "or synthetic)", kind);
    if (rc) tq_dataset_free(ds);
    return rc;
}

void tq_dataset_free(tq_dataset *ds) {
    if (!ds) return;
    split_free(&ds->train);
    split_free(&ds->test);
    memset(ds, 0, sizeof *ds);
}

void tq_epoch_order(int32_t *perm, int64_t n, uint64_t seed, int64_t epoch, int shuffle) {
    if (!perm || n <= 0) return;
    for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    if (!shuffle) return;
    tq_rng r = tq_rng_make(seed, TQ_RNG_SHUFFLE, (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t j = tq_rng_below(&r, (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void tq_aug_draw(tq_aug *out, int n, uint64_t seed, uint64_t mb, int pad) {
    if (!out || n <= 0) return;
    if (pad < 0) pad = 0;
    if (pad > 16383) pad = 16383;   /* dy, dx are int16 */
    tq_rng r = tq_rng_make(seed, TQ_RNG_AUG, mb);
    uint32_t span = 2u * (uint32_t)pad + 1u;
    for (int i = 0; i < n; i++) {
        out[i].dy = (int16_t)tq_rng_below(&r, span);
        out[i].dx = (int16_t)tq_rng_below(&r, span);
        out[i].flip = (uint8_t)(tq_rng_u64(&r) >> 63);
    }
}
