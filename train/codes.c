/* codes.c — the tables of codes.h. */
#include "codes.h"

#include <string.h>

static const struct { const char *name; int final; } states[TQ_STATE_COUNT] = {
#define TQ_X(e, name, final) [TQ_STATE_##e] = { #name, final },
    TQ_JOB_STATES(TQ_X)
#undef TQ_X
};

static const struct { const char *name, *meaning; } errors[TQ_ERR_COUNT] = {
    [TQ_ERR_NONE] = { "", "" },
#define TQ_X(e, name, meaning) [TQ_ERR_##e] = { #name, meaning },
    TQ_ERROR_CODES(TQ_X)
#undef TQ_X
};

const char *tq_state_name(tq_job_state s) { return (unsigned)s < TQ_STATE_COUNT ? states[s].name : "?"; }
int tq_state_is_final(tq_job_state s) { return (unsigned)s < TQ_STATE_COUNT && states[s].final; }
int tq_state_name_final(const char *name) {
    tq_job_state k;
    return tq_state_parse(name, &k) == 0 && tq_state_is_final(k);
}
int tq_state_parse(const char *name, tq_job_state *out) {
    for (int i = 0; name && i < TQ_STATE_COUNT; i++)
        if (!strcmp(name, states[i].name)) { *out = (tq_job_state)i; return 0; }
    return -1;
}
const char *tq_error_name(tq_error_code c) { return (unsigned)c < TQ_ERR_COUNT ? errors[c].name : "?"; }
const char *tq_error_meaning(tq_error_code c) { return (unsigned)c < TQ_ERR_COUNT ? errors[c].meaning : "?"; }
int tq_error_parse(const char *name, tq_error_code *out) {
    for (int i = 1; name && i < TQ_ERR_COUNT; i++)
        if (!strcmp(name, errors[i].name)) { *out = (tq_error_code)i; return 0; }
    return -1;
}
