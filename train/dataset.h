/* dataset.h — the training data: Fashion-MNIST (IDX, gzip), CIFAR-10 (binary version) and a
 * seeded synthetic set, loaded once into host memory as uint8 HWC; the epoch order; the
 * augmentation draws.
 *
 * Contract
 * - tq_dataset_load never exits and never prints. On failure it returns a negative TQ_E*
 *   status, writes a message naming the problem (the file, the field) into err, and leaves
 *   *ds zeroed (nothing to free; tq_dataset_free on it is harmless).
 *     TQ_EINVAL  bad arguments: unknown kind, cifar10 without data_dir, a subset larger than
 *                the split (the message names train_subset / eval_subset), bad synthetic shape
 *     TQ_EIO     a missing or unreadable directory or file (the message names the path; when
 *                it is missing, also what data_dir must hold and docs/spec.md, "Datasets")
 *     TQ_EDATA   a corrupt file: bad magic, truncated or trailing bytes, image/label counts
 *                that disagree, train/test shapes that disagree, a label >= 10, a bad gzip
 *                stream (the message names the file and what is wrong)
 *     TQ_ENOMEM  out of memory
 * - Subsets (train_subset / eval_subset): 0 = the whole split, else the first N samples in
 *   file order; only those N samples are kept in memory. IDX files are still read to their
 *   end, so a truncated or corrupt file is reported even when a subset is used.
 * - Fashion-MNIST: data_dir NULL/"" → /usr/share/datasets/fashion-mnist. Files
 *   train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
 *   t10k-labels-idx1-ubyte, each gzip'd (".gz", preferred) or plain. 28×28×1 in the real set
 *   (any h×w in 1…1024 is accepted when train and test agree), 10 classes,
 *   mean 0.2860 std 0.3530.
 * - CIFAR-10: data_dir required (a directory holding the .bin files, or its parent holding
 *   cifar-10-batches-bin/). data_batch_1.bin…data_batch_5.bin (those present, in that order;
 *   data_batch_1.bin is required) and test_batch.bin (required). Each record: 1 label byte +
 *   3072 bytes CHW (1024 R, 1024 G, 1024 B, row-major 32×32), converted to HWC. A file size
 *   that is not a positive multiple of 3073 is TQ_EDATA. mean (0.4914, 0.4822, 0.4465),
 *   std (0.2470, 0.2435, 0.2616).
 * - synthetic: shape from `synth` (NULL, or any field 0 → defaults 10000 train, 2000 test,
 *   32×32×3; c in 1…3, h and w in 1…4096), 10 classes. Per class a smooth random prototype
 *   (a 4×4 grid of uniform random levels per channel, bilinearly upsampled); each sample is its
 *   class's prototype + approximately Gaussian noise (sd ≈ 32 levels), clipped to 0…255; labels
 *   uniform random (balanced in expectation). Prototypes come from
 *   tq_rng_make(seed, TQ_RNG_SYNTH, 0), train sample i from index (1<<62)+i, test sample i from
 *   (2<<62)+i, so the same (seed, shape) gives the same bytes and a subset is exactly the first
 *   N samples of the full set. mean/std are nominal: 0.5 / 0.25 in every channel.
 * - Thread-safe (no globals). */
#ifndef TQ_DATASET_H
#define TQ_DATASET_H
#include <stddef.h>
#include <stdint.h>
#include "backend.h"   /* tq_aug, TQ_OK / TQ_E* */

typedef struct {
    int64_t n;
    int h, w, c;
    uint8_t *images;   /* n*h*w*c, HWC per sample */
    uint8_t *labels;   /* n, each < classes */
} tq_split;

typedef struct {
    tq_split train, test;
    int classes;
    float mean[3], std[3];   /* per channel (only the first c are meaningful) */
    char name[32];           /* "fashion-mnist" | "cifar10" | "synthetic" */
} tq_dataset;

typedef struct { int64_t train, test; int h, w, c; } tq_synth_opts;

/* kind: "fashion-mnist" | "cifar10" | "synthetic". See the contract above. */
int tq_dataset_load(tq_dataset *ds, const char *kind, const char *data_dir,
                    const tq_synth_opts *synth, int64_t train_subset, int64_t eval_subset,
                    uint64_t seed, char *err, size_t errlen);
void tq_dataset_free(tq_dataset *ds);

/* The order of epoch `epoch`: perm[0..n) = identity when !shuffle, else a Fisher-Yates
 * permutation (for i = n-1 down to 1: j = tq_rng_below(r, i+1), swap perm[i], perm[j]) of the
 * identity, with r = tq_rng_make(seed, TQ_RNG_SHUFFLE, epoch). Stateless: the same
 * (seed, epoch) always gives the same order. n <= INT32_MAX. */
void tq_epoch_order(int32_t *perm, int64_t n, uint64_t seed, int64_t epoch, int shuffle);

/* Augmentation draws for micro-batch number `mb` (global index since the start of the job),
 * r = tq_rng_make(seed, TQ_RNG_AUG, mb); for each sample in order: dy = tq_rng_below(r, 2*pad+1),
 * dx = tq_rng_below(r, 2*pad+1), flip = tq_rng_u64(r) >> 63. pad < 0 counts as 0 (dy = dx = 0,
 * the same draws are made); pad > 16383 as 16383 (dy, dx are int16). */
void tq_aug_draw(tq_aug *out, int n, uint64_t seed, uint64_t mb, int pad);

#endif
