"""machine_facts — what a benchmark report says of the CPU it ran on: the model, family/model/
stepping, the vector extensions that decide which kernels run (AVX2, AVX-512F, AVX512_BF16,
AVX512_FP16, AVX-VNNI, AMX), the CPUs usable and the memory. Used by bench/cpu and bench/ab."""
import os


def cpu_facts():
    model, flags, fm = "unknown", set(), {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and model == "unknown":
                    model = v.strip()
                elif k in ("cpu family", "model", "stepping") and k not in fm:
                    fm[k] = v.strip()
                elif k == "flags" and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    ext = {"AVX2": "avx2" in flags, "AVX-512F": "avx512f" in flags,
           "AVX512_BF16": "avx512_bf16" in flags, "AVX512_FP16": "avx512_fp16" in flags,
           "AVX-VNNI": "avx_vnni" in flags, "AMX": any(f.startswith("amx") for f in flags)}
    amx = sorted(f for f in flags if f.startswith("amx"))
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"model": model, "family_model": "family %s model %s stepping %s" % (
                fm.get("cpu family", "?"), fm.get("model", "?"), fm.get("stepping", "?")),
            "extensions": ext, "amx_flags": amx,
            "nproc": len(os.sched_getaffinity(0)), "online_cpus": os.cpu_count(),
            "mem_bytes": mem}


def ext_text(ext, amx):
    out = []
    for k, v in ext.items():
        if k == "AMX" and v:
            out.append("AMX (%s)" % ", ".join(amx))
        else:
            out.append("%s %s" % (k, "yes" if v else "no"))
    return ", ".join(out)
