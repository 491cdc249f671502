/* cuda_backend.c — the CUDA backend object: devices, lifecycle, memory, timing and the op table.
 *
 * - tq_cuda_devices / tq_cuda_backend_new never abort: no driver, no device, a bad ordinal or an
 *   out-of-memory come back as a status and a one-line reason (the same binary runs on machines
 *   without a GPU and falls back to the CPU).
 * - Memory: every block is one cudaMalloc (the engine allocates one block per planner region,
 *   before the first step, and nothing inside a step). A small host-side table remembers each
 *   block's size so that free() subtracts exactly what alloc() added to be->bytes_live.
 * - One non-blocking stream per backend; cuDNN and cuBLASLt run on it (cuBLASLt loaded here, on
 *   the first backend, not at process start: cuda_lt_load.c). to_host is synchronous
 *   (the trainer reads the step's scalars once per step: the step's one sync). to_device of a
 *   small block (a micro-batch's sample indices and crop offsets) is asynchronous: the bytes are
 *   copied into a ring of pinned staging slots, and a slot is reused only after the event of
 *   its last copy has completed, so the caller may reuse its buffer at once and the host runs
 *   ahead of the GPU. Larger blocks (the dataset, the initial weights) are copied synchronously.
 * - TF32 for f32 data follows tq_cuda_opts.tf32 (tq_cuda_backend_open; the trainer passes the
 *   spec's tf32, default convolutions only, as PyTorch): cuDNN's tensor-core engines for f32
 *   convolutions (cuda_conv.c) and COMPUTE_32F_FAST_TF32 for f32 GEMMs (cuda_linear.c).
 *   tq_cuda_backend_new is tf32 0: exact f32, which gpu_ops checks against the CPU at 1e-4.
 * - CUDA graphs (graph_*): stream capture in cudaStreamCaptureModeGlobal on the backend's
 *   stream, instantiated and uploaded at graph_end. fetch_*: a D2H copy into pinned slots and a
 *   timing event per slot, waited for at fetch_end (the step's results read one step late).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cudnn.h>
#include <cublasLt.h>

#include "cuda/cuda_internal.h"
#include "cuda/cuda_desc.h"

int tqc_cuda_fail(tq_backend *be, cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    const char *base = strrchr(file, '/');
    tq_backend_seterr(be, "%s: %s (%s) at %s:%d", what, cudaGetErrorString(e), cudaGetErrorName(e),
                      base ? base + 1 : file, line);
    return 1;
}

int tq_cuda_built(void) { return 1; }

/* Why there is no usable GPU, in one line, from the runtime's own error. */
static void no_gpu_reason(cudaError_t e, char *why, size_t n) {
    switch (e) {
    case cudaErrorNoDevice:
        snprintf(why, n, "no CUDA device found (the driver reports none)");
        break;
    case cudaErrorInsufficientDriver:
        snprintf(why, n, "the NVIDIA driver is missing or older than this build's CUDA %d.%d runtime needs",
                 CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        break;
    default:
        snprintf(why, n, "CUDA unavailable: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    }
}

int tq_cuda_devices(tq_cuda_devinfo *out, int max, char *why, size_t why_len) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (why) no_gpu_reason(e, why, why_len);
        return e == cudaErrorNoDevice ? 0 : -1;
    }
    if (count == 0 && why) snprintf(why, why_len, "no CUDA device found (the driver reports none)");
    for (int d = 0; d < count && d < max; d++) {
        struct cudaDeviceProp p;
        tq_cuda_devinfo *o = &out[d];
        memset(o, 0, sizeof *o);
        o->ordinal = d;
        o->compute_mode = -1;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) { cudaGetLastError(); continue; }
        int cm = 0;   /* not in cudaDeviceProp since CUDA 13: an attribute */
        if (cudaDeviceGetAttribute(&cm, cudaDevAttrComputeMode, d) == cudaSuccess) o->compute_mode = cm;
        else cudaGetLastError();
        snprintf(o->name, sizeof o->name, "%.95s", p.name);
        o->sm = p.major * 10 + p.minor;
        o->total_bytes = p.totalGlobalMem;
        snprintf(o->pci_bus_id, sizeof o->pci_bus_id, "%08x:%02x:%02x.0", (unsigned)p.pciDomainID,
                 (unsigned)p.pciBusID, (unsigned)p.pciDeviceID);
        /* free memory needs a context on that device: the probe is a short-lived process
         * (`trainq devices`), so creating one here is fine */
        size_t fr = 0, tot = 0;
        if (cudaSetDevice(d) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
            o->free_bytes = fr;
        else
            cudaGetLastError();
    }
    return count;
}

/* ---- memory: a host table of live blocks (pointer -> size) ---- */

typedef struct { void *p; size_t bytes; } blk;
#define STG_SLOTS 16
#define STG_BYTES ((size_t)64 << 10)
typedef struct { void *buf; cudaEvent_t done; } stg_slot;   /* pinned host staging */
typedef struct {
    tqc_ctx c;
    blk *blks;
    size_t nblk, cap;
    cudaEvent_t t0;                     /* the clock's reference event, at t0_ms */
    double t0_ms;
    uint64_t seq;                       /* events recorded for the clock so far */
    uint64_t fetch_seq[TQ_FETCH_SLOTS]; /* when each fetch slot's event was recorded */
    int fetch_open[TQ_FETCH_SLOTS];     /* begun and not yet ended */
    stg_slot stg[STG_SLOTS];
    int stg_next;
    void *fetch;                        /* pinned, TQ_FETCH_SLOTS × TQ_FETCH_BYTES */
    cudaEvent_t fetch_ev[TQ_FETCH_SLOTS];
} ctx_full;

/* Refuses a call a stream capture cannot hold (backend.h: only ops between graph_begin and
 * graph_end, no transfer, sync, alloc or free): an error that names the call, where it would
 * otherwise invalidate the capture, or record a fetch event inside the graph, far from its
 * cause. The void slots set be->err (nerr moves: the trainer's transfer checks see it). */
#define NOT_CAPTURING(be, op, ...)                                                              \
    do {                                                                                        \
        if (tqc(be)->capturing) {                                                               \
            tq_backend_seterr((be), "%s: not allowed while a CUDA graph is being captured", op); \
            return __VA_ARGS__;                                                                 \
        }                                                                                       \
    } while (0)

static void *cu_alloc(tq_backend *be, size_t bytes) {
    NOT_CAPTURING(be, "alloc", NULL);
    ctx_full *f = (ctx_full *)be->ctx;
    if (f->nblk == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 64;
        blk *nb = realloc(f->blks, cap * sizeof *nb);
        if (!nb) { tq_backend_seterr(be, "alloc: out of host memory for the block table"); return NULL; }
        f->blks = nb;
        f->cap = cap;
    }
    if (tq_backend_over_limit(be, bytes)) return NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        cudaGetLastError();
        tq_backend_seterr(be, "cudaMalloc of %zu bytes failed on %s: %s (free %zu of %zu bytes)",
                          bytes, f->c.name, cudaGetErrorString(e), fr, tot);
        return NULL;
    }
    f->blks[f->nblk].p = p;
    f->blks[f->nblk].bytes = bytes;
    f->nblk++;
    be->bytes_live += bytes;
    if (be->bytes_live > be->bytes_peak) be->bytes_peak = be->bytes_live;
    return p;
}

static void cu_free(tq_backend *be, void *p) {
    if (!p) return;
    NOT_CAPTURING(be, "free");
    ctx_full *f = (ctx_full *)be->ctx;
    for (size_t i = f->nblk; i-- > 0;) {
        if (f->blks[i].p != p) continue;
        be->bytes_live -= f->blks[i].bytes;
        f->blks[i] = f->blks[--f->nblk];
        cudaFree(p);
        return;
    }
    /* not ours: a broken invariant of the caller, but never worth crashing a worker over */
    tq_backend_seterr(be, "free: %p was not allocated by this backend", p);
}

/* The void slots cannot return a status: a failure is kept in be->err (be->nerr moves, which
 * the trainer checks before it issues work that reads the copy) and mostly sticks to the
 * stream, so the next op (or the step's sync) reports it too. */
static void cu_memset0(tq_backend *be, void *p, size_t bytes) {
    if (bytes) tqc_cuda_fail(be, cudaMemsetAsync(p, 0, bytes, tqc(be)->stream), "cudaMemsetAsync", __FILE__, __LINE__);
}
static void cu_to_device(tq_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    NOT_CAPTURING(be, "to_device");
    ctx_full *f = (ctx_full *)be->ctx;
    stg_slot *sl = &f->stg[f->stg_next];
    if (bytes <= STG_BYTES && sl->buf) {
        f->stg_next = (f->stg_next + 1) % STG_SLOTS;
        /* the slot's previous copy must have left it (usually long ago) */
        if (tqc_cuda_fail(be, cudaEventSynchronize(sl->done), "cudaEventSynchronize(staging)", __FILE__, __LINE__)) return;
        memcpy(sl->buf, src, bytes);
        if (tqc_cuda_fail(be, cudaMemcpyAsync(dst, sl->buf, bytes, cudaMemcpyHostToDevice, f->c.stream),
                          "cudaMemcpyAsync(H2D staged)", __FILE__, __LINE__)) return;
        tqc_cuda_fail(be, cudaEventRecord(sl->done, f->c.stream), "cudaEventRecord(staging)", __FILE__, __LINE__);
        return;
    }
    tqc_cuda_fail(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, tqc(be)->stream),
                  "cudaMemcpyAsync(H2D)", __FILE__, __LINE__);
    /* the source is pageable host memory the caller may reuse at once */
    tqc_cuda_fail(be, cudaStreamSynchronize(tqc(be)->stream), "cudaStreamSynchronize", __FILE__, __LINE__);
}
static void cu_to_host(tq_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    NOT_CAPTURING(be, "to_host");
    tqc_cuda_fail(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, tqc(be)->stream),
                  "cudaMemcpyAsync(D2H)", __FILE__, __LINE__);
    tqc_cuda_fail(be, cudaStreamSynchronize(tqc(be)->stream), "cudaStreamSynchronize", __FILE__, __LINE__);
}
static void cu_copy(tq_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    tqc_cuda_fail(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tqc(be)->stream),
                  "cudaMemcpyAsync(D2D)", __FILE__, __LINE__);
}
static void cu_sync(tq_backend *be) {
    NOT_CAPTURING(be, "sync");
    tqc_cuda_fail(be, cudaStreamSynchronize(tqc(be)->stream), "cudaStreamSynchronize", __FILE__, __LINE__);
}

/* The device's clock, in ms since the backend started: a completed event's time is t0_ms plus
 * cudaEventElapsedTime from the reference event t0. That call gives a float, whose 24 bits
 * would step by 0.25 ms after 35 minutes and by 8 ms after a day, so the reference moves up:
 * once an event measured is more than CLOCK_REBASE_MS past it, that event becomes the
 * reference (the two handles swap; the old reference is free to be recorded again) and the
 * float never holds more than about a second. An event recorded before the new reference and
 * not yet read would measure negative against it, so the move waits until every open fetch
 * slot was recorded after the event (seq: the order of the records). */
#define CLOCK_REBASE_MS 1000.0

static int clock_read(tq_backend *be, cudaEvent_t *ev, uint64_t seq, double *t_ms) {
    ctx_full *f = (ctx_full *)be->ctx;
    float ms = 0;
    TQC_CHECK(be, cudaEventElapsedTime(&ms, f->t0, *ev));
    *t_ms = f->t0_ms + ms;
    if (ms <= CLOCK_REBASE_MS) return TQ_OK;
    for (int i = 0; i < TQ_FETCH_SLOTS; i++)
        if (f->fetch_open[i] && &f->fetch_ev[i] != ev && f->fetch_seq[i] < seq) return TQ_OK;
    cudaEvent_t old = f->t0;
    f->t0 = *ev;
    f->t0_ms = *t_ms;
    *ev = old;
    return TQ_OK;
}

/* Milliseconds on the device's clock: an event recorded on the stream (the last one so far).
 * Called after sync, so the event is complete at once. */
static double cu_now_ms(tq_backend *be) {
    NOT_CAPTURING(be, "now_ms", 0.0);
    ctx_full *f = (ctx_full *)be->ctx;
    tqc_ctx *c = &f->c;
    double t = f->t0_ms;
    if (cudaEventRecord(c->ev, c->stream) == cudaSuccess && cudaEventSynchronize(c->ev) == cudaSuccess)
        clock_read(be, &c->ev, ++f->seq, &t);
    cudaGetLastError();
    return t;
}

/* ---- CUDA graphs ---- */
static int cu_graph_begin(tq_backend *be) {
    ctx_full *f = (ctx_full *)be->ctx;
    if (f->c.capturing) {
        tq_backend_seterr(be, "graph_begin: a capture is already open");
        return TQ_EINVAL;
    }
    cudaError_t e = cudaStreamBeginCapture(f->c.stream, cudaStreamCaptureModeGlobal);
    if (e != cudaSuccess) {
        tqc_cuda_fail(be, e, "cudaStreamBeginCapture", __FILE__, __LINE__);
        /* cleared, as graph_end's failures are: the trainer trains on uncaptured, and the next
         * launch check (cudaGetLastError) would otherwise report this error as its own */
        cudaGetLastError();
        return TQ_EDEVICE;
    }
    f->c.capturing = 1;
    return TQ_OK;
}

static int cu_graph_end(tq_backend *be, int keep, void **graph) {
    ctx_full *f = (ctx_full *)be->ctx;
    if (graph) *graph = NULL;
    if (!f->c.capturing) {
        tq_backend_seterr(be, "graph_end: no capture is open");
        return TQ_EINVAL;
    }
    f->c.capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(f->c.stream, &g);
    if (!keep || e != cudaSuccess || !g) {
        if (g) cudaGraphDestroy(g);
        if (!keep) { cudaGetLastError(); return TQ_OK; }
        if (e == cudaSuccess) e = cudaErrorStreamCaptureInvalidated;
        tqc_cuda_fail(be, e, "cudaStreamEndCapture", __FILE__, __LINE__);
        cudaGetLastError();
        return TQ_EDEVICE;
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        tqc_cuda_fail(be, e, "cudaGraphInstantiate", __FILE__, __LINE__);
        cudaGetLastError();
        return TQ_EDEVICE;
    }
    if ((e = cudaGraphUpload(x, f->c.stream)) != cudaSuccess) {
        tqc_cuda_fail(be, e, "cudaGraphUpload", __FILE__, __LINE__);
        cudaGraphExecDestroy(x);
        cudaGetLastError();
        return TQ_EDEVICE;
    }
    if (graph) *graph = x;
    else cudaGraphExecDestroy(x);
    return TQ_OK;
}

static int cu_graph_launch(tq_backend *be, void *graph) {
    if (!graph) {
        tq_backend_seterr(be, "graph_launch: no graph");
        return TQ_EINVAL;
    }
    TQC_CHECK(be, cudaGraphLaunch((cudaGraphExec_t)graph, tqc(be)->stream));
    return TQ_OK;
}

static void cu_graph_free(tq_backend *be, void *graph) {
    (void)be;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* ---- fetch: results read without stopping the stream ---- */
static int cu_fetch_begin(tq_backend *be, int slot, const void *src, size_t bytes) {
    NOT_CAPTURING(be, "fetch_begin", TQ_EINVAL);
    ctx_full *f = (ctx_full *)be->ctx;
    if (slot < 0 || slot >= TQ_FETCH_SLOTS || bytes > TQ_FETCH_BYTES || (bytes && !src) || !f->fetch) {
        tq_backend_seterr(be, "fetch_begin: bad slot %d or %zu bytes", slot, bytes);
        return TQ_EINVAL;
    }
    if (bytes)
        TQC_CHECK(be, cudaMemcpyAsync((char *)f->fetch + (size_t)slot * TQ_FETCH_BYTES, src, bytes,
                                      cudaMemcpyDeviceToHost, f->c.stream));
    TQC_CHECK(be, cudaEventRecord(f->fetch_ev[slot], f->c.stream));
    f->fetch_seq[slot] = ++f->seq;
    f->fetch_open[slot] = 1;
    return TQ_OK;
}

static int cu_fetch_end(tq_backend *be, int slot, void *dst, size_t bytes, double *t_ms) {
    NOT_CAPTURING(be, "fetch_end", TQ_EINVAL);
    ctx_full *f = (ctx_full *)be->ctx;
    if (slot < 0 || slot >= TQ_FETCH_SLOTS || bytes > TQ_FETCH_BYTES || (bytes && !dst) || !f->fetch) {
        tq_backend_seterr(be, "fetch_end: bad slot %d or %zu bytes", slot, bytes);
        return TQ_EINVAL;
    }
    TQC_CHECK(be, cudaEventSynchronize(f->fetch_ev[slot]));
    f->fetch_open[slot] = 0;
    if (bytes) memcpy(dst, (const char *)f->fetch + (size_t)slot * TQ_FETCH_BYTES, bytes);
    double t = 0;
    int rc = clock_read(be, &f->fetch_ev[slot], f->fetch_seq[slot], &t);
    if (t_ms) *t_ms = t;
    return rc;
}

static int cu_mem_info(tq_backend *be, size_t *free_bytes, size_t *total_bytes) {
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    if (e != cudaSuccess) { cudaGetLastError(); *free_bytes = *total_bytes = 0; return -1; }
    return 0;
}

static void cu_destroy(tq_backend *be) {
    ctx_full *f = (ctx_full *)be->ctx;
    if (!f) return;
    tqc_ctx *c = &f->c;
    if (f->c.capturing) {                  /* a capture left open by an error path */
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        f->c.capturing = 0;
    }
    if (c->stream) cudaStreamSynchronize(c->stream);
    tqc_conv_destroy(be);
    tqc_linear_destroy(be);
    for (size_t i = 0; i < f->nblk; i++) cudaFree(f->blks[i].p);
    free(f->blks);
    if (c->scratch) cudaFree(c->scratch);
    if (c->lt) cublasLtDestroy((cublasLtHandle_t)c->lt);
    if (c->cudnn) cudnnDestroy((cudnnHandle_t)c->cudnn);
    if (c->ev) cudaEventDestroy(c->ev);
    if (f->t0) cudaEventDestroy(f->t0);
    for (int i = 0; i < STG_SLOTS; i++) {
        if (f->stg[i].buf) cudaFreeHost(f->stg[i].buf);
        if (f->stg[i].done) cudaEventDestroy(f->stg[i].done);
    }
    if (f->fetch) cudaFreeHost(f->fetch);
    for (int i = 0; i < TQ_FETCH_SLOTS; i++)
        if (f->fetch_ev[i]) cudaEventDestroy(f->fetch_ev[i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    cudaGetLastError();
    free(f);
    be->ctx = NULL;
}

static const tq_backend_i cuda_iface = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .memset0 = cu_memset0,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .copy = cu_copy,
    .sync = cu_sync,
    .now_ms = cu_now_ms,
    .mem_info = cu_mem_info,
    .destroy = cu_destroy,
    .conv_ws = tqc_conv_ws,
    .conv_fwd = tqc_conv_fwd,
    .conv_bwd_data = tqc_conv_bwd_data,
    .conv_bwd_filter = tqc_conv_bwd_filter,
    .linear_ws = tqc_linear_ws,
    .linear_fwd = tqc_linear_fwd,
    .linear_bwd_data = tqc_linear_bwd_data,
    .linear_bwd_filter = tqc_linear_bwd_filter,
    .bn_fwd_train = tqc_bn_fwd_train,
    .bn_fwd_infer = tqc_bn_fwd_infer,
    .bn_norm = tqc_bn_norm,
    .bn_bwd = tqc_bn_bwd,
    .relu_fwd = tqc_relu_fwd,
    .relu_bwd = tqc_relu_bwd,
    .add_fwd = tqc_add_fwd,
    .accumulate = tqc_accumulate,
    .maxpool_fwd = tqc_maxpool_fwd,
    .maxpool_bwd = tqc_maxpool_bwd,
    .avgpool_fwd = tqc_avgpool_fwd,
    .avgpool_bwd = tqc_avgpool_bwd,
    .softmax_ce = tqc_softmax_ce,
    .softmax_ce_eval = tqc_softmax_ce_eval,
    .cast = tqc_cast,
    .unscale_check = tqc_unscale_check,
    .sgd_step = tqc_sgd_step,
    .adamw_step = tqc_adamw_step,
    .load_batch = tqc_load_batch,
    .softmax_ce_dyn = tqc_softmax_ce_dyn,
    .unscale_check_dyn = tqc_unscale_check_dyn,
    .sgd_step_dyn = tqc_sgd_step_dyn,
    .adamw_step_dyn = tqc_adamw_step_dyn,
    .step_end = tqc_step_end,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_free = cu_graph_free,
    .fetch_begin = cu_fetch_begin,
    .fetch_end = cu_fetch_end,
};

const tq_backend_i *tqc_backend_iface(void) { return &cuda_iface; }

tq_backend *tq_cuda_backend_new(int device, int benchmark, int deterministic, char *why, size_t why_len) {
    tq_cuda_opts o = { device, benchmark, deterministic, 0 };
    return tq_cuda_backend_open(&o, why, why_len);
}

static __thread int open_busy;
int tq_cuda_open_busy(void) { return open_busy; }

tq_backend *tq_cuda_backend_open(const tq_cuda_opts *opts, char *why, size_t why_len) {
    char tmp[256];
    open_busy = 0;
    const int device = opts ? opts->device : 0;
    if (!why) { why = tmp; why_len = sizeof tmp; }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        no_gpu_reason(e == cudaSuccess ? cudaErrorNoDevice : e, why, why_len);
        return NULL;
    }
    if (device < 0 || device >= count) {
        snprintf(why, why_len, "cuda:%d does not exist: this machine has %d CUDA device%s (cuda:0..cuda:%d)",
                 device, count, count == 1 ? "" : "s", count - 1);
        return NULL;
    }
    tq_backend *be = calloc(1, sizeof *be);
    ctx_full *f = calloc(1, sizeof *f);
    if (!be || !f) { free(be); free(f); snprintf(why, why_len, "out of host memory"); return NULL; }
    be->i = &cuda_iface;
    be->ctx = f;
    be->threads = 1;
    tqc_ctx *c = &f->c;
    c->device = device;
    c->benchmark = opts ? opts->benchmark : 0;
    c->deterministic = opts ? opts->deterministic : 1;
    c->tf32 = opts ? opts->tf32 & (TQ_TF32_CONV_OK | TQ_TF32_MATMUL_OK) : 0;
    struct cudaDeviceProp p;
    const char *step = "cudaSetDevice";
    if ((e = cudaSetDevice(device)) != cudaSuccess) goto cuda_fail;
    step = "cudaGetDeviceProperties";
    if ((e = cudaGetDeviceProperties(&p, device)) != cudaSuccess) goto cuda_fail;
    snprintf(c->name, sizeof c->name, "%.95s", p.name);
    c->sm = p.major * 10 + p.minor;
    c->total_bytes = p.totalGlobalMem;
    step = "cudaStreamCreateWithFlags";
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) goto cuda_fail;
    /* the clock's events (c->ev, t0 and the fetch slots' trade handles in clock_read) wait by
     * blocking, not spinning: with cuda_graphs the host waits at fetch_end for the step before
     * the one in flight, about a whole step, and a spinning wait held a CPU core per job for it
     * on a workstation whose cores CPU jobs share. The GPU never waits on that wake-up: the next
     * step is already queued. Stream syncs (the uncaptured loop's one a step) keep the device's
     * default. */
    step = "cudaEventCreateWithFlags(clock)";
    if ((e = cudaEventCreateWithFlags(&c->ev, cudaEventBlockingSync)) != cudaSuccess) goto cuda_fail;
    if ((e = cudaEventCreateWithFlags(&f->t0, cudaEventBlockingSync)) != cudaSuccess) goto cuda_fail;
    step = "cudaEventRecord";
    if ((e = cudaEventRecord(f->t0, c->stream)) != cudaSuccess) goto cuda_fail;
    step = "cudaMalloc(scratch)";
    if ((e = cudaMalloc(&c->scratch, TQC_SCRATCH_BYTES)) != cudaSuccess) goto cuda_fail;
    for (int i = 0; i < STG_SLOTS; i++) {
        step = "cudaEventCreateWithFlags(staging)";
        if ((e = cudaEventCreateWithFlags(&f->stg[i].done, cudaEventDisableTiming)) != cudaSuccess) goto cuda_fail;
        step = "cudaMallocHost(staging)";
        if ((e = cudaMallocHost(&f->stg[i].buf, STG_BYTES)) != cudaSuccess) goto cuda_fail;
    }
    step = "cudaMallocHost(fetch)";
    if ((e = cudaMallocHost(&f->fetch, (size_t)TQ_FETCH_SLOTS * TQ_FETCH_BYTES)) != cudaSuccess) goto cuda_fail;
    step = "cudaEventCreate(fetch)";
    for (int i = 0; i < TQ_FETCH_SLOTS; i++)
        if ((e = cudaEventCreateWithFlags(&f->fetch_ev[i], cudaEventBlockingSync)) != cudaSuccess) goto cuda_fail;

    cudnnHandle_t h;
    cudnnStatus_t st = cudnnCreate(&h);
    if (st != CUDNN_STATUS_SUCCESS) {
        open_busy = st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;   /* memory taken by others */
        snprintf(why, why_len, "cuDNN %zu cannot start on %s: %s", cudnnGetVersion(), c->name, cudnnGetErrorString(st));
        goto fail;
    }
    c->cudnn = h;
    if ((st = cudnnSetStream(h, c->stream)) != CUDNN_STATUS_SUCCESS) {
        snprintf(why, why_len, "cudnnSetStream: %s", cudnnGetErrorString(st));
        goto fail;
    }
    if (tqc_lt_load(why, why_len)) goto fail;
    cublasLtHandle_t lt;
    cublasStatus_t bs = cublasLtCreate(&lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        open_busy = bs == CUBLAS_STATUS_ALLOC_FAILED;   /* memory taken by others */
        snprintf(why, why_len, "cuBLASLt cannot start on %s: status %d%s", c->name, (int)bs,
                 open_busy ? " (CUBLAS_STATUS_ALLOC_FAILED: out of GPU memory)" : "");
        goto fail;
    }
    c->lt = lt;
    if (tqc_conv_init(be) || tqc_linear_init(be)) {
        snprintf(why, why_len, "%s", be->err[0] ? be->err : "cannot set up the convolution/GEMM caches");
        goto fail;
    }
    return be;

cuda_fail:
    cudaGetLastError();
    open_busy = e == cudaErrorMemoryAllocation || e == cudaErrorDevicesUnavailable;
    snprintf(why, why_len, "%s on cuda:%d: %s (%s)", step, device, cudaGetErrorString(e), cudaGetErrorName(e));
fail:
    cu_destroy(be);
    free(be);
    return NULL;
}

/* the name of the device a CUDA backend runs on (for the summary's "device") */
const char *tq_cuda_backend_name(tq_backend *be) {
    return be && be->i == &cuda_iface ? tqc(be)->name : NULL;
}
