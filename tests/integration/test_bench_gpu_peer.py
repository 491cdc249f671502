"""The GPU benchmark's PyTorch peer (bench/gpu_torch.py) and gpu-check's torch.compile stage,
without a GPU: the peer's loop on the CPU (--device cpu) gives well-formed records for eager
and, where the running torch has torch.compile (a bench/.venv), for a compiled model, or says
"unavailable" (Debian's 1.13) and exits 0; gpu-check --compile-only --compile-device cpu runs
the stage's plumbing end to end with a tiny cnn; --render turns a saved run's compile stage
into its table and target lines. Never a speed."""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_daemon import TRAINQ

REPO = Path(__file__).resolve().parents[2]
PEER = REPO / "bench" / "gpu_torch.py"
GPU_CHECK = REPO / "scripts" / "gpu-check"


def peer(*args):
    r = subprocess.run([sys.executable, str(PEER), "--device", "cpu", "--model", "cnn", "--shape", "8,8,1",
                        "--steps", "2", "--warmup", "1"] + list(args),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


def test_eager_records():
    torch = pytest.importorskip("torch")
    rows = peer("--cells", "4:off:1,4:bf16:2")
    assert [(r["batch"], r["amp"], r["accum"], r["compile"]) for r in rows] == [(4, "off", 1, "none"),
                                                                              (4, "bf16", 2, "none")]
    for r in rows:
        assert r["device"] == "cpu" and r["torch"] == torch.__version__
        assert r["samples_per_s"] > 0 and r["step_ms_median"] > 0 and r["peak_memory_bytes"] is None
        assert r["compile_s"] is None and r["final_loss"] == r["final_loss"]   # not NaN
        flops = r["train_flops_per_sample"]
        try:
            import torch.utils.flop_counter  # noqa: F401 (PyTorch 2.1 and later)
        except ImportError:
            assert flops is None
            continue
        # cnn on 1x8x8, multiply-adds of the forward: conv1 8*8*32*9 = 18,432, conv2 (after a
        # 2x2 pool) 4*4*64*32*9 = 294,912, fc1 256*128 = 32,768, fc2 128*10 = 1,280: 347,392,
        # 694,784 FLOPs. The backward twice that, less conv1's input gradient (the input needs
        # none): 3 * 694,784 - 2 * 18,432 = 2,047,488.
        assert flops == 2047488, flops


def test_compile_mode_or_unavailable():
    torch = pytest.importorskip("torch")
    rows = peer("--cells", "4:off:1", "--compile", "default", "--no-flops", "--warmup", "2")
    assert len(rows) == 1 and rows[0]["compile"] == "default"
    if hasattr(torch, "compile"):
        assert rows[0]["samples_per_s"] > 0 and rows[0]["compile_s"] >= 0
    else:
        assert "torch.compile does not exist" in rows[0]["unavailable"] and "samples_per_s" not in rows[0]


def test_bad_arguments_exit_2():
    pytest.importorskip("torch")
    for bad in (["--compile", "fast"], ["--device", "tpu"], ["--steps", "0"]):
        r = subprocess.run([sys.executable, str(PEER)] + bad, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2, (bad, r.stderr)


def load_gpu_check():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(GPU_CHECK))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def render(tmp_path, saved):
    """gpu-check --render of a saved run: the markdown report."""
    (tmp_path / "run.json").write_text(json.dumps(saved))
    report = tmp_path / "gpu-check.md"
    r = subprocess.run([sys.executable, str(GPU_CHECK), "--render", str(tmp_path / "run.json"), "--report", str(report)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return report.read_text()


def test_compile_targets_and_render(tmp_path):
    gc = load_gpu_check()
    assert gc.card_peak("NVIDIA H100 80GB HBM3")[:2] == (989.4, 494.7)
    assert gc.card_peak("NVIDIA H100 PCIe")[0] == 756.0 and gc.card_peak("NVIDIA H200 NVL")[0] == 835.5
    assert gc.card_peak("Tesla T4") is None
    fp16 = {"batch": 128, "amp": "fp16", "steps": 40,
            "trainq": {"state": "succeeded", "samples_per_s": 20000.0, "peak_memory_bytes": 2e9, "cuda_graphs": "captured"},
            "peers": {"none": {"samples_per_s": 9000.0, "peak_memory_bytes": 3e9, "train_flops_per_sample": 7.8e9},
                      "default": {"samples_per_s": 14000.0, "peak_memory_bytes": 2.4e9, "compile_s": 70.0},
                      "max-autotune": {"samples_per_s": 16000.0, "peak_memory_bytes": 2.6e9, "compile_s": 300.0}}}
    fp32 = {"batch": 128, "amp": "off", "steps": 40,
            "trainq": {"state": "succeeded", "samples_per_s": 5000.0, "peak_memory_bytes": 4e9, "cuda_graphs": "captured"},
            "peers": {"none": {"samples_per_s": 5200.0, "peak_memory_bytes": 5e9, "train_flops_per_sample": 7.8e9},
                      "max-autotune": {"error": "timed out after 590 s (compiling, probably)"}}}
    gc.compile_targets(fp16, "NVIDIA H100 80GB HBM3")
    gc.compile_targets(fp32, "NVIDIA H100 80GB HBM3")
    assert fp16["peers"]["max-autotune"]["ratio"] == pytest.approx(1.25)
    assert fp16["peers"]["max-autotune"]["mem_ratio"] == pytest.approx(2e9 / 2.6e9)
    assert fp16["trainq_share_of_peak"] == pytest.approx(20000 * 7.8e9 / 989.4e12)
    assert fp16["targets"] == {"≥ 1.3× torch.compile max-autotune": False, "≤ 0.8× its peak memory": True,
                               "≥ 15% of the fp16 tensor-core peak": True}
    assert fp32["peak_tflops"] == 494.7 and fp32["targets"] == {"≥ 1.0× PyTorch eager (TF32 alike)": False}
    saved = {"info": {"date": "2026-12-06 18:00 UTC", "gpu": "NVIDIA H100 80GB HBM3"}, "ops": {},
             "compile": {"cells": [fp16, fp32], "card": "NVIDIA H100 80GB HBM3", "wall_s": 420.0}}
    md = render(tmp_path, saved)
    assert "## torch.compile: resnet50 3×32×32, batch 128 (issue 18" in md
    assert "| fp16 | torch.compile max-autotune | 16000 | 1.25× |" in md
    assert "| fp32 | torch.compile max-autotune | timed out after 590 s (compiling, probably) |" in md
    assert "- fp16, ≥ 1.3× torch.compile max-autotune: **not met**" in md
    assert "- fp16, ≤ 0.8× its peak memory: met" in md
    assert "7.80 GFLOP, torch.utils.flop_counter" in md and "H100 row of CARD_PEAKS" in md


def test_compile_stage_mechanics_on_the_cpu(tmp_path):
    """The stage end to end with the python running the tests as the peer (PYTHON=): trainq's
    two cells train, PyTorch's eager fp32 cell has numbers, every other peer cell has numbers
    or says why not (no torch.compile in 1.13; no CPU fp16 autocast in 1.13), and the report
    carries the section, marked as mechanics."""
    pytest.importorskip("torch")
    if not os.access(TRAINQ, os.X_OK):
        pytest.skip("no trainq binary (make)")
    report = tmp_path / "gpu-check.md"
    env = dict(os.environ, PYTHON=sys.executable, TRAINQ_BIN=TRAINQ)
    r = subprocess.run([sys.executable, str(GPU_CHECK), "--compile-only", "--compile-device", "cpu",
                        "--bundle", str(tmp_path / "no-bundle"), "--report", str(report), "--budget", "240"],
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-check.json").read_text())
    c = data["compile"]
    assert c["model"] == "cnn" and c["device"] == "cpu" and [x["amp"] for x in c["cells"]] == ["fp16", "off"]
    for cell in c["cells"]:
        assert cell["trainq"]["state"] == "succeeded" and cell["trainq"]["samples_per_s"] > 0, cell["trainq"]
        assert set(cell["peers"]) == {"none", "default", "max-autotune"}
        for mode, p in cell["peers"].items():
            assert p.get("samples_per_s", 0) > 0 or p.get("unavailable") or p.get("error"), (mode, p)
    eager32 = c["cells"][1]["peers"]["none"]
    assert eager32["samples_per_s"] > 0 and eager32["ratio"] > 0
    md = report.read_text()
    assert "## torch.compile: cnn 1×8×8, batch 8" in md and "the stage's mechanics, not a measurement" in md
    rows = [l for l in md.splitlines() if l.startswith("| fp16 |") or l.startswith("| fp32 |")]
    assert len(rows) == 8 and all(l.count("|") - l.count("\\|") == 9 for l in rows), rows   # one line each


def test_graphs_stage_mechanics_on_the_cpu(tmp_path):
    """gpu-check --graphs-only --graphs-device cpu: the CUDA-graphs stage's plumbing end to end
    with tiny resnet20 jobs, where cuda_graphs is ignored ("not_cuda") and TQ_DEVICE_STEP=1 runs
    the step-on-the-device loop uncaptured: every run must give the same bits as the plain loop,
    the fp16 case must skip overflowed steps, the TF32 modes must repeat themselves, and the
    report must carry the stage's tables, one line a row, marked as mechanics. What a GPU run
    of the stage would trip on in its own code (a key, a format) trips here first."""
    if not os.access(TRAINQ, os.X_OK):
        pytest.skip("no trainq binary (make)")
    report = tmp_path / "gpu-check.md"
    r = subprocess.run([sys.executable, str(GPU_CHECK), "--graphs-only", "--graphs-device", "cpu",
                        "--bundle", str(tmp_path / "no-bundle"), "--report", str(report), "--budget", "240"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    g = json.loads((tmp_path / "gpu-check.json").read_text())["graphs"]
    assert g["device"] == "cpu" and g["pass"] is True
    assert [c["case"] for c in g["identity"]] == ["resnet20 fp16, accum 2, AdamW, overflows",
                                                  "resnet20 fp32, SGD, warmup + cosine"]
    for c in g["identity"]:
        assert c["pass"] and all(c["checks"].values()), c["checks"]
        assert c["differences"] == {"on": None, "on again": None, "uncaptured": None}
        assert c["cuda_graphs"] == {"off": "off", "on": "not_cuda", "on again": "not_cuda", "uncaptured": "uncaptured"}
        assert c["model_sha256"] and len(c["model_sha256"]) == 64
    assert g["identity"][0]["skipped_steps"] >= 1
    assert [t["mode"] for t in g["tf32"]] == ["off", "conv", "all"]
    assert all(t["succeeded"] and t["repeats"] and t["same_bits_as_off"] for t in g["tf32"])
    t = g["timing"][0]
    assert t["pass"] and t["on"]["cuda_graphs"] == ["not_cuda", "not_cuda"] and t["speedup"] > 0
    prof = g["profile"]
    assert prof["pass"] and prof["state"] == "succeeded" and prof["profile"]["model"] == "resnet20"
    assert prof["profile"]["steps_profiled"] == 3 and prof["profile"]["ops"][0]["ms_per_step"] > 0
    md = report.read_text()
    assert "### Where the step goes: `trainq run --profile`, resnet20 batch 8 fp16" in md
    assert sum(1 for l in md.splitlines() if l.startswith("| ") and ("| conv_" in l or "| bn_" in l)) >= 5
    assert "the stage's mechanics, not a measurement" in md and "resnet20 8×8 synthetic, batch 8, 12 steps" in md
    assert "## GPU ops against the CPU ops" not in md and "## Training parity" not in md   # not run: no section
    rows = [l for l in md.splitlines() if l.startswith("| resnet20 ") or l[:8] in ("| off | ", "| conv |", "| all | ")]
    assert len(rows) == 2 + 3 + 1 and all(l.endswith("|") for l in rows), rows
    assert sum("PASS" in l for l in rows) == 6 and "Stage: **PASS**" in md


def test_bundle_tarball_unpacked_when_the_directory_is_missing(tmp_path):
    """scripts/gpu-bundle's DIR.tar.xz stands in for DIR (a device run carries 64 MiB, the
    directory is ~110 MB): unpacked beside it once, left alone when DIR exists, refused when it
    holds anything but DIR/ (another top directory, a path out of it)."""
    import tarfile
    gc = load_gpu_check()
    src = tmp_path / "src" / "gpu-bundle" / "bin"
    src.mkdir(parents=True)
    (src / "trainq").write_text("#!/bin/sh\n")
    dest = tmp_path / "there"
    dest.mkdir()
    with tarfile.open(dest / "gpu-bundle.tar.xz", "w:xz") as t:
        t.add(tmp_path / "src" / "gpu-bundle", arcname="gpu-bundle")
    gc.unpack_bundle(str(dest / "gpu-bundle"))
    assert (dest / "gpu-bundle" / "bin" / "trainq").read_text() == "#!/bin/sh\n"
    (dest / "gpu-bundle" / "bin" / "trainq").write_text("kept")
    gc.unpack_bundle(str(dest / "gpu-bundle"))           # the directory is there: not unpacked again
    assert (dest / "gpu-bundle" / "bin" / "trainq").read_text() == "kept"
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "gpu-bundle.tar.xz", "w:xz") as t:
        t.add(tmp_path / "src" / "gpu-bundle", arcname="gpu-bundle")
        t.add(tmp_path / "src" / "gpu-bundle", arcname="other")
    with pytest.raises(RuntimeError, match="expected one directory gpu-bundle/"):
        gc.unpack_bundle(str(bad / "gpu-bundle"))
    assert not (bad / "gpu-bundle").exists() and not (bad / "other").exists()
    gc.unpack_bundle(str(tmp_path / "nowhere" / "gpu-bundle"))   # neither there: nothing to do


def test_profile_step_skipped_out_of_budget():
    """The graphs stage's profile step gives way when the budget is spent: said, not failed."""
    gc = load_gpu_check()
    gc.BUDGET = 0.0
    rec = gc.profile_step("/nonexistent/trainq", {}, "/nonexistent")
    assert rec["skipped"] == "out of budget" and rec["pass"] is True and rec["model"] == "resnet50"
    md = "\n".join(gc.profile_report(rec))
    assert "resnet50 batch 128 fp16" in md and "Not run: out of budget (`--graphs-only` runs it)." in md


def test_stale_bundle_is_refused(tmp_path):
    """A bundle records the hash of the sources it was built from (scripts/gpu-bundle writes
    SOURCE); gpu-check refuses one built from other sources than its checkout, naming both,
    before it runs anything: the checks would otherwise pass old code off as the new. The hash
    follows the sources: it is gpu-check --source-hash, stable between calls."""
    h = subprocess.run([sys.executable, str(GPU_CHECK), "--source-hash"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and len(h.stdout.strip()) == 16, h
    again = subprocess.run([sys.executable, str(GPU_CHECK), "--source-hash"], capture_output=True, text=True, timeout=60)
    assert again.stdout == h.stdout
    bundle = tmp_path / "gpu-bundle"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "SOURCE").write_text("0123456789abcdef abc1234-dirty, 2026-12-01 10:00 UTC\n")
    report = tmp_path / "gpu-check.md"
    r = subprocess.run([sys.executable, str(GPU_CHECK), "--graphs-only", "--graphs-device", "cpu",
                        "--bundle", str(bundle), "--report", str(report), "--budget", "60"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr + (report.read_text() if report.exists() else "")
    assert "was built from other sources (0123456789abcdef, abc1234-dirty" in out, out[-2000:]
    assert h.stdout.strip() in out


def test_busy_gpu_check_mechanics_and_report(tmp_path):
    """gpu-check's busy-GPU check without a GPU: the other process (here a stand-in that only says
    what it holds) is started and stopped around a placed run of cuda:0 (TQ_TEST_PLACED=1), whose
    failure here is a missing GPU, not a busy one: the check must say FAIL, and the report renders
    both ways."""
    gc = load_gpu_check()
    gc.HOG = "import sys; print('hog: holds 1073741824 bytes, 0 free of 1073741824', flush=True); sys.stdin.read()"
    r = gc.busy_gpu(str(TRAINQ), dict(os.environ), str(tmp_path))
    assert r["hog"].startswith("hog: holds 1073741824") and r["code"] == "device_unavailable", r
    assert r["message"].startswith("placed on cuda:0, but ") and r["pass"] is False, r
    ok = dict(r, message="placed on cuda:0, but cudaSetDevice on cuda:0: out of memory (cudaErrorMemoryAllocation): "
                         "another process took the GPU since the placement", **{"pass": True})
    saved = {"info": {"date": "2026-12-08 01:00 UTC", "gpu": "NVIDIA H100 80GB HBM3"}, "ops": {},
             "oom": {"state": "failed", "code": "out_of_memory", "message": "needs … free", "steps_recorded": 0,
                     "predicted_peak": 1, "busy": ok, "pass": True}}
    md = render(tmp_path, saved)
    assert "must fail a placed job's open *as busy*" in md and "**PASS** — state failed" in md, md
