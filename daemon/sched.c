/* sched.c — placement (see sched.h). */
#include "sched.h"

#include <string.h>

const char *tq_wait_name(tq_wait w) {
    switch (w) {
    case TQ_WAIT_NONE: return "";
    case TQ_WAIT_MEMORY: return "memory";
    case TQ_WAIT_SLOTS: return "max_jobs";
    case TQ_WAIT_PRIORITY: return "priority";
    case TQ_WAIT_NEVER: return "never";
    case TQ_WAIT_NO_DEVICE: return "no_device";
    case TQ_WAIT_USER: return "user_limit";
    case TQ_WAIT_DEPENDENCY: return "dependency";
    case TQ_WAIT_BUSY: return "device_busy";
    }
    return "?";
}

static long long room_of(const tq_sched_dev *d) {
    long long r = d->budget - d->planned;
    if (d->driver_free >= 0 && d->driver_free < r) r = d->driver_free;
    return r < 0 ? 0 : r;
}

static long long need_on(const tq_sched_job *j, const tq_sched_dev *d) {
    return tq_dev_is_gpu(d->id) ? j->need_gpu : j->need_cpu;
}

int tq_sched_place(tq_sched_dev *devs, int ndev, const tq_sched_job *q, int nq,
                   const tq_sched_policy *pol, tq_sched_out *out) {
    char ids[TQ_SCHED_MAX_DEVICES][TQ_DEV_ID_MAX];
    if (ndev > TQ_SCHED_MAX_DEVICES) ndev = TQ_SCHED_MAX_DEVICES;
    for (int d = 0; d < ndev; d++) {
        memcpy(ids[d], devs[d].id, TQ_DEV_ID_MAX);
        devs[d].held_by = -1;
    }
    int placed = 0;
    for (int i = 0; i < nq; i++) {
        const tq_sched_job *j = &q[i];
        tq_sched_out *o = &out[i];
        memset(o, 0, sizeof *o);
        o->dev = -1;
        int cand[TQ_SCHED_MAX_DEVICES];
        int nc = tq_devsel_candidates(&j->want, ids, ndev, cand);
        if (nc == 0) { o->wait = TQ_WAIT_NO_DEVICE; continue; }
        if (j->deps_pending > 0) {   /* waits for its dependencies, holding nothing */
            int d0 = cand[0], holdable = 0;
            for (int k = 0; k < nc; k++) {
                if (need_on(j, &devs[cand[k]]) <= devs[cand[k]].budget) holdable = 1;
                if (devs[cand[k]].budget > devs[d0].budget) d0 = cand[k];
            }
            o->wait = holdable ? TQ_WAIT_DEPENDENCY : TQ_WAIT_NEVER;
            if (!holdable) {
                o->dev = d0;
                o->needs = need_on(j, &devs[d0]);
                o->free = devs[d0].budget;
            }
            continue;
        }
        if (pol->max_per_user > 0 && pol->user_running && j->user >= 0 &&
            pol->user_running[j->user] >= pol->max_per_user) {
            o->wait = TQ_WAIT_USER;
            continue;
        }

        /* the best device where it fits now, among those not held for a job ahead; auto's
         * preference for a GPU: a fitting GPU always beats the CPU */
        int best = -1, best_gpu = 0, any_holdable = 0, held_fit = -1, slots_fit = -1, busy_fit = -1;
        for (int k = 0; k < nc; k++) {
            tq_sched_dev *d = &devs[cand[k]];
            long long need = need_on(j, d);
            if (need <= d->budget) any_holdable = 1;
            if (need > room_of(d)) continue;
            if (d->busy) { if (busy_fit < 0) busy_fit = cand[k]; continue; }
            if (d->njobs >= d->max_jobs) { if (slots_fit < 0) slots_fit = cand[k]; continue; }
            if (d->held_by >= 0) { if (held_fit < 0) held_fit = cand[k]; continue; }
            int gpu = tq_dev_is_gpu(d->id);
            if (best >= 0) {
                const tq_sched_dev *b = &devs[best];
                if (best_gpu && !gpu) continue;
                if (gpu == best_gpu && (d->njobs > b->njobs || (d->njobs == b->njobs && room_of(d) <= room_of(b))))
                    continue;
            }
            best = cand[k];
            best_gpu = gpu;
        }
        if (best >= 0) {
            tq_sched_dev *d = &devs[best];
            long long need = need_on(j, d);
            o->dev = best;
            o->wait = TQ_WAIT_NONE;
            o->needs = need;
            o->free = room_of(d);
            d->planned += need;
            if (d->driver_free >= 0) d->driver_free = d->driver_free > need ? d->driver_free - need : 0;
            d->njobs++;
            if (d->probe) { d->probe = 0; d->busy = 1; }   /* the one job that tries it */
            if (!tq_dev_is_gpu(d->id)) {
                /* each GPU job's worker keeps a core for its host thread (the kernel launches
                 * its GPU waits on); the CPU jobs share the rest */
                int gpu_jobs = 0;
                for (int k = 0; k < ndev; k++) if (tq_dev_is_gpu(devs[k].id)) gpu_jobs += devs[k].njobs;
                int cores = d->cores - gpu_jobs;
                if (cores < 1) cores = 1;
                int t = j->threads > 0 ? j->threads : cores / (d->njobs > 0 ? d->njobs : 1);
                o->threads = t > 0 ? t : 1;
            }
            if (pol->max_per_user > 0 && pol->user_running && j->user >= 0) pol->user_running[j->user]++;
            placed++;
            continue;
        }
        if (!any_holdable) {   /* too big for every device it may use, even empty */
            int d0 = cand[0];
            for (int k = 1; k < nc; k++) if (devs[cand[k]].budget > devs[d0].budget) d0 = cand[k];
            o->wait = TQ_WAIT_NEVER;
            o->dev = d0;
            o->needs = need_on(j, &devs[d0]);
            o->free = devs[d0].budget;
            continue;
        }
        /* it waits: for a held device, for a slot, or for memory on the device that suits it
         * best (the largest budget that can hold it, then the most room) */
        int want = -1;
        for (int k = 0; k < nc; k++) {
            tq_sched_dev *d = &devs[cand[k]];
            if (need_on(j, d) > d->budget) continue;
            if (want < 0 || d->budget > devs[want].budget ||
                (d->budget == devs[want].budget && room_of(d) > room_of(&devs[want])))
                want = cand[k];
        }
        if (held_fit >= 0) {
            o->wait = TQ_WAIT_PRIORITY;
            o->dev = held_fit;
            o->behind = q[devs[held_fit].held_by].id;
        } else if (slots_fit >= 0) {
            o->wait = TQ_WAIT_SLOTS;
            o->dev = slots_fit;
        } else if (busy_fit >= 0) {
            o->wait = TQ_WAIT_BUSY;
            o->dev = busy_fit;
        } else {
            o->wait = TQ_WAIT_MEMORY;
            o->dev = want;
        }
        o->needs = need_on(j, &devs[o->dev]);
        o->free = room_of(&devs[o->dev]);
        /* past the backfill window: hold the device it suits best, unless one is already held
         * for a job ahead (that one goes first; this one holds when it becomes the oldest) */
        if (pol->backfill_window_s >= 0 && j->waited_s > pol->backfill_window_s && devs[want].held_by < 0 &&
            !devs[want].busy)
            devs[want].held_by = i;
    }
    return placed;
}
