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
const char *tq_eval_kind_name(tq_eval_kind k);
#endif
