/* cpu_backend.c — the CPU backend object: lifecycle, memory, timing and the op table.
 *
 * Memory: every block carries a 64-byte header in front of it holding its requested size, so
 * that free() can subtract exactly what alloc() added to bytes_live; user pointers are 64-byte
 * aligned. The ops themselves live in cpu_conv.c (+ cpu_dnnl.c), cpu_bn.c, cpu_elem.c and
 * cpu_pool.c. be->ctx is a tq_cpu_ctx (the oneDNN primitive cache), freed by destroy.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
#include <cblas.h>

#include "cpu/cpu_internal.h"

#define HDR 64   /* header bytes in front of each block; also the alignment */

void tq_backend_seterr(tq_backend *be, const char *fmt, ...) {
    if (!be) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(be->err, sizeof be->err, fmt, ap);
    va_end(ap);
    be->nerr++;
}

int tq_backend_over_limit(tq_backend *be, size_t bytes) {
    if (!be->bytes_limit || (be->bytes_live <= be->bytes_limit && bytes <= be->bytes_limit - be->bytes_live)) return 0;
    tq_backend_seterr(be, "alloc: %zu bytes more would hold %zu, over the %zu bytes planned for this job "
                      "(the job's share of the device)", bytes, be->bytes_live + bytes, be->bytes_limit);
    return 1;
}

int tq_cpu_check_shape(tq_backend *be, const char *op, tq_shape s, tq_dtype dt) {
    if (!tq_cpu_dt_ok(dt)) {
        tq_backend_seterr(be, "%s: bad dtype %d", op, (int)dt);
        return TQ_EINVAL;
    }
    if (s.n <= 0 || s.h <= 0 || s.w <= 0 || s.c <= 0) {
        tq_backend_seterr(be, "%s: bad shape (%d,%d,%d,%d)", op, s.n, s.h, s.w, s.c);
        return TQ_EINVAL;
    }
    return TQ_OK;
}

static void *cpu_alloc(tq_backend *be, size_t bytes) {
    if (bytes > SIZE_MAX - 2 * HDR) {
        tq_backend_seterr(be, "alloc: %zu bytes is too large", bytes);
        return NULL;
    }
    if (tq_backend_over_limit(be, bytes)) return NULL;
    size_t total = (HDR + bytes + HDR - 1) / HDR * HDR;
    unsigned char *base = aligned_alloc(HDR, total);
    if (!base) {
        tq_backend_seterr(be, "alloc: out of memory (%zu bytes)", bytes);
        return NULL;
    }
    memcpy(base, &bytes, sizeof bytes);
    be->bytes_live += bytes;
    if (be->bytes_live > be->bytes_peak) be->bytes_peak = be->bytes_live;
    return base + HDR;
}

static void cpu_free(tq_backend *be, void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - HDR;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    be->bytes_live -= bytes;
    free(base);
}

/* Large buffers (a ResNet-50's 94 MB of gradients, zeroed every step) in one piece per thread:
 * one core's memset ran at 10 GB/s, 9.6 ms of a 457 ms resnet50 bf16 step at batch 32. */
#define MEMSET_PAR_BYTES ((size_t)1 << 22)
void tq_cpu_zero(tq_backend *be, void *p, size_t bytes) {
    int nt = tq_cpu_nt(be);
    if (bytes < MEMSET_PAR_BYTES || nt < 2) {
        if (bytes) memset(p, 0, bytes);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
        size_t a = bytes * (size_t)t / (size_t)nt / 64 * 64, b = t + 1 == nt ? bytes : bytes * (size_t)(t + 1) / (size_t)nt / 64 * 64;
        memset((char *)p + a, 0, b - a);
    }
}
__attribute__((weak)) int tq_cpu_memset0_fails(void);   /* below: a test's failure */
static void cpu_memset0(tq_backend *be, void *p, size_t bytes) {
    if (bytes && tq_cpu_memset0_fails()) {
        memset(p, 0xff, bytes);   /* what was not zeroed: NaNs */
        tq_backend_seterr(be, "memset0: %zu bytes not zeroed (a failure a test asked for)", bytes);
        return;
    }
    tq_cpu_zero(be, p, bytes);
}
static void cpu_copy(tq_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
}
/* A CPU's copies and memsets cannot fail; a GPU's can. Tests define these (weak here: 0, never)
 * to make one to_device, to_host or memset0 fail as a GPU's would and check that the trainer
 * notices (test_devstep.c). */
__attribute__((weak)) int tq_cpu_to_device_fails(void) { return 0; }
__attribute__((weak)) int tq_cpu_to_host_fails(void) { return 0; }
__attribute__((weak)) int tq_cpu_memset0_fails(void) { return 0; }
static void cpu_to_device(tq_backend *be, void *dst, const void *src, size_t bytes) {
    if (tq_cpu_to_device_fails()) {
        tq_backend_seterr(be, "to_device: %zu bytes not copied (a failure a test asked for)", bytes);
        return;
    }
    cpu_copy(be, dst, src, bytes);
}
static void cpu_to_host(tq_backend *be, void *dst, const void *src, size_t bytes) {
    if (tq_cpu_to_host_fails()) {
        memset(dst, 0xff, bytes);   /* what did not arrive: NaNs, not the data */
        tq_backend_seterr(be, "to_host: %zu bytes not copied (a failure a test asked for)", bytes);
        return;
    }
    cpu_copy(be, dst, src, bytes);
}
static void cpu_sync(tq_backend *be) { (void)be; }
static double cpu_now_ms(tq_backend *be) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The host's memory is not a device's: no numbers (-1). Tests define tq_cpu_device_free (weak
 * here: -1, none) to report a device's free bytes as a GPU's mem_info does, and check what the
 * trainer makes of a device with less free than the job's plan (test_engine.c). */
__attribute__((weak)) long long tq_cpu_device_free(void) { return -1; }
static int cpu_mem_info(tq_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be; *free_bytes = *total_bytes = 0;
    long long f = tq_cpu_device_free();
    if (f < 0) return -1;
    *free_bytes = (size_t)f;
    *total_bytes = (size_t)f * 2;
    return 0;
}
static void cpu_destroy(tq_backend *be) {
    tq_cpu_ctx *cx = be->ctx;
    if (cx) tq_dnnl_free(cx->dnnl);
    free(cx);
    be->ctx = NULL;
}

/* ---- the step on the device (backend.h): the plain ops with the values read from the
 * tq_dstep structs, which on the CPU are host memory like everything else ---- */
static int cpu_softmax_ce_dyn(tq_backend *be, int n, int classes, tq_dtype dt, void *dlogits,
                              const void *logits, const int32_t *labels, const tq_dstep_state *st,
                              int accum, float *out) {
    if (!st || accum < 1) {
        tq_backend_seterr(be, "softmax_ce_dyn: %s", !st ? "no step state" : "accum < 1");
        return TQ_EINVAL;
    }
    return tq_cpu_softmax_ce(be, n, classes, dt, dlogits, logits, labels,
                             tq_dstep_grad_scale(st->scale, accum), out);
}
static int cpu_unscale_check_dyn(tq_backend *be, size_t n, float *g, const tq_dstep_state *st,
                                 float *found_inf) {
    if (!st) { tq_backend_seterr(be, "unscale_check_dyn: no step state"); return TQ_EINVAL; }
    return tq_cpu_unscale_check(be, n, g, tq_dstep_inv_scale(st->scale), found_inf);
}
static int cpu_sgd_step_dyn(tq_backend *be, size_t n, float *w, const float *g, float *buf,
                            const tq_dstep_in *in, float momentum, float wd, int nesterov,
                            const float *skip, void *wlow, tq_dtype wdt) {
    if (!in) { tq_backend_seterr(be, "sgd_step_dyn: no step values"); return TQ_EINVAL; }
    return tq_cpu_sgd_step(be, n, w, g, buf, in->lr, momentum, wd, nesterov, skip, wlow, wdt);
}
static int cpu_adamw_step_dyn(tq_backend *be, size_t n, float *w, const float *g, float *m, float *v,
                              const tq_dstep_in *in, const tq_dstep_state *st, float b1, float b2,
                              float eps, float wd, const float *skip, void *wlow, tq_dtype wdt) {
    if (!in || !st) { tq_backend_seterr(be, "adamw_step_dyn: no step values or state"); return TQ_EINVAL; }
    float bc1, bc2;
    tq_dstep_bc(in, st, &bc1, &bc2);
    return tq_cpu_adamw_step(be, n, w, g, m, v, in->lr, b1, b2, eps, wd, bc1, bc2, skip, wlow, wdt);
}
static int cpu_step_end(tq_backend *be, tq_dstep_state *st, const float *found_inf, int fp16,
                        float growth, float backoff, int interval) {
    if (!st) { tq_backend_seterr(be, "step_end: no step state"); return TQ_EINVAL; }
    tq_dstep_end(st, fp16, found_inf && *found_inf != 0.0f, growth, backoff, interval);
    return TQ_OK;
}

/* no graphs on the CPU: the trainer never asks (cuda_graphs applies to CUDA devices) */
static int cpu_graph_begin(tq_backend *be) {
    tq_backend_seterr(be, "graph_begin: CUDA graphs need a CUDA device (the CPU backend has none)");
    return TQ_EINVAL;
}
static int cpu_graph_end(tq_backend *be, int keep, void **graph) {
    if (graph) *graph = NULL;
    if (!keep) return TQ_OK;
    tq_backend_seterr(be, "graph_end: CUDA graphs need a CUDA device (the CPU backend has none)");
    return TQ_EINVAL;
}
static int cpu_graph_launch(tq_backend *be, void *graph) {
    tq_backend_seterr(be, "graph_launch: CUDA graphs need a CUDA device (the CPU backend has none)");
    return TQ_EINVAL;
}
static void cpu_graph_free(tq_backend *be, void *graph) { (void)be; (void)graph; }

/* fetch: the bytes are copied at once (the CPU's ops have run when they return) */
static int cpu_fetch_begin(tq_backend *be, int slot, const void *src, size_t bytes) {
    tq_cpu_ctx *cx = be->ctx;
    if (slot < 0 || slot >= TQ_FETCH_SLOTS || bytes > TQ_FETCH_BYTES || (bytes && !src)) {
        tq_backend_seterr(be, "fetch_begin: bad slot %d or %zu bytes", slot, bytes);
        return TQ_EINVAL;
    }
    if (bytes) memcpy(cx->fetch[slot], src, bytes);
    cx->fetch_ms[slot] = cpu_now_ms(be);
    return TQ_OK;
}
static int cpu_fetch_end(tq_backend *be, int slot, void *dst, size_t bytes, double *t_ms) {
    tq_cpu_ctx *cx = be->ctx;
    if (slot < 0 || slot >= TQ_FETCH_SLOTS || bytes > TQ_FETCH_BYTES || (bytes && !dst)) {
        tq_backend_seterr(be, "fetch_end: bad slot %d or %zu bytes", slot, bytes);
        return TQ_EINVAL;
    }
    if (bytes) memcpy(dst, cx->fetch[slot], bytes);
    if (t_ms) *t_ms = cx->fetch_ms[slot];
    return TQ_OK;
}

static const tq_backend_i cpu_iface = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .to_device = cpu_to_device,
    .to_host = cpu_to_host,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .now_ms = cpu_now_ms,
    .mem_info = cpu_mem_info,
    .destroy = cpu_destroy,
    .conv_ws = tq_cpu_conv_ws,
    .conv_fwd = tq_cpu_conv_fwd,
    .conv_bwd_data = tq_cpu_conv_bwd_data,
    .conv_bwd_filter = tq_cpu_conv_bwd_filter,
    .linear_ws = tq_cpu_linear_ws,
    .linear_fwd = tq_cpu_linear_fwd,
    .linear_bwd_data = tq_cpu_linear_bwd_data,
    .linear_bwd_filter = tq_cpu_linear_bwd_filter,
    .bn_fwd_train = tq_cpu_bn_fwd_train,
    .bn_fwd_infer = tq_cpu_bn_fwd_infer,
    .bn_norm = tq_cpu_bn_norm,
    .bn_bwd = tq_cpu_bn_bwd,
    .relu_fwd = tq_cpu_relu_fwd,
    .relu_bwd = tq_cpu_relu_bwd,
    .add_fwd = tq_cpu_add_fwd,
    .accumulate = tq_cpu_accumulate,
    .maxpool_fwd = tq_cpu_maxpool_fwd,
    .maxpool_bwd = tq_cpu_maxpool_bwd,
    .avgpool_fwd = tq_cpu_avgpool_fwd,
    .avgpool_bwd = tq_cpu_avgpool_bwd,
    .softmax_ce = tq_cpu_softmax_ce,
    .softmax_ce_eval = tq_cpu_softmax_ce_eval,
    .cast = tq_cpu_cast,
    .unscale_check = tq_cpu_unscale_check,
    .sgd_step = tq_cpu_sgd_step,
    .adamw_step = tq_cpu_adamw_step,
    .load_batch = tq_cpu_load_batch,
    .softmax_ce_dyn = cpu_softmax_ce_dyn,
    .unscale_check_dyn = cpu_unscale_check_dyn,
    .sgd_step_dyn = cpu_sgd_step_dyn,
    .adamw_step_dyn = cpu_adamw_step_dyn,
    .step_end = cpu_step_end,
    .graph_begin = cpu_graph_begin,
    .graph_end = cpu_graph_end,
    .graph_launch = cpu_graph_launch,
    .graph_free = cpu_graph_free,
    .fetch_begin = cpu_fetch_begin,
    .fetch_end = cpu_fetch_end,
};

tq_backend *tq_cpu_backend_new(int threads) {
    tq_backend *be = calloc(1, sizeof *be);
    if (!be) return NULL;
    be->i = &cpu_iface;
    be->ctx = calloc(1, sizeof(tq_cpu_ctx));   /* oneDNN state, created on first use */
    if (!be->ctx) {
        free(be);
        return NULL;
    }
    /* GEMMs are threaded by our OpenMP teams (see cpu_conv.c): OpenBLAS itself runs on one
     * thread, always, or its pthread pool and the OpenMP team fight over the cores. */
    openblas_set_num_threads(1);
    if (threads > 0) {
        omp_set_num_threads(threads);
        be->threads = threads;
    } else {
        be->threads = omp_get_max_threads();
    }
    if (be->threads < 1) be->threads = 1;
    return be;
}

void tq_backend_free(tq_backend *be) {
    if (!be) return;
    if (be->i && be->i->destroy) be->i->destroy(be);
    free(be);
}
