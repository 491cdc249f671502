/* cpu_internal.h — what the CPU backend's translation units share (not a public header).
 *
 * Contract: the tq_cpu_* functions below are the CPU implementations of tq_backend_i's slots
 * (same arguments, same semantics as backend.h); cpu_backend.c puts them in the vtable. They
 * run on the caller's thread and fan out with OpenMP (be->threads threads); convolutions
 * and linear layers (f32, bf16) to oneDNN, the rest of the GEMMs (f16 linear layers, the im2col
 * path) to OpenBLAS (pinned to one thread, split by our teams). Nothing here
 * allocates per call (oneDNN primitives are created once per descriptor and cached in be->ctx);
 * scratch comes from the caller's workspace or from bounded stack arrays.
 */
#ifndef TQ_CPU_INTERNAL_H
#define TQ_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "backend.h"

/* Element-wise loops go parallel above this many elements. */
#define TQ_PAR_MIN 32768
/* Element-wise loops are cut into blocks of this many elements (one dtype dispatch per block). */
#define TQ_BLK 4096
/* Per-channel reductions handle at most this many channels at a time (bounded stack use). */
#define TQ_CGROUP 256

#define TQ_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Calls F(<literal dtype>, ...) so that an always-inline F is specialised per dtype. */
#define TQ_DT_CALL(dt, F, ...)                                     \
    do {                                                           \
        if ((dt) == TQ_F32) F(TQ_F32, __VA_ARGS__);                \
        else if ((dt) == TQ_F16) F(TQ_F16, __VA_ARGS__);           \
        else F(TQ_BF16, __VA_ARGS__);                              \
    } while (0)

/* `for` loop LOOP with `omp simd` (dt a literal in an always-inline kernel): GCC's -O2 cost
 * model leaves most loops scalar. The 16-bit conversions of kernels/common are shifts and
 * selects, so every dtype's instance vectorises. The loops it is used on carry no dependence
 * between iterations, so the vector loop computes bit for bit what the scalar one does. */
#define TQ_SIMD(dt, ...)                                           \
    do {                                                           \
        (void)(dt);                                                \
        _Pragma("omp simd") __VA_ARGS__                            \
    } while (0)

static inline int tq_cpu_nt(const tq_backend *be) { return be->threads > 0 ? be->threads : 1; }
static inline int tq_cpu_dt_ok(tq_dtype dt) { return dt == TQ_F32 || dt == TQ_F16 || dt == TQ_BF16; }

/* Per-channel sums over `m` rows of a row-major [m][ld] array of dtype dt, for the channel
 * window [c0, c0+cw), cw <= TQ_CGROUP. Results (double, indexed 0..cw-1):
 *   TQ_RED_SUM:   s0 = Σ a
 *   TQ_RED_SHSQ:  s0 = Σ (a − off),  s1 = Σ (a − off)²     (shifted sums for mean/variance)
 *   TQ_RED_DOT:   s0 = Σ a,          s1 = Σ a·(b − off)    (batch-norm backward)
 *   TQ_RED_DOTM:  TQ_RED_DOT with a taken as 0 where mk <= 0  (… behind a ReLU: relu_bwd's mask)
 * off is indexed 0..cw-1; mk is read by TQ_RED_DOTM only. The summation order depends only on (m, cw), never on the thread
 * count, so results are reproducible. */
typedef enum { TQ_RED_SUM, TQ_RED_SHSQ, TQ_RED_DOT, TQ_RED_DOTM } tq_red_mode;

/* a switch of the CPU's own conversions: *state, or where it is −1 (undecided) 1 when has() says
 * the CPU has them and the environment variable `var` is not "0", else 0, kept in *state
 * (decided once; a race writes the same value). The tests' setters put 1, 0 or −1 there. */
int tq_cpu_native_switch(int *state, const char *var, int (*has)(void));

/* batch-norm's bf16 norm and dx passes with AVX512_BF16's conversion (cpu_bn_bf16.c): the same
 * bits as cpu_bn.c's; tq_cpu_bf16_native: 1 where the CPU has it and TQ_CPU_BF16_NATIVE is not 0 */
int tq_cpu_bf16_native(void);
int tq_cpu_bf16_cpu(void);                /* the CPU has AVX512_BF16 (and BW, VL, DQ) */
void tq_cpu_bf16_native_set(int on);      /* tests: 1 on (where the CPU has it), 0 off, -1 as the environment says */
void tq_cpu_norm_block_bf16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *y,
                             const void *x, const void *res, const float *mu, const float *is,
                             const float *g, const float *b, int relu);
void tq_cpu_bn_dx_block_bf16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *dx,
                              float beta_dx, const void *dy, const void *x, const void *ry,
                              void *dres, float beta_res, const float *mu, const float *is,
                              const float *g, const float *sdb, const float *sdg, float inv_m);
/* f16 through F16C (cpu_f16c.c): batch-norm's norm and dx passes and reduction blocks, max
 * pooling's rows and the casts between f16 and f32, the same bits as cpu_bn.c's, cpu_pool.c's
 * and cpu_elem.c's; tq_cpu_f16_native: 1 where the CPU has AVX2, FMA and F16C
 * (tq_cpu_avx2_f16c, which the Winograd and thin kernels need too) and TQ_CPU_F16_NATIVE is not 0 */
int tq_cpu_avx2_f16c(void);
int tq_cpu_f16_native(void);
void tq_cpu_f16_native_set(int on);       /* tests: 1 on (where the CPU has it), 0 off, -1 as the environment says */
void tq_cpu_norm_block_f16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *y,
                            const void *x, const void *res, const float *mu, const float *is,
                            const float *g, const float *b, int relu);
void tq_cpu_bn_dx_block_f16n(size_t r0, size_t r1, size_t ld, size_t c0, int cw, void *dx,
                             float beta_dx, const void *dy, const void *x, const void *ry,
                             void *dres, float beta_res, const float *mu, const float *is,
                             const float *g, const float *sdb, const float *sdg, float inv_m);
/* red_block (cpu_bn_rows.h) of f16 rows [r0, r1) (at most RED_RB), jw <= FOLD_MIN lanes */
void tq_cpu_red_block_f16n(tq_red_mode mode, size_t r0, size_t r1, size_t ld, size_t col, int jw,
                           const void *a, const void *b, const void *mk, const float *of, float *f0,
                           float *f1);
void tq_cpu_cast_f16n(size_t i0, size_t i1, tq_dtype ddt, void *dst, const void *src);
/* max pooling's f16 rows (cpu_pool_rows.h's arguments): 1 done, 0 left to the emulated rows */
int tq_cpu_maxpool_row_f16n(tq_shape s, int img, int oh, void *y, const void *x, int relu);
int tq_cpu_maxpool_bwd_rows_f16n(tq_shape s, int img, int oh, void *dx, float beta, const void *dy,
                                 const void *x, int relu);
void tq_cpu_chan_sums(tq_backend *be, tq_red_mode mode, size_t m, size_t ld, size_t c0, int cw,
                      tq_dtype dt, const void *a, const void *b, const void *mk, const float *off,
                      double *s0, double *s1);
/* db[k] += Σ over m rows of dy[row][k] (K channels a row): a bias gradient, summed in double */
void tq_cpu_bias_grad(tq_backend *be, size_t m, int K, tq_dtype dt, const void *dy, float *db);

/* memory / lifecycle: cpu_backend.c. be->ctx is a tq_cpu_ctx. */
typedef struct tq_dnnl tq_dnnl;
typedef struct {
    tq_dnnl *dnnl;      /* oneDNN engine, stream and primitive cache (created on first use) */
    int dnnl_off;       /* oneDNN unavailable or turned off (TQ_CPU_DNNL=0) */
    int wino;           /* Winograd 3×3 convolutions: 0 not decided yet, or a wino_mode */
    int wino_forced;    /* TQ_CPU_WINOGRAD=1: every convolution it fits (no wino_few) */
    int wino_vec;       /* their registers: 8 channels (AVX2) or 16 (AVX-512) */
    int wino_amx;       /* oneDNN has AMX here: bf16 stays with its tile kernels */
    int wino_tile;      /* fwd and bwd_data's output tile: 2 (F(2×2, 3×3)) or 4 (F(4×4, 3×3)) */
    int wino_tile_bwdf; /* bwd_filter's (2 unless TQ_CPU_WINO_TILE=4: cpu_conv.c, vec_kernels_init) */
    int thin;           /* the direct kernels of few input channels (tq_cpu_thin_*): 0 off, 1 where
                           they win (cpu_conv.c, thin_use), 2 wherever they fit */
    unsigned char fetch[TQ_FETCH_SLOTS][TQ_FETCH_BYTES];   /* fetch_begin's slots (copied at once) */
    double fetch_ms[TQ_FETCH_SLOTS];
} tq_cpu_ctx;

/* f32 and bf16 convolutions through oneDNN: cpu_dnnl.c. The ops return TQ_DNNL_NA when oneDNN
 * does not run this descriptor and type (f16, turned off, or no primitive for it on this CPU):
 * the caller then runs the im2col path. tq_dnnl_conv_need: 1 and the workspace bytes of `kind`
 * (0 fwd, 1 bwd_data, 2 bwd_filter) when oneDNN runs it, else 0. Descriptors must be valid
 * (geom-checked). */
#define TQ_DNNL_NA 1
/* tests: the forward and weight gradient as GEMMs (cpu_dnnl.c, gemm_route) 0 never, 1 where the
 * rule says, 2 for every f32/bf16 convolution, −1 as TQ_CPU_CONV_GEMM says; read when a
 * descriptor's kind is made. tq_dnnl_conv_is_gemm: that kind (0 fwd, 1 bwd_data, 2 bwd_filter) runs so. */
void tq_cpu_conv_gemm_set(int mode);
int tq_dnnl_conv_is_gemm(tq_backend *, const tq_conv_desc *, tq_dtype dt, int kind);
int tq_dnnl_conv_need(tq_backend *, const tq_conv_desc *, tq_dtype dt, int kind, size_t *bytes);
int tq_dnnl_conv_fwd(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *y, const void *x,
                     const void *w, const float *bias, void *ws, size_t ws_bytes);
int tq_dnnl_conv_bwd_data(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *dx, float beta,
                          const void *dy, const void *w, void *ws, size_t ws_bytes);
int tq_dnnl_conv_bwd_filter(tq_backend *, const tq_conv_desc *, tq_dtype dt, float *dw,
                            float *db, const void *x, const void *dy, void *ws,
                            size_t ws_bytes);
/* bf16 linear layers through oneDNN inner products (cpu_dnnl.c); the same conventions, kind
 * included */
/* linear layers as inner products; d is the layer's 1×1 geometry (tq_cpu_lin_desc) */
int tq_dnnl_linear_need(tq_backend *, const tq_conv_desc *d, tq_dtype dt, int kind, size_t *bytes);
int tq_dnnl_linear_fwd(tq_backend *, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x,
                       const void *w, const float *bias, void *ws, size_t ws_bytes);
int tq_dnnl_linear_bwd_data(tq_backend *, const tq_conv_desc *d, tq_dtype dt, void *dx,
                            float beta, const void *dy, const void *w, void *ws, size_t ws_bytes);
int tq_dnnl_linear_bwd_filter(tq_backend *, const tq_conv_desc *d, tq_dtype dt, float *dw,
                              float *db, const void *x, const void *dy, void *ws,
                              size_t ws_bytes);
void tq_dnnl_free(tq_dnnl *);
/* 1 when oneDNN runs here (not turned off) and its best ISA on this CPU is below AVX-512 */
int tq_dnnl_below_avx512(tq_backend *);
/* Winograd's reach (cpu_conv.c, wino_use): every convolution it fits, those of 32+ channels, none */
enum { WINO_ALL = 1, WINO_WIDE = 2, WINO_OFF = 3 };
/* 1 on a GenuineIntel CPU (CPUID leaf 0) */
int tq_cpu_is_intel(void);
/* 1 when oneDNN can use AMX here (its ISA reaches avx512_core_amx): its bf16 kernels then run
 * on the tile units */
int tq_dnnl_has_amx(tq_backend *);

/* 3×3 stride-1 convolutions (f32, f16, bf16) by Winograd F(2×2, 3×3) and F(4×4, 3×3) on AVX2:
 * cpu_wino.c. fits: the descriptor is one it runs (3×3, stride 1, pad <= 2, channels multiples
 * of 8); the caller checks that the CPU has AVX2, FMA and F16C. ws: workspace bytes of kind
 * (0 fwd, 1 bwd_data, 2 bwd_filter) for nt threads and tile. tile: the output tile, 2
 * (F(2×2, 3×3)) or 4 (F(4×4, 3×3)). The ops never fail on a fitting descriptor and a big
 * enough workspace. */
int tq_cpu_wino_fits(const tq_conv_desc *d);
size_t tq_cpu_wino_ws(const tq_conv_desc *d, int kind, int nt, int tile);
/* vec 16: the GEMMs on AVX-512 registers where the channels are multiples of 16 (fits512; the
 * caller checks that the CPU has AVX-512F), the same bits as vec 8 (AVX2) */
int tq_cpu_wino_fits512(const tq_conv_desc *d);
int tq_cpu_wino_products(const tq_conv_desc *d, int kind, int tile, size_t *outputs);
int tq_cpu_wino_fwd(int nt, int vec, int tile, const tq_conv_desc *d, tq_dtype dt, void *y,
                    const void *x, const void *w, const float *bias, void *ws);
int tq_cpu_wino_bwd_data(int nt, int vec, int tile, const tq_conv_desc *d, tq_dtype dt, void *dx,
                         float beta, const void *dy, const void *w, void *ws);
int tq_cpu_wino_bwd_filter(int nt, int vec, int tile, const tq_conv_desc *d, tq_dtype dt, float *dw,
                           float *db, const void *x, const void *dy, void *ws);
/* Direct 3×3 stride-1 convolutions of 1 to 4 input channels (a network's first layer), forward
 * and filter gradient, vectors over the output channels (a multiple of 8; of 16 for vec 16):
 * cpu_wino.c, cpu_thin_vec.h. The same CPU requirements as the Winograd kernels; ws: the bytes
 * of kind 0 or 2 for nt threads (0 for bwd_data, which these kernels do not run). */
int tq_cpu_thin_fits(const tq_conv_desc *d);
size_t tq_cpu_thin_ws(const tq_conv_desc *d, int kind, int nt);
int tq_cpu_thin_fwd(int nt, int vec, const tq_conv_desc *d, tq_dtype dt, void *y, const void *x,
                    const void *w, const float *bias, void *ws);
int tq_cpu_thin_bwd_filter(int nt, int vec, const tq_conv_desc *d, tq_dtype dt, float *dw, float *db,
                           const void *x, const void *dy, void *ws);

/* convolution and linear: cpu_conv.c */
size_t tq_cpu_conv_ws(tq_backend *, const tq_conv_desc *, tq_dtype dt);
int tq_cpu_conv_fwd(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *y, const void *x,
                    const void *w, const float *bias, void *ws, size_t ws_bytes);
int tq_cpu_conv_bwd_data(tq_backend *, const tq_conv_desc *, tq_dtype dt, void *dx, float beta,
                         const void *dy, const void *w, void *ws, size_t ws_bytes);
int tq_cpu_conv_bwd_filter(tq_backend *, const tq_conv_desc *, tq_dtype dt, float *dw, float *db,
                           const void *x, const void *dy, void *ws, size_t ws_bytes);
size_t tq_cpu_linear_ws(tq_backend *, int n, int in, int out, tq_dtype dt);
int tq_cpu_linear_fwd(tq_backend *, int n, int in, int out, tq_dtype dt, void *y, const void *x,
                      const void *w, const float *bias, void *ws, size_t ws_bytes);
int tq_cpu_linear_bwd_data(tq_backend *, int n, int in, int out, tq_dtype dt, void *dx,
                           float beta, const void *dy, const void *w, void *ws, size_t ws_bytes);
int tq_cpu_linear_bwd_filter(tq_backend *, int n, int in, int out, tq_dtype dt, float *dw,
                             float *db, const void *x, const void *dy, void *ws, size_t ws_bytes);

/* the convolution's op (0 fwd, 1 bwd_data with this beta, 2 bwd_filter) runs Winograd (cpu_wino.c),
 * as tq_cpu_conv_* decide (cpu_conv.c: wino_use, wino_few) */
int tq_cpu_conv_is_wino(tq_backend *, const tq_conv_desc *, tq_dtype dt, int op, float beta);

/* zeroes bytes at p, in one piece per thread when large (cpu_backend.c: the memset0 slot's own
 * work, for the backend's internal use) */
void tq_cpu_zero(tq_backend *be, void *p, size_t bytes);

/* batch-norm: cpu_bn.c */
int tq_cpu_bn_fwd_train(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x,
                        const float *gamma, const float *beta, float *save_mean,
                        float *save_invstd, float *run_mean, float *run_var, float momentum,
                        float eps, const void *res, int relu);
int tq_cpu_bn_norm(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x, const void *res,
                   const float *gamma, const float *beta, const float *mean, const float *invstd,
                   int relu);
int tq_cpu_bn_fwd_infer(tq_backend *, tq_shape, tq_dtype dt, void *y, const void *x,
                        const float *gamma, const float *beta, const float *run_mean,
                        const float *run_var, float eps, const void *res, int relu);
int tq_cpu_bn_bwd(tq_backend *, tq_shape, tq_dtype dt, void *dx, float beta_dx, float *dgamma,
                  float *dbeta, const void *dy, const void *x, const float *gamma,
                  const float *save_mean, const float *save_invstd, const void *relu_y,
                  void *dres, float beta_dres);

/* element-wise, casts, flat-buffer passes: cpu_elem.c */
int tq_cpu_relu_fwd(tq_backend *, size_t n, tq_dtype dt, void *y, const void *x);
int tq_cpu_relu_bwd(tq_backend *, size_t n, tq_dtype dt, void *dx, float beta, const void *dy,
                    const void *y);
int tq_cpu_add_fwd(tq_backend *, size_t n, tq_dtype dt, void *y, const void *a, const void *b);
int tq_cpu_accumulate(tq_backend *, size_t n, tq_dtype dt, void *dst, float beta,
                      const void *src);
int tq_cpu_cast(tq_backend *, size_t n, tq_dtype dst_dt, void *dst, tq_dtype src_dt,
                const void *src);
int tq_cpu_unscale_check(tq_backend *, size_t n, float *g, float inv_scale, float *found_inf);
int tq_cpu_sgd_step(tq_backend *, size_t n, float *w, const float *g, float *buf, float lr,
                    float momentum, float wd, int nesterov, const float *skip, void *wlow,
                    tq_dtype wdt);
int tq_cpu_adamw_step(tq_backend *, size_t n, float *w, const float *g, float *m, float *v,
                      float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                      const float *skip, void *wlow, tq_dtype wdt);

/* pooling, loss, data: cpu_pool.c */
int tq_cpu_maxpool_fwd(tq_backend *, tq_shape x, tq_dtype dt, void *y, const void *xp, int relu);
int tq_cpu_maxpool_bwd(tq_backend *, tq_shape x, tq_dtype dt, void *dx, float beta,
                       const void *dy, const void *xp, int relu);
int tq_cpu_avgpool_fwd(tq_backend *, tq_shape x, tq_dtype dt, void *y, const void *xp);
int tq_cpu_avgpool_bwd(tq_backend *, tq_shape x, tq_dtype dt, void *dx, float beta,
                       const void *dy);
int tq_cpu_softmax_ce(tq_backend *, int n, int classes, tq_dtype dt, void *dlogits,
                      const void *logits, const int32_t *labels, float grad_scale, float *out);
int tq_cpu_softmax_ce_eval(tq_backend *, int n, int classes, tq_dtype dt, const void *logits,
                           const int32_t *labels, float *out);
int tq_cpu_load_batch(tq_backend *, int n, int h, int w, int c, tq_dtype dt, void *x,
                      int32_t *labels, const uint8_t *images, const uint8_t *lab,
                      const int32_t *idx, const tq_aug *aug, int pad, const float *mean,
                      const float *inv_std);

/* Shape check shared by the NHWC ops: all dims > 0. Sets the error and returns TQ_EINVAL. */
int tq_cpu_check_shape(tq_backend *be, const char *op, tq_shape s, tq_dtype dt);

#endif
