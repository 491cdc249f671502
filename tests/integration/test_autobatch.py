"""batch_size "auto": trainq picks the largest micro-batch that divides effective_batch and
whose plan fits the memory cap, and trains exactly what the same spec with that batch_size and
accum_steps given explicitly trains."""
import json
import sqlite3
import subprocess

MIB = 1 << 20
SYN = {"dataset": "synthetic", "model": "resnet20", "threads": 2, "device": "cpu",
       "synthetic": {"train": 512, "test": 64, "height": 32, "width": 32, "channels": 3},
       "steps": 5, "shuffle": False}
AUTO = dict(SYN, effective_batch=256, batch_size="auto", max_memory_mb=60)


def write(tmp_path, name, spec):
    p = tmp_path / name
    p.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return str(p)


def trainq_run(trainq, *args):
    return subprocess.run([trainq] + [str(a) for a in args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)


def steps(db):
    con = sqlite3.connect(str(db))
    rows = con.execute("select step, loss, mem_peak_bytes from steps order by step").fetchall()
    con.close()
    return rows


def test_auto_picks_a_fitting_batch_and_trains_as_the_explicit_one(trainq, tmp_path):
    spec = write(tmp_path, "auto.json", AUTO)
    r = trainq_run(trainq, "plan", spec)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    b, k = plan["batch_size"], plan["accum_steps"]
    assert b * k == 256 and plan["effective_batch"] == 256 and plan["batch_size_auto"] is True
    assert plan["planned_peak_bytes"] == plan["total_bytes"] + plan["data_bytes"]
    assert plan["planned_peak_bytes"] <= 60 * MIB and plan["fits"] is True
    # the largest that fits: twice the micro-batch does not
    bigger = trainq_run(trainq, "plan", write(tmp_path, "x2.json",
                                              dict(SYN, batch_size=2 * b, max_memory_mb=60)))
    assert bigger.returncode == 0 and json.loads(bigger.stdout)["fits"] is False
    # --memory-mb overrides max_memory_mb: a smaller cap, a smaller micro-batch
    small = trainq_run(trainq, "plan", spec, "--memory-mb", "20")
    assert small.returncode == 0, small.stderr
    sp = json.loads(small.stdout)
    assert sp["batch_size"] < b and sp["batch_size"] * sp["accum_steps"] == 256
    assert sp["planned_peak_bytes"] <= 20 * MIB

    r = trainq_run(trainq, "run", spec, "--db", tmp_path / "auto.db", "--out", tmp_path / "auto")
    assert r.returncode == 0, r.stderr
    assert "batch_size auto: micro-batch %d x accum_steps %d = 256" % (b, k) in r.stderr
    s = json.loads(r.stdout)
    assert s["state"] == "succeeded" and s["steps"] == 5 and s["effective_batch"] == 256
    auto_steps = steps(tmp_path / "auto.db")
    assert [x[0] for x in auto_steps] == [1, 2, 3, 4, 5]
    assert all(x[2] <= 60 * MIB for x in auto_steps)
    con = sqlite3.connect(str(tmp_path / "auto.db"))
    stored = json.loads(con.execute("select spec from jobs").fetchone()[0])
    con.close()
    assert stored["batch_size"] == "auto" and stored["accum_steps"] == k
    assert stored["effective_batch"] == 256

    explicit = dict(SYN, batch_size=b, accum_steps=k, max_memory_mb=60)
    r = trainq_run(trainq, "run", write(tmp_path, "explicit.json", explicit), "--db",
                   tmp_path / "explicit.db", "--out", tmp_path / "explicit")
    assert r.returncode == 0, r.stderr
    assert steps(tmp_path / "explicit.db") == auto_steps
    assert ((tmp_path / "auto" / "model.safetensors").read_bytes() ==
            (tmp_path / "explicit" / "model.safetensors").read_bytes())


def test_a_cap_below_micro_batch_1_cannot_fit(trainq, tmp_path):
    spec = write(tmp_path, "tiny.json", dict(AUTO, max_memory_mb=1))
    r = trainq_run(trainq, "plan", spec)
    assert r.returncode == 1 and r.stdout == ""
    assert "trainq plan: cannot_fit: even a micro-batch of 1 plans " in r.stderr
    one = trainq_run(trainq, "plan", write(tmp_path, "one.json", dict(SYN, batch_size=1)))
    need = json.loads(one.stdout)
    need = need["total_bytes"] + need["data_bytes"]
    assert "%d bytes" % need in r.stderr and "%d bytes" % MIB in r.stderr
    assert "max_memory_mb 1" in r.stderr
    r = trainq_run(trainq, "plan", write(tmp_path, "auto.json", AUTO), "--memory-mb", "1")
    assert r.returncode == 1 and "--memory-mb 1" in r.stderr

    r = trainq_run(trainq, "run", spec, "--db", tmp_path / "t.db")
    assert r.returncode == 1
    lines = r.stdout.strip().split("\n")
    assert len(lines) == 1
    s = json.loads(lines[0])
    assert s["state"] == "failed" and s["error"]["code"] == "cannot_fit"
    assert "%d bytes" % need in s["error"]["message"]
    con = sqlite3.connect(str(tmp_path / "t.db"))
    assert con.execute("select state from jobs").fetchone()[0] == "failed"
    con.close()


def test_bad_inputs_exit_2_naming_the_field(trainq, tmp_path):
    cases = [
        (dict(SYN, batch_size="auto"), "batch_size"),
        (dict(SYN, batch_size="big", effective_batch=256), "batch_size"),
        (dict(SYN, effective_batch=256), "effective_batch"),
        (dict(SYN, batch_size=48, effective_batch=256), "effective_batch"),
        (dict(SYN, batch_size="auto", effective_batch=0), "effective_batch"),
        (dict(SYN, batch_size="auto", effective_batch=67108865), "effective_batch"),
        (dict(SYN, batch_size=32, accum_steps=4, effective_batch=256), "accum_steps"),
        (dict(SYN, batch_size="auto", accum_steps=3, effective_batch=256), "accum_steps"),
    ]
    for spec, field in cases:
        p = write(tmp_path, "bad.json", spec)
        for cmd in ("plan", "run"):
            r = trainq_run(trainq, cmd, p)
            assert r.returncode == 2, (cmd, spec, r.stderr)
            assert r.stdout == ""
            assert 'field "%s"' % field in r.stderr, (cmd, spec, r.stderr)
    good = write(tmp_path, "auto.json", AUTO)
    for bad in ("0", "-5", "1.5", "lots", ""):
        r = trainq_run(trainq, "plan", good, "--memory-mb", bad)
        assert r.returncode == 2 and "--memory-mb" in r.stderr, (bad, r.stderr)
    r = trainq_run(trainq, "plan", good, "--memory-mb")
    assert r.returncode == 2 and "--memory-mb" in r.stderr
    r = trainq_run(trainq, "plan", "--help")
    assert r.returncode == 0 and "--memory-mb" in r.stdout
