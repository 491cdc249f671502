/* test_cuda_desc.c — the CUDA backend's descriptor building (kernels/cuda/cuda_desc.h), on a
 * machine without a GPU: cuDNN tensor, convolution, convolution-operation and (handle-less)
 * operation-graph descriptors and cuBLASLt matmul/layout descriptors create and finalize
 * without a device, so this runs in CI. Built only in a CUDA build.
 *
 * Checks: the dims/strides of x, w, y are the NHWC / KRSC ones (element offsets through the
 * strides equal the row-major NHWC / KRSC index); bad descriptors are refused; every op kind
 * finalizes for several shapes, strides, paddings, dtypes and both betas, and the tensors read
 * back with the dims, strides and data type that were set; a deliberately wrong output shape
 * or channel count fails with CUDNN_STATUS_BAD_PARAM and a message that names the op and the
 * wrong shape; cuBLASLt descriptors create with the transposition-trick layouts (op(A) m×k,
 * op(B) k×n, C m×n, the leading dimensions of row-major data, dtypes, epilogue, and the
 * compute type: CUBLAS_COMPUTE_32F_FAST_TF32 only for f32 with TF32 allowed); the engine-note
 * rule (TF32 tensor-core engines for f32 only with the spec's tf32 allowing them); the error
 * line carries status, call, file and line. And the backend's operation table is complete (a new
 * operation of kernels/backend.h that the CUDA backend lacks fails here, with no GPU needed).
 * cuBLASLt is not in the process until its first use (cuda_lt_load.c), then it is.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_desc.h"

static char err[512];

static const tq_conv_desc SHAPES[] = {
    { { 2, 8, 8, 3 }, 4, 3, 3, 1, 1 },        /* 3×3 same */
    { { 3, 7, 5, 16 }, 32, 3, 1, 2, 0 },      /* non-square, stride 2, no pad */
    { { 1, 32, 32, 64 }, 64, 1, 1, 1, 0 },    /* 1×1 */
    { { 4, 16, 16, 8 }, 16, 3, 3, 2, 1 },     /* downsampling 3×3 */
    { { 2, 9, 11, 5 }, 7, 5, 5, 3, 2 },       /* odd everything */
    { { 8, 4, 4, 512 }, 10, 4, 4, 1, 0 },     /* to 1×1 output */
};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])
static const tq_dtype DTS[] = { TQ_F32, TQ_F16, TQ_BF16 };

/* ---- geometry ---- */

static void check_layout(const int64_t dim[4], const int64_t str[4]) {
    /* dims are (N,C,H,W) for activations, (K,C,R,S) for weights: memory order [0][2][3][1] */
    const int64_t N = dim[0], C = dim[1], H = dim[2], W = dim[3];
    assert_int_equal(str[1], 1);
    assert_int_equal(str[3], C);
    assert_int_equal(str[2], W * C);
    assert_int_equal(str[0], H * W * C);
    const int64_t pts[4][4] = { { 0, 0, 0, 0 }, { N - 1, C - 1, H - 1, W - 1 },
                                { N / 2, C / 3, H / 2, W - 1 }, { N - 1, 0, H / 3, W / 2 } };
    for (int i = 0; i < 4; i++) {
        const int64_t n = pts[i][0], c = pts[i][1], h = pts[i][2], w = pts[i][3];
        int64_t off = n * str[0] + c * str[1] + h * str[2] + w * str[3];
        assert_int_equal(off, ((n * H + h) * W + w) * C + c);   /* [n][h][w][c] / [k][r][s][c] */
    }
}

static void test_geom_strides(void **state) {
    (void)state;
    tqc_conv_geom g;
    /* one spelled out */
    assert_int_equal(tqc_conv_geom_of(&SHAPES[0], &g), 0);
    const int64_t xd[4] = { 2, 3, 8, 8 }, xs[4] = { 192, 1, 24, 3 };
    const int64_t wd[4] = { 4, 3, 3, 3 }, ws[4] = { 27, 1, 9, 3 };
    const int64_t yd[4] = { 2, 4, 8, 8 }, ys[4] = { 256, 1, 32, 4 };
    assert_memory_equal(g.xdim, xd, sizeof xd); assert_memory_equal(g.xstr, xs, sizeof xs);
    assert_memory_equal(g.wdim, wd, sizeof wd); assert_memory_equal(g.wstr, ws, sizeof ws);
    assert_memory_equal(g.ydim, yd, sizeof yd); assert_memory_equal(g.ystr, ys, sizeof ys);
    assert_int_equal(g.pad[0], 1); assert_int_equal(g.pad[1], 1);
    assert_int_equal(g.stride[0], 1); assert_int_equal(g.dil[1], 1);
    /* all of them */
    for (int i = 0; i < NSHAPES; i++) {
        const tq_conv_desc *d = &SHAPES[i];
        assert_int_equal(tqc_conv_geom_of(d, &g), 0);
        tq_shape y = tq_conv_yshape(d);
        assert_int_equal(g.xdim[0], d->x.n); assert_int_equal(g.xdim[1], d->x.c);
        assert_int_equal(g.xdim[2], d->x.h); assert_int_equal(g.xdim[3], d->x.w);
        assert_int_equal(g.wdim[0], d->k); assert_int_equal(g.wdim[1], d->x.c);
        assert_int_equal(g.wdim[2], d->r); assert_int_equal(g.wdim[3], d->s);
        assert_int_equal(g.ydim[0], y.n); assert_int_equal(g.ydim[1], y.c);
        assert_int_equal(g.ydim[2], y.h); assert_int_equal(g.ydim[3], y.w);
        assert_int_equal(g.stride[0], d->stride); assert_int_equal(g.stride[1], d->stride);
        assert_int_equal(g.pad[0], d->pad); assert_int_equal(g.pad[1], d->pad);
        check_layout(g.xdim, g.xstr);
        check_layout(g.wdim, g.wstr);
        check_layout(g.ydim, g.ystr);
    }
    /* refused */
    const tq_conv_desc bad[] = {
        { { 2, 8, 8, 3 }, 0, 3, 3, 1, 1 },    /* k = 0 */
        { { 2, 2, 2, 3 }, 4, 5, 5, 1, 1 },    /* kernel larger than the padded input */
        { { 2, 8, 8, 3 }, 4, 3, 3, 0, 1 },    /* stride 0 */
        { { 2, 8, 8, 3 }, 4, 3, 3, 1, -1 },   /* negative pad */
        { { 0, 8, 8, 3 }, 4, 3, 3, 1, 1 },    /* empty batch */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tqc_conv_geom_of(&bad[i], &g), -1);
    assert_int_equal(tqc_conv_geom_of(NULL, &g), -1);
}

/* ---- cuDNN descriptors ---- */

static void read_tensor(cudnnBackendDescriptor_t t, int64_t dim[4], int64_t str[4],
                        cudnnDataType_t *type, int64_t *uid) {
    int64_t cnt = 0;
    assert_int_equal(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4,
                                              &cnt, dim), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cnt, 4);
    assert_int_equal(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4,
                                              &cnt, str), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cnt, 4);
    assert_int_equal(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                              &cnt, type), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnBackendGetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1,
                                              &cnt, uid), CUDNN_STATUS_SUCCESS);
}

static void test_conv_ops_finalize(void **state) {
    (void)state;
    int built = 0;
    for (int i = 0; i < NSHAPES; i++)
        for (int di = 0; di < 3; di++)
            for (int kind = 0; kind < 3; kind++)
                for (int b = 0; b < 2; b++) {
                    tqc_conv_geom g;
                    tqc_conv_descs o;
                    assert_int_equal(tqc_conv_geom_of(&SHAPES[i], &g), 0);
                    err[0] = 0;
                    int rc = tqc_conv_build_op(kind, &g, DTS[di], 1.0f, (float)b, &o, err, sizeof err);
                    if (rc) print_message("shape %d dt %d kind %d beta %d: %s\n", i, di, kind, b, err);
                    assert_int_equal(rc, CUDNN_STATUS_SUCCESS);
                    assert_non_null(o.op);
                    assert_non_null(o.conv);
                    rc = tqc_conv_build_graph(&o, NULL, kind, &g, DTS[di], err, sizeof err);
                    if (rc) print_message("graph: %s\n", err);
                    assert_int_equal(rc, CUDNN_STATUS_SUCCESS);
                    assert_non_null(o.graph);
                    const int64_t *ed[3] = { g.xdim, g.wdim, g.ydim }, *es[3] = { g.xstr, g.wstr, g.ystr };
                    for (int t = 0; t < 3; t++) {
                        int64_t dim[4], str[4], uid = -1;
                        cudnnDataType_t type;
                        read_tensor(o.t[t], dim, str, &type, &uid);
                        assert_memory_equal(dim, ed[t], sizeof dim);
                        assert_memory_equal(str, es[t], sizeof str);
                        assert_int_equal(type, tqc_dnn_dtype(DTS[di]));
                        assert_int_equal(uid, t + 1);
                    }
                    tqc_conv_descs_free(&o);
                    assert_null(o.op);
                    built++;
                }
    assert_int_equal(built, NSHAPES * 3 * 3 * 2);
    assert_int_equal(tqc_dnn_dtype(TQ_F32), CUDNN_DATA_FLOAT);
    assert_int_equal(tqc_dnn_dtype(TQ_F16), CUDNN_DATA_HALF);
    assert_int_equal(tqc_dnn_dtype(TQ_BF16), CUDNN_DATA_BFLOAT16);
}

static void expect_bad_shape(int kind, tqc_conv_geom *g, tq_dtype dt, const char *needle) {
    tqc_conv_descs o;
    memset(&o, 0x5a, sizeof o);
    err[0] = 0;
    int rc = tqc_conv_build_op(kind, g, dt, 1.0f, 0.0f, &o, err, sizeof err);
    assert_int_equal(rc, CUDNN_STATUS_BAD_PARAM);
    /* the message names the op, the status, the failing call, and the wrong shape */
    if (!strstr(err, needle) || !strstr(err, tqc_conv_kind_name(kind)) ||
        !strstr(err, "CUDNN_STATUS_BAD_PARAM") || !strstr(err, "cudnnBackendFinalize") ||
        !strstr(err, "cuda_conv.c:"))
        fail_msg("message does not name it (want \"%s\"): %s", needle, err);
    /* nothing left behind */
    assert_null(o.op); assert_null(o.conv); assert_null(o.graph);
    for (int t = 0; t < 3; t++) assert_null(o.t[t]);
}

static void test_conv_wrong_shape(void **state) {
    (void)state;
    for (int kind = 0; kind < 3; kind++)
        for (int di = 0; di < 3; di++) {
            tqc_conv_geom g;
            /* output one column too wide: y must be [2,8,8,4] */
            assert_int_equal(tqc_conv_geom_of(&SHAPES[0], &g), 0);
            g.ydim[3] = 9;
            g.ystr[0] = 8 * 9 * 4; g.ystr[2] = 9 * 4;
            expect_bad_shape(kind, &g, DTS[di], "y=[2,8,9,4]");
            /* weights with the wrong channel count: w must be [4,3,3,3] */
            assert_int_equal(tqc_conv_geom_of(&SHAPES[0], &g), 0);
            g.wdim[1] = 5;
            g.wstr[0] = 3 * 3 * 5; g.wstr[2] = 3 * 5; g.wstr[3] = 5;
            expect_bad_shape(kind, &g, DTS[di], "w=[4,3,3,5]");
            /* wrong output channel count: y has 6 channels, w has 4 filters */
            assert_int_equal(tqc_conv_geom_of(&SHAPES[1], &g), 0);
            g.ydim[1] = 6;
            g.ystr[0] = g.ydim[2] * g.ydim[3] * 6; g.ystr[2] = g.ydim[3] * 6; g.ystr[3] = 6;
            expect_bad_shape(kind, &g, DTS[di], "y=[3,3,3,6]");
        }
    /* bad arguments never reach cuDNN */
    tqc_conv_geom g;
    tqc_conv_descs o;
    assert_int_equal(tqc_conv_geom_of(&SHAPES[0], &g), 0);
    assert_int_equal(tqc_conv_build_op(7, &g, TQ_F32, 1, 0, &o, err, sizeof err), CUDNN_STATUS_BAD_PARAM);
    assert_non_null(strstr(err, "bad kind"));
    assert_int_equal(tqc_conv_build_op(0, &g, (tq_dtype)9, 1, 0, &o, err, sizeof err), CUDNN_STATUS_BAD_PARAM);
}

/* ---- which engine configs a convolution may take (tqc_conv_cfg_allowed) ---- */

#define NOTE(x) (1u << (x))

static void test_cfg_notes_rule(void **state) {
    (void)state;
    const unsigned tc = NOTE(CUDNN_NUMERICAL_NOTE_TENSOR_CORE), down = NOTE(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS),
                   rpr = NOTE(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION),
                   nondet = NOTE(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC),
                   wino = NOTE(CUDNN_NUMERICAL_NOTE_WINOGRAD) | NOTE(CUDNN_NUMERICAL_NOTE_FFT),
                   rtc = NOTE(CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION);
    for (int d = 0; d < 3; d++) {
        const tq_dtype dt = DTS[d];
        for (int strict = 0; strict < 2; strict++)
            for (int det = 0; det < 2; det++)
                for (int tf = 0; tf < 2; tf++) {
                    /* TF32 (tf, spec tf32 "conv" or true) only ever changes f32's tensor cores */
                    const int tc_ok = dt != TQ_F32 || tf;
                    /* an engine without notes, or with Winograd/FFT ones, always */
                    assert_true(tqc_conv_cfg_allowed(0, 0, dt, strict, det, tf));
                    assert_true(tqc_conv_cfg_allowed(wino, 0, dt, strict, det, tf));
                    /* down-converting inputs never; tensor cores except in f32 without TF32 */
                    assert_false(tqc_conv_cfg_allowed(down, 0, dt, strict, det, tf));
                    assert_false(tqc_conv_cfg_allowed(down | tc, 0, dt, strict, det, tf));
                    assert_int_equal(tqc_conv_cfg_allowed(tc, 0, dt, strict, det, tf), tc_ok);
                    assert_int_equal(tqc_conv_cfg_allowed(tc | wino, 0, dt, strict, det, tf), tc_ok);
                    /* reduced-precision reductions and runtime compilation only when relaxed */
                    assert_int_equal(tqc_conv_cfg_allowed(rpr, 0, dt, strict, det, tf), !strict);
                    assert_int_equal(tqc_conv_cfg_allowed(0, rtc, dt, strict, det, tf), !strict);
                    /* nondeterministic engines only when the job allows them, in either pass */
                    assert_int_equal(tqc_conv_cfg_allowed(nondet, 0, dt, strict, det, tf), !det);
                    assert_int_equal(tqc_conv_cfg_allowed(nondet | wino, 0, dt, strict, det, tf), !det);
                    assert_int_equal(tqc_conv_cfg_allowed(nondet | tc, 0, dt, strict, det, tf), !det && tc_ok);
                }
    }
}

static void test_dnn_msg(void **state) {
    (void)state;
    char buf[256];
    tqc_dnn_msg(buf, sizeof buf, CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize(plan)",
                "/src/kernels/cuda/cuda_conv.c", 42, "conv_fwd f16 x=[1,2,3,4]");
    const char *want = "conv_fwd f16 x=[1,2,3,4]: CUDNN_STATUS_NOT_SUPPORTED from "
                       "cudnnBackendFinalize(plan) at cuda_conv.c:42";
    if (strncmp(buf, want, strlen(want)) != 0) fail_msg("got: %s", buf);
    char tiny[8];
    tqc_dnn_msg(tiny, sizeof tiny, CUDNN_STATUS_BAD_PARAM, "x", "y.c", 1, "conv");
    assert_int_equal(strlen(tiny), 7);
    assert_string_equal(tqc_conv_kind_name(TQC_CONV_BWD_FILTER), "conv_bwd_filter");
}

/* ---- cuBLASLt descriptors ---- */

static uint64_t lay_u64(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a) {
    uint64_t v = 0;
    size_t got = 0;
    assert_int_equal(cublasLtMatrixLayoutGetAttribute(l, a, &v, sizeof v, &got), CUBLAS_STATUS_SUCCESS);
    return v;
}
static int64_t lay_ld(cublasLtMatrixLayout_t l) {
    int64_t v = 0;
    size_t got = 0;
    assert_int_equal(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &v, sizeof v, &got),
                     CUBLAS_STATUS_SUCCESS);
    return v;
}
static int32_t lay_type(cublasLtMatrixLayout_t l) {
    uint32_t v = 0;
    size_t got = 0;
    assert_int_equal(cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &v, sizeof v, &got),
                     CUBLAS_STATUS_SUCCESS);
    return (int32_t)v;
}
static int32_t desc_i32(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a) {
    int32_t v = 0;
    size_t got = 0;
    assert_int_equal(cublasLtMatmulDescGetAttribute(d, a, &v, sizeof v, &got), CUBLAS_STATUS_SUCCESS);
    return v;
}

static void test_iface_complete(void **state) {
    (void)state;
    const tq_backend_i *i = tqc_backend_iface();
    assert_string_equal(i->name, "cuda");
    int miss = tq_backend_i_missing(i);
    if (miss >= 0) print_error("the CUDA backend lacks operation %d of tq_backend_i\n", miss);
    assert_int_equal(miss, -1);
}

static void test_lin_descs(void **state) {
    (void)state;
    const int shapes[][3] = { { 128, 512, 10 }, { 1, 3, 7 }, { 64, 784, 256 }, { 33, 65, 17 } };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 3; di++)
            for (int kind = 0; kind < 3; kind++)
                for (int bias = 0; bias <= (kind == TQC_LIN_FWD); bias++) {
                    const int n = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
                    const tq_dtype dt = DTS[di];
                    tqc_lin_descs o;
                    const int tf32 = (int)(si % 2);   /* half the shapes with TF32 allowed */
                    int rc = tqc_lin_build_desc(kind, n, in, out, dt, bias, tf32, &o, err, sizeof err);
                    if (rc) print_message("%s\n", err);
                    assert_int_equal(rc, CUBLAS_STATUS_SUCCESS);
                    /* the compute type: TF32 only for f32 data and only when allowed */
                    const cublasComputeType_t want = dt == TQ_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                          : CUBLAS_COMPUTE_32F;
                    assert_int_equal(o.compute, want);
                    assert_int_equal(desc_i32(o.op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), want);
                    assert_int_equal(desc_i32(o.op, CUBLASLT_MATMUL_DESC_SCALE_TYPE), CUDA_R_32F);
                    const cudaDataType_t t = tqc_lt_dtype(dt);
                    /* op(A) is m×k, op(B) is k×n, C/D is m×n, all column-major */
                    uint64_t ar = lay_u64(o.a, CUBLASLT_MATRIX_LAYOUT_ROWS), ac = lay_u64(o.a, CUBLASLT_MATRIX_LAYOUT_COLS);
                    uint64_t br = lay_u64(o.b, CUBLASLT_MATRIX_LAYOUT_ROWS), bc = lay_u64(o.b, CUBLASLT_MATRIX_LAYOUT_COLS);
                    uint64_t cr = lay_u64(o.c, CUBLASLT_MATRIX_LAYOUT_ROWS), cc = lay_u64(o.c, CUBLASLT_MATRIX_LAYOUT_COLS);
                    int32_t ta = desc_i32(o.op, CUBLASLT_MATMUL_DESC_TRANSA), tb = desc_i32(o.op, CUBLASLT_MATMUL_DESC_TRANSB);
                    assert_int_equal(ta, o.transa);
                    assert_int_equal(tb, o.transb);
                    assert_int_equal(ta == CUBLAS_OP_T ? ac : ar, o.m);
                    assert_int_equal(ta == CUBLAS_OP_T ? ar : ac, o.k);
                    assert_int_equal(tb == CUBLAS_OP_T ? bc : br, o.k);
                    assert_int_equal(tb == CUBLAS_OP_T ? br : bc, o.n);
                    assert_int_equal(cr, o.m);
                    assert_int_equal(cc, o.n);
                    assert_true(lay_ld(o.a) >= (int64_t)ar);
                    assert_int_equal(lay_type(o.a), t);
                    assert_int_equal(lay_type(o.b), t);
                    switch (kind) {
                    case TQC_LIN_FWD:          /* y^T = w^T' · x^T */
                        assert_int_equal(o.m, out); assert_int_equal(o.n, n); assert_int_equal(o.k, in);
                        assert_int_equal(lay_ld(o.a), in); assert_int_equal(lay_ld(o.b), in);
                        assert_int_equal(lay_ld(o.c), out);
                        assert_int_equal(lay_type(o.c), t);
                        assert_int_equal(desc_i32(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE),
                                         bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
                        if (bias) assert_int_equal(desc_i32(o.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), t);
                        assert_int_equal(o.epi_bias, bias);
                        break;
                    case TQC_LIN_BWD_DATA:     /* dx^T = w · dy^T */
                        assert_int_equal(o.m, in); assert_int_equal(o.n, n); assert_int_equal(o.k, out);
                        assert_int_equal(lay_ld(o.a), in); assert_int_equal(lay_ld(o.b), out);
                        assert_int_equal(lay_ld(o.c), in);
                        assert_int_equal(lay_type(o.c), t);
                        break;
                    default:                   /* dw^T = x^T · dy */
                        assert_int_equal(o.m, in); assert_int_equal(o.n, out); assert_int_equal(o.k, n);
                        assert_int_equal(lay_ld(o.a), in); assert_int_equal(lay_ld(o.b), out);
                        assert_int_equal(lay_ld(o.c), in);
                        assert_int_equal(lay_type(o.c), dt == TQ_F32 ? CUDA_R_32F : t);
                        break;
                    }
                    tqc_lin_descs_free(&o);
                    assert_null(o.op);
                }
    tqc_lin_descs o;
    assert_int_equal(tqc_lin_build_desc(TQC_LIN_FWD, 0, 3, 4, TQ_F32, 0, 0, &o, err, sizeof err),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_non_null(strstr(err, "linear_fwd f32 n=0 in=3 out=4"));
    assert_null(o.op);
    assert_int_equal(tqc_lin_build_desc(TQC_LIN_BWD_DATA, 2, 3, 4, TQ_F16, 1, 0, &o, err, sizeof err),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(tqc_lt_dtype(TQ_BF16), CUDA_R_16BF);
    assert_int_equal(tqc_lin_compute_type(TQ_F32, 0), CUBLAS_COMPUTE_32F);
    assert_int_equal(tqc_lin_compute_type(TQ_F32, 1), CUBLAS_COMPUTE_32F_FAST_TF32);
    assert_int_equal(tqc_lin_compute_type(TQ_F16, 1), CUBLAS_COMPUTE_32F);
    assert_int_equal(tqc_lin_compute_type(TQ_BF16, 1), CUBLAS_COMPUTE_32F);
}

/* First in main: no earlier test may have used cuBLASLt. Linked as a needed library again, it
 * would be loaded (and its ~100 MB initialised) before main in every trainq process. */
static void test_lt_loaded_on_first_use(void **state) {
    (void)state;
    char so[32], why[320] = "";
    snprintf(so, sizeof so, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    void *h = dlopen(so, RTLD_NOW | RTLD_NOLOAD);
    if (h) print_error("%s is loaded before anything used it (is it linked again?)\n", so);
    assert_null(h);
    int rc = tqc_lt_load(why, sizeof why);
    if (rc) print_error("%s\n", why);
    assert_int_equal(rc, 0);
    assert_non_null(h = dlopen(so, RTLD_NOW | RTLD_NOLOAD));
    dlclose(h);
    assert_string_equal(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lt_loaded_on_first_use),
        cmocka_unit_test(test_geom_strides),
        cmocka_unit_test(test_conv_ops_finalize),
        cmocka_unit_test(test_conv_wrong_shape),
        cmocka_unit_test(test_cfg_notes_rule),
        cmocka_unit_test(test_dnn_msg),
        cmocka_unit_test(test_lin_descs),
        cmocka_unit_test(test_iface_complete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
