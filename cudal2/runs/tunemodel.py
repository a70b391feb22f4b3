"""Tune a model's GEMMs on one's own GPU in one command (`cudal2 tune-model --model DIR`).

Four steps in one work folder (default <CUDAL2_CACHE>/tune-model/<model>-tp<N>-<arch>/):
  1. shapes   the model's linear layers (cudal2.runs.shapes) -> work/shapes.csv
  2. prepare  plan, build and pack the candidates (campaign prepare, CPU + nvcc) -> work/pack/
  3. run      time them against the baselines and export the winners (campaign run, GPU)
              into work/run/<gpu>/<date>-campaign/, rows accumulating in work/results.db
  4. report   the served table for this GPU and the model's passes replayed as CUDA graphs,
              torch vs cudal2 (cudal2.runs.modelbench, a real GPU only)
Without a GPU it does steps 1-2 and prints what is left and the command for the GPU machine.

Resumable: a second invocation skips what the folder shows finished, checked on disk, never
taken on trust from a flag. The pack is reused when its manifest loads, names the same arch,
its copy of the shapes file hashes like work/shapes.csv, its libraries hash as the manifest
says and state.json records the same prepare options for that manifest (written when prepare
returned, so a killed prepare's half pack never counts, and is made again). The run is
skipped when state.json records it complete for this pack and GPU and that run's summary.json
agrees (every planned shape done, not stopped by the budget); otherwise it runs again on
work/results.db, which skips every (shape, build, options) it already recorded.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cudal2.core import knobs
from cudal2.core.identity import file_sha
from cudal2.core.store import atomic_write_bytes
from cudal2.runs import campaign, shapes as S

STATE = "state.json"
SCHEMA = "cudal2.tune-model/1"
DEFAULT_ARCH = "sm_90a"          # without a GPU or CUDAL2_ARCH: the H100/H200 class
# campaign prepare's options as its command line defaults them; a pack's own are in state.json
PREPARE_DEFAULTS = {"families": None, "limit_per_shape": 8, "per_family": 2}


@dataclass
class Job:
    """One tune-model call: what its steps share."""
    model: str
    work: Path
    arch: str
    tp: int = 1
    tokens: list = field(default_factory=lambda: list(S.DEFAULT_TOKENS))
    fused: bool = True
    prepare_options: dict = field(default_factory=dict)   # the ones given (state.json: all)
    jobs: int | None = None                                 # nvcc processes: not the pack's identity
    budget_s: float = 0.0
    kernels_out: str | None = None
    rounds: int = 50
    progress: bool | None = None
    log: Callable = print

    @property
    def shapes(self) -> Path:
        return self.work / "shapes.csv"

    @property
    def pack(self) -> Path:
        return self.work / "pack"


# --- state --------------------------------------------------------------------------------------
def read_state(work: Path) -> dict:
    """state.json of the work folder ({} when absent); a corrupt one is an error naming it."""
    p = Path(work) / STATE
    if not p.is_file():
        return {}
    try:
        st = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not JSON ({exc}); delete it to start the folder's steps over") from None
    if not isinstance(st, dict) or st.get("schema") != SCHEMA:
        raise ValueError(f"{p}: field 'schema' is {st.get('schema') if isinstance(st, dict) else st!r}, "
                         f"expected {SCHEMA!r}; delete it to start over")
    return st


def write_state(work: Path, **updates) -> dict:
    st = dict(read_state(work), schema=SCHEMA, **updates)
    # atomic: a killed call leaves the old state or the new
    atomic_write_bytes(Path(work) / STATE, (json.dumps(st, indent=1, sort_keys=True) + "\n").encode())
    return st


# --- step 1: shapes -----------------------------------------------------------------------------
def shapes_step(job: Job) -> str:
    """work/shapes.csv from the model (a config, or a `cudal2 shapes` CSV as given); rewritten only
    when its bytes change, so its hash names the shapes. Returns the hash."""
    job.work.mkdir(parents=True, exist_ok=True)
    src = Path(job.model)
    tmp = job.work / "shapes.csv.tmp"
    if src.suffix == ".csv":
        if not src.is_file():
            raise ValueError(f"{src}: no such shapes file")
        if src.resolve() == job.shapes.resolve():     # the GPU machine's call on a copied folder
            job.log(f"tune-model 1/4 shapes: {job.shapes} (the work folder's own)")
            return file_sha(job.shapes)
        shutil.copyfile(src, tmp)
        what = f"{src} (a shapes file, as given)"
    else:
        model = S.read_config(job.model)
        rows = S.model_rows(model, job.tokens, tp=job.tp, fused=job.fused)
        S.write_rows(rows, tmp)
        what = (f"{model.name} tp={job.tp}: {len(rows)} rows, "
                f"{len({(r['M'], r['N'], r['K']) for r in rows})} distinct shapes")
    same = job.shapes.is_file() and file_sha(tmp) == file_sha(job.shapes)
    if same:
        tmp.unlink()
    else:
        tmp.replace(job.shapes)
    job.log(f"tune-model 1/4 shapes: {what} -> {job.shapes}{' (unchanged)' if same else ''}")
    return file_sha(job.shapes)


# --- step 2: prepare ----------------------------------------------------------------------------
def pack_problem(job: Job, shapes_sha: str, state: dict) -> str | None:
    """Why work/pack cannot be reused for these shapes, arch and options (None: it can)."""
    if not (job.pack / campaign.MANIFEST).is_file():
        return "no pack yet"
    try:
        m = campaign.load_manifest(job.pack)
    except (ValueError, OSError) as exc:
        return f"its manifest does not load ({exc})"
    if m.get("arch") != job.arch:
        return f"it was prepared for {m.get('arch')}, not {job.arch}"
    if not (job.pack / "shapes.csv").is_file() or file_sha(job.pack / "shapes.csv") != shapes_sha:
        return "the shapes changed since it was prepared"
    done = state.get("prepare") or {}
    if done.get("manifest_sha256") != file_sha(job.pack / campaign.MANIFEST):
        return "state.json does not record this pack as prepared here"
    # an option not given takes the pack's: the GPU machine's call need not repeat them
    changed = {k: v for k, v in job.prepare_options.items() if (done.get("options") or {}).get(k, v) != v}
    if changed or not isinstance(done.get("options"), dict):
        return f"the prepare options changed ({done.get('options')} -> {job.prepare_options})"
    for what, e in campaign.pack_entries(m):
        bad = campaign.file_problem(job.pack, what, e)
        if bad:
            return bad
    return None


def prepare_step(job: Job, shapes_sha: str) -> dict:
    """The pack for work/shapes.csv: reused when valid (pack_problem), else prepared afresh."""
    problem = pack_problem(job, shapes_sha, read_state(job.work))
    if problem is None:
        m = campaign.load_manifest(job.pack)
        job.log(f"tune-model 2/4 prepare: {job.pack} is ready for these shapes on {job.arch} "
                f"({len(m['candidates'])} builds): skipped")
        return m
    job.log(f"tune-model 2/4 prepare: {problem}: preparing {job.pack} for {job.arch}")
    write_state(job.work, prepare=None, run=None)   # from here on no pack counts as prepared
    shutil.rmtree(job.pack, ignore_errors=True)     # stale or half made: its builds stay cached
    options = dict(PREPARE_DEFAULTS, **job.prepare_options)
    # include_tuned=False: the pack holds the model's shapes only, not every tuned row's
    m = campaign.prepare(job.shapes, job.arch, job.pack, include_tuned=False, jobs=job.jobs,
                         progress=job.progress, log=job.log, **options)
    write_state(job.work, shapes_sha256=shapes_sha,
                prepare={"arch": job.arch, "options": options,
                         "manifest_sha256": file_sha(job.pack / campaign.MANIFEST)})
    return m


# --- step 3: run --------------------------------------------------------------------------------
def run_done(job: Job, gpu: str) -> Path | None:
    """The run folder of a finished run of this pack on this GPU that exported into the same
    table (every shape timed), else None."""
    done = read_state(job.work).get("run") or {}
    if not (job.pack / campaign.MANIFEST).is_file():
        return None
    if (done.get("manifest_sha256"), done.get("gpu"), done.get("kernels_out")) != (
            file_sha(job.pack / campaign.MANIFEST), gpu, job.kernels_out):
        return None
    summary = Path(done.get("run_dir") or "") / "summary.json"
    try:
        s = json.loads(summary.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    finished = s.get("complete") and not s.get("stopped") and s.get("shapes_done") == s.get("shapes_planned")
    return summary.parent if finished else None


def run_step(job: Job, gpu: str) -> dict | None:
    """campaign run on work/results.db (what it holds is not timed again); None when skipped."""
    earlier = run_done(job, gpu)
    if earlier is not None:
        job.log(f"tune-model 3/4 run: done earlier on {gpu} ({earlier}): skipped")
        return None
    job.log(f"tune-model 3/4 run: timing the pack on {gpu}; rows accumulate in {job.work / 'results.db'}")
    summary = campaign.run(job.pack, job.work / "run", budget_s=job.budget_s or float("inf"),
                           kernels_root=job.kernels_out, db_path=job.work / "results.db",
                           progress=job.progress, log=job.log)
    write_state(job.work, run={"manifest_sha256": file_sha(job.pack / campaign.MANIFEST),
                               "gpu": summary["gpu"], "run_dir": summary["run_dir"],
                               "kernels_out": job.kernels_out})
    if summary.get("stopped"):
        job.log(f"tune-model: {summary['stopped']}; run the same command again to go on "
                f"(what is recorded is not timed again)")
    return summary


# --- step 4: report -----------------------------------------------------------------------------
def served_lines(job: Job, gpu: str) -> list[str]:
    """What dispatch serves for this arch and GPU after the run (`cudal2 served`'s table: the
    user's rows over the shipped ones; --kernels-out as the user's table), then this run's own
    export count (its export.txt names every decision and its reason)."""
    import torch
    from cudal2.core.tables import load_tables
    from cudal2.runs import served
    tables = load_tables(user=job.kernels_out)
    lines = served.report(tables, job.arch, gpu, served.readiness(tables, job.arch, torch.version.cuda))
    done = read_state(job.work).get("run") or {}
    record = Path(done.get("run_dir") or job.work) / "export.txt"
    if record.is_file():
        decisions = record.read_text().splitlines()
        n = sum(d.startswith("exported") for d in decisions)
        lines.append(f"this run exported {n} of {len(decisions)} rows (decisions and reasons: {record})")
    return lines


def replay(job: Job) -> int:
    """The model's passes as CUDA graphs, torch vs cudal2 (`cudal2 bench --model`), on a real GPU."""
    from cudal2.runs import modelbench
    import torch
    if not torch.cuda.is_available():
        job.log("tune-model 4/4 replay: needs a real CUDA GPU (the fake device times nothing): skipped")
        return 0
    if job.kernels_out:          # dispatch layers the user's table over the shipped one
        import os
        os.environ["CUDAL2_USER_KERNELS"] = str(Path(job.kernels_out).resolve())
    stream = job.pack / "baselines" / "stream_read" / "kernel.so"     # no nvcc needed here
    args = argparse.Namespace(model=str(job.shapes), rounds=job.rounds, seed=0, peak_gbs=None,
                              no_ceiling=False, stream_so=str(stream) if stream.is_file() else None,
                              json=str(job.work / "replay.json"))
    job.log(f"tune-model 4/4 replay: the model's passes, torch vs cudal2 (figures also in {args.json})")
    return modelbench.run_cli(args)


def report_step(job: Job, gpu: str) -> int:
    job.log(f"tune-model 4/4 served: {gpu}")
    for line in served_lines(job, gpu):
        job.log("  " + line)
    return replay(job)


def left_for_gpu(job: Job, m: dict) -> list[str]:
    """What the CPU half leaves, and the commands that finish it on a GPU machine."""
    w = job.work
    return [
        f"tune-model: the CPU half is done: {w / 'shapes.csv'}, and {job.pack} "
        f"({len(m['candidates'])} builds, {m.get('screenings', 0)} screenings, "
        f"{m.get('pack_bytes', 0) / 2**20:.1f} MiB). No CUDA GPU here: left for a GPU ({job.arch}):",
        f"  1. copy the work folder to the GPU machine (cudal2 installed there, the same version): "
        f"rsync -a {w}/ GPU-HOST:{w}/",
        f"  2. there: cudal2 tune-model --model {w / 'shapes.csv'} --arch {job.arch} --work {w}"
        + (f" --budget-s {job.budget_s:g}" if job.budget_s else "")
        + (f" --kernels-out {job.kernels_out}" if job.kernels_out else ""),
        "     (finds the pack ready, skips to the run: times, exports, prints the served table and "
        "the model replay)",
        f"     or the run alone: cudal2 campaign run {job.pack} --db {w / 'results.db'} --out {w / 'run'}",
    ]


# --- the command --------------------------------------------------------------------------------
def default_work(model: str, tp: int, arch: str) -> Path:
    """<CUDAL2_CACHE>/tune-model/<model>-tp<N>-<arch>: one folder per model, split and target."""
    src = Path(model)
    if src.suffix == ".csv":
        name = src.stem
    else:
        name = S.read_config(model).name
    safe = re.sub(r"[^\w.-]+", "_", name).strip("_") or "model"
    return knobs.cache_dir() / "tune-model" / f"{safe}-tp{tp}-{arch}"


def pick_arch(explicit: str | None, log=print) -> str:
    """--arch, else CUDAL2_ARCH or the visible GPU's, else sm_90a (said so)."""
    from cudal2.core.toolchain import ToolchainError, detect_arch
    try:
        return detect_arch(explicit)
    except ToolchainError:
        log(f"tune-model: no GPU visible and no --arch: preparing for {DEFAULT_ARCH} "
            f"(--arch sm_80 for an A100)")
        return DEFAULT_ARCH


def tune(job: Job) -> int:
    """The four steps; returns the exit status."""
    from cudal2.harness import provenance
    shapes_sha = shapes_step(job)
    m = prepare_step(job, shapes_sha)
    if not provenance.gpu_visible():
        for line in left_for_gpu(job, m):
            job.log(line)
        return 0
    gpu = provenance.gpu_name() or "GPU"
    run_step(job, gpu)           # a run the budget stopped exported what it measured: report it
    return report_step(job, gpu)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="a model folder, its config.json, a hub id in the local Hugging Face "
                             "cache (read offline), or a shapes CSV that `cudal2 shapes` wrote")
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default 1)")
    parser.add_argument("--tokens", default=None,
                        help="token counts M, comma-separated (default powers of two 1..4096)")
    parser.add_argument("--separate", action="store_true", help="q/k/v and gate/up unfused")
    parser.add_argument("--arch", default=None,
                        help="target (sm_90a, sm_80); default: the visible GPU's, else CUDAL2_ARCH, else sm_90a")
    parser.add_argument("--work", default=None,
                        help="work folder (default <CUDAL2_CACHE>/tune-model/<model>-tp<N>-<arch>); "
                             "a second call on it skips the finished steps")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="the run's wall-clock budget in seconds (0: none); call again to go on")
    parser.add_argument("--kernels-out", default=None,
                        help="kernel table the run exports into (default: campaign run's)")
    # prepare's options default to None: "as the pack in --work was prepared", else prepare's
    parser.add_argument("--families", nargs="+", default=None,
                        help="template families to plan (default: all for the arch)")
    parser.add_argument("--limit-per-shape", type=int, default=None,
                        help="as campaign prepare's (default 8, 0 = all)")
    parser.add_argument("--per-family", type=int, default=None,
                        help="as campaign prepare's (default 2, 0 = no quota)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes")
    parser.add_argument("--rounds", type=int, default=50, help="replays of each pass per path (step 4)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (drawn only on a terminal anyway)")


def job_from_args(args: argparse.Namespace) -> Job:
    is_csv = Path(args.model).suffix == ".csv"
    if is_csv and (args.tp is not None or args.tokens is not None or args.separate):
        raise ValueError(f"--model {args.model} is a shapes file: --tp, --tokens and --separate "
                         "apply to a config only")
    tp = args.tp or 1
    arch = pick_arch(args.arch)
    work = Path(args.work) if args.work else default_work(args.model, tp, arch)
    given = {"families": sorted(args.families) if args.families else None,
             "limit_per_shape": args.limit_per_shape, "per_family": args.per_family}
    # 0 means "no limit" (None) to campaign prepare
    options = {k: (v or None) for k, v in given.items() if v is not None}
    return Job(model=args.model, work=work, arch=arch, tp=tp,
               tokens=S.parse_tokens(args.tokens) if args.tokens else list(S.DEFAULT_TOKENS),
               fused=not args.separate, prepare_options=options, budget_s=args.budget_s,
               kernels_out=args.kernels_out, rounds=args.rounds, jobs=args.jobs,
               progress=False if args.no_progress else None)


def run_cli(args: argparse.Namespace) -> int:
    try:
        return tune(job_from_args(args))
    except (ValueError, RuntimeError) as exc:     # ConfigError is a ValueError
        print(f"cudal2 tune-model: {exc}", file=sys.stderr)
        return 2
