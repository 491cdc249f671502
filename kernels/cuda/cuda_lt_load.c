/* cuda_lt_load.c — cuBLASLt, loaded when the first CUDA backend needs it, not at process start.
 *
 * Linked as a DT_NEEDED library, libcublasLt.so.13 made every trainq process pay for it before
 * main(): its constructors took 60-70 ms and left about 100 MB of anonymous memory behind
 * (`trainq version`: 227 MB resident against 16 MB without CUDA; `trainq serve`, which never
 * runs a GEMM, 100 MB RssAnon). The client commands, the daemon and CPU jobs need none of it.
 *
 * So the binary does not link it. The cublasLt* functions trainq calls are defined here with
 * the header's own prototypes (the compiler checks each against cublasLt.h); the first call
 * dlopen()s libcublasLt.so.<CUBLAS_VER_MAJOR> (found through LD_LIBRARY_PATH, the binary's
 * run path, which the Makefile sets to the toolkit's library folder, or the system's) and looks
 * every function up once. tq_cuda_backend_new calls tqc_lt_load first, so a missing or
 * incomplete library is a backend that does not start, with a reason that names the library,
 * never a crash. Calls made without the library return CUBLAS_STATUS_NOT_INITIALIZED.
 *
 * A cuBLASLt function trainq starts to use must be added to LT_FUNCS (the link fails otherwise:
 * an undefined reference, since nothing else provides it).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <cublasLt.h>

#include "cuda/cuda_desc.h"

#define LT_STR_(x) #x
#define LT_STR(x) LT_STR_(x)
#define LT_SONAME "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR)

/* X(return type, name, (parameters), (arguments)) for every cuBLASLt function trainq calls;
 * S for those that return a string, X for those that return a status */
#define LT_FUNCS(X, S)                                                                         \
    S(const char *, cublasLtGetStatusName, (cublasStatus_t s), (s), "CUBLAS_STATUS_NOT_INITIALIZED") \
    S(const char *, cublasLtGetStatusString, (cublasStatus_t s), (s), "cuBLASLt is not loaded") \
    X(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * h), (h))                             \
    X(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h))                              \
    X(cublasStatus_t, cublasLtMatmul,                                                          \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,          \
       cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,    \
       const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,             \
       const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsb, cudaStream_t stream),           \
      (h, op, alpha, A, a, B, b, beta, C, c, D, d, algo, ws, wsb, stream))                     \
    X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,                                          \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,                  \
       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,           \
       cublasLtMatmulPreference_t pref, int want, cublasLtMatmulHeuristicResult_t res[],       \
       int *got),                                                                              \
      (h, op, a, b, c, d, pref, want, res, got))                                               \
    X(cublasStatus_t, cublasLtMatmulDescCreate,                                                \
      (cublasLtMatmulDesc_t * d, cublasComputeType_t ct, cudaDataType_t st), (d, ct, st))      \
    X(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))                \
    X(cublasStatus_t, cublasLtMatmulDescSetAttribute,                                          \
      (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t at, const void *buf, size_t n),  \
      (d, at, buf, n))                                                                         \
    X(cublasStatus_t, cublasLtMatmulDescGetAttribute,                                          \
      (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t at, void *buf, size_t n,         \
       size_t *got),                                                                           \
      (d, at, buf, n, got))                                                                    \
    X(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p), (p))   \
    X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))    \
    X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,                                    \
      (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t at, const void *buf, \
       size_t n),                                                                              \
      (p, at, buf, n))                                                                         \
    X(cublasStatus_t, cublasLtMatrixLayoutCreate,                                              \
      (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),  \
      (l, t, rows, cols, ld))                                                                  \
    X(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))            \
    X(cublasStatus_t, cublasLtMatrixLayoutGetAttribute,                                        \
      (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t at, void *buf, size_t n,      \
       size_t *got),                                                                           \
      (l, at, buf, n, got))

static struct {
    void *lib;
    char why[320];   /* empty when loaded */
#define LT_PTR(R, name, P, A) R(*name) P;
#define LT_PTR_S(R, name, P, A, fallback) R(*name) P;
    LT_FUNCS(LT_PTR, LT_PTR_S)
#undef LT_PTR
#undef LT_PTR_S
} lt;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;

static void lt_open(void) {
    void *lib = dlopen(LT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(lt.why, sizeof lt.why, "cannot load cuBLASLt (%s): %s", LT_SONAME, e ? e : "dlopen failed");
        return;
    }
#define LT_SYM(R, name, P, A)                                                                  \
    if (!(*(void **)&lt.name = dlsym(lib, #name))) {                                          \
        snprintf(lt.why, sizeof lt.why, "cannot load cuBLASLt: %s has no %s", LT_SONAME, #name); \
        dlclose(lib);                                                                          \
        return;                                                                                \
    }
#define LT_SYM_S(R, name, P, A, fallback) LT_SYM(R, name, P, A)
    LT_FUNCS(LT_SYM, LT_SYM_S)
#undef LT_SYM
#undef LT_SYM_S
    lt.lib = lib;
}

int tqc_lt_load(char *why, size_t n) {
    pthread_once(&lt_once, lt_open);
    if (lt.lib) return 0;
    if (why && n) snprintf(why, n, "%s", lt.why);
    return -1;
}

/* the definitions the rest of the backend links against; the string functions answer without
 * the library too (a message is still wanted then) */
#define LT_DEF(R, name, P, A)                                                                  \
    R name P {                                                                                 \
        if (tqc_lt_load(NULL, 0)) return CUBLAS_STATUS_NOT_INITIALIZED;                        \
        return lt.name A;                                                                      \
    }
#define LT_DEF_S(R, name, P, A, fallback)                                                      \
    R name P {                                                                                 \
        if (tqc_lt_load(NULL, 0)) return fallback;                                             \
        return lt.name A;                                                                      \
    }
LT_FUNCS(LT_DEF, LT_DEF_S)
