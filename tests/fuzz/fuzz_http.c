/* fuzz_http.c — the HTTP request path (api/: libmicrohttpd glue, routing, query and body checks,
 * every handler) on arbitrary bytes sent over a real loopback TCP connection.
 *
 * Setup (once): the API is started with tq_api_start on 127.0.0.1 and a free port (found by
 * binding port 0; tq_api_config has no way to report an ephemeral port back), with a temporary
 * database on /dev/shm, a ledger holding one "cpu" device with a 4 GiB budget, and one queued
 * job (so that /v1/jobs/1/... reach the handlers' job paths). No supervisor runs: jobs stay
 * queued unless a request cancels or deletes them.
 *
 * Input: the whole request, as raw bytes (request line, headers, body; several pipelined ones
 * are fine). The bytes are sent, then the client half-closes its side (shutdown SHUT_WR), and
 * the answer is read with a deadline.
 *
 * Properties, beyond "no crash, no sanitizer report in any of the daemon's threads":
 * - the daemon answers or closes the connection within the deadline (FUZZ_WAIT_MS);
 * - every answer starts with an HTTP/1.x status line and a complete header block;
 * - an answer whose Content-Type is JSON has a complete body that parses as JSON, and for a
 *   status >= 400 it is {"error":{"code":STRING,"message":STRING,...}} with both non-empty;
 * - the daemon is still healthy afterwards (checked every 256 inputs with GET /healthz).
 * Event streams (text/event-stream) and chunked text streams (?follow=1) are checked up to
 * their headers only: they legitimately stay open. */
#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "api/api.h"
#include "api/ledger.h"
#include "schema/store.h"
#include "fuzz_util.h"

#define FUZZ_WAIT_MS 5000          /* an answer or a close, after the client's EOF */
#define FUZZ_PEEK_MS 20            /* a request cut short: an early answer, if any */
#define FUZZ_MAX_ANSWER (4 << 20)  /* bytes read back at most */

static tq_api *api;
static tq_ledger *ledger;
static unsigned short port;
static char state_dir[256];
static unsigned long long inputs;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st; (void)flag; (void)f;
    remove(p);
    return 0;
}

static void teardown(void) {
    if (api) tq_api_stop(api);
    api = NULL;
    if (ledger) tq_ledger_free(ledger);
    ledger = NULL;
    if (state_dir[0]) nftw(state_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static unsigned short free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    FUZZ_CHECK(s >= 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t l = sizeof sa;
    FUZZ_CHECK(bind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    FUZZ_CHECK(getsockname(s, (struct sockaddr *)&sa, &l) == 0);
    close(s);
    return ntohs(sa.sin_port);
}

/* ---- one exchange ----------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len;
    int closed;      /* the daemon closed (or reset) the connection */
} answer;

/* Sends data, half-closes, reads until the daemon closes, `enough` says the answer is
 * complete, or the deadline passes. 0 when the daemon answered or closed in time. */
static int exchange(const uint8_t *data, size_t size, int wait_ms, answer *ans,
                    int (*enough)(const answer *, const uint8_t *, size_t)) {
    memset(ans, 0, sizeof *ans);
    ans->buf = malloc(FUZZ_MAX_ANSWER + 1);
    FUZZ_CHECK(ans->buf);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(s >= 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    /* The client's own limits are not the daemon's fault: a signal, or no free local port (each
     * exchange leaves a TIME_WAIT socket here for 60 s, and this harness makes hundreds a second)
     * gets a retry; a refusal means the daemon stopped listening, and fails. */
    for (int tries = 0;; tries++) {
        if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0) break;
        int e = errno;
        if ((e == EINTR || e == EADDRNOTAVAIL || e == EAGAIN) && tries < 200) {
            close(s);   /* a fresh socket: an interrupted connect goes on in the background */
            struct timespec ts = { 0, 10 * 1000000L };
            nanosleep(&ts, NULL);
            s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            FUZZ_CHECK(s >= 0);
            continue;
        }
        fprintf(stderr, "fuzz_http: connect to 127.0.0.1:%u: %s (try %d)\n", port, strerror(e), tries + 1);
        abort();
    }
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t off = 0;
    while (off < size) {   /* the daemon may answer early (413) and close: a send error is fine */
        struct pollfd p = { s, POLLOUT, 0 };
        if (poll(&p, 1, FUZZ_WAIT_MS) <= 0) break;
        ssize_t n = send(s, data + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) break;
        off += (size_t)n;
    }
    shutdown(s, SHUT_WR);
    double deadline = now_ms() + wait_ms;
    int ok = 0;
    for (;;) {
        if (enough(ans, data, size)) { ok = 1; break; }
        double left = deadline - now_ms();
        if (left <= 0) break;
        struct pollfd p = { s, POLLIN, 0 };
        int r = poll(&p, 1, (int)left + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (ans->len >= FUZZ_MAX_ANSWER) { ok = 1; break; }
        ssize_t n = recv(s, ans->buf + ans->len, FUZZ_MAX_ANSWER - ans->len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { ans->closed = 1; ok = 1; break; }
        ans->len += (size_t)n;
    }
    ans->buf[ans->len] = 0;
    close(s);
    return ok ? 0 : -1;
}

/* ---- HTTP/1.1 answers ------------------------------------------------------------------- */

typedef struct {
    int status;
    size_t head_len;          /* bytes of the status line and headers, with the blank line */
    char ctype[128];
    long long clen;           /* -1 none */
    int chunked;
    int close;                /* Connection: close */
    size_t body_off, body_len;
    int complete;             /* the body is all there (or, for a stream, need not be) */
    size_t total;             /* the bytes of this answer (complete ones) */
} parsed;

/* The bytes of a chunked body at p[0..n): its decoded length in *out, the encoded length; 0 when
 * incomplete, (size_t)-1 when malformed. */
static size_t dechunk(const char *p, size_t n, char *out, size_t *outlen) {
    size_t i = 0, o = 0;
    for (;;) {
        const char *eol = memmem(p + i, n - i, "\r\n", 2);
        if (!eol) return 0;
        char *end;
        unsigned long long cl = strtoull(p + i, &end, 16);
        if (end == p + i) return (size_t)-1;
        size_t line = (size_t)(eol - (p + i)) + 2;
        if (cl == 0) {   /* the last chunk: trailers until a blank line */
            size_t j = i + line;
            for (;;) {
                const char *e2 = memmem(p + j, n - j, "\r\n", 2);
                if (!e2) return 0;
                if (e2 == p + j) { *outlen = o; return j + 2; }
                j = (size_t)(e2 - p) + 2;
            }
        }
        if (cl > n) return 0;
        if (i + line + cl + 2 > n) return 0;
        if (out) memcpy(out + o, p + i + line, cl);
        o += cl;
        i += line + cl + 2;
    }
}

/* Parses the answer starting at b[0..n). 0: parsed (maybe incomplete), -1: malformed, 1: the
 * header block is not complete yet. */
static int parse_answer(const char *b, size_t n, int head_req, parsed *pa) {
    memset(pa, 0, sizeof *pa);
    pa->clen = -1;
    const char *end = memmem(b, n, "\r\n\r\n", 4);
    if (!end) return n >= 5 && strncmp(b, "HTTP/", 5) ? -1 : 1;
    pa->head_len = (size_t)(end - b) + 4;
    if (strncmp(b, "HTTP/1.", 7) || pa->head_len < 13 || b[8] != ' ') return -1;
    pa->status = atoi(b + 9);
    if (pa->status < 100 || pa->status > 599) return -1;
    for (const char *l = memmem(b, pa->head_len, "\r\n", 2) + 2; l < end;) {
        const char *e = memmem(l, (size_t)(end + 2 - l), "\r\n", 2);
        size_t ll = (size_t)(e - l);
        const char *colon = memchr(l, ':', ll);
        if (colon) {
            size_t kl = (size_t)(colon - l);
            const char *v = colon + 1;
            while (v < e && (*v == ' ' || *v == '\t')) v++;
            size_t vl = (size_t)(e - v);
            if (kl == 12 && !strncasecmp(l, "Content-Type", 12))
                snprintf(pa->ctype, sizeof pa->ctype, "%.*s", (int)vl, v);
            else if (kl == 14 && !strncasecmp(l, "Content-Length", 14))
                pa->clen = strtoll(v, NULL, 10);
            else if (kl == 17 && !strncasecmp(l, "Transfer-Encoding", 17) && vl >= 7 && !strncasecmp(v, "chunked", 7))
                pa->chunked = 1;
            else if (kl == 10 && !strncasecmp(l, "Connection", 10) && vl >= 5 && !strncasecmp(v, "close", 5))
                pa->close = 1;
        }
        l = e + 2;
    }
    pa->body_off = pa->head_len;
    size_t have = n - pa->head_len;
    if (pa->status < 200 || pa->status == 204 || pa->status == 304 || head_req) {
        pa->complete = 1;
        pa->total = pa->head_len;
    } else if (!strncasecmp(pa->ctype, "text/event-stream", 17) || (pa->chunked && strncasecmp(pa->ctype, "application/json", 16))) {
        pa->complete = 1;      /* a stream: checked to its headers */
        pa->total = n;
        pa->body_len = have;
    } else if (pa->chunked) {
        size_t dl = 0, used = dechunk(b + pa->head_len, have, NULL, &dl);
        if (used == (size_t)-1) return -1;
        if (used) { pa->complete = 1; pa->body_len = used; pa->total = pa->head_len + used; }
    } else if (pa->clen >= 0) {
        if ((long long)have >= pa->clen) {
            pa->complete = 1;
            pa->body_len = (size_t)pa->clen;
            pa->total = pa->head_len + (size_t)pa->clen;
        }
    } else {
        pa->body_len = have;   /* until the close */
    }
    return 0;
}

/* the input's first request is a HEAD: after the empty lines a server skips before a request
 * line (RFC 9112 section 2.2; libmicrohttpd does), so "\r\n\r\nHEAD / ..." is one too, and its
 * 400 comes without a body. libmicrohttpd reads a line as a C string, so a line whose first byte
 * is NUL is empty to it too: "\0/\r\nHEAD / ..." is a HEAD (CI's fuzz-smoke found it). */
static int is_head(const uint8_t *d, size_t n) {
    for (;;) {
        if (n >= 2 && d[0] == '\r' && d[1] == '\n') d += 2, n -= 2;
        else if (n >= 1 && d[0] == '\n') d += 1, n -= 1;
        else if (n >= 1 && d[0] == '\0') {   /* the rest of the line, through its LF */
            const uint8_t *lf = memchr(d, '\n', n);
            if (!lf) break;
            n -= (size_t)(lf + 1 - d);
            d = lf + 1;
        } else break;
    }
    return n >= 5 && !memcmp(d, "HEAD ", 5);
}

/* whether a line of the input starts with "HEAD " */
static int head_line_anywhere(const uint8_t *d, size_t n) {
    for (size_t i = 0; i + 5 <= n; i++)
        if ((i == 0 || d[i - 1] == '\n') && !memcmp(d + i, "HEAD ", 5)) return 1;
    return 0;
}

/* an answer whose header block is followed directly by the next answer or by the end of what
 * came: the shape of an answer to HEAD */
static int headless_shape(const char *b, size_t n) {
    const char *end = memmem(b, n, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t rest = n - (size_t)(end + 4 - b);
    return rest == 0 || (rest >= 7 && !strncmp(end + 4, "HTTP/1.", 7));
}

/* Whether the answer at b (offset off in what came back) is one to a HEAD request, so without a
 * body. The first answer is to the input's first request: a HEAD when is_head says so, or when
 * it has that shape and a line of the input starts with "HEAD " (what libmicrohttpd skips before
 * a request line is more than is_head models; CI's fuzzing found two such inputs). For a later,
 * pipelined one the input cannot be split into requests reliably (it is fuzzed), so it counts as
 * headless by its shape. */
static int head_answer(size_t off, const char *b, size_t n, const uint8_t *d, size_t dn) {
    if (off == 0) return is_head(d, dn) || (headless_shape(b, n) && head_line_anywhere(d, dn));
    return headless_shape(b, n);
}

/* enough: the first final answer is complete (further pipelined answers are read only if they
 * come with it) */
static int first_answer_in(const answer *a, const uint8_t *d, size_t n) {
    size_t off = 0;
    while (off < a->len) {
        parsed pa;
        int r = parse_answer(a->buf + off, a->len - off, head_answer(off, a->buf + off, a->len - off, d, n), &pa);
        if (r) return r < 0;   /* malformed: checked by the caller */
        if (!pa.complete) return 0;
        if (pa.status >= 200) return 1;
        off += pa.total;
    }
    return 0;
}

static void check_json(const parsed *pa, const char *body, size_t len) {
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (!j) fprintf(stderr, "fuzz_http: a %d answer of type %s is not JSON: %.*s\n", pa->status, pa->ctype,
                    (int)(len > 400 ? 400 : len), body);
    FUZZ_CHECK(j != NULL);
    if (pa->status >= 400) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
        int good = cJSON_IsObject(e) && cJSON_IsString(code) && code->valuestring[0] &&
                   cJSON_IsString(msg) && msg->valuestring[0];
        if (!good) fprintf(stderr, "fuzz_http: a %d answer without {\"error\":{\"code\",\"message\"}}: %.*s\n",
                           pa->status, (int)(len > 400 ? 400 : len), body);
        FUZZ_CHECK(good);
    }
    cJSON_Delete(j);
}

/* every answer in a->buf */
static void check_answers(const answer *a, const uint8_t *d, size_t n) {
    size_t off = 0;
    if (getenv("FUZZ_HTTP_VERBOSE"))   /* reproducing one input: what came back */
        fprintf(stderr, "fuzz_http: %zu bytes%s:\n%.*s\n", a->len, a->closed ? " then a close" : "",
                (int)(a->len > 4000 ? 4000 : a->len), a->buf);
    int finals = 0;
    while (off < a->len) {
        parsed pa;
        int head = head_answer(off, a->buf + off, a->len - off, d, n);
        int r = parse_answer(a->buf + off, a->len - off, head, &pa);
        if (r < 0) fprintf(stderr, "fuzz_http: not an HTTP answer: %.*s\n",
                           (int)(a->len - off > 300 ? 300 : a->len - off), a->buf + off);
        FUZZ_CHECK(r >= 0);
        if (r == 1) {   /* a header block cut short: only after a close, and only if another came */
            if (!finals) fprintf(stderr, "fuzz_http: an incomplete header block%s: %.*s\n",
                                 a->closed ? " before the close" : " at the deadline",
                                 (int)(a->len - off > 300 ? 300 : a->len - off), a->buf + off);
            FUZZ_CHECK(finals > 0);
            return;
        }
        int json = !strncasecmp(pa.ctype, "application/json", 16);
        if (!pa.complete) {
            if (pa.clen < 0 && !pa.chunked && a->closed && json) {   /* body until the close */
                check_json(&pa, a->buf + off + pa.body_off, a->len - off - pa.body_off);
                return;
            }
            /* a JSON body is sent from one buffer: cut short only by a later request's close */
            if (json && !finals) fprintf(stderr, "fuzz_http: an incomplete %d JSON answer (%zu bytes)\n",
                                         pa.status, a->len - off);
            FUZZ_CHECK(!json || finals > 0);
            return;
        }
        if (json && !head && pa.status >= 200 && pa.status != 204 && pa.status != 304) {
            if (pa.chunked) {
                char *body = malloc(pa.body_len + 1);
                size_t dl = 0;
                FUZZ_CHECK(body);
                dechunk(a->buf + off + pa.body_off, pa.body_len, body, &dl);
                check_json(&pa, body, dl);
                free(body);
            } else {
                check_json(&pa, a->buf + off + pa.body_off, pa.body_len);
            }
        }
        if (pa.status >= 200) finals++;
        if (!strncasecmp(pa.ctype, "text/event-stream", 17) || (pa.chunked && !json)) return;
        /* the last answer on this connection. What may follow is libmicrohttpd's: 0.9.75 sends
         * the header block of its own 400 for a Content-Length it cannot parse (one with a NUL
         * in it) twice, the second one as the first one's body */
        if (pa.close && pa.status >= 200) return;
        off += pa.total;
    }
}

static void must_be_healthy(void) {
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    answer a;
    int rc = exchange((const uint8_t *)req, sizeof req - 1, FUZZ_WAIT_MS, &a, first_answer_in);
    parsed pa;
    int good = rc == 0 && parse_answer(a.buf, a.len, 0, &pa) == 0 && pa.status == 200;
    if (!good) fprintf(stderr, "fuzz_http: GET /healthz failed after %llu inputs: %.*s\n", inputs,
                       (int)(a.len > 300 ? 300 : a.len), a.buf);
    FUZZ_CHECK(good);
    free(a.buf);
}

/* ---- libFuzzer -------------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    signal(SIGPIPE, SIG_IGN);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(state_dir, sizeof state_dir, "%s/tq-fuzz-http-XXXXXX", base);
    FUZZ_CHECK(mkdtemp(state_dir) != NULL);
    atexit(teardown);
    char db[400], jobs[400], err[256];
    snprintf(db, sizeof db, "%s/trainq.db", state_dir);
    snprintf(jobs, sizeof jobs, "%s/jobs", state_dir);
    FUZZ_CHECK(mkdir(jobs, 0755) == 0);
    tq_store *st = tq_store_open(db, err, sizeof err);   /* creates the schema */
    if (!st) fprintf(stderr, "fuzz_http: %s\n", err);
    FUZZ_CHECK(st);
    tq_store_close(st);

    tq_ledger_dev cpu;
    memset(&cpu, 0, sizeof cpu);
    snprintf(cpu.id, sizeof cpu.id, "cpu");
    cpu.budget = 4LL << 30;
    cpu.total_bytes = 8LL << 30;
    cpu.driver_used = cpu.driver_free = -1;
    cpu.max_jobs = 1;
    cpu.cores = 2;
    ledger = tq_ledger_new(&cpu, 1);
    FUZZ_CHECK(ledger);

    setenv("TRAINQ_HEADER_TIMEOUT", "1", 1);   /* requests cut short are closed after 1 s */
    for (int attempt = 0; attempt < 8 && !api; attempt++) {
        port = free_port();
        tq_api_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.host = "127.0.0.1";
        cfg.port = port;
        cfg.db_path = db;
        cfg.jobs_dir = jobs;
        cfg.devices = "cpu";
        cfg.cuda = "not probed (fuzz_http)";
        cfg.threads = 2;
        cfg.ledger = ledger;
        cfg.fair_share_window_s = 86400;
        api = tq_api_start(&cfg, err, sizeof err);
        if (!api) fprintf(stderr, "fuzz_http: tq_api_start on port %u: %s\n", port, err);
    }
    FUZZ_CHECK(api);

    /* job 1, queued: the seeds' /v1/jobs/1/... reach the handlers */
    static const char body[] =
        "{\"name\":\"seed\",\"dataset\":\"synthetic\",\"threads\":1,\"device\":\"cpu\",\"model\":\"mlp\","
        "\"batch_size\":8,\"steps\":4,\"synthetic\":{\"train\":32,\"test\":16,\"height\":8,\"width\":8,\"channels\":1}}";
    char req[1024];
    int n = snprintf(req, sizeof req, "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                      "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", sizeof body - 1, body);
    answer a;
    FUZZ_CHECK(exchange((const uint8_t *)req, (size_t)n, FUZZ_WAIT_MS, &a, first_answer_in) == 0);
    parsed pa;
    int good = parse_answer(a.buf, a.len, 0, &pa) == 0 && pa.status == 201;
    if (!good) fprintf(stderr, "fuzz_http: the first submit failed: %.*s\n", (int)(a.len > 500 ? 500 : a.len), a.buf);
    FUZZ_CHECK(good);
    free(a.buf);
    return 0;
}

/* 1 when data holds at least one whole request: a header block, and all of the body its
 * Content-Length or chunked encoding announces (as this harness reads them: a heuristic that
 * only chooses how long to wait, never what is checked) */
static int whole_request(const uint8_t *data, size_t size) {
    const char *d = (const char *)data, *end = memmem(d, size, "\r\n\r\n", 4);
    size_t hl;
    if (end) hl = (size_t)(end - d) + 4;
    else if ((end = memmem(d, size, "\n\n", 2))) hl = (size_t)(end - d) + 2;
    else return 0;
    size_t body = size - hl;
    for (size_t i = 0; i < hl;) {
        const char *e = memchr(d + i, '\n', hl - i);
        size_t ll = e ? (size_t)(e - (d + i)) : hl - i;
        if (ll > 15 && !strncasecmp(d + i, "Content-Length:", 15)) {
            char num[32];
            snprintf(num, sizeof num, "%.*s", (int)(ll - 15 < 31 ? ll - 15 : 31), d + i + 15);
            char *q;
            unsigned long long cl = strtoull(num, &q, 10);
            if (q != num && cl > body) return 0;
        }
        if (ll > 18 && !strncasecmp(d + i, "Transfer-Encoding:", 18) && memmem(d + i, ll, "chunked", 7)) {
            size_t dl;
            size_t used = dechunk(d + hl, body, NULL, &dl);
            if (used == 0 || used == (size_t)-1) return 0;
        }
        i += ll + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    answer a;
    /* A request cut short leaves the daemon waiting for the rest: libmicrohttpd 0.9.75 with epoll
     * may miss an EOF that comes with the last bytes, and the request deadline (http.c's reaper,
     * TRAINQ_HEADER_TIMEOUT here) closes it later. Such inputs get a short look for an early
     * answer (400, 413, 414, 431…); a whole request must be answered or closed. */
    int whole = whole_request(data, size);
    int rc = exchange(data, size, whole ? FUZZ_WAIT_MS : FUZZ_PEEK_MS, &a, first_answer_in);
    if (!whole) {
        if (a.len) check_answers(&a, data, size);
        free(a.buf);
        if (++inputs % 256 == 0) must_be_healthy();
        return 0;
    }
    if (rc) fprintf(stderr, "fuzz_http: no answer and no close within %d ms after the client's EOF (%zu bytes read): %.*s\n",
                    FUZZ_WAIT_MS, a.len, (int)(size > 300 ? 300 : size), (const char *)data);
    FUZZ_CHECK(rc == 0);
    check_answers(&a, data, size);
    free(a.buf);
    if (++inputs % 256 == 0) must_be_healthy();
    return 0;
}
