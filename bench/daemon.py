"""bench/daemon.py — a real `trainq serve` for the benchmark drivers (bench/run, bench/load).

Daemon(binary, workdir, devices) starts it on a free loopback port with its database, job
files and log in `workdir` (retrying on a port taken in between), answers requests, and stops
it with SIGTERM (SIGKILL to its process group when that does not end it). `extra_args` go on
serve's command line (e.g. ["--max-jobs-per-device", "2"]), `env` replaces os.environ for it
(e.g. one with the CUDA libraries on LD_LIBRARY_PATH). Standard library only.
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

    def __init__(self, binary, workdir, devices, extra_args=(), env=None):
        self.binary, self.workdir, self.devices = str(binary), str(workdir), devices
        self.extra_args = [str(a) for a in extra_args]
        self.base_env = env
        self.db = os.path.join(self.workdir, "trainq.db")
        self.proc = None
        self.port = None
        self.log_path = os.path.join(self.workdir, "serve.log")
        self.starts = 0

    def start(self, timeout=30):
        base = os.environ if self.base_env is None else self.base_env
        env = {k: v for k, v in base.items() if k not in _SYSTEMD_ENV}
        for _ in range(3):
            self.port = free_port()
            self.starts += 1
            with open(self.log_path, "ab") as f:
                self.proc = subprocess.Popen(
                    [self.binary, "serve", "--db", self.db, "--listen",
                     "127.0.0.1:%d" % self.port, "--devices", self.devices] + self.extra_args,
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


def wait_jobs(d, ids, timeout, poll=0.2):
    """{id: job object} once every job in ids has ended (succeeded, failed, cancelled);
    DaemonError when that takes longer than timeout seconds (the jobs are left as they are)."""
    deadline = time.monotonic() + timeout
    done = {}
    while True:
        for jid in ids:
            if jid not in done:
                j = d.json("GET", "/v1/jobs/%d" % jid)
                if j["state"] in ("succeeded", "failed", "cancelled"):
                    done[jid] = j
        if len(done) == len(ids):
            return done
        if time.monotonic() > deadline:
            raise DaemonError("jobs %s not finished after %d s"
                              % (sorted(set(ids) - set(done)), timeout))
        time.sleep(poll)


class DeviceSampler:
    """Samples GET /v1/devices every `interval` seconds on a thread, from start() to stop():
    `samples` is [(monotonic seconds, [device objects])]; failed requests are counted in
    `errors` and skipped."""

    def __init__(self, d, interval=0.2):
        import threading
        self.d, self.interval = d, interval
        self.samples, self.errors = [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                st, obj = self.d.request("GET", "/v1/devices", timeout=10)
                if st == 200 and isinstance(obj, dict):
                    self.samples.append((time.monotonic(), obj.get("devices") or []))
                else:
                    self.errors += 1
            except OSError:
                self.errors += 1
            self._stop.wait(self.interval)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=30)
        return self.samples

    def per_device(self):
        """{device id: {"budget_bytes", "reserve_bytes", "max_planned_bytes", "max_running_jobs",
        "max_driver_used_bytes", "over_budget_samples", "samples", "threads": {job id: [threads
        seen]}}} over the samples so far."""
        out = {}
        for _, devs in list(self.samples):
            for dev in devs:
                o = out.setdefault(dev.get("id"), {
                    "budget_bytes": dev.get("budget_bytes"), "reserve_bytes": dev.get("reserve_bytes"),
                    "max_planned_bytes": 0, "max_running_jobs": 0, "max_driver_used_bytes": None,
                    "over_budget_samples": 0, "samples": 0, "threads": {}})
                o["samples"] += 1
                planned = dev.get("planned_bytes") or 0
                o["max_planned_bytes"] = max(o["max_planned_bytes"], planned)
                o["max_running_jobs"] = max(o["max_running_jobs"], dev.get("running_jobs") or 0)
                if dev.get("budget_bytes") is not None and planned > dev["budget_bytes"]:
                    o["over_budget_samples"] += 1
                used = dev.get("driver_used_bytes")
                if isinstance(used, (int, float)):
                    o["max_driver_used_bytes"] = max(o["max_driver_used_bytes"] or 0, used)
                for j in dev.get("jobs") or []:
                    if j.get("threads") is not None:
                        seen = o["threads"].setdefault(str(j.get("id")), [])
                        if j["threads"] not in seen:
                            seen.append(j["threads"])
        return out
