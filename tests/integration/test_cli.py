"""The command line as users see it: exit codes, the one summary line, plan output, the
SQLite columns of CONTRACT.md, bad specs naming their field, failed jobs carrying error.code."""
import json
import sqlite3
import subprocess

SYN = {"dataset": "synthetic", "threads": 2, "device": "cpu",
       "synthetic": {"train": 256, "test": 64, "height": 28, "width": 28, "channels": 1}}

STEP_COLUMNS = ["job_id", "step", "epoch", "loss", "lr", "loss_scale", "skipped", "step_ms",
                "samples_per_s", "mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes",
                "device_used_bytes", "time"]
EVAL_COLUMNS = ["job_id", "step", "epoch", "loss", "accuracy", "samples", "kind", "time"]
SUMMARY_KEYS = {"state", "steps", "samples", "epochs", "wall_s", "samples_per_s",
                "step_ms_median", "final_loss", "val_loss", "val_accuracy", "peak_memory_bytes",
                "predicted_peak_bytes", "device_peak_used_bytes", "skipped_steps",
                "final_loss_scale", "effective_batch", "amp", "device"}


def run(trainq, tmp_path, spec, *args, raw=None):
    p = tmp_path / "spec.json"
    p.write_text(raw if raw is not None else json.dumps(spec))
    return subprocess.run([trainq, "run", str(p)] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)


def test_run_db_and_summary(trainq, tmp_path):
    spec = dict(SYN, model="cnn", batch_size=32, steps=6, amp="fp16", eval_every=3)
    db = tmp_path / "r.db"
    r = run(trainq, tmp_path, spec, "--db", str(db), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().split("\n")
    assert len(lines) == 1
    s = json.loads(lines[0])
    assert SUMMARY_KEYS <= set(s)
    assert s["state"] == "succeeded" and s["steps"] == 6 and s["amp"] == "fp16"
    assert s["peak_memory_bytes"] == s["predicted_peak_bytes"]
    con = sqlite3.connect(str(db))
    cols = [r[1] for r in con.execute("pragma table_info(steps)")]
    assert cols == STEP_COLUMNS
    assert [r[1] for r in con.execute("pragma table_info(evals)")] == EVAL_COLUMNS
    rows = con.execute("select step, loss_scale, skipped, mem_peak_bytes, device_used_bytes "
                       "from steps order by step").fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r[1] == 65536.0 and r[2] == 0 and r[4] is None for r in rows)
    assert all(r[3] == s["predicted_peak_bytes"] for r in rows)
    evals = con.execute("select step, kind, samples from evals order by step").fetchall()
    assert evals == [(3, "eval", 64), (6, "eval", 64)]
    state, summary = con.execute("select state, summary from jobs").fetchone()
    assert state == "succeeded" and json.loads(summary)["steps"] == 6
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "checkpoint.safetensors").is_file()


def test_plan(trainq, tmp_path):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(dict(SYN, model="resnet20", batch_size=64, amp="bf16")))
    r = subprocess.run([trainq, "plan", str(p)], stdout=subprocess.PIPE, text=True)
    assert r.returncode == 0
    plan = json.loads(r.stdout)
    parts = ["params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
             "workspace_bytes"]
    assert plan["total_bytes"] == sum(plan[k] for k in parts)
    assert plan["model"] == "resnet20" and plan["amp"] == "bf16" and plan["batch_size"] == 64
    assert plan["accum_steps"] == 1 and plan["effective_batch"] == 64
    assert plan["planned_peak_bytes"] == plan["total_bytes"] + plan["data_bytes"]
    assert plan["batch_size_auto"] is False and "fits" not in plan
    # --memory-mb on an explicit spec only reports whether it fits
    for mb, fits in ((1, False), (100000, True)):
        r = subprocess.run([trainq, "plan", str(p), "--memory-mb", str(mb)], stdout=subprocess.PIPE,
                           text=True)
        assert r.returncode == 0
        assert json.loads(r.stdout)["fits"] is fits
    r = subprocess.run([trainq, "plan", "--help"], stdout=subprocess.PIPE, text=True)
    assert r.returncode == 0 and "usage: trainq plan" in r.stdout


def test_bad_specs_exit_2_naming_the_field(trainq, tmp_path):
    cases = [
        ('{"model": "cnn", "batch_size": 0}', "batch_size"),
        ('{"model": "vgg"}', "model"),
        ('{"btach_size": 3}', "btach_size"),
        ('{"steps": 3, "epochs": 1}', "steps"),
        ('{"optimizer": {"type": "sgd", "lr": -1}}', "optimizer.lr"),
        ('{"amp": "fp8"}', "amp"),
        ('{"model": "cnn",', ""),
        ('[1, 2]', ""),
    ]
    for text, field in cases:
        r = run(trainq, tmp_path, None, raw=text)
        assert r.returncode == 2, (text, r.stderr)
        assert r.stdout == ""
        if field:
            assert '"%s"' % field in r.stderr, (text, r.stderr)
    r = subprocess.run([trainq, "run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2
    r = subprocess.run([trainq, "run", str(tmp_path / "nope.json")], stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2 and "nope.json" in r.stderr


def test_failed_job_exit_1_with_error(trainq, tmp_path):
    r = run(trainq, tmp_path, {"model": "cnn", "data_dir": str(tmp_path / "missing"), "steps": 1})
    assert r.returncode == 1
    s = json.loads(r.stdout)
    assert s["state"] == "failed" and s["error"]["code"] == "data_not_found"
    assert "missing" in s["error"]["message"]
    big = dict(SYN, model="resnet50", batch_size=128, steps=1, max_memory_mb=100)
    r = run(trainq, tmp_path, big)
    assert r.returncode == 1
    s = json.loads(r.stdout)
    assert s["error"]["code"] == "memory_limit" and "max_memory_mb 100" in s["error"]["message"]


def test_cifar10_binary_with_augmentation(trainq, tmp_path):
    """A small CIFAR-10 in the binary format (label byte + 3072 CHW bytes per record): resnet20
    trains on it with crop+flip (augment defaults to true for cifar10) and resumes."""
    import random
    rnd = random.Random(0)
    d = tmp_path / "cifar"
    d.mkdir()
    for name, n in (("data_batch_1.bin", 256), ("test_batch.bin", 64)):
        with open(d / name, "wb") as f:
            for i in range(n):
                label = i % 10
                f.write(bytes([label]) + bytes(rnd.randrange(256) // (label + 1) for _ in range(3072)))
    spec = {"model": "resnet20", "dataset": "cifar10", "data_dir": str(d), "batch_size": 32,
            "steps": 4, "threads": 2, "device": "cpu", "checkpoint_every": 2}
    r = run(trainq, tmp_path, spec, "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["state"] == "succeeded" and s["steps"] == 4 and s["val_loss"] > 0
    spec_json = json.loads((tmp_path / "spec.json").read_text())
    assert spec_json["dataset"] == "cifar10"
    # a missing test_batch.bin is a failed job naming the file
    (d / "test_batch.bin").unlink()
    r = run(trainq, tmp_path, spec)
    assert r.returncode == 1
    err = json.loads(r.stdout)["error"]
    assert "test_batch.bin" in err["message"]
