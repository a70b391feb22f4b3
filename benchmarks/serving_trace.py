"""A serving trace (GPU): the GEMM sequence of an LLM's layer, replayed as CUDA graphs with random
idle gaps between sequences, through cudal2.matmul and through torch.matmul.

shapes/llm_trace.csv lists, per model and batch size (tokens), the four linear layers of a
Llama block (qkv, o, gate_up, down; B column-major as nn.Linear's x @ W^T). Each (model, tokens)
is one *sequence*: its four GEMMs captured in one CUDA graph, once with cudal2.matmul (whatever
the kernel table serves; torch where it serves nothing) and once with torch.matmul. The replay
draws sequences in proportion to their trace weight, in random order, with an exponential idle
gap (mean --gap-ms) before each; each replay is timed GPU-side (events around the graph launch,
behind a short spin, so the host path stays out). Per sequence: median time of each path and the
ratio torch / cudal2; overall: the weighted total. Prints a table and writes JSON.

    python benchmarks/serving_trace.py [--trace shapes/llm_trace.csv] [--replays 400]
                                        [--gap-ms 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def read_sequences(path) -> dict[tuple[str, int], dict]:
    """(model, tokens) -> {"weight": summed weight, "gemms": [(M, N, K, layout), ...]}."""
    seqs: dict[tuple[str, int], dict] = {}
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            key = (rec["model"], int(rec["tokens"]))
            s = seqs.setdefault(key, {"weight": 0.0, "gemms": []})
            s["weight"] += float(rec["weight"])
            s["gemms"].append((int(rec["M"]), int(rec["N"]), int(rec["K"]), rec.get("layout") or "RC"))
    return seqs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(REPO / "shapes" / "llm_trace.csv"))
    ap.add_argument("--replays", type=int, default=400)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("serving_trace: not measured: no GPU")
        return 0
    import cudal2
    from cudal2.runtime.resolve import TORCH, serving
    from cudal2.timing.kerneltime import CudaKernelBackend
    from cudal2.timing.stats import interval, paired_ratios

    seqs = read_sequences(args.trace)
    be = CudaKernelBackend()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    graphs = {}
    served = {}
    for key, s in seqs.items():
        ops = []
        for M, N, K, layout in s["gemms"]:
            a = torch.randn(M, K, generator=gen, device="cuda").half()
            w = torch.randn(N, K, generator=gen, device="cuda").half()
            ops.append((a, w.t() if layout == "RC" else w.t().contiguous()))
        for path, mm in (("cudal2", cudal2.matmul), ("torch", torch.matmul)):
            for a, b in ops:              # first calls outside capture: dispatch decides here
                mm(a, b)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            outs = []                     # kept alive with the graph: replays write them
            with torch.cuda.graph(g):
                for a, b in ops:
                    outs.append(mm(a, b))
            graphs[(key, path)] = (g, outs, ops)   # the graph reads these pointers: keep them
            if args.verbose:
                print(f"captured {key} {path}", flush=True)
        served[key] = sum(1 for (M, N, K, layout), (a, b) in zip(s["gemms"], ops)
                          if serving.get((0, M, N, K, "RC" if b.stride(0) == 1 else "RR"))
                          not in (None, TORCH))
    rng = random.Random(args.seed)
    keys = list(seqs)
    weights = [seqs[k]["weight"] for k in keys]
    times: dict[tuple, dict[str, list[float]]] = {k: {"cudal2": [], "torch": []} for k in keys}
    for _ in range(args.replays):
        key = rng.choices(keys, weights)[0]
        order = ["cudal2", "torch"]
        rng.shuffle(order)
        for path in order:
            be.synchronize()
            be.sleep(rng.expovariate(1.0 / (args.gap_ms / 1e3)))
            be.spin(20.0)
            s = be.record()
            graphs[(key, path)][0].replay()
            e = be.record()
            times[key][path].append(be.elapsed_us(s, e))
    rows = []
    tot = {"cudal2": 0.0, "torch": 0.0}
    for key in keys:
        t = times[key]
        if not t["torch"]:
            continue
        r = interval(paired_ratios(t["torch"], t["cudal2"]))
        c, tt = interval(t["cudal2"]).median, interval(t["torch"]).median
        tot["cudal2"] += seqs[key]["weight"] * c
        tot["torch"] += seqs[key]["weight"] * tt
        rows.append({"model": key[0], "tokens": key[1], "weight": seqs[key]["weight"],
                     "gemms_served_by_cudal2": served[key], "replays": len(t["torch"]),
                     "cudal2_us": c, "torch_us": tt,
                     "speedup": {"median": r.median, "lo": r.lo, "hi": r.hi, "n": r.n}})
    gpu = torch.cuda.get_device_name()
    print(f"serving trace on {gpu}: {args.replays} sequence replays (CUDA graphs, GPU-timed), "
          f"exponential gaps of mean {args.gap_ms} ms")
    print(f"{'model':>12} {'tokens':>6} {'served':>6} {'cudal2 us':>10} {'torch us':>10} "
          f"{'torch/cudal2 [95% CI]':>24}")
    for r in rows:
        sp = r["speedup"]
        print(f"{r['model']:>12} {r['tokens']:>6} {r['gemms_served_by_cudal2']:>4}/4 "
              f"{r['cudal2_us']:10.2f} {r['torch_us']:10.2f} "
              f"{sp['median']:8.3f} [{sp['lo']:.3f}, {sp['hi']:.3f}]")
    overall = tot["torch"] / tot["cudal2"] if tot["cudal2"] else float("nan")
    print(f"weighted time torch / cudal2 over the trace: {overall:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": gpu, "torch": torch.__version__, "replays": args.replays,
                       "gap_ms": args.gap_ms, "rows": rows, "weighted_speedup": overall}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
