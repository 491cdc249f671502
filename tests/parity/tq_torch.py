"""tq_torch — the PyTorch side of trainq's parity tests and CPU benchmark.

Everything here follows /work/shared/CONTRACT.md ("Models, data and optimizer semantics"):
the same module names and layouts trainq exports, the same input normalisation, loss and
optimizer defaults, and the same micro-batch order with shuffle off.

Helpers:
  build_model(name, in_ch, h, w, num_classes=10)
  st_save(path, tensors, metadata=None) / st_load(path, with_metadata=False) / st_load_torch(path)
  load_fashion_mnist(n_train, n_test, data_dir=...)
  make_optimizer(model, opt_spec)
  train_steps(model, opt, x, y, batch_size, accum_steps, steps)
  evaluate(model, x, y, batch_size=256)
"""
import gzip
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

BN_EPS = 1e-5
BN_MOMENTUM = 0.1

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


# --------------------------------------------------------------------------------------------
# models


def _bn(ch):
    return nn.BatchNorm2d(ch, eps=BN_EPS, momentum=BN_MOMENTUM)


class MLP(nn.Module):
    def __init__(self, in_features, num_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, num_classes)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self, in_ch, h, w, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, 32, 3, padding=1, bias=True)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=True)
        # two 2x2 max-pools (floor)
        self.fc1 = nn.Linear(64 * ((h // 2) // 2) * ((w // 2) // 2), 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)  # (C, H, W) order
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_ch, width, stride):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _bn(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=1, padding=1, bias=False)
        self.bn2 = _bn(width)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), _bn(out_ch))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch, width, stride):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = _bn(width)
        # the stride sits on the 3x3 conv (torchvision "ResNet v1.5")
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = _bn(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), _bn(out_ch))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stride-1 stem, no max-pool, global average pool, fc."""

    def __init__(self, block, blocks_per_stage, widths, strides, in_ch, num_classes=10):
        super().__init__()
        stem = widths[0]
        self.conv1 = nn.Conv2d(in_ch, stem, 3, stride=1, padding=1, bias=False)
        self.bn1 = _bn(stem)
        ch = stem
        self.num_stages = len(widths)
        for si, (n, width, stride) in enumerate(zip(blocks_per_stage, widths, strides)):
            layers = []
            for bi in range(n):
                layers.append(block(ch, width, stride if bi == 0 else 1))
                ch = width * block.expansion
            setattr(self, "layer%d" % (si + 1), nn.Sequential(*layers))
        self.fc = nn.Linear(ch, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for si in range(self.num_stages):
            x = getattr(self, "layer%d" % (si + 1))(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


MODEL_NAMES = ("mlp", "cnn", "resnet20", "resnet18", "resnet50")


def build_model(name, in_ch, h, w, num_classes=10):
    """The contract's model `name` for inputs of shape (in_ch, h, w), default PyTorch init."""
    if name == "mlp":
        return MLP(in_ch * h * w, num_classes)
    if name == "cnn":
        return CNN(in_ch, h, w, num_classes)
    if name == "resnet20":
        return ResNet(BasicBlock, (3, 3, 3), (16, 32, 64), (1, 2, 2), in_ch, num_classes)
    if name == "resnet18":
        return ResNet(BasicBlock, (2, 2, 2, 2), (64, 128, 256, 512), (1, 2, 2, 2), in_ch,
                      num_classes)
    if name == "resnet50":
        return ResNet(Bottleneck, (3, 4, 6, 3), (64, 128, 256, 512), (1, 2, 2, 2), in_ch,
                      num_classes)
    raise ValueError("unknown model %r (expected one of %s)" % (name, ", ".join(MODEL_NAMES)))


def count_params(model):
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# safetensors (minimal reader / writer)

# safetensors dtype -> (numpy dtype used for storage, item size)
_ST_NP = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # bit pattern; no native numpy bfloat16
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_NP_ST = {
    np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
    np.dtype("int8"): "I8", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL",
}
_TORCH_ST = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_ST_TORCH = {v: k for k, v in _TORCH_ST.items()}


class SafetensorsError(ValueError):
    pass


def _to_storage(value):
    """(safetensors dtype, little-endian numpy array holding the exact bytes) for one tensor."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype not in _TORCH_ST:
            raise SafetensorsError("unsupported torch dtype %s" % t.dtype)
        st = _TORCH_ST[t.dtype]
        if t.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy().view("<u2")
        else:
            arr = t.numpy()
        return st, np.ascontiguousarray(arr, dtype=_ST_NP[st]).reshape(tuple(t.shape))
    arr = np.asarray(value)
    if arr.dtype not in _NP_ST:
        raise SafetensorsError("unsupported numpy dtype %s" % arr.dtype)
    st = _NP_ST[arr.dtype]
    # (np.ascontiguousarray would turn a 0-d array into shape (1,))
    return st, np.ascontiguousarray(arr, dtype=_ST_NP[st]).reshape(arr.shape)


def st_dumps(tensors, metadata=None):
    """Serialise {name: numpy array | torch tensor} to safetensors bytes.

    torch.bfloat16 tensors are written as BF16; numpy arrays keep their dtype."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise SafetensorsError("'__metadata__' is reserved")
        st, arr = _to_storage(tensors[name])
        data = arr.tobytes()
        header[name] = {"dtype": st, "shape": [int(d) for d in arr.shape],
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        md = {}
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError("metadata must map str to str")
            md[k] = v
        header["__metadata__"] = md
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    return struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs)


def st_save(path, tensors, metadata=None):
    data = st_dumps(tensors, metadata)
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def st_parse(buf):
    """Parse safetensors bytes -> (header dict without __metadata__, metadata dict, data view).

    Validates lengths, dtypes, shapes and offsets (inside the data section, sized exactly
    prod(shape)·itemsize, non-overlapping)."""
    buf = memoryview(buf)
    if len(buf) < 8:
        raise SafetensorsError("file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    if n > len(buf) - 8:
        raise SafetensorsError("header length %d exceeds the file (%d bytes)" % (n, len(buf)))
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError("header is not JSON: %s" % e)
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError("__metadata__ must map str to str")
    data = buf[8 + n:]
    spans = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise SafetensorsError("%s: entry is not an object" % name)
        dt = info.get("dtype")
        if dt not in _ST_NP:
            raise SafetensorsError("%s: unsupported dtype %r" % (name, dt))
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise SafetensorsError("%s: bad shape %r" % (name, shape))
        offs = info.get("data_offsets")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise SafetensorsError("%s: bad data_offsets %r" % (name, offs))
        b, e = offs
        if not 0 <= b <= e <= len(data):
            raise SafetensorsError("%s: data_offsets %r outside the data section (%d bytes)"
                                   % (name, offs, len(data)))
        want = math.prod(shape) * _ST_NP[dt].itemsize
        if e - b != want:
            raise SafetensorsError("%s: %d bytes for %s %s (want %d)" % (name, e - b, dt, shape,
                                                                         want))
        spans.append((b, e, name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise SafetensorsError("%s and %s overlap" % (n0, n1))
    return header, metadata, data


def _bf16_bits_to_f32(bits):
    return (bits.astype("<u4") << 16).view("<f4")


def st_loads(buf, with_metadata=False, bf16="float32"):
    """safetensors bytes -> {name: numpy array} (and the metadata when with_metadata).

    BF16 has no numpy dtype: bf16="float32" widens it exactly to float32, bf16="raw" returns
    the uint16 bit patterns."""
    header, metadata, data = st_parse(buf)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=_ST_NP[info["dtype"]])
        arr = arr.reshape(tuple(info["shape"])).copy()
        if info["dtype"] == "BF16" and bf16 == "float32":
            arr = _bf16_bits_to_f32(arr)
        out[name] = arr
    return (out, metadata) if with_metadata else out


def st_load(path, with_metadata=False, bf16="float32"):
    with open(path, "rb") as f:
        return st_loads(f.read(), with_metadata=with_metadata, bf16=bf16)


def st_header(path):
    """(tensor entries, metadata) of a safetensors file: {name: {dtype, shape, data_offsets}}."""
    with open(path, "rb") as f:
        header, metadata, _ = st_parse(f.read())
    return header, metadata


def st_load_torch(path):
    """safetensors file -> {name: torch tensor} with the stored dtypes (BF16 included)."""
    with open(path, "rb") as f:
        header, _, data = st_parse(f.read())
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = info["dtype"]
        arr = np.frombuffer(data[b:e], dtype=_ST_NP[dt]).reshape(tuple(info["shape"])).copy()
        if dt == "BF16":
            out[name] = torch.from_numpy(arr.view("<i2")).view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(arr)
    return out


# --------------------------------------------------------------------------------------------
# data


def _read_idx(path, expect_magic):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">I", raw[:4])
    if magic != expect_magic:
        raise ValueError("%s: IDX magic 0x%08x, want 0x%08x" % (path, magic, expect_magic))
    ndim = magic & 0xFF
    dims = struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim])
    arr = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != math.prod(dims):
        raise ValueError("%s: %d bytes of data for dims %s" % (path, arr.size, dims))
    return arr.reshape(dims)


def _normalise(pixels, mean, std):
    x = pixels.astype(np.float32) / np.float32(255.0)
    return (x - np.float32(mean)) / np.float32(std)


def load_fashion_mnist(n_train, n_test, data_dir=FASHION_MNIST_DIR):
    """First n_train / n_test samples in file order (None: all), normalised like trainq.

    Returns (x_train, y_train, x_test, y_test): float32 N×1×28×28 and int64 N tensors."""
    def part(prefix, n):
        imgs = _read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 0x00000803)
        labels = _read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 0x00000801)
        if imgs.shape[0] != labels.shape[0]:
            raise ValueError("%s: %d images but %d labels" % (prefix, imgs.shape[0],
                                                              labels.shape[0]))
        if n is not None:
            if n > imgs.shape[0]:
                raise ValueError("%s: asked for %d samples, have %d" % (prefix, n,
                                                                        imgs.shape[0]))
            imgs, labels = imgs[:n], labels[:n]
        x = _normalise(imgs, FASHION_MNIST_MEAN, FASHION_MNIST_STD)[:, None, :, :]
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(
            labels.astype(np.int64))

    x_tr, y_tr = part("train", n_train)
    x_te, y_te = part("t10k", n_test)
    return x_tr, y_tr, x_te, y_te


# --------------------------------------------------------------------------------------------
# optimizer and training loop

SGD_DEFAULTS = {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}
ADAMW_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}


def make_optimizer(model, opt_spec=None):
    """torch.optim.SGD / AdamW from a CONTRACT.md optimizer object (missing fields: defaults)."""
    spec = dict(opt_spec or {})
    kind = spec.pop("type", "sgd")
    params = model.parameters()
    if kind == "sgd":
        known = set(SGD_DEFAULTS)
        o = dict(SGD_DEFAULTS)
    elif kind == "adamw":
        known = set(ADAMW_DEFAULTS)
        o = dict(ADAMW_DEFAULTS)
    else:
        raise ValueError("optimizer.type %r: expected sgd or adamw" % kind)
    unknown = set(spec) - known
    if unknown:
        raise ValueError("optimizer: unknown field(s) %s for %s" % (sorted(unknown), kind))
    o.update(spec)
    if kind == "sgd":
        nesterov = bool(o["nesterov"])
        if float(o["momentum"]) == 0.0:
            # torch refuses nesterov without momentum; with momentum 0 it is plain SGD anyway
            nesterov = False
        return torch.optim.SGD(params, lr=float(o["lr"]), momentum=float(o["momentum"]),
                               nesterov=nesterov, weight_decay=float(o["weight_decay"]))
    betas = tuple(float(b) for b in o["betas"])
    return torch.optim.AdamW(params, lr=float(o["lr"]), betas=betas, eps=float(o["eps"]),
                             weight_decay=float(o["weight_decay"]))


def grad_scaler(device_type, enabled=True, **kw):
    """A GradScaler for device_type: torch.amp's where it exists (PyTorch 2.x: CUDA and the
    CPU), else torch.cuda.amp's (1.13: CUDA only, disabled on any other device)."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device_type, enabled=enabled, **kw)
    return torch.cuda.amp.GradScaler(enabled=enabled and device_type == "cuda", **kw)


def micro_batch_indices(n, batch_size, accum_steps, step):
    """Sample ranges [(start, end), ...] of 0-based optimizer step `step`, shuffle off.

    An epoch is ⌊n/batch_size⌋ micro-batches, i.e. ⌊that/accum_steps⌋ optimizer steps; the
    step's micro-batches are consecutive micro-batches of its epoch."""
    per_epoch = n // batch_size
    steps_per_epoch = per_epoch // accum_steps
    if steps_per_epoch < 1:
        raise ValueError("%d samples make no full optimizer step of %d×%d" % (n, batch_size,
                                                                               accum_steps))
    within = step % steps_per_epoch
    return [((within * accum_steps + j) * batch_size, (within * accum_steps + j + 1) * batch_size)
            for j in range(accum_steps)]


def train_steps(model, opt, x, y, batch_size, accum_steps=1, steps=1):
    """The contract's loop in fp32, model.train(), shuffle off. Returns per-step losses.

    Each micro-batch: loss = CE mean / accum_steps, backward; every accum_steps micro-batches
    opt.step() and opt.zero_grad(). A step's reported loss is the mean of its micro-batches'
    unscaled CE (= the sum of the divided losses)."""
    model.train()
    n = x.shape[0]
    losses = []
    opt.zero_grad(set_to_none=True)
    for s in range(steps):
        total = 0.0
        for b, e in micro_batch_indices(n, batch_size, accum_steps, s):
            out = model(x[b:e])
            loss = F.cross_entropy(out, y[b:e]) / accum_steps
            loss.backward()
            total += float(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


@torch.no_grad()
def evaluate(model, x, y, batch_size=256):
    """(mean CE, accuracy as a fraction) in eval mode (running batch-norm statistics)."""
    model.eval()
    loss_sum = 0.0
    correct = 0
    for b in range(0, x.shape[0], batch_size):
        out = model(x[b:b + batch_size])
        loss_sum += float(F.cross_entropy(out, y[b:b + batch_size], reduction="sum"))
        correct += int((out.argmax(1) == y[b:b + batch_size]).sum())
    model.train()
    return loss_sum / x.shape[0], correct / x.shape[0]
