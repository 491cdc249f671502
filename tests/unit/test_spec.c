/* test_spec.c — the job spec parser/renderer (train/spec.c) against its documentation
 * (docs/spec.md): defaults, every field's good values, a battery of bad inputs each with the
 * field it must name, the wording of the messages, "did you mean", the parse(to_json(s)) == s
 * round trip; and the documentation table against the parser: every field documented, every
 * example and bound parsed, the committed docs/spec.md and docs/trainq.1 up to date. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "utf8.h"

/* ---- helpers -------------------------------------------------------------------------- */

static tq_spec parse_ok(const char *json) {
    tq_spec s;
    tq_spec_err e;
    int rc = tq_spec_parse(&s, json, &e);
    if (rc != TQ_SPEC_OK) print_error("unexpected error for %s: [%s] %s\n", json, e.field, e.message);
    assert_int_equal(rc, TQ_SPEC_OK);
    assert_string_equal(e.field, "");
    return s;
}

/* Field-by-field equality (strings by content), so a failure says which field differs. */
static int spec_equal(const tq_spec *a, const tq_spec *b) {
#define EQ(f) do { if (a->f != b->f) { print_error("spec field " #f " differs\n"); return 0; } } while (0)
#define SEQ(f) do { if (strcmp(a->f, b->f)) { print_error("spec field " #f " differs: \"%s\" vs \"%s\"\n", a->f, b->f); return 0; } } while (0)
    SEQ(name); EQ(model); EQ(dataset); SEQ(data_dir); EQ(batch_size); EQ(accum_steps);
    EQ(batch_auto); EQ(effective_batch); EQ(amp);
    EQ(steps); EQ(epochs);
    EQ(optimizer.type); EQ(optimizer.lr); EQ(optimizer.momentum); EQ(optimizer.weight_decay);
    EQ(optimizer.beta1); EQ(optimizer.beta2); EQ(optimizer.eps); EQ(optimizer.nesterov);
    EQ(lr_schedule.type); EQ(lr_schedule.warmup_steps); EQ(lr_schedule.step_size);
    EQ(lr_schedule.gamma);
    EQ(loss_scale.init); EQ(loss_scale.growth_factor); EQ(loss_scale.backoff_factor);
    EQ(loss_scale.growth_interval);
    EQ(seed); EQ(shuffle); EQ(augment); EQ(train_subset); EQ(eval_subset); EQ(eval_every);
    EQ(checkpoint_every); SEQ(init_from); SEQ(device); EQ(max_memory_mb); EQ(priority);
    SEQ(submission_id); EQ(timeout_s); EQ(cudnn_benchmark); EQ(prune_amount); EQ(quantize_int8);
    EQ(synthetic.train); EQ(synthetic.test); EQ(synthetic.h); EQ(synthetic.w); EQ(synthetic.c);
    EQ(threads); EQ(recompute); EQ(deterministic); EQ(tf32); EQ(cuda_graphs); EQ(n_after);
    for (int k = 0; k < a->n_after; k++) EQ(after[k]);
#undef EQ
#undef SEQ
    return 1;
}

/* parse → render → parse gives the same spec, and rendering again gives the same text */
static void check_round_trip(const char *json) {
    tq_spec a = parse_ok(json), b;
    char *text = tq_spec_to_json(&a);
    assert_non_null(text);
    tq_spec_err e;
    int rc = tq_spec_parse(&b, text, &e);
    if (rc) print_error("re-parse of %s failed: [%s] %s\n", text, e.field, e.message);
    assert_int_equal(rc, TQ_SPEC_OK);
    if (!spec_equal(&a, &b)) print_error("round trip of %s via %s\n", json, text);
    assert_true(spec_equal(&a, &b));
    assert_memory_equal(&a, &b, sizeof a);
    char *text2 = tq_spec_to_json(&b);
    assert_string_equal(text, text2);
    free(text);
    free(text2);
}

/* The rendered spec as a cJSON tree (caller deletes). */
static cJSON *render(const char *json) {
    tq_spec s = parse_ok(json);
    char *text = tq_spec_to_json(&s);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

static int has_keys_exactly(const cJSON *obj, const char *const *keys, int n) {
    if (cJSON_GetArraySize(obj) != n) return 0;
    for (int i = 0; i < n; i++)
        if (!cJSON_GetObjectItemCaseSensitive(obj, keys[i])) return 0;
    return 1;
}

/* ---- defaults ------------------------------------------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    tq_spec s = parse_ok("{}"), d;
    assert_string_equal(s.name, "");
    assert_int_equal(s.model, TQ_MODEL_CNN);
    assert_int_equal(s.dataset, TQ_DATA_FASHION_MNIST);
    assert_string_equal(s.data_dir, "/usr/share/datasets/fashion-mnist");
    assert_int_equal(s.batch_size, 32);
    assert_int_equal(s.accum_steps, 1);
    assert_int_equal(s.amp, TQ_AMP_OFF);
    assert_int_equal(s.steps, 0);
    assert_true(s.epochs == 1.0);
    assert_int_equal(s.optimizer.type, TQ_OPT_SGD);
    assert_true(s.optimizer.lr == 0.05);
    assert_true(s.optimizer.momentum == 0.9);
    assert_int_equal(s.optimizer.nesterov, 1);
    assert_true(s.optimizer.weight_decay == 5e-4);
    assert_int_equal(s.lr_schedule.type, TQ_SCHED_CONSTANT);
    assert_int_equal(s.lr_schedule.warmup_steps, 0);
    assert_int_equal(s.lr_schedule.step_size, 1000);
    assert_true(s.lr_schedule.gamma == 0.1);
    assert_true(s.loss_scale.init == 65536);
    assert_true(s.loss_scale.growth_factor == 2);
    assert_true(s.loss_scale.backoff_factor == 0.5);
    assert_int_equal(s.loss_scale.growth_interval, 2000);
    assert_int_equal(s.seed, 0);
    assert_int_equal(s.shuffle, 1);
    assert_int_equal(s.augment, 0);
    assert_int_equal(s.train_subset, 0);
    assert_int_equal(s.eval_subset, 0);
    assert_int_equal(s.eval_every, 0);
    assert_int_equal(s.checkpoint_every, 500);
    assert_string_equal(s.init_from, "");
    assert_string_equal(s.device, "auto");
    assert_int_equal(s.max_memory_mb, 0);
    assert_int_equal(s.priority, 0);
    assert_string_equal(s.submission_id, "");
    assert_int_equal(s.timeout_s, 0);
    assert_int_equal(s.cudnn_benchmark, 1);
    assert_int_equal(s.deterministic, 1);
    assert_true(s.prune_amount < 0);
    assert_int_equal(s.quantize_int8, 0);
    assert_int_equal(s.synthetic.train, 10000);
    assert_int_equal(s.synthetic.test, 2000);
    assert_int_equal(s.synthetic.h, 32);
    assert_int_equal(s.synthetic.w, 32);
    assert_int_equal(s.synthetic.c, 3);
    assert_int_equal(s.threads, 0);

    tq_spec_defaults(&d);
    assert_true(spec_equal(&s, &d));
    assert_memory_equal(&s, &d, sizeof s);
    /* whitespace around the object is fine */
    s = parse_ok(" \n\t{ }\n");
    assert_true(spec_equal(&s, &d));
}

static void test_default_rendering(void **state) {
    (void)state;
    tq_spec s;
    tq_spec_defaults(&s);
    char *text = tq_spec_to_json(&s);
    assert_non_null(text);
    assert_string_equal(text,
        "{\"name\":\"\",\"model\":\"cnn\",\"dataset\":\"fashion-mnist\","
        "\"data_dir\":\"/usr/share/datasets/fashion-mnist\",\"batch_size\":32,\"accum_steps\":1,"
        "\"amp\":\"off\",\"epochs\":1,"
        "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.05,\"momentum\":0.9,\"nesterov\":true,\"weight_decay\":0.0005},"
        "\"lr_schedule\":{\"type\":\"constant\",\"warmup_steps\":0},"
        "\"loss_scale\":{\"init\":65536,\"growth_factor\":2,\"backoff_factor\":0.5,\"growth_interval\":2000},"
        "\"seed\":0,\"shuffle\":true,\"augment\":false,\"train_subset\":null,\"eval_subset\":null,"
        "\"eval_every\":0,\"checkpoint_every\":500,\"init_from\":null,\"device\":\"auto\","
        "\"max_memory_mb\":null,\"priority\":0,\"submission_id\":null,\"timeout_s\":null,"
        "\"cudnn_benchmark\":true,\"prune\":null,\"quantize\":null,\"threads\":0,\"recompute\":\"auto\","
        "\"deterministic\":true,\"tf32\":\"conv\",\"cuda_graphs\":false,\"after\":[]}");
    free(text);
}

/* ---- good values ---------------------------------------------------------------------- */

static void test_models_datasets(void **state) {
    (void)state;
    static const char *const models[] = { "mlp", "cnn", "resnet20", "resnet18", "resnet50" };
    for (int i = 0; i < 5; i++) {
        char j[64];
        snprintf(j, sizeof j, "{\"model\":\"%s\"}", models[i]);
        tq_spec s = parse_ok(j);
        assert_int_equal(s.model, i);
        assert_string_equal(tq_model_name((tq_model_kind)i), models[i]);
    }
    tq_spec s = parse_ok("{\"dataset\":\"fashion-mnist\"}");
    assert_int_equal(s.dataset, TQ_DATA_FASHION_MNIST);
    assert_int_equal(s.augment, 0);
    assert_string_equal(s.data_dir, "/usr/share/datasets/fashion-mnist");
    s = parse_ok("{\"dataset\":\"fashion-mnist\",\"data_dir\":\"/data/fm\"}");
    assert_string_equal(s.data_dir, "/data/fm");
    s = parse_ok("{\"dataset\":\"fashion-mnist\",\"data_dir\":null}");
    assert_string_equal(s.data_dir, "/usr/share/datasets/fashion-mnist");
    s = parse_ok("{\"dataset\":\"cifar10\",\"data_dir\":\"/data/cifar-10-batches-bin\"}");
    assert_int_equal(s.dataset, TQ_DATA_CIFAR10);
    assert_string_equal(s.data_dir, "/data/cifar-10-batches-bin");
    assert_int_equal(s.augment, 1);   /* default for cifar10 */
    s = parse_ok("{\"augment\":false,\"dataset\":\"cifar10\",\"data_dir\":\"/c\"}");
    assert_int_equal(s.augment, 0);
    s = parse_ok("{\"dataset\":\"fashion-mnist\",\"augment\":true}");
    assert_int_equal(s.augment, 1);
    s = parse_ok("{\"dataset\":\"synthetic\"}");
    assert_int_equal(s.dataset, TQ_DATA_SYNTHETIC);
    assert_string_equal(s.data_dir, "");
    assert_int_equal(s.augment, 0);
    assert_int_equal(s.synthetic.train, 10000);
    s = parse_ok("{\"dataset\":\"synthetic\",\"synthetic\":{\"train\":64,\"test\":16,\"height\":28,"
                 "\"width\":20,\"channels\":1}}");
    assert_int_equal(s.synthetic.train, 64);
    assert_int_equal(s.synthetic.test, 16);
    assert_int_equal(s.synthetic.h, 28);
    assert_int_equal(s.synthetic.w, 20);
    assert_int_equal(s.synthetic.c, 1);
    s = parse_ok("{\"synthetic\":{\"train\":100},\"dataset\":\"synthetic\"}");   /* order-free */
    assert_int_equal(s.synthetic.train, 100);
    assert_int_equal(s.synthetic.test, 2000);
    assert_string_equal(tq_dataset_name(TQ_DATA_FASHION_MNIST), "fashion-mnist");
    assert_string_equal(tq_dataset_name(TQ_DATA_CIFAR10), "cifar10");
    assert_string_equal(tq_dataset_name(TQ_DATA_SYNTHETIC), "synthetic");
}

static void test_scalars(void **state) {
    (void)state;
    tq_spec s;
    s = parse_ok("{\"name\":\"baseline run\"}");
    assert_string_equal(s.name, "baseline run");
    char name128[200];
    snprintf(name128, sizeof name128, "{\"name\":\"%0128d\"}", 0);
    s = parse_ok(name128);
    assert_int_equal(strlen(s.name), 128);
    s = parse_ok("{\"batch_size\":1,\"accum_steps\":1024}");
    assert_int_equal(s.batch_size, 1);
    assert_int_equal(s.accum_steps, 1024);
    s = parse_ok("{\"batch_size\":65536,\"accum_steps\":1}");
    assert_int_equal(s.batch_size, 65536);
    s = parse_ok("{\"batch_size\":64.0}");   /* an integral number is an integer */
    assert_int_equal(s.batch_size, 64);
    s = parse_ok("{\"batch_size\":1e2}");
    assert_int_equal(s.batch_size, 100);

    s = parse_ok("{\"amp\":false}");  assert_int_equal(s.amp, TQ_AMP_OFF);
    s = parse_ok("{\"amp\":true}");   assert_int_equal(s.amp, TQ_AMP_FP16);
    s = parse_ok("{\"amp\":\"off\"}"); assert_int_equal(s.amp, TQ_AMP_OFF);
    s = parse_ok("{\"amp\":\"fp16\"}"); assert_int_equal(s.amp, TQ_AMP_FP16);
    s = parse_ok("{\"amp\":\"bf16\"}"); assert_int_equal(s.amp, TQ_AMP_BF16);
    assert_string_equal(tq_amp_name(TQ_AMP_OFF), "off");
    assert_string_equal(tq_amp_name(TQ_AMP_FP16), "fp16");
    assert_string_equal(tq_amp_name(TQ_AMP_BF16), "bf16");
    assert_int_equal(tq_amp_dtype(TQ_AMP_BF16), TQ_BF16);

    s = parse_ok("{\"steps\":1}");
    assert_int_equal(s.steps, 1);
    assert_true(s.epochs == 0);
    s = parse_ok("{\"steps\":10000000}");   /* the upper bound */
    assert_int_equal(s.steps, 10000000);
    s = parse_ok("{\"epochs\":0.25}");
    assert_true(s.epochs == 0.25);
    assert_int_equal(s.steps, 0);
    s = parse_ok("{\"epochs\":30}");
    assert_true(s.epochs == 30);

    s = parse_ok("{\"seed\":0}");                 assert_int_equal(s.seed, 0);
    s = parse_ok("{\"seed\":42}");                assert_int_equal(s.seed, 42);
    s = parse_ok("{\"seed\":9007199254740992}");  assert_true(s.seed == 9007199254740992ULL);
    s = parse_ok("{\"shuffle\":false,\"cudnn_benchmark\":false}");
    assert_int_equal(s.shuffle, 0);
    assert_int_equal(s.cudnn_benchmark, 0);
    assert_int_equal(s.deterministic, 1);
    s = parse_ok("{\"deterministic\":false}");
    assert_int_equal(s.deterministic, 0);
    assert_int_equal(s.cudnn_benchmark, 1);
    s = parse_ok("{\"train_subset\":1,\"eval_subset\":500}");
    assert_int_equal(s.train_subset, 1);
    assert_int_equal(s.eval_subset, 500);
    s = parse_ok("{\"train_subset\":null,\"eval_subset\":null}");
    assert_int_equal(s.train_subset, 0);
    assert_int_equal(s.eval_subset, 0);
    s = parse_ok("{\"eval_every\":0,\"checkpoint_every\":1}");
    assert_int_equal(s.eval_every, 0);
    assert_int_equal(s.checkpoint_every, 1);
    s = parse_ok("{\"eval_every\":100,\"checkpoint_every\":100000}");
    assert_int_equal(s.eval_every, 100);
    assert_int_equal(s.checkpoint_every, 100000);
    s = parse_ok("{\"init_from\":\"/w/model.safetensors\"}");
    assert_string_equal(s.init_from, "/w/model.safetensors");
    s = parse_ok("{\"init_from\":null}");
    assert_string_equal(s.init_from, "");

    static const char *const devices[] = { "auto", "cpu", "cuda", "cuda:0", "cuda:7", "cuda:12", "cuda:255" };
    for (int i = 0; i < 7; i++) {
        char j[64];
        snprintf(j, sizeof j, "{\"device\":\"%s\"}", devices[i]);
        s = parse_ok(j);
        assert_string_equal(s.device, devices[i]);
    }
    s = parse_ok("{\"max_memory_mb\":1}");     assert_int_equal(s.max_memory_mb, 1);
    s = parse_ok("{\"max_memory_mb\":24576}"); assert_int_equal(s.max_memory_mb, 24576);
    s = parse_ok("{\"max_memory_mb\":null}");  assert_int_equal(s.max_memory_mb, 0);
    s = parse_ok("{\"priority\":-100}"); assert_int_equal(s.priority, -100);
    s = parse_ok("{\"priority\":100}");  assert_int_equal(s.priority, 100);
    s = parse_ok("{\"submission_id\":\"a1b2-c3\"}");
    assert_string_equal(s.submission_id, "a1b2-c3");
    s = parse_ok("{\"submission_id\":null}");
    assert_string_equal(s.submission_id, "");
    s = parse_ok("{\"timeout_s\":1}");    assert_int_equal(s.timeout_s, 1);
    s = parse_ok("{\"timeout_s\":86400}"); assert_int_equal(s.timeout_s, 86400);
    s = parse_ok("{\"timeout_s\":null}");  assert_int_equal(s.timeout_s, 0);
    s = parse_ok("{\"prune\":{\"amount\":0}}");    assert_true(s.prune_amount == 0);
    s = parse_ok("{\"prune\":{\"amount\":0.95}}"); assert_true(s.prune_amount == 0.95);
    s = parse_ok("{\"prune\":{\"amount\":0.5}}");  assert_true(s.prune_amount == 0.5);
    s = parse_ok("{\"prune\":null}");              assert_true(s.prune_amount < 0);
    s = parse_ok("{\"quantize\":\"int8\"}");       assert_int_equal(s.quantize_int8, 1);
    s = parse_ok("{\"quantize\":null}");           assert_int_equal(s.quantize_int8, 0);
    s = parse_ok("{\"threads\":0}");   assert_int_equal(s.threads, 0);
    s = parse_ok("{\"threads\":256}"); assert_int_equal(s.threads, 256);
    s = parse_ok("{\"threads\":8}");   assert_int_equal(s.threads, 8);
}

static void test_optimizer(void **state) {
    (void)state;
    tq_spec s = parse_ok("{\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0.5,"
                         "\"nesterov\":false,\"weight_decay\":0}}");
    assert_int_equal(s.optimizer.type, TQ_OPT_SGD);
    assert_true(s.optimizer.lr == 0.1);
    assert_true(s.optimizer.momentum == 0.5);
    assert_int_equal(s.optimizer.nesterov, 0);
    assert_true(s.optimizer.weight_decay == 0);
    /* partial sgd: the rest are sgd defaults; type may be left out or come last */
    s = parse_ok("{\"optimizer\":{\"lr\":0.2}}");
    assert_int_equal(s.optimizer.type, TQ_OPT_SGD);
    assert_true(s.optimizer.lr == 0.2);
    assert_true(s.optimizer.momentum == 0.9);
    assert_int_equal(s.optimizer.nesterov, 1);
    assert_true(s.optimizer.weight_decay == 5e-4);
    /* momentum 0 without nesterov: the nesterov default gives way */
    s = parse_ok("{\"optimizer\":{\"momentum\":0}}");
    assert_true(s.optimizer.momentum == 0);
    assert_int_equal(s.optimizer.nesterov, 0);
    s = parse_ok("{\"optimizer\":{\"momentum\":0,\"nesterov\":false}}");
    assert_int_equal(s.optimizer.nesterov, 0);

    s = parse_ok("{\"optimizer\":{\"type\":\"adamw\"}}");
    assert_int_equal(s.optimizer.type, TQ_OPT_ADAMW);
    assert_true(s.optimizer.lr == 1e-3);
    assert_true(s.optimizer.beta1 == 0.9);
    assert_true(s.optimizer.beta2 == 0.999);
    assert_true(s.optimizer.eps == 1e-8);
    assert_true(s.optimizer.weight_decay == 1e-2);
    s = parse_ok("{\"optimizer\":{\"lr\":3e-4,\"betas\":[0.8,0.95],\"eps\":1e-6,"
                 "\"weight_decay\":0.05,\"type\":\"adamw\"}}");
    assert_true(s.optimizer.lr == 3e-4);
    assert_true(s.optimizer.beta1 == 0.8);
    assert_true(s.optimizer.beta2 == 0.95);
    assert_true(s.optimizer.eps == 1e-6);
    assert_true(s.optimizer.weight_decay == 0.05);
    s = parse_ok("{\"optimizer\":{\"type\":\"adamw\",\"betas\":[0,0]}}");
    assert_true(s.optimizer.beta1 == 0 && s.optimizer.beta2 == 0);

    s = parse_ok("{\"lr_schedule\":{\"type\":\"cosine\",\"warmup_steps\":100}}");
    assert_int_equal(s.lr_schedule.type, TQ_SCHED_COSINE);
    assert_int_equal(s.lr_schedule.warmup_steps, 100);
    s = parse_ok("{\"lr_schedule\":{\"type\":\"step\",\"step_size\":30,\"gamma\":0.5}}");
    assert_int_equal(s.lr_schedule.type, TQ_SCHED_STEP);
    assert_int_equal(s.lr_schedule.step_size, 30);
    assert_true(s.lr_schedule.gamma == 0.5);
    s = parse_ok("{\"lr_schedule\":{\"type\":\"step\"}}");
    assert_int_equal(s.lr_schedule.step_size, 1000);
    assert_true(s.lr_schedule.gamma == 0.1);
    s = parse_ok("{\"lr_schedule\":{\"type\":\"onecycle\"}}");
    assert_int_equal(s.lr_schedule.type, TQ_SCHED_ONECYCLE);
    s = parse_ok("{\"lr_schedule\":{\"type\":\"constant\",\"warmup_steps\":0}}");
    assert_int_equal(s.lr_schedule.type, TQ_SCHED_CONSTANT);
    s = parse_ok("{\"lr_schedule\":{}}");
    assert_int_equal(s.lr_schedule.type, TQ_SCHED_CONSTANT);

    s = parse_ok("{\"loss_scale\":{\"init\":1024,\"growth_factor\":1.5,\"backoff_factor\":0.25,"
                 "\"growth_interval\":1}}");
    assert_true(s.loss_scale.init == 1024);
    assert_true(s.loss_scale.growth_factor == 1.5);
    assert_true(s.loss_scale.backoff_factor == 0.25);
    assert_int_equal(s.loss_scale.growth_interval, 1);
    s = parse_ok("{\"loss_scale\":{\"init\":0.5}}");
    assert_true(s.loss_scale.init == 0.5);
    assert_int_equal(s.loss_scale.growth_interval, 2000);
}

/* ---- bad inputs ----------------------------------------------------------------------- */

typedef struct { const char *json, *field; } bad_case;

static const bad_case bad_cases[] = {
    /* the document */
    { "", "" }, { "   ", "" }, { "{", "" }, { "{\"batch_size\":}", "" }, { "{} x", "" },
    { "{\"a\":1,}", "" }, { "[]", "" }, { "[{}]", "" }, { "42", "" }, { "\"spec\"", "" },
    { "null", "" }, { "true", "" },
    /* unknown and repeated fields */
    { "{\"btach_size\":32}", "btach_size" }, { "{\"Batch_size\":32}", "Batch_size" },
    { "{\"\":1}", "" }, { "{\"batch_size\":32,\"batch_size\":64}", "batch_size" },
    { "{\"optimizer\":{\"foo\":1}}", "optimizer.foo" },
    { "{\"optimizer\":{\"lr\":0.1,\"lr\":0.2}}", "optimizer.lr" },
    { "{\"optimizer\":{\"type\":\"sgd\",\"betas\":[0.9,0.99]}}", "optimizer.betas" },
    { "{\"optimizer\":{\"type\":\"sgd\",\"eps\":1e-8}}", "optimizer.eps" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"momentum\":0.9}}", "optimizer.momentum" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"nesterov\":true}}", "optimizer.nesterov" },
    { "{\"lr_schedule\":{\"type\":\"cosine\",\"bar\":1}}", "lr_schedule.bar" },
    { "{\"lr_schedule\":{\"type\":\"cosine\",\"step_size\":10}}", "lr_schedule.step_size" },
    { "{\"lr_schedule\":{\"gamma\":0.5}}", "lr_schedule.gamma" },
    { "{\"loss_scale\":{\"initial\":1}}", "loss_scale.initial" },
    { "{\"loss_scale\":{\"init\":1,\"init\":2}}", "loss_scale.init" },
    { "{\"prune\":{\"amount\":0.5,\"kind\":\"l1\"}}", "prune.kind" },
    { "{\"synthetic\":{\"depth\":3},\"dataset\":\"synthetic\"}", "synthetic.depth" },
    /* name, strings */
    { "{\"name\":5}", "name" }, { "{\"name\":null}", "name" }, { "{\"name\":[\"a\"]}", "name" },
    { "{\"model\":\"resnet34\"}", "model" }, { "{\"model\":\"CNN\"}", "model" },
    { "{\"model\":1}", "model" }, { "{\"model\":null}", "model" },
    { "{\"dataset\":\"mnist\"}", "dataset" }, { "{\"dataset\":true}", "dataset" },
    { "{\"data_dir\":\"\"}", "data_dir" }, { "{\"data_dir\":7}", "data_dir" },
    /* integers */
    { "{\"batch_size\":0}", "batch_size" }, { "{\"batch_size\":65537}", "batch_size" },
    { "{\"batch_size\":-1}", "batch_size" }, { "{\"batch_size\":5.5}", "batch_size" },
    { "{\"batch_size\":\"32\"}", "batch_size" }, { "{\"batch_size\":true}", "batch_size" },
    { "{\"batch_size\":null}", "batch_size" }, { "{\"batch_size\":1e400}", "batch_size" },
    { "{\"accum_steps\":0}", "accum_steps" }, { "{\"accum_steps\":1025}", "accum_steps" },
    { "{\"accum_steps\":2.5}", "accum_steps" },
    { "{\"steps\":0}", "steps" }, { "{\"steps\":-5}", "steps" }, { "{\"steps\":10.5}", "steps" },
    { "{\"steps\":\"100\"}", "steps" }, { "{\"steps\":null}", "steps" },
    { "{\"steps\":1e17}", "steps" },
    { "{\"epochs\":0}", "epochs" }, { "{\"epochs\":-1}", "epochs" },
    { "{\"epochs\":\"1\"}", "epochs" }, { "{\"epochs\":2e6}", "epochs" },
    { "{\"steps\":100,\"epochs\":1}", "steps" }, { "{\"epochs\":1,\"steps\":100}", "steps" },
    { "{\"seed\":-1}", "seed" }, { "{\"seed\":1.5}", "seed" }, { "{\"seed\":\"7\"}", "seed" },
    { "{\"seed\":18014398509481984}", "seed" },
    { "{\"train_subset\":0}", "train_subset" }, { "{\"train_subset\":-3}", "train_subset" },
    { "{\"eval_subset\":0}", "eval_subset" }, { "{\"eval_subset\":1.5}", "eval_subset" },
    { "{\"eval_every\":-1}", "eval_every" }, { "{\"eval_every\":\"x\"}", "eval_every" },
    { "{\"checkpoint_every\":0}", "checkpoint_every" },
    { "{\"checkpoint_every\":null}", "checkpoint_every" },
    { "{\"max_memory_mb\":0}", "max_memory_mb" }, { "{\"max_memory_mb\":-512}", "max_memory_mb" },
    { "{\"max_memory_mb\":1.5}", "max_memory_mb" },
    { "{\"priority\":101}", "priority" }, { "{\"priority\":-101}", "priority" },
    { "{\"priority\":0.5}", "priority" }, { "{\"priority\":null}", "priority" },
    { "{\"timeout_s\":0}", "timeout_s" }, { "{\"timeout_s\":-1}", "timeout_s" },
    { "{\"timeout_s\":\"1h\"}", "timeout_s" },
    { "{\"threads\":-1}", "threads" }, { "{\"threads\":257}", "threads" },
    { "{\"threads\":1.5}", "threads" },
    /* booleans */
    { "{\"shuffle\":1}", "shuffle" }, { "{\"shuffle\":\"true\"}", "shuffle" },
    { "{\"shuffle\":null}", "shuffle" }, { "{\"augment\":0}", "augment" },
    { "{\"cudnn_benchmark\":\"yes\"}", "cudnn_benchmark" },
    { "{\"deterministic\":0}", "deterministic" }, { "{\"deterministic\":\"false\"}", "deterministic" },
    { "{\"cuda_graphs\":1}", "cuda_graphs" }, { "{\"cuda_graphs\":null}", "cuda_graphs" },
    /* recompute */
    { "{\"recompute\":1}", "recompute" }, { "{\"recompute\":\"on\"}", "recompute" },
    { "{\"recompute\":null}", "recompute" },
    /* tf32 */
    { "{\"tf32\":\"all\"}", "tf32" }, { "{\"tf32\":1}", "tf32" }, { "{\"tf32\":null}", "tf32" },
    /* after */
    { "{\"after\":5}", "after" }, { "{\"after\":[0]}", "after[0]" }, { "{\"after\":[1,-2]}", "after[1]" },
    { "{\"after\":[1.5]}", "after[0]" }, { "{\"after\":[\"3\"]}", "after[0]" },
    { "{\"after\":[4,4]}", "after[1]" }, { "{\"after\":{}}", "after" },
    { "{\"after\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "after" },
    /* amp */
    { "{\"amp\":\"fp32\"}", "amp" }, { "{\"amp\":\"FP16\"}", "amp" }, { "{\"amp\":1}", "amp" },
    { "{\"amp\":null}", "amp" }, { "{\"amp\":\"\"}", "amp" },
    /* optimizer */
    { "{\"optimizer\":\"sgd\"}", "optimizer" }, { "{\"optimizer\":null}", "optimizer" },
    { "{\"optimizer\":[]}", "optimizer" },
    { "{\"optimizer\":{\"type\":\"adam\"}}", "optimizer.type" },
    { "{\"optimizer\":{\"type\":null}}", "optimizer.type" },
    { "{\"optimizer\":{\"lr\":0}}", "optimizer.lr" }, { "{\"optimizer\":{\"lr\":-0.1}}", "optimizer.lr" },
    { "{\"optimizer\":{\"lr\":\"0.1\"}}", "optimizer.lr" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"lr\":0}}", "optimizer.lr" },
    { "{\"optimizer\":{\"momentum\":1}}", "optimizer.momentum" },
    { "{\"optimizer\":{\"momentum\":-0.1}}", "optimizer.momentum" },
    { "{\"optimizer\":{\"nesterov\":1}}", "optimizer.nesterov" },
    { "{\"optimizer\":{\"momentum\":0,\"nesterov\":true}}", "optimizer.nesterov" },
    { "{\"optimizer\":{\"nesterov\":true,\"momentum\":0}}", "optimizer.nesterov" },
    { "{\"optimizer\":{\"weight_decay\":-1e-4}}", "optimizer.weight_decay" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"weight_decay\":-1}}", "optimizer.weight_decay" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"betas\":[0.9]}}", "optimizer.betas" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"betas\":[0.9,0.99,0.999]}}", "optimizer.betas" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"betas\":[0.9,1]}}", "optimizer.betas" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"betas\":[-0.1,0.9]}}", "optimizer.betas" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"betas\":[\"0.9\",0.99]}}", "optimizer.betas" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"betas\":0.9}}", "optimizer.betas" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"eps\":0}}", "optimizer.eps" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"eps\":-1e-8}}", "optimizer.eps" },
    /* lr_schedule */
    { "{\"lr_schedule\":\"cosine\"}", "lr_schedule" },
    { "{\"lr_schedule\":{\"type\":\"linear\"}}", "lr_schedule.type" },
    { "{\"lr_schedule\":{\"warmup_steps\":-1}}", "lr_schedule.warmup_steps" },
    { "{\"lr_schedule\":{\"warmup_steps\":1.5}}", "lr_schedule.warmup_steps" },
    { "{\"lr_schedule\":{\"type\":\"step\",\"step_size\":0}}", "lr_schedule.step_size" },
    { "{\"lr_schedule\":{\"type\":\"step\",\"gamma\":0}}", "lr_schedule.gamma" },
    { "{\"lr_schedule\":{\"type\":\"step\",\"gamma\":-0.5}}", "lr_schedule.gamma" },
    /* loss_scale */
    { "{\"loss_scale\":65536}", "loss_scale" },
    { "{\"loss_scale\":{\"init\":0}}", "loss_scale.init" },
    { "{\"loss_scale\":{\"init\":-1}}", "loss_scale.init" },
    { "{\"loss_scale\":{\"growth_factor\":1}}", "loss_scale.growth_factor" },
    { "{\"loss_scale\":{\"growth_factor\":0.5}}", "loss_scale.growth_factor" },
    { "{\"loss_scale\":{\"backoff_factor\":0}}", "loss_scale.backoff_factor" },
    { "{\"loss_scale\":{\"backoff_factor\":1}}", "loss_scale.backoff_factor" },
    { "{\"loss_scale\":{\"growth_interval\":0}}", "loss_scale.growth_interval" },
    { "{\"loss_scale\":{\"growth_interval\":2.5}}", "loss_scale.growth_interval" },
    /* device */
    { "{\"device\":\"gpu\"}", "device" }, { "{\"device\":\"cuda:\"}", "device" },
    { "{\"device\":\"cuda:-1\"}", "device" }, { "{\"device\":\"cuda:x\"}", "device" },
    { "{\"device\":\"cuda:01\"}", "device" }, { "{\"device\":\"cuda:1000\"}", "device" },
    { "{\"device\":\"cuda:256\"}", "device" }, { "{\"device\":\"CPU\"}", "device" },
    { "{\"device\":0}", "device" }, { "{\"device\":null}", "device" },
    /* submission_id, init_from */
    { "{\"submission_id\":\"\"}", "submission_id" }, { "{\"submission_id\":12}", "submission_id" },
    { "{\"init_from\":\"\"}", "init_from" }, { "{\"init_from\":false}", "init_from" },
    /* prune, quantize */
    { "{\"prune\":0.5}", "prune" }, { "{\"prune\":true}", "prune" },
    { "{\"prune\":{}}", "prune.amount" }, { "{\"prune\":{\"amount\":0.96}}", "prune.amount" },
    { "{\"prune\":{\"amount\":-0.1}}", "prune.amount" },
    { "{\"prune\":{\"amount\":\"half\"}}", "prune.amount" },
    { "{\"quantize\":\"int4\"}", "quantize" }, { "{\"quantize\":true}", "quantize" },
    { "{\"quantize\":\"INT8\"}", "quantize" },
    /* datasets */
    { "{\"dataset\":\"cifar10\"}", "data_dir" }, { "{\"dataset\":\"cifar10\",\"data_dir\":null}", "data_dir" },
    { "{\"synthetic\":{\"train\":10}}", "synthetic" },
    { "{\"dataset\":\"cifar10\",\"data_dir\":\"/c\",\"synthetic\":{}}", "synthetic" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":5}", "synthetic" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":{\"train\":0}}", "synthetic.train" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":{\"test\":-1}}", "synthetic.test" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":{\"height\":0}}", "synthetic.height" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":{\"width\":4097}}", "synthetic.width" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":{\"channels\":0}}", "synthetic.channels" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":{\"channels\":2.5}}", "synthetic.channels" },
    /* batch_size "auto" and effective_batch */
    { "{\"batch_size\":\"AUTO\",\"effective_batch\":256}", "batch_size" },
    { "{\"batch_size\":\"\",\"effective_batch\":256}", "batch_size" },
    { "{\"batch_size\":true}", "batch_size" }, { "{\"batch_size\":null}", "batch_size" },
    { "{\"batch_size\":\"auto\"}", "batch_size" },
    { "{\"batch_size\":\"auto\",\"accum_steps\":4}", "batch_size" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":0}", "effective_batch" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":-8}", "effective_batch" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":2.5}", "effective_batch" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":\"256\"}", "effective_batch" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":67108865}", "effective_batch" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":null}", "effective_batch" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":65537}", "effective_batch" },   /* a prime */
    { "{\"effective_batch\":256,\"effective_batch\":256,\"batch_size\":\"auto\"}", "effective_batch" },
    { "{\"effective_batch\":256}", "effective_batch" },
    { "{\"effective_batch\":256,\"accum_steps\":8}", "effective_batch" },
    { "{\"batch_size\":48,\"effective_batch\":256}", "effective_batch" },
    { "{\"batch_size\":1,\"effective_batch\":2048}", "effective_batch" },          /* 2048 > 1024 */
    { "{\"batch_size\":32,\"effective_batch\":256,\"accum_steps\":4}", "accum_steps" },
    { "{\"accum_steps\":4,\"effective_batch\":256,\"batch_size\":32}", "accum_steps" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":256,\"accum_steps\":3}", "accum_steps" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":67108864,\"accum_steps\":1}", "accum_steps" },
    { "{\"batch_size\":\"auto\",\"effective_batch\":256,\"accum_steps\":0}", "accum_steps" },
    /* the first bad field in document order is the one reported */
    { "{\"model\":\"x\",\"batch_size\":0}", "model" },
    { "{\"batch_size\":0,\"model\":\"x\"}", "batch_size" },
};

static void test_bad_inputs(void **state) {
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        tq_spec s;
        tq_spec_err e;
        memset(&e, 0x55, sizeof e);
        int rc = tq_spec_parse(&s, bad_cases[i].json, &e);
        if (rc != TQ_SPEC_BAD) {
            print_error("accepted: %s\n", bad_cases[i].json);
            failures++;
            continue;
        }
        if (strcmp(e.field, bad_cases[i].field) != 0) {
            print_error("%s: field \"%s\" (wanted \"%s\"): %s\n", bad_cases[i].json, e.field,
                        bad_cases[i].field, e.message);
            failures++;
        }
        if (e.message[0] == 0 || memchr(e.message, 0, sizeof e.message) == NULL) {
            print_error("%s: no message\n", bad_cases[i].json);
            failures++;
        }
        /* the message names the field (for field-less document errors, says JSON/object) */
        if (bad_cases[i].field[0] && !strstr(e.message, bad_cases[i].field)) {
            print_error("%s: message does not name %s: %s\n", bad_cases[i].json, bad_cases[i].field,
                        e.message);
            failures++;
        }
        /* a failed parse leaves the defaults, never half a spec */
        tq_spec d;
        tq_spec_defaults(&d);
        if (memcmp(&s, &d, sizeof s) != 0) {
            print_error("%s: spec not reset to defaults\n", bad_cases[i].json);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

static void test_long_strings(void **state) {
    (void)state;
    char buf[4096];
    tq_spec s;
    tq_spec_err e;
    snprintf(buf, sizeof buf, "{\"name\":\"%0129d\"}", 0);
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "name");
    assert_non_null(strstr(e.message, "128"));
    snprintf(buf, sizeof buf, "{\"submission_id\":\"%0129d\"}", 0);
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "submission_id");
    snprintf(buf, sizeof buf, "{\"submission_id\":\"%0128d\"}", 0);
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_OK);
    snprintf(buf, sizeof buf, "{\"init_from\":\"/%01100d\"}", 0);
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "init_from");
    snprintf(buf, sizeof buf, "{\"data_dir\":\"/%01100d\"}", 0);
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "data_dir");
    snprintf(buf, sizeof buf, "{\"data_dir\":\"/%01022d\"}", 0);   /* 1023 bytes fit */
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_OK);
    assert_int_equal(strlen(s.data_dir), 1023);
    /* an unknown field with a very long name: the field is truncated, not overflowed */
    snprintf(buf, sizeof buf, "{\"%0300d\":1}", 0);
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_BAD);
    assert_int_equal(strlen(e.field), sizeof e.field - 1);
    assert_non_null(strstr(e.message, "unknown field"));
    /* NULL document, NULL err */
    assert_int_equal(tq_spec_parse(&s, NULL, &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "");
    assert_int_equal(tq_spec_parse(&s, "{\"x\":1}", NULL), TQ_SPEC_BAD);
    assert_int_equal(tq_spec_parse(&s, "{}", NULL), TQ_SPEC_OK);
}

static void test_messages(void **state) {
    (void)state;
    tq_spec s;
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&s, "{\"batch_size\":0}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "batch_size must be an integer in 1..65536 (got 0)");
    assert_int_equal(tq_spec_parse(&s, "{\"batch_size\":5.5}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "batch_size must be an integer in 1..65536 (got 5.5)");
    assert_int_equal(tq_spec_parse(&s, "{\"batch_size\":\"32\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "batch_size must be an integer in 1..65536 or \"auto\" (got \"32\")");
    assert_int_equal(tq_spec_parse(&s, "{\"btach_size\":32}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "unknown field \"btach_size\" (did you mean \"batch_size\"?)");
    assert_int_equal(tq_spec_parse(&s, "{\"optimizer\":{\"foo\":1}}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "unknown field \"optimizer.foo\"");
    assert_int_equal(tq_spec_parse(&s, "{\"steps\":0}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "steps must be an integer in 1..10000000 (got 0)");
    assert_int_equal(tq_spec_parse(&s, "{\"optimizer\":{\"momentum\":1}}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "optimizer.momentum must be a number in [0, 1) (got 1)");
    assert_int_equal(tq_spec_parse(&s, "{\"optimizer\":{\"lr\":0}}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "optimizer.lr must be a number in (0, 10] (got 0)");
    assert_int_equal(tq_spec_parse(&s, "{\"amp\":\"fp32\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "amp must be false, true, \"off\", \"fp16\" or \"bf16\" (got \"fp32\")");
    assert_int_equal(tq_spec_parse(&s, "{\"model\":\"vgg\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "model must be \"mlp\", \"cnn\", \"resnet20\", \"resnet18\" or "
                                   "\"resnet50\" (got \"vgg\")");
    assert_int_equal(tq_spec_parse(&s, "{\"steps\":10,\"epochs\":1}", &e), TQ_SPEC_BAD);
    assert_non_null(strstr(e.message, "not both"));
    assert_int_equal(tq_spec_parse(&s, "{\"dataset\":\"cifar10\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "data_dir is required for dataset cifar10: the directory of the CIFAR-10 "
                                   "binary version, data_batch_1.bin … data_batch_5.bin and test_batch.bin "
                                   "(docs/spec.md, \"Datasets\")");
    assert_int_equal(tq_spec_parse(&s, "{\"optimizer\":{\"nesterov\":true,\"momentum\":0}}", &e), TQ_SPEC_BAD);
    assert_non_null(strstr(e.message, "momentum > 0"));
    assert_int_equal(tq_spec_parse(&s, "[1,2]", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "the spec must be a JSON object (got an array)");
    /* malformed JSON: the position cJSON stopped at, as line/column/byte */
    assert_int_equal(tq_spec_parse(&s, "{\n  \"batch_size\": 32,\n  \"amp\": tru\n}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "");
    assert_non_null(strstr(e.message, "invalid JSON"));
    assert_non_null(strstr(e.message, "line 3"));
    assert_int_equal(tq_spec_parse(&s, "{\"a\":", &e), TQ_SPEC_BAD);
    assert_non_null(strstr(e.message, "end of the document"));
    assert_int_equal(tq_spec_parse(&s, "", &e), TQ_SPEC_BAD);
    assert_non_null(strstr(e.message, "empty"));
}

/* ---- strings are UTF-8 without controls; numbers are what their text says ------------------- */

static const bad_case text_cases[] = {
    /* invalid UTF-8 as raw bytes, in every free-text field */
    { "{\"name\":\"\xff\xfe\"}", "name" },
    { "{\"name\":\"ok \xc0\xaf\"}", "name" },                 /* overlong '/' */
    { "{\"name\":\"\xe0\x80\xaf\"}", "name" },                /* overlong, 3 bytes */
    { "{\"name\":\"\xed\xa0\x80\"}", "name" },                /* a surrogate, U+D800 */
    { "{\"name\":\"\xf4\x90\x80\x80\"}", "name" },            /* U+110000 */
    { "{\"name\":\"\xe2\x82\"}", "name" },                    /* truncated */
    { "{\"name\":\"\x80\"}", "name" },                        /* a lone continuation byte */
    { "{\"submission_id\":\"id-\xff\"}", "submission_id" },
    { "{\"data_dir\":\"/data/\xfe\"}", "data_dir" },
    { "{\"init_from\":\"/w/\xc3\"}", "init_from" },
    { "{\"model\":\"cnn\xff\"}", "model" },
    { "{\"device\":\"cpu\xff\"}", "device" },
    /* control characters, escaped or raw */
    { "{\"name\":\"a\\u0001b\"}", "name" }, { "{\"name\":\"a\x01" "b\"}", "name" },
    { "{\"name\":\"line\\nbreak\"}", "name" }, { "{\"name\":\"tab\\there\"}", "name" },
    { "{\"name\":\"del\\u007f\"}", "name" }, { "{\"name\":\"c1\\u0085\"}", "name" },
    { "{\"submission_id\":\"a\\rb\"}", "submission_id" },
    { "{\"data_dir\":\"/d\\u001b[31m\"}", "data_dir" },
    /* NUL: cJSON would cut the string there ("cnn\u0000x" would read as "cnn") */
    { "{\"name\":\"a\\u0000b\"}", "name" }, { "{\"model\":\"cnn\\u0000x\"}", "model" },
    { "{\"device\":\"cpu\\u0000\"}", "device" }, { "{\"quantize\":\"int8\\u0000\"}", "quantize" },
    { "{\"optimizer\":{\"type\":\"sgd\\u0000\"}}", "optimizer.type" },
    { "{\"name\\u0000x\":\"a\"}", "name" },
    { "{\"batch_size\":\"auto\\u0000\",\"effective_batch\":256}", "batch_size" },
    /* unknown fields with bad bytes: still named (as valid UTF-8) */
    { "{\"\xff\":1}", "\xef\xbf\xbd" },
    { "{\"optimizer\":{\"l\xffr\":1}}", "optimizer.l\xef\xbf\xbdr" },
};

static const bad_case number_cases[] = {
    /* underflow: a non-zero number is not 0 */
    { "{\"steps\":1e-400}", "steps" }, { "{\"eval_every\":1e-400}", "eval_every" },
    { "{\"seed\":1e-400}", "seed" }, { "{\"priority\":1e-400}", "priority" },
    { "{\"threads\":-1e-400}", "threads" }, { "{\"optimizer\":{\"lr\":1e-400}}", "optimizer.lr" },
    { "{\"optimizer\":{\"weight_decay\":1e-400}}", "optimizer.weight_decay" },
    { "{\"lr_schedule\":{\"warmup_steps\":1e-400}}", "lr_schedule.warmup_steps" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"betas\":[1e-400,0.9]}}", "optimizer.betas" },
    { "{\"prune\":{\"amount\":1e-999}}", "prune.amount" },
    /* not exactly an integer */
    { "{\"steps\":1.5}", "steps" }, { "{\"batch_size\":1.0000000000000001}", "batch_size" },
    { "{\"seed\":9007199254740993}", "seed" }, { "{\"seed\":4503599627370495.5}", "seed" },
    { "{\"eval_every\":0.0000000000000000001}", "eval_every" },
    /* out of a 32-bit field, and the documented upper bounds */
    { "{\"steps\":4294967297}", "steps" }, { "{\"batch_size\":4294967297}", "batch_size" },
    { "{\"priority\":4294967297}", "priority" }, { "{\"threads\":4294967297}", "threads" },
    { "{\"accum_steps\":4294967297}", "accum_steps" },
    { "{\"loss_scale\":{\"growth_interval\":4294967297}}", "loss_scale.growth_interval" },
    { "{\"steps\":10000001}", "steps" }, { "{\"epochs\":100001}", "epochs" },
    { "{\"steps\":1e300}", "steps" }, { "{\"epochs\":1e300}", "epochs" },
    { "{\"optimizer\":{\"lr\":1e300}}", "optimizer.lr" }, { "{\"optimizer\":{\"lr\":10.5}}", "optimizer.lr" },
    { "{\"optimizer\":{\"lr\":1e400}}", "optimizer.lr" },
    { "{\"optimizer\":{\"weight_decay\":1.5}}", "optimizer.weight_decay" },
    { "{\"optimizer\":{\"type\":\"adamw\",\"eps\":2}}", "optimizer.eps" },
    { "{\"lr_schedule\":{\"warmup_steps\":10000001}}", "lr_schedule.warmup_steps" },
    { "{\"lr_schedule\":{\"type\":\"step\",\"step_size\":10000001}}", "lr_schedule.step_size" },
    { "{\"lr_schedule\":{\"type\":\"step\",\"gamma\":1.5}}", "lr_schedule.gamma" },
    { "{\"loss_scale\":{\"init\":1e300}}", "loss_scale.init" },
    { "{\"loss_scale\":{\"init\":3.5e38}}", "loss_scale.init" },
    { "{\"loss_scale\":{\"growth_factor\":17}}", "loss_scale.growth_factor" },
    { "{\"loss_scale\":{\"growth_interval\":10000001}}", "loss_scale.growth_interval" },
    { "{\"train_subset\":10000001}", "train_subset" }, { "{\"eval_subset\":1e300}", "eval_subset" },
    { "{\"eval_every\":10000001}", "eval_every" }, { "{\"checkpoint_every\":10000001}", "checkpoint_every" },
    { "{\"timeout_s\":31536001}", "timeout_s" }, { "{\"max_memory_mb\":1e300}", "max_memory_mb" },
    { "{\"seed\":9007199254740994}", "seed" },
    { "{\"dataset\":\"synthetic\",\"synthetic\":{\"train\":1e-400}}", "synthetic.train" },
};

static void check_bad_cases(const bad_case *cases, size_t n) {
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        tq_spec s, d;
        tq_spec_err e;
        memset(&e, 0x55, sizeof e);
        if (tq_spec_parse(&s, cases[i].json, &e) != TQ_SPEC_BAD) {
            print_error("accepted: %s\n", cases[i].json);
            failures++;
            continue;
        }
        if (strcmp(e.field, cases[i].field)) {
            print_error("%s: field \"%s\" (wanted \"%s\"): %s\n", cases[i].json, e.field,
                        cases[i].field, e.message);
            failures++;
        }
        /* what reaches a JSON error object is valid UTF-8 whatever the input held */
        if (!tq_utf8_valid(e.field) || !tq_utf8_valid(e.message) || !e.message[0]) {
            print_error("%s: field or message not valid UTF-8 (or empty)\n", cases[i].json);
            failures++;
        }
        tq_spec_defaults(&d);
        if (memcmp(&s, &d, sizeof s)) {
            print_error("%s: spec not reset to defaults\n", cases[i].json);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

static void test_bad_text(void **state) {
    (void)state;
    check_bad_cases(text_cases, sizeof text_cases / sizeof text_cases[0]);
    tq_spec s;
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&s, "{\"name\":\"\xff\xfe\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "name is not valid UTF-8 (byte 0xFF at offset 0)");
    assert_int_equal(tq_spec_parse(&s, "{\"name\":\"ab\\u0001\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "name contains a control character (U+0001 at offset 2)");
    assert_int_equal(tq_spec_parse(&s, "{\"model\":\"cnn\\u0000x\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "model must not contain a NUL character (\\u0000)");
    /* the value shown in a message is valid UTF-8 too, its controls spelled out */
    assert_int_equal(tq_spec_parse(&s, "{\"model\":\"x\xff\\u0007\"}", &e), TQ_SPEC_BAD);
    assert_non_null(strstr(e.message, "(got \"x\xef\xbf\xbd\\x07\")"));
    /* a long unknown key cut inside a character: still valid UTF-8 */
    char buf[512];
    snprintf(buf, sizeof buf, "{\"%s\":1}",
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
             "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");
    assert_int_equal(tq_spec_parse(&s, buf, &e), TQ_SPEC_BAD);
    assert_true(tq_utf8_valid(e.field) && tq_utf8_valid(e.message));
    assert_non_null(strstr(e.message, "unknown field"));

    /* what is fine: any Unicode text, raw or escaped (a surrogate pair is one character) */
    s = parse_ok("{\"name\":\"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\x89 \\u00e9\\ud83c\\udf89\"}");
    assert_string_equal(s.name, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\x89 \xc3\xa9\xf0\x9f\x8e\x89");
    s = parse_ok("{\"name\":\"\xf4\x8f\xbf\xbf \xef\xbf\xbd \xc2\xa0\"}");   /* U+10FFFF, U+FFFD, U+00A0 */
    s = parse_ok("{\"data_dir\":\"/srv/donn\xc3\xa9" "es\",\"submission_id\":\"\xe2\x9c\x93-1\"}");
    assert_string_equal(s.submission_id, "\xe2\x9c\x93-1");
    /* an escaped backslash before "u0000" is not a NUL */
    s = parse_ok("{\"name\":\"a\\\\u0000\"}");
    assert_string_equal(s.name, "a\\u0000");
    check_round_trip("{\"name\":\"caf\xc3\xa9 \\ud83c\\udf89\",\"submission_id\":\"\xe6\x97\xa5\"}");
}

static void test_numbers_exact(void **state) {
    (void)state;
    check_bad_cases(number_cases, sizeof number_cases / sizeof number_cases[0]);
    tq_spec s;
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&s, "{\"eval_every\":1e-400}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "eval_every must be an integer in 0..10000000 (got a number out of range)");
    assert_int_equal(tq_spec_parse(&s, "{\"batch_size\":1.0000000000000001}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "batch_size must be an integer in 1..65536 (got a number that is not "
                                   "exactly an integer)");
    assert_int_equal(tq_spec_parse(&s, "{\"steps\":4294967297}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "steps must be an integer in 1..10000000 (got 4294967297)");
    assert_int_equal(tq_spec_parse(&s, "{\"optimizer\":{\"lr\":1e300}}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "optimizer.lr must be a number in (0, 10] (got 1e+300)");

    /* integers written any exact way, and the bounds themselves */
    s = parse_ok("{\"steps\":1e3,\"eval_every\":-0,\"checkpoint_every\":100e-2}");
    assert_int_equal(s.steps, 1000);
    assert_int_equal(s.eval_every, 0);
    assert_int_equal(s.checkpoint_every, 1);
    s = parse_ok("{\"batch_size\":64.000,\"accum_steps\":0.2e1,\"seed\":9007199254740992}");
    assert_int_equal(s.batch_size, 64);
    assert_int_equal(s.accum_steps, 2);
    assert_true(s.seed == 9007199254740992ULL);
    assert_int_equal(tq_spec_parse(&s, "{\"seed\":1234567890123456789e-3}", &e), TQ_SPEC_BAD);
    s = parse_ok("{\"seed\":123456789012345600e-2,\"timeout_s\":31536000,\"eval_every\":10000000}");
    assert_true(s.seed == 1234567890123456ULL);
    assert_int_equal(s.timeout_s, 31536000);
    s = parse_ok("{\"epochs\":100000,\"optimizer\":{\"lr\":10,\"weight_decay\":1}}");
    assert_true(s.epochs == 100000 && s.optimizer.lr == 10 && s.optimizer.weight_decay == 1);
    s = parse_ok("{\"loss_scale\":{\"init\":1e38}}");   /* huge scales force overflows in tests */
    assert_true(s.loss_scale.init == 1e38);
    s = parse_ok("{\"optimizer\":{\"weight_decay\":1e-300}}");   /* tiny, but not 0: fine */
    assert_true(s.optimizer.weight_decay == 1e-300);
}

/* ---- batch_size "auto" and effective_batch ----------------------------------------------- */

/* recompute "auto" (the default) is on unless the spec's own device is "cpu"; true and false
 * are themselves on every device */
static void test_recompute_resolution(void **state) {
    (void)state;
    static const struct { const char *json; int on; } cases[] = {
        { "{}", 1 },
        { "{\"device\":\"cpu\"}", 0 },
        { "{\"device\":\"cuda\"}", 1 },
        { "{\"device\":\"cuda:1\"}", 1 },
        { "{\"device\":\"auto\",\"recompute\":\"auto\"}", 1 },
        { "{\"device\":\"cpu\",\"recompute\":true}", 1 },
        { "{\"device\":\"cuda\",\"recompute\":false}", 0 },
        { "{\"device\":\"cpu\",\"recompute\":false}", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tq_spec s = parse_ok(cases[i].json);
        if (tq_spec_recompute(&s) != cases[i].on) fail_msg("%s: recompute %d, want %d", cases[i].json, !cases[i].on, cases[i].on);
    }
    assert_int_equal(parse_ok("{}").recompute, TQ_RECOMPUTE_AUTO);
}

static void test_batch_auto(void **state) {
    (void)state;
    /* unresolved: batch_size and accum_steps 0 until the picker chooses */
    tq_spec s = parse_ok("{\"batch_size\":\"auto\",\"effective_batch\":256}");
    assert_int_equal(s.batch_auto, 1);
    assert_int_equal(s.effective_batch, 256);
    assert_int_equal(s.batch_size, 0);
    assert_int_equal(s.accum_steps, 0);
    assert_true(tq_spec_batch_unresolved(&s));
    /* the order of the members does not matter */
    tq_spec t = parse_ok("{\"effective_batch\":256,\"batch_size\":\"auto\"}");
    assert_memory_equal(&s, &t, sizeof s);
    /* resolving: batch_size and accum_steps, and the resolved form is what accum_steps gives */
    tq_spec_set_batch(&s, 32);
    assert_int_equal(s.batch_size, 32);
    assert_int_equal(s.accum_steps, 8);
    assert_false(tq_spec_batch_unresolved(&s));
    t = parse_ok("{\"batch_size\":\"auto\",\"effective_batch\":256,\"accum_steps\":8}");
    assert_true(spec_equal(&s, &t));
    assert_memory_equal(&s, &t, sizeof s);
    assert_int_equal(t.batch_auto, 1);
    t = parse_ok("{\"batch_size\":\"auto\",\"effective_batch\":256,\"accum_steps\":1}");
    assert_int_equal(t.batch_size, 256);
    assert_int_equal(t.accum_steps, 1);
    t = parse_ok("{\"batch_size\":\"auto\",\"effective_batch\":67108864,\"accum_steps\":1024}");
    assert_int_equal(t.batch_size, 65536);
    t = parse_ok("{\"batch_size\":\"auto\",\"effective_batch\":67108864}");   /* only 65536 x 1024 */
    assert_true(tq_spec_batch_unresolved(&t));
    t = parse_ok("{\"batch_size\":\"auto\",\"effective_batch\":1}");
    assert_int_equal(t.effective_batch, 1);

    /* an explicit batch_size with effective_batch sets accum_steps */
    t = parse_ok("{\"batch_size\":32,\"effective_batch\":256}");
    assert_int_equal(t.batch_auto, 0);
    assert_int_equal(t.batch_size, 32);
    assert_int_equal(t.accum_steps, 8);
    assert_int_equal(t.effective_batch, 256);
    t = parse_ok("{\"accum_steps\":8,\"batch_size\":32,\"effective_batch\":256}");   /* agreeing */
    assert_int_equal(t.accum_steps, 8);
    t = parse_ok("{\"batch_size\":2,\"effective_batch\":2048}");
    assert_int_equal(t.accum_steps, 1024);
    t = parse_ok("{\"batch_size\":64,\"effective_batch\":64}");
    assert_int_equal(t.accum_steps, 1);
    /* without effective_batch nothing changes */
    t = parse_ok("{\"batch_size\":32,\"accum_steps\":3}");
    assert_int_equal(t.batch_auto, 0);
    assert_int_equal(t.effective_batch, 0);
    assert_int_equal(t.accum_steps, 3);
    tq_spec_set_batch(&t, 16);   /* no effective_batch: only the micro-batch */
    assert_int_equal(t.batch_size, 16);
    assert_int_equal(t.accum_steps, 3);

    /* the messages */
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&t, "{\"batch_size\":\"auto\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "batch_size");
    assert_non_null(strstr(e.message, "needs effective_batch"));
    assert_int_equal(tq_spec_parse(&t, "{\"effective_batch\":256}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "effective_batch");
    assert_non_null(strstr(e.message, "needs batch_size: \"auto\" or an explicit batch_size that divides it"));
    assert_int_equal(tq_spec_parse(&t, "{\"batch_size\":48,\"effective_batch\":256}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "effective_batch 256 is not a multiple of batch_size 48");
    assert_int_equal(tq_spec_parse(&t, "{\"batch_size\":32,\"effective_batch\":256,\"accum_steps\":4}", &e),
                     TQ_SPEC_BAD);
    assert_string_equal(e.field, "accum_steps");
    assert_non_null(strstr(e.message, "256 / batch_size 32 = 8"));
    assert_int_equal(tq_spec_parse(&t, "{\"batch_size\":\"auto\",\"effective_batch\":256,\"accum_steps\":3}", &e),
                     TQ_SPEC_BAD);
    assert_string_equal(e.message, "accum_steps 3 does not divide effective_batch 256");
    assert_int_equal(tq_spec_parse(&t, "{\"batch_size\":\"auto\",\"effective_batch\":67108865}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "effective_batch must be an integer in 1..67108864 (got 67108865)");
    assert_int_equal(tq_spec_parse(&t, "{\"batch_size\":\"big\"}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.message, "batch_size must be an integer in 1..65536 or \"auto\" (got \"big\")");

    /* rendering: "auto" and effective_batch; accum_steps only once resolved */
    cJSON *j = render("{\"batch_size\":\"auto\",\"effective_batch\":256}");
    assert_string_equal(cJSON_GetObjectItem(j, "batch_size")->valuestring, "auto");
    assert_true(cJSON_GetObjectItem(j, "effective_batch")->valuedouble == 256);
    assert_null(cJSON_GetObjectItem(j, "accum_steps"));
    cJSON_Delete(j);
    j = render("{\"batch_size\":\"auto\",\"effective_batch\":256,\"accum_steps\":8}");
    assert_string_equal(cJSON_GetObjectItem(j, "batch_size")->valuestring, "auto");
    assert_true(cJSON_GetObjectItem(j, "accum_steps")->valuedouble == 8);
    cJSON_Delete(j);
    j = render("{\"batch_size\":32,\"effective_batch\":256}");
    assert_true(cJSON_GetObjectItem(j, "batch_size")->valuedouble == 32);
    assert_true(cJSON_GetObjectItem(j, "accum_steps")->valuedouble == 8);
    assert_true(cJSON_GetObjectItem(j, "effective_batch")->valuedouble == 256);
    cJSON_Delete(j);
    j = render("{\"batch_size\":32}");
    assert_null(cJSON_GetObjectItem(j, "effective_batch"));
    cJSON_Delete(j);
    /* a spec resolved with tq_spec_set_batch renders its resolved form and parses back to it */
    s = parse_ok("{\"batch_size\":\"auto\",\"effective_batch\":96,\"model\":\"resnet20\"}");
    tq_spec_set_batch(&s, 12);
    char *text = tq_spec_to_json(&s);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"batch_size\":\"auto\",\"accum_steps\":8,\"effective_batch\":96"));
    assert_int_equal(tq_spec_parse(&t, text, &e), TQ_SPEC_OK);
    assert_memory_equal(&s, &t, sizeof s);
    free(text);
}

static void test_batch_candidates(void **state) {
    (void)state;
    int c[64];
    static const int c256[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256 };
    assert_int_equal(tq_spec_batch_candidates(256, c, 64), 9);
    assert_memory_equal(c, c256, sizeof c256);
    static const int c12[] = { 1, 2, 3, 4, 6, 12 };
    assert_int_equal(tq_spec_batch_candidates(12, c, 64), 6);
    assert_memory_equal(c, c12, sizeof c12);
    /* accum_steps <= 1024: 2048 cannot use a micro-batch of 1 */
    assert_int_equal(tq_spec_batch_candidates(2048, c, 64), 11);
    assert_int_equal(c[0], 2);
    assert_int_equal(c[10], 2048);
    /* micro-batch <= 65536 */
    assert_int_equal(tq_spec_batch_candidates(67108864, c, 64), 1);
    assert_int_equal(c[0], 65536);
    assert_int_equal(tq_spec_batch_candidates(65537, c, 64), 0);
    assert_int_equal(tq_spec_batch_candidates(0, c, 64), 0);
    assert_int_equal(tq_spec_batch_candidates(67108865, c, 64), 0);
    /* counting without storing, and a short out[] */
    assert_int_equal(tq_spec_batch_candidates(256, NULL, 0), 9);
    c[3] = -1;
    assert_int_equal(tq_spec_batch_candidates(256, c, 3), 9);
    assert_int_equal(c[2], 4);
    assert_int_equal(c[3], -1);
    assert_int_equal(tq_spec_batch_candidates(1, c, 64), 1);
    assert_int_equal(c[0], 1);
}

/* ---- rendering and round trip ---------------------------------------------------------- */

static void test_rendering(void **state) {
    (void)state;
    static const char *const sgd_keys[] = { "type", "lr", "momentum", "nesterov", "weight_decay" };
    static const char *const adamw_keys[] = { "type", "lr", "betas", "eps", "weight_decay" };
    cJSON *j = render("{\"amp\":true,\"steps\":100}");
    assert_string_equal(cJSON_GetObjectItem(j, "amp")->valuestring, "fp16");
    assert_int_equal((int)cJSON_GetObjectItem(j, "steps")->valuedouble, 100);
    assert_null(cJSON_GetObjectItem(j, "epochs"));
    assert_true(has_keys_exactly(cJSON_GetObjectItem(j, "optimizer"), sgd_keys, 5));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "init_from")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "submission_id")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "max_memory_mb")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "timeout_s")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "prune")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "quantize")));
    assert_null(cJSON_GetObjectItem(j, "synthetic"));
    cJSON_Delete(j);

    j = render("{\"amp\":\"bf16\",\"optimizer\":{\"type\":\"adamw\"},\"prune\":{\"amount\":0.3},"
               "\"quantize\":\"int8\",\"max_memory_mb\":4096,\"timeout_s\":60,"
               "\"submission_id\":\"k\",\"init_from\":\"/w.safetensors\","
               "\"lr_schedule\":{\"type\":\"step\"},\"dataset\":\"synthetic\"}");
    assert_string_equal(cJSON_GetObjectItem(j, "amp")->valuestring, "bf16");
    assert_true(cJSON_GetObjectItem(j, "epochs")->valuedouble == 1);
    assert_null(cJSON_GetObjectItem(j, "steps"));
    cJSON *opt = cJSON_GetObjectItem(j, "optimizer");
    assert_true(has_keys_exactly(opt, adamw_keys, 5));
    cJSON *betas = cJSON_GetObjectItem(opt, "betas");
    assert_int_equal(cJSON_GetArraySize(betas), 2);
    assert_true(cJSON_GetArrayItem(betas, 1)->valuedouble == 0.999);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "prune"), "amount")->valuedouble == 0.3);
    assert_string_equal(cJSON_GetObjectItem(j, "quantize")->valuestring, "int8");
    assert_true(cJSON_GetObjectItem(j, "max_memory_mb")->valuedouble == 4096);
    assert_string_equal(cJSON_GetObjectItem(j, "submission_id")->valuestring, "k");
    cJSON *sched = cJSON_GetObjectItem(j, "lr_schedule");
    assert_true(cJSON_GetObjectItem(sched, "step_size")->valuedouble == 1000);
    assert_true(cJSON_GetObjectItem(sched, "gamma")->valuedouble == 0.1);
    cJSON *syn = cJSON_GetObjectItem(j, "synthetic");
    assert_non_null(syn);
    assert_true(cJSON_GetObjectItem(syn, "height")->valuedouble == 32);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "data_dir")));
    cJSON_Delete(j);

    /* every contract field is present in the rendering (steps/epochs: one of them) */
    static const char *const all[] = {
        "name", "model", "dataset", "data_dir", "batch_size", "accum_steps", "amp", "optimizer",
        "lr_schedule", "loss_scale", "seed", "shuffle", "augment", "train_subset", "eval_subset",
        "eval_every", "checkpoint_every", "init_from", "device", "max_memory_mb", "priority",
        "submission_id", "timeout_s", "cudnn_benchmark", "prune", "quantize", "threads", "recompute",
        "deterministic", "tf32", "cuda_graphs", "after" };
    j = render("{}");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!cJSON_GetObjectItemCaseSensitive(j, all[i])) print_error("missing %s\n", all[i]);
        assert_non_null(cJSON_GetObjectItemCaseSensitive(j, all[i]));
    }
    assert_int_equal(cJSON_GetArraySize(j), (int)(sizeof all / sizeof all[0]) + 1);
    cJSON_Delete(j);
}

static void test_round_trip(void **state) {
    (void)state;
    check_round_trip("{}");
    check_round_trip("{\"steps\":1234}");
    check_round_trip("{\"epochs\":0.1}");
    check_round_trip("{\"epochs\":2.5,\"optimizer\":{\"lr\":0.05000000000000001}}");
    check_round_trip("{\"optimizer\":{\"lr\":0.30000000000000004,\"momentum\":0.123456789012345678,"
                     "\"weight_decay\":1e-300}}");
    check_round_trip("{\"optimizer\":{\"momentum\":0}}");
    check_round_trip("{\"optimizer\":{\"type\":\"adamw\",\"lr\":3e-4,\"betas\":[0.85,0.9999],"
                     "\"eps\":1e-12,\"weight_decay\":0}}");
    check_round_trip("{\"optimizer\":{\"type\":\"adamw\"},\"lr_schedule\":{\"type\":\"onecycle\","
                     "\"warmup_steps\":50}}");
    check_round_trip("{\"lr_schedule\":{\"type\":\"step\",\"step_size\":7,\"gamma\":0.3333333333333333}}");
    check_round_trip("{\"lr_schedule\":{\"type\":\"cosine\"}}");
    check_round_trip("{\"dataset\":\"cifar10\",\"data_dir\":\"/data/c10\",\"model\":\"resnet18\"}");
    check_round_trip("{\"dataset\":\"cifar10\",\"data_dir\":\"/data/c10\",\"augment\":false}");
    check_round_trip("{\"dataset\":\"synthetic\",\"synthetic\":{\"train\":256,\"test\":64,"
                     "\"height\":8,\"width\":8,\"channels\":1},\"threads\":2}");
    check_round_trip("{\"dataset\":\"synthetic\",\"data_dir\":\"/ignored\"}");
    check_round_trip(
        "{\"name\":\"all \\\"quoted\\\" \\u00e9\",\"model\":\"resnet50\",\"dataset\":\"fashion-mnist\","
        "\"data_dir\":\"/d/fm\",\"batch_size\":128,\"accum_steps\":4,\"amp\":\"fp16\",\"steps\":5000,"
        "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0.95,\"nesterov\":false,"
        "\"weight_decay\":1e-4},\"lr_schedule\":{\"type\":\"cosine\",\"warmup_steps\":100},"
        "\"loss_scale\":{\"init\":1024,\"growth_factor\":4,\"backoff_factor\":0.125,"
        "\"growth_interval\":100},\"seed\":9007199254740992,\"shuffle\":false,\"augment\":true,"
        "\"train_subset\":1000,\"eval_subset\":200,\"eval_every\":50,\"checkpoint_every\":250,"
        "\"init_from\":\"/w/init.safetensors\",\"device\":\"cuda:1\",\"max_memory_mb\":8000,"
        "\"priority\":-7,\"submission_id\":\"sub-42\",\"timeout_s\":3600,\"cudnn_benchmark\":false,"
        "\"prune\":{\"amount\":0.95},\"quantize\":\"int8\",\"threads\":16,"
        "\"recompute\":false,\"deterministic\":false,\"tf32\":true,\"cuda_graphs\":true,"
        "\"after\":[3,1,9007199254740991]}");
    check_round_trip("{\"tf32\":false,\"after\":null}");
    check_round_trip("{\"tf32\":\"conv\",\"after\":[]}");
    check_round_trip("{\"recompute\":\"auto\",\"device\":\"cpu\"}");
    /* batch_size "auto" (unresolved and resolved) and effective_batch with an explicit batch */
    check_round_trip("{\"batch_size\":\"auto\",\"effective_batch\":256}");
    check_round_trip("{\"batch_size\":\"auto\",\"effective_batch\":256,\"accum_steps\":8}");
    check_round_trip("{\"batch_size\":\"auto\",\"effective_batch\":67108864,\"accum_steps\":1024}");
    check_round_trip("{\"batch_size\":\"auto\",\"effective_batch\":7,\"model\":\"resnet20\","
                     "\"dataset\":\"synthetic\",\"max_memory_mb\":60}");
    check_round_trip("{\"batch_size\":32,\"effective_batch\":256}");
    check_round_trip("{\"batch_size\":32,\"effective_batch\":256,\"accum_steps\":8}");
    check_round_trip("{\"batch_size\":1,\"effective_batch\":1}");
}

/* ---- "did you mean": the nearest known field of the same object ----------------------------- */

static void expect_unknown(const char *json, const char *field, const char *message) {
    tq_spec s;
    tq_spec_err e;
    int rc = tq_spec_parse(&s, json, &e);
    if (rc != TQ_SPEC_BAD || strcmp(e.field, field) || strcmp(e.message, message))
        print_error("%s: rc %d, [%s] %s (want [%s] %s)\n", json, rc, e.field, e.message, field, message);
    assert_int_equal(rc, TQ_SPEC_BAD);
    assert_string_equal(e.field, field);
    assert_string_equal(e.message, message);
}

static void test_did_you_mean(void **state) {
    (void)state;
    /* hits: a missing/extra/changed letter, a transposition, case, at the root and nested */
    expect_unknown("{\"batchsize\":8}", "batchsize", "unknown field \"batchsize\" (did you mean \"batch_size\"?)");
    expect_unknown("{\"optimizer\":{\"momentun\":0.5}}", "optimizer.momentun",
                   "unknown field \"optimizer.momentun\" (did you mean \"optimizer.momentum\"?)");
    expect_unknown("{\"stpes\":5}", "stpes", "unknown field \"stpes\" (did you mean \"steps\"?)");
    expect_unknown("{\"epoch\":2}", "epoch", "unknown field \"epoch\" (did you mean \"epochs\"?)");
    expect_unknown("{\"Seed\":1}", "Seed", "unknown field \"Seed\" (did you mean \"seed\"?)");
    expect_unknown("{\"BATCH_SIZE\":1}", "BATCH_SIZE", "unknown field \"BATCH_SIZE\" (did you mean \"batch_size\"?)");
    expect_unknown("{\"optimiser\":{}}", "optimiser", "unknown field \"optimiser\" (did you mean \"optimizer\"?)");
    expect_unknown("{\"timeout\":60}", "timeout", "unknown field \"timeout\" (did you mean \"timeout_s\"?)");
    expect_unknown("{\"train-subset\":60}", "train-subset",
                   "unknown field \"train-subset\" (did you mean \"train_subset\"?)");
    expect_unknown("{\"lr_schedule\":{\"type\":\"step\",\"gama\":0.5}}", "lr_schedule.gama",
                   "unknown field \"lr_schedule.gama\" (did you mean \"lr_schedule.gamma\"?)");
    expect_unknown("{\"loss_scale\":{\"growth_intervall\":5}}", "loss_scale.growth_intervall",
                   "unknown field \"loss_scale.growth_intervall\" (did you mean \"loss_scale.growth_interval\"?)");
    expect_unknown("{\"prune\":{\"amout\":0.5}}", "prune.amout",
                   "unknown field \"prune.amout\" (did you mean \"prune.amount\"?)");
    expect_unknown("{\"dataset\":\"synthetic\",\"synthetic\":{\"heigth\":8}}", "synthetic.heigth",
                   "unknown field \"synthetic.heigth\" (did you mean \"synthetic.height\"?)");
    expect_unknown("{\"optimizer\":{\"nesterow\":true}}", "optimizer.nesterow",
                   "unknown field \"optimizer.nesterow\" (did you mean \"optimizer.nesterov\"?)");
    /* non-hits: nothing close at that level (no suggestion from another level either) */
    expect_unknown("{\"foo\":1}", "foo", "unknown field \"foo\"");
    expect_unknown("{\"x\":1}", "x", "unknown field \"x\"");
    expect_unknown("{\"lr\":0.1}", "lr", "unknown field \"lr\"");                   /* optimizer.lr */
    expect_unknown("{\"momentum\":0.9}", "momentum", "unknown field \"momentum\""); /* optimizer.momentum */
    expect_unknown("{\"learning_rate\":0.1}", "learning_rate", "unknown field \"learning_rate\"");
    expect_unknown("{\"optimizer\":{\"foo\":1}}", "optimizer.foo", "unknown field \"optimizer.foo\"");
    expect_unknown("{\"optimizer\":{\"batch_size\":1}}", "optimizer.batch_size",
                   "unknown field \"optimizer.batch_size\"");
    expect_unknown("{\"lr_schedule\":{\"warmup\":10}}", "lr_schedule.warmup", "unknown field \"lr_schedule.warmup\"");
    expect_unknown("{\"\":1}", "", "unknown field \"\"");
    /* at most 2 edits, and at most a third of the key: "ab" is 2 from "amp" but too short */
    expect_unknown("{\"ab\":1}", "ab", "unknown field \"ab\"");
    expect_unknown("{\"am\":1}", "am", "unknown field \"am\" (did you mean \"amp\"?)");
    expect_unknown("{\"bach_sze\":1}", "bach_sze", "unknown field \"bach_sze\" (did you mean \"batch_size\"?)");
    expect_unknown("{\"bch_sze\":1}", "bch_sze", "unknown field \"bch_sze\"");   /* 3 edits */
    /* a long key: named (cut), no suggestion */
    char json[200];
    snprintf(json, sizeof json, "{\"%s\":1}", "batch_size_batch_size_batch_size_batch_size_batch_size_batch_size_x");
    tq_spec s;
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&s, json, &e), TQ_SPEC_BAD);
    assert_null(strstr(e.message, "did you mean"));
    /* the first of equally near names (the docs' order) */
    expect_unknown("{\"optimizer\":{\"tye\":\"sgd\"}}", "optimizer.tye",
                   "unknown field \"optimizer.tye\" (did you mean \"optimizer.type\"?)");
}

/* ---- the documentation table (docs/spec.md, trainq(1)) against the parser ------------------- */

/* {with_root, "field": value} or {with_root, "parent": {with, "child": value}} for f */
static char *spec_with(const tq_spec_doc_field *f, const char *value) {
    tq_spec_doc_field g = *f;
    g.example = value;
    char *text = tq_spec_doc_example(&g);
    assert_non_null(text);
    return text;
}

static void expect_ok(const tq_spec_doc_field *f, const char *value) {
    char *json = spec_with(f, value);
    tq_spec s;
    tq_spec_err e;
    int rc = tq_spec_parse(&s, json, &e);
    if (rc) print_error("%s: %s refused: [%s] %s\n", f->name, json, e.field, e.message);
    assert_int_equal(rc, TQ_SPEC_OK);
    free(json);
}

static void expect_bad(const tq_spec_doc_field *f, const char *value) {
    char *json = spec_with(f, value);
    tq_spec s;
    tq_spec_err e;
    int rc = tq_spec_parse(&s, json, &e);
    if (rc != TQ_SPEC_BAD || strcmp(e.field, f->name))
        print_error("%s: %s: rc %d [%s] %s (want it refused, naming the field)\n", f->name, json, rc, e.field,
                    e.message);
    assert_int_equal(rc, TQ_SPEC_BAD);
    assert_string_equal(e.field, f->name);
    free(json);
}

static const tq_spec_doc_field *doc_find(const char *name) {
    int n;
    const tq_spec_doc_field *d = tq_spec_doc_fields(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(d[i].name, name)) return &d[i];
    return NULL;
}

/* every name the parser accepts, root and nested, is documented, and nothing else is */
static void test_doc_covers_parser(void **state) {
    (void)state;
    int nroot, ndoc, total = 0;
    const char *const *root = tq_spec_field_names(NULL, &nroot);
    const tq_spec_doc_field *docs = tq_spec_doc_fields(&ndoc);
    assert_non_null(root);
    assert_true(nroot >= 36);
    for (int i = 0; i < nroot; i++) {
        if (!doc_find(root[i])) print_error("root field %s is not documented\n", root[i]);
        assert_non_null(doc_find(root[i]));
        total++;
        int nk;
        const char *const *kids = tq_spec_field_names(root[i], &nk);
        for (int k = 0; kids && k < nk; k++) {
            char dotted[96];
            snprintf(dotted, sizeof dotted, "%s.%s", root[i], kids[k]);
            if (!doc_find(dotted)) print_error("field %s is not documented\n", dotted);
            assert_non_null(doc_find(dotted));
            total++;
        }
    }
    assert_int_equal(ndoc, total);   /* no field documented twice, none the parser lacks */
    int nk;
    assert_null(tq_spec_field_names("name", &nk));
    assert_int_equal(nk, 0);
    assert_null(tq_spec_field_names("nope", NULL));
    /* the nested objects are exactly the root fields whose docs say "object" */
    for (int i = 0; i < ndoc; i++) {
        const tq_spec_doc_field *f = &docs[i];
        if (strchr(f->name, '.')) continue;
        int is_obj = !strncmp(f->type, "object", 6);
        if (is_obj != (tq_spec_field_names(f->name, NULL) != NULL))
            print_error("%s: type \"%s\" vs the parser's member lists\n", f->name, f->type);
        assert_int_equal(is_obj, tq_spec_field_names(f->name, NULL) != NULL);
    }
    /* an unknown member is refused at every level, naming it */
    tq_spec s;
    tq_spec_err e;
    assert_int_equal(tq_spec_parse(&s, "{\"no_such_field\":1}", &e), TQ_SPEC_BAD);
    assert_string_equal(e.field, "no_such_field");
    for (int i = 0; i < nroot; i++) {
        if (!tq_spec_field_names(root[i], NULL)) continue;
        char json[160], want[96];
        snprintf(json, sizeof json, "{\"dataset\":\"synthetic\",\"%s\":{\"no_such_field\":1}}", root[i]);
        snprintf(want, sizeof want, "%s.no_such_field", root[i]);
        assert_int_equal(tq_spec_parse(&s, json, &e), TQ_SPEC_BAD);
        assert_string_equal(e.field, want);
    }
}

/* "%.17g", or a whole number without exponent */
static void num_text(char *buf, size_t n, double d) {
    if (d == floor(d) && fabs(d) < 1e17) snprintf(buf, n, "%.0f", d);
    else snprintf(buf, n, "%.17g", d);
}

/* every example parses; both bounds parse and one step past each is refused naming the field;
 * every enum value parses; the documented default is what the parser fills in */
static void test_doc_table(void **state) {
    (void)state;
    int n;
    const tq_spec_doc_field *docs = tq_spec_doc_fields(&n);
    for (int i = 0; i < n; i++) {
        const tq_spec_doc_field *f = &docs[i];
        assert_non_null(f->type);
        assert_non_null(f->def);
        assert_non_null(f->meaning);
        assert_non_null(f->example);
        expect_ok(f, f->example);
        char v[64];
        if (f->bounds == TQ_DOC_INT) {
            int64_t lo = (int64_t)f->lo, hi = (int64_t)f->hi;
            assert_true((double)lo == f->lo && (double)hi == f->hi && lo <= hi);
            snprintf(v, sizeof v, "%lld", (long long)lo); expect_ok(f, v);
            snprintf(v, sizeof v, "%lld", (long long)hi); expect_ok(f, v);
            snprintf(v, sizeof v, "%lld", (long long)lo - 1); expect_bad(f, v);
            snprintf(v, sizeof v, "%lld", (long long)hi + 1); expect_bad(f, v);
            snprintf(v, sizeof v, "%lld.5", (long long)lo); expect_bad(f, v);   /* not an integer */
        } else if (f->bounds == TQ_DOC_NUM) {
            num_text(v, sizeof v, f->lo);
            if (f->lo_open) expect_bad(f, v); else expect_ok(f, v);
            num_text(v, sizeof v, nextafter(f->lo, f->lo_open ? INFINITY : -INFINITY));
            if (f->lo_open) expect_ok(f, v); else expect_bad(f, v);
            if (isfinite(f->hi)) {
                num_text(v, sizeof v, f->hi);
                if (f->hi_open) expect_bad(f, v); else expect_ok(f, v);
                num_text(v, sizeof v, nextafter(f->hi, f->hi_open ? -INFINITY : INFINITY));
                if (f->hi_open) expect_ok(f, v); else expect_bad(f, v);
            }
            expect_bad(f, "\"1\"");   /* a string is no number */
        } else {
            assert_int_equal(f->bounds, 0);
        }
        for (int k = 0; f->values && k < f->n_values; k++) {   /* the value is taken (a rule */
            char q[64];                                          /* on another field may still */
            snprintf(q, sizeof q, "\"%s\"", f->values[k]);        /* object: cifar10's data_dir) */
            char *json = spec_with(f, q);
            tq_spec s;
            tq_spec_err e;
            if (tq_spec_parse(&s, json, &e) && !strcmp(e.field, f->name))
                fail_msg("%s: the documented value %s is refused: %s", f->name, q, e.message);
            free(json);
        }
        if (f->values) expect_bad(f, "\"no-such-value\"");
        if (f->def_json) {   /* the default, as rendered for {} or for the example's context */
            const char *dot = strchr(f->name, '.');
            char ctx[256];
            if (!dot) snprintf(ctx, sizeof ctx, "{}");
            else snprintf(ctx, sizeof ctx, "{%s%s\"%.*s\": {%s}}", f->with_root ? f->with_root : "",
                          f->with_root ? ", " : "", (int)(dot - f->name), f->name, f->with ? f->with : "");
            cJSON *r = render(ctx), *want = cJSON_Parse(f->def_json);
            assert_non_null(want);
            const cJSON *got;
            if (dot) {
                char parent[64];
                snprintf(parent, sizeof parent, "%.*s", (int)(dot - f->name), f->name);
                got = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, parent), dot + 1);
            } else {
                got = cJSON_GetObjectItemCaseSensitive(r, f->name);
            }
            char *gt = got ? cJSON_PrintUnformatted(got) : NULL;
            if (!got || !cJSON_Compare(got, want, 1))
                print_error("%s: documented default %s, rendered %s (for %s)\n", f->name, f->def_json,
                            gt ? gt : "nothing", ctx);
            assert_true(got && cJSON_Compare(got, want, 1));
            cJSON_free(gt);
            cJSON_Delete(want);
            cJSON_Delete(r);
        }
    }
    /* the full example parses */
    tq_spec s = parse_ok(tq_spec_doc_full_example);
    assert_int_equal(s.dataset, TQ_DATA_CIFAR10);
}

/* The texts' non-ASCII characters are the ones the roff renderer knows; the roff is ASCII. */
static void test_doc_rendering(void **state) {
    (void)state;
    static const char *const glyphs[] = { "…", "×", "≤", "≥", "−", "–", "—", "⌊", "⌋", "·" };
    int n;
    const tq_spec_doc_field *docs = tq_spec_doc_fields(&n);
    for (int i = 0; i < n; i++) {
        const char *texts[] = { docs[i].name, docs[i].type, docs[i].def, docs[i].range, docs[i].meaning,
                                docs[i].example };
        for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++)
            for (const char *p = texts[t]; p && *p;) {
                if ((unsigned char)*p < 0x80) { p++; continue; }
                size_t k, len = 0;
                for (k = 0; k < sizeof glyphs / sizeof glyphs[0]; k++)
                    if (!strncmp(p, glyphs[k], len = strlen(glyphs[k]))) break;
                if (k == sizeof glyphs / sizeof glyphs[0])
                    print_error("%s: a character roff_text does not map: \"%.8s\"\n", docs[i].name, p);
                assert_true(k < sizeof glyphs / sizeof glyphs[0]);
                p += len;
            }
    }
    char *man = tq_spec_doc(TQ_DOC_MAN), *md = tq_spec_doc(TQ_DOC_MARKDOWN);
    assert_non_null(man);
    assert_non_null(md);
    for (const char *p = man; *p; p++) {
        if ((unsigned char)*p >= 0x80) print_error("non-ASCII in the roff: \"%.20s\"\n", p);
        assert_true((unsigned char)*p < 0x80);
    }
    /* every field in both, with its example; the limits as numbers */
    for (int i = 0; i < n; i++) {
        char head[96];
        snprintf(head, sizeof head, "\n### `%s`\n", docs[i].name);
        assert_non_null(strstr(md, head));
        char *ex = tq_spec_doc_example(&docs[i]);
        assert_non_null(strstr(md, ex));
        free(ex);
    }
    assert_non_null(strstr(md, "| [`batch_size`](#batch_size) | integer or `\"auto\"` | `32` | 1…65536 or `\"auto\"`"));
    assert_non_null(strstr(md, "`{\"optimizer\": {\"type\": \"adamw\", \"betas\": [0.9, 0.95]}}`"));
    assert_non_null(strstr(md, "(0, 10]"));
    assert_non_null(strstr(md, "`false`, `\"conv\"` or `true`"));
    assert_non_null(strstr(man, ".TP\n.B optimizer.lr\n"));
    assert_non_null(strstr(man, "1\\&...65536"));
    assert_non_null(strstr(man, "\\fB\"fashion\\-mnist\"\\fR"));
    /* the template's marker line is replaced, the rest kept as is */
    char *filled = tq_spec_doc_fill("# title\nbefore\n@SPEC_REFERENCE@\nafter\n", TQ_DOC_MARKDOWN);
    assert_non_null(filled);
    assert_int_equal(strncmp(filled, "# title\nbefore\n", 15), 0);
    assert_int_equal(strncmp(filled + 15, md, strlen(md)), 0);
    assert_string_equal(filled + 15 + strlen(md), "after\n");
    free(filled);
    filled = tq_spec_doc_fill(".SH SPEC\n.\\\" @SPEC_REFERENCE@\n.SH NEXT\n", TQ_DOC_MAN);
    assert_non_null(filled);
    assert_int_equal(strncmp(filled, ".SH SPEC\n", 9), 0);
    assert_int_equal(strncmp(filled + 9, man, strlen(man)), 0);
    assert_string_equal(filled + 9 + strlen(man), ".SH NEXT\n");
    free(filled);
    assert_null(tq_spec_doc_fill("no marker\n", TQ_DOC_MAN));
    free(man);
    free(md);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) { free(buf); buf = NULL; }
    if (buf) buf[len] = 0;
    fclose(f);
    return buf;
}

/* The committed docs/spec.md and docs/trainq.1 are what the table and the templates make. */
static void check_generated(const char *tmpl_path, const char *out_path, int format) {
    char a[256], b[256];
    const char *roots[] = { "", "../../" };   /* the repository root (make unit), or tests/unit */
    char *tmpl = NULL, *committed = NULL;
    for (size_t r = 0; r < 2 && !tmpl; r++) {
        snprintf(a, sizeof a, "%s%s", roots[r], tmpl_path);
        snprintf(b, sizeof b, "%s%s", roots[r], out_path);
        tmpl = slurp(a);
        if (tmpl) committed = slurp(b);
    }
    if (!tmpl) fail_msg("%s not found: run the test from the repository root", tmpl_path);
    if (!committed) fail_msg("%s is missing: run `make docs`", out_path);
    char *want = tq_spec_doc_fill(tmpl, format);
    assert_non_null(want);
    if (strcmp(want, committed)) {
        int line = 1;
        const char *p = want, *q = committed;
        while (*p && *p == *q) { if (*p == '\n') line++; p++; q++; }
        fail_msg("%s differs from what %s and train/spec.c's field table generate (first at line %d): "
                 "run `make docs`", out_path, tmpl_path, line);
    }
    free(want);
    free(tmpl);
    free(committed);
}

static void test_docs_up_to_date(void **state) {
    (void)state;
    check_generated("docs/spec.md.in", "docs/spec.md", TQ_DOC_MARKDOWN);
    check_generated("docs/trainq.1.in", "docs/trainq.1", TQ_DOC_MAN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_default_rendering),
        cmocka_unit_test(test_models_datasets),
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_optimizer),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_long_strings),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_bad_text),
        cmocka_unit_test(test_numbers_exact),
        cmocka_unit_test(test_recompute_resolution),
        cmocka_unit_test(test_batch_auto),
        cmocka_unit_test(test_batch_candidates),
        cmocka_unit_test(test_rendering),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_doc_covers_parser),
        cmocka_unit_test(test_doc_table),
        cmocka_unit_test(test_doc_rendering),
        cmocka_unit_test(test_docs_up_to_date),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
