/* fuzz_dataset_common.h — the checks fuzz_idx.c and fuzz_cifar.c share: tq_dataset_load's
 * contract (dataset.h) on whatever it returns. */
#ifndef TQ_FUZZ_DATASET_COMMON_H
#define TQ_FUZZ_DATASET_COMMON_H
#include "dataset.h"
#include "fuzz_util.h"

static inline void check_split(const tq_split *s, int64_t want_n, int h, int w, int c) {
    if (want_n) FUZZ_CHECK(s->n == want_n);
    FUZZ_CHECK(s->n >= 1 && s->h >= 1 && s->w >= 1 && s->c == c);
    if (h) FUZZ_CHECK(s->h == h && s->w == w);
    volatile uint8_t sink = 0;
    size_t px = (size_t)s->h * s->w * s->c;
    for (int64_t i = 0; i < s->n; i++) {
        FUZZ_CHECK(s->labels[i] < 10);
        sink ^= s->images[(size_t)i * px] ^ s->images[(size_t)(i + 1) * px - 1];   /* in bounds (ASan) */
    }
    (void)sink;
}

/* Loads kind from the fuzz directory and checks the contract either way. */
static inline void load_and_check(const char *kind, int64_t tsub, int64_t esub, int c) {
    tq_dataset ds;
    char err[512] = "";
    memset(&ds, 0x5a, sizeof ds);
    int rc = tq_dataset_load(&ds, kind, fuzz_dir(), NULL, tsub, esub, 1, err, sizeof err);
    if (rc) {
        FUZZ_CHECK(rc == TQ_EINVAL || rc == TQ_EIO || rc == TQ_EDATA || rc == TQ_ENOMEM);
        FUZZ_CHECK(err[0] != 0);
        FUZZ_CHECK(ds.train.images == NULL && ds.test.images == NULL && ds.train.n == 0);   /* zeroed */
    } else {
        FUZZ_CHECK(ds.classes == 10);
        check_split(&ds.train, tsub, 0, 0, c);
        check_split(&ds.test, esub, ds.train.h, ds.train.w, c);
    }
    tq_dataset_free(&ds);
    tq_dataset_free(&ds);   /* harmless twice (dataset.h) */
}
#endif
