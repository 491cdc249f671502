/* util.c — what the client commands share: ids, JSON GETs, numbers and ages for people, cJSON
 * accessors, plain-text tables. See client.h. */
#include "client.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int tq_cli_parse_id(const char *s, long long *id) {
    char *end = NULL;
    errno = 0;
    if (!s || !s[0] || s[0] < '0' || s[0] > '9') return -1;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || v <= 0) return -1;
    *id = v;
    return 0;
}

int tq_cli_get_json_raw(const char *prog, const char *what, const char *path, int raw, cJSON **out) {
    *out = NULL;
    tq_http_resp r;
    int rc = tq_http_request("GET", path, NULL, &r);
    if (rc) return rc;
    char msg[1024];
    if (r.status != 200) {
        fprintf(stderr, "%s: %s%s%s\n", prog, what ? what : "", what ? ": " : "", tq_http_errmsg(&r, msg, sizeof msg));
        tq_http_resp_free(&r);
        return TQ_CLI_FAILED;
    }
    if (raw) {   /* --json: the daemon's answer as it is */
        fwrite(r.body, 1, r.len, stdout);
        if (!r.len || r.body[r.len - 1] != '\n') putchar('\n');
        tq_http_resp_free(&r);
        return 0;
    }
    *out = cJSON_Parse(r.body);
    tq_http_resp_free(&r);
    if (!*out) {
        fprintf(stderr, "%s: %s%sthe daemon's answer is not JSON\n", prog, what ? what : "", what ? ": " : "");
        return TQ_CLI_FAILED;
    }
    return 0;
}

int tq_cli_get_json(const char *prog, const char *what, const char *path, cJSON **out) {
    return tq_cli_get_json_raw(prog, what, path, 0, out);
}

/* ---- numbers for people ------------------------------------------------------------------ */

const char *tq_fmt_bytes(double b, char *buf, size_t n) {
    if (!isfinite(b) || b < 0) { snprintf(buf, n, "-"); return buf; }
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    int u = 0;
    while (b >= 1024 && u < 5) { b /= 1024; u++; }
    if (u == 0) snprintf(buf, n, "%.0f B", b);
    else snprintf(buf, n, b < 10 ? "%.2f %s" : b < 100 ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

const char *tq_fmt_age(double s, char *buf, size_t n) {
    if (!isfinite(s)) { snprintf(buf, n, "-"); return buf; }
    if (s < 0) s = 0;
    long long t = (long long)s;
    if (t < 60) snprintf(buf, n, "%llds", t);
    else if (t < 3600) snprintf(buf, n, "%lldm", t / 60);
    else if (t < 86400) snprintf(buf, n, "%lldh%lldm", t / 3600, t % 3600 / 60);
    else snprintf(buf, n, "%lldd", t / 86400);
    return buf;
}

const char *tq_fmt_rate(double v, char *buf, size_t n) {
    if (!isfinite(v) || v < 0) snprintf(buf, n, "-");
    else if (v < 10) snprintf(buf, n, "%.1f", v);
    else snprintf(buf, n, "%.0f", v);
    return buf;
}

double tq_parse_time(const char *s) {
    if (!s) return -1;
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int y, mo, d, h, mi;
    double sec;
    if (sscanf(s, "%d-%d-%dT%d:%d:%lf", &y, &mo, &d, &h, &mi, &sec) != 6) return -1;
    tm.tm_year = y - 1900; tm.tm_mon = mo - 1; tm.tm_mday = d;
    tm.tm_hour = h; tm.tm_min = mi; tm.tm_sec = 0;
    time_t t = timegm(&tm);   /* the daemon writes UTC ("Z" or +00:00) */
    return (double)t + sec;
}

double tq_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- cJSON accessors ------------------------------------------------------------------------ */

const cJSON *tq_js_get(const cJSON *o, const char *path) {
    char key[128];
    while (o && path && *path) {
        const char *dot = strchr(path, '.');
        size_t k = dot ? (size_t)(dot - path) : strlen(path);
        if (k >= sizeof key) return NULL;
        memcpy(key, path, k);
        key[k] = 0;
        o = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
        path = dot ? dot + 1 : NULL;
    }
    return o;
}

double tq_js_num(const cJSON *o, const char *path, double dflt) {
    const cJSON *v = tq_js_get(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

const char *tq_js_str(const cJSON *o, const char *path, const char *dflt) {
    const cJSON *v = tq_js_get(o, path);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : dflt;
}

/* ---- tables ---------------------------------------------------------------------------------- */

void tq_table_init(tq_table *t, int ncols, const char *const *head, const int *right) {
    memset(t, 0, sizeof *t);
    t->ncols = ncols;
    t->head = head;
    t->right = right;
}

void tq_table_add(tq_table *t, const char *const *cells) {
    if (t->nrows == t->cap) {
        int nc = t->cap ? t->cap * 2 : 32;
        char **nb = realloc(t->cells, (size_t)nc * t->ncols * sizeof *nb);
        if (!nb) return;
        t->cells = nb;
        t->cap = nc;
    }
    for (int c = 0; c < t->ncols; c++)
        t->cells[(size_t)t->nrows * t->ncols + c] = strdup(cells[c] ? cells[c] : "");
    t->nrows++;
}

/* display width: UTF-8 continuation bytes take no column */
static int width(const char *s) {
    int w = 0;
    for (; s && *s; s++) if (((unsigned char)*s & 0xC0) != 0x80) w++;
    return w;
}

void tq_table_print(tq_table *t, FILE *f) {
    int *w = calloc((size_t)t->ncols, sizeof *w);
    if (!w) return;
    for (int c = 0; c < t->ncols; c++) {
        w[c] = width(t->head[c]);
        for (int r = 0; r < t->nrows; r++) {
            int x = width(t->cells[(size_t)r * t->ncols + c]);
            if (x > w[c]) w[c] = x;
        }
    }
    for (int r = -1; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            const char *s = r < 0 ? t->head[c] : t->cells[(size_t)r * t->ncols + c];
            const char *s0 = s ? s : "";
            int pad = w[c] - width(s0);
            int last = c == t->ncols - 1;
            if (t->right && t->right[c]) fprintf(f, "%*s%s", pad, "", s0);
            else if (last) fputs(s0, f);
            else fprintf(f, "%s%*s", s0, pad, "");
            fputs(last ? "\n" : "  ", f);
        }
    }
    free(w);
}

void tq_table_free(tq_table *t) {
    for (size_t i = 0; i < (size_t)t->nrows * t->ncols; i++) free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof *t);
}
