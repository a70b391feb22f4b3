"""Where a GPU call's time went: the by-phase account and the throughput of a campaign.

A call (the whole device command, or a campaign run alone) is accounted as named phases whose
seconds, with what no phase claims ("unattributed"), sum to the call's wall time. Phases come
from three places: the steps before the campaign (a JSON file the call's script writes: start,
canary, tests), the campaign's own steps (audit, screening, export, reports, ...), and the
finals' measure phases (cudal2.harness.measure: correctness, operands, baselines, autotune,
offline, server, e2e, ...), with the finals' time outside them named "finals hand-over"
(worker start and exchange, loading, the cache rule).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

UNATTRIBUTED = "unattributed"
HANDOVER = "finals hand-over"


class Account:
    """Seconds per phase since `start` (time.time() of the call's start; default: now)."""

    def __init__(self, start: float | None = None, before: dict | None = None):
        self.start = time.time() if start is None else float(start)
        self.phases: dict[str, float] = {}
        for k, v in (before or {}).items():
            self.add(k, v)

    @classmethod
    def from_file(cls, path) -> "Account":
        """The account a call's script began: {"start": epoch seconds, "phases": {name: s}}."""
        try:
            d = json.loads(Path(path).read_text())
            return cls(float(d["start"]), {str(k): float(v) for k, v in d.get("phases", {}).items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"--call-account {path}: not a call account ({exc})") from None

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + max(0.0, float(seconds))

    @contextmanager
    def phase(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - t0)

    def add_finals(self, wall_s: float, measure_phases: dict | None) -> None:
        """One finals stretch: its measure phases, the rest of its wall time as hand-over."""
        inside = 0.0
        for k, v in (measure_phases or {}).items():
            self.add("measure other" if k == "other" else k, v)
            inside += float(v)
        self.add(HANDOVER, wall_s - inside)

    def table(self, now: float | None = None) -> dict:
        """{"wall_s", "phases": {name: s, ..., "unattributed": s}, "unattributed_fraction"}."""
        wall = (time.time() if now is None else now) - self.start
        named = sum(self.phases.values())
        phases = {k: round(v, 3) for k, v in sorted(self.phases.items(), key=lambda kv: -kv[1])}
        phases[UNATTRIBUTED] = round(max(0.0, wall - named), 3)
        return {"wall_s": round(wall, 3), "phases": phases,
                "unattributed_fraction": round(phases[UNATTRIBUTED] / wall, 4) if wall > 0 else 0.0}

    def line(self, now: float | None = None) -> str:
        t = self.table(now)
        return (f"call {t['wall_s']:.1f} s by phase: "
                + ", ".join(f"{k} {v:.1f} s" for k, v in t["phases"].items())
                + f" ({t['unattributed_fraction']:.0%} unattributed)")


def extended(call: dict, start: float, name: str, seconds: float, now: float | None = None) -> dict:
    """A call's account (Account.table's) with one more phase run after its table was taken (the
    verdict call's profile stage, after the campaign wrote it), its wall time up to `now`."""
    acct = Account(start, {k: v for k, v in call["phases"].items() if k != UNATTRIBUTED})
    acct.add(name, seconds)
    return acct.table(now)


def main(argv=None) -> int:
    """python -m cudal2.runs.account extend SUMMARY PHASE SECONDS --start EPOCH: summary.json's
    "call" account with PHASE added (rewritten atomically; a summary without one is left alone)."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__.split(":")[0])
    ap.add_argument("action", choices=["extend"])
    ap.add_argument("summary")
    ap.add_argument("phase")
    ap.add_argument("seconds", type=float)
    ap.add_argument("--start", type=float, required=True, help="the call's start, epoch seconds")
    args = ap.parse_args(argv)
    path = Path(args.summary)
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"account extend: {path}: not a summary ({exc})")
        return 2
    if not isinstance(summary.get("call"), dict):
        print(f"account extend: {path} has no call account; {args.phase} not added")
        return 0
    summary["call"] = extended(summary["call"], args.start, args.phase, args.seconds)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(path)
    return 0


class Throughput:
    """Screenings and finals per GPU-minute, by size bucket (the campaign's benchmark)."""

    def __init__(self):
        self.rec: dict[str, dict[str, float]] = {}

    def add(self, stage: str, bucket: str, n: int, seconds: float) -> None:
        r = self.rec.setdefault(f"{stage} {bucket}", {"n": 0, "seconds": 0.0})
        r["n"] += n
        r["seconds"] += seconds

    def table(self) -> dict:
        out: dict = {}
        for k, r in sorted(self.rec.items()):
            out[k] = dict(r, per_gpu_minute=r["n"] / (r["seconds"] / 60.0) if r["seconds"] else None)
        for stage in ("screen", "final"):
            n = sum(r["n"] for k, r in self.rec.items() if k.startswith(stage))
            t = sum(r["seconds"] for k, r in self.rec.items() if k.startswith(stage))
            out[f"{stage} all"] = {"n": n, "seconds": t, "per_gpu_minute": n / (t / 60.0) if t else None}
        return out

    def lines(self) -> list[str]:
        return [f"  {k:<22} {v['n']:5d} in {v['seconds']:7.1f} s: "
                + (f"{v['per_gpu_minute']:8.1f} per GPU-minute" if v["per_gpu_minute"] else "-")
                for k, v in self.table().items()]


if __name__ == "__main__":
    raise SystemExit(main())
