"""The daemon as users and systemd see it: the real `trainq serve` on a free loopback port with
a temporary database, driven over HTTP (CONTRACT.md: HTTP API, job object, step/eval records,
database; the daemon issue's "What must be shown").

Every wait is bounded; every daemon is stopped with SIGTERM at the end of its test and must
exit 0 (killed when it does not). The module skips while `trainq serve` does not exist yet.

Assumptions beyond CONTRACT.md, from DESIGN.md and the issue: job files live in
<dir of the db>/jobs/<id>/ (model.safetensors, checkpoint.safetensors); the per-job child is
`trainq worker --db PATH --job ID`; `--devices cpu` is one device that runs one job at a time;
a malformed id (`/v1/jobs/abc`) is a 400, an unknown one a 404.
"""
import csv
import datetime
import http.client
import io
import itertools
import json
import os
import re
import select
import signal
import socket
import sqlite3
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINQ = Path(os.environ.get("TRAINQ_BIN", REPO / "build" / "trainq"))
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def _serve_missing():
    """A reason to skip, or None when `trainq serve` exists."""
    if not (TRAINQ.is_file() and os.access(TRAINQ, os.X_OK)):
        return "%s is missing: build it first (make)" % TRAINQ
    with tempfile.TemporaryDirectory() as d:   # should --help start a server, it writes here
        try:
            r = subprocess.run([str(TRAINQ), "serve", "--help"], cwd=d, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=10)
        except subprocess.TimeoutExpired:
            return None                         # it ran as a server: serve exists
    if "unknown command" in r.stdout:
        return "`trainq serve` is not implemented yet (%s says: unknown command)" % TRAINQ
    return None


_SKIP = _serve_missing()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

# ---------------------------------------------------------------- specs and contract fields
SYN = {"dataset": "synthetic", "threads": 1, "device": "cpu",
       "synthetic": {"train": 256, "test": 64, "height": 28, "width": 28, "channels": 1}}


def small(steps=8, **kw):
    """mlp on the synthetic set: ~2 ms a step."""
    return dict(SYN, model="mlp", batch_size=32, steps=steps, **kw)


def medium(steps=40, **kw):
    """cnn on the synthetic set: ~25-30 ms a step on one core."""
    return dict(SYN, model="cnn", batch_size=32, steps=steps, **kw)


def long_job(**kw):
    """A job that runs for minutes: always cancelled, stopped or killed by the test."""
    return medium(steps=20000, **kw)


JOB_KEYS = {"id", "name", "state", "spec", "created_at", "started_at", "finished_at",
            "attempts", "device", "progress", "latest"}
STATES = {"queued", "running", "succeeded", "failed", "cancelled"}
STEP_FIELDS = ["step", "epoch", "loss", "lr", "loss_scale", "skipped", "step_ms",
               "samples_per_s", "mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes",
               "device_used_bytes", "time"]
EVAL_FIELDS = ["step", "epoch", "loss", "accuracy", "samples", "kind"]
SUMMARY_KEYS = {"state", "steps", "samples", "epochs", "wall_s", "samples_per_s",
                "step_ms_median", "final_loss", "val_loss", "val_accuracy", "peak_memory_bytes",
                "predicted_peak_bytes", "device_peak_used_bytes", "skipped_steps",
                "final_loss_scale", "effective_batch", "amp", "device"}
_LOG_IDS = itertools.count()
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]00:00)$")


def parse_time(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))


# ---------------------------------------------------------------- HTTP and the daemon process
class Resp:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    @property
    def ctype(self):
        return self.headers.get("content-type", "")

    def json(self):
        return json.loads(self.body.decode())

    def __repr__(self):
        return "<HTTP %d %s %r>" % (self.status, self.ctype, self.body[:300])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what, interval=0.05):
    """pred() until it returns something truthy; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


class Daemon:
    def __init__(self, state_dir, env=None, devices="cpu", args=()):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = self.dir / "trainq.db"
        base = {k: v for k, v in os.environ.items()
                if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS")}
        self.env = dict(base, **(env or {}))
        self.devices = devices
        self.args = list(args)
        self.proc = None
        self.port = None
        self.logs = []

    # -- process
    def start(self, timeout=30):
        for attempt in range(3):
            self.port = free_port()
            log = self.dir / ("serve-%d.log" % next(_LOG_IDS))
            self.logs.append(log)
            with open(log, "wb") as f:
                self.proc = subprocess.Popen(
                    [str(TRAINQ), "serve", "--db", str(self.db),
                     "--listen", "127.0.0.1:%d" % self.port, "--devices", self.devices] + self.args,
                    stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                    env=self.env, cwd=str(self.dir), start_new_session=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    if self.request("GET", "/healthz", timeout=2).status == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.kill9()
                pytest.fail("trainq serve not healthy after %d s:\n%s" % (timeout, self.log_tail()))
            if "in use" not in self.log_tail().lower():   # lost the port race: try another
                pytest.fail("trainq serve exited with %s at start:\n%s"
                            % (self.proc.returncode, self.log_tail()))
        pytest.fail("trainq serve: no free port after 3 tries")

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=90):
        """Signal serve, wait for it; returns the exit status (kills it on timeout)."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            pytest.fail("trainq serve still running %d s after signal %d:\n%s"
                        % (timeout, sig, self.log_tail()))

    def kill9(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # serve and any worker left in its group
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def log_tail(self, n=4000):
        return "".join(l.read_text(errors="replace") for l in self.logs if l.exists())[-n:]

    # -- HTTP
    def request(self, method, path, body=None, headers=None, host=None, timeout=20):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = dict({"Content-Type": "application/json"}, **(headers or {}))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", host if host is not None else "127.0.0.1:%d" % self.port)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            if body is not None or method in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body or b"")))
            conn.endheaders(body)
            r = conn.getresponse()
            return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()

    def get(self, path, expect=200):
        r = self.request("GET", path)
        assert r.status == expect, (path, r, self.log_tail())
        return r.json() if "json" in r.ctype else r

    def submit(self, spec, expect=201, **kw):
        r = self.request("POST", "/v1/jobs", spec, **kw)
        assert r.status == expect, (spec, r, self.log_tail())
        assert r.ctype.startswith("application/json"), r
        return r.json()

    def job(self, jid):
        return self.get("/v1/jobs/%d" % jid)

    def wait_state(self, jid, states, timeout=60):
        states = {states} if isinstance(states, str) else set(states)
        return wait_until(lambda: (lambda j: j if j["state"] in states else None)(self.job(jid)),
                          timeout, "job %d to be %s (%s)" % (jid, "/".join(sorted(states)),
                                                              self.log_tail(1500)))

    def wait_step(self, jid, step, timeout=60):
        """Until job jid is running with progress.step >= step; returns the job."""
        def pred():
            j = self.job(jid)
            assert j["state"] in ("queued", "running"), j
            return j if j["state"] == "running" and j["progress"]["step"] >= step else None
        return wait_until(pred, timeout, "job %d to pass step %d" % (jid, step))

    def steps(self, jid, query="limit=1000"):
        return self.get("/v1/jobs/%d/steps?%s" % (jid, query))["steps"]

    # -- files and database
    def job_dir(self, jid):
        return self.dir / "jobs" / str(jid)

    def query(self, sql, args=()):
        con = sqlite3.connect(str(self.db), timeout=10)
        try:
            con.execute("pragma query_only = 1")
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute(sql, args)]
        finally:
            con.close()


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def gone(pid):
    return proc_state(pid) in (None, "Z", "X")


def worker_pids(d, jid=None):
    """Live `trainq worker ... --job ID` processes that belong to daemon d (found via /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0")]
            with open("/proc/%d/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "worker" not in args or "--job" not in args or gone(pid):
            continue
        i = args.index("--job")
        if i + 1 >= len(args) or (jid is not None and args[i + 1] != str(jid)):
            continue
        ours = ppid == d.pid
        if "--db" in args and args.index("--db") + 1 < len(args):
            p = args[args.index("--db") + 1]
            ours = ours or os.path.realpath(os.path.join("/proc/%d/cwd" % pid, p)) == \
                os.path.realpath(d.db) or os.path.realpath(p) == os.path.realpath(d.db)
        if ours:
            found.append(pid)
    return found


def the_worker(d, jid, timeout=30):
    pids = wait_until(lambda: worker_pids(d, jid), timeout, "the worker of job %d" % jid)
    assert len(pids) == 1, pids
    return pids[0]


@pytest.fixture
def make_daemon(tmp_path):
    """make_daemon(state_dir=None, env=None) -> a started Daemon. At the end of the test every
    daemon still running gets SIGTERM and must exit 0; workers left behind are killed."""
    made = []

    def make(state_dir=None, env=None, args=(), devices="cpu"):
        d = Daemon(state_dir or tmp_path / "state", env=env, devices=devices, args=args)
        made.append(d)
        return d.start()

    yield make
    problems = []
    for d in made:
        if d.alive():
            try:
                rc = d.stop(signal.SIGTERM, timeout=90)
            except BaseException as e:   # pytest.fail inside stop
                problems.append("serve did not stop: %s" % e)
                continue
            if rc != 0:
                problems.append("serve exited %s after SIGTERM:\n%s" % (rc, d.log_tail()))
    for d in made:
        # libmicrohttpd's own complaints about how it was started would reach every journal
        log = d.log_tail(n=10**7)
        if "standard MHD logger" in log or "MHD_OPTION" in log:
            problems.append("libmicrohttpd complained about its options:\n%s" % log[:2000])
        for pid in worker_pids(d):
            problems.append("worker %d outlived its daemon" % pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print("---- trainq serve log (%s)\n%s" % (d.dir, d.log_tail()))
    assert not problems, "\n".join(problems)


@pytest.fixture
def daemon(make_daemon):
    return make_daemon()


def check_error(r, status, field=None):
    """r is an error response with this status and the contract's error object."""
    assert r.status == status, r
    assert r.ctype.startswith("application/json"), r
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err.get("code"), str) and err["code"], body
    assert isinstance(err.get("message"), str) and err["message"], body
    assert set(err) <= {"code", "message", "field"}, body
    if field is not None:
        assert err.get("field") == field, (field, body)
    return err


def device_jobs(dev):
    """Job ids a /v1/devices entry names under any key with "job" in it (an id, a job object,
    or a list of either)."""
    out = []
    for k, v in dev.items():
        if "job" not in k:
            continue
        for x in (v if isinstance(v, list) else [v]):
            out.append(x.get("id") if isinstance(x, dict) else x)
    return out


def safetensors_names(data):
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return set(k for k in header if k != "__metadata__")


# ---------------------------------------------------------------- service endpoints
METRIC_LINE = re.compile(r'^[A-Za-z_:][A-Za-z0-9_:]*(\{([A-Za-z_][A-Za-z0-9_]*="([^"\\]|\\.)*"'
                         r'(,[A-Za-z_][A-Za-z0-9_]*="([^"\\]|\\.)*")*,?)?\})? '
                         r'(-?[0-9.eE+-]+|[+-]?Inf|NaN)( -?\d+)?$')


def check_prometheus(text):
    samples = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            m = re.match(r"^# (HELP|TYPE) ([A-Za-z_:][A-Za-z0-9_:]*)( (.*))?$", line)
            if m and m.group(1) == "TYPE":
                assert m.group(4) in ("counter", "gauge", "histogram", "summary", "untyped"), line
            continue
        assert METRIC_LINE.match(line), "not Prometheus text: %r" % line
        samples.append(line)
    assert samples, "no samples in /metrics"
    return samples


def test_healthz_devices_metrics(daemon):
    r = daemon.request("GET", "/healthz")
    assert r.status == 200 and r.ctype.startswith("application/json"), r
    assert r.json()["status"] == "ok"

    devs = daemon.get("/v1/devices")
    assert isinstance(devs, dict) and isinstance(devs.get("devices"), list), devs
    assert devs["devices"] and all("id" in x for x in devs["devices"]), devs
    assert "cpu" in [x["id"] for x in devs["devices"]], devs

    r = daemon.request("GET", "/metrics")
    assert r.status == 200, r
    assert r.ctype.startswith("text/plain"), r      # text/plain; version=0.0.4
    check_prometheus(r.body.decode())


def test_devices_and_gpu_refusal(make_daemon, tmp_path):
    """A job naming a GPU the daemon cannot give it is refused at submit (422
    device_unavailable, field "device", the reason in the message) and no job is created;
    /v1/devices lists each device with the job it runs and says why no GPU is used."""
    d = make_daemon()                                   # --devices cpu
    for dev in ("cuda", "cuda:0", "cuda:3"):
        err = check_error(d.request("POST", "/v1/jobs", small(device=dev)), 422, "device")
        assert err["code"] == "device_unavailable" and "--devices cpu" in err["message"], err
    assert d.get("/v1/jobs")["jobs"] == []
    devs = d.get("/v1/devices")
    assert [x["id"] for x in devs["devices"]] == ["cpu"] and "not used" in devs["cuda"], devs

    a = make_daemon(state_dir=tmp_path / "auto", devices="auto")
    devs = a.get("/v1/devices")
    gpus = [x for x in devs["devices"] if x["backend"] == "cuda"]
    for g in gpus:
        assert g["id"].startswith("cuda:") and g["name"] and g["arch"].startswith("sm_"), g
        assert 0 < g["memory_free_bytes"] <= g["memory_total_bytes"], g
    if gpus:
        assert devs["cuda"] == "available", devs
        err = check_error(a.request("POST", "/v1/jobs", small(device="cuda:%d" % len(gpus))), 422, "device")
        assert "does not exist" in err["message"], err
    else:                                              # no GPU here: the probe's reason, verbatim
        assert devs["cuda"] and devs["cuda"] != "available", devs
        err = check_error(a.request("POST", "/v1/jobs", small(device="cuda:0")), 422, "device")
        assert err["code"] == "device_unavailable" and devs["cuda"] in err["message"], err
    job = a.submit(small(device="auto", steps=5000))
    want = gpus[0]["id"] if gpus else "cpu"
    wait_until(lambda: a.get("/v1/jobs/%d" % job["id"])["state"] == "running", 60, "job running")
    seen = wait_until(lambda: [x for x in a.get("/v1/devices")["devices"] if x.get("job") == job["id"]],
                      60, "the running job on /v1/devices")
    assert [x["id"] for x in seen] == [want], seen
    a.request("POST", "/v1/jobs/%d/cancel" % job["id"])
    j = wait_until(lambda: (lambda j: j if j["state"] != "running" else None)(a.get("/v1/jobs/%d" % job["id"])),
                   60, "job stopped")
    assert j["device"] == want, j


def test_config_example_is_accepted(make_daemon):
    """systemd/trainq.conf.example, as `make install` ships it, parses (the command line's
    --listen and --devices win over its values)."""
    d = make_daemon(args=["--config", str(REPO / "systemd" / "trainq.conf.example")])
    assert d.get("/healthz")["status"] == "ok"


# ---------------------------------------------------------------- the life of a job
def test_submit_run_succeed_steps_csv_and_database(daemon):
    spec = medium(steps=40, eval_every=20, name="walk-through")
    job = daemon.submit(spec, headers={"Accept": "application/json"})   # what curl --json sends
    jid = job["id"]
    assert isinstance(jid, int) and jid > 0
    assert JOB_KEYS <= set(job), set(job) ^ JOB_KEYS
    assert job["state"] in ("queued", "running") and job["name"] == "walk-through"
    s = job["spec"]                                   # defaults filled in
    assert s["model"] == "cnn" and s["steps"] == 40 and s["batch_size"] == 32
    assert s["seed"] == 0 and s["accum_steps"] == 1 and s["amp"] == "off" and s["priority"] == 0
    assert s["optimizer"]["type"] == "sgd" and s["optimizer"]["lr"] == 0.05
    assert RFC3339.match(job["created_at"]) and job["finished_at"] is None
    if job["state"] == "queued":
        assert isinstance(job["queue_position"], int)

    seen = set()
    def done():
        j = daemon.job(jid)
        seen.add(j["state"])
        assert j["state"] in ("queued", "running", "succeeded"), j
        p = j["progress"]
        assert p["total_steps"] == 40 and 0 <= p["step"] <= 40, j
        if j["state"] == "running":
            assert j["started_at"] and j["finished_at"] is None and j["device"] == "cpu", j
            assert j["latest"] is None or j["latest"]["step"] == p["step"], j
        return j if j["state"] == "succeeded" else None
    job = wait_until(done, 60, "job %d to succeed" % jid, interval=0.02)
    assert "running" in seen, seen

    assert job["progress"]["step"] == 40 and job.get("error") is None
    assert parse_time(job["created_at"]) <= parse_time(job["started_at"]) \
        <= parse_time(job["finished_at"])
    summary = job["summary"]
    assert SUMMARY_KEYS <= set(summary), SUMMARY_KEYS - set(summary)
    assert summary["state"] == "succeeded" and summary["steps"] == 40 and summary["device"] == "cpu"

    steps = daemon.steps(jid)
    assert [x["step"] for x in steps] == list(range(1, 41))
    for x in steps:
        assert set(STEP_FIELDS) <= set(x), set(STEP_FIELDS) - set(x)
        assert x["loss_scale"] is None and x["skipped"] is False and x["device_used_bytes"] is None
        assert x["mem_peak_bytes"] == summary["predicted_peak_bytes"]
        assert x["loss"] > 0 and x["samples_per_s"] > 0 and x["lr"] == 0.05
    assert job["latest"]["step"] == 40 and job["latest"]["loss"] == steps[-1]["loss"]
    assert summary["final_loss"] == steps[-1]["loss"]
    assert [x["step"] for x in daemon.steps(jid, "after=10&limit=5")] == [11, 12, 13, 14, 15]

    # CSV: a header row, then the same 40 rows
    r = daemon.request("GET", "/v1/jobs/%d/steps?format=csv&limit=1000" % jid)
    assert r.status == 200 and r.ctype.startswith("text/csv"), r
    rows = list(csv.DictReader(io.StringIO(r.body.decode())))
    assert set(STEP_FIELDS) <= set(rows[0]), rows[0]
    assert [int(x["step"]) for x in rows] == list(range(1, 41))
    for c, j in zip(rows, steps):
        for k in ("loss", "lr", "step_ms", "samples_per_s"):
            assert abs(float(c[k]) - j[k]) <= 1e-6 * abs(j[k]), (k, c[k], j[k])
        for k in ("epoch", "mem_allocated_bytes", "mem_peak_bytes", "mem_reserved_bytes"):
            assert int(c[k]) == j[k], (k, c[k], j[k])
        assert c["loss_scale"] in ("", "null") and c["device_used_bytes"] in ("", "null")
        assert c["skipped"] in ("0", "false")

    # the database file, read with Python's sqlite3 module as a user would
    db_rows = daemon.query("select * from steps where job_id = ? order by step", (jid,))
    assert [x["step"] for x in db_rows] == list(range(1, 41))
    assert set(STEP_FIELDS) <= set(db_rows[0])
    for d, j in zip(db_rows, steps):
        for k in STEP_FIELDS:
            if k == "skipped":
                assert bool(d[k]) == j[k]
            elif k == "time":                         # unix ms in the database
                assert isinstance(d[k], int)
                if isinstance(j[k], (int, float)):
                    assert d[k] == j[k]
                else:
                    assert abs(parse_time(j[k]).timestamp() * 1000 - d[k]) < 1000, (d[k], j[k])
            elif isinstance(d[k], float):   # JSON keeps >= 15 significant digits (cJSON)
                assert j[k] == pytest.approx(d[k], rel=1e-13, abs=0), (k, d[k], j[k])
            else:
                assert d[k] == j[k], (k, d[k], j[k])

    evals = daemon.get("/v1/jobs/%d/evals" % jid)["evals"]
    assert {20, 40} <= {e["step"] for e in evals}
    for e in evals:
        assert set(EVAL_FIELDS) <= set(e) and e["kind"] == "eval" and e["samples"] == 64
    db_evals = daemon.query("select * from evals where job_id = ? order by step, kind", (jid,))
    assert [(e["step"], e["kind"], e["samples"]) for e in db_evals] == \
        [(e["step"], e["kind"], e["samples"]) for e in evals]
    for d, j in zip(db_evals, evals):
        assert j["loss"] == pytest.approx(d["loss"], rel=1e-13, abs=0)
        assert j["accuracy"] == pytest.approx(d["accuracy"], rel=1e-13, abs=0)
    assert summary["val_loss"] == evals[-1]["loss"]

    (row,) = daemon.query("select * from jobs where id = ?", (jid,))
    assert row["state"] == "succeeded" and row["name"] == "walk-through"
    assert json.loads(row["summary"])["steps"] == 40 and json.loads(row["spec"])["model"] == "cnn"
    assert row["started_at"] <= row["finished_at"]

    # the model: the file in the job's directory, and the download
    r = daemon.request("GET", "/v1/jobs/%d/model" % jid)
    assert r.status == 200, r
    assert {"conv1.weight", "conv2.bias", "fc1.weight", "fc2.bias"} <= safetensors_names(r.body)
    assert (daemon.job_dir(jid) / "model.safetensors").read_bytes() == r.body
    assert r.headers.get("x-content-type-options") == "nosniff" and r.headers.get("cache-control") == "no-store"
    assert r.headers.get("content-type") == "application/octet-stream", r.headers

    listing = daemon.get("/v1/jobs")
    assert set(listing) >= {"jobs", "next"} and jid in [j["id"] for j in listing["jobs"]]
    assert jid in [j["id"] for j in daemon.get("/v1/jobs?state=succeeded")["jobs"]]
    assert daemon.get("/v1/jobs?state=queued")["jobs"] == []
    assert "succeeded" in daemon.request("GET", "/metrics").body.decode()


def test_events_stream(daemon):
    jid = daemon.submit(medium(steps=30))["id"]
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    try:
        conn.request("GET", "/v1/jobs/%d/events" % jid, headers={"Accept": "text/event-stream"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        assert r.getheader("Content-Type", "").startswith("text/event-stream")
        data, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = r.readline()                     # de-chunked
            except socket.timeout:
                break
            if not line:
                break                                   # the server ended the stream
            line = line.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(json.loads(line[5:].strip()))
                if "succeeded" in line:
                    break
    finally:
        conn.close()
    assert data, "no data: lines in the event stream"
    assert any("step" in json.dumps(x) for x in data), data[:5]
    assert any("succeeded" in json.dumps(x) for x in data), data[-5:]
    daemon.wait_state(jid, "succeeded")


# ---------------------------------------------------------------- queue order and cancel
def test_priorities_cancel_and_listing(daemon):
    long_id = daemon.submit(long_job(name="long"))["id"]
    daemon.wait_step(long_id, 1)

    # the device reports the job it runs
    cpu = [x for x in daemon.get("/v1/devices")["devices"] if x["id"] == "cpu"][0]
    assert long_id in device_jobs(cpu), cpu

    prios = {"a": 0, "b": 10, "c": -5, "d": 10, "e": 0, "x": 50}
    ids = {}
    for name, p in prios.items():                     # submission order a, b, c, d, e, x
        j = daemon.submit(small(steps=30, name=name, priority=p))
        assert j["state"] == "queued" and j["spec"]["priority"] == p, j
        ids[name] = j["id"]
    expected = ["x", "b", "d", "a", "e", "c"]          # priority desc, then submission order
    pos = {n: daemon.job(ids[n])["queue_position"] for n in expected}
    assert sorted(pos, key=pos.get) == expected, pos
    first = pos["x"]
    assert first in (0, 1) and [pos[n] for n in expected] == list(range(first, first + 6)), pos
    assert {j["id"] for j in daemon.get("/v1/jobs?state=queued")["jobs"]} == set(ids.values())
    assert [j["id"] for j in daemon.get("/v1/jobs?state=running")["jobs"]] == [long_id]

    # paging: newest first, ?limit and ?before=next, every job exactly once
    got, before = [], None
    for _ in range(10):
        page = daemon.get("/v1/jobs?limit=2" + ("&before=%s" % before if before else ""))
        assert len(page["jobs"]) <= 2
        got += [j["id"] for j in page["jobs"]]
        before = page["next"]
        if before is None:
            break
    assert got == sorted([long_id] + list(ids.values()), reverse=True), got

    # unfinished jobs cannot be deleted; a queued job has no model yet
    check_error(daemon.request("DELETE", "/v1/jobs/%d" % ids["a"]), 409)
    check_error(daemon.request("DELETE", "/v1/jobs/%d" % long_id), 409)
    check_error(daemon.request("GET", "/v1/jobs/%d/model" % ids["a"]), 404)

    # cancel a queued job: at once
    r = daemon.request("POST", "/v1/jobs/%d/cancel" % ids["x"])
    assert r.status == 200, r
    x = r.json()
    assert x["state"] == "cancelled" and x["finished_at"] and x["started_at"] is None, x
    assert daemon.job(ids["x"])["state"] == "cancelled"
    assert daemon.job(ids["b"])["queue_position"] == first
    check_error(daemon.request("POST", "/v1/jobs/%d/cancel" % ids["x"]), 409)

    # cancel the running job: it stops at a step boundary with a checkpoint
    r = daemon.request("POST", "/v1/jobs/%d/cancel" % long_id)
    assert r.status == 200 and r.json()["state"] in ("running", "cancelled"), r
    lj = daemon.wait_state(long_id, STATES - {"queued", "running"}, timeout=60)
    assert lj["state"] == "cancelled" and lj["finished_at"], lj
    k = lj["progress"]["step"]
    assert 1 <= k < 20000
    assert [s["step"] for s in daemon.steps(long_id, "limit=1000")] == list(range(1, min(k, 1000) + 1))
    assert (daemon.job_dir(long_id) / "checkpoint.safetensors").is_file()
    check_error(daemon.request("POST", "/v1/jobs/%d/cancel" % long_id), 409)

    # the rest run one after another in queue order
    for n in expected[1:]:
        assert daemon.wait_state(ids[n], {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    rows = {r["id"]: r for r in daemon.query("select id, started_at, finished_at from jobs")}
    order = sorted(expected[1:], key=lambda n: rows[ids[n]]["started_at"])
    assert order == expected[1:], order
    for m, n in zip(order, order[1:]):
        assert rows[ids[m]]["finished_at"] <= rows[ids[n]]["started_at"]
    assert rows[long_id]["finished_at"] <= rows[ids["b"]]["started_at"]
    assert rows[ids["x"]]["started_at"] is None
    assert daemon.steps(ids["x"]) == []


def test_delete_removes_steps_evals_and_files(daemon):
    jid = daemon.submit(small(steps=8, eval_every=4))["id"]
    keep = daemon.submit(small(steps=8, eval_every=4))["id"]
    daemon.wait_state(keep, "succeeded")
    daemon.wait_state(jid, "succeeded")
    for j in (jid, keep):
        assert len(daemon.query("select step from steps where job_id = ?", (j,))) == 8
        assert len(daemon.query("select step from evals where job_id = ?", (j,))) >= 2
        assert (daemon.job_dir(j) / "model.safetensors").is_file()

    r = daemon.request("DELETE", "/v1/jobs/%d" % jid)
    assert r.status == 204 and r.body == b"", r
    assert r.headers.get("x-content-type-options") == "nosniff", r.headers
    for method, path in (("GET", ""), ("GET", "/steps"), ("GET", "/evals"), ("GET", "/model"),
                         ("POST", "/cancel"), ("DELETE", "")):
        check_error(daemon.request(method, "/v1/jobs/%d%s" % (jid, path)), 404)
    assert daemon.query("select id from jobs where id = ?", (jid,)) == []
    assert daemon.query("select step from steps where job_id = ?", (jid,)) == []
    assert daemon.query("select step from evals where job_id = ?", (jid,)) == []
    jd = daemon.job_dir(jid)
    assert not jd.exists() or list(jd.iterdir()) == [], list(jd.iterdir())
    assert jid not in [j["id"] for j in daemon.get("/v1/jobs")["jobs"]]
    # the other job is untouched
    assert daemon.job(keep)["state"] == "succeeded" and len(daemon.steps(keep)) == 8
    assert len(daemon.query("select step from evals where job_id = ?", (keep,))) >= 2
    assert (daemon.job_dir(keep) / "model.safetensors").is_file()


def test_idempotent_resubmission(daemon):
    spec = small(steps=8, submission_id="nightly-2024-05-01")
    hdr = {"Content-Type": "application/json; charset=utf-8"}
    body = json.dumps(spec).encode()
    r1 = daemon.request("POST", "/v1/jobs", body, headers=hdr)
    assert r1.status == 201, r1
    jid = r1.json()["id"]
    r2 = daemon.request("POST", "/v1/jobs", body, headers=hdr)
    assert r2.status == 200 and r2.json()["id"] == jid, r2
    done = daemon.wait_state(jid, "succeeded")
    r3 = daemon.request("POST", "/v1/jobs", body, headers=hdr)
    assert r3.status == 200, r3
    j3 = r3.json()
    assert j3["id"] == jid and j3["state"] == "succeeded" and j3["attempts"] == done["attempts"]
    assert len(daemon.steps(jid)) == 8
    assert len(daemon.query("select id from jobs")) == 1

    # concurrent duplicates: exactly one 201, one job
    spec2 = small(steps=4, submission_id="race")
    results = []
    def post():
        results.append(daemon.request("POST", "/v1/jobs", spec2))
    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(r.status for r in results) == [200] * 5 + [201], results
    assert len({r.json()["id"] for r in results}) == 1
    assert len(daemon.query("select id from jobs where submission_id = 'race'")) == 1
    other = daemon.submit(small(steps=4, submission_id="another"))
    assert other["id"] not in (jid, results[0].json()["id"])


# ---------------------------------------------------------------- crashes
def crash_spec():
    if (FMNIST / "train-images-idx3-ubyte.gz").is_file():
        return {"model": "cnn", "dataset": "fashion-mnist", "train_subset": 1024,
                "eval_subset": 256, "batch_size": 32, "steps": 160, "threads": 1,
                "device": "cpu", "seed": 7, "checkpoint_every": 20,
                "optimizer": {"type": "sgd", "lr": 0.02}}
    return medium(steps=160, seed=7, checkpoint_every=20, optimizer={"type": "sgd", "lr": 0.005})


def test_kill9_daemon_and_worker_then_resume(make_daemon, tmp_path):
    spec = crash_spec()
    # the uninterrupted reference run, alongside (one thread each)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    ref = subprocess.Popen([str(TRAINQ), "run", str(tmp_path / "spec.json"), "--quiet",
                            "--db", str(tmp_path / "ref.db"), "--out", str(tmp_path / "ref")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        d = make_daemon()
        jid = d.submit(spec)["id"]
        before = d.wait_step(jid, 50, timeout=120)
        ckpt = d.job_dir(jid) / "checkpoint.safetensors"
        wait_until(ckpt.is_file, 30, "a checkpoint of job %d" % jid)
        worker = the_worker(d, jid)
        os.kill(d.pid, signal.SIGKILL)
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:                       # it went with its parent
            pass
        d.proc.wait(timeout=30)
        wait_until(lambda: gone(worker), 30, "the killed worker to be gone")

        (row,) = d.query("select state, attempts from jobs where id = ?", (jid,))
        assert row["state"] == "running", "the job was not mid-run when killed: %s" % row
        recorded = [r["step"] for r in d.query("select step from steps where job_id = ? "
                                               "order by step", (jid,))]
        assert recorded == list(range(1, len(recorded) + 1)) and len(recorded) < 160

        d2 = make_daemon()                               # same state directory and database
        job = d2.wait_state(jid, {"succeeded", "failed"}, timeout=180)
        assert job["state"] == "succeeded", job
        # an interruption, not a failure: the killed start had made progress (issue 20)
        assert job["interruptions"] == before["interruptions"] + 1, (before, job)
        assert job["attempts"] == before["attempts"] == 1, (before["attempts"], job["attempts"])
        steps = d2.steps(jid)
        assert [s["step"] for s in steps] == list(range(1, 161))
        rows = d2.query("select step, count(*) as n from steps where job_id = ? group by step",
                        (jid,))
        assert [(r["step"], r["n"]) for r in rows] == [(s, 1) for s in range(1, 161)]

        out, err = ref.communicate(timeout=300)
        assert ref.returncode == 0, err[-2000:]
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait()
    want = json.loads(out)
    got = job["summary"]
    for k in ("final_loss", "val_loss", "val_accuracy", "steps", "samples"):
        assert got[k] == want[k], (k, got[k], want[k])
    # bit-identical numbers, database against database (JSON rounds to 15+ digits)
    ref_db = sqlite3.connect(str(tmp_path / "ref.db"))
    ref_losses = [r[0] for r in ref_db.execute("select loss from steps order by step")]
    ref_evals = ref_db.execute("select step, kind, loss, accuracy from evals "
                               "order by step, kind").fetchall()
    ref_db.close()
    assert [r["loss"] for r in d2.query("select loss from steps where job_id = ? order by step",
                                        (jid,))] == ref_losses
    assert [tuple(r.values()) for r in d2.query("select step, kind, loss, accuracy from evals "
                                                "where job_id = ? order by step, kind", (jid,))] \
        == ref_evals


def test_worker_killed_by_signal(daemon):
    victim = daemon.submit(long_job(name="victim"))["id"]
    nxt = daemon.submit(small(steps=8, name="next"))["id"]
    daemon.wait_step(victim, 2)
    worker = the_worker(daemon, victim)
    os.kill(worker, signal.SIGKILL)
    job = daemon.wait_state(victim, {"failed", "succeeded", "cancelled"}, timeout=60)
    assert job["state"] == "failed", job
    assert job["error"]["code"] == "worker_crashed", job["error"]
    assert re.search(r"signal|sigkill|killed|\b9\b", job["error"]["message"], re.I), job["error"]
    assert job["finished_at"]
    assert daemon.wait_state(nxt, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"
    assert daemon.alive() and daemon.request("GET", "/healthz").status == 200


# ---------------------------------------------------------------- bad input
def raw_request(port, head, body, timeout=30):
    """Send head + body over a plain socket, stopping early if the server answers (a 413 may
    come before the whole body is sent); returns (status, header text, body bytes)."""
    deadline = time.monotonic() + timeout
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(head)
        for i in range(0, len(body), 65536):
            if select.select([s], [], [], 0)[0]:
                break
            try:
                s.sendall(body[i:i + 65536])
            except (BrokenPipeError, ConnectionResetError, socket.timeout):
                break
        data = b""
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                hdr, _, rest = data.partition(b"\r\n\r\n")
                m = re.search(rb"(?im)^content-length:\s*(\d+)", hdr)
                if m and len(rest) >= int(m.group(1)):
                    break
    finally:
        s.close()
    assert data.startswith(b"HTTP/1."), data[:200]
    hdr, _, rest = data.partition(b"\r\n\r\n")
    return int(hdr.split()[1]), hdr.decode(errors="replace"), rest


def test_bad_input_battery(daemon):
    jid = daemon.submit(small(steps=8, name="bystander"))["id"]
    before = daemon.wait_state(jid, "succeeded")
    run_id = daemon.submit(long_job(name="running bystander"))["id"]
    running = daemon.wait_step(run_id, 1)
    n_jobs = len(daemon.query("select id from jobs"))
    n_steps = len(daemon.query("select step from steps where job_id = ?", (jid,)))
    port = daemon.port
    J = "/v1/jobs/%d" % jid
    R = "/v1/jobs/%d" % run_id
    ok_body = json.dumps(small(steps=2)).encode()
    jsonh = {"Content-Type": "application/json"}

    cases = [  # (method, path, body, headers, status, field)
        # malformed JSON, not an object
        ("POST", "/v1/jobs", b'{"model": "mlp",', jsonh, 400, None),
        ("POST", "/v1/jobs", b"", jsonh, 400, None),
        ("POST", "/v1/jobs", b"[1, 2]", jsonh, 400, None),
        ("POST", "/v1/jobs", b'"mlp"', jsonh, 400, None),
        ("POST", "/v1/jobs", b"null", jsonh, 400, None),
        ("POST", "/v1/jobs", b"[" * 5000 + b"]" * 5000, jsonh, 400, None),
        ("POST", "/v1/jobs", b'{"model": "mlp"} trailing', jsonh, 400, None),
    ]
    spec_cases = [  # wrong types, unknown fields, out-of-range values: 400 naming the field
        ({"batch_size": "32"}, "batch_size"), ({"model": 3}, "model"),
        ({"shuffle": "yes"}, "shuffle"), ({"optimizer": 3}, "optimizer"),
        ({"steps": 1.5}, "steps"), ({"model": None}, "model"), ({"batch_size": True}, "batch_size"),
        ({"btach_size": 3}, "btach_size"), ({"optimizer": {"type": "sgd", "foo": 1}}, "optimizer.foo"),
        ({"batch_size": 0}, "batch_size"), ({"batch_size": 65537}, "batch_size"),
        ({"priority": 101}, "priority"), ({"priority": -101}, "priority"),
        ({"optimizer": {"type": "sgd", "lr": -1}}, "optimizer.lr"), ({"name": "n" * 129}, "name"),
        ({"submission_id": "s" * 129}, "submission_id"), ({"steps": 3, "epochs": 1}, "steps"),
        ({"amp": "fp8"}, "amp"), ({"device": "tpu"}, "device"), ({"accum_steps": 0}, "accum_steps"),
        ({"prune": {"amount": 0.99}}, "prune.amount"), ({"timeout_s": -5}, "timeout_s"),
    ]
    for spec, field in spec_cases:
        cases.append(("POST", "/v1/jobs", json.dumps(dict(small(), **spec)).encode(), jsonh, 400,
                      field))
    cases += [
        # wrong content type (a browser's cross-site form post among them)
        ("POST", "/v1/jobs", ok_body, {}, 415, None),
        ("POST", "/v1/jobs", ok_body, {"Content-Type": "text/plain"}, 415, None),
        ("POST", "/v1/jobs", ok_body, {"Content-Type": "application/x-www-form-urlencoded"}, 415, None),
        ("POST", "/v1/jobs", ok_body, {"Content-Type": "multipart/form-data; boundary=x"}, 415, None),
        ("POST", "/v1/jobs", ok_body, {"Content-Type": "application/jsonp"}, 415, None),
        # cannot fit: 422
        ("POST", "/v1/jobs", json.dumps(medium(steps=1, max_memory_mb=1)).encode(), jsonh, 422, None),
    ]
    for bad in ("abc", "1.5", "1abc", "99999999999999999999999"):  # malformed ids: 400
        for method, suffix in (("GET", ""), ("GET", "/steps"), ("GET", "/evals"),
                               ("GET", "/model"), ("POST", "/cancel"), ("DELETE", "")):
            cases.append((method, "/v1/jobs/%s%s" % (bad, suffix), None, {}, 400, None))
    for method, suffix in (("GET", ""), ("GET", "/steps"), ("GET", "/evals"), ("GET", "/model"),
                           ("GET", "/events"), ("POST", "/cancel"), ("DELETE", "")):
        cases.append((method, "/v1/jobs/987654%s" % suffix, None, {}, 404, None))   # unknown
    cases += [
        ("GET", "/v1/nothing", None, {}, 404, None),
        ("GET", "/v2/jobs", None, {}, 404, None),
        # bad query parameters
        ("GET", "/v1/jobs?limit=abc", None, {}, 400, None),
        ("GET", "/v1/jobs?limit=-1", None, {}, 400, None),
        ("GET", "/v1/jobs?limit=1001", None, {}, 400, None),
        ("GET", "/v1/jobs?state=bogus", None, {}, 400, None),
        ("GET", "/v1/jobs?before=abc", None, {}, 400, None),
        ("GET", J + "/steps?after=abc", None, {}, 400, None),
        ("GET", J + "/steps?after=-1", None, {}, 400, None),
        ("GET", J + "/steps?limit=abc", None, {}, 400, None),
        ("GET", J + "/steps?format=xml", None, {}, 400, None),
        ("GET", "/v1/jobs?sate=queued", None, {}, 400, None),           # unknown parameter
        ("GET", J + "/steps?afterr=3", None, {}, 400, None),
        # unsupported methods on existing routes
        ("PUT", "/v1/jobs", ok_body, jsonh, 405, None),
        ("DELETE", "/v1/jobs", None, {}, 405, None),
        ("PATCH", J, ok_body, jsonh, 405, None),
        ("PUT", J, ok_body, jsonh, 405, None),
        ("POST", J, ok_body, jsonh, 405, None),
        ("POST", J + "/steps", None, {}, 405, None),
        ("DELETE", J + "/evals", None, {}, 405, None),
        ("GET", J + "/cancel", None, {}, 405, None),
        ("POST", "/healthz", None, {}, 405, None),
        ("DELETE", "/metrics", None, {}, 405, None),
        ("POST", "/v1/devices", None, {}, 405, None),
    ]
    failures = []
    for method, path, body, headers, status, field in cases:
        try:
            err = check_error(daemon.request(method, path, body, headers=headers), status, field)
            if status == 422:
                assert "max_memory_mb" in json.dumps(err), err
        except AssertionError as e:
            failures.append("%s %s %r -> %s" % (method, path, (body or b"")[:60], e))
        assert daemon.alive(), "serve died on %s %s:\n%s" % (method, path, daemon.log_tail())

    # foreign Host headers (DNS rebinding): 403, including for a valid submission
    for host in ("evil.example.com", "evil.example.com:%d" % port, "127.0.0.1.nip.io:%d" % port,
                 "localhost.evil.example:%d" % port, "attacker"):
        for method, path, body, headers in (("GET", "/v1/jobs", None, {}),
                                            ("GET", J, None, {}),
                                            ("POST", "/v1/jobs", ok_body, jsonh),
                                            ("DELETE", J, None, {}),
                                            ("POST", R + "/cancel", None, {})):
            try:
                check_error(daemon.request(method, path, body, headers=headers, host=host), 403)
            except AssertionError as e:
                failures.append("Host %s: %s %s -> %s" % (host, method, path, e))
    for host in ("localhost:%d" % port, "127.0.0.1:%d" % port):
        r = daemon.request("GET", "/v1/jobs", host=host)
        if r.status != 200:
            failures.append("Host %s refused: %r" % (host, r))

    # oversized bodies: 413 (8 MiB of valid JSON), answered without reading it all or hanging
    big = b'{"name": "' + b"x" * (8 << 20) + b'"}'
    status, hdr, body = raw_request(port, ("POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                           "Content-Type: application/json\r\n"
                                           "Content-Length: %d\r\n\r\n" % (port, len(big))).encode(),
                                    big)
    try:
        big_ok = status == 413 and "json" in hdr.lower() and "error" in json.loads(body)
    except ValueError:
        big_ok = False
    if not big_ok:
        failures.append("8 MiB body -> %s %r" % (status, body[:200]))
    assert daemon.alive(), daemon.log_tail()

    assert not failures, "%d of the bad requests got the wrong answer:\n" % len(failures) + \
        "\n".join(failures)
    # nothing created or harmed; still serving
    assert daemon.request("GET", "/healthz").status == 200
    assert len(daemon.query("select id from jobs")) == n_jobs
    assert len(daemon.query("select step from steps where job_id = ?", (jid,))) == n_steps
    assert [j["id"] for j in daemon.get("/v1/jobs")["jobs"]] == [run_id, jid]
    after = daemon.job(jid)
    for k in ("state", "summary", "finished_at", "attempts", "progress", "spec"):
        assert after[k] == before[k], k
    assert (daemon.job_dir(jid) / "model.safetensors").is_file()
    now = daemon.job(run_id)
    assert now["state"] == "running" and now["attempts"] == running["attempts"], now
    assert now["progress"]["step"] >= running["progress"]["step"]
    assert daemon.request("POST", R + "/cancel").status == 200
    daemon.wait_state(run_id, "cancelled", timeout=60)


# ---------------------------------------------------------------- SIGTERM and sd_notify
class NotifySocket:
    """The systemd side of sd_notify: an AF_UNIX datagram socket collecting messages."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages = []              # (monotonic time, {key: value})
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            kv = dict(l.split("=", 1) for l in data.decode(errors="replace").split("\n") if "=" in l)
            with self.lock:
                self.messages.append((time.monotonic(), kv))

    def first(self, key, value=None):
        with self.lock:
            for t, kv in self.messages:
                if key in kv and (value is None or kv[key] == value):
                    return t, kv[key]
        return None

    def wait(self, key, value=None, timeout=20):
        return wait_until(lambda: self.first(key, value), timeout,
                          "%s=%s on NOTIFY_SOCKET" % (key, value or "…"))

    def close(self):
        self.done.set()
        self.thread.join(timeout=5)
        self.sock.close()


def test_sigterm_notify_and_requeue(make_daemon, tmp_path):
    path = tmp_path / "notify.sock"
    if len(str(path)) > 100:                            # sun_path is 108 bytes
        path = Path(tempfile.mkdtemp(prefix="tqn", dir="/tmp")) / "notify.sock"
    notify = NotifySocket(path)
    try:
        d = make_daemon(env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"})
        t_ready, _ = notify.wait("READY", "1", timeout=20)
        assert d.request("GET", "/healthz").status == 200
        notify.wait("WATCHDOG", "1", timeout=10)       # every WATCHDOG_USEC/2 at most
        notify.wait("STATUS", timeout=10)

        spec = medium(steps=400, checkpoint_every=100000)   # a checkpoint only from the stop
        jid = d.submit(spec)["id"]
        d.wait_step(jid, 60, timeout=120)
        assert not (d.job_dir(jid) / "checkpoint.safetensors").exists()
        t_term = time.monotonic()
        rc = d.stop(signal.SIGTERM, timeout=90)
        assert rc == 0, d.log_tail()
        t_stop, _ = notify.wait("STOPPING", "1", timeout=5)
        assert t_ready < t_stop and t_stop >= t_term - 0.1
    finally:
        notify.close()
    assert worker_pids(d) == []

    (row,) = d.query("select state, attempts from jobs where id = ?", (jid,))
    assert row["state"] == "queued", row
    ckpt = d.job_dir(jid) / "checkpoint.safetensors"
    assert ckpt.is_file() and {"conv1.weight", "fc2.bias"} <= safetensors_names(ckpt.read_bytes())
    kept = d.query("select step, loss, time from steps where job_id = ? order by step", (jid,))
    k = len(kept)
    assert k >= 60 and [r["step"] for r in kept] == list(range(1, k + 1))
    first_run_ms = kept[-1]["time"] - kept[0]["time"]    # steps 1..k took this long

    t_restart_ms = time.time() * 1000
    d2 = make_daemon()
    job = d2.job(jid)
    assert job["state"] in ("queued", "running") and job["attempts"] >= row["attempts"]
    d2.wait_step(jid, k + 5, timeout=120)
    rows = d2.query("select step, loss, time from steps where job_id = ? order by step", (jid,))
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows[:k] == kept                              # the records up to the stop stay
    # resumed from the checkpoint, not from step 1: step k+1 came sooner than k steps could
    assert rows[k]["time"] - t_restart_ms < first_run_ms, (rows[k]["time"] - t_restart_ms,
                                                           first_run_ms)
    r = d2.request("POST", "/v1/jobs/%d/cancel" % jid)
    assert r.status == 200, r
    d2.wait_state(jid, "cancelled", timeout=60)
