"""A fake device for CPU rehearsals of GPU runs (CUDAL2_FAKE_DEVICE=<time scale>).

A GPU worker with the knob set answers screening and finals in the shape a device gives, never
in substance: each library is really loaded (its ABI symbols, meta and runtime options are
checked), its times are synthetic (a roofline bound times a factor fixed by the library's bytes
and options), and each unit of work sleeps what it cost on a GPU, times the scale. Rows name the
GPU FAKE_GPU, and the export rule refuses them. What a rehearsal exercises is everything around
the measurement (workers, the tournament, the DB, a run's deadline, phases and files), not the
measurement.

Faults for fault-injection rehearsals: CUDAL2_FAKE_FAULTS="<so sha256 prefix>:trap,<prefix>:hang"
(trap: the launch raises the CUDA error a device fault raises; hang: the launch never returns;
wrong: screening passes, the finals' correctness suite fails the kernel, the worker lives on).
"""
from __future__ import annotations

import functools
import hashlib
import os
import time

from cudal2.core import knobs
from cudal2.harness import bounds

FAKE_GPU = "fake device (CPU rehearsal)"
_PEAK = bounds.KNOWN_PEAKS[1][1]          # times shaped like an H200's
# what one unit cost on a GPU (the H200 campaign of 2026-11-26: ~2400 screenings a GPU-minute)
SCREEN_S = 0.025
SCREEN_SETUP_S = 0.3                      # operand pool, smoke inputs, torch's reference time
# A finals session's phases (measure.PHASES) on the H200, 2026-11-26: the committed DBs' phases_s
# of its 55 sessions (99 finalists) fitted as once per session + per finalist (offline 0.11 +
# 0.45 n, correctness 0.25 + 0.04 n, baselines 0.26 + 0.02 n; 85.6 s in all). load, init,
# reference and autotune had no phase then (they sat in the hand-over): an estimate. Only the
# GPU's work: what the worker's start, exit and exchange cost, the rehearsal's own processes
# cost (before issue 66 point 7 these were ~2 s a finalist, the hand-over counted in twice).
FINAL_SESSION_S = {"provenance": 0.002, "init": 0.05, "reference": 0.1, "correctness": 0.25,
                   "operands": 0.001, "baselines": 0.26, "autotune": 0.05, "calibrate": 0.004,
                   "offline": 0.11}
FINAL_CANDIDATE_S = {"load": 0.02, "correctness": 0.04, "baselines": 0.02, "offline": 0.45}
FAULTS_ENV = "CUDAL2_FAKE_FAULTS"
# the streaming kernel's ceiling (cudal2.harness.bandwidth): its session's cost on a GPU (buffer
# fill, checksum, warm-up, rounds), and the share of the theoretical peak it answers
STREAM_READ_S = 4.0
STREAM_READ_OF_PEAK = 0.9
# the ceilings table's other parts (cudal2.harness.bandwidth.ceilings_task): each session's cost
# on a GPU, the device copy's share of the peak (bytes read + written), the launch floor's times
# (µs: back-to-back launches of an H100/H200), and the ramp of a small read (its launch)
CEILING_SIZE_S = 0.5                      # one stream-read size (its copies filled, rounds)
DEVICE_COPY_S = 0.5
LAUNCH_FLOOR_S = 0.5
DEVICE_COPY_OF_PEAK = 0.8
FLOOR_US = {"empty": 2.0, "one_cta": 2.4, "cublas_smallest": 4.6}


def enabled() -> bool:
    return knobs.fake_device_scale() is not None


def _sleep(seconds: float) -> None:
    time.sleep(seconds * (knobs.fake_device_scale() or 0.0))


@functools.lru_cache(maxsize=4096)
def _so_hash(so_path: str) -> str:
    with open(so_path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _fault(so_path: str) -> str | None:
    """The fault CUDAL2_FAKE_FAULTS injects into this library (trap, hang, wrong), or None."""
    h = _so_hash(so_path)
    for item in filter(None, os.environ.get(FAULTS_ENV, "").split(",")):
        prefix, _, kind = item.partition(":")
        if prefix and h.startswith(prefix):
            return kind
    return None


def _launch(so_path: str) -> None:
    """Where a real launch would run: injected device faults happen here."""
    kind = _fault(so_path)
    if kind == "trap":
        raise RuntimeError("CUDA error: an illegal instruction was encountered (fake device)")
    if kind == "hang":
        while True:
            time.sleep(3600)


def _us(so_path: str, options: dict, M: int, N: int, K: int, who: str = "candidate") -> float:
    """A synthetic median: the cold roofline bound (at least 3 us of launch) times a factor in
    [0.8, 1.6) fixed by the library's bytes, its options and `who`."""
    seed = hashlib.sha256(f"{_so_hash(so_path) if so_path else ''}{sorted(options.items())}{who}".encode())
    factor = 0.8 + 0.8 * int(seed.hexdigest()[:8], 16) / 2**32
    return max(3.0, bounds.lower_bound_us(M, N, K, _PEAK, cold=True) * 1.5) * factor


def _stats(us: float, n: int = 200) -> dict:
    return {"median_us": us, "lo_us": us * 0.995, "hi_us": us * 1.005, "p10_us": us * 0.99,
            "p90_us": us * 1.01, "n": n}


def env() -> dict:
    return {"gpu": FAKE_GPU, "device_name": FAKE_GPU, "fake_device": True,
            "time_scale": knobs.fake_device_scale()}


def screen_one(load, so_path: str, options: dict, shape: tuple, acc: str | None) -> dict:
    """One screening: load (measure._load), launch (faults), a synthetic time."""
    lib, meta, _ = load(so_path, options)
    _sleep(SCREEN_S)
    _launch(so_path)
    us = _us(so_path, dict(options or {}), *shape)
    return {"status": "ok", "detail": "", "acc": acc or meta["acc"], "layout": meta["layout"],
            "meta": meta, "options": dict(options or {}), "speedups": {},
            "timings": {"screen": {"candidate": _stats(us, 20)}},
            "stats": {"screen": {"session": {"fake_device": True}}}}


def torch_us(shape: tuple) -> float:
    _sleep(SCREEN_SETUP_S)
    return _us("", {}, *shape, who="torch")


def _slept(phases: dict, costs: dict, so_path: str | None = None) -> None:
    """Sleep each phase's cost (scaled) into phases; a candidate's launch at its correctness."""
    for name, seconds in costs.items():
        t0 = time.perf_counter()
        _sleep(seconds)
        if name == "correctness" and so_path:
            _launch(so_path)
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 4)


def session(phases: dict) -> None:
    """A finals session's once-per-group work (FINAL_SESSION_S), slept and counted."""
    _slept(phases, FINAL_SESSION_S)


def measure_one(load, so_path: str, request, baselines: list[str], phases: dict) -> dict:
    """One finalist's result as measure_group gives it: every baseline timed beside it in the
    offline mode, its own share of the phases (FINAL_CANDIDATE_S) slept and counted."""
    lib, meta, _ = load(so_path, dict(request.options))
    M, N, K = request.shape.M, request.shape.N, request.shape.K
    _slept(phases, FINAL_CANDIDATE_S, so_path)
    if _fault(so_path) == "wrong":
        return {"status": "wrong", "detail": "fake device: the injected wrong answer (CUDAL2_FAKE_FAULTS)",
                "acc": request.acc or meta["acc"], "layout": meta["layout"], "meta": meta,
                "options": dict(request.options), "timings": {}, "speedups": {}, "stats": {}}
    cand = _us(so_path, dict(request.options), M, N, K)
    base = {b: _us("", {}, M, N, K, who=b) for b in baselines}
    ivs = {b: {"median": t / cand, "lo": t / cand * 0.99, "hi": t / cand * 1.01} for b, t in base.items()}
    return {"status": "ok", "detail": "", "acc": request.acc or meta["acc"], "layout": meta["layout"],
            "meta": meta, "options": dict(request.options),
            "timings": {"offline": {"candidate": _stats(cand), **{b: _stats(t) for b, t in base.items()}}},
            "speedups": {"offline": {b: iv["median"] for b, iv in ivs.items()}},
            "stats": {"offline": {"speedup": ivs, "session": {"fake_device": True, "rounds": 10}}},
            "baseline_notes": {}, "lt_autotune": []}


def device() -> dict:
    """The device facts bandwidth.measure reads, an H200's: 2 x 3.2 GHz x 6144 bit = 4915 GB/s."""
    return {"sms": 132, "memory_clock_khz": 3_200_000, "bus_width_bits": 6144,
            "l2_bytes": _PEAK.l2_bytes, "name": FAKE_GPU}


def _peak_gbs(dev: dict) -> float:
    return 2 * dev["memory_clock_khz"] * 1e3 * dev["bus_width_bits"] / 8 / 1e9


def stream_read(nbytes: int) -> tuple[float, float, float, dict]:
    """The streaming kernel's session (bandwidth.measure_task): (median, lo, hi) µs per call of
    reading `nbytes`, at STREAM_READ_OF_PEAK of an H200-like peak, and the device facts, slept."""
    _sleep(STREAM_READ_S)
    dev = device()
    us = nbytes / (STREAM_READ_OF_PEAK * _peak_gbs(dev) * 1e3)
    return us, us * 0.998, us * 1.002, dev


def stream_read_at(nbytes: int) -> tuple[float, float, float]:
    """One size of the ceilings table: (median, lo, hi) µs of reading `nbytes` cold, a launch
    (FLOOR_US["one_cta"]) plus the bytes at STREAM_READ_OF_PEAK, so small sizes ramp; slept."""
    _sleep(CEILING_SIZE_S)
    us = FLOOR_US["one_cta"] + nbytes / (STREAM_READ_OF_PEAK * _peak_gbs(device()) * 1e3)
    return us, us * 0.995, us * 1.005


def device_copy(nbytes: int) -> tuple[float, float, float]:
    """(median, lo, hi) µs of copying `nbytes` on the device (2 x nbytes moved at
    DEVICE_COPY_OF_PEAK of the peak); slept."""
    _sleep(DEVICE_COPY_S)
    us = 2 * nbytes / (DEVICE_COPY_OF_PEAK * _peak_gbs(device()) * 1e3)
    return us, us * 0.997, us * 1.003


def launch_floor() -> dict:
    """The launch floor's medians, µs (FLOOR_US); slept."""
    _sleep(LAUNCH_FLOOR_S)
    return dict(FLOOR_US)
