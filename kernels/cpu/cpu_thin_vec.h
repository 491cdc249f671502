/* cpu_thin_vec.h — direct 3×3 stride-1 convolutions of few input channels (C <= 4: a network's
 * first layer, whose input is the image) at one vector width: included by cpu_wino.c after
 * cpu_wino_vec.h, with the same macros (WV channels a register, VT, VLD, VFMA, ...).
 *
 * Vectors run over the output channels k, which NHWC keeps contiguous in y and dy; the kernel
 * is copied once a call to Wt[r][s][c][k] (f32). A forward output is the bias, then the products
 * added in (r, s, c) order, those that would read outside the image left out; a pixel whose
 * window lies inside the image takes the unchecked loop (4 pixels a step), one on the border the
 * checked one, and both add in the same order. The filter gradient sums an output row's pixels
 * in f32 registers (9·C products and dy's sum per output channel), then adds each row's sums in
 * double into the thread's accumulators; threads take images [N·t/T, N·(t+1)/T) and their accumulators
 * are added in thread order. Every output channel is its own lane and every sum runs in the same
 * order at both widths: the same bits. Not a header of its own: no include guard. */

/* the value of x at element i, as f32 (f16/bf16 exactly); DT the data's type, a constant where
 * the kernels are inlined (a runtime type cost the loads a branch each and kept the broadcasts
 * from reading memory: the forward ran at 2.4 cycles per FMA) */
#define THIN_X(x, i) tq_ld((x), (tq_dtype)DT, (i))

/* rows r of the kernel whose input row p + r − pad lies inside the image */
WIN void W(thin_rows)(const wgeom *g, int p, int *r0, int *r1) {
    *r0 = g->pad - p > 0 ? g->pad - p : 0;
    *r1 = g->h + g->pad - p < 3 ? g->h + g->pad - p : 3;
}

/* output columns [*qa, *qb) whose window lies inside the image's columns */
WIN void W(thin_cols)(const wgeom *g, int *qa, int *qb) {
    int a = g->pad, b = g->w - 2 + g->pad;
    if (a > g->q) a = g->q;
    if (b > g->q) b = g->q;
    if (b < a) b = a;
    *qa = a;
    *qb = b;
}

/* BODY for the (r, s, c) of the window of a pixel q on the border of output row p whose input
 * element e lies inside the image, in (r, s, c) order (r0, r1, ximg, xrs, C in scope) */
#define THIN_BORDER(BODY)                                                                    \
    WUNROLL(3)                                                                               \
    for (int r = 0; r < 3; r++) {                                                            \
        if (r < r0 || r >= r1) continue;                                                     \
        const size_t row_ = ximg + (size_t)(p + r - g->pad) * xrs;                           \
        WUNROLL(3)                                                                           \
        for (int s = 0; s < 3; s++) {                                                        \
            int ix_ = q + s - g->pad;                                                        \
            if (ix_ < 0 || ix_ >= g->w) continue;                                            \
            WUNROLL(4)                                                                       \
            for (int c = 0; c < C; c++) {                                                    \
                const size_t e = row_ + (size_t)ix_ * C + c;                                 \
                BODY;                                                                        \
            }                                                                                \
        }                                                                                    \
    }

/* forward, one pixel on the border (q) of output row p, checked: the bias, then the products in
 * (r, s, c) order, those outside the image left out */
WIN VT W(thin_fwd_px)(const wgeom *g, const void *x, const float *Wt, VT b, size_t ximg, int p,
                      int q, int r0, int r1, int k, int C, int DT) {
    const int K = g->co;
    const size_t xrs = (size_t)g->w * C;
    VT acc = b;
    THIN_BORDER(acc = VFMA(VSET1(THIN_X(x, e)), VLD(Wt + ((size_t)(r * 3 + s) * C + c) * K + k), acc));
    return acc;
}

/* forward: output row p of image n, output channels k..k+WV−1 (C a constant where inlined) */
WIN void W(thin_fwd_row)(const wgeom *g, const void *x, const float *Wt, const float *bias, void *y,
                         int n, int p, int k, int C, int DT) {
    const int K = g->co;
    const size_t xrs = (size_t)g->w * C, ximg = (size_t)n * g->h * xrs;
    const size_t yrow = ((size_t)n * g->p + p) * g->q * K + k;
    int r0, r1, qa, qb;
    W(thin_rows)(g, p, &r0, &r1);
    W(thin_cols)(g, &qa, &qb);
    const VT b = bias ? VLD(bias + k) : VZERO();
    for (int q = 0; q < qa; q++)
        VSTT(y, yrow + (size_t)q * K, W(thin_fwd_px)(g, x, Wt, b, ximg, p, q, r0, r1, k, C, DT), DT);
    for (int q = qa; q < qb;) {   /* the interior, unchecked: 4 pixels a step, then one */
        const int np = qb - q >= 4 ? 4 : 1;
        VT acc[4] = { b, b, b, b };
        WUNROLL(3)
        for (int r = 0; r < 3; r++) {   /* unrolled, r a constant in each copy: acc in registers */
            if (r < r0 || r >= r1) continue;
            const size_t row = ximg + (size_t)(p + r - g->pad) * xrs + (size_t)(q - g->pad) * C;
            WUNROLL(3)
            for (int s = 0; s < 3; s++)
                WUNROLL(4)
                for (int c = 0; c < C; c++) {
                    const VT wv = VLD(Wt + ((size_t)(r * 3 + s) * C + c) * K + k);
                    const size_t e = row + (size_t)s * C + c;
                    if (np == 4) {
                        WUNROLL(4)
                        for (int i = 0; i < 4; i++)
                            acc[i] = VFMA(VSET1(THIN_X(x, e + (size_t)i * C)), wv, acc[i]);
                    } else {
                        acc[0] = VFMA(VSET1(THIN_X(x, e)), wv, acc[0]);
                    }
                }
        }
        if (np == 4) {   /* constant indices only: acc stays in registers */
            WUNROLL(4)
            for (int i = 0; i < 4; i++) VSTT(y, yrow + (size_t)(q + i) * K, acc[i], DT);
        } else {
            VSTT(y, yrow + (size_t)q * K, acc[0], DT);
        }
        q += np;
    }
    for (int q = qb > qa ? qb : qa; q < g->q; q++)
        VSTT(y, yrow + (size_t)q * K, W(thin_fwd_px)(g, x, Wt, b, ximg, p, q, r0, r1, k, C, DT), DT);
}

WIN void W(thin_fwd_rows_c)(const wgeom *g, const void *x, const float *Wt, const float *bias,
                            void *y, size_t i, int C, int DT) {
    int n = (int)(i / (size_t)g->p), p = (int)(i % (size_t)g->p);
    for (int k = 0; k < g->co; k += WV) W(thin_fwd_row)(g, x, Wt, bias, y, n, p, k, C, DT);
}

/* calls F(..., C, DT) with the channel count and the type as constants */
#define THIN_DISPATCH(F, ...)                                                        \
    do {                                                                             \
        if (g->dt == TQ_F32) THIN_DISPATCH_C(F, TQ_F32, __VA_ARGS__);                \
        else if (g->dt == TQ_F16) THIN_DISPATCH_C(F, TQ_F16, __VA_ARGS__);           \
        else THIN_DISPATCH_C(F, TQ_BF16, __VA_ARGS__);                               \
    } while (0)
#define THIN_DISPATCH_C(F, DT, ...)                                                  \
    do {                                                                             \
        switch (g->ci) {                                                             \
        case 1: F(__VA_ARGS__, 1, DT); break;                                        \
        case 2: F(__VA_ARGS__, 2, DT); break;                                        \
        case 3: F(__VA_ARGS__, 3, DT); break;                                        \
        default: F(__VA_ARGS__, 4, DT); break;                                       \
        }                                                                            \
    } while (0)

/* output row i (image i / P, row i % P) */
WFN static void W(thin_fwd_rows)(const wgeom *g, const void *x, const float *Wt, const float *bias,
                                 void *y, size_t i) {
    THIN_DISPATCH(W(thin_fwd_rows_c), g, x, Wt, bias, y, i);
}

static void W(run_thin_fwd)(const wgeom *g, int nt, const void *x, const float *Wt,
                            const float *bias, void *y) {
    const size_t rows = (size_t)g->n * g->p;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
    for (size_t i = 0; i < rows; i++) W(thin_fwd_rows)(g, x, Wt, bias, y, i);
}

/* the filter gradient of output row p of image n for output channels k..k+WV−1: the 9·C products'
 * sums and dy's sum, stored to sacc[9·C + 1] registers' worth of f32 (C and DT constants where
 * inlined). A row at a time for every k of the row before the next row: the row of dy stays in
 * L1, where passes over all of dy for each register of k had read it K/WV times from memory
 * (the 32-channel cnn conv1: 0.67 ms a call, dy at 38 GB/s) */
WIN void W(thin_bwdf_row)(const wgeom *g, const void *x, const void *dy, int n, int p, int k,
                          float *sacc, int C, int DT) {
    const int K = g->co;
    const size_t xrs = (size_t)g->w * C, ximg = (size_t)n * g->h * xrs;
    VT acc[36], db = VZERO();
    WUNROLL(36)
    for (int j = 0; j < 9 * C; j++) acc[j] = VZERO();
    int qa, qb, r0, r1;
    W(thin_cols)(g, &qa, &qb);
    W(thin_rows)(g, p, &r0, &r1);
    const size_t drow = ((size_t)n * g->p + p) * g->q * K + k;
    size_t xr[3];   /* the input rows' first elements, column −pad (valid rows only) */
    for (int r = r0; r < r1; r++) xr[r] = ximg + (size_t)(p + r - g->pad) * xrs - (size_t)g->pad * C;
    for (int q = 0; q < g->q; q++) {
        const VT d = VLDT(dy, drow + (size_t)q * K, DT);
        db = VADD(db, d);
        if (q >= qa && q < qb) {
            WUNROLL(3)
            for (int r = 0; r < 3; r++) {   /* unrolled, r a constant in each copy: acc in registers */
                if (r < r0 || r >= r1) continue;
                const size_t row = xr[r] + (size_t)q * C;
                WUNROLL(3)
                for (int s = 0; s < 3; s++)
                    WUNROLL(4)
                    for (int c = 0; c < C; c++)
                        acc[(r * 3 + s) * C + c] = VFMA(VSET1(THIN_X(x, row + (size_t)s * C + c)), d,
                                                        acc[(r * 3 + s) * C + c]);
            }
        } else {
            THIN_BORDER(acc[(r * 3 + s) * C + c] = VFMA(VSET1(THIN_X(x, e)), d, acc[(r * 3 + s) * C + c]));
        }
    }
    WUNROLL(36)   /* constant indices only: acc stays in registers */
    for (int j = 0; j < 9 * C; j++) VST(sacc + (size_t)j * WV, acc[j]);
    VST(sacc + (size_t)9 * C * WV, db);
}

/* images [n0, n1): each output row's f32 sums (scratch: (9·C + 1)·K floats, [k register][j][lane]),
 * added in double into dwacc[(r·3+s)·C + c][k] and dbacc[k] after the row (an image's 784 pixels
 * summed in f32 had made 4 micro-batches of 16 differ from one of 64 by 1.1e-5 after 20 cnn
 * steps, oneDNN's sums by 3e-6) */
WFN static void W(thin_bwdf_imgs)(const wgeom *g, const void *x, const void *dy, int n0, int n1,
                                  double *dwacc, double *dbacc, float *scratch) {
    const int K = g->co, J = 9 * g->ci + 1;
    for (int n = n0; n < n1; n++) {
        for (int p = 0; p < g->p; p++) {
            for (int k = 0; k < K; k += WV)
                THIN_DISPATCH(W(thin_bwdf_row), g, x, dy, n, p, k, scratch + (size_t)k * J);
            for (int k = 0; k < K; k += WV) {
                const float *sa = scratch + (size_t)k * J;
                for (int j = 0; j < J - 1; j++)
                    for (int l = 0; l < WV; l++) dwacc[(size_t)j * K + k + l] += sa[(size_t)j * WV + l];
                for (int l = 0; l < WV; l++) dbacc[k + l] += sa[(size_t)(J - 1) * WV + l];
            }
        }
    }
}

#undef THIN_X
#undef THIN_BORDER
#undef THIN_DISPATCH
#undef THIN_DISPATCH_C
