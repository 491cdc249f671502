/* fuzz_cifar.c — the CIFAR-10 binary reader of train/dataset.c.
 *
 * The harness keeps a directory with a valid set (data_batch_1.bin and test_batch.bin of one
 * record each) and writes the input as one of its files. Byte 0: bits 0-2 which file
 * (data_batch_1..5.bin, test_batch.bin; 6-7 wrap), bit 3: pad the content with zeros to a whole
 * number of 3073-byte records (so short inputs reach the record parsing; otherwise most sizes
 * are rejected by the size check). Byte 1: train_subset (bits 0-1) and eval_subset (bits 2-3).
 * Properties: dataset.h's contract (fuzz_dataset_common.h). */
#include <stdint.h>
#include <string.h>
#include "fuzz_dataset_common.h"

#define REC 3073
static const char *const NAMES[6] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                     "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
static uint8_t good[REC];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int i = 0; i < REC; i++) good[i] = (uint8_t)(i * 31);
    good[0] = 3;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 64 * REC) return 0;
    int which = (data[0] & 7) % 6, pad = (data[0] >> 3) & 1;
    int64_t tsub = data[1] & 3, esub = (data[1] >> 2) & 3;
    const uint8_t *body = data + 2;
    size_t n = size - 2;
    for (int i = 0; i < 6; i++) fuzz_dir_put(NAMES[i], i == 0 || i == 5 ? good : NULL, REC);
    if (pad) {
        size_t m = n ? (n + REC - 1) / REC * REC : REC;
        uint8_t *buf = calloc(1, m);
        FUZZ_CHECK(buf);
        memcpy(buf, body, n);
        fuzz_dir_put(NAMES[which], buf, m);
        free(buf);
    } else {
        fuzz_dir_put(NAMES[which], body, n);
    }
    load_and_check("cifar10", tsub, esub, 3);
    return 0;
}
