/* fuzz_idx.c — the IDX (Fashion-MNIST) reader of train/dataset.c, plain and gzip'd.
 *
 * tq_dataset_load reads named files in a directory, so the harness keeps a directory with a
 * small valid set (3 training and 2 test images of 4×4) and replaces one of its four files
 * with the input. Byte 0: bits 0-1 which file (train images, train labels, test images, test
 * labels); bits 2-3 how it is written: 0 plain, 1 gzip'd by the harness (the fuzzer mutates the
 * decompressed bytes), 2 as a .gz file as-is (the fuzzer mutates a gzip stream); bit 4: the
 * partner file (the labels of those images, the images of those labels) is given the sample
 * count of the input's header, so that the count check passes and a header that promises more
 * data than the file holds reaches the allocation and the body reads. Byte 1:
 * train_subset (bits 0-1) and eval_subset (bits 2-3), 0..3. The rest: the file's content.
 * Properties: dataset.h's contract (fuzz_dataset_common.h). */
#include <stdint.h>
#include <string.h>
#include <zlib.h>
#include "fuzz_dataset_common.h"

static const char *const NAMES[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
static uint8_t good[4][64];
static size_t good_n[4];

static size_t idx_file(uint8_t *p, uint32_t magic, uint32_t n, int images) {
    size_t k = 0;
    uint32_t hdr[4] = {magic, n, 4, 4};
    for (int i = 0; i < (images ? 4 : 2); i++)
        for (int b = 3; b >= 0; b--) p[k++] = (uint8_t)(hdr[i] >> (8 * b));
    for (uint32_t i = 0; i < n * (images ? 16u : 1u); i++) p[k++] = (uint8_t)(images ? i * 37 : i % 10);
    return k;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    good_n[0] = idx_file(good[0], 2051, 3, 1);
    good_n[1] = idx_file(good[1], 2049, 3, 0);
    good_n[2] = idx_file(good[2], 2051, 2, 1);
    good_n[3] = idx_file(good[3], 2049, 2, 0);
    return 0;
}

static size_t gzip(const uint8_t *in, size_t n, uint8_t **out) {
    z_stream z;
    memset(&z, 0, sizeof z);
    FUZZ_CHECK(deflateInit2(&z, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    *out = malloc(cap);
    FUZZ_CHECK(*out);
    z.next_in = (Bytef *)in; z.avail_in = (uInt)n;
    z.next_out = *out; z.avail_out = (uInt)cap;
    FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    size_t got = z.total_out;
    deflateEnd(&z);
    return got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > (1u << 20)) return 0;
    int which = data[0] & 3, how = (data[0] >> 2) & 3;
    int64_t tsub = data[1] & 3, esub = (data[1] >> 2) & 3;
    const uint8_t *body = data + 2;
    size_t n = size - 2;
    char gzname[64];
    for (int i = 0; i < 4; i++) {
        fuzz_dir_put(NAMES[i], good[i], good_n[i]);
        snprintf(gzname, sizeof gzname, "%s.gz", NAMES[i]);
        fuzz_dir_put(gzname, NULL, 0);
    }
    if ((data[0] & 16) && n >= 8) {   /* the partner's count := the input's (plain files) */
        int partner = which ^ 1;
        uint8_t p[64];
        memcpy(p, good[partner], good_n[partner]);
        memcpy(p + 4, body + 4, 4);
        fuzz_dir_put(NAMES[partner], p, good_n[partner]);
    }
    snprintf(gzname, sizeof gzname, "%s.gz", NAMES[which]);
    if (how == 0) {
        fuzz_dir_put(NAMES[which], body, n);
    } else if (how == 1) {
        uint8_t *z;
        size_t zn = gzip(body, n, &z);
        fuzz_dir_put(gzname, z, zn);
        free(z);
    } else {
        fuzz_dir_put(gzname, body, n);
    }
    load_and_check("fashion-mnist", tsub, esub, 1);
    return 0;
}
