"""docs/openapi.json as the API's contract (issue 16, "The API as a contract").

Static (no daemon): the document is valid OpenAPI 3.1 (openapi-spec-validator) and schemathesis
reads every operation of it; it documents every route of api/http.c's table and nothing the
table lacks (a new route without a doc fails here); its job spec has exactly the fields of
train/spec.c's parser, and a failed job's error.code exactly the codes of train/codes.h.

Live: schemathesis runs every documented operation against the real `trainq serve` (a
temporary database, `--devices cpu`), with the settings of tests/integration/schemathesis.toml:
the checks not_a_server_error, status_code_conformance, content_type_conformance,
response_schema_conformance and response_headers_conformance on every answer, 15 examples an
operation in each of its four phases (POST /v1/jobs: 40, and its coverage phase sends invalid
specs only; that file says why), one worker (two threads of schemathesis trip a CPython 3.11.2
bug in ast.parse, "AST constructor recursion depth mismatch", inside hypothesis). Before it
runs, the database gets a succeeded job (1: steps, evals, a model, a log), a failed one (2) and
a cancelled one (3), so that the ids schemathesis tries first (the minimum, 1) reach real
records, not only 404s. Jobs it submits must not take the two cores from it: the CPU budget is
256 MiB (larger specs are a 422), and a janitor thread cancels every queued or running job a
few times a second (which also gives cancel, requeue, delete and model their 409 and 204
answers).

The two streaming operations, GET /v1/jobs/{id}/events and GET /v1/jobs/{id}/log?follow=1, stay
open while their job is queued or running: a request for such a job would hold schemathesis for
its whole request timeout (and the log, plain text, would fail as a timeout). They are left out
of the first pass and run in a second one once every job has ended, when each stream ends by
itself (schemathesis validates each server-sent event against the document's Event schema).
test_streams_of_a_live_job covers what that pass cannot: both streams of a job that runs,
followed to its end, each event validated against the document's schemas.
test_spec_at_its_bounds_comes_back_exactly keeps what the first pass found in the daemon.

schemathesis is on PyPI only: scripts/install-deps makes tests/.venv with the pinned versions.
Without it these tests fail with that instruction (skip instead: TRAINQ_ALLOW_SKIP=1).
TRAINQ_ST_SEED picks another schemathesis seed (default a fixed one, printed). By hand, against
a scratch daemon: see the top of schemathesis.toml.
"""
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from test_daemon import _SKIP, Daemon, wait_until  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / "docs" / "openapi.json"
VENV = REPO / "tests" / ".venv"
VPY = VENV / "bin" / "python"
ST = VENV / "bin" / "st"
PINNED = {"schemathesis": "4.32.5", "openapi-spec-validator": "0.9.0"}   # as scripts/install-deps
SEED = int(os.environ.get("TRAINQ_ST_SEED", "20261205"))
CONFIG = REPO / "tests" / "integration" / "schemathesis.toml"   # checks, examples, workers, timeouts
STREAMS = r"^/v1/jobs/\{id\}/(events|log)$"
# a job of about 30 ms: mlp on a tiny synthetic set, one thread
TINY = {"model": "mlp", "dataset": "synthetic", "threads": 1, "device": "cpu",
        "synthetic": {"train": 64, "test": 32, "height": 8, "width": 8, "channels": 1}}


def doc():
    with open(OPENAPI) as f:
        return json.load(f)


def need_venv():
    """The venv's python, or fail (skip with TRAINQ_ALLOW_SKIP) saying how to make it."""
    why = None
    if not (VPY.is_file() and ST.is_file()):
        why = "%s has no schemathesis" % VENV
    else:
        r = subprocess.run([str(VPY), "-c", "import json, importlib.metadata as m; print(json.dumps("
                            "{n: m.version(n) for n in %r}))" % sorted(PINNED)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        if r.returncode != 0 or json.loads(r.stdout) != PINNED:
            why = "%s does not have %s (%s)" % (VENV, PINNED, r.stdout.strip()[-300:])
    if why:
        msg = why + ": run scripts/install-deps"
        if os.environ.get("TRAINQ_ALLOW_SKIP"):
            pytest.skip(msg)
        pytest.fail(msg)
    return str(VPY)


# ---------------------------------------------------------------- static
def c_routes():
    """(METHOD, pattern) of api/http.c's route table."""
    src = (REPO / "api" / "http.c").read_text()
    table = re.search(r"static const route routes\[\] = \{(.*?)\n\};", src, re.S)
    assert table, "api/http.c: no `static const route routes[]` table"
    body = re.sub(r"/\*.*?\*/", "", table.group(1), flags=re.S)
    found = re.findall(r'\{\s*"([A-Z]+)",\s*"([^"]+)",\s*\w+\s*\}', body)
    assert len(found) == len(re.findall(r"\btq_h_\w+", body)), "a route this parser missed:\n" + body
    assert len(found) >= 15, found
    return found


def test_document_is_valid_openapi_3_1():
    d = doc()
    assert d["openapi"].startswith("3.1."), d["openapi"]
    py = need_venv()
    r = subprocess.run([py, "-c", "import sys; from openapi_spec_validator import validate; "
                        "from openapi_spec_validator.readers import read_from_filename; "
                        "validate(read_from_filename(sys.argv[1])[0], cls=__import__("
                        "'openapi_spec_validator').OpenAPIV31SpecValidator)", str(OPENAPI)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    # and schemathesis reads every operation of it
    r = subprocess.run([py, "-c", "import sys, schemathesis; s = schemathesis.openapi.from_path(sys.argv[1]); "
                        "ops = [r.ok().label for r in s.get_all_operations()]; print(len(ops))", str(OPENAPI)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    n = sum(len([m for m in p if m != "parameters"]) for p in d["paths"].values())
    assert r.returncode == 0 and r.stdout.strip() == str(n), r.stdout[-3000:]


def test_every_route_is_documented():
    d = doc()
    documented = {(m.upper(), path) for path, item in d["paths"].items() for m in item if m != "parameters"}
    routes = set(c_routes())
    missing = sorted(r for r in routes if r not in documented)
    assert not missing, "api/http.c routes missing from docs/openapi.json: %s" % missing
    # HEAD is answered wherever GET is (http.c maps it); nothing is documented that is not served
    extra = sorted(r for r in documented if r not in routes and not (r[0] == "HEAD" and ("GET", r[1]) in routes))
    assert not extra, "docs/openapi.json documents operations api/http.c does not serve: %s" % extra
    for path, item in d["paths"].items():
        for m, o in item.items():
            if m == "parameters":
                continue
            assert o.get("operationId") and o.get("responses"), (m, path)
            # every operation documents the answers any request may get
            for status in ("400", "403", "405", "500", "503"):
                assert status in o["responses"], (m, path, status)


def test_spec_fields_and_error_codes_match_the_code():
    d = doc()
    spec_c = (REPO / "train" / "spec.c").read_text()
    m = re.search(r"#define TQ_SPEC_FIELDS\(X\)(.*?)\n\n", spec_c, re.S)
    assert m, "train/spec.c: no TQ_SPEC_FIELDS list"
    fields = set(re.findall(r"X\((\w+)\)", m.group(1)))
    props = set(d["components"]["schemas"]["JobSpec"]["properties"])
    assert fields == props, "spec fields: parser only %s, document only %s" % (
        sorted(fields - props), sorted(props - fields))
    codes_h = (REPO / "train" / "codes.h").read_text()
    m = re.search(r"#define TQ_ERROR_CODES\(X\)(.*?)\n\n", codes_h, re.S)
    codes = set(re.findall(r"X\(\w+,\s*(\w+),", m.group(1)))
    documented = set(d["components"]["schemas"]["JobError"]["properties"]["code"]["enum"])
    assert codes == documented, "job error codes: codes.h only %s, document only %s" % (
        sorted(codes - documented), sorted(documented - codes))


# ---------------------------------------------------------------- live
class Janitor(threading.Thread):
    """Cancels every queued or running job of d, a few times a second, until stopped."""

    def __init__(self, d):
        super().__init__(daemon=True)
        self.d, self.halt, self.cancelled, self.errors = d, threading.Event(), 0, []

    def sweep(self):
        for state in ("running", "queued"):
            r = self.d.request("GET", "/v1/jobs?state=%s&limit=1000" % state, timeout=10)
            if r.status != 200:
                self.errors.append(repr(r))
                continue
            for j in r.json()["jobs"]:
                c = self.d.request("POST", "/v1/jobs/%d/cancel" % j["id"], timeout=10)
                self.cancelled += c.status == 200

    def run(self):
        while not self.halt.is_set():
            try:
                self.sweep()
            except OSError as e:
                self.errors.append(repr(e))
            self.halt.wait(0.2)

    def stop(self):
        self.halt.set()
        self.join(30)


def live_jobs(d):
    return [j["id"] for s in ("queued", "running")
            for j in d.get("/v1/jobs?state=%s&limit=1000" % s)["jobs"]]


def seed_jobs(d):
    """1 succeeded (steps, evals, model, log), 2 failed (invalid_init_from), 3 cancelled."""
    ok = d.submit(dict(TINY, steps=6, eval_every=3, name="openapi-ok"))
    bad = d.submit(dict(TINY, steps=3, init_from="/etc/hostname", name="openapi-failed"))
    gone = d.submit(dict(TINY, steps=100000, name="openapi-cancelled", after=[ok["id"]]))
    assert (ok["id"], bad["id"], gone["id"]) == (1, 2, 3)
    assert d.request("POST", "/v1/jobs/3/cancel").status == 200
    assert d.wait_state(1, "succeeded")["progress"]["step"] == 6
    assert d.wait_state(2, "failed")["error"]["code"] == "invalid_init_from"
    d.wait_state(3, "cancelled")


def schemathesis(d, tmp, *args, timeout=150):
    """st run against d; returns (exit status, output, seconds)."""
    cmd = [str(ST), "--config-file", str(CONFIG), "run", str(OPENAPI), "--url", "http://127.0.0.1:%d" % d.port,
           "--seed", str(SEED), "--no-color"] + list(args)
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=str(tmp), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout,
                           env=dict(os.environ, NO_COLOR="1", COLUMNS="120"))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail("schemathesis still running after %d s:\n%s" % (timeout, out[-6000:]))
    return r.returncode, r.stdout, time.monotonic() - t0


def summary_of(out):
    """The failures part of schemathesis's output (its sections, then the summary)."""
    i = out.find("FAILURES")
    return out[i:] if i >= 0 else out[-8000:]


@pytest.fixture
def served(tmp_path):
    """A started daemon (CPU budget 256 MiB) with the three seed jobs; stopped at the end."""
    need_venv()
    if _SKIP:
        pytest.skip(_SKIP)
    d = Daemon(tmp_path / "state", devices="cpu", args=["--cpu-memory-mb", "256"]).start()
    try:
        seed_jobs(d)
        yield d
    finally:
        if d.alive():
            d.kill9()   # workers of cancelled jobs included (their process group)
        print("---- trainq serve log\n" + d.log_tail(3000))


def test_schemathesis_conformance(served, tmp_path):
    d = served
    janitor = Janitor(d)
    janitor.start()
    try:
        # every operation but the two streams; a few examples each, all four phases
        rc, out, secs = schemathesis(d, tmp_path, "--exclude-path-regex", STREAMS)
    finally:
        janitor.stop()
    print(out[-2500:])
    print("pass 1 (seed %d): %.1f s, %d jobs cancelled by the janitor" % (SEED, secs, janitor.cancelled))
    assert not janitor.errors, janitor.errors[:5]
    assert re.search(r"Tested: +(\d+)", out) and "Tested: 0" not in out, out[-3000:]
    assert rc == 0, "schemathesis found answers that break docs/openapi.json (seed %d):\n%s" % (
        SEED, summary_of(out))
    assert d.alive(), d.log_tail()

    # the streams, now that no job is queued or running: each one ends by itself
    for jid in live_jobs(d):
        d.request("POST", "/v1/jobs/%d/cancel" % jid)
    wait_until(lambda: not live_jobs(d), 60, "every job to end")
    rc, out, secs = schemathesis(d, tmp_path, "--include-path-regex", STREAMS, timeout=90)
    print(out[-1500:])
    print("pass 2 (streams): %.1f s" % secs)
    assert re.search(r"Tested: +2\b", out), out[-3000:]
    assert rc == 0, "schemathesis found stream answers that break docs/openapi.json (seed %d):\n%s" % (
        SEED, summary_of(out))


def test_spec_at_its_bounds_comes_back_exactly(served):
    """The spec a job shows is the one it was accepted with, to the last bit, and can be submitted
    again as it is. (Found by schemathesis: the API's JSON printer wrote 0.9999999999999999 as 1,
    outside backoff_factor's range, and 2^53 as 9.00719925474099e+15. The first pass's coverage
    phase no longer sends valid specs at their bounds, see schemathesis.toml, so this keeps it.)"""
    d = served
    edge = dict(TINY, steps=1, seed=2 ** 53, after=[1],
                optimizer={"type": "sgd", "lr": 5e-324, "momentum": 0.9999999999999999, "weight_decay": 1},
                lr_schedule={"type": "step", "step_size": 10000000, "gamma": 0.30000000000000004},
                loss_scale={"init": 3.4028234663852886e38, "growth_factor": 16,
                            "backoff_factor": 0.9999999999999999, "growth_interval": 1})
    job = d.submit(edge)
    spec = job["spec"]
    for k in ("optimizer", "lr_schedule", "loss_scale"):
        assert {f: spec[k][f] for f in edge[k]} == edge[k], (k, spec[k])
    assert spec["seed"] == 2 ** 53 and isinstance(spec["seed"], int), spec["seed"]
    assert d.job(job["id"])["spec"] == spec
    again = d.submit(spec)
    assert again["spec"] == spec
    validate([("Job", job), ("Job", again)])


VALIDATE = r"""
import json, sys
from jsonschema import Draft202012Validator
doc = json.load(open(sys.argv[1]))
bad = []
for name, value in json.load(sys.stdin):
    v = Draft202012Validator(dict(doc, **{"$ref": "#/components/schemas/" + name}))
    bad += ["%s: %s at %s" % (name, e.message[:300], list(e.absolute_path)) for e in v.iter_errors(value)]
print("\n".join(bad))
sys.exit(1 if bad else 0)
"""


def validate(pairs):
    """Each (schema name, value) against docs/openapi.json's components (the venv's jsonschema)."""
    r = subprocess.run([need_venv(), "-c", VALIDATE, str(OPENAPI)], input=json.dumps(pairs),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert r.returncode == 0, r.stdout[-4000:]


def sse_events(text):
    """[(event, data)] of a text/event-stream body."""
    out = []
    for block in text.split("\n\n"):
        ev, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if ev:
            out.append((ev, json.loads("\n".join(data))))
    return out


def test_streams_of_a_live_job(served):
    """The streams schemathesis runs only for ended jobs, for a job that runs: both followed from
    before its start to its end, every event against the document's schemas."""
    d = served
    spec = dict(TINY, steps=40, eval_every=20, after=[1])
    jid = d.submit(spec)["id"]
    got = {}

    def follow(key, path):
        got[key] = d.request("GET", path, timeout=60)

    ts = [threading.Thread(target=follow, args=("events", "/v1/jobs/%d/events" % jid)),
          threading.Thread(target=follow, args=("log", "/v1/jobs/%d/log?follow=1" % jid))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
    assert all(not t.is_alive() for t in ts), "a stream did not end with its job"
    ev, log = got["events"], got["log"]
    assert ev.status == 200 and ev.ctype == "text/event-stream", ev
    assert ev.headers.get("cache-control") == "no-store", ev.headers
    events = sse_events(ev.body.decode())
    kinds = [e for e, _ in events]
    assert kinds.count("step") == 40 and kinds.count("eval") >= 2 and kinds[-1] == "job", kinds
    assert [x["state"] for e, x in events if e == "state"][-1] == "succeeded", events
    names = {"step": "Step", "eval": "Eval", "job": "Job"}
    validate([(names[e], x) for e, x in events if e in names])
    for e, x in events:
        if e == "state":
            assert set(x) == {"state", "attempts", "error", "job", "time"} and x["job"] == jid, x
    assert log.status == 200 and log.ctype.startswith("text/plain"), log
    assert log.headers.get("cache-control") == "no-store", log.headers
    assert "job %d: succeeded" % jid in log.body.decode(), log.body[-500:]
    # and the other answers of a job's life against the document
    validate([("Job", d.job(jid)), ("JobList", d.get("/v1/jobs")), ("StepList", d.get("/v1/jobs/%d/steps" % jid)),
              ("EvalList", d.get("/v1/jobs/%d/evals" % jid)), ("DeviceList", d.get("/v1/devices")),
              ("UserList", d.get("/v1/users")), ("Health", d.get("/healthz")),
              ("Compare", d.get("/v1/compare?ids=1,%d" % jid))])


def test_a_busy_device_in_the_document(tmp_path):
    """A job a busy device turned away (TQ_TEST_DEVICE_BUSY stands in for the other process): its
    waiting_for while it waits, and its events stream with the device_busy state event, against
    the document."""
    busy = tmp_path / "busy"
    busy.write_text("")
    d = Daemon(tmp_path / "state", env={"TQ_TEST_DEVICE_BUSY": str(busy)})
    d.start()
    try:
        jid = d.submit(dict(TINY, steps=3))["id"]

        def waits():
            j = d.job(jid)
            w = j.get("waiting_for") or {}
            return j if w.get("reason") == "device_busy" else None
        j = wait_until(waits, 60, "the job to wait for the busy device")
        devs = d.get("/v1/devices")
        busy.unlink()
        wait_until(lambda: d.job(jid)["state"] == "succeeded", 90, "the job to run")
        ev = d.request("GET", "/v1/jobs/%d/events" % jid, timeout=60)
        states = [x for e, x in sse_events(ev.body.decode()) if e == "state"]
        turned = [x for x in states if "device_busy" in x]
        assert turned and turned[0]["state"] == "queued" and turned[0]["device_busy"]["device"] == "cpu", states
        validate([("Job", j), ("Job", d.job(jid)), ("DeviceList", devs), ("DeviceList", d.get("/v1/devices"))] +
                 [("StateEvent", x) for x in states])
    finally:
        d.stop()
