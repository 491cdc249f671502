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
    _Pragma("GCC unroll 16")
    for (int b = 0; b < 4; b++) {
        t[0 + b] = VSUB(d[0 + b], d[8 + b]);
        t[4 + b] = VADD(d[4 + b], d[8 + b]);
        t[8 + b] = VSUB(d[8 + b], d[4 + b]);
        t[12 + b] = VSUB(d[4 + b], d[12 + b]);
    }
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 4; a++) {
        const VT *r = t + 4 * a;
        v[4 * a + 0] = VSUB(r[0], r[2]);
        v[4 * a + 1] = VADD(r[1], r[2]);
        v[4 * a + 2] = VSUB(r[2], r[1]);
        v[4 * a + 3] = VSUB(r[1], r[3]);
    }
}

/* the 4×4 tile of x at (row y0, column x0) of the image at element img, channels c..c+WV−1;
 * zeros outside */
WIN void W(load_tile)(const wgeom *g, const void *x, size_t img, int y0, int x0, int c,
                   VT d[16]) {
    const size_t rs = (size_t)g->w * g->ci;
    const int dt = g->dt;
    if (y0 >= 0 && x0 >= 0 && y0 + 4 <= g->h && x0 + 4 <= g->w) {
        const size_t p = img + (size_t)y0 * rs + (size_t)x0 * g->ci + c;
        _Pragma("GCC unroll 16")
        for (int a = 0; a < 4; a++)
            _Pragma("GCC unroll 16")
            for (int b = 0; b < 4; b++) d[4 * a + b] = VLDT(x, p + a * rs + (size_t)b * g->ci, dt);
        return;
    }
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 4; a++) {
        int yy = y0 + a;
        _Pragma("GCC unroll 16")
        for (int b = 0; b < 4; b++) {
            int xx = x0 + b;
            d[4 * a + b] = yy >= 0 && yy < g->h && xx >= 0 && xx < g->w
                               ? VLDT(x, img + (size_t)yy * rs + (size_t)xx * g->ci + c, dt)
                               : VZERO();
        }
    }
}

/* the input transform of tiles [t0, t0+cnt) into V[16][tb][ci]; rows cnt..tb−1 zeroed up to
 * the next multiple of MR (the GEMM reads them) */
WFN static void W(input_block)(const wgeom *g, const void *x, size_t t0, int cnt, float *V) {
    const size_t plane = (size_t)g->tb * g->ci;
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        const size_t img = (size_t)n * g->h * g->w * g->ci;
        for (int c = 0; c < g->ci; c += WV) {
            VT d[16], v[16];
            W(load_tile)(g, x, img, 2 * ty - g->pad, 2 * tx - g->pad, c, d);
            W(in_tf)(d, v);
            float *o = V + (size_t)i * g->ci + c;
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) VST(o + e * plane, v[e]);
        }
    }
    int pad_to = (cnt + MR - 1) / MR * MR;
    _Pragma("GCC unroll 16")
    for (int e = 0; e < 16; e++)
        memset(V + e * plane + (size_t)cnt * g->ci, 0,
               (size_t)(pad_to - cnt) * g->ci * sizeof(float));
}

/* rows [0, nr) of a GEMM block × one register of outputs at column k; nr a constant, MR or 2·MR:
 * 12 accumulators, as many as the two-register loop has (6 chains of FMAs do not hide their
 * latency on two FMA ports) */
WIN void W(gemm_col1)(int nr, int ci, int co, const float *a, const float *U, float *m, int k) {
    VT acc[2 * MR];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < nr; i++) acc[i] = VZERO();
    const float *b = U + k;
    for (int c = 0; c < ci; c++, b += co) {
        VT b0 = VLD(b);
        _Pragma("GCC unroll 16")
        for (int i = 0; i < nr; i++) acc[i] = VFMA(VBCAST(a + (size_t)i * ci + c), b0, acc[i]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < nr; i++) VST(m + (size_t)i * co + k, acc[i]);
}

/* M[rows][co] = V[rows][ci] · U[ci][co] for rows a multiple of MR (co a multiple of WV): pairs of
 * registers of outputs over MR rows, then a last single register over 2·MR rows. Each output is
 * one chain of FMAs over c in order, however the block is cut. */
WIN void W(gemm_block_ci)(int rows, int ci, int co, const float *V, const float *U, float *M) {
    const int k2 = co / (2 * WV) * (2 * WV);
    for (int r0 = 0; r0 < rows; r0 += MR) {
        const float *a = V + (size_t)r0 * ci;
        float *m = M + (size_t)r0 * co;
        for (int k = 0; k < k2; k += 2 * WV) {
            VT acc[MR][2];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = VZERO();
            const float *b = U + k;
            for (int c = 0; c < ci; c++, b += co) {
                VT b0 = VLD(b), b1 = VLD(b + WV);
                _Pragma("GCC unroll 16")
                for (int i = 0; i < MR; i++) {
                    VT av = VBCAST(a + (size_t)i * ci + c);
                    acc[i][0] = VFMA(av, b0, acc[i][0]);
                    acc[i][1] = VFMA(av, b1, acc[i][1]);
                }
            }
            _Pragma("GCC unroll 16")
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

/* the output transform of tiles [t0, t0+cnt) from M[16][tb][co]: y = beta·y + Aᵀ m A + bias
 * (beta 0 does not read y) */
WFN static void W(output_block)(const wgeom *g, const float *M, const float *bias, float beta,
                             size_t t0, int cnt, void *y) {
    const size_t plane = (size_t)g->tb * g->co;
    const size_t rs = (size_t)g->q * g->co;
    const VT vb = VSET1(beta);
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        int oy = 2 * ty, ox = 2 * tx;
        const size_t img = (size_t)n * g->p * rs;
        for (int k = 0; k < g->co; k += WV) {
            const float *s = M + (size_t)i * g->co + k;
            VT m[16], u[8];
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) m[e] = VLD(s + e * plane);
            _Pragma("GCC unroll 16")
            for (int b = 0; b < 4; b++) {   /* Aᵀ m: rows 0, 1 */
                u[b] = VADD(VADD(m[b], m[4 + b]), m[8 + b]);
                u[4 + b] = VSUB(VSUB(m[4 + b], m[8 + b]), m[12 + b]);
            }
            VT bv = bias ? VLD(bias + k) : VZERO();
            _Pragma("GCC unroll 16")
            for (int a = 0; a < 2; a++) {
                if (oy + a >= g->p) break;
                const VT *r = u + 4 * a;
                VT o[2];
                o[0] = VADD(VADD(VADD(r[0], r[1]), r[2]), bv);
                o[1] = VADD(VSUB(VSUB(r[1], r[2]), r[3]), bv);
                _Pragma("GCC unroll 16")
                for (int b = 0; b < 2; b++) {
                    if (ox + b >= g->q) break;
                    size_t p = img + (size_t)(oy + a) * rs + (size_t)(ox + b) * g->co + k;
                    VT v = o[b];
                    if (beta != 0.0f) v = VFMA(vb, VLDT(y, p, g->dt), v);
                    VSTT(y, p, v, g->dt);
                }
            }
        }
    }
}

/* ---- the filter transform: U[ξ][ci][co] = (G g Gᵀ)ξ ---- */

/* G g Gᵀ of a 3×3 kernel (g row-major) */
WIN void W(filt_tf)(const VT g[9], VT u[16]) {
    const VT h = VSET1(0.5f);
    VT t[12];   /* G g: 4 rows × 3 columns */
    _Pragma("GCC unroll 16")
    for (int s = 0; s < 3; s++) {
        VT a = g[s], b = g[3 + s], c = g[6 + s];
        VT ac = VADD(a, c);
        t[s] = a;
        t[3 + s] = VMUL(h, VADD(ac, b));
        t[6 + s] = VMUL(h, VSUB(ac, b));
        t[9 + s] = c;
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < 4; r++) {   /* (G g) Gᵀ */
        VT a = t[3 * r], b = t[3 * r + 1], c = t[3 * r + 2];
        VT ac = VADD(a, c);
        u[4 * r + 0] = a;
        u[4 * r + 1] = VMUL(h, VADD(ac, b));
        u[4 * r + 2] = VMUL(h, VSUB(ac, b));
        u[4 * r + 3] = c;
    }
}

/* w [K][3][3][C]. fwd: ci = C, co = K, g = w[k][·][·][c]. bwd_data (flip): ci = K, co = C,
 * g[r][s] = w[k][2−r][2−s][c]. Vectors run over C (contiguous in w) and scatter into U. */
WFN static void W(filter_block)(const void *w, int dt, int K, int C, int flip, int k0, int k1,
                             float *U) {
    const int ci = flip ? K : C, co = flip ? C : K;
    const size_t plane = (size_t)ci * co;
    for (int k = k0; k < k1; k++) {
        for (int c = 0; c < C; c += WV) {
            VT g[9], u[16];
            _Pragma("GCC unroll 16")
            for (int rs = 0; rs < 9; rs++) {
                int src = flip ? 8 - rs : rs;
                g[rs] = VLDT(w, ((size_t)k * 9 + src) * C + c, dt);
            }
            W(filt_tf)(g, u);
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) {
                float tmp[WV];
                VST(tmp, u[e]);
                float *o = U + e * plane;
                _Pragma("GCC unroll 16")
                for (int j = 0; j < WV; j++) {
                    /* fwd: U[e][c+j][k]; flip: U[e][k][c+j] */
                    size_t idx = flip ? (size_t)k * co + c + j : (size_t)(c + j) * co + k;
                    o[idx] = tmp[j];
                }
            }
        }
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
    _Pragma("GCC unroll 16")
    for (int e = 0; e < 16; e++) W(gemm_block)(rows, g->ci, g->co, V + e * vp, U + e * up, M + e * mp);
    W(output_block)(g, M, bias, beta, t0, cnt, y);
}

static void W(run_fwd_form)(const wgeom *g, int nt, const void *x, const void *w, int K, int C,
                         int flip, const float *bias, float beta, void *y, void *ws) {
    wlay L;
    wlayout(g, 0, nt, &L);
    float *U = align64(ws);
#pragma omp parallel num_threads(nt)
    {
        int T = omp_get_num_threads(), t = omp_get_thread_num();
        W(filter_block)(w, g->dt, K, C, flip, (int)((long long)K * t / T), (int)((long long)K * (t + 1) / T), U);
#pragma omp barrier
        float *V = U + L.u + (size_t)t * L.per, *M = V + L.v;
#pragma omp for schedule(dynamic, 1)
        for (size_t b = 0; b < g->nblk; b++) W(fwd_blocks)(g, x, U, bias, beta, y, V, M, b);
    }
}

/* ---- bwd_filter ---- */

/* A dY Aᵀ of the 2×2 tile of dy at (oy, ox) for outputs k..k+WV−1 (zeros outside), and the
 * tile's sum for db */
WIN void W(dy_tile)(const wgeom *g, const void *dy, size_t img, int oy, int ox, int k, VT e[16],
                 VT *sum) {
    const size_t rs = (size_t)g->q * g->co;
    VT y[4];
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 2; a++)
        _Pragma("GCC unroll 16")
        for (int b = 0; b < 2; b++)
            y[2 * a + b] = oy + a < g->p && ox + b < g->q
                               ? VLDT(dy, img + (size_t)(oy + a) * rs + (size_t)(ox + b) * g->co + k, g->dt)
                               : VZERO();
    *sum = VADD(VADD(y[0], y[1]), VADD(y[2], y[3]));
    VT t[8];   /* A dY: 4 rows × 2 columns */
    _Pragma("GCC unroll 16")
    for (int b = 0; b < 2; b++) {
        t[b] = y[b];
        t[2 + b] = VADD(y[b], y[2 + b]);
        t[4 + b] = VSUB(y[b], y[2 + b]);
        t[6 + b] = VSUB(VZERO(), y[2 + b]);
    }
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 4; a++) {   /* (A dY) Aᵀ */
        VT p = t[2 * a], q = t[2 * a + 1];
        e[4 * a + 0] = p;
        e[4 * a + 1] = VADD(p, q);
        e[4 * a + 2] = VSUB(p, q);
        e[4 * a + 3] = VSUB(VZERO(), q);
    }
}

/* D[16][tb][K] of tiles [t0, t0+cnt); db += the tiles' sums */
WFN static void W(dy_block)(const wgeom *g, const void *dy, size_t t0, int cnt, float *D, float *db) {
    const size_t plane = (size_t)g->tb * g->co;
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        const size_t img = (size_t)n * g->p * g->q * g->co;
        for (int k = 0; k < g->co; k += WV) {
            VT e[16], s;
            W(dy_tile)(g, dy, img, 2 * ty, 2 * tx, k, e, &s);
            VST(db + k, VADD(VLD(db + k), s));
            float *o = D + (size_t)i * g->co + k;
            _Pragma("GCC unroll 16")
            for (int j = 0; j < 16; j++) VST(o + j * plane, e[j]);
        }
    }
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
            _Pragma("GCC unroll 16")
            for (int i = 0; i < TN_KR; i++) acc[i][0] = acc[i][1] = VZERO();
            for (int t = 0; t < cnt; t++) {
                const float *v = V + (size_t)t * C + c, *dd = D + (size_t)t * K + k0;
                VT b0 = VLD(v), b1 = VLD(v + WV);
                _Pragma("GCC unroll 16")
                for (int i = 0; i < TN_KR; i++) {
                    VT a = VBCAST(dd + i);
                    acc[i][0] = VFMA(a, b0, acc[i][0]);
                    acc[i][1] = VFMA(a, b1, acc[i][1]);
                }
            }
            _Pragma("GCC unroll 16")
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
        _Pragma("GCC unroll 16")
        for (int i = 0; i < 2 * TN_KR; i++) acc[i] = VZERO();
        for (int t = 0; t < cnt; t++) {
            VT b0 = VLD(V + (size_t)t * C + c2);
            const float *dd = D + (size_t)t * K + k0;
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 2 * TN_KR; i++) acc[i] = VFMA(VBCAST(dd + i), b0, acc[i]);
        }
        _Pragma("GCC unroll 16")
        for (int i = 0; i < 2 * TN_KR; i++) {
            float *m = Macc + (size_t)(k0 + i) * C + c2;
            VST(m, VADD(VLD(m), acc[i]));
        }
    }
}

#undef TN_KR

/* dw[k][·][·][c..c+WV−1] += Gᵀ M G of the 16 accumulated products (m[ξ] for WV channels) */
WIN void W(filt_out)(const VT m[16], float *dwk, int C, int c) {
    const VT h = VSET1(0.5f);
    VT t[12];   /* Gᵀ M: 3 rows × 4 columns */
    _Pragma("GCC unroll 16")
    for (int b = 0; b < 4; b++) {
        VT s12 = VMUL(h, VADD(m[4 + b], m[8 + b]));
        t[b] = VADD(m[b], s12);
        t[4 + b] = VMUL(h, VSUB(m[4 + b], m[8 + b]));
        t[8 + b] = VADD(s12, m[12 + b]);
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < 3; r++) {   /* (Gᵀ M) G */
        const VT *q = t + 4 * r;
        VT s12 = VMUL(h, VADD(q[1], q[2]));
        VT o[3] = { VADD(q[0], s12), VMUL(h, VSUB(q[1], q[2])),
                        VADD(s12, q[3]) };
        _Pragma("GCC unroll 16")
        for (int s = 0; s < 3; s++) {
            float *p = dwk + (size_t)(3 * r + s) * C + c;
            VST(p, VADD(VLD(p), o[s]));
        }
    }
}

WFN static void W(bwdf_thread)(const wgeom *g, const void *x, const void *dy, float *V, float *D,
                            float *Macc, float *db, size_t b0, size_t b1) {
    const int C = g->ci, K = g->co;
    memset(Macc, 0, 16 * (size_t)K * C * sizeof(float));
    memset(db, 0, (size_t)K * sizeof(float));
    const size_t vp = (size_t)g->tb * C, dp = (size_t)g->tb * K, mp = (size_t)K * C;
    for (size_t b = b0; b < b1; b++) {
        size_t t0;
        int cnt = block_tiles(g, b, &t0);
        W(input_block)(g, x, t0, cnt, V);
        W(dy_block)(g, dy, t0, cnt, D, db);
        _Pragma("GCC unroll 16")
        for (int e = 0; e < 16; e++) W(gemm_tn)(cnt, K, C, D + e * dp, V + e * vp, Macc + e * mp);
    }
}

/* dw[k][·][·][c] += Gᵀ(Σ_threads Macc_t)G for k in [k0, k1); db[k] += Σ_t db_t[k] */
WFN static void W(bwdf_reduce)(const wgeom *g, float *const *macc, float *const *dbt, int T,
                            float *dw, float *db, int k0, int k1) {
    const int C = g->ci, K = g->co;
    const size_t mp = (size_t)K * C;
    for (int k = k0; k < k1; k++) {
        for (int c = 0; c < C; c += WV) {
            VT m[16];
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) {
                size_t o = e * mp + (size_t)k * C + c;
                VT s = VLD(macc[0] + o);
                for (int t = 1; t < T; t++) s = VADD(s, VLD(macc[t] + o));
                m[e] = s;
            }
            W(filt_out)(m, dw + (size_t)k * 9 * C, C, c);
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
