/* report.h — JSON renderings of the trainer's records (cJSON; NaN/inf and "null" fields
 * become JSON null). Returned objects are owned by the caller (cJSON_Delete). */
#ifndef TQ_REPORT_H
#define TQ_REPORT_H
#include <cjson/cJSON.h>
#include "records.h"
#include "engine.h"

cJSON *tq_summary_json(const tq_summary *s);
cJSON *tq_step_json(const tq_step_rec *r);
cJSON *tq_eval_json(const tq_eval_rec *r);
cJSON *tq_plan_json(const tq_plan *p, const char *model, const char *amp, int batch_size);
/* tq_plan_json plus what the batch choice adds: accum_steps, effective_batch (batch_size x
 * accum_steps), planned_peak_bytes (total_bytes + data_bytes, what max_memory_mb is held to)
 * and batch_size_auto (whether the spec asked for "batch_size": "auto"). */
cJSON *tq_plan_batch_json(const tq_plan *p, const char *model, const char *amp, int batch_size,
                          int accum_steps, int batch_auto);
const char *tq_eval_kind_name(tq_eval_kind k);
#endif
