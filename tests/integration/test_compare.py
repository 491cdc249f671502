"""GET /v1/compare against the real daemon: `trainq serve` on a free loopback port with a
temporary database, a few short cnn jobs on the synthetic set (amp off / bf16, accum_steps 1 / 2),
and every field of the comparison recomputed here from what /v1/jobs/{id}/steps and /evals
return (docs/api.md, "GET /v1/compare").

One daemon serves the whole module (the jobs take a few seconds on one core); every wait is
bounded and the daemon must exit 0 on SIGTERM at the end.
"""
import http.client
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINQ = Path(os.environ.get("TRAINQ_BIN", REPO / "build" / "trainq"))

pytestmark = pytest.mark.skipif(not (TRAINQ.is_file() and os.access(TRAINQ, os.X_OK)),
                                reason="%s is missing: build it first (make)" % TRAINQ)

SYN = {"dataset": "synthetic", "threads": 1, "device": "cpu",
       "synthetic": {"train": 256, "test": 64, "height": 28, "width": 28, "channels": 1}}


def cnn(**kw):
    """cnn on the synthetic set: ~30 ms a step on one core."""
    return dict(SYN, model="cnn", batch_size=32, **kw)


# A: the default baseline; B: bf16, with a post-training (pruned) eval after its last eval;
# C: accumulation and only 4 steps (<= 5: the medians are over every step)
SPECS = {
    "A": cnn(name="fp32", steps=8, eval_every=4),
    "B": cnn(name="bf16", steps=8, amp="bf16", eval_every=4, prune={"amount": 0.5}),
    "C": cnn(name="accum2", steps=4, accum_steps=2),
}
ROW_KEYS = {"id", "name", "state", "model", "dataset", "device", "amp", "batch_size",
            "accum_steps", "effective_batch", "steps", "skipped_steps", "samples_per_s",
            "step_ms_median", "peak_memory_bytes", "reserved_bytes", "device_peak_used_bytes",
            "final_loss", "val_loss", "val_accuracy", "wall_s", "vs_baseline"}
FINISHED = {"succeeded", "failed", "cancelled"}


# ---------------------------------------------------------------- the daemon
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


class Daemon:
    def __init__(self, state_dir):
        self.dir = Path(state_dir)
        self.log = self.dir / "serve.log"
        self.proc = None
        self.port = None

    def start(self, timeout=30):
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS")}
        for _ in range(3):
            self.port = free_port()
            with open(self.log, "ab") as f:
                self.proc = subprocess.Popen(
                    [str(TRAINQ), "serve", "--db", str(self.dir / "trainq.db"),
                     "--listen", "127.0.0.1:%d" % self.port, "--devices", "cpu"],
                    stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                    cwd=str(self.dir), start_new_session=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.request("GET", "/healthz", timeout=2)[0] == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.kill()
                pytest.fail("trainq serve not healthy after %d s:\n%s" % (timeout, self.tail()))
            if "in use" not in self.tail().lower():
                pytest.fail("trainq serve exited with %s:\n%s" % (self.proc.returncode, self.tail()))
        pytest.fail("trainq serve: no free port after 3 tries")

    def stop(self, timeout=60):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def tail(self, n=3000):
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def request(self, method, path, body=None, timeout=20):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {}
            if body is not None:
                body = json.dumps(body).encode()
                headers = {"Content-Type": "application/json"}
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def get(self, path, expect=200):
        status, headers, body = self.request("GET", path)
        assert status == expect, (path, status, body[:500], self.tail(1000))
        assert headers.get("content-type", "").startswith("application/json"), headers
        return json.loads(body)

    def submit(self, spec):
        status, _, body = self.request("POST", "/v1/jobs", spec)
        assert status == 201, (spec, status, body[:500])
        return json.loads(body)["id"]

    def wait_finished(self, jid, timeout=60):
        return wait_until(lambda: (lambda j: j if j["state"] in FINISHED else None)(
            self.get("/v1/jobs/%d" % jid)), timeout, "job %d to finish (%s)" % (jid, self.tail(800)))


@pytest.fixture(scope="module")
def daemon():
    with tempfile.TemporaryDirectory(prefix="trainq-compare-") as d:
        dm = Daemon(d).start()
        try:
            yield dm
        finally:
            rc = dm.stop()
            assert rc == 0, "trainq serve exited with %s on SIGTERM:\n%s" % (rc, dm.tail())


@pytest.fixture(scope="module")
def jobs(daemon):
    """{"A": id, "B": id, "C": id}, all succeeded."""
    ids = {k: daemon.submit(spec) for k, spec in SPECS.items()}
    for k, jid in ids.items():
        j = daemon.wait_finished(jid)
        assert j["state"] == "succeeded", j
    return ids


# ---------------------------------------------------------------- the expected values
def median_after_warmup(values):
    vals = values[5:] if len(values) > 5 else values
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def maximum(values):
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def expected_row(daemon, jid):
    """What the comparison must say about job jid, from its job object, steps and evals."""
    job = daemon.get("/v1/jobs/%d" % jid)
    steps = daemon.get("/v1/jobs/%d/steps?limit=100000" % jid)["steps"]
    evals = [e for e in daemon.get("/v1/jobs/%d/evals" % jid)["evals"] if e["kind"] == "eval"]
    spec = job["spec"]
    return {
        "id": jid, "name": job["name"], "state": job["state"], "model": spec["model"],
        "dataset": spec["dataset"], "device": job["device"], "amp": spec["amp"],
        "batch_size": spec["batch_size"], "accum_steps": spec["accum_steps"],
        "effective_batch": spec["batch_size"] * spec["accum_steps"],
        "steps": len(steps), "skipped_steps": sum(1 for s in steps if s["skipped"]),
        "samples_per_s": median_after_warmup([s["samples_per_s"] for s in steps]),
        "step_ms_median": median_after_warmup([s["step_ms"] for s in steps]),
        "peak_memory_bytes": maximum([s["mem_peak_bytes"] for s in steps]),
        "reserved_bytes": maximum([s["mem_reserved_bytes"] for s in steps]),
        "device_peak_used_bytes": maximum([s["device_used_bytes"] for s in steps]),
        "final_loss": steps[-1]["loss"] if steps else None,
        "val_loss": evals[-1]["loss"] if evals else None,
        "val_accuracy": evals[-1]["accuracy"] if evals else None,
        "wall_s": job["summary"]["wall_s"] if job["state"] in FINISHED and job["summary"] else None,
    }


def same(got, want):
    if want is None or got is None:
        return got is want
    if isinstance(want, float) or isinstance(got, float):
        return got == pytest.approx(want, rel=1e-12, abs=1e-12)
    return got == want


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def check_vs(row, base):
    vs = row["vs_baseline"]
    assert set(vs) == {"samples_per_s", "peak_memory_bytes", "val_accuracy_points"}, vs
    for k, want in (("samples_per_s", ratio(row["samples_per_s"], base["samples_per_s"])),
                    ("peak_memory_bytes", ratio(row["peak_memory_bytes"], base["peak_memory_bytes"])),
                    ("val_accuracy_points",
                     None if row["val_accuracy"] is None or base["val_accuracy"] is None
                     else 100.0 * (row["val_accuracy"] - base["val_accuracy"]))):
        assert same(vs[k], want), (row["id"], k, vs[k], want)


def compare(daemon, ids, baseline=None, expect=200):
    q = "ids=" + ",".join(str(i) for i in ids)
    if baseline is not None:
        q += "&baseline=%s" % baseline
    return daemon.get("/v1/compare?" + q, expect)


# ---------------------------------------------------------------- tests
def test_every_field_matches_steps_and_evals(daemon, jobs):
    order = [jobs["A"], jobs["B"], jobs["C"]]
    got = compare(daemon, order)
    assert set(got) == {"baseline", "jobs"}
    assert got["baseline"] == jobs["A"]          # default: the first id
    assert [r["id"] for r in got["jobs"]] == order
    rows = {r["id"]: r for r in got["jobs"]}
    for jid in order:
        row, want = rows[jid], expected_row(daemon, jid)
        assert set(row) == ROW_KEYS, sorted(set(row) ^ ROW_KEYS)
        for k, v in want.items():
            assert same(row[k], v), (jid, k, row[k], v)
    a, b, c = rows[jobs["A"]], rows[jobs["B"]], rows[jobs["C"]]
    # the specs went through: amp, accumulation, effective batch, step counts
    assert (a["amp"], b["amp"], c["amp"]) == ("off", "bf16", "off")
    assert (a["accum_steps"], c["accum_steps"], c["effective_batch"]) == (1, 2, 64)
    assert (a["steps"], b["steps"], c["steps"]) == (8, 8, 4)
    assert a["device"] == "cpu" and a["device_peak_used_bytes"] is None   # null on the CPU
    assert all(r["val_accuracy"] is not None and r["wall_s"] > 0 for r in (a, b, c))
    # a finished job: the comparison agrees with the job's own summary
    for jid in order:
        s = daemon.get("/v1/jobs/%d" % jid)["summary"]
        row = rows[jid]
        assert row["steps"] == s["steps"] and row["skipped_steps"] == s["skipped_steps"]
        assert row["peak_memory_bytes"] == s["peak_memory_bytes"]
        assert same(row["samples_per_s"], s["samples_per_s"])
        assert same(row["step_ms_median"], s["step_ms_median"])
        assert same(row["final_loss"], s["final_loss"])
        assert same(row["val_loss"], s["val_loss"]) and same(row["val_accuracy"], s["val_accuracy"])
    # B's last eval record is its pruned one: val_* are from the last "eval" record
    b_evals = daemon.get("/v1/jobs/%d/evals" % jobs["B"])["evals"]
    assert b_evals[-1]["kind"] == "pruned"
    # vs the default baseline A
    for r in (a, b, c):
        check_vs(r, a)
    assert a["vs_baseline"] == {"samples_per_s": 1, "peak_memory_bytes": 1, "val_accuracy_points": 0}
    assert b["vs_baseline"]["peak_memory_bytes"] < 1     # bf16 holds less memory


def test_baseline_parameter_and_order(daemon, jobs):
    order = [jobs["C"], jobs["A"], jobs["B"]]
    got = compare(daemon, order, baseline=jobs["B"])
    assert got["baseline"] == jobs["B"]
    assert [r["id"] for r in got["jobs"]] == order
    rows = {r["id"]: r for r in got["jobs"]}
    base = rows[jobs["B"]]
    for r in got["jobs"]:
        check_vs(r, base)
    assert base["vs_baseline"] == {"samples_per_s": 1, "peak_memory_bytes": 1,
                                   "val_accuracy_points": 0}
    # the baseline changes only the ratios
    plain = {r["id"]: r for r in compare(daemon, order)["jobs"]}
    for jid, r in rows.items():
        assert {k: v for k, v in r.items() if k != "vs_baseline"} == \
               {k: v for k, v in plain[jid].items() if k != "vs_baseline"}
    # a single job is its own baseline; HEAD answers like GET
    one = compare(daemon, [jobs["C"]])
    assert one["baseline"] == jobs["C"] and len(one["jobs"]) == 1
    assert daemon.request("HEAD", "/v1/compare?ids=%d" % jobs["C"])[0] == 200


def _err(daemon, query, status, field):
    st, headers, body = daemon.request("GET", "/v1/compare" + query)
    assert st == status, (query, st, body[:300])
    e = json.loads(body)["error"]
    assert set(e) >= {"code", "message"}, e
    assert e.get("field") == field, (query, e)
    return e


def test_errors(daemon, jobs):
    a, b = jobs["A"], jobs["B"]
    for query, field in [
        ("", "ids"),                                  # missing
        ("?ids=", "ids"),                             # empty
        ("?ids=%d,,%d" % (a, b), "ids"),              # empty item
        ("?ids=%d," % a, "ids"),                      # trailing comma
        ("?ids=%d,abc" % a, "ids"),                   # malformed
        ("?ids=1.5", "ids"), ("?ids=-1", "ids"), ("?ids=0", "ids"), ("?ids=+1", "ids"),
        ("?ids=%%20%d" % a, "ids"),                   # a space
        ("?ids=1234567890123456789", "ids"),          # too long
        ("?ids=%d,%d,%d" % (a, b, a), "ids"),         # duplicate
        ("?ids=" + ",".join(str(i) for i in range(1, 66)), "ids"),   # 65 > 64
        ("?ids=%d,%d&baseline=%d" % (a, b, jobs["C"]), "baseline"),  # not one of ids
        ("?ids=%d&baseline=x" % a, "baseline"),
        ("?ids=%d&baseline=" % a, "baseline"),
        ("?ids=%d&foo=1" % a, "foo"),                 # unknown parameter
        ("?ids=%d&ids=%d" % (a, b), "ids"),           # repeated parameter
    ]:
        e = _err(daemon, query, 400, field)
        assert e["code"] == "invalid_parameter", (query, e)
    assert "64" in _err(daemon, "?ids=" + ",".join(str(i) for i in range(1, 66)), 400, "ids")["message"]
    unknown = max(jobs.values()) + 1000
    e = _err(daemon, "?ids=%d,%d" % (a, unknown), 404, "ids")
    assert e["code"] == "not_found" and str(unknown) in e["message"]
    # 64 ids is the limit, not an error: the first unknown one is named
    e = _err(daemon, "?ids=%d," % a + ",".join(str(unknown + i) for i in range(63)), 404, "ids")
    assert str(unknown) in e["message"]
    # only GET
    for method in ("POST", "PUT", "DELETE"):
        st, headers, body = daemon.request(method, "/v1/compare?ids=%d" % a)
        assert st == 405, (method, st)
        assert headers.get("allow") == "GET, HEAD" and json.loads(body)["error"]["code"] == "method_not_allowed"


def test_running_and_queued_jobs(daemon, jobs):
    """A running job is compared from its rows so far; a queued one has no steps (nulls)."""
    run = daemon.submit(cnn(name="long", steps=20000))
    queued = daemon.submit(cnn(name="waiting", steps=20000))
    try:
        wait_until(lambda: (lambda j: j["state"] == "running" and j["progress"]["step"] >= 7)(
            daemon.get("/v1/jobs/%d" % run)), 30, "job %d to pass step 7" % run)
        got = compare(daemon, [run, queued, jobs["A"]], baseline=jobs["A"])
        r, q, a = got["jobs"]
        assert r["state"] == "running" and q["state"] == "queued"
        assert r["steps"] >= 7 and r["wall_s"] is None
        assert r["samples_per_s"] > 0 and r["peak_memory_bytes"] > 0
        assert r["final_loss"] is not None and math.isfinite(r["final_loss"])
        assert same(r["vs_baseline"]["samples_per_s"], r["samples_per_s"] / a["samples_per_s"])
        assert q["steps"] == 0 and q["skipped_steps"] == 0 and q["device"] is None
        for k in ("samples_per_s", "step_ms_median", "peak_memory_bytes", "reserved_bytes",
                  "device_peak_used_bytes", "final_loss", "val_loss", "val_accuracy", "wall_s"):
            assert q[k] is None, (k, q)
        assert q["vs_baseline"] == {"samples_per_s": None, "peak_memory_bytes": None,
                                    "val_accuracy_points": None}
        assert q["effective_batch"] == 32 and q["amp"] == "off"
    finally:
        for jid in (queued, run):
            daemon.request("POST", "/v1/jobs/%d/cancel" % jid)
    daemon.wait_finished(run, timeout=30)
    # once stopped, wall_s comes from its summary, and the rows still match
    want = expected_row(daemon, run)
    row = compare(daemon, [run])["jobs"][0]
    assert row["state"] == "cancelled" and row["wall_s"] is not None
    for k, v in want.items():
        assert same(row[k], v), (k, row[k], v)
