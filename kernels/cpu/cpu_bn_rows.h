/* cpu_bn_rows.h — batch-norm's element-wise row kernels and the reductions' block, included by
 * cpu_bn.c (every dtype, built for AVX-512, AVX2 and the baseline), by cpu_bn_bf16.c (bf16 on
 * CPUs with AVX512_BF16) and by cpu_f16c.c (f16 on CPUs with F16C, which runs the f32
 * instances on rows it converts). NAT, a literal: 0 stores each output as tq_st does; 1 (bf16
 * only) writes the row's outputs to an f32 buffer and converts it with BN_BF16_ROW(dst, src,
 * n), which the includer defines: cpu_bn_bf16.c's vcvtne2ps2bf16, bit for bit tq_f32_to_bf16
 * (its denormal lanes go through tq_f32_to_bf16 itself). The emulated rounding had been the
 * bound of the bf16 passes: with a free conversion a resnet20 bf16 step ran 10-12% faster
 * (docs/engine.md).
 * Not a header of its own: no include guard. */

#define FOLD_MIN 64      /* a folded row has at least this many elements (cpu_bn.c, fold_rep) */
#define RED_CB 16        /* channels per reduction task */
#define RED_RB 64        /* rows per f32 partial sum in the reductions */

/* output j of the row at base: stored (NAT 0) or kept in the row buffer T (NAT 1) */
#define BN_OUT(P, T, V)                                 \
    do {                                                \
        if (NAT) (T)[j] = (V);                          \
        else tq_st((P), dt, base + j, (V));             \
    } while (0)

/* y = (x − mu)·is·g + b over rows [r0,r1) of the channel window [c0, c0+cw); with relu,
 * ReLU'd as relu_fwd does, with res, res added to the stored value first (as add_fwd does). */
TQ_ALWAYS_INLINE void norm_rows(tq_dtype dt, int NAT, size_t r0, size_t r1, size_t ld, size_t c0,
                                int cw, void *y, const void *x, const void *res, const float *mu,
                                const float *is, const float *g, const float *b, int relu) {
    float ty[TQ_CGROUP];   /* NAT: the row's outputs before their conversion */
    for (size_t r = r0; r < r1; r++) {
        size_t base = r * ld + c0;
        if (res)
            TQ_SIMD(dt, for (int j = 0; j < cw; j++) {
                float v = tq_round_to(dt, tq_bn_norm(tq_ld(x, dt, base + j), mu[j], is[j], g[j], b[j]));
                v += tq_ld(res, dt, base + j);
                BN_OUT(y, ty, relu && v <= 0.0f ? 0.0f : v);
            });
        else if (relu)
            TQ_SIMD(dt, for (int j = 0; j < cw; j++) {
                float v = tq_bn_norm(tq_ld(x, dt, base + j), mu[j], is[j], g[j], b[j]);
                BN_OUT(y, ty, v <= 0.0f ? 0.0f : v);
            });
        else
            TQ_SIMD(dt, for (int j = 0; j < cw; j++)
                BN_OUT(y, ty, tq_bn_norm(tq_ld(x, dt, base + j), mu[j], is[j], g[j], b[j])););
        if (NAT) BN_BF16_ROW((uint16_t *)y + base, ty, cw);
    }
}

/* dx over rows [r0,r1) of a channel window, given this batch's per-channel sums:
 * dx = bn_dx(g) (+ beta_dx·dx when acc), g = dy, or with mask, relu_bwd(dy) behind a ReLU whose
 * output is ry; with res 1 the add's other gradient dres = g, with res 2 g + beta_res·dres.
 * acc, mask and res are literals (one loop each, every load unconditional: a conditional load
 * keeps GCC from vectorising). */
TQ_ALWAYS_INLINE void bn_dx_rows(tq_dtype dt, int NAT, int acc, int mask, int res, size_t r0, size_t r1,
                                 size_t ld, size_t c0, int cw, void *dx, float beta_dx,
                                 const void *dy, const void *x, const void *ry, void *dres,
                                 float beta_res, const float *mu, const float *is, const float *g,
                                 const float *sdb, const float *sdg, float inv_m) {
    float tdx[TQ_CGROUP], tdr[TQ_CGROUP];   /* NAT: the row's dx and dres before their conversion */
    for (size_t r = r0; r < r1; r++) {
        size_t base = r * ld + c0;
        TQ_SIMD(dt, for (int j = 0; j < cw; j++) {
            float gv = tq_ld(dy, dt, base + j);
            if (mask) gv = tq_ld(ry, dt, base + j) <= 0.0f ? 0.0f : gv;
            float xh = (tq_ld(x, dt, base + j) - mu[j]) * is[j];
            float v = tq_bn_dx(gv, xh, g[j], is[j], sdb[j], sdg[j], inv_m);
            if (acc) v = v + beta_dx * tq_ld(dx, dt, base + j);
            BN_OUT(dx, tdx, v);
            if (res == 1) BN_OUT(dres, tdr, gv);
            if (res == 2) BN_OUT(dres, tdr, gv + beta_res * tq_ld(dres, dt, base + j));
        });
        if (NAT) BN_BF16_ROW((uint16_t *)dx + base, tdx, cw);
        if (NAT && res) BN_BF16_ROW((uint16_t *)dres + base, tdr, cw);
    }
}

/* bn_dx_rows for the dx pass's variants, each a literal: CALL_W(ACC, MASK, RES, W) with W
 * FOLD_MIN (a trip count the compiler knows: a folded row, or 64 channels) or cw */
#define BN_DX_DISPATCH(CALL_W)                                                                \
    do {                                                                                      \
        int acc_ = beta_dx != 0.0f, res_ = !dres ? 0 : beta_res != 0.0f ? 2 : 1;              \
        if (!ry) {                                                                            \
            if (acc_) BN_DX_W_(CALL_W, 1, 0, 0); else BN_DX_W_(CALL_W, 0, 0, 0);              \
        } else if (acc_) {                                                                    \
            if (res_ == 0) BN_DX_W_(CALL_W, 1, 1, 0);                                         \
            else if (res_ == 1) BN_DX_W_(CALL_W, 1, 1, 1);                                    \
            else BN_DX_W_(CALL_W, 1, 1, 2);                                                   \
        } else {                                                                              \
            if (res_ == 0) BN_DX_W_(CALL_W, 0, 1, 0);                                         \
            else if (res_ == 1) BN_DX_W_(CALL_W, 0, 1, 1);                                    \
            else BN_DX_W_(CALL_W, 0, 1, 2);                                                   \
        }                                                                                     \
    } while (0)
#define BN_DX_W_(CALL_W, ACC, MASK, RES)                                                      \
    do {                                                                                      \
        if (cw == FOLD_MIN) CALL_W(ACC, MASK, RES, FOLD_MIN);                                 \
        else CALL_W(ACC, MASK, RES, cw);                                                      \
    } while (0)

/* Sums over rows [r0, r1) of jw channels, jw <= RED_CB: f32 partial sums over RED_RB-row blocks
 * (vectorised over the channels), added into double per block. */
TQ_ALWAYS_INLINE void red_block(tq_dtype dt, tq_red_mode mode, size_t r0, size_t r1, size_t ld,
                                size_t col, int jw, const void *a, const void *b, const void *mk,
                                const float *of, float *f0, float *f1) {
    for (size_t r = r0; r < r1; r++) {
        size_t base = r * ld + col;
        if (mode == TQ_RED_SUM) {
            TQ_SIMD(dt, for (int j = 0; j < jw; j++) f0[j] += tq_ld(a, dt, base + j););
        } else if (mode == TQ_RED_SHSQ) {
            TQ_SIMD(dt, for (int j = 0; j < jw; j++) {
                float d = tq_ld(a, dt, base + j) - of[j];
                f0[j] += d;
                f1[j] += d * d;
            });
        } else if (mode == TQ_RED_DOT) {
            TQ_SIMD(dt, for (int j = 0; j < jw; j++) {
                float va = tq_ld(a, dt, base + j);
                f0[j] += va;
                f1[j] += va * (tq_ld(b, dt, base + j) - of[j]);
            });
        } else {
            TQ_SIMD(dt, for (int j = 0; j < jw; j++) {
                float va = tq_ld(a, dt, base + j), mv = tq_ld(mk, dt, base + j);   /* both loads */
                va = mv <= 0.0f ? 0.0f : va;                                     /* unconditional */
                f0[j] += va;
                f1[j] += va * (tq_ld(b, dt, base + j) - of[j]);
            });
        }
    }
}
