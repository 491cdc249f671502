/* nocuda.c — the CUDA entry points of backend.h in a build without nvcc (CUDA=0).
 *
 * The binary is a CPU-only build: tq_cuda_built() says so, and every request for a GPU gets
 * the one-line reason, so `trainq devices` and a job asking for "cuda" can tell the user. */
#include <stdio.h>
#include "backend.h"

int tq_cuda_built(void) { return 0; }

static const char *reason = "this trainq was built without the CUDA backend (nvcc was not found, or CUDA=0)";

int tq_cuda_devices(tq_cuda_devinfo *out, int max, char *why, size_t why_len) {
    (void)out; (void)max;
    if (why) snprintf(why, why_len, "%s", reason);
    return -1;
}

tq_backend *tq_cuda_backend_new(int device, int benchmark, int deterministic, char *why, size_t why_len) {
    (void)device; (void)benchmark; (void)deterministic;
    if (why) snprintf(why, why_len, "%s", reason);
    return NULL;
}

tq_backend *tq_cuda_backend_open(const tq_cuda_opts *opts, char *why, size_t why_len) {
    (void)opts;
    if (why) snprintf(why, why_len, "%s", reason);
    return NULL;
}

int tq_cuda_open_busy(void) { return 0; }

const char *tq_cuda_backend_name(tq_backend *be) { (void)be; return NULL; }
