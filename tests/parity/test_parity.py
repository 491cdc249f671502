"""Parity: `trainq run` against the same run in PyTorch (CONTRACT.md, "what the same run in
PyTorch means").

For each case: torch.manual_seed(0), build the PyTorch model, save its state_dict as the job's
init_from, run build/trainq on a 20-step spec with shuffle and augmentation off, train the same
20 steps in PyTorch, then compare the per-step losses (steps table), the final weights
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
STEPS = 20
TRAIN_SUBSET = 640
EVAL_SUBSET = 256
LOSS_RTOL = 1e-4      # per step, relative
WEIGHT_RTOL = 1e-3    # per tensor: max|trainq - torch| / max|torch|
EVAL_RTOL = 1e-3      # final val_loss, relative
RUN_TIMEOUT_S = 300

SGD = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}

# name -> (model, batch_size, accum_steps)
CASES = {
    "cnn": ("cnn", 32, 1),
    "resnet20": ("resnet20", 32, 1),
    "mlp-accum4": ("mlp", 16, 4),
}

pytestmark = [
    pytest.mark.skipif(not (TRAINQ.is_file() and os.access(TRAINQ, os.X_OK)),
                       reason="%s is missing or not executable: build it first (make)" % TRAINQ),
    pytest.mark.skipif(
        not os.path.exists(os.path.join(tq.FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
        reason="Fashion-MNIST not found in %s" % tq.FASHION_MNIST_DIR),
]


def _spec(model, batch, accum, init):
    spec = {
        "model": model,
        "dataset": "fashion-mnist",
        "batch_size": batch,
        "steps": STEPS,
        "shuffle": False,
        "augment": False,
        "train_subset": TRAIN_SUBSET,
        "eval_subset": EVAL_SUBSET,
        "init_from": str(init),
        "optimizer": dict(SGD),
        "threads": THREADS,
        "device": "cpu",
    }
    if accum != 1:
        spec["accum_steps"] = accum
    return spec


def _run_case(tmp, name):
    model, batch, accum = CASES[name]
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    net = tq.build_model(model, 1, 28, 28)
    init = tmp / "init.safetensors"
    tq.st_save(str(init), net.state_dict())  # all tensors; num_batches_tracked as I64
    spec = _spec(model, batch, accum, init)
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    db, out = tmp / "run.db", tmp / "out"
    cmd = [str(TRAINQ), "run", str(spec_path), "--db", str(db), "--out", str(out)]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=RUN_TIMEOUT_S, cwd=str(tmp))
    except subprocess.TimeoutExpired as e:
        pytest.fail("%s timed out after %ds; stderr tail:\n%s"
                    % (" ".join(cmd), RUN_TIMEOUT_S, (e.stderr or b"")[-2000:]))

    # the same run in PyTorch, from the same initial weights (still in `net`)
    x, y, xt, yt = tq.load_fashion_mnist(TRAIN_SUBSET, EVAL_SUBSET)
    opt = tq.make_optimizer(net, spec["optimizer"])
    torch_losses = tq.train_steps(net, opt, x, y, batch, accum, STEPS)
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
        "name": name, "model": model, "batch": batch, "accum": accum, "cmd": cmd,
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
    assert s.get("steps") == STEPS, s
    assert s.get("effective_batch") == case["batch"] * case["accum"], s


def test_step_losses(case):
    rows = case["rows"]
    assert rows is not None, "no database at --db\n" + _where(case)
    assert not isinstance(rows, Exception), "steps table: %s\n%s" % (rows, _where(case))
    assert [r[0] for r in rows] == list(range(1, STEPS + 1)), (
        "steps table holds steps %s\n%s" % ([r[0] for r in rows], _where(case)))
    ref = case["torch_losses"]
    report = []
    bad = []
    for (step, loss), t in zip(rows, ref):
        rel = abs(loss - t) / abs(t) if loss is not None else math.inf
        report.append("step %2d  trainq %.8f  torch %.8f  rel %.2e" % (step, loss or math.nan,
                                                                      t, rel))
        if not rel <= LOSS_RTOL:
            bad.append(step)
    print("\n%s losses:\n%s" % (case["name"], "\n".join(report)))
    assert not bad, "%s: steps %s differ by more than %g relative:\n%s" % (
        case["name"], bad, LOSS_RTOL, "\n".join(report))


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
    for k, ref in want.items():
        g = got[k]
        if k.endswith("num_batches_tracked"):
            ok = int(g) == int(ref)
            report.append("%-40s trainq %d torch %d" % (k, int(g), int(ref)))
            if not ok:
                bad.append(k)
            continue
        ref64, g64 = ref.double(), g.double()
        scale = float(ref64.abs().max()) if ref64.numel() else 0.0
        diff = float((g64 - ref64).abs().max()) if ref64.numel() else 0.0
        rel = diff / max(scale, 1e-12)
        report.append("%-40s max|d| %.3e  max|w| %.3e  rel %.3e" % (k, diff, scale, rel))
        if not rel <= WEIGHT_RTOL:
            bad.append(k)
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
    assert abs(val - t_loss) <= EVAL_RTOL * abs(t_loss), (
        "%s: val_loss %.6f vs torch %.6f (eval mode, first %d test samples)"
        % (case["name"], val, t_loss, EVAL_SUBSET))
