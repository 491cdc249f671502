/* report.c — JSON renderings of records, summaries and plans (see report.h). */
#include "report.h"
#include "util.h"
#include <math.h>

static void num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v); else cJSON_AddNullToObject(o, k);
}
static void num_or_null(cJSON *o, const char *k, double v, int is_null) {
    if (is_null) cJSON_AddNullToObject(o, k); else num(o, k, v);
}

const char *tq_eval_kind_name(tq_eval_kind k) {
    return k == TQ_EVAL_PRUNED ? "pruned" : k == TQ_EVAL_INT8 ? "int8" : "eval";
}

cJSON *tq_summary_json(const tq_summary *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", s->state);
    num(o, "steps", (double)s->steps);
    num(o, "samples", (double)s->samples);
    num(o, "epochs", s->epochs);
    num(o, "wall_s", s->wall_s);
    num_or_null(o, "samples_per_s", s->samples_per_s, s->steps == 0);
    num_or_null(o, "step_ms_median", s->step_ms_median, s->steps == 0);
    num(o, "final_loss", s->final_loss);
    num(o, "val_loss", s->val_loss);
    num(o, "val_accuracy", s->val_accuracy);
    num_or_null(o, "peak_memory_bytes", (double)s->peak_memory_bytes, s->peak_memory_bytes < 0);
    num_or_null(o, "predicted_peak_bytes", (double)s->predicted_peak_bytes, s->predicted_peak_bytes < 0);
    num_or_null(o, "device_peak_used_bytes", (double)s->device_peak_used_bytes, s->device_peak_used_bytes < 0);
    num(o, "skipped_steps", (double)s->skipped_steps);
    num_or_null(o, "final_loss_scale", s->final_loss_scale, s->final_loss_scale < 0);
    num(o, "effective_batch", (double)s->effective_batch);
    cJSON_AddStringToObject(o, "amp", s->amp);
    cJSON_AddStringToObject(o, "device", s->device);
    if (s->tf32[0]) cJSON_AddStringToObject(o, "tf32", s->tf32); else cJSON_AddNullToObject(o, "tf32");
    if (s->cuda_graphs[0]) cJSON_AddStringToObject(o, "cuda_graphs", s->cuda_graphs);
    else cJSON_AddNullToObject(o, "cuda_graphs");
    if (s->error_code[0]) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", s->error_code);
        cJSON_AddStringToObject(e, "message", s->error_message);
    }
    return o;
}

cJSON *tq_step_json(const tq_step_rec *r) {
    cJSON *o = cJSON_CreateObject();
    num(o, "step", (double)r->step);
    num(o, "epoch", r->epoch);
    num(o, "loss", r->loss);
    num(o, "lr", r->lr);
    num_or_null(o, "loss_scale", r->loss_scale, r->loss_scale < 0);
    cJSON_AddBoolToObject(o, "skipped", r->skipped);
    num(o, "step_ms", r->step_ms);
    num(o, "samples_per_s", r->samples_per_s);
    num(o, "mem_allocated_bytes", (double)r->mem_allocated_bytes);
    num(o, "mem_peak_bytes", (double)r->mem_peak_bytes);
    num(o, "mem_reserved_bytes", (double)r->mem_reserved_bytes);
    num_or_null(o, "device_used_bytes", (double)r->device_used_bytes, r->device_used_bytes < 0);
    num(o, "time", (double)r->time_ms);
    return o;
}

cJSON *tq_eval_json(const tq_eval_rec *r) {
    cJSON *o = cJSON_CreateObject();
    num(o, "step", (double)r->step);
    num(o, "epoch", r->epoch);
    num(o, "loss", r->loss);
    num(o, "accuracy", r->accuracy);
    num(o, "samples", (double)r->samples);
    cJSON_AddStringToObject(o, "kind", tq_eval_kind_name(r->kind));
    num(o, "time", (double)r->time_ms);
    return o;
}

cJSON *tq_plan_json(const tq_plan *p, const char *model, const char *amp, int batch_size) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "amp", amp);
    cJSON_AddNumberToObject(o, "batch_size", batch_size);
    cJSON_AddNumberToObject(o, "parameters", (double)p->nparameters);
    cJSON_AddNumberToObject(o, "params_bytes", (double)p->params);
    cJSON_AddNumberToObject(o, "grads_bytes", (double)p->grads);
    cJSON_AddNumberToObject(o, "optimizer_bytes", (double)p->optimizer);
    cJSON_AddNumberToObject(o, "activations_bytes", (double)p->activations);
    cJSON_AddNumberToObject(o, "workspace_bytes", (double)p->workspace);
    cJSON_AddNumberToObject(o, "total_bytes", (double)p->total);
    cJSON_AddNumberToObject(o, "data_bytes", (double)p->data);
    return o;
}

cJSON *tq_plan_batch_json(const tq_plan *p, const char *model, const char *amp, int batch_size,
                          int accum_steps, int batch_auto) {
    cJSON *o = tq_plan_json(p, model, amp, batch_size);
    cJSON_AddNumberToObject(o, "accum_steps", accum_steps);
    cJSON_AddNumberToObject(o, "effective_batch", (double)batch_size * accum_steps);
    cJSON_AddNumberToObject(o, "planned_peak_bytes", (double)(p->total + p->data));
    cJSON_AddBoolToObject(o, "batch_size_auto", batch_auto != 0);
    return o;
}
