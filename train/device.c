/* device.c — the device resolver (see device.h). */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_ordinal(const char *s, int *out) {
    if (!*s || strlen(s) > 3) return -1;
    int v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    if (v > 255 || (s[0] == '0' && s[1])) return -1;   /* no leading zeros: one spelling each */
    *out = v;
    return 0;
}

int tq_devsel_parse(const char *s, tq_devsel *out) {
    if (!s) return -1;
    out->ordinal = -1;
    if (!strcmp(s, "auto")) { out->kind = TQ_DEV_AUTO; return 0; }
    if (!strcmp(s, "cpu")) { out->kind = TQ_DEV_CPU; return 0; }
    if (!strcmp(s, "cuda")) { out->kind = TQ_DEV_CUDA_ANY; return 0; }
    if (!strncmp(s, "cuda:", 5) && !parse_ordinal(s + 5, &out->ordinal)) { out->kind = TQ_DEV_CUDA; return 0; }
    return -1;
}

void tq_devsel_str(const tq_devsel *d, char out[TQ_DEV_ID_MAX]) {
    switch (d->kind) {
    case TQ_DEV_AUTO: snprintf(out, TQ_DEV_ID_MAX, "auto"); break;
    case TQ_DEV_CPU: snprintf(out, TQ_DEV_ID_MAX, "cpu"); break;
    case TQ_DEV_CUDA_ANY: snprintf(out, TQ_DEV_ID_MAX, "cuda"); break;
    case TQ_DEV_CUDA: snprintf(out, TQ_DEV_ID_MAX, "cuda:%d", d->ordinal); break;
    }
}

int tq_dev_is_gpu(const char *id) { return id && !strncmp(id, "cuda:", 5); }

int tq_devsel_allows(const tq_devsel *want, const char *id) {
    tq_devsel d;
    if (tq_devsel_parse(id, &d) || d.kind == TQ_DEV_AUTO || d.kind == TQ_DEV_CUDA_ANY) return 0;
    switch (want->kind) {
    case TQ_DEV_AUTO: return 1;
    case TQ_DEV_CPU: return d.kind == TQ_DEV_CPU;
    case TQ_DEV_CUDA_ANY: return d.kind == TQ_DEV_CUDA;
    case TQ_DEV_CUDA: return d.kind == TQ_DEV_CUDA && d.ordinal == want->ordinal;
    }
    return 0;
}

static int has(char out[][TQ_DEV_ID_MAX], int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (!strcmp(out[i], id)) return 1;
    return 0;
}

static int ord_of(const char *id) { return tq_dev_is_gpu(id) ? atoi(id + 5) : 1 << 20; }

int tq_devices_resolve(const char *flag, const char *const *gpus, int ngpus, char out[][TQ_DEV_ID_MAX],
                       int max, char *err, size_t errlen) {
    int n = 0;
    if (!flag || !*flag) { snprintf(err, errlen, "--devices is empty: want auto or a list such as cpu,cuda:0"); return -1; }
    if (!strcmp(flag, "auto")) {
        for (int i = 0; i < ngpus && n < max - 1; i++) snprintf(out[n++], TQ_DEV_ID_MAX, "%s", gpus[i]);
        snprintf(out[n++], TQ_DEV_ID_MAX, "cpu");
    } else {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", flag);
        char *save = NULL;
        int items = 0;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            items++;
            tq_devsel d;
            if (tq_devsel_parse(tok, &d) || d.kind == TQ_DEV_AUTO) {
                snprintf(err, errlen, "--devices: unknown device \"%.64s\" (want auto, or a list of cpu, cuda, cuda:N)", tok);
                return -1;
            }
            if (d.kind == TQ_DEV_CUDA_ANY) {
                if (ngpus == 0) { snprintf(err, errlen, "--devices: \"cuda\" but no GPU was found"); return -1; }
                for (int i = 0; i < ngpus; i++) {
                    if (has(out, n, gpus[i])) { snprintf(err, errlen, "--devices: %s is named twice", gpus[i]); return -1; }
                    if (n < max) snprintf(out[n++], TQ_DEV_ID_MAX, "%s", gpus[i]);
                }
                continue;
            }
            char id[TQ_DEV_ID_MAX];
            tq_devsel_str(&d, id);
            if (has(out, n, id)) { snprintf(err, errlen, "--devices: %s is named twice", id); return -1; }
            if (d.kind == TQ_DEV_CUDA) {
                int found = 0;
                for (int i = 0; i < ngpus; i++) found |= !strcmp(gpus[i], id);
                if (!found) {
                    snprintf(err, errlen, "--devices: %s: no such GPU (found %d GPU%s)", id, ngpus, ngpus == 1 ? "" : "s");
                    return -1;
                }
            }
            if (n < max) snprintf(out[n++], TQ_DEV_ID_MAX, "%s", id);
        }
        if (!items) { snprintf(err, errlen, "--devices \"%.64s\" names no device", flag); return -1; }
    }
    /* GPUs by ordinal, the CPU last: the order jobs prefer and /v1/devices lists */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ord_of(out[j - 1]) > ord_of(out[j]); j--) {
            char t[TQ_DEV_ID_MAX];
            memcpy(t, out[j], sizeof t);
            memcpy(out[j], out[j - 1], sizeof t);
            memcpy(out[j - 1], t, sizeof t);
        }
    return n;
}

int tq_devsel_candidates(const tq_devsel *want, char devs[][TQ_DEV_ID_MAX], int ndev, int *idx) {
    int k = 0;
    for (int pass = 0; pass < 2; pass++)      /* GPUs first, then the CPU */
        for (int i = 0; i < ndev; i++)
            if (tq_dev_is_gpu(devs[i]) == (pass == 0) && tq_devsel_allows(want, devs[i])) idx[k++] = i;
    return k;
}

long long tq_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static const char *const CM_NAMES[] = { "default", "exclusive_thread", "prohibited", "exclusive_process" };

const char *tq_compute_mode_name(int mode) {
    return mode >= 0 && mode < (int)(sizeof CM_NAMES / sizeof CM_NAMES[0]) ? CM_NAMES[mode] : "unknown";
}

int tq_compute_mode_parse(const char *name) {
    for (int m = 0; name && m < (int)(sizeof CM_NAMES / sizeof CM_NAMES[0]); m++)
        if (!strcmp(name, CM_NAMES[m])) return m;
    return -1;
}

int tq_compute_mode_max_jobs(int mode, int max_jobs) {
    if (mode == TQ_CM_PROHIBITED) return 0;
    if (mode == TQ_CM_EXCLUSIVE_PROCESS || mode == TQ_CM_EXCLUSIVE_THREAD) return max_jobs < 1 ? max_jobs : 1;
    return max_jobs;
}

int tq_busy_pause_ms(int streak) {
    static const int pauses[] = { 3000, 10000, 30000, 60000 };
    const int n = (int)(sizeof pauses / sizeof pauses[0]);
    return streak < 1 ? 0 : pauses[streak < n ? streak - 1 : n - 1];
}
