/* cpu_bn_bf16.c — batch-norm's bf16 element-wise passes on CPUs with AVX512_BF16 (Cooper Lake,
 * Sapphire Rapids and later Xeons, AMD Zen 4): the row kernels of cpu_bn_rows.h built for
 * AVX-512 with each output row converted by vcvtne2ps2bf16, 32 values an instruction, instead
 * of the emulated round-to-nearest-even of tq_f32_to_bf16 (a shift, three adds, a NaN select
 * and a pack per vector).
 *
 * The same bits: the instruction rounds to nearest even and quiets a NaN by setting bit 6 of
 * its top half, as tq_f32_to_bf16 does, without consulting MXCSR; it differs only on
 * denormal inputs, which it flushes to signed zero. A vector holding a denormal is converted by
 * tq_f32_to_bf16 instead (vfpclassps finds them), so every value gets the bits of the
 * emulation. test_ops' test_bn_bf16_native compares the two on rows of denormals, NaNs,
 * infinities, ties and overflow.
 *
 * TQ_CPU_BF16_NATIVE=0 in the environment keeps the emulated passes (the tests' way to compare). */
#include <immintrin.h>
#include <stdint.h>

#include "cpu/cpu_internal.h"

int tq_cpu_bf16_cpu(void) {
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

static int native_on = -1;

void tq_cpu_bf16_native_set(int on) { native_on = on < 0 ? -1 : on && tq_cpu_bf16_cpu(); }

int tq_cpu_bf16_native(void) {
    return tq_cpu_native_switch(&native_on, "TQ_CPU_BF16_NATIVE", tq_cpu_bf16_cpu);
}

/* everything below is built for AVX-512 with AVX512_BF16 (the pragmas take a literal) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#endif

/* dst[0..n) = src[0..n) rounded to bf16, bit for bit tq_f32_to_bf16 */
static inline __attribute__((always_inline)) void bf16_row_native(uint16_t *d, const float *s, int n) {
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 a = _mm512_loadu_ps(s + j), b = _mm512_loadu_ps(s + j + 16);
        if (_mm512_fpclass_ps_mask(a, 0x20) | _mm512_fpclass_ps_mask(b, 0x20)) {   /* denormals */
            for (int k = 0; k < 32; k++) d[j + k] = tq_f32_to_bf16(s[j + k]);
            continue;
        }
        _mm512_storeu_si512((void *)(d + j), (__m512i)_mm512_cvtne2ps_pbh(b, a));   /* b: the top half */
    }
    for (; j < n; j += 16) {
        int m = n - j < 16 ? n - j : 16;
        __mmask16 k = (__mmask16)((1u << m) - 1u);
        __m512 a = _mm512_maskz_loadu_ps(k, s + j);
        if (_mm512_mask_fpclass_ps_mask(k, a, 0x20)) {
            for (int i = 0; i < m; i++) d[j + i] = tq_f32_to_bf16(s[j + i]);
            continue;
        }
        _mm256_mask_storeu_epi16((void *)(d + j), k, (__m256i)_mm512_cvtneps_pbh(a));
    }
}

#define BN_BF16_ROW(dst, src, n) bf16_row_native((dst), (src), (n))
#include "cpu/cpu_bn_rows.h"

void tq_cpu_norm_block_bf16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *y,
                             const void *x, const void *res, const float *mu, const float *is,
                             const float *g, const float *b, int relu) {
    if (cw == FOLD_MIN) norm_rows(TQ_BF16, 1, r0, r1, ld, c0, FOLD_MIN, y, x, res, mu, is, g, b, relu);
    else norm_rows(TQ_BF16, 1, r0, r1, ld, c0, cw, y, x, res, mu, is, g, b, relu);
}

void tq_cpu_bn_dx_block_bf16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *dx,
                              float beta_dx, const void *dy, const void *x, const void *ry,
                              void *dres, float beta_res, const float *mu, const float *is,
                              const float *g, const float *sdb, const float *sdg, float inv_m) {
#define BN_DX_N(ACC, MASK, RES, W)                                                                 \
    bn_dx_rows(TQ_BF16, 1, ACC, MASK, RES, r0, r1, ld, c0, W, dx, beta_dx, dy, x, ry, dres, beta_res, \
               mu, is, g, sdb, sdg, inv_m)
    BN_DX_DISPATCH(BN_DX_N);
#undef BN_DX_N
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
