"""Parity: `trainq run` against the same run in PyTorch (CONTRACT.md, "what the same run in
PyTorch means").

For each case: torch.manual_seed(0), build the PyTorch model, save its state_dict as the job's
init_from, run build/trainq on a short spec with shuffle and augmentation off, train the same
steps in PyTorch, then compare the per-step losses (steps table), the final weights
(--out DIR/model.safetensors, loaded with load_state_dict(strict=True)), the summary line on
stdout and the final evaluation loss.

Skips (with the reason) when build/trainq or Fashion-MNIST is missing. TRAINQ_BIN overrides
the binary's path.
"""
import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tq_torch as tq  # noqa: E402

REPO = HERE.parents[1]
TRAINQ = Path(os.environ.get("TRAINQ_BIN", REPO / "build" / "trainq"))

THREADS = 2
TRAIN_SUBSET = 1280
EVAL_SUBSET = 256
LOSS_RTOL = 1e-4      # per step, relative
WEIGHT_RTOL = 1e-3    # per tensor: max|trainq - torch| / max|torch|
EVAL_RTOL = 1e-3      # final val_loss, relative
RUN_TIMEOUT_S = 300

SGD = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}

# Why resnet20 has three cases. Trained with batch-norm in train mode at batch 32, resnet20 is
# chaotic from PyTorch's default init: the loss surface's curvature is ~1e3, so at lr 0.05 a
# rounding difference grows ~10x per step. Measured with PyTorch alone (1.13, CPU): fp32 vs
# fp64 step losses differ by 9e-8, 3e-5, 4e-4, 5e-3 at steps 1-4 and by up to 0.5 later; even
# fp32 on 1 vs 2 threads differs by 1e-2 at step 5 and 0.3 at step 15, and the weights after 20
# steps by up to 2x (max-relative). cnn and mlp stay within ~1e-7 (losses) / 3e-6 (weights).
# The strict 20-step case ("resnet20") therefore starts well-conditioned (zero_init_residual,
# batch 64, lr 0.02), where rounding differences stay ~1e-5 over 20 steps. The default-init
# 20-step run ("resnet20-default-init", chaotic) is held to LOSS_RTOL only at step 1 (same weights,
# forward only), to CHAOS_STEP2_RTOL at step 2, and then only to sanity bands; its weights
# and val_loss are reported, not compared (set TQ_PARITY_STRICT=1 to hold it to the strict
# tolerances anyway). The numerical check of resnet20's backward, batch-norm and update is
# "resnet20-1step": one optimizer step from an init whose batch-norm parameters and running
# statistics are randomised (so no tensor starts at exactly 0 and init_from's running stats
# must be used), at lr 0.02, where fp32-vs-fp64 PyTorch differ by 1.6e-4 in the weights.
CHAOS_STEP2_RTOL = 1e-3
CHAOS_STEP_RTOL = 1.0        # steps 3..: each loss within a factor of 2
CHAOS_TAIL_MEAN_RTOL = 0.25  # mean loss over the second half of the steps
STRICT_ALL = os.environ.get("TQ_PARITY_STRICT") == "1"

CASES = {
    "cnn": dict(model="cnn", batch=32, accum=1, steps=20, optimizer=SGD),
    "resnet20-default-init": dict(model="resnet20", batch=32, accum=1, steps=20, optimizer=SGD,
                                  chaotic=True),
    # resnet20 held to LOSS_RTOL on all 20 steps: started well-conditioned (torchvision's
    # zero_init_residual: each block's last batch-norm weight 0, so every block starts as the
    # identity), batch 64, lr 0.02. Measured: worst step 2.7e-5.
    # Its weights are compared norm-wise over the whole model (||d||/||w|| <= WEIGHT_RTOL):
    # batch-norm weights that start at 0 and biases of ~1e-5 are dominated by rounding, as
    # between PyTorch's own fp32 and fp64 runs.
    "resnet20": dict(model="resnet20", batch=64, accum=1, steps=20,
                     optimizer=dict(SGD, lr=0.02), zero_init_residual=True,
                     weight_check="normwise"),
    "resnet20-1step": dict(model="resnet20", batch=32, accum=1, steps=1,
                           optimizer=dict(SGD, lr=0.02), randomize_bn=True),
    "mlp-accum4": dict(model="mlp", batch=16, accum=4, steps=20, optimizer=SGD),
}
# The same two resnet20 cases with trainq's Winograd 3×3 convolutions forced on
# (TQ_CPU_WINOGRAD=1; by default they run in fp32 only where oneDNN has no AVX-512, and CI's
# machines have it; bf16 cases take them on Intel CPUs where oneDNN has no AMX): a whole training run
# through them must match PyTorch as closely as oneDNN's.
for _n in ("resnet20", "resnet20-1step"):
    CASES[_n + "-winograd"] = dict(CASES[_n], env={"TQ_CPU_WINOGRAD": "1"}, needs_avx2=True)

pytestmark = [
    pytest.mark.skipif(not (TRAINQ.is_file() and os.access(TRAINQ, os.X_OK)),
                       reason="%s is missing or not executable: build it first (make)" % TRAINQ),
    pytest.mark.skipif(
        not os.path.exists(os.path.join(tq.FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
        reason="Fashion-MNIST not found in %s" % tq.FASHION_MNIST_DIR),
]


def _spec(cfg, init):
    spec = {
        "model": cfg["model"],
        "dataset": "fashion-mnist",
        "batch_size": cfg["batch"],
        "steps": cfg["steps"],
        "shuffle": False,
        "augment": False,
        "train_subset": TRAIN_SUBSET,
        "eval_subset": EVAL_SUBSET,
        "init_from": str(init),
        "optimizer": dict(cfg["optimizer"]),
        "threads": THREADS,
        "device": "cpu",
    }
    if cfg["accum"] != 1:
        spec["accum_steps"] = cfg["accum"]
    return spec


def _randomize_bn(net, seed=1):
    """Batch-norm weight in [0.8,1.2], bias in [-0.2,0.2], running_mean in [-0.1,0.1],
    running_var in [0.5,1.5], num_batches_tracked 3."""
    g = torch.Generator().manual_seed(seed)
    u = lambda n, lo, hi: lo + (hi - lo) * torch.rand(n, generator=g)  # noqa: E731
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(u(c, 0.8, 1.2))
                mod.bias.copy_(u(c, -0.2, 0.2))
                mod.running_mean.copy_(u(c, -0.1, 0.1))
                mod.running_var.copy_(u(c, 0.5, 1.5))
                mod.num_batches_tracked.fill_(3)


def _has_wino_isa():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return False
    return all(f in flags for f in ("avx2", "fma", "f16c"))   # what cpu_conv.c's wino_use asks


def _strict(case):
    return STRICT_ALL or not case["cfg"].get("chaotic")


def _run_case(tmp, name):
    cfg = CASES[name]
    if cfg.get("needs_avx2") and not _has_wino_isa():
        pytest.skip("%s: this CPU lacks AVX2, FMA or F16C, so Winograd convolutions do not run" % name)
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    net = tq.build_model(cfg["model"], 1, 28, 28)
    if cfg.get("randomize_bn"):
        _randomize_bn(net)
    if cfg.get("zero_init_residual"):
        with torch.no_grad():
            for name, mod in net.named_modules():
                if name.endswith(".bn2") and name.startswith("layer"):
                    mod.weight.zero_()
    init = tmp / "init.safetensors"
    tq.st_save(str(init), net.state_dict())  # all tensors; num_batches_tracked as I64
    spec = _spec(cfg, init)
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    db, out = tmp / "run.db", tmp / "out"
    cmd = [str(TRAINQ), "run", str(spec_path), "--db", str(db), "--out", str(out)]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=RUN_TIMEOUT_S, cwd=str(tmp),
                              env=dict(os.environ, **cfg.get("env", {})))
    except subprocess.TimeoutExpired as e:
        pytest.fail("%s timed out after %ds; stderr tail:\n%s"
                    % (" ".join(cmd), RUN_TIMEOUT_S, (e.stderr or b"")[-2000:]))

    # the same run in PyTorch, from the same initial weights (still in `net`)
    x, y, xt, yt = tq.load_fashion_mnist(TRAIN_SUBSET, EVAL_SUBSET)
    opt = tq.make_optimizer(net, spec["optimizer"])
    torch_losses = tq.train_steps(net, opt, x, y, cfg["batch"], cfg["accum"], cfg["steps"])
    val_loss, val_acc = tq.evaluate(net, xt, yt)

    rows = None
    if db.exists():
        con = sqlite3.connect(str(db))
        try:
            rows = con.execute("SELECT step, loss FROM steps ORDER BY step").fetchall()
        except sqlite3.Error as e:
            rows = e
        finally:
            con.close()
    return {
        "name": name, "cfg": cfg, "model": cfg["model"], "batch": cfg["batch"],
        "accum": cfg["accum"], "steps": cfg["steps"], "cmd": cmd,
        "rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
        "rows": rows, "out": out, "torch_losses": torch_losses, "torch_model": net,
        "torch_val": (val_loss, val_acc),
    }


_cache = {}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    name = request.param
    if name not in _cache:
        _cache[name] = _run_case(tmp_path_factory.mktemp("parity-" + name), name)
    return _cache[name]


def _where(c):
    return "%s (rc %s)\nstderr tail:\n%s" % (" ".join(c["cmd"]), c["rc"], c["stderr"][-3000:])


def _summary(c):
    lines = c["stdout"].splitlines()
    assert len(lines) == 1, "stdout must be exactly one JSON line, got %d:\n%s\n%s" % (
        len(lines), c["stdout"][-2000:], _where(c))
    try:
        s = json.loads(lines[0])
    except ValueError as e:
        pytest.fail("stdout is not JSON (%s): %r\n%s" % (e, lines[0][:500], _where(c)))
    assert isinstance(s, dict), "summary is not a JSON object: %r" % lines[0][:500]
    return s


def test_summary_line(case):
    s = _summary(case)
    assert case["rc"] == 0, "exit status %s, summary %s\n%s" % (case["rc"], s, _where(case))
    assert s.get("state") == "succeeded", s
    assert s.get("steps") == case["steps"], s
    assert s.get("effective_batch") == case["batch"] * case["accum"], s


def test_step_losses(case):
    rows = case["rows"]
    assert rows is not None, "no database at --db\n" + _where(case)
    assert not isinstance(rows, Exception), "steps table: %s\n%s" % (rows, _where(case))
    assert [r[0] for r in rows] == list(range(1, case["steps"] + 1)), (
        "steps table holds steps %s\n%s" % ([r[0] for r in rows], _where(case)))
    ref = case["torch_losses"]
    strict = _strict(case)
    report = []
    bad = []
    for (step, loss), t in zip(rows, ref):
        rel = abs(loss - t) / abs(t) if loss is not None else math.inf
        if strict or step == 1:
            tol = LOSS_RTOL
        elif step == 2:
            tol = CHAOS_STEP2_RTOL
        else:
            tol = CHAOS_STEP_RTOL
        report.append("step %2d  trainq %.8f  torch %.8f  rel %.2e  (tol %g)"
                      % (step, loss if loss is not None else math.nan, t, rel, tol))
        if not rel <= tol:
            bad.append(step)
    if not strict:
        half = len(ref) // 2
        got_tail = [r[1] for r in rows[half:]]
        mean_t = sum(ref[half:]) / len(ref[half:])
        mean_g = (sum(got_tail) / len(got_tail)) if None not in got_tail else math.nan
        rel = abs(mean_g - mean_t) / abs(mean_t)
        report.append("mean of steps %d-%d  trainq %.6f  torch %.6f  rel %.2e  (tol %g)"
                      % (half + 1, len(ref), mean_g, mean_t, rel, CHAOS_TAIL_MEAN_RTOL))
        if not rel <= CHAOS_TAIL_MEAN_RTOL:
            bad.append("tail mean")
    print("\n%s losses:\n%s" % (case["name"], "\n".join(report)))
    assert not bad, "%s: %s beyond tolerance:\n%s" % (case["name"], bad, "\n".join(report))


def test_final_weights(case):
    path = case["out"] / "model.safetensors"
    assert path.is_file(), "no %s\n%s" % (path, _where(case))
    header, _ = tq.st_header(str(path))
    want = case["torch_model"].state_dict()
    dtype_errors = ["%s: %s" % (k, header[k]["dtype"]) for k in header
                    if header[k]["dtype"] != ("I64" if k.endswith("num_batches_tracked")
                                              else "F32")]
    assert not dtype_errors, "unexpected dtypes (want I64 counters, F32 otherwise): %s" % (
        dtype_errors)
    got = {k: torch.from_numpy(v) for k, v in tq.st_load(str(path)).items()}
    # the exported file must load strictly into the PyTorch module written the same way
    fresh = tq.build_model(case["model"], 1, 28, 28)
    fresh.load_state_dict(got, strict=True)
    shape_errors = ["%s: %s vs %s" % (k, tuple(got[k].shape), tuple(v.shape))
                    for k, v in want.items() if tuple(got[k].shape) != tuple(v.shape)]
    assert not shape_errors, shape_errors

    report = []
    bad = []
    num = den = 0.0
    normwise = case["cfg"].get("weight_check") == "normwise"
    for k, ref in want.items():
        g = got[k]
        if k.endswith("num_batches_tracked"):
            ok = int(g) == int(ref)
            report.append("%-40s trainq %d torch %d" % (k, int(g), int(ref)))
            if not ok:
                bad.append(k)
            continue
        ref64, g64 = ref.double(), g.double()
        if not bool(torch.isfinite(g64).all()):
            report.append("%-40s NOT FINITE" % k)
            bad.append(k)
            continue
        scale = float(ref64.abs().max()) if ref64.numel() else 0.0
        diff = float((g64 - ref64).abs().max()) if ref64.numel() else 0.0
        rel = diff / max(scale, 1e-12)
        num += float(((g64 - ref64) ** 2).sum())
        den += float((ref64 ** 2).sum())
        report.append("%-40s max|d| %.3e  max|w| %.3e  rel %.3e" % (k, diff, scale, rel))
        if _strict(case) and not normwise and not rel <= WEIGHT_RTOL:
            bad.append(k)
    total_rel = math.sqrt(num / max(den, 1e-300))
    report.append("all parameters and buffers: ||d||/||w|| = %.3e" % total_rel)
    if _strict(case) and normwise and not total_rel <= WEIGHT_RTOL:
        bad.append("||d||/||w|| %.3e" % total_rel)
    if not _strict(case):
        report.append("(chaotic case: weights reported, not compared; TQ_PARITY_STRICT=1)")
    print("\n%s final weights:\n%s" % (case["name"], "\n".join(report)))
    assert not bad, "%s: tensors beyond %g relative: %s\n%s" % (
        case["name"], WEIGHT_RTOL, bad, "\n".join(report))


def test_final_eval_loss(case):
    s = _summary(case)
    val = s.get("val_loss")
    assert isinstance(val, (int, float)), "summary has no val_loss: %s" % s
    t_loss, t_acc = case["torch_val"]
    print("\n%s val_loss trainq %.6f torch %.6f; val_accuracy trainq %s torch %.4f"
          % (case["name"], val, t_loss, s.get("val_accuracy"), t_acc))
    assert math.isfinite(val), "val_loss %r" % val
    if not _strict(case):
        return  # chaotic training: the final weights, hence val_loss, are not comparable
    assert abs(val - t_loss) <= EVAL_RTOL * abs(t_loss), (
        "%s: val_loss %.6f vs torch %.6f (eval mode, first %d test samples)"
        % (case["name"], val, t_loss, EVAL_SUBSET))
