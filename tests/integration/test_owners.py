"""Owners (issue 15): every job belongs to the user who submitted it, known from the kernel
(sock_diag on loopback TCP) — no passwords. The test sends requests as other local users
(`daemon`, uid 1, and `nobody`, uid 65534) from child processes that drop root; it needs root
and skips with the reason otherwise."""
import json
import os
import socket
import subprocess
import sys

import pytest

from test_daemon import make_daemon  # noqa: F401 (fixture)

USERS = {"daemon": 1, "nobody": 65534}

# A tiny client run as another uid: one HTTP request over loopback TCP, the answer as JSON.
CLIENT = r"""
import http.client, json, os, sys
uid, port, method, path, body = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
os.setgroups([]); os.setgid(uid); os.setuid(uid)
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
c.request(method, path, body=body.encode() if body else None,
          headers={"Content-Type": "application/json", "Host": "127.0.0.1"})
r = c.getresponse()
print(json.dumps({"status": r.status, "body": r.read().decode()}))
"""


def as_user(d, user, method, path, body=None):
    out = subprocess.run([sys.executable, "-c", CLIENT, str(USERS[user]), str(d.port), method, path,
                          json.dumps(body) if body is not None else ""],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    try:
        r["json"] = json.loads(r["body"]) if r["body"] else None
    except ValueError:
        r["json"] = None
    return r


def spec(**kw):
    s = {"model": "cnn", "dataset": "synthetic", "device": "cpu", "threads": 1, "batch_size": 16,
         "steps": 100000, "shuffle": False, "eval_every": 0,
         "synthetic": {"train": 256, "test": 32, "height": 8, "width": 8, "channels": 1}}
    s.update(kw)
    return s


@pytest.fixture
def root():
    if os.geteuid() != 0:
        pytest.skip("the owner tests switch users: they need root")


def test_owner_from_the_kernel_and_who_may_cancel(root, make_daemon):
    d = make_daemon(args=["--max-jobs-per-device", "2"])
    a = as_user(d, "daemon", "POST", "/v1/jobs", spec(name="daemon's"))
    assert a["status"] == 201, a
    ja = a["json"]
    assert ja["owner"] == "daemon" and ja["owner_uid"] == 1, ja
    b = as_user(d, "nobody", "POST", "/v1/jobs", spec(name="nobody's"))
    assert b["status"] == 201 and b["json"]["owner"] == "nobody", b
    jb = b["json"]

    # another user may not cancel it: 403 naming the owner; reading stays open
    r = as_user(d, "nobody", "POST", "/v1/jobs/%d/cancel" % ja["id"], {})
    assert r["status"] == 403 and r["json"]["error"]["code"] == "forbidden", r
    assert "belongs to daemon" in r["json"]["error"]["message"] and "you are nobody" in r["json"]["error"]["message"]
    assert as_user(d, "nobody", "GET", "/v1/jobs/%d" % ja["id"])["status"] == 200
    # ?owner=me and ?owner=NAME
    mine = as_user(d, "nobody", "GET", "/v1/jobs?owner=me")["json"]["jobs"]
    assert [j["id"] for j in mine] == [jb["id"]]
    assert [j["id"] for j in d.get("/v1/jobs?owner=daemon")["jobs"]] == [ja["id"]]
    # the owner may; so may root (this test process)
    assert as_user(d, "daemon", "POST", "/v1/jobs/%d/cancel" % ja["id"], {})["status"] == 200
    assert d.request("POST", "/v1/jobs/%d/cancel" % jb["id"], {}).status == 200
    d.wait_state(ja["id"], "cancelled")
    d.wait_state(jb["id"], "cancelled")
    r = as_user(d, "nobody", "DELETE", "/v1/jobs/%d" % ja["id"])
    assert r["status"] == 403, r
    assert as_user(d, "daemon", "DELETE", "/v1/jobs/%d" % ja["id"])["status"] == 204

    # the users' table
    users = {u["user"]: u for u in d.get("/v1/users")["users"]}
    assert set(users) == {"nobody"} and users["nobody"]["uid"] == 65534, users
    assert 'trainq_user_device_seconds_total{user="nobody"}' in d.get("/metrics").body.decode()


def test_files_are_read_for_the_submitter(root, make_daemon, tmp_path):
    d = make_daemon()
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    weights = secret / "w.safetensors"
    weights.write_bytes(b"x")
    r = as_user(d, "nobody", "POST", "/v1/jobs", spec(steps=2, init_from=str(weights)))
    assert r["status"] == 403, r
    e = r["json"]["error"]
    assert e["code"] == "forbidden" and e["field"] == "init_from" and str(secret) in e["message"], e
    # through a symlink the user may read, to a file it may not: still refused
    link = tmp_path / "link"
    os.symlink(weights, link)
    r = as_user(d, "nobody", "POST", "/v1/jobs", spec(steps=2, init_from=str(link)))
    assert r["status"] == 403 and r["json"]["error"]["field"] == "init_from", r


def test_private_jobs_and_per_user_cap(root, make_daemon):
    d = make_daemon(args=["--private-jobs", "true", "--max-running-per-user", "1", "--max-jobs-per-device", "3"])
    ids = [as_user(d, "daemon", "POST", "/v1/jobs", spec(name="d%d" % i))["json"]["id"] for i in range(2)]
    other = as_user(d, "nobody", "POST", "/v1/jobs", spec(name="n"))["json"]["id"]
    # private: nobody cannot read daemon's job, and lists only its own
    r = as_user(d, "nobody", "GET", "/v1/jobs/%d" % ids[0])
    assert r["status"] == 403 and "belongs to daemon" in r["json"]["error"]["message"], r
    assert [j["id"] for j in as_user(d, "nobody", "GET", "/v1/jobs")["json"]["jobs"]] == [other]
    # nor through its event stream or a comparison that includes it
    r = as_user(d, "nobody", "GET", "/v1/jobs/%d/events" % ids[0])
    assert r["status"] == 403 and "belongs to daemon" in r["json"]["error"]["message"], r
    r = as_user(d, "nobody", "GET", "/v1/compare?ids=%d,%d" % (other, ids[0]))
    assert r["status"] == 403 and "belongs to daemon" in r["json"]["error"]["message"], r
    assert as_user(d, "nobody", "GET", "/v1/compare?ids=%d" % other)["status"] == 200
    # one running job per user: daemon's second waits with user_limit while nobody's runs
    d.wait_state(other, "running", timeout=60)
    d.wait_state(ids[0], "running", timeout=60)
    j = d.job(ids[1])
    assert j["state"] == "queued" and j["waiting_for"]["reason"] == "user_limit", j
    for i in ids + [other]:
        d.request("POST", "/v1/jobs/%d/cancel" % i, {})


SOCK_CLIENT = r"""
import json, os, socket, sys
uid, path, method, target = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
body = sys.argv[5].encode()
os.setgroups([]); os.setgid(uid); os.setuid(uid)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(path)
head = "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (method, target, len(body))
s.sendall(head.encode() + body)
data = b""
while True:
    k = s.recv(65536)
    if not k:
        break
    data += k
head, _, rest = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": rest.decode(errors="replace")}))
"""


def test_unix_socket_identity(root, make_daemon, tmp_path):
    sock = "/tmp/tq-test-%d.sock" % os.getpid()
    d = make_daemon(args=["--socket", sock])
    try:
        st = os.stat(sock)
        assert oct(st.st_mode & 0o777) == oct(0o666), oct(st.st_mode)
        out = subprocess.run([sys.executable, "-c", SOCK_CLIENT, "65534", sock, "POST", "/v1/jobs",
                              json.dumps(spec(steps=2, name="over the socket"))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
        assert r["status"] == 201, r
        body = r["body"]
        # a chunked or plain JSON body: the owner is nobody, from SO_PEERCRED
        assert '"owner":"nobody"' in body and '"owner_uid":65534' in body, body
    finally:
        assert d.stop() == 0
    assert not os.path.exists(sock), "the socket is removed when the daemon stops"


def test_a_file_replaced_after_the_check_is_refused(make_daemon, tmp_path):
    """The worker opens the files submission checked, by their resolved paths, and refuses one
    whose inode changed since (a path swapped between the check and the open)."""
    import shutil
    src = "/usr/share/datasets/fashion-mnist"
    data = tmp_path / "fm"
    shutil.copytree(src, data)
    d = make_daemon()
    blocker = d.submit(spec(name="blocker"))["id"]               # runs until cancelled
    d.wait_state(blocker, "running", timeout=60)
    jid = d.submit({"model": "mlp", "dataset": "fashion-mnist", "data_dir": str(data), "steps": 2,
                    "train_subset": 256, "eval_subset": 64, "threads": 1, "device": "cpu"})["id"]
    os.rename(data, tmp_path / "fm-old")                          # another directory at the same path
    shutil.copytree(src, data)
    assert d.request("POST", "/v1/jobs/%d/cancel" % blocker, {}).status == 200
    j = d.wait_state(jid, ("failed", "succeeded"), timeout=120)
    assert j["state"] == "failed" and j["error"]["code"] == "input_changed", j
    assert str(data) in j["error"]["message"], j


STREAMS_CLIENT = r"""
import json, os, socket, sys, time
uid, port, job, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
socks, statuses = [], []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(("GET /v1/jobs/%d/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % job).encode())
    head = b""
    while b"\r\n" not in head:
        head += s.recv(1)
    statuses.append(int(head.split()[1]))
    socks.append(s)
print(json.dumps(statuses))
"""


def test_event_streams_are_capped_per_user(root, make_daemon):
    d = make_daemon()
    jid = d.submit(spec(name="watched"))["id"]
    d.wait_state(jid, "running", timeout=60)
    out = subprocess.run([sys.executable, "-c", STREAMS_CLIENT, "65534", str(d.port), str(jid), "66"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    statuses = json.loads(out.stdout)
    assert statuses[:64] == [200] * 64 and statuses[64:] == [503, 503], statuses
    # another user is not affected by nobody's streams
    r = as_user(d, "daemon", "GET", "/v1/jobs/%d" % jid)
    assert r["status"] == 200
    d.request("POST", "/v1/jobs/%d/cancel" % jid, {})


def test_fair_share_and_owner_filter_errors(root, make_daemon):
    """A has used the device and has three jobs queued before B's one, all priority 0: B's job
    runs next. An unknown user in ?owner= is a 400."""
    d = make_daemon(args=["--max-jobs-per-device", "1"])
    first = as_user(d, "daemon", "POST", "/v1/jobs", spec(name="a0"))["json"]["id"]
    d.wait_state(first, "running", timeout=60)
    d.wait_step(first, 5, timeout=60)                      # A's device time accrues
    a = [as_user(d, "daemon", "POST", "/v1/jobs", spec(name="a%d" % i))["json"]["id"] for i in (1, 2, 3)]
    b = as_user(d, "nobody", "POST", "/v1/jobs", spec(name="b"))["json"]["id"]
    assert d.request("POST", "/v1/jobs/%d/cancel" % first, {}).status == 200
    j = d.wait_state(b, "running", timeout=60)
    assert [d.job(i)["state"] for i in a] == ["queued"] * 3, "B's job went first"
    users = {u["user"]: u for u in d.get("/v1/users")["users"]}
    assert users["daemon"]["device_hours_window"] > 0 and users["daemon"]["queued"] == 3, users
    r = d.request("GET", "/v1/jobs?owner=no-such-user-xyz")
    assert r.status == 400 and r.json()["error"]["field"] == "owner", r
    for i in a + [b]:
        d.request("POST", "/v1/jobs/%d/cancel" % i, {})
