"""The correctness suite on CPU: tolerance formula, exact 0/1 inputs, guard bands, and planted
bugs as Python "kernels" that write through the same Operands a .so launch gets."""
import re

import pytest
import torch

from cudal2.harness import check
from cudal2.harness.check import check_kernel, compare, reference, tolerance


def fp32_acc(a, b):
    return (a.float() @ b.float()).half()


def fp16_acc(a, b, chunk=16):
    """An fp16 accumulator updated every `chunk` products (an MMA's k)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
    for k0 in range(0, a.shape[1], chunk):
        acc = (acc.float() + a[:, k0:k0 + chunk].float() @ b[k0:k0 + chunk].float()).half()
    return acc


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---- tolerance -------------------------------------------------------------------------------

@pytest.mark.parametrize("K", [256, 1024, 4096])
def test_fp32_accumulate_passes_and_fp16_accumulate_declared_f32_fails(K):
    a, b = check.random_inputs(64, 64, K, gen(K))
    ref = reference(a, b)
    assert compare(fp32_acc(a, b), ref, K=K, acc="f32").ok
    bad = compare(fp16_acc(a, b), ref, K=K, acc="f32")
    assert not bad.ok and "f32-accumulate bound" in bad.detail
    # declared honestly as f16, the same result passes
    assert compare(fp16_acc(a, b), ref, K=K, acc="f16").ok


def test_sequential_fp16_accumulation_is_within_the_f16_bound():
    a, b = check.random_inputs(32, 32, 1024, gen(1))
    assert compare(fp16_acc(a, b, chunk=1), reference(a, b), K=1024, acc="f16").ok


def test_tolerance_formula_and_errors():
    rtol, atol = tolerance(1024, "f32")
    assert rtol == 2.0 ** -10
    assert atol == pytest.approx(6 * 2.0 ** -20 * 1024 / 3 ** 0.5 + 2.0 ** -24)
    assert tolerance(1024, "f16")[1] > 400 * atol
    assert tolerance(1024, "f32", 2.0, 3.0)[1] == pytest.approx(6 * (atol - 2.0 ** -24) + 2.0 ** -24)
    with pytest.raises(ValueError, match="accumulator"):
        tolerance(64, "f64")
    with pytest.raises(ValueError, match="K"):
        tolerance(0, "f32")


def test_compare_flags_nonfinite_and_wrong_values():
    ref = torch.ones(4, 4)
    c = torch.ones(4, 4, dtype=torch.float16)
    assert compare(c, ref, exact=True).ok
    c[1, 2] = float("nan")
    r = compare(c, ref, exact=True)
    assert not r.ok and "non-finite" in r.detail and "(1, 2)" in r.detail
    c = torch.ones(4, 4, dtype=torch.float16)
    c[3, 0] = 2
    r = compare(c, ref, exact=True)
    assert not r.ok and "(3, 0)" in r.detail and r.max_abs_err == 1.0


# ---- exact 0/1 inputs --------------------------------------------------------------------------

@pytest.mark.parametrize("K", [1, 40, 2048, 8192])
def test_ones_inputs_are_exact_under_fp16_accumulation(K):
    a, b = check.ones_inputs(48, 40, K, gen(K))
    assert set(a.unique().tolist()) <= {0.0, 1.0} and set(b.unique().tolist()) <= {0.0, 1.0}
    assert a.float().sum(dim=1).max() <= check.ONES_MAX_DOT
    ref = reference(a, b)
    assert ref.max() <= check.ONES_MAX_DOT
    assert torch.equal(fp16_acc(a, b).float(), ref)
    assert torch.equal(fp16_acc(a, b, chunk=1).float(), ref)
    if K >= 40:
        assert ref.std() > 0          # informative: sums vary


def test_row_cap_bounds_every_dot_product():
    a = torch.ones(3, 5000, dtype=torch.float16)
    capped = check.cap_row_ones(a)
    assert capped.sum(dim=1).tolist() == [2048.0] * 3
    b = torch.ones(5000, 2, dtype=torch.float16)
    assert torch.equal(fp16_acc(capped, b, chunk=1).float(), reference(capped, b))
    assert check.ones_density(64) == 0.5 and check.ones_density(16384) == 1024 / 16384


# ---- guard bands on CPU tensors ------------------------------------------------------------------

def test_guard_band_checker_sees_writes_outside_c_only():
    ops = check.make_operands(8, 8, 8, "RR", 0, gen(), pad=8)
    before = ops.c_buf.clone()
    ops.c.fill_(1.0)                                  # the interior is the kernel's to write
    assert check.outside_c_changed(before, ops) == 0
    ops.c_buf[-1] = 7.0                               # last element of the back band
    assert check.outside_c_changed(before, ops) == 1
    ops.c_buf.copy_(before)
    row0 = ops.c_buf[(ops.c_buf.numel() - 8 * ops.ldc) // 2:].view(-1)
    row0[8] = 3.0                                     # the padding column of row 0 (ld = N + 8)
    assert check.outside_c_changed(before, ops) == 1


def test_operand_views_and_layouts():
    for layout in ("RR", "RC"):
        ops = check.make_operands(5, 7, 3, layout, 64, gen())
        assert tuple(ops.a.shape) == (5, 3) and tuple(ops.b.shape) == (3, 7)
        assert tuple(ops.c.shape) == (5, 7) and ops.ws.numel() == 64
        assert ops.ldb == (7 if layout == "RR" else 3)
        a, b = check.random_inputs(5, 7, 3, gen(1))
        check.set_inputs(ops, a, b)
        assert torch.equal(ops.a, a) and torch.equal(ops.b, b)
    with pytest.raises(ValueError, match="layout"):
        check.make_operands(1, 1, 1, "CC", 0, gen())


# ---- planted bugs as Python kernels ---------------------------------------------------------------

def good(ops):
    ops.c.copy_(fp32_acc(ops.a, ops.b))
    return 0


def run_suite(kernel, M=64, N=48, K=256, acc="f32", layout="RR", **kw):
    return check_kernel(kernel, M, N, K, acc=acc, layout=layout, seeds=2, **kw)


def test_correct_kernel_passes_every_check():
    for layout in ("RR", "RC"):
        rep = run_suite(good, layout=layout, ws_bytes=128, any_shape=True)
        assert rep.ok, rep.first_failure
        for name in ("ones_exact", "random_tol", "guards", "inputs", "determinism", "reuse",
                     "padded_ld", "edge_shapes", "fresh_buffers"):
            assert rep.checks[name]["ok"] and rep.checks[name]["n"] >= 1, name
        assert rep.checks["determinism"]["n"] >= 2
        assert 0 < rep.max_abs_err < 0.1


def test_fp16_accumulator_declared_f32_is_wrong():
    def f16(ops):
        ops.c.copy_(fp16_acc(ops.a, ops.b))
        return 0
    rep = run_suite(f16, K=512)
    assert not rep.ok
    assert rep.checks["ones_exact"]["ok"]                 # CUDA-L2's check alone passes it
    assert not rep.checks["random_tol"]["ok"]


def test_out_of_bounds_writer_is_caught():
    def oob(ops):
        good(ops)
        band = (ops.c_buf.numel() - ops.M * ops.ldc) // 2
        ops.c_buf[band + ops.M * ops.ldc] = 0.0          # row M, column 0: one row too far
        return 0
    rep = run_suite(oob)
    assert not rep.checks["guards"]["ok"] and "outside C" in rep.checks["guards"]["detail"]


def test_full_tile_writer_caught_by_padded_ld():
    def tile_writer(ops):                     # writes 8 columns past N in each row
        good(ops)
        band = (ops.c_buf.numel() - ops.M * ops.ldc) // 2
        rows = ops.c_buf[band:band + ops.M * ops.ldc].view(ops.M, ops.ldc)
        rows[:, ops.N:min(ops.ldc, ops.N + 8)] = 0.0
        return 0
    rep = run_suite(tile_writer)
    assert rep.checks["ones_exact"]["ok"] and not rep.checks["guards"]["ok"]


def test_workspace_overrun_is_caught():
    def ws_over(ops):
        good(ops)
        ops.ws_buf[ops.ws_band + ops.ws_bytes] += 1
        return 0
    rep = run_suite(ws_over, ws_bytes=256)
    assert not rep.checks["guards"]["ok"] and "workspace" in rep.checks["guards"]["detail"]


def test_input_writer_is_caught():
    def scribble(ops):
        good(ops)
        ops.b[0, 0] = 5.0
        return 0
    rep = run_suite(scribble)
    assert not rep.checks["inputs"]["ok"]


def _pointer_memoiser():
    """A planted bug: answers from a cache keyed by the operands' pointers."""
    cache = {}

    def memo(ops):
        key = (ops.a.data_ptr(), ops.b_store.data_ptr(), ops.c.data_ptr())
        if key not in cache:
            cache[key] = fp32_acc(ops.a, ops.b)
        ops.c.copy_(cache[key])
        return 0
    return memo


def test_pointer_memoiser_is_caught():
    memo = _pointer_memoiser()
    rep = run_suite(memo)
    assert not rep.checks["reuse"]["ok"]


def test_write_c_only_on_first_call_is_caught():
    calls = []

    def once(ops):
        if not calls:
            good(ops)
        calls.append(1)
        return 0
    rep = run_suite(once)
    assert not rep.ok and not rep.checks["random_tol"]["ok"]


def test_reading_c_old_contents_is_caught():
    def accumulate(ops):                      # C += A @ B (beta = 1)
        ops.c.copy_((ops.c.float() + ops.a.float() @ ops.b.float()).half())
        return 0
    rep = run_suite(accumulate)
    assert not rep.checks["ones_exact"]["ok"]


def test_nondeterminism_is_caught():
    calls = [0]

    def jitter(ops):
        good(ops)
        calls[0] += 1
        if calls[0] % 2 == 0:                 # within tolerance, but not bit-identical
            flat = ops.c.view(torch.int16)
            flat[0, 0] += 1
        return 0
    rep = run_suite(jitter)
    assert not rep.checks["determinism"]["ok"]


def _scaled(ops, scale):
    """C = fp16(scale * fp32(A @ B)): 2^-14 relative moves some elements by one fp16 ulp but
    keeps integers <= 2048 exact (half an ulp is >= 2^-12 relative), so within every tolerance."""
    ops.c.copy_((ops.a.float() @ ops.b.float() * scale).half())
    return 0


EPS = 2.0 ** -14


def test_counter_dependent_rounding_fails_only_determinism_and_names_the_element():
    calls = [0]

    def drift(ops):                           # models a reduction order that varies per call
        calls[0] += 1
        return _scaled(ops, 1 + EPS * (calls[0] % 2))
    rep = run_suite(drift)
    assert rep.checks["ones_exact"]["ok"] and rep.checks["random_tol"]["ok"]
    det = rep.checks["determinism"]
    assert not det["ok"] and rep.first_failure.startswith("determinism")
    m = re.match(r"bits differ from the first call at \((\d+), (\d+)\): 0x([0-9a-f]{4}) \(\S+\) "
                 r"then 0x([0-9a-f]{4}) \(\S+\); (\d+) of 3072 elements differ \(repeat after",
                 det["detail"])
    assert m, det["detail"]
    # the same element, patterns and count as the two roundings of seed 0's random product
    a, b, ref, *_ = check.ShapeInputs(64, 48, 256).get("random0")
    plain, bumped = ref.half().view(torch.int16), (ref * (1 + EPS)).half().view(torch.int16)
    diff = plain != bumped
    i, j = check._first(diff)
    assert (int(m[1]), int(m[2])) == (i, j) and int(m[5]) == int(diff.sum())
    assert {int(m[3], 16), int(m[4], 16)} == {int(plain[i, j]) & 0xFFFF, int(bumped[i, j]) & 0xFFFF}


LEFTOVER = {"smem": "own"}


def _leftover_reader(ops):
    """Reads 'shared memory' it never wrote: its own leftovers give the right bits, anyone
    else's a slightly different rounding. It leaves its own values behind."""
    _scaled(ops, 1.0 if LEFTOVER["smem"] == "own" else 1 + EPS)
    LEFTOVER["smem"] = "own"
    return 0


def test_leftover_state_is_caught_only_by_the_repeat_after_other_work():
    def other_kernel():
        LEFTOVER["smem"] = "cublas"
    LEFTOVER["smem"] = "own"
    rep = run_suite(_leftover_reader, between=other_kernel)
    det = rep.checks["determinism"]
    assert not det["ok"] and "(repeat after other work" in det["detail"], det
    assert rep.checks["random_tol"]["ok"] and rep.checks["ones_exact"]["ok"]
    # with nothing in between, every repeat sees its own leftovers: that repeat is the catch
    rep = run_suite(_leftover_reader, between=lambda: None)
    assert rep.ok and rep.checks["determinism"]["n"] == 2, rep.first_failure


def test_honest_kernel_passes_after_the_default_other_work(monkeypatch):
    ran = []
    real = check.other_work
    monkeypatch.setattr(check, "other_work", lambda *a, **kw: (ran.append(a), real(*a, **kw)))
    rep = run_suite(good)
    assert rep.ok, rep.first_failure
    assert rep.checks["determinism"]["n"] >= 2 and len(ran) == 1


def test_split_k_with_a_fixed_reduction_order_is_deterministic():
    def split_k(ops, splits=4):               # fp32 partials of K chunks, summed in split order
        step = -(-ops.K // splits)
        parts = [ops.a[:, k:k + step].float() @ ops.b[k:k + step].float()
                 for k in range(0, ops.K, step)]
        acc = torch.zeros_like(parts[0])
        for p in parts:
            acc += p
        ops.c.copy_(acc.half())
        return 0
    rep = run_suite(split_k, any_shape=True)
    assert rep.ok, rep.first_failure
    assert rep.checks["determinism"]["n"] == 2


def test_bits_differ_names_the_first_element_row_major():
    x = torch.ones(4, 5, dtype=torch.float16)
    assert check.bits_differ(x, x.clone()) == ""
    y = x.clone()
    y[2, 1], y[3, 0] = 1.0009765625, 2.0
    assert check.bits_differ(x, y) == ("bits differ from the first call at (2, 1): 0x3c00 (1) "
                                       "then 0x3c01 (1.00098); 2 of 20 elements differ")


def test_tile_aligned_only_fails_edge_shapes():
    def aligned_only(ops):                    # computes only the 16-aligned part of C
        m, n = ops.M // 16 * 16, ops.N // 16 * 16
        ops.c[:m, :n].copy_(fp32_acc(ops.a[:m], ops.b[:, :n]))
        return 0
    rep = run_suite(aligned_only, any_shape=True)
    assert rep.checks["ones_exact"]["ok"] and not rep.checks["edge_shapes"]["ok"]


def test_launch_error_stops_the_suite():
    rep = run_suite(lambda ops: 700)
    assert not rep.ok and rep.launch_error == 700 and "launch" in rep.first_failure


def test_shape_not_accepted_without_any_shape():
    rep = run_suite(good, M=100, tile=(64, 64, 32))
    assert not rep.ok and "not a multiple" in rep.checks["shape"]["detail"]


def test_edge_shapes_clip_at_one():
    assert check.edge_shapes(1, 1, 1) == [(1, 2, 1), (2, 1, 6)]
    assert check.edge_shapes(64, 64, 64) == [(63, 65, 61), (65, 63, 69)]


def test_edge_shapes_keep_the_declared_divisors():
    # TMA kernels (cutlass_sm90 on ABI 2, wgmma) serve any M but N, K multiples of 8
    assert check.edge_shapes(64, 64, 64, (1, 8, 8)) == [(63, 72, 40), (65, 56, 104)]
    assert check.edge_shapes(1, 8, 8, (1, 8, 8)) == [(1, 16, 8), (2, 8, 48)]


def test_edge_shapes_of_a_divisible_kernel_with_a_shape_dependent_workspace():
    """The first H100 campaign of ABI 2 CUTLASS kernels: every final 'crashed' because the suite
    asked a kernel declaring N, K % 8 == 0 for 63x65x61 (it rightly refused), and a stream-K
    kernel needs more workspace for an edge shape with more tiles than the target."""
    def need(M, N, K):
        return 16 * ((M + 63) // 64) * ((N + 63) // 64)

    def tma_like(ops):
        if ops.N % 8 or ops.K % 8 or ops.ws_bytes < need(ops.M, ops.N, ops.K):
            return 1                          # cudaErrorInvalidValue, as the real launchers do
        return good(ops)
    rep = run_suite(tma_like, M=64, N=64, K=64, any_shape=True, ws_bytes=need(64, 64, 64),
                    divisible=(1, 8, 8), workspace=need)
    assert rep.ok, rep.first_failure
    assert rep.checks["edge_shapes"]["n"] == 4
    # without the divisors the suite would call it with N = 65: the refusal is a launch error
    rep = run_suite(tma_like, M=64, N=64, K=64, any_shape=True, ws_bytes=need(64, 64, 64), workspace=need)
    assert rep.launch_error == 1


def test_zero_init_workspace_contract():
    """A kernel declaring workspace_zero_init (in-kernel split-K fixup, docs/abi.md) is handed a
    zeroed workspace and must leave it zero; a fixup-like fake that counts arrivals in the
    workspace is right only when it starts from zero."""
    def fixup_like(clean):
        def launch(ops):
            if int(ops.ws[0]) != 0:          # a stale semaphore: the tile would finish early
                ops.c.zero_()
                return 0
            ops.ws[0] = 1                     # arrivals counted in the workspace
            good(ops)
            if clean:
                ops.ws[0] = 0                 # the last arrival resets it
            return 0
        return launch
    rep = run_suite(fixup_like(True), ws_bytes=64, any_shape=True, ws_zero_init=True)
    assert rep.ok, rep.first_failure
    assert rep.checks["workspace_zero"]["ok"] and rep.checks["workspace_zero"]["n"] >= 1
    rep = run_suite(fixup_like(False), ws_bytes=64, any_shape=True, ws_zero_init=True)
    assert not rep.ok and not rep.checks["workspace_zero"]["ok"], rep.checks
    # without the declaration the suite hands it random bytes, as it does every other kernel
    rep = run_suite(fixup_like(True), ws_bytes=64, any_shape=True)
    assert not rep.ok


# ---- the planted-bug kernels as CUDA (tests/data/cheats) --------------------------------------------

from pathlib import Path  # noqa: E402

CHEATS = Path(__file__).parent / "data" / "cheats"
# file -> the check that must fail (None: every check passes)
CHEAT_VERDICTS = {
    "good_naive": None,
    "fp16_acc_declared_f32": "random_tol",
    "oob_writer": "guards",
    "pointer_cache": "reuse",
    "first_call_only": "ones_exact",
    "reads_old_c": "ones_exact",
    "tile_aligned_only": "edge_shapes",
}


def _build(name, arch):
    from cudal2.core.build import BuildSpec, build

    res = build(BuildSpec((CHEATS / f"{name}.cu").read_text(), arch, name=name))
    assert res.ok, res.log[-2000:]
    return res.so_path


@pytest.mark.compile
def test_cheat_kernels_build():
    from cudal2.core.toolchain import ToolchainError, find_toolchain

    try:
        find_toolchain()
    except ToolchainError as exc:
        pytest.skip(f"no CUDA toolchain: {exc}")
    assert sorted(p.stem for p in CHEATS.glob("*.cu")) == sorted(CHEAT_VERDICTS)
    for name in CHEAT_VERDICTS:
        _build(name, "sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CHEAT_VERDICTS))
def test_correctness_suite_catches_planted_bugs_on_gpu(name):
    from cudal2.core.abi import KernelLibrary
    from cudal2.core.toolchain import detect_arch

    lib = KernelLibrary(_build(name, detect_arch()))     # not the per-path cache: static state
    meta = lib.meta
    rep = check_kernel(check.so_launcher(lib), 256, 256, 512, acc=meta["acc"],
                       layout=meta["layout"], any_shape=meta["any_shape"], seeds=2,
                       device="cuda")
    must_fail = CHEAT_VERDICTS[name]
    if must_fail is None:
        assert rep.ok, rep.first_failure
    else:
        assert not rep.ok
        assert not rep.checks[must_fail]["ok"], rep.to_dict()


@pytest.mark.gpu
def test_measure_times_a_correct_kernel_against_every_baseline_on_gpu():
    from cudal2.harness.measure import measure, mode_keys
    from cudal2.harness.types import BASELINES, EvalRequest, Shape
    from cudal2.core.toolchain import detect_arch

    arch = detect_arch()
    src = (CHEATS / "good_naive.cu").read_text()
    req = EvalRequest(src, Shape(256, 256, 512), arch=arch,
                      modes=("offline", "server", "e2e", "wall"), server_gaps_ms=(1.0,))
    out = measure(str(_build("good_naive", arch)), req)
    assert out["status"] == "ok", out["detail"]
    for key in mode_keys(req):
        if key.startswith("e2e_graph"):
            continue                  # capture may be refused; the session says why
        assert out["timings"][key]["candidate"]["n"] > 0, key
        if key.startswith("e2e_"):
            assert out["speedups"][key]["torch"] > 0
            continue
        for b in BASELINES:
            assert b in out["timings"][key], (key, b, out["baseline_notes"])
            assert out["speedups"][key][b] > 0
    iv = out["stats"]["offline"]["speedup"]["torch"]
    assert iv["lo"] <= iv["median"] <= iv["hi"] and iv["n"] >= 6
    sess = out["stats"]["offline"]["session"]
    assert sess["calls_per_sample"] >= 1 and sess["operand_sets"] >= 2
    assert out["correctness"]["ok"]
    assert out["env"]["gpu"]
    # where the group's time went: the phases and 'other' sum to measure_group's wall time
    ph, env = out["env"]["phases_s"], out["env"]
    assert {"load", "init", "reference", "correctness", "operands", "baselines", "autotune",
            "calibrate", "offline", "server", "e2e", "wall", "other"} <= set(ph)
    assert sum(ph.values()) == pytest.approx(env["measure_s"], abs=5e-3)
    assert ph["other"] < 0.1 * env["measure_s"], ph
    assert env["shared_inputs"]["references_computed"] == 3 * 2 + 2
    assert env["cold_operands"]["method"] == "rotate" and env["lt_autotune_choice"]["key"]


@pytest.mark.gpu
def test_measure_says_wrong_for_a_cheat_on_gpu():
    from cudal2.harness.measure import measure
    from cudal2.harness.types import EvalRequest, Shape
    from cudal2.core.toolchain import detect_arch

    arch = detect_arch()
    src = (CHEATS / "fp16_acc_declared_f32.cu").read_text()
    out = measure(str(_build("fp16_acc_declared_f32", arch)),
                  EvalRequest(src, Shape(128, 128, 1024), arch=arch))
    assert out["status"] == "wrong" and "random_tol" in out["detail"]
    assert out["timings"] == {}


# ---- one set of main-shape references per finals group (check.ShapeInputs) ----------------------

def _recording(name, seen, M=64, N=48, K=256):
    def launch(ops):
        if (ops.M, ops.N, ops.K) == (M, N, K):
            seen.setdefault(name, []).append((ops.a.clone(), ops.b.clone()))
        return good(ops)
    return launch


def test_a_group_computes_the_main_references_once_and_every_kernel_sees_the_same_inputs():
    shared = check.ShapeInputs(64, 48, 256)
    seen = {}
    # different workspaces and layouts draw different guard bands and garbage: inputs stay put
    for name, ws, layout in (("k0", 0, "RR"), ("k1", 4096, "RC")):
        rep = run_suite(_recording(name, seen), layout=layout, ws_bytes=ws, inputs=shared)
        assert rep.ok, rep.first_failure
    assert shared.references_computed == len(check.ShapeInputs.names(2)) == 6
    assert shared.to_dict()["kept"] == sorted(check.ShapeInputs.names(2))
    assert len(seen["k0"]) == len(seen["k1"]) == 8      # 2 seeds x 2 kinds, padded, 2 repeats, reuse
    for (a0, b0), (a1, b1) in zip(seen["k0"], seen["k1"]):
        assert torch.equal(a0, a1) and torch.equal(b0, b1)
    # a suite of its own draws the same entries (same seed): the same inputs as the group's
    own = {}
    run_suite(_recording("k2", own))
    assert all(torch.equal(x[0], y[0]) for x, y in zip(own["k2"], seen["k0"]))


def test_references_past_the_budget_are_computed_on_each_use():
    shared = check.ShapeInputs(64, 48, 256, budget_bytes=0)
    for _ in range(2):
        assert run_suite(good, inputs=shared).ok
    assert shared.references_computed == 12 and shared.kept_bytes == 0
    a1 = shared.get("random0")[0]
    assert torch.equal(a1, shared.get("random0")[0])       # drawn again: the same values


def test_planted_bugs_are_still_caught_on_shared_references():
    shared = check.ShapeInputs(64, 48, 256).prepare(2)
    memo = _pointer_memoiser()
    assert not run_suite(memo, inputs=shared).checks["reuse"]["ok"]
    assert not run_suite(lambda ops: (ops.c.copy_(fp16_acc(ops.a, ops.b)), 0)[1],
                         inputs=shared).checks["random_tol"]["ok"]
    assert run_suite(good, inputs=shared).ok
    assert shared.references_computed == 6
