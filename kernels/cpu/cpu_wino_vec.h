/* cpu_wino_vec.h — the Winograd kernels of cpu_wino.c at one vector width: included there
 * twice, with WV 8 (AVX2) and 16 (AVX-512), and with the macros it uses:
 *   WV            channels per register;  W(name)  name_WV
 *   VT            the register type;      WIN, WFN  inline / out-of-line with its target
 *   VLD, VST      unaligned f32 load and store;  VLDT, VSTT  the same in the data's type
 *   VADD, VSUB, VMUL, VFMA, VSET1, VZERO, VBCAST (a float broadcast from memory)
 * Every output channel is its own lane, so the arithmetic of a lane, and the order of every
 * sum, is the same at both widths: the same bits. Not a header of its own: no include guard.
 */
/* ---- transforms of WV channels ---- */

/* Bᵀ d B of a 4×4 tile (d row-major, v[4a+b]) */
WIN void W(in_tf)(const VT d[16], VT v[16]) {
    VT t[16];
    WUNROLL(16)
    for (int b = 0; b < 4; b++) {
        t[0 + b] = VSUB(d[0 + b], d[8 + b]);
        t[4 + b] = VADD(d[4 + b], d[8 + b]);
        t[8 + b] = VSUB(d[8 + b], d[4 + b]);
        t[12 + b] = VSUB(d[4 + b], d[12 + b]);
    }
    WUNROLL(16)
    for (int a = 0; a < 4; a++) {
        const VT *r = t + 4 * a;
        v[4 * a + 0] = VSUB(r[0], r[2]);
        v[4 * a + 1] = VADD(r[1], r[2]);
        v[4 * a + 2] = VSUB(r[2], r[1]);
        v[4 * a + 3] = VSUB(r[1], r[3]);
    }
}

/* F(4×4, 3×3) (6×6 tiles): Bᵀ of the 6 values d[0], d[s], …, d[5s] into o[0], o[os], …, o[5os] */
WIN void W(bt6)(const VT *d, int s, VT *o, int os) {
    const VT d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
    const VT u42 = VSUB(d4, d2), u31 = VSUB(d3, d1);
    o[0] = VFMA(VSET1(-5.0f), d2, VFMA(VSET1(4.0f), d0, d4));
    o[os] = VFMA(VSET1(-4.0f), VADD(d1, d2), VADD(d3, d4));
    o[2 * os] = VFMA(VSET1(4.0f), VSUB(d1, d2), VSUB(d4, d3));
    o[3 * os] = VFMA(VSET1(2.0f), u31, u42);
    o[4 * os] = VFMA(VSET1(-2.0f), u31, u42);
    o[5 * os] = VFMA(VSET1(-5.0f), d3, VFMA(VSET1(4.0f), d1, d5));
}

/* Bᵀ d B of a 6×6 tile (d row-major, v[6a+b]): the columns, then the rows */
WIN void W(in_tf6)(const VT d[36], VT v[36]) {
    VT t[36];
    WUNROLL(16)
    for (int b = 0; b < 6; b++) W(bt6)(d + b, 6, t + b, 6);
    WUNROLL(16)
    for (int a = 0; a < 6; a++) W(bt6)(t + 6 * a, 1, v + 6 * a, 1);
}

/* the A×A tile of x at (row y0, column x0) of the image at element img, channels c..c+WV−1;
 * zeros outside (A = 4 or 6, a constant where it is inlined) */
WIN void W(load_tile)(const wgeom *g, const void *x, size_t img, int y0, int x0, int c, int A,
                      VT *d) {
    const size_t rs = (size_t)g->w * g->ci;
    const int dt = g->dt;
    if (y0 >= 0 && x0 >= 0 && y0 + A <= g->h && x0 + A <= g->w) {
        const size_t p = img + (size_t)y0 * rs + (size_t)x0 * g->ci + c;
        WUNROLL(16)
        for (int a = 0; a < A; a++)
            WUNROLL(16)
            for (int b = 0; b < A; b++) d[A * a + b] = VLDT(x, p + a * rs + (size_t)b * g->ci, dt);
        return;
    }
    WUNROLL(16)
    for (int a = 0; a < A; a++) {
        int yy = y0 + a;
        WUNROLL(16)
        for (int b = 0; b < A; b++) {
            int xx = x0 + b;
            d[A * a + b] = yy >= 0 && yy < g->h && xx >= 0 && xx < g->w
                               ? VLDT(x, img + (size_t)yy * rs + (size_t)xx * g->ci + c, dt)
                               : VZERO();
        }
    }
}

/* input_block's body for tiles of m×m outputs (m 2 or 4, a constant where it is inlined) */
WIN void W(input_tiles)(const wgeom *g, const void *x, size_t t0, int cnt, float *V, int m) {
    const int A = m + 2, E = A * A;
    const size_t plane = (size_t)g->tb * g->ci;
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        const size_t img = (size_t)n * g->h * g->w * g->ci;
        for (int c = 0; c < g->ci; c += WV) {
            VT d[36], v[36];
            W(load_tile)(g, x, img, m * ty - g->pad, m * tx - g->pad, c, A, d);
            if (m == 2) W(in_tf)(d, v);
            else W(in_tf6)(d, v);
            float *o = V + (size_t)i * g->ci + c;
            WUNROLL(36)
            for (int e = 0; e < E; e++) VST(o + e * plane, v[e]);
        }
    }
    int pad_to = (cnt + MR - 1) / MR * MR;
    for (int e = 0; e < E; e++)
        memset(V + e * plane + (size_t)cnt * g->ci, 0,
               (size_t)(pad_to - cnt) * g->ci * sizeof(float));
}

/* the input transform of tiles [t0, t0+cnt) into V[E][tb][ci] (E = 16 or 36 products per tile);
 * rows cnt..tb−1 zeroed up to the next multiple of MR (the GEMM reads them) */
WFN static void W(input_block)(const wgeom *g, const void *x, size_t t0, int cnt, float *V) {
    if (g->m == 2) W(input_tiles)(g, x, t0, cnt, V, 2);
    else W(input_tiles)(g, x, t0, cnt, V, 4);
}

/* U[e] (ci × co) is packed in column strips of 2·WV (the last one WV wide when co is an odd
 * number of registers), each strip's rows one after the other: the GEMM below reads a strip
 * front to back. Row-major (rows co floats apart), a strip's two registers a row were 2 KB
 * apart at 512 channels, which the prefetchers did not follow: the GEMM of a resnet18 4×4×512
 * forward call ran at 35 GFLOP/s a core. The place of element (r, j) in that layout: */
WIN size_t W(upos)(int ci, int co, int r, int j) {
    const int k0 = j / (2 * WV) * (2 * WV), ws = co - k0 < 2 * WV ? co - k0 : 2 * WV;
    return (size_t)k0 * ci + (size_t)r * ws + (size_t)(j - k0);
}

/* rows [0, nr) of a GEMM block × one register of outputs at column k; nr a constant, MR or 2·MR:
 * 12 accumulators, as many as the two-register loop has (6 chains of FMAs do not hide their
 * latency on two FMA ports) */
WIN void W(gemm_col1)(int nr, int ci, int co, const float *a, const float *U, float *m, int k) {
    VT acc[2 * MR];
    WUNROLL(16)
    for (int i = 0; i < nr; i++) acc[i] = VZERO();
    const float *b = U + (size_t)k * ci;   /* the last strip, WV wide (upos) */
    for (int c = 0; c < ci; c++, b += WV) {
        VT b0 = VLD(b);
        WUNROLL(16)
        for (int i = 0; i < nr; i++) acc[i] = VFMA(VBCAST(a + (size_t)i * ci + c), b0, acc[i]);
    }
    WUNROLL(16)
    for (int i = 0; i < nr; i++) VST(m + (size_t)i * co + k, acc[i]);
}

/* M[rows][co] = V[rows][ci] · U[ci][co] (U packed: upos) for rows a multiple of MR (co a
 * multiple of WV): pairs of registers of outputs over MR rows, then a last single register over
 * 2·MR rows. Each output is one chain of FMAs over c in order, however the block is cut. */
WIN void W(gemm_block_ci)(int rows, int ci, int co, const float *V, const float *U, float *M) {
    const int k2 = co / (2 * WV) * (2 * WV);
    for (int r0 = 0; r0 < rows; r0 += MR) {
        const float *a = V + (size_t)r0 * ci;
        float *m = M + (size_t)r0 * co;
        for (int k = 0; k < k2; k += 2 * WV) {
            VT acc[MR][2];
            WUNROLL(16)
            for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = VZERO();
            const float *b = U + (size_t)k * ci;   /* its strip (upos) */
            for (int c = 0; c < ci; c++, b += 2 * WV) {
                VT b0 = VLD(b), b1 = VLD(b + WV);
                WUNROLL(16)
                for (int i = 0; i < MR; i++) {
                    VT av = VBCAST(a + (size_t)i * ci + c);
                    acc[i][0] = VFMA(av, b0, acc[i][0]);
                    acc[i][1] = VFMA(av, b1, acc[i][1]);
                }
            }
            WUNROLL(16)
            for (int i = 0; i < MR; i++) {
                VST(m + (size_t)i * co + k, acc[i][0]);
                VST(m + (size_t)i * co + k + WV, acc[i][1]);
            }
        }
    }
    if (k2 < co) {
        int r0 = 0;
        for (; r0 + 2 * MR <= rows; r0 += 2 * MR)
            W(gemm_col1)(2 * MR, ci, co, V + (size_t)r0 * ci, U, M + (size_t)r0 * co, k2);
        for (; r0 < rows; r0 += MR)
            W(gemm_col1)(MR, ci, co, V + (size_t)r0 * ci, U, M + (size_t)r0 * co, k2);
    }
}

/* gemm_block with ResNet's channel counts as constants: the rows' broadcasts then address off
 * one register (a + i·ci + c: with ci a variable each row needs its own index register, and
 * at 12 rows the loop spilled them) */
WFN static void W(gemm_block)(int rows, int ci, int co, const float *V, const float *U, float *M) {
    switch (ci) {
    case 16: W(gemm_block_ci)(rows, 16, co, V, U, M); break;
    case 32: W(gemm_block_ci)(rows, 32, co, V, U, M); break;
    case 64: W(gemm_block_ci)(rows, 64, co, V, U, M); break;
    default: W(gemm_block_ci)(rows, ci, co, V, U, M);
    }
}

/* F(4×4, 3×3): Aᵀ of the 6 values m[0], m[s], …, m[5s] into o[0], o[os], …, o[3os] */
WIN void W(at6)(const VT *m, int s, VT *o, int os) {
    const VT s12 = VADD(m[s], m[2 * s]), d12 = VSUB(m[s], m[2 * s]);
    const VT s34 = VADD(m[3 * s], m[4 * s]), d34 = VSUB(m[3 * s], m[4 * s]);
    o[0] = VADD(VADD(m[0], s12), s34);
    o[os] = VFMA(VSET1(2.0f), d34, d12);
    o[2 * os] = VFMA(VSET1(4.0f), s34, s12);
    o[3 * os] = VADD(VFMA(VSET1(8.0f), d34, d12), m[5 * s]);
}

/* Aᵀ m A + bias of one tile's products m (E of them) into its m×m outputs o[m·a + b] */
WIN void W(out_tf)(const VT *m, VT bv, int mt, VT *o) {
    if (mt == 2) {
        VT u[8];
        WUNROLL(16)
        for (int b = 0; b < 4; b++) {   /* Aᵀ m: rows 0, 1 */
            u[b] = VADD(VADD(m[b], m[4 + b]), m[8 + b]);
            u[4 + b] = VSUB(VSUB(m[4 + b], m[8 + b]), m[12 + b]);
        }
        WUNROLL(16)
        for (int a = 0; a < 2; a++) {
            const VT *r = u + 4 * a;
            o[2 * a] = VADD(VADD(VADD(r[0], r[1]), r[2]), bv);
            o[2 * a + 1] = VADD(VSUB(VSUB(r[1], r[2]), r[3]), bv);
        }
        return;
    }
    VT u[24], t[4];
    WUNROLL(16)
    for (int b = 0; b < 6; b++) W(at6)(m + b, 6, u + b, 6);   /* Aᵀ m: 4 rows × 6 */
    WUNROLL(16)
    for (int a = 0; a < 4; a++) {
        W(at6)(u + 6 * a, 1, t, 1);
        WUNROLL(16)
        for (int b = 0; b < 4; b++) o[4 * a + b] = VADD(t[b], bv);
    }
}

/* output_block's body for tiles of m×m outputs (a constant where it is inlined) */
WIN void W(output_tiles)(const wgeom *g, const float *M, const float *bias, float beta, size_t t0,
                         int cnt, void *y, int mt) {
    const int E = (mt + 2) * (mt + 2);
    const size_t plane = (size_t)g->tb * g->co;
    const size_t rs = (size_t)g->q * g->co;
    const VT vb = VSET1(beta);
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        int oy = mt * ty, ox = mt * tx;
        const size_t img = (size_t)n * g->p * rs;
        for (int k = 0; k < g->co; k += WV) {
            const float *s = M + (size_t)i * g->co + k;
            VT m[36], o[16];
            WUNROLL(36)
            for (int e = 0; e < E; e++) m[e] = VLD(s + e * plane);
            W(out_tf)(m, bias ? VLD(bias + k) : VZERO(), mt, o);
            WUNROLL(16)
            for (int a = 0; a < mt; a++) {
                if (oy + a >= g->p) break;
                WUNROLL(16)
                for (int b = 0; b < mt; b++) {
                    if (ox + b >= g->q) break;
                    size_t p = img + (size_t)(oy + a) * rs + (size_t)(ox + b) * g->co + k;
                    VT v = o[mt * a + b];
                    if (beta != 0.0f) v = VFMA(vb, VLDT(y, p, g->dt), v);
                    VSTT(y, p, v, g->dt);
                }
            }
        }
    }
}

/* the output transform of tiles [t0, t0+cnt) from M[E][tb][co]: y = beta·y + Aᵀ m A + bias
 * (beta 0 does not read y) */
WFN static void W(output_block)(const wgeom *g, const float *M, const float *bias, float beta,
                                size_t t0, int cnt, void *y) {
    if (g->m == 2) W(output_tiles)(g, M, bias, beta, t0, cnt, y, 2);
    else W(output_tiles)(g, M, bias, beta, t0, cnt, y, 4);
}

/* ---- the filter transform: U[ξ][ci][co] = (G g Gᵀ)ξ, each U[ξ] packed in strips (upos) ---- */

/* G g Gᵀ of a 3×3 kernel (g row-major) */
WIN void W(filt_tf)(const VT g[9], VT u[16]) {
    const VT h = VSET1(0.5f);
    VT t[12];   /* G g: 4 rows × 3 columns */
    WUNROLL(16)
    for (int s = 0; s < 3; s++) {
        VT a = g[s], b = g[3 + s], c = g[6 + s];
        VT ac = VADD(a, c);
        t[s] = a;
        t[3 + s] = VMUL(h, VADD(ac, b));
        t[6 + s] = VMUL(h, VSUB(ac, b));
        t[9 + s] = c;
    }
    WUNROLL(16)
    for (int r = 0; r < 4; r++) {   /* (G g) Gᵀ */
        VT a = t[3 * r], b = t[3 * r + 1], c = t[3 * r + 2];
        VT ac = VADD(a, c);
        u[4 * r + 0] = a;
        u[4 * r + 1] = VMUL(h, VADD(ac, b));
        u[4 * r + 2] = VMUL(h, VSUB(ac, b));
        u[4 * r + 3] = c;
    }
}

/* F(4×4, 3×3): G of the 3 values a, b, c into o[0], o[os], …, o[5os] */
WIN void W(g6)(VT a, VT b, VT c, VT *o, int os) {
    const VT ac = VADD(a, c);
    const VT p = VFMA(VSET1(1.0f / 24), a, VMUL(VSET1(1.0f / 6), c)), q = VMUL(VSET1(1.0f / 12), b);
    o[0] = VMUL(VSET1(0.25f), a);
    o[os] = VMUL(VSET1(-1.0f / 6), VADD(ac, b));
    o[2 * os] = VMUL(VSET1(-1.0f / 6), VSUB(ac, b));
    o[3 * os] = VADD(p, q);
    o[4 * os] = VSUB(p, q);
    o[5 * os] = c;
}

/* G g Gᵀ of a 3×3 kernel for 6×6 tiles (u[6r+s]) */
WIN void W(filt_tf6)(const VT g[9], VT u[36]) {
    VT t[18];   /* G g: 6 rows × 3 columns */
    WUNROLL(16)
    for (int s = 0; s < 3; s++) W(g6)(g[s], g[3 + s], g[6 + s], t + s, 3);
    WUNROLL(16)
    for (int r = 0; r < 6; r++) W(g6)(t[3 * r], t[3 * r + 1], t[3 * r + 2], u + 6 * r, 1);
}

/* the transform of 9 kernel vectors g (g[rs] = WV values of w[·][r][s][·]) into E products a tile
 * (16 or 36, a constant where it is inlined) stored at o, o + plane, …: U's rows */
WIN void W(filt_store)(const VT g[9], int E, float *o, size_t plane) {
    VT u[36];
    if (E == 16) W(filt_tf)(g, u);
    else W(filt_tf6)(g, u);
    WUNROLL(36)
    for (int e = 0; e < E; e++) VST(o + e * plane, u[e]);
}

/* bwd_data (flipped): U[e][k][c] = (G g Gᵀ)e with g[r][s] = w[k][2−r][2−s][c], vectors over c
 * (contiguous in w), for k in [k0, k1); strip by strip of U (upos), so that the stores of a
 * strip's rows k0..k1 follow one another */
WIN void W(filter_flip)(const void *w, int dt, int K, int C, int k0, int k1, float *U, int E) {
    const size_t plane = (size_t)K * C;
    for (int s0 = 0; s0 < C; s0 += 2 * WV)
        for (int k = k0; k < k1; k++)
            for (int c = s0; c < s0 + 2 * WV && c < C; c += WV) {
                VT g[9];
                WUNROLL(16)
                for (int rs = 0; rs < 9; rs++) g[rs] = VLDT(w, ((size_t)k * 9 + 8 - rs) * C + c, dt);
                W(filt_store)(g, E, U + W(upos)(K, C, k, c), plane);
            }
}

/* fwd: U[e][c][k] wants vectors over k, which w [K][3][3][C] holds 9·C apart. So each thread
 * first copies its rows k0..k1 into wt[r][s][c][k] (f32, w_kmajor), and after a barrier
 * transforms input channels c0..c1 from wt with vectors over k: every store a whole register
 * (the scattered stores of a transform over c cost a 64-channel forward call 0.07-0.16 ms,
 * 6-15 %), strip by strip of U (upos) as in filter_flip */
WIN void W(filter_fwd)(const float *wt, int K, int C, int c0, int c1, float *U, int E) {
    const size_t plane = (size_t)C * K;
    for (int s0 = 0; s0 < K; s0 += 2 * WV)
        for (int c = c0; c < c1; c++)
            for (int k = s0; k < s0 + 2 * WV && k < K; k += WV) {
                VT g[9];
                WUNROLL(16)
                for (int rs = 0; rs < 9; rs++) g[rs] = VLD(wt + ((size_t)rs * C + c) * K + k);
                W(filt_store)(g, E, U + W(upos)(C, K, c, k), plane);
            }
}

/* U[E][ci][co] of w [K][3][3][C]: fwd ci = C, co = K, g = w[k][·][·][c]; bwd_data (flip) ci = K,
 * co = C, g[r][s] = w[k][2−r][2−s][c]. t of T threads; fwd goes through wt (w_kmajor) and
 * returns between its two halves for the caller's barrier (phase 0, then 1); flip has one. */
WFN static void W(filter_block)(const void *w, int dt, int K, int C, int flip, int t, int T, int E,
                                float *wt, float *U, int phase) {
    int k0 = (int)((long long)K * t / T), k1 = (int)((long long)K * (t + 1) / T);
    int c0 = (int)((long long)C * t / T), c1 = (int)((long long)C * (t + 1) / T);
    if (flip) {
        if (phase == 0) {
            if (E == 16) W(filter_flip)(w, dt, K, C, k0, k1, U, 16);
            else W(filter_flip)(w, dt, K, C, k0, k1, U, 36);
        }
    } else if (phase == 0) {
        w_kmajor(w, dt, K, C, k0, k1, wt);
    } else {
        if (E == 16) W(filter_fwd)(wt, K, C, c0, c1, U, 16);
        else W(filter_fwd)(wt, K, C, c0, c1, U, 36);
    }
}

/* ---- fwd / bwd_data ---- */

WFN static void W(fwd_blocks)(const wgeom *g, const void *x, const float *U, const float *bias,
                           float beta, void *y, float *V, float *M, size_t b) {
    size_t t0;
    int cnt = block_tiles(g, b, &t0);
    int rows = (cnt + MR - 1) / MR * MR;
    W(input_block)(g, x, t0, cnt, V);
    const size_t vp = (size_t)g->tb * g->ci, mp = (size_t)g->tb * g->co,
                 up = (size_t)g->ci * g->co;
    for (int e = 0; e < g->E; e++) W(gemm_block)(rows, g->ci, g->co, V + e * vp, U + e * up, M + e * mp);
    W(output_block)(g, M, bias, beta, t0, cnt, y);
}

static void W(run_fwd_form)(const wgeom *g, int nt, const void *x, const void *w, int K, int C,
                         int flip, const float *bias, float beta, void *y, void *ws) {
    wlay L;
    wlayout(g, 0, nt, &L);
    float *U = align64(ws), *wt = U + L.u;
#pragma omp parallel num_threads(nt)
    {
        int T = omp_get_num_threads(), t = omp_get_thread_num();
        W(filter_block)(w, g->dt, K, C, flip, t, T, g->E, wt, U, 0);
        if (!flip) {
#pragma omp barrier
            W(filter_block)(w, g->dt, K, C, flip, t, T, g->E, wt, U, 1);
        }
#pragma omp barrier
        float *V = wt + L.wt + (size_t)t * L.per, *M = V + L.v;
#pragma omp for schedule(dynamic, 1)
        for (size_t b = 0; b < g->nblk; b++) W(fwd_blocks)(g, x, U, bias, beta, y, V, M, b);
    }
}

/* ---- bwd_filter ---- */

/* A of the 4 values y[0], y[s], y[2s], y[3s] into o[0], o[os], …, o[5os] (F(4×4, 3×3)'s A = (Aᵀ)ᵀ) */
WIN void W(a6)(const VT *y, int s, VT *o, int os) {
    const VT y0 = y[0], y1 = y[s], y2 = y[2 * s], y3 = y[3 * s];
    const VT s02 = VADD(y0, y2), s13 = VADD(y1, y3);
    const VT p = VFMA(VSET1(4.0f), y2, y0), q = VMUL(VSET1(2.0f), VFMA(VSET1(4.0f), y3, y1));
    o[0] = y0;
    o[os] = VADD(s02, s13);
    o[2 * os] = VSUB(s02, s13);
    o[3 * os] = VADD(p, q);
    o[4 * os] = VSUB(p, q);
    o[5 * os] = y3;
}

/* A dY Aᵀ of the m×m tile of dy at (oy, ox) for outputs k..k+WV−1 (zeros outside), and the
 * tile's sum for db (m 2 or 4, a constant where it is inlined) */
WIN void W(dy_tile)(const wgeom *g, const void *dy, size_t img, int oy, int ox, int k, int m,
                    VT *e, VT *sum) {
    const size_t rs = (size_t)g->q * g->co;
    VT y[16];
    WUNROLL(16)
    for (int a = 0; a < m; a++)
        WUNROLL(16)
        for (int b = 0; b < m; b++)
            y[m * a + b] = oy + a < g->p && ox + b < g->q
                               ? VLDT(dy, img + (size_t)(oy + a) * rs + (size_t)(ox + b) * g->co + k, g->dt)
                               : VZERO();
    if (m == 2) {
        *sum = VADD(VADD(y[0], y[1]), VADD(y[2], y[3]));
        VT t[8];   /* A dY: 4 rows × 2 columns */
        WUNROLL(16)
        for (int b = 0; b < 2; b++) {
            t[b] = y[b];
            t[2 + b] = VADD(y[b], y[2 + b]);
            t[4 + b] = VSUB(y[b], y[2 + b]);
            t[6 + b] = VSUB(VZERO(), y[2 + b]);
        }
        WUNROLL(16)
        for (int a = 0; a < 4; a++) {   /* (A dY) Aᵀ */
            VT p = t[2 * a], q = t[2 * a + 1];
            e[4 * a + 0] = p;
            e[4 * a + 1] = VADD(p, q);
            e[4 * a + 2] = VSUB(p, q);
            e[4 * a + 3] = VSUB(VZERO(), q);
        }
        return;
    }
    VT r[4];   /* the rows' sums, added in row order */
    WUNROLL(16)
    for (int a = 0; a < 4; a++) r[a] = VADD(VADD(y[4 * a], y[4 * a + 1]), VADD(y[4 * a + 2], y[4 * a + 3]));
    *sum = VADD(VADD(r[0], r[1]), VADD(r[2], r[3]));
    VT t[24];   /* A dY: 6 rows × 4 columns */
    WUNROLL(16)
    for (int b = 0; b < 4; b++) W(a6)(y + b, 4, t + b, 4);
    WUNROLL(16)
    for (int a = 0; a < 6; a++) W(a6)(t + 4 * a, 1, e + 6 * a, 1);   /* (A dY) Aᵀ */
}

/* dy_block's body for tiles of m×m outputs */
WIN void W(dy_tiles)(const wgeom *g, const void *dy, size_t t0, int cnt, float *D, float *db, int m) {
    const int E = (m + 2) * (m + 2);
    const size_t plane = (size_t)g->tb * g->co;
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        const size_t img = (size_t)n * g->p * g->q * g->co;
        for (int k = 0; k < g->co; k += WV) {
            VT e[36], s;
            W(dy_tile)(g, dy, img, m * ty, m * tx, k, m, e, &s);
            VST(db + k, VADD(VLD(db + k), s));
            float *o = D + (size_t)i * g->co + k;
            WUNROLL(36)
            for (int j = 0; j < E; j++) VST(o + j * plane, e[j]);
        }
    }
}

/* D[E][tb][K] of tiles [t0, t0+cnt); db += the tiles' sums */
WFN static void W(dy_block)(const wgeom *g, const void *dy, size_t t0, int cnt, float *D, float *db) {
    if (g->m == 2) W(dy_tiles)(g, dy, t0, cnt, D, db, 2);
    else W(dy_tiles)(g, dy, t0, cnt, D, db, 4);
}

#define TN_KR (WV == 16 ? 8 : 4)

/* Macc[K][C] += D[cnt][K]ᵀ · V[cnt][C] (K a multiple of 2·TN_KR, C of WV): rows of TN_KR k × 2·WV
 * c, then the last register of c (if C is an odd number of registers) over 2·TN_KR rows of k: 16
 * accumulators at AVX-512 either way, 8 at AVX2, which has 16 registers. Each output is one
 * chain of FMAs over t, added to Macc once, however the rows are cut. */
WFN static void W(gemm_tn)(int cnt, int K, int C, const float *D, const float *V, float *Macc) {
    const int c2 = C / (2 * WV) * (2 * WV);
    for (int k0 = 0; k0 < K; k0 += TN_KR) {
        for (int c = 0; c < c2; c += 2 * WV) {
            VT acc[TN_KR][2];
            WUNROLL(16)
            for (int i = 0; i < TN_KR; i++) acc[i][0] = acc[i][1] = VZERO();
            for (int t = 0; t < cnt; t++) {
                const float *v = V + (size_t)t * C + c, *dd = D + (size_t)t * K + k0;
                VT b0 = VLD(v), b1 = VLD(v + WV);
                WUNROLL(16)
                for (int i = 0; i < TN_KR; i++) {
                    VT a = VBCAST(dd + i);
                    acc[i][0] = VFMA(a, b0, acc[i][0]);
                    acc[i][1] = VFMA(a, b1, acc[i][1]);
                }
            }
            WUNROLL(16)
            for (int i = 0; i < TN_KR; i++) {
                float *m = Macc + (size_t)(k0 + i) * C + c;
                VST(m, VADD(VLD(m), acc[i][0]));
                VST(m + WV, VADD(VLD(m + WV), acc[i][1]));
            }
        }
    }
    if (c2 == C) return;
    for (int k0 = 0; k0 < K; k0 += 2 * TN_KR) {
        VT acc[2 * TN_KR];
        WUNROLL(16)
        for (int i = 0; i < 2 * TN_KR; i++) acc[i] = VZERO();
        for (int t = 0; t < cnt; t++) {
            VT b0 = VLD(V + (size_t)t * C + c2);
            const float *dd = D + (size_t)t * K + k0;
            WUNROLL(16)
            for (int i = 0; i < 2 * TN_KR; i++) acc[i] = VFMA(VBCAST(dd + i), b0, acc[i]);
        }
        WUNROLL(16)
        for (int i = 0; i < 2 * TN_KR; i++) {
            float *m = Macc + (size_t)(k0 + i) * C + c2;
            VST(m, VADD(VLD(m), acc[i]));
        }
    }
}

#undef TN_KR

/* F(4×4, 3×3): Gᵀ of the 6 values m[0], m[s], …, m[5s] into o[0], o[os], o[2os] */
WIN void W(gt6)(const VT *m, int s, VT *o, int os) {
    const VT s12 = VADD(m[s], m[2 * s]), d12 = VSUB(m[s], m[2 * s]);
    const VT s34 = VADD(m[3 * s], m[4 * s]), d34 = VSUB(m[3 * s], m[4 * s]);
    const VT c6 = VSET1(-1.0f / 6);
    o[0] = VFMA(VSET1(1.0f / 24), s34, VFMA(c6, s12, VMUL(VSET1(0.25f), m[0])));
    o[os] = VFMA(VSET1(1.0f / 12), d34, VMUL(c6, d12));
    o[2 * os] = VADD(VFMA(VSET1(1.0f / 6), s34, VMUL(c6, s12)), m[5 * s]);
}

/* dw[k][·][·][c..c+WV−1] += Gᵀ M G of the E accumulated products (m[ξ] for WV channels; E 16 or
 * 36, a constant where it is inlined) */
WIN void W(filt_out)(const VT *m, int E, float *dwk, int C, int c) {
    VT o[9];
    if (E == 16) {
        const VT h = VSET1(0.5f);
        VT t[12];   /* Gᵀ M: 3 rows × 4 columns */
        WUNROLL(16)
        for (int b = 0; b < 4; b++) {
            VT s12 = VMUL(h, VADD(m[4 + b], m[8 + b]));
            t[b] = VADD(m[b], s12);
            t[4 + b] = VMUL(h, VSUB(m[4 + b], m[8 + b]));
            t[8 + b] = VADD(s12, m[12 + b]);
        }
        WUNROLL(16)
        for (int r = 0; r < 3; r++) {   /* (Gᵀ M) G */
            const VT *q = t + 4 * r;
            VT s12 = VMUL(h, VADD(q[1], q[2]));
            o[3 * r] = VADD(q[0], s12);
            o[3 * r + 1] = VMUL(h, VSUB(q[1], q[2]));
            o[3 * r + 2] = VADD(s12, q[3]);
        }
    } else {
        VT t[18];   /* Gᵀ M: 3 rows × 6 columns */
        WUNROLL(16)
        for (int b = 0; b < 6; b++) W(gt6)(m + b, 6, t + b, 6);
        WUNROLL(16)
        for (int r = 0; r < 3; r++) W(gt6)(t + 6 * r, 1, o + 3 * r, 1);   /* (Gᵀ M) G */
    }
    WUNROLL(16)
    for (int rs = 0; rs < 9; rs++) {
        float *p = dwk + (size_t)rs * C + c;
        VST(p, VADD(VLD(p), o[rs]));
    }
}

WFN static void W(bwdf_thread)(const wgeom *g, const void *x, const void *dy, float *V, float *D,
                            float *Macc, float *db, size_t b0, size_t b1) {
    const int C = g->ci, K = g->co;
    memset(Macc, 0, (size_t)g->E * K * C * sizeof(float));
    memset(db, 0, (size_t)K * sizeof(float));
    const size_t vp = (size_t)g->tb * C, dp = (size_t)g->tb * K, mp = (size_t)K * C;
    for (size_t b = b0; b < b1; b++) {
        size_t t0;
        int cnt = block_tiles(g, b, &t0);
        W(input_block)(g, x, t0, cnt, V);
        W(dy_block)(g, dy, t0, cnt, D, db);
        for (int e = 0; e < g->E; e++) W(gemm_tn)(cnt, K, C, D + e * dp, V + e * vp, Macc + e * mp);
    }
}

/* dw[k][·][·][c] += Gᵀ(Σ_threads Macc_t)G for k in [k0, k1); db[k] += Σ_t db_t[k] */
WFN static void W(bwdf_reduce)(const wgeom *g, float *const *macc, float *const *dbt, int T,
                            float *dw, float *db, int k0, int k1) {
    const int C = g->ci, K = g->co;
    const size_t mp = (size_t)K * C;
    for (int k = k0; k < k1; k++) {
        for (int c = 0; c < C; c += WV) {
            VT m[36];
            for (int e = 0; e < g->E; e++) {
                size_t o = e * mp + (size_t)k * C + c;
                VT s = VLD(macc[0] + o);
                for (int t = 1; t < T; t++) s = VADD(s, VLD(macc[t] + o));
                m[e] = s;
            }
            if (g->E == 16) W(filt_out)(m, 16, dw + (size_t)k * 9 * C, C, c);
            else W(filt_out)(m, 36, dw + (size_t)k * 9 * C, C, c);
        }
        if (db) {
            float s = dbt[0][k];
            for (int t = 1; t < T; t++) s += dbt[t][k];
            db[k] += s;
        }
    }
}


/* the bwd_filter op: per-thread accumulation over its blocks, then the reduction */
static void W(run_bwd_filter)(const wgeom *g, int nt, const void *x, const void *dy, float *dw,
                              float *db, void *ws) {
    wlay L;
    wlayout(g, 1, nt, &L);
    const int K = g->co;
    float *base = align64(ws);
    float *macc[WINO_TMAX], *dbt[WINO_TMAX];
#pragma omp parallel num_threads(nt)
    {
        int T = omp_get_num_threads(), t = omp_get_thread_num();
        float *V = base + (size_t)t * L.per, *D = V + L.v;
        macc[t] = D + L.d;
        dbt[t] = macc[t] + L.acc;
        W(bwdf_thread)(g, x, dy, V, D, macc[t], dbt[t], g->nblk * t / T, g->nblk * (t + 1) / T);
#pragma omp barrier
        W(bwdf_reduce)(g, macc, dbt, T, dw, db, (int)((long long)K * t / T),
                       (int)((long long)K * (t + 1) / T));
    }
}
