/* http.c — libmicrohttpd glue (see api.h): the daemon's options, the route table, per-request
 * state, body caps, the Host check, query parameters and the response helpers.
 *
 * What enters is checked before any handler runs: exactly one Host (none only in HTTP/1.0) and
 * an allowed one; a path whose decoded bytes are valid UTF-8 without NUL or other control
 * characters (judged on the raw URI, before libmicrohttpd's unescaping cuts a %00); query
 * parameters likewise (their decoded lengths, so a %00 is seen); one Content-Length, refused
 * with a JSON 413 when over the cap before the body is read. What leaves as JSON is made valid
 * UTF-8 (tq_send_json), whatever an older database holds.
 *
 * libmicrohttpd 0.9.75 answers some malformed requests itself, before any callback of ours, with
 * its own small HTML bodies, and has no option to replace them: a Content-Length that is not a
 * number (400) or does not fit in 64 bits (413), a request line or header block over the
 * connection memory limit (431, or 414 for the URI), a malformed request line or header (400),
 * an unsupported HTTP version (505), a bad chunked encoding (400). Everything that reaches the
 * access handler is answered as {"error":{...}}. */
#include "internal.h"
#include "utf8.h"
#include <sys/stat.h>
#include <sys/un.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <time.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

/* ---- the route table ------------------------------------------------------------------ */

typedef struct {
    const char *method;
    const char *pattern;   /* segments; "{id}" matches a job id */
    tq_handler fn;
} route;

static const route routes[] = {
    { "POST",   "/v1/jobs",              tq_h_submit },
    { "GET",    "/v1/jobs",              tq_h_list },
    { "GET",    "/v1/jobs/{id}",         tq_h_get },
    { "DELETE", "/v1/jobs/{id}",         tq_h_delete },
    { "GET",    "/v1/jobs/{id}/steps",   tq_h_steps },
    { "GET",    "/v1/jobs/{id}/evals",   tq_h_evals },
    { "GET",    "/v1/jobs/{id}/events",  tq_h_events },
    { "POST",   "/v1/jobs/{id}/cancel",  tq_h_cancel },
    { "GET",    "/v1/jobs/{id}/model",   tq_h_model },
    { "GET",    "/v1/jobs/{id}/log",     tq_h_log },
    { "GET",    "/v1/compare",           tq_h_compare },
    { "GET",    "/v1/devices",           tq_h_devices },
    { "GET",    "/v1/users",             tq_h_users },
    { "GET",    "/healthz",              tq_h_health },
    { "GET",    "/metrics",              tq_h_metrics },
};

/* Does url match pattern? *idseg receives the {id} segment (pointer into url) and its length. */
static int match(const char *pattern, const char *url, const char **idseg, size_t *idlen) {
    const char *p = pattern, *u = url;
    *idseg = NULL; *idlen = 0;
    while (*p && *u) {
        if (*p != '/' || *u != '/') return 0;
        p++; u++;
        size_t pl = strcspn(p, "/"), ul = strcspn(u, "/");
        if (pl == 4 && !strncmp(p, "{id}", 4)) {
            if (ul == 0) return 0;
            *idseg = u; *idlen = ul;
        } else if (pl != ul || strncmp(p, u, pl)) {
            return 0;
        }
        p += pl; u += ul;
    }
    return !*p && !*u;
}

/* ---- responses ------------------------------------------------------------------------ */

static enum MHD_Result queue(tq_ctx *c, unsigned status, struct MHD_Response *r, const char *ctype) {
    if (!r) return MHD_NO;
    if (ctype) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ret = MHD_queue_response(c->conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result tq_send_text(tq_ctx *c, unsigned status, const char *ctype, char *text, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(text); return MHD_NO; }
    return queue(c, status, r, ctype);
}

enum MHD_Result tq_send_json(tq_ctx *c, unsigned status, cJSON *body) {
    if (!body) return MHD_NO;
    /* every string valid UTF-8, whatever a handler copied in (a stored name, an echoed value
     * cut inside a character): a client always gets JSON it can parse */
    if (tq_utf8_sanitize_json(body)) { cJSON_Delete(body); return MHD_NO; }
    char *s = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    if (!s) return MHD_NO;
    size_t n = strlen(s);
    /* cJSON allocates with malloc (default hooks): MHD may free() it */
    char *t = realloc(s, n + 2);
    if (!t) { free(s); return MHD_NO; }
    t[n] = '\n'; t[n + 1] = 0;
    return tq_send_text(c, status, "application/json", t, n + 1);
}

enum MHD_Result tq_send_error(tq_ctx *c, unsigned status, const char *code, const char *field,
                              const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    if (field && field[0]) cJSON_AddStringToObject(e, "field", field);
    return tq_send_json(c, status, o);
}

enum MHD_Result tq_send_store_error(tq_ctx *c, tq_store *s, int rc) {
    const char *m = s ? tq_store_errmsg(s) : "the database cannot be opened";
    if (rc == TQ_STORE_ENOJOB) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)c->id);
    if (rc == TQ_STORE_ECONFLICT) return tq_send_error(c, MHD_HTTP_CONFLICT, "conflict", NULL, "%s", m);
    const char *path = c->api->db_path;
    switch (s ? tq_store_fault(s) : TQ_STORE_FAULT_READONLY) {
    case TQ_STORE_FAULT_BUSY:
        return tq_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "database_busy", NULL,
                             "the database %s is busy; try again (%s)", path, m);
    case TQ_STORE_FAULT_FULL:
        __atomic_store_n(&c->api->storage_fault_ms, (long long)time(NULL) * 1000, __ATOMIC_RELAXED);
        return tq_send_error(c, MHD_HTTP_INSUFFICIENT_STORAGE, "storage_full", NULL,
                             "the filesystem of the database %s is full: nothing was written; reads still "
                             "work, writes resume when space is freed (%s)", path, m);
    case TQ_STORE_FAULT_READONLY:
    case TQ_STORE_FAULT_IO:
        return tq_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "storage_unavailable", NULL,
                             "the database %s cannot be written: nothing was written; reads still work (%s)",
                             path, m);
    default:
        return tq_send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL, "%s", m);
    }
}

/* ---- the thread's store --------------------------------------------------------------- */

static void close_store(void *p) { tq_store_close(p); }

tq_store *tq_api_store(tq_ctx *c) {
    tq_store *s = pthread_getspecific(c->api->store_key);
    if (s) return s;
    char err[512];
    s = tq_store_open(c->api->db_path, err, sizeof err);
    if (!s) { fprintf(stderr, "trainq api: %s\n", err); return NULL; }
    if (tq_store_set_durable(s, 1)) fprintf(stderr, "trainq api: %s\n", tq_store_errmsg(s));
    pthread_setspecific(c->api->store_key, s);
    return s;
}

/* ---- query parameters ----------------------------------------------------------------- */

/* The query parameters into c->qk/qv; the first one that is not valid UTF-8 or holds a control
 * character (a %00 included: the sizes are the decoded ones) is noted in field/why. */
typedef struct {
    tq_ctx *c;
    char field[64];
    char why[192];
} arg_scan;

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                   const char *value, size_t value_size) {
    arg_scan *as = cls;
    tq_ctx *c = as->c;
    (void)kind;
    char why[96];
    if (!as->why[0] && tq_utf8_explain(key, key_size, 0, why, sizeof why)) {
        tq_utf8_sanitize_to(as->field, sizeof as->field, key, key_size, 1);
        snprintf(as->why, sizeof as->why, "the name of query parameter \"%s\" %s", as->field, why);
    } else if (!as->why[0] && value && tq_utf8_explain(value, value_size, 0, why, sizeof why)) {
        tq_utf8_sanitize_to(as->field, sizeof as->field, key, key_size, 1);
        snprintf(as->why, sizeof as->why, "query parameter %s %s", as->field, why);
    }
    if (c->nq < TQ_API_MAX_QUERY) { c->qk[c->nq] = key; c->qv[c->nq] = value ? value : ""; }
    c->nq++;
    return MHD_YES;
}

int tq_query_check(tq_ctx *c, const char *const *allowed, enum MHD_Result *answered) {
    if (c->nq > TQ_API_MAX_QUERY) {
        *answered = tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", NULL, "too many query parameters");
        return 0;
    }
    for (int i = 0; i < c->nq; i++) {
        int ok = 0;
        for (const char *const *a = allowed; a && *a; a++) if (!strcmp(*a, c->qk[i])) ok = 1;
        if (!ok) {
            *answered = tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", c->qk[i],
                                      "unknown query parameter \"%.64s\"", c->qk[i]);
            return 0;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(c->qk[j], c->qk[i])) {
                *answered = tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", c->qk[i],
                                          "query parameter \"%.64s\" is given twice", c->qk[i]);
                return 0;
            }
    }
    return 1;
}

const char *tq_query(tq_ctx *c, const char *key) {
    for (int i = 0; i < c->nq && i < TQ_API_MAX_QUERY; i++) if (!strcmp(c->qk[i], key)) return c->qv[i];
    return NULL;
}

/* strict decimal: optional '-', digits only, no overflow */
static int parse_ll(const char *s, long long *out) {
    if (!s || !*s) return -1;
    const char *p = s;
    if (*p == '-') p++;
    if (!*p) return -1;
    for (const char *q = p; *q; q++) if (!isdigit((unsigned char)*q)) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int tq_query_int(tq_ctx *c, const char *key, long long lo, long long hi, long long *out,
                 enum MHD_Result *answered) {
    const char *v = tq_query(c, key);
    long long x;
    if (parse_ll(v, &x) || x < lo || x > hi) {
        *answered = tq_send_error(c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", key,
                                  "%s must be an integer in %lld…%lld, got \"%.64s\"", key, lo, hi, v ? v : "");
        return -1;
    }
    *out = x;
    return 0;
}

/* Content-Length (digits, as libmicrohttpd accepted it) over max? Any value past 64 bits was
 * refused by libmicrohttpd before we run. */
static int over_limit(const char *cl, size_t max) {
    while (*cl == ' ' || *cl == '\t') cl++;
    while (*cl == '0' && isdigit((unsigned char)cl[1])) cl++;
    size_t n = strspn(cl, "0123456789");
    if (n == 0) return 0;
    if (n > 19) return 1;   /* >= 10^19 */
    errno = 0;
    unsigned long long v = strtoull(cl, NULL, 10);
    return errno != 0 || v > (unsigned long long)max;
}

/* ---- the request line and headers ------------------------------------------------------- */

/* Why the raw path (the URI up to '?') is refused, into why[n]; "" when it is fine: its bytes,
 * %XX decoded as libmicrohttpd will, must be UTF-8 without NUL or other control characters. */
static void check_raw_path(const char *uri, char *why, size_t n) {
    why[0] = 0;
    size_t len = strcspn(uri, "?");
    char *dec = malloc(len + 1);
    if (!dec) { snprintf(why, n, "out of memory"); return; }
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (uri[i] == '%' && isxdigit((unsigned char)uri[i + 1]) && isxdigit((unsigned char)uri[i + 2])) {
            char hex[3] = { uri[i + 1], uri[i + 2], 0 };
            dec[o++] = (char)strtol(hex, NULL, 16);
            i += 2;
        } else {
            dec[o++] = uri[i];
        }
    }
    char what[96];
    if (tq_utf8_explain(dec, o, 0, what, sizeof what))
        snprintf(why, n, "the path (after %%-decoding) %s", what);
    free(dec);
}

typedef struct { const char *name; int n; } header_count;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    header_count *h = cls;
    (void)kind; (void)value;
    if (key && !strcasecmp(key, h->name)) h->n++;
    return MHD_YES;
}

static int headers_named(struct MHD_Connection *conn, const char *name) {
    header_count h = { name, 0 };
    MHD_get_connection_values(conn, MHD_HEADER_KIND, count_header, &h);
    return h.n;
}

/* ---- the Host check (DNS rebinding) ----------------------------------------------------- */

/* host[:port] or [v6][:port] → the name part in out (lowercase) */
static int host_name(const char *h, char *out, size_t n) {
    size_t len;
    if (h[0] == '[') {
        const char *e = strchr(h, ']');
        if (!e) return -1;
        len = (size_t)(e - h) + 1;
        if (e[1] && e[1] != ':') return -1;
    } else {
        len = strcspn(h, ":");
        if (h[len] && strchr(h + len + 1, ':')) return -1;
    }
    const char *port = h + len;
    if (*port == ':') for (const char *q = port + 1; *q; q++) if (!isdigit((unsigned char)*q)) return -1;
    if (len == 0 || len >= n) return -1;
    for (size_t i = 0; i < len; i++) out[i] = (char)tolower((unsigned char)h[i]);
    out[len] = 0;
    return 0;
}

static int name_in_list(const char *name, const char *list) {
    if (!list) return 0;
    const char *p = list;
    while (*p) {
        while (*p == ',' || *p == ' ') p++;
        size_t l = strcspn(p, ", ");
        if (l && strlen(name) == l && !strncasecmp(name, p, l)) return 1;
        p += l;
    }
    return 0;
}

static int host_allowed(tq_api *a, const char *host) {
    if (!host) return 1;   /* HTTP/1.0 without Host (HTTP/1.1 requires one: MHD answers 400) */
    char name[300];
    if (host_name(host, name, sizeof name)) return 0;
    if (!strcmp(name, "localhost") || !strcmp(name, "127.0.0.1") || !strcmp(name, "[::1]")) return 1;
    if (a->host[0] && strcmp(a->host, "0.0.0.0") && strcmp(a->host, "::")) {
        char lh[300];
        if (strchr(a->host, ':')) snprintf(lh, sizeof lh, "[%s]", a->host);
        else snprintf(lh, sizeof lh, "%s", a->host);
        if (!strcasecmp(name, lh)) return 1;
    }
    return name_in_list(name, a->allowed_hosts);
}

/* ---- the access handler --------------------------------------------------------------- */

/* http.c's per-request state around the tq_req the handlers see: made by the URI callback (which
 * sees the raw URI, before it is unescaped), freed by completed_cb. rq first: the same pointer. */
typedef struct {
    tq_req rq;
    int seen;              /* the access handler has run for this request */
    char bad_path[160];    /* "" or why the path is refused */
} request;

static void *uri_cb(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)cls; (void)conn;
    request *rx = calloc(1, sizeof *rx);
    if (rx) check_raw_path(uri ? uri : "", rx->bad_path, sizeof rx->bad_path);
    return rx;
}

static int is_json_type(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ') ct++;
    size_t l = strlen("application/json");
    if (strncasecmp(ct, "application/json", l)) return 0;
    return ct[l] == 0 || ct[l] == ';' || ct[l] == ' ';
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    tq_api *a = cls;
    request *rx = *con_cls;
    if (!rx) {   /* the URI callback could not allocate */
        rx = calloc(1, sizeof *rx);
        if (!rx) return MHD_NO;
        *con_cls = rx;
    }
    tq_req *rq = &rx->rq;
    tq_ctx c = { .api = a, .conn = conn, .method = method, .req = rq };
    if (!rx->seen) {
        rx->seen = 1;
        /* checks that need no body: answered at once (MHD then skips the body) */
        int nhost = headers_named(conn, MHD_HTTP_HEADER_HOST);
        if (nhost > 1)
            return tq_send_error(&c, MHD_HTTP_BAD_REQUEST, "invalid_request", "Host",
                                 "the request has %d Host headers; it must have one (RFC 9112, 3.2)", nhost);
        if (nhost == 0 && version && strcmp(version, MHD_HTTP_VERSION_1_0))
            return tq_send_error(&c, MHD_HTTP_BAD_REQUEST, "invalid_request", "Host",
                                 "an %.16s request must have a Host header (RFC 9112, 3.2)", version);
        if (!host_allowed(a, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)))
            return tq_send_error(&c, MHD_HTTP_FORBIDDEN, "forbidden_host", NULL,
                                 "the Host header is not a name this daemon answers to");
        if (rx->bad_path[0])
            return tq_send_error(&c, MHD_HTTP_BAD_REQUEST, "invalid_request", "path", "%s", rx->bad_path);
        int ncl = headers_named(conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (ncl > 1)
            return tq_send_error(&c, MHD_HTTP_BAD_REQUEST, "invalid_request", "Content-Length",
                                 "the request has %d Content-Length headers; it must have at most one", ncl);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && over_limit(cl, a->max_body))
            return tq_send_error(&c, MHD_HTTP_CONTENT_TOO_LARGE, "payload_too_large", NULL,
                                 "the body has %.24s bytes, more than the %zu allowed", cl, a->max_body);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->too_large) {
            if (rq->len + *upload_size > a->max_body) {
                rq->too_large = 1;
                free(rq->body); rq->body = NULL; rq->len = rq->cap = 0;
            } else {
                if (rq->len + *upload_size + 1 > rq->cap) {
                    size_t nc = rq->cap ? rq->cap : 4096;
                    while (nc < rq->len + *upload_size + 1) nc *= 2;
                    char *nb = realloc(rq->body, nc);
                    if (!nb) return MHD_NO;
                    rq->body = nb; rq->cap = nc;
                }
                memcpy(rq->body + rq->len, upload, *upload_size);
                rq->len += *upload_size;
                rq->body[rq->len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->started) return MHD_YES;   /* already answered */
    rq->started = 1;
    if (rq->too_large)
        return tq_send_error(&c, MHD_HTTP_CONTENT_TOO_LARGE, "payload_too_large", NULL,
                             "the body is larger than the %zu bytes allowed", a->max_body);

    /* route */
    const char *m = !strcmp(method, "HEAD") ? "GET" : method;
    const route *hit = NULL;
    char allow[64] = "";
    const char *idseg = NULL;
    size_t idlen = 0;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const char *seg; size_t sl;
        if (!match(routes[i].pattern, url, &seg, &sl)) continue;
        if (!strcmp(routes[i].method, m)) { hit = &routes[i]; idseg = seg; idlen = sl; break; }
        size_t al = strlen(allow);
        snprintf(allow + al, sizeof allow - al, "%s%s", al ? ", " : "", routes[i].method);
    }
    if (!hit && allow[0]) {
        struct MHD_Response *r;
        cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", "method_not_allowed");
        char msg[256];
        snprintf(msg, sizeof msg, "%.16s is not allowed on %.80s (allowed: %s)", method, url, allow);
        cJSON_AddStringToObject(e, "message", msg);
        char *s = tq_utf8_sanitize_json(o) ? NULL : cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s) return MHD_NO;
        r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
        if (!r) { free(s); return MHD_NO; }
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
        return queue(&c, MHD_HTTP_METHOD_NOT_ALLOWED, r, "application/json");
    }
    if (!hit) return tq_send_error(&c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no endpoint %.200s", url);
    if (idseg) {
        int ok = idlen <= 18;
        for (size_t i = 0; ok && i < idlen; i++) if (!isdigit((unsigned char)idseg[i])) ok = 0;
        if (!ok)
            return tq_send_error(&c, MHD_HTTP_BAD_REQUEST, "invalid_id", "id",
                                 "a job id is a positive integer, got \"%.*s\"", (int)(idlen > 64 ? 64 : idlen), idseg);
        c.id = strtoll(idseg, NULL, 10);
    }
    arg_scan as = { .c = &c };
    MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, collect_arg, &as);
    if (as.why[0])
        return tq_send_error(&c, MHD_HTTP_BAD_REQUEST, "invalid_parameter", as.field, "%s", as.why);
    if (!strcmp(m, "POST") && hit->fn == tq_h_submit) {
        const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        char why[96];
        if (ct && tq_utf8_explain(ct, strlen(ct), 0, why, sizeof why))
            return tq_send_error(&c, MHD_HTTP_BAD_REQUEST, "invalid_request", "Content-Type",
                                 "the Content-Type header %s", why);
        if (!is_json_type(ct))
            return tq_send_error(&c, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", NULL,
                                 "the body must be application/json (curl --json), got %.64s",
                                 ct ? ct : "no Content-Type");
    }
    return hit->fn(&c);
}

static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn; (void)toe;
    request *rx = *con_cls;
    if (!rx) return;
    if (rx->rq.sse) tq_sse_free(cls, rx->rq.sse);
    free(rx->rq.body);
    free(rx);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fputs("trainq api: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---- start / stop --------------------------------------------------------------------- */

static char *dupz(const char *s) { return s ? strdup(s) : strdup(""); }

static void api_free(tq_api *a) {
    if (!a) return;
    free(a->host); free(a->db_path); free(a->jobs_dir); free(a->devices); free(a->allowed_hosts);
    free(a->cuda); free(a->gpus); free(a->admin_group); free(a->socket_path);
    for (size_t i = 0; i < sizeof a->plans / sizeof a->plans[0]; i++) free(a->plans[i].key);
    pthread_mutex_destroy(&a->sse_mu);
    pthread_mutex_destroy(&a->plan_mu);
    pthread_key_delete(a->store_key);
    free(a);
}

/* The unix socket: every local user may connect (mode 0666), and SO_PEERCRED tells who did
 * (peer.h). A stale socket file from a daemon that died is replaced; any other file at the path
 * is not touched. Served by a second libmicrohttpd daemon on the same handlers. 0 ok. */
static int listen_unix(tq_api *a, const char *path, unsigned threads, char *err, size_t errlen) {
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "--socket %s: the path is longer than %zu bytes", path, sizeof sa.sun_path - 1);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "--socket %s: a file that is not a socket is in the way", path);
            return -1;
        }
        unlink(path);   /* a stale socket (the lock on the database says no daemon uses it) */
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || chmod(path, 0666) || listen(fd, 128)) {
        snprintf(err, errlen, "--socket %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    a->mhd_unix = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                                   MHD_USE_AUTO, 0, NULL, NULL, access_cb, a,
                                   MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                                   MHD_OPTION_LISTEN_SOCKET, fd,
                                   MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(threads ? threads : 4),
                                   MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                                   MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
                                   MHD_OPTION_NOTIFY_COMPLETED, completed_cb, a,
                                   MHD_OPTION_URI_LOG_CALLBACK, uri_cb, a,
                                   MHD_OPTION_END);
    if (!a->mhd_unix) {
        snprintf(err, errlen, "--socket %s: libmicrohttpd refused to serve it", path);
        close(fd);
        unlink(path);
        return -1;
    }
    a->socket_path = strdup(path);
    return 0;
}

tq_api *tq_api_start(const tq_api_config *cfg, char *err, size_t errlen) {
    tq_api *a = calloc(1, sizeof *a);
    if (!a) { snprintf(err, errlen, "out of memory"); return NULL; }
    a->host = dupz(cfg->host); a->db_path = dupz(cfg->db_path); a->jobs_dir = dupz(cfg->jobs_dir);
    a->devices = dupz(cfg->devices ? cfg->devices : "cpu");
    a->allowed_hosts = cfg->allowed_hosts ? strdup(cfg->allowed_hosts) : NULL;
    a->port = cfg->port;
    a->ledger = cfg->ledger;
    a->admin_group = strdup(cfg->admin_group && cfg->admin_group[0] ? cfg->admin_group : "trainq-admin");
    a->private_jobs = cfg->private_jobs;
    a->remote_writes = cfg->allow_remote_writes;
    a->fair_window_s = cfg->fair_share_window_s;
    a->max_body = cfg->max_body ? cfg->max_body : 64 * 1024;
    pthread_mutex_init(&a->sse_mu, NULL);
    pthread_mutex_init(&a->plan_mu, NULL);
    pthread_key_create(&a->store_key, close_store);
    a->cuda = dupz(cfg->cuda ? cfg->cuda : "not probed");
    if (cfg->ngpus > 0 && cfg->gpus) {
        a->gpus = malloc((size_t)cfg->ngpus * sizeof *a->gpus);
        if (!a->gpus) { snprintf(err, errlen, "out of memory"); api_free(a); return NULL; }
        memcpy(a->gpus, cfg->gpus, (size_t)cfg->ngpus * sizeof *a->gpus);
        a->ngpus = cfg->ngpus;
    }

    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%u", cfg->port);
    const char *h = cfg->host && cfg->host[0] ? cfg->host : "127.0.0.1";
    int g = getaddrinfo(h, port, &hints, &ai);
    if (g || !ai) {
        snprintf(err, errlen, "cannot resolve listen address %s: %s", h, gai_strerror(g));
        api_free(a);
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | MHD_USE_AUTO;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    a->mhd = MHD_start_daemon(flags, cfg->port, NULL, NULL, access_cb, a,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads ? cfg->threads : 4),
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)256,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)64,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
                              MHD_OPTION_NOTIFY_COMPLETED, completed_cb, a,
                              MHD_OPTION_URI_LOG_CALLBACK, uri_cb, a,
                              MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!a->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%u (%s)", h, cfg->port,
                 errno ? strerror(errno) : "libmicrohttpd refused to start");
        api_free(a);
        return NULL;
    }
    if (cfg->socket_path && cfg->socket_path[0] && listen_unix(a, cfg->socket_path, cfg->threads, err, errlen)) {
        MHD_stop_daemon(a->mhd);
        api_free(a);
        return NULL;
    }
    if (tq_sse_start(a)) {
        snprintf(err, errlen, "cannot start the event-stream thread");
        MHD_stop_daemon(a->mhd);
        api_free(a);
        return NULL;
    }
    return a;
}

void tq_api_stop(tq_api *a) {
    if (!a) return;
    MHD_quiesce_daemon(a->mhd);   /* stop accepting */
    if (a->mhd_unix) MHD_quiesce_daemon(a->mhd_unix);
    tq_sse_stop(a);               /* resume and end every stream */
    tq_log_follow_stop(a);        /* and every log follower */
    MHD_stop_daemon(a->mhd);
    if (a->mhd_unix) MHD_stop_daemon(a->mhd_unix);
    if (a->socket_path) unlink(a->socket_path);
    api_free(a);
}
