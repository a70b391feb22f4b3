"""cudal2.matmul behaves as torch.matmul: results, errors, out=, autograd, torch.compile, the
custom op's fake and autograd registrations, patch()/patched(), CUDAL2_DISABLE, the overhead
benchmark. CPU tests run everywhere; @pytest.mark.gpu tests exercise the kernel path."""
import json
import subprocess
import sys
import warnings

import pytest
import torch

import cudal2
from cudal2.core import vocab
from cudal2.runtime import hot, race, resolve
from cudal2.core.vocab import AUDIT_VERSION

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


def _t(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 5, shape, generator=g, dtype=dtype)


CASES = [
    ((5,), (5,), F32),                  # dot
    ((3, 5), (5,), F32),                # mv
    ((5,), (5, 4), F32),                # vm
    ((3, 5), (5, 4), F32),
    ((3, 5), (5, 4), F16),
    ((3, 5), (5, 4), BF16),
    ((3, 5), (5, 4), torch.float64),
    ((3, 5), (5, 4), torch.int64),
    ((3, 5), (5, 4), torch.int32),
    ((64, 64), (64, 64), F16),
    ((2, 3, 5), (2, 5, 4), F32),        # batched
    ((2, 3, 5), (5, 4), F16),           # batched @ 2-D
    ((2, 1, 3, 5), (6, 5, 4), F32),     # broadcast batch dims
    ((2, 3, 5), (5,), F32),
    ((5,), (2, 5, 4), F32),
    ((0, 5), (5, 4), F32),              # empty M
    ((3, 0), (0, 4), F16),              # empty K: zeros
    ((3, 5), (5, 0), F32),
    ((0,), (0,), F32),
]


@pytest.mark.parametrize("sa,sb,dtype", CASES, ids=[f"{a}@{b}-{str(d)[6:]}" for a, b, d in CASES])
def test_equals_torch_matmul_on_cpu(sa, sb, dtype):
    a, b = _t(sa, dtype, 1), _t(sb, dtype, 2)
    want = torch.matmul(a, b)
    got = cudal2.matmul(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


def test_non_contiguous_and_parameters():
    a = _t((6, 4), F32).t()             # (4, 6), column-major
    b = torch.nn.Parameter(_t((5, 6), F32).t())
    assert torch.equal(cudal2.matmul(a, b), torch.matmul(a, b))
    x = _t((4, 8), F16)[:, ::2]         # odd strides
    w = _t((4, 3), F16)
    assert torch.equal(cudal2.matmul(x, w), torch.matmul(x, w))


def test_out_argument():
    a, b = _t((3, 5), F32), _t((5, 4), F32)
    out = torch.empty(3, 4)
    res = cudal2.matmul(a, b, out=out)
    assert res is out and torch.equal(out, torch.matmul(a, b))
    # Wrong-shaped out: torch resizes it (with a warning); so do we.
    o1, o2 = torch.empty(7), torch.empty(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.matmul(a, b, out=o1)
        cudal2.matmul(a, b, out=o2)
    assert o1.shape == o2.shape == (3, 4) and torch.equal(o1, o2)


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001 - comparing exactly what torch raises
        return ("raised", type(exc), str(exc))


BAD = [
    ("mismatched", lambda: (_t((3, 4), F32), _t((5, 6), F32)), {}),
    ("mismatched-f16", lambda: (_t((3, 4), F16), _t((5, 6), F16)), {}),
    ("batched-mismatch", lambda: (_t((2, 3, 4), F32), _t((3, 5, 6), F32)), {}),
    ("0-d", lambda: (torch.tensor(2.0), _t((3,), F32)), {}),
    ("dtype-mix", lambda: (_t((3, 4), F32), _t((4, 5), F16)), {}),
    ("int-float", lambda: (_t((3, 4), torch.int64), _t((4, 5), F32)), {}),
    ("not-a-tensor", lambda: ([[1.0]], _t((1, 1), F32)), {}),
    ("none", lambda: (None, _t((1, 1), F32)), {}),
    ("out-dtype", lambda: (_t((3, 4), F32), _t((4, 5), F32)), {"out": torch.empty(3, 5, dtype=torch.int64)}),
    ("out-grad", lambda: (_t((3, 4), F32).requires_grad_(), _t((4, 5), F32)), {"out": torch.empty(3, 5)}),
]


@pytest.mark.parametrize("name,make,kw", BAD, ids=[b[0] for b in BAD])
def test_same_errors_as_torch(name, make, kw):
    a, b = make()
    want = _outcome(lambda: torch.matmul(a, b, **kw))
    got = _outcome(lambda: cudal2.matmul(a, b, **kw))
    assert want[0] == "raised", f"{name}: torch.matmul did not raise"
    assert got == want


def test_autograd_on_cpu_matches_torch():
    a = _t((4, 6), F32).requires_grad_()
    b = _t((6, 3), F32).requires_grad_()
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    g = _t((4, 3), F32, 9)
    cudal2.matmul(a, b).backward(g)
    torch.matmul(a2, b2).backward(g)
    assert torch.equal(a.grad, a2.grad) and torch.equal(b.grad, b2.grad)


def test_disable_knob(monkeypatch):
    monkeypatch.delenv("CUDAL2_DISABLE", raising=False)
    assert hot.disabled() is False
    monkeypatch.setenv("CUDAL2_DISABLE", "0")
    assert hot.disabled() is False
    monkeypatch.setenv("CUDAL2_DISABLE", "1")
    assert hot.disabled() is True
    a, b = _t((3, 5), F16), _t((5, 4), F16)
    assert torch.equal(cudal2.matmul(a, b), torch.matmul(a, b))


# -- the custom op -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F16, torch.float64])
def test_op_opcheck_on_cpu(dtype):
    args = (_t((5, 7), dtype), _t((7, 3), dtype))
    torch.library.opcheck(torch.ops.cudal2.hgemm.default, args)
    torch.library.opcheck(torch.ops.cudal2.hgemm.default, (args[0].t().contiguous().t(), args[1]))
    ag = (args[0].clone().requires_grad_(dtype != F16), args[1].clone().requires_grad_(dtype != F16))
    torch.library.opcheck(torch.ops.cudal2.hgemm.default, ag)


def test_op_fake_impl_on_fake_cuda_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a = torch.empty(64, 32, dtype=F16, device="cuda")
        b = torch.empty_strided((32, 16), (1, 32), dtype=F16, device="cuda")  # column-major
        c = torch.ops.cudal2.hgemm(a, b)
        assert (c.shape, c.dtype, c.device.type, c.stride()) == ((64, 16), F16, "cuda", (16, 1))
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            torch.ops.cudal2.hgemm(a, a)


def test_op_rejects_non_2d():
    with pytest.raises(RuntimeError, match="2-D"):
        torch.ops.cudal2.hgemm(_t((2, 3, 4), F32), _t((4, 5), F32))


def test_op_autograd_matches_torch():
    a = _t((4, 6), torch.float64).requires_grad_()
    b = _t((6, 3), torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(torch.ops.cudal2.hgemm, (a, b))
    g = _t((4, 3), torch.float64, 5)
    ga, gb = torch.autograd.grad(torch.ops.cudal2.hgemm(a, b), (a, b), g)
    ta, tb = torch.autograd.grad(torch.matmul(a, b), (a, b), g)
    assert torch.equal(ga, ta) and torch.equal(gb, tb)
    # Only the needed gradient is computed.
    (gb_only,) = torch.autograd.grad(torch.ops.cudal2.hgemm(a.detach(), b), (b,), g)
    assert torch.equal(gb_only, tb)


# -- torch.compile -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_on_cpu(backend):
    torch._dynamo.reset()

    def f(x, y, z):
        return cudal2.matmul(x, y).relu() + cudal2.matmul(x, z.t())

    x, y, z = _t((8, 16), F32), _t((16, 4), F32), _t((4, 16), F32)
    cf = torch.compile(f, fullgraph=True, backend=backend)
    assert torch.equal(cf(x, y, z), f(x, y, z))
    xb = _t((2, 8, 16), F32)
    assert torch.equal(cf(xb, y, z), f(xb, y, z))


# -- patch / patched ---------------------------------------------------------------------------
def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 8, bias=False))


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_patched_model_on_cpu_is_identical_and_restored(dtype):
    m = _model().to(dtype)
    x = _t((5, 16), dtype)
    x3 = _t((2, 5, 16), dtype)
    want, want3 = m(x), m(x3)
    with cudal2.patched(m) as pm:
        assert pm is m
        assert all("forward" in l.__dict__ for l in m if isinstance(l, torch.nn.Linear))
        assert torch.equal(m(x), want) and torch.equal(m(x3), want3)
    assert all("forward" not in l.__dict__ for l in m)
    assert torch.equal(m(x), want)


def test_patch_is_idempotent_and_keeps_an_instance_forward():
    m = _model()
    lin = m[0]
    custom = lambda x: torch.zeros(x.shape[0], 32)  # noqa: E731 - an instance-level forward
    lin.forward = custom
    cudal2.patch(m)
    cudal2.patch(m)
    x = _t((3, 16), F32)
    assert torch.equal(m[0](x), torch.zeros(3, 32))  # CPU input: the layer's own forward
    cudal2.unpatch(m)
    assert lin.forward is custom
    assert "forward" not in m[2].__dict__


def test_patched_model_gradients_on_cpu():
    m, ref = _model(), _model()
    x = _t((4, 16), F32)
    with cudal2.patched(m):
        m(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


# -- overhead benchmark and import weight ------------------------------------------------------
def test_overhead_benchmark_runs_on_cpu(tmp_path):
    from cudal2.runs import overhead
    res = overhead.measure("cpu", (8, 8, 8), calls=5, repeats=3)
    assert [r["path"] for r in res["rows"]] == list(overhead.PATHS)
    assert res["served_by"] == "torch (CPU)"
    assert all(r["median_us"] > 0 and r["n"] == 3 for r in res["rows"])
    table = overhead.format_table([res])
    assert "cudal2.matmul" in table and "vs torch" in table
    out = tmp_path / "oh.json"
    rc = overhead.main(["--device", "cpu", "--shape", "4", "4", "4", "--calls", "3",
                        "--repeats", "2", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data[0]["shape"] == [4, 4, 4] and len(data[0]["rows"]) == 4


def test_import_is_light():
    # The serving path needs torch and the standard library (core.build is stdlib-only and is
    # what loads a kernel); the measurement stack and the optional dependencies stay out.
    code = ("import sys, cudal2; cudal2.matmul; heavy = [m for m in ('pandas', 'trl', 'ray', "
            "'matplotlib', 'cutlass_library', 'transformers', 'cudal2.harness', 'cudal2.runs', "
            "'cudal2.search') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ==============================================================================================
# GPU: the kernel path
# ==============================================================================================
def _ref(a, b):
    return torch.matmul(a.float(), b.float())


def _close(c, ref, K):
    err = (c.float() - ref).abs().max().item()
    return err <= 2e-3 * K ** 0.5 * (ref.abs().max().item() + 1)


@pytest.fixture
def gpu_store(tmp_path, monkeypatch):
    """A kernel table holding the mma family's default (any-shape) kernel, marked tuned for one
    shape, in a temp store and cache: exercises build, load, exact, nearest and the race."""
    from cudal2.core.store import KernelIndex
    from cudal2.templates import FAMILIES, instantiate
    arch = vocab.ARCH_BY_CAPABILITY.get(torch.cuda.get_device_capability())
    if arch not in ("sm_80", "sm_90a"):
        pytest.skip(f"no kernel family targets this GPU ({arch})")
    root = tmp_path / "kernels"
    monkeypatch.setenv("CUDAL2_KERNELS", str(root))
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    idx = KernelIndex(root)
    for layout in ("RR", "RC"):
        cfg = FAMILIES["mma"].default().with_(LAYOUT=layout)
        idx.add(instantiate(cfg), arch=arch, acc="f32", layout=layout, M=256, N=256, K=256,
                family="mma", tuned=True, mode="offline", report="test fixture",
                speedups={"torch": 1.01}, config=cfg.name(),   # trusted: serves nearest shapes
                audit=AUDIT_VERSION, gpu=torch.cuda.get_device_name())   # this GPU's: no race
    idx.write()
    resolve.reset()
    yield root
    resolve.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["RR", "RC"])
def test_gpu_exact_kernel_path_is_correct(gpu_store, layout):
    a = torch.randn(256, 256, device="cuda", dtype=F16)
    b = torch.randn(256, 256, device="cuda", dtype=F16)
    if layout == "RC":
        b = b.t().contiguous().t()
    c = cudal2.matmul(a, b)
    assert resolve.serving[(0, 256, 256, 256, layout)] is not resolve.TORCH
    assert c.dtype == F16 and _close(c, _ref(a, b), 256)
    out = torch.empty(256, 256, device="cuda", dtype=F16)
    assert cudal2.matmul(a, b, out=out) is out and _close(out, _ref(a, b), 256)


@pytest.mark.gpu
def test_gpu_kernel_launches_on_the_current_stream(gpu_store):
    """On a side stream, a delayed write to A and then cudal2.matmul: a kernel on any other
    stream would read A before the write lands."""
    a = torch.randn(256, 256, device="cuda", dtype=F16)
    b = torch.randn(256, 256, device="cuda", dtype=F16)
    cudal2.matmul(a, b)                       # resolve (build, load) first
    assert resolve.serving[(0, 256, 256, 256, "RR")] is not resolve.TORCH
    new = torch.randn_like(a)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)        # tens of ms of GPU time on s
        a.copy_(new)
        c = cudal2.matmul(a, b)
    s.synchronize()
    assert _close(c, _ref(new, b), 256)


@pytest.mark.gpu
def test_gpu_table_kernels_are_correct():
    """Every tuned kernel of the shipped table for this GPU on its own shape."""
    from cudal2.core.store import KernelIndex
    arch = vocab.ARCH_BY_CAPABILITY.get(torch.cuda.get_device_capability())
    rows = [r for r in KernelIndex.load().tuned_rows() if r.arch == arch and r.acc == "f32"]
    if not rows:
        pytest.skip(f"the shipped table has no tuned {arch} kernels yet")
    resolve.reset()
    for r in rows[:8]:
        a = torch.randn(r.M, r.K, device="cuda", dtype=F16)
        b = torch.randn(r.K, r.N, device="cuda", dtype=F16)
        if r.layout == "RC":
            b = b.t().contiguous().t()
        c = cudal2.matmul(a, b)
        assert resolve.serving[(0, r.M, r.N, r.K, r.layout)] is not resolve.TORCH, r.file
        assert _close(c, _ref(a, b), r.K), r.file


@pytest.mark.gpu
def test_gpu_nearest_races_once_and_caches_on_disk(gpu_store, monkeypatch, tmp_path):
    a = torch.randn(192, 320, device="cuda", dtype=F16)
    b = torch.randn(320, 136, device="cuda", dtype=F16)
    calls = []
    real_race = race.race
    monkeypatch.setattr(race, "race", lambda *args: calls.append(1) or real_race(*args))
    c1 = cudal2.matmul(a, b)
    c2 = cudal2.matmul(a, b)
    assert calls == [1]                                  # raced on the first call only
    assert _close(c1, _ref(a, b), 320) and _close(c2, _ref(a, b), 320)
    verdicts = list((tmp_path / "cache" / "dispatch").rglob("*.json"))
    assert len(verdicts) == 1
    v = json.loads(verdicts[0].read_text())
    assert v["key"]["shape"] == [192, 136, 320] and "torch" in v["time_us"]
    resolve.reset()                                            # a new process: verdict from disk
    c3 = cudal2.matmul(a, b)
    assert calls == [1] and _close(c3, _ref(a, b), 320)


@pytest.mark.gpu
def test_gpu_fallbacks_are_torch_exactly(gpu_store):
    a = torch.randn(256, 256, device="cuda", dtype=F16)
    b = torch.randn(256, 256, device="cuda", dtype=F16)
    for x, y in [(a.float(), b.float()), (a[:, 1:], b[1:]), (a.t(), b), (a[None], b[None])]:
        assert torch.equal(cudal2.matmul(x, y), torch.matmul(x, y))


@pytest.mark.gpu
def test_gpu_autograd_through_kernel_path(gpu_store):
    a = torch.randn(256, 256, device="cuda", dtype=F16, requires_grad=True)
    b = torch.randn(256, 256, device="cuda", dtype=F16, requires_grad=True)
    g = torch.randn(256, 256, device="cuda", dtype=F16)
    cudal2.matmul(a, b).backward(g)
    af, bf = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    torch.matmul(af, bf).backward(g.float())
    assert _close(a.grad, af.grad, 256) and _close(b.grad, bf.grad, 256)


@pytest.mark.gpu
def test_gpu_compile_and_patch(gpu_store):
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 256)).cuda().half()
    x = torch.randn(4, 64, 256, device="cuda", dtype=F16)
    want = m.float()(x.float())
    m.half()
    with cudal2.patched(m):
        got = m(x)
        assert resolve.serving.get((0, 256, 256, 256, "RC")) not in (None, resolve.TORCH)
        assert _close(got, want, 256)
        cm = torch.compile(m, fullgraph=True)
        assert _close(cm(x), want, 256)


@pytest.mark.gpu
def test_gpu_disable_knob_is_torch(gpu_store, monkeypatch):
    monkeypatch.setenv("CUDAL2_DISABLE", "1")
    a = torch.randn(256, 256, device="cuda", dtype=F16)
    b = torch.randn(256, 256, device="cuda", dtype=F16)
    assert torch.equal(cudal2.matmul(a, b), torch.matmul(a, b))
    assert (0, 256, 256, 256, "RR") not in resolve.serving


@pytest.mark.gpu
def test_gpu_overhead_benchmark_kernel_path(gpu_store):
    from cudal2.runs import overhead
    res = overhead.measure("cuda", (256, 256, 256), calls=20, repeats=3)
    assert res["served_by"] == "kernel"
