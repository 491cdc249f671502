"""Each job's own log (issue 17): the worker's stdout and stderr go to jobs/<id>/log, not the
daemon's journal; GET /v1/jobs/{id}/log serves it, ?follow=1 streams it until the job ends,
and a failed job's error points to it."""
import http.client
import time

from test_daemon import make_daemon  # noqa: F401 (fixture)


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
