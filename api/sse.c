/* sse.c — GET /v1/jobs/{id}/events: server-sent events of a job's steps ("step"), evaluations
 * ("eval") and state changes ("state"), from its beginning (or ?after=STEP) until it finishes.
 *
 * A response callback of unknown size reads the database on the connection's pool thread;
 * when there is nothing new it suspends the connection, and a ticker thread resumes every
 * suspended stream each TICK_MS, so that no pool thread ever sleeps or spins. The stream ends
 * after the job's final state event (or when the job is deleted, or the daemon stops); a
 * comment line goes out every KEEPALIVE_MS of silence. Every read of one poll is one
 * snapshot, so a final state is never sent before the steps written before it.
 *
 * Streams are capped: MAX_STREAMS open in all (both listeners), MAX_STREAMS_PER_CLIENT from one
 * remote (non-loopback) address; beyond, a 503 too_many_streams. Loopback clients all share the
 * address 127.0.0.1, so they are capped per uid instead (MAX_STREAMS_PER_USER, root exempt:
 * the kernel says who each client is, peer.h), which leaves the others room under the total. Both stay far below http.c's connection limit (1,500),
 * so that ordinary requests are always served beside them. A stream whose client went away is
 * ended at the next tick (POLLRDHUP on its socket), not at its next keepalive, so that a closed
 * dashboard tab frees its slot at once. */
#include "internal.h"
#include "utf8.h"
#include "report.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define TICK_MS 250
#define KEEPALIVE_MS 15000
#define STEPS_PER_POLL 500
#define MAX_STREAMS 256
#define MAX_STREAMS_PER_CLIENT 32
#define MAX_STREAMS_PER_USER 64

struct tq_sse {
    tq_sse *next;
    tq_api *api;
    struct MHD_Connection *conn;
    int64_t job, last_step, last_event;
    int evals_sent;
    int suspended, finished, gone;
    double last_send;
    char *buf;
    size_t len, off, cap;
    int fd;                      /* the connection's socket (-1 unknown) */
    int remote;                  /* from a non-loopback address, in addr */
    int uid;                     /* a local client's uid (-1 unknown) */
    unsigned char addr[16];      /* IPv6, or IPv4 v4-mapped */
};

/* The client's address as 16 bytes (IPv4 v4-mapped); 1 when it is a remote (non-loopback) IP. */
static int client_addr(struct MHD_Connection *conn, unsigned char key[16]) {
    memset(key, 0, 16);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (!sa) return 0;
    if (sa->sa_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    } else {
        return 0;   /* the unix socket */
    }
    static const unsigned char v4m[12] = { 0,0,0,0, 0,0,0,0, 0,0,0xff,0xff }, lo6[16] = { [15] = 1 };
    if (!memcmp(key, v4m, 12) && key[12] == 127) return 0;
    return memcmp(key, lo6, 16) != 0;
}

/* the client closed its end (or the socket failed): nothing will read what we send */
static int client_gone(const tq_sse *s) {
    if (s->fd < 0) return 0;
    struct pollfd p = { .fd = s->fd, .events = POLLRDHUP };
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void put(tq_sse *s, const char *t, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8192;
        while (nc < s->len + n + 1) nc *= 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) return;   /* drops this event; the stream goes on */
        s->buf = nb; s->cap = nc;
    }
    memcpy(s->buf + s->len, t, n);
    s->len += n;
}

/* one event: "event: TYPE\n[id: ID\n]data: JSON\n\n" (cJSON never prints a newline unformatted) */
static void emit(tq_sse *s, const char *type, const char *id, cJSON *data) {
    tq_utf8_sanitize_json(data);   /* event data from an older database may hold invalid UTF-8 */
    char *d = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    if (!d) return;
    put(s, "event: ", 7); put(s, type, strlen(type)); put(s, "\n", 1);
    if (id) { put(s, "id: ", 4); put(s, id, strlen(id)); put(s, "\n", 1); }
    put(s, "data: ", 6); put(s, d, strlen(d)); put(s, "\n\n", 2);
    cJSON_free(d);
}

typedef struct {
    tq_sse *s;
    tq_step_rec *steps; int nsteps;
    tq_eval_rec *evals; int nevals;
    tq_event *events; int nevents;
    int found;
    tq_job job;
} poll_ctx;

static int poll_reads(tq_store *st, void *ctx) {
    poll_ctx *p = ctx;
    tq_sse *s = p->s;
    int rc = tq_queue_get(st, s->job, &p->job);
    if (rc < 0) return rc;
    p->found = rc;
    if (!rc) return 0;
    if ((rc = tq_queue_steps(st, s->job, s->last_step, STEPS_PER_POLL, &p->steps, &p->nsteps))) return rc;
    if ((rc = tq_queue_evals(st, s->job, s->evals_sent, &p->evals, &p->nevals))) return rc;
    return tq_queue_events(st, s->job, s->last_event, 100, &p->events, &p->nevents);
}

static int is_final(const char *state) {
    return !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");
}

/* reads what is new into s->buf */
static void poll_db(tq_sse *s, tq_store *st) {
    poll_ctx p = { .s = s };
    int rc = tq_queue_snapshot(st, poll_reads, &p);
    if (rc) {   /* a busy database: try again at the next tick */
        free(p.steps); free(p.evals); tq_events_free(p.events, p.nevents);
        if (p.found) tq_job_free(&p.job);
        return;
    }
    if (!p.found) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "job", (double)s->job);
        cJSON_AddStringToObject(o, "state", "deleted");
        emit(s, "state", NULL, o);
        s->finished = 1;
        return;
    }
    char id[48];
    for (int i = 0; i < p.nsteps; i++) {
        snprintf(id, sizeof id, "%lld", (long long)p.steps[i].step);
        emit(s, "step", id, tq_step_json(&p.steps[i]));
        s->last_step = p.steps[i].step;
    }
    for (int i = 0; i < p.nevals; i++) emit(s, "eval", NULL, tq_eval_json(&p.evals[i]));
    s->evals_sent += p.nevals;
    int saw_final = 0;
    for (int i = 0; i < p.nevents; i++) {
        cJSON *o = p.events[i].data ? cJSON_Parse(p.events[i].data) : NULL;
        if (!o) o = cJSON_CreateObject();
        if (!strcmp(p.events[i].type, "state")) {
            /* the job's current progress rides along */
            cJSON_AddNumberToObject(o, "job", (double)s->job);
            char t[32];
            tq_rfc3339(p.events[i].time, t);
            cJSON_AddStringToObject(o, "time", t);
            const cJSON *stv = cJSON_GetObjectItemCaseSensitive(o, "state");
            if (cJSON_IsString(stv) && is_final(stv->valuestring)) saw_final = 1;
        }
        emit(s, p.events[i].type, NULL, o);
        s->last_event = p.events[i].id;
    }
    /* finished, with every record sent: the last event is the job object */
    if (is_final(p.job.state) && p.nsteps < STEPS_PER_POLL && p.nevents < 100) {
        if (!saw_final && s->last_event == 0) {   /* a job without events (trainq run) */
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "job", (double)s->job);
            cJSON_AddStringToObject(o, "state", p.job.state);
            emit(s, "state", NULL, o);
        }
        emit(s, "job", NULL, tq_api_job_json(s->api, &p.job));   /* as GET /v1/jobs/{id} answers */
        s->finished = 1;
    }
    free(p.steps); free(p.evals); tq_events_free(p.events, p.nevents);
    tq_job_free(&p.job);
}

static ssize_t reader(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    tq_sse *s = cls;
    for (int pass = 0; pass < 2; pass++) {
        if (s->off < s->len) {
            size_t n = s->len - s->off < max ? s->len - s->off : max;
            memcpy(out, s->buf + s->off, n);
            s->off += n;
            if (s->off == s->len) s->off = s->len = 0;
            s->last_send = mono_ms();
            return (ssize_t)n;
        }
        if (s->finished || s->api->stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        if (pass) break;
        if (client_gone(s)) return MHD_CONTENT_READER_END_WITH_ERROR;
        tq_ctx c = { .api = s->api, .conn = s->conn };
        tq_store *st = tq_api_store(&c);
        if (st) poll_db(s, st);
        if (s->len == 0 && mono_ms() - s->last_send > KEEPALIVE_MS) put(s, ": keepalive\n\n", 13);
    }
    pthread_mutex_lock(&s->api->sse_mu);
    if (s->api->stopping) {   /* tq_sse_stop's resume_all may have run already */
        pthread_mutex_unlock(&s->api->sse_mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    MHD_suspend_connection(s->conn);
    s->suspended = 1;
    pthread_mutex_unlock(&s->api->sse_mu);
    return 0;
}

enum MHD_Result tq_h_events(tq_ctx *c) {
    static const char *const allowed[] = { "after", NULL };
    enum MHD_Result ans;
    if (!tq_query_check(c, allowed, &ans)) return ans;
    long long after = 0;
    if (tq_query(c, "after") && tq_query_int(c, "after", 0, INT64_MAX, &after, &ans)) return ans;
    tq_store *st = tq_api_store(c);
    if (!st) return tq_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "database_unavailable", NULL, "the database cannot be opened");
    tq_job j;
    int rc = tq_queue_get(st, c->id, &j);
    if (rc < 0) return tq_send_store_error(c, st, rc);
    if (rc == 0) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no job %lld", (long long)c->id);
    int readable = tq_may_read_job(c, &j, &ans);   /* private_jobs */
    tq_job_free(&j);
    if (!readable) return ans;
    tq_sse *s = calloc(1, sizeof *s);
    if (!s) return MHD_NO;
    s->api = c->api;
    s->conn = c->conn;
    s->job = c->id;
    s->last_step = after;
    s->last_send = mono_ms();
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = ci ? ci->connect_fd : -1;
    s->remote = client_addr(c->conn, s->addr);
    tq_peer peer;
    tq_ctx_peer(c, &peer);
    s->uid = peer.known ? (int)peer.uid : -1;
    /* the caps: counted and taken under one lock */
    unsigned total = 0, mine = 0, user = 0;
    pthread_mutex_lock(&c->api->sse_mu);
    for (tq_sse *o = c->api->sse_list; o; o = o->next) {
        total++;
        if (s->remote && o->remote && !memcmp(o->addr, s->addr, 16)) mine++;
        if (s->uid > 0 && o->uid == s->uid) user++;
    }
    if (user >= MAX_STREAMS_PER_USER) {
        pthread_mutex_unlock(&c->api->sse_mu);
        free(s);
        return tq_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "too_many_streams", NULL,
                             "you (%s) hold %u event streams, the most one user may; close one, or poll "
                             "GET /v1/jobs/%lld", peer.user, user, (long long)c->id);
    }
    if (total >= MAX_STREAMS || mine >= MAX_STREAMS_PER_CLIENT) {
        pthread_mutex_unlock(&c->api->sse_mu);
        free(s);
        if (total >= MAX_STREAMS)
            return tq_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "too_many_streams", NULL,
                                 "%u event streams are open, the most this daemon serves; try again later, "
                                 "or poll GET /v1/jobs/%lld", total, (long long)c->id);
        return tq_send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "too_many_streams", NULL,
                             "%u event streams are open from your address, the most one client may hold; "
                             "close one, or poll GET /v1/jobs/%lld", mine, (long long)c->id);
    }
    s->next = c->api->sse_list;
    c->api->sse_list = s;
    pthread_mutex_unlock(&c->api->sse_mu);
    c->req->sse = s;   /* freed with the request (completed callback) */
    put(s, "retry: 2000\n\n", 13);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, s, NULL);
    if (!r) return MHD_NO;   /* s goes with the request */
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return tq_send_response(c, MHD_HTTP_OK, r, "text/event-stream");
}

void tq_sse_free(tq_api *a, tq_sse *s) {
    pthread_mutex_lock(&a->sse_mu);
    for (tq_sse **pp = &a->sse_list; *pp; pp = &(*pp)->next)
        if (*pp == s) { *pp = s->next; break; }
    pthread_mutex_unlock(&a->sse_mu);
    free(s->buf);
    free(s);
}

static void resume_all(tq_api *a) {
    pthread_mutex_lock(&a->sse_mu);
    for (tq_sse *s = a->sse_list; s; s = s->next)
        if (s->suspended) { s->suspended = 0; MHD_resume_connection(s->conn); }
    tq_log_follow_resume(a);
    pthread_mutex_unlock(&a->sse_mu);
}

static void *ticker(void *arg) {
    tq_api *a = arg;
    while (!a->stopping) {
        struct timespec ts = { 0, TICK_MS * 1000000L };
        nanosleep(&ts, NULL);
        resume_all(a);
    }
    return NULL;
}

int tq_sse_start(tq_api *a) {
    if (pthread_create(&a->ticker, NULL, ticker, a)) return -1;
    a->ticker_started = 1;
    return 0;
}

void tq_sse_stop(tq_api *a) {
    pthread_mutex_lock(&a->sse_mu);
    a->stopping = 1;
    pthread_mutex_unlock(&a->sse_mu);
    if (a->ticker_started) pthread_join(a->ticker, NULL);
    a->ticker_started = 0;
    resume_all(a);   /* each stream then ends (END_OF_STREAM) */
    struct timespec ts = { 0, 100 * 1000000L };
    nanosleep(&ts, NULL);
}
