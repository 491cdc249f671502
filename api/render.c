/* render.c — the job object of CONTRACT.md as cJSON, RFC 3339 times, steps as CSV.
 * Text read from the database (names, states, stored spec and summary JSON, error messages) is
 * made valid UTF-8 (U+FFFD for bad sequences) before cJSON sees it: a row written by an older
 * daemon, or by hand with sqlite3, cannot make a listing invalid JSON. */
#include "internal.h"
#include "report.h"
#include "utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tq_rfc3339(int64_t ms, char out[32]) {
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    char base[24];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 32, "%s.%03dZ", base, (int)(ms % 1000));
}

static void add_time(cJSON *o, const char *k, int64_t ms) {
    if (ms <= 0) { cJSON_AddNullToObject(o, k); return; }
    char b[32];
    tq_rfc3339(ms, b);
    cJSON_AddStringToObject(o, k, b);
}

/* stored text as a JSON string (bad sequences as U+FFFD) */
static void add_text(cJSON *o, const char *k, const char *text) {
    if (tq_utf8_valid(text)) {
        cJSON_AddStringToObject(o, k, text ? text : "");
        return;
    }
    char *fixed = tq_utf8_sanitize(text);
    cJSON_AddStringToObject(o, k, fixed ? fixed : "");
    free(fixed);
}

/* stored JSON text as a tree, or null when it does not parse. Bad UTF-8 can only sit inside
 * its strings (every byte of JSON's syntax is ASCII), so mending the text mends those strings. */
static cJSON *parse_or_null(const char *text) {
    cJSON *v = NULL;
    if (text && tq_utf8_valid(text)) {
        v = cJSON_Parse(text);
    } else if (text) {
        char *fixed = tq_utf8_sanitize(text);
        if (fixed) v = cJSON_Parse(fixed);
        free(fixed);
    }
    return v ? v : cJSON_CreateNull();
}

/* cJSON 1.7.15 prints a number with %1.15g whenever that reads back within a relative
 * DBL_EPSILON of it, so a stored spec's 0.9999999999999999 came out as 1 (outside the
 * backoff_factor range the spec was accepted in) and a seed of 2^53 as 9.00719925474099e+15.
 * Each number of item whose %.15g text is not exactly it becomes a raw item with the shortest
 * text that is (as spec.c wrote it): the spec a job shows is the one it runs, and can be
 * resubmitted as it is. Numbers %.15g holds exactly (every count, id and small integer the
 * handlers read back with cJSON_IsNumber) stay numbers. */
static void exact_numbers(cJSON *item, int depth) {
    if (!item || depth > 64) return;
    for (cJSON *c = item->child, *next; c; c = next) {
        next = c->next;
        if (cJSON_IsObject(c) || cJSON_IsArray(c)) { exact_numbers(c, depth + 1); continue; }
        if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble)) continue;
        double d = c->valuedouble;
        char t[40];
        snprintf(t, sizeof t, "%.15g", d);
        if (strtod(t, NULL) == d) continue;
        snprintf(t, sizeof t, "%.16g", d);
        if (strtod(t, NULL) != d) snprintf(t, sizeof t, "%.17g", d);
        cJSON *raw = cJSON_CreateRaw(t);
        if (!raw) continue;
        raw->string = c->string;   /* the member's key moves over (ReplaceItemViaPointer keeps none) */
        raw->type |= c->type & cJSON_StringIsConst;
        c->string = NULL;
        if (!cJSON_ReplaceItemViaPointer(item, c, raw)) {   /* cannot fail for a child of item */
            c->string = raw->string;
            raw->string = NULL;
            cJSON_Delete(raw);
        }
    }
}

cJSON *tq_job_json(const tq_job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)j->id);
    add_text(o, "name", j->name);
    add_text(o, "state", j->state);
    cJSON *spec = parse_or_null(j->spec);
    exact_numbers(spec, 0);
    cJSON_AddItemToObject(o, "spec", spec);
    cJSON_AddNumberToObject(o, "priority", j->priority);
    if (j->submission_id[0]) add_text(o, "submission_id", j->submission_id);
    else cJSON_AddNullToObject(o, "submission_id");
    add_time(o, "created_at", j->created_at);
    add_time(o, "started_at", j->started_at);
    add_time(o, "finished_at", j->finished_at);
    if (!strcmp(j->state, "queued") && j->queue_position > 0)
        cJSON_AddNumberToObject(o, "queue_position", (double)j->queue_position);
    else
        cJSON_AddNullToObject(o, "queue_position");
    cJSON_AddNumberToObject(o, "attempts", j->attempts);
    cJSON_AddNumberToObject(o, "max_attempts", j->max_attempts);
    if (j->device[0]) add_text(o, "device", j->device);
    else cJSON_AddNullToObject(o, "device");

    cJSON *p = cJSON_AddObjectToObject(o, "progress");
    cJSON_AddNumberToObject(p, "step", j->has_latest ? (double)j->latest.step : 0);
    int64_t total = j->total_steps;
    if (total <= 0) {   /* before the worker knows it: the spec's steps, when given */
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(spec, "steps");
        if (cJSON_IsNumber(s) && s->valuedouble >= 1) total = (int64_t)s->valuedouble;
    }
    if (total > 0) cJSON_AddNumberToObject(p, "total_steps", (double)total);
    else cJSON_AddNullToObject(p, "total_steps");
    cJSON_AddNumberToObject(p, "epoch", j->has_latest ? j->latest.epoch : 0);

    if (j->has_latest) cJSON_AddItemToObject(o, "latest", tq_step_json(&j->latest));
    else cJSON_AddNullToObject(o, "latest");
    cJSON_AddItemToObject(o, "summary", parse_or_null(j->summary));
    if (j->error_code[0]) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        add_text(e, "code", j->error_code);
        add_text(e, "message", j->error_message ? j->error_message : "");
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (j->planned_peak_bytes >= 0) cJSON_AddNumberToObject(o, "planned_peak_bytes", (double)j->planned_peak_bytes);
    else cJSON_AddNullToObject(o, "planned_peak_bytes");
    cJSON_AddBoolToObject(o, "cancel_requested", j->cancel_requested);
    return o;
}

/* ---- CSV ------------------------------------------------------------------------------ */

typedef struct { char *p; size_t n, cap; int oom; } sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 8192;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np; b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* shortest of %.15g / %.17g that reads back exactly (cJSON's rule); empty for null */
static void put_double(sbuf *b, double v, int is_null) {
    char t[40] = "";
    if (!is_null && isfinite(v)) {
        snprintf(t, sizeof t, "%.15g", v);
        if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
    }
    put(b, t, strlen(t));
}
static void put_int(sbuf *b, long long v, int is_null) {
    char t[32] = "";
    if (!is_null) snprintf(t, sizeof t, "%lld", v);
    put(b, t, strlen(t));
}

char *tq_steps_csv(const tq_step_rec *v, int n, size_t *len) {
    sbuf b = {0};
    static const char header[] = "step,epoch,loss,lr,loss_scale,skipped,step_ms,samples_per_s,"
                                 "mem_allocated_bytes,mem_peak_bytes,mem_reserved_bytes,"
                                 "device_used_bytes,time\n";
    put(&b, header, sizeof header - 1);
    for (int i = 0; i < n; i++) {
        const tq_step_rec *r = &v[i];
        put_int(&b, r->step, 0); put(&b, ",", 1);
        put_int(&b, r->epoch, 0); put(&b, ",", 1);
        put_double(&b, r->loss, 0); put(&b, ",", 1);
        put_double(&b, r->lr, 0); put(&b, ",", 1);
        put_double(&b, r->loss_scale, r->loss_scale < 0); put(&b, ",", 1);
        put_int(&b, r->skipped ? 1 : 0, 0); put(&b, ",", 1);
        put_double(&b, r->step_ms, 0); put(&b, ",", 1);
        put_double(&b, r->samples_per_s, 0); put(&b, ",", 1);
        put_int(&b, r->mem_allocated_bytes, 0); put(&b, ",", 1);
        put_int(&b, r->mem_peak_bytes, 0); put(&b, ",", 1);
        put_int(&b, r->mem_reserved_bytes, 0); put(&b, ",", 1);
        put_int(&b, r->device_used_bytes, r->device_used_bytes < 0); put(&b, ",", 1);
        put_int(&b, r->time_ms, 0); put(&b, "\n", 1);
    }
    if (b.oom) { free(b.p); return NULL; }
    *len = b.n;
    return b.p;
}
