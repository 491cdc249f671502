"""The reference users have (issue 17): docs/spec.md and the man page docs/trainq.1.

Both are generated (`make docs`) from their templates and the spec parser's field table;
tests/unit/test_spec checks that the committed files are what that makes, and that the table
covers exactly the parser's fields. Here, against the real binary: the man page renders without
a groff warning; every option that a command's --help names is in the man page (its COMMANDS
sections are written by hand from the --help texts); no pointer to the design docs a clone does
not have; and an unknown spec field gets its "did you mean" from `trainq run` and over HTTP, a
missing CIFAR-10 directory its pointer to docs/spec.md's Datasets section."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_daemon import SYN, TRAINQ, check_error, make_daemon  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
MAN = REPO / "docs" / "trainq.1"
SPEC_MD = REPO / "docs" / "spec.md"

COMMANDS = ["run", "plan", "devices", "version", "serve", "worker",
            "submit", "ls", "show", "logs", "steps", "cancel", "rm", "requeue", "compare"]
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def binary():
    if not (TRAINQ.is_file() and os.access(TRAINQ, os.X_OK)):
        pytest.skip("%s is missing: build it first (make)" % TRAINQ)
    return str(TRAINQ)


def help_text(cmd):
    """The command's --help, or None while the command does not exist (or has no --help)."""
    r = subprocess.run([binary(), cmd, "--help"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=30,
                       env=dict(os.environ, TRAINQ_SERVER="http://127.0.0.1:9"))
    if r.returncode != 0 or "unknown command" in r.stderr:
        return None
    return r.stdout


def test_man_page_renders_without_warnings():
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed (Debian: groff-base)")
    r = subprocess.run(["groff", "-ww", "-z", "-man", "-Tutf8", str(MAN)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = subprocess.run(["groff", "-man", "-Tutf8", str(MAN)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60, env=dict(os.environ, MANWIDTH="80"))
    text = re.sub(r".\x08", "", r.stdout.decode("utf-8", "replace"))
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "CLIENT COMMANDS", "SPEC", "DATASETS",
                    "FILES", "ENVIRONMENT", "EXIT STATUS", "EXAMPLES", "SEE ALSO"):
        assert re.search(r"^%s$" % section, text, re.M), section
    # the SPEC section is the generated reference: every field, with its range
    for needle in ("batch_size", "1...65536", "optimizer.momentum", "tf32", "cuda_graphs", "after",
                   "dependency_failed", "cifar-10-binary.tar.gz", "TRAINQ_SERVER"):
        assert needle in text, needle


def test_every_help_option_is_in_the_man_page():
    roff = MAN.read_text()
    missing, seen = [], 0
    for cmd in COMMANDS:
        assert ".SS trainq %s" % cmd in roff, "the man page has no section for trainq %s" % cmd
        text = help_text(cmd)
        if text is None:
            continue          # not there yet (requeue's client command): its section is from the API
        seen += 1
        for opt in sorted(set(OPTION.findall(text))):
            if opt.replace("-", "\\-") not in roff:
                missing.append("%s (trainq %s --help)" % (opt, cmd))
    assert seen >= 10
    assert not missing, ("options that --help names and docs/trainq.1.in does not; add them, then "
                         "run `make docs`: %s" % ", ".join(missing))


def test_no_pointer_to_docs_a_clone_lacks():
    files = [REPO / "README.md", REPO / "docs" / "api.md", SPEC_MD, REPO / "docs" / "spec.md.in",
             MAN, REPO / "docs" / "trainq.1.in"]
    for f in files:
        text = f.read_text()
        for bad in ("CONTRACT.md", "shared docs", "shared design docs"):
            assert bad not in text, "%s still points to %s" % (f.relative_to(REPO), bad)
    for cmd in COMMANDS:
        text = help_text(cmd) or ""
        assert "CONTRACT" not in text and "shared docs" not in text, cmd


def test_run_suggests_the_nearest_field(tmp_path):
    spec = tmp_path / "typo.json"
    spec.write_text(json.dumps(dict(SYN, batchsize=8)))
    r = subprocess.run([binary(), "run", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert 'field "batchsize": unknown field "batchsize" (did you mean "batch_size"?)' in r.stderr, r.stderr
    spec.write_text(json.dumps(dict(SYN, optimizer={"momentun": 0.5})))
    r = subprocess.run([binary(), "plan", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.returncode == 2, r
    assert '(did you mean "optimizer.momentum"?)' in r.stderr, r.stderr
    spec.write_text(json.dumps(dict(SYN, foo=1)))
    r = subprocess.run([binary(), "run", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.returncode == 2 and 'unknown field "foo"' in r.stderr and "did you mean" not in r.stderr, r


def test_http_400_suggests_the_nearest_field(make_daemon, tmp_path):
    d = make_daemon()
    err = check_error(d.request("POST", "/v1/jobs", dict(SYN, batchsize=8)), 400, "batchsize")
    assert err["code"] == "invalid_spec"
    assert err["message"] == 'unknown field "batchsize" (did you mean "batch_size"?)', err
    err = check_error(d.request("POST", "/v1/jobs", dict(SYN, optimizer={"momentun": 0.5})), 400,
                      "optimizer.momentun")
    assert err["message"] == 'unknown field "optimizer.momentun" (did you mean "optimizer.momentum"?)'
    err = check_error(d.request("POST", "/v1/jobs", dict(SYN, learning_rate=0.1)), 400, "learning_rate")
    assert err["message"] == 'unknown field "learning_rate"', err
    # the client shows the daemon's message
    spec = tmp_path / "typo.json"
    spec.write_text(json.dumps(dict(SYN, epoch=2)))
    r = subprocess.run([binary(), "submit", str(spec), "--server", "http://127.0.0.1:%d" % d.port],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 2, r
    assert '(did you mean "epochs"?)' in r.stderr, r.stderr
    # a CIFAR-10 directory without the files: which files, where, and where the docs say more
    empty = tmp_path / "cifar"
    empty.mkdir()
    os.chmod(tmp_path, 0o755)
    spec = {"dataset": "cifar10", "data_dir": str(empty), "steps": 1, "device": "cpu"}
    err = check_error(d.request("POST", "/v1/jobs", spec), 400, "data_dir")
    assert err["code"] == "data_not_found", err
    for needle in (str(empty / "data_batch_1.bin"), "test_batch.bin", "cifar-10-batches-bin",
                   'docs/spec.md, "Datasets"'):
        assert needle in err["message"], (needle, err)
    assert d.get("/v1/jobs")["jobs"] == []
