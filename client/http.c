/* http.c — the client's one way to the daemon: libcurl requests (GET, POST JSON, DELETE), a
 * streamed GET for follow modes with a server-sent-events parser on top, and error objects
 * ({"error":{"code","message","field"}}) turned into messages. See client.h. */
#include "client.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TQ_CLI_VERSION "0.1.0"
#define DEFAULT_SERVER "http://127.0.0.1:8470"
#define DEFAULT_SOCKET "./var/trainq.sock"          /* make run */
#define SYSTEM_SOCKET "/run/trainq/trainq.sock"     /* the systemd unit */

static char g_base[1024];      /* scheme://host[:port], no trailing '/' */
static char g_unix[1024];      /* the unix socket's path, "" for TCP */
static char g_shown[1100];     /* the server as the user named it */
static char g_noproxy[2048];
static int g_inited;
static int g_quiet;

void tq_http_set_quiet(int quiet) { g_quiet = quiet; }

const char *tq_http_server(void) { return g_shown; }

static int is_socket(const char *path) {
    struct stat st;
    return path && path[0] && stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* value: "unix:/path", "http[s]://host[:port][/]" or "host:port" */
static int set_server(const char *prog, const char *value, const char *from) {
    if (!strncmp(value, "unix:", 5)) {
        const char *p = value + 5;
        if (!p[0] || strlen(p) >= sizeof g_unix) {
            fprintf(stderr, "%s: %s: a unix socket needs a path (unix:/path/to/trainq.sock)\n", prog, from);
            return TQ_CLI_USAGE;
        }
        snprintf(g_unix, sizeof g_unix, "%s", p);
        snprintf(g_base, sizeof g_base, "http://localhost");   /* Host: localhost, which the daemon allows */
        snprintf(g_shown, sizeof g_shown, "unix:%s", p);
        return 0;
    }
    g_unix[0] = 0;
    const char *scheme = strstr(value, "://") ? "" : "http://";
    if (strstr(value, "://") && strncmp(value, "http://", 7) && strncmp(value, "https://", 8)) {
        fprintf(stderr, "%s: %s: \"%s\" is not an http:// or https:// URL, nor unix:/path\n", prog, from, value);
        return TQ_CLI_USAGE;
    }
    if (!value[0] || strlen(value) + 8 >= sizeof g_base) {
        fprintf(stderr, "%s: %s: give a URL like %s or unix:/path/to/trainq.sock\n", prog, from, DEFAULT_SERVER);
        return TQ_CLI_USAGE;
    }
    snprintf(g_base, sizeof g_base, "%s%s", scheme, value);
    size_t n = strlen(g_base);
    while (n > 0 && g_base[n - 1] == '/') g_base[--n] = 0;
    snprintf(g_shown, sizeof g_shown, "%s", g_base);
    return 0;
}

int tq_http_init(const char *prog, const char *server_flag) {
    if (!g_inited) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
            fprintf(stderr, "%s: libcurl could not be initialised\n", prog);
            return TQ_CLI_FAILED;
        }
        g_inited = 1;
    }
    /* loopback never goes through a proxy that http_proxy names; the user's no_proxy is kept */
    const char *np = getenv("no_proxy");
    if (!np || !np[0]) np = getenv("NO_PROXY");
    snprintf(g_noproxy, sizeof g_noproxy, "localhost,127.0.0.1,::1%s%s", np && np[0] ? "," : "", np && np[0] ? np : "");
    /* the order: --server, $TRAINQ_SERVER, $TRAINQ_SOCKET, ./var/trainq.sock,
     * /run/trainq/trainq.sock, the default */
    if (server_flag) return set_server(prog, server_flag, "--server");
    const char *env = getenv("TRAINQ_SERVER");
    if (env && env[0]) return set_server(prog, env, "TRAINQ_SERVER");
    char buf[1100];
    const char *sock = getenv("TRAINQ_SOCKET");
    if (sock && sock[0] && is_socket(sock)) {
        snprintf(buf, sizeof buf, "unix:%s", sock);
        return set_server(prog, buf, "TRAINQ_SOCKET");
    }
    if (is_socket(DEFAULT_SOCKET)) return set_server(prog, "unix:" DEFAULT_SOCKET, DEFAULT_SOCKET);
    if (is_socket(SYSTEM_SOCKET)) return set_server(prog, "unix:" SYSTEM_SOCKET, SYSTEM_SOCKET);
    return set_server(prog, DEFAULT_SERVER, "the default server");
}

/* ---- one request ---------------------------------------------------------------------- */

static int append(tq_http_resp *r, const char *data, size_t n) {
    char *nb = realloc(r->body, r->len + n + 1);
    if (!nb) return -1;
    r->body = nb;
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = 0;
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud) {
    size_t n = size * nmemb;
    return append(ud, data, n) ? 0 : n;
}

static CURL *easy(const char *path, char *errbuf) {
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    char url[2200];
    snprintf(url, sizeof url, "%s%s", g_base, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (g_unix[0]) curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, g_unix);
    curl_easy_setopt(h, CURLOPT_NOPROXY, g_noproxy);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "trainq/" TQ_CLI_VERSION);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    errbuf[0] = 0;
    return h;
}

/* "trainq: cannot reach the daemon at SERVER: WHY (start it with: trainq serve)" */
static int unreachable(CURL *h, CURLcode rc, const char *errbuf) {
    long oserr = 0;
    curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &oserr);
    const char *why = oserr ? strerror((int)oserr) : errbuf[0] ? errbuf : curl_easy_strerror(rc);
    if (g_quiet) return TQ_CLI_UNREACHABLE;
    int hint = rc == CURLE_COULDNT_CONNECT && (oserr == ECONNREFUSED || oserr == ENOENT || oserr == 0);
    fprintf(stderr, "trainq: cannot reach the daemon at %s: %s%s\n", g_shown, why,
            hint ? " (start it with: trainq serve)" : "");
    return TQ_CLI_UNREACHABLE;
}

static void fill_ctype(CURL *h, tq_http_resp *r) {
    char *ct = NULL;
    curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(r->ctype, sizeof r->ctype, "%s", ct ? ct : "");
}

int tq_http_request(const char *method, const char *path, const char *json_body, tq_http_resp *r) {
    memset(r, 0, sizeof *r);
    char errbuf[CURL_ERROR_SIZE];
    CURL *h = easy(path, errbuf);
    if (!h) { fprintf(stderr, "trainq: libcurl: out of memory\n"); return TQ_CLI_FAILED; }
    struct curl_slist *hdr = NULL;
    if (!strcmp(method, "POST")) {
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, json_body ? json_body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)(json_body ? strlen(json_body) : 0));
    } else if (strcmp(method, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    }
    hdr = curl_slist_append(hdr, "Expect:");   /* no 100-continue round trip */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 300L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    CURLcode rc = curl_easy_perform(h);
    int ret = 0;
    if (rc != CURLE_OK) {
        ret = unreachable(h, rc, errbuf);
        free(r->body);
        memset(r, 0, sizeof *r);
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
        fill_ctype(h, r);
        if (!r->body) append(r, "", 0);
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return ret;
}

void tq_http_resp_free(tq_http_resp *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* ---- streams --------------------------------------------------------------------------- */

typedef struct {
    CURL *h;
    tq_http_data_fn fn;
    void *ctx;
    tq_http_resp *err;
    long status;
    int stopped;
} stream_ctx;

static size_t on_stream(char *data, size_t size, size_t nmemb, void *ud) {
    stream_ctx *s = ud;
    size_t n = size * nmemb;
    if (!s->status) curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status < 200 || s->status > 299) return append(s->err, data, n) ? 0 : n;
    if (s->fn(s->ctx, data, n)) { s->stopped = 1; return 0; }
    return n;
}

int tq_http_stream(const char *path, tq_http_data_fn on_data, void *ctx, long idle_s,
                   tq_http_resp *err_resp, int *dropped) {
    memset(err_resp, 0, sizeof *err_resp);
    if (dropped) *dropped = 0;
    char errbuf[CURL_ERROR_SIZE];
    CURL *h = easy(path, errbuf);
    if (!h) { fprintf(stderr, "trainq: libcurl: out of memory\n"); return TQ_CLI_FAILED; }
    stream_ctx s = { h, on_data, ctx, err_resp, 0, 0 };
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    if (idle_s > 0) {
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, idle_s);
    }
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    int ret = 0;
    if (s.stopped) {
        ret = 0;
    } else if (status == 0) {   /* no answer at all */
        ret = unreachable(h, rc, errbuf);
    } else if (status < 200 || status > 299) {
        err_resp->status = status;
        fill_ctype(h, err_resp);
        if (!err_resp->body) append(err_resp, "", 0);
    } else if (rc != CURLE_OK) {   /* the answer broke off */
        if (dropped) *dropped = 1;
        else fprintf(stderr, "trainq: the connection to %s broke off: %s\n", g_shown,
                     errbuf[0] ? errbuf : curl_easy_strerror(rc));
        if (!dropped) ret = TQ_CLI_FAILED;
    }
    curl_easy_cleanup(h);
    return ret;
}

/* ---- server-sent events ------------------------------------------------------------------ */

typedef struct {
    tq_sse_fn fn;
    void *ctx;
    char *line; size_t llen, lcap;
    char type[64], id[64];
    char *data; size_t dlen, dcap;
    int have_data;
} sse_parser;

static int grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    char *nb = realloc(*p, nc);
    if (!nb) return -1;
    *p = nb; *cap = nc;
    return 0;
}

/* one complete line (no newline) */
static int sse_line(sse_parser *p, char *l, size_t n) {
    if (n && l[n - 1] == '\r') l[--n] = 0;
    if (n == 0) {   /* dispatch */
        int stop = 0;
        if (p->have_data) {
            p->data[p->dlen] = 0;
            stop = p->fn(p->ctx, p->type[0] ? p->type : "message", p->id, p->data);
        }
        p->type[0] = 0;
        p->dlen = 0;
        p->have_data = 0;
        return stop;
    }
    if (l[0] == ':') return 0;   /* a comment (keepalive) */
    char *colon = memchr(l, ':', n);
    const char *field = l, *val = "";
    if (colon) {
        *colon = 0;
        val = colon + 1;
        if (*val == ' ') val++;
    }
    if (!strcmp(field, "event")) snprintf(p->type, sizeof p->type, "%s", val);
    else if (!strcmp(field, "id")) snprintf(p->id, sizeof p->id, "%s", val);
    else if (!strcmp(field, "data")) {
        size_t vl = strlen(val);
        if (grow(&p->data, &p->dcap, p->dlen + vl + 2)) return -1;
        if (p->have_data) p->data[p->dlen++] = '\n';
        memcpy(p->data + p->dlen, val, vl);
        p->dlen += vl;
        p->have_data = 1;
    }
    return 0;
}

static int sse_data(void *ctx, const char *d, size_t n) {
    sse_parser *p = ctx;
    for (size_t i = 0; i < n; i++) {
        if (d[i] == '\n') {
            if (grow(&p->line, &p->lcap, p->llen + 1)) return -1;
            p->line[p->llen] = 0;
            int stop = sse_line(p, p->line, p->llen);
            p->llen = 0;
            if (stop) return stop;
        } else {
            if (grow(&p->line, &p->lcap, p->llen + 2)) return -1;
            p->line[p->llen++] = d[i];
        }
    }
    return 0;
}

int tq_sse_stream(const char *path, tq_sse_fn on_event, void *ctx, tq_http_resp *err_resp, int *dropped) {
    sse_parser p = { .fn = on_event, .ctx = ctx };
    /* the daemon sends a keepalive every 15 s of silence: a minute without a byte is a dead peer */
    int rc = tq_http_stream(path, sse_data, &p, 60, err_resp, dropped);
    free(p.line);
    free(p.data);
    return rc;
}

/* ---- error objects ------------------------------------------------------------------------ */

static const cJSON *err_obj(const tq_http_resp *r, cJSON **root) {
    *root = r->body ? cJSON_Parse(r->body) : NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(*root, "error");
    return cJSON_IsObject(e) ? e : NULL;
}

static const char *err_item(const tq_http_resp *r, const char *key, char *buf, size_t n) {
    cJSON *root;
    const cJSON *e = err_obj(r, &root);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    snprintf(buf, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
    cJSON_Delete(root);
    return buf;
}

const char *tq_http_errcode(const tq_http_resp *r, char *buf, size_t n) { return err_item(r, "code", buf, n); }
const char *tq_http_errfield(const tq_http_resp *r, char *buf, size_t n) { return err_item(r, "field", buf, n); }

const char *tq_http_errmsg(const tq_http_resp *r, char *buf, size_t n) {
    cJSON *root;
    const cJSON *e = err_obj(r, &root);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *field = cJSON_GetObjectItemCaseSensitive(e, "field");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
    if (cJSON_IsString(msg) && msg->valuestring[0]) {
        /* the field only where the message does not name it already */
        if (cJSON_IsString(field) && field->valuestring[0] && !strstr(msg->valuestring, field->valuestring))
            snprintf(buf, n, "%s (field %s)", msg->valuestring, field->valuestring);
        else
            snprintf(buf, n, "%s", msg->valuestring);
    } else if (cJSON_IsString(code)) {
        snprintf(buf, n, "%s (HTTP %ld)", code->valuestring, r->status);
    } else {   /* not our error object: a proxy, libmicrohttpd's own HTML answer… */
        char body[201];
        size_t k = 0;
        for (size_t i = 0; r->body && i < r->len && k < sizeof body - 1; i++)
            body[k++] = (r->body[i] == '\n' || r->body[i] == '\r' || r->body[i] == '\t') ? ' ' : r->body[i];
        body[k] = 0;
        snprintf(buf, n, "HTTP %ld%s%s", r->status, k ? ": " : "", body);
    }
    cJSON_Delete(root);
    return buf;
}

void tq_http_job_error(const char *prog, long long id, const tq_http_resp *r) {
    char msg[1024], self[48];
    tq_http_errmsg(r, msg, sizeof msg);
    snprintf(self, sizeof self, "job %lld", id);
    if (strstr(msg, self)) fprintf(stderr, "%s: %s\n", prog, msg);   /* it names the job already */
    else fprintf(stderr, "%s: job %lld: %s\n", prog, id, msg);
}
