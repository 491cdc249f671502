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


def test_run_profile(trainq, tmp_path):
    """--profile FILE: the same training (the summary's loss, bit for bit), the steps after the
    warm-up timed op by op, a table on stderr, the JSON in FILE; a FILE that cannot be written
    is refused before anything trains."""
    spec = dict(SYN, model="resnet20", batch_size=16, steps=6, eval_every=3)
    plain = run(trainq, tmp_path, spec)
    prof = tmp_path / "profile.json"
    r = run(trainq, tmp_path, spec, "--profile", str(prof))
    assert plain.returncode == 0 and r.returncode == 0, r.stderr
    a, b = json.loads(plain.stdout), json.loads(r.stdout)
    assert a["final_loss"] == b["final_loss"] and a["val_loss"] == b["val_loss"]
    assert "trainq: profile of 3 steps after 3 warm-up (cpu, resnet20, off, batch 16 x 1" in r.stderr
    assert "conv_fwd" in r.stderr and "GFLOP/s" in r.stderr and "by kind: conv" in r.stderr
    p = json.loads(prof.read_text())
    assert p["steps_profiled"] == 3 and p["warmup_steps"] == 3 and p["model"] == "resnet20"
    assert p["step_ms_mean"] > 0 and p["op_ms_per_step"] > 0
    assert p["op_ms_per_step"] <= p["step_ms_mean"] * 1.05   # the ops are inside the steps
    assert abs(sum(p["ms_per_step_by_kind"].values()) - p["op_ms_per_step"]) < 1e-6 * p["op_ms_per_step"] + 1e-9
    ops = p["ops"]
    assert [o["ms_per_step"] for o in ops] == sorted((o["ms_per_step"] for o in ops), reverse=True)
    # resnet20: 21 convolutions (19 3x3 and two 1x1 projections), one forward and one filter
    # gradient each per step; the stem's input gradient is not needed
    fwd = sum(o["calls_per_step"] for o in ops if o["op"] == "conv_fwd")
    assert fwd == sum(o["calls_per_step"] for o in ops if o["op"] == "conv_bwd_filter")
    assert fwd == 21 or fwd == 19, fwd
    stem = [o for o in ops if o["op"] == "conv_fwd" and o["shape"].startswith("x 16x28x28x1 ")]
    assert len(stem) == 1 and stem[0]["flops_per_call"] == 2 * 16 * 28 * 28 * 16 * 1 * 3 * 3
    assert stem[0]["gflop_per_s"] > 0
    assert {"conv", "batchnorm", "optimizer", "data"} <= {o["kind"] for o in ops}
    assert not [o for o in ops if o["op"] in ("bn_fwd_infer", "softmax_ce_eval")]   # evals stay out
    bad = run(trainq, tmp_path, spec, "--profile", str(tmp_path / "no-such-dir" / "p.json"))
    assert bad.returncode == 2 and "--profile" in bad.stderr and "no-such-dir" in bad.stderr
    assert not bad.stdout


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


# ---------------------------------------------------------------- --help on every command
# What each command's --help says it takes, checked against what its parser takes: the commands
# come from `trainq --help` (a new one is covered as soon as it is listed there), the options
# from each --help; every listed option is fed to its command, with a value where it takes one,
# in a command line that gets past parsing and stops before any work (a spec that does not
# parse, an address that does not parse, a daemon that is not there), and must not be refused;
# every option-like string literal of the command's source file that --help does not list, and
# a made-up one, must be refused as "unknown option ... (trainq CMD --help ...)", exit 2.
import os      # noqa: E402
import re      # noqa: E402
import socket  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
REFUSED = ("unknown option", "unexpected argument", "needs a value", "takes no value",
           "as two arguments", "unknown or incomplete")


def sh(trainq, *args, cwd=None, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("TRAINQ_SERVER", "TRAINQ_SOCKET")}
    return subprocess.run([trainq] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60,
                          cwd=cwd, env=dict(e, **(env or {})))


def top_level(trainq):
    """{command: its synopsis lines in `trainq --help`}, and the set of client commands."""
    r = sh(trainq, "--help")
    assert r.returncode == 0 and r.stderr == "", r
    assert r.stdout == sh(trainq, "-h").stdout == sh(trainq, "help").stdout
    syn, client, cur, in_client = {}, set(), None, False
    for line in r.stdout.splitlines():
        m = re.match(r"(?:usage: |       )trainq (\S+)", line)
        if m:
            cur = m.group(1)
            syn[cur] = [line[7:]]
            if in_client:
                client.add(cur)
        elif line.startswith("client commands"):
            in_client, cur = True, None
        elif cur and line.startswith(" " * 8):
            syn[cur].append(line[7:])
        else:
            cur = None
    return syn, client


def help_options(text):
    """[(flag, alias, arg)] of a --help's options: section"""
    lines = text.splitlines()
    assert "options:" in lines, text
    out = []
    for line in lines[lines.index("options:") + 1:]:
        if not line.startswith("  "):
            break
        m = re.match(r"  (?:(-\w), )?(--[a-z][\w-]*)(?: (\S+))?(?:  |$)", line)
        assert m, "an options: line that is not an option: %r" % line
        out.append((m.group(2), m.group(1), m.group(3)))
    return out


def value_for(arg, tmp_path):
    first = arg.split("|")[0]
    if first != first.upper():          # a literal choice: auto, me, cpu, true
        return first
    f = tmp_path / "empty.conf"
    f.write_text("")
    return {"PATH": tmp_path / "x.db", "FILE": f, "DIR": tmp_path / "out", "MB": "64",
            "DURATION": "10m", "HOST:PORT": "127.0.0.1:1", "S": "queued", "GROUP": "root",
            "URL": "http://127.0.0.1:1", "BYTES": "0"}.get(first, "1")


def source_of(cmd):
    """The source file that defines the command's option table (its doc)."""
    pat = re.compile(r"\b(?:tq_doc_%s|%s_doc)\s*=\s*\{" % (cmd, cmd))
    for p in sorted((REPO / "daemon").glob("*.c")) + sorted((REPO / "client").glob("*.c")):
        if pat.search(p.read_text()):
            return p
    return None


def test_help_of_every_command(trainq, tmp_path):
    syn, client = top_level(trainq)
    expected = {"run", "plan", "devices", "version", "serve", "worker", "submit", "ls", "show",
                "logs", "steps", "cancel", "rm", "compare"}
    assert expected <= set(syn), sorted(syn)
    assert {"submit", "ls", "show", "logs", "steps", "cancel", "rm", "compare"} <= client
    man = REPO / "docs" / "trainq.1"      # the man page (make docs) names every command and option too
    man = man.read_text().replace("\\-", "-") if man.is_file() else None
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))     # bound, never listening: connections are refused
    server = "http://127.0.0.1:%d" % closed.getsockname()[1]
    bad_spec = tmp_path / "bad.json"
    bad_spec.write_text("{not json")
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    cwd = tmp_path / "cwd"
    cwd.mkdir()

    def base(cmd):
        """(arguments that get past parsing and stop before any work, what then shows it)"""
        if cmd in client:
            first = [spec] if cmd == "submit" else ([] if cmd == "ls" else ["1"])
            return first + ["--server", server], lambda r: r.returncode == 3 and "cannot reach" in r.stderr
        if cmd in ("run", "plan"):
            return [bad_spec, "--out", tmp_path / "out"] if cmd == "run" else [bad_spec], \
                lambda r: r.returncode == 2 and "invalid spec" in r.stderr
        if cmd == "serve":
            return ["--listen", "nope"], lambda r: r.returncode == 2 and "--listen wants" in r.stderr
        if cmd == "worker":
            return [], lambda r: r.returncode == 2 and "needs --db PATH and --job ID" in r.stderr
        return [], lambda r: r.returncode == 0

    try:
        for cmd in sorted(syn):
            r = sh(trainq, cmd, "--help", cwd=cwd)
            assert r.returncode == 0 and r.stderr == "", (cmd, r)
            assert r.stdout.startswith("usage: trainq %s" % cmd), (cmd, r.stdout)
            assert sh(trainq, cmd, "-h", cwd=cwd).stdout == r.stdout, cmd
            # the synopsis of --help is the line of `trainq --help`
            lines = r.stdout.splitlines()
            usage = [lines[0][7:]]
            for line in lines[1:]:
                if not line.startswith(" " * 8):
                    break
                usage.append(line[7:])
            assert usage == syn[cmd], (cmd, usage, syn[cmd])
            opts = help_options(r.stdout)
            flags = {f for f, _, _ in opts} | {a for _, a, _ in opts if a}
            assert {"--help", "-h"} <= flags, (cmd, flags)
            assert ("--server" in flags) == (cmd in client), (cmd, flags)
            # the synopsis shows every option but --help and --server, and nothing else
            shown = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", " ".join(syn[cmd])))
            assert shown == flags - {"--help", "-h", "--server"}, (cmd, shown, flags)

            if man is not None:
                assert "trainq " + cmd in man, "docs/trainq.1 lacks trainq %s" % cmd
                assert not [f for f in flags if f not in man], ("docs/trainq.1 lacks options of", cmd,
                                                                [f for f in flags if f not in man])

            args, past_parsing = base(cmd)
            for flag, alias, arg in opts:
                if flag == "--help":
                    continue
                for name in filter(None, (flag, alias)):
                    given = [name] + ([value_for(arg, tmp_path)] if arg else [])
                    r = sh(trainq, cmd, *given, *args, cwd=cwd)
                    assert not any(s in r.stderr for s in REFUSED), (cmd, given, r)
                    assert past_parsing(r), (cmd, given, r)

            src = source_of(cmd)
            assert src is not None, "no option table (tq_doc_%s or %s_doc) for %s" % (cmd, cmd, cmd)
            literals = set(re.findall(r'"(--?[a-z][a-z0-9-]*)', src.read_text()))
            for name in sorted((literals | {"--no-such-option", "-Z"}) - flags):
                r = sh(trainq, cmd, name, *args, cwd=cwd)
                assert r.returncode == 2, (cmd, name, r)
                assert "unknown option %s (trainq %s --help" % (name, cmd) in r.stderr, (cmd, name, r.stderr)
    finally:
        closed.close()
