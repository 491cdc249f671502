"""Learning: cnn on the full Fashion-MNIST reaches >= 88% test accuracy after one epoch on
the CPU (batch 64, SGD lr 0.05 nesterov, cosine schedule). Measured here: 89.8-89.9% over
seeds 0 and 2 (constant lr: 88.6-89.3%), ~29 s on 2 cores."""
import json
import subprocess
import time


def test_cnn_one_epoch_fashion_mnist(trainq, tmp_path):
    spec = {"model": "cnn", "dataset": "fashion-mnist", "batch_size": 64, "epochs": 1,
            "seed": 0, "threads": 2, "device": "cpu", "lr_schedule": {"type": "cosine"}}
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec))
    t0 = time.time()
    r = subprocess.run([trainq, "run", str(p), "--db", str(tmp_path / "run.db")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    wall = time.time() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    print("\ncnn, one epoch of Fashion-MNIST: val_accuracy %.4f, %d steps, %.1f s, %.0f samples/s"
          % (s["val_accuracy"], s["steps"], wall, s["samples_per_s"]))
    assert s["steps"] == 60000 // 64
    assert s["val_accuracy"] >= 0.88
