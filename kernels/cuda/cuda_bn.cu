/* cuda_bn.cu — per-channel reductions, batch-norm (train / infer / backward) and the bias
 * gradient helper of the CUDA backend. NHWC: M = N·H·W rows of C contiguous channels.
 *
 * Contract (same semantics as kernels/cpu/cpu_bn.c)
 * - Reductions are deterministic two-pass: pass 1 (k_chan_red) runs a (channel tiles × row
 *   chunks) grid, each thread sums its rows in f32 over runs of RED_RB rows and adds those runs
 *   in double, the block adds its row lanes in a fixed tree order (double) and writes one
 *   partial per (chunk, channel) into tqc(be)->scratch; pass 2 (one thread per channel) adds
 *   the chunk partials in chunk order in double and finishes the statistics. No atomics: a run
 *   is bit-reproducible, and the geometry depends only on (M, C).
 * - Variance: shifted sums exactly as the CPU (shift = row 0 of x): mean = off + Σd/M,
 *   var = Σd²/M − (Σd/M)² in double, clamped at 0; save_invstd = 1/sqrt(var + eps) in double;
 *   running mean/var updated in f32 with the unbiased variance, as cpu_bn.c does.
 * - Element passes run a (channel tiles × row chunks) grid with the per-channel parameters in
 *   registers; loads and stores are coalesced along C. beta_dx == 0 never reads dx.
 * - Scratch layout: [aux: 4 × Cpad floats][partials: 2 × G × C doubles], checked against
 *   TQC_SCRATCH_BYTES; a channel count too large for it is TQ_EINVAL.
 * - Errors: TQ_EINVAL with the op and argument named; launch failures TQ_EDEVICE.
 */
#include "cuda/cuda_kern.cuh"

#define RED_RB 16               /* rows per f32 run inside a thread */
#define RED_ROWS_PER_THREAD 32  /* target rows per thread in pass 1 */
#define RED_MAX_CHUNKS 4096

enum { RED_SUM = 0, RED_SHSQ = 1, RED_DOT = 2 };

typedef struct {
    float *aux;          /* 4 × cpad floats */
    size_t cpad;
    double *p0, *p1;     /* G × C each */
    unsigned gy;         /* row chunks of pass 1 */
    tqc_ctile t;
} red_plan;

/* Plans pass 1 for m rows × C channels; 0 or TQ_EINVAL when the scratch cannot hold it. */
static int red_plan_of(tq_backend *be, const char *op, size_t m, int C, red_plan *p) {
    p->t = tqc_ctile_of(C);
    p->cpad = ((size_t)C + 63) / 64 * 64;
    size_t aux_bytes = 4 * p->cpad * sizeof(float);
    size_t per_chunk = 2 * (size_t)C * sizeof(double);
    if (aux_bytes + per_chunk > TQC_SCRATCH_BYTES) {
        tq_backend_seterr(be, "%s: %d channels do not fit the %zu-byte reduction scratch", op, C,
                          (size_t)TQC_SCRATCH_BYTES);
        return TQ_EINVAL;
    }
    size_t rows_per_block = (size_t)p->t.rl * RED_ROWS_PER_THREAD;
    size_t gy = (m + rows_per_block - 1) / rows_per_block;
    size_t cap = (TQC_SCRATCH_BYTES - aux_bytes) / per_chunk;
    if (cap > RED_MAX_CHUNKS) cap = RED_MAX_CHUNKS;
    if (gy > cap) gy = cap;
    if (gy < 1) gy = 1;
    p->gy = (unsigned)gy;
    char *s = (char *)tqc(be)->scratch;
    p->aux = (float *)s;
    p->p0 = (double *)(s + aux_bytes);
    p->p1 = p->p0 + gy * (size_t)C;
    return TQ_OK;
}

/* Pass 1. MODE SUM: p0 = Σa. SHSQ: d = a − a[row 0], p0 = Σd, p1 = Σd². DOT: p0 = Σa,
 * p1 = Σa·(b − off[c]), with a taken as 0 where mk <= 0 when mk is given (the gradient behind
 * a ReLU, relu_bwd's mask). Block (x, y) covers channels [x·tc, x·tc+tc) and rows
 * [m·y/G, m·(y+1)/G). */
template <int DT, int MODE>
__global__ void __launch_bounds__(TQC_RED_THREADS)
k_chan_red(size_t m, int C, int tc, const void *a, const void *b, const void *mk,
           const float *off, double *p0, double *p1) {
    __shared__ double s0[TQC_RED_THREADS], s1[TQC_RED_THREADS];
    const int tid = threadIdx.x, lane = tid & (tc - 1), rl = tid / tc, RL = TQC_RED_THREADS / tc;
    const int c = blockIdx.x * tc + lane;
    const size_t G = gridDim.y, y = blockIdx.y;
    const size_t r0 = m * y / G, r1 = m * (y + 1) / G;
    double d0 = 0.0, d1 = 0.0;
    if (c < C) {
        float of = 0.0f;
        if (MODE == RED_SHSQ) of = ldx<DT>(a, (size_t)c);
        else if (MODE == RED_DOT) of = off[c];
        float f0 = 0.0f, f1 = 0.0f;
        int cnt = 0;
        for (size_t r = r0 + rl; r < r1; r += RL) {
            size_t i = r * C + c;
            float va = ldx<DT>(a, i);
            if (MODE == RED_SUM) {
                f0 += va;
            } else if (MODE == RED_SHSQ) {
                float d = va - of;
                f0 += d;
                f1 += d * d;
            } else {
                if (mk && ldx<DT>(mk, i) <= 0.0f) va = 0.0f;
                f0 += va;
                f1 += va * (ldx<DT>(b, i) - of);
            }
            if (++cnt == RED_RB) {
                d0 += f0; d1 += f1;
                f0 = 0.0f; f1 = 0.0f; cnt = 0;
            }
        }
        d0 += f0; d1 += f1;
    }
    s0[tid] = d0;
    s1[tid] = d1;
    __syncthreads();
    for (int st = RL / 2; st > 0; st >>= 1) {
        if (rl < st) {
            s0[tid] += s0[tid + st * tc];
            if (MODE != RED_SUM) s1[tid] += s1[tid + st * tc];
        }
        __syncthreads();
    }
    if (rl == 0 && c < C) {
        p0[y * C + c] = s0[tid];
        if (MODE != RED_SUM) p1[y * C + c] = s1[tid];
    }
}

template <int MODE>
static int launch_red(tq_backend *be, tq_dtype dt, size_t m, int C, const void *a, const void *b,
                      const void *mk, const float *off, const red_plan *p) {
    dim3 grid(p->t.gx, p->gy);
    TQC_DT_SWITCH(dt, DT, (k_chan_red<DT, MODE><<<grid, TQC_RED_THREADS, 0, tqc(be)->stream>>>(
                              m, C, p->t.tc, a, b, mk, off, p->p0, p->p1)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

/* Pass 2 of the statistics: one thread per channel, chunks added in order. */
template <int DT>
__global__ void k_bn_stats_fin(int C, unsigned G, size_t m, const void *x, const double *p0,
                               const double *p1, float *save_mean, float *save_invstd,
                               float *run_mean, float *run_var, float momentum, float eps) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t0 = 0.0, t1 = 0.0;
    for (unsigned y = 0; y < G; y++) {
        t0 += p0[(size_t)y * C + c];
        t1 += p1[(size_t)y * C + c];
    }
    double dm = (double)m;
    double d = t0 / dm;
    double mean = (double)ldx<DT>(x, (size_t)c) + d;
    double var = t1 / dm - d * d;
    if (var < 0) var = 0;
    save_mean[c] = (float)mean;
    save_invstd[c] = (float)(1.0 / sqrt(var + (double)eps));
    if (run_mean) run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * (float)mean;
    if (run_var)
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * (float)(var * dm / (dm - 1.0));
}

/* y = (x − mu)·is·g + b; with res, res added to the stored value (as add_fwd does); with relu,
 * ReLU'd as relu_fwd does; g, b may be NULL (1, 0). */
template <int DT>
__global__ void __launch_bounds__(TQC_RED_THREADS)
k_bn_norm(size_t m, int C, int tc, void *y, const void *x, const void *res, const float *mu,
          const float *is, const float *gamma, const float *beta, int relu) {
    const int tid = threadIdx.x, lane = tid & (tc - 1), rl = tid / tc, RL = TQC_RED_THREADS / tc;
    const int c = blockIdx.x * tc + lane;
    if (c >= C) return;
    const float mc = mu[c], ic = is[c], gc = gamma ? gamma[c] : 1.0f, bc = beta ? beta[c] : 0.0f;
    const size_t step = (size_t)gridDim.y * RL;
    for (size_t r = (size_t)blockIdx.y * RL + rl; r < m; r += step) {
        size_t i = r * C + c;
        float v = tq_bn_norm(ldx<DT>(x, i), mc, ic, gc, bc);
        if (res) v = tq_round_to((tq_dtype)DT, v) + ldx<DT>(res, i);
        stx<DT>(y, i, relu && v <= 0.0f ? 0.0f : v);
    }
}

static int launch_norm(tq_backend *be, tq_dtype dt, size_t m, int C, void *y, const void *x,
                       const float *mu, const float *is, const float *gamma, const float *beta,
                       int relu, const void *res) {
    tqc_ctile t = tqc_ctile_of(C);
    dim3 grid(t.gx, tqc_rows_grid(m, t));
    TQC_DT_SWITCH(dt, DT, (k_bn_norm<DT><<<grid, TQC_RED_THREADS, 0, tqc(be)->stream>>>(
                              m, C, t.tc, y, x, res, mu, is, gamma, beta, relu)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

extern "C" int tqc_bn_fwd_train(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *x,
                                const float *gamma, const float *beta, float *save_mean,
                                float *save_invstd, float *run_mean, float *run_var,
                                float momentum, float eps, const void *res, int relu) {
    const char *op = "bn_fwd_train";
    int rc = tqc_check_shape(be, op, s, dt);
    if (rc) return rc;
    size_t m = (size_t)s.n * s.h * s.w;
    if (m < 2) {
        tq_backend_seterr(be, "%s: need more than 1 value per channel (N·H·W = %zu)", op, m);
        return TQ_EINVAL;
    }
    TQC_NEED(be, op, save_mean);
    TQC_NEED(be, op, save_invstd);
    TQC_NEED(be, op, x);
    TQC_NEED(be, op, y);
    red_plan p;
    if ((rc = red_plan_of(be, op, m, s.c, &p))) return rc;
    if ((rc = launch_red<RED_SHSQ>(be, dt, m, s.c, x, NULL, NULL, NULL, &p))) return rc;
    unsigned fb = (unsigned)((s.c + 127) / 128);
    TQC_DT_SWITCH(dt, DT, (k_bn_stats_fin<DT><<<fb, 128, 0, tqc(be)->stream>>>(
                              s.c, p.gy, m, x, p.p0, p.p1, save_mean, save_invstd, run_mean,
                              run_var, momentum, eps)));
    TQC_LAUNCH_CHECK(be);
    return launch_norm(be, dt, m, s.c, y, x, save_mean, save_invstd, gamma, beta, relu, res);
}

__global__ void k_infer_is(int C, const float *run_var, float eps, float *is) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) is[c] = 1.0f / sqrtf(run_var[c] + eps);
}

extern "C" int tqc_bn_fwd_infer(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *x,
                                const float *gamma, const float *beta, const float *run_mean,
                                const float *run_var, float eps, const void *res, int relu) {
    const char *op = "bn_fwd_infer";
    int rc = tqc_check_shape(be, op, s, dt);
    if (rc) return rc;
    if (!run_mean || !run_var) {
        tq_backend_seterr(be, "%s: running statistics missing", op);
        return TQ_EINVAL;
    }
    TQC_NEED(be, op, x);
    TQC_NEED(be, op, y);
    size_t m = (size_t)s.n * s.h * s.w;
    red_plan p;
    if ((rc = red_plan_of(be, op, m, s.c, &p))) return rc;
    k_infer_is<<<(unsigned)((s.c + 127) / 128), 128, 0, tqc(be)->stream>>>(s.c, run_var, eps, p.aux);
    TQC_LAUNCH_CHECK(be);
    return launch_norm(be, dt, m, s.c, y, x, run_mean, p.aux, gamma, beta, relu, res);
}

extern "C" int tqc_bn_norm(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *x,
                           const void *res, const float *gamma, const float *beta, const float *mean,
                           const float *invstd, int relu) {
    const char *op = "bn_norm";
    int rc = tqc_check_shape(be, op, s, dt);
    if (rc) return rc;
    TQC_NEED(be, op, mean);
    TQC_NEED(be, op, invstd);
    TQC_NEED(be, op, x);
    TQC_NEED(be, op, y);
    return launch_norm(be, dt, (size_t)s.n * s.h * s.w, s.c, y, x, mean, invstd, gamma, beta, relu,
                       res);
}

/* sdb = Σdy, sdg = Σdy·(x − mu)·is (f32 as the CPU rounds them), added into dgamma/dbeta and
 * kept in aux for the dx pass. */
__global__ void k_bn_bwd_fin(int C, unsigned G, const double *p0, const double *p1,
                             const float *is, float *sdb_out, float *sdg_out, float *dgamma,
                             float *dbeta) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t0 = 0.0, t1 = 0.0;
    for (unsigned y = 0; y < G; y++) {
        t0 += p0[(size_t)y * C + c];
        t1 += p1[(size_t)y * C + c];
    }
    float sdb = (float)t0, sdg = (float)(t1 * (double)is[c]);
    sdb_out[c] = sdb;
    sdg_out[c] = sdg;
    if (dgamma) dgamma[c] += sdg;
    if (dbeta) dbeta[c] += sdb;
}

/* dx = bn_dx(g) + beta_dx·dx with g = dy, or relu_bwd(dy, ry) behind a ReLU; with dres, also
 * dres = g + beta_res·dres (the add's other input). */
template <int DT, int ACC>
__global__ void __launch_bounds__(TQC_RED_THREADS)
k_bn_dx(size_t m, int C, int tc, void *dx, float beta_dx, const void *dy, const void *x,
        const float *mu, const float *is, const float *gamma, const float *sdb, const float *sdg,
        float inv_m, const void *ry, void *dres, float beta_res) {
    const int tid = threadIdx.x, lane = tid & (tc - 1), rl = tid / tc, RL = TQC_RED_THREADS / tc;
    const int c = blockIdx.x * tc + lane;
    if (c >= C) return;
    const float mc = mu[c], ic = is[c], gc = gamma ? gamma[c] : 1.0f, db = sdb[c], dg = sdg[c];
    const size_t step = (size_t)gridDim.y * RL;
    for (size_t r = (size_t)blockIdx.y * RL + rl; r < m; r += step) {
        size_t i = r * C + c;
        float xh = (ldx<DT>(x, i) - mc) * ic;
        float gv = ldx<DT>(dy, i);
        if (ry && ldx<DT>(ry, i) <= 0.0f) gv = 0.0f;
        float v = tq_bn_dx(gv, xh, gc, ic, db, dg, inv_m);
        if (ACC) v = v + beta_dx * ldx<DT>(dx, i);
        stx<DT>(dx, i, v);
        if (dres) stx<DT>(dres, i, beta_res != 0.0f ? gv + beta_res * ldx<DT>(dres, i) : gv);
    }
}

extern "C" int tqc_bn_bwd(tq_backend *be, tq_shape s, tq_dtype dt, void *dx, float beta_dx,
                          float *dgamma, float *dbeta, const void *dy, const void *x,
                          const float *gamma, const float *save_mean, const float *save_invstd,
                          const void *relu_y, void *dres, float beta_dres) {
    const char *op = "bn_bwd";
    int rc = tqc_check_shape(be, op, s, dt);
    if (rc) return rc;
    if (!save_mean || !save_invstd) {
        tq_backend_seterr(be, "%s: saved statistics missing", op);
        return TQ_EINVAL;
    }
    TQC_NEED(be, op, dy);
    TQC_NEED(be, op, x);
    if (dres && (!relu_y || !dx)) {
        tq_backend_seterr(be, "%s: dres needs relu_y and dx (the fused add is behind a ReLU)", op);
        return TQ_EINVAL;
    }
    size_t m = (size_t)s.n * s.h * s.w;
    int C = s.c;
    red_plan p;
    if ((rc = red_plan_of(be, op, m, C, &p))) return rc;
    float *sdb = p.aux, *sdg = p.aux + p.cpad;
    if ((rc = launch_red<RED_DOT>(be, dt, m, C, dy, x, relu_y, save_mean, &p))) return rc;
    k_bn_bwd_fin<<<(unsigned)((C + 127) / 128), 128, 0, tqc(be)->stream>>>(
        C, p.gy, p.p0, p.p1, save_invstd, sdb, sdg, dgamma, dbeta);
    TQC_LAUNCH_CHECK(be);
    if (!dx) return TQ_OK;
    float inv_m = (float)(1.0 / (double)m);
    tqc_ctile t = tqc_ctile_of(C);
    dim3 grid(t.gx, tqc_rows_grid(m, t));
    cudaStream_t st = tqc(be)->stream;
    if (beta_dx == 0.0f)
        TQC_DT_SWITCH(dt, DT, (k_bn_dx<DT, 0><<<grid, TQC_RED_THREADS, 0, st>>>(
                                  m, C, t.tc, dx, 0.0f, dy, x, save_mean, save_invstd, gamma,
                                  sdb, sdg, inv_m, relu_y, dres, beta_dres)));
    else
        TQC_DT_SWITCH(dt, DT, (k_bn_dx<DT, 1><<<grid, TQC_RED_THREADS, 0, st>>>(
                                  m, C, t.tc, dx, beta_dx, dy, x, save_mean, save_invstd, gamma,
                                  sdb, sdg, inv_m, relu_y, dres, beta_dres)));
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}

/* ---- bias gradient: db[k] += Σ_rows dy[row][k] ---- */

__global__ void k_bias_fin(int C, unsigned G, const double *p0, float *db) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t0 = 0.0;
    for (unsigned y = 0; y < G; y++) t0 += p0[(size_t)y * C + c];
    db[c] += (float)t0;
}

extern "C" int tqc_bias_grad(tq_backend *be, size_t rows, int k, tq_dtype dt, float *db,
                             const void *dy) {
    const char *op = "bias_grad";
    int rc = tqc_check_dt(be, op, "dt", dt);
    if (rc) return rc;
    if (k <= 0) {
        tq_backend_seterr(be, "%s: bad channel count k=%d", op, k);
        return TQ_EINVAL;
    }
    if (rows == 0) return TQ_OK;
    TQC_NEED(be, op, db);
    TQC_NEED(be, op, dy);
    red_plan p;
    if ((rc = red_plan_of(be, op, rows, k, &p))) return rc;
    if ((rc = launch_red<RED_SUM>(be, dt, rows, k, dy, NULL, NULL, NULL, &p))) return rc;
    k_bias_fin<<<(unsigned)((k + 127) / 128), 128, 0, tqc(be)->stream>>>(k, p.gy, p.p0, db);
    TQC_LAUNCH_CHECK(be);
    return TQ_OK;
}
