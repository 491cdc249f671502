"""Tests of the PyTorch-side helpers (tq_torch.py); they do not need build/trainq."""
import json
import os
import struct
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tq_torch as tq  # noqa: E402

BN_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _bn_keys(prefix):
    return ["%s.%s" % (prefix, k) for k in BN_KEYS]


# ------------------------------------------------------------------------------- models


def test_resnet20_state_dict_keys_spot_check():
    sd = tq.build_model("resnet20", 3, 32, 32).state_dict()
    keys = list(sd)
    # the start and end, written out
    assert keys[:6] == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                        "bn1.running_var", "bn1.num_batches_tracked"]
    assert keys[6:18] == [
        "layer1.0.conv1.weight",
        "layer1.0.bn1.weight", "layer1.0.bn1.bias", "layer1.0.bn1.running_mean",
        "layer1.0.bn1.running_var", "layer1.0.bn1.num_batches_tracked",
        "layer1.0.conv2.weight",
        "layer1.0.bn2.weight", "layer1.0.bn2.bias", "layer1.0.bn2.running_mean",
        "layer1.0.bn2.running_var", "layer1.0.bn2.num_batches_tracked",
    ]
    assert keys[-2:] == ["fc.weight", "fc.bias"]
    # the first block of stage 2 carries the downsample, after conv2/bn2 (torchvision order)
    i = keys.index("layer2.0.conv1.weight")
    assert keys[i:i + 18] == (
        ["layer2.0.conv1.weight"] + _bn_keys("layer2.0.bn1")
        + ["layer2.0.conv2.weight"] + _bn_keys("layer2.0.bn2")
        + ["layer2.0.downsample.0.weight"] + _bn_keys("layer2.0.downsample.1"))
    # the whole list, built independently of the module code
    expected = ["conv1.weight"] + _bn_keys("bn1")
    for stage in (1, 2, 3):
        for blk in range(3):
            p = "layer%d.%d" % (stage, blk)
            expected += [p + ".conv1.weight"] + _bn_keys(p + ".bn1")
            expected += [p + ".conv2.weight"] + _bn_keys(p + ".bn2")
            if blk == 0 and stage > 1:
                expected += [p + ".downsample.0.weight"] + _bn_keys(p + ".downsample.1")
    expected += ["fc.weight", "fc.bias"]
    assert keys == expected
    assert len(keys) == 128
    # layouts and dtypes
    assert tuple(sd["conv1.weight"].shape) == (16, 3, 3, 3)
    assert tuple(sd["layer2.0.conv1.weight"].shape) == (32, 16, 3, 3)
    assert tuple(sd["layer2.0.downsample.0.weight"].shape) == (32, 16, 1, 1)
    assert tuple(sd["layer3.0.downsample.0.weight"].shape) == (64, 32, 1, 1)
    assert tuple(sd["fc.weight"].shape) == (10, 64)
    for k, v in sd.items():
        if k.endswith("num_batches_tracked"):
            assert v.dtype == torch.int64 and v.shape == ()
        else:
            assert v.dtype == torch.float32


def test_small_models_state_dict_keys():
    cnn = tq.build_model("cnn", 1, 28, 28).state_dict()
    assert [(k, tuple(v.shape)) for k, v in cnn.items()] == [
        ("conv1.weight", (32, 1, 3, 3)), ("conv1.bias", (32,)),
        ("conv2.weight", (64, 32, 3, 3)), ("conv2.bias", (64,)),
        ("fc1.weight", (128, 64 * 7 * 7)), ("fc1.bias", (128,)),
        ("fc2.weight", (10, 128)), ("fc2.bias", (10,)),
    ]
    mlp = tq.build_model("mlp", 1, 28, 28).state_dict()
    assert [(k, tuple(v.shape)) for k, v in mlp.items()] == [
        ("fc1.weight", (512, 784)), ("fc1.bias", (512,)),
        ("fc2.weight", (256, 512)), ("fc2.bias", (256,)),
        ("fc3.weight", (10, 256)), ("fc3.bias", (10,)),
    ]


def test_resnet18_50_structure():
    r18 = tq.build_model("resnet18", 3, 32, 32).state_dict()
    assert "layer4.1.bn2.running_var" in r18 and "layer4.2.conv1.weight" not in r18
    assert "layer1.0.downsample.0.weight" not in r18  # 64 -> 64, stride 1
    assert tuple(r18["layer4.0.downsample.0.weight"].shape) == (512, 256, 1, 1)
    assert tuple(r18["fc.weight"].shape) == (10, 512)
    r50 = tq.build_model("resnet50", 3, 32, 32).state_dict()
    assert "layer4.2.bn3.num_batches_tracked" in r50 and "layer3.5.conv3.weight" in r50
    # stage 1 of a bottleneck net changes channels 64 -> 256: downsample even at stride 1
    assert tuple(r50["layer1.0.downsample.0.weight"].shape) == (256, 64, 1, 1)
    # the stride is on the 3x3 conv: conv1 is 1x1 in->width, conv2 is 3x3
    assert tuple(r50["layer2.0.conv1.weight"].shape) == (128, 256, 1, 1)
    assert tuple(r50["layer2.0.conv2.weight"].shape) == (128, 128, 3, 3)
    m = tq.build_model("resnet50", 3, 32, 32)
    assert m.layer2[0].conv2.stride == (2, 2) and m.layer2[0].conv1.stride == (1, 1)
    assert m.layer2[0].downsample[0].stride == (2, 2)
    assert tuple(r50["fc.weight"].shape) == (10, 2048)


def _resnet20_count(in_ch):
    """By hand: stem + 3 stages of 3 basic blocks + 1x1-conv downsamples + fc."""
    conv = lambda i, o, k: i * o * k * k  # noqa: E731
    bn = lambda c: 2 * c  # noqa: E731
    n = conv(in_ch, 16, 3) + bn(16)
    ch = 16
    for width in (16, 32, 64):
        for blk in range(3):
            n += conv(ch, width, 3) + bn(width) + conv(width, width, 3) + bn(width)
            if blk == 0 and ch != width:
                n += conv(ch, width, 1) + bn(width)
            ch = width
    return n + 64 * 10 + 10


def test_parameter_counts():
    # resnet20 with 1x1-conv (option B) downsample: 269,722 for the option-A (zero-pad
    # shortcut) variant + 2,752 for the two projection shortcuts (512+64, 2048+128)
    assert _resnet20_count(3) == 272474
    assert tq.count_params(tq.build_model("resnet20", 3, 32, 32)) == 272474
    assert tq.count_params(tq.build_model("resnet20", 1, 28, 28)) == 272474 - 2 * 16 * 9
    assert tq.count_params(tq.build_model("cnn", 1, 28, 28)) == (
        32 * 9 + 32 + 32 * 64 * 9 + 64 + 64 * 7 * 7 * 128 + 128 + 128 * 10 + 10)
    assert tq.count_params(tq.build_model("cnn", 1, 28, 28)) == 421642
    assert tq.count_params(tq.build_model("mlp", 1, 28, 28)) == 535818
    # the usual CIFAR-variant counts (10 classes)
    assert tq.count_params(tq.build_model("resnet18", 3, 32, 32)) == 11173962
    assert tq.count_params(tq.build_model("resnet50", 3, 32, 32)) == 23520842


@pytest.mark.parametrize("name", tq.MODEL_NAMES)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_forward_shapes(name, shape):
    torch.manual_seed(0)
    m = tq.build_model(name, *shape)
    out = m(torch.randn(2, *shape))
    assert tuple(out.shape) == (2, 10)


def test_batchnorm_settings():
    m = tq.build_model("resnet20", 1, 28, 28)
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d)]
    assert len(bns) == 1 + 18 + 2
    assert all(b.eps == 1e-5 and b.momentum == 0.1 and b.affine and b.track_running_stats
               for b in bns)


# ------------------------------------------------------------------------------- safetensors


def test_st_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    bf = torch.tensor([1.0, -2.5, 3.140625, 1e30, -0.0, float("inf")], dtype=torch.bfloat16)
    tensors = {
        "a.f32": rng.standard_normal((3, 4, 2)).astype(np.float32),
        "b.f16": rng.standard_normal((5,)).astype(np.float16),
        "c.i64": np.array([0, -1, 2 ** 62, -(2 ** 63)], dtype=np.int64),
        "d.scalar_i64": np.array(20, dtype=np.int64),
        "e.i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "f.u8": np.arange(7, dtype=np.uint8),
        "g.bf16": bf,
        "h.empty": np.zeros((0, 3), dtype=np.float32),
        "i.torch_f32": torch.arange(4, dtype=torch.float32).reshape(2, 2).t(),  # non-contiguous
        "j.torch_i64": torch.tensor(7, dtype=torch.int64),
    }
    p = tmp_path / "t.safetensors"
    tq.st_save(str(p), tensors, metadata={"format": "pt", "note": "round trip"})
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    back, md = tq.st_load(str(p), with_metadata=True)
    assert md == {"format": "pt", "note": "round trip"}
    assert set(back) == set(tensors)
    for k in ("a.f32", "b.f16", "c.i64", "d.scalar_i64", "e.i32", "f.u8", "h.empty"):
        assert back[k].dtype == tensors[k].dtype, k
        assert back[k].shape == tensors[k].shape, k
        assert np.array_equal(back[k], tensors[k]), k
    assert back["d.scalar_i64"].shape == () and int(back["d.scalar_i64"]) == 20
    assert back["g.bf16"].dtype == np.float32
    assert np.array_equal(back["g.bf16"], bf.float().numpy())
    assert np.array_equal(back["i.torch_f32"], np.array([[0, 2], [1, 3]], dtype=np.float32))
    assert back["j.torch_i64"].dtype == np.int64 and int(back["j.torch_i64"]) == 7
    raw_bf = tq.st_load(str(p), bf16="raw")["g.bf16"]
    assert raw_bf.dtype == np.uint16
    assert np.array_equal(raw_bf, bf.view(torch.int16).numpy().view(np.uint16))
    # torch view keeps every dtype, bf16 bit-exact
    tt = tq.st_load_torch(str(p))
    assert tt["g.bf16"].dtype == torch.bfloat16
    assert torch.equal(tt["g.bf16"].view(torch.int16), bf.view(torch.int16))
    assert tt["c.i64"].dtype == torch.int64 and tt["b.f16"].dtype == torch.float16
    header, md2 = tq.st_header(str(p))
    assert header["g.bf16"]["dtype"] == "BF16" and header["b.f16"]["dtype"] == "F16"
    assert header["c.i64"]["dtype"] == "I64" and header["f.u8"]["dtype"] == "U8"
    assert header["d.scalar_i64"]["shape"] == []
    assert md2["format"] == "pt"


def test_st_state_dict_round_trip(tmp_path):
    torch.manual_seed(0)
    m = tq.build_model("resnet20", 1, 28, 28)
    m.train()
    m(torch.randn(4, 1, 28, 28))  # move running stats and num_batches_tracked
    p = tmp_path / "m.safetensors"
    tq.st_save(str(p), m.state_dict())
    header, _ = tq.st_header(str(p))
    assert header["bn1.num_batches_tracked"] == {
        "dtype": "I64", "shape": [], "data_offsets": header["bn1.num_batches_tracked"][
            "data_offsets"]}
    m2 = tq.build_model("resnet20", 1, 28, 28)
    m2.load_state_dict({k: torch.from_numpy(v) for k, v in tq.st_load(str(p)).items()},
                       strict=True)
    for (k, a), (k2, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and a.dtype == b.dtype and torch.equal(a, b), k
    assert int(m2.bn1.num_batches_tracked) == 1
    assert all(tuple(v.shape) == tuple(m.state_dict()[k].shape)
               for k, v in tq.st_load_torch(str(p)).items())


def _hand_built():
    """A safetensors byte string put together by hand, tensors out of name order."""
    w = struct.pack("<4f", 1.0, -2.0, 0.5, 8.0)                 # F32 [2,2]
    n = struct.pack("<q", 123456789012)                         # I64 []
    h = struct.pack("<3H", 0x3C00, 0xC000, 0x7BFF)              # F16 [3]: 1, -2, 65504
    b = struct.pack("<2H", 0x3F80, 0xC0A0)                      # BF16 [2]: 1, -5
    u = bytes([0, 7, 255])                                      # U8 [3]
    i = struct.pack("<2i", -7, 2 ** 31 - 1)                     # I32 [2,1]
    data = n + w + h + b + u + i
    header = (
        '{"__metadata__":{"format":"pt"},'
        '"w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},'
        '"n":{"dtype":"I64","shape":[],"data_offsets":[0,8]},'
        '"h":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},'
        '"b":{"dtype":"BF16","shape":[2],"data_offsets":[30,34]},'
        '"u":{"dtype":"U8","shape":[3],"data_offsets":[34,37]},'
        '"i":{"dtype":"I32","shape":[2,1],"data_offsets":[37,45]}}'
    ).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def test_st_parse_hand_built():
    t, md = tq.st_loads(_hand_built(), with_metadata=True)
    assert md == {"format": "pt"}
    assert set(t) == {"w", "n", "h", "b", "u", "i"}
    assert t["w"].dtype == np.float32 and t["w"].tolist() == [[1.0, -2.0], [0.5, 8.0]]
    assert t["n"].dtype == np.int64 and t["n"].shape == () and int(t["n"]) == 123456789012
    assert t["h"].dtype == np.float16 and t["h"].tolist() == [1.0, -2.0, 65504.0]
    assert t["b"].dtype == np.float32 and t["b"].tolist() == [1.0, -5.0]
    assert t["u"].dtype == np.uint8 and t["u"].tolist() == [0, 7, 255]
    assert t["i"].dtype == np.int32 and t["i"].tolist() == [[-7], [2 ** 31 - 1]]
    # unpadded headers (other writers) parse too
    raw = _hand_built()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = raw[8:8 + n].rstrip(b" ")
    t2 = tq.st_loads(struct.pack("<Q", len(hdr)) + hdr + raw[8 + n:])
    assert t2["w"].tolist() == t["w"].tolist()


def test_st_writer_layout():
    raw = tq.st_dumps({"b": np.array([1, 2], dtype=np.int64),
                       "a": np.array([1.5], dtype=np.float32)}, metadata={"k": "v"})
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and raw[8 + n - 1:8 + n] in (b" ", b"}")
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"k": "v"}
    assert header["a"] == {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    assert header["b"] == {"dtype": "I64", "shape": [2], "data_offsets": [4, 20]}
    assert raw[8 + n:] == struct.pack("<f", 1.5) + struct.pack("<2q", 1, 2)


@pytest.mark.parametrize("mutate", [
    lambda r: r[:4],                                                    # truncated length
    lambda r: struct.pack("<Q", 10 ** 9) + r[8:],                       # header past EOF
    lambda r: r[:-1],                                                   # data too short
    lambda r: r.replace(b'"F32"', b'"F99"'),                            # unknown dtype
    lambda r: r.replace(b'"shape":[2,2]', b'"shape":[2,3]'),            # size mismatch
    lambda r: r.replace(b'[0,8]', b'[1,9]'),                            # overlap with w
    lambda r: r[:8] + b"[" + r[9:],                                     # not JSON
    lambda r: r[:8] + b"\xff" + r[9:],                                  # not UTF-8
])
def test_st_parse_rejects(mutate):
    with pytest.raises(tq.SafetensorsError):
        tq.st_loads(mutate(_hand_built()))


# ------------------------------------------------------------------------------- data


def test_load_fashion_mnist():
    if not os.path.exists(os.path.join(tq.FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")):
        pytest.skip("no Fashion-MNIST in %s" % tq.FASHION_MNIST_DIR)
    x, y, xt, yt = tq.load_fashion_mnist(100, 50)
    assert x.dtype == torch.float32 and tuple(x.shape) == (100, 1, 28, 28)
    assert y.dtype == torch.int64 and tuple(y.shape) == (100,)
    assert tuple(xt.shape) == (50, 1, 28, 28) and tuple(yt.shape) == (50,)
    assert int(y[0]) == 9 and int(yt[0]) == 9  # both files start with an ankle boot
    assert int(y.min()) >= 0 and int(y.max()) <= 9
    lo = (0.0 - 0.2860) / 0.3530
    hi = (1.0 - 0.2860) / 0.3530
    assert abs(float(x.min()) - lo) < 1e-6 and float(x.max()) <= hi + 1e-6
    # first N in file order: a larger load starts with the same samples
    x2, y2, _, _ = tq.load_fashion_mnist(200, 1)
    assert torch.equal(x2[:100], x) and torch.equal(y2[:100], y)


# ------------------------------------------------------------------------------- optimizer, loop


def test_make_optimizer_defaults():
    m = tq.build_model("mlp", 1, 4, 4)
    sgd = tq.make_optimizer(m, {"type": "sgd"})
    g = sgd.param_groups[0]
    assert isinstance(sgd, torch.optim.SGD)
    assert (g["lr"], g["momentum"], g["nesterov"], g["weight_decay"]) == (0.05, 0.9, True, 5e-4)
    assert isinstance(tq.make_optimizer(m, None), torch.optim.SGD)
    adamw = tq.make_optimizer(m, {"type": "adamw"})
    g = adamw.param_groups[0]
    assert isinstance(adamw, torch.optim.AdamW)
    assert (g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"]) == (
        1e-3, (0.9, 0.999), 1e-8, 1e-2)
    g = tq.make_optimizer(m, {"type": "adamw", "lr": 3e-4, "betas": [0.8, 0.99]}).param_groups[0]
    assert g["lr"] == 3e-4 and tuple(g["betas"]) == (0.8, 0.99) and g["weight_decay"] == 1e-2
    g = tq.make_optimizer(m, {"type": "sgd", "momentum": 0.0}).param_groups[0]
    assert g["momentum"] == 0.0 and not g["nesterov"]
    with pytest.raises(ValueError):
        tq.make_optimizer(m, {"type": "lion"})
    with pytest.raises(ValueError):
        tq.make_optimizer(m, {"type": "sgd", "betas": [0.9, 0.9]})


def test_sgd_matches_contract_formula():
    """CONTRACT.md: g += wd·w; buf = m·buf + g; nesterov g += m·buf; w -= lr·g."""
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    model = torch.nn.Module()
    model.w = w
    opt = tq.make_optimizer(model, {"type": "sgd", "lr": 0.1, "momentum": 0.9,
                                    "nesterov": True, "weight_decay": 0.01})
    ref = w.detach().clone()
    buf = None
    for grad in ([0.3, -0.1, 2.0], [-1.0, 0.5, 0.25], [0.0, 1.0, -3.0]):
        gr = torch.tensor(grad, dtype=torch.float64)
        w.grad = gr.clone()
        opt.step()
        g = gr + 0.01 * ref
        buf = g.clone() if buf is None else 0.9 * buf + g
        g = g + 0.9 * buf
        ref = ref - 0.1 * g
        assert torch.allclose(w.detach(), ref, rtol=0, atol=1e-12)


def test_micro_batch_indices():
    # 100 samples, b=16: 6 micro-batches an epoch (4 dropped); accum 2: 3 steps an epoch
    assert tq.micro_batch_indices(100, 16, 2, 0) == [(0, 16), (16, 32)]
    assert tq.micro_batch_indices(100, 16, 2, 2) == [(64, 80), (80, 96)]
    assert tq.micro_batch_indices(100, 16, 2, 3) == [(0, 16), (16, 32)]
    # 5 micro-batches an epoch, accum 2: 2 steps, the fifth micro-batch is not used
    assert tq.micro_batch_indices(80, 16, 2, 1) == [(32, 48), (48, 64)]
    assert tq.micro_batch_indices(80, 16, 2, 2) == [(0, 16), (16, 32)]
    assert tq.micro_batch_indices(64, 32, 1, 5) == [(32, 64)]
    with pytest.raises(ValueError):
        tq.micro_batch_indices(10, 16, 1, 0)


def test_accumulation_equals_big_batch():
    """mlp has no batch-norm: 4 micro-batches of 8 accumulated == one batch of 32."""
    torch.manual_seed(0)
    x = torch.randn(96, 1, 8, 8)
    y = torch.randint(0, 10, (96,))
    a = tq.build_model("mlp", 1, 8, 8)
    b = tq.build_model("mlp", 1, 8, 8)
    b.load_state_dict(a.state_dict())
    la = tq.train_steps(a, tq.make_optimizer(a, {"type": "sgd"}), x, y, 8, 4, 5)
    lb = tq.train_steps(b, tq.make_optimizer(b, {"type": "sgd"}), x, y, 32, 1, 5)
    assert len(la) == len(lb) == 5
    assert np.allclose(la, lb, rtol=1e-5, atol=0)
    for (k, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(pa, pb, rtol=1e-4, atol=1e-6), k


def test_train_steps_reports_unscaled_mean_and_counts_bn_batches():
    torch.manual_seed(0)
    x = torch.randn(40, 1, 8, 8)
    y = torch.randint(0, 10, (40,))
    m = tq.build_model("resnet20", 1, 8, 8)
    ref = tq.build_model("resnet20", 1, 8, 8)
    ref.load_state_dict(m.state_dict())
    losses = tq.train_steps(m, tq.make_optimizer(m, {"type": "sgd"}), x, y, 8, 2, 3)
    # 40 samples / 8 = 5 micro-batches an epoch -> 2 steps an epoch; 3 steps = 6 forwards
    assert int(m.bn1.num_batches_tracked) == 6
    # step 1's loss is the mean of the first two micro-batches' CE at the initial weights
    ref.train()
    with torch.no_grad():
        ce = [float(torch.nn.functional.cross_entropy(ref(x[i:i + 8]), y[i:i + 8]))
              for i in (0, 8)]
    assert abs(losses[0] - sum(ce) / 2) < 1e-5 * abs(losses[0])
    assert all(np.isfinite(losses))


def test_evaluate():
    torch.manual_seed(0)
    m = tq.build_model("cnn", 1, 8, 8)
    x = torch.randn(20, 1, 8, 8)
    y = torch.randint(0, 10, (20,))
    loss, acc = tq.evaluate(m, x, y, batch_size=7)
    with torch.no_grad():
        out = m(x)
    assert abs(loss - float(torch.nn.functional.cross_entropy(out, y))) < 1e-5
    assert acc == pytest.approx(int((out.argmax(1) == y).sum()) / 20)
    assert m.training
