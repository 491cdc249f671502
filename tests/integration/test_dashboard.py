"""The dashboard (README "Dashboard", docs/api.md "The dashboard"): GET /, /jobs/{id} and
/compare answer one HTML page embedded in the binary, with its scripts, styles and Chart.js
under /assets/, each with its type, an ETag (304 on If-None-Match), no-cache and a strict
Content-Security-Policy; the page has no inline script, style or event handler, so that policy
holds.

The browser part drives Debian's `chromium` headless through the DevTools protocol on a pipe
(--remote-debugging-pipe: no websocket, no extra package) against a daemon with a finished job
and a running one: the queue page, a finished job's page and a running one's (its step counter
must move: the event stream works), the compare page, and the Cancel button (a JSON POST). No
console error, uncaught exception or CSP violation may appear. A job that failed on its
dataset shows its error's code and message on its page, and the queue page says it failed. It
skips, saying why, where chromium is not installed (scripts/install-deps installs it).
Screenshots (dashboard-queue, -job-finished, -job-running, -job-failed, -compare .png) go to
$TRAINQ_SCREENSHOTS when set, relative to the repository (TRAINQ_SCREENSHOTS=docs/img rewrites
the pictures README.md and docs/api.md show), else to the test's tmp dir.
"""
import base64
import fcntl
import html.parser
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from test_daemon import _SKIP, make_daemon, small, medium, wait_until  # noqa: F401 (fixture)
from test_logs import job_whose_dataset_breaks

pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".html": "text/html"}


class Shell(html.parser.HTMLParser):
    """What the page refers to, and anything a strict CSP would refuse."""

    def __init__(self):
        super().__init__()
        self.refs, self.inline, self.scripts, self._in_script = [], [], [], False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in a:
            if k.startswith("on"):
                self.inline.append("%s %s=" % (tag, k))
        if "style" in a:
            self.inline.append("%s style=" % tag)
        if tag == "style":
            self.inline.append("<style>")
        if tag == "script":
            self.scripts.append(a)
            self._in_script = True
            if not a.get("src"):
                self.inline.append("<script> without src")
        for k in ("src", "href"):
            v = a.get(k)
            if v and v.startswith("/assets/"):
                self.refs.append(v)
            if v and v.lower().startswith("javascript:"):
                self.inline.append("%s %s=javascript:" % (tag, k))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.inline.append("inline script text")


def check_headers(r, ctype):
    assert r.status == 200, r
    assert r.headers.get("content-type", "").startswith(ctype), (r.headers, ctype)
    assert r.headers.get("content-security-policy") == CSP, r.headers
    assert r.headers.get("x-content-type-options") == "nosniff"
    assert r.headers.get("referrer-policy") == "no-referrer"
    assert r.headers.get("cache-control") == "no-cache"
    assert re.fullmatch(r'"[0-9a-f]{16}"', r.headers.get("etag", "")), r.headers


def test_shell_assets_and_caching(make_daemon):
    d = make_daemon()
    r = d.request("GET", "/")
    check_headers(r, "text/html")
    page = r.body.decode()
    p = Shell()
    p.feed(page)
    assert not p.inline, "the page has inline code a strict CSP refuses: %s" % p.inline
    assert any(s.get("type") == "module" for s in p.scripts), p.scripts
    assert "/assets/chart.min.js" in p.refs and "/assets/app.css" in p.refs, p.refs

    # every file the page refers to, and every module the scripts import, exists with its type
    todo, seen = list(p.refs), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        r = d.request("GET", path)
        check_headers(r, TYPES[os.path.splitext(path)[1]])
        if path.endswith(".js") and path != "/assets/chart.min.js":
            for m in re.findall(r'(?:import|from)\s*["\'](\./[^"\']+)["\']', r.body.decode()):
                todo.append("/assets/" + m[2:])
            assert "eval(" not in r.body.decode() and "innerHTML" not in r.body.decode(), path
    assert {"/assets/app.js", "/assets/util.js", "/assets/charts.js"} <= seen, seen
    chart = d.request("GET", "/assets/chart.min.js").body
    assert b"Chart.js v" in chart[:200] or b"TQ_NO_CHARTS" in chart, chart[:200]

    # the pages of the app are the same shell; the id of /jobs/{id} is checked as in the API
    for path in ("/jobs/1", "/jobs/12345", "/compare", "/compare?ids=1,2"):
        r = d.request("GET", path)
        check_headers(r, "text/html")
        assert r.body.decode() == page, path
    assert d.request("GET", "/jobs/abc").status == 400
    assert d.request("GET", "/assets/nope.js").status == 404
    assert d.request("GET", "/assets/").status == 404
    assert d.request("GET", "/nope").status == 404
    r = d.request("POST", "/", body=b"{}", headers={"Content-Type": "application/json"})
    assert r.status == 405 and "GET" in r.headers.get("allow", ""), r

    # ETag: 304 without a body for the same tag (also weak, or in a list), 200 for another
    etag = d.request("GET", "/assets/app.js").headers["etag"]
    for inm in (etag, "W/" + etag, '"0000000000000000", ' + etag, "*"):
        r = d.request("GET", "/assets/app.js", headers={"If-None-Match": inm})
        assert r.status == 304 and r.body == b"", (inm, r)
        assert r.headers.get("etag") == etag
    r = d.request("GET", "/assets/app.js", headers={"If-None-Match": '"0000000000000000"'})
    assert r.status == 200 and r.body
    # HEAD: the headers of GET, no body
    r = d.request("HEAD", "/")
    assert r.status == 200 and r.body == b"" and r.headers.get("content-security-policy") == CSP
    assert int(r.headers["content-length"]) == len(page.encode())


# ---------------------------------------------------------------- headless Chromium
def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


class Browser:
    """Chromium over the DevTools protocol on a pipe (fd 3: commands in, fd 4: replies and
    events out, each a JSON message ended by a NUL byte). One page; console errors, uncaught
    exceptions and CSP reports are collected in self.problems."""

    def __init__(self, exe, profile, width=1400, height=1000):
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds():   # in the child: the protocol's fds 3 and 4 (by way of fds >= 10: no clash)
            r, w = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--mute-audio", "--hide-scrollbars", "--remote-debugging-pipe",
             "--user-data-dir=%s" % profile, "--window-size=%d,%d" % (width, height), "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=fds, start_new_session=True)   # Python's fds are CLOEXEC
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next, self._replies, self._cv = 1, {}, threading.Condition()
        self.problems, self.dialogs, self.session = [], [], None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        targets = self.call("Target.getTargets", session=False)["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True,
                                 session=False)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(domain + ".enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _read(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self._r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cv:
                    self._replies[None] = "closed"
                    self._cv.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                self._message(json.loads(raw))

    def _message(self, m):
        if "id" in m:
            with self._cv:
                self._replies[m["id"]] = m
                self._cv.notify_all()
            return
        method, p = m.get("method"), m.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.problems.append("console.%s: %s" % (p["type"], " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", []))))
        elif method == "Runtime.exceptionThrown":
            e = p.get("exceptionDetails", {})
            self.problems.append("uncaught: %s %s" % (e.get("text"), e.get("exception", {}).get("description", "")))
        elif method == "Log.entryAdded":
            e = p.get("entry", {})
            if e.get("level") == "error" or "Content Security Policy" in e.get("text", ""):
                self.problems.append("log (%s): %s %s" % (e.get("source"), e.get("text"), e.get("url", "")))
        elif method == "Page.javascriptDialogOpening":
            self.dialogs.append(p.get("message"))
            threading.Thread(target=self.call, args=("Page.handleJavaScriptDialog",),
                             kwargs={"accept": True}, daemon=True).start()

    def call(self, method, session=True, timeout=30, **params):
        with self._cv:
            mid = self._next
            self._next += 1
        msg = {"id": mid, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cv:
            while mid not in self._replies:
                if None in self._replies:
                    raise RuntimeError("chromium closed the DevTools pipe during %s" % method)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("chromium did not answer %s in %d s" % (method, timeout))
                self._cv.wait(left)
            r = self._replies.pop(mid)
        if "error" in r:
            raise RuntimeError("%s: %s" % (method, r["error"]))
        return r.get("result", {})

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    def goto(self, url):
        """Open url and wait until the app has drawn its first load (body[data-ready])."""
        self.js("window.tqOld = true")   # so that the old page is never taken for the new one
        self.call("Page.navigate", url=url)
        wait_until(lambda: self.js("!window.tqOld && document.readyState === 'complete' && "
                                   "document.body?.dataset.ready === '1'"),
                   60, "%s to load" % url, interval=0.1)

    def wait(self, expr, what, timeout=30):
        return wait_until(lambda: self.js(expr), timeout, what, interval=0.2)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=10)
        os.close(self._w)
        os.close(self._r)


def screenshot_dir(tmp_path):
    """$TRAINQ_SCREENSHOTS (relative to the repository: TRAINQ_SCREENSHOTS=docs/img writes the
    README's pictures), else the test's tmp dir."""
    env = os.environ.get("TRAINQ_SCREENSHOTS")
    shots = (Path(__file__).resolve().parents[2] / env) if env else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def test_dashboard_in_chromium(make_daemon, tmp_path):
    exe = chromium()
    if not exe:
        pytest.skip("chromium is not installed (apt-get install chromium, or scripts/install-deps): "
                    "the browser half of the dashboard test needs it")
    shots = screenshot_dir(tmp_path)
    d = make_daemon()
    base = "http://127.0.0.1:%d" % d.port
    done = d.submit(small(steps=60, name="finished-mlp", eval_every=20, prune={"amount": 0.5}))
    d.wait_state(done["id"], "succeeded", timeout=120)
    run = d.submit(medium(steps=20000, name="running-cnn", eval_every=1000))
    d.wait_step(run["id"], 3, timeout=120)
    jid, rid = done["id"], run["id"]

    with tempfile.TemporaryDirectory() as profile:
        b = Browser(exe, profile)
        try:
            # the queue: the running job on its device, with a progress bar; the finished one
            b.goto(base + "/")
            b.wait("document.body.innerText.includes('running-cnn') && "
                   "document.body.innerText.includes('finished-mlp') && !!document.querySelector('.device progress')",
                   "the queue page to show both jobs")
            b.screenshot(shots / "dashboard-queue.png")

            # a finished job: its name, summary and charts drawn (Chart.js sets the canvas size)
            b.goto(base + "/jobs/%d" % jid)
            b.wait("document.querySelector('.job-name')?.textContent === 'finished-mlp' && "
                   "[...document.querySelectorAll('canvas')].filter(c => c.width > 0 && c.offsetParent).length >= 4 && "
                   "document.body.innerText.includes('val_accuracy')", "the finished job's page")
            links = b.js("[...document.querySelectorAll('a')].map(a => a.getAttribute('href'))")
            assert "/v1/jobs/%d/model" % jid in links and "/v1/jobs/%d/steps?format=csv" % jid in links, links
            b.screenshot(shots / "dashboard-job-finished.png")

            # a running job: live, the step counter moves with the event stream
            b.goto(base + "/jobs/%d" % rid)
            b.wait("document.querySelector('.job-name')?.textContent === 'running-cnn' && "
                   "document.querySelectorAll('canvas').length >= 4 && !!document.querySelector('dl.kv progress')",
                   "the running job's page")
            first = b.js("document.querySelector('dl.kv progress').value")
            b.wait("document.querySelector('dl.kv progress').value > %d" % (first + 2),
                   "the running job's progress to move (events)")
            b.screenshot(shots / "dashboard-job-running.png")

            # compare
            b.goto(base + "/compare?ids=%d,%d" % (jid, rid))
            b.wait("document.querySelectorAll('table.compare tbody tr').length > 10 && "
                   "document.querySelectorAll('canvas').length >= 4", "the compare page")
            b.screenshot(shots / "dashboard-compare.png")

            # Cancel: a JSON POST from the page (after its confirm())
            b.goto(base + "/jobs/%d" % rid)
            b.wait("[...document.querySelectorAll('button')].some(x => x.textContent === 'Cancel')", "the Cancel button")
            b.js("[...document.querySelectorAll('button')].find(x => x.textContent === 'Cancel').click()")
            d.wait_state(rid, "cancelled", timeout=60)
            assert any("Cancel job %d" % rid in m for m in b.dialogs), b.dialogs
            b.wait("document.querySelector('.badge')?.textContent === 'cancelled'", "the page to show the cancel")
            assert not b.problems, "the browser reported:\n" + "\n".join(b.problems)
        finally:
            b.close()


def test_failed_job_page_shows_why(make_daemon, tmp_path):
    """A job that failed on its dataset (test_logs.job_whose_dataset_breaks): its page shows the
    error's code and message (job.js, the error box under the summary), and the queue page
    names the failure among the finished jobs."""
    exe = chromium()
    if not exe:
        pytest.skip("chromium is not installed (apt-get install chromium, or scripts/install-deps)")
    shots = screenshot_dir(tmp_path)
    d = make_daemon()
    base = "http://127.0.0.1:%d" % d.port
    j, reason = job_whose_dataset_breaks(d, tmp_path)
    with tempfile.TemporaryDirectory() as profile:
        b = Browser(exe, profile)
        try:
            b.goto(base + "/jobs/%d" % j["id"])
            b.wait("document.querySelector('.job-name')?.textContent === 'broken-data' && "
                   "!!document.querySelector('.error-box')", "the failed job's page")
            shown = b.js("document.querySelector('.error-box').innerText")
            assert " ".join(shown.split()) == " ".join(reason.split()), (shown, reason)
            assert b.js("document.querySelector('.badge')?.textContent") == "failed"
            b.screenshot(shots / "dashboard-job-failed.png")

            b.goto(base + "/")
            b.wait("document.body.innerText.includes('broken-data')", "the queue page")
            row = b.js("[...document.querySelectorAll('tr')].find(r => r.innerText.includes('broken-data'))?.innerText")
            assert row and "failed" in row and "invalid_data" in row, row
            assert not b.problems, "the browser reported:\n" + "\n".join(b.problems)
        finally:
            b.close()
