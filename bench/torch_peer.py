#!/usr/bin/python3
"""PyTorch peer for trainq's CPU benchmark: the same model, batch and SGD settings, fp32.

Prints one JSON line: {"model","batch","threads","samples_per_s","step_ms_median",...};
samples_per_s = batch / median step time over the steps after the warmup.
Run with Debian's /usr/bin/python3 (PyTorch 1.13).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tq_torch as tq  # noqa: E402

SGD = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn", choices=tq.MODEL_NAMES)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=30, help="timed steps (after the warmup)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dataset", default="synthetic", choices=("synthetic", "fashion-mnist"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--channels-last", action="store_true",
                    help="model and inputs in torch.channels_last (NHWC, as trainq stores them)")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.threads < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--batch, --threads and --steps must be >= 1, --warmup >= 0")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    in_ch, h, w = 1, 28, 28  # Fashion-MNIST's shape for every model
    total = a.steps + a.warmup
    if a.dataset == "fashion-mnist":
        n = a.batch * total
        x, y, _, _ = tq.load_fashion_mnist(min(n, 60000), 1)
        nb = x.shape[0] // a.batch
        if nb < 1:
            ap.error("--batch larger than the training set")
        batches = [(x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch])
                   for i in range(nb)]
    else:
        # a few distinct random batches (normalised-pixel-like values), reused cyclically
        batches = [(torch.randn(a.batch, in_ch, h, w), torch.randint(0, 10, (a.batch,)))
                   for _ in range(min(total, 8))]

    model = tq.build_model(a.model, in_ch, h, w)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        batches = [(xb.contiguous(memory_format=torch.channels_last), yb) for xb, yb in batches]
    model.train()
    opt = tq.make_optimizer(model, SGD)
    times = []
    lv = float("nan")
    for i in range(total):
        xb, yb = batches[i % len(batches)]
        t0 = time.perf_counter()
        out = model(xb)
        loss = F.cross_entropy(out, yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = float(loss.item())  # synchronises like a step record would
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
    med = statistics.median(times)
    print(json.dumps({
        "model": a.model, "batch": a.batch, "threads": a.threads,
        "samples_per_s": round(a.batch / med, 2), "step_ms_median": round(med * 1e3, 3),
        "steps": a.steps, "warmup": a.warmup, "dataset": a.dataset,
        "channels_last": a.channels_last, "final_loss": lv, "torch": torch.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
