/* test_safetensors.c — train/safetensors.c: round trip of every dtype the engine writes with
 * metadata, the exact bytes of a tiny file, a Python (stdlib json + struct) reading of a file
 * written here, write-side argument checks, and corrupt inputs (each gives NULL and a message;
 * every truncation and many byte flips of a good file must not crash). */
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

#include "safetensors.h"

static char errbuf[1024];
static char tmpdir[256];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(p);
}
static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tq_test_st_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

static const char *tpath(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) & 3;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    unlink(path);   /* truncating a written file makes ext4 flush it (auto_da_alloc): slow */
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static tq_st_tensor mk(const char *name, const char *dtype, int ndim, const int64_t *shape,
                       const void *data, size_t bytes) {
    tq_st_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    snprintf(t.dtype, sizeof t.dtype, "%s", dtype);
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < 8; i++) t.shape[i] = shape[i];
    t.data = data;
    t.bytes = bytes;
    return t;
}

/* the tensors of the round trip */
static const float W[6] = { -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f };
static const uint16_t H16[4] = { 0x3c00, 0xc100, 0x7bff, 0x0000 };   /* 1, -2.5, 65504, 0 */
static const uint16_t B16[4] = { 0x3f80, 0xc040, 0x3f00, 0x4380 };   /* 1, -3, 0.5, 256 */
static const int64_t I64V[3] = { -5, 1ll << 40, 7 };
static const int32_t I32V[1] = { -123456 };
static const uint8_t U8V[5] = { 0, 1, 2, 254, 255 };
static const float SC[1] = { 3.25f };
#define NT 8

static int build(tq_st_tensor *ts) {
    static const int64_t s23[] = { 2, 3 }, s4[] = { 4 }, s22[] = { 2, 2 }, s3[] = { 3 },
                         s1[] = { 1 }, s5[] = { 5 }, s03[] = { 0, 3 };
    int k = 0;
    ts[k++] = mk("conv1.weight", "F32", 2, s23, W, sizeof W);
    ts[k++] = mk("layer1.0.bn1.h", "F16", 1, s4, H16, sizeof H16);
    ts[k++] = mk("b", "BF16", 2, s22, B16, sizeof B16);
    ts[k++] = mk("bn.num_batches_tracked", "I64", 1, s3, I64V, sizeof I64V);
    ts[k++] = mk("i", "I32", 1, s1, I32V, sizeof I32V);
    ts[k++] = mk("u", "U8", 1, s5, U8V, sizeof U8V);
    ts[k++] = mk("scalar", "F32", 0, NULL, SC, sizeof SC);
    ts[k++] = mk("empty", "F32", 2, s03, NULL, 0);
    return k;
}

static cJSON *build_meta(void) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "step", "100");
    cJSON_AddStringToObject(m, "format", "pt");
    cJSON_AddStringToObject(m, "note", "quote \" backslash \\ ünïcode");
    return m;
}

static void test_round_trip(void **state) {
    (void)state;
    tq_st_tensor ts[NT];
    int n = build(ts);
    cJSON *meta = build_meta();
    const char *p = tpath("rt.safetensors");
    int rc = tq_st_write(p, ts, n, meta, errbuf, sizeof errbuf);
    if (rc) fail_msg("write: %s", errbuf);
    cJSON_Delete(meta);
    assert_int_equal(access(tpath("rt.safetensors.tmp"), F_OK), -1);   /* no temp left */

    tq_st_file *f = tq_st_open(p, errbuf, sizeof errbuf);
    if (!f) fail_msg("open: %s", errbuf);
    assert_int_equal(tq_st_count(f), n);
    for (int i = 0; i < n; i++) {
        const tq_st_tensor *t = tq_st_at(f, i);
        assert_non_null(t);
        assert_string_equal(t->name, ts[i].name);    /* written order = data order */
        assert_string_equal(t->dtype, ts[i].dtype);
        assert_int_equal(t->ndim, ts[i].ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], ts[i].shape[d]);
        assert_int_equal(t->bytes, ts[i].bytes);
        if (t->bytes) assert_memory_equal(t->data, ts[i].data, t->bytes);
        assert_ptr_equal(tq_st_find(f, ts[i].name), t);
    }
    assert_null(tq_st_at(f, n));
    assert_null(tq_st_at(f, -1));
    assert_null(tq_st_find(f, "nope"));
    assert_null(tq_st_find(f, "__metadata__"));
    assert_string_equal(tq_st_meta(f, "step"), "100");
    assert_string_equal(tq_st_meta(f, "format"), "pt");
    assert_string_equal(tq_st_meta(f, "note"), "quote \" backslash \\ ünïcode");
    assert_null(tq_st_meta(f, "absent"));
    tq_st_close(f);

    /* header length is a multiple of 8; the data follows it */
    size_t len;
    uint8_t *b = slurp(p, &len);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)b[i] << (8 * i);
    assert_int_equal(hl % 8, 0);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += ts[i].bytes;
    assert_int_equal(len, 8 + hl + total);
    free(b);

    /* overwrite in place: the new content wins */
    rc = tq_st_write(p, ts, 1, NULL, errbuf, sizeof errbuf);
    if (rc) fail_msg("rewrite: %s", errbuf);
    f = tq_st_open(p, errbuf, sizeof errbuf);
    if (!f) fail_msg("open: %s", errbuf);
    assert_int_equal(tq_st_count(f), 1);
    assert_null(tq_st_meta(f, "step"));
    tq_st_close(f);

    /* no tensors at all; an empty meta object is omitted */
    cJSON *em = cJSON_CreateObject();
    rc = tq_st_write(p, NULL, 0, em, errbuf, sizeof errbuf);
    cJSON_Delete(em);
    if (rc) fail_msg("write empty: %s", errbuf);
    b = slurp(p, &len);
    assert_int_equal(len, 16);
    assert_memory_equal(b, "\x08\0\0\0\0\0\0\0{}      ", 16);
    free(b);
    f = tq_st_open(p, errbuf, sizeof errbuf);
    if (!f) fail_msg("open: %s", errbuf);
    assert_int_equal(tq_st_count(f), 0);
    tq_st_close(f);

    /* a relative path (directory ".") */
    char cwd[1024];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(tmpdir), 0);
    rc = tq_st_write("rel.safetensors", ts, 1, NULL, errbuf, sizeof errbuf);
    assert_int_equal(chdir(cwd), 0);
    if (rc) fail_msg("relative: %s", errbuf);
    assert_int_equal(access(tpath("rel.safetensors"), F_OK), 0);
}

static void test_exact_bytes(void **state) {
    (void)state;
    static const float v[2] = { 1.0f, -2.0f };
    static const int64_t s2[] = { 2 };
    tq_st_tensor t = mk("w", "F32", 1, s2, v, sizeof v);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "k", "v");
    const char *p = tpath("tiny.safetensors");
    int rc = tq_st_write(p, &t, 1, m, errbuf, sizeof errbuf);
    cJSON_Delete(m);
    if (rc) fail_msg("write: %s", errbuf);
    const char *json = "{\"__metadata__\":{\"k\":\"v\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
                       "\"data_offsets\":[0,8]}}";
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;
    uint8_t want[256];
    memset(want, 0, sizeof want);
    want[0] = (uint8_t)hl;
    memcpy(want + 8, json, jl);
    memset(want + 8 + jl, ' ', hl - jl);
    memcpy(want + 8 + hl, "\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
    size_t len;
    uint8_t *b = slurp(p, &len);
    assert_int_equal(len, 8 + hl + 8);
    assert_memory_equal(b, want, len);
    free(b);
}

/* a file written here read by Python's json + struct (no numpy needed) */
static const char PY[] =
    "import json, struct, sys\n"
    "b = open(sys.argv[1], 'rb').read()\n"
    "n = struct.unpack('<Q', b[:8])[0]\n"
    "assert n % 8 == 0 and 8 + n <= len(b)\n"
    "h = json.loads(b[8:8 + n].decode('utf-8'))\n"
    "d = b[8 + n:]\n"
    "def get(name, fmt):\n"
    "    e = h[name]\n"
    "    s, t = e['data_offsets']\n"
    "    k = (t - s) // struct.calcsize(fmt)\n"
    "    return e['dtype'], e['shape'], list(struct.unpack('<%d%s' % (k, fmt), d[s:t]))\n"
    "assert list(h) == ['__metadata__', 'conv1.weight', 'layer1.0.bn1.h', 'b',\n"
    "                   'bn.num_batches_tracked', 'i', 'u', 'scalar', 'empty'], list(h)\n"
    "assert h['__metadata__'] == {'step': '100', 'format': 'pt',\n"
    "                             'note': 'quote \" backslash \\\\ \\u00fcn\\u00efcode'}, h['__metadata__']\n"
    "assert get('conv1.weight', 'f') == ('F32', [2, 3], [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5])\n"
    "assert get('layer1.0.bn1.h', 'e') == ('F16', [4], [1.0, -2.5, 65504.0, 0.0])\n"
    "dt, sh, v = get('b', 'H')\n"
    "assert (dt, sh) == ('BF16', [2, 2])\n"
    "assert [struct.unpack('<f', struct.pack('<I', x << 16))[0] for x in v] == [1.0, -3.0, 0.5, 256.0]\n"
    "assert get('bn.num_batches_tracked', 'q') == ('I64', [3], [-5, 1 << 40, 7])\n"
    "assert get('i', 'i') == ('I32', [1], [-123456])\n"
    "assert get('u', 'B') == ('U8', [5], [0, 1, 2, 254, 255])\n"
    "assert get('scalar', 'f') == ('F32', [], [3.25])\n"
    "assert get('empty', 'f') == ('F32', [0, 3], [])\n"
    "ends = sorted(e['data_offsets'] for k, e in h.items() if k != '__metadata__')\n"
    "assert ends[0][0] == 0 and ends[-1][1] == len(d)\n"
    "assert all(a[1] == c[0] for a, c in zip(ends, ends[1:]))\n"
    "print('python-ok')\n";

static void test_python_reads_it(void **state) {
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0) skip();
    tq_st_tensor ts[NT];
    int n = build(ts);
    cJSON *meta = build_meta();
    const char *p = tpath("py.safetensors");
    int rc = tq_st_write(p, ts, n, meta, errbuf, sizeof errbuf);
    cJSON_Delete(meta);
    if (rc) fail_msg("write: %s", errbuf);
    const char *script = tpath("check.py");
    spit(script, PY, strlen(PY));
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' 2>&1", script, p);
    FILE *pp = popen(cmd, "r");
    assert_non_null(pp);
    size_t got = fread(out, 1, sizeof out - 1, pp);
    out[got] = 0;
    int st = pclose(pp);
    if (st != 0 || !strstr(out, "python-ok")) fail_msg("python check failed (%d): %s", st, out);
}

static void test_write_errors(void **state) {
    (void)state;
    static const float v[2] = { 1, 2 };
    static const int64_t s2[] = { 2 }, s3[] = { 3 }, s9[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 2 };
    const char *p = tpath("bad.safetensors");
    tq_st_tensor t[2];

    t[0] = mk("a", "F32", 1, s3, v, sizeof v);   /* 3 elements, 8 bytes */
    assert_int_equal(tq_st_write(p, t, 1, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_non_null(strstr(errbuf, "a"));
    t[0] = mk("a", "F33", 1, s2, v, sizeof v);
    assert_int_equal(tq_st_write(p, t, 1, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_non_null(strstr(errbuf, "dtype"));
    t[0] = mk("a", "F32", 1, s2, v, sizeof v);
    t[1] = mk("a", "U8", 1, s2, v, 2);
    assert_int_equal(tq_st_write(p, t, 2, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_non_null(strstr(errbuf, "twice"));
    t[1] = mk("__metadata__", "U8", 1, s2, v, 2);
    assert_int_equal(tq_st_write(p, t, 2, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    t[1] = mk("", "U8", 1, s2, v, 2);
    assert_int_equal(tq_st_write(p, t, 2, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    t[1] = mk("c", "U8", 8, s9, v, 2);
    t[1].ndim = 9;
    assert_int_equal(tq_st_write(p, t, 2, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    t[1] = mk("c", "U8", 1, s2, NULL, 2);
    assert_int_equal(tq_st_write(p, t, 2, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "step", 5);
    assert_int_equal(tq_st_write(p, t, 1, m, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_non_null(strstr(errbuf, "step"));
    cJSON_Delete(m);
    m = cJSON_CreateArray();
    assert_int_equal(tq_st_write(p, t, 1, m, errbuf, sizeof errbuf), TQ_EINVAL);
    cJSON_Delete(m);
    assert_int_equal(tq_st_write(p, t, -1, NULL, errbuf, sizeof errbuf), TQ_EINVAL);
    assert_int_equal(access(p, F_OK), -1);   /* nothing written */

    /* I/O: a missing directory */
    const char *q = "/nonexistent/tq_dir/x.safetensors";
    assert_int_equal(tq_st_write(q, t, 1, NULL, errbuf, sizeof errbuf), TQ_EIO);
    assert_non_null(strstr(errbuf, q));
    assert_int_equal(tq_st_write(q, t, 1, NULL, NULL, 0), TQ_EIO);   /* err may be NULL */
}

/* a file from a header string (length hl, or strlen when hl < 0) and `dlen` data bytes */
static const char *craft(const char *header, int64_t hl, size_t dlen) {
    const char *p = tpath("crafted.safetensors");
    size_t jl = strlen(header);
    uint64_t l = hl < 0 ? jl : (uint64_t)hl;
    uint8_t *b = calloc(1, 8 + jl + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(l >> (8 * i));
    memcpy(b + 8, header, jl);
    for (size_t i = 0; i < dlen; i++) b[8 + jl + i] = (uint8_t)i;
    spit(p, b, 8 + jl + dlen);
    free(b);
    return p;
}

static void expect_bad(const char *p, const char *needle) {
    errbuf[0] = 0;
    tq_st_file *f = tq_st_open(p, errbuf, sizeof errbuf);
    if (f) { tq_st_close(f); fail_msg("opened a bad file (want \"%s\")", needle ? needle : ""); }
    if (!strstr(errbuf, p)) fail_msg("message does not name the file: %s", errbuf);
    if (needle && !strstr(errbuf, needle)) fail_msg("message \"%s\" lacks \"%s\"", errbuf, needle);
}

#define T1(dt, shape, offs) "{\"a\":{\"dtype\":" dt ",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static void test_corrupt(void **state) {
    (void)state;
    /* the control case opens */
    tq_st_file *f = tq_st_open(craft(T1("\"F32\"", "[2]", "[0,8]"), -1, 8), errbuf, sizeof errbuf);
    if (!f) fail_msg("control: %s", errbuf);
    assert_int_equal(tq_st_count(f), 1);
    tq_st_close(f);

    expect_bad(tpath("missing.safetensors"), "No such file");
    expect_bad(tmpdir, NULL);
    spit(tpath("short"), "\x05\0\0\0", 4);
    expect_bad(tpath("short"), "too short");
    spit(tpath("zero"), "", 0);
    expect_bad(tpath("zero"), "too short");

    struct { const char *hdr; int64_t hl; size_t dlen; const char *needle; } c[] = {
        { T1("\"F32\"", "[2]", "[0,8]"), 1ll << 40, 8, "100 MB" },
        { T1("\"F32\"", "[2]", "[0,8]"), 100000000, 8, "100 MB" },
        { T1("\"F32\"", "[2]", "[0,8]"), 99999999, 8, "exceeds the file" },
        { T1("\"F32\"", "[2]", "[0,8]"), 0, 8, "JSON" },
        { T1("\"F32\"", "[2]", "[0,8]"), 20, 8, "JSON" },              /* cut inside the JSON */
        { "{\"a\":{\"dtype\":\"F32\",", -1, 8, "JSON" },
        { "not json at all", -1, 0, "JSON" },
        { "[1,2]", -1, 0, "not a JSON object" },
        { T1("\"F32\"", "[2]", "[0,8]") "x", -1, 8, "unexpected bytes" },
        { T1("\"F32\"", "[2]", "[0,8]"), -1, 7, "out of range" },
        { T1("\"F32\"", "[2]", "[0,8]"), -1, 9, "cover" },              /* trailing data */
        { T1("\"F32\"", "[2]", "[4,12]"), -1, 12, "gap" },
        { T1("\"F32\"", "[3]", "[0,8]"), -1, 8, "needs 12" },           /* wrong byte count */
        { T1("\"F32\"", "[2]", "[8,0]"), -1, 8, "out of range" },
        { T1("\"F33\"", "[2]", "[0,8]"), -1, 8, "unknown dtype \"F33\"" },
        { T1("\"f32\"", "[2]", "[0,8]"), -1, 8, "unknown dtype" },
        { T1("5", "[2]", "[0,8]"), -1, 8, "dtype is not a string" },
        { T1("\"F32\"", "[-2]", "[0,8]"), -1, 8, "shape" },
        { T1("\"F32\"", "[1.5]", "[0,8]"), -1, 8, "shape" },
        { T1("\"F32\"", "[\"2\"]", "[0,8]"), -1, 8, "shape" },
        { T1("\"F32\"", "2", "[0,8]"), -1, 8, "shape is not an array" },
        { T1("\"F32\"", "[1,1,1,1,1,1,1,1,2]", "[0,8]"), -1, 8, "9 dimensions" },
        { T1("\"F32\"", "[4294967296,4294967296,4294967296]", "[0,8]"), -1, 8, "needs" },
        { T1("\"F32\"", "[2]", "[0,8,9]"), -1, 8, "data_offsets" },
        { T1("\"F32\"", "[2]", "[0]"), -1, 8, "data_offsets" },
        { T1("\"F32\"", "[2]", "[-1,7]"), -1, 8, "data_offsets" },
        { T1("\"F32\"", "[2]", "[0,1e300]"), -1, 8, "data_offsets" },
        { T1("\"F32\"", "[2]", "[\"0\",\"8\"]"), -1, 8, "data_offsets" },
        { T1("\"F32\"", "[2]", "{}"), -1, 8, "data_offsets" },
        { "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", -1, 8, "missing \"shape\"" },
        { "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8, "missing \"dtype\"" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", -1, 8, "missing \"data_offsets\"" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", -1, 8,
          "unexpected field \"x\"" },
        { "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8,
          "twice" },
        { "{\"a\":5}", -1, 0, "not an object" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", -1, 12, "overlap" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", -1, 12, "gap" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, 8, "twice" },
        { "{\"__metadata__\":{\"k\":1}," "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
          -1, 1, "not a string" },
        { "{\"__metadata__\":[1]}", -1, 0, "__metadata__ is not an object" },
        { "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", -1, 0, "twice" },
        { "{\"__metadata__\":{},\"__metadata__\":{}}", -1, 0, "twice" },
        { "{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":"
          "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", -1, 1, "longer than" },
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        const char *p = craft(c[k].hdr, c[k].hl, c[k].dlen);
        errbuf[0] = 0;
        f = tq_st_open(p, errbuf, sizeof errbuf);
        if (f) { tq_st_close(f); fail_msg("case %zu opened (want \"%s\")", k, c[k].needle); }
        if (!strstr(errbuf, p) || !strstr(errbuf, c[k].needle))
            fail_msg("case %zu: message \"%s\" (want the path and \"%s\")", k, errbuf, c[k].needle);
    }

    /* valid oddities: whitespace padding, metadata only, zero-size tensors, a header not a
     * multiple of 8, tensors listed out of data order */
    const char *okh[] = {
        "{\"__metadata__\":{\"k\":\"v\"}}\n\t  ",
        "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"f\":{\"dtype\":\"F32\",\"shape\":[5,0],\"data_offsets\":[0,0]}}",
        "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]},"
        "\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}",
    };
    size_t okd[] = { 0, 0, 3 };
    for (size_t k = 0; k < 3; k++) {
        f = tq_st_open(craft(okh[k], -1, okd[k]), errbuf, sizeof errbuf);
        if (!f) fail_msg("ok case %zu: %s", k, errbuf);
        tq_st_close(f);
    }
    f = tq_st_open(craft(okh[2], -1, 3), errbuf, sizeof errbuf);
    assert_non_null(f);
    assert_string_equal(tq_st_at(f, 0)->name, "a");   /* data order */
    assert_string_equal(tq_st_at(f, 1)->name, "b");
    assert_int_equal(tq_st_at(f, 0)->ndim, 0);
    assert_int_equal(*(const uint8_t *)tq_st_find(f, "b")->data, 1);
    tq_st_close(f);
}

/* every truncation and many byte flips of a good file: no crash, and every truncation fails */
static void test_fuzz(void **state) {
    (void)state;
    tq_st_tensor ts[NT];
    int n = build(ts);
    cJSON *meta = build_meta();
    const char *p = tpath("fz.safetensors");
    int rc = tq_st_write(p, ts, n, meta, errbuf, sizeof errbuf);
    cJSON_Delete(meta);
    if (rc) fail_msg("write: %s", errbuf);
    size_t len;
    uint8_t *b = slurp(p, &len);
    const char *q = tpath("fz2.safetensors");
    for (size_t cut = 0; cut < len; cut++) {
        spit(q, b, cut);
        tq_st_file *f = tq_st_open(q, errbuf, sizeof errbuf);
        if (f) { tq_st_close(f); fail_msg("truncated to %zu of %zu bytes opened", cut, len); }
    }
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)b[i] << (8 * i);
    static const uint8_t vals[] = { 0, '"', '}', ']', '{', '[', ',', ':', '9', '-', ' ', 0xff, 'e' };
    int opened = 0;
    for (size_t pos = 0; pos < 8 + hl; pos++)
        for (size_t v = 0; v < sizeof vals; v++) {
            uint8_t old = b[pos];
            if (old == vals[v]) continue;
            b[pos] = vals[v];
            spit(q, b, len);
            tq_st_file *f = tq_st_open(q, errbuf, sizeof errbuf);
            if (f) {
                opened++;
                for (int i = 0; i < tq_st_count(f); i++) {
                    const tq_st_tensor *t = tq_st_at(f, i);
                    assert_ptr_equal(tq_st_find(f, t->name), t);
                    volatile uint8_t sink = 0;
                    for (size_t j = 0; j < t->bytes; j++) sink ^= ((const uint8_t *)t->data)[j];
                    (void)sink;
                }
                tq_st_close(f);
            } else {
                assert_true(errbuf[0] != 0);
            }
            b[pos] = old;
        }
    (void)opened;
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_exact_bytes),
        cmocka_unit_test(test_python_reads_it),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
