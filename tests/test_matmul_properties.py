"""Property tests: cudal2.matmul is torch.matmul. Hypothesis draws a case (shapes with 0, 1, odd
and larger sizes, batching and broadcasting, 1-D operands, strides, transposes, offsets and
expanded batch dims, dtypes including mixed ones, out= fresh / wrongly shaped / strided /
aliasing an input / of another dtype, requires_grad, no_grad, inference mode, autocast) and both
functions must give the same outcome: the same result (dtype, shape, device, requires_grad,
values, gradients; `out` returned and filled) or the same exception type and message.

One generator (`cases`) serves both tiers: the CPU run here, and the GPU run on CUDA tensors with
a tuned kernel table (sizes include the table's shape), where fp16 2-D results come from cudal2's
kernels and are compared with a tolerance instead of bit for bit."""
import warnings
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import cudal2

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64)
# 0, 1, odd, powers of two and their neighbours; 256 is the GPU fixture's tuned shape
SIZES = (0, 1, 2, 3, 5, 7, 8, 16, 17, 31, 64, 65, 128, 256)
LAYOUTS = ("contiguous", "transposed", "strided", "offset", "padded", "expanded")
OUTS = (None, "fresh", "wrong_shape", "transposed", "alias_a", "alias_b", "other_dtype", "grad")
MODES = ("plain", "no_grad", "inference_mode", "autocast")


@dataclass(frozen=True)
class Case:
    a_shape: tuple
    b_shape: tuple
    a_dtype: torch.dtype
    b_dtype: torch.dtype
    a_layout: str
    b_layout: str
    out: str | None
    grad: tuple            # (a requires grad, b requires grad)
    mode: str
    seed: int


@st.composite
def cases(draw) -> Case:
    """One matmul call: mostly well-formed (so results are compared), sometimes not (so errors are)."""
    m, n, k = (draw(st.sampled_from(SIZES)) for _ in range(3))
    if draw(st.integers(0, 9)) == 0:                  # contraction mismatch: an error
        k_b = draw(st.sampled_from(SIZES).filter(lambda x: x != k))
    else:
        k_b = k
    batch = tuple(draw(st.lists(st.sampled_from((1, 2, 3)), max_size=2)))
    # each side: 1-D, 2-D, or batched with the batch dims (or a suffix of them, or 1s: broadcast)
    a_kind, b_kind = draw(st.sampled_from(("1d", "2d", "nd"))), draw(st.sampled_from(("1d", "2d", "nd")))

    def side_batch():
        bt = batch[draw(st.integers(0, len(batch))):] if batch else ()
        return tuple(1 if draw(st.booleans()) and draw(st.booleans()) else d for d in bt)

    a_shape = {"1d": (k,), "2d": (m, k), "nd": side_batch() + (m, k)}[a_kind]
    b_shape = {"1d": (k_b,), "2d": (k_b, n), "nd": side_batch() + (k_b, n)}[b_kind]
    if draw(st.integers(0, 29)) == 0:                 # a 0-d operand: torch's error
        a_shape = ()
    floats = DTYPES[:4]
    a_dtype = draw(st.sampled_from(DTYPES))
    b_dtype = a_dtype if draw(st.integers(0, 7)) else draw(st.sampled_from(DTYPES))
    grad = (draw(st.booleans()) and a_dtype in floats and draw(st.booleans()),
            draw(st.booleans()) and b_dtype in floats and draw(st.booleans()))
    return Case(a_shape, b_shape, a_dtype, b_dtype, draw(st.sampled_from(LAYOUTS)),
                draw(st.sampled_from(LAYOUTS)), draw(st.sampled_from(OUTS)), grad,
                draw(st.sampled_from(MODES)), draw(st.integers(0, 2**16)))


def _values(shape, dtype, gen, device):
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=gen)
    else:
        x = torch.randint(-4, 5, shape, generator=gen)
    return x.to(device=device, dtype=dtype)


def _laid_out(x, layout):
    """The same values as `x` in another memory layout (a view of a bigger or reordered buffer)."""
    if x.dim() < 2 or x.numel() == 0:
        if layout == "offset" and x.dim() >= 1:
            return torch.cat([x.new_zeros((1,) + x.shape[1:]), x])[1:]
        return x
    if layout == "transposed":                         # column-major last two dims
        return x.mT.contiguous().mT
    if layout == "strided":                            # every other column of a wider buffer
        wide = x.new_zeros(x.shape[:-1] + (2 * x.shape[-1],))
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "offset":                             # storage offset of one element
        flat = torch.cat([x.new_zeros(1), x.reshape(-1)])
        return flat[1:].view(x.shape)
    if layout == "padded":                             # leading dimension wider than the row
        wide = x.new_zeros(x.shape[:-1] + (x.shape[-1] + 3,))
        wide[..., : x.shape[-1]] = x
        return wide[..., : x.shape[-1]]
    if layout == "expanded" and x.dim() >= 3 and x.shape[0] > 1:   # stride-0 batch dim
        return x[:1].expand(x.shape)
    return x


def make_inputs(case: Case, device: str):
    """Fresh tensors for one call (each call gets its own copies: out= and autograd mutate)."""
    gen = torch.Generator().manual_seed(case.seed)
    a = _laid_out(_values(case.a_shape, case.a_dtype, gen, device), case.a_layout)
    b = _laid_out(_values(case.b_shape, case.b_dtype, gen, device), case.b_layout)
    if case.grad[0]:
        a = a.detach().requires_grad_()
    if case.grad[1]:
        b = b.detach().requires_grad_()
    kw = {}
    if case.out is not None:
        with torch.no_grad():
            try:
                shape = torch.matmul(torch.empty(case.a_shape, dtype=torch.float32),
                                     torch.empty(case.b_shape, dtype=torch.float32)).shape
            except RuntimeError:
                shape = (3,)
            dt = torch.promote_types(case.a_dtype, case.b_dtype)
        out = {
            "fresh": lambda: torch.full(shape, 7, dtype=dt, device=device),
            "wrong_shape": lambda: torch.full((5,), 7, dtype=dt, device=device),
            "transposed": lambda: (torch.full(shape, 7, dtype=dt, device=device).mT.contiguous().mT
                                   if len(shape) >= 2 else torch.full(shape, 7, dtype=dt, device=device)),
            "alias_a": lambda: a,
            "alias_b": lambda: b,
            "other_dtype": lambda: torch.full(shape, 7, dtype=torch.float64 if dt != torch.float64
                                              else torch.float32, device=device),
            "grad": lambda: torch.full(shape, 7, dtype=dt, device=device,
                                       requires_grad=dt.is_floating_point),
        }[case.out]()
        kw["out"] = out
    return a, b, kw


def _context(mode: str, device: str):
    import contextlib
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    if mode == "autocast":
        return torch.autocast(device, dtype=torch.bfloat16 if device == "cpu" else torch.float16)
    return contextlib.nullcontext()


def outcome(fn, case: Case, device: str):
    """What one call does: ("raised", type, message) or ("ok", result, out, a, b, grads)."""
    a, b, kw = make_inputs(case, device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # torch warns when it resizes out=
            with _context(case.mode, device):
                r = fn(a, b, **kw)
            grads = None
            if r.requires_grad and r.numel():
                g = torch.Generator().manual_seed(case.seed + 1)
                r.backward(_values(r.shape, r.dtype, g, device))
                grads = tuple(x.grad for x in (a, b) if isinstance(x, torch.Tensor) and x.requires_grad)
    except Exception as exc:  # noqa: BLE001 - comparing exactly what torch raises
        return ("raised", type(exc), str(exc))
    return ("ok", r, kw.get("out"), a, b, grads)


def _same_values(x, y, *, tolerance: bool):
    assert x.dtype == y.dtype and x.shape == y.shape and x.device == y.device, (x, y)
    if tolerance and x.dtype == torch.float16 and x.dim() == 2:      # a kernel vs cuBLAS
        k_scale = max(1, x.shape[-1]) ** 0.5
        torch.testing.assert_close(x.float(), y.float(), rtol=2e-3 * k_scale, atol=2e-3 * k_scale)
    else:
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


def _resizes_an_input(case: Case, result_shape) -> bool:
    aliased = {"alias_a": case.a_shape, "alias_b": case.b_shape}.get(case.out)
    return aliased is not None and tuple(aliased) != tuple(result_shape)


def check_same_as_torch(case: Case, device: str, *, tolerance: bool = False):
    want = outcome(torch.matmul, case, device)
    got = outcome(cudal2.matmul, case, device)
    if want[0] == "raised":
        assert got == want, f"{case}: torch raised {want[1].__name__}: {want[2]}; cudal2 gave {got[:3]}"
        return
    assert got[0] == "ok", f"{case}: torch returned, cudal2 raised {got[1].__name__}: {got[2]}"
    _, r, out, a, b, grads = want
    _, r2, out2, a2, b2, grads2 = got
    if _resizes_an_input(case, r.shape):
        # out= aliasing an input that torch must resize: torch reads the storage it just
        # reallocated, so its own values differ from call to call; only the form is compared
        assert (r.dtype, r.shape, r.device) == (r2.dtype, r2.shape, r2.device), case
        return
    _same_values(r.detach(), r2.detach(), tolerance=tolerance)
    assert r.requires_grad == r2.requires_grad and r.is_inference() == r2.is_inference(), case
    assert (out is None) == (out2 is None) and (out is None or (r is out) == (r2 is out2)), case
    assert r.stride() == r2.stride() or tolerance, (case, r.stride(), r2.stride())
    for x, y in ((a, a2), (b, b2)):                 # inputs unchanged (or changed alike: out=a)
        _same_values(x.detach(), y.detach(), tolerance=tolerance)
    assert (grads is None) == (grads2 is None), case
    for g, g2 in zip(grads or (), grads2 or ()):
        _same_values(g, g2, tolerance=tolerance)


# derandomized and without a database: the same cases on every run and machine, nothing written
_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                 derandomize=True, database=None)


@settings(max_examples=120, **_SETTINGS)
@given(case=cases())
def test_matmul_is_torch_matmul_on_cpu(case):
    check_same_as_torch(case, "cpu")


# the GPU tier: the same cases on CUDA tensors, with a tuned kernel table so that 2-D fp16
# operands reach cudal2's kernels (tests/test_matmul.py's fixture)
from tests.test_matmul import gpu_store  # noqa: E402,F401


@pytest.mark.gpu
@settings(max_examples=200, **{**_SETTINGS, "suppress_health_check": [
    *_SETTINGS["suppress_health_check"], HealthCheck.function_scoped_fixture]})
@given(case=cases())
def test_matmul_is_torch_matmul_on_cuda(gpu_store, case):  # noqa: F811
    check_same_as_torch(case, "cuda", tolerance=True)
