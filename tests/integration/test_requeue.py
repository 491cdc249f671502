"""A job's lifecycle after it ends (issue 17): POST /v1/jobs/{id}/requeue and `trainq requeue`
send a failed or cancelled job back to the queue, to resume from its checkpoint with every step
recorded exactly once and the same numbers as a run never stopped; what requeue refuses; the
model of a job that will never have one; a worker's end in words; dependencies ("after"): a job
runs once the jobs it lists succeeded, fails with dependency_failed (down a chain) when one does
not, and never holds up the jobs behind it."""
import json
import os
import re
import signal
import sqlite3
import subprocess

import pytest

from test_owners import as_user
from test_daemon import (TRAINQ, check_error, free_port, make_daemon, medium, small,  # noqa: F401
                         the_worker, wait_until)


def ref_spec(steps=120):
    """cnn on the synthetic set, ~25 ms a step: long enough to cancel mid-way."""
    return medium(steps=steps, seed=7, checkpoint_every=10, eval_every=0,
                  optimizer={"type": "sgd", "lr": 0.01})


def reference_run(tmp_path, spec):
    """The uninterrupted run of spec (`trainq run`, its own database), started now."""
    (tmp_path / "ref.json").write_text(json.dumps(spec))
    return subprocess.Popen([str(TRAINQ), "run", str(tmp_path / "ref.json"), "--quiet",
                             "--db", str(tmp_path / "ref.db"), "--out", str(tmp_path / "ref")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reference_losses(tmp_path, ref):
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err[-2000:]
    db = sqlite3.connect(str(tmp_path / "ref.db"))
    try:
        return json.loads(out), [r[0] for r in db.execute("select loss from steps order by step")]
    finally:
        db.close()


def each_step_once(d, jid, n):
    rows = d.query("select count(*) as n, count(distinct step) as u, min(step) as a, max(step) as b "
                   "from steps where job_id = ?", (jid,))[0]
    assert (rows["n"], rows["u"], rows["a"], rows["b"]) == (n, n, 1, n), rows


def requeue(d, jid):
    return d.request("POST", "/v1/jobs/%d/requeue" % jid)


def state_events(d, jid):
    return [json.loads(r["data"]) for r in d.query("select data from events where job_id = ? and type = 'state' "
                                                   "order by id", (jid,))]


def cli(*args, timeout=60):
    return subprocess.run([str(TRAINQ)] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


# ---------------------------------------------------------------- requeue

def test_cancel_then_requeue_resumes_bit_for_bit(make_daemon, tmp_path):
    spec = ref_spec()
    ref = reference_run(tmp_path, spec)
    try:
        d = make_daemon()
        jid = d.submit(spec)["id"]
        d.wait_step(jid, 30, timeout=120)
        r = d.request("POST", "/v1/jobs/%d/cancel" % jid)
        assert r.status == 200, r
        j = d.wait_state(jid, {"cancelled", "succeeded", "failed"}, timeout=60)
        assert j["state"] == "cancelled", j
        k = j["progress"]["step"]
        assert 30 <= k < 120, j
        assert (d.job_dir(jid) / "checkpoint.safetensors").is_file()

        # a cancelled job will never have a model: 409, naming the step, pointing to requeue
        err = check_error(d.request("GET", "/v1/jobs/%d/model" % jid), 409)
        assert err["code"] == "no_model", err
        assert "cancelled at step %d" % k in err["message"] and "requeue" in err["message"], err

        r = requeue(d, jid)
        assert r.status == 200, r
        q = r.json()
        assert q["state"] in ("queued", "running"), q
        assert q["requeues"] == 1 and q["requeued_at"], q
        assert q["error"] is None and q["summary"] is None, q
        if q["state"] == "queued":
            assert q["finished_at"] is None and q["started_at"] is None and q["attempts"] == 0, q
        j = d.wait_state(jid, {"succeeded", "failed", "cancelled"}, timeout=180)
        assert j["state"] == "succeeded", j
        assert j["attempts"] == 1 and j["requeues"] == 1, j
        each_step_once(d, jid, 120)
        # it resumed after step k: the steps up to k were written before the requeue, the rest after
        times = {r["step"]: r["time"] for r in d.query("select step, time from steps where job_id = ?", (jid,))}
        requeued_ms = d.query("select requeued_at from jobs where id = ?", (jid,))[0]["requeued_at"]
        assert times[k] < requeued_ms <= times[k + 1], (k, times[k], requeued_ms, times[k + 1])
        # the history: the requeue's state event keeps the outcome it replaced
        ev = [e for e in state_events(d, jid) if "requeued" in e]
        assert len(ev) == 1 and ev[0]["state"] == "queued", ev
        assert ev[0]["requeued"]["from"] == "cancelled" and ev[0]["requeued"]["step"] == k, ev
        assert ev[0]["requeued"]["requeues"] == 1 and ev[0]["requeued"]["finished_at"], ev
        assert d.get("/v1/jobs/%d/model" % jid).status == 200
        want, ref_losses = reference_losses(tmp_path, ref)
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait()
    # the same numbers as the uninterrupted run, bit for bit
    got = [r["loss"] for r in d.query("select loss from steps where job_id = ? order by step", (jid,))]
    assert got == ref_losses
    for key in ("final_loss", "val_loss", "val_accuracy", "steps", "samples"):
        assert j["summary"][key] == want[key], (key, j["summary"][key], want[key])


def test_killed_worker_in_words_then_requeue(make_daemon):
    d = make_daemon()
    jid = d.submit(ref_spec(steps=150))["id"]
    d.wait_step(jid, 25, timeout=120)
    os.kill(the_worker(d, jid), signal.SIGKILL)
    j = d.wait_state(jid, {"failed", "succeeded", "cancelled"}, timeout=60)
    assert j["state"] == "failed" and j["error"]["code"] == "worker_crashed", j
    msg = j["error"]["message"]
    assert "killed by signal 9 (Killed)" in msg and "OOM killer" in msg, msg
    err = check_error(d.request("GET", "/v1/jobs/%d/model" % jid), 409)
    assert err["code"] == "no_model" and "failed at step" in err["message"], err
    # steps past the last checkpoint were recorded; the resume recomputes them, recording none twice
    recorded = d.query("select max(step) as m from steps where job_id = ?", (jid,))[0]["m"]
    assert recorded >= 25
    # the client's requeue --wait: requeued, then followed to its end, exit 0 as it succeeded
    r = cli("requeue", jid, "--wait", "--server", "http://127.0.0.1:%d" % d.port, timeout=180)
    assert r.returncode == 0, r
    assert "job %d requeued: it resumes after step" % jid in r.stdout, r
    assert "job %d succeeded: 150 steps" % jid in r.stderr, r
    j = d.job(jid)
    assert j["state"] == "succeeded", j
    each_step_once(d, jid, 150)
    ev = [e for e in state_events(d, jid) if "requeued" in e]
    assert ev[0]["requeued"]["from"] == "failed" and ev[0]["requeued"]["error"]["code"] == "worker_crashed", ev


def test_requeue_refusals_and_the_cli(make_daemon):
    d = make_daemon()
    server = "http://127.0.0.1:%d" % d.port
    done = d.submit(small(steps=4, name="done"))["id"]
    d.wait_state(done, "succeeded", timeout=60)
    run = d.submit(medium(steps=20000, name="runs"))["id"]
    queued = d.submit(small(steps=3, name="behind"))["id"]   # --devices cpu: one job at a time
    d.wait_step(run, 2, timeout=60)
    assert d.job(queued)["state"] == "queued"

    err = check_error(requeue(d, 999999), 404)
    assert err["code"] == "not_found", err
    check_error(d.request("POST", "/v1/jobs/abc/requeue"), 400, "id")
    for jid, code, word in ((run, "not_finished", "running"), (queued, "not_finished", "queued"),
                            (done, "already_succeeded", "nothing to resume")):
        err = check_error(requeue(d, jid), 409)
        assert err["code"] == code and word in err["message"] and "job %d" % jid in err["message"], err
    assert d.job(done)["state"] == "succeeded" and d.job(queued)["state"] == "queued"
    check_error(d.request("GET", "/v1/jobs/%d/requeue" % done), 405)
    # a running job has no model yet: 404, "not yet"
    err = check_error(d.request("GET", "/v1/jobs/%d/model" % run), 404)
    assert err["code"] == "no_model" and "not yet" in err["message"], err

    # the client: refusals exit 1 with the daemon's message, usage 2, no daemon 3
    r = cli("requeue", run, "--server", server)
    assert r.returncode == 1 and "only a failed or cancelled job" in r.stderr, r
    assert cli("requeue", "--server", server).returncode == 2
    assert cli("requeue", "x1", "--server", server).returncode == 2
    assert cli("requeue", "--bogus", "1", "--server", server).returncode == 2
    r = cli("requeue", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: trainq requeue") and "exit:" in r.stdout, r
    assert cli("requeue", "1", "--server", "http://127.0.0.1:%d" % free_port()).returncode == 3

    # a job cancelled while queued has no checkpoint: it starts at step 0 and records each step once
    assert d.request("POST", "/v1/jobs/%d/cancel" % queued).json()["state"] == "cancelled"
    assert d.request("POST", "/v1/jobs/%d/cancel" % run).status == 200
    d.wait_state(run, "cancelled", timeout=60)
    r = cli("requeue", queued, "--server", server)
    assert r.returncode == 0 and "job %d requeued: it starts at step 0" % queued in r.stdout, r
    j = d.wait_state(queued, {"succeeded", "failed"}, timeout=60)
    assert j["state"] == "succeeded" and j["requeues"] == 1, j
    each_step_once(d, queued, 3)
    # several ids: the refused one makes the exit 1, the others are requeued
    r = cli("requeue", done, run, "--server", server)
    assert r.returncode == 1 and "job %d succeeded" % done in r.stderr, r
    assert re.search(r"job %d requeued: it resumes after step \d+ of 20000" % run, r.stdout), r
    d.wait_step(run, 1, timeout=60)
    assert d.request("POST", "/v1/jobs/%d/cancel" % run).status == 200
    d.wait_state(run, "cancelled", timeout=60)


def test_damaged_checkpoint_and_failures_a_requeue_would_repeat(make_daemon):
    d = make_daemon()
    jid = d.submit(ref_spec(steps=80))["id"]
    d.wait_step(jid, 20, timeout=120)
    assert d.request("POST", "/v1/jobs/%d/cancel" % jid).status == 200
    k = d.wait_state(jid, "cancelled", timeout=60)["progress"]["step"]
    ckpt = d.job_dir(jid) / "checkpoint.safetensors"
    ckpt.write_bytes(ckpt.read_bytes()[:100])                   # damaged
    assert requeue(d, jid).status == 200
    j = d.wait_state(jid, {"failed", "succeeded"}, timeout=60)
    assert j["state"] == "failed" and j["error"]["code"] == "invalid_checkpoint", j
    # the next requeue moves it aside: the job starts over at step 0, each step still recorded once
    assert requeue(d, jid).status == 200
    assert (d.job_dir(jid) / "checkpoint.safetensors.damaged").is_file()
    j = d.wait_state(jid, {"failed", "succeeded"}, timeout=120)
    assert j["state"] == "succeeded" and j["requeues"] == 2, j
    each_step_once(d, jid, 80)
    assert k >= 20

    # failures a requeue would repeat (made so in the database), and a plan no device holds now
    def finished_as(state, code, **cols):
        con = sqlite3.connect(str(d.db), timeout=10)
        sets = ", ".join(["state = ?", "error_code = ?"] + ["%s = ?" % c for c in cols])
        con.execute("update jobs set %s where id = ?" % sets, [state, code] + list(cols.values()) + [jid])
        con.commit()
        con.close()
    for code in ("invalid_spec", "memory_limit", "input_changed"):
        finished_as("failed", code)
        err = check_error(requeue(d, jid), 409)
        assert err["code"] == "not_requeueable" and code in err["message"], err
        assert d.job(jid)["state"] == "failed"
    finished_as("cancelled", None, planned_cpu_bytes=1 << 50)
    err = check_error(requeue(d, jid), 422)
    assert err["code"] == "cannot_fit" and "budget of cpu" in err["message"], err
    assert d.job(jid)["state"] == "cancelled"


def test_owner_rules_as_for_cancel(make_daemon):
    """Requeue takes cancel's owner check: the owner or an admin (root) may, another user gets 403
    naming the owner. Requests as other users come from children that drop root (test_owners)."""
    if os.geteuid() != 0:
        pytest.skip("switching users needs root")
    d = make_daemon()
    r = as_user(d, "daemon", "POST", "/v1/jobs", small(steps=3, priority=-5))
    assert r["status"] == 201, r
    jid = r["json"]["id"]
    busy = d.submit(medium(steps=20000))["id"]           # keeps the CPU so that the job stays queued
    assert as_user(d, "daemon", "POST", "/v1/jobs/%d/cancel" % jid)["status"] == 200
    r = as_user(d, "nobody", "POST", "/v1/jobs/%d/requeue" % jid)
    assert r["status"] == 403 and r["json"]["error"]["code"] == "forbidden", r
    assert "belongs to daemon" in r["json"]["error"]["message"], r
    assert d.job(jid)["state"] == "cancelled"
    r = as_user(d, "daemon", "POST", "/v1/jobs/%d/requeue" % jid)
    assert r["status"] == 200 and r["json"]["state"] == "queued", r
    assert d.request("POST", "/v1/jobs/%d/cancel" % jid).status == 200     # root: an admin
    assert requeue(d, jid).status == 200
    assert d.request("POST", "/v1/jobs/%d/cancel" % busy).status == 200
    assert d.wait_state(jid, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"


# ---------------------------------------------------------------- dependencies

def test_after_runs_once_its_dependency_succeeded(make_daemon):
    d = make_daemon()
    a = d.submit(medium(steps=60, name="a"))["id"]
    b = d.submit(small(steps=4, name="b", after=[a], priority=50))["id"]
    j = d.job(b)
    assert j["state"] == "queued" and j["spec"]["after"] == [a], j
    # it waits, saying for which job
    wf = wait_until(lambda: d.job(b)["waiting_for"], 30, "job %d's waiting_for" % b)
    assert wf["reason"] == "dependency" and wf["after"] == [a], wf
    a_done = d.wait_state(a, {"succeeded", "failed"}, timeout=120)
    assert a_done["state"] == "succeeded", a_done
    jb = d.wait_state(b, {"succeeded", "failed"}, timeout=60)
    assert jb["state"] == "succeeded", jb
    # events order: b started after a succeeded
    rows = d.query("select job_id, json_extract(data, '$.state') as state, id from events "
                   "where type = 'state' and job_id in (?, ?) order by id", (a, b))
    seq = [(r["job_id"], r["state"]) for r in rows]
    assert seq.index((b, "running")) > seq.index((a, "succeeded")), seq
    assert jb["started_at"] >= a_done["finished_at"], (jb, a_done)


def test_failed_dependency_fails_the_chain_and_requeue(make_daemon):
    d = make_daemon()
    a = d.submit(medium(steps=20000, name="a"))["id"]
    b = d.submit(small(steps=3, name="b", after=[a]))["id"]
    c = d.submit(small(steps=3, name="c", after=[b]))["id"]
    e = d.submit(small(steps=3, name="e", after=[c]))["id"]
    d.wait_step(a, 2, timeout=60)
    assert d.request("POST", "/v1/jobs/%d/cancel" % a).status == 200
    assert d.wait_state(a, {"cancelled", "failed", "succeeded"}, timeout=60)["state"] == "cancelled"
    jb, jc, je = (d.wait_state(x, {"failed", "succeeded"}, timeout=30) for x in (b, c, e))
    for j, dep, outcome in ((jb, a, "was cancelled"), (jc, b, "failed with dependency_failed"),
                            (je, c, "failed with dependency_failed")):
        assert j["state"] == "failed" and j["error"]["code"] == "dependency_failed", j
        assert "job %d" % dep in j["error"]["message"] and outcome in j["error"]["message"], j["error"]
        assert j["started_at"] is None and j["finished_at"], j
    # a new job after a failed one: accepted, failed at once
    f = d.submit(small(steps=3, after=[b]))
    assert f["state"] == "failed" and f["error"]["code"] == "dependency_failed", f
    # requeue of a dependent while its dependency is failed: 409 naming it
    err = check_error(requeue(d, b), 409, "after")
    assert err["code"] == "dependency_failed" and "job %d" % a in err["message"], err
    # the dependency first, then the chain: they run in order and succeed
    r = cli("requeue", a, b, c, e, "--server", "http://127.0.0.1:%d" % d.port)
    assert r.returncode == 0, r
    wf = wait_until(lambda: d.job(c)["waiting_for"], 30, "job %d's waiting_for" % c)
    assert wf["reason"] == "dependency" and wf["after"] == [b], wf
    d.wait_step(a, 3, timeout=60)
    assert d.request("POST", "/v1/jobs/%d/cancel" % a).status == 200   # and once more: the chain fails again
    for x in (b, c, e):
        assert d.wait_state(x, {"failed", "succeeded"}, timeout=30)["error"]["code"] == "dependency_failed"


def test_chain_succeeds_in_order(make_daemon):
    d = make_daemon()
    a = d.submit(small(steps=5, name="a"))["id"]
    b = d.submit(small(steps=5, name="b", after=[a]))["id"]
    c = d.submit(small(steps=5, name="c", after=[a, b], priority=100))["id"]
    for x in (a, b, c):
        assert d.wait_state(x, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"
    rows = d.query("select job_id, json_extract(data, '$.state') as state from events "
                   "where type = 'state' order by id")
    seq = [(r["job_id"], r["state"]) for r in rows]
    assert seq.index((a, "succeeded")) < seq.index((b, "running")) < seq.index((b, "succeeded")) \
        < seq.index((c, "running")), seq


def test_a_waiting_dependent_holds_nothing(make_daemon):
    """With the backfill window at 0 every job that waits would hold its device at once: one that
    waits for a dependency must not, so the job behind it still runs."""
    d = make_daemon(args=["--max-jobs-per-device", "2", "--backfill-window", "0"])
    long_a = d.submit(medium(steps=20000, name="long"))["id"]
    d.wait_step(long_a, 1, timeout=60)
    w = d.submit(small(steps=3, name="waits", after=[long_a], priority=100))["id"]
    x = d.submit(small(steps=3, name="behind"))["id"]
    assert d.wait_state(x, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"
    j = d.job(w)
    assert j["state"] == "queued" and j["waiting_for"]["reason"] == "dependency", j
    assert j["waiting_for"]["after"] == [long_a], j
    assert d.request("POST", "/v1/jobs/%d/cancel" % long_a).status == 200
    j = d.wait_state(w, {"failed", "succeeded"}, timeout=60)
    assert j["error"]["code"] == "dependency_failed" and "was cancelled" in j["error"]["message"], j


def test_after_names_existing_jobs(make_daemon):
    d = make_daemon()
    a = d.submit(small(steps=2))["id"]
    err = check_error(d.request("POST", "/v1/jobs", small(after=[a, 987654])), 422, "after[1]")
    assert err["code"] == "invalid_dependency" and "987654" in err["message"], err
    err = check_error(d.request("POST", "/v1/jobs", small(after=[a + 1])), 422, "after[0]")   # itself, to be
    assert err["code"] == "invalid_dependency", err
    check_error(d.request("POST", "/v1/jobs", small(after=["x"])), 400, "after[0]")
    check_error(d.request("POST", "/v1/jobs", small(after=[a, a])), 400, "after[1]")
    assert d.query("select count(*) as n from jobs")[0]["n"] == 1
    # deleted after it succeeded: a job already waiting for it still runs; a new one cannot name it
    d.wait_state(a, "succeeded", timeout=60)
    b = d.submit(small(steps=2, after=[a]))["id"]
    assert d.wait_state(b, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"
    assert d.request("DELETE", "/v1/jobs/%d" % a).status == 204
    check_error(d.request("POST", "/v1/jobs", small(after=[a])), 422, "after[0]")
