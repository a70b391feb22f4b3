#!/usr/bin/env python3
"""The verdict call's profile stage: reasons, not only times. After the campaign, for each
target shape, one `ncu` pass over OUR best finalist and one over the FASTEST BASELINE's call at
that shape, into a compact CSV (cudal2/harness/ncu.py COLUMNS).

    python tools/gpu_session/profile.py --db DB --pack P [--pack P2 ...] --out PATH/profile.csv \
        [--budget-s 90] [--ncu PATH] [--shapes N] [--timeout-s 60]

Each shape's best finalist: the lowest offline median among the DB's 'final' rows that passed;
the fastest baseline: the lowest of types.BASELINES in that same row. Shapes go worst first (our
time / the fastest baseline's). One ncu process per (shape, target), wrapping
`python -m cudal2.harness.profile_target` (the pack's .so or baseline libraries, no compiling),
in its own process group, killed at its timeout or at the budget's end. The CSV is rewritten
whole (atomically) after each target, so a kill leaves a complete file; targets the budget did
not reach are rows with status budget.

ncu absent, the driver refusing the counters (ERR_NVGPUCTRPERM), or ncu failing to start its
profiler ("Failed to initialize the profiler: LibraryNotLoaded" under a sandboxed driver): the
stage stops after the first target, one line, the CSV written with that status and ncu's text,
exit 0: the call goes on. A fake ncu for CPU rehearsals: fake_ncu.py here.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cudal2.harness import ncu  # noqa: E402
from cudal2.harness.types import BASELINES, medians  # noqa: E402

DEFAULT_BUDGET_S = 90.0
DEFAULT_TIMEOUT_S = 60.0           # one ncu process: start, the target's warm-up, the replays
MIN_START_S = 3.0                  # with less left, no ncu process starts (its start alone costs seconds)
KILL_WAIT_S = 5.0


class Stop(Exception):
    """SIGTERM / SIGINT: the caller's own deadline; finish the CSV and leave."""


# ---- what to profile ---------------------------------------------------------------------------

@dataclass
class Pick:
    """One shape: our best finalist and the fastest baseline in the same finals row."""
    M: int
    N: int
    K: int
    layout: str
    acc: str
    sha: str
    options: dict
    ours_us: float
    baseline: str
    baseline_us: float
    lt_key: str = ""               # the cuBLASLt autotune key the finals timed (env lt_autotune_choice)

    @property
    def ratio(self) -> float:
        return self.ours_us / self.baseline_us


@dataclass
class Target:
    base: dict                     # M, N, K, layout, who, name: the CSV's leading cells
    args: list = field(default_factory=list)   # profile_target's arguments
    problem: str = ""              # set: not run, an error row with this detail


def _passed(ev) -> bool:
    return (ev.stage == "final" and ev.status == "ok" and not ev.estimated
            and (ev.correctness or {}).get("ok") is not False
            and "candidate" in medians(ev, "offline"))


def picks(evs, limit: int | None = None) -> list[Pick]:
    """Each (shape, layout)'s best finalist against its fastest baseline, worst first."""
    best: dict[tuple, Pick] = {}
    for ev in filter(_passed, evs):
        med = medians(ev, "offline")
        bases = {b: t for b, t in med.items() if b in BASELINES}
        if not bases:
            continue
        name = min(bases, key=bases.get)
        key = (ev.shape.M, ev.shape.N, ev.shape.K, ev.layout)
        lt = ((ev.env or {}).get("lt_autotune_choice") or {}).get("key") or ""
        p = Pick(*key, ev.acc, ev.source_sha, dict(ev.options), med["candidate"], name, bases[name], lt)
        if key not in best or p.ours_us < best[key].ours_us:
            best[key] = p
    out = sorted(best.values(), key=lambda p: (-p.ratio, p.M, p.N, p.K, p.layout))
    return out[:limit] if limit else out


def our_name(sha: str, options: dict) -> str:
    opts = ";".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{sha[:12]}:{opts}" if opts else sha[:12]


@dataclass
class Packs:
    kernels: dict                  # source sha -> kernel.so (a gzipped one unpacked: library_path)
    baselines: dict                # "cublas" / "cublaslt" -> .so
    lt_choices: dict               # autotune key -> entry (the manifests')


def read_packs(paths) -> Packs:
    from cudal2.runs.campaign import library_path, load_manifest
    kernels, bases, lt = {}, {}, {}
    for p in map(Path, paths):
        m = load_manifest(p)
        for c in m["candidates"]:
            if c["sha"] not in kernels:
                kernels[c["sha"]] = str(library_path(p / c["dir"]))
        for b in m.get("baselines") or ():
            bases.setdefault(b["name"], str((p / b["dir"] / "kernel.so").resolve()))
        lt.update(m.get("lt_choices") or {})
    return Packs(kernels, bases, lt)


def targets(ps: list[Pick], packs: Packs, lt_file: str) -> list[Target]:
    out = []
    for p in ps:
        shape = ["--shape", f"{p.M}x{p.N}x{p.K}", "--layout", p.layout, "--acc", p.acc or "f32"]
        cells = {"M": p.M, "N": p.N, "K": p.K, "layout": p.layout}
        so = packs.kernels.get(p.sha)
        out.append(Target({**cells, "who": "ours", "name": our_name(p.sha, p.options)},
                          shape + ["--kernel", so or "", "--options", json.dumps(p.options)],
                          "" if so else f"our kernel {p.sha[:12]} is in no pack given"))
        libs = [a for k in ("cublas", "cublaslt") if k in packs.baselines
                for a in (f"--{k}", packs.baselines[k])]
        needs = {"cublas_nn": "cublas", "cublas_tn": "cublas"}.get(p.baseline,
                                                                   "cublaslt" if "lt" in p.baseline else "")
        out.append(Target({**cells, "who": "baseline", "name": p.baseline},
                          shape + ["--baseline", p.baseline, *libs, "--lt-choices", lt_file,
                                   *(["--lt-key", p.lt_key] if p.lt_key else [])],
                          f"the packs carry no {needs} baseline library"
                          if needs and needs not in packs.baselines else ""))
    return out


# ---- running ncu -------------------------------------------------------------------------------

def find_ncu(given: str | None) -> tuple[list[str] | None, str]:
    """(the command that runs ncu, "") or (None, why not). A .py (fake_ncu) runs under python."""
    path = given or os.environ.get("NCU") or shutil.which("ncu")
    if not path and Path("/usr/local/cuda/bin/ncu").is_file():
        path = "/usr/local/cuda/bin/ncu"
    if not path:
        return None, "ncu absent: not on PATH, no --ncu, no /usr/local/cuda/bin/ncu"
    if not Path(path).is_file():
        return None, f"ncu absent: {path} is no file"
    return ([sys.executable, path] if path.endswith(".py") else [path]), ""


class Runner:
    """One ncu process per target; the process group killed at its limit or on Stop."""

    def __init__(self, ncu_cmd: list[str], workdir: Path, timeout_s: float):
        self.ncu_cmd, self.workdir, self.timeout_s = ncu_cmd, workdir, timeout_s
        self.metrics = list(ncu.METRICS)
        self.dropped: list[str] = []
        self.passes = 0                # the most replay passes ncu said one launch took
        self.proc: subprocess.Popen | None = None
        self.n = 0

    def kill(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)        # ncu, the target, whatever it started
            except ProcessLookupError:
                pass

    def _once(self, t: Target, left_s: float) -> tuple[str, str]:
        """('done' | 'timeout' | 'budget', ncu's output and log)."""
        self.n += 1
        log = self.workdir / f"ncu{self.n}.log"
        target = [sys.executable, "-m", "cudal2.harness.profile_target", *t.args]
        cmd = ncu.command(self.ncu_cmd, target, metrics=self.metrics, log_file=str(log))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        limit = min(self.timeout_s, left_s)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace",
                                     start_new_session=True, env=env, cwd=str(REPO))
        try:
            out, outcome = self.proc.communicate(timeout=limit)[0], "done"
        except subprocess.TimeoutExpired:
            self.kill()
            try:
                out = self.proc.communicate(timeout=KILL_WAIT_S)[0]
            except subprocess.TimeoutExpired:       # something outside the group holds the pipe
                out = ""
            outcome = "timeout" if limit >= self.timeout_s else "budget"
        except BaseException:                       # Stop: nothing of it outlives the stage
            self.kill()
            raise
        finally:
            self.proc = None
        text = (log.read_text(errors="replace") if log.exists() else "") + "\n" + (out or "")
        return outcome, text

    def __call__(self, t: Target, left_s: float) -> list[dict]:
        """The target's rows; an unknown metric is dropped and the target run again."""
        while True:
            t0 = time.monotonic()
            outcome, text = self._once(t, left_s)
            left_s -= time.monotonic() - t0
            if outcome == "timeout":
                return [ncu.status_row(t.base, "timeout", f"ncu ran past {self.timeout_s:.0f} s")]
            if outcome == "budget":
                return [ncu.status_row(t.base, "budget", "budget: stopped at the deadline")]
            parsed = ncu.parse(text, self.metrics)
            self.passes = max(self.passes, parsed.passes or 0)
            m = parsed.missing_metric
            if m in self.metrics and len(self.metrics) > 1 and left_s >= MIN_START_S:
                self.metrics.remove(m)
                self.dropped.append(m)
                continue
            return ncu.rows(t.base, parsed)


def profile_all(ts: list[Target], run, *, deadline: float, now=time.monotonic,
                on_rows=lambda rows: None) -> list[dict]:
    """Run each target in order until the deadline. A status that answers for the device (the
    counters refused, the profiler failing to start: ncu.DEVICE_STATUSES) stops the stage: the
    rest are rows saying so, no further ncu process starts. on_rows(all rows so far) after each."""
    rows: list[dict] = []
    stopped: dict | None = None             # the first row of a device status
    for i, t in enumerate(ts):
        left = deadline - now()
        if stopped:
            rows.append(ncu.status_row(t.base, stopped["status"], stopped["detail"]))
        elif t.problem:
            rows.append(ncu.status_row(t.base, "error", t.problem))
        elif left < MIN_START_S:
            rows += [ncu.status_row(u.base, "budget", "budget: not reached before the deadline")
                     for u in ts[i:]]
            break
        else:
            got = run(t, left)
            rows += got
            if got and got[0]["status"] in ncu.DEVICE_STATUSES:
                stopped = got[0]
        on_rows(rows)
    on_rows(rows)
    return rows


# ---- the stage ---------------------------------------------------------------------------------

def _summary(rows: list[dict], n_shapes: int, wall_s: float, out: Path, run: Runner) -> str:
    per: dict[tuple, str] = {}
    for r in rows:                 # a target's status: its first row's
        per.setdefault((r["M"], r["N"], r["K"], r["layout"], r["who"]), r["status"])
    counts: dict[str, int] = {}
    for s in per.values():
        counts[s] = counts.get(s, 0) + 1
    text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda x: -x[1]))
    extra = f"; up to {run.passes} replay passes a launch" if run.passes else ""
    extra += f"; ncu lacked {', '.join(run.dropped)} (left out)" if run.dropped else ""
    return (f"profile: {counts.get('ok', 0)} of {len(per)} targets profiled over {n_shapes} "
            f"shapes in {wall_s:.0f} s ({text or 'nothing to profile'}){extra} -> {out}")


def _evaluations(db_path: Path) -> tuple[list, dict]:
    from cudal2.harness.db import ResultsDB
    with ResultsDB(db_path, readonly=True) as db:
        return db.rows(stage="final"), db.baseline_choices()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, type=Path, help="the call's results DB (.db or .db.gz)")
    p.add_argument("--pack", action="append", required=True, type=Path, help="a campaign pack (repeat)")
    p.add_argument("--out", required=True, type=Path, help="the compact CSV to write")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="one ncu process")
    p.add_argument("--ncu", help="ncu to run (default: $NCU, PATH, /usr/local/cuda/bin/ncu)")
    p.add_argument("--shapes", type=int, default=None, help="profile the N worst shapes only")
    return p.parse_args(argv)


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def _key(row_or_base: dict) -> tuple:
    return tuple(row_or_base[k] for k in ("M", "N", "K", "layout", "who"))


def _profile(a, ps: list[Pick], evs_choices: dict, packs: Packs, t0: float) -> str:
    """Run the targets; the CSV kept whole after each. Returns the summary line."""
    with tempfile.TemporaryDirectory(prefix="cudal2-profile.") as tmp:
        lt_file = Path(tmp) / "lt_choices.json"
        lt_file.write_text(json.dumps({**packs.lt_choices, **evs_choices}))
        ts = targets(ps, packs, str(lt_file))
        ncu_cmd, why = find_ncu(a.ncu)
        if ncu_cmd is None:
            ncu.write_csv(a.out, [ncu.status_row(t.base, "ncu_absent", why) for t in ts])
            return f"profile: {why}; {len(ts)} targets written as ncu_absent -> {a.out}"
        run = Runner(ncu_cmd, Path(tmp), a.timeout_s)
        rows: list[dict] = []

        def keep(r):
            rows[:] = r
            ncu.write_csv(a.out, r)
        try:
            profile_all(ts, run, deadline=t0 + a.budget_s, on_rows=keep)
        except Stop as exc:
            run.kill()
            done = {_key(r) for r in rows}
            keep(rows + [ncu.status_row(t.base, "budget", f"budget: stopped by {exc}")
                         for t in ts if _key(t.base) not in done])
    stop = next((r for r in rows if r["status"] in ncu.DEVICE_STATUSES), None)
    if stop:
        return (f"profile: {stop['detail']}; stopped after one ncu process, {len(ts)} targets "
                f"written as {stop['status']} in {time.monotonic() - t0:.0f} s -> {a.out}")
    return _summary(rows, len(ps), time.monotonic() - t0, a.out, run)


def _stage(a, t0: float) -> str:
    if not a.db.exists():
        ncu.write_csv(a.out, [])
        return f"profile: no results DB at {a.db}: nothing to profile -> {a.out}"
    try:
        evs, choices = _evaluations(a.db)
        packs = read_packs(a.pack)
    except (ValueError, OSError) as exc:
        ncu.write_csv(a.out, [])
        return f"profile: {' '.join(str(exc).split())[:300]}"
    return _profile(a, picks(evs, a.shapes), choices, packs, t0)


def main(argv=None) -> int:
    a = parse_args(argv)
    t0 = time.monotonic()
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        line = _stage(a, t0)
    except Stop as exc:                      # before the first target: no row to write yet
        if not a.out.exists():
            ncu.write_csv(a.out, [])
        line = f"profile: stopped by {exc} before profiling -> {a.out}"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
