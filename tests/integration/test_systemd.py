"""systemd/trainq.service: `systemd-analyze verify` accepts it, with no warning at all (unknown
keys and bad values are only warnings there, exit status 0), and it keeps the properties the
daemon issue asks for. Verified twice: on a copy whose ExecStart points at the binary under test
(verify needs the binary to exist, and /usr/local/bin/trainq is only there after `make install`),
and as installed: `make install DESTDIR=ROOT` staged, then `systemd-analyze verify --root=ROOT`
(what `make verify-unit` runs). The make targets install the binary under test (its BUILD)."""
import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "trainq.service"
CONF = REPO / "systemd" / "trainq.conf.example"
INSTALLED_BIN = "/usr/local/bin/trainq"


def build_of(trainq):
    """The BUILD directory (relative to the repository) of the binary under test, so that the
    make targets below install that binary and build nothing elsewhere; skips for a binary
    outside the repository."""
    p = Path(trainq).resolve()
    try:
        rel = p.parent.relative_to(REPO)
    except ValueError:
        pytest.skip("%s is outside the repository: no BUILD directory to install from" % p)
    if p.name != "trainq" or not str(rel) or str(rel) == ".":
        pytest.skip("%s is not BUILD/trainq" % p)
    return str(rel)


def unit_directives(text):
    """[(section, key, value)] in file order (repeated keys kept)."""
    out, section = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            section = m.group(1)
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def values(directives, section, key):
    return [v for s, k, v in directives if s == section and k == key]


def test_unit_keeps_its_promises():
    d = unit_directives(UNIT.read_text())
    one = lambda key: values(d, "Service", key)[-1] if values(d, "Service", key) else None
    assert one("Type") == "notify" and one("NotifyAccess") == "main"
    exec_start = one("ExecStart").split()
    assert exec_start[:2] == [INSTALLED_BIN, "serve"]
    # only options that `trainq serve` accepts (CONTRACT.md)
    opts = [a for a in exec_start[2:] if a.startswith("--")]
    assert set(opts) <= {"--db", "--listen", "--devices", "--config", "--socket"}, opts
    assert exec_start[exec_start.index("--db") + 1].startswith("/var/lib/trainq/")
    assert one("StateDirectory") == "trainq"
    assert one("User") == "trainq" and one("Group") == "trainq" and one("DynamicUser") is None
    assert int(one("WatchdogSec").rstrip("s")) >= 10
    assert int(one("TimeoutStopSec").rstrip("s")) >= 60      # time to checkpoint
    assert one("KillMode") == "mixed"                        # SIGTERM to serve only
    assert one("Restart") == "on-failure"
    assert one("PrivateDevices") in (None, "no", "false")    # would hide /dev/nvidia*
    allowed = [v.split()[0] for v in values(d, "Service", "DeviceAllow")]
    # the NVIDIA driver's /proc/devices names, before driver 550.40 ("nvidia-frontend") and
    # since ("nvidia", "nvidiactl"): systemd matches char-NAME against them as a glob
    for group in ("nvidia-frontend", "nvidia", "nvidiactl", "nvidia-uvm", "nvidia-caps", "nvidia-modeset"):
        assert any(a.startswith("char-") and fnmatch.fnmatchcase(group, a[5:]) for a in allowed), (group, allowed)
    assert "/dev/nvidiactl" in allowed
    assert one("ProtectSystem") == "strict" and one("NoNewPrivileges") == "yes"
    assert one("PrivateTmp") == "yes" and one("ProtectHome") in ("yes", "read-only")
    assert set(one("RestrictAddressFamilies").split()) == {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}
    assert one("RuntimeDirectory") == "trainq"
    assert values(d, "Install", "WantedBy") == ["multi-user.target"]


def test_config_example_is_key_value_lines():
    keys = {}
    for n, line in enumerate(CONF.read_text().splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        assert "=" in s, "line %d is not KEY=VALUE: %r" % (n, line)
        k, _, v = s.partition("=")
        keys[k.strip()] = v.strip()
    assert set(keys) <= {"listen", "devices", "db", "allowed_hosts", "threads", "max_jobs_per_device",
                         "gpu_reserve_mb", "cpu_memory_mb", "backfill_window", "socket", "fair_share_window",
                         "max_running_per_user", "admin_group", "private_jobs", "allow_remote_writes"}
    assert keys["listen"] == "127.0.0.1:8470" and keys["devices"] == "auto"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian package systemd)")
def test_systemd_analyze_verify(tmp_path, trainq):
    text = UNIT.read_text()
    assert INSTALLED_BIN in text
    copy = tmp_path / "trainq.service"
    copy.write_text(text.replace(INSTALLED_BIN, os.path.abspath(trainq)))
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    # only lines about our file count: verify also loads the units it references
    # (multi-user.target, ...), and a container's own units may warn about themselves
    ours = [l for l in r.stdout.splitlines() if "trainq" in l]
    assert r.returncode == 0, r.stdout
    assert ours == [], "\n".join(ours)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian package systemd)")
def test_verify_would_catch_mistakes(tmp_path, trainq):
    """The check above is only worth something if verify reports what we filter for."""
    bad = tmp_path / "trainq.service"
    bad.write_text(UNIT.read_text().replace(INSTALLED_BIN, os.path.abspath(trainq))
                   .replace("[Install]", "NoSuchKey=1\n[Install]"))
    r = subprocess.run(["systemd-analyze", "verify", str(bad)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert "NoSuchKey" in r.stdout


def test_make_install_staged(tmp_path, trainq):
    """`make install DESTDIR=... PREFIX=...` (what a package build does): binary, unit with
    ExecStart following PREFIX, config installed once and then kept, the docs (docs/spec.md
    among them) and the man page trainq(1); uninstall removes the binary, the unit, the docs
    and the man page and keeps the config. No user is created and systemctl is not run with a
    DESTDIR."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dest = tmp_path / "pkg"
    mk = ["make", "-s", "-C", str(REPO), "DESTDIR=%s" % dest, "PREFIX=/opt/tq", "BUILD=%s" % build_of(trainq)]
    r = subprocess.run(mk + ["install"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout
    binary = dest / "opt/tq/bin/trainq"
    unit = dest / "opt/tq/lib/systemd/system/trainq.service"
    conf = dest / "etc/trainq/trainq.conf"
    assert binary.is_file() and os.access(binary, os.X_OK)
    assert (unit.stat().st_mode & 0o777) == 0o644
    assert "ExecStart=/opt/tq/bin/trainq serve " in unit.read_text()
    assert INSTALLED_BIN not in unit.read_text()
    assert conf.read_text() == CONF.read_text()
    docdir, man = dest / "opt/tq/share/doc/trainq", dest / "opt/tq/share/man/man1/trainq.1"
    for name in ("README.md", "api.md", "spec.md"):
        assert (docdir / name).read_bytes() == (REPO / ("docs" if name != "README.md" else "") / name).read_bytes()
    assert man.read_bytes() == (REPO / "docs" / "trainq.1").read_bytes()
    assert (man.stat().st_mode & 0o777) == 0o644
    conf.write_text("listen=127.0.0.1:9999\n")            # the admin's edit survives
    r = subprocess.run(mk + ["install"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    assert r.returncode == 0 and "keeping" in r.stdout, r.stdout
    assert conf.read_text() == "listen=127.0.0.1:9999\n"
    r = subprocess.run(mk + ["uninstall"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    assert not binary.exists() and not unit.exists() and conf.exists()
    assert not man.exists() and not docdir.exists()
    assert "/var/lib/trainq" in r.stdout                  # says what it kept


def host_units():
    for d in ("/usr/lib/systemd/system", "/lib/systemd/system"):
        if os.path.isdir(d):
            return d
    pytest.skip("no systemd units on this machine to verify against")


def verify_in(root, unit):
    """systemd-analyze verify --root=ROOT UNIT -> (exit status, its lines about trainq, all).
    With --root, a unit outside systemd's search path (PREFIX=/opt/tq) is "not found":
    SYSTEMD_UNIT_PATH adds its directory (the trailing ':' keeps the default path)."""
    env = dict(os.environ, SYSTEMD_UNIT_PATH=os.path.dirname(unit) + ":")
    r = subprocess.run(["systemd-analyze", "verify", "--root=%s" % root, unit], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60, env=env)
    return r.returncode, [l for l in r.stdout.splitlines() if "trainq" in l], r.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None or shutil.which("make") is None,
                    reason="systemd-analyze (Debian package systemd) or make is not installed")
@pytest.mark.parametrize("prefix", ["/usr/local", "/opt/tq"])
def test_systemd_analyze_verify_as_installed(tmp_path, trainq, prefix):
    """The unit as `make install` writes it (ExecStart, Documentation and the config path
    substituted for PREFIX and SYSCONFDIR), verified in the staged root: `--root` makes
    systemd-analyze look for ExecStart's binary there, and the machine's own units copied in
    give it the targets the unit refers to (sysinit.target, multi-user.target). This is what
    `make verify-unit` does (README, "Run it as a service")."""
    root = tmp_path / "root"
    r = subprocess.run(["make", "-s", "-C", str(REPO), "install", "DESTDIR=%s" % root, "PREFIX=%s" % prefix,
                        "BUILD=%s" % build_of(trainq)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout
    unit = "%s/lib/systemd/system/trainq.service" % prefix
    text = (root / unit.lstrip("/")).read_text()
    assert "ExecStart=%s/bin/trainq serve " % prefix in text
    if prefix != "/usr/local":
        assert INSTALLED_BIN not in text
    shutil.copytree(host_units(), root / "usr/lib/systemd/system", symlinks=True)
    rc, ours, out = verify_in(root, unit)
    assert rc == 0 and ours == [], out

    # the same check reports what it is for: a key systemd does not know, a binary missing
    good = text
    (root / unit.lstrip("/")).write_text(good.replace("[Install]", "NoSuchKey=1\n[Install]"))
    rc, ours, out = verify_in(root, unit)
    assert any("NoSuchKey" in l for l in ours), out
    (root / unit.lstrip("/")).write_text(good)
    (root / prefix.lstrip("/") / "bin/trainq").unlink()
    rc, ours, out = verify_in(root, unit)
    assert rc != 0 and any("%s/bin/trainq" % prefix in l for l in ours), out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None or shutil.which("make") is None,
                    reason="systemd-analyze (Debian package systemd) or make is not installed")
def test_make_verify_unit(trainq):
    """`make verify-unit`, the command README gives for checking the unit before installing."""
    build = build_of(trainq)
    r = subprocess.run(["make", "-s", "-C", str(REPO), "verify-unit", "BUILD=%s" % build],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert r.returncode == 0, r.stdout
    assert "verify-unit: systemd-analyze verify accepts /usr/local/lib/systemd/system/trainq.service" in r.stdout, \
        r.stdout
    shutil.rmtree(REPO / build / "verify-root", ignore_errors=True)
