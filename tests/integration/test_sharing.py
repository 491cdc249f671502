"""Sharing the devices (issue 14): several jobs at once on a device, packed by their planned
peaks; backfill with a starvation window; batch_size "auto" through the daemon; kill -9 of the
daemon and its workers with two jobs running; bad flags and specs.

The CPU stands in for a GPU here, with the budget and job counts set small: the placement rules
are the same code for both (daemon/sched.c), and unit-tested without processes in
tests/unit/test_sched.c."""
import json
import math
import os
import signal
import struct
import subprocess
import time

import pytest

from test_daemon import TRAINQ, Daemon, make_daemon, wait_until, worker_pids  # noqa: F401 (fixture)

MIB = 1 << 20


def syn(model="cnn", batch=32, steps=40, **kw):
    hw, ch = (28, 1) if model in ("cnn", "mlp") else (32, 3)
    s = {"model": model, "dataset": "synthetic", "device": "cpu", "threads": 1, "batch_size": batch,
         "steps": steps, "shuffle": False, "checkpoint_every": 1000, "eval_every": 0,
         "synthetic": {"train": 1024, "test": 64, "height": hw, "width": hw, "channels": ch}}
    s.update(kw)
    return s


def plan_bytes(tmp_path, spec):
    """The bytes placement counts for spec on the CPU: `trainq plan`'s planned peak."""
    p = tmp_path / ("plan-%d.json" % abs(hash(json.dumps(spec, sort_keys=True))))
    p.write_text(json.dumps(spec))
    r = subprocess.run([str(TRAINQ), "plan", str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["planned_peak_bytes"]


def run_alone(tmp_path, spec, name):
    p = tmp_path / (name + ".json")
    p.write_text(json.dumps(spec))
    r = subprocess.run([str(TRAINQ), "run", str(p), "--db", str(tmp_path / (name + ".db")),
                        "--out", str(tmp_path / name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def running_intervals(d, jid):
    """[(start_ms, end_ms)] of job jid's 'running' spells from the events table."""
    ev = d.query("select time, json_extract(data, '$.state') as state from events "
                 "where job_id = ? and type = 'state' order by id", (jid,))
    spans, start = [], None
    for e in ev:
        if e["state"] == "running":
            start = e["time"]
        elif start is not None:
            spans.append((start, e["time"]))
            start = None
    return spans


def mib_ceil(b):
    return int(math.ceil(b / MIB))


def test_two_jobs_share_the_cpu_a_third_waits_for_memory(make_daemon, tmp_path):
    specs = [syn(steps=150, seed=i, name="pack-%d" % i) for i in range(3)]
    need = plan_bytes(tmp_path, specs[0])
    budget_mb = mib_ceil(2.5 * need)            # two fit, three do not
    d = make_daemon(args=["--max-jobs-per-device", "3", "--cpu-memory-mb", str(budget_mb)])
    ids = [d.submit(s)["id"] for s in specs]

    # the third waits, and says for what: memory on the cpu, with the numbers
    def third_waits():
        j = d.job(ids[2])
        w = j.get("waiting_for")
        return j if j["state"] == "queued" and w and w["reason"] == "memory" else None
    j3 = wait_until(third_waits, 60, "job 3 to wait for memory")
    w = j3["waiting_for"]
    assert w["device"] == "cpu" and w["needs_bytes"] == need, w
    assert w["free_bytes"] == budget_mb * MIB - 2 * need, w
    assert [d.job(i)["state"] for i in ids[:2]] == ["running", "running"]
    dev = [x for x in d.get("/v1/devices")["devices"] if x["id"] == "cpu"][0]
    assert dev["budget_bytes"] == budget_mb * MIB and dev["running_jobs"] == 2, dev
    assert dev["planned_bytes"] == 2 * need and sorted(x["id"] for x in dev["jobs"]) == ids[:2], dev
    assert all(x["planned_bytes"] == need and x["threads"] == 1 for x in dev["jobs"]), dev
    metrics = d.get("/metrics").body.decode()
    assert 'trainq_device_planned_bytes{device="cpu"} %d' % (2 * need) in metrics
    assert 'trainq_device_running_jobs{device="cpu"} 2' in metrics

    for i in ids:
        d.wait_state(i, "succeeded", timeout=180)
    a, b, c = (running_intervals(d, i) for i in ids)
    assert len(a) == len(b) == len(c) == 1, (a, b, c)
    assert a[0][0] < b[0][1] and b[0][0] < a[0][1], "the first two ran at the same time"
    assert c[0][0] >= min(a[0][1], b[0][1]), "the third started when one of them ended"
    # packing changes nothing of the training: each equals its run alone with the same threads
    for i, s in zip(ids, specs):
        alone = run_alone(tmp_path, s, "alone-%d" % i)
        got = d.job(i)
        assert got["device"] == "cpu" and got["threads"] == 1, got
        assert got["summary"]["final_loss"] == alone["final_loss"], (got["summary"], alone)


def test_backfill_then_the_window_holds_the_device(make_daemon, tmp_path):
    long_ = syn(batch=128, steps=100000, name="long")   # runs until the test cancels it
    big = syn(batch=512, steps=3, name="big")
    small = syn(batch=8, steps=3, name="small")
    nl, nb, ns = (plan_bytes(tmp_path, s) for s in (long_, big, small))
    assert nb > 2 * ns
    budget_mb = mib_ceil(max(nl + 3 * ns, nb + ns))   # long + smalls fit, big + small fit; long + big not
    assert nl + nb > budget_mb * MIB and nb + ns <= budget_mb * MIB
    d = make_daemon(args=["--max-jobs-per-device", "4", "--cpu-memory-mb", str(budget_mb),
                          "--backfill-window", "3s"])
    jl = d.submit(long_)["id"]
    d.wait_step(jl, 1, timeout=60)
    jb = d.submit(big)["id"]
    js1 = d.submit(small)["id"]
    # backfill: the small job behind the big one starts and finishes while the big one waits
    d.wait_state(js1, "succeeded", timeout=60)
    j = d.job(jb)
    assert j["state"] == "queued" and j["waiting_for"]["reason"] == "memory", j
    assert d.job(jl)["state"] == "running"
    # past the window the device is held for the big job: a later small one waits behind it
    time.sleep(3.5)
    js2 = d.submit(dict(small, name="small-2"))["id"]

    def held():
        w = d.job(js2).get("waiting_for")
        return w if w and w["reason"] == "priority" else None
    w = wait_until(held, 20, "the small job to wait behind the held device")
    assert w["behind"] == jb and w["device"] == "cpu", w
    assert d.job(jl)["state"] == "running"
    assert d.request("POST", "/v1/jobs/%d/cancel" % jl, {}).status == 200
    d.wait_state(jl, "cancelled", timeout=60)
    for i in (jb, js2):
        d.wait_state(i, "succeeded", timeout=120)
    (sb, _), = running_intervals(d, jb)
    (s2, _), = running_intervals(d, js2)
    assert sb <= s2, "the held-for job started first"


AUTO_BASE = {"dataset": "synthetic", "model": "resnet20", "threads": 2, "device": "cpu",
             "synthetic": {"train": 512, "test": 64, "height": 32, "width": 32, "channels": 3},
             "steps": 5, "shuffle": False, "seed": 3}


def safetensors_tensors(blob):
    """{name: bytes} of a safetensors file (the header's metadata left out)."""
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def test_auto_batch_through_the_daemon(make_daemon, tmp_path):
    d = make_daemon(args=["--max-jobs-per-device", "2"])   # the two jobs run side by side
    auto = d.submit(dict(AUTO_BASE, effective_batch=256, batch_size="auto", max_memory_mb=60, name="auto"))
    sp, bt = auto["spec"], auto["batch"]
    b, k = bt["batch_size"], bt["accum_steps"]
    assert sp["batch_size"] == "auto" and sp["accum_steps"] == k and sp["effective_batch"] == 256, sp
    assert bt["auto"] is True and bt["effective_batch"] == 256 and b * k == 256 and b < 256, bt
    explicit = d.submit(dict(AUTO_BASE, batch_size=b, accum_steps=k, name="explicit"))
    ja, je = auto["id"], explicit["id"]
    for i in (ja, je):
        j = d.wait_state(i, ("succeeded", "failed"), timeout=300)
        assert j["state"] == "succeeded", j
    sa = d.job(ja)["summary"]
    assert sa["effective_batch"] == 256 and sa["predicted_peak_bytes"] <= 60 * MIB, sa
    steps = d.steps(ja)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert all(s["mem_peak_bytes"] <= 60 * MIB for s in steps), steps
    wa = safetensors_tensors(d.get("/v1/jobs/%d/model" % ja).body)
    we = safetensors_tensors(d.get("/v1/jobs/%d/model" % je).body)
    assert wa.keys() == we.keys() and all(wa[n] == we[n] for n in wa), "auto == explicit, bit for bit"

    # a cap below a micro-batch of 1: 422 naming both numbers
    r = d.request("POST", "/v1/jobs", dict(AUTO_BASE, effective_batch=256, batch_size="auto", max_memory_mb=1))
    assert r.status == 422, r
    e = r.json()["error"]
    assert e["code"] == "cannot_fit" and e["field"] == "max_memory_mb", e
    assert "micro-batch of 1" in e["message"] and "1048576 bytes" in e["message"], e


def test_kill9_with_two_jobs_running_both_finish_every_step_once(make_daemon, tmp_path):
    st = tmp_path / "state"
    d = make_daemon(state_dir=st, args=["--max-jobs-per-device", "2", "--cpu-memory-mb", "2000"])
    ids = [d.submit(syn(steps=300, seed=i, checkpoint_every=10, name="k9-%d" % i))["id"] for i in range(2)]
    for i in ids:
        d.wait_step(i, 15, timeout=120)
    workers = worker_pids(d)
    assert len(workers) == 2, workers
    os.killpg(d.pid, signal.SIGKILL)                 # the daemon and its workers, as a crash would
    d.proc.wait(timeout=30)
    wait_until(lambda: not worker_pids(d), 30, "the workers to die with the daemon")
    d2 = make_daemon(state_dir=st, args=["--max-jobs-per-device", "2", "--cpu-memory-mb", "2000"])
    for i in ids:
        j = d2.wait_state(i, ("succeeded", "failed"), timeout=240)
        assert j["state"] == "succeeded", j
        rows = d2.query("select step, count(*) as n from steps where job_id = ? group by step order by step", (i,))
        assert [r["step"] for r in rows] == list(range(1, 301)) and all(r["n"] == 1 for r in rows)


def serve_fails(tmp_path, *args):
    r = subprocess.run([str(TRAINQ), "serve", "--db", str(tmp_path / "x.db"), "--listen", "127.0.0.1:0"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return r.returncode, r.stderr


@pytest.mark.parametrize("args,names", [
    (["--devices", "cpu,gpu9"], "gpu9"),
    (["--devices", "cpu,cpu"], "named twice"),
    (["--devices", "cpu,cuda:7"], "cuda:7"),
    (["--devices", "cpu", "--cpu-memory-mb", "0"], "--cpu-memory-mb"),
    (["--devices", "cpu", "--cpu-memory-mb", "-5"], "--cpu-memory-mb"),
    (["--devices", "cpu", "--max-jobs-per-device", "0"], "--max-jobs-per-device"),
    (["--devices", "cpu", "--gpu-reserve-mb", "x"], "--gpu-reserve-mb"),
    (["--devices", "cpu", "--backfill-window", "-1"], "--backfill-window"),
])
def test_bad_flags_are_named(tmp_path, args, names):
    rc, err = serve_fails(tmp_path, *args)
    assert rc == 2 and names in err, (rc, err)
    assert not (tmp_path / "x.db").exists() or True


def test_bad_specs_are_named_and_nothing_is_lost(make_daemon):
    d = make_daemon(args=["--cpu-memory-mb", "500"])
    keep = d.submit(syn(steps=2, name="keep"))["id"]
    r = d.request("POST", "/v1/jobs", syn(device="cuda:1"))
    assert r.status == 422 and r.json()["error"]["field"] == "device", r
    assert "cuda:1" in r.json()["error"]["message"] and "cpu" in r.json()["error"]["message"]
    no_batch = syn(effective_batch=256)
    del no_batch["batch_size"]
    r = d.request("POST", "/v1/jobs", no_batch)                      # neither "auto" nor a batch
    assert r.status == 400 and r.json()["error"]["field"] in ("effective_batch", "batch_size"), r
    r = d.request("POST", "/v1/jobs", syn(batch=24, effective_batch=100))   # not divisible
    assert r.status == 400 and r.json()["error"]["field"] in ("effective_batch", "batch_size"), r
    r = d.request("POST", "/v1/jobs", dict(syn(), batch_size="auto"))   # auto without effective_batch
    assert r.status == 400 and r.json()["error"]["field"] in ("effective_batch", "batch_size"), r
    # a job bigger than the whole CPU budget: refused at once, naming both numbers
    r = d.request("POST", "/v1/jobs", syn(model="resnet20", batch=4096))
    assert r.status == 422 and r.json()["error"]["code"] == "cannot_fit", r
    assert "budget of cpu" in r.json()["error"]["message"], r
    assert d.wait_state(keep, "succeeded")["name"] == "keep"
    assert [j["id"] for j in d.get("/v1/jobs")["jobs"]] == [keep]


def test_sigterm_requeues_every_running_job_and_each_resumes(make_daemon, tmp_path):
    st = tmp_path / "state"
    args = ["--max-jobs-per-device", "2", "--cpu-memory-mb", "2000"]
    d = make_daemon(state_dir=st, args=args)
    ids = [d.submit(syn(steps=300, seed=i, checkpoint_every=10, name="term-%d" % i))["id"] for i in range(2)]
    for i in ids:
        d.wait_step(i, 15, timeout=120)
    assert d.stop(signal.SIGTERM) == 0
    for i in ids:
        row = d.query("select state, checkpoint_path from jobs where id = ?", (i,))[0]
        assert row["state"] == "queued" and row["checkpoint_path"], row
    d2 = make_daemon(state_dir=st, args=args)
    for i in ids:
        j = d2.wait_state(i, ("succeeded", "failed"), timeout=240)
        assert j["state"] == "succeeded" and j["device"] == "cpu", j
        assert len(running_intervals(d2, i)) == 2, "two spells: before and after the restart"
        rows = d2.query("select count(*) as n, min(step) as a, max(step) as b from steps where job_id = ?", (i,))[0]
        assert (rows["n"], rows["a"], rows["b"]) == (300, 1, 300), rows


def test_placement_settings_from_the_config_file_and_the_flags_win(make_daemon, tmp_path):
    conf = tmp_path / "trainq.conf"
    conf.write_text("max_jobs_per_device = 2\ncpu_memory_mb = 300\nbackfill_window = 5m\n")
    d = make_daemon(state_dir=tmp_path / "a", args=["--config", str(conf)])
    cpu = [x for x in d.get("/v1/devices")["devices"] if x["id"] == "cpu"][0]
    assert cpu["budget_bytes"] == 300 * MIB and cpu["max_jobs"] == 2, cpu
    d2 = make_daemon(state_dir=tmp_path / "b", args=["--config", str(conf), "--max-jobs-per-device", "3"])
    cpu = [x for x in d2.get("/v1/devices")["devices"] if x["id"] == "cpu"][0]
    assert cpu["budget_bytes"] == 300 * MIB and cpu["max_jobs"] == 3, cpu
    conf.write_text("cpu_memory_mb = lots\n")
    rc, err = serve_fails(tmp_path, "--devices", "cpu", "--config", str(conf))
    assert rc == 2 and "--cpu-memory-mb" in err and "lots" in err, err


def test_recompute_auto_is_settled_at_submission(make_daemon, tmp_path):
    """recompute "auto" (the default) is settled when the job is submitted, from the devices it
    may use, and stored so: off when they are all the CPU (device "cpu", or "auto" on this
    daemon, which serves no GPU), so such jobs keep every activation as `trainq run` does on a
    host without a GPU; true and false are kept as given. The job runs the plan it was placed
    with: its predicted peak equals the planned one."""
    d = make_daemon()
    jobs = {}
    for name, kw in (("auto", {}), ("cpu", {"device": "cpu"}), ("kept", {"device": "cpu", "recompute": True})):
        jobs[name] = d.submit(syn("resnet20", batch=8, steps=3, name="rc-" + name, **dict({"device": "auto"}, **kw)))
    assert jobs["auto"]["planned_peak_bytes"] == jobs["cpu"]["planned_peak_bytes"], jobs
    assert jobs["kept"]["planned_peak_bytes"] < jobs["cpu"]["planned_peak_bytes"], jobs
    want = {"auto": False, "cpu": False, "kept": True}
    for name, j in jobs.items():
        d.wait_state(j["id"], "succeeded", timeout=120)
        got = d.job(j["id"])
        assert got["spec"]["recompute"] is want[name], (name, got["spec"])
        assert got["summary"]["predicted_peak_bytes"] == j["planned_peak_bytes"], (name, got["summary"], j)
    # trainq plan and trainq run settle it the same way on this host (no GPU): off for "auto"
    plans = [plan_bytes(tmp_path, syn("resnet20", batch=8, steps=3, **kw))
             for kw in ({"device": "auto"}, {"device": "cpu"}, {"device": "cpu", "recompute": True})]
    assert plans[0] == plans[1] > plans[2], plans


def test_a_busy_device_sends_the_job_back_to_the_queue(make_daemon, tmp_path):
    """A worker that finds the device it was placed on busy (another process took it since the
    placement; TQ_TEST_DEVICE_BUSY stands in for that process here) ends at once: the job goes
    back to the queue without the start counting, waits with reason device_busy while nothing is
    placed on that device for a pause, and runs once the device is free."""
    busy = tmp_path / "busy"
    busy.write_text("")
    d = make_daemon(env={"TQ_TEST_DEVICE_BUSY": str(busy)})
    jid = d.submit(syn(model="mlp", steps=5, name="turned-away"))["id"]

    def waits_busy():
        j = d.job(jid)
        w = j.get("waiting_for")
        return j if j["state"] == "queued" and w and w["reason"] == "device_busy" else None
    j = wait_until(waits_busy, 60, "the job to wait for the busy cpu")
    w = j["waiting_for"]
    assert w["device"] == "cpu"
    assert "placed on cpu, but the device is busy" in w["message"], w
    assert "nothing is placed there for" in w["message"], w
    assert j["attempts"] == 0 and j["started_at"] is None, j
    ev = [json.loads(e["data"]) for e in d.query(
        "select data from events where job_id = ? and type = 'state' order by id", (jid,))]
    turned = [e for e in ev if "device_busy" in e]
    assert turned and turned[0]["state"] == "queued" and turned[0]["device_busy"]["device"] == "cpu", ev
    assert "TQ_TEST_DEVICE_BUSY" in turned[0]["device_busy"]["message"]
    # the client shows why
    r = subprocess.run([str(TRAINQ), "show", str(jid), "--server", "http://127.0.0.1:%d" % d.port],
                       stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "busy" in r.stdout, r.stdout

    # GET /v1/devices says the device is busy, and why
    def cpu_busy():
        return [x for x in d.get("/v1/devices")["devices"] if x["id"] == "cpu"][0]["busy"]
    why = wait_until(cpu_busy, 30, "/v1/devices to show the cpu busy")
    assert "found it busy" in why and ("nothing is placed there" in why or "is trying it again" in why), why

    busy.unlink()
    j = wait_until(lambda: d.job(jid)["state"] == "succeeded" and d.job(jid), 90,
                   "the job to run once the device is free")
    assert j["attempts"] == 1 and j["waiting_for"] is None, j
    wait_until(lambda: cpu_busy() is None, 10, "the cpu to take jobs again")   # once its worker is reaped


def test_a_device_that_stays_busy_fails_the_job_after_its_tries(make_daemon, tmp_path):
    """Turned away TQ_BUSY_MAX_TRIES (8) times in a row, the job fails as device_unavailable,
    saying how often and why, and its owner's requeue runs it once the device is free. The pauses
    are cut to 100 ms (TQ_TEST_BUSY_PAUSE_MS) to get there in seconds."""
    busy = tmp_path / "busy"
    busy.write_text("")
    d = make_daemon(env={"TQ_TEST_DEVICE_BUSY": str(busy), "TQ_TEST_BUSY_PAUSE_MS": "100"})
    jid = d.submit(syn(model="mlp", steps=5, name="never-free"))["id"]
    j = wait_until(lambda: d.job(jid)["state"] == "failed" and d.job(jid), 120, "the job to give up")
    assert j["error"]["code"] == "device_unavailable", j
    msg = j["error"]["message"]
    assert "turned the job away 8 times in a row" in msg and "TQ_TEST_DEVICE_BUSY" in msg, msg
    assert "/requeue" in msg
    n_busy = d.query("select count(*) as n from events where job_id = ? and type = 'state' and "
                     "json_extract(data, '$.device_busy') is not null", (jid,))[0]["n"]
    assert n_busy == 7, n_busy      # the eighth ends it
    # requeued by its owner once the device is free, it runs
    busy.unlink()
    r = d.request("POST", "/v1/jobs/%d/requeue" % jid)
    assert r.status == 200, r
    wait_until(lambda: d.job(jid)["state"] == "succeeded", 90, "the requeued job to run")


def test_after_a_pause_one_job_tries_the_busy_device(make_daemon, tmp_path):
    """Two jobs both turned away by the busy device: after the pause one of them tries it, and
    the other waits ("is trying it again") until that one's worker says the device holds it;
    then it starts beside it."""
    busy = tmp_path / "busy"
    busy.write_text("")
    d = make_daemon(env={"TQ_TEST_DEVICE_BUSY": str(busy), "TQ_TEST_BUSY_PAUSE_MS": "1500"},
                    args=["--max-jobs-per-device", "2"])
    ids = [d.submit(syn(steps=400, seed=i, name="probe-%d" % i))["id"] for i in range(2)]
    wait_until(lambda: all((d.job(i).get("waiting_for") or {}).get("reason") == "device_busy" for i in ids),
               60, "both jobs to wait for the busy cpu")
    busy.unlink()
    seen = []

    def probing():
        js = [d.job(i) for i in ids]
        for j in js:
            w = j.get("waiting_for") or {}
            if j["state"] == "queued" and "is trying it again" in w.get("message", ""):
                seen.append((j["id"], w["message"]))
        return all(j["state"] in ("running", "succeeded") for j in js)
    wait_until(probing, 90, "both jobs to start", interval=0.02)
    assert seen, "no job waited for the probe"
    waiting = seen[0][0]
    prober = ids[1] if waiting == ids[0] else ids[0]
    assert "job %d is trying it again" % prober in seen[0][1], seen[0]
    # the second started after the first, and the daemon saw the device work
    def last_start(j):
        return d.query("select max(time) as t from events where job_id = ? and type = 'state' and "
                       "json_extract(data, '$.state') = 'running'", (j,))[0]["t"]
    assert last_start(waiting) > last_start(prober)
    assert "job %d runs there: no longer busy" % prober in d.log_tail(20000)
    for i in ids:
        d.request("POST", "/v1/jobs/%d/cancel" % i)


def test_a_cancelled_busy_job_starts_its_count_again(make_daemon, tmp_path):
    """A job cancelled while busy devices turn it away, then requeued by its owner, gets its full
    TQ_BUSY_MAX_TRIES again: the count of the cancelled run is forgotten."""
    busy = tmp_path / "busy"
    busy.write_text("")
    d = make_daemon(env={"TQ_TEST_DEVICE_BUSY": str(busy), "TQ_TEST_BUSY_PAUSE_MS": "150"})
    jid = d.submit(syn(model="mlp", steps=5, name="cancel-while-busy"))["id"]

    def turned():
        return d.query("select count(*) as n from events where job_id = ? and type = 'state' and "
                       "json_extract(data, '$.device_busy') is not null", (jid,))[0]["n"]
    wait_until(lambda: turned() >= 4, 60, "four busy turn-aways")
    r = d.request("POST", "/v1/jobs/%d/cancel" % jid)
    assert r.status == 200, r
    d.wait_state(jid, ["cancelled"], timeout=30)
    before = turned()
    time.sleep(0.5)                    # a round or two: the count is pruned
    r = d.request("POST", "/v1/jobs/%d/requeue" % jid)
    assert r.status == 200, r
    j = wait_until(lambda: d.job(jid)["state"] == "failed" and d.job(jid), 120, "the job to give up")
    assert "8 times in a row" in j["error"]["message"], j["error"]
    assert turned() - before == 7, (before, turned())   # 7 requeues, the 8th fails it
