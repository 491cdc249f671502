/* internal.h — what the files of api/ share: the request context, the route handlers, the
 * response helpers, the job renderer and the event streams. Not included outside api/. */
#ifndef TQ_API_INTERNAL_H
#define TQ_API_INTERNAL_H
#include "api.h"
#include "../schema/queue.h"
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>

#define TQ_API_MAX_QUERY 16

typedef struct tq_sse tq_sse;

struct tq_api {
    struct MHD_Daemon *mhd;
    struct MHD_Daemon *mhd_unix; /* the unix socket's listener (NULL none) */
    char *socket_path;           /* its path, removed at stop */
    char *host, *db_path, *jobs_dir, *devices, *allowed_hosts, *cuda;
    tq_api_gpu *gpus;            /* the probe's GPUs (ngpus of them) */
    int ngpus;
    tq_ledger *ledger;           /* the scheduler's devices and waits (ledger.h) */
    long long storage_fault_ms;  /* when a write last failed for a full filesystem (ms, 0 never) */
    char *admin_group;           /* owners (peer.h): who may act on anyone's job */
    int private_jobs, remote_writes;
    double fair_window_s;
    unsigned short port;
    size_t max_body;
    pthread_key_t store_key;     /* each pool thread's tq_store */
    /* event streams and log followers: suspended while idle, resumed by the ticker (sse.c) */
    pthread_mutex_t sse_mu;
    tq_sse *sse_list;
    struct tq_follower *follow_list;   /* logfollow.c's (under sse_mu) */
    pthread_t ticker;
    int ticker_started;
    volatile int stopping;
    volatile int closing;        /* tq_api_stop began: accept_cb turns every new connection away */
    /* plan cache */
    pthread_mutex_t plan_mu;
    struct { char *key; long long total, data; unsigned stamp; } plans[16];
    unsigned plan_clock;
    /* open connections (http.c): the request deadline, the per-address limit */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;
    struct tq_conn *conns;       /* every open connection of both listeners (under conn_mu) */
    double request_timeout_ms;   /* a request must be complete this long after its wait began */
    pthread_t reaper;            /* closes the connections that miss it */
    int reaper_started, reaper_stop;
    unsigned long long reaped;   /* connections it closed */
};

/* per-request state: made on the first callback, freed in the completed callback */
typedef struct {
    int started;
    char *body;
    size_t len, cap;
    int too_large;
    tq_sse *sse;          /* an event stream's state, when the request became one */
} tq_req;

typedef struct {
    tq_api *api;
    struct MHD_Connection *conn;
    tq_req *req;
    const char *method;
    int64_t id;           /* the {id} of the path, when it has one */
    const char *url;      /* the request's path (decoded), for handlers of a path family */
    int nq;
    const char *qk[TQ_API_MAX_QUERY], *qv[TQ_API_MAX_QUERY];
} tq_ctx;

typedef enum MHD_Result (*tq_handler)(tq_ctx *);

/* http.c */
#include "peer.h"
/* who is on the other end of the request's connection (looked up once per connection) */
void tq_ctx_peer(tq_ctx *, tq_peer *);
tq_store *tq_api_store(tq_ctx *);   /* NULL: the error was answered? no: caller answers 503 */
/* queues r (and destroys it) with Cache-Control: no-store, X-Content-Type-Options: nosniff and
 * the Content-Type ctype (NULL: none, or r's own) */
enum MHD_Result tq_send_response(tq_ctx *, unsigned status, struct MHD_Response *r, const char *ctype);
enum MHD_Result tq_send_json(tq_ctx *, unsigned status, cJSON *body);   /* takes body */
enum MHD_Result tq_send_text(tq_ctx *, unsigned status, const char *ctype, char *text, size_t n); /* takes text */
enum MHD_Result tq_send_error(tq_ctx *, unsigned status, const char *code, const char *field,
                              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
enum MHD_Result tq_send_store_error(tq_ctx *, tq_store *, int rc);
/* query parameters: checks that every key is in allowed (NULL-terminated) and none repeats;
 * answers 400 itself and returns 0 otherwise */
int tq_query_check(tq_ctx *, const char *const *allowed, enum MHD_Result *answered);
const char *tq_query(tq_ctx *, const char *key);
/* parse an integer parameter in [lo, hi]; 0 ok, else answered 400 */
int tq_query_int(tq_ctx *, const char *key, long long lo, long long hi, long long *out,
                 enum MHD_Result *answered);

/* render.c */
cJSON *tq_job_json(const tq_job *);
cJSON *tq_api_job_json(const tq_api *, const tq_job *);   /* the API's job object (handlers.c) */
/* handlers.c: 1 when this connection may read job j (always, unless private_jobs: its owner,
 * root, admin_group); else 0 and *ans the 403 naming the owner */
int tq_may_read_job(tq_ctx *, const tq_job *j, enum MHD_Result *ans);
void tq_rfc3339(int64_t ms, char out[32]);
char *tq_steps_csv(const tq_step_rec *v, int n, size_t *len);   /* malloc'd */

/* handlers.c */
enum MHD_Result tq_h_submit(tq_ctx *);
enum MHD_Result tq_h_list(tq_ctx *);
enum MHD_Result tq_h_get(tq_ctx *);
enum MHD_Result tq_h_delete(tq_ctx *);
enum MHD_Result tq_h_steps(tq_ctx *);
enum MHD_Result tq_h_evals(tq_ctx *);
enum MHD_Result tq_h_cancel(tq_ctx *);
enum MHD_Result tq_h_requeue(tq_ctx *);
enum MHD_Result tq_h_model(tq_ctx *);
enum MHD_Result tq_h_log(tq_ctx *);
enum MHD_Result tq_h_users(tq_ctx *);
/* logfollow.c: ?follow=1 of the log. tq_log_follow_resume resumes the API's suspended
 * followers (sse.c's ticker, with sse_mu held); once `stopping` is set each then ends. */
enum MHD_Result tq_log_follow(tq_ctx *, const char *path);
void tq_log_follow_resume(tq_api *);
enum MHD_Result tq_h_devices(tq_ctx *);
enum MHD_Result tq_h_health(tq_ctx *);
enum MHD_Result tq_h_metrics(tq_ctx *);

/* compare.c */
enum MHD_Result tq_h_compare(tq_ctx *);

/* web.c: the dashboard (GET/HEAD /, /jobs/{id}, /compare, /assets/NAME) from the files of
 * api/web/ that scripts/embed-web compiled into $(BUILD)/gen/web_assets.c */
typedef struct {
    const char *path, *ctype, *etag;   /* "/" is the app shell; the rest "/assets/NAME" */
    const unsigned char *data;         /* NUL-terminated after len bytes */
    size_t len;
} tq_web_asset;
extern const tq_web_asset tq_web_assets[];
extern const int tq_web_nassets;
enum MHD_Result tq_h_web_page(tq_ctx *);
enum MHD_Result tq_h_web_asset(tq_ctx *);

/* sse.c */
enum MHD_Result tq_h_events(tq_ctx *);
int tq_sse_start(tq_api *);         /* the ticker that resumes suspended streams and followers */
void tq_sse_stop(tq_api *);         /* ends every stream and follower (before MHD_stop_daemon) */
void tq_sse_free(tq_api *, tq_sse *);   /* from the completed callback */
#endif
