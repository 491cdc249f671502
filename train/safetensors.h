/* safetensors.h — read and write safetensors files (checkpoints, exports, init_from).
 *
 * Format: 8-byte little-endian header length N; N bytes of JSON
 *   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "F32", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * padded with spaces so that the data starts at a multiple of 8; then the raw little-endian
 * data, offsets relative to the start of the data section.
 *
 * Contract
 * - dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2.
 * - Nothing here exits or prints; failures write a message naming the file and the problem
 *   into err (which may be NULL).
 * - tq_st_write: checks every tensor (name non-empty, < 160 bytes, unique, not
 *   "__metadata__"; known dtype; 0 <= ndim <= 8; bytes == numel × dtype size; data non-NULL when
 *   bytes > 0) and meta (NULL or a cJSON object of string values; omitted when empty) →
 *   TQ_EINVAL. Tensors are laid out back to back in the order given (so a tensor's data is
 *   only as aligned as the sizes before it make it; readers should memcpy). The write is
 *   atomic: path.tmp, fwrite, fflush, fsync, rename over path, fsync of the directory; any
 *   I/O failure → TQ_EIO and the temporary file is removed. TQ_ENOMEM on out of memory.
 * - tq_st_open reads the whole file into memory and validates it as strictly as the
 *   reference implementation: file >= 8 bytes; header length <= file size − 8 and < 100 MB;
 *   the header is one JSON object followed only by whitespace; "__metadata__" (optional) is an
 *   object of strings; every other entry is an object with exactly dtype (known), shape
 *   (<= 8 non-negative integers) and data_offsets ([begin, end], integers, begin <= end);
 *   end − begin == numel × dtype size; no duplicate names; names < 160 bytes; sorted by offset,
 *   the tensors tile the data section exactly (first begins at 0, each begins where the previous
 *   ended, the last ends at the end of the file: no overlap, no gap, no trailing bytes).
 *   Otherwise NULL with the message. tq_st_at(i) lists tensors in data (offset) order; `data`
 *   points into the file's buffer, valid until tq_st_close, and may be unaligned.
 * - A tq_st_file is immutable after open: concurrent readers are fine. */
#ifndef TQ_SAFETENSORS_H
#define TQ_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "backend.h"   /* TQ_OK / TQ_E* */

typedef struct {
    char name[160];
    char dtype[8];       /* "F32", "F16", "BF16", "I64", "I32", "U8", ... */
    int ndim;            /* 0…8; 0 is a scalar (numel 1) */
    int64_t shape[8];
    const void *data;
    size_t bytes;
} tq_st_tensor;

/* Bytes per element of a safetensors dtype name, 0 when unknown. */
size_t tq_st_dtype_size(const char *dtype);

/* Writes atomically (see above). meta: NULL or a cJSON object of string values. Returns TQ_OK,
 * TQ_EINVAL, TQ_EIO or TQ_ENOMEM. */
int tq_st_write(const char *path, const tq_st_tensor *ts, int n, const cJSON *meta, char *err,
                size_t errlen);

typedef struct tq_st_file tq_st_file;

/* Reads and validates; NULL with a message naming the file and the problem. */
tq_st_file *tq_st_open(const char *path, char *err, size_t errlen);
int tq_st_count(const tq_st_file *f);
const tq_st_tensor *tq_st_at(const tq_st_file *f, int i);                /* NULL if out of range */
const tq_st_tensor *tq_st_find(const tq_st_file *f, const char *name);   /* NULL if absent */
const char *tq_st_meta(const tq_st_file *f, const char *key);            /* NULL if absent */
void tq_st_close(tq_st_file *f);

#endif
