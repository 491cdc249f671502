"""bench/load, briefly: a real `trainq serve`, a cnn job, 2 clients polling for 2 s. Every answer
the clients got must be right, and the report must hold the numbers docs/benchmarks.md quotes
(latencies, requests/s, the slowdown). Slowdowns are not asserted: this is a smoke test of the
driver, not a timed test."""
import json
import math
import subprocess
import sys
from pathlib import Path

LOAD = Path(__file__).resolve().parents[2] / "bench" / "load"


def test_bench_load_smoke(trainq, tmp_path):
    r = subprocess.run([sys.executable, str(LOAD), "--trainq", trainq, "--seconds", "2",
                        "--clients", "2", "--json"], cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, "bench/load failed (%d):\n%s" % (r.returncode, r.stderr[-3000:])
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["wrong_answers"] == 0
    assert rep["clients"] == 2 and rep["requests"] > 0
    for k in ("job", "steps", "all"):
        lat = rep["latency_ms"][k]
        assert lat["n"] > 0 and 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    assert rep["step_ms"]["baseline"]["n"] > 0 and rep["step_ms"]["polled_in_window"]["n"] > 0
    for k in ("baseline", "polled"):
        v = rep["samples_per_s_median"][k]
        assert isinstance(v, float) and math.isfinite(v) and v > 0
