"""The measured reward table: a read-only view over results DBs, keyed by the built binary.

Every measured row (a screening with its interval, or a final) of a kernel with a binary key
(cudal2.core.binarykey: identical binaries share it however their source is written) becomes one
*draw* of (binary key, shape) on one GPU model, timed one way (timer + operands). Estimated and
not-measured rows never enter: the table holds measurements only. Only rows run with the binary's
default runtime options count (a campaign also screens other split-K, swizzle or raster values:
another configuration of the same binary, which neither the policy's file nor an arm's pick runs),
and a row found in two DBs (a merged copy) is one draw.

Draws of one binary at one shape are ordered by when they were recorded; with two or more, the
odd positions give the kernel's reward time and the even ones its reference time, so one lucky
draw is never both a kernel's reward and the bar it is measured against. A single draw serves
both. A shape's reference is the fastest reference time of its binaries.

`Queue`: the kernels the table lacked (binary key, shape, how often asked, source), a JSONL file
with the sources beside it, which the next GPU call screens (tools/gpu_session, `--queue`).

`python -m cudal2_rl.table describe|queue PATHS...` prints what a table or a queue holds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from cudal2.core.abi import AbiError, option_values
from cudal2.core.store import atomic_write_bytes
from cudal2.harness.db import ResultsDB

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "reports"
DEFAULT_BASELINE = "cublaslt_autotuned"


@dataclass(frozen=True)
class Draw:
    """One measurement of one binary at one shape."""
    us: float
    lo_us: float | None
    hi_us: float | None
    stage: str              # "screen" | "final"
    row_id: int
    db: str
    gpu_seconds: float
    created: str = ""


@dataclass(frozen=True)
class Entry:
    """One binary at one shape, with every draw the table holds of it."""
    binary_key: str
    shape: tuple
    layout: str
    acc: str
    source_sha: str
    source: str
    draws: tuple
    reward_us: float | None = None      # None: from the draws (odd positions when >= 2)
    reference_us: float | None = None   # None: from the draws (even positions)

    def __post_init__(self):
        if not self.draws and (self.reward_us is None or self.reference_us is None):
            raise ValueError(f"reward table: entry {self.binary_key[:12]} at {self.shape} has no draw")
        if self.reward_us is None:
            object.__setattr__(self, "reward_us", _median(self.draws[1::2] or self.draws))
        if self.reference_us is None:
            object.__setattr__(self, "reference_us", _median(self.draws[0::2]))

    @property
    def gpu_seconds(self) -> float:
        return sum(d.gpu_seconds for d in self.draws)


def _median(draws) -> float:
    return float(statistics.median(d.us for d in draws))


def default_paths() -> list[Path]:
    """The committed DBs: every reports/**/results.db.gz of the repository this package is in."""
    return sorted(REPORTS.glob("**/results.db.gz")) if REPORTS.is_dir() else []


def _draw(ev, db: str) -> Draw | None:
    """The kernel-time draw of a measured row, or None."""
    mode = "screen" if ev.stage == "screen" else "offline"
    t = ((ev.timings or {}).get(mode) or {}).get("candidate") or {}
    us = t.get("median_us")
    if not us or us <= 0:
        return None
    return Draw(float(us), t.get("lo_us"), t.get("hi_us"), ev.stage, int(ev.id), db,
                _session_seconds(ev), ev.created)


def _session_seconds(ev) -> float:
    """The GPU seconds the row's timed sessions took (recorded in stats), this candidate's share
    of a session it shared with others (session.group); 0 where none is recorded."""
    total = 0.0
    for rec in (ev.stats or {}).values():
        sess = (rec or {}).get("session") if isinstance(rec, dict) else None
        if isinstance(sess, dict) and isinstance(sess.get("seconds"), (int, float)):
            total += float(sess["seconds"]) / max(1, int(sess.get("group") or 1))
    return total


def _default_options(ev) -> bool:
    """Was the row run with the binary's default runtime options (none chosen, or the defaults)?"""
    if not ev.options:
        return True
    try:
        return option_values(ev.meta, ev.options) == option_values(ev.meta, {})
    except AbiError:
        return False


def _baselines(ev) -> dict[str, float]:
    off = (ev.timings or {}).get("offline") or {}
    return {who: float(t["median_us"]) for who, t in off.items()
            if who != "candidate" and (t or {}).get("median_us")}


class RewardTable:
    """The measured rows of one GPU model, arch and timing, by (binary key, shape)."""

    def __init__(self, entries, *, gpu: str, arch: str, paths=(), baselines=None):
        self.gpu, self.arch, self.paths = gpu, arch, [Path(p) for p in paths]
        self._by_shape: dict[tuple, list[Entry]] = {}
        for e in entries:
            self._by_shape.setdefault(tuple(e.shape), []).append(e)
        for members in self._by_shape.values():
            members.sort(key=lambda e: (e.reward_us, e.binary_key))
        self._baselines = {tuple(k): v for k, v in (baselines or {}).items()}

    @classmethod
    def from_entries(cls, entries, *, gpu: str, arch: str, baselines=None) -> "RewardTable":
        """An in-memory table; `baselines` maps a shape to {baseline: us} or to one number
        (cuBLASLt autotuned's time)."""
        return cls(entries, gpu=gpu, arch=arch, baselines=baselines)

    @classmethod
    def open(cls, paths=None, *, gpu: str | None = None, arch: str = "sm_90a",
             timer: str = "kernel", operands: str = "cold", layout: str | None = None,
             acc: str = "f32") -> "RewardTable":
        """The table over `paths` (default: the committed DBs); gpu None: the GPU model with
        the most measured rows. Every DB is opened read-only (a .gz in memory)."""
        paths = [Path(p) for p in (default_paths() if paths is None else paths)]
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(f"reward table: {p}: no such results DB")
        rows = []
        for p in paths:
            db = ResultsDB(p, readonly=True)
            try:
                rows += [(ev, db.source(ev.source_sha) or "", str(p)) for ev in
                         db.rows(status="ok", estimated=False, arch=arch)]
            finally:
                db.close()
        rows = [r for r in rows if _keep(r[0], timer, operands, layout, acc)]
        if gpu is None:
            counts: dict[str, int] = {}
            for ev, _, _ in rows:
                counts[_gpu(ev)] = counts.get(_gpu(ev), 0) + 1
            gpu = max(sorted(counts), key=counts.get) if counts else ""
        entries, baselines = _collect([r for r in rows if _gpu(r[0]) == gpu])
        return cls(entries, gpu=gpu, arch=arch, paths=paths, baselines=baselines)

    # -- reading
    def shapes(self) -> list[tuple]:
        return sorted(self._by_shape)

    def entries(self, shape) -> list[Entry]:
        """The binaries measured at `shape`, fastest (reward time) first."""
        return list(self._by_shape.get(tuple(shape), ()))

    def lookup(self, binary_key: str | None, shape) -> Entry | None:
        if not binary_key:
            return None
        return next((e for e in self._by_shape.get(tuple(shape), ())
                     if e.binary_key == binary_key), None)

    def reference_us(self, shape) -> float:
        entries = self._by_shape.get(tuple(shape))
        if not entries:
            raise KeyError(f"reward table: no measured kernel at shape {tuple(shape)}")
        return min(e.reference_us for e in entries)

    def best(self, shape) -> Entry:
        entries = self._by_shape.get(tuple(shape))
        if not entries:
            raise KeyError(f"reward table: no measured kernel at shape {tuple(shape)}")
        return min(entries, key=lambda e: (e.reference_us, e.binary_key))

    def baseline_us(self, shape, baseline: str = DEFAULT_BASELINE) -> float | None:
        got = self._baselines.get(tuple(shape))
        if isinstance(got, dict):
            return got.get(baseline)
        return got if baseline == DEFAULT_BASELINE else None

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_shape.values())

    def describe(self) -> str:
        draws = sum(len(e.draws) for v in self._by_shape.values() for e in v)
        keys = {e.binary_key for v in self._by_shape.values() for e in v}
        where = f"{len(self.paths)} DB(s)" if self.paths else "in memory"
        return (f"reward table ({where}): {self.gpu or 'no GPU model'} {self.arch}: "
                f"{len(self._by_shape)} shapes, {len(keys)} binaries, {len(self)} entries, "
                f"{draws} draws")


def _gpu(ev) -> str:
    return (ev.env or {}).get("gpu") or ""


def _keep(ev, timer: str, operands: str, layout: str | None, acc: str) -> bool:
    rec = (ev.env or {}).get("settings") or {}
    return bool(ev.binary_key and _gpu(ev) and rec.get("timer", timer) == timer
                and rec.get("operands", operands) == operands
                and (layout is None or ev.layout == layout) and (not acc or ev.acc in ("", acc))
                and _default_options(ev))


def _collect(rows):
    """Entries and per-shape baseline times from (Evaluation, source, db) rows."""
    draws: dict[tuple, list] = {}
    first: dict[tuple, tuple] = {}
    baselines: dict[tuple, dict] = {}
    for ev, source, db in rows:
        shape = (ev.shape.M, ev.shape.N, ev.shape.K)
        d = _draw(ev, db)
        if d is None:
            continue
        key = (ev.binary_key, shape)
        draws.setdefault(key, []).append(d)
        first.setdefault(key, (ev, source))
        if ev.stage == "final":
            baselines.setdefault(shape, {}).update(_baselines(ev))
    entries = []
    for (bkey, shape), ds in draws.items():
        ev, source = first[(bkey, shape)]
        ds = _distinct(sorted(ds, key=lambda d: (d.created, d.db, d.row_id)))
        entries.append(Entry(bkey, shape, ev.layout, ev.acc, ev.source_sha, source, tuple(ds)))
    return entries, baselines


def _distinct(draws: list) -> list:
    """One draw per measurement: a row copied into another DB (a merge) has the same time,
    stage, interval and timestamp."""
    seen, out = set(), []
    for d in draws:
        sig = (d.created, d.stage, d.us, d.lo_us, d.hi_us)
        if sig not in seen:
            seen.add(sig)
            out.append(d)
    return out


class Queue:
    """Kernels the table lacked, for the next GPU call to screen: JSONL rows (binary_key, M, N,
    K, count, source_sha, source_file), sources in sources/<sha>.cu beside it."""

    def __init__(self, path):
        self.path = Path(path)
        self._rows: dict[tuple, dict] = {}
        if self.path.is_file():
            for n, line in enumerate(self.path.read_text().splitlines(), 1):
                if line.strip():
                    try:
                        r = json.loads(line)
                        self._rows[(r["binary_key"], r["M"], r["N"], r["K"])] = r
                    except (ValueError, KeyError, TypeError):
                        raise ValueError(f"{self.path}:{n}: not a queue row") from None

    def add(self, binary_key: str, shape, source_sha: str, source: str) -> dict:
        M, N, K = (int(x) for x in shape)
        row = self._rows.get((binary_key, M, N, K))
        if row is None:
            src = self.path.parent / "sources" / f"{source_sha}.cu"
            if not src.exists():
                atomic_write_bytes(src, source.encode())
            row = {"binary_key": binary_key, "M": M, "N": N, "K": K, "count": 0,
                   "source_sha": source_sha, "source_file": f"sources/{source_sha}.cu"}
            self._rows[(binary_key, M, N, K)] = row
        row["count"] += 1
        atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n"
                                              for r in self._rows.values()).encode())
        return row

    def rows(self) -> list[dict]:
        return [dict(r) for r in self._rows.values()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudal2_rl.table", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    d = sub.add_parser("describe", help="what a reward table holds, per shape")
    d.add_argument("paths", nargs="*", help="results DBs (default: the committed reports/**/results.db.gz)")
    d.add_argument("--gpu"), d.add_argument("--arch", default="sm_90a")
    q = sub.add_parser("queue", help="what a queue file holds")
    q.add_argument("path")
    args = ap.parse_args(argv)
    try:
        return _show(args)
    except (OSError, ValueError) as e:      # a missing DB, a bad queue row: one line
        print(f"cudal2_rl.table: error: {e}", file=sys.stderr)
        return 2


def _show(args) -> int:
    if args.verb == "queue":
        rows = Queue(args.path).rows()
        if not rows:
            print(f"{args.path}: no queued kernel")
        for r in sorted(rows, key=lambda r: -r["count"]):
            print(f"{r['M']}x{r['N']}x{r['K']}  count {r['count']}  {r['binary_key'][:12]}  {r['source_file']}")
        return 0
    table = RewardTable.open(args.paths or None, gpu=args.gpu, arch=args.arch)
    print(table.describe())
    for shape in table.shapes():
        best = table.best(shape)
        print(f"  {'x'.join(map(str, shape))}: {len(table.entries(shape))} binaries, best "
              f"{best.reference_us:.2f} us ({best.binary_key[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
