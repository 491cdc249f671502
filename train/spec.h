/* spec.h — the job spec (docs/spec.md): parse and validate JSON into a tq_spec with every
 * default filled in, render it back as JSON, and document it (docs/spec.md and the SPEC
 * section of trainq(1) are generated from the field table in spec.c: `make docs`).
 *
 * Contract: tq_spec_parse never exits and never prints; on a bad spec it returns TQ_SPEC_BAD
 * and fills `err` with the offending field's name (dotted for nested fields:
 * "optimizer.lr") and a message that names the problem ("batch_size must be an integer in
 * 1…65536, got 0"). Unknown fields, wrong types and out-of-range values are all errors; an
 * unknown field's message suggests the nearest known field of the same object when one is
 * close ("unknown field \"batchsize\" (did you mean \"batch_size\"?)").
 * The struct owns no heap memory. Thread-safe (no globals). */
#ifndef TQ_SPEC_H
#define TQ_SPEC_H
#include <stdint.h>
#include "common/tq_common.h"

#define TQ_PATH_MAX 1024

typedef enum { TQ_MODEL_MLP, TQ_MODEL_CNN, TQ_MODEL_RESNET20, TQ_MODEL_RESNET18,
               TQ_MODEL_RESNET50 } tq_model_kind;
typedef enum { TQ_DATA_FASHION_MNIST, TQ_DATA_CIFAR10, TQ_DATA_SYNTHETIC } tq_data_kind;
typedef enum { TQ_AMP_OFF = 0, TQ_AMP_FP16 = 1, TQ_AMP_BF16 = 2 } tq_amp;
typedef enum { TQ_OPT_SGD, TQ_OPT_ADAMW } tq_opt_kind;
typedef enum { TQ_SCHED_CONSTANT, TQ_SCHED_COSINE, TQ_SCHED_STEP, TQ_SCHED_ONECYCLE } tq_sched_kind;
/* TF32 on the GPU (Ampere and later; ignored on the CPU): PyTorch's defaults are "conv"
 * (torch.backends.cudnn.allow_tf32 = True, torch.backends.cuda.matmul.allow_tf32 = False) */
typedef enum { TQ_TF32_OFF = 0, TQ_TF32_CONV = 1, TQ_TF32_ALL = 2 } tq_tf32;

#define TQ_AFTER_MAX 16   /* job ids a job may wait for ("after") */

typedef struct {
    char name[129];
    tq_model_kind model;
    tq_data_kind dataset;
    char data_dir[TQ_PATH_MAX];       /* "" → the dataset's default */
    int batch_size;                   /* 1…65536, default 32; 0 while an "auto" batch is unresolved */
    int accum_steps;                  /* 1…1024, default 1; 0 while an "auto" batch is unresolved */
    int batch_auto;                   /* 1: the spec gave "batch_size": "auto" (train/autobatch.h) */
    int64_t effective_batch;          /* 1…67108864, 0 = not given; batch_size × accum_steps */
    tq_amp amp;
    int64_t steps;                    /* 0 when epochs is used */
    double epochs;                    /* 0 when steps is used; default 1 */
    struct {
        tq_opt_kind type;
        double lr, momentum, weight_decay, beta1, beta2, eps;
        int nesterov;
    } optimizer;   /* sgd defaults: lr .05, momentum .9, nesterov true, wd 5e-4;
                      adamw defaults: lr 1e-3, betas (.9,.999), eps 1e-8, wd 1e-2 */
    struct {
        tq_sched_kind type;
        int64_t warmup_steps, step_size;   /* step_size default 1000 (step schedule) */
        double gamma;                      /* default 0.1 */
    } lr_schedule;
    struct { double init, growth_factor, backoff_factor; int growth_interval; } loss_scale;
    uint64_t seed;
    int shuffle;                      /* default 1 */
    int augment;                      /* default: 1 for cifar10, else 0 */
    int64_t train_subset, eval_subset; /* 0: all */
    int64_t eval_every;               /* 0: end of each epoch and of the job */
    int64_t checkpoint_every;         /* default 500 */
    char init_from[TQ_PATH_MAX];      /* "" none */
    char device[16];                  /* auto | cpu | cuda | cuda:N */
    int64_t max_memory_mb;            /* 0 none */
    int priority;                     /* -100…100 */
    char submission_id[129];          /* "" none */
    int64_t timeout_s;                /* 0 none */
    int cudnn_benchmark;              /* default 1 */
    int deterministic;                /* default 1: GPU convolutions only on deterministic cuDNN engines */
    int recompute;                    /* 1, 0 or TQ_RECOMPUTE_AUTO (the default): regenerate ReLU
                                         outputs in the backward (graph.h); tq_spec_recompute */
    double prune_amount;              /* < 0 none; 0…0.95 */
    int quantize_int8;                /* 0/1 */
    struct { int64_t train, test; int h, w, c; } synthetic; /* defaults 10000, 2000, 32, 32, 3 */
    int threads;                      /* CPU threads, 0 = all cores (addition to the contract) */
    tq_tf32 tf32;                     /* default TQ_TF32_CONV (PyTorch's defaults) */
    int cuda_graphs;                  /* default 0: capture each step as a CUDA graph and replay it */
    int n_after;                      /* run only after these jobs succeeded (sbatch afterok) */
    int64_t after[TQ_AFTER_MAX];      /* distinct job ids >= 1, in the order given */
} tq_spec;

typedef struct { char field[64]; char message[256]; } tq_spec_err;

enum { TQ_SPEC_OK = 0, TQ_SPEC_BAD = 1 };

void tq_spec_defaults(tq_spec *s);
int tq_spec_parse(tq_spec *s, const char *json, tq_spec_err *err);
/* malloc'd JSON text of the full spec (defaults filled in); NULL on OOM. Parsing it again
 * gives the same spec. */
char *tq_spec_to_json(const tq_spec *s);

/* "batch_size": "auto" with effective_batch N (and no accum_steps): the micro-batch is still
 * to be chosen (tq_autobatch_pick); batch_size and accum_steps are 0 until then. */
static inline int tq_spec_batch_unresolved(const tq_spec *s) { return s->batch_auto && s->batch_size == 0; }
/* Sets the micro-batch; when effective_batch is given, also accum_steps = effective_batch /
 * batch_size (which must divide it: asserted). Rendering an auto spec afterwards gives its
 * resolved form ("batch_size":"auto","accum_steps":k,"effective_batch":N). */
void tq_spec_set_batch(tq_spec *s, int batch_size);
/* The micro-batches an effective batch N allows: the divisors b of N with b <= 65536 and
 * N/b <= 1024, ascending. Writes at most `max` of them to out (out may be NULL when max is 0)
 * and returns how many there are (0 when N is out of 1…67108864, or, e.g., a prime > 65536). */
int tq_spec_batch_candidates(int64_t effective_batch, int *out, int max);

const char *tq_model_name(tq_model_kind);
const char *tq_dataset_name(tq_data_kind);
const char *tq_amp_name(tq_amp);
const char *tq_tf32_name(tq_tf32);   /* "off", "conv", "all" (the spec renders false/"conv"/true) */

#define TQ_RECOMPUTE_AUTO (-1)
/* Whether the job's backward regenerates ReLU outputs: `recompute` itself, or for "auto" on
 * unless `device` is "cpu". Callers that know where a "device": "auto" job can run settle
 * "auto" first (the daemon at submission from the devices it serves, storing the result;
 * trainq run/plan from the GPUs the host has), so a job's plan and its run agree. */
int tq_spec_recompute(const tq_spec *);

/* ---- the spec's documentation (docs/spec.md, trainq(1)), from the parser's own lists ---- */

/* The member names the parser accepts in an object: parent NULL or "" for the root, else a
 * root field holding an object ("optimizer", "lr_schedule", "loss_scale", "prune",
 * "synthetic"); NULL (and *n = 0) for anything else. */
const char *const *tq_spec_field_names(const char *parent, int *n);

/* One documented field. Bounds come from the parser's own limits; the unit test parses every
 * example and both bounds, and checks the table covers exactly the parser's fields. */
typedef struct {
    const char *name;       /* dotted for a nested field: "optimizer.lr" */
    const char *type;       /* the JSON type(s), as the docs print them */
    const char *def;        /* the default, as the docs print it */
    const char *def_json;   /* the default as tq_spec_to_json renders it: for the spec {} (a root
                               field) or for the example's `with`/`with_root` alone (a nested
                               one); NULL when that does not show it */
    int bounds;             /* TQ_DOC_INT: an integer in [lo, hi]; TQ_DOC_NUM: a number between
                               lo and hi (*_open: excluded; hi may be INFINITY); 0: none */
    double lo, hi;
    int lo_open, hi_open;
    const char *const *values;   /* the allowed strings of an enum (n_values of them), or NULL */
    int n_values;
    const char *range;      /* more about the range, printed after the bounds/values, or NULL */
    const char *meaning;
    const char *example;    /* a JSON value */
    const char *with;       /* JSON members the example needs in the same object, or NULL */
    const char *with_root;  /* JSON members the example needs at the root, or NULL */
} tq_spec_doc_field;
enum { TQ_DOC_INT = 1, TQ_DOC_NUM = 2 };

/* Every documented field, root fields first in the rendering's order, each object's members
 * after it. */
const tq_spec_doc_field *tq_spec_doc_fields(int *count);
/* The field's example as a whole spec: {with_root, "field": example} or, nested,
 * {with_root, "parent": {with, "field": example}}. malloc'd; NULL on OOM. */
char *tq_spec_doc_example(const tq_spec_doc_field *f);
/* A complete example spec (it parses; the unit test checks it). */
extern const char tq_spec_doc_full_example[];

enum { TQ_DOC_MARKDOWN = 0, TQ_DOC_MAN = 1 };
/* The spec reference: a summary table, every field (type, default, range, meaning, example),
 * the cross-field rules and a full example, as Markdown or as man(7) roff. malloc'd; NULL on
 * OOM. */
char *tq_spec_doc(int format);
/* A template with the line "@SPEC_REFERENCE@" (roff: ".\" @SPEC_REFERENCE@") replaced by
 * tq_spec_doc(format): what `make docs` writes to docs/spec.md and docs/trainq.1. malloc'd;
 * NULL on OOM or when the template has no such line. */
char *tq_spec_doc_fill(const char *template_text, int format);
static inline tq_dtype tq_amp_dtype(tq_amp a) { return a == TQ_AMP_FP16 ? TQ_F16 : a == TQ_AMP_BF16 ? TQ_BF16 : TQ_F32; }

#endif
