/* autobatch.c — pick the largest micro-batch that fits a memory cap (see autobatch.h).
 *
 * Each candidate is planned with tq_plan_spec, the same code `trainq plan` and the trainer's
 * own pre-flight check use, so the bytes compared here are exactly those the job will be
 * held to. tq_plan_spec loads the dataset on every call (cheap for synthetic data, ~0.5 s for
 * fashion-mnist), so rather than plan every divisor we binary-search the ascending
 * candidates: the planned bytes are non-decreasing in the micro-batch (activations and
 * workspace grow with it, the rest is constant). That is at most 2 + ceil(log2(#candidates))
 * plans — 5 for an effective batch of 256, about 12 for the most composite N allowed. */
#include "autobatch.h"
#include "codes.h"
#include "backend.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB(x) ((double)(x) / 1048576.0)

typedef struct {
    const tq_spec *sp;
    long long extra;
    char *code, *err;
    size_t codelen, errlen;
} picker;

/* Plans sp at micro-batch b (b <= 0: as it is); fills *rep and *need. */
static int plan_at(picker *p, int b, tq_spec *t, tq_plan_report *rep, long long *need) {
    *t = *p->sp;
    if (b > 0) tq_spec_set_batch(t, b);
    int rc = tq_plan_spec(t, rep, p->code, p->codelen, p->err, p->errlen);
    if (rc) return rc;
    *need = (long long)(rep->plan.total + rep->plan.data) + p->extra;
    return 0;
}

static int fits(long long need, long long cap) { return cap <= 0 || need <= cap; }

static void extra_text(char *buf, size_t n, long long extra) {
    if (extra > 0) snprintf(buf, n, ", with %lld bytes of device overhead", extra);
    else buf[0] = 0;
}

int tq_autobatch_pick(const tq_spec *sp, long long cap_bytes, long long extra_bytes,
                      const char *cap_name, tq_spec *out, tq_plan_report *rep,
                      long long *need_bytes, char *code, size_t codelen, char *err, size_t errlen) {
    picker p = { sp, extra_bytes > 0 ? extra_bytes : 0, code, err, codelen, errlen };
    const char *what = cap_name && cap_name[0] ? cap_name : "the memory cap";
    char extra[96];
    extra_text(extra, sizeof extra, p.extra);
    if (code && codelen) code[0] = 0;
    if (err && errlen) err[0] = 0;
    tq_spec t;
    tq_plan_report r;
    long long need = 0;
    int rc;

    if (!tq_spec_batch_unresolved(sp)) {   /* explicit or already resolved: check it */
        if ((rc = plan_at(&p, 0, &t, &r, &need))) return rc;
        if (!fits(need, cap_bytes)) {
            snprintf(code, codelen, "%s", tq_error_name(TQ_ERR_CANNOT_FIT));
            snprintf(err, errlen, "batch_size %d x accum_steps %d plans %lld bytes (%.1f MiB%s), over the "
                     "cap of %lld bytes (%.1f MiB, %s)", sp->batch_size, sp->accum_steps, need, MIB(need),
                     extra, cap_bytes, MIB(cap_bytes), what);
            return TQ_ENOMEM;
        }
        *out = t;
        *rep = r;
        *need_bytes = need;
        return 0;
    }

    int n = tq_spec_batch_candidates(sp->effective_batch, NULL, 0);
    if (n == 0) {
        snprintf(code, codelen, "%s", tq_error_name(TQ_ERR_INVALID_SPEC));
        snprintf(err, errlen, "effective_batch %lld has no divisor that makes a micro-batch of at most "
                 "65536 with accum_steps at most 1024", (long long)sp->effective_batch);
        return TQ_EINVAL;
    }
    int *cand = malloc(sizeof *cand * (size_t)n);
    if (!cand) {
        snprintf(code, codelen, "%s", tq_error_name(TQ_ERR_OUT_OF_MEMORY));
        snprintf(err, errlen, "out of memory listing the micro-batch candidates");
        return TQ_ENOMEM;
    }
    tq_spec_batch_candidates(sp->effective_batch, cand, n);

    tq_spec best_spec;
    tq_plan_report best_rep;
    long long best_need = 0;
    int lo, hi;   /* invariant: cand[lo] fits (best_* is its plan), cand[hi] does not */
    if (cap_bytes <= 0) {
        if ((rc = plan_at(&p, cand[n - 1], &best_spec, &best_rep, &best_need))) goto out;
        goto chosen;
    }
    if ((rc = plan_at(&p, cand[0], &t, &r, &need))) goto out;
    if (!fits(need, cap_bytes)) {
        snprintf(code, codelen, "%s", tq_error_name(TQ_ERR_CANNOT_FIT));
        snprintf(err, errlen, "even a micro-batch of %d plans %lld bytes (%.1f MiB%s), over the cap of "
                 "%lld bytes (%.1f MiB, %s)", cand[0], need, MIB(need), extra, cap_bytes,
                 MIB(cap_bytes), what);
        rc = TQ_ENOMEM;
        goto out;
    }
    best_spec = t; best_rep = r; best_need = need;
    if (n == 1) goto chosen;
    if ((rc = plan_at(&p, cand[n - 1], &t, &r, &need))) goto out;
    if (fits(need, cap_bytes)) { best_spec = t; best_rep = r; best_need = need; goto chosen; }
    lo = 0;
    hi = n - 1;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if ((rc = plan_at(&p, cand[mid], &t, &r, &need))) goto out;
        if (fits(need, cap_bytes)) { lo = mid; best_spec = t; best_rep = r; best_need = need; }
        else hi = mid;
    }
chosen:
    *out = best_spec;
    *rep = best_rep;
    *need_bytes = best_need;
    rc = 0;
out:
    free(cand);
    return rc;
}
