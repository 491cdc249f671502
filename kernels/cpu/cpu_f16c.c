/* cpu_f16c.c — f16 through F16C (every CPU with AVX2) where the emulated conversions were the
 * bound: batch-norm's passes (the norm and dx passes and the statistics' reductions), max
 * pooling's, and the casts between f16 and f32 (the operands of the f16 convolutions that
 * oneDNN runs in f32, AMP's weight copy). A pass converts each block of rows to f32 with
 * vcvtph2ps, eight values an instruction, into buffers on the stack, runs the f32 instances of
 * cpu_bn_rows.h's or cpu_pool_rows.h's kernels on the buffers, and stores their outputs with
 * vcvtps2ph (cpu_f16c.h's st8, whose NaN fix-up writes 0x7e00 with the sign as tq_f32_to_f16
 * does). Emulated in C, an f16 load is ten integer operations and a store fifteen: the f16
 * batch-norm passes ran at a third of the bf16 ones' speed and made fp16 AMP on the CPU slower
 * than fp32.
 *
 * The same bits as cpu_bn.c's, cpu_pool.c's and cpu_elem.c's f16 instances: the conversions are
 * exact one way and round to nearest even the other (test_ops' test_conversions_reference holds
 * F16C to the emulation on every non-NaN class), the f32 arithmetic is the same C over the same
 * values in the same order (rows in order within a lane; ISO C, no FMA contraction), and the
 * one rounding inside a pass, of the normalised value before a residual add, is F16C's round
 * trip. The one difference: vcvtph2ps quiets a signalling NaN, which the emulated load passes
 * on as it is; trainq's own stores never write one. test_ops compares the two: test_bn_native
 * on rows of NaN, infinities, subnormal outputs and overflow, test_maxpool_f16_native,
 * test_cast_f16_native.
 *
 * TQ_CPU_F16_NATIVE=0 in the environment keeps the emulated passes (the tests' way to compare). */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"

int tq_cpu_avx2_f16c(void) {
    unsigned a, b, c, d;   /* F16C: CPUID 1, ECX bit 29 (clang's builtin does not know it) */
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int tq_cpu_native_switch(int *state, const char *var, int (*has)(void)) {
    if (*state < 0) {
        const char *e = getenv(var);
        *state = !(e && !strcmp(e, "0")) && has();
    }
    return *state;
}

static int native_on = -1;

void tq_cpu_f16_native_set(int on) { native_on = on < 0 ? -1 : on && tq_cpu_avx2_f16c(); }

int tq_cpu_f16_native(void) {
    return tq_cpu_native_switch(&native_on, "TQ_CPU_F16_NATIVE", tq_cpu_avx2_f16c);
}

/* everything below is built for AVX2, FMA and F16C (the pragmas take a literal) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define BN_BF16_ROW(dst, src, n) ((void)(dst), (void)(src), (void)(n))   /* NAT is 0 here */
#include "cpu/cpu_bn_rows.h"
#include "cpu/cpu_f16c.h"
#include "cpu/cpu_pool_rows.h"

#define STAGE 2048   /* floats per staged operand (8 KiB): rows × lanes of one chunk */

/* rows [r, r+rows) of cw lanes from column c0 of s [.][ld] (f16) → d [rows][cw] f32, exact */
static inline __attribute__((always_inline)) void stage_in(float *d, const void *s, size_t ld, size_t r,
                                                           size_t c0, int rows, int cw) {
    for (int i = 0; i < rows; i++) {
        size_t base = (r + i) * ld + c0;
        float *q = d + (size_t)i * cw;
        int j = 0;
        for (; j + 8 <= cw; j += 8) _mm256_storeu_ps(q + j, ld8(s, base + j, TQ_F16));
        for (; j < cw; j++) q[j] = tq_ld(s, TQ_F16, base + j);
    }
}

/* the inverse: s [rows][cw] f32 → rows of d (f16), rounded as tq_st rounds */
static inline __attribute__((always_inline)) void stage_out(void *d, size_t ld, size_t r, size_t c0,
                                                            const float *s, int rows, int cw) {
    for (int i = 0; i < rows; i++) {
        size_t base = (r + i) * ld + c0;
        const float *q = s + (size_t)i * cw;
        int j = 0;
        for (; j + 8 <= cw; j += 8) st8(d, base + j, _mm256_loadu_ps(q + j), TQ_F16);
        for (; j < cw; j++) tq_st(d, TQ_F16, base + j, q[j]);
    }
}

/* v[i] = the value v[i] has once stored as f16, i < n: tq_round_to(TQ_F16, ·) but for a NaN's
 * payload (its sign is kept; every store writes a NaN as 0x7e00 with that sign) */
static inline __attribute__((always_inline)) void round_f16(float *v, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(v + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(v + i),
                                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    for (; i < n; i++) v[i] = tq_round_to(TQ_F16, v[i]);
}

static int stage_rows(int cw, size_t left) {
    size_t r = STAGE / (size_t)cw;
    return (int)(r < left ? r : left);
}

void tq_cpu_norm_block_f16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *y,
                            const void *x, const void *res, const float *mu, const float *is,
                            const float *g, const float *b, int relu) {
    float X[STAGE] __attribute__((aligned(64))), R[STAGE] __attribute__((aligned(64)));
    for (size_t r = r0; r < r1;) {
        int rows = stage_rows(cw, r1 - r), n = rows * cw;
        stage_in(X, x, ld, r, c0, rows, cw);
        /* norm_rows' three forms on the buffer, in place; with res, its rounding of the
         * normalised value before the add is the round trip */
        if (cw == FOLD_MIN) norm_rows(TQ_F32, 0, 0, rows, FOLD_MIN, 0, FOLD_MIN, X, X, NULL, mu, is, g, b, res ? 0 : relu);
        else norm_rows(TQ_F32, 0, 0, rows, cw, 0, cw, X, X, NULL, mu, is, g, b, res ? 0 : relu);
        if (res) {
            round_f16(X, n);
            stage_in(R, res, ld, r, c0, rows, cw);
            if (relu)
                TQ_SIMD(TQ_F32, for (int i = 0; i < n; i++) {
                    float v = X[i] + R[i];
                    X[i] = v <= 0.0f ? 0.0f : v;
                });
            else
                TQ_SIMD(TQ_F32, for (int i = 0; i < n; i++) X[i] = X[i] + R[i];);
        }
        stage_out(y, ld, r, c0, X, rows, cw);
        r += (size_t)rows;
    }
}

/* BN_DX_DISPATCH picks the kernel from ry, dres (given or not), beta_dx, beta_res and cw; the
 * kernel runs on the staged copies */
void tq_cpu_bn_dx_block_f16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *dx,
                             float beta_dx, const void *dy, const void *x, const void *ry,
                             void *dres, float beta_res, const float *mu, const float *is,
                             const float *g, const float *sdb, const float *sdg, float inv_m) {
    float DY[STAGE] __attribute__((aligned(64))), X[STAGE] __attribute__((aligned(64)));
    float RY[STAGE] __attribute__((aligned(64))), DX[STAGE] __attribute__((aligned(64)));
    float DR[STAGE] __attribute__((aligned(64)));
    for (size_t r = r0; r < r1;) {
        int rows = stage_rows(cw, r1 - r);
        stage_in(DY, dy, ld, r, c0, rows, cw);
        stage_in(X, x, ld, r, c0, rows, cw);
        if (ry) stage_in(RY, ry, ld, r, c0, rows, cw);
        if (beta_dx != 0.0f) stage_in(DX, dx, ld, r, c0, rows, cw);
        if (dres && beta_res != 0.0f) stage_in(DR, dres, ld, r, c0, rows, cw);
#define BN_DX_W(ACC, MASK, RES, W)                                                               \
    bn_dx_rows(TQ_F32, 0, ACC, MASK, RES, 0, (size_t)rows, (size_t)(W), 0, W, DX, beta_dx, DY, X, RY, \
               DR, beta_res, mu, is, g, sdb, sdg, inv_m)
        BN_DX_DISPATCH(BN_DX_W);
#undef BN_DX_W
        stage_out(dx, ld, r, c0, DX, rows, cw);
        if (dres) stage_out(dres, ld, r, c0, DR, rows, cw);
        r += (size_t)rows;
    }
}

void tq_cpu_red_block_f16n(tq_red_mode mode, size_t r0, size_t r1, size_t ld, size_t col, int jw,
                           const void *a, const void *b, const void *mk, const float *of, float *f0,
                           float *f1) {
    float A[STAGE] __attribute__((aligned(64))), B[STAGE] __attribute__((aligned(64)));
    float MK[STAGE] __attribute__((aligned(64)));
    for (size_t r = r0; r < r1;) {   /* chunks of rows in order: each lane's sums in row order */
        int rows = stage_rows(jw, r1 - r);
        stage_in(A, a, ld, r, col, rows, jw);
        if (mode == TQ_RED_DOT || mode == TQ_RED_DOTM) stage_in(B, b, ld, r, col, rows, jw);
        if (mode == TQ_RED_DOTM) stage_in(MK, mk, ld, r, col, rows, jw);
#define RED_W(MODE)                                                                                 \
    do {                                                                                            \
        if (jw == RED_CB) red_block(TQ_F32, MODE, 0, (size_t)rows, RED_CB, 0, RED_CB, A, B, MK, of, f0, f1); \
        else if (jw == FOLD_MIN) red_block(TQ_F32, MODE, 0, (size_t)rows, FOLD_MIN, 0, FOLD_MIN, A, B, MK, of, f0, f1); \
        else red_block(TQ_F32, MODE, 0, (size_t)rows, (size_t)jw, 0, jw, A, B, MK, of, f0, f1);   \
    } while (0)
        if (mode == TQ_RED_SUM) RED_W(TQ_RED_SUM);
        else if (mode == TQ_RED_SHSQ) RED_W(TQ_RED_SHSQ);
        else if (mode == TQ_RED_DOT) RED_W(TQ_RED_DOT);
        else RED_W(TQ_RED_DOTM);
#undef RED_W
        r += (size_t)rows;
    }
}

/* Max pooling's rows in chunks of qc output columns (the input's 2·qc columns of both rows staged,
 * 2·qc·C <= STAGE): k_maxpool_row / k_maxpool_bwd_rows on an image of 2 rows and 2·qc columns.
 * 0 where a column of channels does not fit (2·C > STAGE), or for bwd an uncovered last row:
 * the caller runs its emulated rows. */
int tq_cpu_maxpool_row_f16n(tq_shape s, int img, int oh, void *y, const void *x, int relu) {
    const int C = s.c, Q = s.w / 2;
    if (2 * C > STAGE) return 0;
    float X[2 * STAGE] __attribute__((aligned(64))), Y[STAGE] __attribute__((aligned(64)));
    const size_t rs = (size_t)s.w * C, r0 = ((size_t)img * s.h + 2 * oh) * rs;
    const size_t yo = (((size_t)img * (s.h / 2) + oh) * Q) * C;
    const int qmax = STAGE / (2 * C);
    for (int q0 = 0; q0 < Q; q0 += qmax) {
        int qc = Q - q0 < qmax ? Q - q0 : qmax, w = 2 * qc * C;
        stage_in(X, x, 0, 0, r0 + (size_t)(2 * q0) * C, 1, w);
        stage_in(X + w, x, 0, 0, r0 + rs + (size_t)(2 * q0) * C, 1, w);
        tq_shape sc = { 1, 2, 2 * qc, C };
        k_maxpool_row(TQ_F32, sc, 0, 0, Y, X, relu);
        stage_out(y, 0, 0, yo + (size_t)q0 * C, Y, 1, qc * C);
    }
    return 1;
}

int tq_cpu_maxpool_bwd_rows_f16n(tq_shape s, int img, int oh, void *dx, float beta, const void *dy,
                                 const void *x, int relu) {
    const int C = s.c, Q = s.w / 2;
    if (2 * C > STAGE || 2 * oh + 1 >= s.h) return 0;
    float X[2 * STAGE] __attribute__((aligned(64))), DX[2 * STAGE] __attribute__((aligned(64)));
    float DY[STAGE / 2] __attribute__((aligned(64)));
    const size_t rs = (size_t)s.w * C, r0 = ((size_t)img * s.h + 2 * oh) * rs;
    const size_t yo = (((size_t)img * (s.h / 2) + oh) * Q) * C;
    const int qmax = STAGE / (2 * C);
    for (int q0 = 0; q0 < Q; q0 += qmax) {
        int qc = Q - q0 < qmax ? Q - q0 : qmax, w = 2 * qc * C;
        size_t c0 = r0 + (size_t)(2 * q0) * C;
        stage_in(X, x, 0, 0, c0, 1, w);
        stage_in(X + w, x, 0, 0, c0 + rs, 1, w);
        stage_in(DY, dy, 0, 0, yo + (size_t)q0 * C, 1, qc * C);
        if (beta != 0.0f) {
            stage_in(DX, dx, 0, 0, c0, 1, w);
            stage_in(DX + w, dx, 0, 0, c0 + rs, 1, w);
        }
        tq_shape sc = { 1, 2, 2 * qc, C };
        k_maxpool_bwd_rows(TQ_F32, sc, 0, 0, DX, beta, DY, X, relu);
        stage_out(dx, 0, 0, c0, DX, 1, w);
        stage_out(dx, 0, 0, c0 + rs, DX + w, 1, w);
    }
    k_maxpool_bwd_lastcol(TQ_F16, s, r0, dx, beta);
    return 1;
}

/* elements [i0, i1) of a cast between f16 and f32 (ddt the destination's type), i1 − i0 <= INT_MAX */
void tq_cpu_cast_f16n(size_t i0, size_t i1, tq_dtype ddt, void *dst, const void *src) {
    int n = (int)(i1 - i0);
    if (ddt == TQ_F32) stage_in((float *)dst + i0, (const uint16_t *)src + i0, 0, 0, 0, 1, n);
    else stage_out((uint16_t *)dst + i0, 0, 0, 0, (const float *)src + i0, 1, n);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
