"""bench/pack, briefly: a queue of 2 tiny jobs (a cnn and a resnet20) through a real `trainq
serve`, packed (2 jobs at once on the CPU) and one at a time, one round, written to a temporary
folder (--out: docs/ is left alone). Every job must succeed, and the report must hold what
docs/benchmarks.md quotes (wall times, jobs/hour, the peak planned bytes, the ratio). Speeds are
not asserted: this is a smoke test of the driver, not a timed test."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "bench" / "pack"


def test_bench_pack_smoke(trainq, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(PACK), "--trainq", trainq, "--jobs", "2", "--rounds", "1",
                        "--steps", "2", "--cnn-steps", "4", "--batch", "8", "--timeout", "120",
                        "--out", str(out), "--json"], cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, "bench/pack failed (%d):\n%s" % (r.returncode, r.stderr[-3000:])
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep == json.loads((out / "bench-pack.json").read_text())
    md = (out / "bench-pack.md").read_text()
    assert md.startswith("<!-- bench/pack begin -->") and md.rstrip().endswith("<!-- bench/pack end -->")
    assert rep["all_succeeded"] is True
    assert rep["settings"]["packed_max_jobs"] == 2 and rep["settings"]["mix"] == {"cnn": [1, 4],
                                                                                  "resnet20": [1, 2]}
    m = rep["machine"]
    assert m["cores"] >= 1 and isinstance(m["avx2"], bool) and isinstance(m["amx"], list) and m["model"]
    assert [(x["round"], x["config"], x["max_jobs_per_device"]) for x in rep["runs"]] == \
        [(1, "packed", 2), (1, "serial", 1)]
    for run in rep["runs"]:
        assert run["succeeded"] == run["jobs"] == 2 and run["failed"] == 0 and run["out_of_memory"] == 0
        assert run["wall_s"] > 0 and run["jobs_per_hour"] > 0 and run["samples_per_s"] > 0
        assert run["device_samples"] > 0 and run["over_budget_samples"] == 0
        assert 0 < run["peak_planned_bytes"] <= run["budget_bytes"]
        assert 1 <= run["max_running_jobs"] <= run["max_jobs_per_device"]
    for cfg in ("packed", "serial"):
        s = rep["summary"][cfg]
        assert s["succeeded"] == s["jobs"] == 2 and s["out_of_memory"] == 0
        assert s["wall_s"]["min"] <= s["wall_s"]["median"] <= s["wall_s"]["max"]
    ratio = rep["summary"]["ratio_jobs_per_hour_packed_over_serial"]
    assert ratio["n"] == 1 and ratio["min"] <= ratio["median"] <= ratio["max"] and len(ratio["per_round"]) == 1
