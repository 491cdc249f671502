/* spec.c — parse, validate, render and document the job spec (docs/spec.md). See spec.h.
 *
 * Parsing walks the document's members in order, so the first bad field in the text is the one
 * reported; cross-field rules (steps with epochs, cifar10 without data_dir, synthetic with
 * another dataset, the batch rules below) are checked after the walk. Nested objects have their own member lists; the
 * optimizer's and the lr schedule's members depend on their `type`, which is read first.
 * Rendering prints every number with the fewest digits that parse back to the same double, so
 * tq_spec_parse(tq_spec_to_json(s)) reproduces s exactly.
 *
 * Batch rules. batch_size is an integer or "auto"; effective_batch N (samples per optimizer
 * step) goes with either:
 * - an explicit batch_size b: b must divide N with N/b <= 1024, and accum_steps = N/b (an
 *   accum_steps given as well must agree);
 * - "auto": with accum_steps k given, k must divide N and batch_size = N/k (the resolved form,
 *   what tq_spec_set_batch leaves and what renders back); without it the spec is unresolved,
 *   batch_size and accum_steps 0, until train/autobatch.c picks the micro-batch.
 * "auto" without effective_batch, and effective_batch with batch_size left at its default,
 * are errors. An auto spec renders "batch_size":"auto" and "effective_batch", plus
 * "accum_steps" once resolved; any other spec renders as before, plus "effective_batch" when
 * it was given.
 *
 * Strings are valid UTF-8 without control characters (train/utf8.h), within their byte limits;
 * integers are numbers whose text is exactly an integer in range (1e-400 is not 0, 1.5 and
 * 9007199254740993 are not integers); every count and rate has an upper bound (the *_MAX below,
 * docs/spec.md, generated from the documentation table at the end of this file).
 *
 * Documentation. The field table at the end (doc_fields) gives every field its type, default,
 * range, meaning and example; bounds are the *_MAX below and the parser's range constants, and
 * enum values the name arrays the parser looks up, so docs/spec.md and trainq(1) (`make docs`)
 * cannot drift from what is accepted. tests/unit/test_spec.c parses every example and both
 * bounds of every field, and checks that the table covers exactly the parser's member lists
 * (root_names and the nested *_fields), which are also what an unknown field's "did you mean"
 * is chosen from. */
#include "spec.h"
#include "utf8.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define INT_MAX_JSON 9007199254740992LL   /* 2^53: the largest integer a JSON double holds exactly */
#define NAME_MAX_LEN 128
#define PATH_LEN_MAX 1023            /* data_dir, init_from: TQ_PATH_MAX - 1 bytes */
_Static_assert(PATH_LEN_MAX == TQ_PATH_MAX - 1, "a path and its NUL fill TQ_PATH_MAX");
#define BATCH_MAX 65536
#define ACCUM_MAX 1024
#define EFFECTIVE_BATCH_MAX ((int64_t)BATCH_MAX * ACCUM_MAX)
/* upper bounds of the counts (docs/api.md, "Job spec ranges") */
#define STEPS_MAX 10000000           /* steps, warmup_steps, step_size, eval/checkpoint_every */
#define EPOCHS_MAX 100000
#define SUBSET_MAX 10000000          /* train_subset, eval_subset */
#define TIMEOUT_MAX 31536000         /* timeout_s: 365 days */
#define LR_MAX 10.0
#define MAX_MEMORY_MB_MAX (1LL << 30)
#define PRIORITY_MAX 100             /* priority: -PRIORITY_MAX..PRIORITY_MAX */
#define THREADS_MAX 256
#define PRUNE_MAX 0.95
#define SYNTH_COUNT_MAX 10000000     /* synthetic.train, synthetic.test */
#define SYNTH_SIDE_MAX 4096          /* synthetic.height, synthetic.width */
#define SYNTH_CHANNELS_MAX 3         /* synthetic.channels (the dataset keeps 3 channel means) */
#define DEVICE_INDEX_MAX 255         /* cuda:N */
/* A private bit in a cJSON number's type (cJSON's own use the low 10 bits, and cJSON_IsNumber
 * masks them): the number's text is not exactly an integer, though its double may be one
 * ("1.0000000000000001", "9007199254740993"). Set by scan_tree, read by get_int. */
#define NUM_NOT_INTEGER (1 << 12)

/* ---- names ---------------------------------------------------------------------------- */

static const char *const model_names[] = { "mlp", "cnn", "resnet20", "resnet18", "resnet50" };
static const char *const dataset_names[] = { "fashion-mnist", "cifar10", "synthetic" };
static const char *const amp_names[] = { "off", "fp16", "bf16" };
static const char *const opt_names[] = { "sgd", "adamw" };
static const char *const sched_names[] = { "constant", "cosine", "step", "onecycle" };
/* the members of the nested objects (the root's are root_names, below) */
static const char *const optimizer_fields[] = { "type", "lr", "momentum", "nesterov", "betas", "eps",
                                                "weight_decay" };
static const char *const lr_schedule_fields[] = { "type", "warmup_steps", "step_size", "gamma" };
static const char *const loss_scale_fields[] = { "init", "growth_factor", "backoff_factor",
                                                 "growth_interval" };
static const char *const prune_fields[] = { "amount" };
static const char *const synthetic_fields[] = { "train", "test", "height", "width", "channels" };
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

const char *tq_model_name(tq_model_kind k) {
    return (int)k >= 0 && (int)k < COUNT(model_names) ? model_names[k] : "?";
}
const char *tq_dataset_name(tq_data_kind k) {
    return (int)k >= 0 && (int)k < COUNT(dataset_names) ? dataset_names[k] : "?";
}
const char *tq_amp_name(tq_amp a) {
    return (int)a >= 0 && (int)a < COUNT(amp_names) ? amp_names[a] : "?";
}
int tq_spec_recompute(const tq_spec *s) {
    return s->recompute != TQ_RECOMPUTE_AUTO ? s->recompute != 0 : strcmp(s->device, "cpu") != 0;
}
const char *tq_tf32_name(tq_tf32 t) {
    static const char *const names[] = { "off", "conv", "all" };
    return (int)t >= 0 && (int)t < COUNT(names) ? names[t] : "?";
}

static int lookup(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

/* ---- defaults ------------------------------------------------------------------------- */

static void optimizer_defaults(tq_spec *s, tq_opt_kind type) {
    memset(&s->optimizer, 0, sizeof s->optimizer);
    s->optimizer.type = type;
    if (type == TQ_OPT_SGD) {
        s->optimizer.lr = 0.05;
        s->optimizer.momentum = 0.9;
        s->optimizer.nesterov = 1;
        s->optimizer.weight_decay = 5e-4;
    } else {
        s->optimizer.lr = 1e-3;
        s->optimizer.beta1 = 0.9;
        s->optimizer.beta2 = 0.999;
        s->optimizer.eps = 1e-8;
        s->optimizer.weight_decay = 1e-2;
    }
}

void tq_spec_defaults(tq_spec *s) {
    memset(s, 0, sizeof *s);
    s->model = TQ_MODEL_CNN;
    s->dataset = TQ_DATA_FASHION_MNIST;
    snprintf(s->data_dir, sizeof s->data_dir, "%s", FMNIST_DIR);
    s->batch_size = 32;
    s->accum_steps = 1;
    s->amp = TQ_AMP_OFF;
    s->steps = 0;
    s->epochs = 1;
    optimizer_defaults(s, TQ_OPT_SGD);
    s->lr_schedule.type = TQ_SCHED_CONSTANT;
    s->lr_schedule.warmup_steps = 0;
    s->lr_schedule.step_size = 1000;
    s->lr_schedule.gamma = 0.1;
    s->loss_scale.init = 65536;
    s->loss_scale.growth_factor = 2;
    s->loss_scale.backoff_factor = 0.5;
    s->loss_scale.growth_interval = 2000;
    s->seed = 0;
    s->shuffle = 1;
    s->augment = 0;
    s->checkpoint_every = 500;
    snprintf(s->device, sizeof s->device, "auto");
    s->cudnn_benchmark = 1;
    s->deterministic = 1;
    s->recompute = TQ_RECOMPUTE_AUTO;
    s->prune_amount = -1;
    s->quantize_int8 = 0;
    s->synthetic.train = 10000;
    s->synthetic.test = 2000;
    s->synthetic.h = 32;
    s->synthetic.w = 32;
    s->synthetic.c = 3;
    s->threads = 0;
    s->tf32 = TQ_TF32_CONV;
    s->cuda_graphs = 0;
    s->n_after = 0;
}

/* ---- errors --------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int fail(tq_spec_err *e, const char *field, const char *fmt, ...) {
    /* both as valid UTF-8 whatever the input was, and never cut inside a character: they end up
     * in JSON error objects */
    tq_utf8_sanitize_to(e->field, sizeof e->field, field, strlen(field), 1);
    char msg[sizeof e->message];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) msg[0] = 0;
    tq_utf8_sanitize_to(e->message, sizeof e->message, msg, strnlen(msg, sizeof msg), 0);
    return TQ_SPEC_BAD;
}

/* Shortest "%.Ng" that parses back to exactly d (finite d). */
static void fmt_double(char *buf, size_t n, double d) {
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) return;
    }
}

/* A short description of a JSON value for "(got …)". */
static const char *describe(const cJSON *v, char *buf, size_t n) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsTrue(v)) return "true";
    if (cJSON_IsFalse(v)) return "false";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsNumber(v)) {
        if (!isfinite(v->valuedouble)) return "a number out of range";
        fmt_double(buf, n, v->valuedouble);
        return buf;
    }
    if (cJSON_IsString(v)) {   /* at most 40 bytes of it, as valid UTF-8, controls as \xNN */
        size_t len = strlen(v->valuestring);
        char shown[48];
        tq_utf8_sanitize_to(shown, sizeof shown, v->valuestring, len > 40 ? 40 : len, 1);
        if (len > 40) snprintf(buf, n, "\"%s...\" (%zu bytes)", shown, len);
        else snprintf(buf, n, "\"%s\"", shown);
        return buf;
    }
    return "an invalid value";
}

/* "a.b" into a caller's buffer, truncated to fit tq_spec_err.field */
static const char *dotted(char *buf, size_t n, const char *parent, const char *key) {
    if (snprintf(buf, n, "%s.%s", parent, key) < 0) buf[0] = 0;
    return buf;
}

/* ---- typed getters: each checks type and range and reports `field` ------------------- */

static int get_int(tq_spec_err *e, const char *field, const cJSON *v, int64_t lo, int64_t hi,
                   int64_t *out) {
    char buf[96];
    const char *got;
    if (cJSON_IsNumber(v) && !(v->type & NUM_NOT_INTEGER) && isfinite(v->valuedouble) &&
        floor(v->valuedouble) == v->valuedouble &&
        v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) {
        *out = (int64_t)v->valuedouble;
        return TQ_SPEC_OK;
    }
    if (cJSON_IsNumber(v) && (v->type & NUM_NOT_INTEGER) && isfinite(v->valuedouble) &&
        floor(v->valuedouble) == v->valuedouble)   /* the double is an integer, the text is not */
        got = "a number that is not exactly an integer";
    else
        got = describe(v, buf, sizeof buf);
    if (hi >= INT_MAX_JSON)
        return fail(e, field, "%s must be an integer >= %" PRId64 "%s (got %s)", field, lo,
                    cJSON_IsNumber(v) && v->valuedouble > (double)hi ? " and at most 2^53" : "", got);
    return fail(e, field, "%s must be an integer in %" PRId64 "..%" PRId64 " (got %s)", field, lo,
                hi, got);
}

static int get_int32(tq_spec_err *e, const char *field, const cJSON *v, int lo, int hi, int *out) {
    int64_t x = 0;
    if (get_int(e, field, v, lo, hi, &x)) return TQ_SPEC_BAD;
    *out = (int)x;
    return TQ_SPEC_OK;
}

/* A range of doubles: lo/hi may be ±INFINITY; *_open excludes the bound. */
typedef struct { double lo, hi; int lo_open, hi_open; } range;

static void range_text(char *buf, size_t n, range r) {
    char a[32], b[32];
    fmt_double(a, sizeof a, r.lo);
    if (isinf(r.hi)) {
        snprintf(buf, n, "%s %s", r.lo_open ? ">" : ">=", a);
        return;
    }
    fmt_double(b, sizeof b, r.hi);
    snprintf(buf, n, "in %c%s, %s%c", r.lo_open ? '(' : '[', a, b, r.hi_open ? ')' : ']');
}

static int in_range(double d, range r) {
    if (!isfinite(d)) return 0;
    if (r.lo_open ? !(d > r.lo) : !(d >= r.lo)) return 0;
    if (r.hi_open ? !(d < r.hi) : !(d <= r.hi)) return 0;
    return 1;
}

static int get_num(tq_spec_err *e, const char *field, const cJSON *v, range r, double *out) {
    if (cJSON_IsNumber(v) && in_range(v->valuedouble, r)) {
        *out = v->valuedouble;
        return TQ_SPEC_OK;
    }
    char got[96], rt[80];
    range_text(rt, sizeof rt, r);
    return fail(e, field, "%s must be a number %s (got %s)", field, rt,
                describe(v, got, sizeof got));
}

static int get_bool(tq_spec_err *e, const char *field, const cJSON *v, int *out) {
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v) ? 1 : 0;
        return TQ_SPEC_OK;
    }
    char got[96];
    return fail(e, field, "%s must be true or false (got %s)", field, describe(v, got, sizeof got));
}

/* A string of 1..maxlen bytes (0..maxlen when allow_empty) copied into out[outsz]. */
static int get_str(tq_spec_err *e, const char *field, const cJSON *v, size_t maxlen,
                   int allow_empty, char *out, size_t outsz) {
    char got[96];
    if (!cJSON_IsString(v))
        return fail(e, field, "%s must be a string (got %s)", field, describe(v, got, sizeof got));
    size_t len = strlen(v->valuestring);
    if (len > maxlen || len + 1 > outsz)
        return fail(e, field, "%s must be at most %zu bytes long (got %zu)", field,
                    maxlen < outsz - 1 ? maxlen : outsz - 1, len);
    if (len == 0 && !allow_empty)
        return fail(e, field, "%s must not be empty", field);
    char why[96];
    if (tq_utf8_explain(v->valuestring, len, 0, why, sizeof why))
        return fail(e, field, "%s %s", field, why);
    memset(out, 0, outsz);   /* no bytes of an earlier value behind the terminator */
    memcpy(out, v->valuestring, len);
    return TQ_SPEC_OK;
}

/* One of names[] → its index. */
static int get_enum(tq_spec_err *e, const char *field, const cJSON *v, const char *const *names,
                    int n, int *out) {
    if (cJSON_IsString(v)) {
        int i = lookup(names, n, v->valuestring);
        if (i >= 0) {
            *out = i;
            return TQ_SPEC_OK;
        }
    }
    char list[160] = "", got[96];
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof list; i++) {
        int w = snprintf(list + used, sizeof list - used, "%s\"%s\"",
                         i == 0 ? "" : i == n - 1 ? " or " : ", ", names[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    return fail(e, field, "%s must be %s (got %s)", field, list, describe(v, got, sizeof got));
}

/* Has an earlier member of obj the same key as c? */
static int duplicate_key(const cJSON *obj, const cJSON *c) {
    for (const cJSON *p = obj->child; p && p != c; p = p->next)
        if (strcmp(p->string, c->string) == 0) return 1;
    return 0;
}

static int check_object(tq_spec_err *e, const char *field, const cJSON *v) {
    if (cJSON_IsObject(v)) return TQ_SPEC_OK;
    char got[96];
    return fail(e, field, "%s must be an object (got %s)", field, describe(v, got, sizeof got));
}

/* The optimal-string-alignment distance (Levenshtein plus adjacent transpositions, each edit
 * costing 1) between a and b, ASCII letters compared without case; both at most 64 bytes. */
static int edit_distance(const char *a, const char *b) {
    enum { L = 64 };
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > L || lb > L) return L + 1;
    int d[L + 1][L + 1];
    char x[L + 1], y[L + 1];
    for (int i = 0; i < la; i++) x[i] = (char)(a[i] >= 'A' && a[i] <= 'Z' ? a[i] + 32 : a[i]);
    for (int j = 0; j < lb; j++) y[j] = (char)(b[j] >= 'A' && b[j] <= 'Z' ? b[j] + 32 : b[j]);
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (x[i - 1] != y[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && x[i - 1] == y[j - 2] && x[i - 2] == y[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

/* The known name nearest to an unknown key, or NULL when none is close: at most 2 edits, and at
 * most a third of the key's length (at least 1), so "lr" never turns into "eps". The first
 * of equally near names wins (the lists are in the docs' order). */
static const char *nearest_name(const char *key, const char *const *names, int n) {
    size_t len = strlen(key);
    if (len == 0 || len > 64) return NULL;
    int limit = (int)(len / 3);
    if (limit < 1) limit = 1;
    if (limit > 2) limit = 2;
    const char *best = NULL;
    int best_d = limit + 1;
    for (int i = 0; i < n; i++) {
        int dist = edit_distance(key, names[i]);
        if (dist < best_d) { best_d = dist; best = names[i]; }
    }
    return best;
}

/* "unknown field", with the nearest of names[0..n) (the members of the same object) when one
 * is close: (did you mean "parent.name"?). */
static int fail_unknown(tq_spec_err *e, const char *parent, const char *key, const char *const *names,
                        int n) {
    char f[64], k[72];
    /* the key as valid UTF-8 (bad bytes as U+FFFD, controls as \xNN), cut on a character */
    tq_utf8_sanitize_to(k, sizeof k, key, strnlen(key, 64), 1);
    if (parent) dotted(f, sizeof f, parent, k);
    else snprintf(f, sizeof f, "%.63s", k);   /* fail() mends a character cut here */
    const char *more = strlen(key) > 64 ? "..." : "";
    const char *near = nearest_name(key, names, n);
    if (near)
        return fail(e, f, "unknown field \"%s%s%s%s\" (did you mean \"%s%s%s\"?)", parent ? parent : "",
                    parent ? "." : "", k, more, parent ? parent : "", parent ? "." : "", near);
    return fail(e, f, "unknown field \"%s%s%s%s\"", parent ? parent : "", parent ? "." : "",
                k, more);
}

static int fail_duplicate(tq_spec_err *e, const char *parent, const char *key) {
    char f[64];
    if (parent) dotted(f, sizeof f, parent, key);
    else snprintf(f, sizeof f, "%s", key);
    return fail(e, f, "field \"%s\" is given more than once", f);
}

/* ---- what the tree does not show: the text of numbers and strings ------------------------ */

/* cJSON keeps a number as a double and a string as a C string, so "1e-400" would read as 0,
 * "1.0000000000000001" as the integer 1, and "cnn\u0000x" as "cnn". scan_tree walks the text
 * beside the parsed tree (the text's strings and numbers come in the tree's depth-first order,
 * keys before their values) and: makes a number that underflowed to 0 NaN (every getter refuses
 * a non-finite number: "got a number out of range"), marks NUM_NOT_INTEGER on a number whose
 * text is not exactly the integer its double holds, and refuses a \u0000 in a key or a string
 * (naming the field). */

typedef struct { const char *p; } text_scan;

/* The next string ('S') or number ('N') token of the text: [*b, *en), *nul when a string holds
 * the escape \u0000; 0 at the end. The text is one cJSON accepted. */
static int next_token(text_scan *sc, const char **b, const char **en, int *nul) {
    const char *p = sc->p;
    *nul = 0;
    for (;; p++) {
        if (!*p) { sc->p = p; return 0; }
        if (*p == '"') {
            *b = p++;
            while (*p && *p != '"') {
                if (*p == '\\') {
                    if (!strncmp(p + 1, "u0000", 5)) *nul = 1;
                    if (p[1]) p++;   /* the escaped character; \uXXXX's digits are plain */
                }
                p++;
            }
            if (*p) p++;
            *en = sc->p = p;
            return 'S';
        }
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            *b = p;
            while (*p && strchr("0123456789+-.eE", *p)) p++;
            *en = sc->p = p;
            return 'N';
        }
    }
}

/* The number item c whose text is [b, en). */
static void check_number(cJSON *c, const char *b, const char *en) {
    const char *p = b;
    char sig[72];               /* significant digits, leading zeros dropped */
    int nsig = 0, nonzero = 0;
    long long exp10 = 0;        /* value = sig × 10^exp10 (before trailing zeros are dropped) */
    if (p < en && *p == '-') p++;
    for (; p < en && *p >= '0' && *p <= '9'; p++) {
        if (*p != '0') nonzero = 1;
        if (nonzero && nsig < (int)sizeof sig - 1) sig[nsig++] = *p;
        else if (nonzero) exp10++;   /* a digit past what sig holds: scale instead (cJSON stops at 63) */
    }
    if (p < en && *p == '.')
        for (p++; p < en && *p >= '0' && *p <= '9'; p++) {
            if (*p != '0') nonzero = 1;
            if (nonzero && nsig < (int)sizeof sig - 1) { sig[nsig++] = *p; exp10--; }
            else if (!nonzero) exp10--;
        }
    if (!nonzero) return;   /* 0, -0, 0.000, 0e5: exactly the integer 0 */
    if (p < en && (*p == 'e' || *p == 'E')) {
        p++;
        int neg = 0;
        if (p < en && (*p == '+' || *p == '-')) neg = *p++ == '-';
        long long x = 0;
        for (; p < en && *p >= '0' && *p <= '9'; p++) if (x < 1000000) x = x * 10 + (*p - '0');
        exp10 += neg ? -x : x;
    }
    while (nsig > 0 && sig[nsig - 1] == '0') { nsig--; exp10++; }
    sig[nsig] = 0;
    double d = c->valuedouble;
    if (d == 0) {   /* a non-zero text that underflowed */
        c->valuedouble = NAN;
        return;
    }
    if (!isfinite(d)) return;
    if (exp10 < 0) { c->type |= NUM_NOT_INTEGER; return; }
    long long digits = nsig + exp10;
    if (digits <= 15 || digits > 40) return;   /* exact in a double; or far out of every range */
    char want[80], have[80];
    snprintf(want, sizeof want, "%s%0*d", sig, (int)exp10, 0);
    if (exp10 == 0) snprintf(want, sizeof want, "%s", sig);
    snprintf(have, sizeof have, "%.0f", fabs(d));
    if (strcmp(want, have)) c->type |= NUM_NOT_INTEGER;
}

/* The members/elements of item (an object or an array at `path`), depth first. */
static int scan_tree(cJSON *item, const char *path, text_scan *sc, int depth, tq_spec_err *e) {
    const char *b, *en;
    int nul;
    if (depth > 64) return fail(e, path, "%s is nested too deeply", path[0] ? path : "the spec");
    for (cJSON *c = item->child; c; c = c->next) {
        char sub[64];
        const char *cp = path;
        if (cJSON_IsObject(item)) {
            if (next_token(sc, &b, &en, &nul) != 'S') goto lost;
            if (path[0]) dotted(sub, sizeof sub, path, c->string);
            else snprintf(sub, sizeof sub, "%s", c->string);
            if (nul) return fail(e, sub, "the field name \"%s\" contains a NUL character (\\u0000)", sub);
            cp = sub;
        }
        if (cJSON_IsString(c)) {
            if (next_token(sc, &b, &en, &nul) != 'S') goto lost;
            if (nul) return fail(e, cp, "%s must not contain a NUL character (\\u0000)", cp[0] ? cp : "a string");
        } else if (cJSON_IsNumber(c)) {
            if (next_token(sc, &b, &en, &nul) != 'N') goto lost;
            check_number(c, b, en);
        } else if (cJSON_IsObject(c) || cJSON_IsArray(c)) {
            if (scan_tree(c, cp, sc, depth + 1, e)) return TQ_SPEC_BAD;
        }
    }
    return TQ_SPEC_OK;
lost:
    return fail(e, "", "internal error: the spec's text and its parsed tree disagree");
}

/* ---- nested objects ------------------------------------------------------------------- */

/* The ranges of the number fields, as macros so that the documentation table (a static
 * initializer) takes the same numbers: lo, hi, lo_open, hi_open. */
#define RANGE_UNIT_HALFOPEN 0, 1, 0, 1      /* [0, 1): momentum, betas */
#define RANGE_LR 0, LR_MAX, 1, 0            /* (0, 10] */
#define RANGE_WEIGHT_DECAY 0, 1, 0, 0       /* [0, 1] */
#define RANGE_EPS 0, 1, 1, 0                /* (0, 1] */
#define RANGE_GAMMA 0, 1, 1, 0              /* (0, 1] */
#define RANGE_EPOCHS 0, EPOCHS_MAX, 1, 0    /* (0, 100000] */
#define RANGE_SCALE_INIT 0, FLT_MAX, 1, 0   /* (0, the largest fp32]: the scale is kept in fp32 */
#define RANGE_GROWTH 1, 16, 1, 0            /* (1, 16] */
#define RANGE_BACKOFF 0, 1, 1, 1            /* (0, 1) */
#define RANGE_PRUNE 0, PRUNE_MAX, 0, 0      /* [0, 0.95] */
static const range R_UNIT_HALFOPEN = { RANGE_UNIT_HALFOPEN };
static const range R_LR = { RANGE_LR };
static const range R_WEIGHT_DECAY = { RANGE_WEIGHT_DECAY };
static const range R_EPS = { RANGE_EPS };
static const range R_GAMMA = { RANGE_GAMMA };
static const range R_EPOCHS = { RANGE_EPOCHS };
static const range R_SCALE_INIT = { RANGE_SCALE_INIT };
static const range R_GROWTH = { RANGE_GROWTH };
static const range R_BACKOFF = { RANGE_BACKOFF };
static const range R_PRUNE = { RANGE_PRUNE };

static const cJSON *member(const cJSON *obj, const char *key) {
    for (const cJSON *c = obj->child; c; c = c->next)
        if (strcmp(c->string, key) == 0) return c;
    return NULL;
}

static int parse_optimizer(tq_spec *s, const cJSON *o, tq_spec_err *e) {
    if (check_object(e, "optimizer", o)) return TQ_SPEC_BAD;
    int type = TQ_OPT_SGD;
    const cJSON *t = member(o, "type");
    if (t && get_enum(e, "optimizer.type", t, opt_names, COUNT(opt_names), &type))
        return TQ_SPEC_BAD;
    optimizer_defaults(s, (tq_opt_kind)type);
    int nesterov_given = 0;
    for (const cJSON *c = o->child; c; c = c->next) {
        const char *k = c->string;
        char f[64];
        dotted(f, sizeof f, "optimizer", k);
        int is_sgd_key = !strcmp(k, "momentum") || !strcmp(k, "nesterov");
        int is_adamw_key = !strcmp(k, "betas") || !strcmp(k, "eps");
        if (lookup(optimizer_fields, COUNT(optimizer_fields), k) < 0)
            return fail_unknown(e, "optimizer", k, optimizer_fields, COUNT(optimizer_fields));
        if (duplicate_key(o, c)) return fail_duplicate(e, "optimizer", k);
        if ((is_sgd_key && type != TQ_OPT_SGD) || (is_adamw_key && type != TQ_OPT_ADAMW))
            return fail(e, f, "%s is not a field of the %s optimizer (%s takes %s)", f,
                        opt_names[type], opt_names[type],
                        type == TQ_OPT_SGD ? "lr, momentum, nesterov, weight_decay"
                                           : "lr, betas, eps, weight_decay");
        int rc = TQ_SPEC_OK;
        if (!strcmp(k, "type")) continue;
        else if (!strcmp(k, "lr")) rc = get_num(e, f, c, R_LR, &s->optimizer.lr);
        else if (!strcmp(k, "weight_decay")) rc = get_num(e, f, c, R_WEIGHT_DECAY, &s->optimizer.weight_decay);
        else if (!strcmp(k, "momentum")) rc = get_num(e, f, c, R_UNIT_HALFOPEN, &s->optimizer.momentum);
        else if (!strcmp(k, "nesterov")) { rc = get_bool(e, f, c, &s->optimizer.nesterov); nesterov_given = 1; }
        else if (!strcmp(k, "eps")) rc = get_num(e, f, c, R_EPS, &s->optimizer.eps);
        else if (!strcmp(k, "betas")) {
            const cJSON *b1 = cJSON_IsArray(c) ? cJSON_GetArrayItem(c, 0) : NULL;
            const cJSON *b2 = cJSON_IsArray(c) ? cJSON_GetArrayItem(c, 1) : NULL;
            if (!b1 || !b2 || cJSON_GetArraySize(c) != 2 || !cJSON_IsNumber(b1) ||
                !cJSON_IsNumber(b2) || !in_range(b1->valuedouble, R_UNIT_HALFOPEN) ||
                !in_range(b2->valuedouble, R_UNIT_HALFOPEN)) {
                char got[96];
                const char *g = describe(c, got, sizeof got);
                if (cJSON_IsArray(c)) {
                    int n = cJSON_GetArraySize(c);
                    if (n != 2) snprintf(got, sizeof got, "an array of %d value%s", n, n == 1 ? "" : "s");
                    else snprintf(got, sizeof got, "an array holding a non-number");
                    g = got;
                }
                if (b1 && b2 && cJSON_GetArraySize(c) == 2 && cJSON_IsNumber(b1) && cJSON_IsNumber(b2)) {
                    char x[32], y[32];
                    fmt_double(x, sizeof x, b1->valuedouble);
                    fmt_double(y, sizeof y, b2->valuedouble);
                    snprintf(got, sizeof got, "[%s, %s]", x, y);
                    g = got;
                }
                return fail(e, f, "%s must be an array of two numbers in [0, 1) (got %s)", f, g);
            }
            s->optimizer.beta1 = b1->valuedouble;
            s->optimizer.beta2 = b2->valuedouble;
        }
        if (rc) return rc;
    }
    if (type == TQ_OPT_SGD && s->optimizer.nesterov && s->optimizer.momentum == 0) {
        if (nesterov_given)
            return fail(e, "optimizer.nesterov",
                        "optimizer.nesterov requires optimizer.momentum > 0 (as torch.optim.SGD)");
        s->optimizer.nesterov = 0;   /* the default yields to an explicit momentum of 0 */
    }
    return TQ_SPEC_OK;
}

static int parse_lr_schedule(tq_spec *s, const cJSON *o, tq_spec_err *e) {
    if (check_object(e, "lr_schedule", o)) return TQ_SPEC_BAD;
    int type = TQ_SCHED_CONSTANT;
    const cJSON *t = member(o, "type");
    if (t && get_enum(e, "lr_schedule.type", t, sched_names, COUNT(sched_names), &type))
        return TQ_SPEC_BAD;
    s->lr_schedule.type = (tq_sched_kind)type;
    s->lr_schedule.warmup_steps = 0;
    s->lr_schedule.step_size = 1000;
    s->lr_schedule.gamma = 0.1;
    for (const cJSON *c = o->child; c; c = c->next) {
        const char *k = c->string;
        char f[64];
        dotted(f, sizeof f, "lr_schedule", k);
        int step_key = !strcmp(k, "step_size") || !strcmp(k, "gamma");
        if (lookup(lr_schedule_fields, COUNT(lr_schedule_fields), k) < 0)
            return fail_unknown(e, "lr_schedule", k, lr_schedule_fields, COUNT(lr_schedule_fields));
        if (duplicate_key(o, c)) return fail_duplicate(e, "lr_schedule", k);
        if (step_key && type != TQ_SCHED_STEP)
            return fail(e, f, "%s applies only to the \"step\" schedule (this one is \"%s\")", f,
                        sched_names[type]);
        int rc = TQ_SPEC_OK;
        if (!strcmp(k, "warmup_steps")) rc = get_int(e, f, c, 0, STEPS_MAX, &s->lr_schedule.warmup_steps);
        else if (!strcmp(k, "step_size")) rc = get_int(e, f, c, 1, STEPS_MAX, &s->lr_schedule.step_size);
        else if (!strcmp(k, "gamma")) rc = get_num(e, f, c, R_GAMMA, &s->lr_schedule.gamma);
        if (rc) return rc;
    }
    return TQ_SPEC_OK;
}

static int parse_loss_scale(tq_spec *s, const cJSON *o, tq_spec_err *e) {
    if (check_object(e, "loss_scale", o)) return TQ_SPEC_BAD;
    for (const cJSON *c = o->child; c; c = c->next) {
        const char *k = c->string;
        char f[64];
        dotted(f, sizeof f, "loss_scale", k);
        int rc;
        if (lookup(loss_scale_fields, COUNT(loss_scale_fields), k) < 0)
            return fail_unknown(e, "loss_scale", k, loss_scale_fields, COUNT(loss_scale_fields));
        if (duplicate_key(o, c)) return fail_duplicate(e, "loss_scale", k);
        if (!strcmp(k, "init")) rc = get_num(e, f, c, R_SCALE_INIT, &s->loss_scale.init);
        else if (!strcmp(k, "growth_factor"))
            rc = get_num(e, f, c, R_GROWTH, &s->loss_scale.growth_factor);
        else if (!strcmp(k, "backoff_factor"))
            rc = get_num(e, f, c, R_BACKOFF, &s->loss_scale.backoff_factor);
        else if (!strcmp(k, "growth_interval"))
            rc = get_int32(e, f, c, 1, STEPS_MAX, &s->loss_scale.growth_interval);
        else return fail(e, f, "internal error: unhandled field %s", f);
        if (rc) return rc;
    }
    return TQ_SPEC_OK;
}

static int parse_prune(tq_spec *s, const cJSON *o, tq_spec_err *e) {
    if (cJSON_IsNull(o)) { s->prune_amount = -1; return TQ_SPEC_OK; }
    if (!cJSON_IsObject(o)) {
        char got[96];
        return fail(e, "prune", "prune must be an object {\"amount\": 0..%g} or null (got %s)",
                    PRUNE_MAX, describe(o, got, sizeof got));
    }
    const cJSON *a = NULL;
    for (const cJSON *c = o->child; c; c = c->next) {
        if (lookup(prune_fields, COUNT(prune_fields), c->string) < 0)
            return fail_unknown(e, "prune", c->string, prune_fields, COUNT(prune_fields));
        if (duplicate_key(o, c)) return fail_duplicate(e, "prune", c->string);
        a = c;
    }
    if (!a) return fail(e, "prune.amount", "prune.amount is required (a number in [0, %g])", PRUNE_MAX);
    return get_num(e, "prune.amount", a, R_PRUNE, &s->prune_amount);
}

static int parse_synthetic(tq_spec *s, const cJSON *o, tq_spec_err *e) {
    if (check_object(e, "synthetic", o)) return TQ_SPEC_BAD;
    for (const cJSON *c = o->child; c; c = c->next) {
        const char *k = c->string;
        char f[64];
        dotted(f, sizeof f, "synthetic", k);
        int rc;
        if (lookup(synthetic_fields, COUNT(synthetic_fields), k) < 0)
            return fail_unknown(e, "synthetic", k, synthetic_fields, COUNT(synthetic_fields));
        if (duplicate_key(o, c)) return fail_duplicate(e, "synthetic", k);
        if (!strcmp(k, "train")) rc = get_int(e, f, c, 1, SYNTH_COUNT_MAX, &s->synthetic.train);
        else if (!strcmp(k, "test")) rc = get_int(e, f, c, 1, SYNTH_COUNT_MAX, &s->synthetic.test);
        else if (!strcmp(k, "height")) rc = get_int32(e, f, c, 1, SYNTH_SIDE_MAX, &s->synthetic.h);
        else if (!strcmp(k, "width")) rc = get_int32(e, f, c, 1, SYNTH_SIDE_MAX, &s->synthetic.w);
        else rc = get_int32(e, f, c, 1, SYNTH_CHANNELS_MAX, &s->synthetic.c);
        if (rc) return rc;
    }
    return TQ_SPEC_OK;
}

static int parse_device(tq_spec *s, const cJSON *v, tq_spec_err *e) {
    if (cJSON_IsString(v)) {
        const char *d = v->valuestring;
        int ok = !strcmp(d, "auto") || !strcmp(d, "cpu") || !strcmp(d, "cuda");
        if (!ok && !strncmp(d, "cuda:", 5)) {
            const char *n = d + 5;
            size_t len = strlen(n);
            ok = len >= 1 && len <= 3 && strspn(n, "0123456789") == len &&
                 (len == 1 || n[0] != '0') && atoi(n) <= DEVICE_INDEX_MAX;
        }
        if (ok) {
            memset(s->device, 0, sizeof s->device);
            memcpy(s->device, d, strlen(d));   /* at most "cuda:255" */
            return TQ_SPEC_OK;
        }
    }
    char got[96];
    return fail(e, "device", "device must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\" (N in 0..%d) (got %s)",
                DEVICE_INDEX_MAX, describe(v, got, sizeof got));
}

/* "after": [job ids]: distinct integers >= 1, at most TQ_AFTER_MAX; null or [] for none */
static int parse_after(tq_spec *s, const cJSON *v, tq_spec_err *e) {
    s->n_after = 0;
    if (cJSON_IsNull(v)) return TQ_SPEC_OK;
    char got[96];
    if (!cJSON_IsArray(v))
        return fail(e, "after", "after must be an array of job ids (got %s)", describe(v, got, sizeof got));
    int n = 0;
    for (const cJSON *c = v->child; c; c = c->next, n++) {
        char f[32];
        snprintf(f, sizeof f, "after[%d]", n);
        if (n >= TQ_AFTER_MAX)
            return fail(e, "after", "after lists more than %d jobs", TQ_AFTER_MAX);
        int64_t id = 0;
        if (get_int(e, f, c, 1, INT_MAX_JSON, &id)) return TQ_SPEC_BAD;
        for (int k = 0; k < n; k++)
            if (s->after[k] == id) return fail(e, f, "%s repeats job %" PRId64 " (already after[%d])", f, id, k);
        s->after[n] = id;
    }
    s->n_after = n;
    return TQ_SPEC_OK;
}

/* ---- the root ------------------------------------------------------------------------- */

/* The root's members; the order is the contract's and the rendering's. */
#define TQ_SPEC_FIELDS(X) \
    X(name) X(model) X(dataset) X(data_dir) X(batch_size) X(accum_steps) X(effective_batch)  \
    X(amp) X(steps)                                                                            \
    X(epochs) X(optimizer) X(lr_schedule) X(loss_scale) X(seed) X(shuffle) X(augment)         \
    X(train_subset) X(eval_subset) X(eval_every) X(checkpoint_every) X(init_from) X(device)   \
    X(max_memory_mb) X(priority) X(submission_id) X(timeout_s) X(cudnn_benchmark) X(prune)    \
    X(quantize) X(synthetic) X(threads) X(recompute) X(deterministic) X(tf32) X(cuda_graphs)    \
    X(after)

enum {
#define X(n) F_##n,
    TQ_SPEC_FIELDS(X)
#undef X
    F_COUNT
};
_Static_assert(F_COUNT <= 64, "the parser's `given` set is a uint64_t");
static const char *const root_names[] = {
#define X(n) #n,
    TQ_SPEC_FIELDS(X)
#undef X
};

static int parse_member(tq_spec *s, int f, const cJSON *v, tq_spec_err *e) {
    const char *fn = root_names[f];
    int i = 0;
    char got[96];
    switch (f) {
    case F_name: return get_str(e, fn, v, NAME_MAX_LEN, 1, s->name, sizeof s->name);
    case F_model:
        if (get_enum(e, fn, v, model_names, COUNT(model_names), &i)) return TQ_SPEC_BAD;
        s->model = (tq_model_kind)i;
        return TQ_SPEC_OK;
    case F_dataset:
        if (get_enum(e, fn, v, dataset_names, COUNT(dataset_names), &i)) return TQ_SPEC_BAD;
        s->dataset = (tq_data_kind)i;
        return TQ_SPEC_OK;
    case F_data_dir:
        if (cJSON_IsNull(v)) { memset(s->data_dir, 0, sizeof s->data_dir); return TQ_SPEC_OK; }
        return get_str(e, fn, v, PATH_LEN_MAX, 0, s->data_dir, sizeof s->data_dir);
    case F_batch_size:
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "auto")) {
            s->batch_auto = 1;
            s->batch_size = 0;   /* until resolved (after the walk, or by train/autobatch.c) */
            return TQ_SPEC_OK;
        }
        if (!cJSON_IsNumber(v))
            return fail(e, fn, "batch_size must be an integer in 1..%d or \"auto\" (got %s)", BATCH_MAX,
                        describe(v, got, sizeof got));
        s->batch_auto = 0;
        return get_int32(e, fn, v, 1, BATCH_MAX, &s->batch_size);
    case F_accum_steps: return get_int32(e, fn, v, 1, ACCUM_MAX, &s->accum_steps);
    case F_effective_batch: return get_int(e, fn, v, 1, EFFECTIVE_BATCH_MAX, &s->effective_batch);
    case F_amp:
        if (cJSON_IsBool(v)) { s->amp = cJSON_IsTrue(v) ? TQ_AMP_FP16 : TQ_AMP_OFF; return TQ_SPEC_OK; }
        if (cJSON_IsString(v) && (i = lookup(amp_names, COUNT(amp_names), v->valuestring)) >= 0) {
            s->amp = (tq_amp)i;
            return TQ_SPEC_OK;
        }
        return fail(e, fn, "amp must be false, true, \"off\", \"fp16\" or \"bf16\" (got %s)",
                    describe(v, got, sizeof got));
    case F_steps: return get_int(e, fn, v, 1, STEPS_MAX, &s->steps);
    case F_epochs: return get_num(e, fn, v, R_EPOCHS, &s->epochs);
    case F_optimizer: return parse_optimizer(s, v, e);
    case F_lr_schedule: return parse_lr_schedule(s, v, e);
    case F_loss_scale: return parse_loss_scale(s, v, e);
    case F_seed: {
        int64_t x = 0;
        if (get_int(e, fn, v, 0, INT_MAX_JSON, &x)) return TQ_SPEC_BAD;
        s->seed = (uint64_t)x;
        return TQ_SPEC_OK;
    }
    case F_shuffle: return get_bool(e, fn, v, &s->shuffle);
    case F_augment: return get_bool(e, fn, v, &s->augment);
    case F_train_subset:
        if (cJSON_IsNull(v)) { s->train_subset = 0; return TQ_SPEC_OK; }
        return get_int(e, fn, v, 1, SUBSET_MAX, &s->train_subset);
    case F_eval_subset:
        if (cJSON_IsNull(v)) { s->eval_subset = 0; return TQ_SPEC_OK; }
        return get_int(e, fn, v, 1, SUBSET_MAX, &s->eval_subset);
    case F_eval_every: return get_int(e, fn, v, 0, STEPS_MAX, &s->eval_every);
    case F_checkpoint_every: return get_int(e, fn, v, 1, STEPS_MAX, &s->checkpoint_every);
    case F_init_from:
        if (cJSON_IsNull(v)) { memset(s->init_from, 0, sizeof s->init_from); return TQ_SPEC_OK; }
        return get_str(e, fn, v, PATH_LEN_MAX, 0, s->init_from, sizeof s->init_from);
    case F_device: return parse_device(s, v, e);
    case F_max_memory_mb:
        if (cJSON_IsNull(v)) { s->max_memory_mb = 0; return TQ_SPEC_OK; }
        return get_int(e, fn, v, 1, MAX_MEMORY_MB_MAX, &s->max_memory_mb);
    case F_priority: return get_int32(e, fn, v, -PRIORITY_MAX, PRIORITY_MAX, &s->priority);
    case F_submission_id:
        if (cJSON_IsNull(v)) { memset(s->submission_id, 0, sizeof s->submission_id); return TQ_SPEC_OK; }
        return get_str(e, fn, v, NAME_MAX_LEN, 0, s->submission_id, sizeof s->submission_id);
    case F_timeout_s:
        if (cJSON_IsNull(v)) { s->timeout_s = 0; return TQ_SPEC_OK; }
        return get_int(e, fn, v, 1, TIMEOUT_MAX, &s->timeout_s);
    case F_cudnn_benchmark: return get_bool(e, fn, v, &s->cudnn_benchmark);
    case F_recompute:
        if (cJSON_IsBool(v)) { s->recompute = cJSON_IsTrue(v); return TQ_SPEC_OK; }
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "auto")) { s->recompute = TQ_RECOMPUTE_AUTO; return TQ_SPEC_OK; }
        return fail(e, fn, "recompute must be true, false or \"auto\" (false where the job can only train on the CPU) "
                    "(got %s)", describe(v, got, sizeof got));
    case F_deterministic: return get_bool(e, fn, v, &s->deterministic);
    case F_prune: return parse_prune(s, v, e);
    case F_quantize:
        if (cJSON_IsNull(v)) { s->quantize_int8 = 0; return TQ_SPEC_OK; }
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "int8")) { s->quantize_int8 = 1; return TQ_SPEC_OK; }
        return fail(e, fn, "quantize must be \"int8\" or null (got %s)", describe(v, got, sizeof got));
    case F_synthetic: return parse_synthetic(s, v, e);
    case F_threads: return get_int32(e, fn, v, 0, THREADS_MAX, &s->threads);
    case F_tf32:
        if (cJSON_IsBool(v)) { s->tf32 = cJSON_IsTrue(v) ? TQ_TF32_ALL : TQ_TF32_OFF; return TQ_SPEC_OK; }
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "conv")) { s->tf32 = TQ_TF32_CONV; return TQ_SPEC_OK; }
        return fail(e, fn, "tf32 must be false (never), \"conv\" (convolutions only, PyTorch's default) or "
                    "true (convolutions and matmuls) (got %s)", describe(v, got, sizeof got));
    case F_cuda_graphs: return get_bool(e, fn, v, &s->cuda_graphs);
    case F_after: return parse_after(s, v, e);
    }
    return fail(e, fn, "internal error: unhandled field %s", fn);
}

/* The cross-field batch rules of the top comment; s holds the walked values. */
static int batch_rules(tq_spec *s, int batch_given, int accum_given, int eff_given, tq_spec_err *e) {
    const int64_t N = s->effective_batch;
    if (s->batch_auto) {
        if (!eff_given)
            return fail(e, "batch_size", "batch_size \"auto\" needs effective_batch (the samples per "
                                         "optimizer step to split into micro-batches)");
        if (!accum_given) {   /* unresolved: the picker chooses */
            if (tq_spec_batch_candidates(N, NULL, 0) == 0)
                return fail(e, "effective_batch", "effective_batch %" PRId64 " has no divisor that makes "
                            "a micro-batch of at most %d with accum_steps at most %d", N, BATCH_MAX, ACCUM_MAX);
            s->batch_size = 0;
            s->accum_steps = 0;
            return TQ_SPEC_OK;
        }
        if (N % s->accum_steps)
            return fail(e, "accum_steps", "accum_steps %d does not divide effective_batch %" PRId64,
                        s->accum_steps, N);
        if (N / s->accum_steps > BATCH_MAX)
            return fail(e, "accum_steps", "effective_batch %" PRId64 " / accum_steps %d is a micro-batch of %"
                        PRId64 ", over the batch_size limit of %d", N, s->accum_steps,
                        N / s->accum_steps, BATCH_MAX);
        s->batch_size = (int)(N / s->accum_steps);
        return TQ_SPEC_OK;
    }
    if (!eff_given) return TQ_SPEC_OK;
    if (!batch_given)
        return fail(e, "effective_batch", "effective_batch needs batch_size: \"auto\" or an explicit "
                                          "batch_size that divides it");
    const int b = s->batch_size;
    if (N % b)
        return fail(e, "effective_batch", "effective_batch %" PRId64 " is not a multiple of batch_size %d",
                    N, b);
    if (N / b > ACCUM_MAX)
        return fail(e, "effective_batch", "effective_batch %" PRId64 " / batch_size %d is %" PRId64
                    " micro-batches per step, over the accum_steps limit of %d", N, b, N / b, ACCUM_MAX);
    if (accum_given && s->accum_steps != N / b)
        return fail(e, "accum_steps", "accum_steps %d disagrees with effective_batch %" PRId64
                    " / batch_size %d = %" PRId64, s->accum_steps, N, b, N / b);
    s->accum_steps = (int)(N / b);
    return TQ_SPEC_OK;
}

int tq_spec_batch_candidates(int64_t N, int *out, int max) {
    if (N < 1 || N > EFFECTIVE_BATCH_MAX) return 0;
    int n = 0;
    int64_t lo = (N + ACCUM_MAX - 1) / ACCUM_MAX, hi = N < BATCH_MAX ? N : BATCH_MAX;
    for (int64_t b = lo; b <= hi; b++)   /* at most 65536 iterations */
        if (N % b == 0) {
            if (n < max) out[n] = (int)b;
            n++;
        }
    return n;
}

void tq_spec_set_batch(tq_spec *s, int batch_size) {
    assert(batch_size >= 1 && batch_size <= BATCH_MAX);
    s->batch_size = batch_size;
    if (s->effective_batch > 0) {
        assert(s->effective_batch % batch_size == 0);
        assert(s->effective_batch / batch_size <= ACCUM_MAX);
        s->accum_steps = (int)(s->effective_batch / batch_size);
    }
}

/* line and column (1-based) of byte `off` in text */
static void position(const char *text, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && text[i]; i++) {
        if (text[i] == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

int tq_spec_parse(tq_spec *s, const char *json, tq_spec_err *err) {
    tq_spec_err scratch;
    tq_spec_err *e = err ? err : &scratch;
    memset(e, 0, sizeof *e);
    tq_spec_defaults(s);
    if (!json) return fail(e, "", "invalid JSON: no document");

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        size_t off = end && end >= json ? (size_t)(end - json) : 0;
        size_t len = strlen(json);
        if (off > len) off = len;
        int line, col;
        position(json, off, &line, &col);
        size_t ws = strspn(json, " \t\r\n");
        if (ws == len) return fail(e, "", "invalid JSON: the document is empty");
        if (off >= len)
            return fail(e, "", "invalid JSON: unexpected end of the document at line %d, column %d (byte %zu)",
                        line, col, off);
        return fail(e, "", "invalid JSON at line %d, column %d (byte %zu, near \"%.16s\")", line, col,
                    off, json + off);
    }

    int rc = TQ_SPEC_OK;
    uint64_t given = 0;
    if (!cJSON_IsObject(root)) {
        char got[96];
        rc = fail(e, "", "the spec must be a JSON object (got %s)", describe(root, got, sizeof got));
        goto done;
    }
    text_scan sc = { json };
    if ((rc = scan_tree(root, "", &sc, 0, e))) goto done;
    for (const cJSON *c = root->child; c; c = c->next) {
        int f = lookup(root_names, F_COUNT, c->string);
        if (f < 0) { rc = fail_unknown(e, NULL, c->string, root_names, F_COUNT); goto done; }
        if (given & (1ull << f)) { rc = fail_duplicate(e, NULL, c->string); goto done; }
        given |= 1ull << f;
        if ((rc = parse_member(s, f, c, e))) goto done;
    }
#define GIVEN(n) ((given >> F_##n) & 1)
    if (GIVEN(steps) && GIVEN(epochs)) {
        rc = fail(e, "steps", "give either steps or epochs, not both");
        goto done;
    }
    if (GIVEN(steps)) s->epochs = 0;
    else s->steps = 0;   /* epochs given, or the default of 1 epoch */
    if ((rc = batch_rules(s, GIVEN(batch_size), GIVEN(accum_steps), GIVEN(effective_batch), e))) goto done;
    if (!GIVEN(data_dir) || !s->data_dir[0]) {
        if (s->dataset == TQ_DATA_CIFAR10) {
            rc = fail(e, "data_dir", "data_dir is required for dataset cifar10: the directory of the CIFAR-10 "
                      "binary version, data_batch_1.bin … data_batch_5.bin and test_batch.bin (docs/spec.md, "
                      "\"Datasets\")");
            goto done;
        }
        memset(s->data_dir, 0, sizeof s->data_dir);
        if (s->dataset == TQ_DATA_FASHION_MNIST) memcpy(s->data_dir, FMNIST_DIR, sizeof FMNIST_DIR);
    }
    if (!GIVEN(augment)) s->augment = s->dataset == TQ_DATA_CIFAR10;
    if (GIVEN(synthetic) && s->dataset != TQ_DATA_SYNTHETIC) {
        rc = fail(e, "synthetic", "synthetic applies only to dataset \"synthetic\" (this spec's is \"%s\")",
                  tq_dataset_name(s->dataset));
        goto done;
    }
#undef GIVEN
done:
    cJSON_Delete(root);
    if (rc) tq_spec_defaults(s);   /* never half a spec */
    return rc;
}

/* ---- rendering ------------------------------------------------------------------------ */

typedef struct { int ok; } jb;   /* allocation status while building */

static void add_item(jb *b, cJSON *obj, const char *key, cJSON *item) {
    if (!item) { b->ok = 0; return; }
    if (!cJSON_AddItemToObject(obj, key, item)) { cJSON_Delete(item); b->ok = 0; }
}
static cJSON *num_item(double d) {
    char buf[40];
    if (!isfinite(d)) return cJSON_CreateNull();
    fmt_double(buf, sizeof buf, d);
    return cJSON_CreateRaw(buf);
}
static cJSON *int_item(int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}
static void add_num(jb *b, cJSON *o, const char *k, double d) { add_item(b, o, k, num_item(d)); }
static void add_int(jb *b, cJSON *o, const char *k, int64_t v) { add_item(b, o, k, int_item(v)); }
static void add_str(jb *b, cJSON *o, const char *k, const char *v) { add_item(b, o, k, cJSON_CreateString(v)); }
static void add_str_or_null(jb *b, cJSON *o, const char *k, const char *v) {
    add_item(b, o, k, v[0] ? cJSON_CreateString(v) : cJSON_CreateNull());
}
static void add_int_or_null(jb *b, cJSON *o, const char *k, int64_t v) {
    add_item(b, o, k, v > 0 ? int_item(v) : cJSON_CreateNull());
}
static void add_bool(jb *b, cJSON *o, const char *k, int v) { add_item(b, o, k, cJSON_CreateBool(v)); }
static cJSON *add_obj(jb *b, cJSON *o, const char *k) {
    cJSON *c = cJSON_CreateObject();
    add_item(b, o, k, c);
    return b->ok ? c : NULL;
}

char *tq_spec_to_json(const tq_spec *s) {
    jb b = { 1 };
    cJSON *r = cJSON_CreateObject(), *o;
    if (!r) return NULL;
    add_str(&b, r, "name", s->name);
    add_str(&b, r, "model", tq_model_name(s->model));
    add_str(&b, r, "dataset", tq_dataset_name(s->dataset));
    if (!s->data_dir[0] && s->dataset == TQ_DATA_FASHION_MNIST) add_str(&b, r, "data_dir", FMNIST_DIR);
    else add_str_or_null(&b, r, "data_dir", s->data_dir);
    if (s->batch_auto) {
        add_str(&b, r, "batch_size", "auto");
        if (!tq_spec_batch_unresolved(s)) add_int(&b, r, "accum_steps", s->accum_steps);
    } else {
        add_int(&b, r, "batch_size", s->batch_size);
        add_int(&b, r, "accum_steps", s->accum_steps);
    }
    if (s->effective_batch > 0) add_int(&b, r, "effective_batch", s->effective_batch);
    add_str(&b, r, "amp", tq_amp_name(s->amp));
    if (s->steps > 0) add_int(&b, r, "steps", s->steps);
    else add_num(&b, r, "epochs", s->epochs);
    if ((o = add_obj(&b, r, "optimizer"))) {
        add_str(&b, o, "type", opt_names[s->optimizer.type == TQ_OPT_ADAMW]);
        add_num(&b, o, "lr", s->optimizer.lr);
        if (s->optimizer.type == TQ_OPT_ADAMW) {
            cJSON *betas = cJSON_CreateArray();
            if (betas) {
                cJSON *x = num_item(s->optimizer.beta1), *y = num_item(s->optimizer.beta2);
                if (!x || !cJSON_AddItemToArray(betas, x)) { cJSON_Delete(x); b.ok = 0; }
                if (!y || !cJSON_AddItemToArray(betas, y)) { cJSON_Delete(y); b.ok = 0; }
            }
            add_item(&b, o, "betas", betas);
            add_num(&b, o, "eps", s->optimizer.eps);
        } else {
            add_num(&b, o, "momentum", s->optimizer.momentum);
            add_bool(&b, o, "nesterov", s->optimizer.nesterov);
        }
        add_num(&b, o, "weight_decay", s->optimizer.weight_decay);
    }
    if ((o = add_obj(&b, r, "lr_schedule"))) {
        int t = (int)s->lr_schedule.type;
        add_str(&b, o, "type", t >= 0 && t < COUNT(sched_names) ? sched_names[t] : "?");
        add_int(&b, o, "warmup_steps", s->lr_schedule.warmup_steps);
        if (s->lr_schedule.type == TQ_SCHED_STEP) {
            add_int(&b, o, "step_size", s->lr_schedule.step_size);
            add_num(&b, o, "gamma", s->lr_schedule.gamma);
        }
    }
    if ((o = add_obj(&b, r, "loss_scale"))) {
        add_num(&b, o, "init", s->loss_scale.init);
        add_num(&b, o, "growth_factor", s->loss_scale.growth_factor);
        add_num(&b, o, "backoff_factor", s->loss_scale.backoff_factor);
        add_int(&b, o, "growth_interval", s->loss_scale.growth_interval);
    }
    {
        char seed[32];
        snprintf(seed, sizeof seed, "%" PRIu64, s->seed);
        add_item(&b, r, "seed", cJSON_CreateRaw(seed));
    }
    add_bool(&b, r, "shuffle", s->shuffle);
    add_bool(&b, r, "augment", s->augment);
    add_int_or_null(&b, r, "train_subset", s->train_subset);
    add_int_or_null(&b, r, "eval_subset", s->eval_subset);
    add_int(&b, r, "eval_every", s->eval_every);
    add_int(&b, r, "checkpoint_every", s->checkpoint_every);
    add_str_or_null(&b, r, "init_from", s->init_from);
    add_str(&b, r, "device", s->device);
    add_int_or_null(&b, r, "max_memory_mb", s->max_memory_mb);
    add_int(&b, r, "priority", s->priority);
    add_str_or_null(&b, r, "submission_id", s->submission_id);
    add_int_or_null(&b, r, "timeout_s", s->timeout_s);
    add_bool(&b, r, "cudnn_benchmark", s->cudnn_benchmark);
    if (s->prune_amount >= 0) {
        if ((o = add_obj(&b, r, "prune"))) add_num(&b, o, "amount", s->prune_amount);
    } else {
        add_item(&b, r, "prune", cJSON_CreateNull());
    }
    add_item(&b, r, "quantize", s->quantize_int8 ? cJSON_CreateString("int8") : cJSON_CreateNull());
    if (s->dataset == TQ_DATA_SYNTHETIC && (o = add_obj(&b, r, "synthetic"))) {
        add_int(&b, o, "train", s->synthetic.train);
        add_int(&b, o, "test", s->synthetic.test);
        add_int(&b, o, "height", s->synthetic.h);
        add_int(&b, o, "width", s->synthetic.w);
        add_int(&b, o, "channels", s->synthetic.c);
    }
    add_int(&b, r, "threads", s->threads);
    if (s->recompute == TQ_RECOMPUTE_AUTO) add_str(&b, r, "recompute", "auto");
    else add_bool(&b, r, "recompute", s->recompute);
    add_bool(&b, r, "deterministic", s->deterministic);
    if (s->tf32 == TQ_TF32_CONV) add_str(&b, r, "tf32", "conv");
    else add_bool(&b, r, "tf32", s->tf32 == TQ_TF32_ALL);
    add_bool(&b, r, "cuda_graphs", s->cuda_graphs);
    {
        cJSON *a = cJSON_CreateArray();
        for (int k = 0; a && k < s->n_after; k++) {
            cJSON *x = int_item(s->after[k]);
            if (!x || !cJSON_AddItemToArray(a, x)) { cJSON_Delete(x); b.ok = 0; }
        }
        add_item(&b, r, "after", a);
    }
    char *text = b.ok ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    return text;
}

/* ---- documentation: docs/spec.md and trainq(1) (`make docs`), from the parser's limits ----- */

const char *const *tq_spec_field_names(const char *parent, int *n) {
    static const struct { const char *parent; const char *const *names; int n; } nested[] = {
        { "optimizer", optimizer_fields, COUNT(optimizer_fields) },
        { "lr_schedule", lr_schedule_fields, COUNT(lr_schedule_fields) },
        { "loss_scale", loss_scale_fields, COUNT(loss_scale_fields) },
        { "prune", prune_fields, COUNT(prune_fields) },
        { "synthetic", synthetic_fields, COUNT(synthetic_fields) },
    };
    int dummy;
    if (!n) n = &dummy;
    if (!parent || !parent[0]) { *n = F_COUNT; return root_names; }
    for (int i = 0; i < COUNT(nested); i++)
        if (!strcmp(nested[i].parent, parent)) { *n = nested[i].n; return nested[i].names; }
    *n = 0;
    return NULL;
}

#define STR_(x) #x
#define XSTR(x) STR_(x)
#define D_INT(lo_, hi_) .bounds = TQ_DOC_INT, .lo = (double)(lo_), .hi = (double)(hi_)
#define D_NUM_(a, b, c, d) .bounds = TQ_DOC_NUM, .lo = (a), .hi = (b), .lo_open = (c), .hi_open = (d)
#define D_NUM(r) D_NUM_(r)
#define D_ENUM(names) .values = (names), .n_values = COUNT(names)

/* Texts may hold `code` spans (Markdown as is; bold in roff) and these non-ASCII characters,
 * which the roff renderer maps: … × ≤ ≥ − – — ⌊ ⌋ → (anything else fails the unit test). */
static const tq_spec_doc_field doc_fields[] = {
    { .name = "name", .type = "string", .def = "`\"\"`", .def_json = "\"\"",
      .range = "at most " XSTR(NAME_MAX_LEN) " bytes of UTF-8 without control characters",
      .meaning = "A label for people: `trainq ls`, `trainq show`, the dashboard and the job object show it. "
                 "It need not be unique.",
      .example = "\"resnet20-fp16\"" },
    { .name = "model", .type = "string", .def = "`\"cnn\"`", .def_json = "\"cnn\"", D_ENUM(model_names),
      .meaning = "The network. `mlp`: three linear layers (512, 256, 10 units); `cnn`: two 3×3 convolutions "
                 "(32 and 64 channels) with max-pooling, then two linear layers; `resnet20`: the CIFAR ResNet "
                 "(3 stages of 3 basic blocks, widths 16/32/64); `resnet18`, `resnet50`: torchvision's "
                 "architectures for small images (3×3 stem, no max-pool). Weights carry PyTorch's names and "
                 "layouts, so `load_state_dict(strict=True)` takes them.",
      .example = "\"resnet20\"" },
    { .name = "dataset", .type = "string", .def = "`\"fashion-mnist\"`", .def_json = "\"fashion-mnist\"",
      D_ENUM(dataset_names),
      .meaning = "What to train and evaluate on: Fashion-MNIST (28×28 grey images, 60000 training and 10000 "
                 "test), CIFAR-10 (32×32 colour, 50000 and 10000; needs `data_dir`) or a seeded synthetic set "
                 "shaped by `synthetic`. Where the files come from: Datasets.",
      .example = "\"synthetic\"" },
    { .name = "data_dir", .type = "string or null",
      .def = "`\"" FMNIST_DIR "\"` for fashion-mnist (Debian's dataset-fashion-mnist); none for synthetic; "
             "cifar10 requires it",
      .def_json = "\"" FMNIST_DIR "\"",
      .range = "a path of at most " XSTR(PATH_LEN_MAX) " bytes",
      .meaning = "The directory holding the dataset's files (Datasets says which). The daemon checks at "
                 "submission that the submitting user may read it, and that the files are there (400 "
                 "`data_not_found` otherwise).",
      .example = "\"/srv/datasets/cifar10\"", .with_root = "\"dataset\": \"cifar10\"" },
    { .name = "batch_size", .type = "integer or `\"auto\"`", .def = "`32`", .def_json = "32",
      D_INT(1, BATCH_MAX), .range = "or `\"auto\"` (with `effective_batch`)",
      .meaning = "The micro-batch: samples per forward and backward pass. `\"auto\"` lets trainq choose the "
                 "largest micro-batch that divides `effective_batch` and whose memory plan fits (the batch "
                 "rules below).",
      .example = "64" },
    { .name = "accum_steps", .type = "integer", .def = "`1`", .def_json = "1", D_INT(1, ACCUM_MAX),
      .meaning = "Micro-batches whose gradients are accumulated into one optimizer step: the effective batch "
                 "is `batch_size` × `accum_steps`. Each micro-batch's loss is divided by `accum_steps`, as in "
                 "PyTorch.",
      .example = "4" },
    { .name = "effective_batch", .type = "integer", .def = "none: `batch_size` × `accum_steps`",
      D_INT(1, EFFECTIVE_BATCH_MAX),
      .meaning = "Samples per optimizer step. With an integer `batch_size` it must be a multiple of it, and "
                 "`accum_steps` becomes `effective_batch` / `batch_size`; `\"batch_size\": \"auto\"` requires "
                 "it, and trainq chooses the split.",
      .example = "256", .with_root = "\"batch_size\": \"auto\"" },
    { .name = "amp", .type = "boolean or string", .def = "`false` (shown as `\"off\"`)", .def_json = "\"off\"",
      D_ENUM(amp_names), .range = "(`false` means `\"off\"`, `true` means `\"fp16\"`)",
      .meaning = "Mixed precision. `\"fp16\"`: forward and backward in half precision with dynamic loss "
                 "scaling (`loss_scale`); `\"bf16\"`: in bfloat16, no scaling needed. Weights and optimizer "
                 "state stay fp32. bf16 is the fast one on the CPU, fp16 and bf16 on a GPU.",
      .example = "\"bf16\"" },
    { .name = "steps", .type = "integer", .def = "none (`epochs` applies)", D_INT(1, STEPS_MAX),
      .meaning = "Optimizer steps to train for. Give `steps` or `epochs`, not both.",
      .example = "1000" },
    { .name = "epochs", .type = "number", .def = "`1` when `steps` is not given", .def_json = "1",
      D_NUM(RANGE_EPOCHS),
      .meaning = "Passes over the training set: the job trains round(`epochs` × steps per epoch) optimizer "
                 "steps (at least 1), so a fraction trains part of the last pass.",
      .example = "30" },
    { .name = "optimizer", .type = "object",
      .def = "`{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9, \"nesterov\": true, \"weight_decay\": 0.0005}`",
      .meaning = "The optimizer and its hyper-parameters (the `optimizer.*` fields below). Its members depend "
                 "on its `type`, and the defaults of those left out are the type's.",
      .example = "{\"type\": \"adamw\", \"lr\": 0.001}" },
    { .name = "optimizer.type", .type = "string", .def = "`\"sgd\"`", .def_json = "\"sgd\"", D_ENUM(opt_names),
      .meaning = "`sgd` as `torch.optim.SGD` (takes `lr`, `momentum`, `nesterov`, `weight_decay`); `adamw` as "
                 "`torch.optim.AdamW` (takes `lr`, `betas`, `eps`, `weight_decay`).",
      .example = "\"adamw\"" },
    { .name = "optimizer.lr", .type = "number", .def = "`0.05` (sgd), `0.001` (adamw)", .def_json = "0.05",
      D_NUM(RANGE_LR),
      .meaning = "The learning rate: the peak of the `lr_schedule`.",
      .example = "0.1" },
    { .name = "optimizer.momentum", .type = "number", .def = "`0.9`", .def_json = "0.9",
      D_NUM(RANGE_UNIT_HALFOPEN), .range = "(sgd only)",
      .meaning = "SGD momentum: `buf = momentum·buf + g`. 0 turns momentum (and the default Nesterov) off.",
      .example = "0.8" },
    { .name = "optimizer.nesterov", .type = "boolean", .def = "`true` (`false` when `momentum` is 0)",
      .def_json = "true", .range = "(sgd only; `true` requires `momentum` > 0)",
      .meaning = "Nesterov momentum: the step uses `g + momentum·buf` instead of `buf`.",
      .example = "false" },
    { .name = "optimizer.betas", .type = "array of two numbers", .def = "`[0.9, 0.999]`",
      .def_json = "[0.9, 0.999]",
      .range = "each in [0, 1) (adamw only)",
      .meaning = "AdamW's decay rates of the first and second moment estimates.",
      .example = "[0.9, 0.95]", .with = "\"type\": \"adamw\"" },
    { .name = "optimizer.eps", .type = "number", .def = "`1e-8`", .def_json = "1e-8", D_NUM(RANGE_EPS),
      .range = "(adamw only)",
      .meaning = "AdamW's term added to the denominator for numerical stability.",
      .example = "1e-6", .with = "\"type\": \"adamw\"" },
    { .name = "optimizer.weight_decay", .type = "number", .def = "`0.0005` (sgd), `0.01` (adamw)",
      .def_json = "0.0005", D_NUM(RANGE_WEIGHT_DECAY),
      .meaning = "SGD adds `weight_decay`·w to every parameter's gradient (L2); AdamW decays the weights "
                 "directly, decoupled from the gradient. Biases and batch-norm parameters included, as "
                 "PyTorch does without parameter groups.",
      .example = "0.0001" },
    { .name = "lr_schedule", .type = "object", .def = "`{\"type\": \"constant\", \"warmup_steps\": 0}`",
      .meaning = "How the learning rate changes over the job's steps (the `lr_schedule.*` fields below).",
      .example = "{\"type\": \"cosine\", \"warmup_steps\": 100}" },
    { .name = "lr_schedule.type", .type = "string", .def = "`\"constant\"`", .def_json = "\"constant\"",
      D_ENUM(sched_names),
      .meaning = "After the warm-up: `constant` keeps `lr`; `cosine` anneals it towards 0 over the remaining steps; `step` "
                 "multiplies it by `gamma` every `step_size` steps; `onecycle` follows "
                 "`torch.optim.lr_scheduler.OneCycleLR`'s defaults (from `lr`/25 up to `lr` over the first 30% "
                 "of the steps, then down to `lr`/25/10000, cosine).",
      .example = "\"cosine\"" },
    { .name = "lr_schedule.warmup_steps", .type = "integer", .def = "`0`", .def_json = "0", D_INT(0, STEPS_MAX),
      .meaning = "Steps of linear warm-up before the schedule starts: step s (from 0) uses `lr`·(s+1)/"
                 "`warmup_steps`.",
      .example = "500" },
    { .name = "lr_schedule.step_size", .type = "integer", .def = "`1000`", .def_json = "1000",
      D_INT(1, STEPS_MAX),
      .range = "(`step` only)",
      .meaning = "Steps between two decays of the `step` schedule.",
      .example = "2000", .with = "\"type\": \"step\"" },
    { .name = "lr_schedule.gamma", .type = "number", .def = "`0.1`", .def_json = "0.1", D_NUM(RANGE_GAMMA),
      .range = "(`step` only)",
      .meaning = "The factor of each decay of the `step` schedule.",
      .example = "0.5", .with = "\"type\": \"step\"" },
    { .name = "loss_scale", .type = "object",
      .def = "`{\"init\": 65536, \"growth_factor\": 2, \"backoff_factor\": 0.5, \"growth_interval\": 2000}`",
      .meaning = "The dynamic loss scaling of `\"amp\": \"fp16\"`, as `torch.amp.GradScaler` (ignored "
                 "otherwise): the loss is multiplied by the scale before the backward pass; a step whose "
                 "gradients overflow is skipped and the scale backs off.",
      .example = "{\"init\": 1024}" },
    { .name = "loss_scale.init", .type = "number", .def = "`65536`", .def_json = "65536", D_NUM(RANGE_SCALE_INIT),
      .range = "(the largest fp32 number: the scale is kept in fp32)",
      .meaning = "The first scale.",
      .example = "1024" },
    { .name = "loss_scale.growth_factor", .type = "number", .def = "`2`", .def_json = "2", D_NUM(RANGE_GROWTH),
      .meaning = "The scale is multiplied by this after `growth_interval` steps in a row without overflow.",
      .example = "4" },
    { .name = "loss_scale.backoff_factor", .type = "number", .def = "`0.5`", .def_json = "0.5",
      D_NUM(RANGE_BACKOFF),
      .meaning = "The scale is multiplied by this after a step whose gradients overflowed (the step is "
                 "skipped).",
      .example = "0.25" },
    { .name = "loss_scale.growth_interval", .type = "integer", .def = "`2000`", .def_json = "2000",
      D_INT(1, STEPS_MAX),
      .meaning = "Steps without overflow before the scale grows.",
      .example = "1000" },
    { .name = "seed", .type = "integer", .def = "`0`", .def_json = "0", D_INT(0, INT_MAX_JSON),
      .range = "(2^53)",
      .meaning = "Seeds the initial weights, the data order, the augmentation and the synthetic data: the "
                 "same spec and seed give the same run, bit for bit, on the same device.",
      .example = "42" },
    { .name = "shuffle", .type = "boolean", .def = "`true`", .def_json = "true",
      .meaning = "Shuffle the training set every epoch; `false` keeps file order (for reproducible "
                 "comparisons).",
      .example = "false" },
    { .name = "augment", .type = "boolean", .def = "`true` for cifar10, else `false`", .def_json = "false",
      .meaning = "Random crop (padding 4) and horizontal flip of the training images.",
      .example = "true" },
    { .name = "train_subset", .type = "integer or null", .def = "`null`: the whole training set",
      .def_json = "null", D_INT(1, SUBSET_MAX),
      .meaning = "Train on the first N training samples (in file order) only.",
      .example = "5000" },
    { .name = "eval_subset", .type = "integer or null", .def = "`null`: the whole test set", .def_json = "null",
      D_INT(1, SUBSET_MAX),
      .meaning = "Evaluate on the first N test samples only.",
      .example = "1000" },
    { .name = "eval_every", .type = "integer", .def = "`0`", .def_json = "0", D_INT(0, STEPS_MAX),
      .meaning = "Evaluate on the test set every N optimizer steps and at the end; 0: at the end of every "
                 "epoch and of the job.",
      .example = "500" },
    { .name = "checkpoint_every", .type = "integer", .def = "`500`", .def_json = "500", D_INT(1, STEPS_MAX),
      .meaning = "Write a checkpoint every N optimizer steps, at the end, and when the job is stopped (cancel, "
                 "the daemon's SIGTERM). A requeued job, or `trainq run --resume`, continues from it with the "
                 "same data order and the same numbers. `trainq run` writes checkpoints only with `--out`.",
      .example = "1000" },
    { .name = "init_from", .type = "string or null", .def = "`null`: fresh weights", .def_json = "null",
      .range = "a path of at most " XSTR(PATH_LEN_MAX) " bytes",
      .meaning = "A safetensors file of PyTorch-named weights (a `state_dict` saved with `safetensors`, or a "
                 "trainq `model.safetensors`) to start from. The daemon checks that the submitting user may "
                 "read it.",
      .example = "\"/srv/models/resnet20-warm.safetensors\"" },
    { .name = "device", .type = "string", .def = "`\"auto\"`", .def_json = "\"auto\"",
      .range = "`\"auto\"`, `\"cpu\"`, `\"cuda\"` or `\"cuda:N\"` (N in 0…" XSTR(DEVICE_INDEX_MAX) ")",
      .meaning = "Where the job may run. `auto`: a GPU when the daemon has one (the least busy), else the "
                 "CPU; `cuda`: any GPU; `cuda:N`: that GPU. A device the daemon does not serve is a 422 "
                 "`device_unavailable`.",
      .example = "\"cuda:0\"" },
    { .name = "max_memory_mb", .type = "integer or null", .def = "`null`: no cap of its own", .def_json = "null",
      D_INT(1, MAX_MEMORY_MB_MAX), .range = "MiB",
      .meaning = "A cap on the job's planned peak memory (training plus the dataset): a job planned above it "
                 "is refused (422 `cannot_fit`); `\"batch_size\": \"auto\"` picks a micro-batch that fits it.",
      .example = "4096" },
    { .name = "priority", .type = "integer", .def = "`0`", .def_json = "0", D_INT(-PRIORITY_MAX, PRIORITY_MAX),
      .meaning = "Higher runs first; among equals, the user with the least recent device time, then "
                 "submission order.",
      .example = "5" },
    { .name = "submission_id", .type = "string or null", .def = "`null`", .def_json = "null",
      .range = "at most " XSTR(NAME_MAX_LEN) " bytes of UTF-8 without control characters",
      .meaning = "An idempotency key: submitting the same key again answers 200 with the job it first "
                 "created, and queues nothing. For retries and cron jobs.",
      .example = "\"nightly-2026-05-01\"" },
    { .name = "timeout_s", .type = "integer or null", .def = "`null`: none", .def_json = "null",
      D_INT(1, TIMEOUT_MAX), .range = "seconds (365 days)",
      .meaning = "A running job still training after this many seconds fails with `timeout` (after writing "
                 "its checkpoint).",
      .example = "3600" },
    { .name = "cudnn_benchmark", .type = "boolean", .def = "`true`", .def_json = "true",
      .meaning = "On a GPU, time the candidate cuDNN convolution engines once per shape and keep the fastest "
                 "(`torch.backends.cudnn.benchmark`). Ignored on the CPU.",
      .example = "false" },
    { .name = "prune", .type = "object or null", .def = "`null`: no pruning", .def_json = "null",
      .meaning = "After training: L1-unstructured pruning of every convolution and linear weight "
                 "(`torch.nn.utils.prune.l1_unstructured`), then an evaluation recorded with kind `pruned`.",
      .example = "{\"amount\": 0.5}" },
    { .name = "prune.amount", .type = "number", .def = "none: `prune` requires it", D_NUM(RANGE_PRUNE),
      .meaning = "The fraction of each weight tensor's entries, smallest magnitudes first, set to zero.",
      .example = "0.3" },
    { .name = "quantize", .type = "string or null", .def = "`null`: no quantization", .def_json = "null",
      .range = "`\"int8\"` or `null`",
      .meaning = "After training: dynamic int8 quantization of the linear layers (as "
                 "`torch.ao.quantization.quantize_dynamic`), then an evaluation recorded with kind `int8`.",
      .example = "\"int8\"" },
    { .name = "synthetic", .type = "object", .def = "`{\"train\": 10000, \"test\": 2000, \"height\": 32, "
                                                    "\"width\": 32, \"channels\": 3}`",
      .range = "(dataset `synthetic` only)",
      .meaning = "The shape of the synthetic dataset (the `synthetic.*` fields below).",
      .example = "{\"train\": 1024, \"test\": 256}", .with_root = "\"dataset\": \"synthetic\"" },
    { .name = "synthetic.train", .type = "integer", .def = "`10000`", .def_json = "10000",
      D_INT(1, SYNTH_COUNT_MAX),
      .meaning = "Training samples.",
      .example = "1024", .with_root = "\"dataset\": \"synthetic\"" },
    { .name = "synthetic.test", .type = "integer", .def = "`2000`", .def_json = "2000", D_INT(1, SYNTH_COUNT_MAX),
      .meaning = "Test samples.",
      .example = "256", .with_root = "\"dataset\": \"synthetic\"" },
    { .name = "synthetic.height", .type = "integer", .def = "`32`", .def_json = "32", D_INT(1, SYNTH_SIDE_MAX),
      .meaning = "Image height in pixels.",
      .example = "28", .with_root = "\"dataset\": \"synthetic\"" },
    { .name = "synthetic.width", .type = "integer", .def = "`32`", .def_json = "32", D_INT(1, SYNTH_SIDE_MAX),
      .meaning = "Image width in pixels.",
      .example = "28", .with_root = "\"dataset\": \"synthetic\"" },
    { .name = "synthetic.channels", .type = "integer", .def = "`3`", .def_json = "3",
      D_INT(1, SYNTH_CHANNELS_MAX),
      .meaning = "Channels per pixel.",
      .example = "1", .with_root = "\"dataset\": \"synthetic\"" },
    { .name = "threads", .type = "integer", .def = "`0`: all cores", .def_json = "0", D_INT(0, THREADS_MAX),
      .meaning = "CPU threads for a job on the CPU. With 0 `trainq run` uses every core, and the daemon "
                 "divides the cores among the CPU jobs running when the job starts.",
      .example = "4" },
    { .name = "recompute", .type = "boolean or string", .def = "`\"auto\"`", .def_json = "\"auto\"",
      .range = "`true`, `false` or `\"auto\"`",
      .meaning = "Regenerate the ReLU outputs of residual blocks in the backward pass instead of keeping them: "
                 "the same numbers, bit for bit, for about 30% less activation memory in a ResNet, at one "
                 "more pass over memory each. `false` keeps every activation, as PyTorch does. `\"auto\"`: "
                 "`false` where the job can only train on the CPU, where memory is rarely short and the extra "
                 "passes cost time (resnet20 in bf16 on 2 Xeon cores with AMX: about 10% faster without them; "
                 "fp32 the same), else `true`. The daemon settles it when it takes the job, from the devices the "
                 "job may use, and stores the result in the job's spec: `false` where they are all the CPU "
                 "(`device: \"cpu\"`, or `\"auto\"` on a daemon that serves no GPU), `true` where they are all "
                 "GPUs. A job that may run on either (`\"auto\"` on a daemon that serves both) keeps `\"auto\"` "
                 "and is planned for each: on a GPU with recomputation, on the CPU without, and it runs the "
                 "plan of the device it is placed on; where the CPU's plan would exceed `max_memory_mb` or the "
                 "CPU's budget, it is settled `true` instead. `trainq run` and `trainq plan` settle it from the "
                 "GPUs the host has.",
      .example = "false" },
    { .name = "deterministic", .type = "boolean", .def = "`true`", .def_json = "true",
      .meaning = "On a GPU, run convolutions only on cuDNN engines that give the same bits every time; "
                 "`false` also allows those that use atomics (PyTorch's default; faster in fp32). Ignored on "
                 "the CPU.",
      .example = "false" },
    { .name = "tf32", .type = "boolean or string", .def = "`\"conv\"`", .def_json = "\"conv\"",
      .range = "`false`, `\"conv\"` or `true`",
      .meaning = "TF32 tensor-core math for fp32 on Ampere and later GPUs. `\"conv\"` is PyTorch's default: "
                 "cuDNN convolutions may use TF32, cuBLAS matmuls do not; `true`: both; `false`: neither. "
                 "Ignored on the CPU.",
      .example = "false" },
    { .name = "cuda_graphs", .type = "boolean", .def = "`false`", .def_json = "false",
      .meaning = "Capture the training step as a CUDA graph once and replay it for every step after, which "
                 "saves the CPU's kernel launches. GPU only: on the CPU it is ignored, with a warning in the "
                 "job's log.",
      .example = "true" },
    { .name = "after", .type = "array of job ids, or null", .def = "`[]`: none", .def_json = "[]",
      .range = "at most " XSTR(TQ_AFTER_MAX) " distinct integers >= 1",
      .meaning = "Run only after all of these jobs succeeded, like `sbatch --dependency=afterok`; the job "
                 "waits in the queue until then. If one of them fails or is cancelled, this job fails with "
                 "`dependency_failed`.",
      .example = "[12, 13]" },
};

const tq_spec_doc_field *tq_spec_doc_fields(int *count) {
    if (count) *count = COUNT(doc_fields);
    return doc_fields;
}

const char tq_spec_doc_full_example[] =
    "{\n"
    "  \"name\": \"resnet20-cifar10-bf16\",\n"
    "  \"model\": \"resnet20\",\n"
    "  \"dataset\": \"cifar10\",\n"
    "  \"data_dir\": \"/srv/datasets/cifar10\",\n"
    "  \"batch_size\": 128,\n"
    "  \"accum_steps\": 1,\n"
    "  \"amp\": \"bf16\",\n"
    "  \"epochs\": 30,\n"
    "  \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9, \"nesterov\": true,\n"
    "                \"weight_decay\": 0.0005},\n"
    "  \"lr_schedule\": {\"type\": \"cosine\", \"warmup_steps\": 200},\n"
    "  \"seed\": 1,\n"
    "  \"augment\": true,\n"
    "  \"eval_every\": 0,\n"
    "  \"checkpoint_every\": 1000,\n"
    "  \"device\": \"auto\",\n"
    "  \"max_memory_mb\": 4096,\n"
    "  \"priority\": 5,\n"
    "  \"submission_id\": \"resnet20-cifar10-bf16-run1\",\n"
    "  \"timeout_s\": 86400,\n"
    "  \"after\": []\n"
    "}\n";

/* ---- rendering the documentation ---- */

typedef struct { char *p; size_t len, cap; int oom; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf) { b->oom = 1; return; }
    sb_add(b, buf, (size_t)n);
}

static char *sb_take(sbuf *b) {
    if (b->oom) { free(b->p); return NULL; }
    if (!b->p) sb_puts(b, "");
    return b->p;
}

/* The "range" column: bounds, enum values, the note. */
static void doc_range(sbuf *b, const tq_spec_doc_field *f) {
    int any = 0;
    if (f->bounds == TQ_DOC_INT) {
        sb_printf(b, "%.0f…%.0f", f->lo, f->hi);
        any = 1;
    } else if (f->bounds == TQ_DOC_NUM) {
        char lo[32], hi[32];
        fmt_double(lo, sizeof lo, f->lo);
        if (isinf(f->hi)) sb_printf(b, "%s %s", f->lo_open ? ">" : ">=", lo);
        else {
            fmt_double(hi, sizeof hi, f->hi);
            sb_printf(b, "%c%s, %s%c", f->lo_open ? '(' : '[', lo, hi, f->hi_open ? ')' : ']');
        }
        any = 1;
    } else if (f->values) {
        for (int i = 0; i < f->n_values; i++)
            sb_printf(b, "%s`\"%s\"`", i == 0 ? "" : i == f->n_values - 1 ? " or " : ", ", f->values[i]);
        any = 1;
    }
    if (f->range) sb_printf(b, "%s%s", any ? " " : "", f->range);
}

static int doc_has_range(const tq_spec_doc_field *f) { return f->bounds || f->values || f->range; }

char *tq_spec_doc_example(const tq_spec_doc_field *f) {
    sbuf b = { 0 };
    const char *dot = strchr(f->name, '.');
    sb_puts(&b, "{");
    if (f->with_root) sb_printf(&b, "%s, ", f->with_root);
    if (dot) {
        sb_printf(&b, "\"%.*s\": {", (int)(dot - f->name), f->name);
        if (f->with) sb_printf(&b, "%s, ", f->with);
        sb_printf(&b, "\"%s\": %s}}", dot + 1, f->example);
    } else {
        sb_printf(&b, "\"%s\": %s}", f->name, f->example);
    }
    return sb_take(&b);
}

/* The cross-field rules, as paragraphs (with `code` spans). */
static void doc_rules(sbuf *b, const char *bullet, const char *end) {
    const char *text[] = {
        "Give `steps` or `epochs`, not both; with neither the job trains 1 epoch. An epoch is "
        "⌊N / `batch_size`⌋ micro-batches of the N training samples (after `train_subset`; the remainder "
        "is dropped, like `drop_last=True`), so ⌊that / `accum_steps`⌋ optimizer steps; `epochs` trains "
        "round(`epochs` × that) steps.",
        "An integer `batch_size` b with `effective_batch` N: b must divide N, N / b must be at most %d "
        "(`accum_steps`' limit), and `accum_steps` becomes N / b (one given as well must agree). "
        "`effective_batch` without `batch_size` is an error.",
        "`\"batch_size\": \"auto\"` requires `effective_batch` N. Without `accum_steps`, trainq picks the "
        "largest micro-batch b that divides N (b <= %d, N / b <= %d) whose planned peak memory fits the cap: "
        "`max_memory_mb`, else in the daemon the memory budget of the device the job prefers, in `trainq "
        "run` and `trainq plan` half of the available memory on the CPU; then `accum_steps` = N / b. A cap "
        "too small for a micro-batch of 1 is a 422 `cannot_fit` naming both numbers. With `accum_steps` k "
        "given, k must divide N and the micro-batch is N / k. The job's `spec` shows `\"batch_size\": "
        "\"auto\"` with the chosen `accum_steps`; `trainq plan SPEC --memory-mb MB` shows what it would "
        "pick.",
        "`data_dir` is required for `cifar10`; `fashion-mnist` defaults to `" FMNIST_DIR "`; `synthetic` "
        "reads no files, and the `synthetic` object applies to it alone. `augment` defaults to `true` for "
        "`cifar10` only.",
        "The `optimizer`'s members depend on its `type`: `sgd` takes `lr`, `momentum`, `nesterov`, "
        "`weight_decay`; `adamw` takes `lr`, `betas`, `eps`, `weight_decay`; a member of the other type is "
        "an error, and those left out take the type's defaults. `nesterov: true` requires `momentum` > 0 "
        "(left out, it turns off with `momentum` 0). `lr_schedule.step_size` and `gamma` belong to the "
        "`step` schedule only. `loss_scale` matters only with `\"amp\": \"fp16\"`.",
        "Strings are UTF-8 without control characters; an integer field takes only numbers whose text is "
        "exactly an integer (`64`, `6.4e1`; not `1.5` or `1e-400`); a field given twice, an unknown field "
        "(the message suggests the nearest known one: `unknown field \"batchsize\" (did you mean "
        "\"batch_size\"?)`), a wrong type and a value out of range are errors that name the field: HTTP 400 "
        "`invalid_spec` from the daemon, exit status 2 from `trainq run` and `trainq plan`.",
    };
    for (int i = 0; i < COUNT(text); i++) {
        sb_puts(b, bullet);
        if (i == 1) sb_printf(b, text[i], ACCUM_MAX);
        else if (i == 2) sb_printf(b, text[i], BATCH_MAX, ACCUM_MAX);
        else sb_puts(b, text[i]);
        sb_puts(b, end);
    }
}

/* Markdown: | escaped inside tables */
static void md_cell(sbuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '|') sb_puts(b, "\\|");
        else sb_add(b, s, 1);
    }
}

static void md_anchor(sbuf *b, const char *name) {   /* GitHub's: lower case, '.' dropped */
    for (const char *p = name; *p; p++)
        if (*p != '.') sb_add(b, p, 1);
}

static char *doc_markdown(void) {
    sbuf b = { 0 }, t = { 0 };
    sb_puts(&b, "| field | type | default | range |\n|---|---|---|---|\n");
    for (int i = 0; i < COUNT(doc_fields); i++) {
        const tq_spec_doc_field *f = &doc_fields[i];
        sb_puts(&b, "| [`");
        sb_puts(&b, f->name);
        sb_puts(&b, "`](#");
        md_anchor(&b, f->name);
        sb_puts(&b, ") | ");
        md_cell(&b, f->type);
        sb_puts(&b, " | ");
        md_cell(&b, f->def);
        sb_puts(&b, " | ");
        t.len = 0;
        if (doc_has_range(f)) doc_range(&t, f);
        else sb_puts(&t, "—");
        md_cell(&b, t.oom ? "" : t.p);
        sb_puts(&b, " |\n");
    }
    for (int i = 0; i < COUNT(doc_fields); i++) {
        const tq_spec_doc_field *f = &doc_fields[i];
        sb_printf(&b, "\n### `%s`\n\n%s\n\n- type: %s\n- default: %s\n", f->name, f->meaning, f->type, f->def);
        if (doc_has_range(f)) {
            sb_puts(&b, "- range: ");
            doc_range(&b, f);
            sb_puts(&b, "\n");
        }
        char *ex = tq_spec_doc_example(f);
        sb_printf(&b, "- example: `%s`\n", ex ? ex : "");
        if (!ex) b.oom = 1;
        free(ex);
    }
    sb_puts(&b, "\n## Rules across fields\n\n");
    doc_rules(&b, "- ", "\n");
    sb_puts(&b, "\n## A full example\n\n```json\n");
    sb_puts(&b, tq_spec_doc_full_example);
    sb_puts(&b, "```\n");
    if (t.oom) b.oom = 1;
    free(t.p);
    return sb_take(&b);
}

/* roff text: \ - and a leading . or ' escaped, `code` in bold, the few non-ASCII characters
 * the table uses as glyphs (any other byte >= 0x80 becomes "?": the unit test refuses it). */
static void roff_text(sbuf *b, const char *s, int line_start) {
    static const struct { const char *utf8, *roff; } glyphs[] = {
        { "…", "\\&..." }, { "×", "\\(mu" }, { "≤", "\\(<=" }, { "≥", "\\(>=" }, { "−", "\\-" },
        { "–", "\\(en" }, { "—", "\\(em" }, { "⌊", "\\(lf" }, { "⌋", "\\(rf" }, { "·", "\\[pc]" },
    };
    int code = 0;
    for (const char *p = s; *p;) {
        if (line_start && (*p == '.' || *p == '\'')) sb_puts(b, "\\&");
        line_start = 0;
        unsigned char c = (unsigned char)*p;
        if (c == '`') { sb_puts(b, code ? "\\fR" : "\\fB"); code = !code; p++; continue; }
        if (c == '\\') { sb_puts(b, "\\e"); p++; continue; }
        if (c == '-') { sb_puts(b, "\\-"); p++; continue; }
        if (c == '\n') { sb_puts(b, "\n"); line_start = 1; p++; continue; }
        if (c < 0x80) { sb_add(b, p, 1); p++; continue; }
        int k;
        for (k = 0; k < COUNT(glyphs); k++) {
            size_t n = strlen(glyphs[k].utf8);
            if (!strncmp(p, glyphs[k].utf8, n)) { sb_puts(b, glyphs[k].roff); p += n; break; }
        }
        if (k == COUNT(glyphs)) {
            sb_puts(b, "?");
            for (p++; (unsigned char)*p >= 0x80 && (unsigned char)*p < 0xc0; p++) {}
        }
    }
    if (code) sb_puts(b, "\\fR");
}

static char *doc_man(void) {
    sbuf b = { 0 }, t = { 0 };
    for (int i = 0; i < COUNT(doc_fields); i++) {
        const tq_spec_doc_field *f = &doc_fields[i];
        sb_puts(&b, ".TP\n.B ");
        roff_text(&b, f->name, 0);
        sb_puts(&b, "\n");
        t.len = 0;
        sb_printf(&t, "%s; default %s", f->type, f->def);
        if (doc_has_range(f)) {
            sb_puts(&t, "; range ");
            doc_range(&t, f);
        }
        sb_puts(&t, ".\n");
        sb_puts(&t, f->meaning);
        if (!t.oom) roff_text(&b, t.p, 1);
        char *ex = tq_spec_doc_example(f);
        sb_puts(&b, "\n.br\nExample: ");
        if (!ex) b.oom = 1;
        else roff_text(&b, ex, 0);
        free(ex);
        sb_puts(&b, "\n");
    }
    sb_puts(&b, ".SS Rules across fields\n");
    t.len = 0;
    doc_rules(&t, ".IP \\(bu 2\n", "\n");
    if (!t.oom) {   /* the bullets' macro lines are ours; escape the text between them */
        const char *p = t.p;
        while (*p) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            char *line = strndup(p, n);
            if (!line) { b.oom = 1; break; }
            if (!strncmp(line, ".IP ", 4)) sb_puts(&b, line);
            else roff_text(&b, line, 1);
            sb_puts(&b, "\n");
            free(line);
            p += n + (nl != NULL);
        }
    }
    sb_puts(&b, ".SS A full example\n.PP\n.RS 4\n.nf\n");
    roff_text(&b, tq_spec_doc_full_example, 1);
    sb_puts(&b, ".fi\n.RE\n");
    if (t.oom) b.oom = 1;
    free(t.p);
    return sb_take(&b);
}

char *tq_spec_doc(int format) {
    return format == TQ_DOC_MAN ? doc_man() : doc_markdown();
}

char *tq_spec_doc_fill(const char *tmpl, int format) {
    const char *mark = tmpl ? strstr(tmpl, "@SPEC_REFERENCE@") : NULL;
    if (!mark) return NULL;
    const char *bol = mark, *eol = strchr(mark, '\n');
    while (bol > tmpl && bol[-1] != '\n') bol--;
    eol = eol ? eol + 1 : mark + strlen(mark);
    char *doc = tq_spec_doc(format);
    if (!doc) return NULL;
    sbuf b = { 0 };
    sb_add(&b, tmpl, (size_t)(bol - tmpl));
    sb_puts(&b, doc);
    sb_puts(&b, eol);
    free(doc);
    return sb_take(&b);
}
