#!/usr/bin/env python3
"""Generate the shape lists under shapes/ (deterministic; rerun to reproduce them byte for byte).

shapes/llm_trace.csv -- the linear layers of Llama-3 8B and 70B at token counts
  M in {1, 16, 64, 256, 1024, 4096}. Layers as a serving engine runs them (vLLM fuses Q/K/V and
  gate/up into one GEMM each); x @ W^T, so M = tokens, N = output features, K = input features
  (the weight is N x K row-major: layout "RC").
    qkv:     N = (heads + 2 * kv_heads) * head_dim, K = hidden
    o:       N = hidden,                            K = heads * head_dim
    gate_up: N = 2 * intermediate,                  K = hidden
    down:    N = hidden,                            K = intermediate
  8B: hidden 4096, intermediate 14336, 32 heads, 8 KV heads, head dim 128, 32 layers.
  70B: hidden 8192, intermediate 28672, 64 heads, 8 KV heads, head dim 128, 80 layers.
  weight = the shape's share of the time of its scenario, one scenario = one forward pass of one
  model at one M; every scenario counts equally (weights sum to 1 over the file). Inside a
  scenario every GEMM has the same M, so its flops (2*M*N*K) and its weight bytes (2*N*K) are
  both proportional to N*K: the flop share is the time share whether the layer is compute- or
  bandwidth-bound. The layer count multiplies every GEMM of a model alike and cancels.
  Attention itself, embeddings and the LM head are not linear layers of the block and are left out.
  Report a time-weighted speedup as  1 / sum(weight_i / speedup_i)  (cudal2.runs.report).

shapes/stratified_100.csv -- 100 shapes of the 1000-shape grid {64..16384}^3, 25 drawn (seed 0,
  numpy default_rng) from each flop bucket of cudal2.runs.report.BUCKETS: < 1e9, < 1e11, < 1e12, >= 1e12
  (2*M*N*K), sorted by M, N, K.

Usage: python scripts/make_shapes.py [--out shapes/]
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

GRID = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
TOKENS = (1, 16, 64, 256, 1024, 4096)
MODELS = {
    "llama3-8b": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, layers=32),
    "llama3-70b": dict(hidden=8192, intermediate=28672, heads=64, kv_heads=8, head_dim=128, layers=80),
}
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cudal2.runs.report import BUCKETS, size_bucket as bucket  # noqa: E402  (one definition of the buckets)


def linear_layers(cfg: dict) -> list[tuple[str, int, int]]:
    h, hd = cfg["hidden"], cfg["head_dim"]
    return [
        ("qkv", (cfg["heads"] + 2 * cfg["kv_heads"]) * hd, h),
        ("o", h, cfg["heads"] * hd),
        ("gate_up", 2 * cfg["intermediate"], h),
        ("down", h, cfg["intermediate"]),
    ]


def llm_trace() -> list[dict]:
    rows = []
    scenarios = len(MODELS) * len(TOKENS)
    for model, cfg in MODELS.items():
        layers = linear_layers(cfg)
        total = sum(n * k for _, n, k in layers)
        for m in TOKENS:
            for name, n, k in layers:
                rows.append(dict(M=m, N=n, K=k, weight=f"{n * k / total / scenarios:.6f}",
                                 model=model, layer=name, tokens=m, layout="RC"))
    return rows


def stratified(n_per_bucket: int = 25, seed: int = 0) -> list[dict]:
    grid = [(m, n, k) for m in GRID for n in GRID for k in GRID]
    rng = np.random.default_rng(seed)
    out = []
    for _, name in BUCKETS:
        members = [s for s in grid if bucket(*s) == name]
        if len(members) < n_per_bucket:
            raise ValueError(f"bucket {name} has only {len(members)} grid shapes")
        pick = rng.choice(len(members), size=n_per_bucket, replace=False)
        out += [members[i] for i in sorted(pick)]
    return [dict(M=m, N=n, K=k, bucket=bucket(m, n, k)) for m, n, k in sorted(out)]


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "shapes"))
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "llm_trace.csv", llm_trace())
    _write(out / "stratified_100.csv", stratified())
    print(f"wrote {out / 'llm_trace.csv'} and {out / 'stratified_100.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
