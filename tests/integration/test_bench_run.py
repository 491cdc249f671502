"""bench/run --quick: the article's experiment on a 2-cell smoke grid (cnn fp32 b64×1 and bf16
b32×2, a few steps), trainq through a real `trainq serve` next to PyTorch, everything written
under a temporary --out directory (never docs/). Checks the files it writes and that every cell
has numbers on both sides. Skips without the binary (build/trainq or TRAINQ_BIN), torch or
matplotlib.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "run"
BEGIN = "<!-- bench/run:begin -->"
END = "<!-- bench/run:end -->"


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@pytest.fixture(scope="module")
def quick(tmp_path_factory, trainq):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("bench-run")
    env = dict(os.environ, TRAINQ=trainq)
    r = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(out)], cwd=str(out),
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, "bench/run failed (%d):\n%s" % (r.returncode, r.stderr[-4000:])
    return out, r


def test_writes_its_files_under_out(quick):
    out, r = quick
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    assert md.count(BEGIN) == 1 and md.count(END) == 1 and md.index(BEGIN) < md.index(END)
    assert "## The article's experiment (bench/run)" in md
    assert "### cnn" in md and "The article's claims" in md
    png = out / "img" / "bench-run-cnn.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](img/bench-run-cnn.png)" in md
    data = json.loads((out / "bench-results.json").read_text())
    assert data["meta"]["grid"]["quick"] is True
    # stdout is the markdown section
    assert "### cnn" in r.stdout


def test_every_cell_has_numbers(quick):
    out, _ = quick
    data = json.loads((out / "bench-results.json").read_text())
    cells = data["cells"]
    assert [(c["model"], c["batch"], c["amp"], c["accum"]) for c in cells] == [
        ("cnn", 64, "off", 1), ("cnn", 32, "bf16", 2)]
    steps = data["meta"]["steps"]
    for c in cells:
        tq, pt = c["trainq"], c["torch"]
        assert tq["state"] == "succeeded", tq.get("error")
        assert pt["state"] == "succeeded", pt.get("error")
        assert len(tq["steps"]) == steps and len(pt["steps"]) == steps
        for side in (tq["summary"], pt["summary"]):
            for k in ("samples_per_s", "peak_memory_bytes", "val_accuracy", "final_loss"):
                assert number(side[k]) and side[k] > 0, (c["key"], k, side[k])
        # the AMP/fp32 ratios: trainq's from /v1/compare, PyTorch's computed the same way
        for vs in (tq["compare"]["vs_baseline"], pt["vs_baseline"]):
            for k in ("samples_per_s", "peak_memory_bytes", "val_accuracy_points"):
                assert number(vs[k]), (c["key"], k, vs)
        assert c["baseline"] == "cnn/b64/off/a1"
        # same weights, same data: the first step's loss agrees between the two
        assert abs(tq["steps"][0]["loss"] - pt["steps"][0]["loss"]) < 1e-3
    assert cells[0]["trainq"]["compare"]["vs_baseline"]["samples_per_s"] == 1
    assert data["meta"]["compare_source"] == "/v1/compare"
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    rows = [l for l in md.splitlines() if l.startswith("| 64 | off") or l.startswith("| 32 | bf16")]
    assert len(rows) == 2
    for row in rows:
        assert "failed" not in row and "rejected" not in row, row
    claims = [l for l in md.splitlines() if l.startswith("| cnn | memory, AMP b32×2")]
    assert len(claims) == 1 and "%" in claims[0].split("|")[5]   # trainq bf16


def test_accuracy_stage(quick):
    """The article's configurations trained longer: both sides, numbers, and the claims
    table's accuracy row taken from them."""
    out, _ = quick
    data = json.loads((out / "bench-results.json").read_text())
    acc = data["accuracy"]
    assert acc["steps"] > data["meta"]["steps"] and acc["eval_samples"] > 0
    runs = acc["runs"]
    assert [(r["model"], r["batch"], r["amp"], r["accum"]) for r in runs] == [
        ("cnn", 64, "off", 1), ("cnn", 32, "bf16", 2)]
    for r in runs:
        for side in ("trainq", "torch"):
            s = r[side]
            assert s["state"] == "succeeded", s.get("error")
            assert len(s["losses"]) == acc["steps"]
            assert number(s["summary"]["val_accuracy"]) and 0 < s["summary"]["val_accuracy"] <= 1
        # same weights and data: the first step agrees
        assert abs(r["trainq"]["losses"][0] - r["torch"]["losses"][0]) < 1e-3
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    assert "### Accuracy, trained longer" in md
    want = 100 * (runs[1]["trainq"]["summary"]["val_accuracy"] - runs[0]["trainq"]["summary"]["val_accuracy"])
    row = [l for l in md.splitlines() if l.startswith("| cnn | accuracy, AMP b32×2")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == ("%+.1f pt" % want).replace("-", "−"), (cells, want)
