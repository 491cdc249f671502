#!/usr/bin/python3
"""PyTorch peer for trainq's CPU benchmark: the same model, batch and SGD settings.

Prints one JSON line (the last line of stdout): {"model","batch","threads","amp","variant",
"samples_per_s","step_ms_median","first_step_s","compile_s","torch",...}; samples_per_s =
batch / median step time over the steps after the warmup. Variants: eager in PyTorch's default
NCHW layout, eager in channels_last (--channels-last), torch.compile of the model in its
default mode (--compile; the warmup steps include the compilation, which is reported as
compile_s and never timed). --amp bf16 runs the forward and the loss under
torch.autocast("cpu", bfloat16), as trainq's amp bf16 keeps fp32 master weights.

The interpreter: bench/.venv's python when bench/.venv exists (bench/setup-peer: PyPI's newest
torch), Debian's /usr/bin/python3 (python3-torch 1.13) otherwise; the script re-executes itself
under the venv unless TQ_PEER_NO_REEXEC=1 (bench/cpu sets it after choosing the python
itself). Where torch.compile does not exist (PyTorch 1.13), --compile prints
{"unavailable": "..."} and exits 3.

TQ_PERF_CTL=CTL_FIFO,ACK_FIFO: perf stat --control fifos; the timed steps are bracketed by
"enable" / "disable" so that perf counts them alone (bench/cpu uses it where perf works).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer_venv  # noqa: E402

if __name__ == "__main__":
    peer_venv.reexec_in_venv(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tq_torch as tq  # noqa: E402

SGD = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}


def torch_info():
    """What PyTorch this is and where it came from, and the ISA it dispatches to."""
    venv = peer_venv.in_venv()
    cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    onednn = blas = capv = None
    try:
        for line in torch.__config__.show().splitlines():
            line = line.strip(" -")
            if ("MKL-DNN v" in line or "oneDNN v" in line) and not onednn:
                onednn = line.split(" (Git")[0].replace("Intel(R) ", "")
            if line.startswith("CPU capability usage:") and not cap:
                capv = line.split(":", 1)[1].strip()
            if line.startswith("Build settings:") and "BLAS_INFO=" in line:
                blas = line.split("BLAS_INFO=")[1].split(",")[0]
    except Exception:
        pass
    return {
        "torch": torch.__version__,
        "torch_source": ("PyPI wheel in bench/.venv (bench/setup-peer)" if venv else
                         "Debian python3-torch" if torch.__file__.startswith("/usr/lib/python3/")
                         else "other: " + os.path.dirname(torch.__file__)),
        "python": sys.executable,
        "cpu_capability": cap() if cap else capv,
        "onednn": onednn,
        "blas": blas,
        "has_compile": hasattr(torch, "compile"),
    }


class PerfCtl:
    """perf stat --control fifo:CTL,ACK: enable / disable the counters around the timed steps."""

    def __init__(self, spec):
        self.ctl = self.ack = None
        if spec:
            ctl, ack = spec.split(",", 1)
            self.ctl = open(ctl, "w")
            self.ack = open(ack, "r")

    def send(self, cmd):
        if self.ctl:
            self.ctl.write(cmd + "\n")
            self.ctl.flush()
            self.ack.readline()


def probe(threads):
    torch.set_num_threads(threads)
    x = torch.randn(8, 16, 14, 14, requires_grad=True)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1)
    lin = torch.nn.Linear(16 * 14 * 14, 10)
    for amp in (False, True):
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else torch.autocast("cpu", enabled=False)
        with ctx:
            out = lin(torch.flatten(conv(x), 1))
        out.float().sum().backward()
    info = torch_info()
    if info["has_compile"]:
        try:
            from torch._inductor import cpu_vec_isa
            info["inductor_vec_isa"] = str(cpu_vec_isa.pick_vec_isa())
        except Exception as e:  # an older layout of inductor
            info["inductor_vec_isa"] = "? (%s)" % e
    print(json.dumps(info))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cnn", choices=tq.MODEL_NAMES)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=30, help="timed steps (after the warmup)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dataset", default="synthetic", choices=("synthetic", "fashion-mnist"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--amp", default="off", choices=("off", "bf16"),
                    help="bf16: forward and loss under torch.autocast('cpu', torch.bfloat16)")
    ap.add_argument("--channels-last", action="store_true",
                    help="model and inputs in torch.channels_last (NHWC, as trainq stores them)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile(model) in its default mode (compilation in the warmup)")
    ap.add_argument("--probe", action="store_true",
                    help="print the version / ISA facts as JSON after a tiny convolution forward and "
                         "backward, fp32 and bf16 (with ONEDNN_VERBOSE=1 oneDNN names its ISA and kernels)")
    a = ap.parse_args(argv)
    if a.probe:
        return probe(a.threads)
    if a.batch < 1 or a.threads < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--batch, --threads and --steps must be >= 1, --warmup >= 0")
    if a.compile and a.warmup < 1:
        ap.error("--compile needs --warmup >= 1 (the compilation is not timed)")

    info = torch_info()
    variant = ("compile" if a.compile else "eager") + ("-channels_last" if a.channels_last else "-nchw")
    head = {"model": a.model, "batch": a.batch, "threads": a.threads, "amp": a.amp,
            "variant": variant, "channels_last": a.channels_last, "compile": a.compile}
    if a.compile and not info["has_compile"]:
        print(json.dumps(dict(head, unavailable="torch.compile is not in PyTorch %s" % torch.__version__,
                              **info)))
        return 3

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
    fwd = torch.compile(model) if a.compile else model
    if a.amp == "bf16":
        def autocast():
            return torch.autocast("cpu", dtype=torch.bfloat16)
    else:
        import contextlib

        def autocast():
            return contextlib.nullcontext()

    perf = PerfCtl(os.environ.get("TQ_PERF_CTL"))
    times = []
    lv = float("nan")
    cpu0 = None
    for i in range(total):
        if i == a.warmup:
            perf.send("enable")
            cpu0 = time.process_time()
        xb, yb = batches[i % len(batches)]
        t0 = time.perf_counter()
        with autocast():
            out = fwd(xb)
            loss = F.cross_entropy(out, yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = float(loss.item())  # synchronises like a step record would
        times.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0
    perf.send("disable")
    timed = times[a.warmup:]
    med = statistics.median(timed)
    print(json.dumps(dict(
        head, samples_per_s=round(a.batch / med, 2), step_ms_median=round(med * 1e3, 3),
        step_ms_min=round(min(timed) * 1e3, 3),
        first_step_s=round(times[0], 3), warmup_s=round(sum(times[:a.warmup]), 3),
        # the compilation happens in the first step (forward, then backward): its time beyond a
        # steady step
        compile_s=round(times[0] - med, 3) if a.compile else None,
        timed_cpu_s_per_sample=cpu_s / (a.batch * a.steps),
        steps=a.steps, warmup=a.warmup, dataset=a.dataset, final_loss=lv,
        step_ms=[round(t * 1e3, 2) for t in times], **info)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
