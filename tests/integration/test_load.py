"""Load on the real daemon (issue 16): many clients at once, over loopback only.

- 400 submits from 8 client threads: every 201 names a distinct id, and every one of them is in
  the listing exactly once (and nothing else is).
- the same `submission_id` from 8 clients released at once: exactly one job; one client gets 201,
  the other seven 200 with the same id.
- 200 event streams (GET /v1/jobs/{id}/events) opened and dropped by their clients: afterwards
  the daemon's open descriptors (/proc/PID/fd) are back to where they were, and its resident
  memory (/proc/PID/status VmRSS) has not grown by more than a small tolerance (see
  test_event_streams_opened_and_dropped).

Nothing here may train for real on a shared 2-core machine: one long job is started and its
worker is stopped with SIGSTOP (the job stays "running" and holds the only CPU slot, so every
job submitted afterwards stays queued and its event stream stays open, sending only
keepalives). The worker is continued and the job cancelled at the end. Every wait is bounded;
the module takes well under a minute (more under the sanitizers).
"""
import http.client
import json
import os
import signal
import socket
import sqlite3
import threading
import time

import pytest

from test_daemon import (Daemon, check_error, long_job, make_daemon, small, the_worker,  # noqa: F401
                         wait_until)

CLIENTS = 8


@pytest.fixture
def held(make_daemon):
    """A started daemon whose only CPU slot is held by a stopped worker."""
    d = make_daemon()
    jid = d.submit(long_job(name="holder"))["id"]
    d.wait_state(jid, "running", timeout=60)
    pid = the_worker(d, jid)
    # stopped where it holds no write lock on the database: a worker stopped inside a step's
    # commit (durable: an fsync long) would make every write of the API wait for it, which is not
    # what these tests hold (a full CPU slot)
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        con = sqlite3.connect(str(d.db), timeout=0.2)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
            break
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            con.close()
    else:
        pytest.fail("the worker held the database's write lock at every stop")
    d.holder = jid
    try:
        yield d
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        if d.alive():
            d.request("POST", "/v1/jobs/%d/cancel" % jid)


def run_clients(n, fn):
    """fn(i) in n threads; returns the results in order (an exception is re-raised here)."""
    out, errs = [None] * n, []

    def body(i):
        try:
            out[i] = fn(i)
        except BaseException as e:   # noqa: BLE001 — reported by the main thread
            errs.append(e)
    ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a client thread is still running after 120 s"
    if errs:
        raise errs[0]
    return out


def listing(d, **q):
    """Every job of GET /v1/jobs, page by page (limit 100: the pagination is exercised too)."""
    jobs, before = [], None
    for _ in range(100):
        qs = "limit=100" + ("&before=%d" % before if before else "")
        qs += "".join("&%s=%s" % kv for kv in q.items())
        page = d.get("/v1/jobs?" + qs)
        jobs += page["jobs"]
        before = page["next"]
        if before is None:
            return jobs
    pytest.fail("the listing did not end after 100 pages")


def test_400_submits_from_8_clients(held):
    d = held
    per = 400 // CLIENTS

    def client(i):
        got = []
        for k in range(per):
            r = d.request("POST", "/v1/jobs", small(steps=4, name="load-%d-%d" % (i, k)), timeout=60)
            assert r.status == 201, r
            got.append((r.json()["id"], r.json()["name"]))
        return got
    t0 = time.monotonic()
    results = [x for per_client in run_clients(CLIENTS, client) for x in per_client]
    took = time.monotonic() - t0
    ids = [jid for jid, _ in results]
    assert len(ids) == 400 and len(set(ids)) == 400, "ids answered twice: %r" % sorted(ids)
    names = {jid: name for jid, name in results}

    jobs = listing(d)
    listed = [j["id"] for j in jobs]
    assert len(listed) == len(set(listed)), "a job listed twice"
    assert set(listed) == set(ids) | {d.holder}, (set(listed) ^ (set(ids) | {d.holder}))
    for j in jobs:
        if j["id"] != d.holder:
            assert j["name"] == names[j["id"]] and j["state"] == "queued", j
    assert [j["id"] for j in jobs] == sorted(listed, reverse=True), "not newest first"
    queued = listing(d, state="queued")
    assert sorted(j["id"] for j in queued) == sorted(ids)
    assert len(d.query("select id from jobs")) == 401
    print("400 submits from %d clients: %.1f s (%.0f/s)" % (CLIENTS, took, 400 / took))


def test_same_submission_id_from_8_clients(held):
    d = held
    spec = small(steps=4, submission_id="load-race")
    go = threading.Barrier(CLIENTS)

    def client(i):
        go.wait(timeout=30)
        return d.request("POST", "/v1/jobs", spec, timeout=60)
    rs = run_clients(CLIENTS, client)
    statuses = sorted(r.status for r in rs)
    assert statuses == [200] * (CLIENTS - 1) + [201], rs
    assert len({r.json()["id"] for r in rs}) == 1, rs
    assert len(d.query("select id from jobs where submission_id = 'load-race'")) == 1
    assert len(d.query("select id from jobs")) == 2   # the holder and this one


# ---------------------------------------------------------------- event streams
def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def sanitized(pid):
    with open("/proc/%d/maps" % pid) as f:
        return any("libasan" in line or "libclang_rt.asan" in line for line in f)


def open_stream(d, jid):
    """A socket with an event stream's response headers read: (sock, status, body of an error)."""
    s = socket.create_connection(("127.0.0.1", d.port), timeout=20)
    s.sendall(("GET /v1/jobs/%d/events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n\r\n"
               % (jid, d.port)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, "the daemon closed an event stream before its headers: %r" % buf
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    if status == 200:
        assert b"text/event-stream" in head.lower(), head
        return s, status, None
    # an error (503 too_many_streams beyond the cap): a JSON body of Content-Length bytes
    n = int([l.split(b":", 1)[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0])
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, "an error body cut short"
        rest += chunk
    s.close()
    return None, status, rest[:n]


def open_and_drop(d, jid, total, batch):
    """Opens `total` streams `batch` at a time, each batch held open together and then dropped by
    the client (close without reading to the end). A 503 too_many_streams (another engineer's
    caps: per client address, per user, in all) is accepted, counted and retried after the
    batch is dropped. Returns (opened, refused)."""
    opened = refused = 0
    deadline = time.monotonic() + 120
    while opened < total:
        assert time.monotonic() < deadline, "streams still refused after 120 s (%d opened)" % opened
        socks = []
        try:
            for _ in range(min(batch, total - opened)):
                s, status, body = open_stream(d, jid)
                if status == 200:
                    socks.append(s)
                    continue
                assert status == 503, (status, body)
                assert json.loads(body)["error"]["code"] == "too_many_streams", body
                refused += 1
                break   # at the cap: drop what this batch holds, then go on
            # every stream of the batch is live: its first bytes (retry:, or events) came or come
            opened += len(socks)
        finally:
            for s in socks:
                s.close()
        if refused and not socks:
            time.sleep(0.3)   # a tick of sse.c (250 ms) ends the dropped ones
    return opened, refused


def test_event_streams_opened_and_dropped(held):
    d = held
    jid = d.submit(small(steps=4, name="watched"))["id"]      # queued behind the stopped worker
    pid = d.pid
    # warm up with a round like the measured one: the pool threads' database connections and
    # their page caches, the ticker, malloc's per-thread arenas
    open_and_drop(d, jid, 200, 25)
    settle = lambda: wait_until(lambda: d.request("GET", "/healthz").status == 200, 10, "healthz")
    settle()
    time.sleep(1.0)   # > 3 ticks: every dropped stream is ended
    fd0, rss0 = fds(pid), rss_kib(pid)

    t0 = time.monotonic()
    opened, refused = open_and_drop(d, jid, 200, 25)
    took = time.monotonic() - t0
    assert opened == 200

    # descriptors: every stream's socket is closed again (the ticker sees each client's hang-up
    # within a tick; allow 10 s for a loaded machine)
    wait_until(lambda: fds(pid) <= fd0, 10, "the daemon's fds to return to %d (now %d)" % (fd0, fds(pid)))
    # streams: none is counted any more: a batch of 25 opens at once
    again, refused2 = open_and_drop(d, jid, 25, 25)
    assert again == 25 and refused2 == 0, (again, refused2)
    wait_until(lambda: fds(pid) <= fd0, 10, "the daemon's fds to return to %d (now %d)" % (fd0, fds(pid)))
    settle()
    time.sleep(0.5)
    rss1 = rss_kib(pid)
    # RSS: freed memory need not go back to the kernel at once (glibc keeps freed chunks in its
    # per-thread arenas and trims only the top of a heap; SQLite's page caches fill up to their
    # cap), so "back to where it was" means within a tolerance: measured on this machine, after a
    # warm-up round each further round of 200 streams moved VmRSS by 0-1.2 MiB, shrinking round
    # after round (25 rounds: +4 MiB in all, flat for the last ones): a plateau, not a leak
    # (a leak grows by the same amount every round). 2 MiB catches gross growth (each stream
    # holds a connection pool of up to 128 KiB, an 8 KiB event buffer and a 16 KiB response
    # block: 225 of them kept would be well over 2 MiB once their buffers are written); the exact
    # checks are elsewhere: a leaked connection keeps its socket (the fd check above), and the
    # sanitized pass leak-checks at exit (LSan). Under AddressSanitizer, freed memory
    # sits in its quarantine (up to 256 MiB) instead: there the leak check at exit (LSan) is the
    # test.
    grew = rss1 - rss0
    print("200 streams in %.1f s (%d refused at the cap); fds %d -> %d; VmRSS %d -> %d KiB (%+d)%s"
          % (took, refused, fd0, fds(pid), rss0, rss1, grew,
             " (sanitized: RSS not judged)" if sanitized(pid) else ""))
    # a round may still land on the plateau's slope (one CI run: +2.3 MiB): up to two more rounds,
    # each judged alone; a leak of 2 MiB per 200 streams exceeds the limit in every round
    extra = 0
    while not sanitized(pid) and grew > 2048 and extra < 2:
        extra += 1
        rss0 = rss_kib(pid)
        assert open_and_drop(d, jid, 200, 25)[0] == 200
        wait_until(lambda: fds(pid) <= fd0, 10, "the daemon's fds to return to %d (now %d)" % (fd0, fds(pid)))
        settle()
        time.sleep(0.5)
        grew = rss_kib(pid) - rss0
        print("another round of 200 streams: VmRSS %+d KiB" % grew)
    if not sanitized(pid):
        assert grew <= 2048, "VmRSS grew by %d KiB over 200 dropped streams in each of %d rounds (limit 2048 KiB)" % (grew, extra + 1)
    # and the job and the daemon are fine
    assert d.job(jid)["state"] == "queued"
