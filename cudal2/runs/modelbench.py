"""A model's forward-pass GEMMs, torch vs cudal2, as CUDA graphs (`cudal2 bench --model PATH`).

For each token count of the model's shapes (a config read by cudal2.runs.shapes, or a CSV that
`cudal2 shapes` wrote), one pass is the sequence of its GEMMs, each row `count` times (rows
round-robin, a row with count c in the last c rounds: lm_head, count 1, runs last), `x @ W.t()`
as nn.Linear runs it. Each pass is captured twice as a CUDA graph: through cudal2.matmul (what
the kernel table serves, torch elsewhere; first calls outside the capture decide) and through
torch.matmul. Weights rotate over enough copies per row that a row's copies exceed 3x L2 (the
kernel timer's cold-operand rule, up to its count), as a real model's distinct layers do.

Replays: rounds; in each, every pass's two graphs in shuffled order, each behind a spin and
timed by CUDA events (GPU time of the replay, the host's launch out of the bracket). Per pass:
median times and the median of per-round torch / cudal2 with a bootstrap interval. Overall: the
time-weighted speedup 1 / sum_T(w_T / s_T) (w_T = the pass's share of the file's weights, every
pass equal for a `cudal2 shapes` file; s_T its per-round ratio), per round, with a bootstrap
interval over rounds. Decode passes (M <= 64) also report the fraction of HBM bandwidth each path
reaches: the pass's bytes (every GEMM's A, B and C once, fp16) / time / the GPU's peak
(2 x memory clock x bus width, or --peak-gbs), and beside it the fraction of the device's own
ceiling, the read-only streaming kernel (cudal2.harness.bandwidth) timed in the same run before
the passes are captured (--no-ceiling skips it; --stream-so takes a prebuilt library, else it
is built through the build cache).

GPU-only at run time; the arithmetic (sequence, bytes, bandwidth, weighting) is pure and tested
on CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Mapping, Sequence

from cudal2.core.shapefile import check_sizes, open_csv, reader as shape_reader
from cudal2.core.toolchain import detect_arch
from cudal2.harness import bandwidth as bw
from cudal2.runs import shapes as S
from cudal2.timing.kerneltime import n_operand_sets
from cudal2.timing.stats import interval, paired_ratios

DECODE_MAX_M = bw.DECODE_MAX_M     # the decode rows: M <= 64


# --- pure parts ---------------------------------------------------------------------------------
def read_rows(path) -> list[dict]:
    """Rows of a `cudal2 shapes` CSV (M,N,K,layout,weight,tokens,count; count 1 when absent)."""
    out = []
    with open_csv(path) as f:
        for i, rec in enumerate(shape_reader(f, path), start=2):
            try:
                M, N, K = check_sizes((int(rec["M"]), int(rec["N"]), int(rec["K"])), path, i)
                out.append(dict(M=M, N=N, K=K,
                                layout=(rec.get("layout") or "RC").strip(),
                                weight=float(rec.get("weight") or 0.0),
                                layer=rec.get("layer", ""), tokens=int(rec.get("tokens") or rec["M"]),
                                count=int(rec.get("count") or 1)))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{i}: bad row {rec}: {exc!r}") from None
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def passes(rows: Sequence[dict]) -> dict[int, list[dict]]:
    """tokens -> that pass's rows, in file order."""
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(r["tokens"], []).append(r)
    return out


def call_sequence(counts: Sequence[int]) -> list[int]:
    """Row indices in call order: rounds over the rows, a row with count c in the last c rounds."""
    rounds = max(counts)
    return [i for r in range(rounds) for i, c in enumerate(counts) if r >= rounds - c]


def pass_bytes(rows: Sequence[dict]) -> int:
    """fp16 bytes a pass moves at least: each GEMM reads A (M x K) and B (N x K), writes C once."""
    return sum(2 * r["count"] * (r["M"] * r["K"] + r["N"] * r["K"] + r["M"] * r["N"]) for r in rows)


def hbm_fraction(nbytes: int, time_us: float, of_gbs: float | None) -> float | None:
    """nbytes read in time_us as a fraction of of_gbs (the peak, or the measured ceiling)."""
    return bw.fraction(bw.achieved_gbs(nbytes, time_us), of_gbs)


def weighted_speedup(weights: Mapping[int, float], speedups: Mapping[int, float]) -> float:
    """1 / sum(w_T / s_T) with the weights normalised over the passes given (report.py's rule)."""
    total = sum(weights[t] for t in speedups)
    if total <= 0:
        raise ValueError("the passes timed carry no weight")
    return 1.0 / sum(weights[t] / total / s for t, s in speedups.items())


def overall(weights: Mapping[int, float], torch_us: Mapping[int, Sequence[float | None]],
            cudal2_us: Mapping[int, Sequence[float | None]]):
    """The time-weighted speedup per round (rounds where every pass was timed), as an Interval."""
    keys = list(torch_us)
    n = min(len(torch_us[t]) for t in keys)
    per_round = []
    for r in range(n):
        if all(torch_us[t][r] and cudal2_us[t][r] for t in keys):
            per_round.append(weighted_speedup(
                weights, {t: torch_us[t][r] / cudal2_us[t][r] for t in keys}))
    if not per_round:
        raise ValueError("no round timed every pass")
    return interval(per_round)


def weight_copies(row: dict, l2_bytes: int) -> int:
    """Distinct weight tensors a row rotates over: cold in L2 as in the kernel timer, at most its count."""
    return max(1, min(row["count"], n_operand_sets(2 * row["N"] * row["K"], l2_bytes)))


# --- the GPU run --------------------------------------------------------------------------------
def stream_ceiling(stream_so: str | None = None, *, log=print) -> dict:
    """The streaming kernel's ceiling on this process's GPU (bw.measure's answer), built for the
    visible GPU's arch through the build cache unless `stream_so` is given; a failure is an
    answer ({"status": "error", "detail"}), never the run's end."""
    try:
        so = stream_so or bw.build_stream_read(detect_arch())
        return bw.measure(so)
    except Exception as exc:  # noqa: BLE001 - no nvcc, no build: the figures without the ceiling
        log(f"no streaming ceiling: {exc}")
        return {"status": "error", "detail": str(exc)[:500]}


def run(rows: list[dict], *, rounds: int = 50, seed: int = 0, peak_gbs: float | None = None,
        ceiling: bool = True, stream_so: str | None = None, log=print) -> dict:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("not measured: needs a CUDA GPU (none visible)")
    import cudal2
    from cudal2.runtime.resolve import TORCH, serving
    from cudal2.timing.kerneltime import CudaKernelBackend

    be = CudaKernelBackend()
    props = torch.cuda.get_device_properties(0)
    # the device's own ceiling first, while the memory the passes take is still free
    ceil = stream_ceiling(stream_so, log=log) if ceiling else None
    if ceil and ceil.get("status") == "ok":
        log(bw.line(ceil))
    ceil_gbs = ceil.get("gbs") if ceil and ceil.get("status") == "ok" else None
    peak = peak_gbs or bw.theoretical_peak_gbs(getattr(props, "memory_clock_rate", None),
                                          getattr(props, "memory_bus_width", None)) \
        or (ceil or {}).get("peak_gbs")        # CUDA 13's device properties may lack the clock
    gen = torch.Generator(device="cuda").manual_seed(seed)
    by_pass = passes(rows)
    weights = {t: sum(r["weight"] for r in rs) for t, rs in by_pass.items()}
    graphs, served = {}, {}
    for t, rs in by_pass.items():
        acts = [torch.randn(r["M"], r["K"], generator=gen, device="cuda").half() for r in rs]
        ws = [[torch.randn(r["N"], r["K"], generator=gen, device="cuda").half()
               for _ in range(weight_copies(r, be.l2_bytes))] for r in rs]
        seq = call_sequence([r["count"] for r in rs])
        for path, mm in (("cudal2", cudal2.matmul), ("torch", torch.matmul)):
            with torch.no_grad():
                for i, r in enumerate(rs):          # decide outside the capture
                    mm(acts[i], ws[i][0].t())
                torch.cuda.synchronize()
                g, outs, used = torch.cuda.CUDAGraph(), [], [0] * len(rs)
                with torch.cuda.graph(g):
                    for i in seq:
                        w = ws[i][used[i] % len(ws[i])]
                        used[i] += 1
                        outs.append(mm(acts[i], w.t()))
            graphs[(t, path)] = (g, outs, acts, ws)
        dev = torch.cuda.current_device()
        served[t] = sum(serving.get((dev, r["M"], r["N"], r["K"], "RC")) not in (None, TORCH) for r in rs)
        log(f"captured pass tokens={t}: {len(seq)} GEMMs, {served[t]}/{len(rs)} rows served by cudal2")
    rng = random.Random(seed)
    times = {t: {"cudal2": [], "torch": []} for t in by_pass}
    for _ in range(rounds):
        for t in by_pass:
            order = ["cudal2", "torch"]
            rng.shuffle(order)
            for path in order:
                be.synchronize()
                be.spin(20.0)
                s = be.record()
                graphs[(t, path)][0].replay()
                e = be.record()
                times[t][path].append(be.elapsed_us(s, e))
    out_rows = []
    for t, rs in by_pass.items():
        sp = interval(paired_ratios(times[t]["torch"], times[t]["cudal2"]))
        tt, tc = interval(times[t]["torch"]).median, interval(times[t]["cudal2"]).median
        row = {"tokens": t, "weight": weights[t], "rows": len(rs), "served_by_cudal2": served[t],
               "torch_us": tt, "cudal2_us": tc, "speedup": sp.to_dict()}
        if t <= DECODE_MAX_M:
            nb = pass_bytes(rs)
            row.update(bytes=nb, hbm_fraction_torch=hbm_fraction(nb, tt, peak),
                       hbm_fraction_cudal2=hbm_fraction(nb, tc, peak),
                       ceiling_fraction_torch=hbm_fraction(nb, tt, ceil_gbs),
                       ceiling_fraction_cudal2=hbm_fraction(nb, tc, ceil_gbs))
        out_rows.append(row)
    total = overall(weights, {t: times[t]["torch"] for t in by_pass},
                    {t: times[t]["cudal2"] for t in by_pass})
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": rounds,
            "peak_gbs": peak, "ceiling": ceil, "passes": out_rows,
            "weighted_speedup": total.to_dict()}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="a model folder or config.json (read as `cudal2 shapes` does), or a "
                             "CSV that `cudal2 shapes` wrote")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--tokens", default=",".join(map(str, S.DEFAULT_TOKENS)))
    parser.add_argument("--separate", action="store_true", help="q/k/v and gate/up unfused")
    parser.add_argument("--rounds", type=int, default=50, help="replays of each pass per path")
    parser.add_argument("--peak-gbs", type=float, default=None,
                        help="HBM peak in GB/s (default: from the device's memory clock and bus)")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip the streaming kernel's bandwidth ceiling (measured by default)")
    parser.add_argument("--stream-so", default=None,
                        help="a built streaming kernel (baselines/stream_read.cu); default: built "
                             "through the build cache for the visible GPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the figures here")


def model_rows(args) -> list[dict]:
    p = Path(args.model)
    if p.suffix == ".csv":
        return read_rows(p)
    m = S.read_config(p)
    return [dict(r, weight=float(r["weight"])) for r in
            S.model_rows(m, S.parse_tokens(args.tokens), tp=args.tp, fused=not args.separate)]


def run_cli(args: argparse.Namespace) -> int:
    try:
        rows = model_rows(args)
    except ValueError as exc:
        print(f"cudal2 bench --model: {exc}", file=sys.stderr)
        return 2
    bad = sorted({r["layout"] for r in rows} - {"RC"})
    if bad:
        print(f"cudal2 bench --model: rows with layout {bad}: a model's layers are RC", file=sys.stderr)
        return 2
    try:
        res = run(rows, rounds=args.rounds, seed=args.seed, peak_gbs=args.peak_gbs,
                  ceiling=not args.no_ceiling, stream_so=args.stream_so)
    except RuntimeError as exc:
        print(f"cudal2 bench --model: {exc}", file=sys.stderr)
        return 3
    print(f"{res['gpu']}: {args.rounds} rounds of each pass as CUDA graphs (GPU time)")
    print(bw.line(res.get("ceiling")) if res.get("ceiling") else "stream read: skipped (--no-ceiling)")
    print(f"{'tokens':>6} {'served':>7} {'torch us':>10} {'cudal2 us':>10} {'torch/cudal2 [95% CI]':>24} "
          f"{'of peak torch/cudal2':>21} {'of ceiling torch/cudal2':>24}")

    def pair(a, b):
        return f"{a:.2f}/{b:.2f}" if a is not None and b is not None else ""
    for r in res["passes"]:
        sp = r["speedup"]
        hbm = pair(r.get("hbm_fraction_torch"), r.get("hbm_fraction_cudal2"))
        ceil = pair(r.get("ceiling_fraction_torch"), r.get("ceiling_fraction_cudal2"))
        print(f"{r['tokens']:>6} {r['served_by_cudal2']:>3}/{r['rows']:<3} {r['torch_us']:10.1f} "
              f"{r['cudal2_us']:10.1f} {sp['median']:8.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}] {hbm:>21} "
              f"{ceil:>24}")
    w = res["weighted_speedup"]
    print(f"time-weighted torch / cudal2: {w['median']:.3f} [{w['lo']:.3f}, {w['hi']:.3f}]")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if math.isfinite(w["median"]) else 1
