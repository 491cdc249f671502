"""Each job's own log (issue 17): the worker's stdout and stderr go to jobs/<id>/log, not the
daemon's journal; GET /v1/jobs/{id}/log serves it, ?follow=1 streams it until the job ends,
and a failed job's error points to it; a job whose dataset breaks before it starts says why
there, in `trainq logs` and in `trainq show` (test_dashboard checks its page)."""
import http.client
import os
import struct
import subprocess
import time

from test_daemon import TRAINQ, long_job, make_daemon  # noqa: F401 (fixture)


def spec(**kw):
    s = {"model": "cnn", "dataset": "synthetic", "device": "cpu", "threads": 1, "batch_size": 16,
         "steps": 5, "shuffle": False, "eval_every": 0,
         "synthetic": {"train": 256, "test": 32, "height": 8, "width": 8, "channels": 1}}
    s.update(kw)
    return s


def test_log_of_a_job_and_following_it(make_daemon, tmp_path):
    d = make_daemon()
    jid = d.submit(spec(name="logged"))["id"]
    j = d.wait_state(jid, "succeeded", timeout=120)
    assert j["log"] == "/v1/jobs/%d/log" % jid
    r = d.request("GET", j["log"])
    assert r.status == 200 and r.ctype.startswith("text/plain"), r
    text = r.body.decode()
    assert "job %d starts on cpu" % jid in text and "trainq worker: job %d: succeeded" % jid in text, text
    assert "trainq worker: job %d" % jid not in d.log_tail(), "worker output stays out of the daemon's log"

    # a failing job: its error says where its output is
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    fid = d.submit(spec(name="fails", init_from=str(bad)))["id"]
    f = d.wait_state(fid, "failed", timeout=120)
    assert f["error"]["code"] == "invalid_init_from", f
    assert "invalid_init_from" in d.request("GET", f["log"]).body.decode()

    # follow: the answer stays open while the job runs and ends with it
    lid = d.submit(spec(name="long", steps=400, checkpoint_every=1000))["id"]
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
    t0 = time.monotonic()
    conn.request("GET", "/v1/jobs/%d/log?follow=1" % lid, headers={"Host": "127.0.0.1"})
    resp = conn.getresponse()
    assert resp.status == 200
    body = resp.read().decode()                     # returns when the job has ended
    conn.close()
    assert "trainq worker: job %d: succeeded" % lid in body, body[-2000:]
    assert d.job(lid)["state"] == "succeeded"
    assert time.monotonic() - t0 < 120
    r = d.request("GET", "/v1/jobs/%d/log?previous=1" % lid)
    assert r.status == 404 and r.json()["error"]["code"] == "not_found"    # never rotated
    assert d.request("GET", "/v1/jobs/%d/log?follow=2" % lid).status == 400
    assert d.request("GET", "/v1/jobs/999/log").status == 404



def test_follow_ends_when_the_daemon_stops(make_daemon):
    """A follower is a suspended connection most of the time: SIGTERM must resume and end it
    (its answer completes) and the daemon must exit 0, promptly, not wait on the reader."""
    import threading
    d = make_daemon()
    jid = d.submit(long_job(name="followed"))["id"]
    d.wait_state(jid, "running", timeout=60)
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    conn.request("GET", "/v1/jobs/%d/log?follow=1" % jid, headers={"Host": "127.0.0.1"})
    resp = conn.getresponse()
    assert resp.status == 200
    got = {}

    def read_all():
        try:
            got["body"] = resp.read().decode()
        except Exception as e:   # noqa: BLE001 — the test says which
            got["error"] = repr(e)
    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    time.sleep(1.0)                      # the follower reaches the end of the file and suspends
    assert reader.is_alive(), got
    t0 = time.monotonic()
    rc = d.stop(timeout=60)
    reader.join(timeout=30)
    conn.close()
    assert rc == 0, d.log_tail()
    assert not reader.is_alive(), "the follow answer did not end when the daemon stopped"
    assert "body" in got, got            # ended as a complete chunked answer, not a reset
    assert "job %d starts on cpu" % jid in got["body"], got["body"][-2000:]
    assert time.monotonic() - t0 < 30


# ---------------------------------------------------------------- a dataset that breaks
def idx_dataset(path, n_train=64, n_test=16):
    """A small data_dir in Fashion-MNIST's layout (train-/t10k-, images-idx3/labels-idx1, plain
    IDX files of 28x28 images; train/dataset.c also reads them gzip'd)."""
    path.mkdir()
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        (path / ("%s-images-idx3-ubyte" % prefix)).write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + bytes((i * 7) % 256 for i in range(n * 28 * 28)))
        (path / ("%s-labels-idx1-ubyte" % prefix)).write_bytes(
            struct.pack(">II", 2049, n) + bytes(i % 10 for i in range(n)))
    return path


def job_whose_dataset_breaks(d, tmp_path):
    """A Fashion-MNIST job whose files are fine when it is submitted (submission reads them all:
    a corrupt set is a 400 there) and truncated before it starts, as a copy or download still
    going on would leave them: it waits behind a job holding the CPU, the train images are cut
    in place (the same directory, so not input_changed), the other job is cancelled. Returns the
    failed job and the message its error must carry."""
    data = idx_dataset(tmp_path / "fmnist")
    blocker = d.submit(long_job(name="blocker"))["id"]
    d.wait_state(blocker, "running", timeout=60)
    jid = d.submit({"name": "broken-data", "model": "mlp", "dataset": "fashion-mnist",
                    "data_dir": str(data), "device": "cpu", "threads": 1, "batch_size": 16,
                    "steps": 4})["id"]
    images = data / "train-images-idx3-ubyte"
    with open(images, "r+b") as f:
        f.truncate(16 + 10 * 28 * 28)          # the header says 64 images; 10 are left
    r = d.request("POST", "/v1/jobs/%d/cancel" % blocker, body=b"{}",
                  headers={"Content-Type": "application/json"})
    assert r.status == 200, r
    j = d.wait_state(jid, "failed", timeout=120)
    assert j["error"]["code"] == "invalid_data", j
    assert str(images) in j["error"]["message"] and "truncated" in j["error"]["message"], j
    return j, "invalid_data: " + j["error"]["message"]


def test_dataset_error_in_the_log_and_the_client(make_daemon, tmp_path):
    """The reason a job failed on its dataset is in its log (GET .../log, `trainq logs ID`) and
    in `trainq show ID`, word for word as in the job's error."""
    d = make_daemon()
    j, reason = job_whose_dataset_breaks(d, tmp_path)
    log = d.request("GET", j["log"]).body.decode()
    assert "trainq worker: job %d: failed: %s" % (j["id"], reason) in log, log
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINQ_SERVER", "TRAINQ_SOCKET")}
    server = "http://127.0.0.1:%d" % d.port
    for args in (["logs", str(j["id"])], ["show", str(j["id"])]):
        r = subprocess.run([str(TRAINQ)] + args + ["--server", server], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60, env=env, cwd=str(tmp_path))
        assert r.returncode == 0, (args, r)
        assert j["error"]["message"] in r.stdout and "invalid_data" in r.stdout, (args, r.stdout)
