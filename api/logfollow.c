/* logfollow.c — GET /v1/jobs/{id}/log?follow=1: the job's log as it grows, until the job ends.
 *
 * Like the event streams (sse.c): a response of unknown size whose reader sends what the file
 * has past the last offset; at the end of the file it checks the job's state (at most every
 * CHECK_MS) and, while the job runs, suspends the connection. The API's followers are a list
 * beside its streams, under the same lock, and the streams' ticker resumes both every tick, so
 * no pool thread sleeps or spins; when the API stops, its last resume ends them. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <sys/stat.h>

#define CHECK_MS 500

typedef struct tq_follower {
    struct tq_follower *next;
    tq_api *api;
    struct MHD_Connection *conn;
    int fd;
    int64_t job;
    int suspended, ended;
    double checked_ms;
} follower;

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* 1 while the job is queued or running (or cannot be read: keep following) */
static int job_live(follower *f) {
    tq_ctx c = { .api = f->api, .conn = f->conn };
    tq_store *st = tq_api_store(&c);
    if (!st) return 1;
    tq_job j;
    int rc = tq_queue_get(st, f->job, &j);
    if (rc < 0) return 1;
    if (rc == 0) return 0;   /* deleted */
    int live = !tq_state_name_final(j.state);
    tq_job_free(&j);
    return live;
}

static ssize_t reader(void *cls, uint64_t pos, char *out, size_t max) {
    follower *f = cls;
    (void)pos;
    for (int pass = 0; pass < 2; pass++) {
        ssize_t k = read(f->fd, out, max);
        if (k > 0) return k;
        if (k < 0 && errno == EINTR) { pass--; continue; }
        if (f->ended || f->api->stopping) return MHD_CONTENT_READER_END_OF_STREAM;
        if (pass) break;
        double now = mono_ms();
        if (now - f->checked_ms >= CHECK_MS) {
            f->checked_ms = now;
            if (!job_live(f)) f->ended = 1;   /* one more read for the last lines, then the end */
        }
    }
    pthread_mutex_lock(&f->api->sse_mu);
    if (f->api->stopping) {
        pthread_mutex_unlock(&f->api->sse_mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    MHD_suspend_connection(f->conn);
    f->suspended = 1;
    pthread_mutex_unlock(&f->api->sse_mu);
    return 0;
}

static void release(void *cls) {
    follower *f = cls;
    pthread_mutex_lock(&f->api->sse_mu);
    for (follower **pp = &f->api->follow_list; *pp; pp = &(*pp)->next)
        if (*pp == f) { *pp = f->next; break; }
    pthread_mutex_unlock(&f->api->sse_mu);
    close(f->fd);
    free(f);
}

enum MHD_Result tq_log_follow(tq_ctx *c, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {   /* queued, not started yet: follow the file once it exists */
        char dir[1200];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) { *slash = 0; mkdir(dir, 0755); }
        int w = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (w >= 0) close(w);
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0)
        return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "job %lld has no log (%s)", (long long)c->id,
                             strerror(errno));
    follower *f = calloc(1, sizeof *f);
    if (!f) { close(fd); return MHD_NO; }
    f->api = c->api;
    f->conn = c->conn;
    f->fd = fd;
    f->job = c->id;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, f, release);
    if (!r) { close(fd); free(f); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    pthread_mutex_lock(&c->api->sse_mu);
    f->next = c->api->follow_list;
    c->api->follow_list = f;
    pthread_mutex_unlock(&c->api->sse_mu);
    enum MHD_Result ret = MHD_queue_response(c->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

void tq_log_follow_resume(tq_api *a) {
    for (follower *f = a->follow_list; f; f = f->next)
        if (f->suspended) { f->suspended = 0; MHD_resume_connection(f->conn); }
}
