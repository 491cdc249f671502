"""Post-training evaluations against PyTorch: `prune` (torch.nn.utils.prune.l1_unstructured on
every conv/linear weight) and `quantize: "int8"` (linear weights quantised per tensor with the
scale of torch's default dynamic-quantisation weight observer, MinMaxObserver qint8
per_tensor_symmetric; activations stay float in trainq's emulation, so the PyTorch side
dequantises the weights the same way). trainq's "pruned" and "int8" eval rows must match
PyTorch evaluating its exported model.safetensors with the same transformation."""
import json
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

TRAINQ = Path(os.environ.get("TRAINQ_BIN", HERE.parents[1] / "build" / "trainq"))
pytestmark = pytest.mark.skipif(not TRAINQ.is_file(), reason="build/trainq missing: run make")

EVAL_N = 512


def test_prune_and_int8_match_pytorch(tmp_path):
    spec = {"model": "cnn", "batch_size": 64, "steps": 30, "train_subset": 1920,
            "eval_subset": EVAL_N, "threads": 2, "device": "cpu", "shuffle": False,
            "prune": {"amount": 0.6}, "quantize": "int8"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    db = tmp_path / "run.db"
    r = subprocess.run([str(TRAINQ), "run", str(tmp_path / "spec.json"), "--db", str(db),
                        "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = dict((k, (l, a)) for k, l, a in sqlite3.connect(str(db)).execute(
        "select kind, loss, accuracy from evals"))
    assert set(rows) == {"eval", "pruned", "int8"}

    torch.set_num_threads(2)
    _, _, xt, yt = tq.load_fashion_mnist(64, EVAL_N)
    state = {k: torch.from_numpy(v) for k, v in tq.st_load(str(tmp_path / "out" / "model.safetensors")).items()}

    def fresh():
        m = tq.build_model("cnn", 1, 28, 28)
        m.load_state_dict(state, strict=True)
        return m

    base = tq.evaluate(fresh(), xt, yt)
    assert abs(base[0] - rows["eval"][0]) <= 1e-4 * base[0]

    import torch.nn.utils.prune as prune
    m = fresh()
    for mod in m.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            prune.l1_unstructured(mod, "weight", amount=0.6)
            prune.remove(mod, "weight")
    pl = tq.evaluate(m, xt, yt)
    print("\npruned 60%%: trainq loss %.6f acc %.4f, torch loss %.6f acc %.4f"
          % (rows["pruned"][0], rows["pruned"][1], pl[0], pl[1]))
    assert abs(pl[0] - rows["pruned"][0]) <= 1e-4 * pl[0]
    assert abs(pl[1] - rows["pruned"][1]) <= 2.0 / EVAL_N

    from torch.ao.quantization import MinMaxObserver
    m = fresh()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):
                obs = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
                obs(mod.weight)
                scale, zp = obs.calculate_qparams()
                q = torch.quantize_per_tensor(mod.weight, float(scale), int(zp), torch.qint8)
                mod.weight.copy_(q.dequantize())
    ql = tq.evaluate(m, xt, yt)
    print("int8 weights: trainq loss %.6f acc %.4f, torch loss %.6f acc %.4f"
          % (rows["int8"][0], rows["int8"][1], ql[0], ql[1]))
    assert abs(ql[0] - rows["int8"][0]) <= 1e-4 * ql[0]
