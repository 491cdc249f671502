#!/usr/bin/env python3
"""PyTorch peer for scripts/gpu-check: the same model and SGD on the GPU, the way people run it.

channels_last, torch.backends.cudnn.benchmark = True, torch.autocast(dtype) for AMP with a
GradScaler for fp16, the usual accumulation loop (loss / accum, backward per micro-batch, one
step), TF32 as --tf32 says: "conv" (the default) is PyTorch's defaults and trainq's (cuDNN may
run fp32 convolutions in TF32, matmuls stay fp32), "off" and "all" as trainq's spec tf32 false
and true. --compile MODE runs the model through torch.compile(model, mode=MODE) ("default" or
"max-autotune", which also captures CUDA graphs; the loss, GradScaler and optimizer stay eager,
as the PyTorch tutorials write it); the compilation happens in the warm-up steps, whose time
beyond the median step is reported as compile_s. For each (batch, amp, accum) prints one JSON
line: samples_per_s (effective batch / median step time after the warmup, timed with
torch.cuda.synchronize around each step), peak_memory_bytes (torch.cuda.max_memory_allocated
over the timed steps, after reset_peak_memory_stats) and train_flops_per_sample (convolutions
and matmuls of one forward + backward, torch.utils.flop_counter, where it exists).
A torch without torch.compile answers each compile cell with "unavailable" and exits 0.
--device cpu runs the same loop on the CPU (no memory figures): the tests use it.
"""
import argparse
import contextlib
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


def train_flops_per_sample(model_name, c, h, w, dev):
    """FLOPs (2 per multiply-add) of the convolutions and matmuls in one forward and backward,
    per sample, counted by torch.utils.flop_counter on a fresh copy; None where it is missing."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    torch.manual_seed(0)
    m = tq.build_model(model_name, c, h, w).to(dev)
    x = torch.randn(2, c, h, w, device=dev)
    y = torch.randint(0, 10, (2,), device=dev)
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(m(x), y).backward()
    return fc.get_total_flops() / 2


def one(model_name, batch, amp, accum, steps, warmup, h, w, c, dev, compile_mode):
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rec = {"model": model_name, "batch": batch, "amp": amp, "accum": accum, "compile": compile_mode,
           "device": dev.type, "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version() if cuda else None,
           "gpu": torch.cuda.get_device_name(0) if cuda else None}
    torch.manual_seed(0)
    model = tq.build_model(model_name, c, h, w).to(dev).to(memory_format=torch.channels_last)
    model.train()
    opt = tq.make_optimizer(model, SGD)
    run = model
    if compile_mode != "none":
        if not hasattr(torch, "compile"):
            rec["unavailable"] = "torch.compile does not exist in PyTorch %s" % torch.__version__
            return rec
        run = torch.compile(model) if compile_mode == "default" else torch.compile(model, mode=compile_mode)
    dtype = DTYPES[amp]
    scaler = tq.grad_scaler(dev.type, enabled=(amp == "fp16"))
    xs = [torch.randn(batch, c, h, w, device=dev).to(memory_format=torch.channels_last) for _ in range(accum)]
    ys = [torch.randint(0, 10, (batch,), device=dev) for _ in range(accum)]
    times, warm = [], []
    for s in range(warmup + steps):
        if s == warmup and cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for j in range(accum):
            with torch.autocast(dev.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
                loss = F.cross_entropy(run(xs[j]), ys[j]) / accum
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sync()
        (times if s >= warmup else warm).append(time.perf_counter() - t)
    med = statistics.median(times)
    rec.update({"samples_per_s": batch * accum / med, "step_ms_median": med * 1e3,
                "warmup_s": sum(warm), "compile_s": max(0.0, sum(warm) - len(warm) * med) if compile_mode != "none" else None,
                "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                "final_loss": float(loss.detach()) * accum})
    return rec


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
    ap.add_argument("--compile", default="none", choices=("none", "default", "max-autotune"),
                    help="torch.compile the model in this mode (none: eager)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--no-flops", action="store_true", help="leave out the FLOP count")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 1:
        ap.error("--steps and --warmup must be >= 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 77
    dev = torch.device(a.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = a.tf32 == "all"
    torch.backends.cudnn.allow_tf32 = a.tf32 != "off"
    h, w, c = (int(v) for v in a.shape.split(","))
    if a.cells:
        cells = [(int(b), amp, int(acc)) for b, amp, acc in (x.split(":") for x in a.cells.split(","))]
    else:
        cells = [(int(b), amp, int(acc)) for b in a.batches.split(",") for amp in a.amps.split(",")
                 for acc in a.accums.split(",")]
    flops = None if a.no_flops else train_flops_per_sample(a.model, c, h, w, dev)
    for b, amp, acc in cells:
        r = one(a.model, b, amp, acc, a.steps, a.warmup, h, w, c, dev, a.compile)
        r["tf32"] = a.tf32
        r["train_flops_per_sample"] = flops
        print(json.dumps(r), flush=True)
        if a.device == "cuda":
            torch.cuda.empty_cache()
        if a.compile != "none" and hasattr(torch, "_dynamo"):
            torch._dynamo.reset()   # each cell compiles for its own shapes, as a fresh process would
    return 0


if __name__ == "__main__":
    sys.exit(main())
