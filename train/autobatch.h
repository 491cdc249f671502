/* autobatch.h — "batch_size": "auto": the largest micro-batch that fits a memory cap.
 *
 * A spec with "effective_batch": N and "batch_size": "auto" (spec.h) leaves the micro-batch
 * open. tq_autobatch_pick plans the candidates (tq_spec_batch_candidates: the divisors b of N
 * with b <= 65536 and N/b <= 1024) and takes the largest b whose planned bytes fit the cap;
 * accum_steps = N / b. The bytes that count for a candidate are
 *     plan.total + plan.data + extra_bytes
 * (training memory, the dataset on the device, and a per-device constant the caller knows,
 * e.g. a CUDA context; 0 on the CPU).
 *
 * Contract: never exits, never prints. Thread-safe as tq_plan_spec is (no globals). */
#ifndef TQ_AUTOBATCH_H
#define TQ_AUTOBATCH_H
#include <stddef.h>
#include "spec.h"
#include "trainer.h"

/* Resolves `sp` against a cap.
 * - sp unresolved (tq_spec_batch_unresolved): the largest candidate micro-batch that fits
 *   cap_bytes; cap_bytes <= 0 means no cap (the largest candidate).
 * - any other spec (resolved auto, or an explicit batch_size): planned as it is and checked
 *   against the cap.
 * cap_name says what the cap is, for the message: "max_memory_mb 60", "--memory-mb 60",
 * "half of the CPU's available memory"…
 * On success returns 0 with *out the resolved spec (tq_spec_set_batch; out may be sp), *rep
 * the plan of the chosen micro-batch and *need_bytes its total + data + extra_bytes.
 * On failure returns non-zero with code/err set and *out untouched:
 * - "cannot_fit": even the smallest candidate is over the cap; err names both numbers ("even
 *   a micro-batch of 1 plans 6477376 bytes (6.2 MiB), over the cap of 1048576 bytes (1.0 MiB,
 *   max_memory_mb 1)");
 * - "invalid_spec": an effective batch without any candidate (the parser rejects those);
 * - otherwise tq_plan_spec's code and message (data_not_found, invalid_data, …). */
int tq_autobatch_pick(const tq_spec *sp, long long cap_bytes, long long extra_bytes,
                      const char *cap_name, tq_spec *out, tq_plan_report *rep,
                      long long *need_bytes, char *code, size_t codelen, char *err, size_t errlen);

#endif
