#!/usr/bin/env python3
"""PyTorch peer for scripts/gpu-check: the same model and SGD on the GPU, the way people run it.

channels_last, torch.backends.cudnn.benchmark = True, torch.autocast(dtype) for AMP with a
GradScaler for fp16, the usual accumulation loop (loss / accum, backward per micro-batch, one
step), TF32 as --tf32 says: "conv" (the default) is PyTorch's defaults and trainq's (cuDNN may
run fp32 convolutions in TF32, matmuls stay fp32), "off" and "all" as trainq's spec tf32 false
and true. For each (batch, amp, accum) prints one
JSON line: samples_per_s (effective batch / median step time after the warmup, timed with
torch.cuda.synchronize around each step) and peak_memory_bytes (torch.cuda.max_memory_allocated
over the timed steps, after reset_peak_memory_stats).
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
DTYPES = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def one(model_name, batch, amp, accum, steps, warmup, h, w, c):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = tq.build_model(model_name, c, h, w).to(dev).to(memory_format=torch.channels_last)
    model.train()
    opt = tq.make_optimizer(model, SGD)
    dtype = DTYPES[amp]
    scaler = torch.amp.GradScaler("cuda", enabled=(amp == "fp16"))
    xs = [torch.randn(batch, c, h, w, device=dev).to(memory_format=torch.channels_last) for _ in range(accum)]
    ys = [torch.randint(0, 10, (batch,), device=dev) for _ in range(accum)]
    times = []
    for s in range(warmup + steps):
        if s == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for j in range(accum):
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.cross_entropy(model(xs[j]), ys[j]) / accum
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        if s >= warmup:
            times.append(time.perf_counter() - t)
    med = statistics.median(times)
    return {"model": model_name, "batch": batch, "amp": amp, "accum": accum,
            "samples_per_s": batch * accum / med, "step_ms_median": med * 1e3,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", choices=tq.MODEL_NAMES)
    ap.add_argument("--batches", default="32,64,128")
    ap.add_argument("--amps", default="off,fp16,bf16")
    ap.add_argument("--accums", default="1,2")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--shape", default="32,32,3", help="H,W,C")
    ap.add_argument("--cells", default="", help="BATCH:AMP:ACCUM,... in this order (instead of the grid)")
    ap.add_argument("--tf32", default="conv", choices=("off", "conv", "all"),
                    help="TF32 for fp32: conv (PyTorch's and trainq's default), off, all")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 77
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = a.tf32 == "all"
    torch.backends.cudnn.allow_tf32 = a.tf32 != "off"
    h, w, c = (int(v) for v in a.shape.split(","))
    if a.cells:
        cells = [(int(b), amp, int(acc)) for b, amp, acc in (x.split(":") for x in a.cells.split(","))]
    else:
        cells = [(int(b), amp, int(acc)) for b in a.batches.split(",") for amp in a.amps.split(",")
                 for acc in a.accums.split(",")]
    for b, amp, acc in cells:
        r = one(a.model, b, amp, acc, a.steps, a.warmup, h, w, c)
        r["tf32"] = a.tf32
        print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
