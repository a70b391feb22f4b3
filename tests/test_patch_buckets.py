"""cudal2.patch(model) serving a model's shapes by token bucket: which kernel serves each layer at
each token count (eager), and what dispatch does while a CUDA graph is being captured.

Without a GPU: CPU fp16 tensors stand in for CUDA ones (is_cuda reads True, device -1, stream 0)
and the table's kernels are fakes that compute C = A @ B^T from the raw pointers they get, as a
kernel would, and record each launch; the nearest-shape race needs a GPU, so here its verdict is
torch (the race has its own tests in test_dispatch.py)."""
import ctypes

import numpy as np
import pytest
import torch

import cudal2
from cudal2.core.store import KernelIndex
from cudal2.runtime import hot as hotpath
from cudal2.runtime import resolve
from cudal2.runtime.loader import KernelLoader
from cudal2.core.vocab import AUDIT_VERSION

F16 = torch.float16
HIDDEN, INTER, VOCAB = 64, 128, 128


class TinyDecoder(torch.nn.Module):
    """One block's linear layers, fused as a serving engine runs them (kv heads = q heads / 2)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)     # 64 -> 128
        self.o = torch.nn.Linear(HIDDEN, HIDDEN)
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * INTER, bias=False)  # 64 -> 256
        self.down = torch.nn.Linear(INTER, HIDDEN, bias=False)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)      # 64 -> 128, as qkv

    def forward(self, x):
        h = x + self.o(self.qkv(x)[..., :HIDDEN])
        g, u = self.gate_up(h).chunk(2, dim=-1)
        h = h + self.down(torch.nn.functional.silu(g) * u)
        return self.lm_head(h)


def _halves(ptr, count):
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint16)), (count,)).view(np.float16)


class FakeKernel:
    """A table kernel for RC: computes C = A @ B^T (fp32 accumulate) from raw pointers."""

    def __init__(self, name, launches):
        self.name = name
        self.meta = {"arch": "sm_90a", "acc": "f32", "layout": "RC", "any_shape": True,
                     "tile": [64, 64, 32], "workspace_bytes": 0}
        self.launches = launches

    def raw_launch(self, pa, pb, pc, M, N, K, lda, ldb, ldc, ws, ws_bytes, stream, *opts):
        a = _halves(pa.value, (M - 1) * lda + K).astype(np.float32)
        b = _halves(pb.value, (N - 1) * ldb + K).astype(np.float32)
        c = _halves(pc.value, (M - 1) * ldc + N)
        for i in range(M):
            row = a[i * lda:i * lda + K]
            c[i * ldc:i * ldc + N] = np.array([row @ b[j * ldb:j * ldb + K] for j in range(N)],
                                              dtype=np.float32).astype(np.float16)
        self.launches.append((self.name, M, N, K))
        return 0

    launch = raw_launch

    def options(self, chosen=None):
        return None

    def workspace_bytes(self, M, N, K, options=None):
        return 0


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A table tuned for TinyDecoder's layers at M=4 (bucket 3-4) and for its 128x64 layers
    (qkv, lm_head) at M=16 (bucket 9-16); CPU tensors routed as CUDA ones to fake kernels."""
    root = tmp_path / "kernels"
    monkeypatch.setenv("CUDAL2_KERNELS", str(root))
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUDAL2_DISABLE", raising=False)
    idx = KernelIndex(root)
    kw = dict(arch="sm_90a", acc="f32", layout="RC", family="mma", tuned=True, mode="offline",
              report="synthetic", speedups={"torch": 1.2}, audit=AUDIT_VERSION,
              verified=("tile",))   # the audit confirmed their tiles: they may serve a bucket
    for n, k in ((128, 64), (64, 64), (256, 64), (64, 128)):
        idx.add("// k4\n", M=4, N=n, K=k, m_bucket="3-4", **kw)
    idx.add("// k16\n", M=16, N=128, K=64, m_bucket="9-16", **kw)
    idx.write()
    launches, loads, raced = [], [], []

    def fake_build_and_load(source, arch, name):
        loads.append(name)
        return FakeKernel(source.split()[1], launches)

    def nearest(dev, M, N, K, layout, a, b, d):
        raced.append((M, N, K))
        return resolve.TORCH

    capturing = [False]
    resolve.reset(KernelLoader(fake_build_and_load))
    resolve.state.arch[-1] = "sm_90a"
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(hotpath, "_cur_device", lambda: -1)
    monkeypatch.setattr(hotpath, "_raw_stream", lambda dev: 0)
    monkeypatch.setattr(resolve, "_race", nearest)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    yield launches, loads, raced, capturing
    resolve.reset()


def _run(model, ref, tokens):
    torch.manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN, dtype=F16)
    with torch.no_grad():
        got, want = model(x), ref(x.float())
    assert torch.allclose(got.float(), want, atol=2e-2, rtol=2e-2), tokens


def test_patched_model_serves_each_buckets_kernel_and_torch_elsewhere(served):
    launches, loads, raced, _ = served
    torch.manual_seed(0)
    ref = TinyDecoder().float()
    model = cudal2.patch(TinyDecoder().half())
    model.load_state_dict({k: v.half() for k, v in ref.state_dict().items()})
    _run(model, ref, 3)        # bucket 3-4: every layer by the M=4 kernel, no race
    assert launches == [("k4", 3, 128, 64), ("k4", 3, 64, 64), ("k4", 3, 256, 64),
                        ("k4", 3, 64, 128), ("k4", 3, 128, 64)]
    assert raced == []
    launches.clear()
    _run(model, ref, 4)        # the tuned M itself
    assert [l[0] for l in launches] == ["k4"] * 5
    launches.clear()
    _run(model, ref, 12)       # bucket 9-16: the 128x64 layers by the M=16 kernel, the rest race
    assert launches == [("k16", 12, 128, 64), ("k16", 12, 128, 64)]
    assert sorted(raced) == [(12, 64, 64), (12, 64, 128), (12, 256, 64)]
    launches.clear()
    _run(model, ref, 40)       # no bucket holds 40: the race decides (here: torch) for every layer
    assert launches == [] and len(raced) == 3 + 4
    assert len(loads) == 2     # each kernel built and loaded once
    _run(model, ref, 3)
    assert [l[:2] for l in launches] == [("k4", 3)] * 5    # decided shapes: one dict lookup
    cudal2.unpatch(model)


def test_no_decision_inside_a_graph_capture(served, monkeypatch):
    """Capture-safe: inside a capture a shape already decided launches its kernel on the current
    stream; an undecided one runs torch and stays undecided (no build, load, race or host sync:
    those cannot be captured), and is decided by the first call after the capture."""
    launches, loads, raced, capturing = served
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("host sync in capture"))
    torch.manual_seed(0)
    ref = TinyDecoder().float()
    model = cudal2.patch(TinyDecoder().half())
    model.load_state_dict({k: v.half() for k, v in ref.state_dict().items()})
    _run(model, ref, 3)                          # warm-up outside the capture decides M=3
    launches.clear()
    capturing[0] = True
    _run(model, ref, 3)
    assert [l[:2] for l in launches] == [("k4", 3)] * 5
    launches.clear()
    _run(model, ref, 12)                         # undecided: torch, nothing learned
    assert launches == [] and raced == [] and loads == ["sm_90a/f32_RC/4_128_64.cu"]
    assert not any(k[1] == 12 for k in resolve.serving)
    capturing[0] = False
    _run(model, ref, 12)
    assert launches == [("k16", 12, 128, 64), ("k16", 12, 128, 64)] and len(raced) == 3


@pytest.mark.gpu
def test_gpu_patched_model_in_a_cuda_graph_serves_its_bucket(tmp_path, monkeypatch):
    """A kernel tuned at M=256 (bucket 129-256) serves M=200 of a patched layer eagerly and in a
    captured CUDA graph's replays."""
    from cudal2.core import vocab
    from cudal2.templates import FAMILIES, instantiate
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    arch = vocab.ARCH_BY_CAPABILITY.get(torch.cuda.get_device_capability())
    if arch not in ("sm_80", "sm_90a"):
        pytest.skip(f"no kernel family targets this GPU ({arch})")
    root = tmp_path / "kernels"
    monkeypatch.setenv("CUDAL2_KERNELS", str(root))
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    idx = KernelIndex(root)
    cfg = FAMILIES["mma"].default().with_(LAYOUT="RC")
    idx.add(instantiate(cfg), arch=arch, acc="f32", layout="RC", M=256, N=256, K=256,
            family="mma", tuned=True, mode="offline", report="test fixture",
            speedups={"torch": 1.01}, m_bucket="129-256", audit=AUDIT_VERSION,
            config=cfg.name(),        # our own instantiation: its meta is trusted for the bucket
            gpu=torch.cuda.get_device_name())   # measured here: serves its bucket without a race
    idx.write()
    resolve.reset()
    try:
        lin = torch.nn.Linear(256, 256).cuda().half()
        x = torch.randn(200, 256, device="cuda", dtype=F16)
        with torch.no_grad():
            want0 = lin(x).float()
            cudal2.patch(lin)
            eager = lin(x)                       # decides outside the capture
            key = (torch.cuda.current_device(), 200, 256, 256, "RC")
            assert resolve.serving.get(key) not in (None, resolve.TORCH)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = lin(x)
            x.copy_(torch.randn_like(x))
            want = torch.nn.functional.linear(x, lin.weight, lin.bias).float()
            g.replay()
            torch.cuda.synchronize()
        assert (eager.float() - want0).abs().max().item() <= 1e-2 * max(1.0, want0.abs().max().item())
        assert (out.float() - want).abs().max().item() <= 1e-2 * max(1.0, want.abs().max().item())
    finally:
        resolve.reset()
