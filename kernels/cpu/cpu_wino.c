/* cpu_wino.c — 3×3 stride-1 convolutions by Winograd's F(4×4, 3×3) and F(2×2, 3×3), on AVX2 or
 * AVX-512.
 *
 * Types: x, y, w, dx, dy in the op's type (f32, f16, bf16); f16/bf16 values are converted to
 * f32 exactly as they are loaded (F16C, a shift) and every output is rounded once as it is
 * stored, to nearest even, bit for bit as tq_f32_to_f16/bf16; everything in between is f32,
 * so a 16-bit op's outputs are its f32 op's on the same values, rounded. dw, db, bias: f32.
 *
 * Why: oneDNN 2.6's direct convolutions already run near the FMA peak of the cores (jit:avx2
 * and avx512_core alike), so the only way to do a 3×3 convolution faster is to do fewer
 * multiplications. F(m×m, 3×3) computes an m×m output tile from an (m+2)×(m+2) input tile with
 * (m+2)² products per (input, output) channel pair instead of 9m²: F(2×2, 3×3) 16 instead of
 * 36 (2.25× fewer), F(4×4, 3×3) 36 instead of 144 (4× fewer). The transforms are additions
 * and multiplications by constants over channels, which NHWC keeps contiguous, so every
 * transform works on 8 channels in one AVX2 register, or 16 in an AVX-512 one (the same
 * kernels, cpu_wino_vec.h, compiled at both widths; at 16 where the channel counts are
 * multiples of 16). oneDNN's own Winograd convolutions need AVX-512 and are f32 only.
 * cpu_conv.c decides when these run (wino_use) and with which tile (tile 4: F(4×4, 3×3) where
 * it takes fewer products over the output than F(2×2, 3×3): square maps of 3, 4 and from 7 up;
 * 1 and 2 take F(2×2, 3×3), 5 and 6 tie and take it too).
 *
 * The three ops share one set of transforms (Lavin & Gray 2015, "Fast Algorithms for
 * Convolutional Neural Networks"; the backward forms by the transposition principle):
 *   fwd:        Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A                 per (m+2)² tile d of x (stride m)
 *   bwd_data:   the forward convolution of dy with the flipped, channel-transposed kernel
 *               W'[c][r][s][k] = W[k][2−r][2−s][c] and padding 2 − pad (exact for stride 1)
 *   bwd_filter: dW = Gᵀ[Σ_tiles (A dY Aᵀ) ⊙ (Bᵀ d B)]G     per m×m tile dY of dy and the
 *               (m+2)² tile d of x it saw; the sum over tiles (and images) is (m+2)² GEMMs:
 *               Mξ[k][c] = Σ_t Dξ[t][k]·Vξ[t][c]
 * F(2×2, 3×3): Bᵀ = [1 0 −1 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1], G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1],
 *   Aᵀ = [1 1 1 0; 0 1 −1 −1].
 * F(4×4, 3×3) (points 0, ±1, ±2, ∞): Bᵀ = [4 0 −5 0 1 0; 0 −4 −4 1 1 0; 0 4 −4 −1 1 0;
 *   0 −2 −1 2 1 0; 0 2 −1 −2 1 0; 0 4 0 −5 0 1], G = [¼ 0 0; −⅙ −⅙ −⅙; −⅙ ⅙ −⅙;
 *   1/24 1/12 ⅙; 1/24 −1/12 ⅙; 0 0 1], Aᵀ = [1 1 1 1 1 0; 0 1 −1 2 −2 0; 0 1 1 4 4 0;
 *   0 1 −1 8 −8 1].
 * Tiles over the image's edge read zeros and write nothing.
 *
 * Blocking: tiles (n, ty, tx), n-major, go in blocks of TB (a multiple of 6, the GEMM
 * micro-kernel's rows). Per block: the input transform into V[E][TB][C] (E = (m+2)²), E GEMMs
 * M[ξ] = V[ξ]·U[ξ] (U[E][C][K] the transformed filter, once a call), the output transform.
 * A block's V and M stay in L2.
 *
 * Threads: fwd and bwd_data hand out blocks dynamically (a block's result does not depend on
 * who computed it); bwd_filter gives thread t the blocks [nb·t/T, nb·(t+1)/T) and its own
 * accumulators, added in thread order at the end, so results are reproducible for a thread
 * count (as oneDNN's and the im2col path's).
 *
 * Accuracy: F(2×2, 3×3)'s transforms only add and halve; F(4×4, 3×3)'s multiply by up to 8 and
 * 1/24, so its rounding error is larger (in numpy, a tile in f32 against float64: 7e-7 of the
 * largest output) but still of the order of a few f32 ulps of the sum's magnitude:
 * tests/unit/test_ops.c holds all three ops, at both tiles, to 1e-5 of a double reference.
 *
 * Workspace (floats, sections rounded up to 16 floats, the base aligned to 64 bytes inside
 * the caller's buffer):
 *   fwd, bwd_data: U[E·Cin·Cout] | wt[9·Cin·Cout] | T × {V[E·TB·Cin] | M[E·TB·Cout]}
 *   bwd_filter:    T × {V[E·TB·C] | D[E·TB·K] | Macc[E·K·C] | db[K]}
 */
#include <stdint.h>
#include <string.h>
#include <immintrin.h>
#include <omp.h>

#include "cpu/cpu_internal.h"

#define T_AVX512 "avx512f,avx2,fma,f16c"

#define MR 6            /* GEMM micro-kernel rows (tiles) */

/* the kernels' loop unrolling (their arrays of registers need it to stay in registers); left
 * out with TQ_NO_UNROLL, as the sanitized and fuzzing builds do: clang -O1 with ASan and UBSan
 * took 7 minutes and 2.5 GB over this file unrolled */
#ifdef TQ_NO_UNROLL
#define WUNROLL(n)
#else
#define WUNROLL_(x) _Pragma(#x)
#define WUNROLL(n) WUNROLL_(GCC unroll n)
#endif

/* the geometry of a forward-form convolution: x [n][h][w][ci] → y [n][p][q][co], pad */
typedef struct {
    int n, h, w, ci, co, pad, p, q, ty, tx, tb;
    int m, E;                   /* outputs per tile side (2 or 4), products per tile (16, 36) */
    int dt;                     /* x, y, w, dx, dy: TQ_F32, TQ_F16 or TQ_BF16 */
    size_t nt, nblk;
} wgeom;

static size_t up16(size_t f) { return (f + 15) / 16 * 16; }

/* tiles per block: V and M of a block about 96 KiB together for F(2×2, 3×3) (measured best of
 * 96/192/384 KiB on the three ResNet-20 stages, 2 threads) and 192 KiB for F(4×4, 3×3) (against
 * 96 KiB, the three ops of the 16- and 32-channel stages at batch 128 took 13-14 % less time,
 * medians of 5 interleaved rounds; 384 KiB no better), at least 2 rows of the kernel */
static int pick_tb(int ci, int co, int E) {
#ifndef WINO_TB_FLOATS
#define WINO_TB_FLOATS 24576
#endif
    size_t budget = E == 16 ? WINO_TB_FLOATS : 2 * (size_t)WINO_TB_FLOATS;
    int tb = (int)(budget / (E * (size_t)(ci + co))) / MR * MR;
    if (tb < 2 * MR) tb = 2 * MR;
    if (tb > 16 * MR) tb = 16 * MR;
    return tb;
}

static void wgeom_init(wgeom *g, int n, int h, int w, int ci, int co, int pad, int dt, int m) {
    g->dt = dt;
    g->n = n; g->h = h; g->w = w; g->ci = ci; g->co = co; g->pad = pad;
    g->m = m;
    g->E = (m + 2) * (m + 2);
    g->p = h + 2 * pad - 2;
    g->q = w + 2 * pad - 2;
    g->ty = (g->p + m - 1) / m;
    g->tx = (g->q + m - 1) / m;
    g->nt = (size_t)n * g->ty * g->tx;
    g->tb = pick_tb(ci, co, g->E);
    g->nblk = (g->nt + g->tb - 1) / g->tb;
}

int tq_cpu_wino_fits(const tq_conv_desc *d) {
    return d->r == 3 && d->s == 3 && d->stride == 1 && d->pad >= 0 && d->pad <= 2 &&
           d->x.c % 8 == 0 && d->k % 8 == 0 && d->x.h + 2 * d->pad >= 3 &&
           d->x.w + 2 * d->pad >= 3;
}

int tq_cpu_wino_fits512(const tq_conv_desc *d) {
    return tq_cpu_wino_fits(d) && d->x.c % 16 == 0 && d->k % 16 == 0;
}

/* products per image of tiles of m×m outputs over a p×q output: ⌈p/m⌉·⌈q/m⌉·(m+2)² */
static long tile_products(int p, int q, int m) {
    return (long)((p + m - 1) / m) * ((q + m - 1) / m) * (m + 2) * (m + 2);
}

/* kind: 0 fwd, 1 bwd_data, 2 bwd_filter. tile 2: F(2×2, 3×3); tile 4: F(4×4, 3×3) where it
 * takes fewer products over the op's output than F(2×2, 3×3) (ResNet's 7×7 to 32×32 maps:
 * 1.36-1.78× fewer), else F(2×2, 3×3) (a 2×2 map: 36 products against 16) */
static void fwd_form(const tq_conv_desc *d, int dt, int kind, int tile, wgeom *g) {
    int h = d->x.h, w = d->x.w, ci = d->x.c, co = d->k, pad = d->pad;
    if (kind == 1) {   /* dy [N][P][Q][K] → dx [N][H][W][C], padding 2 − pad */
        h = d->x.h + 2 * d->pad - 2, w = d->x.w + 2 * d->pad - 2;
        ci = d->k, co = d->x.c, pad = 2 - d->pad;
    }
    int p = h + 2 * pad - 2, q = w + 2 * pad - 2;
    int m = tile == 4 && tile_products(p, q, 4) < tile_products(p, q, 2) ? 4 : 2;
    wgeom_init(g, d->x.n, h, w, ci, co, pad, dt, m);
}

/* the forward-form op's (kind 0 fwd, 1 bwd_data) products a tile (16: F(2×2, 3×3), 36:
 * F(4×4, 3×3)) with this tile setting, and its outputs N·P·Q (for cpu_conv.c's rule) */
int tq_cpu_wino_products(const tq_conv_desc *d, int kind, int tile, size_t *outputs) {
    wgeom g;
    fwd_form(d, TQ_F32, kind, tile, &g);
    if (outputs) *outputs = (size_t)g.n * g.p * g.q;
    return g.E;
}

/* The workspace's sections in floats from the 64-byte aligned base, one layout for
 * tq_cpu_wino_ws and the ops: fwd/bwd_data (filter 0) U | wt, then per thread V | M; bwd_filter
 * (filter 1) per thread V | D | Macc | db. Absent sections are 0. */
typedef struct { size_t u, wt, v, m, d, acc, db, per, total; } wlay;

static void wlayout(const wgeom *g, int filter, int nt, wlay *L) {
    memset(L, 0, sizeof *L);
    const size_t tb = (size_t)g->tb, ci = (size_t)g->ci, co = (size_t)g->co, E = (size_t)g->E;
    L->v = up16(E * tb * ci);
    if (filter) {
        L->d = up16(E * tb * co);
        L->acc = up16(E * co * ci);
        L->db = up16(co);
    } else {
        L->u = up16(E * ci * co);
        L->wt = up16(9 * ci * co);
        L->m = up16(E * tb * co);
    }
    L->per = L->v + L->m + L->d + L->acc + L->db;
    L->total = L->u + L->wt + (size_t)nt * L->per;
}

size_t tq_cpu_wino_ws(const tq_conv_desc *d, int kind, int nt, int tile) {
    wgeom g;
    wlay L;
    fwd_form(d, TQ_F32, kind, tile, &g);   /* the layout does not depend on the type */
    wlayout(&g, kind == 2, nt, &L);
    return L.total * sizeof(float) + 64;
}

/* the tiles of block b: the first in *t0, the count returned */
static int block_tiles(const wgeom *g, size_t b, size_t *t0) {
    *t0 = b * g->tb;
    return (int)(g->nt - *t0 < (size_t)g->tb ? g->nt - *t0 : (size_t)g->tb);
}

static float *align64(void *ws) {
    return (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
}

/* image n and tile row/column (ty, tx) of tile t (tiles n-major) */
static inline void tile_at(const wgeom *g, size_t t, int *n, int *ty, int *tx) {
    const size_t per_img = (size_t)g->ty * g->tx;
    int rem = (int)(t % per_img);
    *n = (int)(t / per_img);
    *ty = rem / g->tx;
    *tx = rem % g->tx;
}

/* wt[r][s][c][k] (f32) = w[k][r][s][c] for rows k0..k1 of w [K][3][3][C]: the kernel with its
 * output channels contiguous, as the kernels with vectors over k want it (the Winograd forward
 * filter transform, the thin forward) */
static void w_kmajor(const void *w, int dt, int K, int C, int k0, int k1, float *wt) {
    /* in tiles of 16 k × 16 j, each j's 16 k one store run (a cache line of wt) from 16 rows of
     * w that stay in L1. Row by row instead, a k at a time, every store went to another line K
     * floats on, 2 KB apart at 512 channels (two L1 sets): 8-15 ms of a 25 ms resnet18 4×4×512
     * forward call on 2 cores */
    enum { B = 16 };
    const size_t J = (size_t)9 * C;
    for (int kb = k0; kb < k1; kb += B) {
        const int ke = kb + B < k1 ? kb + B : k1;
        for (size_t jb = 0; jb < J; jb += B) {
            const size_t je = jb + B < J ? jb + B : J;
            if (dt == TQ_F32)
                for (size_t j = jb; j < je; j++)
                    for (int k = kb; k < ke; k++) wt[j * K + k] = ((const float *)w)[(size_t)k * J + j];
            else
                for (size_t j = jb; j < je; j++)
                    for (int k = kb; k < ke; k++) wt[j * K + k] = tq_ld(w, (tq_dtype)dt, (size_t)k * J + j);
        }
    }
}

/* ---- 8 channels in and out of an AVX2 register: ld8, st8 (cpu_f16c.h) ---- */

#include "cpu/cpu_f16c.h"

/* ---- 16 channels in and out of an AVX-512 register (AVX-512F only) ---- */

#define WIN16 static inline __attribute__((always_inline, target(T_AVX512)))

/* 16 values of type dt from element i of p, as f32 (exact) */
WIN16 __m512 ld16(const void *p, size_t i, int dt) {
    if (dt == TQ_F32) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (dt == TQ_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 f32 stored as type dt at element i of p, rounded as st8 does (the same bits) */
WIN16 void st16(void *p, size_t i, __m512 v, int dt) {
    if (dt == TQ_F32) {
        _mm512_storeu_ps((float *)p + i, v);
        return;
    }
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r, q;
    if (dt == TQ_F16) {
        r = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        q = _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7e00));
    } else {
        r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                               _mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);
        q = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    }
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i),
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q)));
}

#define WINO_TMAX 256   /* bwd_filter's threads at most */
#define WCAT_(a, b) a##_##b
#define WCAT(a, b) WCAT_(a, b)
#define W(name) WCAT(name, WV)

/* AVX2: 8 channels a register */
#define WV 8
#define VT __m256
#define WIN WIN8
#define WFN __attribute__((target(T_AVX2)))
#define VLD _mm256_loadu_ps
#define VST _mm256_storeu_ps
#define VADD _mm256_add_ps
#define VSUB _mm256_sub_ps
#define VMUL _mm256_mul_ps
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps
#define VBCAST _mm256_broadcast_ss
#define VLDT ld8
#define VSTT st8
#include "cpu/cpu_wino_vec.h"
#include "cpu/cpu_thin_vec.h"
#undef WV
#undef VT
#undef WIN
#undef WFN
#undef VLD
#undef VST
#undef VADD
#undef VSUB
#undef VMUL
#undef VFMA
#undef VSET1
#undef VZERO
#undef VBCAST
#undef VLDT
#undef VSTT

/* AVX-512: 16 channels a register */
#define WV 16
#define VT __m512
#define WIN WIN16
#define WFN __attribute__((target(T_AVX512)))
#define VLD _mm512_loadu_ps
#define VST _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VSUB _mm512_sub_ps
#define VMUL _mm512_mul_ps
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps
#define VBCAST(p) _mm512_set1_ps(*(p))
#define VLDT ld16
#define VSTT st16
#include "cpu/cpu_wino_vec.h"
#include "cpu/cpu_thin_vec.h"

/* ---- the ops: the AVX-512 kernels where vec is 16 and the channels are multiples of 16 ---- */

int tq_cpu_wino_fwd(int nt, int vec, int tile, const tq_conv_desc *d, tq_dtype dt, void *y,
                    const void *x, const void *w, const float *bias, void *ws) {
    wgeom g;
    fwd_form(d, dt, 0, tile, &g);
    if (vec == 16 && tq_cpu_wino_fits512(d)) run_fwd_form_16(&g, nt, x, w, d->k, d->x.c, 0, bias, 0.0f, y, ws);
    else run_fwd_form_8(&g, nt, x, w, d->k, d->x.c, 0, bias, 0.0f, y, ws);
    return TQ_OK;
}

int tq_cpu_wino_bwd_data(int nt, int vec, int tile, const tq_conv_desc *d, tq_dtype dt, void *dx,
                         float beta, const void *dy, const void *w, void *ws) {
    wgeom g;
    fwd_form(d, dt, 1, tile, &g);
    if (vec == 16 && tq_cpu_wino_fits512(d)) run_fwd_form_16(&g, nt, dy, w, d->k, d->x.c, 1, NULL, beta, dx, ws);
    else run_fwd_form_8(&g, nt, dy, w, d->k, d->x.c, 1, NULL, beta, dx, ws);
    return TQ_OK;
}

int tq_cpu_wino_bwd_filter(int nt, int vec, int tile, const tq_conv_desc *d, tq_dtype dt, float *dw,
                           float *db, const void *x, const void *dy, void *ws) {
    wgeom g;
    fwd_form(d, dt, 2, tile, &g);
    if (nt > WINO_TMAX) nt = WINO_TMAX;
    if (vec == 16 && tq_cpu_wino_fits512(d)) run_bwd_filter_16(&g, nt, x, dy, dw, db, ws);
    else run_bwd_filter_8(&g, nt, x, dy, dw, db, ws);
    return TQ_OK;
}

/* ---- few input channels: direct 3×3 stride-1 convolutions (cpu_thin_vec.h) ---- */

int tq_cpu_thin_fits(const tq_conv_desc *d) {
    return d->r == 3 && d->s == 3 && d->stride == 1 && d->pad >= 0 && d->pad <= 2 && d->x.c >= 1 &&
           d->x.c <= 4 && d->k % 8 == 0 && d->x.h + 2 * d->pad >= 3 && d->x.w + 2 * d->pad >= 3;
}

/* fwd: Wt[9·C·K] floats; bwd_filter: per thread 9·C·K + K doubles (its sums), then per thread
 * as many floats (an output row's sums); bwd_data: not these kernels */
static size_t thin_per(const tq_conv_desc *d) { return (size_t)9 * d->x.c * d->k + (size_t)d->k; }
size_t tq_cpu_thin_ws(const tq_conv_desc *d, int kind, int nt) {
    if (nt > WINO_TMAX) nt = WINO_TMAX;
    if (kind == 0) return (size_t)9 * d->x.c * d->k * sizeof(float) + 64;
    if (kind == 2) return (size_t)nt * thin_per(d) * (sizeof(double) + sizeof(float)) + 64;
    return 0;
}

int tq_cpu_thin_fwd(int nt, int vec, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x,
                    const void *w, const float *bias, void *ws) {
    wgeom g;
    fwd_form(d, dt, 0, 2, &g);
    float *Wt = align64(ws);
    const int K = d->k;
    w_kmajor(w, dt, K, d->x.c, 0, K, Wt);
    if (vec == 16 && K % 16 == 0) run_thin_fwd_16(&g, nt, x, Wt, bias, y);
    else run_thin_fwd_8(&g, nt, x, Wt, bias, y);
    return TQ_OK;
}

int tq_cpu_thin_bwd_filter(int nt, int vec, const tq_conv_desc *d, tq_dtype dt, float *dw, float *db,
                           const void *x, const void *dy, void *ws) {
    wgeom g;
    fwd_form(d, dt, 2, 2, &g);
    if (nt > WINO_TMAX) nt = WINO_TMAX;
    const int C = d->x.c, K = d->k, N = d->x.n, wide = vec == 16 && K % 16 == 0;
    const size_t per = thin_per(d);
    double *acc = (double *)align64(ws);
    float *scr = (float *)(acc + (size_t)nt * per);
    int team = 1;
#pragma omp parallel num_threads(nt)
    {
        int T = omp_get_num_threads(), t = omp_get_thread_num();
        if (t == 0) team = T;
        double *a = acc + (size_t)t * per;
        memset(a, 0, per * sizeof(double));
        int n0 = (int)((long long)N * t / T), n1 = (int)((long long)N * (t + 1) / T);
        if (wide) thin_bwdf_imgs_16(&g, x, dy, n0, n1, a, a + per - K, scr + (size_t)t * per);
        else thin_bwdf_imgs_8(&g, x, dy, n0, n1, a, a + per - K, scr + (size_t)t * per);
    }
    for (int j = 0; j < 9 * C; j++)   /* dw[k][r][s][c] += Σ_t, in thread order */
        for (int k = 0; k < K; k++) {
            double s = 0;
            for (int t = 0; t < team; t++) s += acc[(size_t)t * per + (size_t)j * K + k];
            dw[(size_t)k * 9 * C + j] += (float)s;
        }
    if (db)
        for (int k = 0; k < K; k++) {
            double s = 0;
            for (int t = 0; t < team; t++) s += acc[(size_t)t * per + per - K + k];
            db[k] += (float)s;
        }
    return TQ_OK;
}
