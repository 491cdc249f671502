"""Restarts are not failures (issue 20): a job interrupted by daemon restarts — graceful
(SIGTERM, as `systemctl restart` sends) or kill -9 — keeps its attempts when each start made
progress, counts its interruptions, records every step exactly once; and a cancel asked for
just before a restart is not forgotten."""
import os
import signal

from test_daemon import make_daemon, wait_until  # noqa: F401 (fixture)

STEPS = 400


def spec(**kw):
    s = {"model": "cnn", "dataset": "synthetic", "device": "cpu", "threads": 1, "batch_size": 32,
         "steps": STEPS, "shuffle": False, "checkpoint_every": 10, "eval_every": 0,
         "synthetic": {"train": 1024, "test": 64, "height": 28, "width": 28, "channels": 1}}
    s.update(kw)
    return s


def restart(make_daemon, st, d, hard):
    if hard:
        os.killpg(d.pid, signal.SIGKILL)            # the daemon and its worker, as a crash would
        d.proc.wait(timeout=30)
    else:
        assert d.stop(signal.SIGTERM) == 0
    return make_daemon(state_dir=st)


def test_restart_soak_four_sigterms_and_a_kill9(make_daemon, tmp_path):
    st = tmp_path / "state"
    d = make_daemon(state_dir=st)
    jid = d.submit(spec(name="soak"))["id"]
    last = 0
    for k, hard in enumerate([False, False, True, False, False]):
        # progress since this start: at least one more checkpoint's worth of steps
        j = wait_until(lambda: (lambda j: j if j["state"] == "running" and j["progress"]["step"] >= last + 12
                                else None)(d.job(jid)), 120, "progress after restart %d" % k)
        assert j["attempts"] == 1 and j["interruptions"] == k, j
        assert j["progress"]["step"] < STEPS, "the job must still run when it is interrupted; make it longer"
        d = restart(make_daemon, st, d, hard)
        last = d.job(jid)["progress"]["step"]       # what the interrupted start recorded
    j = d.wait_state(jid, ("succeeded", "failed"), timeout=240)
    assert j["state"] == "succeeded", j
    assert j["attempts"] == 1 and j["interruptions"] == 5, j
    rows = d.query("select count(*) as n, count(distinct step) as u, min(step) as a, max(step) as b "
                   "from steps where job_id = ?", (jid,))[0]
    assert (rows["n"], rows["u"], rows["a"], rows["b"]) == (STEPS, STEPS, 1, STEPS), rows


def test_a_cancel_before_a_restart_is_kept(make_daemon, tmp_path):
    st = tmp_path / "state"
    d = make_daemon(state_dir=st)
    for hard in (False, True):
        jid = d.submit(spec(steps=100000, name="cancel-%s" % hard))["id"]
        d.wait_step(jid, 3, timeout=60)
        assert d.request("POST", "/v1/jobs/%d/cancel" % jid, {}).status == 200
        d = restart(make_daemon, st, d, hard)        # at once: the worker may not have seen it
        j = d.wait_state(jid, ("cancelled", "succeeded", "failed"), timeout=60)
        assert j["state"] == "cancelled", j
        assert d.query("select count(*) as n from jobs where state = 'running'")[0]["n"] == 0
