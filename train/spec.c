/* spec.c — parse, validate and render the job spec (CONTRACT.md, "Job spec"). See spec.h.
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
 * docs/api.md "Job spec ranges"). */
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
#define BATCH_MAX 65536
#define ACCUM_MAX 1024
#define EFFECTIVE_BATCH_MAX ((int64_t)BATCH_MAX * ACCUM_MAX)
/* upper bounds of the counts (docs/api.md, "Job spec ranges") */
#define STEPS_MAX 10000000           /* steps, warmup_steps, step_size, eval/checkpoint_every */
#define EPOCHS_MAX 100000
#define SUBSET_MAX 10000000          /* train_subset, eval_subset */
#define TIMEOUT_MAX 31536000         /* timeout_s: 365 days */
#define LR_MAX 10.0
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
    s->recompute = 1;
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

static int fail_unknown(tq_spec_err *e, const char *parent, const char *key) {
    char f[64], k[72];
    /* the key as valid UTF-8 (bad bytes as U+FFFD, controls as \xNN), cut on a character */
    tq_utf8_sanitize_to(k, sizeof k, key, strnlen(key, 64), 1);
    if (parent) dotted(f, sizeof f, parent, k);
    else snprintf(f, sizeof f, "%.63s", k);   /* fail() mends a character cut here */
    const char *more = strlen(key) > 64 ? "..." : "";
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

static const range R_UNIT_HALFOPEN = { 0, 1, 0, 1 };   /* [0, 1) */
static const range R_LR = { 0, LR_MAX, 1, 0 };         /* (0, 10] */
static const range R_WEIGHT_DECAY = { 0, 1, 0, 0 };    /* [0, 1] */
static const range R_EPS = { 0, 1, 1, 0 };             /* (0, 1] */
static const range R_GAMMA = { 0, 1, 1, 0 };           /* (0, 1] */

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
        int known = !strcmp(k, "type") || !strcmp(k, "lr") || !strcmp(k, "weight_decay") ||
                    is_sgd_key || is_adamw_key;
        if (!known) return fail_unknown(e, "optimizer", k);
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
        if (!step_key && strcmp(k, "type") && strcmp(k, "warmup_steps"))
            return fail_unknown(e, "lr_schedule", k);
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
        if (duplicate_key(o, c)) return fail_duplicate(e, "loss_scale", k);
        if (!strcmp(k, "init")) rc = get_num(e, f, c, (range){ 0, FLT_MAX, 1, 0 }, &s->loss_scale.init);
        else if (!strcmp(k, "growth_factor"))
            rc = get_num(e, f, c, (range){ 1, 16, 1, 0 }, &s->loss_scale.growth_factor);
        else if (!strcmp(k, "backoff_factor"))
            rc = get_num(e, f, c, (range){ 0, 1, 1, 1 }, &s->loss_scale.backoff_factor);
        else if (!strcmp(k, "growth_interval"))
            rc = get_int32(e, f, c, 1, STEPS_MAX, &s->loss_scale.growth_interval);
        else return fail_unknown(e, "loss_scale", k);
        if (rc) return rc;
    }
    return TQ_SPEC_OK;
}

static int parse_prune(tq_spec *s, const cJSON *o, tq_spec_err *e) {
    if (cJSON_IsNull(o)) { s->prune_amount = -1; return TQ_SPEC_OK; }
    if (!cJSON_IsObject(o)) {
        char got[96];
        return fail(e, "prune", "prune must be an object {\"amount\": 0..0.95} or null (got %s)",
                    describe(o, got, sizeof got));
    }
    const cJSON *a = NULL;
    for (const cJSON *c = o->child; c; c = c->next) {
        if (strcmp(c->string, "amount")) return fail_unknown(e, "prune", c->string);
        if (duplicate_key(o, c)) return fail_duplicate(e, "prune", c->string);
        a = c;
    }
    if (!a) return fail(e, "prune.amount", "prune.amount is required (a number in [0, 0.95])");
    return get_num(e, "prune.amount", a, (range){ 0, 0.95, 0, 0 }, &s->prune_amount);
}

static int parse_synthetic(tq_spec *s, const cJSON *o, tq_spec_err *e) {
    if (check_object(e, "synthetic", o)) return TQ_SPEC_BAD;
    for (const cJSON *c = o->child; c; c = c->next) {
        const char *k = c->string;
        char f[64];
        dotted(f, sizeof f, "synthetic", k);
        int rc;
        if (duplicate_key(o, c)) return fail_duplicate(e, "synthetic", k);
        if (!strcmp(k, "train")) rc = get_int(e, f, c, 1, 10000000, &s->synthetic.train);
        else if (!strcmp(k, "test")) rc = get_int(e, f, c, 1, 10000000, &s->synthetic.test);
        else if (!strcmp(k, "height")) rc = get_int32(e, f, c, 1, 4096, &s->synthetic.h);
        else if (!strcmp(k, "width")) rc = get_int32(e, f, c, 1, 4096, &s->synthetic.w);
        else if (!strcmp(k, "channels")) rc = get_int32(e, f, c, 1, 64, &s->synthetic.c);
        else return fail_unknown(e, "synthetic", k);
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
                 (len == 1 || n[0] != '0') && atoi(n) <= 255;
        }
        if (ok) {
            memset(s->device, 0, sizeof s->device);
            memcpy(s->device, d, strlen(d));   /* at most "cuda:255" */
            return TQ_SPEC_OK;
        }
    }
    char got[96];
    return fail(e, "device", "device must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\" (N in 0..255) (got %s)",
                describe(v, got, sizeof got));
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
        return get_str(e, fn, v, TQ_PATH_MAX - 1, 0, s->data_dir, sizeof s->data_dir);
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
    case F_epochs: return get_num(e, fn, v, (range){ 0, EPOCHS_MAX, 1, 0 }, &s->epochs);
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
        return get_str(e, fn, v, TQ_PATH_MAX - 1, 0, s->init_from, sizeof s->init_from);
    case F_device: return parse_device(s, v, e);
    case F_max_memory_mb:
        if (cJSON_IsNull(v)) { s->max_memory_mb = 0; return TQ_SPEC_OK; }
        return get_int(e, fn, v, 1, 1LL << 30, &s->max_memory_mb);
    case F_priority: return get_int32(e, fn, v, -100, 100, &s->priority);
    case F_submission_id:
        if (cJSON_IsNull(v)) { memset(s->submission_id, 0, sizeof s->submission_id); return TQ_SPEC_OK; }
        return get_str(e, fn, v, NAME_MAX_LEN, 0, s->submission_id, sizeof s->submission_id);
    case F_timeout_s:
        if (cJSON_IsNull(v)) { s->timeout_s = 0; return TQ_SPEC_OK; }
        return get_int(e, fn, v, 1, TIMEOUT_MAX, &s->timeout_s);
    case F_cudnn_benchmark: return get_bool(e, fn, v, &s->cudnn_benchmark);
    case F_recompute: return get_bool(e, fn, v, &s->recompute);
    case F_deterministic: return get_bool(e, fn, v, &s->deterministic);
    case F_prune: return parse_prune(s, v, e);
    case F_quantize:
        if (cJSON_IsNull(v)) { s->quantize_int8 = 0; return TQ_SPEC_OK; }
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "int8")) { s->quantize_int8 = 1; return TQ_SPEC_OK; }
        return fail(e, fn, "quantize must be \"int8\" or null (got %s)", describe(v, got, sizeof got));
    case F_synthetic: return parse_synthetic(s, v, e);
    case F_threads: return get_int32(e, fn, v, 0, 256, &s->threads);
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
        if (f < 0) { rc = fail_unknown(e, NULL, c->string); goto done; }
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
            rc = fail(e, "data_dir", "data_dir is required for dataset cifar10");
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
    add_bool(&b, r, "recompute", s->recompute);
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
