"""bench/daemon.py — a real `trainq serve` for the benchmark drivers (bench/run, bench/load).

Daemon(binary, workdir, devices) starts it on a free loopback port with its database, job
files and log in `workdir` (retrying on a port taken in between), answers requests, and stops
it with SIGTERM (SIGKILL to its process group when that does not end it). Standard library
only.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

# a daemon the benchmark starts must not talk to the systemd of the shell it runs in
_SYSTEMD_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaemonError(RuntimeError):
    pass


class Daemon:
    """`trainq serve` on a free loopback port with its database (and job files) in `workdir`."""

    def __init__(self, binary, workdir, devices):
        self.binary, self.workdir, self.devices = str(binary), str(workdir), devices
        self.db = os.path.join(self.workdir, "trainq.db")
        self.proc = None
        self.port = None
        self.log_path = os.path.join(self.workdir, "serve.log")
        self.starts = 0

    def start(self, timeout=30):
        env = {k: v for k, v in os.environ.items() if k not in _SYSTEMD_ENV}
        for _ in range(3):
            self.port = free_port()
            self.starts += 1
            with open(self.log_path, "ab") as f:
                self.proc = subprocess.Popen(
                    [self.binary, "serve", "--db", self.db, "--listen",
                     "127.0.0.1:%d" % self.port, "--devices", self.devices],
                    stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                    cwd=self.workdir, start_new_session=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    st, _ = self.request("GET", "/healthz", timeout=2)
                    if st == 200:
                        return
                except OSError:
                    pass
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.kill()
                raise DaemonError("trainq serve not healthy after %d s:\n%s"
                                  % (timeout, self.log_tail()))
            if "in use" not in self.log_tail().lower():
                raise DaemonError("trainq serve exited with status %s at start:\n%s"
                                  % (self.proc.returncode, self.log_tail()))
        raise DaemonError("trainq serve: no free port after 3 tries")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        except OSError:
            return ""

    def request(self, method, path, body=None, timeout=30):
        """(HTTP status, parsed JSON or None); OSError when the daemon cannot be reached."""
        data = None
        headers = {}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data,
                                     headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw.decode()) if raw else None
        except ValueError:
            return status, None

    def json(self, method, path, body=None, expect=(200,)):
        """The parsed answer; DaemonError when its status is not one of `expect`."""
        status, obj = self.request(method, path, body)
        if status not in expect:
            code, msg = api_error(obj, status)
            raise DaemonError("%s %s -> %d %s: %s" % (method, path, status, code, msg))
        return obj

    def raw(self, method, path, timeout=30):
        """(status, Content-Type, body bytes) over one fresh connection, nothing parsed: what a
        load test times."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path)
            r = conn.getresponse()
            return r.status, r.getheader("Content-Type", ""), r.read()
        finally:
            conn.close()

    def stop(self, timeout=60):
        if not self.alive():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # serve and its worker (its own group)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def api_error(obj, status):
    """(code, message) from an error answer."""
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        e = obj["error"]
        return e.get("code") or "http_%d" % status, e.get("message") or ""
    return "http_%d" % status, ""


def all_steps(d, jid, page=1000):
    """Every step record of job jid, paging GET /v1/jobs/{id}/steps?after=K."""
    steps, after = [], 0
    while True:
        st, obj = d.request("GET", "/v1/jobs/%d/steps?after=%d&limit=%d" % (jid, after, page))
        if st != 200 or not isinstance(obj, dict):
            raise DaemonError("GET /v1/jobs/%d/steps: HTTP %d" % (jid, st))
        got = obj.get("steps") or []
        steps.extend(got)
        if len(got) < page:
            return steps
        after = got[-1]["step"]
