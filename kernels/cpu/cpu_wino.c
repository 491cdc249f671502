/* cpu_wino.c — 3×3 stride-1 convolutions by Winograd's F(2×2, 3×3), for AVX2 CPUs.
 *
 * Types: x, y, w, dx, dy in the op's type (f32, f16, bf16); f16/bf16 values are converted to
 * f32 exactly as they are loaded (F16C, a shift) and every output is rounded once as it is
 * stored, to nearest even, bit for bit as tq_f32_to_f16/bf16; everything in between is f32,
 * so a 16-bit op's outputs are its f32 op's on the same values, rounded. dw, db, bias: f32.
 *
 * Why: on a CPU without AVX-512, oneDNN 2.6's direct convolutions (jit:avx2) already run near
 * the FMA peak of the cores, so the only way to do a 3×3 convolution faster is to do fewer
 * multiplications. F(2×2, 3×3) computes a 2×2 output tile from a 4×4 input tile with 16
 * products per (input, output) channel pair instead of 36 (2.25× fewer); the transforms are
 * additions over channels, which NHWC keeps contiguous, so every transform works on 8 channels
 * in one AVX2 register. oneDNN's own Winograd convolutions need AVX-512. cpu_conv.c decides
 * when these run (wino_use); on AVX-512 CPUs oneDNN's kernels stay (faster there, measured: for
 * bf16 on Intel CPUs without AMX, its f32 ones on f32 copies, cpu_dnnl.c).
 *
 * The three ops share one set of transforms (Lavin & Gray 2015, "Fast Algorithms for
 * Convolutional Neural Networks"; the backward forms by the transposition principle):
 *   fwd:        Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A                 per 4×4 tile d of x (stride 2)
 *   bwd_data:   the forward convolution of dy with the flipped, channel-transposed kernel
 *               W'[c][r][s][k] = W[k][2−r][2−s][c] and padding 2 − pad (exact for stride 1)
 *   bwd_filter: dW = Gᵀ[Σ_tiles (A dY Aᵀ) ⊙ (Bᵀ d B)]G     per 2×2 tile dY of dy and the 4×4
 *               tile d of x it saw; the sum over tiles (and images) is 16 GEMMs, ξ = 0..15:
 *               Mξ[k][c] = Σ_t Dξ[t][k]·Vξ[t][c]
 * with Bᵀ = [1 0 −1 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1], G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1],
 * Aᵀ = [1 1 1 0; 0 1 −1 −1]. Tiles over the image's edge read zeros and write nothing.
 *
 * Blocking: tiles (n, ty, tx), n-major, go in blocks of TB (a multiple of 6, the GEMM
 * micro-kernel's rows). Per block: the input transform into V[16][TB][C], 16 GEMMs
 * M[ξ] = V[ξ]·U[ξ] (U[16][C][K] the transformed filter, once a call), the output transform.
 * A block's V and M stay in L2.
 *
 * Threads: fwd and bwd_data hand out blocks dynamically (a block's result does not depend on
 * who computed it); bwd_filter gives thread t the blocks [nb·t/T, nb·(t+1)/T) and its own
 * accumulators, added in thread order at the end, so results are reproducible for a thread
 * count (as oneDNN's and the im2col path's).
 *
 * Accuracy: the transforms only add and halve; the error is that of a 3×3 convolution
 * summed in a different order, within a few f32 ulps of the sum's magnitude (tests/unit/
 * test_ops.c holds all three ops to 1e-5 of a double reference).
 *
 * Workspace (floats, sections rounded up to 16 floats, the base aligned to 64 bytes inside
 * the caller's buffer):
 *   fwd, bwd_data: U[16·Cin·Cout] | T × {V[16·TB·Cin] | M[16·TB·Cout]}
 *   bwd_filter:    T × {V[16·TB·C] | D[16·TB·K] | Macc[16·K·C] | db[K]}
 */
#include <stdint.h>
#include <string.h>
#include <immintrin.h>
#include <omp.h>

#include "cpu/cpu_internal.h"

#define WFN __attribute__((target("avx2,fma,f16c")))
#define WIN static inline __attribute__((always_inline, target("avx2,fma,f16c")))

#define MR 6            /* GEMM micro-kernel rows (tiles) */

/* the geometry of a forward-form convolution: x [n][h][w][ci] → y [n][p][q][co], pad */
typedef struct {
    int n, h, w, ci, co, pad, p, q, ty, tx, tb;
    int dt;                     /* x, y, w, dx, dy: TQ_F32, TQ_F16 or TQ_BF16 */
    size_t nt, nblk;
} wgeom;

static size_t up16(size_t f) { return (f + 15) / 16 * 16; }

/* tiles per block: V and M of a block about 96 KiB together (measured best of 96/192/384 KiB
 * on the three ResNet-20 stages, 2 threads), at least 2 rows of the kernel */
static int pick_tb(int ci, int co) {
#ifndef WINO_TB_FLOATS
#define WINO_TB_FLOATS 24576
#endif
    int tb = (int)(WINO_TB_FLOATS / (16 * (size_t)(ci + co))) / MR * MR;
    if (tb < 2 * MR) tb = 2 * MR;
    if (tb > 16 * MR) tb = 16 * MR;
    return tb;
}

static void wgeom_init(wgeom *g, int n, int h, int w, int ci, int co, int pad, int dt) {
    g->dt = dt;
    g->n = n; g->h = h; g->w = w; g->ci = ci; g->co = co; g->pad = pad;
    g->p = h + 2 * pad - 2;
    g->q = w + 2 * pad - 2;
    g->ty = (g->p + 1) / 2;
    g->tx = (g->q + 1) / 2;
    g->nt = (size_t)n * g->ty * g->tx;
    g->tb = pick_tb(ci, co);
    g->nblk = (g->nt + g->tb - 1) / g->tb;
}

int tq_cpu_wino_fits(const tq_conv_desc *d) {
    return d->r == 3 && d->s == 3 && d->stride == 1 && d->pad >= 0 && d->pad <= 2 &&
           d->x.c % 8 == 0 && d->k % 8 == 0 && d->x.h + 2 * d->pad >= 3 &&
           d->x.w + 2 * d->pad >= 3;
}

static void fwd_form(const tq_conv_desc *d, int dt, int bwd_data, wgeom *g) {
    if (bwd_data) {   /* dy [N][P][Q][K] → dx [N][H][W][C], padding 2 − pad */
        int P = d->x.h + 2 * d->pad - 2, Q = d->x.w + 2 * d->pad - 2;
        wgeom_init(g, d->x.n, P, Q, d->k, d->x.c, 2 - d->pad, dt);
    } else {
        wgeom_init(g, d->x.n, d->x.h, d->x.w, d->x.c, d->k, d->pad, dt);
    }
}

/* The workspace's sections in floats from the 64-byte aligned base, one layout for
 * tq_cpu_wino_ws and the ops: fwd/bwd_data (filter 0) U, then per thread V | M; bwd_filter
 * (filter 1) per thread V | D | Macc | db. Absent sections are 0. */
typedef struct { size_t u, v, m, d, acc, db, per, total; } wlay;

static void wlayout(const wgeom *g, int filter, int nt, wlay *L) {
    memset(L, 0, sizeof *L);
    const size_t tb = (size_t)g->tb, ci = (size_t)g->ci, co = (size_t)g->co;
    L->v = up16(16 * tb * ci);
    if (filter) {
        L->d = up16(16 * tb * co);
        L->acc = up16(16 * co * ci);
        L->db = up16(co);
    } else {
        L->u = up16(16 * ci * co);
        L->m = up16(16 * tb * co);
    }
    L->per = L->v + L->m + L->d + L->acc + L->db;
    L->total = L->u + (size_t)nt * L->per;
}

size_t tq_cpu_wino_ws(const tq_conv_desc *d, int kind, int nt) {
    wgeom g;
    wlay L;
    fwd_form(d, TQ_F32, kind == 1, &g);   /* the layout does not depend on the type */
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

/* ---- 8 channels in and out of an AVX2 register ---- */

/* 8 values of type dt from element i of p, as f32 (exact) */
WIN __m256 ld8(const void *p, size_t i, int dt) {
    if (dt == TQ_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (dt == TQ_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the low 16 bits of each 32-bit lane (values in [0, 0xffff]), in order */
WIN __m128i pack16(__m256i x) {
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(x, x), 0xD8));
}

/* 8 f32 stored as type dt at element i of p, rounded to nearest even bit for bit as
 * tq_f32_to_f16 / tq_f32_to_bf16 (kernels/common) do: a NaN becomes bf16's quiet NaN (the top
 * half | 0x40) or f16's 0x7e00 with its sign */
WIN void st8(void *p, size_t i, __m256 v, int dt) {
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

/* ---- transforms of 8 channels ---- */

/* Bᵀ d B of a 4×4 tile (d row-major, v[4a+b]) */
WIN void in_tf(const __m256 d[16], __m256 v[16]) {
    __m256 t[16];
    _Pragma("GCC unroll 16")
    for (int b = 0; b < 4; b++) {
        t[0 + b] = _mm256_sub_ps(d[0 + b], d[8 + b]);
        t[4 + b] = _mm256_add_ps(d[4 + b], d[8 + b]);
        t[8 + b] = _mm256_sub_ps(d[8 + b], d[4 + b]);
        t[12 + b] = _mm256_sub_ps(d[4 + b], d[12 + b]);
    }
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 4; a++) {
        const __m256 *r = t + 4 * a;
        v[4 * a + 0] = _mm256_sub_ps(r[0], r[2]);
        v[4 * a + 1] = _mm256_add_ps(r[1], r[2]);
        v[4 * a + 2] = _mm256_sub_ps(r[2], r[1]);
        v[4 * a + 3] = _mm256_sub_ps(r[1], r[3]);
    }
}

/* the 4×4 tile of x at (row y0, column x0) of the image at element img, channels c..c+7;
 * zeros outside */
WIN void load_tile(const wgeom *g, const void *x, size_t img, int y0, int x0, int c,
                   __m256 d[16]) {
    const size_t rs = (size_t)g->w * g->ci;
    const int dt = g->dt;
    if (y0 >= 0 && x0 >= 0 && y0 + 4 <= g->h && x0 + 4 <= g->w) {
        const size_t p = img + (size_t)y0 * rs + (size_t)x0 * g->ci + c;
        _Pragma("GCC unroll 16")
        for (int a = 0; a < 4; a++)
            _Pragma("GCC unroll 16")
            for (int b = 0; b < 4; b++) d[4 * a + b] = ld8(x, p + a * rs + (size_t)b * g->ci, dt);
        return;
    }
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 4; a++) {
        int yy = y0 + a;
        _Pragma("GCC unroll 16")
        for (int b = 0; b < 4; b++) {
            int xx = x0 + b;
            d[4 * a + b] = yy >= 0 && yy < g->h && xx >= 0 && xx < g->w
                               ? ld8(x, img + (size_t)yy * rs + (size_t)xx * g->ci + c, dt)
                               : _mm256_setzero_ps();
        }
    }
}

/* the input transform of tiles [t0, t0+cnt) into V[16][tb][ci]; rows cnt..tb−1 zeroed up to
 * the next multiple of MR (the GEMM reads them) */
WFN static void input_block(const wgeom *g, const void *x, size_t t0, int cnt, float *V) {
    const size_t plane = (size_t)g->tb * g->ci;
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        const size_t img = (size_t)n * g->h * g->w * g->ci;
        for (int c = 0; c < g->ci; c += 8) {
            __m256 d[16], v[16];
            load_tile(g, x, img, 2 * ty - g->pad, 2 * tx - g->pad, c, d);
            in_tf(d, v);
            float *o = V + (size_t)i * g->ci + c;
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) _mm256_storeu_ps(o + e * plane, v[e]);
        }
    }
    int pad_to = (cnt + MR - 1) / MR * MR;
    _Pragma("GCC unroll 16")
    for (int e = 0; e < 16; e++)
        memset(V + e * plane + (size_t)cnt * g->ci, 0,
               (size_t)(pad_to - cnt) * g->ci * sizeof(float));
}

/* M[rows][co] = V[rows][ci] · U[ci][co] for rows a multiple of MR (co a multiple of 8) */
WFN static void gemm_block(int rows, int ci, int co, const float *V, const float *U, float *M) {
    for (int r0 = 0; r0 < rows; r0 += MR) {
        const float *a = V + (size_t)r0 * ci;
        float *m = M + (size_t)r0 * co;
        int k = 0;
        for (; k + 16 <= co; k += 16) {
            __m256 acc[MR][2];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
            const float *b = U + k;
            for (int c = 0; c < ci; c++, b += co) {
                __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
                _Pragma("GCC unroll 16")
                for (int i = 0; i < MR; i++) {
                    __m256 av = _mm256_broadcast_ss(a + (size_t)i * ci + c);
                    acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
                }
            }
            _Pragma("GCC unroll 16")
            for (int i = 0; i < MR; i++) {
                _mm256_storeu_ps(m + (size_t)i * co + k, acc[i][0]);
                _mm256_storeu_ps(m + (size_t)i * co + k + 8, acc[i][1]);
            }
        }
        if (k < co) {
            __m256 acc[MR];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < MR; i++) acc[i] = _mm256_setzero_ps();
            const float *b = U + k;
            for (int c = 0; c < ci; c++, b += co) {
                __m256 b0 = _mm256_loadu_ps(b);
                _Pragma("GCC unroll 16")
                for (int i = 0; i < MR; i++)
                    acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + (size_t)i * ci + c), b0, acc[i]);
            }
            _Pragma("GCC unroll 16")
            for (int i = 0; i < MR; i++) _mm256_storeu_ps(m + (size_t)i * co + k, acc[i]);
        }
    }
}

/* the output transform of tiles [t0, t0+cnt) from M[16][tb][co]: y = beta·y + Aᵀ m A + bias
 * (beta 0 does not read y) */
WFN static void output_block(const wgeom *g, const float *M, const float *bias, float beta,
                             size_t t0, int cnt, void *y) {
    const size_t plane = (size_t)g->tb * g->co;
    const size_t rs = (size_t)g->q * g->co;
    const __m256 vb = _mm256_set1_ps(beta);
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        int oy = 2 * ty, ox = 2 * tx;
        const size_t img = (size_t)n * g->p * rs;
        for (int k = 0; k < g->co; k += 8) {
            const float *s = M + (size_t)i * g->co + k;
            __m256 m[16], u[8];
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) m[e] = _mm256_loadu_ps(s + e * plane);
            _Pragma("GCC unroll 16")
            for (int b = 0; b < 4; b++) {   /* Aᵀ m: rows 0, 1 */
                u[b] = _mm256_add_ps(_mm256_add_ps(m[b], m[4 + b]), m[8 + b]);
                u[4 + b] = _mm256_sub_ps(_mm256_sub_ps(m[4 + b], m[8 + b]), m[12 + b]);
            }
            __m256 bv = bias ? _mm256_loadu_ps(bias + k) : _mm256_setzero_ps();
            _Pragma("GCC unroll 16")
            for (int a = 0; a < 2; a++) {
                if (oy + a >= g->p) break;
                const __m256 *r = u + 4 * a;
                __m256 o[2];
                o[0] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(r[0], r[1]), r[2]), bv);
                o[1] = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(r[1], r[2]), r[3]), bv);
                _Pragma("GCC unroll 16")
                for (int b = 0; b < 2; b++) {
                    if (ox + b >= g->q) break;
                    size_t p = img + (size_t)(oy + a) * rs + (size_t)(ox + b) * g->co + k;
                    __m256 v = o[b];
                    if (beta != 0.0f) v = _mm256_fmadd_ps(vb, ld8(y, p, g->dt), v);
                    st8(y, p, v, g->dt);
                }
            }
        }
    }
}

/* ---- the filter transform: U[ξ][ci][co] = (G g Gᵀ)ξ ---- */

/* G g Gᵀ of a 3×3 kernel (g row-major) */
WIN void filt_tf(const __m256 g[9], __m256 u[16]) {
    const __m256 h = _mm256_set1_ps(0.5f);
    __m256 t[12];   /* G g: 4 rows × 3 columns */
    _Pragma("GCC unroll 16")
    for (int s = 0; s < 3; s++) {
        __m256 a = g[s], b = g[3 + s], c = g[6 + s];
        __m256 ac = _mm256_add_ps(a, c);
        t[s] = a;
        t[3 + s] = _mm256_mul_ps(h, _mm256_add_ps(ac, b));
        t[6 + s] = _mm256_mul_ps(h, _mm256_sub_ps(ac, b));
        t[9 + s] = c;
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < 4; r++) {   /* (G g) Gᵀ */
        __m256 a = t[3 * r], b = t[3 * r + 1], c = t[3 * r + 2];
        __m256 ac = _mm256_add_ps(a, c);
        u[4 * r + 0] = a;
        u[4 * r + 1] = _mm256_mul_ps(h, _mm256_add_ps(ac, b));
        u[4 * r + 2] = _mm256_mul_ps(h, _mm256_sub_ps(ac, b));
        u[4 * r + 3] = c;
    }
}

/* w [K][3][3][C]. fwd: ci = C, co = K, g = w[k][·][·][c]. bwd_data (flip): ci = K, co = C,
 * g[r][s] = w[k][2−r][2−s][c]. Vectors run over C (contiguous in w) and scatter into U. */
WFN static void filter_block(const void *w, int dt, int K, int C, int flip, int k0, int k1,
                             float *U) {
    const int ci = flip ? K : C, co = flip ? C : K;
    const size_t plane = (size_t)ci * co;
    for (int k = k0; k < k1; k++) {
        for (int c = 0; c < C; c += 8) {
            __m256 g[9], u[16];
            _Pragma("GCC unroll 16")
            for (int rs = 0; rs < 9; rs++) {
                int src = flip ? 8 - rs : rs;
                g[rs] = ld8(w, ((size_t)k * 9 + src) * C + c, dt);
            }
            filt_tf(g, u);
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) {
                float tmp[8];
                _mm256_storeu_ps(tmp, u[e]);
                float *o = U + e * plane;
                _Pragma("GCC unroll 16")
                for (int j = 0; j < 8; j++) {
                    /* fwd: U[e][c+j][k]; flip: U[e][k][c+j] */
                    size_t idx = flip ? (size_t)k * co + c + j : (size_t)(c + j) * co + k;
                    o[idx] = tmp[j];
                }
            }
        }
    }
}

/* ---- fwd / bwd_data ---- */

WFN static void fwd_blocks(const wgeom *g, const void *x, const float *U, const float *bias,
                           float beta, void *y, float *V, float *M, size_t b) {
    size_t t0;
    int cnt = block_tiles(g, b, &t0);
    int rows = (cnt + MR - 1) / MR * MR;
    input_block(g, x, t0, cnt, V);
    const size_t vp = (size_t)g->tb * g->ci, mp = (size_t)g->tb * g->co,
                 up = (size_t)g->ci * g->co;
    _Pragma("GCC unroll 16")
    for (int e = 0; e < 16; e++) gemm_block(rows, g->ci, g->co, V + e * vp, U + e * up, M + e * mp);
    output_block(g, M, bias, beta, t0, cnt, y);
}

static void run_fwd_form(const wgeom *g, int nt, const void *x, const void *w, int K, int C,
                         int flip, const float *bias, float beta, void *y, void *ws) {
    wlay L;
    wlayout(g, 0, nt, &L);
    float *U = align64(ws);
#pragma omp parallel num_threads(nt)
    {
        int T = omp_get_num_threads(), t = omp_get_thread_num();
        filter_block(w, g->dt, K, C, flip, (int)((long long)K * t / T), (int)((long long)K * (t + 1) / T), U);
#pragma omp barrier
        float *V = U + L.u + (size_t)t * L.per, *M = V + L.v;
#pragma omp for schedule(dynamic, 1)
        for (size_t b = 0; b < g->nblk; b++) fwd_blocks(g, x, U, bias, beta, y, V, M, b);
    }
}

int tq_cpu_wino_fwd(int nt, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x,
                    const void *w, const float *bias, void *ws) {
    wgeom g;
    fwd_form(d, dt, 0, &g);
    run_fwd_form(&g, nt, x, w, d->k, d->x.c, 0, bias, 0.0f, y, ws);
    return TQ_OK;
}

int tq_cpu_wino_bwd_data(int nt, const tq_conv_desc *d, tq_dtype dt, void *dx, float beta,
                         const void *dy, const void *w, void *ws) {
    wgeom g;
    fwd_form(d, dt, 1, &g);
    run_fwd_form(&g, nt, dy, w, d->k, d->x.c, 1, NULL, beta, dx, ws);
    return TQ_OK;
}

/* ---- bwd_filter ---- */

/* A dY Aᵀ of the 2×2 tile of dy at (oy, ox) for outputs k..k+7 (zeros outside), and the
 * tile's sum for db */
WIN void dy_tile(const wgeom *g, const void *dy, size_t img, int oy, int ox, int k, __m256 e[16],
                 __m256 *sum) {
    const size_t rs = (size_t)g->q * g->co;
    __m256 y[4];
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 2; a++)
        _Pragma("GCC unroll 16")
        for (int b = 0; b < 2; b++)
            y[2 * a + b] = oy + a < g->p && ox + b < g->q
                               ? ld8(dy, img + (size_t)(oy + a) * rs + (size_t)(ox + b) * g->co + k, g->dt)
                               : _mm256_setzero_ps();
    *sum = _mm256_add_ps(_mm256_add_ps(y[0], y[1]), _mm256_add_ps(y[2], y[3]));
    __m256 t[8];   /* A dY: 4 rows × 2 columns */
    _Pragma("GCC unroll 16")
    for (int b = 0; b < 2; b++) {
        t[b] = y[b];
        t[2 + b] = _mm256_add_ps(y[b], y[2 + b]);
        t[4 + b] = _mm256_sub_ps(y[b], y[2 + b]);
        t[6 + b] = _mm256_sub_ps(_mm256_setzero_ps(), y[2 + b]);
    }
    _Pragma("GCC unroll 16")
    for (int a = 0; a < 4; a++) {   /* (A dY) Aᵀ */
        __m256 p = t[2 * a], q = t[2 * a + 1];
        e[4 * a + 0] = p;
        e[4 * a + 1] = _mm256_add_ps(p, q);
        e[4 * a + 2] = _mm256_sub_ps(p, q);
        e[4 * a + 3] = _mm256_sub_ps(_mm256_setzero_ps(), q);
    }
}

/* D[16][tb][K] of tiles [t0, t0+cnt); db += the tiles' sums */
WFN static void dy_block(const wgeom *g, const void *dy, size_t t0, int cnt, float *D, float *db) {
    const size_t plane = (size_t)g->tb * g->co;
    for (int i = 0; i < cnt; i++) {
        int n, ty, tx;
        tile_at(g, t0 + i, &n, &ty, &tx);
        const size_t img = (size_t)n * g->p * g->q * g->co;
        for (int k = 0; k < g->co; k += 8) {
            __m256 e[16], s;
            dy_tile(g, dy, img, 2 * ty, 2 * tx, k, e, &s);
            _mm256_storeu_ps(db + k, _mm256_add_ps(_mm256_loadu_ps(db + k), s));
            float *o = D + (size_t)i * g->co + k;
            _Pragma("GCC unroll 16")
            for (int j = 0; j < 16; j++) _mm256_storeu_ps(o + j * plane, e[j]);
        }
    }
}

/* Macc[K][C] += D[cnt][K]ᵀ · V[cnt][C] (K a multiple of 8, C of 8): rows of 4 k × 16 c */
WFN static void gemm_tn(int cnt, int K, int C, const float *D, const float *V, float *Macc) {
    for (int k0 = 0; k0 < K; k0 += 4) {
        int c = 0;
        for (; c + 16 <= C; c += 16) {
            __m256 acc[4][2];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
            for (int t = 0; t < cnt; t++) {
                const float *v = V + (size_t)t * C + c, *dd = D + (size_t)t * K + k0;
                __m256 b0 = _mm256_loadu_ps(v), b1 = _mm256_loadu_ps(v + 8);
                _Pragma("GCC unroll 16")
                for (int i = 0; i < 4; i++) {
                    __m256 a = _mm256_broadcast_ss(dd + i);
                    acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
                }
            }
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 4; i++) {
                float *m = Macc + (size_t)(k0 + i) * C + c;
                _mm256_storeu_ps(m, _mm256_add_ps(_mm256_loadu_ps(m), acc[i][0]));
                _mm256_storeu_ps(m + 8, _mm256_add_ps(_mm256_loadu_ps(m + 8), acc[i][1]));
            }
        }
        if (c < C) {
            __m256 acc[4];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 4; i++) acc[i] = _mm256_setzero_ps();
            for (int t = 0; t < cnt; t++) {
                __m256 b0 = _mm256_loadu_ps(V + (size_t)t * C + c);
                const float *dd = D + (size_t)t * K + k0;
                _Pragma("GCC unroll 16")
                for (int i = 0; i < 4; i++)
                    acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + i), b0, acc[i]);
            }
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 4; i++) {
                float *m = Macc + (size_t)(k0 + i) * C + c;
                _mm256_storeu_ps(m, _mm256_add_ps(_mm256_loadu_ps(m), acc[i]));
            }
        }
    }
}

/* dw[k][·][·][c..c+7] += Gᵀ M G of the 16 accumulated products (m[ξ] for 8 channels) */
WIN void filt_out(const __m256 m[16], float *dwk, int C, int c) {
    const __m256 h = _mm256_set1_ps(0.5f);
    __m256 t[12];   /* Gᵀ M: 3 rows × 4 columns */
    _Pragma("GCC unroll 16")
    for (int b = 0; b < 4; b++) {
        __m256 s12 = _mm256_mul_ps(h, _mm256_add_ps(m[4 + b], m[8 + b]));
        t[b] = _mm256_add_ps(m[b], s12);
        t[4 + b] = _mm256_mul_ps(h, _mm256_sub_ps(m[4 + b], m[8 + b]));
        t[8 + b] = _mm256_add_ps(s12, m[12 + b]);
    }
    _Pragma("GCC unroll 16")
    for (int r = 0; r < 3; r++) {   /* (Gᵀ M) G */
        const __m256 *q = t + 4 * r;
        __m256 s12 = _mm256_mul_ps(h, _mm256_add_ps(q[1], q[2]));
        __m256 o[3] = { _mm256_add_ps(q[0], s12), _mm256_mul_ps(h, _mm256_sub_ps(q[1], q[2])),
                        _mm256_add_ps(s12, q[3]) };
        _Pragma("GCC unroll 16")
        for (int s = 0; s < 3; s++) {
            float *p = dwk + (size_t)(3 * r + s) * C + c;
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), o[s]));
        }
    }
}

WFN static void bwdf_thread(const wgeom *g, const void *x, const void *dy, float *V, float *D,
                            float *Macc, float *db, size_t b0, size_t b1) {
    const int C = g->ci, K = g->co;
    memset(Macc, 0, 16 * (size_t)K * C * sizeof(float));
    memset(db, 0, (size_t)K * sizeof(float));
    const size_t vp = (size_t)g->tb * C, dp = (size_t)g->tb * K, mp = (size_t)K * C;
    for (size_t b = b0; b < b1; b++) {
        size_t t0;
        int cnt = block_tiles(g, b, &t0);
        input_block(g, x, t0, cnt, V);
        dy_block(g, dy, t0, cnt, D, db);
        _Pragma("GCC unroll 16")
        for (int e = 0; e < 16; e++) gemm_tn(cnt, K, C, D + e * dp, V + e * vp, Macc + e * mp);
    }
}

/* dw[k][·][·][c] += Gᵀ(Σ_threads Macc_t)G for k in [k0, k1); db[k] += Σ_t db_t[k] */
WFN static void bwdf_reduce(const wgeom *g, float *const *macc, float *const *dbt, int T,
                            float *dw, float *db, int k0, int k1) {
    const int C = g->ci, K = g->co;
    const size_t mp = (size_t)K * C;
    for (int k = k0; k < k1; k++) {
        for (int c = 0; c < C; c += 8) {
            __m256 m[16];
            _Pragma("GCC unroll 16")
            for (int e = 0; e < 16; e++) {
                size_t o = e * mp + (size_t)k * C + c;
                __m256 s = _mm256_loadu_ps(macc[0] + o);
                for (int t = 1; t < T; t++) s = _mm256_add_ps(s, _mm256_loadu_ps(macc[t] + o));
                m[e] = s;
            }
            filt_out(m, dw + (size_t)k * 9 * C, C, c);
        }
        if (db) {
            float s = dbt[0][k];
            for (int t = 1; t < T; t++) s += dbt[t][k];
            db[k] += s;
        }
    }
}

int tq_cpu_wino_bwd_filter(int nt, const tq_conv_desc *d, tq_dtype dt, float *dw, float *db,
                           const void *x, const void *dy, void *ws) {
    wgeom g;
    wlay L;
    fwd_form(d, dt, 0, &g);
    enum { TMAX = 256 };
    if (nt > TMAX) nt = TMAX;
    wlayout(&g, 1, nt, &L);
    const int K = d->k;
    float *base = align64(ws);
    float *macc[TMAX], *dbt[TMAX];
#pragma omp parallel num_threads(nt)
    {
        int T = omp_get_num_threads(), t = omp_get_thread_num();
        float *V = base + (size_t)t * L.per, *D = V + L.v;
        macc[t] = D + L.d;
        dbt[t] = macc[t] + L.acc;
        bwdf_thread(&g, x, dy, V, D, macc[t], dbt[t], g.nblk * t / T, g.nblk * (t + 1) / T);
#pragma omp barrier
        bwdf_reduce(&g, macc, dbt, T, dw, db, (int)((long long)K * t / T),
                    (int)((long long)K * (t + 1) / T));
    }
    return TQ_OK;
}
