/* cpu_f16c.h — 8 values of a storage dtype in and out of an AVX2 register, for the kernels that
 * are built for AVX2, FMA and F16C (cpu_wino.c, cpu_f16c.c): f16 through F16C's vcvtph2ps and
 * vcvtps2ph, bf16 by shifts. Loads are exact; stores round to nearest even bit for bit as
 * tq_f32_to_f16 / tq_f32_to_bf16 (kernels/common) do, NaN included (test_ops checks F16C
 * against tq_f32_to_f16 on every non-NaN pattern class, and the kernels against the emulated
 * ones). Not a header of its own: included once by each of those files, no include guard. */
#include <immintrin.h>
#include <stdint.h>

#define T_AVX2 "avx2,fma,f16c"
#define WIN8 static inline __attribute__((always_inline, target(T_AVX2)))

/* 8 values of type dt from element i of p, as f32 (exact) */
WIN8 __m256 ld8(const void *p, size_t i, int dt) {
    if (dt == TQ_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (dt == TQ_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the low 16 bits of each 32-bit lane (values in [0, 0xffff]), in order */
WIN8 __m128i pack16(__m256i x) {
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(x, x), 0xD8));
}

/* 8 f32 stored as type dt at element i of p, rounded to nearest even bit for bit as
 * tq_f32_to_f16 / tq_f32_to_bf16 (kernels/common) do: a NaN becomes bf16's quiet NaN (the top
 * half | 0x40) or f16's 0x7e00 with its sign */
WIN8 void st8(void *p, size_t i, __m256 v, int dt) {
    if (dt == TQ_F32) {
        _mm256_storeu_ps((float *)p + i, v);
        return;
    }
    const __m256i u = _mm256_castps_si256(v);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    __m128i h;
    if (dt == TQ_F16) {
        __m128i r = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i q = _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x8000)),
                                    _mm256_set1_epi32(0x7e00));
        __m128i m = _mm256_castsi256_si128(
            _mm256_permute4x64_epi64(_mm256_packs_epi32(nan, nan), 0xD8));
        h = _mm_blendv_epi8(r, pack16(q), m);
    } else {
        __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                             _mm256_and_si256(hi, _mm256_set1_epi32(1))), 16);
        __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
        h = pack16(_mm256_blendv_epi8(r, q, nan));
    }
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
}
