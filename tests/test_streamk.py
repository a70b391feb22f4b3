"""Stream-K range math (cudal2/templates/streamk.cuh), the skinny families' decomposition 3: the
header's own __host__ __device__ code runs on the host (tests/data/streamk_emulate.cu) for every
decode row (M <= 64) of shapes/llm_trace.csv at the skinny tiles and a range of grids: every
(tile, k-tile) exactly once, no empty CTA, per-CTA work within one iteration, the contributors
of each tile consistent with the ranges, unique workspace slots, and the kernel's arrive/last-sums
protocol replayed in random CTA orders: bit-identical across orders, the workspace zero after.
"""
from __future__ import annotations

import csv
import shutil
import subprocess
from pathlib import Path

import pytest

from cudal2.templates import template_dir

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]


def _decode_rows() -> list[tuple[int, int, int]]:
    with open(ROOT / "shapes" / "llm_trace.csv") as f:
        rows = [(int(r["M"]), int(r["N"]), int(r["K"])) for r in csv.DictReader(f)]
    return sorted({r for r in rows if r[0] <= 64})


def _triples() -> list[tuple[int, int, int]]:
    out = set()
    for M, N, K in _decode_rows():
        for BN, BK in ((128, 64), (256, 128), (64, 64)):
            tiles, kt = -(-N // BN), -(-K // BK)
            I = tiles * kt
            for slots in (1, 7, 132, 264, 396, 528, I - 1, I, I + 5, 5000):
                if slots >= 1:
                    out.add((tiles, kt, slots))
    # the streamk family's deep-K targets (issue 51): M x N tiles over a deep K
    for M, N, K in ((128, 64, 12288), (128, 128, 16384), (256, 128, 8192), (1024, 256, 16384),
                    (128, 128, 2048), (100, 72, 12296)):
        for BM, BN, BK in ((32, 64, 64), (64, 64, 64), (128, 128, 32)):
            tiles, kt = -(-M // BM) * -(-N // BN), -(-K // BK)
            for slots in (132, 264, 114, 456):
                out.add((tiles, kt, min(slots, tiles * kt)))
    # corners: one tile, one k-tile, fewer iterations than slots, one CTA per tile exactly
    out |= {(1, 1, 264), (1, 64, 264), (3, 1, 264), (264, 1, 264), (7, 5, 3), (2, 3, 5)}
    return sorted(out)


@pytest.mark.compile
def test_stream_k_ranges_cover_every_iteration_once(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    assert len(_decode_rows()) >= 20
    exe = tmp_path / "streamk_emulate"
    subprocess.run([cxx, "-std=c++17", "-O2", "-x", "c++", "-I", str(template_dir()),
                    str(DATA / "streamk_emulate.cu"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    triples = _triples()
    stdin = "".join(f"{t} {k} {s}\n" for t, k, s in triples)
    r = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=300)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and not [x for x in lines if x.startswith("FAIL")], r.stdout[-3000:]
    assert len(lines) == len(triples)
    for (tiles, kt, slots), line in zip(triples, lines):
        G = int(line.split()[-1])
        # the grid: the resident slots, never more CTAs than iterations (no empty CTA)
        assert G == min(slots, tiles * kt, 2048), line
    # the Llama-3 8B decode shapes at the default skinny tile on 264 slots: no partial wave
    by = {tuple(map(int, x.split()[1:4])): int(x.split()[4]) for x in lines}
    for N, K in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        assert by[(-(-N // 128), -(-K // 64), 264)] == 264
