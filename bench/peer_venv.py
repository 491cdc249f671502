"""Which python runs the benchmarks' PyTorch peer: bench/.venv's (bench/setup-peer: PyPI's
newest torch) where it exists, else the python already running. One place for bench/cpu,
bench/torch_peer.py, bench/run and scripts/gpu-check. Standard library only: the scripts import
it before torch.
"""
import os
import subprocess
import sys

VENV = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".venv")
VENV_PY = os.path.join(VENV, "bin", "python")
NO_REEXEC = "TQ_PEER_NO_REEXEC"   # =1: keep the python a script was started with


def in_venv():
    """True when this process runs bench/.venv's python."""
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def venv_python(needs=()):
    """(bench/.venv's python, None) when it exists and imports every module in needs; else
    (None, why not), why None when there is no venv at all."""
    if not os.access(VENV_PY, os.X_OK):
        return None, None
    if needs:
        r = subprocess.run([VENV_PY, "-c", "import " + ", ".join(needs)], capture_output=True, text=True)
        if r.returncode != 0:
            return None, (r.stderr.strip().splitlines() or ["its python failed"])[-1]
    return VENV_PY, None


def reexec_in_venv(script, needs=()):
    """Run script again under bench/.venv's python (same arguments) unless TQ_PEER_NO_REEXEC=1
    or this already is that python. Returns only when it does not: None, or why the venv that
    exists could not be used."""
    if os.environ.get(NO_REEXEC) == "1" or in_venv():
        return None
    py, why = venv_python(needs)
    if py:
        os.environ[NO_REEXEC] = "1"
        os.execv(py, [py, os.path.abspath(script)] + sys.argv[1:])
    return why
