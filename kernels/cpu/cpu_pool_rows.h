/* cpu_pool_rows.h — max pooling's row kernels (2×2 window, stride 2; cpu_pool.c says what they
 * compute), included by cpu_pool.c (every dtype, built for AVX-512, AVX2 and the baseline) and by
 * cpu_f16c.c (f16 on CPUs with F16C, which runs the f32 instances on rows it converts).
 * Not a header of its own: no include guard. */

/* the window's maximum without branches: m takes v when v > m or v is NaN, so the first
 * maximum in window order wins and a NaN propagates */
TQ_ALWAYS_INLINE float pick(float m, float v) { return (v > m || v != v) ? v : m; }
TQ_ALWAYS_INLINE float max4(float a, float b, float c, float d) {
    return pick(pick(pick(a, b), c), d);
}

TQ_ALWAYS_INLINE float relu_if(int relu, float m) { return relu && m <= 0.0f ? 0.0f : m; }

/* a store of v that is exactly a value of dt (0, or a value loaded from dt): bf16 takes the top
 * half of its bits, what tq_f32_to_bf16's rounding gives there (but for a signalling NaN, which
 * it would quiet and trainq never stores) */
TQ_ALWAYS_INLINE void st_exact(tq_dtype dt, void *p, size_t i, float v) {
    if (dt == TQ_BF16) ((uint16_t *)p)[i] = (uint16_t)(tq_f32_bits(v) >> 16);
    else tq_st(p, dt, i, v);
}

TQ_ALWAYS_INLINE void k_maxpool_row(tq_dtype dt, tq_shape s, int img, int oh, void *y,
                                    const void *x, int relu) {
    int Q = s.w / 2, C = s.c;
    size_t rs = (size_t)s.w * C;
    size_t r0 = ((size_t)img * s.h + 2 * oh) * rs;
    size_t yo = (((size_t)img * (s.h / 2) + oh) * Q) * C;
    for (int q = 0; q < Q; q++) {   /* branch-free over the contiguous channels (vectorised) */
        size_t ia = r0 + (size_t)(2 * q) * C, ib = ia + C, ie = ia + rs, iff = ie + C;
        size_t io = yo + (size_t)q * C;
        TQ_SIMD(dt, for (int c = 0; c < C; c++)
            st_exact(dt, y, io + c, relu_if(relu, max4(tq_ld(x, dt, ia + c), tq_ld(x, dt, ib + c),
                                                       tq_ld(x, dt, ie + c), tq_ld(x, dt, iff + c)))););
    }
}

TQ_ALWAYS_INLINE void mix1(tq_dtype dt, void *dx, size_t i, float beta, float v) {
    if (beta != 0.0f) v += beta * tq_ld(dx, dt, i);
    tq_st(dx, dt, i, v);
}

/* g0_..g3_ = g at the window element max4 picks (v0..v3, first maximum, NaN wins), 0 at the
 * others; branch-free selects so that the channel loop vectorises. t_k: v_k replaces the
 * running maximum, which moves g from the earlier elements to v_k. */
#define WIN_GRAD(v0, v1, v2, v3, g)                                        \
    float m_ = (v0), g0_ = (g), g1_, g2_, g3_;                             \
    int t1 = ((v1) > m_) | ((v1) != (v1));                                 \
    m_ = t1 ? (v1) : m_;                                                   \
    g1_ = t1 ? (g) : 0.0f;                                                 \
    g0_ = t1 ? 0.0f : g0_;                                                 \
    int t2 = ((v2) > m_) | ((v2) != (v2));                                 \
    m_ = t2 ? (v2) : m_;                                                   \
    g2_ = t2 ? (g) : 0.0f;                                                 \
    g1_ = t2 ? 0.0f : g1_;                                                 \
    g0_ = t2 ? 0.0f : g0_;                                                 \
    int t3 = ((v3) > m_) | ((v3) != (v3));                                 \
    g3_ = t3 ? (g) : 0.0f;                                                 \
    g2_ = t3 ? 0.0f : g2_;                                                 \
    g1_ = t3 ? 0.0f : g1_;                                                 \
    g0_ = t3 ? 0.0f : g0_

/* the uncovered last column of input rows r0 and r0 + 1 (an odd width): dx = beta·dx */
TQ_ALWAYS_INLINE void k_maxpool_bwd_lastcol(tq_dtype dt, tq_shape s, size_t r0, void *dx, float beta) {
    size_t rs = (size_t)s.w * s.c;
    if (s.w & 1)
        for (int rr = 0; rr < 2; rr++)
            for (int c = 0; c < s.c; c++) mix1(dt, dx, r0 + rr * rs + (size_t)(s.w - 1) * s.c + c, beta, 0.0f);
}

/* Input rows 2·oh, 2·oh+1 of image img (or the odd last row when 2·oh+1 == h). */
TQ_ALWAYS_INLINE void k_maxpool_bwd_rows(tq_dtype dt, tq_shape s, int img, int oh, void *dx,
                                         float beta, const void *dy, const void *x, int relu) {
    int Q = s.w / 2, C = s.c;
    size_t rs = (size_t)s.w * C;
    size_t r0 = ((size_t)img * s.h + 2 * oh) * rs;
    if (2 * oh + 1 >= s.h) {                       /* uncovered last row */
        for (size_t j = 0; j < rs; j++) mix1(dt, dx, r0 + j, beta, 0.0f);
        return;
    }
    size_t yo = (((size_t)img * (s.h / 2) + oh) * Q) * C;
    for (int q = 0; q < Q; q++) {   /* the argmax of the window, branch-free over the channels */
        size_t ia = r0 + (size_t)(2 * q) * C, ib = ia + C, ie = ia + rs, iff = ie + C;
        size_t ig = yo + (size_t)q * C;
        if (beta == 0.0f)
            TQ_SIMD(dt, for (int c = 0; c < C; c++) {
                float va = tq_ld(x, dt, ia + c), vb = tq_ld(x, dt, ib + c), ve = tq_ld(x, dt, ie + c),
                      vf = tq_ld(x, dt, iff + c), gc = tq_ld(dy, dt, ig + c);
                gc = (relu & (max4(va, vb, ve, vf) <= 0.0f)) ? 0.0f : gc;
                WIN_GRAD(va, vb, ve, vf, gc);
                st_exact(dt, dx, ia + c, g0_);   /* each is gc, a loaded value, or 0 */
                st_exact(dt, dx, ib + c, g1_);
                st_exact(dt, dx, ie + c, g2_);
                st_exact(dt, dx, iff + c, g3_);
            });
        else
            TQ_SIMD(dt, for (int c = 0; c < C; c++) {
                float va = tq_ld(x, dt, ia + c), vb = tq_ld(x, dt, ib + c), ve = tq_ld(x, dt, ie + c),
                      vf = tq_ld(x, dt, iff + c), gc = tq_ld(dy, dt, ig + c);
                gc = (relu & (max4(va, vb, ve, vf) <= 0.0f)) ? 0.0f : gc;
                WIN_GRAD(va, vb, ve, vf, gc);
                tq_st(dx, dt, ia + c, g0_ + beta * tq_ld(dx, dt, ia + c));
                tq_st(dx, dt, ib + c, g1_ + beta * tq_ld(dx, dt, ib + c));
                tq_st(dx, dt, ie + c, g2_ + beta * tq_ld(dx, dt, ie + c));
                tq_st(dx, dt, iff + c, g3_ + beta * tq_ld(dx, dt, iff + c));
            });
    }
    k_maxpool_bwd_lastcol(dt, s, r0, dx, beta);
}
