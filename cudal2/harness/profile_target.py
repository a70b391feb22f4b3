"""The process ncu wraps in the profile stage: one call of one GEMM at one shape, bracketed by
cudaProfilerStart / Stop so `ncu --profile-from-start off` profiles exactly that call (one
kernel launch, or more: split-K's fixup, cuBLAS's own reduction).

    python -m cudal2.harness.profile_target --shape MxNxK --layout RR --acc f32 \
        (--kernel PACK/builds/<sha>/kernel.so [--options '{"splits": 2}']
         | --baseline NAME --cublas SO --cublaslt SO [--lt-choices FILE.json])

OUR kernel is called through the ABI as the finals call it (measure._candidate_launch: the
meta's B layout, its workspace zeroed once); a BASELINE through baselines.BaselineRunners with
the pack's libraries, cuBLASLt autotuned at the algorithm the results DB recorded (the same
keys and lookup as the finals: baselines.autotune_key, then the legacy key). Warm-up calls first
(first-call costs out of the profile) on one operand set; the profiled call on another, never
touched, and ncu flushes the caches before each replay pass (its default --cache-control all):
operands are cold.

Generated kernels are hostile: this runs as ncu's child under the stage's timeout. A failure is
one line on stderr, "profile_target: ...", and exit status 1.

On the fake device (CUDAL2_FAKE_DEVICE) nothing touches a GPU: the library is loaded (ABI,
meta, options checked), faults are injected as fakedevice does, and what the call would launch
is written to $CUDAL2_FAKE_NCU_LAUNCHES (JSON) for tools/gpu_session/fake_ncu.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from cudal2.core.abi import AbiError, load_library
from cudal2.harness import fakedevice
from cudal2.harness.baselines import (BaselineError, BaselineRunners, CublasLib, CublasLtLib,
                                      autotune_key, legacy_autotune_key)
from cudal2.harness.types import BASELINES, Shape

WARMUP_CALLS = 3
FAKE_LAUNCHES_ENV = "CUDAL2_FAKE_NCU_LAUNCHES"


class TargetError(RuntimeError):
    """Why the call could not be made; one line."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m cudal2.harness.profile_target")
    p.add_argument("--shape", required=True, type=Shape.parse)
    p.add_argument("--layout", default="RR", choices=("RR", "RC"))
    p.add_argument("--acc", default="f32", choices=("f16", "f32"))
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--kernel", help="our kernel's .so")
    who.add_argument("--baseline", choices=BASELINES)
    p.add_argument("--options", default="{}", help="our kernel's runtime options, JSON")
    p.add_argument("--cublas", help="the pack's cublas baseline .so")
    p.add_argument("--cublaslt", help="the pack's cublaslt baseline .so")
    p.add_argument("--lt-choices", help="JSON {autotune key: entry}: the recorded cuBLASLt choices")
    p.add_argument("--lt-key", help="the autotune key the finals timed (their env lt_autotune_choice)")
    p.add_argument("--warmup", type=int, default=WARMUP_CALLS)
    return p.parse_args(argv)


def _options(a) -> dict:
    try:
        opts = json.loads(a.options)
    except ValueError as exc:
        raise TargetError(f"--options is not JSON: {exc}") from None
    if not isinstance(opts, dict):
        raise TargetError(f"--options must be a JSON object, got {a.options!r}")
    return opts


def _lt_index(runners: BaselineRunners, a, gpus: list[str]) -> int:
    """The autotuned algorithm the finals used: the choice recorded under the key they timed
    (--lt-key, when it names this cuBLASLt version), else under the key for this GPU, cuBLASLt
    version, shape, accumulator and layout, as the finals look it up. None recorded: no profile
    (never a different algorithm)."""
    known = json.loads(open(a.lt_choices).read()) if a.lt_choices else {}
    S, ver = a.shape, runners.lt.version()
    keys = [a.lt_key] if a.lt_key and f"|cublasLt {ver}|" in a.lt_key else []
    for gpu in gpus:
        keys += [autotune_key(gpu, ver, S.M, S.N, S.K, a.acc, a.layout),
                 legacy_autotune_key(gpu, ver, S.M, S.N, S.K, a.acc, a.layout)]
    hit = next((known[k] for k in keys if k in known), None)
    gpu = gpus[0] if gpus else "?"
    if not isinstance(hit, dict) or not isinstance(hit.get("index"), int) \
            or not 0 <= hit["index"] < runners.lt_algos:
        raise TargetError(f"cublaslt_autotuned: no recorded cuBLASLt choice for {S} {a.acc} "
                          f"{a.layout} on {gpu} (cuBLASLt {ver})")
    return hit["index"]


def _libs(a) -> dict:
    return {k: v for k, v in (("cublas", a.cublas), ("cublaslt", a.cublaslt)) if v}


def _ours(a, torch):
    """fn(a, b_rr, b_rc, c) -> status for our kernel, as the finals call it."""
    from cudal2.harness.measure import _candidate_launch
    S = a.shape
    lib = load_library(a.kernel)
    opts = lib.options(_options(a) or None)
    layout = lib.meta["layout"]
    if layout != a.layout:
        raise TargetError(f"{a.kernel}: meta layout {layout}, asked {a.layout}")
    ws_bytes = lib.workspace_bytes(S.M, S.N, S.K, opts)
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
    return _candidate_launch(lib, layout, S.M, S.N, S.K, opts, ws)


def _baseline(a, torch):
    S = a.shape
    runners = BaselineRunners(_libs(a), S.M, S.N, S.K, a.acc, a.layout)
    if a.baseline == "cublaslt_autotuned":
        from cudal2.harness.timing import gpu_env
        # the finals name the GPU as NVML does, else as torch does: both spellings looked up
        gpus = [g for g in dict.fromkeys([gpu_env().get("gpu"), torch.cuda.get_device_name()]) if g]
        runners.lt_autotuned_index = _lt_index(runners, a, gpus)
    return runners.launcher(a.baseline)


def _call(fn, pool, i: int, c, what: str) -> None:
    rc = fn(pool.a(i), pool.b_rr(i), pool.b_rc(i), c)
    if rc:
        raise TargetError(f"{what} returned status {rc}")


def run_gpu(a) -> None:
    import torch
    from cudal2.harness.measure import OperandPool

    if not torch.cuda.is_available():
        raise TargetError("no CUDA device visible")
    S = a.shape
    fn = _ours(a, torch) if a.kernel else _baseline(a, torch)
    what = a.kernel or a.baseline
    pool = OperandPool(S.M, S.N, S.K, 2, "cuda")          # set 0 warms up, set 1 is profiled
    c = torch.empty(S.M, S.N, dtype=torch.float16, device="cuda")
    for _ in range(max(0, a.warmup)):
        _call(fn, pool, 0, c, what)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        _call(fn, pool, 1, c, what)
        torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


# ---- the fake device ---------------------------------------------------------------------------

def _fake_grid(S: Shape, tile) -> str:
    bm, bn = (int(tile[0]), int(tile[1])) if tile and len(tile) >= 2 else (128, 128)
    return f"{math.ceil(S.N / bn)},{math.ceil(S.M / bm)},1"


def fake_launches(a) -> list[dict]:
    """What the call would launch, for fake_ncu: the library really loaded, faults injected."""
    S = a.shape
    if a.kernel:
        lib = load_library(a.kernel)
        opts = _options(a)
        arr = lib.options(opts or None)
        meta = lib.meta
        ws = lib.workspace_bytes(S.M, S.N, S.K, arr)
        fakedevice._launch(a.kernel)
        us = fakedevice._us(a.kernel, opts, S.M, S.N, S.K)
        main = {"kernel": f"void cudal2_{meta.get('style', 'kernel')}_hgemm<{meta['layout']}>"
                          f"(const __half *, const __half *, __half *, int, int, int)",
                "grid": _fake_grid(S, meta.get("tile")), "block": f"{meta.get('threads', 128)},1,1",
                "duration_ns": us * 1e3 * (0.9 if ws else 1.0)}
        # a workspace means a reduction after the main kernel (split-K's fixup)
        fix = {"kernel": "void cudal2_splitk_fixup(const float *, __half *, int, int)",
               "grid": f"{math.ceil(S.M * S.N / 256)},1,1", "block": "256,1,1",
               "duration_ns": us * 1e3 * 0.1}
        return [main, fix] if ws else [main]
    for name, cls in (("cublas", CublasLib), ("cublaslt", CublasLtLib)):
        if _libs(a).get(name):
            cls(_libs(a)[name])
    us = fakedevice._us("", {}, S.M, S.N, S.K, who=a.baseline)
    return [{"kernel": f"void fake_{a.baseline}_gemm_kernel(cutlass::Params)",
             "grid": _fake_grid(S, None), "block": "256,1,1", "duration_ns": us * 1e3}]


def run_fake(a) -> None:
    launches = fake_launches(a)
    path = os.environ.get(FAKE_LAUNCHES_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(launches, f)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        run_fake(a) if fakedevice.enabled() else run_gpu(a)
    except (TargetError, AbiError, BaselineError, OSError) as exc:
        print(f"profile_target: {' '.join(str(exc).split())[:300]}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - a CUDA error from a hostile kernel: one line, rc 1
        print(f"profile_target: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
              file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
