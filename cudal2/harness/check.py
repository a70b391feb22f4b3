"""Correctness of one candidate on one shape: the checks a model-written kernel must pass.

    ones_exact      0/1 inputs, compared exactly with an fp32 reference (CUDA-L2's check, made
                    exact under fp16 accumulation too: see `ones_inputs`)
    random_tol      N(0,1) inputs within `tolerance(K, acc)`: an fp16 accumulator declared as
                    f32 fails for K >= 256 (docs/measurement.md derives the bound)
    guards          guard bands (random sentinel bits) before and after A, B, C and the
                    workspace, and the padding columns of a padded leading dimension, unchanged
    inputs          A and B bit-identical to copies taken before the call
    reuse           same pointers, new values: a kernel that memoises by pointer returns stale C
    fresh_buffers   new allocations for every seed
    determinism     the same inputs at least twice, after calls on other operands and after
                    other work (`other_work`), give bit-identical C; the first differing
                    element is named
    padded_ld       lda/ldb/ldc larger than the row length (the ABI passes them; kernels honour them)
    edge_shapes     for `any_shape` kernels, odd shapes near the target (M-1, N+1, K-3; M+1, N-1, K+5)

Before every call C is filled with fresh garbage (NaN or large random values, alternating), so
an element the kernel skips, or an answer kept from an earlier call, fails the comparison.
The main shape's inputs and fp32 references (`ShapeInputs`) are drawn and computed once per
finals group and shared by its candidates; the guard bands, garbage and edge shapes stay per
kernel.
Everything takes a `launch(ops: Operands) -> int` callable and works on any torch device, so the
logic is unit-tested on CPU with Python "kernels"; `so_launcher` wraps a built .so for the GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

# fp16 unit roundoff, and the effective unit roundoff we allow an fp32 accumulator (2^-24 in
# IEEE; 16x slack for tensor-core adders that truncate when aligning addends).
U_F16 = 2.0 ** -11
U_F32_EFF = 2.0 ** -20
# Final rounding of C to fp16 costs at most 2^-11 relative; 2^-10 allows one more rounding.
OUT_RTOL = 2.0 ** -10
LAMBDA = 6.0                 # standard deviations of the accumulation-error model
ABS_FLOOR = 2.0 ** -24       # fp16's smallest subnormal
ONES_MAX_DOT = 2048          # integers up to 2048 are exact in fp16
SENTINEL_BAND_MIN = 4096     # elements in each guard band at least
# `other_work`'s GEMM: on a GPU enough tiles to occupy every SM (cuBLAS overwrites each one's
# shared memory) and 32 MiB of C through L2; 512^3 would touch only a few dozen SMs.
OTHER_WORK_GPU = (4096, 4096, 512)
OTHER_WORK_CPU = (512, 512, 512)     # no leftover state to clobber on CPU: just cheap


def tolerance(K: int, acc: str, rms_a: float = 1.0, rms_b: float = 1.0) -> tuple[float, float]:
    """(rtol, atol) for |C - ref| <= rtol*|ref| + atol with random inputs.

    Model: the running sum after k products has rms sqrt(k)*rms_a*rms_b; each accumulator
    update rounds it with an error of rms u*|partial|/sqrt(3) (uniform rounding). Summed over K
    updates: rms ~ u*rms_a*rms_b*K/sqrt(6). atol = LAMBDA * u * rms_a*rms_b * K/sqrt(3) (a 6-sigma
    bound with sqrt(2) slack), u = U_F16 for a declared f16 accumulator, U_F32_EFF for f32. With
    f32 declared, an fp16 accumulator errs by ~2^-10*K*0.05 even when it rounds only every 16
    products (an MMA's k), which exceeds rtol*|ref| + atol on the elements where |ref| is small,
    for K >= 256."""
    if acc not in ("f32", "f16"):
        raise ValueError(f"accumulator must be 'f32' or 'f16', got {acc!r}")
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    u = U_F16 if acc == "f16" else U_F32_EFF
    return OUT_RTOL, LAMBDA * u * rms_a * rms_b * K / math.sqrt(3.0) + ABS_FLOOR


def ones_density(K: int) -> float:
    """Probability of a 1 in A: K/2 ones per row while K <= 2048, then 1024 per row on average,
    so sums stay varied (a skipped k-tile changes them) and far below the cap."""
    return min(0.5, 1024.0 / K)


def cap_row_ones(a, cap: int = ONES_MAX_DOT):
    """Zero every 1 past the cap-th in its row: each row of A then has at most `cap` ones."""
    import torch

    count = torch.cumsum(a.float(), dim=1)
    return a * (count <= cap).to(a.dtype)


def ones_inputs(M: int, N: int, K: int, gen, device="cpu"):
    """0/1 fp16 inputs whose products sum exactly in any order and any precision >= fp16.

    Each row of A has at most 2048 ones (capped), so every dot product, and every partial sum
    of it in any order, is a non-negative integer <= 2048; fp16 represents all such integers
    exactly, so fp16 or fp32 accumulation, split-K and the final fp16 store are all exact."""
    import torch

    a = (torch.rand(M, K, generator=gen, device=device) < ones_density(K)).to(torch.float16)
    a = cap_row_ones(a)
    b = (torch.rand(K, N, generator=gen, device=device) < 0.5).to(torch.float16)
    return a, b


def random_inputs(M: int, N: int, K: int, gen, device="cpu"):
    import torch

    a = torch.randn(M, K, generator=gen, device=device).to(torch.float16)
    b = torch.randn(K, N, generator=gen, device=device).to(torch.float16)
    return a, b


def reference(a, b):
    """fp32 reference of fp16 inputs: products of fp16 values are exact in fp32; TF32 off."""
    import torch

    if a.is_cuda:
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return a.float() @ b.float()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
    return a.float() @ b.float()


@dataclass
class Compare:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    detail: str = ""


def compare(c, ref, *, exact: bool = False, K: int = 1, acc: str = "f32",
            rms_a: float = 1.0, rms_b: float = 1.0) -> Compare:
    """C (fp16) against the fp32 reference: bit-exact, or within tolerance(K, acc)."""
    import torch

    out = c.float()
    finite = torch.isfinite(out)
    n_bad_finite = int((~finite).sum())
    err = (out - ref).abs()
    err = torch.where(finite, err, torch.full_like(err, math.inf))
    max_abs = float(err.max()) if err.numel() else 0.0
    rel = err / ref.abs().clamp_min(1.0)
    max_rel = float(rel.max()) if rel.numel() else 0.0
    if n_bad_finite:
        return Compare(False, max_abs, max_rel, f"{n_bad_finite} non-finite outputs "
                       f"(first at {_first(~finite)})")
    if exact:
        bad = out != ref
        n = int(bad.sum())
        if n:
            i = _first(bad)
            return Compare(False, max_abs, max_rel, f"{n} outputs differ from the exact 0/1 "
                           f"result; at {i}: got {out[i].item()}, want {ref[i].item()}")
        return Compare(True, max_abs, max_rel)
    rtol, atol = tolerance(K, acc, rms_a, rms_b)
    bound = rtol * ref.abs() + atol
    bad = err > bound
    n = int(bad.sum())
    if n:
        i = _first(bad)
        return Compare(False, max_abs, max_rel,
                       f"{n} outputs outside the {acc}-accumulate bound (rtol {rtol:.2e}, atol "
                       f"{atol:.2e}, K={K}); at {i}: got {out[i].item():.6g}, want "
                       f"{ref[i].item():.6g}")
    return Compare(True, max_abs, max_rel)


def _first(mask) -> tuple[int, ...]:
    idx = mask.nonzero()[0]
    return tuple(int(v) for v in idx)


def bits_differ(first, again) -> str:
    """'' when `again` is bit-identical to `first` (fp16), else the first differing element
    in row-major order with both values and bit patterns, and how many elements differ."""
    import torch

    x, y = first.view(torch.int16), again.view(torch.int16)
    diff = x != y
    n = int(diff.sum())
    if not n:
        return ""
    i = _first(diff)
    return (f"bits differ from the first call at {i}: {_f16(x[i], first[i])} then "
            f"{_f16(y[i], again[i])}; {n} of {diff.numel()} elements differ")


def _f16(bits, value) -> str:
    return f"0x{int(bits) & 0xFFFF:04x} ({value.item():.6g})"


def other_work(device, gen, shape: tuple[int, int, int] | None = None) -> None:
    """Unrelated work between two calls on the same inputs: a torch fp16 GEMM on fresh random
    data, its result discarded. A kernel that reads shared memory it never wrote, or whose
    reduction order follows timing (atomics), then gives other bits than before."""
    import torch

    dev = torch.device(device)
    m, n, k = shape or (OTHER_WORK_GPU if dev.type == "cuda" else OTHER_WORK_CPU)
    a = torch.randn(m, k, generator=gen, device=dev).to(torch.float16)
    b = torch.randn(k, n, generator=gen, device=dev).to(torch.float16)
    torch.matmul(a, b)


# ---- guarded operands -------------------------------------------------------------------------

@dataclass
class Operands:
    """One call's buffers. *_buf are the flat allocations including guard bands; a, b_store, c
    are views into them; b is the logical K x N operand (b_store transposed for layout RC)."""
    M: int
    N: int
    K: int
    lda: int
    ldb: int
    ldc: int
    layout: str
    a_buf: object
    b_buf: object
    c_buf: object
    ws_buf: object
    a: object
    b_store: object
    c: object
    ws: object
    ws_bytes: int
    band: int
    ws_band: int

    @property
    def b(self):
        return self.b_store if self.layout == "RR" else self.b_store.t()


def _band(ld: int) -> int:
    # Two full rows past either end: a tile written one row too far lands in the band.
    return max(SENTINEL_BAND_MIN, 2 * ld)


def _sentinel_fill(buf, gen):
    import torch

    bits = torch.randint(-32768, 32768, buf.shape, dtype=torch.int16, generator=gen,
                         device=buf.device)
    buf.view(torch.int16).copy_(bits)


def _guarded_matrix(rows: int, cols: int, ld: int, gen, device):
    import torch

    band = _band(ld)
    buf = torch.empty(2 * band + rows * ld, dtype=torch.float16, device=device)
    _sentinel_fill(buf, gen)
    view = buf[band:band + rows * ld].view(rows, ld)[:, :cols]
    return buf, view, band


def make_operands(M: int, N: int, K: int, layout: str, ws_bytes: int, gen, device="cpu", *,
                  pad: int = 0, ws_zero: bool = False) -> Operands:
    """Fresh guarded buffers (contents: sentinel bits everywhere; fill a, b, c afterwards; the
    workspace's interior zero when `ws_zero`: a kernel declaring workspace_zero_init)."""
    import torch

    if layout not in ("RR", "RC"):
        raise ValueError(f"layout must be 'RR' or 'RC', got {layout!r}")
    lda, ldc = K + pad, N + pad
    a_buf, a, band = _guarded_matrix(M, K, lda, gen, device)
    if layout == "RR":
        ldb = N + pad
        b_buf, b_store, _ = _guarded_matrix(K, N, ldb, gen, device)
    else:
        ldb = K + pad
        b_buf, b_store, _ = _guarded_matrix(N, K, ldb, gen, device)
    c_buf, c, _ = _guarded_matrix(M, N, ldc, gen, device)
    ws_band = SENTINEL_BAND_MIN
    ws_buf = torch.randint(0, 256, (2 * ws_band + ws_bytes,), dtype=torch.uint8, generator=gen,
                           device=device)
    ws = ws_buf[ws_band:ws_band + ws_bytes]
    if ws_zero:
        ws.zero_()
    band = max(band, _band(ldb), _band(ldc))
    return Operands(M, N, K, lda, ldb, ldc, layout, a_buf, b_buf, c_buf, ws_buf, a, b_store, c,
                    ws, ws_bytes, band, ws_band)


def set_inputs(ops: Operands, a, b) -> None:
    """Copy logical A (M x K) and B (K x N) into the operand views (in place: same pointers)."""
    ops.a.copy_(a)
    ops.b.copy_(b)


def fill_garbage(c, gen, kind: str) -> None:
    """Fresh garbage in C before a call: 'nan' (quiet NaN bits) or 'random' (large normals)."""
    import torch

    if kind == "nan":
        c.view(torch.int16).fill_(0x7E00)
    else:
        c.copy_((torch.randn(c.shape, generator=gen, device=c.device) * 1e3).to(c.dtype))


def outside_c_changed(c_buf_before, ops: Operands) -> int:
    """Number of fp16 elements of C's allocation outside the M x N interior that changed:
    guard bands and, with a padded ldc, the padding columns."""
    import torch

    diff = ops.c_buf.view(torch.int16) != c_buf_before.view(torch.int16)
    band = (ops.c_buf.numel() - ops.M * ops.ldc) // 2
    inner = diff[band:band + ops.M * ops.ldc].view(ops.M, ops.ldc)
    inner[:, :ops.N] = False
    return int(diff.sum())


def bands_changed(buf, before, lo: int, hi_start: int) -> int:
    """Changed elements in buf[:lo] and buf[hi_start:] (workspace bands)."""
    import torch

    a = buf.view(torch.uint8) if buf.dtype == torch.uint8 else buf.view(torch.int16)
    b = before.view(torch.uint8) if before.dtype == torch.uint8 else before.view(torch.int16)
    return int((a[:lo] != b[:lo]).sum()) + int((a[hi_start:] != b[hi_start:]).sum())


# ---- the main shape's inputs and references, shared by a finals group -------------------------

SHARED_INPUT_BYTES = 4 << 30   # keep at most this much of inputs + references per group


class ShapeInputs:
    """The inputs of the main shape's checks (0/1 and random per seed, then "reuse" and
    "padded") with their fp32 references and rms, each drawn from its own generator seeded by
    (seed, name): the same values for every candidate of a finals group, whatever its workspace
    or layout (which draw the guard bands and garbage, from the suite's own generator). Each
    reference is computed once and kept, with its inputs, while the kept bytes stay within
    `budget_bytes`; past it (huge shapes) an entry is drawn and computed again on each use.
    The kernel never sees these tensors: the suite copies them into fresh guarded buffers."""

    def __init__(self, M: int, N: int, K: int, *, device="cpu", seed: int = 0,
                 budget_bytes: int = SHARED_INPUT_BYTES):
        self.M, self.N, self.K, self.device, self.seed = M, N, K, device, seed
        self.budget_bytes = budget_bytes
        self.kept_bytes = 0
        self.references_computed = 0
        self._kept: dict[str, tuple] = {}

    @staticmethod
    def names(seeds: int) -> list[str]:
        """The entries one suite run uses: ones<s>, random<s> per seed, reuse, padded."""
        return [f"{kind}{s}" for s in range(seeds) for kind in ("ones", "random")] + ["reuse", "padded"]

    def _draw(self, name: str):
        import hashlib

        import torch

        h = int.from_bytes(hashlib.sha256(f"{self.seed}|{name}".encode()).digest()[:6], "little")
        gen = torch.Generator(device=self.device)
        gen.manual_seed(h)
        make = ones_inputs if name.startswith("ones") else random_inputs
        return make(self.M, self.N, self.K, gen, self.device)

    def get(self, name: str) -> tuple:
        """(a, b, ref, rms_a, rms_b) of one entry (rms 1.0 for 0/1 inputs: compared exactly)."""
        hit = self._kept.get(name)
        if hit is not None:
            return hit
        a, b = self._draw(name)
        ref = reference(a, b)
        self.references_computed += 1
        ones = name.startswith("ones")
        entry = (a, b, ref, 1.0 if ones else rms(a), 1.0 if ones else rms(b))
        size = (a.numel() + b.numel()) * a.element_size() + ref.numel() * ref.element_size()
        if self.kept_bytes + size <= self.budget_bytes:
            self._kept[name] = entry
            self.kept_bytes += size
        return entry

    def prepare(self, seeds: int) -> "ShapeInputs":
        """Compute (and keep, within the budget) every entry a suite of `seeds` seeds uses."""
        for name in self.names(seeds):
            self.get(name)
        return self

    def to_dict(self) -> dict:
        return {"shared": True, "kept": sorted(self._kept), "kept_bytes": self.kept_bytes,
                "references_computed": self.references_computed}


# ---- the suite --------------------------------------------------------------------------------

class LaunchError(RuntimeError):
    def __init__(self, code: int, where: str):
        super().__init__(f"kernel returned error {code} ({where})")
        self.code = code


@dataclass
class CheckReport:
    ok: bool = True
    checks: dict[str, dict] = field(default_factory=dict)   # name -> {"ok", "detail", "n"}
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    launch_error: int | None = None
    first_failure: str = ""

    def record(self, name: str, ok: bool, detail: str = "") -> None:
        entry = self.checks.setdefault(name, {"ok": True, "detail": "", "n": 0})
        entry["n"] += 1
        if not ok and entry["ok"]:
            entry["ok"], entry["detail"] = False, detail
        if not ok and self.ok:
            self.ok, self.first_failure = False, f"{name}: {detail}"

    def to_dict(self) -> dict:
        return {"ok": self.ok, "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "checks": self.checks, "launch_error": self.launch_error,
                "first_failure": self.first_failure}


Launch = Callable[[Operands], int]


class Suite:
    """Runs calls with all the per-call guards; checks record into one CheckReport."""

    def __init__(self, launch: Launch, *, acc: str, layout: str, ws_bytes: int = 0,
                 device="cpu", seed: int = 0, workspace: Callable[[int, int, int], int] | None = None,
                 ws_zero_init: bool = False, inputs: "ShapeInputs | None" = None,
                 between: Callable[[], None] | None = None):
        import torch

        self.launch_fn, self.acc, self.layout, self.ws_bytes = launch, acc, layout, ws_bytes
        # the workspace a shape other than the target needs (edge shapes; stream-K grows with tiles)
        self.workspace = workspace
        # the kernel finds its workspace zero and must leave it zero (docs/abi.md)
        self.ws_zero_init = ws_zero_init
        self.device, self.seed = device, seed
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.report = CheckReport()
        self._garbage_kinds = ("nan", "random")
        self._calls = 0
        # the main shape's inputs and references (shared by a finals group; else this suite's)
        self.inputs = inputs
        # work between two determinism repeats (default: a torch GEMM, `other_work`)
        self.between = between or (lambda: other_work(self.device, self.gen))

    # one guarded call: garbage in C, copies of everything, launch, then the guard checks
    def call(self, ops: Operands, where: str):
        kind = self._garbage_kinds[self._calls % 2]
        self._calls += 1
        fill_garbage(ops.c, self.gen, kind)
        a_before, b_before = ops.a_buf.clone(), ops.b_buf.clone()
        c_before, ws_before = ops.c_buf.clone(), ops.ws_buf.clone()
        code = int(self.launch_fn(ops))
        if code != 0:
            self.report.launch_error = code
            self.report.record("launch", False, f"returned {code} ({where})")
            raise LaunchError(code, where)
        import torch

        same_a = torch.equal(ops.a_buf.view(torch.int16), a_before.view(torch.int16))
        same_b = torch.equal(ops.b_buf.view(torch.int16), b_before.view(torch.int16))
        self.report.record("inputs", same_a and same_b,
                           f"{'A' if not same_a else 'B'} (or its guard band) modified ({where})")
        n_c = outside_c_changed(c_before, ops)
        n_ws = bands_changed(ops.ws_buf, ws_before, ops.ws_band, ops.ws_band + ops.ws_bytes)
        self.report.record("guards", n_c == 0 and n_ws == 0,
                           f"{n_c} elements written outside C's M x N interior, {n_ws} bytes "
                           f"outside the workspace ({where})")
        if self.ws_zero_init and ops.ws_bytes:
            left = int((ops.ws != 0).sum())
            self.report.record("workspace_zero", left == 0, f"{left} workspace bytes left nonzero "
                               f"by a kernel declaring workspace_zero_init ({where})")
        return ops.c.clone()

    def _score(self, name: str, c, a, b, exact: bool, where: str, K: int,
               shared: tuple | None = None) -> bool:
        """shared: (ref, rms_a, rms_b) of a's and b's ShapeInputs entry (else computed here)."""
        ref, rms_a, rms_b = shared if shared is not None else (reference(a, b), None, None)
        if exact:
            cmp = compare(c, ref, exact=True)
        else:
            cmp = compare(c, ref, K=K, acc=self.acc, rms_a=rms(a) if rms_a is None else rms_a,
                          rms_b=rms(b) if rms_b is None else rms_b)
            self.report.max_abs_err = max(self.report.max_abs_err, cmp.max_abs_err)
            self.report.max_rel_err = max(self.report.max_rel_err, cmp.max_rel_err)
        self.report.record(name, cmp.ok, f"{cmp.detail} ({where})")
        return cmp.ok

    def fresh(self, M, N, K, kind: str, pad: int = 0):
        ws_bytes = self.ws_bytes if self.workspace is None else int(self.workspace(M, N, K))
        ops = make_operands(M, N, K, self.layout, ws_bytes, self.gen, self.device, pad=pad,
                            ws_zero=self.ws_zero_init)
        a, b = (ones_inputs if kind == "ones" else random_inputs)(M, N, K, self.gen, self.device)
        set_inputs(ops, a, b)
        return ops, a, b

    def fresh_main(self, name: str, pad: int = 0):
        """Fresh guarded buffers of the main shape holding the ShapeInputs entry `name`:
        (ops, a, b, (ref, rms_a, rms_b))."""
        inp = self.inputs
        a, b, ref, ra, rb = inp.get(name)
        ws_bytes = self.ws_bytes if self.workspace is None else int(self.workspace(inp.M, inp.N, inp.K))
        ops = make_operands(inp.M, inp.N, inp.K, self.layout, ws_bytes, self.gen, self.device,
                            pad=pad, ws_zero=self.ws_zero_init)
        set_inputs(ops, a, b)
        return ops, a, b, (ref, ra, rb)

    def _repeats(self, ops: Operands, c_first, target: str) -> None:
        """determinism: seed 0's random inputs again on the same pointers (fresh garbage in C),
        after calls on other operands, then after `between`; each bit-identical to the first."""
        for when in ("after calls on other operands", "after other work"):
            if when == "after other work":
                self.between()
            c = self.call(ops, f"{target} repeat {when}")
            diff = bits_differ(c_first, c)
            self.report.record("determinism", not diff, f"{diff} (repeat {when}, {target})")

    def run(self, M: int, N: int, K: int, *, seeds: int = 3, any_shape: bool = False,
            tile: tuple[int, int, int] | None = None,
            divisible: tuple[int, int, int] = (1, 1, 1), max_m: int | None = None,
            max_n: int | None = None) -> CheckReport:
        try:
            self._run(M, N, K, seeds=seeds, any_shape=any_shape, tile=tile, divisible=divisible,
                      max_m=max_m, max_n=max_n)
        except LaunchError:
            pass
        return self.report

    def _run(self, M, N, K, *, seeds, any_shape, tile, divisible=(1, 1, 1), max_m=None,
             max_n=None):
        if not any_shape and tile:
            bm, bn, bk = tile
            if M % bm or N % bn or K % bk:
                self.report.record("shape", False, f"{M}x{N}x{K} is not a multiple of the "
                                   f"kernel's tile {bm}x{bn}x{bk} and it does not claim any_shape")
                return
        target = f"{M}x{N}x{K}"
        if self.inputs is None or (self.inputs.M, self.inputs.N, self.inputs.K) != (M, N, K):
            self.inputs = ShapeInputs(M, N, K, device=self.device, seed=self.seed)
        kept = None
        for s in range(seeds):
            # fresh buffers for every seed; 0/1 exact, then random within tolerance
            ops, a, b, ref = self.fresh_main(f"ones{s}")
            c = self.call(ops, f"{target} 0/1 seed {s}")
            self._score("ones_exact", c, a, b, True, f"{target} seed {s}", K, ref)
            ops, a, b, ref = self.fresh_main(f"random{s}")
            c = self.call(ops, f"{target} random seed {s}")
            self._score("random_tol", c, a, b, False, f"{target} seed {s}", K, ref)
            self.report.record("fresh_buffers", True)
            if s == 0:
                kept = (ops, c)
        ops, c_first = kept
        # padded leading dimensions (16 bytes, so TMA alignment still holds); before the
        # repeats, so even with one seed a call on other operands precedes them
        pops, a, b, ref = self.fresh_main("padded", pad=8)
        c = self.call(pops, f"{target} padded ld")
        self._score("padded_ld", c, a, b, False, f"{target}, ld + 8", K, ref)
        self._repeats(ops, c_first, target)
        # same pointers, new values: memoisation keyed on pointers returns the old answer
        a, b, *ref = self.inputs.get("reuse")
        set_inputs(ops, a, b)
        c = self.call(ops, f"{target} reused buffers")
        self._score("reuse", c, a, b, False, f"{target}, same pointers, new values", K, tuple(ref))
        if any_shape:
            for (m, n, k) in edge_shapes(M, N, K, divisible, max_m, max_n):
                where = f"{m}x{n}x{k}"
                ops, a, b = self.fresh(m, n, k, "ones")
                self._score("edge_shapes", self.call(ops, where), a, b, True, where, k)
                ops, a, b = self.fresh(m, n, k, "random")
                self._score("edge_shapes", self.call(ops, where), a, b, False, where, k)


def edge_shapes(M: int, N: int, K: int, divisible: tuple[int, int, int] = (1, 1, 1),
                max_m: int | None = None, max_n: int | None = None) -> list[tuple[int, int, int]]:
    """Odd shapes near the target, clipped at 1, without the target itself or repeats. A
    dimension the kernel declares `divisible` by d moves in steps of d (TMA needs N and K
    multiples of 8: N+1 would be a shape the kernel rightly refuses, not an edge it mishandles);
    M and N stay at or below the meta's max_m and max_n (skinny kernels and their mirror)."""
    out = []
    for steps in ((-1, 1, -3), (1, -1, 5)):
        s = tuple(max(d, v + step * d) for v, step, d in zip((M, N, K), steps, divisible))
        if max_m is not None and s[0] > max_m:
            s = (max_m,) + s[1:]
        if max_n is not None and s[1] > max_n:
            s = (s[0], max_n, s[2])
        if s != (M, N, K) and s not in out:
            out.append(s)
    return out


def rms(x) -> float:
    v = float(x.float().pow(2).mean().sqrt())
    return v if v > 0 else 1.0


def check_kernel(launch: Launch, M: int, N: int, K: int, *, acc: str, layout: str,
                 ws_bytes: int = 0, any_shape: bool = False,
                 tile: tuple[int, int, int] | None = None, seeds: int = 3, device="cpu",
                 seed: int = 0, divisible: tuple[int, int, int] = (1, 1, 1),
                 workspace: Callable[[int, int, int], int] | None = None,
                 ws_zero_init: bool = False, max_m: int | None = None,
                 max_n: int | None = None, inputs: ShapeInputs | None = None,
                 between: Callable[[], None] | None = None) -> CheckReport:
    """The whole correctness suite for one kernel and shape. divisible: the meta's (M, N, K)
    divisors, which the edge shapes keep; workspace(M, N, K): bytes for shapes other than the
    target (default: ws_bytes for every shape). inputs: the main shape's ShapeInputs, shared by
    every candidate of a finals group (default: the suite's own); the edge shapes, which
    depend on the kernel's meta, stay per kernel. between(): work run before the last
    determinism repeat (default: `other_work` on the suite's device)."""
    suite = Suite(launch, acc=acc, layout=layout, ws_bytes=ws_bytes, device=device, seed=seed,
                  workspace=workspace, ws_zero_init=ws_zero_init, inputs=inputs,
                  between=between)
    return suite.run(M, N, K, seeds=seeds, any_shape=any_shape, tile=tile, divisible=divisible,
                     max_m=max_m, max_n=max_n)


def so_launcher(lib) -> Launch:
    """Launch a loaded KernelLibrary (cudal2.core.abi) on torch's current stream."""
    import torch

    def launch(ops: Operands) -> int:
        stream = torch.cuda.current_stream().cuda_stream
        return lib.launch(ops.a.data_ptr(), ops.b_store.data_ptr(), ops.c.data_ptr(),
                          ops.M, ops.N, ops.K, ops.lda, ops.ldb, ops.ldc,
                          ops.ws.data_ptr() if ops.ws_bytes else 0, ops.ws_bytes, stream)
    return launch
