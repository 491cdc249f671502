/* ledger.c — the device ledger (see ledger.h). */
#include "ledger.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct tq_ledger {
    pthread_mutex_t mu;
    tq_ledger_dev devs[TQ_LEDGER_MAX_DEVICES];
    int ndev;
    tq_ledger_wait *waits;
    int nwait;
};

tq_ledger *tq_ledger_new(const tq_ledger_dev *devs, int ndev) {
    tq_ledger *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    pthread_mutex_init(&l->mu, NULL);
    tq_ledger_publish(l, devs, ndev, NULL, 0);
    return l;
}

void tq_ledger_free(tq_ledger *l) {
    if (!l) return;
    pthread_mutex_destroy(&l->mu);
    free(l->waits);
    free(l);
}

void tq_ledger_publish(tq_ledger *l, const tq_ledger_dev *devs, int ndev, const tq_ledger_wait *w, int nw) {
    if (ndev > TQ_LEDGER_MAX_DEVICES) ndev = TQ_LEDGER_MAX_DEVICES;
    tq_ledger_wait *copy = NULL;
    if (nw > 0) {
        copy = malloc((size_t)nw * sizeof *copy);
        if (copy) memcpy(copy, w, (size_t)nw * sizeof *copy);
        else nw = -1;   /* keep the previous waits */
    }
    pthread_mutex_lock(&l->mu);
    memcpy(l->devs, devs, (size_t)ndev * sizeof *devs);
    l->ndev = ndev;
    if (nw >= 0) {
        free(l->waits);
        l->waits = copy;
        l->nwait = nw;
    }
    pthread_mutex_unlock(&l->mu);
}

int tq_ledger_devices(tq_ledger *l, tq_ledger_dev *out, int max) {
    pthread_mutex_lock(&l->mu);
    int n = l->ndev < max ? l->ndev : max;
    memcpy(out, l->devs, (size_t)n * sizeof *out);
    pthread_mutex_unlock(&l->mu);
    return n;
}

int tq_ledger_wait_of(tq_ledger *l, int64_t id, tq_ledger_wait *out) {
    int found = 0;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->nwait; i++)
        if (l->waits[i].id == id) { *out = l->waits[i]; found = 1; break; }
    pthread_mutex_unlock(&l->mu);
    return found;
}
