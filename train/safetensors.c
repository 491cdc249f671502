/* safetensors.c — see safetensors.h for the contract. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (tensor data is written as-is)"
#endif

#define ST_MAX_HEADER 100000000ull
#define ST_MAX_INT 9007199254740992.0   /* 2^53: integers a JSON double holds exactly */
#define ST_NAME_MAX ((int)sizeof(((tq_st_tensor *)0)->name))

__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
    int e = errno;   /* the failed call's: a full filesystem is its own code */
    if (code == TQ_EIO && (e == ENOSPC || e == EDQUOT)) code = TQ_ENOSPC;
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static const struct { const char *name; size_t size; } DTYPES[] = {
    { "F64", 8 }, { "F32", 4 }, { "F16", 2 }, { "BF16", 2 }, { "I64", 8 }, { "I32", 4 },
    { "I16", 2 }, { "I8", 1 }, { "U64", 8 }, { "U32", 4 }, { "U16", 2 }, { "U8", 1 },
    { "BOOL", 1 }, { "F8_E4M3", 1 }, { "F8_E5M2", 1 },
};

size_t tq_st_dtype_size(const char *dtype) {
    if (!dtype) return 0;
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (!strcmp(dtype, DTYPES[i].name)) return DTYPES[i].size;
    return 0;
}

/* numel × esize with overflow detection; -1 on overflow */
static int64_t tensor_bytes(const int64_t *shape, int ndim, size_t esize) {
    uint64_t n = esize;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d && n > (uint64_t)INT64_MAX / d) return -1;
        n *= d;
    }
    return n > (uint64_t)INT64_MAX ? -1 : (int64_t)n;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first duplicated key of a (cJSON) object, or NULL. keys: scratch of count entries. */
static const char *dup_key(const cJSON *obj, const char **keys, int count) {
    int k = 0;
    for (const cJSON *c = obj->child; c && k < count; c = c->next) keys[k++] = c->string ? c->string : "";
    qsort(keys, (size_t)k, sizeof *keys, cmp_str);
    for (int i = 1; i < k; i++)
        if (!strcmp(keys[i - 1], keys[i])) return keys[i];
    return NULL;
}

/* ---------------------------------------------------------------- write */

static int write_all(FILE *fp, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, fp) == n; }

int tq_st_write(const char *path, const tq_st_tensor *ts, int n, const cJSON *meta, char *err,
                size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (!path || !*path) return fail(err, errlen, TQ_EINVAL, "safetensors: no path given");
    if (n < 0 || (n > 0 && !ts))
        return fail(err, errlen, TQ_EINVAL, "%s: bad tensor list (n = %d)", path, n);
    if (meta && !cJSON_IsObject(meta))
        return fail(err, errlen, TQ_EINVAL, "%s: metadata must be a JSON object", path);

    /* validate */
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const tq_st_tensor *t = &ts[i];
        if (!memchr(t->name, 0, sizeof t->name) || !t->name[0])
            return fail(err, errlen, TQ_EINVAL, "%s: tensor %d: name empty or not terminated "
                        "within %zu bytes", path, i, sizeof t->name);
        if (!strcmp(t->name, "__metadata__"))
            return fail(err, errlen, TQ_EINVAL, "%s: \"__metadata__\" is not a tensor name", path);
        size_t es = memchr(t->dtype, 0, sizeof t->dtype) ? tq_st_dtype_size(t->dtype) : 0;
        if (!es)
            return fail(err, errlen, TQ_EINVAL, "%s: tensor %s: unknown dtype \"%.8s\"", path,
                        t->name, t->dtype);
        if (t->ndim < 0 || t->ndim > 8)
            return fail(err, errlen, TQ_EINVAL, "%s: tensor %s: ndim %d not in 0…8", path, t->name,
                        t->ndim);
        int64_t b = tensor_bytes(t->shape, t->ndim, es);
        if (b < 0 || (uint64_t)b != (uint64_t)t->bytes)
            return fail(err, errlen, TQ_EINVAL, "%s: tensor %s: %zu bytes given, the %s shape "
                        "needs %lld", path, t->name, t->bytes, t->dtype, (long long)b);
        if (t->bytes && !t->data)
            return fail(err, errlen, TQ_EINVAL, "%s: tensor %s: no data", path, t->name);
        total += t->bytes;
        if (total > (1ull << 50))
            return fail(err, errlen, TQ_EINVAL, "%s: more than 2^50 bytes of tensors", path);
    }
    if (meta)
        for (const cJSON *c = meta->child; c; c = c->next)
            if (!cJSON_IsString(c) || !c->string)
                return fail(err, errlen, TQ_EINVAL, "%s: metadata value of \"%s\" is not a string",
                            path, c->string ? c->string : "?");

    /* header */
    int rc = TQ_OK;
    char *json = NULL, *tmp = NULL, *dir = NULL;
    const char **keys = NULL;
    FILE *fp = NULL;
    int tmp_made = 0;
    cJSON *root = cJSON_CreateObject();
    if (!root) { rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path); goto out; }
    if (meta && meta->child) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m) { rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path); goto out; }
        for (const cJSON *c = meta->child; c; c = c->next)
            if (!cJSON_AddStringToObject(m, c->string, c->valuestring)) {
                rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path);
                goto out;
            }
        if (!(keys = malloc(sizeof *keys * (size_t)cJSON_GetArraySize(m) + 1))) {
            rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        const char *d = dup_key(m, keys, cJSON_GetArraySize(m));
        if (d) { rc = fail(err, errlen, TQ_EINVAL, "%s: metadata key \"%s\" given twice", path, d); goto out; }
        free(keys);
        keys = NULL;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const tq_st_tensor *t = &ts[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = e ? cJSON_CreateArray() : NULL;
        cJSON *offs = shape ? cJSON_CreateArray() : NULL;
        if (!offs || !cJSON_AddStringToObject(e, "dtype", t->dtype)) {
            cJSON_Delete(shape);
            rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON_AddItemToObject(e, "data_offsets", offs);
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + t->bytes)));
        if (cJSON_GetArraySize(shape) != t->ndim || cJSON_GetArraySize(offs) != 2) {
            rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        off += t->bytes;
    }
    if (n > 0) {
        if (!(keys = malloc(sizeof *keys * (size_t)(n + 1)))) {
            rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        const char *d = dup_key(root, keys, n + 1);
        if (d) { rc = fail(err, errlen, TQ_EINVAL, "%s: tensor name \"%s\" given twice", path, d); goto out; }
    }
    if (!(json = cJSON_PrintUnformatted(root))) {
        rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    size_t jl = strlen(json), hl = (jl + 7) & ~(size_t)7;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    static const char spaces[8] = { ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ' };

    /* file */
    size_t pl = strlen(path);
    if (!(tmp = malloc(pl + 5)) || !(dir = malloc(pl + 2))) {
        rc = fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    fp = fopen(tmp, "wb");
    if (!fp) { rc = fail(err, errlen, TQ_EIO, "%s: cannot create: %s", tmp, strerror(errno)); goto out; }
    tmp_made = 1;
    int ok = write_all(fp, len8, 8) && write_all(fp, json, jl) && write_all(fp, spaces, hl - jl);
    for (int i = 0; ok && i < n; i++) ok = write_all(fp, ts[i].data, ts[i].bytes);
    if (!ok || fflush(fp) != 0) { rc = fail(err, errlen, TQ_EIO, "%s: write failed: %s", tmp, strerror(errno)); goto out; }
    if (fsync(fileno(fp)) != 0) { rc = fail(err, errlen, TQ_EIO, "%s: fsync failed: %s", tmp, strerror(errno)); goto out; }
    int cr = fclose(fp);
    fp = NULL;
    if (cr != 0) { rc = fail(err, errlen, TQ_EIO, "%s: close failed: %s", tmp, strerror(errno)); goto out; }
    if (rename(tmp, path) != 0) {
        rc = fail(err, errlen, TQ_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    tmp_made = 0;
    /* make the rename durable */
    const char *slash = strrchr(path, '/');
    if (!slash) memcpy(dir, ".", 2);
    else if (slash == path) memcpy(dir, "/", 2);
    else { memcpy(dir, path, (size_t)(slash - path)); dir[slash - path] = 0; }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) { rc = fail(err, errlen, TQ_EIO, "%s: cannot open directory %s: %s", path, dir, strerror(errno)); goto out; }
    if (fsync(dfd) != 0 && errno != EINVAL) {
        rc = fail(err, errlen, TQ_EIO, "%s: fsync of directory %s failed: %s", path, dir, strerror(errno));
    }
    close(dfd);
out:
    if (fp) fclose(fp);
    if (tmp_made) unlink(tmp);
    free(keys);
    free(tmp);
    free(dir);
    free(json);
    cJSON_Delete(root);
    return rc;
}

/* ---------------------------------------------------------------- read */

struct tq_st_file {
    uint8_t *buf;
    size_t size;
    cJSON *root;
    const cJSON *meta;     /* the "__metadata__" object or NULL */
    int n;
    tq_st_tensor *t;       /* in data order */
    int *by_name;          /* indices of t sorted by name */
};

/* an integer in [0, 2^53] */
static int json_uint(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_INT) || floor(d) != d) return 0;
    *out = (int64_t)d;
    return 1;
}

typedef struct { int64_t begin, end; int idx; } span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

static int cmp_byname_r(const void *a, const void *b, void *ctx) {
    const tq_st_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

tq_st_file *tq_st_open(const char *path, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (!path || !*path) { fail(err, errlen, TQ_EINVAL, "safetensors: no path given"); return NULL; }
    tq_st_file *f = calloc(1, sizeof *f);
    span *sp = NULL;
    const char **keys = NULL;
    FILE *fp = NULL;
    if (!f) { fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path); return NULL; }

    fp = fopen(path, "rb");
    if (!fp) { fail(err, errlen, TQ_EIO, "%s: %s", path, strerror(errno)); goto bad; }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) { fail(err, errlen, TQ_EIO, "%s: %s", path, strerror(errno)); goto bad; }
    if (!S_ISREG(st.st_mode)) { fail(err, errlen, TQ_EIO, "%s: not a regular file", path); goto bad; }
    if (st.st_size < 8) {
        fail(err, errlen, TQ_EDATA, "%s: %lld bytes is too short for a safetensors file (8-byte "
             "header length first)", path, (long long)st.st_size);
        goto bad;
    }
    f->size = (size_t)st.st_size;
    if (!(f->buf = malloc(f->size))) { fail(err, errlen, TQ_ENOMEM, "%s: out of memory (%zu bytes)", path, f->size); goto bad; }
    if (fread(f->buf, 1, f->size, fp) != f->size) {
        fail(err, errlen, ferror(fp) ? TQ_EIO : TQ_EDATA, "%s: short read", path);
        goto bad;
    }
    fclose(fp);
    fp = NULL;

    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)f->buf[i] << (8 * i);
    if (hl >= ST_MAX_HEADER) {
        fail(err, errlen, TQ_EDATA, "%s: header length %llu exceeds the 100 MB limit", path,
             (unsigned long long)hl);
        goto bad;
    }
    if (hl > f->size - 8) {
        fail(err, errlen, TQ_EDATA, "%s: header length %llu exceeds the file (%zu bytes)", path,
             (unsigned long long)hl, f->size);
        goto bad;
    }
    const char *hdr = (const char *)f->buf + 8, *end = NULL;
    f->root = cJSON_ParseWithLengthOpts(hdr, (size_t)hl, &end, 0);
    if (!f->root) {
        fail(err, errlen, TQ_EDATA, "%s: the header is not valid JSON (error near header byte %lld)",
             path, (long long)(end && end >= hdr ? end - hdr : 0));
        goto bad;
    }
    for (const char *p = end; p < hdr + hl; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            fail(err, errlen, TQ_EDATA, "%s: unexpected bytes after the header's JSON (header byte "
                 "%lld)", path, (long long)(p - hdr));
            goto bad;
        }
    if (!cJSON_IsObject(f->root)) { fail(err, errlen, TQ_EDATA, "%s: the header is not a JSON object", path); goto bad; }

    int entries = cJSON_GetArraySize(f->root);
    if (!(keys = malloc(sizeof *keys * (size_t)(entries + 1)))) { fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path); goto bad; }
    const char *dk = dup_key(f->root, keys, entries);
    if (dk) { fail(err, errlen, TQ_EDATA, "%s: header entry \"%s\" appears twice", path, dk); goto bad; }

    const uint64_t data_size = f->size - 8 - hl;
    f->t = calloc((size_t)entries + 1, sizeof *f->t);
    sp = calloc((size_t)entries + 1, sizeof *sp);
    f->by_name = calloc((size_t)entries + 1, sizeof *f->by_name);
    if (!f->t || !sp || !f->by_name) { fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path); goto bad; }

    int n = 0;
    for (const cJSON *e = f->root->child; e; e = e->next) {
        const char *name = e->string ? e->string : "";
        if (!strcmp(name, "__metadata__")) {
            if (!cJSON_IsObject(e)) { fail(err, errlen, TQ_EDATA, "%s: __metadata__ is not an object", path); goto bad; }
            int mc = cJSON_GetArraySize(e);
            for (const cJSON *m = e->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    fail(err, errlen, TQ_EDATA, "%s: __metadata__ value of \"%s\" is not a string",
                         path, m->string ? m->string : "?");
                    goto bad;
                }
            const char **mk = malloc(sizeof *mk * (size_t)(mc + 1));
            if (!mk) { fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path); goto bad; }
            dk = dup_key(e, mk, mc);
            if (dk) {
                fail(err, errlen, TQ_EDATA, "%s: __metadata__ key \"%s\" appears twice", path, dk);
                free(mk);
                goto bad;
            }
            free(mk);
            f->meta = e;
            continue;
        }
        tq_st_tensor *t = &f->t[n];
        if (strlen(name) >= sizeof t->name) {
            fail(err, errlen, TQ_EDATA, "%s: tensor name \"%.40s…\" is longer than %d bytes", path,
                 name, ST_NAME_MAX - 1);
            goto bad;
        }
        snprintf(t->name, sizeof t->name, "%s", name);
        if (!cJSON_IsObject(e)) { fail(err, errlen, TQ_EDATA, "%s: tensor %s: entry is not an object", path, name); goto bad; }
        const cJSON *dt = NULL, *shape = NULL, *offs = NULL;
        for (const cJSON *k = e->child; k; k = k->next) {
            const char *kn = k->string ? k->string : "";
            const cJSON **slot = !strcmp(kn, "dtype") ? &dt : !strcmp(kn, "shape") ? &shape
                               : !strcmp(kn, "data_offsets") ? &offs : NULL;
            if (!slot) { fail(err, errlen, TQ_EDATA, "%s: tensor %s: unexpected field \"%s\"", path, name, kn); goto bad; }
            if (*slot) { fail(err, errlen, TQ_EDATA, "%s: tensor %s: field \"%s\" appears twice", path, name, kn); goto bad; }
            *slot = k;
        }
        if (!dt || !shape || !offs) {
            fail(err, errlen, TQ_EDATA, "%s: tensor %s: missing \"%s\"", path, name,
                 !dt ? "dtype" : !shape ? "shape" : "data_offsets");
            goto bad;
        }
        size_t es = cJSON_IsString(dt) ? tq_st_dtype_size(dt->valuestring) : 0;
        if (!es) {
            if (cJSON_IsString(dt))
                fail(err, errlen, TQ_EDATA, "%s: tensor %s: unknown dtype \"%.16s\"", path, name,
                     dt->valuestring);
            else
                fail(err, errlen, TQ_EDATA, "%s: tensor %s: dtype is not a string", path, name);
            goto bad;
        }
        snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
        if (!cJSON_IsArray(shape)) { fail(err, errlen, TQ_EDATA, "%s: tensor %s: shape is not an array", path, name); goto bad; }
        int nd = cJSON_GetArraySize(shape);
        if (nd > 8) { fail(err, errlen, TQ_EDATA, "%s: tensor %s: %d dimensions (at most 8)", path, name, nd); goto bad; }
        t->ndim = 0;
        for (const cJSON *d = shape->child; d; d = d->next)
            if (!json_uint(d, &t->shape[t->ndim++])) {
                fail(err, errlen, TQ_EDATA, "%s: tensor %s: shape entry %d is not a non-negative "
                     "integer", path, name, t->ndim - 1);
                goto bad;
            }
        if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
            !json_uint(offs->child, &sp[n].begin) || !json_uint(offs->child->next, &sp[n].end)) {
            fail(err, errlen, TQ_EDATA, "%s: tensor %s: data_offsets is not [begin, end] of "
                 "non-negative integers", path, name);
            goto bad;
        }
        if (sp[n].begin > sp[n].end || (uint64_t)sp[n].end > data_size) {
            fail(err, errlen, TQ_EDATA, "%s: tensor %s: data_offsets [%lld, %lld] out of range "
                 "(data section: %llu bytes)", path, name, (long long)sp[n].begin,
                 (long long)sp[n].end, (unsigned long long)data_size);
            goto bad;
        }
        int64_t want = tensor_bytes(t->shape, t->ndim, es);
        if (want < 0 || want != sp[n].end - sp[n].begin) {
            fail(err, errlen, TQ_EDATA, "%s: tensor %s: data_offsets span %lld bytes but %s of that "
                 "shape needs %lld", path, name, (long long)(sp[n].end - sp[n].begin), t->dtype,
                 (long long)want);
            goto bad;
        }
        t->bytes = (size_t)want;
        t->data = f->buf + 8 + hl + sp[n].begin;
        sp[n].idx = n;
        n++;
    }

    /* the tensors tile the data section exactly */
    qsort(sp, (size_t)n, sizeof *sp, cmp_span);
    int64_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (sp[i].begin != pos) {
            fail(err, errlen, TQ_EDATA, "%s: tensor %s: data_offsets [%lld, %lld] %s (expected "
                 "it to begin at %lld)", path, f->t[sp[i].idx].name, (long long)sp[i].begin,
                 (long long)sp[i].end, sp[i].begin < pos ? "overlap another tensor" : "leave a gap",
                 (long long)pos);
            goto bad;
        }
        pos = sp[i].end;
    }
    if ((uint64_t)pos != data_size) {
        fail(err, errlen, TQ_EDATA, "%s: the data section has %llu bytes but the tensors cover %lld",
             path, (unsigned long long)data_size, (long long)pos);
        goto bad;
    }
    /* store in data order */
    tq_st_tensor *ordered = calloc((size_t)n + 1, sizeof *ordered);
    if (!ordered) { fail(err, errlen, TQ_ENOMEM, "%s: out of memory", path); goto bad; }
    for (int i = 0; i < n; i++) ordered[i] = f->t[sp[i].idx];
    free(f->t);
    f->t = ordered;
    f->n = n;
    for (int i = 0; i < n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)n, sizeof *f->by_name, cmp_byname_r, f->t);
    free(sp);
    free(keys);
    return f;

bad:
    if (fp) fclose(fp);
    free(sp);
    free(keys);
    tq_st_close(f);
    return NULL;
}

int tq_st_count(const tq_st_file *f) { return f ? f->n : 0; }

const tq_st_tensor *tq_st_at(const tq_st_file *f, int i) {
    return f && i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const tq_st_tensor *tq_st_find(const tq_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const tq_st_tensor *t = &f->t[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (!c) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *tq_st_meta(const tq_st_file *f, const char *key) {
    if (!f || !f->meta || !key) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

void tq_st_close(tq_st_file *f) {
    if (!f) return;
    cJSON_Delete(f->root);
    free(f->buf);
    free(f->t);
    free(f->by_name);
    free(f);
}
