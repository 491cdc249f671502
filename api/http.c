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
#include "peer.h"
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
#include <sys/resource.h>
#include <sys/socket.h>

/* ---- the route table ------------------------------------------------------------------ */

typedef struct {
    const char *method;
    const char *pattern;   /* segments; "{id}" matches a job id, "{name}" any one segment */
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
    { "POST",   "/v1/jobs/{id}/requeue", tq_h_requeue },
    { "GET",    "/v1/jobs/{id}/model",   tq_h_model },
    { "GET",    "/v1/jobs/{id}/log",     tq_h_log },
    { "GET",    "/v1/compare",           tq_h_compare },
    { "GET",    "/v1/devices",           tq_h_devices },
    { "GET",    "/v1/users",             tq_h_users },
    { "GET",    "/healthz",              tq_h_health },
    { "GET",    "/metrics",              tq_h_metrics },
    /* the dashboard (web.c): an app shell for the pages, the embedded files of api/web/ */
    { "GET",    "/",                     tq_h_web_page },
    { "GET",    "/jobs/{id}",            tq_h_web_page },
    { "GET",    "/compare",              tq_h_web_page },
    { "GET",    "/assets/{name}",        tq_h_web_asset },
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
        } else if (pl == 6 && !strncmp(p, "{name}", 6)) {
            if (ul == 0) return 0;
        } else if (pl != ul || strncmp(p, u, pl)) {
            return 0;
        }
        p += pl; u += ul;
    }
    return !*p && !*u;
}

/* ---- responses ------------------------------------------------------------------------ */

enum MHD_Result tq_send_response(tq_ctx *c, unsigned status, struct MHD_Response *r, const char *ctype) {
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
    return tq_send_response(c, status, r, ctype);
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

/* ---- connections: the request deadline and the per-address limit ---------------------- *
 *
 * Every local client is 127.0.0.1, so a per-IP limit on loopback lets one script (or 64
 * dashboard tabs) deny the API to every other user: loopback has none. Connections from other
 * hosts are limited per address by the accept policy below (libmicrohttpd's own
 * MHD_OPTION_PER_IP_CONNECTION_LIMIT cannot skip loopback). Local connections are limited per
 * uid instead (TQ_PER_UID_LIMIT, root exempt): the kernel says who each one is at accept
 * (peer.h: SO_PEERCRED, sock_diag), once per connection, and handlers read it from here.
 *
 * libmicrohttpd 0.9.75's connection timeout is an idle timeout: every byte resets it, so a client
 * trickling one header byte a second holds a connection for ever. Here each connection has a
 * record (MHD_OPTION_NOTIFY_CONNECTION: made at STARTED, freed at CLOSED, reached from a
 * callback through MHD_CONNECTION_INFO_SOCKET_CONTEXT) saying when its wait for a request began
 * (its accept, or the end of its previous request) and whether a request is in progress; the
 * access handler's first call means the headers are complete, and the call that runs the handler
 * that the body is too. A reaper thread shuts down (shutdown(SHUT_RDWR)) the socket of every
 * connection whose request is not complete request_timeout_ms after its wait began: the
 * connection's own pool thread then sees its recv() end and closes it as a client that went away.
 * That is the only thing the reaper does to a connection, and it is safe under the thread pool:
 * shutdown() is a kernel operation on a socket that may run beside that thread's recv/send, and
 * the fd is still the connection's: libmicrohttpd calls NOTIFY_CLOSED (which takes conn_mu and
 * unlinks the record) before it closes the fd, and the reaper only touches fds of linked records
 * while holding conn_mu. A request in progress (an answer being computed or sent, an event
 * stream, a log follower) has no deadline here; its idle time stays under libmicrohttpd's
 * timeout (and a suspended stream is resumed, which resets it, every tick of sse.c). So an idle
 * connection that sends nothing is closed after the same deadline, and a keep-alive connection
 * after the same time without a next request. */

#define TQ_CONN_LIMIT 1500         /* TCP connections in all: > streams (sse.c, 256) + a crowd's 1,000 */
#define TQ_UNIX_CONN_LIMIT 1000    /* the unix socket's */
#define TQ_PER_ADDR_LIMIT 64       /* TCP connections per remote (non-loopback) address */
#define TQ_PER_UID_LIMIT 512       /* local connections per uid (root exempt) */
#define TQ_IDLE_TIMEOUT_S 30       /* libmicrohttpd's idle timeout, within a request */
#define TQ_REQUEST_TIMEOUT_S 10.0  /* default of tq_api_config.header_timeout_s */
#define TQ_FD_RESERVE 256          /* descriptors kept for the rest (database, logs, workers) */
#define TQ_REAP_TICK_MS 200

enum { CONN_WAITING, CONN_BODY, CONN_ACTIVE };

struct tq_conn {
    struct tq_conn *prev, *next;
    tq_peer peer;              /* who is on the other end, looked up once at accept (peer.h) */
    int fd;
    int phase;                 /* CONN_*: WAITING and BODY have the deadline */
    int shut;                  /* the reaper shut it down */
    int remote;                /* a non-loopback IP address, in addr */
    unsigned char addr[16];    /* IPv6, or IPv4 as v4-mapped */
    double since_ms;           /* when the wait for the request began (monotonic) */
};

static double conn_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The peer's address as 16 bytes (IPv4 v4-mapped); 1 when it is an IP address that is not
 * loopback (127.0.0.0/8, ::1, ::ffff:127.x.x.x), 0 otherwise (loopback, unix socket, unknown). */
static int remote_addr(const struct sockaddr *sa, unsigned char key[16]) {
    memset(key, 0, 16);
    if (!sa) return 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *v = (const struct sockaddr_in *)sa;
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &v->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    } else {
        return 0;
    }
    static const unsigned char v4m[12] = { 0,0,0,0, 0,0,0,0, 0,0,0xff,0xff }, lo6[16] = { [15] = 1 };
    if (!memcmp(key, v4m, 12) && key[12] == 127) return 0;
    return memcmp(key, lo6, 16) != 0;
}

/* MHD's accept policy (both listeners): none once tq_api_stop began; at most TQ_PER_ADDR_LIMIT
 * connections per remote address; loopback and the unix socket are not limited. Counted over
 * the open connections' records; two pool threads accepting at once from one address may go a
 * connection or two over. */
static enum MHD_Result accept_cb(void *cls, const struct sockaddr *sa, socklen_t len) {
    tq_api *a = cls;
    if (a->closing) return MHD_NO;
    unsigned char key[16];
    if (!len || !remote_addr(sa, key)) return MHD_YES;
    unsigned n = 0;
    pthread_mutex_lock(&a->conn_mu);
    for (struct tq_conn *k = a->conns; k && n < TQ_PER_ADDR_LIMIT; k = k->next)
        if (k->remote && !memcmp(k->addr, key, 16)) n++;
    pthread_mutex_unlock(&a->conn_mu);
    return n < TQ_PER_ADDR_LIMIT ? MHD_YES : MHD_NO;
}

static void conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe) {
    tq_api *a = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct tq_conn *k = calloc(1, sizeof *k);
        if (!k) return;   /* untracked: only libmicrohttpd's idle timeout applies */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        k->remote = ci ? remote_addr(ci->client_addr, k->addr) : 0;
        k->phase = CONN_WAITING;
        k->since_ms = conn_now_ms();
        tq_peer_of(conn, &k->peer);
        pthread_mutex_lock(&a->conn_mu);
        if (k->peer.known && k->peer.uid != 0 && k->fd >= 0) {
            int same = 0;
            for (struct tq_conn *o = a->conns; o; o = o->next) same += o->peer.known && o->peer.uid == k->peer.uid;
            if (same >= TQ_PER_UID_LIMIT) { shutdown(k->fd, SHUT_RDWR); k->shut = 1; }   /* closed as gone */
        }
        k->next = a->conns;
        if (a->conns) a->conns->prev = k;
        a->conns = k;
        pthread_mutex_unlock(&a->conn_mu);
        *socket_context = k;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct tq_conn *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&a->conn_mu);
        if (k->prev) k->prev->next = k->next; else a->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&a->conn_mu);
        free(k);
        *socket_context = NULL;
    }
}

void tq_ctx_peer(tq_ctx *c, tq_peer *p) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const struct tq_conn *k = ci ? ci->socket_context : NULL;
    if (k) *p = k->peer;
    else tq_peer_of(c->conn, p);   /* an untracked connection: ask now */
}

/* a body is to come: a Content-Length other than 0 (libmicrohttpd checked it is a number) */
static int has_length(struct MHD_Connection *conn) {
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return cl && cl[strspn(cl, "0 \t")] != 0;
}

/* From the connection's own thread: the request's phase (CONN_WAITING starts a new wait). */
static void conn_phase(tq_api *a, struct MHD_Connection *conn, int phase) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct tq_conn *k = ci ? ci->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&a->conn_mu);
    if (phase == CONN_WAITING) k->since_ms = conn_now_ms();
    k->phase = phase;
    pthread_mutex_unlock(&a->conn_mu);
}

static void *reaper(void *arg) {
    tq_api *a = arg;
    unsigned long long logged = 0;
    double last_log = 0;
    pthread_mutex_lock(&a->conn_mu);
    while (!a->reaper_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += TQ_REAP_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&a->conn_cv, &a->conn_mu, &ts);
        if (a->reaper_stop) break;
        double now = conn_now_ms();
        for (struct tq_conn *k = a->conns; k; k = k->next)
            if (k->phase != CONN_ACTIVE && !k->shut && k->fd >= 0 && now - k->since_ms > a->request_timeout_ms) {
                shutdown(k->fd, SHUT_RDWR);   /* its pool thread closes it (see above) */
                k->shut = 1;
                a->reaped++;
            }
        unsigned long long n = a->reaped - logged;
        if (n && now - last_log >= 60000) {   /* at most a line a minute */
            logged = a->reaped;
            last_log = now;
            pthread_mutex_unlock(&a->conn_mu);
            fprintf(stderr, "trainq api: closed %llu connection(s) that sent no complete request within %.1f s\n",
                    n, a->request_timeout_ms / 1000);
            pthread_mutex_lock(&a->conn_mu);
        }
    }
    pthread_mutex_unlock(&a->conn_mu);
    return NULL;
}

/* The descriptors the listeners may hold: RLIMIT_NOFILE's soft limit is raised toward the hard
 * one when it is short (systemd's default soft limit is 1024); when even the hard one is short,
 * the connection limits shrink to fit, and that is said. */
static void fd_budget(unsigned *tcp, unsigned *unx) {
    struct rlimit rl;
    rlim_t need = (rlim_t)*tcp + *unx + TQ_FD_RESERVE;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        struct rlimit nl = { want, rl.rlim_max };
        if (!setrlimit(RLIMIT_NOFILE, &nl)) rl.rlim_cur = want;
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return;
    rlim_t room = rl.rlim_cur > 2 * TQ_FD_RESERVE ? rl.rlim_cur - TQ_FD_RESERVE : rl.rlim_cur / 2;
    unsigned t = (unsigned)(room * *tcp / (*tcp + *unx)), u = (unsigned)(room - t);
    fprintf(stderr, "trainq api: warning: the open-file limit is %llu (hard %llu): serving at most %u TCP and "
                    "%u unix-socket connections instead of %u and %u (raise LimitNOFILE=)\n",
            (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, t ? t : 1, u ? u : 1, *tcp, *unx);
    *tcp = t ? t : 1;
    *unx = u ? u : 1;
}

/* Event loop flags: epoll with the pool (1,000 sockets need no FD_SETSIZE), else MHD_USE_AUTO
 * (poll; select only where nothing else exists). */
static unsigned poll_flags(void) {
    return MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL_INTERNAL_THREAD
                                                                  : MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
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
    tq_ctx c = { .api = a, .conn = conn, .method = method, .req = rq, .url = url };
    if (!rx->seen) {
        rx->seen = 1;
        /* the headers are complete: the deadline stays while a body is to come */
        conn_phase(a, conn, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) ||
                            has_length(conn) ? CONN_BODY : CONN_ACTIVE);
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
    conn_phase(a, conn, CONN_ACTIVE);   /* the whole request is in: no deadline while it is answered */
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
        snprintf(allow + al, sizeof allow - al, "%s%s%s", al ? ", " : "", routes[i].method,
                 strcmp(routes[i].method, "GET") ? "" : ", HEAD");   /* every GET answers HEAD */
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
        return tq_send_response(&c, MHD_HTTP_METHOD_NOT_ALLOWED, r, "application/json");
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
    (void)toe;
    conn_phase(cls, conn, CONN_WAITING);   /* the next request's deadline runs from now */
    request *rx = *con_cls;
    if (!rx) return;
    if (rx->rq.sse) tq_sse_free(cls, rx->rq.sse);
    free(rx->rq.body);
    free(rx);
    *con_cls = NULL;
}

/* libmicrohttpd's messages, at most LOG_BURST a minute: a crowd (or a deadline closing a hundred
 * trickling connections) would otherwise write a line per connection */
#define LOG_BURST 20
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static double window;
    static unsigned used, dropped;
    double now = conn_now_ms();
    pthread_mutex_lock(&mu);
    if (now - window >= 60000) { window = now; used = 0; }
    int say = used < LOG_BURST;
    unsigned was = dropped;
    if (say) { used++; dropped = 0; } else dropped++;
    pthread_mutex_unlock(&mu);
    if (!say) return;
    if (was) fprintf(stderr, "trainq api: (%u more libmicrohttpd messages were not logged)\n", was);
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
    pthread_mutex_destroy(&a->conn_mu);
    pthread_cond_destroy(&a->conn_cv);
    pthread_key_delete(a->store_key);
    free(a);
}

/* One libmicrohttpd daemon, on addr (TCP) or the listening socket fd (the unix socket): the
 * two share every other option — a pool of `threads` threads (0: 4), at most `limit`
 * connections, the idle timeout, 128 KiB a connection, our callbacks. */
static struct MHD_Daemon *start_mhd(tq_api *a, unsigned flags, uint16_t port,
                                    const struct sockaddr *addr, int fd, unsigned threads,
                                    unsigned limit) {
    struct MHD_OptionItem common[] = {
        { MHD_OPTION_THREAD_POOL_SIZE, threads ? threads : 4, NULL },
        { MHD_OPTION_CONNECTION_LIMIT, limit, NULL },
        { MHD_OPTION_CONNECTION_TIMEOUT, TQ_IDLE_TIMEOUT_S, NULL },
        { MHD_OPTION_CONNECTION_MEMORY_LIMIT, 128 * 1024, NULL },
        { MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed_cb, a },
        { MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)conn_notify, a },
        { MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)uri_cb, a },
        { MHD_OPTION_END, 0, NULL },
    };
    /* the logger first: libmicrohttpd complains (to the logger it has then) of one given later */
    if (addr)
        return MHD_start_daemon(flags, port, accept_cb, a, access_cb, a, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                                NULL, MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_ARRAY, common, MHD_OPTION_END);
    return MHD_start_daemon(flags, 0, accept_cb, a, access_cb, a, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_ARRAY, common, MHD_OPTION_END);
}

/* The unix socket: every local user may connect (mode 0666), and SO_PEERCRED tells who did
 * (peer.h). A stale socket file from a daemon that died is replaced; any other file at the path
 * is not touched. Served by a second libmicrohttpd daemon on the same handlers. 0 ok. */
static int listen_unix(tq_api *a, const char *path, unsigned threads, unsigned limit, char *err, size_t errlen) {
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
    a->mhd_unix = start_mhd(a, poll_flags() | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL,
                            fd, threads, limit);
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
    pthread_mutex_init(&a->conn_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->conn_cv, &ca);
    pthread_condattr_destroy(&ca);
    double rt = cfg->header_timeout_s;
    if (!(rt > 0)) {   /* TRAINQ_HEADER_TIMEOUT: the tests' shorter deadline (serve has --header-timeout) */
        const char *e = getenv("TRAINQ_HEADER_TIMEOUT");
        rt = e && strtod(e, NULL) > 0 ? strtod(e, NULL) : TQ_REQUEST_TIMEOUT_S;
    }
    a->request_timeout_ms = rt * 1000;
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
    /* 1,500 TCP connections (libmicrohttpd splits the limit among the pool's threads; a thread
     * at its share stops accepting and the others take the next ones); no per-IP limit: see
     * accept_cb. epoll (poll_flags): each pool thread has its own epoll set. */
    unsigned tcp_limit = TQ_CONN_LIMIT, unix_limit = TQ_UNIX_CONN_LIMIT;
    fd_budget(&tcp_limit, &unix_limit);
    unsigned flags = poll_flags() | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    a->mhd = start_mhd(a, flags, cfg->port, ai->ai_addr, -1, cfg->threads, tcp_limit);
    freeaddrinfo(ai);
    if (!a->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%u (%s)", h, cfg->port,
                 errno ? strerror(errno) : "libmicrohttpd refused to start");
        api_free(a);
        return NULL;
    }
    if (cfg->socket_path && cfg->socket_path[0] && listen_unix(a, cfg->socket_path, cfg->threads, unix_limit, err, errlen)) {
        MHD_stop_daemon(a->mhd);
        api_free(a);
        return NULL;
    }
    if (tq_sse_start(a)) {
        snprintf(err, errlen, "cannot start the event-stream thread");
        MHD_stop_daemon(a->mhd);
        if (a->mhd_unix) MHD_stop_daemon(a->mhd_unix);
        api_free(a);
        return NULL;
    }
    if (pthread_create(&a->reaper, NULL, reaper, a)) {
        snprintf(err, errlen, "cannot start the connection-deadline thread");
        tq_api_stop(a);
        return NULL;
    }
    a->reaper_started = 1;
    return a;
}

void tq_api_stop(tq_api *a) {
    if (!a) return;
    /* Stop taking connections: accept_cb refuses them from now on. Not MHD_quiesce_daemon: with
     * a pool of epoll threads, libmicrohttpd 0.9.75 races its own threads removing the listen
     * socket from their epoll sets and aborts the process ("Failed to remove listen FD from
     * epoll set", about one stop in 75 in the tests). */
    a->closing = 1;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    tq_sse_stop(a);               /* resume and end every stream and log follower */
    if (a->reaper_started) {      /* before MHD_stop_daemon: every connection's record goes then */
        pthread_mutex_lock(&a->conn_mu);
        a->reaper_stop = 1;
        pthread_cond_signal(&a->conn_cv);
        pthread_mutex_unlock(&a->conn_mu);
        pthread_join(a->reaper, NULL);
        a->reaper_started = 0;
    }
    MHD_stop_daemon(a->mhd);
    if (a->mhd_unix) MHD_stop_daemon(a->mhd_unix);
    if (a->socket_path) unlink(a->socket_path);
    api_free(a);
}
