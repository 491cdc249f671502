/* cpu_bn.c — per-channel reductions and batch-norm (NHWC: channels contiguous, M = N·H·W rows).
 *
 * The batch-norm statistics are summed in f32 over blocks of RED_RB rows, the blocks in double;
 * plain sums (bias gradients) in double. Reductions are cut into (row segment × 16-channel block)
 * tasks whose partial sums are combined in a fixed order, so results do not depend on the
 * thread count. Channels are processed in groups of TQ_CGROUP so that every per-channel
 * scratch array is a bounded stack array.
 */
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

#define BN_BF16_ROW(dst, src, n) ((void)(dst), (void)(src), (void)(n))   /* NAT is 0 here */
#include "cpu/cpu_bn_rows.h"

#define RED_SEG_MIN 256  /* rows (folded) a reduction segment has at least */
#define RED_PART 4096    /* partial sums kept on the stack: nseg·lanes <= RED_PART */
#define ROW_BLK 256      /* rows per dtype dispatch in the element passes */

/* A window that spans whole rows (cw == ld, so c0 == 0) is one contiguous run, and `rep` rows of
 * it are one row of cw·rep elements with the per-channel parameters repeated rep times. The
 * passes below loop over such folded rows where channels are few: at a ResNet's first stage
 * (16 channels) a row's vector loop costs more to set up than to run, and the norm, dx and
 * statistics passes were a third of a bf16 step (perf). Element-wise passes compute the same
 * bits either way; the rows m % rep left over run unfolded. Returns rep, 1 for no folding. */
static int fold_rep(size_t ld, int cw, size_t m) {
    int rep = (size_t)cw == ld && cw < FOLD_MIN ? FOLD_MIN / cw : 1;
    return (size_t)rep <= m ? rep : 1;
}

/* dst[k·cw + j] = src[j] for k < rep (dst holds FOLD_MIN floats; cw·rep <= FOLD_MIN) */
static const float *fold_param(float *dst, const float *src, int cw, int rep) {
    if (rep == 1) return src;
    for (int k = 0; k < rep; k++) memcpy(dst + (size_t)k * cw, src, (size_t)cw * sizeof(float));
    return dst;
}

/* jw <= TQ_CGROUP lanes (a group's channels, or a folded row's cw·rep); nat: nat_mode's (below).
 * Each block of RED_RB rows is summed FOLD_MIN lanes at a time, so its rows come from memory
 * once and its later lanes from cache: tasks of 16 channels each, side by side, had read every
 * cache line of a 64-channel row once per task, and the reductions ran at half the memory's
 * speed (a quarter at 256 channels). Each lane's additions are the same either way. */
TQ_ALWAYS_INLINE void red_task(tq_dtype dt, tq_red_mode mode, int nat, size_t r0, size_t r1,
                               size_t ld, size_t col, int jw, const void *a, const void *b,
                               const void *mk, const float *off, double *o0, double *o1) {
    double acc0[TQ_CGROUP], acc1[TQ_CGROUP];
    float of[TQ_CGROUP + FOLD_MIN];   /* zeros past jw: red_block's FOLD_MIN path reads them */
    for (int j = 0; j < jw; j++) { acc0[j] = 0; acc1[j] = 0; }
    for (int j = 0; j < TQ_CGROUP + FOLD_MIN; j++) of[j] = off && j < jw ? off[j] : 0.0f;
    if (mode == TQ_RED_SUM) {
        /* bias gradients (Σ dy with cancellation, added over microbatches): double per row */
        for (size_t r = r0; r < r1; r++) {
            size_t base = r * ld + col;
            TQ_SIMD(dt, for (int j = 0; j < jw; j++) acc0[j] += tq_ld(a, dt, base + j););
        }
        for (int j = 0; j < jw; j++) o0[j] = acc0[j];
        return;
    }
    for (size_t rb = r0; rb < r1; rb += RED_RB) {
        size_t re = r1 - rb < RED_RB ? r1 : rb + RED_RB;
        for (int j0 = 0; j0 < jw; j0 += FOLD_MIN) {
            int w = jw - j0 < FOLD_MIN ? jw - j0 : FOLD_MIN;
            size_t c = col + (size_t)j0;
            const float *o = of + j0;
            float f0[FOLD_MIN], f1[FOLD_MIN];
            for (int j = 0; j < FOLD_MIN; j++) { f0[j] = 0; f1[j] = 0; }
            if (dt == TQ_F16 && nat == 2) tq_cpu_red_block_f16n(mode, rb, re, ld, c, w, a, b, mk, o, f0, f1);
            else if (w == RED_CB) red_block(dt, mode, rb, re, ld, c, RED_CB, a, b, mk, o, f0, f1);
            else if (w == FOLD_MIN) red_block(dt, mode, rb, re, ld, c, FOLD_MIN, a, b, mk, o, f0, f1);
            else red_block(dt, mode, rb, re, ld, c, w, a, b, mk, o, f0, f1);
            for (int j = 0; j < w; j++) { acc0[j0 + j] += f0[j]; acc1[j0 + j] += f1[j]; }
        }
    }
    for (int j = 0; j < jw; j++) {
        o0[j] = acc0[j];
        o1[j] = acc1[j];
    }
}

/* The 16-bit passes with the CPU's own conversions, the same bits: 1, bf16's norm and dx passes
 * take cpu_bn_bf16.c's blocks where the CPU has AVX512_BF16; 2, f16's norm and dx passes and
 * reduction blocks take cpu_f16c.c's where it has F16C; 0, the emulated ones. Asked once a
 * pass, outside its parallel loop. */
static int nat_mode(tq_dtype dt) {
    if (dt == TQ_BF16) return tq_cpu_bf16_native() ? 1 : 0;
    if (dt == TQ_F16) return tq_cpu_f16_native() ? 2 : 0;
    return 0;
}

#define RED_MODE_CALL(DT, mode, ...)                                                  \
    do {                                                                              \
        if ((mode) == TQ_RED_SUM) red_task(DT, TQ_RED_SUM, __VA_ARGS__);              \
        else if ((mode) == TQ_RED_SHSQ) red_task(DT, TQ_RED_SHSQ, __VA_ARGS__);       \
        else if ((mode) == TQ_RED_DOT) red_task(DT, TQ_RED_DOT, __VA_ARGS__);         \
        else red_task(DT, TQ_RED_DOTM, __VA_ARGS__);                                  \
    } while (0)

/* one reduction task; built for AVX-512 and AVX2 too, picked when the program loads (the
 * vectors run across channels, each lane summing its channel's rows in order: the same bits
 * at any width) */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void red_task_any(tq_dtype dt, tq_red_mode mode, int nat, size_t r0, size_t r1, size_t ld,
                         size_t col, int jw, const void *a, const void *b, const void *mk,
                         const float *of, double *o0, double *o1) {
    if (dt == TQ_F32) RED_MODE_CALL(TQ_F32, mode, nat, r0, r1, ld, col, jw, a, b, mk, of, o0, o1);
    else if (dt == TQ_F16) RED_MODE_CALL(TQ_F16, mode, nat, r0, r1, ld, col, jw, a, b, mk, of, o0, o1);
    else RED_MODE_CALL(TQ_BF16, mode, nat, r0, r1, ld, col, jw, a, b, mk, of, o0, o1);
}

/* The row segments of a reduction: as many as the rows allow (RED_SEG_MIN each) and the stack's
 * partial sums hold, from 24, 12, 6, 4, 2 and 1, which the thread counts a machine has divide
 * (the static schedule's shares even, and each thread's rows the ones it gets in the
 * element-wise pass that follows, so those come from its own cache). Fixed by the shape alone,
 * never by the thread count: the sums' order, and so their bits, are the same on any machine.
 * The rule had been a segment per 4096 rows: at resnet20's 28×28×16 stage at batch 64 that
 * made 3 segments, two of them on one of 2 threads, and at 14×14×32 one, its lanes split in
 * halves read from the same cache lines by both threads. */
static size_t red_segments(size_t fm, int lanes) {
    static const int counts[] = { 24, 12, 6, 4, 2 };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        size_t k = (size_t)counts[i];
        if (fm / k >= RED_SEG_MIN && k * (size_t)lanes <= RED_PART) return k;
    }
    return 1;
}

void tq_cpu_chan_sums(tq_backend *be, tq_red_mode mode, size_t m, size_t ld, size_t c0, int cw,
                      tq_dtype dt, const void *a, const void *b, const void *mk, const float *off,
                      double *s0, double *s1) {
    /* folded (see fold_rep): one block of cw·rep lanes, whose rep lanes per channel are added
     * in order at the end; otherwise blocks of RED_CB channels */
    int rep = fold_rep(ld, cw, m);
    float foff[FOLD_MIN];
    const float *poff = off ? fold_param(foff, off, cw, rep) : NULL;
    size_t fm = m / rep, fld = ld * (size_t)rep;
    int lanes = cw * rep;                            /* lanes of the rows the tasks see */
    size_t nseg = red_segments(fm, lanes);
    /* a task per segment with every lane; where there are fewer segments than threads, the
     * lanes split into as many blocks (multiples of RED_CB) as it takes to give each thread a
     * task: no lane's additions depend on it, only on the segments */
    int nt = tq_cpu_nt(be);
    int bw = lanes;                                  /* lanes per task */
    if ((int)nseg < nt) {
        int want = (nt + (int)nseg - 1) / (int)nseg;
        bw = ((lanes + want - 1) / want + RED_CB - 1) / RED_CB * RED_CB;
    }
    int nblk = (lanes + bw - 1) / bw;
    int direct = nseg == 1 && rep == 1;              /* tasks write s0, s1 themselves */
    double part0[RED_PART], part1[RED_PART];
    int ntask = (int)nseg * nblk;
    int par = (double)m * cw > TQ_PAR_MIN && ntask > 1;
    int nat = nat_mode(dt);
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int t = 0; t < ntask; t++) {
        size_t seg = (size_t)(t / nblk);
        int j0 = (t % nblk) * bw;
        int jw = lanes - j0 < bw ? lanes - j0 : bw;
        size_t r0 = fm * seg / nseg, r1 = fm * (seg + 1) / nseg;
        double *o0 = direct ? s0 + j0 : part0 + seg * lanes + j0;
        double *o1 = mode == TQ_RED_SUM ? NULL : direct ? s1 + j0 : part1 + seg * lanes + j0;
        const float *of = poff ? poff + j0 : NULL;
        red_task_any(dt, mode, nat, r0, r1, fld, c0 + (size_t)j0, jw, a, b, mk, of, o0, o1);
    }
    if (!direct) {
        for (int j = 0; j < cw; j++) {
            double t0 = 0, t1 = 0;
            for (size_t sg = 0; sg < nseg; sg++)
                for (int k = 0; k < rep; k++) {
                    t0 += part0[sg * lanes + (size_t)k * cw + j];
                    if (mode != TQ_RED_SUM) t1 += part1[sg * lanes + (size_t)k * cw + j];
                }
            s0[j] = t0;
            if (mode != TQ_RED_SUM) s1[j] = t1;
        }
    }
    if (fm * rep < m) {   /* the rows left over, unfolded, added last */
        double t0[FOLD_MIN], t1[FOLD_MIN];
        red_task_any(dt, mode, nat, fm * rep, m, ld, c0, cw, a, b, mk, off, t0, t1);
        for (int j = 0; j < cw; j++) {
            s0[j] += t0[j];
            if (mode != TQ_RED_SUM) s1[j] += t1[j];
        }
    }
}

void tq_cpu_bias_grad(tq_backend *be, size_t m, int K, tq_dtype dt, const void *dy, float *db) {
    for (int c0 = 0; c0 < K; c0 += TQ_CGROUP) {
        int cw = K - c0 < TQ_CGROUP ? K - c0 : TQ_CGROUP;
        double s0[TQ_CGROUP];
        tq_cpu_chan_sums(be, TQ_RED_SUM, m, (size_t)K, (size_t)c0, cw, dt, dy, NULL, NULL, NULL, s0, NULL);
        for (int j = 0; j < cw; j++) db[c0 + j] += (float)s0[j];
    }
}

/* the normalisation pass is the hottest element-wise loop of a ResNet step (its recomputation
 * included): built for AVX-512 and AVX2 too, the one that runs picked when the program loads.
 * The same C arithmetic (ISO C: no FMA contraction), so the same bits on every machine. */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void norm_block(tq_dtype dt, int nat, size_t r0, size_t r1, size_t ld, size_t c0, int cw,
                       void *y, const void *x, const void *res, const float *mu, const float *is,
                       const float *g, const float *b, int relu) {
    if (nat == 1) {   /* bf16 with AVX512_BF16's conversion (cpu_bn_bf16.c) */
        tq_cpu_norm_block_bf16n(r0, r1, ld, c0, cw, y, x, res, mu, is, g, b, relu);
        return;
    }
    if (nat == 2) {   /* f16 through F16C (cpu_f16c.c) */
        tq_cpu_norm_block_f16n(r0, r1, ld, c0, cw, y, x, res, mu, is, g, b, relu);
        return;
    }
    if (cw == FOLD_MIN)   /* a folded row, or 64 channels: a trip count the compiler knows */
        TQ_DT_CALL(dt, norm_rows, 0, r0, r1, ld, c0, FOLD_MIN, y, x, res, mu, is, g, b, relu);
    else
        TQ_DT_CALL(dt, norm_rows, 0, r0, r1, ld, c0, cw, y, x, res, mu, is, g, b, relu);
}

static void norm_pass(tq_backend *be, tq_dtype dt, size_t m, size_t ld, size_t c0, int cw,
                      void *y, const void *x, const void *res, const float *mu, const float *is,
                      const float *g, const float *b, int relu) {
    int rep = fold_rep(ld, cw, m);
    float fmu[FOLD_MIN], fis[FOLD_MIN], fg[FOLD_MIN], fb[FOLD_MIN];
    const float *pmu = fold_param(fmu, mu, cw, rep), *pis = fold_param(fis, is, cw, rep),
                *pg = fold_param(fg, g, cw, rep), *pb = fold_param(fb, b, cw, rep);
    size_t fm = m / rep, fld = ld * (size_t)rep, blk = ROW_BLK / rep ? ROW_BLK / rep : 1;
    int fcw = cw * rep;
    size_t nrb = (fm + blk - 1) / blk;
    int nt = tq_cpu_nt(be);
    int par = (double)m * cw > TQ_PAR_MIN;
    int nat = nat_mode(dt);
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (size_t rb = 0; rb < nrb; rb++) {
        size_t r0 = rb * blk, r1 = r0 + blk < fm ? r0 + blk : fm;
        norm_block(dt, nat, r0, r1, fld, c0, fcw, y, x, res, pmu, pis, pg, pb, relu);
    }
    if (fm * rep < m)   /* the rows left over, unfolded */
        norm_block(dt, nat, fm * rep, m, ld, c0, cw, y, x, res, mu, is, g, b, relu);
}

static void load_affine(const float *gamma, const float *beta, size_t c0, int cw, float *g,
                        float *b) {
    for (int j = 0; j < cw; j++) {
        g[j] = gamma ? gamma[c0 + j] : 1.0f;
        b[j] = beta ? beta[c0 + j] : 0.0f;
    }
}

int tq_cpu_bn_fwd_train(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *x,
                        const float *gamma, const float *beta, float *save_mean,
                        float *save_invstd, float *run_mean, float *run_var, float momentum,
                        float eps, const void *res, int relu) {
    int rc = tq_cpu_check_shape(be, "bn_fwd_train", s, dt);
    if (rc) return rc;
    size_t m = (size_t)s.n * s.h * s.w, C = (size_t)s.c;
    if (m < 2) {
        tq_backend_seterr(be, "bn_fwd_train: need more than 1 value per channel (N·H·W = %zu)", m);
        return TQ_EINVAL;
    }
    if (!save_mean || !save_invstd) {
        tq_backend_seterr(be, "bn_fwd_train: save_mean/save_invstd missing");
        return TQ_EINVAL;
    }
    double dm = (double)m;
    for (size_t c0 = 0; c0 < C; c0 += TQ_CGROUP) {
        int cw = C - c0 < TQ_CGROUP ? (int)(C - c0) : TQ_CGROUP;
        float off[TQ_CGROUP], is[TQ_CGROUP], g[TQ_CGROUP], b[TQ_CGROUP];
        double s0[TQ_CGROUP], s1[TQ_CGROUP];
        for (int j = 0; j < cw; j++) off[j] = tq_ld(x, dt, c0 + j);   /* shift: row 0 */
        tq_cpu_chan_sums(be, TQ_RED_SHSQ, m, C, c0, cw, dt, x, NULL, NULL, off, s0, s1);
        for (int j = 0; j < cw; j++) {
            double d = s0[j] / dm;
            double mean = (double)off[j] + d;
            double var = s1[j] / dm - d * d;
            if (var < 0) var = 0;
            save_mean[c0 + j] = (float)mean;
            save_invstd[c0 + j] = (float)(1.0 / sqrt(var + (double)eps));
            if (run_mean)
                run_mean[c0 + j] = (1.0f - momentum) * run_mean[c0 + j] + momentum * (float)mean;
            if (run_var)
                run_var[c0 + j] = (1.0f - momentum) * run_var[c0 + j] +
                                  momentum * (float)(var * dm / (dm - 1.0));
            is[j] = save_invstd[c0 + j];
        }
        load_affine(gamma, beta, c0, cw, g, b);
        norm_pass(be, dt, m, C, c0, cw, y, x, res, save_mean + c0, is, g, b, relu);
    }
    return TQ_OK;
}

/* y = epilogue(bn(x)) with given per-channel statistics: 1/σ is `sd` itself, or, with
 * var_eps >= 0, 1/sqrt(sd + var_eps) (sd the running variance). */
static int norm_with(tq_backend *be, const char *op, tq_shape s, tq_dtype dt, void *y,
                     const void *x, const void *res, const float *gamma, const float *beta,
                     const float *mean, const float *sd, float var_eps, int relu) {
    int rc = tq_cpu_check_shape(be, op, s, dt);
    if (rc) return rc;
    if (!mean || !sd) {
        tq_backend_seterr(be, "%s: statistics missing", op);
        return TQ_EINVAL;
    }
    size_t m = (size_t)s.n * s.h * s.w, C = (size_t)s.c;
    for (size_t c0 = 0; c0 < C; c0 += TQ_CGROUP) {
        int cw = C - c0 < TQ_CGROUP ? (int)(C - c0) : TQ_CGROUP;
        float is[TQ_CGROUP], g[TQ_CGROUP], b[TQ_CGROUP];
        for (int j = 0; j < cw; j++) is[j] = var_eps >= 0 ? 1.0f / sqrtf(sd[c0 + j] + var_eps) : sd[c0 + j];
        load_affine(gamma, beta, c0, cw, g, b);
        norm_pass(be, dt, m, C, c0, cw, y, x, res, mean + c0, is, g, b, relu);
    }
    return TQ_OK;
}

int tq_cpu_bn_fwd_infer(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *x,
                        const float *gamma, const float *beta, const float *run_mean,
                        const float *run_var, float eps, const void *res, int relu) {
    return norm_with(be, "bn_fwd_infer", s, dt, y, x, res, gamma, beta, run_mean, run_var, eps, relu);
}

int tq_cpu_bn_norm(tq_backend *be, tq_shape s, tq_dtype dt, void *y, const void *x,
                   const void *res, const float *gamma, const float *beta, const float *mean,
                   const float *invstd, int relu) {
    return norm_with(be, "bn_norm", s, dt, y, x, res, gamma, beta, mean, invstd, -1.0f, relu);
}

/* the dx pass over rows [r0, r1), behind a ReLU when ry is given (dres only then); built for
 * AVX-512 and AVX2 too, like the norm pass */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static void bn_dx_block(tq_dtype dt, int nat, size_t r0, size_t r1, size_t ld, size_t c0, int cw,
                        void *dx, float beta_dx, const void *dy, const void *x, const void *ry,
                        void *dres, float beta_res, const float *mu, const float *is, const float *g,
                        const float *sdb, const float *sdg, float inv_m) {
    if (nat == 1) {   /* as in norm_block */
        tq_cpu_bn_dx_block_bf16n(r0, r1, ld, c0, cw, dx, beta_dx, dy, x, ry, dres, beta_res, mu, is, g,
                                 sdb, sdg, inv_m);
        return;
    }
    if (nat == 2) {
        tq_cpu_bn_dx_block_f16n(r0, r1, ld, c0, cw, dx, beta_dx, dy, x, ry, dres, beta_res, mu, is, g,
                                sdb, sdg, inv_m);
        return;
    }
#define BN_DX_W(ACC, MASK, RES, W)                                                           \
    TQ_DT_CALL(dt, bn_dx_rows, 0, ACC, MASK, RES, r0, r1, ld, c0, W, dx, beta_dx, dy, x, ry, dres, \
               beta_res, mu, is, g, sdb, sdg, inv_m)
    BN_DX_DISPATCH(BN_DX_W);
#undef BN_DX_W
}

int tq_cpu_bn_bwd(tq_backend *be, tq_shape s, tq_dtype dt, void *dx, float beta_dx,
                  float *dgamma, float *dbeta, const void *dy, const void *x, const float *gamma,
                  const float *save_mean, const float *save_invstd, const void *relu_y,
                  void *dres, float beta_dres) {
    int rc = tq_cpu_check_shape(be, "bn_bwd", s, dt);
    if (rc) return rc;
    if (!save_mean || !save_invstd) {
        tq_backend_seterr(be, "bn_bwd: saved statistics missing");
        return TQ_EINVAL;
    }
    if (dres && (!relu_y || !dx)) {
        tq_backend_seterr(be, "bn_bwd: dres needs relu_y and dx (the fused add is behind a ReLU)");
        return TQ_EINVAL;
    }
    size_t m = (size_t)s.n * s.h * s.w, C = (size_t)s.c;
    float inv_m = (float)(1.0 / (double)m);
    int nt = tq_cpu_nt(be);
    for (size_t c0 = 0; c0 < C; c0 += TQ_CGROUP) {
        int cw = C - c0 < TQ_CGROUP ? (int)(C - c0) : TQ_CGROUP;
        float g[TQ_CGROUP], sdb[TQ_CGROUP], sdg[TQ_CGROUP], unused[TQ_CGROUP];
        double s0[TQ_CGROUP], s1[TQ_CGROUP];
        const float *mu = save_mean + c0, *is = save_invstd + c0;
        tq_cpu_chan_sums(be, relu_y ? TQ_RED_DOTM : TQ_RED_DOT, m, C, c0, cw, dt, dy, x, relu_y, mu,
                         s0, s1);
        for (int j = 0; j < cw; j++) {
            sdb[j] = (float)s0[j];
            sdg[j] = (float)(s1[j] * (double)is[j]);
        }
        load_affine(gamma, NULL, c0, cw, g, unused);
        if (dx) {
            int rep = fold_rep(C, cw, m);
            float fmu[FOLD_MIN], fis[FOLD_MIN], fg[FOLD_MIN], fsb[FOLD_MIN], fsg[FOLD_MIN];
            const float *pmu = fold_param(fmu, mu, cw, rep), *pis = fold_param(fis, is, cw, rep),
                        *pg = fold_param(fg, g, cw, rep), *psb = fold_param(fsb, sdb, cw, rep),
                        *psg = fold_param(fsg, sdg, cw, rep);
            size_t fm = m / rep, fld = C * (size_t)rep, blk = ROW_BLK / rep ? ROW_BLK / rep : 1;
            int fcw = cw * rep;
            size_t nrb = (fm + blk - 1) / blk;
            int par = (double)m * cw > TQ_PAR_MIN;
            int nat = nat_mode(dt);
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
            for (size_t rb = 0; rb < nrb; rb++) {
                size_t r0 = rb * blk, r1 = r0 + blk < fm ? r0 + blk : fm;
                bn_dx_block(dt, nat, r0, r1, fld, c0, fcw, dx, beta_dx, dy, x, relu_y, dres, beta_dres,
                            pmu, pis, pg, psb, psg, inv_m);
            }
            if (fm * rep < m)   /* the rows left over, unfolded */
                bn_dx_block(dt, nat, fm * rep, m, C, c0, cw, dx, beta_dx, dy, x, relu_y, dres, beta_dres,
                            mu, is, g, sdb, sdg, inv_m);
        }
        for (int j = 0; j < cw; j++) {
            if (dgamma) dgamma[c0 + j] += sdg[j];
            if (dbeta) dbeta[c0 + j] += sdb[j];
        }
    }
    return TQ_OK;
}
