"""bench/ab: trainq against itself under two environments, interleaved rounds (never a speed):
the table and the JSON carry every round of both sides and their paired ratios; a run that fails
is named and makes the exit status 1; a malformed environment is refused."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AB = REPO / "bench" / "ab"


def ab(*args):
    return subprocess.run([sys.executable, str(AB)] + list(args), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


def test_two_environments_paired(trainq, tmp_path):
    r = ab("-", "TQ_FUSE=0,TQ_CPU_WINOGRAD=", "--models", "cnn", "--batches", "8", "--amps", "off,bf16",
           "--rounds", "2", "--steps", "7", "--trainq", trainq, "--json", str(tmp_path / "ab.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "A: (unchanged); B: TQ_FUSE=0, TQ_CPU_WINOGRAD=" in r.stdout
    assert "AVX2 " in r.stdout and "AMX" in r.stdout   # the CPU's vector extensions, yes or no
    rows = [l for l in r.stdout.splitlines() if l.startswith("| cnn | 8 |")]
    assert len(rows) == 2 and "| fp32 |" in rows[0] and "| bf16 |" in rows[1]
    assert all("×" in l for l in rows)
    d = json.loads((tmp_path / "ab.json").read_text())
    assert d["b"] == {"TQ_FUSE": "0", "TQ_CPU_WINOGRAD": ""} and d["rounds"] == 2
    for c in d["cells"]:
        assert len(c["A"]) == 2 and len(c["B"]) == 2 and len(c["ratio"]) == 2 and not c["errors"]
        assert all(x > 0 for x in c["A"] + c["B"])
        assert c["ratio"][0] == pytest.approx(c["B"][0] / c["A"][0])


def test_two_builds(trainq, tmp_path):
    # --trainq-b: side B runs another binary (here a wrapper that logs each run, then execs
    # trainq); A keeps --trainq's
    log = tmp_path / "b.log"
    wrapper = tmp_path / "trainq-b"
    wrapper.write_text("#!/bin/sh\necho \"$@\" >> %s\nexec %s \"$@\"\n" % (log, trainq))
    wrapper.chmod(0o755)
    r = ab("-", "-", "--models", "cnn", "--batches", "8", "--amps", "off", "--rounds", "2", "--steps", "7",
           "--trainq", trainq, "--trainq-b", str(wrapper), "--json", str(tmp_path / "ab.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "A %s, B %s" % (trainq, wrapper) in r.stdout
    assert len(log.read_text().splitlines()) == 2   # one B run a round
    d = json.loads((tmp_path / "ab.json").read_text())
    assert d["trainq_a"] == trainq and d["trainq_b"] == str(wrapper) and len(d["cells"][0]["ratio"]) == 2
    bad = ab("-", "-", "--trainq", trainq, "--trainq-b", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "--trainq-b" in bad.stderr


def test_failures_and_bad_arguments(tmp_path):
    r = ab("-", "-", "--models", "cnn", "--batches", "8", "--amps", "off", "--rounds", "1", "--steps", "7",
           "--trainq", "/bin/false")
    assert r.returncode == 1 and "round 1 A:" in r.stdout and "| cnn | 8 | fp32 | — | — | — |" in r.stdout
    bad = ab("TQ_FUSE", "-")
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
    assert ab("-", "-", "--steps", "5").returncode == 2


def test_ops_table_per_op(trainq, tmp_path):
    # --ops: each run profiled; per cell the ops that took A the most, each side's ms per call
    # and B's paired speed-up; the JSON keeps every round's op table
    r = ab("TQ_CPU_WINO_TILE=2,TQ_CPU_WINOGRAD=1", "TQ_CPU_WINOGRAD=1", "--models", "resnet20", "--batches", "4",
           "--amps", "off", "--rounds", "2", "--steps", "7", "--trainq", trainq, "--ops", "3",
           "--json", str(tmp_path / "ab.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "Per op (`trainq run --profile`" in out and "resnet20 b4 fp32:" in out
    rows = [l for l in out.split("resnet20 b4 fp32:", 1)[1].splitlines() if l.startswith("| conv")]
    assert len(rows) == 3, out
    for l in rows:
        cells = [x.strip() for x in l.strip("|").split("|")]
        assert cells[1] == "f32" and float(cells[3]) > 0 and float(cells[4]) > 0 and "×" in cells[5]
    d = json.loads((tmp_path / "ab.json").read_text())
    ops = d["cells"][0]["ops"]
    assert len(ops) == 2 and set(ops[0]) == {"A", "B"}
    assert any(k.startswith("conv_fwd|f32|") for k in ops[0]["A"])
    assert ab("-", "-", "--ops", "-1").returncode == 2


def test_spec_fields_per_side(trainq, tmp_path):
    # --spec-a/--spec-b lay job-spec fields over one side's spec: with recompute on for A and off
    # for B, B's profiles have no bn_norm (the recomputation) while A's have
    r = ab("-", "-", "--spec-a", '{"recompute": true}', "--spec-b", '{"recompute": false}', "--models", "resnet20", "--batches", "4",
           "--amps", "off", "--rounds", "1", "--steps", "7", "--trainq", trainq, "--ops", "1",
           "--json", str(tmp_path / "ab.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'A: spec {"recompute": true}; B: spec {"recompute": false}' in r.stdout
    d = json.loads((tmp_path / "ab.json").read_text())
    assert d["spec_b"] == {"recompute": False} and d["spec_a"] == {"recompute": True}
    ops = d["cells"][0]["ops"][0]
    assert any(k.startswith("bn_norm|") for k in ops["A"])
    assert not any(k.startswith("bn_norm|") for k in ops["B"])
    for bad in ("{recompute}", "[1]"):
        b = ab("-", "-", "--spec-b", bad)
        assert b.returncode == 2 and "--spec-b" in b.stderr
