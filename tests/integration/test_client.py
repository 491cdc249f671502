"""The client commands (`trainq submit/ls/show/logs/steps/cancel/rm/compare`) against the real
daemon: `trainq serve --devices cpu` on a free loopback port (test_daemon's fixture), driven the
way a user types them, with the exit codes a CLI user expects: 0 ok, 1 the operation or the job
failed, 2 bad usage, 3 no daemon. Every run of the client has a timeout; the client never sees
TRAINQ_SERVER/TRAINQ_SOCKET from the environment unless a test sets them, and runs in an empty
directory (so no ./var/trainq.sock is picked up by accident)."""
import csv
import io
import json
import os
import re
import subprocess
import time

import pytest

from test_daemon import TRAINQ, STEP_FIELDS, free_port, make_daemon, wait_until  # noqa: F401 (fixture)

COMMANDS = ["submit", "ls", "show", "logs", "steps", "cancel", "requeue", "rm", "compare"]

SYN = {"model": "cnn", "dataset": "synthetic",
       "synthetic": {"train": 256, "test": 32, "height": 8, "width": 8, "channels": 1},
       "steps": 5, "threads": 1, "device": "cpu"}


def long_spec():
    """Minutes of work: always cancelled by the test."""
    return dict(SYN, steps=2000000, synthetic=dict(SYN["synthetic"], train=4096))


@pytest.fixture
def cli(tmp_path):
    """cli(*args, server=…, env=…, timeout=…) -> CompletedProcess (text)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in ("TRAINQ_SERVER", "TRAINQ_SOCKET")}

    def run(*args, server=None, env=None, timeout=60, cwd_=None):
        argv = [str(TRAINQ)] + [str(a) for a in args]
        if server:
            argv += ["--server", server]
        return subprocess.run(argv, cwd=str(cwd_ or cwd), env=dict(base, **(env or {})),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
    return run


def url(d):
    return "http://127.0.0.1:%d" % d.port


def write_spec(tmp_path, spec, name="spec.json"):
    p = tmp_path / name
    p.write_text(json.dumps(spec))
    return p


def submit(cli, d, tmp_path, spec, *args):
    r = cli("submit", write_spec(tmp_path, spec), *args, server=url(d))
    assert r.returncode == 0, r
    assert re.fullmatch(r"\d+\n", r.stdout), r
    return int(r.stdout)


# ---------------------------------------------------------------- without a daemon

def test_help_for_each_command(cli):
    r = cli("--help")
    assert r.returncode == 0
    for c in COMMANDS:
        assert "trainq " + c in r.stdout, (c, r.stdout)
    for c in COMMANDS:
        r = cli(c, "--help")
        assert r.returncode == 0, (c, r)
        assert r.stdout.startswith("usage: trainq " + c), (c, r.stdout)
        assert "exit:" in r.stdout and r.stderr == "", (c, r)
        assert cli(c, "-h").stdout == r.stdout


def test_unreachable_daemon_exits_3(cli):
    port = free_port()   # nothing listens there
    for args in (["ls"], ["show", "1"], ["cancel", "1"], ["rm", "1"], ["steps", "1"],
                 ["logs", "1"], ["compare", "1"]):
        r = cli(*args, server="http://127.0.0.1:%d" % port)
        assert r.returncode == 3, (args, r)
        assert r.stderr.startswith("trainq: cannot reach the daemon at http://127.0.0.1:%d: "
                                   "Connection refused (start it with: trainq serve)" % port), r
    r = cli("ls", env={"TRAINQ_SERVER": "http://127.0.0.1:%d" % port})   # the environment
    assert r.returncode == 3 and "127.0.0.1:%d" % port in r.stderr, r
    r = cli("ls", env={"TRAINQ_SERVER": "unix:/nonexistent/trainq.sock"})
    assert r.returncode == 3, r
    assert "cannot reach the daemon at unix:/nonexistent/trainq.sock: No such file" in r.stderr, r


def test_owner_unknown_to_an_older_daemon(cli):
    """A daemon that does not know ?owner= answers 400 for the unknown parameter: ls says so."""
    import http.server
    import threading

    class Old(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if "owner=" in self.path:
                body = json.dumps({"error": {"code": "invalid_parameter", "field": "owner",
                                             "message": "unknown query parameter owner"}}).encode()
                self.send_response(400)
            else:
                body = json.dumps({"jobs": [{"id": 3, "name": "x", "state": "queued", "device": None,
                                             "progress": {"step": 0, "total_steps": 5, "epoch": 0},
                                             "latest": None, "summary": None,
                                             "created_at": "2024-05-01T21:01:17.841Z"}],
                                   "next": None}).encode()
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Old)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        server = "http://127.0.0.1:%d" % srv.server_address[1]
        r = cli("ls", "--owner", "me", server=server)
        assert r.returncode == 1, r
        assert "does not filter by owner" in r.stderr and "unknown query parameter owner" in r.stderr, r
        r = cli("ls", server=server)   # no owner field: "-"
        assert r.returncode == 0, r
        row = r.stdout.splitlines()[1].split()
        assert row[:4] == ["3", "-", "x", "queued"] and row[5:7] == ["0/5", "0%"], r.stdout
    finally:
        srv.shutdown()
        srv.server_close()


def test_bad_usage_exits_2(cli, tmp_path):
    server = "http://127.0.0.1:%d" % free_port()   # never reached: usage is checked first
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    cases = [
        (["show", "abc"], "not a job id"),
        (["show"], "which job"),
        (["cancel"], "which jobs"),
        (["rm", "1", "x"], "not a job id"),
        (["submit"], "which spec"),
        (["submit", tmp_path / "missing.json"], "cannot read the spec"),
        (["submit", bad], "not valid JSON"),
        (["submit", arr], "not a JSON object"),
        (["submit", bad, "--priority", "high"], "not valid JSON"),
        (["ls", "--bogus"], "unknown option --bogus (trainq ls --help"),
        (["ls", "extra"], "unexpected argument"),
        (["steps", "1", "--bogus"], "unknown option"),
        (["compare"], "which jobs"),
        (["logs", "-f", "--previous", "1"], "cannot be followed"),
    ]
    for args, msg in cases:
        r = cli(*args, server=server)
        assert r.returncode == 2, (args, r)
        assert msg in r.stderr, (args, r.stderr)
    r = cli("ls", env={"TRAINQ_SERVER": "ftp://example.org"})
    assert r.returncode == 2 and "TRAINQ_SERVER" in r.stderr, r


# ---------------------------------------------------------------- with the daemon

def test_submit_wait_ls_show_steps_compare_rm(make_daemon, cli, tmp_path):
    d = make_daemon()
    s = url(d)
    # submit: the id alone on stdout; overrides, --name and --priority reach the spec
    a = submit(cli, d, tmp_path, SYN, "--name", "first", "--priority", "7",
               "optimizer.lr=0.05", "amp=off", "eval_every=2")
    job = d.job(a)
    assert job["name"] == "first" and job["priority"] == 7
    assert job["spec"]["optimizer"]["lr"] == 0.05 and job["spec"]["eval_every"] == 2
    # --wait: follows the stream, exits 0 when the job succeeded
    r = cli("submit", write_spec(tmp_path, SYN), "--wait", "--name", "second", server=s, timeout=120)
    assert r.returncode == 0, r
    b = int(r.stdout)
    assert re.fullmatch(r"\d+\n", r.stdout), r
    assert "job %d succeeded" % b in r.stderr and "step 5/5" in r.stderr, r.stderr
    assert d.job(b)["state"] == "succeeded"
    d.wait_state(a, "succeeded")

    # ls: the default shows queued and running only; --all the finished too
    r = cli("ls", server=s)
    assert r.returncode == 0, r
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "OWNER", "NAME", "STATE", "DEVICE", "PROGRESS", "SAMPLES/S",
                                "MEM", "AGE"]
    assert len(lines) == 1, r.stdout
    r = cli("ls", "--all", server=s)
    assert r.returncode == 0, r
    rows = {int(l.split()[0]): l for l in r.stdout.splitlines()[1:]}
    assert set(rows) == {a, b}, r.stdout
    assert "first" in rows[a] and "succeeded" in rows[a] and "5/5 100%" in rows[a] and "MiB" in rows[a]
    assert "second" in rows[b] and " cpu " in rows[b]
    r = cli("ls", "--state", "succeeded", server=s)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r
    r = cli("ls", "--state", "bogus", server=s)
    assert r.returncode == 1 and "state" in r.stderr, r

    # show: for people, and --json as the API sends it
    r = cli("show", b, server=s)
    assert r.returncode == 0, r
    assert r.stdout.startswith("job %d  second\n" % b)
    for key in ("state", "device", "batch", "progress", "memory", "summary", "accuracy"):
        assert re.search(r"^  %s " % key, r.stdout, re.M), (key, r.stdout)
    assert re.search(r"^  state +succeeded$", r.stdout, re.M)
    assert re.search(r"^  progress +step 5 of 5 ", r.stdout, re.M)
    r = cli("show", b, "--json", server=s)
    assert r.returncode == 0, r
    j = json.loads(r.stdout)
    assert j["id"] == b and j["state"] == "succeeded" and j["summary"]["steps"] == 5
    r = cli("show", "999", server=s)
    assert r.returncode == 1 and "no job 999" in r.stderr, r

    # steps: a table, CSV with the API's header, and -f on a finished job (replays, then ends)
    r = cli("steps", b, server=s)
    assert r.returncode == 0, r
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["STEP", "EPOCH", "LOSS"] and len(lines) == 6, r.stdout
    assert [int(l.split()[0]) for l in lines[1:]] == [1, 2, 3, 4, 5]
    r = cli("steps", b, "--csv", server=s)
    assert r.returncode == 0, r
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows[0] == STEP_FIELDS and [int(x[0]) for x in rows[1:]] == [1, 2, 3, 4, 5]
    api = d.steps(b)
    r = cli("steps", b, "--csv", "-f", server=s)
    assert r.returncode == 0, r
    frows = list(csv.reader(io.StringIO(r.stdout)))
    assert frows[0] == STEP_FIELDS and len(frows) == 6
    for got, want in zip(frows[1:], api):   # the same numbers as the API's records
        assert int(got[0]) == want["step"] and float(got[2]) == want["loss"]
        assert int(got[9]) == want["mem_peak_bytes"]
    r = cli("steps", "999", server=s)
    assert r.returncode == 1 and "no job 999" in r.stderr, r

    # logs: the worker's log of a finished job
    r = cli("logs", b, server=s)
    assert r.returncode == 0, r
    assert "job %d" % b in r.stdout, r.stdout
    r = cli("logs", "999", server=s)
    assert r.returncode == 1 and "no job 999" in r.stderr, r

    # compare: both jobs in a table, the first the baseline
    r = cli("compare", a, b, server=s)
    assert r.returncode == 0, r
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "STATE", "MODEL"]
    assert lines[1].split()[0] == "%d*" % a and lines[2].split()[0] == str(b), r.stdout
    assert "1.00x" in lines[1] and "cnn" in lines[2]
    r = cli("compare", "%d,%d" % (a, b), "--baseline", b, "--json", server=s)
    assert r.returncode == 0 and json.loads(r.stdout)["baseline"] == b, r
    r = cli("compare", a, 999, server=s)
    assert r.returncode == 1 and "999" in r.stderr, r

    # rm: each id; 1 when any failed, with the daemon's message
    r = cli("rm", a, server=s)
    assert r.returncode == 0 and "job %d removed" % a in r.stdout, r
    r = cli("rm", a, b, server=s)
    assert r.returncode == 1, r
    assert "no job %d" % a in r.stderr and "job %d removed" % b in r.stdout, r
    assert d.get("/v1/jobs")["jobs"] == []


def test_wait_failing_job_exits_1(make_daemon, cli, tmp_path):
    d = make_daemon()
    spec = dict(long_spec(), timeout_s=1)   # fails with "timeout" after a second
    r = cli("submit", write_spec(tmp_path, spec), "--wait", server=url(d), timeout=120)
    assert r.returncode == 1, r
    jid = int(r.stdout)
    assert "job %d failed: timeout" % jid in r.stderr, r.stderr
    assert d.job(jid)["state"] == "failed"


def test_submit_refused(make_daemon, cli, tmp_path):
    d = make_daemon()
    r = cli("submit", write_spec(tmp_path, SYN), "batch_size=0", server=url(d))
    assert r.returncode == 2, r               # an invalid spec, as `trainq run` says it
    assert r.stdout == "" and "batch_size" in r.stderr and "invalid_spec" in r.stderr, r
    r = cli("submit", write_spec(tmp_path, SYN), "device=cuda:7", server=url(d))
    assert r.returncode == 1 and "device" in r.stderr, r      # 422: valid, cannot run here
    assert d.get("/v1/jobs")["jobs"] == []


def test_cancel_rm_and_default_ls(make_daemon, cli, tmp_path):
    d = make_daemon()
    s = url(d)
    run = submit(cli, d, tmp_path, long_spec(), "--name", "long")
    d.wait_step(run, 1)
    queued = submit(cli, d, tmp_path, SYN, "--name", "behind")   # --devices cpu: one at a time
    # ls by default: the running job, then the queued one
    r = cli("ls", server=s)
    assert r.returncode == 0, r
    rows = [l.split() for l in r.stdout.splitlines()[1:]]
    assert [(int(x[0]), x[3]) for x in rows] == [(run, "running"), (queued, "queued")], r.stdout
    assert all(x[1] != "" for x in rows)   # OWNER: a name, or "-"
    # a queued job's DEVICE is why it waits, as squeue's (REASON)
    wf = wait_until(lambda: d.job(queued).get("waiting_for"), 30, "a reason for job %d" % queued)
    rows = [l.split() for l in cli("ls", server=s).stdout.splitlines()[1:]]
    assert rows[1][4] == "(%s)" % wf["reason"], (rows, wf)
    r = cli("ls", "--state", "queued", server=s)
    assert [int(l.split()[0]) for l in r.stdout.splitlines()[1:]] == [queued], r.stdout
    # --owner: me (the daemon knows who is on the connection), or a name
    owner = d.job(run).get("owner")
    if owner:
        r = cli("ls", "--owner", "me", server=s)
        assert r.returncode == 0, r
        assert [int(l.split()[0]) for l in r.stdout.splitlines()[1:]] == [run, queued], r.stdout
        assert all(l.split()[1] == owner for l in r.stdout.splitlines()[1:]), r.stdout
        r = cli("ls", "--owner", "nobody-has-this-name", server=s)   # no such user: the daemon's 400
        assert r.returncode == 1 and "no such user" in r.stderr and "does not filter" not in r.stderr, r
    # show a queued job
    r = cli("show", queued, server=s)
    assert r.returncode == 0 and re.search(r"^  state +queued$", r.stdout, re.M), r
    # rm of a running job: refused with the daemon's reason
    r = cli("rm", run, server=s)
    assert r.returncode == 1 and "cancel" in r.stderr, r
    # cancel both: 0; the queued one at once
    r = cli("cancel", run, queued, server=s)
    assert r.returncode == 0, r
    assert "job %d cancelled" % queued in r.stdout and "job %d" % run in r.stdout
    d.wait_state(run, "cancelled")
    # cancel again: each one fails (finished), exit 1; an unknown id too
    r = cli("cancel", run, 999, server=s)
    assert r.returncode == 1, r
    assert "already cancelled" in r.stderr and "no job 999" in r.stderr, r.stderr
    r = cli("rm", run, queued, server=s)
    assert r.returncode == 0 and r.stdout.count("removed") == 2, r


def test_wait_cancelled_job_exits_1(make_daemon, cli, tmp_path):
    d = make_daemon()
    argv = [str(TRAINQ), "submit", str(write_spec(tmp_path, long_spec())), "--wait",
            "--server", url(d)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, cwd=str(tmp_path))
    try:
        jid = wait_until(lambda: (d.get("/v1/jobs")["jobs"] or [None])[0], 30, "the job")["id"]
        d.wait_step(jid, 1)
        assert d.request("POST", "/v1/jobs/%d/cancel" % jid).status == 200
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, (out, err)
    assert int(out) == jid and "job %d was cancelled" % jid in err, err


def test_follow_modes_on_a_running_job(make_daemon, cli, tmp_path):
    """steps -f and logs -f stream while the job runs and end when it ends."""
    d = make_daemon()
    jid = submit(cli, d, tmp_path, long_spec())
    d.wait_step(jid, 1)
    base = {k: v for k, v in os.environ.items() if k not in ("TRAINQ_SERVER", "TRAINQ_SOCKET")}
    procs = [subprocess.Popen([str(TRAINQ), c, "-f", str(jid), "--server", url(d)], env=base,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, cwd=str(tmp_path))
             for c in ("steps", "logs")]
    try:
        time.sleep(1.0)
        assert all(p.poll() is None for p in procs)   # still following
        assert d.request("POST", "/v1/jobs/%d/cancel" % jid).status == 200
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    (sout, serr), (lout, lerr) = outs
    assert procs[0].returncode == 0, (sout[-500:], serr)
    steps = [int(l.split()[0]) for l in sout.splitlines()[1:]]
    last = d.job(jid)["progress"]["step"]
    assert steps == list(range(1, last + 1)), (steps[:5], steps[-5:], last)
    assert "job %d cancelled" % jid in serr
    assert procs[1].returncode == 0, lerr
    assert "job %d" % jid in lout, lout


def test_server_order_env_and_unix_socket(make_daemon, cli, tmp_path):
    """TRAINQ_SERVER, then TRAINQ_SOCKET, then ./var/trainq.sock, then the default; --server
    over all of them."""
    d = make_daemon()
    jid = submit(cli, d, tmp_path, SYN)
    r = cli("show", jid, "--json", env={"TRAINQ_SERVER": url(d)})
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == jid, r
    # --server wins over the environment
    r = cli("show", jid, server=url(d), env={"TRAINQ_SERVER": "http://127.0.0.1:%d" % free_port()})
    assert r.returncode == 0, r
    sock = d.dir / "trainq.sock"
    if not sock.exists():
        pytest.skip("this daemon has no unix socket listener (%s)" % sock)
    r = cli("show", jid, "--json", env={"TRAINQ_SERVER": "unix:%s" % sock})
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == jid, r
    r = cli("show", jid, "--json", server="unix:%s" % sock)
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == jid, r
    r = cli("show", jid, "--json", env={"TRAINQ_SOCKET": str(sock)})
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == jid, r
    # ./var/trainq.sock in the working directory, when nothing else is given
    wd = tmp_path / "wd"
    (wd / "var").mkdir(parents=True)
    (wd / "var" / "trainq.sock").symlink_to(sock)
    r = cli("show", jid, "--json", cwd_=wd)
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == jid, r
    # TRAINQ_SERVER over the socket files
    r = cli("show", jid, cwd_=wd, env={"TRAINQ_SERVER": "http://127.0.0.1:%d" % free_port()})
    assert r.returncode == 3, r
