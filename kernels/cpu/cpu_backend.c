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

static void cpu_memset0(tq_backend *be, void *p, size_t bytes) { if (bytes) memset(p, 0, bytes); }
static void cpu_copy(tq_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
}
static void cpu_sync(tq_backend *be) { (void)be; }
static double cpu_now_ms(tq_backend *be) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cpu_mem_info(tq_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be; *free_bytes = *total_bytes = 0;
    return -1;
}
static void cpu_destroy(tq_backend *be) {
    tq_cpu_ctx *cx = be->ctx;
    if (cx) tq_dnnl_free(cx->dnnl);
    free(cx);
    be->ctx = NULL;
}

static const tq_backend_i cpu_iface = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
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
