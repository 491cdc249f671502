"""bench/cpu on a tiny grid: the tool runs and writes a well-formed report (never a speed).

With the python running the tests (Debian's python3-torch 1.13 in CI, where torch.compile does
not exist: the compile cells must say "unavailable", not fail), cnn at batch 16, fp32 and bf16,
6 steps, 2 interleaved rounds, everything under a temporary --out (never docs/); then one round
of --isa avx2, whose probe must show both sides' oneDNN capped at AVX2. Skips without the
binary (build/trainq or TRAINQ_BIN) or torch.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "cpu"
SIDES = ("trainq", "eager-nchw", "eager-cl", "compile")


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v > 0


def run_bench(trainq, out, *args, **env):
    e = dict(os.environ, PYTHON=sys.executable, STEPS="6", MODELS="cnn", BATCHES="16", THREADS="2", **env)
    for k in ("ISA", "ROUNDS", "AMPS", "COMPILE", "TRAINQ", "BATCH"):
        e.pop(k, None)
    e.update(env)
    r = subprocess.run([sys.executable, str(BENCH), "--trainq", trainq, "--out", str(out)] + list(args),
                       env=e, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, "bench/cpu failed (%d):\n%s" % (r.returncode, r.stderr[-4000:])
    return r


@pytest.fixture(scope="module")
def native(tmp_path_factory, trainq):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("bench-cpu")
    r = run_bench(trainq, out, "--rounds", "2", "--amps", "off", "bf16")
    return out, r


def test_report_files(native):
    out, r = native
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    b, e = "<!-- bench/cpu:begin -->", "<!-- bench/cpu:end -->"
    assert md.count(b) == 1 and md.count(e) == 1 and md.index(b) < md.index(e)
    body = md[md.index(b):md.index(e)]
    rows = [l for l in body.splitlines() if l.startswith("| cnn | 16 |")]
    assert len(rows) == 2 and "| fp32 |" in rows[0] and "| bf16 |" in rows[1]
    assert "run: native" in body and "load average" in body and "perf:" in body
    assert "AVX-512F" in body and "AMX" in body          # the CPU's extensions, yes or no
    assert "PyTorch " in body and "trainq ÷ eager" in body
    assert r.stdout.strip() in md                        # stdout is the section
    data = json.loads((out / "bench-cpu.json").read_text())
    assert data["meta"]["rounds_done"] == 2
    tq = data["meta"]["isa_check"]["trainq"]
    isa = tq["off"]["onednn_isa"] or ""
    assert tq["winograd_tile"] == 4 and tq["winograd_tile_bwdf"] == 2   # this build: F(4x4, 3x3) but dW
    if "512" in isa:
        intel = "GenuineIntel" in open("/proc/cpuinfo").read()
        route = "through the f32 primitives on f32 copies of the bf16 data"
        if not intel:   # a Zen 4: oneDNN runs every convolution, its bf16 kernels the bf16 ones
            assert tq["off"]["onednn_convs_winograd_shaped"] > 0
            assert tq["winograd"] == [] and "ran its own Winograd" not in body
            assert tq["bf16_via_f32"] is False and route not in body
        else:   # Intel: Winograd F(4x4, 3x3) on AVX-512 registers takes every 3x3 one it fits
            amx = "AMX" in isa
            assert tq["winograd"] == (["off"] if amx else ["off", "bf16"]), tq
            assert tq["winograd_reach"] == ({"off": "all"} if amx else {"off": "all", "bf16": "all"}), tq
            assert "ran its own Winograd F(4×4, 3×3)" in body and "on AVX-512 registers" in body
            assert "in fp32 all those" in body and ("in bf16 all those" in body) != amx
            assert tq["off"]["onednn_convs_winograd_shaped"] == 0
            if amx:   # AMX tiles keep bf16
                assert tq["bf16_via_f32"] is False and tq["bf16"]["onednn_convs_bf16"] > 0 and route not in body
            else:     # no AMX: the other bf16 ones in f32 chunks, oneDNN's f32 kernels
                assert tq["bf16_via_f32"] is True and tq["bf16"]["onednn_convs_bf16"] == 0 and route in body


def test_render_rewrites_the_section_from_the_json(native, tmp_path):
    """--render runs nothing: the section comes back from the JSON alone, the rest of the file kept."""
    out, r = native
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    b, e = "<!-- bench/cpu:begin -->", "<!-- bench/cpu:end -->"
    page = "# kept above\n\n" + b + "\nstale words\n" + e + "\n\nkept below\n"
    (tmp_path / "benchmarks.md").write_text(page, encoding="utf-8")
    rr = subprocess.run([sys.executable, str(BENCH), "--render", str(out / "bench-cpu.json"), "--out", str(tmp_path)],
                        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert rr.returncode == 0, rr.stderr
    new = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert new.startswith("# kept above\n") and new.rstrip().endswith("kept below")
    assert "stale words" not in new
    assert new[new.index(b):new.index(e)] == md[md.index(b):md.index(e)]



def test_machine_keeps_its_own_section(native, tmp_path):
    """--machine NAME: a second machine's section and JSON sit beside the first machine's, which
    stay as they are; a name that cannot name a file is refused before anything runs."""
    out, r = native
    data = json.loads((out / "bench-cpu.json").read_text())
    assert data["meta"]["machine"] is None
    data["meta"]["machine"] = "zen4"
    (tmp_path / "bench-cpu-zen4.json").write_text(json.dumps(data))
    b, e = "<!-- bench/cpu:begin -->", "<!-- bench/cpu:end -->"
    page = "## CPU training throughput, trainq vs PyTorch (`bench/cpu`)\n\n" + b + "\nthe first machine\n" + e + "\n"
    (tmp_path / "benchmarks.md").write_text(page, encoding="utf-8")
    rr = subprocess.run([sys.executable, str(BENCH), "--render", str(tmp_path / "bench-cpu-zen4.json"),
                         "--out", str(tmp_path)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert rr.returncode == 0, rr.stderr
    new = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert new[new.index(b):new.index(e)] == b + "\nthe first machine\n"
    zb, ze = "<!-- bench/cpu-zen4:begin -->", "<!-- bench/cpu-zen4:end -->"
    assert new.count(zb) == 1 and new.index(e) < new.index(zb) < new.index(ze)
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    assert new[new.index(zb) + len(zb):new.index(ze)] == md[md.index(b) + len(b):md.index(e)]
    for bad in ("Zen4", "../x", "", "a" * 33):
        rb = subprocess.run([sys.executable, str(BENCH), "--machine", bad, "--out", str(tmp_path)],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert rb.returncode == 2 and "--machine" in rb.stderr, (bad, rb.stderr)

def test_every_cell_measured_in_every_round(native):
    out, _ = native
    data = json.loads((out / "bench-cpu.json").read_text())
    m = data["meta"]
    assert m["isa"] == "native" and m["threads"] == 2 and m["steps"] == 6
    assert m["torch"]["torch"] and m["torch"]["torch_source"]
    for k in ("model", "extensions", "nproc"):
        assert k in m["cpu"]
    assert len(m["load_before"]) == 3 and len(m["load_after"]) == 3
    assert isinstance(m["perf"]["works"], bool)
    assert [(c["model"], c["batch"], c["amp"]) for c in data["configs"]] == [("cnn", 16, "off"), ("cnn", 16, "bf16")]
    for c in data["configs"]:
        for side in SIDES:
            runs = [r for r in c["runs"] if r["side"] == side]
            assert sorted(r["round"] for r in runs) == [0, 1], (c["amp"], side)
            for r in runs:
                if side == "compile" and r.get("unavailable"):
                    assert not m["torch"]["has_compile"]
                    continue
                assert number(r.get("samples_per_s")), (c["amp"], side, r)
                if side == "compile":
                    assert isinstance(r.get("compile_s"), (int, float)), r   # reported, never timed
        s = c["summary"]
        assert len(s["ratio_eager"]["per_round"]) == 2 and all(number(x) for x in s["ratio_eager"]["per_round"])
        assert number(s["ratio_eager"]["median"])
        if m["torch"]["has_compile"]:
            assert all(number(x) for x in s["ratio_compile"]["per_round"])
    # the rounds alternate: round 1 runs the cells in the reverse order of round 0
    c0 = [(c["amp"], r["side"], r["order"]) for c in data["configs"] for r in c["runs"] if r["round"] == 0]
    c1 = [(c["amp"], r["side"], r["order"]) for c in data["configs"] for r in c["runs"] if r["round"] == 1]
    first0 = min(c0, key=lambda x: x[2])
    last1 = max(c1, key=lambda x: x[2])
    assert first0[:2] == last1[:2]


def test_compile_unavailable_is_reported_not_failed(native):
    out, _ = native
    data = json.loads((out / "bench-cpu.json").read_text())
    md = (out / "benchmarks.md").read_text(encoding="utf-8")
    if data["meta"]["torch"]["has_compile"]:
        pytest.skip("this PyTorch has torch.compile")
    assert "unavailable (torch 1." in md
    assert "failed" not in md


def test_avx2_emulation(tmp_path, trainq):
    pytest.importorskip("torch")
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("no AVX2 on this CPU")
    run_bench(trainq, tmp_path, "--rounds", "1", "--amps", "off", "--isa", "avx2")
    data = json.loads((tmp_path / "bench-cpu-avx2.json").read_text())
    m = data["meta"]
    assert m["isa"] == "avx2" and m["label"] == "AVX2 emulated on an AVX-512 machine"
    assert m["isa_env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    ic = m["isa_check"]
    assert "AVX2" in ic["trainq"]["off"]["onednn_isa"], ic["trainq"]
    assert "AVX-512" not in ic["trainq"]["off"]["onednn_isa"]
    assert all(":avx2" in k or ":uni" in k or ":blk" in k or "ref" in k or "gemm" in k
               for k in ic["trainq"]["off"]["onednn_kernels"]), ic["trainq"]["off"]["onednn_kernels"]
    assert ic["trainq"]["off"]["openblas_core"] == "Haswell"
    if ic["torch"].get("onednn_isa"):
        assert "AVX2" in ic["torch"]["onednn_isa"] and "512" not in ic["torch"]["onednn_isa"]
    md = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert "<!-- bench/cpu-avx2:begin -->" in md
    assert "AVX2 emulated on an AVX-512 machine" in md
    # below AVX-512 trainq's Winograd kernels take resnet20's 3x3 stride-1 convolutions (where the
    # CPU has FMA and F16C): the probe sees oneDNN run none of them and records it
    flags = set(next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")).split())
    wino = "ran its own Winograd F(4×4, 3×3) (for the forward and backward-data ops; F(2×2, 3×3) for the filter gradient"
    if {"fma", "f16c"} <= flags:
        assert ic["trainq"]["winograd"] == ["off", "bf16"] and ic["trainq"]["bf16_via_f32"] is True, ic["trainq"]
        assert ic["trainq"]["winograd_reach"] == {"off": "all", "bf16": "all"}
        assert ic["trainq"]["off"]["onednn_convs"] > 0 and ic["trainq"]["off"]["onednn_convs_winograd_shaped"] == 0
        assert wino in md
    # a run recorded before the probe saw it: a re-render says nothing about Winograd
    del m["isa_check"]["trainq"]["winograd"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    rr = subprocess.run([sys.executable, str(BENCH), "--render", str(tmp_path / "old.json"), "--out", str(tmp_path)],
                        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert rr.returncode == 0, rr.stderr
    md = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert "AVX2 emulated on an AVX-512 machine" in md and wino not in md
